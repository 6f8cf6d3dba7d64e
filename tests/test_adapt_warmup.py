"""Warm-up: deeper or shallower warm-up per device, Megatron-LM's order on 1F1B."""

import pytest

from tabsched import DeadlockError, InvalidParameterError, generate
from tabsched.adapt import Warmup, warmup_depths
from tabsched.schedules.one_f_one_b import device_order
from tabsched.table import KINDS


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
])
def test_warmup_errors(build, message):
    with pytest.raises(InvalidParameterError, match=message):
        build()


def test_warmup_depths_count_the_forwards_before_the_first_other_cell():
    table = generate("1f1b", devices=4, microbatches=8)
    assert warmup_depths(table) == [4, 3, 2, 1]
    assert warmup_depths(Warmup(None, 1).apply(table)) == [5, 4, 3, 2]
    assert warmup_depths(Warmup([3], -1).apply(table)) == [4, 3, 2, 1]   # never past its own
    assert warmup_depths(generate("gpipe", devices=4, microbatches=8)) == [8] * 4
