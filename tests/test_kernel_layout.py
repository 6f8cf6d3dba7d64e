"""The topological layout and the pull passes: kernel against twin, and against the
event kernel they replace where no resource is held."""

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tabsched import _kernel, _reference
from tabsched._testing import random_durations, random_table
from tabsched.lower import lower

I32 = np.int32


def layout_both(indptr, successors):
    outputs = []
    n = len(indptr) - 1
    for module in (_kernel, _reference):
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


def layouts(lowered):
    """The lowering's layout in the kernel's and the twin's form."""
    arrays = (lowered.topo_order, lowered.topo_pred_indptr, lowered.topo_predecessors)
    return lowered.layout, _reference.make_layout(*arrays)


def pull_both(lowered, durations, *, ordered=True, binding=True):
    outputs = []
    n = lowered.num_nodes
    for module, layout in zip((_kernel, _reference), layouts(lowered)):
        start = np.full(durations.shape, np.nan)
        bound = np.full(n if binding else 0, -7, I32)
        status = module.longest_path(layout, ordered, durations, start, bound, np.zeros(n))
        outputs.append((status, start, bound))
    return outputs


def event_kernel(lowered, durations):
    n = lowered.num_nodes
    start = np.zeros(durations.shape)
    bound = np.zeros(n, I32)
    status = _kernel.evaluate(lowered.indptr, lowered.successors, durations, lowered.resources,
                              0, start, np.empty((0, n)), bound, np.zeros(n, I32),
                              np.zeros(n, I32), np.zeros(0), np.zeros(0, I32), np.zeros(0),
                              np.zeros(0, I32))
    assert status == _kernel.OK
    return start, bound


@given(seed=st.integers(0, 2**32 - 1), samples=st.integers(1, 3), integer=st.booleans(),
       tail=st.booleans())
def test_pull_pass_equals_reference_and_the_event_kernel(seed, samples, integer, tail):
    table = random_table(seed)
    lowered = lower(table, grad_sync="all" if tail else None, optimizer=tail)
    durations = random_durations(lowered, seed, samples=samples, integer=integer)
    (status_k, start_k, bound_k), (status_r, start_r, bound_r) = pull_both(lowered, durations)
    assert status_k == status_r == _kernel.OK
    np.testing.assert_array_equal(start_k, start_r)
    np.testing.assert_array_equal(bound_k, bound_r)
    start_e, bound_e = event_kernel(lowered, durations)
    np.testing.assert_array_equal(start_k, start_e)     # the same numbers, to the bit,
    np.testing.assert_array_equal(bound_k, bound_e)     # and the same ties broken
    # by position: the same pass over renumbered arrays
    order = lowered.topo_order
    renumbered = np.ascontiguousarray(durations[:, order])
    start = np.zeros(durations.shape)
    assert _kernel.longest_path(lowered.layout, False, renumbered, start, np.empty(0, I32),
                                np.zeros(lowered.num_nodes)) == _kernel.OK
    np.testing.assert_array_equal(start, start_k[:, order])


def summary_pull_both(lowered, durations):
    outputs = []
    devices = lowered.table.num_devices
    samples, n = durations.shape
    for module, layout in zip((_kernel, _reference), layouts(lowered)):
        out = (np.full(samples, np.nan), np.full((samples, devices), np.nan),
               np.full((samples, devices), np.nan), np.full((samples, devices), np.nan))
        status = module.longest_path_summary(
            layout, True, lowered.node_device, durations, *out,
            np.zeros(n * _kernel.SUMMARY_BLOCK))
        outputs.append((status, out))
    return outputs


@given(seed=st.integers(0, 2**32 - 1), samples=st.sampled_from([1, 5, 16, 17, 40, 70]),
       tail=st.booleans())
def test_blocked_summary_equals_reference_and_the_event_kernel(seed, samples, tail):
    table = random_table(seed)
    lowered = lower(table, grad_sync="all" if tail else None, optimizer=tail)
    durations = random_durations(lowered, seed, samples=samples)
    (status_k, out_k), (status_r, out_r) = summary_pull_both(lowered, durations)
    assert status_k == status_r == _kernel.OK
    for mine, theirs in zip(out_k, out_r):
        np.testing.assert_array_equal(mine, theirs)
    n = lowered.num_nodes
    devices = table.num_devices
    out_e = (np.zeros(samples), np.zeros((samples, devices)), np.zeros((samples, devices)),
             np.zeros((samples, devices)))
    assert _kernel.evaluate_summary(
        lowered.indptr, lowered.successors, durations, lowered.resources, 0,
        lowered.node_device, *out_e, np.zeros(n), np.zeros(n, I32), np.zeros(n, I32),
        np.zeros(0), np.zeros(0, I32), np.zeros(0), np.zeros(0, I32)) == _kernel.OK
    for mine, theirs in zip(out_k, out_e):
        np.testing.assert_array_equal(mine, theirs)


