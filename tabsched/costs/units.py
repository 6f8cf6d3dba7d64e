"""Human units in, human units out; SI base units inside.

Every size, time, bandwidth and compute rate that a user types -- on the command
line or in a preset's TOML -- may carry a unit: ``80GB``, ``1.5TiB``,
``450GB/s``, ``400Gb/s`` (bits), ``2us``, ``1.2ms``, ``500ns``, ``1PFLOP/s``.
Inside tabsched, and in every JSON it writes, quantities are plain numbers in SI
base units: bytes, seconds, bytes per second, FLOP per second. A bare number is
taken to be in those units already.

Prefixes are decimal (``k M G T P E``, powers of 1000) or binary (``Ki Mi Gi
Ti Pi``, powers of 1024), in any case. ``B`` and ``byte`` are bytes, ``bit`` a
bit, and ``b`` a bit after an SI-spelled prefix (``400Gb/s`` and ``400Gbps`` are
50 GB/s) but a byte after a lower-case one in a size (``80gb`` is 80 GB; in a
rate, ``400gb/s`` is refused as ambiguous). Rates end in ``/s``, ``/sec`` or
``ps``; times may be words (``1.5 sec``, ``2 minutes``). ``ACCEPTED`` lists the
forms per unit, and an error shows them.

>>> parse_quantity("80GB", "B")
80000000000.0
>>> parse_quantity("2us", "s")
2e-06
>>> parse_quantity("400Gb/s", "B/s")
50000000000.0
>>> format_quantity(3.35e12, "B/s")
'3.35 TB/s'
>>> format_quantity(0.0012, "s")
'1.2 ms'
"""

from __future__ import annotations

import math
import re

from tabsched.exceptions import InvalidParameterError

__all__ = ["parse_quantity", "format_quantity", "format_number", "format_count", "UNITS",
           "ACCEPTED"]

#: The units tabsched knows, each with an example for error messages.
UNITS = {"B": "80GB", "B/s": "450GB/s", "s": "1.2ms", "FLOP/s": "1PFLOP/s", "FLOP": "2TFLOP"}
#: What people type, per unit: listed in the error when a value is not understood.
ACCEPTED = {"B": "80GB, 80 GiB, 80G, 80gb, 80 GByte",
            "B/s": "450GB/s, 450 GB/sec, 450GBps, 400Gb/s, 400 Gbit/s, 400Gbps",
            "s": "1.2ms, 2us, 2 \u00b5s, 500ns, 1.5 sec, 2min",
            "FLOP/s": "1PFLOP/s, 989 TFLOPS, 989 tflop/s, 989T",
            "FLOP": "2TFLOP, 2 tflop, 2T"}
_WHAT = {"B": "a size", "B/s": "a bandwidth", "s": "a time", "FLOP/s": "a compute rate",
         "FLOP": "an amount of compute"}

# Prefixes are read case-insensitively (milli-bytes and milli-FLOPs mean nothing, so "m" is
# mega); the SI spelling (k, K, and upper-case M G T P E, Ki Mi ...) is what decides, for a
# lower-case "b", whether bits are meant (see _byte_factor).
_DECIMAL = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15, "e": 1e18}
_BINARY = {"ki": 2.0**10, "mi": 2.0**20, "gi": 2.0**30, "ti": 2.0**40, "pi": 2.0**50,
           "ei": 2.0**60}
