import json

import pytest

from tabsched import generate
from tabsched.io import write_table


def test_eval_prints_a_summary(cli):
    code, out, err = cli("eval", "1f1b", "--devices", "8", "--microbatches", "32")
    assert code == 0 and err == ""
    assert "makespan      78 slots" in out
    assert "bubble ratio  17.95%" in out
    assert "d7" in out and "peak memory" in out


def test_eval_json_is_one_object(cli):
    code, out, _ = cli("eval", "1f1b", "-p", "4", "-m", "8", "--b", "2", "--json")
    data = json.loads(out)
    assert code == 0
    assert data["makespan"] == 33 and data["level"] == "table"
    assert data["bubble_ratio"] == pytest.approx(3 / 11)
    assert [d["peak_memory"] for d in data["devices"]] == [4, 3, 2, 1]
    assert {"busy", "idle"} <= set(data["devices"][0])
    assert data["formula"]["level"] == "formula"


def test_eval_with_communication_is_a_simulation(cli):
    code, out, _ = cli("eval", "gpipe", "-p", "2", "-m", "2", "--comm", "0.5", "--json",
                       "--contention", "link")
    data = json.loads(out)
    assert data["level"] == "simulation" and data["contention"] == "link"
    assert data["makespan"] == 7.0


def test_eval_and_show_accept_files(cli, tmp_path):
    path = tmp_path / "s.csv"
    write_table(generate("1f1b", devices=2, microbatches=3), path)
    code, out, _ = cli("eval", str(path), "--json")
    assert code == 0 and json.loads(out)["makespan"] == 8
    code, out, _ = cli("show", str(path))
    assert code == 0 and "d1" in out
    code, out, _ = cli("show", "1f1b", "-p", "2", "-m", "3", "--format", "csv")
    assert out == path.read_bytes().decode()


def test_list_shows_families(cli):
    code, out, _ = cli("list")
    assert code == 0 and "1f1b:" in out and "gpipe:" in out and "parameters:" in out
    code, out, _ = cli("list", "--json")
    assert {row["name"] for row in json.loads(out)} >= {"1f1b", "gpipe"}


@pytest.mark.parametrize("argv,message", [
    (["eval", "lf1b", "-p", "2", "-m", "2"], "unknown schedule family 'lf1b'"),
    (["eval", "1f1b"], "1f1b needs --devices and --microbatches"),
    (["eval", "1f1b", "-p", "x", "-m", "2"], "'x' is not a valid integer"),
    (["eval", "1f1b", "-p", "2", "-m", "2", "--chunks", "2"], "1f1b does not take --chunks"),
    (["eval", "1f1b", "-p", "2", "-m", "2", "--f", "-1"], "f must be finite and >= 0"),
    (["eval", "1f1b", "-p", "0", "-m", "2"], "devices must be >= 1"),
    (["eval", "missing.csv"], "missing.csv: cannot read"),
    (["eval", "1f1b", "-p", "2", "-m", "2", "--contention", "bus"], "Invalid value for '--contention'"),
    (["frobnicate"], "No such command 'frobnicate'"),
])
def test_bad_input_is_one_line_and_exit_1(cli, argv, message):
    code, out, err = cli(*argv)
    assert code == 1
    assert err.count("\n") == 1 and err.startswith("Error: ")
    assert message in err


def test_bad_file_and_deadlock_from_cli(cli, tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_bytes(b"0F0,0Q0\r\n")
    code, _, err = cli("eval", str(bad))
    assert code == 1 and 'device 0, slot 1: "0Q0" is not an operation' in err
    stuck = tmp_path / "stuck.csv"
    stuck.write_text("0F0,0B0,0F1,0B1\r\n1F1,1F0,1B0,1B1\r\n")
    code, _, err = cli("eval", str(stuck))
    assert code == 1 and err.startswith("Error: deadlock:") and err.count("\n") == 1


def test_python_dash_m_runs_the_cli():
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-m", "tabsched", "eval", "gpipe", "-p", "2", "-m",
                           "1", "--json"], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout)["makespan"] == 4
