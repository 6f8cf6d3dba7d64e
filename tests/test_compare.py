import pytest

from tabsched import InvalidParameterError, UnitCosts, UnknownNameError, evaluate, generate
from tabsched.compare import (compare, disagreements, model_costs_for, parse_spec, rank,
                              rank_fitting_first)
from tabsched.evaluate import table_level


def test_unit_cost_comparison_has_exact_numbers():
    # F = B: the lengths SCHEDULES.md's Chimera figures assume
    rows = compare(["gpipe", "1f1b", "chimera"], 4, 8, costs=UnitCosts(1, 1, 1, 1),
                   lengths=(1, 1, 1, 1))
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


def test_split_backward_costs_what_a_full_one_does_and_the_formula_matches_eval():
    """The default slot lengths make I + W = B (F=1 B=2 I=1 W=1), so ZB-H1 takes fewer
    slots than 1F1B as it ranks first; the formula column is the table's own at those
    lengths, the number `eval` prints for the same table, not the simulation's costs'."""
    from tabsched.formulas import formula_for
    rows = compare(["1f1b", "zb-h1"], 4, 8)
    one, zb = rows
    assert rows.lengths == {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0}
    assert zb.table["slots"] < one.table["slots"] and zb.ranks["table"] == 1
    assert (one.table["slots"], zb.table["slots"]) == (33, 27)   # 11 x 3; 8 x 3 + 3
    for row in rows:
        table = generate(row.family, devices=4, microbatches=8)
        at_table = evaluate(table)   # eval's table level, the same default lengths
        assert row.formula["bubble_ratio"] == pytest.approx(at_table.formula["bubble_ratio"])
        assert row.formula["bubble_ratio"] == pytest.approx(
            formula_for(table, UnitCosts())["bubble_ratio"])
    assert zb.formula["bubble_ratio"] == pytest.approx(1 / 9)     # 3 idle of 27
    with_b1 = compare(["zb-h1"], 4, 8, lengths=(1, 1, 1, 1))[0]
    assert with_b1.formula["bubble_ratio"] == pytest.approx(
        formula_for(generate("zb-h1", devices=4, microbatches=8),
                    UnitCosts(1, 1, 1, 1))["bubble_ratio"])


def test_comparisons_say_what_ran_in_one_line():
    rows = compare(["1f1b", "zb-h1", "chimera"], 4, 8)
    text = repr(rows)
    assert "\n" not in text and len(text) < 300
    assert text.startswith("<Comparisons of 3 families on paper-128l / mid_nw_mid_cp, 4 "
                           "devices, 8 microbatches; fastest simulated ")
    assert all("\n" not in repr(row) and len(repr(row)) < 300 for row in rows)
    page = rows._repr_html_()
    assert page.count("<tr>") == 4 and "slot lengths F=1 B=2 I=1 W=1" in page
    data = rows[0].to_dict()
    assert (data["model"], data["system"]) == ("paper-128l", "mid_nw_mid_cp")
    assert data["execution"]["tensor_parallel"] == 1


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


def test_a_family_that_does_not_fit_ranks_after_every_family_that_does():
    """On 80 GB A100s at t = 8, ZB-H2 and interleaved 1F1B are faster than 1F1B but go
    over the device's memory: they rank after 1F1B and ZB-V, which fit."""
    rows = compare(["1f1b", "zb-h2", "zbv", "interleaved-1f1b"], 8, 64, model="gpt3-175b",
                   system="dgx-a100", parallel={"tensor_parallel": 8})
    fits = {row.label: row.simulation["fits"] for row in rows}
    assert fits == {"1f1b": True, "zb-h2": False, "zbv": True, "interleaved-1f1b": False}
    makespans = {row.label: row.simulation["makespan"] for row in rows}
    assert makespans["zb-h2"] < makespans["1f1b"] and \
        makespans["interleaved-1f1b"] < makespans["zbv"]
    ranks = {row.label: row.ranks["simulation"] for row in rows}
    assert ranks == {"zbv": 1, "1f1b": 2, "interleaved-1f1b": 3, "zb-h2": 4}
    zb = next(row for row in rows if row.label == "zb-h2").simulation
    assert zb["memory_capacity"] == 80e9
    assert zb["over_capacity"] == pytest.approx(max(zb["peak_memory"]) - 80e9)
    assert next(row for row in rows if row.label == "zbv").simulation["over_capacity"] == 0.0
    assert rank_fitting_first([3.0, 1.0, 2.0, None, 1.0], [True, False, True, True, False]) \
        == [2, 3, 1, None, 3]


