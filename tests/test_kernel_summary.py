"""The kernel's summary entry point (Monte Carlo) against its twin and against run()."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tabsched import DeadlockError, ScheduleTable, _kernel, _reference
from tabsched._testing import kernel_scratch, random_durations, random_table
from tabsched.lower import lower


def summary_both(lowered, durations, node_device=None, devices=None):
    node_device = lowered.node_device if node_device is None else node_device
    devices = lowered.table.num_devices if devices is None else devices
    outputs = []
    for module in (_kernel, _reference):
        samples, n = durations.shape[0], lowered.num_nodes
        out = (np.full(samples, np.nan), np.full((samples, devices), np.nan),
               np.full((samples, devices), np.nan), np.full((samples, devices), np.nan))
        graph = module.Graph(n)
        assert graph.add_edges(lowered.indptr, lowered.successors, lowered.resources,
                               lowered.num_resources) == _kernel.OK
        status = graph.add_devices(np.asarray(node_device, np.int32), devices)
        scratch = kernel_scratch(module, graph, n)
        if status == _kernel.OK:
            status = module.fifo_summary(graph, durations, *out, scratch)
        outputs.append((status, out, scratch.indegree))
    return outputs


@given(seed=st.integers(0, 2**32 - 1), contention=st.sampled_from(["none", "link", "nic"]),
       samples=st.integers(1, 3), integer=st.booleans(), tail=st.booleans())
def test_event_summary_equals_reference(seed, contention, samples, integer, tail):
    table = random_table(seed)
    lowered = lower(table, contention=contention, devices_per_node=2,
                    grad_sync="all" if tail else None, optimizer=tail)
    durations = random_durations(lowered, seed, samples=samples, integer=integer)
    (status_k, out_k, _), (status_r, out_r, _) = summary_both(lowered, durations)
    assert status_k == status_r == _kernel.OK
    for kernel, reference in zip(out_k, out_r):
        np.testing.assert_array_equal(kernel, reference)


@given(seed=st.integers(0, 2**32 - 1), contention=st.sampled_from(["none", "link"]),
       method=st.sampled_from(["auto", "events"]))
def test_summary_agrees_with_run(seed, contention, method):
    table = random_table(seed)
    lowered = lower(table, contention=contention, optimizer=True)
    durations = random_durations(lowered, seed, samples=2)
    makespan, busy, first, last = lowered.run_summary(durations, method=method)
    start, end, _ = lowered.run(durations, binding=False, method=method)
    np.testing.assert_array_equal(makespan, end.max(axis=1))
    devices = lowered.node_device
    for d in range(table.num_devices):
        mine = devices == d
        np.testing.assert_allclose(busy[:, d], durations[:, mine].sum(axis=1), rtol=1e-12)
        np.testing.assert_array_equal(first[:, d], start[:, mine].min(axis=1))
        np.testing.assert_array_equal(last[:, d], end[:, mine].max(axis=1))


@given(seed=st.integers(0, 2**32 - 1), samples=st.sampled_from([1, 2, 33, 65]),
       integer=st.booleans())
def test_one_sample_pass_equals_the_blocked_pass(seed, samples, integer):
    """A lone sample (a nominal run, or the last of 33) takes the scalar path: the same
    numbers, to the bit, as the same sample carried in a block beside others."""
    table = random_table(seed)
    lowered = lower(table, contention="none", optimizer=True)
    durations = random_durations(lowered, seed, samples=samples, integer=integer)
    together = lowered.run_summary(durations, method="pull")
    for row in sorted({0, samples - 1}):
        alone = lowered.run_summary(durations[row:row + 1], method="pull")
        for a, b in zip(alone, together):
            np.testing.assert_array_equal(a[0], b[row])


def test_summary_of_a_device_without_nodes():
    table = ScheduleTable([["0F0", "0B0"], []])
    lowered = lower(table)
    makespan, busy, first, last = lowered.run_summary(np.array([2.0, 3.0]))
    assert makespan.tolist() == [5.0]
    assert busy.tolist() == [[5.0, 0.0]]
    assert first[0, 1] == np.inf and last[0, 1] == 0.0


def test_summary_status_codes():
    table = ScheduleTable([["0F0", "1F0", "1B0", "0B0"]])
    lowered = lower(table)
    durations = np.ones((1, lowered.num_nodes))
    bad = lowered.node_device.copy()
    bad[0] = 5
    (status_k, *_), (status_r, *_) = summary_both(lowered, durations, node_device=bad)
    assert status_k == status_r == _kernel.BAD_INDEX
    (status_k, *_), (status_r, *_) = summary_both(lowered, durations, devices=2)
    assert status_k == status_r == _kernel.OK
    wrong = np.ones((1, lowered.num_nodes + 1))
    assert summary_both(lowered, wrong)[0][0] == _kernel.BAD_SHAPE
    (status_k, *_), (status_r, *_) = summary_both(lowered, durations, devices=0)
    assert status_k == status_r == _kernel.BAD_INDEX


def shuffled_row(table, seed):
    """``table`` with the cells of one device in a random order (may deadlock)."""
    rng = np.random.default_rng(seed)
    device = int(rng.integers(table.num_devices))
    slot = table.slot.copy()
    mine = np.flatnonzero(table.device == device)
    cells = np.unique(slot[mine])
    slot[mine] = rng.permutation(cells)[np.searchsorted(cells, slot[mine])]
    return ScheduleTable.from_arrays(table.device, slot, table.kind, table.stage,
                                     table.microbatch, table.row_lengths, **table.metadata)


@given(seed=st.integers(0, 2**32 - 1))
def test_summary_deadlocks_like_evaluate(seed):
    table = shuffled_row(random_table(seed, max_devices=2), seed)
    lowered = lower(table, contention="link")
    durations = random_durations(lowered, seed)
    (status_k, _, left_k), (status_r, _, left_r) = summary_both(lowered, durations)
    assert status_k == status_r
    if status_k == _kernel.DEADLOCK:
        np.testing.assert_array_equal(left_k > 0, left_r > 0)
        with pytest.raises(DeadlockError, match=r"^deadlock: the row orders contradict"):
            lowered.run_summary(durations)


def test_a_shuffled_row_can_deadlock():
    statuses = set()
    for seed in range(30):
        table = shuffled_row(random_table(seed, max_devices=2), seed)
        lowered = lower(table, contention="link")
        statuses.add(summary_both(lowered, random_durations(lowered, seed))[0][0])
    assert statuses == {_kernel.OK, _kernel.DEADLOCK}
