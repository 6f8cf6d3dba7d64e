"""Microbatch transforms: splits (whole, at the edges) and merges, priced at their size."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tabsched import (DeadlockError, InvalidParameterError, ModelCosts, ScheduleTable,
                      evaluate, generate)
from tabsched.adapt import MergeMicrobatches, SplitMicrobatches, SplitPhases
from tabsched.costs.system import load_system
from tabsched.costs.transformer import TransformerModel


def apply_or_reject(transform, table, costs):
    """The transformed table, or None where the transform does not apply or deadlocks."""
    try:
        return transform.apply(table, costs)
    except (DeadlockError, InvalidParameterError):
        return None


# ---------------------------------------------------------------- splitting
def test_split_renumbers_and_runs_the_parts_back_to_back():
    table = generate("1f1b", devices=2, microbatches=3)
    split = SplitMicrobatches([1], 2).apply(table)
    assert split.microbatch_sizes == (1.0, 0.5, 0.5, 1.0)
    assert [str(op) for op in split.orders()[1]] == [
        "1F0", "1B0", "1F1", "1F2", "1B1", "1B2", "1F3", "1B3"]


def test_split_keeps_overlapped_partners_with_the_first_part():
    table = generate("dualpipev", devices=4, microbatches=8)
    overlapped = np.flatnonzero(~table.cell_starts())[0]
    microbatch = int(table.microbatch[overlapped])
    split = SplitMicrobatches([microbatch], 2).apply(table)
    assert len(split) == len(table) + int((table.microbatch == microbatch).sum())
    assert np.sum(~split.cell_starts()) == np.sum(~table.cell_starts())


def test_split_under_a_model_prices_the_smaller_microbatches_by_the_roofline():
    model = TransformerModel(layers=8, hidden=1024, heads=16, sequence=1024, vocab=32000,
                             microbatch_size=4)
    system = load_system("mid_nw_mid_cp").replace(half_efficiency_tokens=2048)
    costs = ModelCosts(model, system)
    table = generate("1f1b", devices=4, microbatches=8)
    split = SplitMicrobatches("all", 2).apply(table, costs)
    flops = [np.sum(costs.op_work(t)[0]) for t in (table, split)]
    assert flops[1] == pytest.approx(flops[0], rel=1e-12)
    # the efficiency curve and the launch latency: half the samples, more than half the time
    assert costs.op_durations(split).sum() > costs.op_durations(table).sum()
    # transfers: half the bytes, the full latency
    bandwidth, latency = system.link_matrices(4)
    for t in (table, split):
        result = evaluate(t, costs)
        link = [link for link in result.links if (link.src, link.dst) == (0, 1)][0]
        assert link.busy == pytest.approx(link.transfers * latency[0, 1]
                                          + link.nbytes / bandwidth[0, 1])
    links = [evaluate(t, costs).links[0] for t in (table, split)]
    assert links[1].nbytes == pytest.approx(links[0].nbytes)
    assert links[1].transfers == 2 * links[0].transfers


def test_a_split_factor_must_divide_the_samples():
    costs = ModelCosts("paper-128l", "mid_nw_mid_cp", microbatch_size=4)
    table = generate("1f1b", devices=8, microbatches=8)
    assert SplitMicrobatches([0], 4).apply(table, costs).microbatch_sizes[:4] == (0.25,) * 4
    with pytest.raises(InvalidParameterError,
                       match=r"^split factor 3 does not divide microbatch 0's 4 samples"):
        SplitMicrobatches("all", 3).apply(table, costs)
    with pytest.raises(InvalidParameterError, match=r"split factor must be an integer >= 2"):
        SplitMicrobatches("all", 1)


def test_split_phases_picks_the_edges():
    table = generate("1f1b", devices=4, microbatches=8)
    assert SplitPhases(2, 3, 0).microbatches(table).tolist() == [0, 1, 2]
    assert SplitPhases(2, 0, 2).microbatches(table).tolist() == [6, 7]
    split = SplitPhases(2, 3, 3).apply(table)
    assert split.microbatch_sizes == (0.5,) * 6 + (1.0,) * 2 + (0.5,) * 6
    with pytest.raises(InvalidParameterError, match=r"split-phases: give warmup or cooldown"):
        SplitPhases(2, 0, 0)


def test_a_split_microbatch_must_exist():
    with pytest.raises(InvalidParameterError,
                       match=r"microbatch 8 is out of range \(the table has microbatches 0..7\)"):
        SplitMicrobatches([8], 2).apply(generate("1f1b", devices=4, microbatches=8))


# ------------------------------------------------------------------ merging
def test_merge_runs_from_the_first_forward_to_the_last_backward():
    table = generate("1f1b", devices=4, microbatches=8)
    merged = MergeMicrobatches("all", 2).apply(table)
    assert merged.microbatch_sizes == (2.0,) * 4
    # d0: F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7; pairs enter at F0, F2, F4, F6
    # and leave at B1, B3, B5, B7
    assert [str(op) for op in merged.orders()[0]] == [
        "0F0", "0F1", "0F2", "0B0", "0F3", "0B1", "0B2", "0B3"]
    assert [str(op) for op in merged.orders()[3]] == [
        "3F0", "3B0", "3F1", "3B1", "3F2", "3B2", "3F3", "3B3"]
    peaks = [d.peak_memory for d in evaluate(merged).devices]
    assert peaks == [6.0, 4.0, 4.0, 2.0]


@pytest.mark.parametrize("family,params,merge,message", [
    ("chimera", {}, MergeMicrobatches([1], 2),  # 1 goes down the pipeline, 2 up
     r"cannot merge microbatches 1\.\.2: stage 0 runs them on devices 0 and 3"),
    ("dualpipev", {}, MergeMicrobatches("all", 2), r"is in an overlapped cell on device"),
    ("1f1b", {}, MergeMicrobatches([7], 2), r"microbatches 7\.\.8 run past the table's 8"),
    ("1f1b", {}, MergeMicrobatches([1, 2], 2), r"groups overlap at microbatch 2"),
])
def test_merge_errors(family, params, merge, message):
    table = generate(family, devices=4, microbatches=8, **params)
    with pytest.raises(InvalidParameterError, match=message):
        merge.apply(table)


def test_merge_refuses_a_mix_of_whole_and_split_backwards():
    mixed = ScheduleTable(
        [["0F0", "0F1", "0B0", "0B1"], ["1F0", "1I0", "1W0", "1F1", "1B1"]])
    with pytest.raises(InvalidParameterError, match=r"stage 1 runs some of their backwards "
                                                    r"whole and some split into I and W"):
        MergeMicrobatches("all", 2).apply(mixed)


@pytest.mark.parametrize("build,message", [
    (lambda t: SplitMicrobatches("some", 2).apply(t),
     r"split\(all,k=2\): microbatches must be 'all' or a list of microbatches, not 'some'"),
    (lambda t: SplitMicrobatches([None], 2),
     r"^split: microbatches must be 'all' or a list of microbatches, not \[None\]$"),
    (lambda t: MergeMicrobatches([0.5], 2),
     r"^merge: microbatches must be 'all' or a list of microbatches, not \[0.5\]$"),
    (lambda t: MergeMicrobatches("pairs", 2).apply(t),
     r"merge\(all,count=2\): first must be 'all' or a list of microbatches"),
    (lambda t: MergeMicrobatches("all", 2).apply(generate("1f1b", devices=4, microbatches=1)),
     r"^merge\(all,count=2\): the table has only 1 microbatches$"),
])
def test_selection_errors(build, message):
    table = generate("1f1b", devices=4, microbatches=8)
    with pytest.raises(InvalidParameterError, match=message):
        build(table)


SMALL_MODEL = TransformerModel(layers=8, hidden=512, heads=8, sequence=512, vocab=8000,
                               microbatch_size=4)
CURVED = ModelCosts(SMALL_MODEL, load_system("mid_nw_mid_cp").replace(
    half_efficiency_tokens=1024))


@given(family=st.sampled_from([("1f1b", {}), ("zb-h1", {}), ("interleaved-1f1b", {"chunks": 2}),
                               ("gpipe", {})]),
       devices=st.sampled_from([2, 4]), microbatches=st.sampled_from([4, 8]),
       transform=st.one_of(
           st.builds(SplitMicrobatches, st.lists(st.integers(0, 3), min_size=1, max_size=3),
                     st.sampled_from([2, 4])),
           st.builds(SplitPhases, st.sampled_from([2, 4]), st.integers(0, 2), st.integers(1, 2)),
           st.builds(MergeMicrobatches, st.sampled_from(["all", [0], [2]]), st.just(2))))
def test_work_is_conserved_up_to_the_efficiency_curve(family, devices, microbatches, transform):
    name, params = family
    table = generate(name, devices=devices, microbatches=microbatches, **params)
    result = apply_or_reject(transform, table, CURVED)
    if result is None:
        return
    flops = [CURVED.op_work(t)[0].sum() for t in (table, result)]
    assert flops[1] == pytest.approx(flops[0], rel=1e-12)
    time = [CURVED.op_durations(t).sum() for t in (table, result)]
    if isinstance(transform, MergeMicrobatches):
        assert time[1] < time[0]          # bigger products run closer to the peak
    else:
        assert time[1] > time[0]          # smaller ones further from it
