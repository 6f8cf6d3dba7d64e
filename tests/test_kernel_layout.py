"""The topological layout, the pull passes and the fused Monte Carlo pass: kernel
against twin, and against the event pass where no resource is held."""

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tabsched import _kernel, _reference
from tabsched._testing import kernel_graphs, kernel_scratch, random_durations, random_table
from tabsched.engine import NoisyDurations
from tabsched.lower import lower

I32 = np.int32
MODULES = (_kernel, _reference)


def layout_both(indptr, successors):
    outputs = []
    n = len(indptr) - 1
    for module in MODULES:
        order = np.full(n, -9, I32)
        pred_indptr = np.full(n + 1, -9, I32)
        predecessors = np.full(len(successors), -9, I32)
        scratch = np.full(n, -9, I32)
        status = module.topological(np.asarray(indptr, I32), np.asarray(successors, I32),
                                    order, pred_indptr, predecessors, scratch)
        outputs.append((status, order, pred_indptr, predecessors, scratch))
    return outputs


@given(seed=st.integers(0, 2**32 - 1), tail=st.booleans(), blocking=st.booleans())
def test_layout_equals_reference_and_points_backwards(seed, tail, blocking):
    table = random_table(seed)
    lowered = lower(table, blocking_sends=blocking, grad_sync="all" if tail else None,
                    optimizer=tail)
    kernel, reference = layout_both(lowered.indptr, lowered.successors)
    assert kernel[0] == reference[0] == _kernel.OK
    for mine, theirs in zip(kernel[1:4], reference[1:4]):
        np.testing.assert_array_equal(mine, theirs)
    status, order, pred_indptr, predecessors, _ = kernel
    position = np.argsort(order)
    # every edge v -> u appears once, as position[v] in the list of position[u], below it
    sources = np.repeat(np.arange(lowered.num_nodes), np.diff(lowered.indptr))
    expected = sorted(zip(position[lowered.successors].tolist(), position[sources].tolist()))
    targets = np.repeat(np.arange(lowered.num_nodes), np.diff(pred_indptr))
    assert sorted(zip(targets.tolist(), predecessors.tolist())) == expected
    assert np.all(predecessors < targets)
    np.testing.assert_array_equal(order, lowered.topo_order)


@given(seed=st.integers(0, 2**32 - 1))
def test_layout_deadlocks_like_the_event_kernel(seed):
    table = random_table(seed, max_devices=2)
    rng = np.random.default_rng(seed)
    lowered = lower(table)
    # reverse one device's row: a cycle unless the row has one cell
    successors = lowered.successors.copy()
    kernel, reference = layout_both(lowered.indptr, np.concatenate([successors, [0]])[:-1])
    assert kernel[0] == reference[0] == _kernel.OK
    extra_source = int(rng.integers(lowered.num_nodes))
    extra_target = 0 if extra_source else lowered.num_nodes - 1
    indptr = lowered.indptr.copy()
    indptr[extra_source + 1:] += 1
    successors = np.insert(lowered.successors, lowered.indptr[extra_source + 1],
                           extra_target).astype(I32)
    kernel, reference = layout_both(indptr, successors)
    assert kernel[0] == reference[0]
    if kernel[0] == _kernel.DEADLOCK:
        np.testing.assert_array_equal(kernel[4] > 0, reference[4] > 0)


def pull_both(lowered, durations, *, binding=True, by_position=False):
    outputs = []
    n = lowered.num_nodes
    for module, graph in zip(MODULES, kernel_graphs(lowered, MODULES)):
        start = np.full(durations.shape, np.nan)
        bound = np.full(n if binding else 0, -7, I32)
        status = module.longest_path_starts(graph, durations, start, bound,
                                            kernel_scratch(module, graph, n), by_position)
        outputs.append((status, start, bound))
    return outputs


def event_pass(lowered, durations):
    """The event pass's starts (it holds every resource-free lowering too)."""
    graph, = kernel_graphs(lowered, (_kernel,))
    start = np.zeros(durations.shape)
    assert _kernel.fifo_starts(graph, durations, start, np.zeros(lowered.num_nodes, I32),
                               kernel_scratch(_kernel, graph)) == _kernel.OK
    return start


