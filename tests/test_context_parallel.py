"""Context parallelism (Execution.context_parallel, cp_comm; issue 23, item 6)."""

import numpy as np
import pytest
from click.testing import CliRunner

from tabsched import ModelCosts, generate
from tabsched.cli import cli
from tabsched.costs import load_model
from tabsched.costs.kernels import layer_kernels
from tabsched.exceptions import InvalidParameterError
from tabsched.execution import Execution
from tabsched.lower import lower
from tabsched.nodes import OPTIMIZER

MODEL = "llama3-8b"
SYSTEM = "dgx-h100"


def _run(cp=1, **fields):
    return Execution(tensor_parallel=2, attention="flash", context_parallel=cp, **fields)


def test_what_context_parallelism_needs():
    model = load_model(MODEL)
    with pytest.raises(InvalidParameterError, match="needs attention 'flash'"):
        Execution(context_parallel=2).check(model)
    with pytest.raises(InvalidParameterError, match=r"not a multiple of 2 x 3"):
        _run(3).check(model)
    with pytest.raises(InvalidParameterError, match=r"cp_comm 'a2a': tensor_parallel x "
                                                    r"context_parallel 16 does not divide "
                                                    r"kv_heads 8"):
        _run(8, cp_comm="a2a").check(model)
    with pytest.raises(InvalidParameterError, match="cp_comm 'ring' is not one of p2p, "
                                                    "allgather, a2a"):
        _run(2, cp_comm="ring")
    with pytest.raises(InvalidParameterError, match="zero_stage 3 with context_parallel 2 is "
                                                    "not priced yet"):
        _run(2, data_parallel=2, zero_stage=3)
    assert _run(2).context_exchange == "p2p" and _run(1).context_exchange is None
    assert _run(2, data_parallel=4).gradient_replicas == 8


def test_every_kernel_does_a_context_ranks_share():
    model = load_model(MODEL)
    one, two = (layer_kernels(model, _run(cp)) for cp in (1, 2))
    for phase in ("F", "I", "W"):
        work = {kernel.name: kernel for kernel in one[phase]}
        for kernel in two[phase]:
            if kernel.name.startswith("cp_"):
                continue
            # half the tokens: half of every token-proportional FLOP, byte and message;
            # the attention meets the whole sequence's keys with half the queries
            assert kernel.flops[1] == pytest.approx(work[kernel.name].flops[1] / 2)
            assert kernel.message[1] == pytest.approx(work[kernel.name].message[1] / 2)
    # and the exchange of keys and values over the context group
    ring = [kernel for kernel in two["F"] if kernel.name.startswith("cp_")]
    assert [(k.name, k.collective, k.group, k.hides_behind) for k in ring] == [
        ("cp_kv_ring", "all_gather", "context", "flash_attention")]
    kv = 2 * model.sequence * 2 * model.kv_width / 2          # d * S * 2hk / t
    assert ring[0].message == (0.0, kv)
    backward = [kernel for kernel in two["I"] if kernel.name.startswith("cp_")]
    assert [(k.name, k.message) for k in backward] == [("cp_kv_ring_bwd", (0.0, 2 * kv))]
    ulysses = layer_kernels(model, _run(2, cp_comm="a2a"))
    qkv = 2 * (model.sequence / 2) * (model.hidden + 2 * model.kv_width) / 2
    out = 2 * (model.sequence / 2) * model.hidden / 2
    assert [(k.name, k.collective, k.message, k.hides_behind) for k in ulysses["F"]
            if k.name.startswith("cp_")] == [("cp_a2a_in", "all_to_all", (0.0, qkv), None),
                                             ("cp_a2a_out", "all_to_all", (0.0, out), None)]
    assert [(k.name, k.message) for k in ulysses["I"] if k.name.startswith("cp_")] == [
        ("cp_a2a_bwd_in", (0.0, out)), ("cp_a2a_bwd_out", (0.0, qkv))]
    gathered = layer_kernels(model, _run(2, cp_comm="allgather"))
    assert [(k.name, k.collective, k.hides_behind) for k in gathered["I"]
            if k.name.startswith("cp_")] == [("cp_kv_all_gather", "all_gather", None),
                                             ("cp_dkv_reduce_scatter", "reduce_scatter", None)]


