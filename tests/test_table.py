import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tabsched import InvalidScheduleError, Op, Overlap, ScheduleTable
from tabsched.table import parse_cell


def test_rows_roundtrip_and_metadata():
    rows = [["0F0", "0F1", None, "0B0", "0B1"], [None, "1F0", "1B0", "1F1", "1B1"]]
    table = ScheduleTable(rows, family="hand", params={"note": 1})
    assert table.num_devices == 2 and table.num_stages == 2 and table.num_microbatches == 2
    assert [[None if c is None else str(c) for c in row] for row in table.rows] == \
        [["0F0", "0F1", None, "0B0", "0B1"], [None, "1F0", "1B0", "1F1", "1B1"]]
    assert table.num_slots == 5 and len(table) == 8
    assert table.metadata["family"] == "hand"
    assert table.placement() == {0: (0,), 1: (1,)}
    assert table == ScheduleTable(rows, family="hand", params={"note": 1})
    assert table != ScheduleTable(rows)


def test_cells_accept_ops_tuples_and_text():
    table = ScheduleTable([[Op("F", 0, 0), ("B", 0, 0), " 0F1 ", "0B1"]])
    assert table.orders() == [[Op("F", 0, 0), Op("B", 0, 0), Op("F", 0, 1), Op("B", 0, 1)]]


def test_overlap_cell_is_one_cell_with_two_ops():
    table = ScheduleTable([["0F0", "1F0", "(0F1;1B0)OVERLAP_F_B", "0B0", "1F1", "1B1", "0B1"]],
                          num_stages=2)
    assert len(table) == 8
    assert table.rows[0][2] == Overlap((Op("F", 0, 1), Op("B", 1, 0)))
    assert table.cell_starts().sum() == 7


@pytest.mark.parametrize("text,expected", [
    ("3F12", Op("F", 3, 12)), ("0W0", Op("W", 0, 0)), ("", None), ("  ", None),
    ("(0F7;7B3)OVERLAP_F_B", Overlap((Op("F", 0, 7), Op("B", 7, 3)))),
])
def test_parse_cell(text, expected):
    assert parse_cell(text) == expected


@pytest.mark.parametrize("text,message", [
    ("4X2", r'"4X2" is not an operation \(expected <stage><F\|B\|I\|W><microbatch>'),
    ("F3", r'"F3" is not an operation'),
    ("3F", r'"3F" is not an operation'),
    ("(0F7;7B3", r"has no closing parenthesis"),
    ("(0F7;7B3)OVERLAP", r'must end in OVERLAP_F_B, not "OVERLAP"'),
    ("(0F7;0F3)OVERLAP_F_B", r"holds one forward and one backward"),
    ("(0F7;7W3)OVERLAP_F_B", r"holds one forward and one backward"),
    ("(0F7;x)OVERLAP_F_B", r'"x" is not an operation'),
])
def test_parse_cell_errors(text, message):
    with pytest.raises(InvalidScheduleError, match=message):
        parse_cell(text)


@pytest.mark.parametrize("rows,kwargs,message", [
    ([["0F0", "4X2"]], {}, r'^device 0, slot 1: "4X2" is not an operation'),
    ([["0F0", "0B0"], ["5F0", "5B0"]], {"num_stages": 2},
     r"^device 1, slot 0: 5F0: stage 5 is out of range \(the table has stages 0..1\)"),
    ([["0F0", "0B0", "0F3", "0B3"]], {"num_microbatches": 2},
     r"^device 0, slot 2: 0F3: microbatch 3 is out of range \(the table has microbatches 0..1\)"),
    ([["0F0", "0B0", None, "0F0"]], {},
     r"^device 0, slot 3: 0F0 appears twice \(also at device 0, slot 0\)"),
    ([["0F0", "0B0", "0B1"]], {}, r"^device 0, slot 2: 0B1 has no forward \(0F1\)"),
    ([["0F0", "0F1", "0B1"]], {},
     r"^device 0, slot 0: 0F0 has no backward \(0B0, or 0I0 and 0W0\)"),
    ([["0F0", "0I0"]], {}, r"^device 0, slot 1: 0I0 has no weight-grad \(0W0\)"),
    ([["0F0", "0W0"]], {}, r"^device 0, slot 1: 0W0 has no input-grad \(0I0\)"),
    ([["0F0", "0B0", "0I0", "0W0"]], {},
     r"^device 0, slot 2: 0I0 splits a backward that 0B0 already runs whole"),
    ([["0F0", None], [None, "0B0"]], {},
     r"^device 1, slot 1: 0B0 is on device 1 but 0F0 is on device 0"),
    ([["0F1", "0B1"]], {"num_microbatches": 2},
     r"^stage 0, microbatch 0: no operation at all \(expected 0F0 and its backward\)"),
])
def test_validation_reports_first_problem_with_place(rows, kwargs, message):
    with pytest.raises(InvalidScheduleError, match=message):
        ScheduleTable(rows, **kwargs)


