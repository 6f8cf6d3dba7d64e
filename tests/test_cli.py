import json

import pytest

from tabsched import generate
from tabsched.io import write_table


def test_eval_prints_a_summary(cli):
    code, out, err = cli("eval", "1f1b", "--devices", "8", "--microbatches", "32")
    assert code == 0 and err == ""
    assert "makespan      117 slots" in out   # (32 + 7) x (F=1 + B=2)
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
    assert data["makespan"] == 10.0   # 2 F, a 0.5 send, 2 B of 2, a 0.5 send, the last B


def test_eval_and_show_accept_files(cli, tmp_path):
    path = tmp_path / "s.csv"
    write_table(generate("1f1b", devices=2, microbatches=3), path, drop_metadata=True)
    code, out, _ = cli("eval", str(path), "--json")
    assert code == 0 and json.loads(out)["makespan"] == 12   # (3 + 1) x (F + B)
    code, out, _ = cli("show", str(path))
    assert code == 0 and "d1" in out
    code, out, _ = cli("show", "1f1b", "-p", "2", "-m", "3", "--format", "csv", "--drop-metadata")
    assert out == path.read_bytes().decode()
    code, out, err = cli("show", "1f1b", "-p", "2", "-m", "3", "--format", "csv")
    assert code == 0 and out == path.read_bytes().decode() and err == (
        "note: the CSV leaves out the family and its parameters (1f1b devices=2 "
        "microbatches=3); read back, the table has no formula level\n")
    code, out, err = cli("show", "1f1b", "-p", "2", "-m", "3", "--layers", "8",
                         "--stage-layers-ratio", "1:3", "--format", "csv")
    assert code == 1 and out == "" and err == (
        "Error: --format csv cannot hold the layers of each stage (2,6; a CSV reads back an "
        "even split): use --format json to keep them, or add --drop-metadata to write the "
        "cells alone\n")


def test_list_shows_families(cli):
    code, out, _ = cli("list")
    assert code == 0 and "1f1b:" in out and "gpipe:" in out and "parameters:" in out
    code, out, _ = cli("list", "--json")
    assert {row["name"] for row in json.loads(out)} >= {"1f1b", "gpipe"}


@pytest.mark.parametrize("argv,message", [
    (["eval", "lf1b", "-p", "2", "-m", "2"], "unknown schedule family 'lf1b'"),
    (["eval", "1f1b", "-p", "2", "-m", "2", "--chunks", "2"], "1f1b does not take --chunks"),
    (["eval", "1f1b", "-p", "2", "-m", "2", "--f", "-1"], "f must be finite and >= 0"),
    (["eval", "1f1b", "-p", "0", "-m", "2"], "devices must be >= 1"),
    (["eval", "missing.csv"], "missing.csv: cannot read"),
])
def test_bad_input_is_one_line_and_exit_1(cli, argv, message):
    code, out, err = cli(*argv)
    assert code == 1
    assert err.count("\n") == 1 and err.startswith("Error: ")
    assert message in err


@pytest.mark.parametrize("argv,usage,message", [
    (["eval", "1f1b", "-p", "x", "-m", "2"], "tabsched eval [OPTIONS] SCHEDULE",
     "Invalid value for '--devices' / '-p': 'x' is not a valid integer."),
    (["eval", "1f1b", "-p", "2", "-m", "2", "--contention", "bus"],
     "tabsched eval [OPTIONS] SCHEDULE", "Invalid value for '--contention'"),
    (["eval", "1f1b", "--frob"], "tabsched eval [OPTIONS] SCHEDULE", "No such option '--frob'"),
    (["eval"], "tabsched eval [OPTIONS] SCHEDULE", "Missing argument 'SCHEDULE'."),
    # a family's missing size is a missing option, as the README's exit status 2 says
    (["eval", "1f1b"], "tabsched eval [OPTIONS] SCHEDULE",
     "1f1b needs --devices and --microbatches"),
    (["eval", "gpipe", "-p", "2"], "tabsched eval [OPTIONS] SCHEDULE",
     "gpipe needs --microbatches"),
    (["frobnicate"], "tabsched [OPTIONS] COMMAND [ARGS]...", "No such command 'frobnicate'."),
    (["convert", "1f1b", "-p", "2", "-m", "2"], "tabsched convert [OPTIONS] SCHEDULE [OUTPUT]",
     "convert needs OUTPUT (or -o FILE; '-' for stdout)"),
])
def test_usage_errors_exit_2_with_the_usage_and_a_help_hint(cli, argv, usage, message):
    code, out, err = cli(*argv)
    lines = err.splitlines()
    assert code == 2 and out == ""
    assert lines[0] == f"Usage: {usage}"
    assert lines[1].startswith("Try 'tabsched") and lines[1].endswith("for help.")
    assert lines[-1].startswith("Error: ") and message in lines[-1]


