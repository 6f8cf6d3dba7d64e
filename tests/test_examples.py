"""The examples clean up after themselves."""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_measure_vs_predict_leaves_no_temporary_folder(tmp_path):
    """Without --out, the profiler traces (hundreds of MB at the defaults) go to a temporary
    folder that is removed at the end; with --out they stay there."""
    pytest.importorskip("torch", reason="the example runs the tables in PyTorch")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    small = ["--families", "1f1b", "--microbatches", "4", "--warmup", "1", "--timed", "1",
             "--profiled", "1", "--layers", "2", "--hidden", "32", "--sequence", "16"]
    environment = dict(os.environ, TMPDIR=str(scratch))
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "measure_vs_predict.py"),
                           *small], capture_output=True, text=True, env=environment,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "1f1b" in done.stdout and "removed at the end" in done.stderr
    assert not [path for path in scratch.iterdir() if path.name.startswith("tabsched-")]
    kept = tmp_path / "kept"
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "measure_vs_predict.py"),
                           *small, "--out", str(kept)], capture_output=True, text=True,
                          env=environment, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (kept / "1f1b.csv").exists()
