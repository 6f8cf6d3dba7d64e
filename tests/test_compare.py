import pytest

from tabsched import InvalidParameterError, UnitCosts, UnknownNameError, evaluate, generate
from tabsched.compare import compare, disagreements, model_costs_for, parse_spec, rank
from tabsched.evaluate import table_level


def test_unit_cost_comparison_has_exact_numbers():
    rows = compare(["gpipe", "1f1b", "chimera"], 4, 8, costs=UnitCosts())
    gpipe, one, chimera = rows
    for row in (gpipe, one):
        assert row.formula["bubble_ratio"] == pytest.approx(3 / 11)
        assert row.table == {"bubble_ratio": pytest.approx(3 / 11), "slots": 22, "cells": 64}
        assert row.simulation["makespan"] == 22.0
    assert chimera.formula["bubble_ratio"] == pytest.approx(2 / 18)
    assert chimera.table["bubble_ratio"] == pytest.approx(2 / 18)
    assert chimera.simulation["makespan"] == 18.0           # SCHEDULES.md §8, F=B
    assert one.simulation["peak_activation"] == [4, 3, 2, 1]
    assert [row.ranks for row in rows] == [
        {"formula": 2, "table": 2, "simulation": 2}, {"formula": 2, "table": 2, "simulation": 2},
        {"formula": 1, "table": 1, "simulation": 1}]
    assert not any(row.disagrees for row in rows) and disagreements(rows) == []


def test_simulation_level_matches_evaluate_and_marks_disagreement():
    rows = compare(["gpipe", "1f1b", "chimera"], 8, 16, system="slow_nw_fast_cp",
                   global_batch=256)
    costs = model_costs_for("paper-128l", "slow_nw_fast_cp", 16, global_batch=256)
    assert costs.model.microbatch_size == 16
    single = evaluate(generate("chimera", devices=8, microbatches=16), costs,
                      grad_sync="replicas")
    assert rows[2].simulation["makespan"] == single.makespan
    assert rows[2].simulation["peak_memory"] == [d.peak_total_memory for d in single.devices]
    # chimera has the smallest bubble on paper but is slowest here: the levels disagree
    assert rows[2].ranks["table"] == 1 and rows[2].ranks["simulation"] == 3
    assert rows[2].disagrees
    assert ("table", "simulation", "gpipe", "chimera") in disagreements(rows)


def test_invalid_families_are_reported_not_raised():
    rows = compare(["chimera", "1f1b"], 3, 6, costs=UnitCosts())
    assert rows[0].error.startswith("chimera: devices must be even")
    assert rows[0].ranks == {"formula": None, "table": None, "simulation": None}
    assert rows[1].error is None and rows[1].ranks["table"] == 1


def test_specs_and_ranks():
    assert parse_spec("chimera:stage_layers_ratio=1:2").kwargs() == {"stage_layers_ratio": "1:2"}
    assert parse_spec("hanayo:waves=2, ").kwargs() == {"waves": 2}
    rows = compare(["chimera:stage_layers_ratio=1:2"], 8, 16)
    assert rows[0].error is None          # the ratio took the model's 128 layers
    assert rank([2.0, 1.0, 2.0, None]) == [2, 1, 2, None]
    with pytest.raises(UnknownNameError, match="unknown schedule family 'chimaera'"):
        parse_spec("chimaera")
    with pytest.raises(InvalidParameterError, match="expected name:key=value"):
        parse_spec("hanayo:waves")
    with pytest.raises(InvalidParameterError, match="global batch 100 does not split into 16"):
        model_costs_for("paper-128l", "mid_nw_mid_cp", 16, global_batch=100)
    with pytest.raises(InvalidParameterError, match="at least one family"):
        compare([], 4, 8)


def test_table_level_counts_an_overlapped_cell_once():
    table = generate("dualpipev", devices=4, microbatches=8)
    level = table_level(table)
    assert level["cells"] == int(table.cell_starts().sum()) < len(table)
    assert level["bubble_ratio"] == pytest.approx(1 - level["cells"] / (4 * level["slots"]))
