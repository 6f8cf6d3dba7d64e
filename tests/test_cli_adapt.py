"""`tabsched adapt` and `tabsched eval --cv/--samples`: output, JSON, files, errors."""

import json

import pytest

from tabsched import read_table

PAPER = ["--model", "paper-128l", "--system", "slow_nw_mid_cp", "--recompute", "full"]
ADAPT = ["adapt", "1f1b", "-p", "8", "-m", "32", *PAPER, "--memory-budget", "80GB",
         "--max-rounds", "2", "--samples", "64"]


def test_adapt_json_holds_the_decision(cli):
    code, out, err = cli(*ADAPT, "--cv", "0.1", "--slow-link", "3-4:3", "--json")
    assert code == 0 and err == ""
    data = json.loads(out)
    assert data["budget"] == 80e9 and data["feasible"] is True
    for key in ("baseline", "adapted"):
        report = data[key]
        assert set(report) >= {"mean_makespan", "p95_makespan", "peak_memory"}
        assert len(report["peak_memory"]) == 8
    assert data["baseline"]["transforms"] == []
    assert data["adapted"]["mean_makespan"] < data["baseline"]["mean_makespan"]
    assert max(data["adapted"]["peak_memory"]) <= 80e9
    assert {"1f1b", "zb-h1", "zb-auto", "interleaved-1f1b:chunks=4"} <= set(data["references"])
    best = data["references"][data["best_reference"]]
    assert best["feasible"] and data["gain"][data["best_reference"]] >= 0
    assert data["adapted"]["mean_makespan"] <= best["mean_makespan"]
    assert data["started_from"] in (None, *data["references"])
    assert data["gain"]["1f1b"] > 0.1
    assert data["variation"] == [{"model": "slow-link", "devices": [3, 4],
                                  "bandwidth_factor": 3.0}, {"model": "noise", "cv": 0.1}]
    assert len(data["headroom"]) == 8 and min(data["headroom"]) >= 0
    assert "log" not in data["search"] and data["search"]["candidates"] > 10
    assert data["table"]["params"].get("transforms", []) == data["adapted"]["transforms"]


def test_adapt_prints_the_decision_the_gain_and_the_table(cli, tmp_path):
    out_path = tmp_path / "adapted.json"
    code, out, err = cli(*ADAPT, "--cv", "0.1", "--slow-link", "3-4:3", "--out", str(out_path))
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].startswith("adapt 1f1b devices=8 microbatches=32: 8 devices, 32 "
                               "microbatches (ModelCosts transformer=paper-128l")
    assert lines[1].startswith("budget        80 GB per device; objective mean makespan over "
                               "64 samples (search seed 0, figures below on seed 1)")
    assert lines[2] == "variation     link 3-4 bandwidth / 3; noise cv 0.1"
    assert lines[3].startswith("decision      ")
    assert any(line.startswith("baseline (1f1b)") and line.endswith("%") for line in lines)
    assert any(line.startswith("zb-h1 ") for line in lines)
    assert any(line.startswith("zb-auto ") for line in lines)
    assert any(line.startswith("best ref.     ") and "against it" in line for line in lines)
    assert any(line.startswith("headroom      ") for line in lines)
    # with --out the table goes to the file and the terminal keeps the decision
    assert f"wrote the adapted table to {out_path}" in out
    assert not any(line.startswith("slot ") for line in lines)
    table = read_table(out_path)
    # the table the search started from: 1F1B or the best reference
    assert "devices=8 microbatches=32" in table.params.get("adapted_from", "devices=8 "
                                                                          "microbatches=32")
    assert table.num_devices == 8


def test_adapt_with_unit_costs_and_the_log(cli):
    code, out, _ = cli("adapt", "zb-h1", "-p", "4", "-m", "8", "--memory-budget", "6",
                       "--max-rounds", "1", "--log")
    assert code == 0
    assert "variation     none (the cost model's durations)" in out
    assert any(line.startswith("slot ") for line in out.splitlines())   # the table, no --out
    assert "candidates (id, parent, round, status, mean, p95, transforms):" in out
    assert "(start)" in out


