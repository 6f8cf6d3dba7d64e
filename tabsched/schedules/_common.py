"""Helpers shared by the generators: parameters, and orders built as arrays."""

import numpy as np

from tabsched.layout import from_order_arrays
from tabsched.table import KIND_CODES

DEVICES = "pipeline depth: number of devices (the papers' S or p)"
MICROBATCHES = "microbatches per iteration (the papers' M or N)"


class OrderBuilder:
    """Collects per-device operation orders, then lays them out.

    ``add(device, kind, stage, microbatch)`` appends one operation to the
    device's order; ``add_overlap(device, parts)`` appends parts run as one step.
    """

    def __init__(self, num_devices):
        self.num_devices = num_devices
        self._columns = ([], [], [], [], [])
        self._length = [0] * num_devices

    def add(self, device, kind, stage, microbatch):
        devices, positions, kinds, stages, microbatches = self._columns
        devices.append(device)
        positions.append(self._length[device])
        kinds.append(KIND_CODES[kind])
        stages.append(stage)
        microbatches.append(microbatch)
        self._length[device] += 1

    def add_overlap(self, device, parts):
        position = self._length[device]
        for kind, stage, microbatch in parts:
            self.add(device, kind, stage, microbatch)
            self._length[device] = position
        self._length[device] = position + 1

    def table(self, **metadata):
        return from_order_arrays(*self._columns, num_devices=self.num_devices,
                                               **metadata)


def table_from_columns(columns, num_devices, **metadata):
    """Lay out orders given as numpy columns (device, position, kind, stage, microbatch)."""
    device, position, kind, stage, microbatch = (
        np.concatenate(column, dtype=dtype, casting="same_kind") if len(column)
        else np.zeros(0, dtype=dtype)
        for column, dtype in zip(columns, (np.int32, np.int32, np.int8, np.int32, np.int32)))
    return from_order_arrays(device, position, kind, stage, microbatch,
                                           num_devices=num_devices, **metadata)
