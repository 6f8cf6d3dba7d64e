"""evaluate(memory_budget=...): every device over the budget is a violation, with when and how much."""

import json

import pytest

from tabsched import (InvalidParameterError, MemoryBudgetError, ModelCosts, UnitCosts, evaluate,
                      generate)


def test_unit_costs_budget_in_stage_activations():
    # 1F1B P=4, M=8: peaks 4, 3, 2, 1 activations; d0 runs F at slots 0..3 (unit costs)
    result = evaluate(generate("1f1b", devices=4, microbatches=8), UnitCosts(),
                      memory_budget=2.5)
    assert result.memory_budget == 2.5
    assert [v.device for v in result.violations] == [0, 1]
    d0, d1 = result.violations
    assert (d0.since, d0.time, d0.memory, d0.over) == (2.0, 3.0, 4.0, 1.5)
    assert (d1.memory, d1.over) == (3.0, 0.5)
    assert d1.since == d1.time == 3.0


def test_no_budget_no_violations():
    result = evaluate(generate("1f1b", devices=4, microbatches=8))
    assert result.memory_budget is None and result.violations == []
    assert result.check_memory() is result
    assert evaluate(generate("1f1b", devices=4, microbatches=8),
                    memory_budget=4).violations == []


def test_a_budget_below_the_persistent_bytes_flags_every_device():
    table = generate("1f1b", devices=8, microbatches=16)
    costs = ModelCosts("paper-128l", "mid_nw_mid_cp", recompute="full")
    persistent = costs.persistent_memory(table)
    result = evaluate(table, costs, memory_budget=float(persistent.min()) / 2)
    assert [v.device for v in result.violations] == list(range(8))
    for violation, device in zip(result.violations, result.devices):
        assert violation.since == 0.0
        assert violation.memory == pytest.approx(device.peak_total_memory)
        assert violation.over == pytest.approx(device.peak_total_memory - violation.budget)


def test_budget_with_units_and_in_json():
    table = generate("1f1b", devices=8, microbatches=32)
    result = evaluate(table, ModelCosts("paper-128l", "mid_nw_mid_cp"), memory_budget="80GB")
    assert result.memory_budget == 80e9
    over = [d.device for d in result.devices if d.peak_total_memory > 80e9]
    assert [v.device for v in result.violations] == over and over
    data = json.loads(json.dumps(result.to_dict()))
    assert data["memory_budget"] == 80e9
    assert [v["device"] for v in data["violations"]] == over
    assert data["violations"][0]["over"] == pytest.approx(result.violations[0].over)
    with pytest.raises(MemoryBudgetError, match=rf"^memory budget 80 GB exceeded on "
                                                rf"{len(over)} of 8 devices: d0 by [\d.]+ GB "
                                                rf"at [\d.]+ m?s, "):
        result.check_memory()


@pytest.mark.parametrize("costs,budget,message", [
    (UnitCosts(), -1, r"memory_budget must be > 0, not -1"),
    (UnitCosts(), "80GB", r"memory_budget must be a number of activations, not '80GB'"),
    (None, "80XB", r"memory_budget: '80XB' is not a size"),
    (None, "0GB", r"memory_budget must be > 0, not '0GB'"),
])
def test_budget_errors(costs, budget, message):
    costs = costs or ModelCosts("paper-128l", "mid_nw_mid_cp")
    with pytest.raises(InvalidParameterError, match=message):
        evaluate(generate("1f1b", devices=8, microbatches=8), costs, memory_budget=budget)


# ------------------------------------------------------------ the device's own memory
def test_model_costs_check_every_device_against_the_systems_memory_without_a_budget():
    """A device over the system's memory_capacity is never silent: the result lists it,
    with no budget asked for (1F1B at P=8, M=32 holds 133 GB on an 80 GB device)."""
    table = generate("1f1b", devices=8, microbatches=32)
    result = evaluate(table, ModelCosts("paper-128l", "mid_nw_mid_cp"))
    assert result.memory_budget is None and result.violations == []
    assert result.memory_capacity == 80e9 and result.memory_limit == 80e9
    over = [d.device for d in result.devices if d.peak_total_memory > 80e9]
    assert over and [v.device for v in result.capacity_violations] == over
    assert result.capacity_violations == evaluate(
        table, ModelCosts("paper-128l", "mid_nw_mid_cp"), memory_budget=80e9).violations
    assert result.fits is False
    data = json.loads(json.dumps(result.to_dict()))
    assert data["memory_capacity"] == 80e9 and data["fits"] is False
    assert [v["device"] for v in data["capacity_violations"]] == over
    assert data["capacity_violations"][0]["over"] == pytest.approx(
        result.capacity_violations[0].over)


def test_a_budget_rules_over_the_devices_memory():
    table = generate("1f1b", devices=8, microbatches=32)
    costs = ModelCosts("paper-128l", "mid_nw_mid_cp")
    roomy = evaluate(table, costs, memory_budget="200GB")
    assert roomy.fits and roomy.memory_limit == 200e9 and roomy.capacity_violations
    tight = evaluate(generate("1f1b", devices=8, microbatches=8),
                     ModelCosts("gpt3-175b", "dgx-a100", tensor_parallel=8),
                     memory_budget="40GB")
    assert not tight.capacity_violations and not tight.fits


def test_costs_that_know_no_device_check_nothing():
    result = evaluate(generate("1f1b", devices=4, microbatches=8))
    assert result.memory_capacity is None and result.capacity_violations == []
    assert result.fits is True and result.memory_limit is None
    assert "memory_capacity" not in result.to_dict() and "fits" not in result.to_dict()
    budgeted = evaluate(generate("1f1b", devices=4, microbatches=8), memory_budget=2.5)
    assert budgeted.fits is False and budgeted.capacity_violations == []


def test_a_system_without_a_capacity_checks_nothing():
    from tabsched.costs import load_system
    system = load_system("mid_nw_mid_cp").replace(memory_capacity=None)
    costs = ModelCosts("paper-128l", system)
    assert costs.memory_capacity is None
    result = evaluate(generate("1f1b", devices=8, microbatches=32), costs)
    assert result.capacity_violations == [] and result.fits
    assert "capacity_violations" not in result.to_dict() and "throughput" in result.to_dict()


def test_summaries_check_the_devices_memory_as_the_results_do():
    from tabsched.evaluate import evaluate_many, evaluate_summaries
    table = generate("1f1b", devices=8, microbatches=8)
    costs = [ModelCosts("gpt3-175b", "dgx-a100", tensor_parallel=8),
             ModelCosts("gpt3-175b", "dgx-a100", tensor_parallel=8, microbatch_size=4),
             UnitCosts()]
    summaries = evaluate_summaries(table, costs)
    results = evaluate_many(table, costs)
    assert [s.fits for s in summaries] == [r.fits for r in results] == [True, False, True]
    assert [s.memory_capacity for s in summaries] == [80e9, 80e9, None]
    over = max(d.peak_total_memory for d in results[1].devices) - 80e9
    assert summaries[1].over_capacity == over > 0
    assert summaries[0].over_capacity == 0.0 and summaries[2].over_capacity is None
