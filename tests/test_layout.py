import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

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


# ------------------------------------------------ a generator's layout, made when read
def _fixed_families():
    from tabsched.schedules import families
    return [family.name for family in families() if not family.cost_driven]


def _generated_or_none(family, devices, microbatches):
    from tabsched import InvalidParameterError
    try:
        return generate(family, devices=devices, microbatches=microbatches)
    except InvalidParameterError:       # sizes the family refuses
        return None


@settings(max_examples=60, deadline=None)
@given(family=st.sampled_from(_fixed_families()), devices=st.integers(1, 8),
       microbatches=st.integers(1, 20), comm=st.sampled_from([0.0, 0.25]))
def test_a_generated_table_evaluates_without_its_layout_as_the_laid_out_table(
        family, devices, microbatches, comm):
    """A generator's table makes its layout when its slots are first read; until then
    evaluation reads its row orders alone, and every number (starts, ends, makespan,
    critical path, memory, links) is the eagerly laid out table's."""
    from tabsched import StageCosts, UnitCosts, evaluate
    from tabsched.layout import lay_out
    lazy = _generated_or_none(family, devices, microbatches)
    assume(lazy is not None)
    assert not lazy.laid_out
    eager = lay_out(lazy._order)          # the same order, laid out at once
    costs = UnitCosts(f=1, b=2, i=1, w=1) if comm == 0.0 else StageCosts(1.0, comm=comm)
    mine, theirs = evaluate(lazy, costs), evaluate(eager, costs)
    assert not lazy.laid_out                                  # evaluating did not lay it out
    assert np.array_equal(mine.op_start, theirs.op_start)
    assert np.array_equal(mine.op_end, theirs.op_end)
    assert mine.makespan == theirs.makespan and mine.devices == theirs.devices
    assert np.array_equal(mine._node_start, theirs._node_start)
    assert mine.links == theirs.links
    assert not lazy.laid_out
    # the critical path names its cells' slots: reading it makes the layout
    assert mine.critical_path == theirs.critical_path
    # the slots, when read, are the eager layout's, and then the tables are equal
    assert np.array_equal(lazy.slot, eager.slot) and lazy.laid_out
    assert not lazy.slot.flags.writeable and not lazy.row_lengths.flags.writeable
    assert np.array_equal(lazy.row_lengths, eager.row_lengths)
    assert lazy == eager and lazy.rows == eager.rows
    assert mine.to_dict(ops=True) == theirs.to_dict(ops=True)


def test_a_lazy_layout_is_made_by_any_reader_of_the_slots_and_pickles_laid_out():
    import pickle
    from tabsched.layout import lay_out
    for read in (lambda t: t.slot, lambda t: t.row_lengths, lambda t: t.rows,
                 lambda t: t.num_slots, lambda t: repr(t), lambda t: pickle.dumps(t)):
        table = generate("zbv", devices=4, microbatches=8)
        assert not table.laid_out and table.num_devices == 4 and len(table) == 192
        order = table._order
        read(table)
        assert table.laid_out and table._order is None
        assert table == lay_out(order)
    table = generate("1f1b", devices=4, microbatches=8)
    copy = pickle.loads(pickle.dumps(table))
    assert copy.laid_out and copy == table and table.laid_out
    assert copy.rows == from_order(table.orders()).rows


def test_a_lazy_layout_of_an_order_that_deadlocks_raises_when_read():
    """Generators never give such an order (the tests run every family); if one did,
    reading the slots, or evaluating, raises the DeadlockError the eager layout
    raises, naming the order's positions."""
    from tabsched import DeadlockError, evaluate
    from tabsched.layout import lay_out, order_table
    from tabsched.table import BACKWARD, FORWARD
    # device 1 runs 1B0 before 1F0
    columns = ([0, 0, 1, 1], [0, 1, 0, 1], [FORWARD, BACKWARD, BACKWARD, FORWARD],
               [0, 0, 1, 1], [0, 0, 0, 0])
    order = order_table(*(np.array(column) for column in columns), num_devices=2)
    with pytest.raises(DeadlockError) as eager:
        lay_out(order)
    lazy = lay_out(order, lazy=True)
    with pytest.raises(DeadlockError) as read:
        lazy.slot
    assert str(read.value) == str(eager.value)
    assert not lazy.laid_out                      # nothing changed: it raises again
    with pytest.raises(DeadlockError):
        lazy.row_lengths
    with pytest.raises(DeadlockError):
        evaluate(lazy)


def test_a_lazy_layout_offers_its_lowering_to_the_next_lower():
    """Reading the slots lowers the order; that lowering serves the table's next
    lower(), as an eager layout's does, and equals one made afresh."""
    from tabsched.lower import lower
    table = generate("interleaved-1f1b", devices=4, microbatches=8, chunks=2)
    assert table._lowering is None
    table.rows
    assert table._lowering is not None
    fresh = lower(table._order if table._order is not None else table.replace())
    reused = lower(table)
    assert table._lowering is None and reused.table is table
    for name in ("cell_of_op", "cell_device", "indptr", "successors", "kind_bounds"):
        assert np.array_equal(getattr(fresh, name), getattr(reused, name)), name
