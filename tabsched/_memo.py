"""Memos: every cache of tabsched's, bounded, each a pure function of frozen values.

A memo remembers what a function returned for arguments that cannot change: a
model, a system or an execution (frozen dataclasses), names, numbers and tuples
of them. Its answers cannot go stale, because nothing they depend on can be
assigned to; the ones that are arrays are made read-only, so no caller can change
them either. Each memo drops its least recently used answers beyond its limit.

Every memo is made here, by :func:`memo`, so that this is the one place the
library keeps answers between calls: :func:`clear` forgets them all (tests that
compare a first and a second call), :func:`sizes` says how many each holds. No
other module keeps state at module level.

>>> @memo(limit=4)
... def square(x):
...     return x * x
>>> square(3), square(3), sizes()["tabsched._memo.square"]
(9, 9, 1)
>>> clear(); sizes()["tabsched._memo.square"]
0
"""

from __future__ import annotations

import functools

import numpy as np

__all__ = ["memo", "clear", "sizes", "read_only"]

#: The memos made by :func:`memo`, by qualified name: filled as modules are imported
#: (each memo once, when its module is), never at run time.
_REGISTRY: dict[str, functools._lru_cache_wrapper] = {}


def memo(limit):
    """Decorate a pure function of hashable, frozen arguments: remember ``limit`` answers.

    The function must not depend on anything but its arguments; an answer that is a
    numpy array (or a tuple or dict of them) is made read-only.
    """
    if not isinstance(limit, int) or limit < 1:
        raise ValueError(f"a memo needs a limit >= 1, not {limit!r}")

    def decorate(function):
        @functools.wraps(function)
        def frozen(*args, **kwargs):
            return read_only(function(*args, **kwargs))
        cached = functools.lru_cache(maxsize=limit)(frozen)
        name = f"{function.__module__}.{function.__qualname__}"
        _REGISTRY[name] = cached
        return cached
    return decorate


def read_only(value):
    """``value`` with every numpy array in it (tuples, lists and dict values) read-only."""
    if isinstance(value, np.ndarray):
        value.flags.writeable = False
    elif isinstance(value, (tuple, list)):
        for item in value:
            read_only(item)
    elif isinstance(value, dict):
        for item in value.values():
            read_only(item)
    return value


def clear():
    """Forget every memo's answers."""
    for cached in _REGISTRY.values():
        cached.cache_clear()


def sizes():
    """``{name: answers held}`` of every memo."""
    return {name: cached.cache_info().currsize for name, cached in _REGISTRY.items()}
