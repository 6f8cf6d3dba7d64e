"""``tabsched plan``: the table, the summary, the exports, the files, the errors."""

import csv
import json

import pytest

from tabsched.execution import load_execution

SMALL = ("llama3-8b", "dgx-h100", "--gpus", "16", "--global-batch", "64", "-t", "2,4",
         "--microbatch-size", "1,2", "--families", "1f1b,zbv,interleaved-1f1b",
         "--max-chunks", "2")


def test_the_report(cli):
    code, out, err = cli("plan", *SMALL, "--top", "4", "--explain")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == ("llama3-8b on 16 GPUs of dgx-h100, global batch 64, memory budget "
                        "80 GB")
    assert lines[1].split()[:6] == ["rank", "family", "t", "p", "d", "b"]
    assert lines[2].startswith("1")
    assert any(line.endswith("tied, not ranked") for line in lines)
    assert any(" configurations over " in line and " simulated " in line for line in lines)
    assert any(line.startswith("reproduce the best: tabsched eval ") for line in lines)
    assert any(line.startswith("Megatron-LM: ") for line in lines)
    assert any(line.startswith("torchtitan: ") for line in lines)
    assert any(line.startswith("explain: winner: ") for line in lines)


def test_json_csv_and_executions(cli, tmp_path):
    rows = tmp_path / "plan.csv"
    folder = tmp_path / "runs"
    code, out, err = cli("plan", *SMALL, "--json", "-o", str(rows), "--save-executions",
                         str(folder), "--top", "3")
    assert code == 0
    data = json.loads(out)
    assert data["gpus"] == 16 and len(data["rows"]) == 3
    assert data["counts"]["simulated"] <= data["counts"]["configurations"]
    with open(rows, newline="") as handle:
        read = list(csv.DictReader(handle))
    assert [row["rank"] for row in read] == ["1", "2", "3"]
    assert float(read[0]["iteration_s"]) == data["rows"][0]["iteration_s"]
    for row in data["rows"]:
        saved = load_execution(folder / f"rank-{row['rank']}.toml")
        assert saved.to_dict() == row["execution"]
    assert f"wrote {rows}: 3 configurations" in err


def test_the_eval_command_reproduces_the_best(cli):
    import shlex
    code, out, _ = cli("plan", *SMALL, "--json", "--top", "2")
    for row in json.loads(out)["rows"]:
        argv = shlex.split(row["eval_command"])[1:] + ["--json"]
        code, evaluated, err = cli(*argv)
        assert code == 0, err
        assert json.loads(evaluated)["makespan"] == row["iteration_s"]
        assert json.loads(evaluated)["steady_period"] == row["steady_period_s"]


def test_exhaustive_gives_the_same_rows(cli):
    pruned = json.loads(cli("plan", *SMALL, "--json")[1])
    exhaustive = json.loads(cli("plan", *SMALL, "--json", "--exhaustive")[1])
    assert [row["execution"] for row in pruned["rows"]] == [
        row["execution"] for row in exhaustive["rows"]]
    assert exhaustive["counts"]["pruned_time"] == exhaustive["counts"]["pruned_memory"] == 0
    assert exhaustive["pruning"] == [] and pruned["pruning"] == ["memory", "time"]


def test_narrowing_options(cli):
    code, out, _ = cli("plan", *SMALL, "--json", "--recompute", "full", "--zero", "1",
                       "--sequence-parallel", "on", "--uneven", "0", "--tie-band", "0")
    assert code == 0
    rows = json.loads(out)["rows"]
    assert {row["recompute"] for row in rows} == {"full"}
    assert all(row["sequence_parallel"] for row in rows)
    assert all(row["zero_stage"] == (1 if row["data_parallel"] > 1 else 0) for row in rows)
    best = rows[0]["iteration_s"]      # with no band, only exact equals tie
    assert [row["tied"] for row in rows] == [row["iteration_s"] == best for row in rows]


