"""Breadth-first pipeline parallelism: PyTorch's ``ScheduleLoopedBFS`` (SCHEDULES.md §4).

Looping placement as in interleaved 1F1B: device ``r`` holds stages
``r, r+p, r+2p, ...``. PyTorch (``torch/distributed/pipelining/schedules.py``,
``ScheduleLoopedBFS._calculate_single_rank_operations``) orders device ``r``:
for each local stage in increasing order, the forwards of all ``N``
microbatches; then, for each local stage in decreasing order, the backwards of
microbatches ``N-1`` down to ``0``. (PyTorch pads the list with ``r`` and
``2(p-1-r)`` empty slots; the layout here comes from execution instead.)

Every (stage, microbatch) runs whole: the table holds all ``v*N`` chunk
activations on a device at its peak, like GPipe. With ``N < p`` the forward of
a device's next local stage waits for the wrap-around from the last device,
which PyTorch's padding does not model; the table shows that stall.
"""

import numpy as np

from tabsched.exceptions import InvalidParameterError
from tabsched.schedules._common import DEVICES, MICROBATCHES, table_from_columns
from tabsched.schedules._registry import Family, Parameter, register
from tabsched.table import BACKWARD, FORWARD

NAME = "looped-bfs"


def validate(devices, microbatches, chunks=2):
    """Every size is valid: the table's stage count (``chunks`` per device)."""
    return devices * chunks


def build(devices, microbatches, chunks=2):
    p, n, v = devices, microbatches, chunks
    if v < 1:  # pragma: no cover - the registry already rejects chunks < 1
        raise InvalidParameterError(f"{NAME}: chunks must be >= 1, not {v}")
    mbs = np.arange(n)
    local = np.arange(v)
    count = v * n
    columns = ([], [], [], [], [])
    for r in range(p):
        forward_stages = np.repeat(local * p + r, n)
        backward_stages = np.repeat(local[::-1] * p + r, n)
        values = (np.full(2 * count, r), np.arange(2 * count),
                  np.repeat([FORWARD, BACKWARD], count),
                  np.concatenate([forward_stages, backward_stages]),
                  np.concatenate([np.tile(mbs, v), np.tile(mbs[::-1], v)]))
        for column, value in zip(columns, values):
            column.append(value)
    return table_from_columns(columns, p, num_stages=v * p, num_microbatches=n, family=NAME,
                              params={"devices": p, "microbatches": n, "chunks": v})


FAMILY = register(Family(
    name=NAME,
    summary="breadth-first: every microbatch through one local stage before the next "
            "(PyTorch ScheduleLoopedBFS; Lamy-Poirier 2022)",
    build=build,
    check=validate,
    parameters=(Parameter("devices", help=DEVICES),
                Parameter("microbatches", help=MICROBATCHES),
                Parameter("chunks", 2, "model chunks per device; chunk c of device r is "
                                       "stage c*p+r")),
    constraints="any devices, microbatches, chunks >= 1 (microbatches < devices stalls at "
                "each loop boundary)",
    notes="each device holds all v*M chunk activations at its peak, like GPipe; backwards "
          "run in reverse microbatch order; chunks=1 is GPipe with descending backwards",
    aliases=("bfs", "breadth-first"),
))
