"""CLI: compare, sweep, study, plot and trace."""

import json

import pytest


def test_compare_prints_ranks_and_marks_disagreement(cli):
    code, out, err = cli("compare", "gpipe", "1f1b", "chimera", "-p", "8", "-m", "16",
                         "--system", "slow_nw_fast_cp", "--global-batch", "256")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == ("8 devices, 16 microbatches; simulation: paper-128l on "
                        "slow_nw_fast_cp, global batch 256")
    chimera = next(line for line in lines if line.startswith("chimera"))
    assert "15.8%" in chimera and chimera.rstrip().endswith("*")
    assert "rankings disagree" in lines[-1]


def test_compare_json(cli):
    code, out, _ = cli("compare", "gpipe", "chimera", "hanayo:waves=2", "-p", "4", "-m", "8",
                       "--json")
    data = json.loads(out)
    assert [row["family"] for row in data] == ["gpipe", "chimera", "hanayo"]
    for row in data:
        assert {"formula", "table", "simulation"} <= set(row)
        assert "bubble_ratio" in row["formula"] and "slots" in row["table"]
        assert {"makespan", "peak_activation", "peak_memory", "bubble_ratio"} <= set(
            row["simulation"])
    assert data[2]["params"]["waves"] == 2


def test_compare_reports_skipped_families(cli):
    code, out, _ = cli("compare", "chimera", "1f1b", "-p", "3", "-m", "6", "--model",
                       "llama3-8b")
    assert code == 0
    assert "skipped chimera: chimera: devices must be even" in out
    assert "skipped 1f1b: model llama3-8b has 32 layers" in out
    assert out.rstrip().endswith("fewer than two families evaluated: nothing to rank")


def test_sweep_writes_csv_and_reports_progress(cli, tmp_path):
    path = tmp_path / "s.csv"
    code, out, err = cli("sweep", "gpipe", "chimera", "-p", "3,4", "-m", "4",
                         "--systems", "mid_nw_mid_cp,fast_nw_fast_cp", "-o", str(path), "-j", "2")
    assert code == 0 and out == ""
    assert err == f"wrote {path}: 8 configurations, 4 skipped\n"   # no bar when not a terminal
    lines = path.read_text().splitlines()
    assert len(lines) == 9 and lines[0].startswith("spec,family,params,devices")
    code, out, _ = cli("sweep", "gpipe", "-p", "2", "-m", "2", "--systems", "mid_nw_mid_cp")
    assert out.count("\n") == 2


def test_plot_and_trace_commands(cli, tmp_path):
    svg = tmp_path / "g.svg"
    code, _, err = cli("plot", "gantt", "zbv", "-p", "4", "-m", "8", "--model", "paper-128l",
                       "--system", "mid_nw_mid_cp", "-o", str(svg))
    assert code == 0 and f"wrote {svg}" in err
    assert svg.read_text().count('id="device-') == 4
    png = tmp_path / "m.png"
    code, _, _ = cli("plot", "memory", "1f1b", "-p", "4", "-m", "8", "--model", "paper-128l",
                     "--system", "mid_nw_mid_cp", "--memory-budget", "80GB", "-o", str(png))
    assert code == 0 and png.stat().st_size > 10_000
    trace = tmp_path / "t.json"
    code, _, err = cli("trace", "1f1b", "-p", "2", "-m", "2", "-o", str(trace))
    assert code == 0 and "perfetto" in err
    events = json.loads(trace.read_text())["traceEvents"]
    assert sum(e["ph"] == "X" for e in events) == 8 + 4
    csv = tmp_path / "s.csv"
    cli("sweep", "gpipe", "1f1b", "-p", "4", "-m", "4,8", "--systems", "mid_nw_mid_cp",
        "-o", str(csv))
    code, _, _ = cli("plot", "sweep", str(csv), "-o", str(tmp_path / "s.png"))
    assert code == 0 and (tmp_path / "s.png").exists()


def test_study_command(cli, tmp_path):
    code, out, err = cli("study", "tabular-paper", "-o", str(tmp_path / "out"), "-j", "2")
    assert code == 0
    assert out.count("\n") == 5 and out.startswith("1. reproduced: Rankings")
    assert (tmp_path / "out" / "report.md").exists()