def test_first_problem_in_row_order_wins():
    # Two problems: 0I0 without 0W0 (device 0, slot 2) and stage 1 microbatch 0 split
    # over two devices (seen at device 1, slot 0). Reading row by row meets the first first.
    rows = [["0F0", "1F0", "0I0"], ["1B0", "0F1", "0B1"]]
    with pytest.raises(InvalidScheduleError, match=r"^device 0, slot 2: 0I0 has no weight-grad"):
        ScheduleTable(rows)


def test_metadata_validation():
    with pytest.raises(InvalidScheduleError, match="microbatch_sizes has 3 entries for 2"):
        ScheduleTable([["0F0", "0B0", "0F1", "0B1"]], num_microbatches=2,
                      microbatch_sizes=[1, 1, 1])
    with pytest.raises(InvalidScheduleError, match="microbatch_sizes must be positive"):
        ScheduleTable([["0F0", "0B0"]], microbatch_sizes=[0])
    with pytest.raises(InvalidScheduleError, match="stage_layers has 2 entries for 1 stages"):
        ScheduleTable([["0F0", "0B0"]], stage_layers=[1, 2])


def test_stage_on_two_devices_for_different_microbatches_is_valid():
    table = ScheduleTable([["0F0", "0B0", None], [None, "0F1", "0B1"]])
    assert table.placement() == {0: (0, 1)}


def test_from_arrays_sorts_and_freezes():
    table = ScheduleTable.from_arrays([0, 0], [1, 0], [1, 0], [0, 0], [0, 0], [2])
    assert [str(c) for c in table.rows[0]] == ["0F0", "0B0"]
    with pytest.raises(ValueError):
        table.kind[0] = 3


def test_replace_keeps_cells():
    table = ScheduleTable([["0F0", None, None, "0B0"], [None, "1F0", "1B0", None]])
    changed = table.replace(stage_layers=(3, 5), family="x")
    assert changed.stage_layers == (3, 5) and changed.family == "x"
    assert np.array_equal(changed.slot, table.slot)


def test_grad_sync_metadata():
    rows = [["0F0", "0B0"], ["1F0", "1B0"]]
    table = ScheduleTable(rows, grad_sync=[1, 0, 1])
    assert table.grad_sync == (0, 1) and table.metadata["grad_sync"] == (0, 1)
    assert table != ScheduleTable(rows) and "grad_sync" not in ScheduleTable(rows).metadata
    assert table.replace(family="x").grad_sync == (0, 1)
    with pytest.raises(InvalidScheduleError, match=r"grad_sync names stages \[0, 5\] but the "
                                                   r"table has stages 0\.\.1"):
        ScheduleTable(rows, grad_sync=[0, 5])
    with pytest.raises(InvalidScheduleError, match=r"grad_sync must be a list of stages, not 3"):
        ScheduleTable(rows, grad_sync=3)


def test_first_bad_cell_comes_before_a_later_microbatch_out_of_range():
    # PyTorch 2.13's Schedule1F1B shape: the last row skips microbatch 0 and runs microbatch M
    rows = [["0F0", "0F1", "0B0", "0B1"], ["1F1", "1B0", "1F2", "1B1"]]
    with pytest.raises(InvalidScheduleError, match=r"^device 1, slot 1: 1B0 has no forward "
                                                   r"\(1F0\)$"):
        ScheduleTable(rows, num_microbatches=2)
    with pytest.raises(InvalidScheduleError, match=r"^device 1, slot 2: 1F2: microbatch 2 is out "
                                                   r"of range"):
        ScheduleTable([["0F0", "0F1", "0B0", "0B1"], ["1F0", "1B0", "1F2", "1B1", "1F1"]],
                      num_microbatches=2)


@settings(max_examples=50, deadline=None)
@given(cells=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 9)), min_size=1,
                      max_size=30, unique=True),
       lengths=st.lists(st.integers(0, 12), min_size=4, max_size=4))
def test_row_lengths_reach_past_every_rows_last_slot(cells, lengths):
    """A row is as long as asked, or as its last slot needs: the largest slot of each
    device plus one (np.maximum.at), found on the sorted arrays."""
    device = np.array([d for d, _ in cells], dtype=np.int32)
    slot = np.array([s for _, s in cells], dtype=np.int32)
    table = ScheduleTable.from_arrays(device, slot, np.zeros(len(cells), np.int8),
                                      np.zeros(len(cells), np.int32),
                                      np.arange(len(cells), dtype=np.int32), lengths,
                                      validate=False)
    expected = np.array(lengths, dtype=np.int32)
    np.maximum.at(expected, device, slot + 1)
    assert np.array_equal(table.row_lengths, expected)
