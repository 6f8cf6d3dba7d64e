"""Sequence slices cut by FLOPs: slice_bounds, the table's slice_partition, SplitSequence's
partition and --slice-partition (Seq1F1B's computation-wise partition, section 3.3)."""

import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tabsched.adapt import SplitSequence
from tabsched.costs import ModelCosts
from tabsched.costs.transformer import (SLICE_GRANULE, TransformerModel, load_model,
                                        slice_bounds)
from tabsched.exceptions import InvalidParameterError, InvalidScheduleError
from tabsched.execution import Execution
from tabsched.formats.table_json import from_json, to_json
from tabsched.schedules import generate
from tabsched.table import BACKWARD, FORWARD

LONG = "examples/llama3-8b-32k.toml"
FLASH = Execution(attention="flash")


def _costs(attention):
    model = load_model("llama3-8b").replace(sequence=4096)
    return ModelCosts(model, "dgx-h100", Execution(tensor_parallel=4, attention=attention))


COSTS = {"eager": _costs("eager"), "flash": _costs("flash")}

models = st.builds(
    lambda layers, hidden, heads, gated, tokens, vocab: TransformerModel(
        layers=layers, hidden=hidden, heads=heads, sequence=tokens, vocab=vocab,
        gated_ffn=gated),
    st.integers(1, 4), st.sampled_from([64, 128, 256, 1024]), st.sampled_from([1, 2, 4, 8]),
    st.booleans(), st.integers(1024, 20000), st.integers(2, 5000))


def _slice_flops(model, partition, k):
    """Each slice's forward and backward FLOPs (every layer and the output layer, with
    FlashAttention), as its view prices them."""
    work = []
    for i in range(k):
        view = model.sliced(i, k, partition)
        layer, _ = view.layer_work(1, FLASH)
        output, _ = view.output_work(1, FLASH)
        work.append(view.layers * (layer[FORWARD, 0] + layer[BACKWARD, 0])
                    + output[FORWARD, 0] + output[BACKWARD, 0])
    return np.asarray(work)


@settings(max_examples=60, deadline=None)
@given(model=models, k=st.integers(1, 8))
def test_compute_slices_cover_the_sequence_in_whole_tiles(model, k):
    bounds = slice_bounds(model, k, "compute")
    assert len(bounds) == k + 1 and bounds[0] == 0 and bounds[-1] == model.sequence
    sizes = np.diff(bounds)
    assert np.all(sizes >= min(SLICE_GRANULE, model.sequence))
    assert all(bound % SLICE_GRANULE == 0 for bound in bounds[:-1])
    views = [model.sliced(i, k, "compute") for i in range(k)]
    assert sum(view.sequence for view in views) == model.sequence
    assert [view.keys for view in views] == list(bounds[1:])


@settings(max_examples=40, deadline=None)
@given(model=models, k=st.integers(2, 8), tiles=st.integers(1, 12))
def test_compute_slices_are_never_less_even_in_flops_than_equal_ones(model, k, tiles):
    # a sequence of whole tiles per equal slice, so that both cut at tile bounds
    model = model.replace(sequence=k * tiles * SLICE_GRANULE)
    spread = {}
    for partition in ("even", "compute"):
        work = _slice_flops(model, partition, k)
        spread[partition] = work.max() / work.min()
    assert spread["compute"] <= spread["even"] * (1 + 1e-9)


@pytest.mark.parametrize("k", [2, 4, 8])
def test_compute_slices_of_a_long_sequence_are_even_in_flops(k):
    model = load_model(LONG)
    even = _slice_flops(model, "even", k)
    compute = _slice_flops(model, "compute", k)
    assert even.max() / even.min() > 1.4
    assert compute.max() / compute.min() < 1.05    # 128-token bounds: 2-4% of a slice
    assert compute.sum() == pytest.approx(even.sum(), rel=0.01)
    tokens = np.diff(slice_bounds(model, k, "compute"))
    assert np.all(np.diff(tokens) < 0)          # earlier slices hold more tokens


# that compute-partitioned tables keep every dependency, device order and memory bound is
# tests/test_sequence.py::test_sliced_tables_keep_dependencies_devices_and_memory