def test_compare_rows_carry_the_throughput():
    rows = compare(["1f1b", "zbv"], 8, 32, model="gpt3-175b", system="dgx-a100",
                   parallel={"tensor_parallel": 8})
    costs = model_costs_for("gpt3-175b", "dgx-a100", 32, tensor_parallel=8)
    single = evaluate(generate("1f1b", devices=8, microbatches=32), costs,
                      grad_sync="replicas")
    assert rows[0].simulation["throughput"] == single.throughput.to_dict()
    assert rows[0].to_dict()["simulation"]["throughput"]["mfu"] == single.throughput.mfu
    unit = compare(["1f1b"], 4, 8, costs=UnitCosts())[0].simulation
    assert unit["throughput"] is None and unit["memory_capacity"] is None and unit["fits"]


def test_the_global_batch_counts_every_data_parallel_replica():
    """Megatron-LM's --global-batch-size: d replicas of M microbatches of b samples."""
    costs = model_costs_for("gpt3-175b", "dgx-a100", 16, global_batch=128, tensor_parallel=8,
                            data_parallel=4)
    assert costs.execution.microbatch_size == 2 and costs.execution.global_batch == 128
    assert costs.execution.microbatches == 16
    one = model_costs_for("paper-128l", "mid_nw_mid_cp", 16, global_batch=256)
    assert one.execution.microbatch_size == 16          # d = 1: as it always was
    rows = compare(["1f1b"], 8, 16, model="gpt3-175b", system="dgx-a100", global_batch=128,
                   parallel={"tensor_parallel": 8, "data_parallel": 4})
    assert rows[0].execution["microbatch_size"] == 2 and rows[0].execution["global_batch"] == 128
    assert rows[0].simulation["throughput"]["samples"] == 128
    with pytest.raises(InvalidParameterError, match=r"^global batch 100 does not split into 16 "
                                                    r"microbatches of whole samples on each of "
                                                    r"2 data-parallel replicas$"):
        model_costs_for("paper-128l", "mid_nw_mid_cp", 16, global_batch=100, data_parallel=2)
    with pytest.raises(InvalidParameterError, match=r"^microbatch size 4 does not fit global "
                                                    r"batch 128: 4 data-parallel replicas x 16 "
                                                    r"microbatches of 2 samples hold it$"):
        model_costs_for("gpt3-175b", "dgx-a100", 16, global_batch=128, microbatch_size=4,
                        tensor_parallel=8, data_parallel=4)
    from tabsched.execution import Execution
    file = Execution(data_parallel=2, global_batch=64, microbatch_size=1)
    costs = model_costs_for("gpt3-175b", "dgx-a100", 16, tensor_parallel=8, execution=file)
    assert costs.execution.microbatch_size == 2     # -m with the file's global batch


def test_slot_lengths_are_checked_alike_whether_remembered_or_not():
    from tabsched.compare import slot_lengths
    assert slot_lengths((1, 2, 1, 1)) == slot_lengths((1.0, 2.0, 1.0, 1.0)) == (1.0, 2.0, 1.0, 1.0)
    assert all(type(value) is float for value in slot_lengths((1, 2, 1, 1)))
    np = pytest.importorskip("numpy")
    assert slot_lengths((np.float64(1), 2, 1, 1)) == (1.0, 2.0, 1.0, 1.0)
    for bad in ((-1, 1, 1, 1), (float("nan"), 1, 1, 1)):
        for _ in range(2):      # refused every time, not remembered
            with pytest.raises(InvalidParameterError, match="f must be finite and >= 0"):
                slot_lengths(bad)
