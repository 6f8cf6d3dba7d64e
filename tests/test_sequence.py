"""Sequence slices: tabsched/adapt/sequence.py, the table's sequence_slices, the slice view."""

import json
import re

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tabsched import evaluate
from tabsched.adapt import SplitSequence
from tabsched.costs import ModelCosts, UnitCosts
from tabsched.costs.kernels import FLASH_TILE
from tabsched.costs.transformer import load_model
from tabsched.exceptions import InvalidParameterError, InvalidScheduleError
from tabsched.execution import Execution
from tabsched.formats.table_json import from_json, to_json
from tabsched.memory import activation_peaks
from tabsched.schedules import generate
from tabsched.table import BACKWARD, FORWARD, INPUT_GRAD, WEIGHT_GRAD

LONG = "examples/llama3-8b-32k.toml"
LINEAR = ("qkv", "out_proj", "mlp_up", "mlp_down")


def _costs(attention="eager", t=4):
    # a small sequence keeps the eager scores cheap to price; the shape is llama3-8b's
    model = load_model("llama3-8b").replace(sequence=4096)
    return ModelCosts(model, "dgx-h100", Execution(tensor_parallel=t, attention=attention))


COSTS = {"eager": _costs("eager"), "flash": _costs("flash")}


def _slice_of(table, m):
    return table.sequence_slices[m] if table.sequence_slices else (0, 1)


@settings(max_examples=20, deadline=None)
@given(p=st.sampled_from([2, 4]), extra=st.integers(0, 4), k=st.sampled_from([2, 4, 8]),
       family=st.sampled_from(["1f1b", "gpipe", "zb-h1"]), lead=st.sampled_from(["seq1f1b", "kept"]),
       attention=st.sampled_from(["eager", "flash"]),
       partition=st.sampled_from(["even", "compute"]))
def test_sliced_tables_keep_dependencies_devices_and_memory(p, extra, k, family, lead,
                                                            attention, partition):
    """Equal slices and Seq1F1B's computation-wise ones (earlier slices longer) alike."""
    costs = COSTS[attention]
    table = generate(family, devices=p, microbatches=p + extra)
    sliced = SplitSequence(k, lead, partition).apply(table, costs)
    assert sliced.slice_partition == partition
    result = evaluate(sliced, costs)
    start, end = np.asarray(result.op_start), np.asarray(result.op_end)
    where = {(int(sliced.kind[n]), int(sliced.stage[n]), int(sliced.microbatch[n])): n
             for n in range(len(sliced))}
    eps = 1e-12

    def backward(stage, m):
        return where.get((BACKWARD, stage, m), where.get((INPUT_GRAD, stage, m)))
    for (kind, stage, m), n in where.items():
        index, count = _slice_of(sliced, m)
        if kind == FORWARD:
            if stage > 0:
                assert start[n] >= end[where[FORWARD, stage - 1, m]] - eps
            if index > 0:      # the key-value cache of the slice before, on this stage
                assert start[n] >= end[where[FORWARD, stage, m - 1]] - eps
        elif kind == WEIGHT_GRAD:
            assert start[n] >= end[where[INPUT_GRAD, stage, m]] - eps
        else:
            assert start[n] >= end[where[FORWARD, stage, m]] - eps
            if stage < sliced.num_stages - 1:
                assert start[n] >= end[backward(stage + 1, m)] - eps
            if index < count - 1:   # the later slices' key and value gradients
                assert start[n] >= end[backward(stage, m + 1)] - eps
    for d in range(sliced.num_devices):
        mine = np.flatnonzero(sliced.device == d)
        order = np.argsort(start[mine], kind="stable")
        assert np.all(start[mine][order][1:] >= end[mine][order][:-1] - eps)
    for _, values in result.memory_timeline():
        assert np.min(values, initial=0.0) >= -1e-6 * max(1.0, float(np.max(values)))
    effect = SplitSequence(k, lead, partition).memory_effect(table, costs)
    assert effect.check(activation_peaks(evaluate(table, costs)),
                        activation_peaks(result)) == []