def _layout(pred_indptr, predecessors, order=None):
    pred_indptr = np.asarray(pred_indptr, I32)
    order = np.arange(len(pred_indptr) - 1, dtype=I32) if order is None else order
    made = [module.make_layout(np.asarray(order, I32), pred_indptr.copy(),
                               np.asarray(predecessors, I32)) for module in (_kernel, _reference)]
    statuses = [item if isinstance(item, int) else _kernel.OK for item in made]
    assert statuses[0] == statuses[1]
    return statuses[0]


def test_a_layout_is_checked_once_when_it_is_made():
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
    layout = _kernel.make_layout(np.array([1, 0], I32), np.array([0, 0, 1], I32),
                                 np.array([0], I32))
    assert not layout.predecessors.flags.writeable      # what was checked stays so


@pytest.mark.parametrize("summary", [False, True])
def test_passes_check_their_shapes(summary):
    layout = _kernel.make_layout(np.array([0, 1], I32), np.array([0, 0, 1], I32),
                                 np.array([0], I32))
    if summary:
        for device in ([0, 3], [-1, -2]):
            assert _kernel.longest_path_summary(
                layout, True, np.array(device, I32), np.ones((2, 2)), np.zeros(2),
                np.zeros((2, 1)), np.zeros((2, 1)), np.zeros((2, 1)),
                np.zeros(2 * _kernel.SUMMARY_BLOCK)) == _kernel.BAD_INDEX
        assert _kernel.longest_path_summary(
            layout, True, np.zeros(2, I32), np.ones((2, 3)), np.zeros(2), np.zeros((2, 1)),
            np.zeros((2, 1)), np.zeros((2, 1)),
            np.zeros(2 * _kernel.SUMMARY_BLOCK)) == _kernel.BAD_SHAPE
    else:
        assert _kernel.longest_path(layout, True, np.ones((1, 3)), np.zeros((1, 3)),
                                    np.zeros(3, I32), np.zeros(3)) == _kernel.BAD_SHAPE
        assert _kernel.longest_path(layout, True, np.ones((1, 2)), np.zeros((1, 2)),
                                    np.zeros(2, I32), np.zeros(2)) == _kernel.OK
    with pytest.raises(TypeError):
        _kernel.longest_path(np.zeros(3, I32), True, np.ones((1, 2)), np.zeros((1, 2)),
                             np.zeros(2, I32), np.zeros(2))


def test_layout_checks_what_it_dereferences():
    assert layout_both([0, 1, 1], [1])[0][0] == _kernel.OK
    assert layout_both([0, 1, 1], [2])[0][0] == _kernel.BAD_INDEX
    assert layout_both([-2000000000, 1, 1], [1])[0][0] == _kernel.BAD_SHAPE
    for module in (_kernel, _reference):
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
    arguments = (
        lowered.node_device, np.append(cells, ops).astype(I32),
        rng.exponential(1.0, ops), rng.integers(0, 2**63, ops, dtype=np.int64).astype(np.uint64),
        np.full(ops, 0.2, np.float32), np.full(ops, 0.02, np.float32), 0.8,
        rng.exponential(0.3, len(lowered.transfers)),
        rng.integers(0, 2**63, len(lowered.transfers), dtype=np.int64).astype(np.uint64),
        0.1, 0.005, rng.exponential(0.1, lowered.num_nodes - lowered.extra_nodes.start), 77, 78)
    devices = table.num_devices

    def outputs():
        return (np.full(samples, np.nan), np.full((samples, devices), np.nan),
                np.full((samples, devices), np.nan), np.full((samples, devices), np.nan))

    def scratch():
        return np.zeros((lowered.num_nodes + 3 * devices) * _kernel.SUMMARY_BLOCK)

    expected = outputs()
    assert _reference.monte_carlo_summary(layouts(lowered)[1], *arguments, *expected,
                                          scratch()) == _kernel.OK
    layout = lowered.layout
    runs = {"monte_carlo_summary": lambda *args: _kernel.monte_carlo_summary(layout, *args)}
    for name, build in _kernel.FUSED_PASSES.items():     # every build this CPU can run
        runs[name] = lambda *args, build=build: build(layout.pred_indptr, layout.predecessors,
                                                      layout.order, *args)
    for name, run in runs.items():
        out = outputs()
        assert run(*arguments, *out, scratch()) == _kernel.OK, name
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