@pytest.mark.parametrize("argv,message", [
    (["compare", "gpipe", "chimaera", "-p", "4", "-m", "8"], "unknown schedule family 'chimaera'"),
    (["compare", "hanayo:waves", "-p", "4", "-m", "8"], "expected name:key=value"),
    (["sweep", "gpipe", "-p", "4,x", "-m", "8"], "--devices '4,x': expected integers"),
    (["sweep", "gpipe", "-p", "0", "-m", "8"], "expected positive integers"),
    (["sweep", "gpipe", "-p", "4", "-m", "8", "--systems", "mars"], "unknown system"),
    (["sweep", "gpipe", "-p", "4", "-m", "8", "-j", "0"], "jobs must be >= 1, not 0"),
    (["study", "tabular"], "unknown study 'tabular'; valid studies: tabular-paper"),
    (["plot", "gantt", "1f1b", "-p", "2", "-m", "2", "-o", "x.gif"],
     "pictures are written as .png, .svg, .pdf"),
    (["plot", "sweep", "missing.csv", "-o", "x.png"], "missing.csv"),
    (["trace", "lf1b", "-p", "2", "-m", "2", "-o", "t.json"], "unknown schedule family 'lf1b'"),
])
def test_bad_input_is_one_line_and_exit_1(cli, argv, message):
    code, out, err = cli(*argv)
    assert code == 1
    assert err.count("\n") == 1 and err.startswith("Error: ")
    assert message in err


def test_plot_sweep_bad_metric_and_depth(cli, tmp_path):
    csv = tmp_path / "s.csv"
    cli("sweep", "gpipe", "-p", "2,4", "-m", "4", "--systems", "mid_nw_mid_cp", "-o", str(csv))
    code, _, err = cli("plot", "sweep", str(csv), "-o", str(tmp_path / "a.png"))
    assert code == 1 and "the sweep has devices 2, 4: choose one to plot (--devices)" in err
    code, _, err = cli("plot", "sweep", str(csv), "-p", "2", "--metric", "speed", "-o",
                       str(tmp_path / "a.png"))
    assert code == 1 and "--metric 'speed' is not a sweep column" in err


def test_unreachable_dask_scheduler(cli, monkeypatch):
    distributed = pytest.importorskip("distributed")

    class Refused(distributed.Client):
        def __init__(self, *args, **kwargs):
            raise OSError("Timed out trying to connect")

    monkeypatch.setattr(distributed, "Client", Refused)
    code, _, err = cli("sweep", "gpipe", "-p", "2", "-m", "2", "--systems", "mid_nw_mid_cp",
                       "--dask", "tcp://127.0.0.1:9")
    assert code == 1
    assert "--dask tcp://127.0.0.1:9: cannot reach the scheduler" in err


def test_repeated_list_options_accumulate(cli):
    code, out, _ = cli("sweep", "gpipe", "-p", "2", "-p", "3,4", "-m", "4", "-m", "8",
                       "--system", "mid_nw_mid_cp", "--model", "paper-128l", "--models",
                       "gpt3-175b")
    import csv
    import io
    records = list(csv.DictReader(io.StringIO(out)))
    assert code == 0 and len(records) == 3 * 2 * 2
    assert {r["devices"] for r in records} == {"2", "3", "4"}
    assert {r["microbatches"] for r in records} == {"4", "8"}
    assert {r["model"] for r in records} == {"paper-128l", "gpt3-175b"}


def test_progress_bar_on_a_terminal_only(cli, monkeypatch, tmp_path):
    import sys
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    path = tmp_path / "s.csv"
    code, _, err = cli("sweep", "gpipe", "1f1b", "-p", "3,4", "-m", "4", "--system",
                       "mid_nw_mid_cp", "-o", str(path))
    assert code == 0 and "sweep  [####" in err and "4/4  4 configurations" in err
    code, _, err = cli("sweep", "gpipe", "1f1b", "-p", "3,4", "-m", "4", "--system",
                       "mid_nw_mid_cp", "-o", str(path), "--quiet")
    assert code == 0 and err == f"wrote {path}: 4 configurations, 2 skipped\n"


