"""Pipeline sends as the runtimes post them (tabsched/p2p.py, through tabsched/lower.py)."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tabsched import InvalidParameterError, _reference, engine
from tabsched._testing import kernel_graphs, kernel_scratch
from tabsched.costs import StageCosts
from tabsched.evaluate import evaluate
from tabsched.execution import P2P_MODES, Execution
from tabsched.lower import lower
from tabsched.nodes import CELL, TRANSFER
from tabsched.schedules import generate

SCHEDULED = ("megatron-batched", "megatron-overlap", "pytorch")
#: Megatron-LM's and PyTorch's own orders, and tables neither runs as its own
TABLES = st.sampled_from([
    ("1f1b", {}), ("interleaved-1f1b", {"chunks": 2}), ("gpipe", {}), ("zb-h1", {}),
    ("zbv", {}), ("chimera", {}), ("looped-bfs", {}), ("dualpipev", {})])


def table_of(family, params, devices, microbatches):
    if family in ("chimera", "zbv", "dualpipev", "interleaved-1f1b"):
        devices = max(2, devices - devices % 2)
    if family == "dualpipev":
        microbatches = max(microbatches, 2 * devices)
    if family == "chimera":
        microbatches = devices * max(1, microbatches // devices)
    if family == "interleaved-1f1b":
        microbatches = devices * max(1, microbatches // devices)
    return generate(family, devices=devices, microbatches=microbatches, **params)


def durations(lowered, cell, transfer, seed=0):
    rng = np.random.default_rng(seed)
    values = np.zeros(lowered.num_nodes)
    values[lowered.nodes(CELL)] = cell * rng.uniform(0.5, 1.5, lowered.count(CELL))
    values[lowered.nodes(TRANSFER)] = transfer * rng.uniform(0.5, 1.5, lowered.count(TRANSFER))
    return values


def makespan(lowered, values):
    start, end, _ = lowered.run(values, binding=False)
    return float(end.max())


# --------------------------------------------------------------- hand-checked
#: 1F1B, p = 2, M = 2, F = 1, B = 2, every transfer 0.5. Free: d1 runs F0 1.5-2.5,
#: B0 2.5-4.5, F1 4.5-5.5, B1 5.5-7.5, its gradient for B1 lands at 8; d0's B0 5-7,
#: B1 8-10. Every other mode: d1's B0 gradient and d0's F1 activation are one
#: exchange (Megatron's send_forward_recv_backward on d0, send_backward_recv_forward on
#: d1; PyTorch's fused fwd_send + bwd_recv), which d1 can post only after B0 (4.5):
#: both land at 5, d1 runs F1 5-6, B1 6-8, the last gradient lands at 8.5 and d0's
#: B1 runs 8.5-10.5. Blocking reaches the same: d1's gradient send holds it until 5.
HAND_CHECKED = {"free": 10.0, "blocking": 10.5, "megatron-batched": 10.5,
                "megatron-overlap": 10.5, "pytorch": 10.5}


@pytest.mark.parametrize("mode", P2P_MODES)
def test_a_1f1b_pipeline_of_two_as_checked_by_hand(mode):
    table = generate("1f1b", devices=2, microbatches=2)
    costs = StageCosts([1.0, 1.0], [2.0, 2.0], comm=0.5, execution=Execution(p2p=mode))
    assert evaluate(table, costs, formula=False).makespan == pytest.approx(HAND_CHECKED[mode])


def test_megatron_batches_an_interleaved_step_after_the_pair():
    """Interleaved, without overlap: F's output leaves with the B after it (one batch
    per (F, B) pair), so the device is not held after the F as a blocking send holds it;
    with --overlap-p2p-communication, the waits move to the next chunk of the same
    direction, as free as free on this table (unit cells, transfers of 0.3)."""
    table = generate("interleaved-1f1b", devices=4, microbatches=8, chunks=2)
    times = {}
    for mode in P2P_MODES:
        lowered = lower(table, p2p=mode)
        values = np.zeros(lowered.num_nodes)
        values[lowered.nodes(CELL)] = 1.0
        values[lowered.nodes(TRANSFER)] = 0.3
        times[mode] = makespan(lowered, values)
    assert times["free"] < times["megatron-batched"] < times["blocking"]
    assert times["free"] <= times["megatron-overlap"] < times["megatron-batched"]


def test_a_one_chunk_table_runs_overlap_as_batched():
    """Megatron-LM turns --overlap-p2p-communication off without a virtual pipeline."""
    table = generate("1f1b", devices=4, microbatches=8)
    batched, overlap = lower(table, p2p="megatron-batched"), lower(table, p2p="megatron-overlap")
    assert np.array_equal(batched.successors, overlap.successors)
    assert np.array_equal(batched.indptr, overlap.indptr)


# ------------------------------------------------------------------ properties
@settings(max_examples=40, deadline=None)
@given(table=TABLES, devices=st.integers(2, 5), microbatches=st.integers(1, 8),
       mode=st.sampled_from(P2P_MODES), seed=st.integers(0, 2**16))
def test_every_start_follows_its_dependencies_and_postings(table, devices, microbatches, mode,
                                                           seed):
    lowered = lower(table_of(*table, devices, microbatches), p2p=mode)
    values = durations(lowered, 1.0, 0.4, seed)
    start, end, _ = lowered.run(values, binding=False)
    start, end = start[0], end[0]
    sources = np.repeat(np.arange(lowered.num_nodes), np.diff(lowered.indptr))
    assert np.all(start[lowered.successors] >= end[sources] - 1e-12)


@settings(max_examples=40, deadline=None)
@given(table=TABLES, devices=st.integers(2, 5), microbatches=st.integers(1, 8),
       mode=st.sampled_from(SCHEDULED), seed=st.integers(0, 2**16),
       slower=st.floats(1.0, 4.0))
def test_the_makespan_grows_with_transfer_time_and_is_never_below_free(
        table, devices, microbatches, mode, seed, slower):
    table = table_of(*table, devices, microbatches)
    lowered, free = lower(table, p2p=mode), lower(table)
    values = durations(lowered, 1.0, 0.3, seed)
    more = values.copy()
    more[lowered.nodes(TRANSFER)] *= slower
    assert makespan(lowered, more) >= makespan(lowered, values) - 1e-9
    # the modes add edges to the free DAG (same nodes, same numbering): never faster
    assert makespan(lowered, values) >= makespan(free, values) - 1e-9


@settings(max_examples=30, deadline=None)
@given(table=TABLES, devices=st.integers(2, 4), microbatches=st.integers(1, 6),
       mode=st.sampled_from(P2P_MODES), contention=st.sampled_from(["none", "link"]),
       seed=st.integers(0, 2**16))
def test_the_kernel_equals_the_reference_in_every_mode(table, devices, microbatches, mode,
                                                       contention, seed):
    lowered = lower(table_of(*table, devices, microbatches), p2p=mode, contention=contention)
    values = durations(lowered, 1.0, 0.4, seed)[None, :]
    start, _ = engine.run(lowered, values, binding=False, method="events")
    graph, = kernel_graphs(lowered, (_reference,))
    expected = np.full(values.shape, np.nan)
    binding = np.full(lowered.num_nodes, -7, np.int32)
    status = _reference.fifo_starts(graph, values, expected, binding,
                                    kernel_scratch(_reference, graph))
    assert status == _reference.OK
    assert np.array_equal(start, expected)


@pytest.mark.parametrize("family, params", [("1f1b", {}), ("interleaved-1f1b", {"chunks": 2}),
                                            ("zbv", {})])
def test_blocking_sends_is_p2p_blocking_to_the_bit(family, params):
    table = generate(family, devices=4, microbatches=8, **params)
    old, new = lower(table, blocking_sends=True), lower(table, p2p="blocking")
    assert np.array_equal(old.successors, new.successors)
    costs = StageCosts([1.0] * table.num_stages, comm=0.3)
    assert evaluate(table, costs.with_execution(Execution(blocking_sends=True))).makespan == \
        evaluate(table, costs.with_execution(Execution(p2p="blocking"))).makespan


# ------------------------------------------------------------------- bad input
def test_a_mode_that_is_not_one_is_refused():
    with pytest.raises(InvalidParameterError, match="p2p 'eager' is not one of free"):
        Execution(p2p="eager")
    with pytest.raises(InvalidParameterError, match="p2p 'bulk' is not one of free"):
        lower(generate("1f1b", devices=2, microbatches=2), p2p="bulk")
    with pytest.raises(InvalidParameterError, match="contradicts blocking_sends"):
        Execution(p2p="pytorch", blocking_sends=True)


def test_the_cli_refuses_a_bad_mode_in_one_line(cli_error):
    message = cli_error("eval", "1f1b", "--devices", "2", "--microbatches", "2", "--p2p", "bulk")
    assert message.startswith("--p2p 'bulk' is not one of")
    message = cli_error("eval", "1f1b", "--devices", "2", "--microbatches", "2", "--comm", "0.3",
                        "--p2p", "pytorch", "--blocking-sends")
    assert "--blocking-sends" in message


def test_the_cli_runs_each_mode_and_free_is_the_fastest(cli):
    spans = {}
    for mode in P2P_MODES:
        code, out, _ = cli("eval", "interleaved", "--devices", "4", "--microbatches", "8",
                           "--chunks", "2", "--comm", "0.3", "--p2p", mode, "--json")
        assert code == 0
        spans[mode] = json.loads(out)["makespan"]
    assert min(spans.values()) == spans["free"] < spans["megatron-batched"]


def _predecessors(lowered):
    sources = np.repeat(np.arange(lowered.num_nodes), np.diff(lowered.indptr))
    preds = {}
    for source, target in zip(sources.tolist(), lowered.successors.tolist()):
        preds.setdefault(target, set()).add(source)
    return preds


@pytest.mark.parametrize("devices, microbatches, chunks, group",
                         [(4, 8, 2, None), (2, 4, 3, None), (4, 4, 2, None), (4, 12, 2, 6)])
def test_megatron_interleaved_sends_a_forward_with_the_backward_after_it(devices, microbatches,
                                                                           chunks, group):
    """Without overlap, a steady (F, B) pair's outputs leave in one batch after the B
    (send_forward_backward_recv_forward_backward); a warm-up F's output leaves right after
    it; so does the last F of a device whose forwards are all warm-up (its first backward's
    receive is a call of its own). With --overlap-p2p-communication, F's send is posted
    right after F in every case."""
    table = generate("interleaved-1f1b", devices=devices, microbatches=microbatches,
                     chunks=chunks, group_size=group)
    checked = 0
    for mode, after_pair in (("megatron-batched", True), ("megatron-overlap", False)):
        lowered = lower(table, p2p=mode)
        preds = _predecessors(lowered)
        first = lowered.nodes(TRANSFER).start
        cells = lowered.cell_of_op
        for index, producer in enumerate(lowered.transfers.producer.tolist()):
            if table.op(producer).kind != "F":
                continue
            cell = int(cells[producer])
            following = cell + 1
            if following >= lowered.num_cells or \
                    lowered.cell_device[following] != lowered.cell_device[cell]:
                continue
            row = [op for op in table.rows[int(lowered.cell_device[cell])] if op is not None]
            kinds = "".join(op.kind for op in row)
            all_warmup = kinds == "F" * kinds.count("F") + "B" * kinds.count("B")
            pair = table.op(int(np.searchsorted(cells, following))).kind == "B" and \
                not all_warmup
            posted_after_next = following in preds[first + index]
            assert posted_after_next == (pair and after_pair)
            checked += pair
    assert checked > 0


def test_the_cli_blocking_sends_is_p2p_blocking_to_the_bit(cli):
    common = ("eval", "interleaved", "-p", "4", "-m", "8", "--chunks", "2", "--model",
              "paper-128l", "--system", "mid_nw_mid_cp", "--json")
    code, old, _ = cli(*common, "--blocking-sends")
    assert code == 0
    code, new, _ = cli(*common, "--p2p", "blocking")
    assert code == 0
    assert json.loads(old)["makespan"] == json.loads(new)["makespan"]
    code, free, _ = cli(*common)
    assert json.loads(free)["makespan"] < json.loads(new)["makespan"]