def test_activations_and_transfers_are_a_context_ranks_share():
    model = load_model(MODEL)
    for recompute in ("selective", "full"):
        assert model.layer_activation(2, recompute, parallel=_run(2)) * 2 == \
            model.layer_activation(2, recompute, parallel=_run(1))
    assert model.transfer_bytes(1, _run(4)) * 4 == model.transfer_bytes(1, _run(1))
    assert model.output_activation(1, _run(2)) * 2 == model.output_activation(1, _run(1))


def test_the_ring_hides_behind_the_attention_and_the_layer_halves():
    times = {cp: ModelCosts(MODEL, SYSTEM, _run(cp)).part_times((1.0,))["layer"][:, 0]
             for cp in (1, 2)}
    gathered, ulysses = (ModelCosts(MODEL, SYSTEM, _run(2, cp_comm=kind)).part_times(
        (1.0,))["layer"][:, 0] for kind in ("allgather", "a2a"))
    assert np.all(times[2] < 0.6 * times[1]) and np.all(times[2] > 0.45 * times[1])
    assert np.all(times[2] <= gathered)       # exposed all-gathers cost at least the ring
    assert np.all(ulysses < 0.6 * times[1])


def test_gradients_reduce_over_data_and_context_ranks():
    table = generate("1f1b", devices=2, microbatches=4)
    lowered = lower(table, optimizer=True)
    cp = ModelCosts(MODEL, SYSTEM, _run(2))
    dp = ModelCosts(MODEL, SYSTEM, _run(1, data_parallel=2))
    assert cp.execution.optimizer_step and cp.placement.gradient_group().size == 2
    # two ranks t apart in one node either way: the same all-reduce, the same step
    assert np.asarray(cp.node_prices(lowered, OPTIMIZER)) == pytest.approx(
        np.asarray(dp.node_prices(lowered, OPTIMIZER)))
    # ZeRO-1 shards the optimizer state over both
    sharded = ModelCosts(MODEL, SYSTEM, _run(2, data_parallel=2, zero_stage=1))
    assert sharded.persistent_memory(table)[0] < ModelCosts(
        MODEL, SYSTEM, _run(1, data_parallel=2, zero_stage=1)).persistent_memory(table)[0]


def test_the_cli_prices_it_and_refuses_what_cannot_be():
    runner = CliRunner()
    base = ["eval", "1f1b", "-p", "2", "-m", "8", "--model", MODEL, "--system", SYSTEM,
            "-t", "2"]
    ok = runner.invoke(cli, base + ["--attention", "flash", "--context-parallel", "2"])
    assert ok.exit_code == 0, ok.output
    for extra, words in ((["--cp-comm", "p2p"], "--cp-comm applies to --context-parallel > 1"),
                         (["--context-parallel", "2"], "needs attention 'flash'"),
                         (["--context-parallel", "0"], "--context-parallel must be >= 1")):
        result = runner.invoke(cli, base + extra)
        assert result.exit_code == 1 and words in result.output, result.output
        assert "Traceback" not in result.output
        assert len(result.output.strip().splitlines()) == 1


def test_megatron_arguments_carry_the_context_group():
    from tabsched.megatron import execution_arguments
    arguments = dict(execution_arguments(_run(4, cp_comm="allgather")))
    assert arguments["--context-parallel-size"] == 4
    assert arguments["--cp-comm-type"] == "allgather"
    assert "--context-parallel-size" not in dict(execution_arguments(_run(1)))


@pytest.mark.parametrize("command", ["sweep", "compare"])
def test_sweep_and_compare_take_every_new_execution_flag(command):
    """The flags reach their cost models as execution fields (they were keywords
    ModelCosts did not take: a traceback)."""
    runner = CliRunner()
    base = [command, "1f1b", "-p", "2", "-m", "8", "--model", MODEL, "--system", SYSTEM,
            "-t", "2"]
    for extra in (["--attention", "flash", "--context-parallel", "2", "--cp-comm",
                   "allgather"],
                  ["--fp8", "tensorwise"],
                  ["-d", "2", "--overlap-grad-reduce", "--grad-bucket-size", "1000000",
                   "--no-align-grad-reduce"]):
        result = runner.invoke(cli, base + extra)
        assert result.exit_code == 0, (extra, result.output)
        assert "Traceback" not in result.output
    result = runner.invoke(cli, ["sweep", "1f1b", "-p", "2", "-m", "8", "--model", MODEL,
                                 "--system", SYSTEM, "-t", "2", "--attention", "flash",
                                 "--context-parallel", "2", "--fp8", "blockwise"])
    header, row = result.output.strip().splitlines()[:2]
    values = dict(zip(header.split(","), next(iter(__import__("csv").reader([row])))))
    assert (values["context_parallel"], values["fp8"], values["gpus"]) == ("2", "blockwise",
                                                                            "8")