@given(seed=st.integers(0, 2**32 - 1), samples=st.integers(1, 3), integer=st.booleans(),
       tail=st.booleans())
def test_pull_pass_equals_reference_and_the_event_pass(seed, samples, integer, tail):
    table = random_table(seed)
    lowered = lower(table, grad_sync="all" if tail else None, optimizer=tail)
    durations = random_durations(lowered, seed, samples=samples, integer=integer)
    (status_k, start_k, bound_k), (status_r, start_r, bound_r) = pull_both(lowered, durations)
    assert status_k == status_r == _kernel.OK
    np.testing.assert_array_equal(start_k, start_r)
    np.testing.assert_array_equal(bound_k, bound_r)
    # the same numbers as the event order, to the bit
    np.testing.assert_array_equal(start_k, event_pass(lowered, durations))
    # the binding: a predecessor whose end is the start
    ends = start_k[0] + durations[0]
    for node in range(lowered.num_nodes):
        chosen = int(bound_k[node])
        if chosen < 0:
            assert start_k[0, node] == 0.0
            continue
        assert ends[chosen] == start_k[0, node] > 0
    # by position: the same pass over renumbered arrays
    order = lowered.topo_order
    renumbered = np.ascontiguousarray(durations[:, order])
    (status_p, start_p, _), (status_q, start_q, _) = pull_both(lowered, renumbered,
                                                               binding=False, by_position=True)
    assert status_p == status_q == _kernel.OK
    np.testing.assert_array_equal(start_p, start_k[:, order])
    np.testing.assert_array_equal(start_q, start_k[:, order])


def summary_pull_both(lowered, durations):
    outputs = []
    devices = lowered.table.num_devices
    samples, n = durations.shape
    for module, graph in zip(MODULES, kernel_graphs(lowered, MODULES)):
        out = (np.full(samples, np.nan), np.full((samples, devices), np.nan),
               np.full((samples, devices), np.nan), np.full((samples, devices), np.nan))
        status = module.longest_path_summary(
            graph, durations, *out, kernel_scratch(module, graph, n * _kernel.SUMMARY_BLOCK))
        outputs.append((status, out))
    return outputs


@given(seed=st.integers(0, 2**32 - 1), samples=st.sampled_from([1, 5, 16, 17, 40, 70]),
       tail=st.booleans())
def test_blocked_summary_equals_reference_and_the_event_pass(seed, samples, tail):
    table = random_table(seed)
    lowered = lower(table, grad_sync="all" if tail else None, optimizer=tail)
    durations = random_durations(lowered, seed, samples=samples)
    (status_k, out_k), (status_r, out_r) = summary_pull_both(lowered, durations)
    assert status_k == status_r == _kernel.OK
    for mine, theirs in zip(out_k, out_r):
        np.testing.assert_array_equal(mine, theirs)
    makespan, busy, first, last = out_k
    start = event_pass(lowered, durations)
    end = start + durations
    np.testing.assert_array_equal(makespan, end.max(axis=1))
    for d in range(table.num_devices):
        mine = lowered.node_device == d
        np.testing.assert_allclose(busy[:, d], durations[:, mine].sum(axis=1), rtol=1e-12)
        np.testing.assert_array_equal(first[:, d], start[:, mine].min(axis=1, initial=np.inf))
        np.testing.assert_array_equal(last[:, d], end[:, mine].max(axis=1, initial=0.0))


def _layout(pred_indptr, predecessors, order=None):
    pred_indptr = np.asarray(pred_indptr, I32)
    order = np.arange(len(pred_indptr) - 1, dtype=I32) if order is None else order
    statuses = [module.Graph(len(order)).add_layout(np.asarray(order, I32), pred_indptr.copy(),
                                                    np.asarray(predecessors, I32))
                for module in MODULES]
    assert statuses[0] == statuses[1]
    return statuses[0]


