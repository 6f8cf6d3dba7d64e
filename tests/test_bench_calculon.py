"""bench/_calculon.py: the Calculon harness skips without a checkout, refuses unknown names and
broken checkouts in one line, and maps tabsched's presets to Calculon files of the same sizes."""

import importlib.util
import os
import pathlib
import sys

import pytest

BENCH = pathlib.Path(__file__).resolve().parent.parent / "bench"


@pytest.fixture(scope="module")
def harness():
    spec = importlib.util.spec_from_file_location("_calculon", BENCH / "_calculon.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def fake_checkout(tmp_path, monkeypatch):
    """A directory that looks like a checkout but whose ``calculon`` has no ``Llm``."""
    (tmp_path / "calculon" / "llm").mkdir(parents=True)
    (tmp_path / "calculon" / "llm" / "optimal_execution.py").write_text("")
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "gpt3-175B.json").write_text(
        '{"num_blocks": 96, "hidden": 12288, "attn_heads": 96, "attn_size": 128, '
        '"feedforward": 49152, "seq_size": 2048}')
    monkeypatch.setenv("CALCULON_DIR", str(tmp_path))
    monkeypatch.setenv("CALCULON_PYTHON", sys.executable)
    return tmp_path


def test_no_checkout_is_none(harness, tmp_path, monkeypatch):
    monkeypatch.setenv("CALCULON_DIR", str(tmp_path))
    assert harness.calculon_checkout() is None
    assert harness.calculon_rate(seconds=1) is None


@pytest.mark.parametrize("arguments, message", [
    ({"model": "llama3-8b"}, "model 'llama3-8b' has no Calculon file .known: gpt3-175b"),
    ({"system": "gb200-nvl72"}, "system 'gb200-nvl72' has no Calculon file .known: dgx-a100"),
    ({"seconds": 0}, "seconds 0 and slice_seconds 1.0 must be positive"),
])
def test_bad_arguments(harness, arguments, message):
    with pytest.raises(ValueError, match=f"^calculon_rate: {message}"):
        harness.calculon_rate(**arguments)


def test_a_broken_checkout_is_one_line(harness, fake_checkout):
    with pytest.raises(harness.CalculonError,
                       match=r"^calculon_rate: Calculon at .* failed under .* \(exit 1\): "
                             r"ImportError: cannot import name 'Llm'"):
        harness.calculon_rate(seconds=1)


def test_an_interpreter_that_does_not_start(harness, fake_checkout, monkeypatch):
    monkeypatch.setenv("CALCULON_PYTHON", str(fake_checkout / "no-python"))
    with pytest.raises(harness.CalculonError, match=r"^calculon_rate: cannot start .*no-python"):
        harness.calculon_rate(seconds=1)


def test_a_child_past_its_time_is_stopped(harness, fake_checkout, monkeypatch):
    (fake_checkout / "calculon" / "llm" / "__init__.py").write_text(
        "import time\ntime.sleep(60)\n")
    monkeypatch.setattr(harness, "START_UP_ALLOWANCE", 1.0)
    with pytest.raises(harness.CalculonError, match=r"ran past 2 s under .*; stopped$"):
        harness.calculon_rate(seconds=1)


def test_the_sizes_of_a_mapped_model_are_checked(harness, tmp_path):
    (tmp_path / "model.json").write_text('{"num_blocks": 48, "hidden": 12288}')
    with pytest.raises(harness.CalculonError,
                       match=r"model.json has num_blocks 48, tabsched's gpt3-175b 96$"):
        harness._check_same_model("gpt3-175b", tmp_path / "model.json")


def test_a_missing_model_file(harness, fake_checkout):
    (fake_checkout / "models" / "gpt3-175B.json").unlink()
    with pytest.raises(harness.CalculonError,
                       match=r"^calculon_rate: cannot read .*gpt3-175B.json: FileNotFoundError$"):
        harness.calculon_rate(seconds=1)


def test_every_mapped_model_has_tabscheds_sizes(harness):
    checkout = harness.calculon_checkout()
    if checkout is None:
        pytest.skip("no Calculon checkout at $CALCULON_DIR or /tmp/calculon")
    for model, path in harness.CALCULON_MODELS.items():
        harness._check_same_model(model, os.path.join(checkout, path))


def test_a_real_checkout_is_timed(harness):
    if not (os.environ.get("CALCULON_DIR") and os.environ.get("CALCULON_PYTHON")):
        pytest.skip("set CALCULON_DIR and CALCULON_PYTHON to time a real Calculon")
    measured = harness.calculon_rate(seconds=1.0, slice_seconds=0.5)
    assert measured["good"] <= measured["priced"] <= measured["executions"]
    assert 1 <= measured["tasks_run"] <= measured["tasks"] == 3330
    assert measured["rate"] == pytest.approx(measured["calculon_said_rate"], rel=0.05)