def test_exit_statuses_are_documented(cli):
    _, out, _ = cli("--help")
    text = " ".join(out.split())
    assert ("Exit status: 0 success; 1 bad input or a failure (one 'Error:' line on stderr); 2 "
            "a usage error (unknown option, missing argument); 3 --strict and a device over "
            "--memory-budget.") in text


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
    assert json.loads(done.stdout)["makespan"] == 6   # two forwards of 1, two backwards of 2


# ------------------------------------------------------------- PyTorch files
import pathlib  # noqa: E402

from tabsched.pytorch import to_compute_comms, to_compute_only  # noqa: E402

PYTORCH_DATA = pathlib.Path(__file__).resolve().parent / "data" / "pytorch"


def test_convert_writes_csv_json_and_torch_comms(cli, tmp_path):
    table = generate("1f1b", devices=2, microbatches=3)
    code, _, err = cli("convert", "1f1b", "-p", "2", "-m", "3", "--layers", "4",
                       "--stage-layers", "1,3", str(tmp_path / "a.csv"))
    assert code == 1 and "a CSV cannot hold the layers of each stage (1,3" in err
    assert "write a .json table (--to json) to keep them, or add --drop-metadata" in err
    assert not (tmp_path / "a.csv").exists()
    code, _, err = cli("convert", "1f1b", "-p", "2", "-m", "3", str(tmp_path / "a.csv"))
    assert code == 0 and err == (
        "wrote {} (csv, 2 devices, 2 stages, 3 microbatches)\nnote: the CSV leaves out the "
        "family and its parameters (1f1b devices=2 microbatches=3); read back, the table has "
        "no formula level\n").format(tmp_path / "a.csv")
    assert (tmp_path / "a.csv").read_bytes() == to_compute_only(table, drop_metadata=True).encode()
    code, _, _ = cli("convert", str(tmp_path / "a.csv"), str(tmp_path / "a.json"))
    assert code == 0 and json.loads((tmp_path / "a.json").read_text())["rows"][0][0] == "0F0"
    code, out, _ = cli("convert", str(tmp_path / "a.json"), "-", "--to", "torch-comms")
    assert code == 0 and out == to_compute_comms(table, drop_metadata=True)


def test_convert_a_pytorch_comms_file_says_what_it_read(cli, tmp_path):
    source = PYTORCH_DATA / "zbv_pp4_m8_comms.csv"
    code, _, err = cli("convert", str(source), str(tmp_path / "z.csv"))
    assert code == 0
    assert "note: read 8 UNSHARD and 8 RESHARD cells as FSDP's parameter windows" in err
    assert "note: the file's own SEND/RECV positions are not written" in err
    # the compute cells, laid out in unit slots, lower to PyTorch's own compute_comms again
    code, out, _ = cli("convert", str(tmp_path / "z.csv"), "-", "--to", "torch-comms")
    assert out == source.read_bytes().decode()


def test_legacy_files_convert_to_current_tokens(cli, tmp_path):
    legacy = tmp_path / "old.csv"
    legacy.write_text("0F0,0F1,0B0,0W0,0BW1\r\n", newline="")
    code, out, err = cli("convert", str(legacy), "-", "--torch-legacy")
    assert code == 0 and out == "0F0,0F1,0I0,0W0,0B1\r\n"
    assert "note: read PyTorch's legacy tokens" in err
    code, _, err = cli("eval", str(legacy))
    assert code == 1 and err.count("\n") == 1 and "read the file with legacy=True" in err


def test_show_and_eval_take_pytorch_files(cli):
    code, out, _ = cli("show", str(PYTORCH_DATA / "dualpipev_pp4_m8_comms.csv"), "--width", "60")
    assert code == 0 and "stage map: v (stages 0..3 down the devices" in out
    assert "note: read 8 UNSHARD and 8 RESHARD cells as FSDP's parameter" in out
    code, out, _ = cli("show", "1f1b", "-p", "2", "-m", "2")
    assert out.endswith("stage map: loop (stage s on device s)\n")
    code, out, _ = cli("eval", str(PYTORCH_DATA / "interleaved_1f1b_pp2_m4.csv"))
    assert code == 0 and "makespan      27 slots" in out
    code, out, _ = cli("eval", str(PYTORCH_DATA / "gpipe_pp4_m4.csv"), "--json")
    assert code == 0 and json.loads(out)["makespan"] == 21   # (4 + 3) x (F=1 + B=2)
    code, out, _ = cli("eval", str(PYTORCH_DATA / "dualpipev_pp4_m8_comms.csv"), "--comm", "1",
                       "--b", "2", "--json")
    data = json.loads(out)
    assert code == 0 and data["makespan"] == 87 and len(data["notes"]) == 2
    code, out, _ = cli("eval", str(PYTORCH_DATA / "dualpipev_pp4_m8_comms.csv"), "--comm", "1",
                       "--b", "2", "--p2p", "free", "--json")
    assert json.loads(out)["makespan"] == 76


