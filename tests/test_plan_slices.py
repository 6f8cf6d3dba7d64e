"""tabsched.plan with sequence slices: the bounds stay below the simulation, pruning keeps
the exhaustive answer, slicing never worsens the best, and the CLI refuses bad input."""

import json
import shlex

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tabsched import Execution, ModelCosts
from tabsched.costs import load_system
from tabsched.costs.transformer import TransformerModel
from tabsched.evaluate import evaluate_summaries
from tabsched.exceptions import InvalidParameterError, MemoryBudgetError
from tabsched.plan import plan
from tabsched.plan.bounds import (LayoutArrays, RunGroups, bound_costs, memory_bounds,
                                  step_seconds, time_bounds)
from tabsched.plan.search import sliced_table_of
from tabsched.plan.space import Layout, family_accepts, family_variants, layer_splits, \
    slicing_refusal, stage_count
from tabsched.schedules import families, get_family

MODEL = TransformerModel(layers=24, hidden=1024, heads=16, sequence=2048, vocab=32000,
                         ffn=4096, name="small")
SYSTEM = load_system("dgx-a100")
#: Every family that slices (the others are refused by name, and left out by default).
SLICING = [family.name for family in families()
           if slicing_refusal(family.name, family_variants(family, 2)[0]) is None]
LONG = "examples/llama3-8b-32k.toml"
FLASH = Execution(attention="flash")


def test_which_families_slice():
    assert {"1f1b", "gpipe", "zb-h1", "zbv", "interleaved-1f1b", "chimera"} <= set(SLICING)
    assert not {"zb-auto", "zbv-auto", "dualpipe", "dualpipev"} & set(SLICING)


@settings(max_examples=40, deadline=None)
@given(family=st.sampled_from(SLICING), devices=st.sampled_from([2, 3, 4, 6]),
       microbatches=st.sampled_from([1, 2, 3, 4, 6, 8]), slices=st.sampled_from([2, 4, 8]),
       lead=st.sampled_from(["seq1f1b", "kept"]), tensor=st.sampled_from([1, 2, 4]),
       size=st.sampled_from([1, 2]), recompute=st.sampled_from(["none", "selective", "full"]),
       parallel=st.booleans(), data=st.sampled_from([1, 2]), zero=st.booleans(),
       attention=st.sampled_from(["eager", "flash"]), choice=st.integers(0, 20),
       split_choice=st.integers(0, 20))
def test_sliced_bounds_never_exceed_the_simulation(family, devices, microbatches, slices, lead,
                                                   tensor, size, recompute, parallel, data,
                                                   zero, attention, choice, split_choice):
    """On random sliced configurations of every family that slices (uneven layer splits,
    ZeRO-1, split backwards, replicated stages, eager and flash attention), the bounds the
    plan gives a sliced candidate are at most the simulated makespan and the fullest
    device's simulated peak, the slices' own costs and memory."""
    variants = family_variants(get_family(family), 3)
    params = variants[choice % len(variants)]
    stages = stage_count(family, params, devices)
    if stages is None or family_accepts(family, params, devices, microbatches) is not None:
        return
    options = layer_splits(MODEL.layers, stages, 3)
    if not options:
        return
    layout = Layout(family, params, devices, stages, options[split_choice % len(options)],
                    slices, lead)
    run = Execution(tensor_parallel=tensor, sequence_parallel=parallel and tensor > 1,
                    data_parallel=data, microbatch_size=size, recompute=recompute,
                    zero_stage=1 if zero and data > 1 else 0, optimizer_step=True,
                    attention=attention)
    costs = ModelCosts(MODEL, SYSTEM, run)
    groups = RunGroups.over_slices(RunGroups([bound_costs(MODEL, SYSTEM, run)],
                                             [microbatches]), slices)
    arrays = LayoutArrays.of(layout.whole, groups.cost_models[0])
    time = time_bounds(arrays, groups, step=step_seconds(layout.whole, costs))[0]
    table = sliced_table_of(layout, microbatches, costs)
    # the bound's persistent bytes are the cost model's (tests/test_plan_bounds.py)
    persistent = np.asarray(costs.persistent_memory(table), dtype=np.float64)
    memory = memory_bounds(arrays, groups, (None, None, None), persistent[None, :])[0, 0]
    assert table.sequence_slices is not None and len(table.sequence_slices) == \
        microbatches * slices
    summary = evaluate_summaries(table, [costs], formula=False)[0]
    assert time <= summary.makespan * (1 + 1e-9)
    assert memory <= max(summary.peak_memory) * (1 + 1e-9)


