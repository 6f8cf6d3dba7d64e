"""The idealized layout: per-device orders laid out in unit slots.

A generator states each device's order of operations; the *table* places every
cell in the slot where unit-length execution with free communication would run
it: as soon as its device is free and its dependencies are done. Every row is
as long as the whole table, so cool-down idle shows. The layout is a longest
path over the lowered table (:func:`tabsched.lower.lower`) with unit durations,
which is why it lives here and not in :mod:`tabsched.table`: a table does not
depend on the lowering.

>>> table = from_order([["0F0", "0F1", "0B0", "0B1"], ["1F0", "1B0", "1F1", "1B1"]])
>>> [[str(cell) if cell else None for cell in row] for row in table.rows]
[['0F0', '0F1', None, '0B0', None, '0B1'], [None, '1F0', '1B0', '1F1', '1B1', None]]
"""

import numpy as np

from tabsched.exceptions import InvalidScheduleError
from tabsched.lower import INDEX, lower
from tabsched.table import KIND_CODES, Overlap, ScheduleTable, coerce_cell

__all__ = ["from_order", "from_order_arrays", "unit_layout"]


def from_order(orders, **metadata):
    """Lay out per-device operation orders as unit-length execution would.

    ``orders[d]`` lists device d's cells in the order it runs them (no idle
    cells). Every cell gets one slot and starts as soon as its device is free
    and its dependencies are done; the table is as long as the last end.
    ``metadata`` are :class:`~tabsched.table.ScheduleTable`'s keywords.

    Raises ``DeadlockError`` if the orders contradict the dependencies.
    """
    devices, positions, kinds, stages, microbatches = [], [], [], [], []
    for device, order in enumerate(orders):
        for position, cell in enumerate(order):
            try:
                cell = coerce_cell(cell)
            except InvalidScheduleError as error:
                raise InvalidScheduleError(
                    f"device {device}, position {position}: {error}") from None
            if cell is None:
                raise InvalidScheduleError(f"device {device}, position {position}: an order "
                                           f"lists operations, not idle cells")
            for op in (cell.parts if isinstance(cell, Overlap) else (cell,)):
                devices.append(device)
                positions.append(position)
                kinds.append(KIND_CODES[op.kind])
                stages.append(op.stage)
                microbatches.append(op.microbatch)
    return from_order_arrays(devices, positions, kinds, stages, microbatches,
                             num_devices=len(orders), **metadata)


def from_order_arrays(device, position, kind, stage, microbatch, *, num_devices=None,
                      **metadata):
    """:func:`from_order` for generators that build their orders as arrays.

    ``position`` orders the operations of one device; operations sharing a
    device and position form one overlapped cell.
    """
    device = np.asarray(device, dtype=np.int32)
    if num_devices is None:
        num_devices = int(device.max()) + 1 if len(device) else 0
    position = np.asarray(position, dtype=np.int32)
    lengths = np.zeros(num_devices, dtype=np.int32)
    if len(device):
        np.maximum.at(lengths, device, position + 1)
    order = ScheduleTable.from_arrays(device, position, kind, stage, microbatch, lengths,
                                      validate=False, **metadata)
    order.validate(place="position")
    slots, lengths = unit_layout(order)
    return ScheduleTable.from_arrays(order.device, slots, order.kind, order.stage,
                                     order.microbatch, lengths, validate=False,
                                     **order.metadata)


def unit_layout(table):
    """Slots of every operation and row lengths under unit-length execution.

    Every cell lasts one slot, communication is free: each cell's slot is the
    earliest at which its device is free and its dependencies are done. Every row
    is as long as the whole table (the last end), so cool-down idle shows.
    """
    lowered = lower(table)
    durations = np.zeros(lowered.num_nodes)
    durations[:lowered.num_cells] = 1.0
    start, end, _ = lowered.run(durations, binding=False)
    makespan = int(end[0].max()) if lowered.num_nodes else 0
    slots = start[0, :lowered.num_cells].astype(INDEX)[lowered.cell_of_op]
    return slots, np.full(table.num_devices, makespan, dtype=INDEX)
