"""The Cython kernel's event passes against their plain-Python twins, the Graph's
checks and the status codes."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tabsched import _kernel, _reference
from tabsched._testing import kernel_graphs, kernel_scratch, random_durations, random_table
from tabsched.lower import lower

I32 = np.int32
MODULES = (_kernel, _reference)


def fifo_both(lowered, durations, *, binding=True):
    outputs = []
    samples, n = durations.shape
    for module, graph in zip(MODULES, kernel_graphs(lowered, MODULES)):
        start = np.full((samples, n), np.nan)
        bound = np.full(n if binding else 0, -7, dtype=I32)
        scratch = kernel_scratch(module, graph)
        status = module.fifo_starts(graph, durations, start, bound, scratch)
        outputs.append((status, start, bound, scratch.indegree))
    return outputs


@given(seed=st.integers(0, 2**32 - 1), contention=st.sampled_from(["none", "link", "nic"]),
       samples=st.integers(1, 3), integer=st.booleans())
def test_event_pass_equals_reference(seed, contention, samples, integer):
    table = random_table(seed)
    lowered = lower(table, contention=contention, devices_per_node=2)
    durations = random_durations(lowered, seed, samples=samples, integer=integer)
    (status_k, start_k, bind_k, _), (status_r, start_r, bind_r, _) = fifo_both(lowered,
                                                                             durations)
    assert status_k == status_r == _kernel.OK
    np.testing.assert_array_equal(start_k, start_r)
    np.testing.assert_array_equal(bind_k, bind_r)


@given(seed=st.integers(0, 2**32 - 1))
def test_event_pass_equals_reference_on_deadlocks(seed):
    table = random_table(seed)
    rng = np.random.default_rng(seed)
    orders = table.orders()
    device = int(rng.integers(len(orders)))
    rng.shuffle(orders[device])
    from tabsched import ScheduleTable
    shuffled = ScheduleTable.from_arrays(*_order_arrays(orders), table.row_lengths,
                                         **table.metadata)
    lowered = lower(shuffled, contention="link")
    durations = random_durations(lowered, seed)
    (status_k, *_, deg_k), (status_r, *_, deg_r) = fifo_both(lowered, durations)
    assert status_k == status_r
    assert (status_k == _kernel.DEADLOCK) == (lowered.unfinished is not None)
    if status_k == _kernel.DEADLOCK:
        np.testing.assert_array_equal(deg_k > 0, deg_r > 0)
        np.testing.assert_array_equal(deg_k > 0, lowered.unfinished > 0)


def _order_arrays(orders):
    from tabsched.table import KIND_CODES, Overlap
    columns = ([], [], [], [], [])
    for device, order in enumerate(orders):
        for slot, cell in enumerate(order):
            for op in (cell.parts if isinstance(cell, Overlap) else (cell,)):
                for column, value in zip(columns, (device, slot, KIND_CODES[op.kind],
                                                   op.stage, op.microbatch)):
                    column.append(value)
    return columns


def _edges(indptr, successors, n, resources=None, n_resources=0):
    """The status of adding these edges to a Graph of ``n`` nodes, the same in both."""
    resources = np.empty((n, 0), dtype=I32) if resources is None else resources
    statuses = {module.Graph(n).add_edges(np.asarray(indptr, I32), np.asarray(successors, I32),
                                          resources, n_resources) for module in MODULES}
    assert len(statuses) == 1, statuses
    return statuses.pop()


def test_a_graph_checks_its_edges_once():
    assert _edges([0, 1, 1], [1], 2) == _kernel.OK
    assert _edges([0, 1, 1], [5], 2) == _kernel.BAD_INDEX
    assert _edges([0, 1, 1], [-1], 2) == _kernel.BAD_INDEX
    assert _edges([0, 2, 1], [1, 0], 2) == _kernel.BAD_SHAPE      # indptr decreasing
    assert _edges([0, 1, 3], [1], 2) == _kernel.BAD_SHAPE         # indptr past successors
    assert _edges([0, 1, 1], [1], 3) == _kernel.BAD_SHAPE         # offsets for 2 nodes
    bad_resource = np.array([[3], [-1]], dtype=I32)
    assert _edges([0, 1, 1], [1], 2, resources=bad_resource, n_resources=1) == \
        _kernel.BAD_INDEX
    assert _edges([0, 1, 1], [1], 2, resources=bad_resource, n_resources=4) == _kernel.OK
    assert _edges([0, 1, 2], [1, 0], 2) == _kernel.OK             # a cycle is the pass's
    graph = _kernel.Graph(2)
    indptr = np.array([0, 1, 1], I32)
    assert graph.add_edges(indptr, np.array([1], I32), np.empty((2, 0), I32), 0) == _kernel.OK
    assert not indptr.flags.writeable             # what was checked stays so
    assert graph.add_edges(indptr, np.array([1], I32), np.empty((2, 0), I32), 0) == \
        _kernel.BAD_SHAPE                         # a part is added once
    with pytest.raises(ValueError):
        _kernel.Graph(-1)


def test_a_graph_checks_its_devices_once():
    for module in MODULES:
        assert module.Graph(2).add_devices(np.array([0, 3], I32), 2) == _kernel.BAD_INDEX
        assert module.Graph(2).add_devices(np.array([-1, -2], I32), 2) == _kernel.BAD_INDEX
        assert module.Graph(2).add_devices(np.array([-1, 1], I32), 2) == _kernel.OK
        assert module.Graph(2).add_devices(np.array([0], I32), 2) == _kernel.BAD_SHAPE


def test_passes_refuse_a_graph_without_the_part_they_read():
    for module in MODULES:
        graph = module.Graph(2)
        scratch = kernel_scratch(module, graph, 2)
        assert module.fifo_starts(graph, np.ones((1, 2)), np.zeros((1, 2)), np.zeros(0, I32),
                                  scratch) == _kernel.BAD_SHAPE
        assert module.longest_path_starts(graph, np.ones((1, 2)), np.zeros((1, 2)),
                                          np.zeros(0, I32), scratch) == _kernel.BAD_SHAPE


def test_the_event_pass_checks_its_shapes():
    table = random_table(3)
    lowered = lower(table, contention="link")
    n = lowered.num_nodes
    for module, graph in zip(MODULES, kernel_graphs(lowered, MODULES)):
        scratch = kernel_scratch(module, graph)
        assert module.fifo_starts(graph, np.ones((1, n + 1)), np.zeros((1, n + 1)),
                                  np.zeros(0, I32), scratch) == _kernel.BAD_SHAPE
        assert module.fifo_starts(graph, np.ones((2, n)), np.zeros((1, n)), np.zeros(0, I32),
                                  scratch) == _kernel.BAD_SHAPE
        short = module.Scratch(np.zeros(n, I32), np.zeros(n), np.zeros(n, I32), np.zeros(0),
                               np.zeros(0, I32), np.zeros(0))
        assert module.fifo_starts(graph, np.ones((1, n)), np.zeros((1, n)), np.zeros(0, I32),
                                  short) == (_kernel.BAD_SHAPE if lowered.num_resources
                                             else _kernel.OK)


def test_find_cycle_matches_reference():
    # 0 -> 1 -> 2 -> 1 (cycle 1, 2), and 2 -> 3
    pred_indptr = np.array([0, 0, 2, 3, 4], dtype=I32)
    predecessors = np.array([0, 2, 1, 2], dtype=I32)
    remaining = np.array([0, 1, 1, 1], dtype=I32)
    out = []
    for module in MODULES:
        cycle = np.zeros(4, dtype=I32)
        length = module.find_cycle(pred_indptr, predecessors, remaining, cycle,
                                   np.zeros(4, dtype=I32))
        out.append(list(cycle[:length]))
    assert out[0] == out[1]
    assert sorted(out[0]) == [1, 2]


def test_find_cycle_on_nothing_unfinished():
    cycle = np.zeros(2, dtype=I32)
    assert _kernel.find_cycle(np.array([0, 0, 1], dtype=I32), np.array([0], dtype=I32),
                              np.zeros(2, dtype=I32), cycle,
                              np.zeros(2, dtype=I32)) == 0


def test_kernel_rejects_wrong_dtypes_without_crashing():
    with pytest.raises((TypeError, ValueError)):
        _kernel.Graph(1).add_edges(np.array([0, 0], dtype=np.int64), np.zeros(0, dtype=I32),
                                   np.empty((1, 0), dtype=I32), 0)
    graph = _kernel.Graph(1)
    assert graph.add_edges(np.array([0, 0], I32), np.zeros(0, I32), np.empty((1, 0), I32),
                           0) == _kernel.OK
    with pytest.raises((TypeError, ValueError)):
        _kernel.fifo_starts(graph, np.ones((1, 1), dtype=np.float32), np.zeros((1, 1)),
                            np.zeros(0, I32), kernel_scratch(_kernel, graph))
    with pytest.raises(TypeError):
        _kernel.fifo_starts(np.zeros(3, I32), np.ones((1, 1)), np.zeros((1, 1)),
                            np.zeros(0, I32), kernel_scratch(_kernel, graph))
