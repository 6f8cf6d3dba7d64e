"""Shared test set-up: hypothesis profiles and small helpers.

Profiles, chosen by the HYPOTHESIS_PROFILE environment variable:
``dev`` (default, quick), ``ci`` (what .ci/run uses: more examples, derandomised
so a CI run is reproducible), ``thorough`` (for a long local run).
"""

import os
import pathlib

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("dev", max_examples=40, deadline=None)
settings.register_profile("ci", max_examples=120, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", max_examples=2000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

ROOT = pathlib.Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "schedules"


@pytest.fixture
def golden():
    """Path of a golden table file in schedules/."""
    return lambda name: GOLDEN / name


def run_cli(capsys, *argv):
    """Run the CLI entry point; return (exit code, stdout, stderr)."""
    from tabsched.cli import main
    with pytest.raises(SystemExit) as exit_info:
        main(list(argv))
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


@pytest.fixture
def cli(capsys):
    return lambda *argv: run_cli(capsys, *argv)


#: No error line of the CLI is longer than this, whatever the input.
LONGEST_ERROR = 400


@pytest.fixture
def cli_error(capsys):
    """Run the CLI on bad input; assert exit 1 and a single short ``Error:`` line with no
    traceback; return the message after ``Error: ``."""
    def run(*argv):
        code, out, err = run_cli(capsys, *[str(arg) for arg in argv])
        assert code == 1, (out, err)
        assert err.startswith("Error: ") and err.count("\n") == 1, err
        assert "Traceback" not in err and len(err) < LONGEST_ERROR, err
        return err[len("Error: "):-1]
    return run
