"""Free transfers as direct edges (lower(free_transfers=True), issue 24): where every
transfer lasts 0, evaluate() runs a lowering with no transfer node, and the Result is
the one the lowering with transfer nodes gives, in everything it says."""

from unittest import mock

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import tabsched
from tabsched import InvalidParameterError, StageCosts, UnitCosts, generate
from tabsched._testing import random_table
from tabsched.costs.base import CostModel
from tabsched.formats.perfetto import chrome_trace
from tabsched.lower import lower
from tabsched.nodes import CELL, TRANSFER

FAMILIES = ["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zbv", "dualpipev", "chimera",
            "hanayo"]


def with_transfer_nodes(table, costs, **options):
    """``evaluate`` as it ran before: the costs' transfers not taken as free."""
    with mock.patch.object(type(costs), "free_transfers", property(lambda self: False)):
        return tabsched.evaluate(table, costs, **options)


def assert_same_results(direct, full, trace=True):
    assert "_cells" in direct.__dict__ and "_cells" not in full.__dict__
    assert direct.makespan == full.makespan and direct.bubble_ratio == full.bubble_ratio
    assert direct.devices == full.devices and direct.formula == full.formula
    assert direct.notes == full.notes and direct.execution == full.execution
    np.testing.assert_array_equal(direct.op_start, full.op_start)
    np.testing.assert_array_equal(direct.op_end, full.op_end)
    for (times, values), (their_times, their_values) in zip(direct.memory_timeline(),
                                                            full.memory_timeline()):
        np.testing.assert_array_equal(times, their_times)
        np.testing.assert_array_equal(values, their_values)
    # read before any view of the transfers: the cells' run served the above
    assert "_cells" in direct.__dict__
    assert direct.critical_path == full.critical_path
    assert direct.critical_counts() == full.critical_counts()
    assert direct.links == full.links
    np.testing.assert_array_equal(direct._node_start, full._node_start)
    np.testing.assert_array_equal(direct._node_durations, full._node_durations)
    np.testing.assert_array_equal(direct._binding, full._binding)
    for name in ("kind_bounds", "cell_of_op", "indptr", "successors"):
        assert np.array_equal(getattr(direct._lowered, name), getattr(full._lowered, name))
    assert direct.steady_period == full.steady_period
    assert direct.to_dict(ops=True) == full.to_dict(ops=True)
    if trace:       # transfers drawn, path marked
        assert chrome_trace(direct) == chrome_trace(full)


COSTS = st.one_of(
    st.builds(UnitCosts, f=st.sampled_from([0.0, 0.5, 1.0, 3.0]),
              b=st.sampled_from([0.0, 1.0, 2.0]), i=st.sampled_from([0.5, 1.0]),
              w=st.sampled_from([0.0, 1.0])),
    st.builds(StageCosts, st.sampled_from([0.25, 1.0, 2.0]), comm=st.just(0.0)))


@given(family=st.sampled_from(FAMILIES), devices=st.sampled_from([1, 2, 4, 6]),
       microbatches=st.integers(1, 12), costs=COSTS)
def test_a_generated_tables_result_is_the_one_with_transfer_nodes(family, devices,
                                                                  microbatches, costs):
    try:
        table = generate(family, devices=devices, microbatches=microbatches)
    except InvalidParameterError:
        assume(False)
    again = generate(family, devices=devices, microbatches=microbatches)
    assert_same_results(tabsched.evaluate(table, costs), with_transfer_nodes(again, costs))


@given(seed=st.integers(0, 2**31), costs=COSTS)
def test_a_random_tables_result_is_the_one_with_transfer_nodes(seed, costs):
    """Random tables: overlapped cells, replicated stages, split backwards, uneven
    microbatches; zero-length cells (ties everywhere) among the costs."""
    table = random_table(seed)
    full = with_transfer_nodes(table, costs)   # takes the lowering its layout offered
    assert_same_results(tabsched.evaluate(table, costs), full)


def test_the_direct_lowering_has_no_transfer_node_and_the_same_cells():
    table = generate("1f1b", devices=4, microbatches=8)
    direct, full = lower(table, free_transfers=True), lower(table)
    assert direct.direct and not full.direct and len(direct.transfers) == 0
    assert direct.count(TRANSFER) == 0 and direct.num_nodes == full.count(CELL)
    assert np.array_equal(direct.cell_of_op, full.cell_of_op)
    # every transfer's dependency is an edge producer -> consumer instead
    assert direct.num_edges == full.num_edges - 2 * len(full.transfers) + len(full.transfers)
    again = direct.with_transfers()
    assert not again.direct and full.with_transfers() is full
    for name in ("kind_bounds", "indptr", "successors"):
        assert np.array_equal(getattr(again, name), getattr(full, name))
    durations = UnitCosts().node_durations(direct)
    start = direct.run(durations, binding=False)[0][0]
    full_start = full.run(UnitCosts().node_durations(full), binding=False)[0][0]
    np.testing.assert_array_equal(direct.transfer_starts(start, durations, again), full_start)


@pytest.mark.parametrize("options", [dict(contention="link"), dict(p2p="blocking"),
                                     dict(optimizer=True), dict(grad_sync="all"),
                                     dict(transfer_after=(np.zeros(0, int), np.zeros(0, int)))])
def test_free_transfers_is_ignored_where_a_transfer_waits_for_more(options):
    """Only a plain lowering under contention none: there a transfer's one predecessor is
    its producer; elsewhere the transfers stay nodes."""
    table = generate("1f1b", devices=4, microbatches=8)
    assert not lower(table, free_transfers=True, **options).direct


def test_which_costs_price_transfers_at_zero():
    assert UnitCosts().free_transfers and StageCosts(1.0).free_transfers
    assert not StageCosts(1.0, comm=0.5).free_transfers
    assert not StageCosts(1.0, comm=np.zeros((2, 2))).free_transfers
    assert not tabsched.ModelCosts("paper-128l", "mid_nw_mid_cp").free_transfers

    class Priced(UnitCosts):
        def transfer_costs(self, table, transfers):
            return np.ones(len(transfers)), np.zeros(len(transfers))
    assert not Priced().free_transfers
    assert CostModel.free_transfers.fget(UnitCosts())


def test_a_direct_result_pickles_and_makes_its_transfers_after():
    import pickle
    table = generate("1f1b", devices=4, microbatches=8)
    result = tabsched.evaluate(table, UnitCosts())
    copy = pickle.loads(pickle.dumps(result))
    assert "_cells" in copy.__dict__
    assert copy.critical_path == result.critical_path and copy.links == result.links


def test_a_deadlock_is_named_as_with_transfer_nodes():
    from tabsched import DeadlockError, ScheduleTable
    rows = [["0F0", "0B0", "0F1", "0B1"], ["1F1", "1F0", "1B0", "1B1"]]
    errors = []
    for evaluate in (tabsched.evaluate, with_transfer_nodes):
        with pytest.raises(DeadlockError) as error:
            evaluate(ScheduleTable(rows), UnitCosts())
        errors.append(error.value)
    assert str(errors[0]) == str(errors[1]) and errors[0].cycle == errors[1].cycle
    assert errors[0].nodes == errors[1].nodes
