"""The formula level: times measured from any cost model, and the `exact` verdict."""

import numpy as np
import pytest

from tabsched import StageCosts, UnitCosts, evaluate, generate
from tabsched.costs import ModelCosts
from tabsched.formulas import formula_for, nominal_times
from tabsched.nodes import TRANSFER


def test_nominal_times_come_from_the_cost_model():
    table = generate("1f1b", devices=2, microbatches=2)
    times = nominal_times(table, StageCosts([1.0, 3.0], comm=0.5))
    assert (times["F"], times["B"], times["I"], times["W"]) == (2.0, 4.0, 2.0, 2.0)
    assert times["comm"] == 0.5 and times["uniform_comm"]
    assert not times["uniform_stages"]
    unit = nominal_times(table, UnitCosts(b=2))
    assert unit["B"] == 2.0 and unit["comm"] == 0.0 and unit["uniform_stages"]


def test_model_costs_are_measured_not_assumed():
    table = generate("chimera", devices=8, microbatches=16)
    costs = ModelCosts("paper-128l", "mid_nw_mid_cp")
    times = nominal_times(table, costs)
    assert times["B"] == pytest.approx(2 * times["F"], rel=0.2)
    assert times["comm"] > 0
    assert formula_for(table, costs)["exact"] is False
    # Chimera's closed form assumes a backward as long as a forward (Li & Hoefler, SC 2021)
    assert formula_for(table, UnitCosts(b=1))["exact"] is True
    assert formula_for(table, UnitCosts())["exact"] is False   # B = 2 by default


@pytest.mark.parametrize("family,params", [
    ("gpipe", {}), ("1f1b", {}), ("zb-h1", {}), ("chimera", {}), ("dualpipev", {}),
])
def test_exact_means_the_table_matches_under_unit_costs(family, params):
    table = generate(family, devices=4, microbatches=8, **params)
    result = evaluate(table, UnitCosts())
    if result.formula.get("exact"):
        assert result.bubble_ratio == pytest.approx(result.formula["bubble_ratio"])


def test_flush_formula_not_exact_with_communication():
    table = generate("1f1b", devices=4, microbatches=8)
    assert evaluate(table).formula["exact"] is True
    assert evaluate(table, StageCosts(1.0, comm=0.1)).formula["exact"] is False
    assert evaluate(table, StageCosts([1.0, 1.0, 1.0, 2.0])).formula["exact"] is False


def test_formula_levels_are_formula_level_for_each_cost_model():
    """The one lookup and check for many cost models, and the remembered stage times,
    give each cost model what formula_level gives it alone (a fresh cache included)."""
    from tabsched import _memo
    from tabsched.formulas import formula_level, formula_levels
    from tabsched.lower import lower
    costs = [ModelCosts("paper-128l", "slow_nw_mid_cp"), StageCosts([1.0, 2.0, 3.0, 4.0]),
             ModelCosts("paper-128l", "fast_nw_fast_cp"), UnitCosts(b=2)]
    tables = [generate("zb-h1", devices=4, microbatches=8),
              generate("chimera", devices=4, microbatches=8),
              generate("1f1b", devices=4, microbatches=8).replace(params={"devices": 2}),
              generate("gpipe", devices=4, microbatches=8).replace(family="no-such-family")]
    for table in tables:
        lowered = lower(table)
        times = [c.node_durations(lowered)[lowered.nodes(TRANSFER)]
                 for c in costs]
        together = formula_levels(table, costs, lowered, times)
        _memo.clear()
        alone = [formula_level(table, c, lowered, transfer_times=t)
                 for c, t in zip(costs, times)]
        assert together == alone
        assert formula_levels(table, costs, lowered) == [formula_level(table, c, lowered)
                                                         for c in costs]


@pytest.mark.parametrize("model, options, stage_layers", [
    ("paper-128l", {}, None), ("paper-128l", {"tensor_parallel": 2}, [40, 30, 30, 28]),
    ("llama3-8b", {"recompute": "full", "microbatch_size": 3}, None),
    ("gpt3-175b", {"tensor_parallel": 8, "sequence_parallel": True}, [24, 24, 24, 24]),
])
def test_model_costs_give_the_probe_tables_durations_directly(model, options, stage_layers):
    """ModelCosts.microbatch_durations is what op_durations gives the probe table, to
    the bit, so the formula level need not build one."""
    from tabsched.formulas import _measured_on_probe
    table = generate("1f1b", devices=4, microbatches=8)
    if stage_layers:
        table = table.replace(stage_layers=stage_layers)
    costs = ModelCosts(model, "mid_nw_mid_cp", **options)
    direct = costs.microbatch_durations(table)
    probed = np.asarray(_measured_on_probe(table, costs)).reshape(4, 4)
    assert np.array_equal(direct, probed)
    assert StageCosts(1.0).microbatch_durations(table) is None


@pytest.mark.parametrize("length", [0, 1, 7, 9, 130, 1000, 4099])
def test_comm_times_of_all_rows_are_each_rows_own(length):
    """Means and uniformity of many rows at once equal each row's alone, to the bit
    (numpy's pairwise sums included)."""
    from tabsched.formulas import _comm_times
    rng = np.random.default_rng(length)
    rows = rng.random((6, length)) * 10.0 ** rng.uniform(-7, 2, (6, 1))
    rows[0] = rows[0, :1] if length else rows[0]       # a uniform row
    for row, (mean, uniform) in zip(rows, _comm_times(rows)):
        assert mean == (float(row.mean()) if length else 0.0)
        assert uniform == bool(length == 0 or np.ptp(row) <= 1e-12 * max(
            1.0, float(row.max())))