@settings(max_examples=30, deadline=None)
@given(p=st.integers(1, 8), extra=st.integers(0, 12), k=st.sampled_from([2, 4, 8]),
       family=st.sampled_from(["1f1b", "zb-h1"]))
def test_sliced_1f1b_alternates_one_forward_and_one_backward_slice(p, extra, k, family):
    """Seq1F1B's sliced 1F1B (Sun et al. 2024, Figure 3): device d warms up with
    ``p - d - 1 + k - 1`` forward slices, then runs one forward slice and one backward
    slice by turns until its forwards are done, then the rest of its backwards. Through
    1F1B's cool-down too (the unsliced row runs out of forwards first: slicing it by the
    row's shrinking lead ran two backward slices per forward there, 0.79x 1F1B's speed
    on llama3-8b at 32K)."""
    m = p + extra
    table = generate(family, devices=p, microbatches=m)
    sliced = SplitSequence(k).apply(table, COSTS["flash"])
    for d, row in enumerate(sliced.orders()):
        kinds = "".join({"F": "F", "B": "B", "I": "B"}.get(re.sub(r"[0-9]", "", str(op)), "")
                        for op in row)
        forwards = m * k
        warm = min(p - d - 1 + k - 1, forwards)
        steady = forwards - warm
        assert kinds == "F" * warm + "FB" * steady + "B" * (forwards - steady), (d, kinds)


@pytest.mark.parametrize("family,params", [("interleaved-1f1b", {"chunks": 2}), ("bitpipe", {}),
                                           ("chimera", {})])
@pytest.mark.parametrize("lead", ["seq1f1b", "kept"])
def test_devices_of_several_stages_keep_their_rows_lead(family, params, lead):
    """Where a device holds several stages, the row's own lead orders its slices: keeping
    a lead through the cool-down there (as one-stage devices do) ordered two devices'
    slices against each other and deadlocked interleaved 1F1B at p = 8, m = 16."""
    for microbatches in (8, 16):
        table = generate(family, devices=8, microbatches=microbatches, **params)
        for k in (2, 4):
            sliced = SplitSequence(k, lead).apply(table, COSTS["flash"])
            assert evaluate(sliced, COSTS["flash"]).makespan > 0


@pytest.mark.parametrize("attention", ["eager", "flash"])
@pytest.mark.parametrize("k", [2, 4, 8])
def test_later_slices_never_cheaper_in_attention(attention, k):
    model = COSTS[attention].model
    attention_flops = []
    for i in range(k):
        kernels = model.sliced(i, k).kernels("layer", COSTS[attention].execution)
        attention_flops.append(sum(kernel.flops[1] for phase in ("F", "I")
                                   for kernel in kernels[phase]
                                   if kernel.name not in LINEAR
                                   and not kernel.name.endswith("_dgrad")
                                   and kernel.cls == "matrix"))
    assert all(b > a for a, b in zip(attention_flops, attention_flops[1:]))
    # slice i's attention is s/k queries over (i+1)s/k keys: linear in i+1 for the eager
    # kernels (the whole score rectangle); the fused kernel skips the tiles above the
    # diagonal, so slice i computes i full squares of n tiles a side and one triangle
    expected = np.arange(1, k + 1, dtype=float)
    if attention == "flash":
        n = np.ceil(model.sequence / k / FLASH_TILE)
        expected = (expected - 1 + (n + 1) / (2 * n)) / ((n + 1) / (2 * n))
    assert np.allclose(np.asarray(attention_flops) / attention_flops[0], expected)


@pytest.mark.parametrize("k", [2, 4, 16])
def test_slice_linear_flops_sum_to_the_unsliced(k):
    costs = COSTS["flash"]
    whole = costs.model.kernels("layer", costs.execution)

    def linear(kernels):
        return sum(kernel.flops[1] for phase in ("F", "I", "W") for kernel in kernels[phase]
                   if kernel.name.split("_dgrad")[0].split("_wgrad")[0] in LINEAR)
    parts = [linear(costs.model.sliced(i, k).kernels("layer", costs.execution))
             for i in range(k)]
    assert linear(whole) > 0
    assert sum(parts) == pytest.approx(linear(whole), rel=1e-12)