def test_adapt_says_when_nothing_fits(cli):
    code, out, err = cli("adapt", "1f1b", "-p", "4", "-m", "8", "--memory-budget", "0.1",
                         "--max-rounds", "2")
    assert code == 0
    assert "INFEASIBLE    no candidate fits the budget; the closest is over it by" in out
    assert err.startswith("warning: no table fits the memory budget")
    code, out, err = cli("adapt", "1f1b", "-p", "4", "-m", "8", "--memory-budget", "0.1",
                         "--max-rounds", "2", "--strict", "--json")
    data = json.loads(out)
    assert code == 3 and data["feasible"] is False
    assert err.splitlines()[-1] == "Error: no table within the memory budget 0.1 activations " \
                                   "(--strict)"


def test_a_csv_cannot_hold_split_microbatches(cli, tmp_path):
    path = tmp_path / "adapted.csv"
    code, _, err = cli("adapt", "1f1b", "-p", "4", "-m", "8", "--comm", "0.3",
                       "--memory-budget", "8", "--max-rounds", "2", "--split-factor", "2",
                       "--out", str(path))
    assert code == 1 and err.count("\n") == 1
    assert err.startswith(f"Error: --out {path}: write the adapted table as .json, which keeps "
                          f"the microbatch sizes a split gives")
    assert not path.exists()


@pytest.mark.parametrize("extra,message", [
    (["--memory-budget", "40GB"],
     "Error: memory budget 40 GB is below the persistent memory of device 0 (54.9 GB of "
     "weights, gradients and optimizer state); no schedule fits it"),
    (["--memory-budget", "80GB", "--split-factor", "3", "--microbatch-size", "4"],
     "Error: split factor 3 does not divide microbatch 0's 4 samples (a part must hold "
     "whole samples; raise the microbatch size or pick a factor that divides it)"),
    (["--memory-budget", "80GB", "--straggler", "9:1.5"],
     "Error: straggler on device 9, but the table has devices 0..7"),
    (["--memory-budget", "80GB", "--cv", "-0.1"], "Error: cv must be >= 0, not -0.1"),
    (["--memory-budget", "80GB", "--slow-link", "3-9:3"],
     "Error: slow link 3-9: device 9 does not exist (the table has devices 0..7)"),
    (["--memory-budget", "80GB", "--straggler", "3"],
     "Error: --straggler '3': expected DEVICE:FACTOR, e.g. 3:1.5"),
    (["--memory-budget", "80GB", "--slow-link", "3:3"],
     "Error: --slow-link '3:3': expected A-B:FACTOR, e.g. 3-4:3"),
    (["--memory-budget", "80GB", "--samples", "0"], "Error: --samples must be >= 1, not 0"),
    (["--memory-budget", "80GB", "--max-rounds", "0"], "Error: --max-rounds must be >= 1, not 0"),
    ([], "Error: adapt needs --memory-budget (e.g. 80GB, or 'capacity' with a --system that "
         "states its memory)"),
])
def test_adapt_bad_input_is_one_line(cli, extra, message):
    code, out, err = cli("adapt", "1f1b", "-p", "8", "-m", "8", "--model", "paper-128l",
                         "--system", "slow_nw_mid_cp", "--recompute", "full", *extra)
    assert code == 1 and out == ""
    assert err == message + "\n"


def test_eval_gives_monte_carlo_figures_for_any_table(cli, golden):
    code, out, err = cli("eval", str(golden("1f1b_p8_m16.csv")), "--comm", "0.1", "--cv", "0.1",
                         "--samples", "200", "--seed", "3")
    assert code == 0 and err == ""
    assert "monte carlo   200 samples (seed 3): mean " in out
    assert "run-time bubble " in out and "of the mean makespan) over 73 slots at mean " \
                                         "durations" in out
    assert "device  mean busy  mean idle  idle at mean durations  run-time bubble" in out
    code, out, _ = cli("eval", "1f1b", "-p", "8", "-m", "32", *PAPER, "--straggler", "2:1.5",
                       "--slow-link", "3-4:3", "--samples", "10", "--json")
    data = json.loads(out)
    runs = data["monte_carlo"]
    assert runs["samples"] == 10 and runs["runtime_bubble"] == 0.0
    assert runs["nominal_makespan"] > data["makespan"]
    assert len(runs["devices"]) == 8