def test_a_layout_is_checked_once_when_it_is_added():
    assert _layout([0, 0, 1], [0]) == _kernel.OK
    assert _layout([0, 0, 1], [1]) == _kernel.BAD_INDEX    # not before it
    assert _layout([0, 0, 1], [-5]) == _kernel.BAD_INDEX
    assert _layout([0, 1, 1], [0]) == _kernel.BAD_INDEX    # a self-loop
    assert _layout([-2000000000, 0, 1], [0]) == _kernel.BAD_SHAPE
    assert _layout([0, 5, 1], [0]) == _kernel.BAD_SHAPE     # past the end
    assert _layout([0, 0, 5, 1], [0]) == _kernel.BAD_SHAPE  # then falls
    assert _layout([0, 0, 2], [0]) == _kernel.BAD_SHAPE     # past the end
    assert _layout([0, 0, 1], [0], order=[1, 0]) == _kernel.OK
    assert _layout([0, 0, 1], [0], order=[1, 7]) == _kernel.BAD_INDEX
    assert _layout([0, 0, 1], [0], order=[1]) == _kernel.BAD_SHAPE
    graph = _kernel.Graph(2)
    predecessors = np.array([0], I32)
    assert graph.add_layout(np.array([1, 0], I32), np.array([0, 0, 1], I32),
                            predecessors) == _kernel.OK
    assert not predecessors.flags.writeable      # what was checked stays so
    assert graph.predecessors is predecessors and graph.has_layout


@pytest.mark.parametrize("summary", [False, True])
def test_pull_passes_check_their_shapes(summary):
    for module in MODULES:
        graph = module.Graph(2)
        assert graph.add_layout(np.array([0, 1], I32), np.array([0, 0, 1], I32),
                                np.array([0], I32)) == _kernel.OK
        if summary:
            blocks = kernel_scratch(module, graph, 2 * _kernel.SUMMARY_BLOCK)
            out = (np.zeros(2), np.zeros((2, 1)), np.zeros((2, 1)), np.zeros((2, 1)))
            assert module.longest_path_summary(graph, np.ones((2, 2)), *out, blocks) == \
                _kernel.BAD_SHAPE                           # no devices yet
            assert graph.add_devices(np.zeros(2, I32), 1) == _kernel.OK
            assert module.longest_path_summary(graph, np.ones((2, 2)), *out, blocks) == \
                _kernel.OK
            assert module.longest_path_summary(graph, np.ones((2, 3)), *out, blocks) == \
                _kernel.BAD_SHAPE
            assert module.longest_path_summary(graph, np.ones((2, 2)), *out,
                                               kernel_scratch(module, graph, 2)) == \
                _kernel.BAD_SHAPE
        else:
            scratch = kernel_scratch(module, graph, 2)
            assert module.longest_path_starts(graph, np.ones((1, 3)), np.zeros((1, 3)),
                                              np.zeros(3, I32), scratch) == _kernel.BAD_SHAPE
            assert module.longest_path_starts(graph, np.ones((1, 2)), np.zeros((1, 2)),
                                              np.zeros(2, I32), scratch) == _kernel.OK
    with pytest.raises(TypeError):
        _kernel.longest_path_starts(np.zeros(3, I32), np.ones((1, 2)), np.zeros((1, 2)),
                                    np.zeros(2, I32), kernel_scratch(_kernel, _kernel.Graph(2)))


def test_layout_checks_what_it_dereferences():
    assert layout_both([0, 1, 1], [1])[0][0] == _kernel.OK
    assert layout_both([0, 1, 1], [2])[0][0] == _kernel.BAD_INDEX
    assert layout_both([-2000000000, 1, 1], [1])[0][0] == _kernel.BAD_SHAPE
    for module in MODULES:
        assert module.topological(np.array([0, 1, 1], I32), np.array([1], I32),
                                  np.zeros(1, I32), np.zeros(3, I32), np.zeros(1, I32),
                                  np.zeros(2, I32)) == _kernel.BAD_SHAPE


