"""Untrusted files and values: bounded TOML parsing and one-line checks.

Every file a user hands tabsched (a model, a system, an execution) is untrusted:
at most :data:`MAX_FILE_BYTES` are read, its nesting is measured before the
parser sees it (Python's TOML parser recurses on nested arrays and inline
tables, and spends time quadratic in the parts of a dotted key), and every value
goes through the bounded checks here (:func:`number`, :func:`integer`,
:func:`text`), which the descriptions also apply to values given from Python.
Messages show values through :func:`shown_value`, which stays short for any
value, a 4,000-digit integer or a deeply nested table included.

It imports nothing of tabsched's but the exceptions (the unit parser is imported
when a quantity is met), so that every description, the execution included, can
use it without importing the cost models.
"""

import difflib
import math
import re

import numpy as np

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser as a package (tomllib's origin)
    import tomli as tomllib  # type: ignore[no-redef,import-not-found]

from tabsched.exceptions import InvalidParameterError

#: Bytes read from a user's file at most. The largest preset is under 3 KB; 1 MiB leaves
#: room for long efficiency tables and override lists, and bounds what is parsed.
MAX_FILE_BYTES = 2**20
#: Deepest nesting of arrays and inline tables. The schema needs 3 (an inline array of
#: override tables, each with a device pair); the parser recurses once per level.
MAX_NESTING = 16
#: Most parts of one dotted key or table header (``a.b.c`` has 3). The schema's keys have
#: one; the parser's time grows with the square of the parts (16,000 take 6 s).
MAX_KEY_PARTS = 16
#: Characters of a quantity's text: ``"3.35 TB/s"`` needs 9. Longer text is no quantity,
#: and is refused before the unit parser sees it.
MAX_QUANTITY_TEXT = 64
#: Characters a value shows in a message at most.
SHOWN_LIMIT = 60
_BOM = b"\xef\xbb\xbf"


def _a(kind):
    """``a model``, ``an execution``: the article for a kind of file."""
    return f"an {kind}" if kind[:1] in "aeiou" else f"a {kind}"


def parse(raw, source, kind):
    """The TOML document in ``raw`` (bytes), checked for size and nesting before parsing.

    A leading UTF-8 byte-order mark is dropped (editors on Windows write one).

    >>> parse(b'peak_flops = "1PFLOP/s"', "gpu.toml", "system")
    {'peak_flops': '1PFLOP/s'}
    >>> parse(b"a = " + b"[" * 5000 + b"]" * 5000, "deep.toml", "system")
    Traceback (most recent call last):
    ...
    tabsched.exceptions.InvalidParameterError: deep.toml: not a system file: arrays or inline tables nested more than 16 deep
    """
    if len(raw) > MAX_FILE_BYTES:
        raise InvalidParameterError(f"{source}: larger than {MAX_FILE_BYTES // 2**20} MiB; "
                                    f"{_a(kind)} file holds a few KB of keys")
    if raw.startswith(_BOM):
        raw = raw[len(_BOM):]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise InvalidParameterError(f"{source}: byte {error.start} is not UTF-8 text; not "
                                    f"{_a(kind)} file") from None
    problem = nesting_problem(text)
    if problem:
        raise InvalidParameterError(f"{source}: not {_a(kind)} file: {problem}")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise InvalidParameterError(f"{source}: not valid TOML: "
                                    f"{_one_line(str(error), 160)}") from None
    except ValueError:  # an integer longer than Python converts (4300 digits)
        raise InvalidParameterError(f"{source}: not valid TOML: a number has more digits "
                                    f"than any quantity needs") from None
    except RecursionError:  # pragma: no cover - nesting_problem bounds the recursion
        raise InvalidParameterError(f"{source}: not {_a(kind)} file: nested too deeply") \
            from None


# What the nesting scan stops at: brackets, quotes, comments, and what ends a key.
_SPECIAL = re.compile(r"""[\[\]{}"'#.=,\n]""")
# (unrolled: a character class repeats without a backtracking entry per character)
_BASIC_BODY = re.compile(r'[^"\\\n]*(?:\\.[^"\\\n]*)*')                    # "...": one line
_MULTILINE_BODY = re.compile(r'[^"\\]*(?:(?:\\.|"(?!""))[^"\\]*)*', re.S)  # """..."""
_LITERAL_BODY = re.compile(r"[^'\n]*")                          # '...'


def nesting_problem(text):
    """Why ``text`` nests too deeply for the parser, or ``""``.

    Counts the nesting of ``[`` and ``{`` and the dots of each dotted key
    outside strings and comments, in one pass that stops at the first excess.
    A file with few brackets and dots (every preset) needs no scan.

    >>> nesting_problem('description = "[[[[[[[[[[[[[[[[[[[[[[[[..................."')
    ''
    >>> nesting_problem("a" + ".a" * 20 + " = 1")
    'a key or table name of more than 16 dotted parts'
    """
    if (text.count("[") + text.count("{") <= MAX_NESTING
            and text.count(".") < MAX_KEY_PARTS):
        return ""
    depth = dots = 0
    position = 0
    end = len(text)
    while position < end:
        match = _SPECIAL.search(text, position)
        if match is None:
            break
        char = match.group()
        position = match.end()
        if char in "[{":
            depth += 1
            dots = 0
            if depth > MAX_NESTING:
                return f"arrays or inline tables nested more than {MAX_NESTING} deep"
        elif char in "]}":
            depth = max(depth - 1, 0)
            dots = 0
        elif char == ".":   # a float has one dot, a dotted key one fewer than its parts
            dots += 1
            if dots >= MAX_KEY_PARTS:
                return f"a key or table name of more than {MAX_KEY_PARTS} dotted parts"
        elif char in "=,\n":
            dots = 0
        elif char == "#":
            newline = text.find("\n", position)
            position = end if newline < 0 else newline
        elif char == '"':
            if text.startswith('""', position):
                closing = _MULTILINE_BODY.match(text, position + 2).end()
                position = _past_closing(text, closing, '"')
            else:
                position = _BASIC_BODY.match(text, position).end() + 1
        elif text.startswith("''", position):   # '''...'''
            closing = text.find("'''", position + 2)
            position = end if closing < 0 else _past_closing(text, closing, "'")
        else:
            position = _LITERAL_BODY.match(text, position).end() + 1
    return ""


def _past_closing(text, closing, quote):
    """Where a multi-line string closed at ``closing`` ends: up to two more quotes are its own."""
    position = closing + 3
    for _ in range(2):
        if text.startswith(quote, position):
            position += 1
    return position


def check_keys(data, required, optional, source):
    """Raise for the first missing or unknown key of ``data`` (sorted, so messages are stable)."""
    known = set(required) | set(optional) | {"kind", "description"}
    for key in sorted(data):
        if key not in known:
            raise InvalidParameterError(f"{source}: unknown key {shown_value(key)}"
                                        f"{suggestion(key, known)}")
    for key in required:
        if key not in data:
            raise InvalidParameterError(f"{source}: missing key {key!r}")


def suggestion(key, known):
    """`` (did you mean 'x'?)`` for the known name closest to ``key``, or ``""``."""
    close = difflib.get_close_matches(str(key)[:100], sorted(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


# ---------------------------------------------------------------- values, checked
def shown_value(value, limit=SHOWN_LIMIT):
    """``repr(value)`` for a one-line message: short for any value.

    A huge integer shows its size (Python refuses to print one of more than
    4300 digits), text is escaped and cut, containers are cut after a few levels.

    >>> shown_value(1e30), shown_value("5GB/s"), shown_value([1, [2, [3, [4, [5]]]]])
    ('1e+30', "'5GB/s'", '[1, [2, [3, [...]]]]')
    >>> shown_value(10**5000)
    '<an integer of 5001 digits>'
    >>> shown_value("x" * 100)
    "'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx... (100 characters)"
    """
    if isinstance(value, str) and len(value) > limit - 2:
        return f"{repr(value[:limit - 2])[:-1]}... ({len(value)} characters)"
    text = _bounded_repr(value, limit + 1, 3)
    return text if len(text) <= limit else text[:limit] + "..."


def _bounded_repr(value, budget, depth):
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        return f"<an integer of {_digits(value)} digits>"
    if isinstance(value, str):
        return repr(value[:budget])
    if isinstance(value, (list, tuple, dict)):
        opening, closing = ("{", "}") if isinstance(value, dict) else \
            ("(", ")") if isinstance(value, tuple) else ("[", "]")
        if depth == 0:
            return f"{opening}...{closing}"
        parts, used = [], 0
        items = value.items() if isinstance(value, dict) else ((None, item) for item in value)
        for key, item in items:
            if used > budget:
                parts.append("...")
                break
            shown = _bounded_repr(item, budget - used, depth - 1)
            if key is not None:
                shown = f"{_bounded_repr(key, budget - used, 0)}: {shown}"
            parts.append(shown)
            used += len(shown) + 2
        return opening + ", ".join(parts) + closing
    return _one_line(repr(value), budget)


def _digits(value):
    """Decimal digits of a big integer, without converting it to text."""
    digits = int(abs(value).bit_length() * math.log10(2)) + 1
    return digits if abs(value) >= 10 ** (digits - 1) else digits - 1


def _one_line(text, limit):
    text = "".join(char if char.isprintable() else repr(char)[1:-1] for char in text[:limit])
    return text


def integer(name, value, low, high):
    """``value`` as an int in ``low .. high`` (not a bool, not a float), or one line naming ``name``.

    >>> integer("layers", 96, 1, 100_000)
    96
    >>> integer("layers", 2.0, 1, 100_000)
    Traceback (most recent call last):
    ...
    tabsched.exceptions.InvalidParameterError: layers must be a positive integer, not 2.0
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidParameterError(f"{name} must be {_integer_kind(low)}, not "
                                    f"{shown_value(value)}")
    if value < low:
        raise InvalidParameterError(f"{name} must be {_integer_kind(low)}, not "
                                    f"{shown_value(value)}")
    if value > high:
        raise InvalidParameterError(f"{name} must be an integer from {low} to {high}, not "
                                    f"{shown_value(value)}")
    return int(value)


def _integer_kind(low):
    return {0: "an integer >= 0", 1: "a positive integer"}.get(low, f"an integer >= {low}")


def number(name, value, low, high, *, unit=None, positive=False):
    """``value`` as a finite float in ``low .. high``, or one line naming ``name``.

    ``value`` is an int or float, or with ``unit`` (see
    :data:`tabsched.costs.units.UNITS`) also a text with a unit (``"450GB/s"``).
    Booleans are refused. ``positive``: a value <= 0 is "must be > 0" (else a
    value < 0 is "must be >= 0"); a value outside ``low .. high`` names the range.

    >>> number("inter_node_bandwidth", "50GB/s", 1e3, 1e15, unit="B/s", positive=True)
    50000000000.0
    >>> number("inter_node_bandwidth", 1e-300, 1e3, 1e15, unit="B/s", positive=True)
    Traceback (most recent call last):
    ...
    tabsched.exceptions.InvalidParameterError: inter_node_bandwidth must be between 1 kB/s and 1 PB/s, not 1e-300 (a bare number is in B/s)
    """
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, str) and unit is not None:
        from tabsched.costs.units import UNITS, parse_quantity
        if len(value) > MAX_QUANTITY_TEXT:
            raise InvalidParameterError(f"{name}: {shown_value(value)} is not a quantity "
                                        f"(expected e.g. {UNITS[unit]})")
        quantity = parse_quantity(value, unit, name=name)
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        from tabsched.costs.units import UNITS
        expected = (f"a number or a quantity such as {UNITS[unit]!r}" if unit is not None
                    else "a number")
        raise InvalidParameterError(f"{name} must be {expected}, not {shown_value(value)}")
    elif isinstance(value, int) and abs(value) > 10**300:
        quantity = math.inf if value > 0 else -math.inf   # float(value) would overflow
    else:
        quantity = float(value)
    if math.isnan(quantity):
        raise InvalidParameterError(f"{name} must be a number, not {shown_value(value)}")
    if positive and quantity <= 0:
        raise InvalidParameterError(f"{name} must be > 0, not {shown_value(value)}")
    if quantity < 0 <= low:
        raise InvalidParameterError(f"{name} must be >= 0, not {shown_value(value)}")
    if not low <= quantity <= high:
        bare = f" (a bare number is in {unit})" if unit and not isinstance(value, str) else ""
        raise InvalidParameterError(f"{name} must be between {_bound(low, unit)} and "
                                    f"{_bound(high, unit)}, not {shown_value(value)}{bare}")
    return quantity


def _bound(value, unit):
    if unit is None or value > 1e21:   # past the largest prefix (E): 1e+30 FLOP
        return f"{value:g}" + (f" {unit}" if unit else "")
    from tabsched.costs.units import format_quantity
    return format_quantity(value, unit)


def text(name, value, limit):
    """``value`` as one line of printable text of at most ``limit`` characters.

    >>> text("description", "DGX H100", 500)
    'DGX H100'
    """
    if not isinstance(value, str):
        raise InvalidParameterError(f"{name} must be text, not {shown_value(value)}")
    if len(value) > limit:
        raise InvalidParameterError(f"{name} is {len(value)} characters long; at most "
                                    f"{limit} are allowed")
    if not value.isprintable():
        raise InvalidParameterError(f"{name} must be one line of printable text, not "
                                    f"{shown_value(value)}")
    return value