def test_compare_marks_what_does_not_fit_and_ranks_it_after_what_does(cli):
    code, out, err = cli("compare", "1f1b", "zb-h2", "zbv", "interleaved-1f1b", "-p", "8",
                         "-m", "64", "--model", "gpt3-175b", "--system", "dgx-a100", "-t", "8")
    assert code == 0 and err == ""
    lines = out.splitlines()
    header = lines[2]
    assert "tokens/s/GPU  MFU" in header and header.endswith("peak mem  fits      rank")

    def cell(line, name):       # the column that starts where its (last) header does
        start = header.rindex(name)
        return line[start:].split("  ")[0].strip()
    rows = {line.split()[0]: line for line in lines[3:7]}
    assert cell(rows["1f1b"], "fits") == "yes" and cell(rows["zb-h2"], "fits") == "+24.6 GB"
    assert cell(rows["zbv"], "MFU") == "52.3%"
    assert [cell(rows[name], "rank") for name in
            ("zbv", "1f1b", "interleaved-1f1b", "zb-h2")] == ["1", "2", "3", "4"]
    assert lines[7] == ("device memory 80 GB (dgx-a100): 2 of 4 families go over (fits: by "
                        "how much on the fullest device); they rank after every family that "
                        "fits")
    code, out, _ = cli("compare", "1f1b", "gpipe", "-p", "8", "-m", "32")
    assert ("device memory 80 GB (mid_nw_mid_cp): no family fits (fits: how far the fullest "
            "device goes over); ranked by iteration time among themselves") in out
    code, out, _ = cli("compare", "1f1b", "zbv", "-p", "8", "-m", "32", "--model",
                       "gpt3-175b", "--system", "dgx-a100", "-t", "8")
    assert "device memory 80 GB (dgx-a100): every family fits" in out
    code, out, _ = cli("compare", "1f1b", "zbv", "-p", "8", "-m", "32", "--model",
                       "gpt3-175b", "--system", "dgx-a100", "-t", "8", "--json")
    data = json.loads(out)
    assert data[0]["simulation"]["fits"] is True and data[0]["simulation"]["over_capacity"] == 0
    assert data[0]["simulation"]["memory_capacity"] == 80e9
    assert {"tokens_per_s_per_gpu", "model_tflops_per_gpu", "mfu", "hfu"} <= set(
        data[0]["simulation"]["throughput"])


def test_sweep_takes_lists_of_the_executions_axes(cli):
    import csv
    import io
    code, out, err = cli("sweep", "1f1b", "-p", "8", "--model", "gpt3-175b", "--system",
                         "dgx-a100", "--global-batch", "64", "--microbatch-size", "1,2",
                         "-t", "4", "-t", "8", "-d", "1,2", "--recompute", "selective,full")
    assert code == 0 and err == ""
    rows = list(csv.DictReader(io.StringIO(out)))
    assert len(rows) == 16
    assert {(r["tensor_parallel"], r["data_parallel"], r["microbatch_size"], r["recompute"])
            for r in rows} == {(t, d, b, mode) for t in "48" for d in "12" for b in "12"
                               for mode in ("selective", "full")}
    assert {(r["data_parallel"], r["microbatch_size"], r["microbatches"]) for r in rows} == {
        ("1", "1", "64"), ("1", "2", "32"), ("2", "1", "32"), ("2", "2", "16")}
    assert {r["simulation_fits"] for r in rows} == {"true", "false"}
    over = [r for r in rows if r["simulation_fits"] == "false"]
    assert all(float(r["simulation_over_capacity_bytes"]) > 0 for r in over)
    assert all(float(r["simulation_mfu"]) > 0 and r["gpus"] for r in rows)
    # a list lets the grid keep what the model refuses as rows, as any invalid combination
    code, out, _ = cli("sweep", "1f1b", "-p", "8", "-m", "8", "--model", "gpt3-175b",
                       "--system", "dgx-a100", "-t", "3,8")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [r["status"] for r in rows] == ["skipped", "ok"]
    assert rows[0]["reason"].startswith("tensor_parallel 3 does not divide the 8 devices of a "
                                        "node of system dgx-a100")
    code, out, _ = cli("sweep", "1f1b", "-p", "8", "-m", "8", "--model", "gpt3-175b",
                       "--system", "dgx-a100", "-t", "1,8", "--sequence-parallel")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert code == 0 and [r["status"] for r in rows] == ["skipped", "ok"]
    assert rows[0]["reason"] == ("sequence_parallel needs tensor_parallel > 1 (it splits the "
                                 "sequence over the tensor ranks)")
    assert rows[1]["sequence_parallel"] == "true" and rows[1]["tensor_parallel"] == "8"
    code, out, err = cli("sweep", "1f1b", "-p", "8", "-m", "8", "--model", "gpt3-175b",
                         "--system", "dgx-a100", "-t", "3")     # one value: a mistake
    assert code == 1 and "--tensor-parallel/-t 3 does not divide the 8 devices of a node" in err