def test_one_slice_bounds_are_the_whole_sequences():
    """``over_slices(1)`` is the run groups' own numbers: slicing by 1 bounds nothing new."""
    run = Execution(tensor_parallel=2, attention="flash")
    groups = RunGroups([bound_costs(MODEL, SYSTEM, run)], [8])
    one = RunGroups.over_slices(groups, 1)
    layout = Layout("1f1b", (), 4, 4)
    arrays = LayoutArrays.of(layout, groups.cost_models[0])
    assert time_bounds(arrays, one) == pytest.approx(time_bounds(arrays, groups), rel=1e-12)
    for part in groups.parts:
        assert np.allclose(one.parts[part], groups.parts[part])


def _ranking(result):
    return [(row.iteration_s, row.configuration) for row in result.rows]


@settings(max_examples=6, deadline=None)
@given(gpus=st.sampled_from([4, 8]), global_batch=st.sampled_from([8, 16]),
       chosen=st.lists(st.sampled_from(SLICING), min_size=1, max_size=3, unique=True),
       budget=st.sampled_from(["3GB", "5GB", "8GB", "40GB"]),
       slices=st.sampled_from([(2,), (4,), (2, 4)]), top=st.sampled_from([1, 3, 10]),
       leads=st.sampled_from([("seq1f1b",), ("kept",), ("seq1f1b", "kept")]))
def test_sliced_plans_prune_to_the_exhaustive_answer_and_never_worsen_the_best(
        gpus, global_batch, chosen, budget, slices, top, leads):
    """With sequence slices in the space, every pruning rule gives the exhaustive search's
    rows, every simulated configuration's bounds are at most what it simulated to, and the
    best is never worse than the best without slices (whole sequences stay in the space)."""
    options = dict(families=chosen, memory_budget=budget, uneven=0, max_chunks=2, top=top,
                   recompute=["none", "full"], execution=FLASH)
    try:
        whole = plan(MODEL, SYSTEM, gpus, global_batch, **options)
    except MemoryBudgetError:
        whole = None
    options.update(sequence_slices=slices, slice_leads=leads)
    try:
        exhaustive = plan(MODEL, SYSTEM, gpus, global_batch, prune=False, **options)
    except MemoryBudgetError:
        assert whole is None        # slicing only adds candidates
        return
    for evaluated in exhaustive.evaluated:
        if evaluated.makespan is not None:
            assert evaluated.lower_bound <= evaluated.makespan * (1 + 1e-9)
            assert evaluated.memory_bound <= evaluated.peak_memory * (1 + 1e-9)
    if whole is not None:
        assert exhaustive.best.iteration_s <= whole.best.iteration_s
    for prune in (True, {"memory"}, {"time"}):
        pruned = plan(MODEL, SYSTEM, gpus, global_batch, prune=prune, **options)
        assert _ranking(pruned) == _ranking(exhaustive), prune
        assert pruned.counts.simulated <= exhaustive.counts.simulated


def test_slicing_is_chosen_when_nothing_else_fits():
    """The long-context case of docs/guide/sequence-slices.md: on 8 GPUs without
    recomputation no whole-sequence configuration fits 80 GB; with slices 1F1B does."""
    options = dict(pipeline_parallel=[8], recompute=["none"], families=["1f1b", "zb-h1"],
                   execution=FLASH)
    with pytest.raises(MemoryBudgetError):
        plan(LONG, "dgx-h100", 8, 16, **options)
    result = plan(LONG, "dgx-h100", 8, 16, sequence_slices=[2, 4], **options)
    best = result.best
    assert best.layout.slices > 1 and best.peak_memory_max <= 80e9
    assert result.sequence_slices == (2, 4)
    assert "--sequence-slices" in best.eval_command and best.megatron is None


