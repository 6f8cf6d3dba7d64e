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
