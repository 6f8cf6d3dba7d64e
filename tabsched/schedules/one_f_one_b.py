"""1F1B (PipeDream-Flush / DAPPLE), SCHEDULES.md §2.

Megatron's order on device r: warm-up of ``w = min(p-r-1, N)`` forwards, then
``N-w`` pairs (F(w+i), B(i)), then the last ``w`` backwards. PyTorch's
``Schedule1F1B`` writes the same sequence; it rejects N < p, Megatron caps the
warm-up at N, and so do we.
"""

import numpy as np

from tabsched import _build
from tabsched.exceptions import TabschedError
from tabsched.layout import from_order_arrays
from tabsched.schedules._common import DEVICES, MICROBATCHES
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


def order_columns(devices, microbatches):
    """Every device's :func:`device_order` at once, as the order's columns ``(device,
    position, kind, stage, microbatch)``: step ``i`` of device ``r`` (warm-up ``w``) is
    ``F(i)`` while ``i < w``, then ``F(w + j/2)`` and ``B(j/2)`` by turns (``j = i -
    w``), then ``B(i - n)`` from ``i = 2n - w``. Written by ``_build.one_f_one_b_order``
    in one pass, no loop per device here and no temporary; the stage column is the
    device column (a stage per device)."""
    total = 2 * devices * microbatches
    device, position, microbatch = (np.empty(total, dtype=np.int32) for _ in range(3))
    kind = np.empty(total, dtype=np.int8)
    status = _build.one_f_one_b_order(devices, microbatches, device, position, kind,
                                      microbatch)
    if status != _build.OK:
        raise TabschedError(f"internal error: the 1F1B order returned status {status} "
                            f"(please report this)")
    return device, position, kind, device, microbatch


assert (FORWARD, BACKWARD) == (0, 1)


def build(devices, microbatches):
    p, n = devices, microbatches
    # the columns in their dtypes already (table_from_columns would copy them)
    return from_order_arrays(*order_columns(p, n), num_devices=p, lazy=True, num_stages=p,
                             num_microbatches=n, family="1f1b",
                             params={"devices": p, "microbatches": n})


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