def test_slices_of_a_table_hold_each_sequence_once_and_cost_its_linear_work():
    costs = COSTS["flash"]
    table = generate("1f1b", devices=4, microbatches=4)
    sliced = SplitSequence(4).apply(table, costs)
    # transfers carry s/k tokens: the sum over slices is the microbatch's bytes
    assert costs.model.sliced(0, 4).transfer_bytes(1, costs.execution) * 4 == \
        pytest.approx(costs.model.transfer_bytes(1, costs.execution))
    # activations: 1/k of the per-token part each, so the slices together hold at most
    # the microbatch
    whole = costs.activation_sizes(table)[(table.stage == 1) & (table.kind == FORWARD)][0]
    parts = costs.activation_sizes(sliced)[(sliced.stage == 1) & (sliced.kind == FORWARD)
                                           & (sliced.microbatch < 4)]
    assert parts.sum() <= whole * (1 + 1e-12)
    assert np.all(parts > 0)


def test_one_slice_is_the_table_itself():
    costs = COSTS["eager"]
    table = generate("1f1b", devices=4, microbatches=8)
    same = SplitSequence(1).apply(table, costs)
    assert same.sequence_slices is None
    assert same.orders() == table.orders()
    assert evaluate(same, costs).makespan == evaluate(table, costs).makespan
    assert np.array_equal(costs.op_durations(same), costs.op_durations(table))
    assert np.array_equal(costs.activation_sizes(same), costs.activation_sizes(table))


def test_sliced_tables_round_trip_through_json():
    costs = COSTS["flash"]
    sliced = SplitSequence(2).apply(generate("1f1b", devices=2, microbatches=2), costs)
    back = from_json(to_json(sliced))
    assert back == sliced and back.sequence_slices == ((0, 2), (1, 2)) * 2


def test_tables_that_break_slice_order_are_refused():
    table = generate("1f1b", devices=2, microbatches=2)
    with pytest.raises(InvalidScheduleError, match="reverse order"):
        table.replace(sequence_slices=[(0, 2), (1, 2)])
    with pytest.raises(InvalidScheduleError, match="sequence_slices"):
        table.replace(sequence_slices=[(1, 2), (0, 2)])


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True])
def test_bad_slice_counts_are_refused(bad):
    with pytest.raises(InvalidParameterError, match="sequence slices"):
        SplitSequence(bad)


def test_slices_need_a_sequence_that_they_divide():
    table = generate("1f1b", devices=2, microbatches=2)
    with pytest.raises(InvalidParameterError, match="divide"):
        SplitSequence(3).apply(table, COSTS["flash"])
    for costs in (None, UnitCosts()):
        with pytest.raises(InvalidParameterError, match="need a model with a sequence"):
            SplitSequence(2).apply(table, costs)
    sliced = SplitSequence(2).apply(table, COSTS["flash"])
    with pytest.raises(InvalidParameterError, match="need a model with a sequence"):
        evaluate(sliced, UnitCosts())


@pytest.mark.parametrize("value, message", [
    ("0", "--sequence-slices '0': expected positive integers"),
    ("x", "--sequence-slices 'x': expected integers"),
    ("3", "--sequence-slices 3: does not divide model llama3-8b-32k's sequence 32768")])
def test_cli_refuses_bad_slice_counts_in_one_line(cli_error, value, message):
    assert cli_error("adapt", "1f1b", "-p", "2", "-m", "2", "--model", LONG, "--system",
                     "dgx-h100", "--memory-budget", "capacity", "--sequence-slices", value,
                     "--samples", "2").startswith(message)


def test_cli_refuses_slices_without_a_model(cli_error):
    assert cli_error("adapt", "1f1b", "-p", "2", "-m", "2", "--memory-budget", "8",
                     "--sequence-slices", "2", "--samples", "2") == (
        "--sequence-slices: slices need a model with a sequence (give --model and --system)")


def test_cli_adapt_slices_a_long_sequence(cli):
    code, out, err = cli("adapt", "1f1b", "-p", "2", "-m", "4", "--model", LONG, "--system",
                         "dgx-h100", "-t", "8", "--sequence-parallel", "--attention", "flash",
                         "--memory-budget", "capacity", "--sequence-slices", "2",
                         "--samples", "2", "--max-rounds", "2", "-q", "--json", "--log")
    assert code == 0, err
    tried = [text for entry in json.loads(out)["search"]["log"]
             for text in entry["transforms"]]
    assert any(text.startswith("split-sequence(k=2") for text in tried)


