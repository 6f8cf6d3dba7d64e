"""Split backward: I + W, the W ops placed in idle time under their caps."""

import pytest

from tabsched import (InvalidParameterError, ScheduleTable, StageCosts, UnitCosts, evaluate,
                      generate)
from tabsched.adapt import SplitBackward, deferred_weight_grads


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


def test_split_backward_needs_something_to_split():
    # device 1 runs nothing at all
    table = ScheduleTable([["0F0", "1F0", "1B0", "0B0"], []])
    with pytest.raises(InvalidParameterError,
                       match=r"^split-backward\(d1,defer<=inf\): the chosen devices run no B "
                             r"or W$"):
        SplitBackward([1]).apply(table)
    assert SplitBackward([0]).apply(table).num_ops == 6


@pytest.mark.parametrize("build,message", [
    (lambda: SplitBackward([9]).apply(generate("1f1b", devices=4, microbatches=8)),
     r"split-backward on device 9, but the table has devices 0..3"),
    (lambda: SplitBackward(max_deferred="later"), r"max_deferred must be an integer, None"),
    (lambda: SplitBackward(max_deferred=[1, 2]).apply(generate("1f1b", devices=4,
                                                               microbatches=8)),
     r"max_deferred has 2 entries for 4 devices"),
    (lambda: SplitBackward(max_deferred=-1), r"^max_deferred must be an integer >= 0, not -1$"),
])
def test_split_backward_errors(build, message):
    with pytest.raises(InvalidParameterError, match=message):
        build()


@pytest.mark.parametrize("family", ["zb-h1", "zb-h2", "1f1b"])
def test_rows_left_as_staged_give_the_table_the_rebuild_gives(family, monkeypatch):
    # apply() returns the staged table itself when every device runs its cells as
    # staged; the rebuild from the rows must give the same table, orders and layout
    import importlib
    module = importlib.import_module("tabsched.adapt.split_backward")
    table = generate(family, devices=4, microbatches=12)
    moves = [SplitBackward(max_deferred=cap) for cap in (0, 1, None, "cooldown")]
    moves += [SplitBackward([device], cap) for device in range(4) for cap in (0, 1, 3)]
    shortcut = 0
    for move in moves:
        fast = (move.orders(table), move.apply(table))
        staged = move._staged(table, move._chosen(table))
        rows = module._fill_idle(staged, UnitCosts(), move._chosen(table),
                                 move.caps(table, UnitCosts()))
        shortcut += module._in_staged_order(rows)
        with monkeypatch.context() as patch:
            patch.setattr(module, "_in_staged_order", lambda rows: False)
            slow = (move.orders(table), move.apply(table))
        for mine, theirs in zip(fast, slow):
            assert mine == theirs
            assert mine.rows == theirs.rows and mine.params == theirs.params
            assert mine.microbatch_sizes == theirs.microbatch_sizes
    assert shortcut > 0


@pytest.mark.parametrize("family", ["zb-h1", "zb-h2", "1f1b"])
def test_moves_on_one_table_share_its_staged_arrays_and_give_the_same_tables(family,
                                                                             monkeypatch):
    # inside shared_staging the moves on one table whose devices run no B reuse one
    # _fill_idle_base; made afresh for each move they give the same tables
    import importlib
    module = importlib.import_module("tabsched.adapt.split_backward")
    table = generate(family, devices=4, microbatches=12)
    costs = StageCosts([1.0, 1.4, 0.8, 1.1], comm=0.3)
    moves = [SplitBackward([device], cap) for device in range(4) for cap in (0, 1, None)]
    moves += [SplitBackward(max_deferred="cooldown"), SplitBackward([1, 2], "cooldown")]
    with module.shared_staging():
        shared = [move.apply(table, costs) for move in moves]
        kept = module._SHARED_STAGING.get()
        assert kept.get("table") is (None if family == "1f1b" else table)
    assert module._SHARED_STAGING.get() is None          # outside: nothing is kept
    with monkeypatch.context() as patch:
        patch.setattr(module, "_base", lambda table, staged, costs, chosen:
                      module._fill_idle_base(staged, costs))
        fresh = [move.apply(table, costs) for move in moves]
    for mine, theirs in zip(shared, fresh):
        assert mine == theirs and mine.rows == theirs.rows and mine.params == theirs.params
