"""The package's type hints hold together: tabsched ships ``py.typed``, so a user's type
checker reads them. mypy over the package must find nothing (skipped without mypy,
which the test extra installs)."""

import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "tabsched"


def test_mypy_finds_no_error_in_the_package(tmp_path):
    pytest.importorskip("mypy", reason="mypy is not installed (pip install '.[test]')")
    done = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path),
                           "--no-error-summary", str(PACKAGE)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
