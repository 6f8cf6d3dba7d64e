"""Granularity transforms: valid tables, conserved work, stated memory effects."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tabsched import (DeadlockError, InvalidParameterError, ModelCosts, ScheduleTable,
                      StageCosts, UnitCosts, evaluate, generate)
from tabsched._testing import random_table
from tabsched.adapt import (MergeMicrobatches, SplitBackward, SplitMicrobatches, SplitPhases,
                            Warmup, deferred_weight_grads)
from tabsched.costs.transformer import TransformerModel
from tabsched.schedules.one_f_one_b import device_order
from tabsched.costs.system import load_system
from tabsched.table import KINDS

COSTS = StageCosts([1.0, 1.5, 0.7, 1.2, 0.9, 1.1], comm=0.25)


def stage_costs(table):
    """Per-stage costs with I + W = B, positive everywhere, for any stage count."""
    S = table.num_stages
    forward = 1.0 + 0.1 * np.arange(S)
    return StageCosts(forward, 2 * forward, input_grad=1.2 * forward,
                      weight_grad=0.8 * forward, comm=0.25, activation=1 + 0.5 * np.arange(S))


transforms = st.one_of(
    st.builds(lambda ms, k: SplitMicrobatches(ms, k),
              st.lists(st.integers(0, 4), min_size=1, max_size=3), st.sampled_from([2, 3])),
    st.builds(SplitMicrobatches, st.just("all"), st.sampled_from([2, 3])),
    st.builds(SplitPhases, st.sampled_from([2, 3]), st.integers(0, 2), st.integers(1, 2)),
    st.builds(MergeMicrobatches, st.sampled_from(["all", [0], [1], [0, 2]]), st.just(2)),
    st.builds(SplitBackward, st.sampled_from([None, [0], [0, 1]]),
              st.sampled_from([0, 1, 2, None, "cooldown"])),
    st.builds(Warmup, st.sampled_from([None, [0], [0, 1], [1, 2, 3]]),
              st.sampled_from([-2, -1, 1, 2])),
)


def apply_or_reject(transform, table, costs):
    """The transformed table, or None where the transform does not apply or deadlocks."""
    try:
        return transform.apply(table, costs)
    except (DeadlockError, InvalidParameterError):
        return None


def work(table, costs):
    """Modelled compute per (kind group, stage): forwards, and backwards with I + W = B."""
    durations = costs.op_durations(table)
    group = np.where(table.kind == 0, 0, 1)
    return np.bincount(group * table.num_stages + table.stage, weights=durations,
                       minlength=2 * table.num_stages)


def draw_table(seed, plain):
    """A random table; a plain one has no overlaps, replicas or split backwards."""
    if plain:
        return random_table(seed, split=0.0, overlap=0.0, replicate=0.0)
    return random_table(seed)


@given(seed=st.integers(0, 2**32 - 1), plain=st.booleans(), transform=transforms)
def test_transforms_give_valid_tables_with_the_same_work(seed, plain, transform):
    table = draw_table(seed, plain)
    costs = stage_costs(table)
    result = apply_or_reject(transform, table, costs)
    if result is None:
        return
    assert isinstance(result, ScheduleTable)
    result.validate()
    assert result.num_devices == table.num_devices and result.num_stages == table.num_stages
    assert sum(result.microbatch_sizes) == pytest.approx(sum(table.microbatch_sizes))
    np.testing.assert_allclose(work(result, costs), work(table, costs), rtol=1e-12)
    assert result.params["transforms"][-1] == transform.describe()
    assert result.family is None
    evaluate(result, costs)  # lowers and runs: no deadlock


@given(seed=st.integers(0, 2**32 - 1), plain=st.booleans(), transform=transforms)
def test_transforms_keep_their_memory_statement(seed, plain, transform):
    table = draw_table(seed, plain)
    costs = stage_costs(table)
    result = apply_or_reject(transform, table, costs)
    if result is None:
        return
    effect = transform.memory_effect(table, costs)
    before = [d.peak_memory for d in evaluate(table, costs).devices]
    after = [d.peak_memory for d in evaluate(result, costs).devices]
    assert effect.check(before, after) == [], (effect.statement, before, after,
                                                effect.lower, effect.upper)
    assert np.all(effect.lower <= 0) and np.all(effect.upper >= 0)


def test_every_transform_applies_to_the_common_families():
    moves = [SplitMicrobatches("all", 2), SplitPhases(2, 3, 3), MergeMicrobatches("all", 2),
             SplitBackward(), SplitBackward(max_deferred="cooldown"), Warmup(None, 1),
             Warmup(None, -1)]
    for family, params in [("1f1b", {}), ("zb-h1", {}), ("interleaved-1f1b", {"chunks": 2}),
                           ("gpipe", {}), ("zbv", {}), ("hanayo", {"waves": 2})]:
        table = generate(family, devices=4, microbatches=8, **params)
        costs = stage_costs(table)
        for move in moves:
            if isinstance(move, SplitBackward) and family == "zbv":
                pass  # ZB-V is already split: this re-places its W ops
            result = move.apply(table, costs)
            np.testing.assert_allclose(work(result, costs), work(table, costs), rtol=1e-12)


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


# ------------------------------------------------------------------ warm-up
@pytest.mark.parametrize("delta", [1, -1, 2])
def test_warmup_on_1f1b_is_megatrons_order(delta):
    p, m = 4, 8
    table = generate("1f1b", devices=p, microbatches=m)
    changed = Warmup(None, delta).apply(table)
    for device, order in enumerate(changed.orders()):
        warmup = max(min(p - device - 1 + delta, m), 0)
        if delta < 0 and p - device - 1 == 0:
            warmup = 0
        kinds, microbatches = device_order(warmup, m)
        assert [str(op) for op in order] == [f"{device}{KINDS[k]}{mb}"
                                             for k, mb in zip(kinds, microbatches)]


def test_warmup_on_zero_bubble_tables_moves_whole_steps():
    table = generate("zb-h1", devices=4, microbatches=8)
    shallow = Warmup([0], -1).apply(table).orders()[0]
    assert [str(op) for op in shallow[:6]] == ["0F0", "0F1", "0F2", "0I0", "0W0", "0F3"]


def test_a_shallower_warmup_on_one_gpipe_device_deadlocks():
    # device 1 still runs every forward before its first backward
    with pytest.raises(DeadlockError, match=r"^deadlock: the row orders contradict"):
        Warmup([0], -1).apply(generate("gpipe", devices=4, microbatches=8))


@pytest.mark.parametrize("build,message", [
    (lambda: Warmup([0], 0), r"warmup delta must be a non-zero integer, not 0"),
    (lambda: Warmup([], 1), r"warmup: give at least one device"),
    (lambda: Warmup([9], 1).apply(generate("1f1b", devices=4, microbatches=8)),
     r"warmup on device 9, but the table has devices 0..3"),
    (lambda: SplitBackward([9]).apply(generate("1f1b", devices=4, microbatches=8)),
     r"split-backward on device 9, but the table has devices 0..3"),
    (lambda: SplitBackward(max_deferred="later"), r"max_deferred must be an integer, None"),
    (lambda: SplitBackward(max_deferred=[1, 2]).apply(generate("1f1b", devices=4,
                                                               microbatches=8)),
     r"max_deferred has 2 entries for 4 devices"),
    (lambda: SplitMicrobatches([8], 2).apply(generate("1f1b", devices=4, microbatches=8)),
     r"microbatch 8 is out of range \(the table has microbatches 0..7\)"),
])
def test_transform_errors(build, message):
    with pytest.raises(InvalidParameterError, match=message):
        build()


# ---------------------------------------------------------- split backward
def test_split_backward_without_deferral_runs_w_right_after_i():
    table = generate("1f1b", devices=4, microbatches=8)
    split = SplitBackward(max_deferred=0).apply(table, UnitCosts())
    for order in split.orders():
        texts = [str(op) for op in order]
        for index, text in enumerate(texts):
            if "I" in text:
                assert texts[index + 1] == text.replace("I", "W")
    assert deferred_weight_grads(split) == [0, 0, 0, 0]


def test_split_backward_fills_idle_time_and_respects_its_caps():
    table = generate("1f1b", devices=4, microbatches=8)
    costs = UnitCosts(f=1, b=2, i=1, w=1)
    eager = SplitBackward(max_deferred=0).apply(table, costs)
    for caps in ([1, 1, 1, 1], [0, 1, 2, 3], [None] * 4):
        placed = SplitBackward(max_deferred=caps).apply(table, costs)
        deferred = deferred_weight_grads(placed)
        assert all(cap is None or d <= cap for d, cap in zip(deferred, caps))
        assert evaluate(placed, costs).makespan <= evaluate(eager, costs).makespan
    # unbounded, the W ops fill the cool-down: ZB-H1's makespan here
    unbounded = SplitBackward().apply(table, costs)
    assert evaluate(unbounded, costs).makespan == evaluate(generate("zb-h1", devices=4,
                                                                    microbatches=8),
                                                           costs).makespan


def test_split_backward_fits_caps_to_the_cooldown():
    table = generate("1f1b", devices=4, microbatches=8)
    costs = UnitCosts(f=1, b=2, i=1, w=1)
    caps = SplitBackward(max_deferred="cooldown").caps(table, costs)
    assert caps[0] == 0 and caps == sorted(caps)


def test_deferred_weight_grads_of_zero_bubble_tables():
    assert deferred_weight_grads(generate("zb-h1", devices=4, microbatches=8)) == [0, 1, 2, 3]
    assert deferred_weight_grads(generate("1f1b", devices=4, microbatches=8)) == [0] * 4


def test_transforms_describe_themselves():
    assert SplitMicrobatches([0, 1, 2, 5], 2).describe() == "split(m0-2,5,k=2)"
    assert MergeMicrobatches("all", 2).describe() == "merge(all,count=2)"
    assert Warmup(range(4), 1).describe() == "warmup(d0-3,+1)"
    assert SplitBackward([7], 3).describe() == "split-backward(d7,defer<=3)"
    assert SplitBackward(max_deferred=[0, None]).describe() == "split-backward(all,defer<=0/inf)"
    assert SplitPhases(2, 7, 7).to_dict() == {"transform": "split-phases", "parts": 2,
                                              "warmup": 7, "cooldown": 7}
    assert Warmup([1], 1) == Warmup([1], 1) and Warmup([1], 1) != Warmup([1], -1)
    chained = Warmup(None, 1).apply(SplitBackward().apply(generate("1f1b", devices=2,
                                                                   microbatches=2)))
    assert chained.params == {"transforms": ["split-backward(all,defer<=inf)",
                                             "warmup(all,+1)"],
                              "adapted_from": "1f1b devices=2 microbatches=2"}


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
    (lambda t: SplitBackward(max_deferred=-1), r"^max_deferred must be an integer >= 0, not -1$"),
])
def test_selection_errors(build, message):
    table = generate("1f1b", devices=4, microbatches=8)
    with pytest.raises(InvalidParameterError, match=message):
        build(table)


def test_split_backward_needs_something_to_split():
    # device 1 runs nothing at all
    table = ScheduleTable([["0F0", "1F0", "1B0", "0B0"], []])
    with pytest.raises(InvalidParameterError,
                       match=r"^split-backward\(d1,defer<=inf\): the chosen devices run no B "
                             r"or W$"):
        SplitBackward([1]).apply(table)
    assert SplitBackward([0]).apply(table).num_ops == 6


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