def test_slicing_is_chosen_when_it_is_faster():
    """Seq1F1B's comparison (Sun et al. 2024: sliced 1F1B against Megatron-LM's 1F1B,
    1.14x): on 32 GPUs at 32K tokens sliced 1F1B is 1.14x 1F1B (3.71 s against 4.22 s).
    Against the best of several families the gain is smaller (interleaved 1F1B 3.74 s
    whole, 3.60 s sliced): with FlashAttention's causal tiles counted, slicing does not
    change the attention's work, only the pipeline's grain and its memory."""
    options = dict(tensor_parallel=[4], pipeline_parallel=[8], recompute=["none"],
                   sequence_parallel=[True], zero_stages=[0], max_chunks=2, execution=FLASH)
    whole = plan(LONG, "dgx-h100", 32, 16, families=["1f1b"], **options)
    sliced = plan(LONG, "dgx-h100", 32, 16, families=["1f1b"], sequence_slices=[2, 4],
                  **options)
    assert whole.best.layout.slices == 1
    assert sliced.best.layout.slices > 1
    assert sliced.best.iteration_s < whole.best.iteration_s / 1.1
    families = ["1f1b", "zb-h1", "interleaved-1f1b"]
    whole = plan(LONG, "dgx-h100", 32, 16, families=families, **options)
    sliced = plan(LONG, "dgx-h100", 32, 16, families=families, sequence_slices=[2, 4],
                  **options)
    assert whole.best.layout.slices == 1 and sliced.best.layout.slices > 1
    assert sliced.best.iteration_s < whole.best.iteration_s


def test_the_default_families_leave_out_those_that_do_not_slice():
    result = plan(MODEL, SYSTEM, 4, 8, sequence_slices=[2], tensor_parallel=[1],
                  pipeline_parallel=[4], recompute=["none"], execution=FLASH, top=100)
    sliced = {row.family for row in result.rows if row.layout.slices > 1}
    assert sliced and not sliced & {"zb-auto", "zbv-auto", "dualpipe", "dualpipev"}
    assert any("cost-driven" in reason for reason in result.counts.refused)


def test_context_parallel_splits_run_whole_sequences():
    result = plan(MODEL, SYSTEM, 4, 8, sequence_slices=[2], context_parallel=[1, 2],
                  tensor_parallel=[1], recompute=["none"], families=["1f1b"],
                  execution=FLASH, top=100)
    assert all(row.layout.slices == 1 for row in result.rows
               if row.execution.context_parallel > 1)
    assert any("context parallelism" in reason for reason in result.counts.refused)


@pytest.mark.parametrize("kwargs,message", [
    (dict(sequence_slices=[0]), "sequence_slices 0: expected an integer >= 1"),
    (dict(sequence_slices=[3]), "sequence_slices 3: does not divide model small's sequence"),
    (dict(sequence_slices=[2], families=["1f1b", "dualpipe"]),
     "sequence_slices 2: family dualpipe runs overlapped cells"),
    (dict(sequence_slices=[2], families=["zb-auto"]),
     "sequence_slices 2: family zb-auto builds its table for whole sequences"),
    (dict(sequence_slices=[2], slice_leads=["long"]), "slice_leads 'long' is not one of"),
])
def test_bad_slicing_arguments(kwargs, message):
    with pytest.raises(InvalidParameterError, match=message):
        plan(MODEL, SYSTEM, 4, 8, **kwargs)


CLI = (LONG, "dgx-h100", "--gpus", "8", "--global-batch", "16", "-p", "8", "--recompute",
       "none", "--families", "1f1b,zb-h1", "--execution",
       "examples/executions/flash-attention.toml")


def test_the_cli_shows_the_slices_and_reproduces_the_best(cli):
    code, out, err = cli("plan", *CLI, "--sequence-slices", "2,4", "--top", "3", "-q")
    assert code == 0, err
    lines = out.splitlines()
    header = lines[1].split()
    assert "slices" in header
    column = header.index("slices")
    assert lines[2].split()[column] in ("2", "4")
    code, out, err = cli("plan", *CLI, "--sequence-slices", "2,4", "--top", "2", "-q",
                         "--json")
    data = json.loads(out)
    assert data["sequence_slices"] == [2, 4]
    for row in data["rows"]:
        assert row["sequence_slices"] in (2, 4) and row["slice_lead"] in ("seq1f1b", "kept")
        code, evaluated, err = cli(*shlex.split(row["eval_command"])[1:], "--json")
        assert code == 0, err
        assert json.loads(evaluated)["makespan"] == row["iteration_s"]


