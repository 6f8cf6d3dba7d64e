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

from tabsched.lower import INDEX, lower, offer_lowering
from tabsched.nodes import CELL
from tabsched.table import ScheduleTable, cell_columns, certainly_valid

__all__ = ["from_order", "from_order_arrays", "order_table", "lay_out", "unit_layout",
           "certainly_valid"]


def from_order(orders, **metadata):
    """Lay out per-device operation orders as unit-length execution would.

    ``orders[d]`` lists device d's cells in the order it runs them (no idle
    cells). Every cell gets one slot and starts as soon as its device is free
    and its dependencies are done; the table is as long as the last end.
    ``metadata`` are :class:`~tabsched.table.ScheduleTable`'s keywords.

    Raises ``DeadlockError`` if the orders contradict the dependencies.
    """
    devices, positions, kinds, stages, microbatches, _ = cell_columns(
        orders, "position", "an order lists operations, not idle cells")
    return from_order_arrays(devices, positions, kinds, stages, microbatches,
                             num_devices=len(orders), **metadata)


def from_order_arrays(device, position, kind, stage, microbatch, *, num_devices=None,
                      lazy=False, **metadata):
    """:func:`from_order` for generators that build their orders as arrays.

    ``position`` orders the operations of one device; operations sharing a
    device and position form one overlapped cell. ``lazy``: as :func:`lay_out`'s.
    """
    return lay_out(order_table(device, position, kind, stage, microbatch,
                               num_devices=num_devices, **metadata), lazy=lazy)


def order_table(device, position, kind, stage, microbatch, *, num_devices=None, **metadata):
    """The valid table whose slots are the positions of ``from_order_arrays``'s orders
    (no idle cell), before :func:`lay_out` places its cells.

    Row orders are all that evaluation reads, so this table evaluates as its layout
    does; only the idealized table level (idle cells) needs :func:`lay_out`.
    """
    device = np.asarray(device, dtype=np.int32)
    if num_devices is None:
        num_devices = int(device.max()) + 1 if len(device) else 0
    position = np.asarray(position, dtype=np.int32)
    lengths = np.zeros(num_devices, dtype=np.int32)
    if len(device) and np.all(device[1:] >= device[:-1]):
        # sorted by device, as generators give them: a maximum per row segment
        starts = np.searchsorted(device, np.arange(num_devices, dtype=np.int32))
        busy = np.flatnonzero(np.append(starts[1:], len(device)) > starts)
        lengths[busy] = np.maximum.reduceat(position, starts[busy]) + 1
    elif len(device):
        np.maximum.at(lengths, device, position + 1)
    order = ScheduleTable.from_arrays(device, position, kind, stage, microbatch, lengths,
                                      validate=False, **metadata)
    if not certainly_valid(order):
        order.validate(place="position")   # raises with the first problem's place
    return order


def lay_out(order, *, lazy=False):
    """``order`` (a valid table) with its cells in the slots of unit-length execution.

    Raises ``DeadlockError`` if the row orders contradict the dependencies.

    ``lazy=True`` leaves the layout for the first read of the table's ``slot`` or
    ``row_lengths`` (its grid, its rows, its length in slots): evaluation reads the
    row orders alone, so a table generated and evaluated never makes it. Only for
    orders known not to deadlock (the generators' orders, which the tests run):
    the ``DeadlockError`` of one that does comes when the slots are first read, or
    from the evaluation, naming the order's positions.
    """
    if lazy:
        return order._laid_out_later(_placed)
    lowered = lower(order)
    slots, lengths = unit_layout(order, lowered)
    # a row's cells take slots in its order, and every row is as long as the layout
    table = order._with_slots(slots, lengths)
    # Lowering reads the row orders, not the slots: the table's plain lowering is
    # the one just made; the next lower(table) takes it instead of redoing it.
    offer_lowering(table, lowered)
    return table


def _placed(order, table):
    """``(slots, row_lengths)`` of the valid table ``order`` laid out, for ``table``
    whose layout was left for later; its lowering is offered to ``table``'s next
    ``lower()``, as an eager layout's is."""
    lowered = lower(order)
    slots, lengths = unit_layout(order, lowered)
    offer_lowering(table, lowered)
    return slots, lengths


def unit_layout(table, lowered=None):
    """Slots of every operation and row lengths under unit-length execution.

    Every cell lasts one slot, communication is free: each cell's slot is the
    earliest at which its device is free and its dependencies are done. Every row
    is as long as the whole table (the last end), so cool-down idle shows.
    ``lowered``: ``lower(table)``, if at hand.
    """
    lowered = lower(table) if lowered is None else lowered
    cells = lowered.nodes(CELL)
    durations = np.zeros(lowered.num_nodes)
    durations[cells] = 1.0
    start, _, _ = lowered.run(durations, binding=False, end=False)
    start = start[0]
    makespan = int(start[cells].max()) + 1 if lowered.count(CELL) else 0
    slots = start[lowered.cell_of_op].astype(INDEX)
    return slots, np.full(table.num_devices, makespan, dtype=INDEX)