CROSSED = ("0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\r\n"
           "1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1\r\n")


@pytest.mark.parametrize("content,message", [
    ("0F0,0X0\r\n", 'device 0, slot 1: "0X0" is not an operation'),
    ("0F0,(0F1;0B0,0B1\r\n", 'device 0, slot 1: "(0F1;0B0" has no closing parenthesis'),
    ("", "the file is empty"),
    ("0F0,0B0\r\n0F\x000\r\n", "line 2 contains a NUL byte"),
    ("0F0,0B0\r\n,,,\r\n", "device 1 (line 2) has no operations"),
    ("0F0,0B0\r\n1UNSHARD,1RESHARD\r\n", "device 1 (line 2) has no compute operations"),
    ("0F0,0B0,0REDUCE_GRAD3\r\n", '"0REDUCE_GRAD3": REDUCE_GRAD takes no microbatch'),
    ("0F0,0SEND_F0,0B0\r\n1F0,1B0,1SEND_B0\r\n",
     "device 0, slot 1: 0SEND_F0 has no matching 1RECV_F0 on device 1"),
    (CROSSED, "device 0, slot 3: 0SEND_F1 and device 1, slot 3: 1SEND_B0 deadlock"),
    (None, "schedule_1f1b_pp4_m4.csv: device 3, slot 1: 3B0 has no forward (3F0)"),
])
@pytest.mark.parametrize("command", ["eval", "show", "convert"])
def test_bad_pytorch_files_are_one_line_and_exit_1(cli, tmp_path, command, content, message):
    if content is None:
        path = PYTORCH_DATA / "schedule_1f1b_pp4_m4.csv"
    else:
        path = tmp_path / "bad.csv"
        path.write_bytes(content.encode())
    argv = [command, str(path)] + ([str(tmp_path / "out.csv")] if command == "convert" else [])
    code, out, err = cli(*argv)
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith("Error: ") and message in err


def test_convert_refuses_what_pytorch_cannot_express(cli, tmp_path):
    replicas = tmp_path / "replicas.json"
    write_table(generate("chimera", devices=2, microbatches=2), replicas)
    code, _, err = cli("convert", str(replicas), str(tmp_path / "out.csv"))
    assert code == 1 and err == ("Error: PyTorch cannot express this table: stage 0 runs on "
                                 "devices 0 and 1 (replicas, as in Chimera); "
                                 "torch.distributed.pipelining places each stage on exactly one "
                                 "rank; write .json (--to json) to keep it\n")
    assert not (tmp_path / "out.csv").exists()
    halves = tmp_path / "halves.json"
    write_table(generate("gpipe", devices=2, microbatches=2).replace(
        microbatch_sizes=(1.0, 0.5)), halves)
    code, _, err = cli("convert", str(halves), "-", "--to", "torch-comms")
    assert code == 1 and err.count("\n") == 1 and "microbatch 1 has size 0.5" in err
    code, out, _ = cli("convert", str(halves), "-", "--to", "json")
    assert code == 0 and json.loads(out)["microbatch_sizes"] == [1.0, 0.5]


def test_out_of_memory_is_one_line(cli, monkeypatch):
    import tabsched.cli.build

    def exhausted(*args, **kwargs):
        raise MemoryError()

    monkeypatch.setattr(tabsched.cli.build, "evaluate", exhausted)
    code, _, err = cli("eval", "1f1b", "-p", "2", "-m", "2")
    assert code == 1 and err.count("\n") == 1
    assert "out of memory: the table or sweep is too large for this machine" in err


def test_huge_sizes_are_refused_in_one_line(cli):
    code, _, err = cli("eval", "1f1b", "-p", "50000", "-m", "50000")
    assert code == 1 and err.count("\n") == 1 and "would have up to 7.5e+09 operations" in err


def test_show_and_convert_offer_formats_of_the_registry():
    from tabsched.cli.tables import CONVERT_TARGETS, SHOW_FORMATS
    from tabsched.formats import get_format
    for name in SHOW_FORMATS + CONVERT_TARGETS:
        chosen = get_format(name)
        assert chosen.holds == "table" and chosen.dumps is not None, name
    assert [get_format(name).pytorch for name in CONVERT_TARGETS] == \
        ["compute_only", None, "compute_comms"]