@pytest.mark.parametrize("argv,message", [
    (["-p", "8", "--global-batch", "64"],
     "--microbatches/-m is needed unless --global-batch and --microbatch-size give it (each "
     "replica runs global-batch / (d x microbatch size) microbatches)"),
    (["-p", "8", "--microbatch-size", "2"], "--microbatches/-m is needed unless"),
    (["-p", "8", "-m", "8", "--global-batch", "64", "--microbatch-size", "2"],
     "give two of --microbatches/-m, --microbatch-size and --global-batch: the third follows "
     "(global batch = d x M x microbatch size)"),
    (["-p", "8", "-m", "8", "--recompute", "none,fulll"],
     "--recompute 'none,fulll': 'fulll' is not one of none, selective, full"),
    (["-p", "8", "-m", "8", "--recompute", ","],
     "--recompute ',': expected modes separated by commas, e.g. none,full"),
    (["-p", "8", "-m", "8", "-t", "4,x"], "--tensor-parallel/-t '4,x': expected integers"),
    (["-p", "8", "-m", "8", "-d", "0"], "--data-parallel/-d '0': expected positive integers"),
    (["-p", "8", "-m", "8", "--microbatch-size", "1,0"],
     "--microbatch-size '1,0': expected positive integers"),
])
def test_bad_sweep_axes_are_one_line(cli_error, argv, message):
    assert message in cli_error("sweep", "1f1b", "--model", "gpt3-175b", "--system",
                                "dgx-a100", *argv)


def test_a_files_global_batch_counts_as_given(cli_error, tmp_path):
    run = tmp_path / "run.toml"
    run.write_text("global_batch = 64\n")
    assert cli_error("sweep", "1f1b", "--model", "gpt3-175b", "--system", "dgx-a100", "-p",
                     "8", "-m", "8", "--microbatch-size", "1,2", "--execution", str(run)) == (
        f"give two of --microbatches/-m, --microbatch-size and the global_batch of {run}: the "
        f"third follows (global batch = d x M x microbatch size)")


def test_compare_and_eval_on_a_system_without_a_memory_check_nothing(cli, tmp_path):
    from tabsched.costs._presets import preset_index
    path = tmp_path / "no-memory.toml"
    path.write_text("\n".join(line for line in preset_index()["system"]["mid_nw_mid_cp"]
                              .splitlines() if not line.startswith("memory_capacity")) + "\n")
    code, out, _ = cli("compare", "1f1b", "zbv", "-p", "4", "-m", "8", "--system", str(path))
    assert code == 0 and "device memory" not in out
    assert "MFU" in out and "fits" not in out.splitlines()[2]
    code, out, _ = cli("eval", "1f1b", "-p", "4", "-m", "8", "--model", "paper-128l",
                       "--system", str(path))
    assert code == 0 and "device memory" not in out and "throughput    " in out


def test_compare_says_when_ranks_differ_only_by_a_tie(cli):
    # gpipe and 1f1b tie at the formula and table levels; at the simulation level gpipe
    # goes over the 80 GB and ranks after 1f1b: a rank differs, no order is reversed
    code, out, _ = cli("compare", "gpipe", "1f1b", "-p", "8", "-m", "64", "--model",
                       "gpt3-175b", "--system", "dgx-a100", "-t", "8", "--sequence-parallel",
                       "--global-batch", "64")
    assert code == 0
    lines = out.splitlines()
    gpipe = next(line for line in lines if line.startswith("gpipe"))
    assert gpipe.rstrip().endswith("*")
    assert lines[-1] == ("no two families in opposite orders at two levels; * marks a rank "
                         "that differs where one level ties families another orders")


@pytest.mark.parametrize("metric", ["family", "spec", "devices"])
def test_plot_sweep_refuses_a_configuration_column_as_the_metric(cli, tmp_path, metric):
    csv = tmp_path / "sweep.csv"
    code, _, _ = cli("sweep", "1f1b", "gpipe", "-p", "2", "-m", "4,8", "-o", str(csv))
    assert code == 0
    code, _, err = cli("plot", "sweep", str(csv), "--metric", metric, "-o",
                       str(tmp_path / "p.png"))
    assert code == 1 and f"--metric '{metric}' is a configuration column, not a metric; " \
        "numeric columns: formula_bubble_ratio" in err
    assert not (tmp_path / "p.png").exists()


def test_a_dask_address_that_is_no_address_is_one_line(cli, tmp_path):
    pytest.importorskip("distributed")
    for argv in (["sweep", "1f1b", "-p", "2", "-m", "4", "--dask", "nonsense"],
                 ["study", "tabular-paper", "-o", str(tmp_path / "st"), "--dask", "nonsense"]):
        code, _, err = cli(*argv)
        assert code == 1 and "--dask nonsense: cannot reach the scheduler (" in err
    assert not (tmp_path / "st").exists()
