"""Human units in, human units out; SI base units inside.

Every size, time, bandwidth and compute rate that a user types -- on the command
line or in a preset's TOML -- may carry a unit: ``80GB``, ``1.5TiB``,
``450GB/s``, ``400Gb/s`` (bits), ``2us``, ``1.2ms``, ``500ns``, ``1PFLOP/s``.
Inside tabsched, and in every JSON it writes, quantities are plain numbers in SI
base units: bytes, seconds, bytes per second, FLOP per second. A bare number is
taken to be in those units already.

Prefixes are decimal (``k M G T P E``, powers of 1000) or binary (``Ki Mi Gi
Ti Pi``, powers of 1024). ``B`` is a byte and ``b`` a bit, so ``400Gb/s`` is
50 GB/s.

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

import math
import re

from tabsched.exceptions import InvalidParameterError

__all__ = ["parse_quantity", "format_quantity", "UNITS"]

#: The units tabsched knows, each with an example for error messages.
UNITS = {"B": "80GB", "B/s": "450GB/s", "s": "1.2ms", "FLOP/s": "1PFLOP/s", "FLOP": "2TFLOP"}
_WHAT = {"B": "a size", "B/s": "a bandwidth", "s": "a time", "FLOP/s": "a compute rate",
         "FLOP": "an amount of compute"}

_DECIMAL = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
_BINARY = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50}
# time suffixes as divisors (500 / 1e9 is exactly 5e-07; 500 * 1e-9 is not)
_TIME = {"s": 1.0, "ms": 1e3, "us": 1e6, "\u00b5s": 1e6, "ns": 1e9, "min": 1 / 60, "h": 1 / 3600}
_NUMBER = re.compile(r"\s*([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*(.*?)\s*")


def _multiplier(suffix, unit):
    """Factor from ``suffix`` (what follows the number) to ``unit``; None if it does not fit."""
    if suffix == "":
        return 1.0
    if unit == "s":
        return 1.0 / _TIME[suffix] if suffix in _TIME else None
    if unit in ("B", "B/s"):
        if unit == "B/s":
            if suffix.endswith("/s") or suffix.endswith("ps"):  # GB/s, Gb/s, GBps, Gbps
                suffix = suffix[:-2]
            else:
                return None
        if suffix.endswith("B"):
            scale = 1.0
        elif suffix.endswith("b"):
            scale = 0.125
        else:
            return None
        prefix = suffix[:-1]
        factor = _DECIMAL.get(prefix, _BINARY.get(prefix))
        return None if factor is None else factor * scale
    if unit in ("FLOP/s", "FLOP"):
        upper = suffix.upper()
        if unit == "FLOP/s":
            for ending in ("FLOP/S", "FLOPS"):
                if upper.endswith(ending):
                    prefix = suffix[:-len(ending)]
                    break
            else:
                return None
        else:
            if not upper.endswith("FLOP"):
                return None
            prefix = suffix[:-4]
        return _DECIMAL.get(prefix)
    raise ValueError(f"unknown unit {unit!r}")


def parse_quantity(value, unit, *, name=None):
    """``value`` (a number, or a string with an optional unit) in SI base units of ``unit``.

    Parameters
    ----------
    value : int, float or str
        ``80GB``, ``450 GB/s``, ``2us``, ``1PFLOP/s``, ``1e9``...
    unit : {"B", "B/s", "s", "FLOP/s", "FLOP"}
    name : str, optional
        What the value is (a key, an option), for the error message.

    Raises
    ------
    InvalidParameterError
        If ``value`` is not a number or its unit does not fit ``unit``.

    >>> parse_quantity("1.5 TiB", "B") == 1.5 * 2**40
    True
    >>> parse_quantity("80 GB/s", "B", name="memory_budget")
    Traceback (most recent call last):
    ...
    tabsched.exceptions.InvalidParameterError: memory_budget: '80 GB/s' is not a size (expected e.g. 80GB)
    """
    label = f"{name}: " if name else ""
    if isinstance(value, bool):
        raise InvalidParameterError(f"{label}{value!r} is not {_WHAT[unit]} "
                                    f"(expected e.g. {UNITS[unit]})")
    if isinstance(value, (int, float)):
        return float(value)
    text = str(value)
    match = _NUMBER.fullmatch(text)
    factor = _multiplier(match.group(2), unit) if match else None
    if factor is None:
        raise InvalidParameterError(f"{label}{text!r} is not {_WHAT[unit]} "
                                    f"(expected e.g. {UNITS[unit]})")
    if unit == "s" and match.group(2):
        return float(match.group(1)) / _TIME[match.group(2)]
    return float(match.group(1)) * factor


_FORMAT_PREFIXES = [(1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"),
                    (1.0, "")]
_FORMAT_TIMES = [(1.0, "s"), (1e-3, "ms"), (1e-6, "us"), (1e-9, "ns")]


def format_quantity(value, unit, *, digits=3):
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


def _rounds_to_at_least_one(mantissa, digits):
    return float(_significant(mantissa, digits)) >= 1.0


def _significant(number, digits):
    text = f"{number:.{digits}g}"
    if "e" in text:  # a mantissa that rounds up to 1000 stays positional
        text = f"{number:.0f}"
    return text