def test_eval_without_variation_options_is_unchanged(cli):
    code, out, _ = cli("eval", "1f1b", "-p", "4", "-m", "8", "--json")
    assert code == 0 and "monte_carlo" not in json.loads(out)
    code, out, _ = cli("eval", "1f1b", "-p", "4", "-m", "8")
    assert "monte carlo" not in out


def test_eval_replays_a_profile(cli, tmp_path):
    profile = tmp_path / "profile.csv"
    profile.write_text("op,duration\n0F0,3\n0F0,5\n")
    code, out, _ = cli("eval", "1f1b", "-p", "2", "-m", "2", "--model", "paper-128l",
                       "--system", "mid_nw_mid_cp", "--replay", str(profile), "--replay-partial",
                       "--samples", "2", "--json")
    assert code == 0
    runs = json.loads(out)["monte_carlo"]
    assert runs["variation"][0]["model"] == "replay"
    assert runs["max_makespan"] - runs["mean_makespan"] == pytest.approx(1.0)


@pytest.mark.parametrize("extra,message", [
    (["--cv", "-1"], "Error: cv must be >= 0, not -1.0"),
    (["--level", "formula", "--cv", "0.1"],
     "Error: --level formula has no run-time variation; drop --cv, --straggler, --slow-link, "
     "--replay and --samples"),
    (["--straggler", "4:2"], "Error: straggler on device 4, but the table has devices 0..3"),
    (["--samples", "0"], "Error: --samples must be >= 1, not 0"),
    (["--cv", "0.1", "--seed", "-2"], "Error: --seed must be >= 0, not -2"),
])
def test_eval_variation_errors(cli, extra, message):
    code, out, err = cli("eval", "1f1b", "-p", "4", "-m", "8", *extra)
    assert code == 1 and out == "" and err == message + "\n"


def test_adapt_model_options_need_a_model(cli):
    code, out, err = cli("adapt", "1f1b", "-p", "4", "-m", "8", "--memory-budget", "8",
                         "--recompute", "full")
    assert code == 1 and out == "" and err == "Error: --recompute needs --model and --system\n"


def test_adapt_says_when_no_transform_helped(cli):
    # one device, two microbatches: nothing can remove a bubble that is not there
    code, out, _ = cli("adapt", "1f1b", "-p", "1", "-m", "2", "--memory-budget", "100",
                       "--max-rounds", "1")
    assert code == 0
    decision = next(line for line in out.splitlines() if line.startswith("decision"))
    assert "no transform helped" in decision and "candidates tried" in decision


def test_a_replay_on_slot_costs_reports_seconds(cli, tmp_path):
    """Measured seconds replayed on a table evaluated in slots: the figures are seconds
    (every device has a measurement to convert its slots), never printed as slots; a
    device with none is refused, naming it."""
    full = tmp_path / "full.csv"
    full.write_text("op,duration\n" + "".join(
        f"{d}{kind}{m},{3 if kind == 'F' else 6}ms\n"
        for d in range(2) for kind in "FB" for m in range(2)))
    code, out, _ = cli("eval", "1f1b", "-p", "2", "-m", "2", "--replay", str(full),
                       "--samples", "4")
    assert code == 0
    line = next(line for line in out.splitlines() if line.startswith("monte carlo"))
    assert "mean 27 ms" in line and "slots" not in line
    code, out, _ = cli("eval", "1f1b", "-p", "2", "-m", "2", "--replay", str(full),
                       "--samples", "4", "--json")
    assert json.loads(out)["monte_carlo"]["time_unit"] == "s"
    partial = tmp_path / "partial.csv"
    partial.write_text("op,duration\n0F0,3ms\n0F1,3ms\n0B0,6ms\n0B1,6ms\n")
    code, _, err = cli("eval", "1f1b", "-p", "2", "-m", "2", "--replay", str(partial),
                       "--replay-partial", "--samples", "4")
    assert code == 1 and err.count("\n") == 1
    assert "device 1 has no measured operation" in err
