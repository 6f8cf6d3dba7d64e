"""``adapt --follow``: traces appear while it reads them; it refits, re-plans, reports
switches once, survives bad entries and stops cleanly with its log whole."""

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from tabsched import InvalidParameterError, StageCosts, generate
from tabsched.adapt.follow import follow
from tabsched.whatif import synthetic_trace

HERE = pathlib.Path(__file__).resolve().parent
TABLE = generate("1f1b", devices=2, microbatches=8)


def _steps(folder, slow_from, count):
    """``count`` traced steps of TABLE; from step ``slow_from`` on, stage 1 is 3x slower."""
    for step in range(count):
        forward = [1e-3, 1e-3] if step < slow_from else [1e-3, 3e-3]
        synthetic_trace(TABLE, StageCosts(forward, comm=1e-4), folder / f"step{step}",
                        iterations=2)


def _lines(path):
    text = path.read_text()
    assert text.endswith("\n") or not text
    return [json.loads(line) for line in text.splitlines()]


def test_follows_traces_copied_in_while_it_reads(tmp_path):
    source, target = tmp_path / "source", tmp_path / "job"
    target.mkdir()
    _steps(source, slow_from=3, count=5)

    def feed():
        for step in range(5):
            shutil.copytree(source / f"step{step}", target / f".tmp{step}")
            os.rename(target / f".tmp{step}", target / f"step{step}")   # whole, as a job would
            time.sleep(0.05)
    writer = threading.Thread(target=feed)
    writer.start()
    lines = []
    result = follow(target, TABLE, poll=0.02, max_files=5, timeout=60, log=tmp_path / "l.jsonl",
                    report=lines.append, samples=16)
    writer.join()
    assert result.stopped == "max-files"
    assert [os.path.basename(entry) for entry in result.processed] == [f"step{i}" for i in
                                                                       range(5)]
    switches = [record for record in _lines(tmp_path / "l.jsonl") if record["event"] == "switch"]
    # a switch is advice, given once while it keeps paying, and only when it pays
    assert len({tuple(record["transforms"]) for record in switches}) == len(switches)
    for record in switches:
        assert record["net_saving"] > record["threshold"] * record["horizon"] * record["current"]
        assert record["adapted"] < record["current"]
        assert record["switch_cost"] == pytest.approx(record["current"])   # one iteration
    assert result.searches >= 2              # the fit moved when stage 1 slowed down
    assert len(lines) >= 5


def test_bad_entries_are_one_line_each_and_the_loop_goes_on(tmp_path):
    job = tmp_path / "job"
    _steps(job, slow_from=99, count=1)
    (job / "cut.json").write_text('{"traceEvents": [{"ph": "X", "na')      # never completed
    synthetic_trace(generate("gpipe", devices=2, microbatches=8), StageCosts(1e-3),
                    job / "other")
    (job / "new").mkdir()
    document = json.loads((job / "step0" / "rank0.json").read_text())
    (job / "new" / "rank0.json").write_text(json.dumps(dict(document, schemaVersion=9)))
    lines = []
    result = follow(job, TABLE, poll=0.01, timeout=3, log=tmp_path / "l.jsonl",
                    report=lines.append, samples=8, settle=0.2)
    assert [os.path.basename(entry) for entry in result.processed] == ["step0"]
    reasons = {os.path.basename(entry): reason for entry, reason in result.skipped.items()}
    assert set(reasons) == {"cut.json", "other", "new"}
    assert "not JSON" in reasons["cut.json"]
    assert "another table" in reasons["other"]
    assert "unknown trace schemaVersion 9" in reasons["new"]
    skipped = [line for line in lines if line.startswith("skipped ")]
    assert len(skipped) == 3 and all("\n" not in line for line in skipped)
    logged = _lines(tmp_path / "l.jsonl")
    assert sorted(os.path.basename(record["entry"]) for record in logged
                  if record["event"] == "skip") == ["cut.json", "new", "other"]


