"""Throughput: model FLOPs from the kernel lists, Narayanan et al.'s equation (3), MFU."""

import pytest

from tabsched import InvalidParameterError, ModelCosts, UnitCosts, evaluate, generate
from tabsched.costs.transformer import load_model
from tabsched.throughput import sample_flops, throughput


@pytest.mark.parametrize("name", ["gpt3-175b", "megatron-22b", "turing-530b", "megatron-1t"])
def test_model_flops_are_narayanan_equation_3(name):
    """72 B s l h^2 (1 + s/6h + V/12lh) per sample without recompute; with full recompute
    the paper's printed form, 96 B s l h^2 (1 + s/6h + V/16lh)."""
    model = load_model(name)
    s, l, h, V = model.sequence, model.layers, model.hidden, model.vocab
    plain, _ = sample_flops(model.replace(recompute="none"))
    assert plain == pytest.approx(72 * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h)),
                                  rel=1e-12)
    _, full = sample_flops(model.replace(recompute="full"))
    assert full == pytest.approx(96 * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h)),
                                 rel=1e-12)
    model_selective, hardware_selective = sample_flops(model.replace(recompute="selective"))
    assert model_selective == plain < hardware_selective < full


def test_throughput_counts_every_gpu_and_the_whole_batch():
    costs = ModelCosts("gpt3-175b", "dgx-a100", tensor_parallel=8, data_parallel=4,
                       microbatch_size=2)
    table = generate("1f1b", devices=8, microbatches=16)
    result = evaluate(table, costs)
    run = throughput(costs, table, result.makespan)
    assert (run.gpus, run.samples, run.tokens) == (256, 128.0, 128.0 * 2048)
    assert run.tokens_per_s == pytest.approx(128 * 2048 / result.makespan)
    assert run.mfu == pytest.approx(run.model_flops / result.makespan / 256 / 312e12)
    assert set(run.to_dict()) >= {"tokens_per_s_per_gpu", "model_tflops_per_gpu", "mfu", "hfu"}
    with pytest.raises(InvalidParameterError, match="throughput needs model costs"):
        throughput(UnitCosts(), table, 1.0)


def test_every_result_under_model_costs_carries_its_throughput():
    costs = ModelCosts("gpt3-175b", "dgx-a100", tensor_parallel=8, data_parallel=2)
    table = generate("interleaved-1f1b", devices=8, microbatches=16, chunks=2)
    result = evaluate(table, costs)
    assert result.throughput == throughput(costs, table, result.makespan)
    assert result.to_dict()["throughput"] == result.throughput.to_dict()
    assert result.to_dict()["throughput"]["gpus"] == 128
    unit = evaluate(table)
    assert unit.throughput is None and "throughput" not in unit.to_dict()


def test_a_summary_gives_its_results_throughput_to_the_bit():
    from tabsched.evaluate import evaluate_many, evaluate_summaries
    from tabsched.throughput import iteration_work
    table = generate("1f1b", devices=8, microbatches=16)
    costs = [ModelCosts("gpt3-175b", system, tensor_parallel=8, recompute=mode)
             for system in ("dgx-a100", "dgx-h100") for mode in ("selective", "full")]
    for summary, result in zip(evaluate_summaries(table, costs), evaluate_many(table, costs)):
        assert summary.throughput == result.throughput
    # the work of one model and execution, shared between systems, gives the same numbers
    work = iteration_work(costs[0], table)
    assert throughput(costs[2], table, 3.0, work=work) == throughput(costs[2], table, 3.0)
    assert evaluate_summaries(table, [UnitCosts()])[0].throughput is None