@pytest.mark.parametrize("pred_indptr,predecessors", [
    ([-2000000000, 0, 5], [0, 0, 0, 0, 0]),     # issue 13, item 9: segfaulted
    ([0, 2000000000, 1], [0]),
    ([0, 1, 0], []),
    ([0, 1, 1], [7]),
])
def test_find_cycle_refuses_inconsistent_arrays(pred_indptr, predecessors):
    for module in (_kernel, _reference):
        assert module.find_cycle(np.array(pred_indptr, I32), np.array(predecessors, I32),
                                 np.ones(2, I32), np.zeros(2, I32), np.zeros(2, I32)) == -1


@given(seed=st.integers(0, 2**32 - 1), count=st.integers(1, 40))
def test_lognormal_factors_equal_the_numpy_twin_to_the_bit(seed, count):
    rng = np.random.default_rng(seed)
    samples = rng.integers(0, 10**6, count)
    keys = rng.integers(0, 2**63, 7, dtype=np.int64).astype(np.uint64)
    cv = rng.choice([0.0, 0.05, 0.3, 2.0], 7)
    sigma2 = np.log1p(cv * cv)
    sigma, shift = np.sqrt(sigma2).astype(np.float32), (sigma2 / 2).astype(np.float32)
    stream = int(rng.integers(0, 2**63))
    outputs = []
    for module in (_kernel, _reference):
        factors = np.full((count, 7), np.nan)
        assert module.lognormal_factors(stream, samples, keys, sigma, shift, factors) == \
            _kernel.OK
        outputs.append(factors)
    np.testing.assert_array_equal(*outputs)
    assert np.all(outputs[0][:, cv == 0] == 1.0)


def test_lognormal_factors_have_mean_one_and_the_cv():
    keys = np.arange(50, dtype=np.uint64) * np.uint64(7919)
    sigma2 = np.log1p(0.3 ** 2)
    factors = np.empty((4000, 50))
    _kernel.lognormal_factors(12345, np.arange(4000), keys,
                              np.full(50, np.sqrt(sigma2), np.float32),
                              np.full(50, sigma2 / 2, np.float32), factors)
    assert abs(factors.mean() - 1.0) < 0.005
    assert abs(factors.std() / factors.mean() - 0.3) < 0.005
    normals = (np.log(factors) + sigma2 / 2) / np.sqrt(sigma2)
    assert abs(np.corrcoef(normals[0::2].ravel(), normals[1::2].ravel())[0, 1]) < 0.02


@given(seed=st.integers(0, 2**32 - 1), samples=st.sampled_from([1, 5, 16, 21, 33, 70]))
def test_the_fused_monte_carlo_pass_equals_its_twin(seed, samples):
    table = random_table(seed, overlap=0.3)
    lowered = lower(table, optimizer=True, grad_sync="all")
    rng = np.random.default_rng(seed)
    cells = np.flatnonzero(table.cell_starts())
    ops = len(table)
    draws = NoisyDurations(
        cell_first_op=np.append(cells, ops).astype(I32), op_base=rng.exponential(1.0, ops),
        op_key=rng.integers(0, 2**63, ops, dtype=np.int64).astype(np.uint64),
        op_sigma=np.full(ops, 0.2, np.float32), op_shift=np.full(ops, 0.02, np.float32),
        overlap=0.8, transfer_base=rng.exponential(0.3, len(lowered.transfers)),
        transfer_key=rng.integers(0, 2**63, len(lowered.transfers),
                                  dtype=np.int64).astype(np.uint64),
        transfer_sigma=0.1, transfer_shift=0.005,
        extra=rng.exponential(0.1, lowered.num_nodes - lowered.extra_nodes.start),
        noise_stream=77, transfer_stream=78)
    devices = table.num_devices
    finish = (lowered.num_nodes + 3 * devices) * _kernel.SUMMARY_BLOCK

    def outputs():
        return (np.full(samples, np.nan), np.full((samples, devices), np.nan),
                np.full((samples, devices), np.nan), np.full((samples, devices), np.nan))

    graph, twin = kernel_graphs(lowered, MODULES)
    expected = outputs()
    assert _reference.monte_carlo_summary(twin, draws, *expected,
                                          kernel_scratch(_reference, twin, finish)) == _kernel.OK
    runs = {"monte_carlo_summary": lambda *out: _kernel.monte_carlo_summary(
        graph, draws, *out, kernel_scratch(_kernel, graph, finish))}
    arguments = (graph.node_device, draws.cell_first_op, draws.op_base, draws.op_key,
                 draws.op_sigma, draws.op_shift, draws.overlap, draws.transfer_base,
                 draws.transfer_key, draws.transfer_sigma, draws.transfer_shift, draws.extra,
                 draws.noise_stream, draws.transfer_stream)
    for name, build in _kernel.FUSED_PASSES.items():     # every build this CPU can run
        runs[name] = lambda *out, build=build: build(graph.pred_indptr, graph.predecessors,
                                                     graph.order, *arguments, *out,
                                                     np.zeros(finish))
    for name, run in runs.items():
        out = outputs()
        assert run(*out) == _kernel.OK, name
        for mine, theirs in zip(out, expected):
            np.testing.assert_array_equal(mine, theirs, err_msg=name)


