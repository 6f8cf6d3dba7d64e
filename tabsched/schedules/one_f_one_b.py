"""1F1B (PipeDream-Flush / DAPPLE), SCHEDULES.md §2.

Megatron's order on device r: warm-up of ``w = min(p-r-1, N)`` forwards, then
``N-w`` pairs (F(w+i), B(i)), then the last ``w`` backwards. PyTorch's
``Schedule1F1B`` writes the same sequence; it rejects N < p, Megatron caps the
warm-up at N, and so do we.
"""

import numpy as np

from tabsched.schedules._common import DEVICES, MICROBATCHES, table_from_columns
from tabsched.schedules._registry import Family, Parameter, register
from tabsched.table import BACKWARD, FORWARD


def device_order(warmup, microbatches):
    """(kinds, microbatches) of one device's 1F1B order with the given warm-up depth."""
    n, w = microbatches, warmup
    steady = n - w
    kinds = np.concatenate([np.full(w, FORWARD),
                            np.tile([FORWARD, BACKWARD], steady),
                            np.full(w, BACKWARD)])
    pairs = np.empty(2 * steady, dtype=np.int64)
    pairs[0::2] = np.arange(w, n)
    pairs[1::2] = np.arange(steady)
    mbs = np.concatenate([np.arange(w), pairs, np.arange(steady, n)])
    return kinds, mbs


def validate(devices, microbatches):
    """Every size is valid: the table's stage count (one stage per device)."""
    return devices


def build(devices, microbatches):
    p, n = devices, microbatches
    columns = ([], [], [], [], [])
    for r in range(p):
        kinds, mbs = device_order(min(p - r - 1, n), n)
        values = (np.full(2 * n, r), np.arange(2 * n), kinds, np.full(2 * n, r), mbs)
        for column, value in zip(columns, values):
            column.append(value)
    return table_from_columns(columns, p, num_stages=p, num_microbatches=n,
                              family="1f1b", params={"devices": p, "microbatches": n})


FAMILY = register(Family(
    name="1f1b",
    summary="one forward, one backward in the steady state (PipeDream-Flush, DAPPLE)",
    build=build,
    check=validate,
    parameters=(Parameter("devices", help=DEVICES),
                Parameter("microbatches", help=MICROBATCHES)),
    constraints="any devices >= 1, microbatches >= 1 (warm-up capped at M, as Megatron does)",
    notes="device d holds min(p-d, M) activations at its peak",
    aliases=("pipedream-flush", "dapple"),
))