_SI_SPELLING = {"", "k", "K", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"}
# time suffixes as divisors (500 / 1e9 is exactly 5e-07; 500 * 1e-9 is not)
_TIME = {"s": 1.0, "ms": 1e3, "us": 1e6, "ns": 1e9, "min": 1 / 60, "h": 1 / 3600}
_TIME_WORDS = {"sec": "s", "secs": "s", "second": "s", "seconds": "s",
               "msec": "ms", "millisecond": "ms", "milliseconds": "ms",
               "\u00b5s": "us", "\u03bcs": "us", "usec": "us", "microsecond": "us",
               "microseconds": "us", "nsec": "ns", "nanosecond": "ns", "nanoseconds": "ns",
               "minute": "min", "minutes": "min", "mins": "min",
               "hr": "h", "hrs": "h", "hour": "h", "hours": "h"}
_PER_SECOND = ("/second", "/sec", "/s")
# ASCII digits only: float() would also read other scripts' digits ("\u0668" is 8)
_NUMBER = re.compile(r"\s*([+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)\s*(.*?)\s*",
                     re.ASCII)


def _prefix(text):
    """Factor of a decimal or binary prefix (case-insensitive), or None."""
    lower = text.lower()
    return _DECIMAL.get(lower, _BINARY.get(lower))


class _Ambiguous(Exception):
    """A unit that reads as bits to some and bytes to others."""


def _byte_factor(body, *, rate, per_second_ps=False):
    """Bytes per unit of ``body`` (``GB``, ``Gb``, ``gb``, ``Gbit``, ``GiB``, ``G``...).

    ``B`` and ``byte`` are bytes, ``bit`` is a bit. A lower-case ``b`` is a bit after a
    prefix in its SI spelling (``Gb``, ``kb``, ``Mib``), as network rates are written, and
    always in ``bps``; after an all-lower-case prefix (``gb``) it is a byte for a size
    (``80gb`` of memory) and ambiguous for a rate.
    """
    lower = body.lower()
    for word, scale in (("bytes", 1.0), ("byte", 1.0), ("bits", 0.125), ("bit", 0.125)):
        if lower.endswith(word):
            factor = _prefix(body[:-len(word)])
            return None if factor is None else factor * scale
    if body.endswith("B"):
        factor, scale = _prefix(body[:-1]), 1.0
    elif body.endswith("b"):
        prefix = body[:-1]
        factor = _prefix(prefix)
        if prefix in _SI_SPELLING or per_second_ps:
            scale = 0.125
        elif rate:
            raise _Ambiguous
        else:
            scale = 1.0
    else:  # a prefix alone: 80G is 80 GB
        factor, scale = _prefix(body), 1.0
    return None if factor is None else factor * scale


def _multiplier(suffix, unit):
    """Factor from ``suffix`` (what follows the number) to ``unit``; None if it does not fit.

    For times, the divisor's key in ``_TIME`` (a str) instead, so that sub-second values
    divide exactly.
    """
    suffix = "".join(suffix.split())
    if suffix == "":
        return 1.0
    if unit == "s":
        lower = suffix.lower()
        key = _TIME_WORDS.get(lower, lower)
        return key if key in _TIME else None
    if unit == "B":
        return _byte_factor(suffix, rate=False)
    if unit == "B/s":
        lower = suffix.lower()
        for ending in _PER_SECOND:
            if lower.endswith(ending):
                return _byte_factor(suffix[:-len(ending)], rate=True)
        if lower.endswith("ps") and len(suffix) > 2:  # GBps (bytes), Gbps and gbps (bits)
            return _byte_factor(suffix[:-2], rate=True, per_second_ps=True)
        return None
    if unit in ("FLOP/s", "FLOP"):
        lower = suffix.lower()
        endings = (("flops/s", "flop/s", "flop/sec", "flops") if unit == "FLOP/s"
                   else ("flops", "flop"))
        for ending in endings:
            if lower.endswith(ending):
                return _prefix(suffix[:-len(ending)])
        return _prefix(suffix) if unit == "FLOP/s" or "/" not in suffix else None
    raise ValueError(f"unknown unit {unit!r}")


def parse_quantity(value: float | str, unit: str, *, name: str | None = None) -> float:
    """``value`` (a number, or a string with an optional unit) in SI base units of ``unit``.

    Parameters
    ----------
    value : int, float or str
        ``80GB``, ``450 GB/s``, ``2us``, ``1PFLOP/s``, ``1e9``... (see ``ACCEPTED``)
    unit : {"B", "B/s", "s", "FLOP/s", "FLOP"}
    name : str, optional
        What the value is (a key, an option), for the error message.

    Raises
    ------
    InvalidParameterError
        If ``value`` is not a finite number or its unit does not fit ``unit``; the
        message lists the accepted forms.

    >>> parse_quantity("1.5 TiB", "B") == 1.5 * 2**40
    True
    >>> parse_quantity("400 Gbit/s", "B/s"), parse_quantity("989 tflop/s", "FLOP/s")
    (50000000000.0, 989000000000000.0)
    >>> parse_quantity("80 GB/s", "B", name="memory_budget")
    Traceback (most recent call last):
    ...
    tabsched.exceptions.InvalidParameterError: memory_budget: '80 GB/s' is not a size (expected e.g. 80GB; accepted forms: 80GB, 80 GiB, 80G, 80gb, 80 GByte)
    """
    label = f"{name}: " if name else ""
    if isinstance(value, bool):
        raise InvalidParameterError(f"{label}{value!r} is not {_WHAT[unit]} "
                                    f"(expected e.g. {UNITS[unit]})")
    if isinstance(value, (int, float)):
        number = float(value)
    else:
        text = str(value)
        match = _NUMBER.fullmatch(text)
        factor = None
        if match is not None:
            try:
                factor = _multiplier(match.group(2), unit)
            except _Ambiguous:
                raise InvalidParameterError(
                    f"{label}{_shown(text)} is ambiguous: write {match.group(1)}"
                    f"{match.group(2).strip()[:1].upper()}B/s for bytes or {match.group(1)}"
                    f"{match.group(2).strip()[:1].upper()}bit/s for bits per second") from None
        if match is None or factor is None:
            raise InvalidParameterError(f"{label}{_shown(text)} is not {_WHAT[unit]} "
                                        f"(expected e.g. {UNITS[unit]}; accepted forms: "
                                        f"{ACCEPTED[unit]})")
        number = (float(match.group(1)) / _TIME[factor] if isinstance(factor, str)
                  else float(match.group(1)) * factor)
    if not math.isfinite(number):
        raise InvalidParameterError(f"{label}{value!r} is not a finite number")
    return number


def _shown(text, limit=40):
    """``repr(text)``, cut to ``limit`` characters for one-line messages."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


_FORMAT_PREFIXES = [(1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"),
                    (1.0, "")]
_FORMAT_TIMES = [(1.0, "s"), (1e-3, "ms"), (1e-6, "us"), (1e-9, "ns")]


def format_quantity(value: float, unit: str, *, digits: int = 3) -> str:
    """``value`` (SI base units of ``unit``) as a short human string, ``digits`` significant.

    >>> format_quantity(80e9, "B"), format_quantity(5e-7, "s"), format_quantity(1e15, "FLOP/s")
    ('80 GB', '500 ns', '1 PFLOP/s')
    >>> format_quantity(0, "B"), format_quantity(0.99996, "s"), format_quantity(1234.4, "s")
    ('0 B', '1 s', '1234 s')
    """
    value = float(value)
    if not math.isfinite(value):
        return f"{value} {unit}"
    magnitude = abs(value)
    if unit == "s" and magnitude < 1e-12:  # float residue of a difference of times
        magnitude = value = 0.0
    scales = _FORMAT_TIMES if unit == "s" else _FORMAT_PREFIXES
    if magnitude == 0.0 or (unit == "s" and magnitude >= 1.0):
        return f"{_significant(value, digits)} s" if unit == "s" else f"0 {unit}"
    scale, prefix = next(((scale, prefix) for scale, prefix in scales
                          if _rounds_to_at_least_one(magnitude / scale, digits)), scales[-1])
    if unit == "s":
        return f"{_significant(value / scale, digits)} {prefix}"
    return f"{_significant(value / scale, digits)} {prefix}{unit}"


def format_number(value, digits=6):
    """``value`` positionally, never in scientific notation: a whole number in full, any
    other with at most ``digits`` significant digits (trailing zeros dropped).

    For counts a user reads (slots, cells, microbatches), where ``3e+06 slots`` hides
    the size.

    >>> format_number(3e6), format_number(27.0), format_number(1 / 3), format_number(1234567.891)
    ('3000000', '27', '0.333333', '1234568')
    >>> format_number(2.5e-7), format_number(-0.0), format_number(float("inf"))
    ('0.00000025', '0', 'inf')
    """
    value = float(value)
    if not math.isfinite(value):
        return str(value)
    if value == 0.0:
        return "0"
    if value.is_integer() and abs(value) < 1e18:
        return str(int(value))
    exponent = math.floor(math.log10(abs(value)))
    decimals = max(0, digits - 1 - exponent)
    text = f"{value:.{decimals}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def format_count(value, digits=3):
    """A large count with a thousands prefix (k, M, B for billions as model sizes are
    named, T): ``format_count(1.008e12)`` is ``'1.01T'``, never ``'1.01e+03B'``.

    >>> format_count(8.03e9), format_count(1.008e12), format_count(175e9), format_count(950)
    ('8.03B', '1.01T', '175B', '950')
    """
    value = float(value)
    if not math.isfinite(value):
        return str(value)
    for scale, prefix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if _rounds_to_at_least_one(abs(value) / scale, digits):
            return f"{_significant(value / scale, digits)}{prefix}"
    return _significant(value, digits)


def _rounds_to_at_least_one(mantissa, digits):
    return float(_significant(mantissa, digits)) >= 1.0


def _significant(number, digits):
    text = f"{number:.{digits}g}"
    if "e" in text:  # a mantissa that rounds up to 1000 stays positional
        text = f"{number:.0f}"
    return text