def test_the_avx2_build_runs_where_the_cpu_has_avx2():
    """The build made the AVX2 pass on x86-64 and _kernel picked it; a build that lost
    it would run at the baseline's speed with no other sign."""
    import platform
    flags = ""
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            flags = cpuinfo.read()
    if platform.machine() != "x86_64" or " avx2" not in flags:
        pytest.skip("needs an x86-64 CPU with AVX2 (and /proc/cpuinfo to tell)")
    if os.environ.get("TABSCHED_SIMD", "").strip().lower() == "baseline":
        pytest.skip("TABSCHED_SIMD=baseline keeps to the baseline build")
    assert list(_kernel.FUSED_PASSES) == ["avx2", "baseline"]
    assert _kernel.FUSED_PATH == "avx2"


def test_tabsched_simd_baseline_keeps_to_the_baseline_build():
    code = "from tabsched import _kernel; print(_kernel.FUSED_PATH, list(_kernel.FUSED_PASSES))"
    environment = dict(os.environ, TABSCHED_SIMD="baseline")
    shown = subprocess.run([sys.executable, "-c", code], env=environment, check=True,
                           capture_output=True, text=True).stdout.split()
    assert shown == ["baseline", "['baseline']"]


def test_an_unknown_tabsched_simd_is_named_in_a_warning_and_read_as_auto():
    code = ("import warnings; warnings.simplefilter('error')\n"
            "try:\n"
            "    from tabsched import _kernel\n"
            "except RuntimeWarning as warning:\n"
            "    print(warning)\n")
    environment = dict(os.environ, TABSCHED_SIMD="sse9")
    shown = subprocess.run([sys.executable, "-c", code], env=environment, check=True,
                           capture_output=True, text=True).stdout.strip()
    assert shown == "TABSCHED_SIMD='sse9' is not auto, avx2 or baseline: read as auto"
    code = "from tabsched import _kernel; print(list(_kernel.FUSED_PASSES)[-1])"
    shown = subprocess.run([sys.executable, "-c", code], env=environment, check=True,
                           capture_output=True, text=True)
    assert shown.stdout.strip() == "baseline" and shown.stderr.count("\n") <= 2


def push_both(lowered, durations, *, binding=True):
    outputs = []
    n = lowered.num_nodes
    for module, graph in zip(MODULES, kernel_graphs(lowered, MODULES)):
        start = np.full(durations.shape, np.nan)
        bound = np.full(n if binding else 0, -7, I32)
        scratch = kernel_scratch(module, graph)
        status = module.kahn_starts(graph, durations, start, bound, scratch)
        outputs.append((status, start, bound, np.asarray(scratch.indegree).copy(),
                        np.asarray(scratch.heap_node).copy()))
    return outputs


@given(seed=st.integers(0, 2**32 - 1), samples=st.integers(1, 3), integer=st.booleans(),
       tail=st.booleans(), blocking=st.booleans())