def test_compute_slices_hold_activations_by_their_own_tokens():
    # no score tensors with FlashAttention: activations are per token
    costs = ModelCosts(LONG, "dgx-h100", Execution(tensor_parallel=4, attention="flash"))
    table = generate("1f1b", devices=4, microbatches=4)
    sliced = SplitSequence(4, partition="compute").apply(table, costs)
    tokens = np.diff(slice_bounds(costs.model, 4, "compute"))
    assert len(set(tokens.tolist())) > 1
    whole = costs.activation_sizes(table)[(table.stage == 1) & (table.kind == FORWARD)][0]
    forward = (sliced.stage == 1) & (sliced.kind == FORWARD) & (sliced.microbatch < 4)
    parts = costs.activation_sizes(sliced)[forward]
    order = np.argsort(sliced.microbatch[forward])
    assert parts.sum() == pytest.approx(whole, rel=1e-12)
    assert np.allclose(parts[order] / tokens, whole / costs.model.sequence)
    # a slice sends its own tokens' activation
    sent = [costs.model.sliced(i, 4, "compute").transfer_bytes(1, costs.execution)
            for i in range(4)]
    assert np.allclose(np.asarray(sent) / tokens,
                       costs.model.transfer_bytes(1, costs.execution) / costs.model.sequence)


def test_the_partition_changes_the_price_and_even_is_the_default():
    costs = COSTS["flash"]
    table = generate("1f1b", devices=2, microbatches=4)
    even = SplitSequence(2).apply(table, costs)
    compute = SplitSequence(2, partition="compute").apply(table, costs)
    assert even.slice_partition == "even" and compute.slice_partition == "compute"
    assert even.orders() == compute.orders() and even != compute
    assert not np.allclose(costs.op_durations(even), costs.op_durations(compute))
    assert SplitSequence(1, partition="compute").apply(table, costs).slice_partition == "even"
    assert SplitSequence(2, partition="compute").describe() == \
        "split-sequence(k=2,partition=compute)"
    assert SplitSequence(2).to_dict()["partition"] == "even"


def test_the_partition_round_trips_through_json_and_replace():
    costs = COSTS["flash"]
    table = generate("1f1b", devices=2, microbatches=2)
    sliced = SplitSequence(2, partition="compute").apply(table, costs)
    back = from_json(to_json(sliced))
    assert back == sliced and back.slice_partition == "compute"
    assert "slice_partition" not in json.loads(to_json(SplitSequence(2).apply(table, costs)))
    assert sliced.replace(slice_partition="even").slice_partition == "even"
    assert table.replace(slice_partition="compute").slice_partition == "even"   # unsliced


@pytest.mark.parametrize("bad", ["equal", 1, ["even"]])
def test_bad_partitions_are_refused_in_one_line(bad):
    table = SplitSequence(2).apply(generate("1f1b", devices=2, microbatches=2), COSTS["flash"])
    with pytest.raises(InvalidScheduleError, match="^slice_partition must be one of even, "
                                                   "compute, not"):
        table.replace(slice_partition=bad)
    with pytest.raises(InvalidParameterError, match="^split-sequence: partition must be one"):
        SplitSequence(2, partition=bad)
    with pytest.raises(InvalidParameterError, match="^slice partition .* is not one of"):
        slice_bounds(COSTS["flash"].model, 2, bad)
    with pytest.raises(InvalidScheduleError, match='"slice_partition" must be one of even, compute'):
        from_json(to_json(table)[:-1] + ', "slice_partition": "equal"}')


def test_compute_slices_need_a_tile_each():
    model = load_model("llama3-8b").replace(sequence=1000)
    assert slice_bounds(model, 7, "compute")[-2] == 768
    with pytest.raises(InvalidParameterError, match="cannot give each of 8 slices 128 tokens"):
        slice_bounds(model, 8, "compute")
    costs = ModelCosts(model, "dgx-h100", FLASH)
    with pytest.raises(InvalidParameterError, match="cannot give each of 8 slices"):
        SplitSequence(8, partition="compute").apply(generate("1f1b", devices=2,
                                                             microbatches=2), costs)


EVAL = ("eval", "1f1b", "-p", "4", "-m", "8", "--model", LONG, "--system", "dgx-h100",
        "-t", "4", "--sequence-parallel", "--attention", "flash")


def test_cli_eval_prices_the_compute_partition(cli):
    makespans = {}
    for partition in ("even", "compute"):
        code, out, err = cli(*EVAL, "--sequence-slices", "2", "--slice-partition", partition,
                             "--json")
        assert code == 0, err
        makespans[partition] = json.loads(out)["makespan"]
    assert makespans["compute"] < makespans["even"]


