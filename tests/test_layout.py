import pytest

from tabsched import InvalidScheduleError
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