def test_push_pass_equals_reference_and_the_pull_pass(seed, samples, integer, tail, blocking):
    """Kahn's loop pushing the ends gives the pull pass's starts and binding, to the bit
    (integer durations make ties, where the first in Kahn's order must win)."""
    table = random_table(seed)
    lowered = lower(table, blocking_sends=blocking, grad_sync="all" if tail else None,
                    optimizer=tail)
    durations = random_durations(lowered, seed, samples=samples, integer=integer)
    (status_k, start_k, bound_k, _, order_k), (status_r, start_r, bound_r, _, order_r) = \
        push_both(lowered, durations)
    assert status_k == status_r == _kernel.OK
    np.testing.assert_array_equal(start_k, start_r)
    np.testing.assert_array_equal(bound_k, bound_r)
    # the queue it leaves is Kahn's order, the layout's; following it gives the same
    np.testing.assert_array_equal(order_k, lowered.topo_order)
    np.testing.assert_array_equal(order_r, lowered.topo_order)
    for module, graph in zip(MODULES, kernel_graphs(lowered, MODULES)):
        again = np.full(durations.shape, np.nan)
        bound = np.full(lowered.num_nodes, -7, I32)
        assert module.ordered_starts(graph, order_k, durations, again, bound) == _kernel.OK
        np.testing.assert_array_equal(again, start_k)
        np.testing.assert_array_equal(bound, bound_k)
    (status_p, start_p, bound_p), _ = pull_both(lowered, durations)
    assert status_p == _kernel.OK
    np.testing.assert_array_equal(start_k, start_p)
    np.testing.assert_array_equal(bound_k, bound_p)
    (_, unbound, empty, _, _), _ = push_both(lowered, durations, binding=False)
    np.testing.assert_array_equal(unbound, start_k)
    assert empty.shape == (0,)


@given(seed=st.integers(0, 2**32 - 1))
def test_push_pass_deadlocks_as_the_layout_does(seed):
    """On a cycle the push pass says DEADLOCK and leaves the indegrees Kahn's order
    leaves (those ``topological`` reports), kernel and twin alike."""
    table = random_table(seed, max_devices=2)
    lowered = lower(table)
    n = lowered.num_nodes
    extra_source = int(np.random.default_rng(seed).integers(n))
    extra_target = 0 if extra_source else n - 1
    indptr = lowered.indptr.copy()
    indptr[extra_source + 1:] += 1
    successors = np.insert(lowered.successors, lowered.indptr[extra_source + 1],
                           extra_target).astype(I32)
    cyclic = lower(table)
    cyclic.indptr, cyclic.successors = indptr, successors
    layout = layout_both(indptr, successors)[0]
    (status_k, _, _, left_k, _), (status_r, _, _, left_r, _) = push_both(
        cyclic, np.ones((1, n)))
    assert status_k == status_r == layout[0]
    if layout[0] == _kernel.DEADLOCK:
        np.testing.assert_array_equal(left_k, layout[4])
        np.testing.assert_array_equal(left_r, layout[4])


def test_push_pass_refuses_wrong_shapes():
    lowered = lower(random_table(3))
    n = lowered.num_nodes
    for module, graph in zip(MODULES, kernel_graphs(lowered, MODULES)):
        scratch = kernel_scratch(module, graph)
        assert module.kahn_starts(graph, np.ones((1, n + 1)), np.zeros((1, n + 1)),
                                  np.zeros(0, I32), scratch) == _kernel.BAD_SHAPE
        assert module.kahn_starts(graph, np.ones((1, n)), np.zeros((1, n)), np.zeros(1, I32),
                                  scratch) == _kernel.BAD_SHAPE
        assert module.kahn_starts(module.Graph(n), np.ones((1, n)), np.zeros((1, n)),
                                  np.zeros(0, I32), scratch) == _kernel.BAD_SHAPE
        order = np.arange(n, dtype=I32)
        assert module.ordered_starts(graph, order[1:], np.ones((1, n)), np.zeros((1, n)),
                                     np.zeros(0, I32)) == _kernel.BAD_SHAPE
        order[0] = n
        assert module.ordered_starts(graph, order, np.ones((1, n)), np.zeros((1, n)),
                                     np.zeros(0, I32)) == _kernel.BAD_INDEX