@pytest.mark.parametrize("extra, message", [
    (("--sequence-slices", "2", "--slice-partition", "equal"),
     "--slice-partition 'equal': expected one of even, compute"),
    (("--slice-partition", "compute"), "--slice-partition goes with --sequence-slices"),
    (("--sequence-slices", "512", "--slice-partition", "compute"),
     "--slice-partition compute: model llama3-8b-32k's sequence 32768 cannot give each of "
     "512 slices 128 tokens")])
def test_cli_refuses_bad_partitions_in_one_line(cli_error, extra, message):
    assert cli_error(*EVAL, *extra) == message
    assert cli_error("adapt", "1f1b", "-p", "2", "-m", "2", "--model", LONG, "--system",
                     "dgx-h100", "--memory-budget", "capacity", *extra,
                     "--samples", "2") == message


def test_cli_adapt_tries_compute_slices(cli):
    code, out, err = cli("adapt", "1f1b", "-p", "2", "-m", "4", "--model", LONG, "--system",
                         "dgx-h100", "-t", "8", "--sequence-parallel", "--attention", "flash",
                         "--memory-budget", "capacity", "--sequence-slices", "2",
                         "--slice-partition", "compute", "--samples", "2", "--max-rounds",
                         "2", "-q", "--json", "--log")
    assert code == 0, err
    tried = [text for entry in json.loads(out)["search"]["log"]
             for text in entry["transforms"]]
    assert any("partition=compute" in text for text in tried)


PLAN_MODEL = TransformerModel(layers=24, hidden=1024, heads=16, sequence=2048, vocab=32000,
                              ffn=4096, name="small")


@settings(max_examples=4, deadline=None)
@given(gpus=st.sampled_from([4, 8]), budget=st.sampled_from(["3GB", "8GB", "40GB"]),
       slices=st.sampled_from([(2,), (4,), (2, 4)]))
def test_compute_plans_prune_to_the_exhaustive_answer_below_their_bounds(gpus, budget,
                                                                         slices):
    from tabsched.exceptions import MemoryBudgetError
    from tabsched.plan import plan
    options = dict(families=["1f1b", "zb-h1"], memory_budget=budget, uneven=0, max_chunks=2,
                   top=5, recompute=["none", "full"], execution=FLASH,
                   sequence_slices=slices, slice_partition="compute")
    try:
        exhaustive = plan(PLAN_MODEL, "dgx-a100", gpus, 16, prune=False, **options)
    except MemoryBudgetError:
        return
    for evaluated in exhaustive.evaluated:
        if evaluated.makespan is not None:
            assert evaluated.lower_bound <= evaluated.makespan * (1 + 1e-9)
            assert evaluated.memory_bound <= evaluated.peak_memory * (1 + 1e-9)
    pruned = plan(PLAN_MODEL, "dgx-a100", gpus, 16, **options)
    assert [(row.configuration.describe(), row.iteration_s) for row in pruned.rows] == \
        [(row.configuration.describe(), row.iteration_s) for row in exhaustive.rows]


def test_cli_plan_searches_compute_slices_and_reproduces_them(cli, cli_error):
    import shlex
    argv = ("plan", LONG, "dgx-h100", "--gpus", "32", "--global-batch", "16", "-t", "4",
            "-p", "8", "--recompute", "none", "--sequence-parallel", "on", "--zero", "0",
            "--families", "1f1b", "--execution", "examples/executions/flash-attention.toml",
            "--sequence-slices", "2", "--slice-partition", "compute", "--top", "2", "-q")
    code, out, err = cli(*argv, "--json")
    assert code == 0, err
    rows = [row for row in json.loads(out)["rows"] if row["sequence_slices"] == 2]
    assert rows and all(row["slice_partition"] == "compute" for row in rows)
    for row in rows:
        assert "--slice-partition compute" in row["eval_command"]
        code, evaluated, err = cli(*shlex.split(row["eval_command"])[1:], "--json")
        assert code == 0, err
        assert json.loads(evaluated)["makespan"] == row["iteration_s"]
    assert cli_error(*argv[:-7], "--slice-partition", "compute", "-q") == \
        "--slice-partition goes with --sequence-slices"
    assert cli_error(*argv[:-6], "512", "--slice-partition", "compute", "-q") == \
        ("--sequence-slices 512: slice partition compute: model llama3-8b-32k's sequence "
         "32768 cannot give each of 512 slices 128 tokens (a FlashAttention tile)")
