"""Looping-placement families: interleaved 1F1B (Megatron) and looped BFS (PyTorch).

Worked numbers from SCHEDULES.md §3-§4; properties over every valid size;
formula level; parameter errors from the API and the CLI; golden files.
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tabsched import InvalidParameterError, Op, UnitCosts, evaluate, generate, read_table
from tabsched._testing import parse_grid
from tabsched.formulas import formula_for
from tabsched.io import to_csv
from tabsched.schedules import get_family
from tabsched.schedules.interleaved import schedule_table
from tabsched.table import BACKWARD, FORWARD

RATIOS = st.sampled_from([(1, 1), (1, 2), (1, 3), (2, 1), (1, 1.5)])


def looping_op(devices):
    """Grid letters of a 2-chunk looping placement: upper case chunk 0, lower case chunk 1."""
    def op_of(device, letter, microbatch):
        chunk = 1 if letter.islower() else 0
        return Op(letter.upper(), chunk * devices + device, microbatch)
    return op_of


def assert_table_basics(table, devices, stages, microbatches, placement):
    """Valid (it was built), no deadlock, M forwards per stage, stages where they belong."""
    assert table.num_devices == devices and table.num_stages == stages
    forwards = table.stage[table.kind == FORWARD]
    assert np.array_equal(np.bincount(forwards, minlength=stages), [microbatches] * stages)
    assert table.placement() == {stage: (placement(stage),) for stage in range(stages)}
    return evaluate(table)  # raises DeadlockError on a cycle


# --------------------------------------------------------------- interleaved 1F1B
INTERLEAVED_4_8 = """
d0: F0 F1 F2 F3 f0 f1 f2 f3 F4 F5 F6 .  .  .  b0 b0 F7 b1 b1 .  f4 b2 b2 f5 b3 b3 f6 B0 B0 f7 B1 B1 B2 B2 .  B3 B3 .  b4 b4 .  b5 b5 .  b6 b6 .  b7 b7 B4 B4 B5 B5 B6 B6 B7 B7
d3: .  .  .  F0 F1 F2 F3 f0 b0 b0 f1 b1 b1 f2 b2 b2 f3 b3 b3 F4 B0 B0 F5 B1 B1 F6 B2 B2 F7 B3 B3 f4 b4 b4 f5 b5 b5 f6 b6 b6 f7 b7 b7 B4 B4 B5 B5 B6 B6 B7 B7 .  .  .  .  .  .
"""


def test_interleaved_matches_schedules_md():
    table = generate("interleaved-1f1b", devices=4, microbatches=8, chunks=2)
    assert table.params == {"devices": 4, "microbatches": 8, "chunks": 2, "group_size": 4}
    grid = parse_grid(INTERLEAVED_4_8, looping_op(4), {"F": 1, "B": 2})
    orders = table.orders()
    for device, row in grid.items():
        assert orders[device] == [op for op, _ in row]
    result = evaluate(table, UnitCosts(f=1, b=2))
    assert result.makespan == 57 and round(result.bubble_ratio, 3) == 0.158
    assert [device.peak_memory for device in result.devices] == [11, 9, 7, 5]


def test_interleaved_schedule_table_groups():
    # Megatron's own example (PP2 N3M5 VP2) in schedules.py.
    microbatch, chunk = schedule_table(5, 2, 3)
    assert microbatch.tolist() == [0, 1, 2, 0, 1, 2, 3, 4, 3, 4]
    assert chunk.tolist() == [0, 0, 0, 1, 1, 1, 0, 0, 1, 1]
    # Groups of 4 over 10 microbatches: [0,4), [4,8), [8,10).
    microbatch, chunk = schedule_table(10, 2, 4)
    assert microbatch.tolist()[8:16] == [4, 5, 6, 7, 4, 5, 6, 7]
    assert microbatch.tolist()[16:] == [8, 9, 8, 9]


def test_interleaved_group_size_changes_the_order():
    table = generate("interleaved-1f1b", devices=2, microbatches=4, chunks=2, group_size=4)
    first = [str(op) for op in table.orders()[1][:9]]
    # device 1, warm-up 2*0 + 1*4 = 4 forwards of chunk 0, then the 1F1B pairs.
    assert first == ["1F0", "1F1", "1F2", "1F3", "3F0", "3B0", "3F1", "3B1", "3F2"]
    assert table.params["group_size"] == 4


def interleaved_sizes():
    def valid(p, v, n):
        groups = [g for g in range(p, n + 1) if n % g == 0 or n % g >= p]
        return st.tuples(st.just(p), st.just(v), st.just(n), st.sampled_from(groups))
    return st.tuples(st.integers(1, 8), st.integers(2, 4)).flatmap(
        lambda pv: st.integers(pv[0], 3 * pv[0] + 3).flatmap(
            lambda n: valid(pv[0], pv[1], n)))


@given(interleaved_sizes(), RATIOS)
def test_interleaved_properties(size, ratio):
    p, v, n, g = size
    table = generate("interleaved-1f1b", devices=p, microbatches=n, chunks=v, group_size=g)
    unit = assert_table_basics(table, p, v * p, n, lambda stage: stage % p)
    formula = formula_for(table)
    assert [d.peak_memory for d in unit.devices] == formula["peak_activation"]
    forward, backward = ratio
    result = evaluate(table, UnitCosts(f=forward, b=backward))
    assert result.bubble_ratio == pytest.approx(formula["bubble_ratio"], abs=1e-12)
    assert formula["bubble_ratio"] == pytest.approx((p - 1) / (v * n + p - 1))


@given(interleaved_sizes(), RATIOS)
def test_combined_1f1b_properties(size, ratio):
    """pairs=fused (Megatron-Core's combined 1F1B): a valid table whose steady cells pair
    a forward with a backward of another microbatch, one activation more than the serial
    schedule on every device that reaches its steady state, and the same formulas."""
    p, v, n, g = size
    table = generate("interleaved-1f1b", devices=p, microbatches=n, chunks=v, group_size=g,
                     pairs="fused")
    unit = assert_table_basics(table, p, v * p, n, lambda stage: stage % p)
    formula = formula_for(table)
    assert [d.peak_memory for d in unit.devices] == formula["peak_activation"]
    first = table.cell_starts()
    for op in np.flatnonzero(~first):
        assert {int(table.kind[op - 1]), int(table.kind[op])} == {FORWARD, BACKWARD}
    forward, backward = ratio
    result = evaluate(table, UnitCosts(f=forward, b=backward))
    serial = evaluate(generate("interleaved-1f1b", devices=p, microbatches=n, chunks=v,
                               group_size=g), UnitCosts(f=forward, b=backward))
    assert result.makespan >= serial.makespan - 1e-9
    # a pair costs its two operations under slot costs: the bubble is the serial one's
    assert result.bubble_ratio == pytest.approx(formula["bubble_ratio"], abs=1e-12)


@pytest.mark.parametrize("params,message", [
    (dict(devices=4, microbatches=8, chunks=1),
     r"interleaved-1f1b: chunks must be >= 2, not 1 \(one chunk per device is the 1f1b family\)"),
    (dict(devices=4, microbatches=3),
     r"interleaved-1f1b: microbatches must be >= devices \(3 < 4\), since group_size must lie "
     r"in \[devices, microbatches\]"),
    (dict(devices=4, microbatches=8, group_size=3),
     r"interleaved-1f1b: group_size must lie in \[devices, microbatches\] = \[4, 8\], not 3"),
    (dict(devices=4, microbatches=8, group_size=9),
     r"group_size must lie in \[devices, microbatches\] = \[4, 8\], not 9"),
    (dict(devices=4, microbatches=10),
     r"interleaved-1f1b: the last microbatch group would hold 2 microbatches \(microbatches % "
     r"group_size = 10 % 4\), fewer than devices=4; it must be 0 or >= devices \(valid "
     r"group_size for 10 microbatches: 5, 6, 10\)"),
    (dict(devices=4, microbatches=8, group_size=0), r"interleaved-1f1b: group_size must be >= 1"),
])
def test_interleaved_rejects(params, message):
    with pytest.raises(InvalidParameterError, match=message):
        generate("interleaved-1f1b", **params)


# ------------------------------------------------------------------- looped BFS
def test_looped_bfs_order_and_schedules_md_numbers():
    table = generate("looped-bfs", devices=2, microbatches=3, chunks=2)
    assert [str(op) for op in table.orders()[0]] == [
        "0F0", "0F1", "0F2", "2F0", "2F1", "2F2", "2B2", "2B1", "2B0", "0B2", "0B1", "0B0"]
    assert [str(op) for op in table.orders()[1]] == [
        "1F0", "1F1", "1F2", "3F0", "3F1", "3F2", "3B2", "3B1", "3B0", "1B2", "1B1", "1B0"]
    result = evaluate(generate("looped-bfs", devices=4, microbatches=8), UnitCosts(f=1, b=2))
    assert result.makespan == 57 and round(result.bubble_ratio, 3) == 0.158
    assert [device.peak_memory for device in result.devices] == [16] * 4


def test_looped_bfs_stalls_when_microbatches_are_fewer_than_devices():
    table = generate("looped-bfs", devices=4, microbatches=2, chunks=2)
    result = evaluate(table, UnitCosts(f=1, b=2))
    assert result.bubble_ratio > 3 / (2 * 2 + 3)
    # Device 0 waits for stage 3's forward of microbatch 0 before stage 4's.
    starts = {str(table.op(k)): result.op_start[k] for k in range(len(table))
              if table.device[k] == 0}
    assert starts["4F0"] == 4 and starts["0F1"] == 1


@given(st.integers(1, 8), st.integers(1, 4), st.integers(1, 24), RATIOS)
def test_looped_bfs_properties(p, v, n, ratio):
    table = generate("looped-bfs", devices=p, microbatches=n, chunks=v)
    unit = assert_table_basics(table, p, v * p, n, lambda stage: stage % p)
    formula = formula_for(table)
    assert formula["bubble_ratio"] is None and "no published closed-form" in formula["note"]
    assert [d.peak_memory for d in unit.devices] == formula["peak_activation"] == [v * n] * p
    result = evaluate(table, UnitCosts(f=ratio[0], b=ratio[1]))
    table_level = (p - 1) / (v * n + p - 1)
    if n >= p:
        assert result.bubble_ratio == pytest.approx(table_level, abs=1e-12)
    else:
        assert result.bubble_ratio >= table_level - 1e-12


def test_looped_bfs_rejects_zero_chunks():
    with pytest.raises(InvalidParameterError, match=r"looped-bfs: chunks must be >= 1, not 0"):
        generate("looped-bfs", devices=2, microbatches=2, chunks=0)


# ------------------------------------------------------------- CLI, golden files
@pytest.mark.parametrize("argv,message", [
    (["interleaved-1f1b", "-p", "4", "-m", "8", "--chunks", "1"],
     "interleaved-1f1b: chunks must be >= 2, not 1"),
    (["interleaved-1f1b", "-p", "4", "-m", "6", "--chunks", "2"],
     "the last microbatch group would hold 2 microbatches"),
    (["interleaved-1f1b", "-p", "4", "-m", "2"], "microbatches must be >= devices (2 < 4)"),
    (["looped-bfs", "-p", "2", "-m", "2", "--chunks", "0"], "looped-bfs: chunks must be >= 1"),
])
def test_cli_rejects(cli, argv, message):
    code, out, err = cli("eval", *argv)
    assert code == 1 and out == "" and message in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("family", ["interleaved-1f1b", "looped-bfs"])
def test_cli_shows_and_evaluates(cli, family):
    code, out, _ = cli("show", family, "-p", "4", "-m", "8", "--chunks", "2", "--width", "100")
    assert code == 0 and out.startswith(f"{family} devices=4 microbatches=8 chunks=2")
    assert "4F0" in out and "d3" in out
    code, out, _ = cli("eval", family, "-p", "4", "-m", "8", "--b", "2")
    assert code == 0 and "makespan      57 slots" in out


@pytest.mark.parametrize("family,name", [("interleaved-1f1b", "interleaved-1f1b_p4_m8_v2.csv"),
                                         ("looped-bfs", "looped-bfs_p4_m8_v2.csv")])
def test_golden_files(golden, family, name):
    path = golden(name)
    table = generate(family, devices=4, microbatches=8, chunks=2)
    assert to_csv(table, drop_metadata=True).encode() == path.read_bytes()
    assert read_table(path).orders() == table.orders()


def test_interleaved_golden_file_agrees_with_schedules_md(golden):
    """The golden file's rows run in the order of §3's grid (its layout is unit-time)."""
    stored = read_table(golden("interleaved-1f1b_p4_m8_v2.csv"))
    grid = parse_grid(INTERLEAVED_4_8, looping_op(4), {"F": 1, "B": 2})
    for device, row in grid.items():
        assert stored.orders()[device] == [op for op, _ in row]
    result = evaluate(stored, UnitCosts(f=1, b=2))
    assert result.makespan == 57


def test_listing_shows_the_derived_group_size(cli):
    code, out, _ = cli("list")
    assert code == 0
    assert "parameters:  devices, microbatches, chunks=2, [group_size]" in out
    assert "default: devices" in get_family("interleaved-1f1b").parameters[3].help
