"""Timing helper shared by the benchmarks (run them as ``python bench/<name>.py``)."""

import gc
import time


def best_of(repeat, function):
    """``(seconds, value)``: the fastest of ``repeat`` calls, after a garbage collection each."""
    best, value = float("inf"), None
    for _ in range(repeat):
        gc.collect()
        began = time.perf_counter()
        value = function()
        best = min(best, time.perf_counter() - began)
    return best, value
