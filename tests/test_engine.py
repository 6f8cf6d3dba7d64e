"""The engine (tabsched/engine.py): the pass it chooses, and every pass it runs against
the plain-Python oracle (tabsched/_reference.py) on random tables."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tabsched import DeadlockError, InvalidParameterError, ScheduleTable, _reference, engine
from tabsched._testing import kernel_graphs, kernel_scratch, random_durations, random_table
from tabsched.lower import lower
from tabsched.nodes import CELL

I32 = np.int32
CONTENTION = st.sampled_from(["none", "link", "nic"])


def lowering(seed, contention, tail, blocking=False):
    return lower(random_table(seed), contention=contention, devices_per_node=2,
                 blocking_sends=blocking, grad_sync="all" if tail else None, optimizer=tail)


def durations_of(lowered, seed, samples, zero_cells):
    """Random durations; with ``zero_cells`` some cells last 0 (the chains are then not
    exact: the engine must take the heap)."""
    durations = random_durations(lowered, seed, samples=samples,
                                 integer=bool(seed % 2))
    cells = lowered.nodes(CELL)
    if zero_cells and lowered.count(CELL):
        durations[:, cells.start] = 0.0
    else:
        durations[:, cells] += 0.25
    return durations


def reference_starts(lowered, durations, method):
    """The oracle's starts (and sample 0's binding) for ``method`` on ``lowered``."""
    target = lowered.link_chains() if method == "chained" else lowered
    graph, = kernel_graphs(target, (_reference,))
    start = np.full(durations.shape, np.nan)
    binding = np.full(lowered.num_nodes, -7, I32)
    n = lowered.num_nodes
    if method == "events":
        status = _reference.fifo_starts(graph, durations, start, binding,
                                        kernel_scratch(_reference, graph))
    else:
        status = _reference.longest_path_starts(graph, durations, start, binding,
                                                kernel_scratch(_reference, graph, n))
    assert status == _reference.OK
    return start, binding


@given(seed=st.integers(0, 2**32 - 1), contention=CONTENTION, tail=st.booleans(),
       blocking=st.booleans(), zero_cells=st.booleans(), samples=st.integers(1, 3))
def test_the_pass_the_engine_chooses_equals_the_reference(seed, contention, tail, blocking,
                                                          zero_cells, samples):
    lowered = lowering(seed, contention, tail, blocking)
    durations = durations_of(lowered, seed, samples, zero_cells)
    method = engine.choose(lowered, durations)
    expected = {"none": "pull", "nic": "events"}.get(contention)
    if contention == "link":
        exact = len(lowered.transfers) > 0 and not (zero_cells and lowered.count(CELL))
        expected = "chained" if exact else "events"
    assert method == expected
    start, binding = engine.run(lowered, durations)
    assert binding is None
    reference, _ = reference_starts(lowered, durations, method)
    np.testing.assert_array_equal(start, reference)
    # whichever pass ran, the starts are the event order's (the semantics), to the bit
    np.testing.assert_array_equal(start, reference_starts(lowered, durations, "events")[0])
    # with a binding, the pass the binding is defined by: the heap under contention
    bound_method = engine.choose(lowered, durations, binding=True)
    assert bound_method == ("pull" if contention == "none" else "events")
    start_b, binding = engine.run(lowered, durations, binding=True)
    reference_b, reference_binding = reference_starts(lowered, durations, bound_method)
    np.testing.assert_array_equal(start_b, reference_b)
    np.testing.assert_array_equal(binding, reference_binding)


@given(seed=st.integers(0, 2**32 - 1), contention=CONTENTION, tail=st.booleans(),
       zero_cells=st.booleans(), samples=st.sampled_from([1, 3, 33]))
def test_the_summary_the_engine_chooses_equals_the_reference(seed, contention, tail,
                                                             zero_cells, samples):
    lowered = lowering(seed, contention, tail)
    durations = durations_of(lowered, seed, samples, zero_cells)
    method = engine.choose(lowered, durations)
    target = lowered.link_chains() if method == "chained" else lowered
    graph, = kernel_graphs(target, (_reference,))
    devices = lowered.table.num_devices
    expected = (np.empty(samples), np.empty((samples, devices)), np.empty((samples, devices)),
                np.empty((samples, devices)))
    if method == "events":
        status = _reference.fifo_summary(graph, durations, *expected,
                                         kernel_scratch(_reference, graph, lowered.num_nodes))
    else:
        status = _reference.longest_path_summary(
            graph, durations, *expected,
            kernel_scratch(_reference, graph, lowered.num_nodes * engine.SUMMARY_BLOCK))
    assert status == _reference.OK
    for mine, theirs in zip(engine.summarize(lowered, durations), expected):
        np.testing.assert_array_equal(mine, theirs)


@given(seed=st.integers(0, 2**32 - 1), contention=CONTENTION, samples=st.sampled_from([1, 40]))
def test_the_fused_pass_equals_the_reference_or_steps_aside(seed, contention, samples):
    table = random_table(seed, overlap=0.3)
    lowered = lower(table, contention=contention, devices_per_node=2, optimizer=True)
    rng = np.random.default_rng(seed)
    cells = np.flatnonzero(table.cell_starts())
    ops = len(table)
    draws = engine.NoisyDurations(
        cell_first_op=np.append(cells, ops).astype(I32), op_base=rng.exponential(1.0, ops) + 0.1,
        op_key=rng.integers(0, 2**63, ops, dtype=np.int64).astype(np.uint64),
        op_sigma=np.full(ops, 0.2, np.float32), op_shift=np.full(ops, 0.02, np.float32),
        overlap=0.9, transfer_base=rng.exponential(0.3, len(lowered.transfers)),
        transfer_key=rng.integers(0, 2**63, len(lowered.transfers),
                                  dtype=np.int64).astype(np.uint64),
        transfer_sigma=0.1, transfer_shift=0.005,
        extra=rng.exponential(0.1, lowered.num_nodes - lowered.extra_nodes.start),
        noise_stream=5, transfer_stream=6)
    nominal = np.ones(lowered.num_nodes)
    got = engine.monte_carlo_summary(lowered, draws, samples, nominal=nominal)
    method = engine.choose(lowered, nominal)
    if method == "events":
        assert got is None
        return
    target = lowered.link_chains() if method == "chained" else lowered
    graph, = kernel_graphs(target, (_reference,))
    devices = table.num_devices
    expected = (np.empty(samples), np.empty((samples, devices)), np.empty((samples, devices)),
                np.empty((samples, devices)))
    finish = (lowered.num_nodes + 3 * devices) * engine.SUMMARY_BLOCK
    assert _reference.monte_carlo_summary(graph, draws, *expected,
                                          kernel_scratch(_reference, graph, finish)) == \
        _reference.OK
    for mine, theirs in zip(got, (expected[0], expected[1], expected[3])):
        np.testing.assert_array_equal(mine, theirs)


def test_a_forced_method_runs_that_pass_or_says_why_not():
    table = random_table(7)
    link = lower(table, contention="link")
    durations = np.ones(link.num_nodes)
    for method in ("events", "chained"):
        start, _ = engine.run(link, durations, method=method)
        np.testing.assert_array_equal(start, engine.run(link, durations)[0])
    with pytest.raises(InvalidParameterError, match=r"method 'pull' would ignore the link"):
        engine.run(link, durations, method="pull")
    plain = lower(table)
    with pytest.raises(InvalidParameterError, match=r"method 'chained' needs a lowering"):
        engine.summarize(plain, np.ones(plain.num_nodes), method="chained")
    with pytest.raises(InvalidParameterError, match=r"method 'fast' is not one of auto, pull"):
        engine.run(plain, np.ones(plain.num_nodes), method="fast")
    # the heap holds a lowering without resources too: the same starts
    np.testing.assert_array_equal(engine.run(plain, np.ones(plain.num_nodes),
                                             method="events")[0],
                                  engine.run(plain, np.ones(plain.num_nodes))[0])


def test_durations_are_checked_at_the_boundary():
    lowered = lower(random_table(2))
    with pytest.raises(InvalidParameterError, match=r"durations have 3 columns for"):
        engine.run(lowered, np.ones(3))
    with pytest.raises(InvalidParameterError, match=r"finite and not negative"):
        engine.summarize(lowered, -np.ones(lowered.num_nodes))
    with pytest.raises(InvalidParameterError, match=r"finite and not negative"):
        engine.run(lowered, np.full(lowered.num_nodes, np.nan))


def test_a_deadlock_is_raised_before_any_pass():
    table = ScheduleTable([["0B0", "0F0"]])
    lowered = lower(table)
    for call in (engine.run, engine.summarize):
        with pytest.raises(DeadlockError, match=r"^deadlock: the row orders contradict"):
            call(lowered, np.ones(lowered.num_nodes))


def test_the_graph_is_made_once_per_lowering_and_the_chains_once():
    table = random_table(11)
    taken = lower(table, contention="link")     # the layout's lowering, run once by push:
    assert taken._graph is None and not taken.laid_out    # nothing of it carried over
    lowered = lower(table, contention="link")   # lowered afresh
    assert lowered._graph is None
    durations = np.ones(lowered.num_nodes)
    engine.run(lowered, durations, method="events")
    graph = lowered._graph
    engine.summarize(lowered, durations, method="events")
    assert lowered._graph is graph and graph.has_edges and graph.has_devices
    assert not graph.has_layout               # added when a pull pass first needs it
    from tabsched import generate
    chained = lower(generate("1f1b", devices=4, microbatches=8), contention="link")
    held = chained.link_chains()
    assert held is not None and chained.link_chains() is held   # made once while held
    import gc
    import weakref
    gone = weakref.ref(held)
    del held
    gc.collect()
    assert gone() is None                           # the lowering does not keep it alive
    import pickle
    again = pickle.loads(pickle.dumps(lowered))    # without the compiled view
    assert again._graph is None
    np.testing.assert_array_equal(engine.run(again, durations)[0],
                                  engine.run(lowered, durations)[0])


@pytest.mark.parametrize("samples", [2, 33, 65, 100, 257])
def test_samples_split_over_threads_give_the_numbers_of_one_pass(monkeypatch, samples):
    from tabsched import ModelCosts, generate
    from tabsched.adapt import Noise, monte_carlo
    table = generate("zbv", devices=4, microbatches=8)
    costs = ModelCosts("paper-128l", "slow_nw_mid_cp", contention="link")
    variation = Noise(0.2, transfers=0.1)
    whole = monte_carlo(table, costs, variation, samples=samples, seed=3)
    monkeypatch.setattr(engine, "_THREAD_WORK", 1)          # a thread for every few samples
    monkeypatch.setattr(engine.os, "sched_getaffinity", lambda pid: range(4), raising=False)
    ranges = engine._thread_ranges(samples, 100)
    pair_of_blocks = 2 * engine.SUMMARY_BLOCK       # the least a range holds
    assert (len(ranges) > 1) == (samples > pair_of_blocks) and len(ranges) <= 4
    split = monte_carlo(table, costs, variation, samples=samples, seed=3)
    assert split.makespans.tobytes() == whole.makespans.tobytes()
    assert split.to_dict()["devices"] == whole.to_dict()["devices"]


def test_thread_ranges_start_at_even_samples_and_cover_every_sample(monkeypatch):
    monkeypatch.setattr(engine.os, "sched_getaffinity", lambda pid: range(3), raising=False)
    for samples in (1, 31, 32, 1000, 10001):
        ranges = engine._thread_ranges(samples, 10_000)
        assert ranges[0][0] == 0 and ranges[-1][1] == samples
        assert all(first % 2 == 0 and first < last for first, last in ranges)
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
        assert len(ranges) <= 3


def test_lay_out_and_find_cycle():
    indptr = np.array([0, 1, 2, 2], I32)
    (order, pred_indptr, predecessors), unfinished = engine.lay_out(indptr,
                                                                    np.array([1, 2], I32))
    assert unfinished is None and order.tolist() == [0, 1, 2]
    assert pred_indptr.tolist() == [0, 0, 1, 2] and not order.flags.writeable
    layout, unfinished = engine.lay_out(np.array([0, 1, 2], I32), np.array([1, 0], I32))
    assert layout is None and unfinished.tolist() == [1, 1]
    cycle = engine.find_cycle(np.array([0, 1, 2], I32), np.array([1, 0], I32), unfinished)
    assert sorted(cycle.tolist()) == [0, 1]


@pytest.mark.parametrize("family, params", [("1f1b", {}), ("zbv", {}), ("chimera", {}),
                                            ("interleaved-1f1b", {"chunks": 2})])
@pytest.mark.parametrize("costs", [None, "stage"])
def test_a_lowering_run_by_push_gives_the_layouts_results(monkeypatch, family, params, costs):
    """generate() + evaluate() take the push pass (no layout made); with the layout made
    first (PUSH_RUNS = 0, every run a pull pass) every result is the same: makespan,
    every operation's start and end, the critical path, the devices' memory."""
    import tabsched
    cost_model = tabsched.UnitCosts(f=1, b=2) if costs is None else tabsched.StageCosts(
        1.0, comm=0.5)

    def evaluated():
        table = tabsched.generate(family, devices=4, microbatches=8, **params)
        return tabsched.evaluate(table, cost_model)
    # the lowering the run took (_cell_run: under UnitCosts the direct one, whose
    # lowering with transfer nodes is made when _lowered is read)
    pushed = evaluated()
    assert not pushed._cell_run()[0].laid_out
    monkeypatch.setattr(engine, "PUSH_RUNS", 0)
    pulled = evaluated()
    assert pulled._cell_run()[0].laid_out
    assert pushed.makespan == pulled.makespan
    np.testing.assert_array_equal(pushed.op_start, pulled.op_start)
    np.testing.assert_array_equal(pushed.op_end, pulled.op_end)
    np.testing.assert_array_equal(pushed._node_start, pulled._node_start)
    np.testing.assert_array_equal(pushed._binding, pulled._binding)
    assert pushed.critical_path == pulled.critical_path
    assert pushed.devices == pulled.devices


def test_the_push_pass_serves_a_lowerings_first_runs_then_the_layout():
    """A lowering's first PUSH_RUNS runs of one sample take the push pass; the next one
    lays it out; a run of several samples lays it out at once. The starts are the same
    whichever pass, and a deadlock raises the same error both ways."""
    from tabsched import generate
    table = generate("1f1b", devices=3, microbatches=5)
    lowered = lower(table)
    lowered.table._lowering = None
    durations = random_durations(lowered, 5, integer=True)[0]
    runs = [engine.run(lowered, durations, binding=True) for _ in range(engine.PUSH_RUNS)]
    assert not lowered.laid_out
    order = lowered.__dict__[engine.KAHN_ORDER]              # the first run's order ...
    assert lowered.copied().__dict__[engine.KAHN_ORDER] is order     # ... travels along
    laid = engine.run(lowered, durations, binding=True)
    assert lowered.laid_out
    for start, bound in runs:
        np.testing.assert_array_equal(start, laid[0])
        np.testing.assert_array_equal(bound, laid[1])
    many = lower(table)
    engine.run(many, np.stack([durations, durations]))
    assert many.laid_out
    # device 1 runs microbatch 1 first, device 0 waits for B(1, 0) first: a cycle
    stuck = ScheduleTable([["0F0", "0B0", "0F1", "0B1"], ["1F1", "1F0", "1B0", "1B1"]])
    messages = []
    for laid_out_first in (False, True):
        cyclic = lower(stuck)
        if laid_out_first:
            assert cyclic.topo_order is None     # reading it lays out: a deadlock
        with pytest.raises(DeadlockError) as raised:
            engine.run(cyclic, np.ones(cyclic.num_nodes))
        messages.append(str(raised.value))
    assert messages[0] == messages[1]
