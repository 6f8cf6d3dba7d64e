"""Replay: measured durations cycled sample by sample, read from untrusted files."""

import numpy as np
import pytest

from tabsched import InvalidParameterError, StageCosts, generate
from tabsched.adapt import Replay, VariationContext
from tabsched.lower import lower


def context_of(table, costs, **options):
    return VariationContext(lower(table, contention=costs.contention), costs, **options)


def test_replay_cycles_measurements_and_scales_the_rest(tmp_path):
    table = generate("1f1b", devices=2, microbatches=2)
    costs = StageCosts(1.0, comm=0.5)
    path = tmp_path / "profile.csv"
    path.write_text("op,duration\n0F0,2\n0F0,4ms\n0F1,3\n0F0 d0->d1,1.5\n")
    replay = Replay.from_csv(path, partial=True)   # device 1 measured nothing
    assert replay.describe() == {"model": "replay", "labels": 3, "measurements": 4,
                                 "source": str(path)}
    context = context_of(table, costs)
    ops, sends = context.op_labels
    drawn = context.sample_durations(replay, np.arange(3))
    cell = context.lowered.cell_of_op
    f0, f1 = ops.index("0F0"), ops.index("0F1")
    assert drawn[:, cell[f0]].tolist() == [2.0, 0.004, 2.0]
    assert drawn[:, cell[f1]].tolist() == [3.0, 3.0, 3.0]
    # device 0's unmeasured ops scale by its measured / modelled ratio
    ratio = ((2.0 + 0.004) / 2 + 3.0) / (1.0 + 1.0)
    b0 = ops.index("0B0")
    assert drawn[0, cell[b0]] == pytest.approx(2.0 * ratio)
    # device 1: nothing measured, the model's durations
    assert drawn[0, cell[ops.index("1F0")]] == 1.0
    send = context.lowered.num_cells + sends.index("0F0 d0->d1")
    assert drawn[0, send] == 1.5
    other = context.lowered.num_cells + sends.index("0F1 d0->d1")
    assert drawn[0, other] == pytest.approx(0.5 * 3.0)
    mean = context.mean_durations(replay)
    assert mean[cell[f0]] == pytest.approx(1.002)
    assert replay.random and not Replay({"0F0": [1.0]}).random


@pytest.mark.parametrize("text,message", [
    ("op,duration\n0F0,1,2\n", r"line 2: expected op,duration, not 3 fields"),
    ("0F0,fast\n", r"line 1: duration: 'fast' is not a time"),
    ("0F0,-1\n", r"line 1: duration must be >= 0, not '-1'"),
    ("op,duration\n", r"no op,duration rows"),
])
def test_replay_file_errors(tmp_path, text, message):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(InvalidParameterError, match=message):
        Replay.from_csv(path)


def test_replay_missing_file(tmp_path):
    with pytest.raises(InvalidParameterError, match=r"missing.csv: cannot read"):
        Replay.from_csv(tmp_path / "missing.csv")


@pytest.mark.parametrize("build,message", [
    (lambda: Replay({"0F0": [-1.0]}), r"replay 0F0: durations must be finite and >= 0"),
    (lambda: Replay({"0F0": []}), r"^replay 0F0: give one or more durations$"),
])
def test_replay_parameter_errors(build, message):
    with pytest.raises(InvalidParameterError, match=message):
        build()


def test_a_partial_replay_lists_the_labels_that_match_nothing():
    table = generate("1f1b", devices=2, microbatches=2)
    replay = Replay({"0F0": [1.0], "0F0 d0->d1": [0.5], "9F9": [2.0], "0F0 d0->d7": [1.0]},
                    partial=True)
    assert replay.check(table) == ["9F9", "0F0 d0->d7"]
    info = replay.describe()
    assert info["unmatched"] == 2 and info["unmatched_labels"] == ["9F9", "0F0 d0->d7"]
    assert info["note"] == ("2 of 4 labels match nothing in the table and were left out "
                            "(partial replay)")
    drawn = context_of(table, StageCosts(1.0, comm=0.5)).sample_durations(replay, [0])
    assert np.isfinite(drawn).all()
