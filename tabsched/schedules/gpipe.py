"""GPipe: every forward, then every backward (SCHEDULES.md §1).

Stage r on device r. PyTorch's ``ScheduleGPipe`` runs the backwards in
ascending microbatch order; some drawings use descending order, so the order
is a parameter.
"""

import numpy as np

from tabsched.exceptions import InvalidParameterError
from tabsched.schedules._common import DEVICES, MICROBATCHES, table_from_columns
from tabsched.schedules._registry import Family, Parameter, register
from tabsched.table import BACKWARD, FORWARD

ORDERS = ("ascending", "descending")


def validate(devices, microbatches, backward_order="ascending"):
    """Raise where :func:`build` would; the table's stage count otherwise."""
    if backward_order not in ORDERS:
        raise InvalidParameterError(f"gpipe: backward_order must be one of "
                                    f"{', '.join(ORDERS)}, not {backward_order!r}")
    return devices


def build(devices, microbatches, backward_order="ascending"):
    validate(devices, microbatches, backward_order)
    p, n = devices, microbatches
    mbs = np.arange(n, dtype=np.int32)
    backward_mbs = mbs if backward_order == "ascending" else mbs[::-1]
    columns = ([], [], [], [], [])
    for r in range(p):
        values = (np.full(2 * n, r), np.arange(2 * n),
                  np.repeat([FORWARD, BACKWARD], n), np.full(2 * n, r),
                  np.concatenate([mbs, backward_mbs]))
        for column, value in zip(columns, values):
            column.append(value)
    params = {"devices": p, "microbatches": n}
    if backward_order != "ascending":
        params["backward_order"] = backward_order
    return table_from_columns(columns, p, num_stages=p, num_microbatches=n,
                              family="gpipe", params=params)


FAMILY = register(Family(
    name="gpipe",
    summary="all forwards, then all backwards (Huang et al. 2019)",
    build=build,
    check=validate,
    parameters=(Parameter("devices", help=DEVICES),
                Parameter("microbatches", help=MICROBATCHES),
                Parameter("backward_order", "ascending",
                          "ascending (PyTorch) or descending microbatch order of the backwards")),
    constraints="any devices >= 1, microbatches >= 1",
    notes="each device holds all M activations at its peak",
))