def test_the_cli_csv_has_the_slice_columns(cli, tmp_path):
    import csv
    path = tmp_path / "plan.csv"
    code, _, err = cli("plan", *CLI, "--sequence-slices", "4", "--slice-lead", "seq1f1b",
                       "--top", "1", "-q", "-o", str(path))
    assert code == 0, err
    with open(path, newline="") as handle:
        (row,) = list(csv.DictReader(handle))
    assert (row["sequence_slices"], row["slice_lead"]) == ("4", "seq1f1b")


def test_without_slices_the_report_has_no_slices_column(cli):
    code, out, _ = cli("plan", "llama3-8b", "dgx-h100", "--gpus", "8", "--global-batch",
                       "16", "-t", "2", "--families", "1f1b", "--top", "1", "-q")
    assert code == 0 and "slices" not in out.splitlines()[1].split()


@pytest.mark.parametrize("argv,message", [
    (("--sequence-slices", "0"), "--sequence-slices '0': expected positive integers"),
    (("--sequence-slices", "abc"), "--sequence-slices 'abc': expected integers"),
    (("--sequence-slices", "3"), "--sequence-slices 3: does not divide model llama3-8b-32k's "
                                 "sequence 32768"),
    (("--sequence-slices", "2", "--families", "1f1b,dualpipev"),
     "--sequence-slices 2: family dualpipev runs overlapped cells"),
    (("--sequence-slices", "2", "--families", "zbv-auto"),
     "--sequence-slices 2: family zbv-auto builds its table for whole sequences"),
])
def test_bad_slices_are_one_line(cli_error, argv, message):
    assert message in cli_error("plan", LONG, "dgx-h100", "--gpus", "8", "--global-batch",
                                "16", *argv)


def test_processes_give_the_serial_answer_with_slices():
    """Sliced layouts travel to worker processes and come back with the serial ranking."""
    options = dict(families=["1f1b", "zb-h1"], tensor_parallel=[1], recompute=["none"],
                   execution=FLASH, sequence_slices=[2, 4], top=5)
    serial = plan(MODEL, SYSTEM, 4, 8, **options)
    assert _ranking(plan(MODEL, SYSTEM, 4, 8, jobs=2, **options)) == _ranking(serial)


@settings(max_examples=20, deadline=None)
@given(family=st.sampled_from(SLICING), devices=st.sampled_from([2, 3, 4]),
       microbatches=st.sampled_from([1, 2, 4, 6, 8]), slices=st.sampled_from([2, 4]))
def test_where_the_leads_agree_they_give_one_table(family, devices, microbatches, slices):
    """``leads_agree``, which lets the plan search the kept lead once where it is Seq1F1B's,
    is never wrong: both leads then give the same rows."""
    from tabsched.adapt.sequence import SplitSequence, leads_agree
    from tabsched.schedules import generate
    params = family_variants(get_family(family), 2)[0]
    if stage_count(family, params, devices) is None or \
            family_accepts(family, params, devices, microbatches) is not None:
        return
    table = generate(family, devices=devices, microbatches=microbatches, **dict(params))
    if leads_agree(table):
        costs = ModelCosts(MODEL, SYSTEM)
        short, kept = (SplitSequence(slices, lead).apply(table, costs)
                       for lead in ("seq1f1b", "kept"))
        assert [[str(op) for op in row] for row in short.orders()] == \
            [[str(op) for op in row] for row in kept.orders()]


def test_the_kept_lead_is_searched_once_where_it_is_seq1f1bs():
    result = plan(MODEL, SYSTEM, 2, 8, sequence_slices=[2], families=["1f1b"],
                  tensor_parallel=[1], recompute=["none"], execution=FLASH, top=100)
    assert {row.layout.lead for row in result.rows if row.layout.slices > 1} == {"seq1f1b"}
    assert any("kept lead" in reason for reason in result.counts.refused)
