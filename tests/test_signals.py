"""SIGTERM stops a command cleanly: no temporary file left, no worker left running (issue 24)."""

import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="reads /proc to find the forked workers")


def children(pid):
    """The processes whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(entry))
    return found


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_sigterm_stops_a_parallel_sweep_and_its_workers(tmp_path):
    out = tmp_path / "sweep.csv"
    out.write_text("the previous sweep\n")
    command = [sys.executable, "-m", "tabsched", "sweep", "gpipe", "1f1b", "zb-h1",
               "-p", "32,64", "-m", "2048,4096,8192,16384", "-j", "2", "-q", "-o", str(out)]
    process = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        workers = []
        deadline = time.monotonic() + 60
        while not workers and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.05)
            workers = [pid for pid in children(process.pid) if alive(pid)]
        assert workers, "the sweep forked no worker"
        time.sleep(0.5)
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 128 + signal.SIGTERM, err
    assert err.strip().splitlines()[-1] == ("Error: stopped by SIGTERM; no output was left "
                                            "half-written")
    for _ in range(100):
        if not any(alive(pid) for pid in workers):
            break
        time.sleep(0.05)
    assert not any(alive(pid) for pid in workers), "a worker outlived the sweep"
    assert out.read_text() == "the previous sweep\n"
    assert [path.name for path in tmp_path.iterdir()] == ["sweep.csv"]   # no temporary


SCRIPT = """
import os, signal, sys
from tabsched.cli import _on_termination, Terminated
from tabsched.files import atomic_write
_on_termination()
def write(path):
    with open(path, "w") as out:
        out.write("half")
    os.kill(os.getpid(), signal.SIGTERM)   # arrives in the middle of the write
try:
    atomic_write(sys.argv[1], write=write)
except Terminated:
    sys.exit(143)
sys.exit(0)
"""


def test_sigterm_in_the_middle_of_a_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "report.md"
    target.write_text("the previous report\n")
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(target)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 143, done.stderr
    assert target.read_text() == "the previous report\n"
    assert [path.name for path in tmp_path.iterdir()] == ["report.md"]


def test_a_study_that_fails_part_way_leaves_the_previous_folder_whole(tmp_path, monkeypatch):
    """The megatron study writes table5.csv and report.md as one unit: when the report
    fails after the table is written, the folder keeps the previous table and report."""
    import tabsched.study_megatron as study_module
    from tabsched.study_megatron import run_megatron_study
    out = tmp_path / "study"
    out.mkdir()
    (out / "table5.csv").write_text("previous table\n")
    (out / "report.md").write_text("previous report\n")

    def broken(study, system):
        raise OSError(28, "No space left on device")
    # the diagnostics that rerun the eight runs many times are not what is tested here
    monkeypatch.setattr(study_module, "_sensitivity", lambda system: [])
    monkeypatch.setattr(study_module, "implied_matrix_efficiency", lambda system: [])
    with monkeypatch.context() as failing:
        failing.setattr(study_module, "markdown_report", broken)
        with pytest.raises(OSError):
            run_megatron_study(out)
    assert (out / "table5.csv").read_text() == "previous table\n"
    assert (out / "report.md").read_text() == "previous report\n"
    assert sorted(path.name for path in out.iterdir()) == ["report.md", "table5.csv"]
    study = run_megatron_study(out)                  # and a whole run replaces both
    assert (out / "table5.csv").read_text().startswith("model,gpus")
    assert study.files == [str(out / "table5.csv"), str(out / "report.md")]
    assert sorted(path.name for path in out.iterdir()) == ["report.md", "table5.csv"]