def test_zero_takes_a_list_of_stages(cli):
    code, out, _ = cli("plan", "llama3-8b", "dgx-h100", "--gpus", "8", "--global-batch", "16",
                       "-t", "1", "-p", "1,2", "--families", "1f1b", "--zero", "3,0", "--json",
                       "--top", "20")
    assert code == 0
    rows = json.loads(out)["rows"]
    assert {row["zero_stage"] for row in rows} <= {0, 3} and any(
        row["zero_stage"] == 3 for row in rows)
    for text, words in (("5", "--zero '5' is not one of 0, 1, 2, 3"),
                        (",", "--zero names no stage")):
        code, out, err = cli("plan", "llama3-8b", "dgx-h100", "--gpus", "8",
                             "--global-batch", "16", "--zero", text)
        assert code == 1 and words in err and "Traceback" not in err
        assert len(err.strip().splitlines()) == 1


def test_a_base_execution(cli, tmp_path):
    base = tmp_path / "base.toml"
    base.write_text('blocking_sends = true\nattention = "flash"\n')
    code, out, _ = cli("plan", *SMALL, "--json", "--execution", str(base), "--top", "1")
    row = json.loads(out)["rows"][0]
    assert row["execution"]["blocking_sends"] and row["execution"]["attention"] == "flash"
    assert "--blocking-sends" in row["eval_command"]
    assert "--attention flash" in row["eval_command"]


def test_a_post_validation_base_reaches_the_rows_and_their_eval_command(cli, tmp_path):
    import shlex
    base = tmp_path / "base.toml"
    base.write_text("post_validation = true\n")
    code, out, _ = cli("plan", *SMALL, "--json", "--execution", str(base), "--top", "1")
    row = json.loads(out)["rows"][0]
    assert row["execution"]["post_validation"] and "--post-validation" in row["eval_command"]
    assert row["steady_period_s"] <= row["iteration_s"] * (1 + 1e-12)
    code, evaluated, err = cli(*shlex.split(row["eval_command"])[1:], "--json")
    assert code == 0, err
    assert json.loads(evaluated)["steady_period"] == row["steady_period_s"]


@pytest.mark.parametrize("argv,message", [
    (("--gpus", "97", "--global-batch", "64"), "gpus 97: no split t x p x d = 97 runs "
                                               "llama3-8b"),
    (("--gpus", "8", "--global-batch", "6", "--microbatch-size", "4"),
     "no microbatch size divides the global batch"),
    (("--gpus", "8", "--global-batch", "16", "-t", "3"),
     "tensor degree does not divide the GPUs"),
    (("--gpus", "8", "--global-batch", "16", "--recompute", "some"),
     "--recompute 'some' is not one of none, selective, full"),
    (("--gpus", "8", "--global-batch", "16", "--top", "0"), "--top must be >= 1, not 0"),
    (("--gpus", "8", "--global-batch", "16", "--families", "lf1b"),
     "unknown schedule family 'lf1b'"),
    (("--gpus", "8", "--global-batch", "16", "-o", "/nonexistent/plan.csv"), "/nonexistent"),
    # counts the search factors are bounded before it factors them (it hung on these)
    (("--gpus", "9" * 400, "--global-batch", "8"),
     "must be an integer from 1 to 16777216, not <an integer of 400 digits>"),
    (("--gpus", "16", "--global-batch", "9" * 30),
     "must be an integer from 1 to 16777216, not " + "9" * 30),
])
def test_bad_input_is_one_line(cli_error, argv, message):
    assert message in cli_error("plan", "llama3-8b", "dgx-h100", *argv)


def test_nothing_fits_the_budget_exits_3(cli):
    code, out, err = cli("plan", "gpt3-175b", "dgx-a100", "--gpus", "64", "--global-batch", "64",
                         "--memory-budget", "1GB")
    assert code == 3 and out == ""
    assert err.startswith("Error: nothing fits the 1 GB memory budget") and err.count("\n") == 1
    assert "the weights, gradients and optimizer state alone take" in err


def test_help_lists_the_space_options(cli):
    code, out, _ = cli("plan", "-h")
    assert code == 0 and "Space (plan):" in out and "--max-chunks" in out