def test_a_file_still_being_written_is_retried_before_it_is_skipped(tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    table = generate("1f1b", devices=1, microbatches=2)
    synthetic_trace(table, StageCosts(1e-3), tmp_path / "single")
    text = (tmp_path / "single" / "rank0.json").read_text()
    (job / "step.json").write_text(text[:len(text) // 2])                  # half written
    polls = []

    def sleep(seconds):
        polls.append(seconds)
        if len(polls) == 1:
            (job / "step.json").write_text(text)                            # now complete
    result = follow(job, table, poll=0.01, max_files=1, timeout=10, sleep=sleep, samples=8)
    assert [os.path.basename(entry) for entry in result.processed] == ["step.json"]
    assert not result.skipped


def test_a_directory_that_disappears_is_said_once_and_waited_for(tmp_path):
    job = tmp_path / "job"
    _steps(job, slow_from=99, count=1)
    lines = []
    polls = []

    def sleep(seconds):
        polls.append(seconds)
        if len(polls) == 1:
            shutil.rmtree(job)
        if len(polls) == 4:
            _steps(job, slow_from=99, count=2)
    result = follow(job, TABLE, poll=0.01, max_files=2, timeout=10, sleep=sleep,
                    report=lines.append, samples=8)
    gone = [line for line in lines if "cannot list" in line]
    assert len(gone) == 1 and str(job) in gone[0]
    assert any(line.endswith(": back") for line in lines)
    assert len(result.processed) == 2


def test_ctrl_c_stops_cleanly_with_the_log_whole(tmp_path):
    job = tmp_path / "job"
    _steps(job, slow_from=0, count=1)

    def sleep(seconds):
        raise KeyboardInterrupt
    result = follow(job, TABLE, poll=0.01, sleep=sleep, log=tmp_path / "l.jsonl", samples=8)
    assert result.stopped == "interrupted" and len(result.processed) == 1
    _lines(tmp_path / "l.jsonl")


def test_parameters_are_checked():
    with pytest.raises(InvalidParameterError, match="horizon must be an integer >= 1"):
        follow(".", TABLE, horizon=0)
    with pytest.raises(InvalidParameterError, match="switch cost must be >= 0"):
        follow(".", TABLE, switch_cost=-1.0)


def test_cli_follow(cli, cli_error, tmp_path):
    job = tmp_path / "job"
    _steps(job, slow_from=1, count=2)
    log = tmp_path / "switches.jsonl"
    code, out, err = cli("adapt", "1f1b", "-p", "2", "-m", "8", "--follow", str(job),
                         "--follow-log", str(log), "--max-files", "2", "--poll", "0.01",
                         "--timeout", "30", "--samples", "8")
    assert code == 0, err
    assert "step0: iteration" in out and "followed 2 entries" in out
    assert "stopped: max-files" in out
    _lines(log)
    assert cli_error("adapt", "1f1b", "-p", "2", "-m", "8", "--follow",
                     str(tmp_path / "nowhere")) == f"--follow {tmp_path / 'nowhere'}: not a " \
                                                    f"directory"
    assert cli_error("adapt", "1f1b", "-p", "2", "-m", "8", "--follow", str(job),
                     "--horizon", "0") == "--horizon must be >= 1, not 0"
    assert cli_error("adapt", "1f1b", "-p", "2", "-m", "8", "--follow", str(job), "--model",
                     "llama3-8b").startswith("--model does not go with --follow DIR")
    assert cli_error("adapt", "1f1b", "-p", "2", "-m", "8", "--memory-budget", "4",
                     "--max-files", "2") == "--max-files goes with --follow DIR"


def test_sigterm_stops_the_command_cleanly(tmp_path):
    job = tmp_path / "job"
    _steps(job, slow_from=0, count=1)
    synthetic_trace(generate("gpipe", devices=2, microbatches=8), StageCosts(1e-3),
                    job / "other")                 # skipped: a line in the log to wait for
    log = tmp_path / "l.jsonl"
    environment = dict(os.environ, PYTHONPATH=str(HERE.parent))
    process = subprocess.Popen([sys.executable, "-m", "tabsched", "adapt", "1f1b", "-p", "2",
                                "-m", "8", "--follow", str(job), "--follow-log", str(log),
                                "--poll", "0.05", "--timeout", "60", "--samples", "8"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=environment)
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline and not (log.exists() and log.read_text()):
        time.sleep(0.1)
    time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=30)
    assert "Traceback" not in err
    assert process.returncode == 0, err
    assert "stopped by a signal" in err
    assert _lines(log)


torch = pytest.importorskip("torch", reason="following a real run needs PyTorch's runtime")


def test_follows_the_pytorch_runner_while_it_writes(tmp_path):
    """The repository's runner writes step traces (one folder of per-rank files per job)
    while --follow reads the folder."""
    sys.path.insert(0, str(HERE.parent / "examples"))
    import torch_pipeline as pipeline

    from tabsched.pytorch import to_compute_only
    config = pipeline.ModelConfig(layers=4, hidden=32, sequence=32, vocabulary=64)
    table = generate("1f1b", devices=2, microbatches=4)
    path = tmp_path / "1f1b.csv"
    path.write_bytes(to_compute_only(table).encode())
    jobs = [pipeline.job_for(table, path, f"step{i}", config=config, iterations=1,
                             profile=True) for i in range(3)]
    out = tmp_path / "run"
    out.mkdir()
    errors = []

    def run():
        try:
            pipeline.run_jobs(jobs, out, timeout=50)
        except Exception as error:   # reported by the assertion below
            errors.append(error)
    runner = threading.Thread(target=run)
    runner.start()
    result = follow(out, table, poll=0.1, max_files=3, timeout=55, samples=8)
    runner.join()
    assert not errors
    assert sorted(os.path.basename(entry) for entry in result.processed) == [
        f"step{i}.traces" for i in range(3)]