def test_seq1f1b_direction_on_a_long_sequence():
    """Seq1F1B (Sun et al. 2024, abstract): 1.14x Megatron 1F1B's throughput with half its
    memory. tabsched, llama3-8b at 32K on dgx-h100, p=8, t=4 with sequence parallelism,
    FlashAttention, 16 microbatches: sliced 1F1B with 4 slices at the unsliced lead is at
    least 1.1x faster within 1F1B's memory; with Seq1F1B's short lead, 2 slices hold at
    most 0.6 of 1F1B's peak activations, and 4 slices are at least 1.1x faster holding
    under half (1.14x at 0.23x; see bench/seq1f1b.py for the figures)."""
    costs = ModelCosts(LONG, "dgx-h100", Execution(tensor_parallel=4, sequence_parallel=True,
                                                    attention="flash"))
    table = generate("1f1b", devices=8, microbatches=16)
    base = evaluate(table, costs)
    persistent = float(np.max(costs.persistent_memory(table)))
    fast = evaluate(SplitSequence(4, "kept").apply(table, costs), costs)
    assert base.makespan / fast.makespan >= 1.1
    assert fast.peak_memory <= base.peak_memory
    small = evaluate(SplitSequence(2).apply(table, costs), costs)
    assert (small.peak_memory - persistent) <= 0.6 * (base.peak_memory - persistent)
    both = evaluate(SplitSequence(4).apply(table, costs), costs)
    assert base.makespan / both.makespan >= 1.1
    assert (both.peak_memory - persistent) <= 0.5 * (base.peak_memory - persistent)


def test_adapt_slices_a_start_that_does_not_fit_rather_than_only_a_reference(cli):
    """llama3-8b at 32K on 8 H100s: 1F1B needs 172 GB a device, and of the fixed tables
    only zb-auto fits (46.1 s). The search starts from zb-auto, but its first round also
    tries 1F1B's own moves: 1F1B in 4 slices fits, and the search goes on from there
    (12.2 s); before, it only sliced zb-auto (21.6 s)."""
    code, out, err = cli("adapt", "1f1b", "-p", "8", "-m", "16", "--model", LONG, "--system",
                         "dgx-h100", "--attention", "flash", "--memory-budget", "capacity",
                         "--sequence-slices", "2,4", "--samples", "4", "--max-rounds", "3",
                         "-q", "--json")
    assert code == 0, err
    found = json.loads(out)
    assert found["started_from"] is None
    adapted, zb_auto = found["adapted"], found["references"]["zb-auto"]
    assert adapted["feasible"] and adapted["transforms"][0].startswith("split-sequence(k=4")
    assert adapted["mean_makespan"] < 0.5 * zb_auto["mean_makespan"]


EVAL = ("eval", "1f1b", "-p", "4", "-m", "8", "--model", LONG, "--system", "dgx-h100",
        "-t", "8", "--sequence-parallel", "--attention", "flash")


def test_cli_eval_slices_and_counts_each_sequence_once(cli):
    code, out, err = cli(*EVAL, "--json")
    assert code == 0, err
    whole = json.loads(out)
    code, out, err = cli(*EVAL, "--sequence-slices", "4", "--slice-lead", "kept", "--json")
    assert code == 0, err
    sliced = json.loads(out)
    assert sliced["throughput"]["tokens"] == whole["throughput"]["tokens"]
    assert sliced["makespan"] < whole["makespan"]


@pytest.mark.parametrize("extra, message", [
    (("--sequence-slices", "0"), "--sequence-slices 0: expected an integer >= 1"),
    (("--sequence-slices", "5"), "--sequence-slices 5: does not divide model"),
    (("--sequence-slices", "2", "--level", "formula"), "--sequence-slices: --level formula")])
def test_cli_eval_refuses_bad_slices_in_one_line(cli_error, extra, message):
    assert cli_error(*EVAL, *extra).startswith(message)
