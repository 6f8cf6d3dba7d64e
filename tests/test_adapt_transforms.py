"""Granularity transforms in general: valid tables, conserved work, stated memory effects,
the metadata a transformed table records (each transform's own rules:
test_adapt_microbatches.py, test_adapt_warmup.py, test_adapt_split_backward.py)."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tabsched import (DeadlockError, InvalidParameterError, ScheduleTable, StageCosts,
                      evaluate, generate)
from tabsched._testing import random_table
from tabsched.adapt import (MemoryEffect, MergeMicrobatches, SplitBackward, SplitMicrobatches,
                            SplitPhases, Warmup)
from tabsched.adapt.transforms import describe_microbatches
from tabsched.layout import lay_out


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


def test_orders_are_the_applied_table_before_its_layout():
    table = generate("zb-h1", devices=4, microbatches=8)
    for transform in (SplitMicrobatches([1], 2), SplitPhases(2, 1, 1), MergeMicrobatches("all", 2),
                      SplitBackward(max_deferred=1), Warmup(None, 1)):
        applied, orders = transform.apply(table), transform.orders(table)
        assert [[str(op) for op in row] for row in orders.orders()] == \
            [[str(op) for op in row] for row in applied.orders()]
        laid_out = lay_out(orders)
        np.testing.assert_array_equal(laid_out.slot, applied.slot)
        assert laid_out.params == applied.params


def test_a_memory_effect_names_the_devices_that_break_it():
    effect = MemoryEffect(lower=np.array([-1.0, 0.0, 0.0]), upper=np.array([0.0, 2.0, 0.0]),
                          statement="test")
    assert effect.check([5.0, 5.0, 5.0], [4.0, 7.0, 5.0]) == []
    assert effect.check([5.0, 5.0, 5.0], [3.9, 7.1, 5.0]) == [0, 1]
    assert effect.check([5.0, 5.0, 5.0], [5.0, 5.0, 5.0 + 1e-12]) == []   # the tolerance


def test_describe_microbatches_runs_and_singles():
    assert describe_microbatches([]) == ""
    assert describe_microbatches([3]) == "3"
    assert describe_microbatches([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"


@given(values=st.lists(st.integers(-3, 40), max_size=200))
def test_run_firsts_is_searchsorted_on_sorted_values(values):
    from tabsched.adapt.transforms import run_firsts
    ordered = np.sort(np.asarray(values, dtype=np.int64))
    assert np.array_equal(run_firsts(ordered), np.searchsorted(ordered, ordered))


@given(rows=st.lists(st.tuples(st.integers(0, 70), st.integers(-5, 3000), st.integers(0, 3)),
                     max_size=200),
       huge=st.booleans())
def test_lexsort3_is_lexsort(rows, huge):
    from tabsched.adapt.transforms import _lexsort3
    columns = [np.array([row[k] for row in rows], dtype=np.int64) for k in range(3)]
    if huge and rows:     # ranges too wide for one key: lexsort itself
        columns[1][0] = 2**61
    assert np.array_equal(_lexsort3(*columns),
                          np.lexsort((columns[2], columns[1], columns[0])))
