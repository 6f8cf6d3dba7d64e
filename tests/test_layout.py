import numpy as np
import pytest

from tabsched import InvalidScheduleError, ScheduleTable, generate
from tabsched.layout import from_order


def test_from_order_lays_out_unit_slots():
    table = from_order([["0F0", "0F1", "0B0", "0B1"], ["1F0", "1B0", "1F1", "1B1"]])
    assert [[None if c is None else str(c) for c in row] for row in table.rows] == [
        ["0F0", "0F1", None, "0B0", None, "0B1"],
        [None, "1F0", "1B0", "1F1", "1B1", None]]
    assert list(table.row_lengths) == [6, 6]


def test_from_order_rejects_idle_cells_and_names_position():
    with pytest.raises(InvalidScheduleError, match="device 0, position 1: an order lists"):
        from_order([["0F0", None, "0B0"]])
    with pytest.raises(InvalidScheduleError, match="device 0, position 1: 0F0 appears twice"):
        from_order([["0F0", "0F0", "0B0"]])


@pytest.mark.parametrize("family, params", [
    ("1f1b", {}), ("zbv", {}), ("chimera", {}), ("dualpipe", {}), ("hanayo", {"waves": 2}),
    ("interleaved-1f1b", {"chunks": 3}), ("zb-h2", {}),
])
def test_a_laid_out_table_is_what_from_arrays_builds(family, params):
    """lay_out copies the order table with the new slots (no second round of checks);
    the table is the one from_arrays builds from those slots and the metadata."""
    from tabsched.layout import lay_out, order_table, unit_layout
    made = generate(family, devices=4, microbatches=8, **params)
    order = order_table(made.device, made.slot, made.kind, made.stage, made.microbatch,
                        num_devices=made.num_devices, **made.metadata)
    laid = lay_out(order)
    slots, lengths = unit_layout(order)
    built = ScheduleTable.from_arrays(order.device, slots, order.kind, order.stage,
                                      order.microbatch, lengths, validate=False,
                                      **order.metadata)
    for name in ScheduleTable.__slots__:
        if name in ("_rows", "_lowering"):       # caches: the rows view, the offered lowering
            continue
        mine, theirs = getattr(laid, name), getattr(built, name)
        if isinstance(mine, np.ndarray):
            assert mine.dtype == theirs.dtype and np.array_equal(mine, theirs), name
            assert not mine.flags.writeable
        else:
            assert mine == theirs, name
    assert laid == built == made and laid.params is not order.params