def test_plan_keeps_the_executions_context_degree_and_prunes_soundly():
    from tabsched.plan import plan
    from tabsched.costs import load_system
    from tabsched.plan.rows import table_for
    from tabsched.plan.search import run_costs
    from tabsched import evaluate
    base = Execution(attention="flash", context_parallel=2)
    options = dict(families=["1f1b", "gpipe"], execution=base, top=6, memory_budget="60GB",
                   zero_stages=(0, 1))
    pruned = plan(MODEL, SYSTEM, 16, 32, **options)
    exhaustive = plan(MODEL, SYSTEM, 16, 32, prune=False, **options)
    assert [(row.iteration_s, row.configuration) for row in pruned.rows] == \
        [(row.iteration_s, row.configuration) for row in exhaustive.rows]
    for row in pruned.rows:
        run = row.execution
        assert run.context_parallel == 2
        assert run.tensor_parallel * 2 * row.layout.devices * run.data_parallel == 16
        assert "--context-parallel 2" in row.eval_command
    row = pruned.rows[0]
    costs = run_costs(load_model(MODEL), load_system(SYSTEM), row.execution)
    evaluated = evaluate(table_for(row.configuration, costs, row.memory_budget), costs,
                         memory_budget=row.memory_budget)
    assert evaluated.makespan == row.iteration_s and evaluated.violations == []
    with pytest.raises(InvalidParameterError, match="zero stages 3 with context parallelism "
                                                    "2 are not priced yet"):
        plan(MODEL, SYSTEM, 16, 32, families=["1f1b"], execution=base, zero_stages=(3,))
    with pytest.raises(InvalidParameterError, match=r"no split t x cp x p x d = 15"):
        plan(MODEL, SYSTEM, 15, 32, families=["1f1b"], execution=base)
    with pytest.raises(InvalidParameterError, match="context_parallel 2 needs attention "
                                                    "'flash'"):
        plan(MODEL, SYSTEM, 16, 32, families=["1f1b"], execution=Execution(context_parallel=2))
    # a search over context degrees: each row's degree is one asked for, and the best of
    # the wider space is no slower than the best at cp = 1
    wide = plan(MODEL, SYSTEM, 16, 32, families=["1f1b"], context_parallel=[1, 2, 4],
                execution=Execution(attention="flash"), top=30, zero_stages=(0, 1))
    narrow = plan(MODEL, SYSTEM, 16, 32, families=["1f1b"], context_parallel=[1],
                  execution=Execution(attention="flash"), top=30, zero_stages=(0, 1))
    assert {row.execution.context_parallel for row in wide.rows} <= {1, 2, 4}
    assert len({row.execution.context_parallel for row in wide.rows}) > 1
    assert wide.rows[0].iteration_s <= narrow.rows[0].iteration_s
    assert {row.execution.context_parallel for row in narrow.rows} == {1}


def test_sequence_parallelism_splits_a_context_ranks_tokens():
    from tabsched.costs.transformer import TransformerModel
    odd = TransformerModel(layers=2, hidden=64, heads=4, sequence=24, vocab=100)
    with pytest.raises(InvalidParameterError, match="sequence_parallel: tensor_parallel 4 "
                                                    "does not divide the 6 tokens of a "
                                                    "context rank"):
        Execution(tensor_parallel=4, sequence_parallel=True, context_parallel=4,
                  attention="flash").check(odd)


def test_plan_counts_zero_2_3_refused_where_the_context_degree_is_above_1():
    from tabsched.plan import plan
    result = plan(MODEL, SYSTEM, 16, 32, families=["1f1b"], context_parallel=[1, 2],
                  execution=Execution(attention="flash"), zero_stages=(3,), top=40)
    assert {row.execution.context_parallel for row in result.rows} == {1}
    assert {row.execution.zero_stage for row in result.rows} == {3}
    assert result.counts.refused["ZeRO-2/3 with context parallelism (not priced)"] > 0
