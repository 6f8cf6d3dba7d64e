"""Helpers shared by the generators: parameters, and orders built as arrays."""

import numpy as np

from tabsched.layout import from_order_arrays
from tabsched.table import KIND_CODES

DEVICES = "pipeline depth: number of devices (the papers' S or p)"
MICROBATCHES = "microbatches per iteration (the papers' M or N)"


class OrderBuilder:
    """Collects per-device operation orders, then lays them out (when the table's
    slots are first read: ``layout.lay_out(lazy=True)``; a generator's orders do not
    deadlock, which the tests check family by family).

    ``add(device, kind, stage, microbatch)`` appends one operation to the
    device's order; ``add_overlap(device, parts)`` appends parts run as one step.
    Operations are kept as one list of tuples, turned into columns once.
    """

    def __init__(self, num_devices):
        self.num_devices = num_devices
        self._ops = []
        self._length = [0] * num_devices

    def add(self, device, kind, stage, microbatch):
        position = self._length[device]
        self._ops.append((device, position, KIND_CODES[kind], stage, microbatch))
        self._length[device] = position + 1

    def add_overlap(self, device, parts):
        position = self._length[device]
        for kind, stage, microbatch in parts:
            self._ops.append((device, position, KIND_CODES[kind], stage, microbatch))
        self._length[device] = position + 1

    def table(self, **metadata):
        ops = np.array(self._ops, dtype=np.int64).reshape(-1, 5)
        return from_order_arrays(*(np.ascontiguousarray(column) for column in ops.T),
                                 num_devices=self.num_devices, lazy=True, **metadata)


def table_from_columns(columns, num_devices, **metadata):
    """Lay out orders given as numpy columns (device, position, kind, stage, microbatch),
    the layout made when the table's slots are first read (``lay_out(lazy=True)``)."""
    device, position, kind, stage, microbatch = (
        np.concatenate(column, dtype=dtype, casting="same_kind") if len(column)
        else np.zeros(0, dtype=dtype)
        for column, dtype in zip(columns, (np.int32, np.int32, np.int8, np.int32, np.int32)))
    return from_order_arrays(device, position, kind, stage, microbatch,
                             num_devices=num_devices, lazy=True, **metadata)
