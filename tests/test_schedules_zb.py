"""Split-backward families: ZB-H1, ZB-H2, ZB-V, V-Half, V-Min.

Worked tables from SCHEDULES.md §5-§7 (the V-Half/V-Min grids are the
authors' own output, so their idle slots are compared too); properties over
every valid size; memory in the units the sources use, converted; the formula
level; parameter errors from the API and the CLI; golden files.
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tabsched import InvalidParameterError, Op, UnitCosts, evaluate, generate, read_table
from tabsched._testing import parse_grid
from tabsched.formulas import formula_for
from tabsched.io import to_csv
from tabsched.schedules.v_shape import block_offsets, peak_memory
from tabsched.table import FORWARD

UNIT = {"F": 1, "I": 1, "W": 1}
TIMES = st.sampled_from([0.5, 1.0, 2.0, 3.0])
KIND = {"F": "F", "B": "I", "W": "W"}  # the papers' B is the input-grad pass


def one_chunk_op(device, letter, microbatch):
    return Op(KIND[letter], device, microbatch)


def v_op(devices):
    """Grid letters of the V placement: upper case stage d, lower case stage 2p-1-d."""
    def op_of(device, letter, microbatch):
        stage = 2 * devices - 1 - device if letter.islower() else device
        return Op(KIND[letter.upper()], stage, microbatch)
    return op_of


def assert_orders(table, grid):
    orders = table.orders()
    for device, row in grid.items():
        assert orders[device] == [op for op, _ in row], f"device {device}"


def assert_starts(table, grid):
    """Every op of the grid's rows starts where the grid shows it (unit times)."""
    result = evaluate(table)
    starts = {(int(table.device[k]), table.op(k)): result.op_start[k] for k in range(len(table))}
    for device, row in grid.items():
        assert [starts[device, op] for op, _ in row] == [slot for _, slot in row]
        assert len(row) == int(np.count_nonzero(table.device == device))
    return result


def assert_table_basics(table, devices, stages, microbatches, placement):
    assert table.num_devices == devices and table.num_stages == stages
    forwards = table.stage[table.kind == FORWARD]
    assert np.array_equal(np.bincount(forwards, minlength=stages), [microbatches] * stages)
    assert table.placement() == {stage: (placement(stage),) for stage in range(stages)}
    return evaluate(table)  # raises DeadlockError on a cycle


def v_placement(devices):
    return lambda stage: stage if stage < devices else 2 * devices - 1 - stage


def span_bubble(table, result, work):
    """Bubble measured per device from its own first op to its last (ZB's convention)."""
    span = max(result.op_end[table.device == d].max() - result.op_start[table.device == d].min()
               for d in range(table.num_devices))
    return (span - work) / span


# ------------------------------------------------------------------ ZB-H1, ZB-H2
ZB_H1_4_8 = """
H1 d0: F0 F1 F2 F3 .  .  .  B0 W0 F4 B1 W1 F5 B2 W2 F6 B3 W3 F7 B4 W4 B5 W5 B6 W6 B7 W7
H1 d1: .  F0 F1 F2 .  .  B0 F3 B1 W0 F4 B2 W1 F5 B3 W2 F6 B4 W3 F7 B5 W4 B6 W5 B7 W6 W7
H1 d2: .  .  F0 F1 .  B0 F2 B1 F3 B2 W0 F4 B3 W1 F5 B4 W2 F6 B5 W3 F7 B6 W4 B7 W5 W6 W7
H1 d3: .  .  .  F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 F6 B6 W3 F7 B7 W4 W5 W6 W7
"""
ZB_H2_4_8 = """
H2 d0: F0 F1 F2 F3 F4 F5 F6 B0 W0 F7 B1 W1 B2 W2 B3 W3 B4 W4 B5 W5 B6 W6 B7 W7 .  .  .
H2 d3: .  .  .  F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 W0 F7 B7 W1 W2 W3 W4 W5 W6 W7
"""


def test_zb_h1_matches_schedules_md():
    table = generate("zb-h1", devices=4, microbatches=8)
    assert_orders(table, parse_grid(ZB_H1_4_8, one_chunk_op, UNIT))
    result = evaluate(table)
    assert result.makespan == 27 and round(result.bubble_ratio, 3) == 0.111
    assert [d.peak_memory for d in result.devices] == [4] * 4


def test_zb_h2_matches_schedules_md_and_idles_only_at_the_ends():
    table = generate("zb-h2", devices=4, microbatches=8)
    assert_orders(table, parse_grid(ZB_H2_4_8, one_chunk_op, UNIT))
    result = evaluate(table)
    assert result.makespan == 27
    assert all(device.inside == 0 for device in result.devices)
    assert [d.peak_memory for d in result.devices] == [7] * 4  # 2p-1
    assert span_bubble(table, result, 24) == 0 == formula_for(table)["bubble_ratio"]


def zb_sizes():
    return st.integers(1, 8).flatmap(
        lambda p: st.tuples(st.just(p), st.integers(1, 3 * p + 2)))


@pytest.mark.parametrize("family,factor", [("zb-h1", 1), ("zb-h2", 2)])
@given(size=zb_sizes(), forward=TIMES, input_grad=TIMES, weight_grad=TIMES)
def test_zb_handcrafted_properties(family, factor, size, forward, input_grad, weight_grad):
    p, n = size
    table = generate(family, devices=p, microbatches=n)
    unit = assert_table_basics(table, p, p, n, lambda stage: stage)
    assert [d.peak_memory for d in unit.devices] == [min(n, factor * (p - 1) + 1)] * p
    costs = UnitCosts(f=forward, i=input_grad, w=weight_grad)
    formula = formula_for(table, costs)
    assert formula["peak_activation"] == [min(n, factor * (p - 1) + 1)] * p
    expected = (p - 1) * (forward + input_grad - factor * weight_grad)
    assert formula["bubble_time"] == pytest.approx(max(expected, 0.0))
    result = evaluate(table, costs)
    assert result.bubble_ratio >= formula["bubble_ratio"] - 1e-12
    exact = n >= 2 * p and weight_grad <= min(forward, input_grad)
    if exact:
        work = n * (forward + input_grad + weight_grad)
        measured = result.bubble_ratio if factor == 1 else span_bubble(table, result, work)
        assert measured == pytest.approx(formula["bubble_ratio"], abs=1e-12)


# ------------------------------------------------------------------------ ZB-V
ZBV_4_8 = """
d0: F0 F1 F2 F3 F4 F5 F6 f0 b0 w0 f1 b1 w1 f2 b2 w2 f3 b3 w3 F7 B0 W0 f4 b4 w4 B1 W1 f5 b5 w5 B2 W2 f6 b6 w6 B3 W3 f7 b7 w7 B4 W4 B5 W5 B6 W6 B7 W7 .  .  .
d1: .  F0 F1 F2 F3 F4 f0 F5 f1 b0 w0 f2 b1 w1 f3 b2 w2 F6 B0 W0 f4 b3 w3 F7 B1 W1 f5 b4 w4 B2 W2 f6 b5 w5 B3 W3 f7 b6 w6 B4 b7 B5 W4 B6 W5 B7 W6 w7 W7 .  .
d2: .  .  F0 F1 F2 f0 F3 f1 F4 f2 b0 w0 f3 b1 w1 F5 B0 W0 f4 b2 w2 F6 B1 W1 f5 b3 w3 F7 B2 W2 f6 b4 w4 B3 W3 f7 b5 w5 B4 b6 B5 b7 B6 W4 B7 W5 w6 w7 W6 W7 .
d3: .  .  .  F0 f0 F1 f1 F2 f2 F3 f3 b0 w0 F4 B0 W0 f4 b1 w1 F5 B1 W1 f5 b2 w2 F6 B2 W2 f6 b3 w3 F7 B3 W3 f7 b4 w4 B4 b5 B5 b6 B6 b7 B7 W4 w5 w6 w7 W5 W6 W7
"""


def test_zbv_matches_schedules_md():
    table = generate("zbv", devices=4, microbatches=8, chunks=2)
    result = assert_starts(table, parse_grid(ZBV_4_8, v_op(4), UNIT))
    assert result.makespan == 51 and round(result.bubble_ratio, 3) == 0.059
    assert [d.peak_memory for d in result.devices] == [8] * 4  # p devices' worth, 2 chunks each


@given(zb_sizes())
def test_zbv_properties(size):
    p, n = size
    table = generate("zbv", devices=p, microbatches=n)
    result = assert_table_basics(table, p, 2 * p, n, v_placement(p))
    formula = formula_for(table)
    peaks = [d.peak_memory for d in result.devices]
    # Observed (not published): below M = 2p-1 device d holds M+1+d at most.
    assert peaks == [min(2 * p, 2 * n, n + 1 + d) for d in range(p)]
    assert all(peak <= bound for peak, bound in zip(peaks, formula["peak_activation"]))
    assert formula["bubble_ratio"] == 0.0 and result.bubble_ratio >= 0
    if n >= 2 * p - 1:
        assert peaks == formula["peak_activation"] == [2 * p] * p
        assert span_bubble(table, result, 6 * n) == 0
        assert result.bubble_ratio == pytest.approx((p - 1) / (6 * n + p - 1))


def test_zbv_has_no_closed_form_for_unequal_times():
    table = generate("zbv", devices=4, microbatches=8)
    formula = formula_for(table, UnitCosts(f=1, i=1, w=0.5))
    assert formula["bubble_ratio"] is None and "F = I = W" in formula["note"]


# --------------------------------------------------------------- V-Half, V-Min
V_HALF_4_8 = """
VH d0: F0 F1 F2 F3 F4 .  .  f0 b0 w0 f1 b1 w1 f2 .  .  B0 b2 w2 f3 W0 F5 B1 b3 w3 f4 W1 F6 B2 b4 w4 f5 W2 F7 B3 b5 w5 f6 b6 w6 B4 W3 W4 f7 b7 B5 w7 B6 W5 W6 .  B7 W7
VH d1: .  F0 F1 F2 F3 .  f0 .  f1 b0 w0 f2 b1 w1 .  B0 W0 F4 f3 b2 w2 B1 W1 F5 f4 b3 w3 B2 W2 F6 f5 b4 w4 B3 F7 W3 f6 b5 w5 B4 b6 w6 f7 W4 B5 b7 B6 w7 W5 W6 B7 W7 .
VH d2: .  .  F0 F1 F2 f0 .  f1 .  f2 b0 w0 F3 b1 B0 w1 W0 f3 F4 .  B1 b2 w2 f4 W1 F5 B2 b3 w3 f5 W2 F6 B3 b4 w4 f6 W3 F7 B4 b5 w5 f7 b6 B5 w6 B6 b7 w7 W4 B7 W5 W6 W7
VH d3: .  .  .  F0 f0 F1 f1 F2 f2 .  .  b0 w0 B0 W0 F3 f3 b1 w1 B1 W1 F4 f4 b2 w2 B2 W2 F5 f5 b3 w3 B3 F6 W3 f6 b4 B4 w4 F7 W4 f7 b5 B5 b6 B6 w5 w6 b7 B7 w7 W5 W6 W7
"""
V_MIN_4_8 = """
VM d0: F0 F1 F2 .  .  .  .  f0 b0 w0 f1 b1 w1 .  .  B0 W0 F3 .  f2 b2 B1 w2 W1 F4 f3 b3 B2 w3 W2 F5 f4 b4 B3 w4 W3 F6 f5 b5 B4 w5 W4 F7 f6 b6 B5 w6 W5 .  f7 b7 B6 w7 W6 .  .  .  B7 W7
VM d3: .  .  .  F0 f0 F1 f1 .  .  .  .  b0 B0 w0 W0 F2 f2 b1 B1 w1 W1 F3 f3 b2 B2 w2 W2 F4 f4 b3 B3 w3 W3 F5 f5 b4 B4 w4 W4 F6 f6 b5 B5 w5 W5 F7 f7 b6 B6 w6 W6 .  .  b7 B7 w7 W7 .  .
"""


@pytest.mark.parametrize("family,grid,makespan,bubble,peak", [
    ("v-half", V_HALF_4_8, 53, 0.094, 6),
    ("v-min", V_MIN_4_8, 59, 0.186, 4),
])
def test_v_schedules_reproduce_the_authors_output(family, grid, makespan, bubble, peak):
    table = generate(family, devices=4, microbatches=8, chunks=2)
    result = assert_starts(table, parse_grid(grid, v_op(4), UNIT))
    assert result.makespan == makespan and round(result.bubble_ratio, 3) == bubble
    assert result.peak_memory == peak


@pytest.mark.parametrize("family,makespan,bubble,peak", [
    ("v-half", 113, 0.150, 10),  # (8+2)//2 = 5 device activations
    ("v-min", 123, 0.220, 8),    # (8+4)//3 = 4 device activations
])
def test_v_schedules_match_the_authors_numbers_at_p8_m16(family, makespan, bubble, peak):
    result = evaluate(generate(family, devices=8, microbatches=16))
    assert result.makespan == makespan and round(result.bubble_ratio, 3) == bubble
    assert result.peak_memory == peak


def test_v_building_blocks():
    assert block_offsets("v-half", 4) == [(0, 10, 14, 25), (2, 9, 16, 24), (4, 8, 18, 23),
                                          (6, 7, 20, 22)]
    assert block_offsets("v-min", 3) == [(0, 5, 8, 13), (1, 4, 9, 12), (2, 3, 10, 11)]
    # Lists: F chunk 0, F chunk 1, I chunk 1, I chunk 0 [, W]. Without W's, an idle
    # slot releases a pending W: F I . F I holds 1, F I F I holds 2.
    assert peak_memory([[0], [3], [1], [4]]) == 1
    assert peak_memory([[0], [2], [1], [3]]) == 2
    # With explicit W's only they release: F I W F I holds 1, F I . F I W holds 2.
    assert peak_memory([[0], [3], [1], [4], [2]]) == 1
    assert peak_memory([[0], [3], [1], [4], [5]]) == 2
    # Two blocks: F F I I . F F I I -> 2, 2, 2, 2, 1, 2, 3, 3, 3.
    assert peak_memory([[0, 5], [1, 6], [2, 7], [3, 8]]) == 3


def v_sizes():
    return st.tuples(st.integers(1, 10), st.integers(1, 32))


@pytest.mark.parametrize("family,device_peak", [("v-half", lambda p: (p + 2) // 2),
                                                ("v-min", lambda p: (p + 4) // 3)])
@given(size=v_sizes())
def test_v_schedule_properties(family, device_peak, size):
    p, n = size
    table = generate(family, devices=p, microbatches=n)
    result = assert_table_basics(table, p, 2 * p, n, v_placement(p))
    formula = formula_for(table)
    stated = min(2 * device_peak(p), 2 * n)  # device activations are two chunks each
    assert formula["peak_activation"] == [stated] * p
    assert result.peak_memory == stated
    assert all(device.peak_memory <= stated for device in result.devices)
    assert formula["bubble_ratio"] is None and formula["approximate_bubble_ratio"] > 0
    # Never better than the start skew, never worse than 1F1B.
    assert (p - 1) / (6 * n + p - 1) - 1e-12 <= result.bubble_ratio
    assert result.bubble_ratio <= (p - 1) / (n + p - 1) + 1e-12


# ------------------------------------------------------------------ errors, CLI
@pytest.mark.parametrize("family,params,message", [
    ("zbv", dict(chunks=3), r"zbv: chunks must be 2, not 3 \(the V placement puts stages r "
                            r"and 2p-1-r on device r\)"),
    ("v-half", dict(chunks=1), r"v-half: chunks must be 2, not 1"),
    ("v-min", dict(chunks=4), r"v-min: chunks must be 2, not 4"),
    ("v-min", dict(microbatches=0), r"v-min: microbatches must be >= 1, not 0"),
    ("zb-h1", dict(chunks=2), r"zb-h1 does not take chunks; its parameters are devices, "
                              r"microbatches"),
    ("zb-h2", dict(devices=0), r"zb-h2: devices must be >= 1, not 0"),
])
def test_rejects(family, params, message):
    with pytest.raises(InvalidParameterError, match=message):
        generate(family, **{"devices": 4, "microbatches": 8, **params})


@pytest.mark.parametrize("argv,message", [
    (["zbv", "-p", "4", "-m", "8", "--chunks", "3"], "zbv: chunks must be 2, not 3"),
    (["v-half", "-p", "4", "-m", "8", "--chunks", "1"], "v-half: chunks must be 2, not 1"),
    (["v-min", "-p", "4", "-m", "8", "-v", "4"], "v-min: chunks must be 2, not 4"),
    (["zb-h1", "-p", "4", "-m", "8", "--chunks", "2"], "zb-h1 does not take --chunks"),
    (["zb-h2", "-p", "0", "-m", "8"], "zb-h2: devices must be >= 1, not 0"),
])
def test_cli_rejects(cli, argv, message):
    code, out, err = cli("eval", *argv)
    assert code == 1 and out == "" and message in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("family,first", [("zb-h1", "0I0"), ("zb-h2", "0I0"), ("zbv", "7F0"),
                                          ("v-half", "7F0"), ("v-min", "7F0")])
def test_cli_shows_and_evaluates(cli, family, first):
    code, out, _ = cli("show", family, "-p", "4", "-m", "8", "--width", "120")
    assert code == 0 and out.startswith(f"{family} devices=4 microbatches=8")
    assert first in out and "d3" in out
    code, out, _ = cli("eval", family, "-p", "4", "-m", "8")
    assert code == 0 and "makespan" in out


# ---------------------------------------------------------------- golden files
GOLDEN = {
    "zb-h1": ("zb-h1_p4_m8.csv", ZB_H1_4_8, one_chunk_op, False),
    "zb-h2": ("zb-h2_p4_m8.csv", ZB_H2_4_8, one_chunk_op, False),
    "zbv": ("zbv_p4_m8.csv", ZBV_4_8, v_op(4), True),
    "v-half": ("v-half_p4_m8.csv", V_HALF_4_8, v_op(4), True),
    "v-min": ("v-min_p4_m8.csv", V_MIN_4_8, v_op(4), True),
}


@pytest.mark.parametrize("family", sorted(GOLDEN))
def test_golden_files(golden, family):
    name, grid, op_of, exact = GOLDEN[family]
    path = golden(name)
    table = generate(family, devices=4, microbatches=8)
    assert to_csv(table, drop_metadata=True).encode() == path.read_bytes()
    # Verified against SCHEDULES.md: cell for cell where the grid is the authors' own
    # output (the list index is the slot), op order where it is a simulation.
    stored = read_table(path)
    rows = parse_grid(grid, op_of, UNIT)
    if exact:
        for device, row in rows.items():
            cells = stored.rows[device]
            assert {slot: op for op, slot in row} == {
                slot: cell for slot, cell in enumerate(cells) if cell is not None}
    else:
        assert_orders(stored, rows)


def test_v_schedules_every_size_up_to_p12_m40():
    """The greedy reorder is the riskiest generator: run it on every small size."""
    for family, device_peak in [("v-half", lambda p: (p + 2) // 2),
                                ("v-min", lambda p: (p + 4) // 3)]:
        for p in range(1, 13):
            for n in range(1, 41):
                result = evaluate(generate(family, devices=p, microbatches=n))
                assert result.peak_memory == min(2 * device_peak(p), 2 * n), (family, p, n)
                assert result.bubble_ratio <= (p - 1) / (n + p - 1) + 1e-12, (family, p, n)


def _zb_h_loop(p, n, r, c):
    """The authors' get_hand_schedule loop for device r, op by op (the oracle)."""
    warmup = min(c * (p - r - 1), n)
    order = [("F", m) for m in range(warmup)]
    weights = 0
    for i in range(n):
        if warmup + i < n:
            order.append(("F", warmup + i))
        order.append(("I", i))
        if i >= c * r:
            order.append(("W", weights))
            weights += 1
    return order + [("W", m) for m in range(weights, n)]


def _zbv_loop(p, n, r):
    """The authors' get_zb_v_schedule loop for device r, op by op (the oracle)."""
    total, order = max(2 * p - 1, n), []
    count = dict.fromkeys([(k, c) for k in "FIW" for c in (0, 1)], 0)

    def run(kind, chunk):
        order.append((kind, chunk, count[kind, chunk]))
        count[kind, chunk] += 1
    for _ in range(2 * (p - r) - 1):
        run("F", 0)
    for _ in range(r):
        run("F", 1), run("F", 0)
    for _ in range(p - r):
        run("F", 1), run("I", 1), run("W", 1)
    while count["F", 1] < count["F", 0] or count["F", 0] < total:
        if count["F", 0] < total:
            run("F", 0)
        run("I", 0), run("W", 0), run("F", 1), run("I", 1), run("W", 1)
    for _ in range(r):
        run("I", 0), run("I", 1)
    for _ in range(p - r):
        run("I", 0), run("W", 0)
    while count["W", 1] < count["I", 1]:
        run("W", 1)
    while count["W", 0] < count["I", 0]:
        run("W", 0)
    return [op for op in order if op[2] < n]


@pytest.mark.parametrize("devices", [1, 2, 3, 4, 5, 8, 13])
def test_the_column_builders_follow_the_authors_loops(devices):
    """zb-h1, zb-h2 and zbv build each device's order as arrays, phase by phase; the
    op-by-op loops of the authors' code give the same order at every size."""
    from tabsched.schedules import zb_handcrafted, zbv
    for n in list(range(1, 3 * devices + 3)) + [64]:
        for r in range(devices):
            for c in (1, 2):
                assert zb_handcrafted.device_order(devices, n, r, c) == _zb_h_loop(
                    devices, n, r, c)
            assert zbv.device_order(devices, n, r) == _zbv_loop(devices, n, r)
        table = generate("zbv", devices=devices, microbatches=n)
        for r in range(devices):
            stages = zbv.v_stages(devices, r)
            assert [(op.kind, op.stage, op.microbatch) for op in table.rows[r] if op] == [
                (kind, stages[chunk], m) for kind, chunk, m in _zbv_loop(devices, n, r)]


def _reorder_op_by_op(slots, with_weights):
    """V schedule reorder as the authors' loop runs it: every op in slot order, the
    phase followed op by op (the oracle of v_shape.reorder, which marks the ops that
    only hold their slots at once)."""
    from tabsched._build import slot_peak
    from tabsched.schedules import v_shape
    slots = [v_shape.fill_weights(lists, split=False) if with_weights
             else [list(t) for t in lists] for lists in slots]
    microbatches = len(slots[0][v_shape.F0])
    grids = [v_shape._kind_grid(lists) for lists in slots]
    explicit = len(slots[0]) > 4
    budget = max(slot_peak(grid, explicit) for grid in grids)
    occupied = [set() for _ in slots]
    phase = "warm-up"
    for time, device, kind, microbatch in v_shape._in_slot_order(slots):
        if phase == "warm-up" and kind == v_shape.I0 and device == 0:
            phase = "steady"
        if phase == "steady" or (phase == "warm-up" and not with_weights):
            if phase == "steady" and kind == v_shape.F0 and microbatch == microbatches - 1:
                phase = "cool-down"
            occupied[device].add(time)
            continue
        earliest = v_shape._dependencies(slots, device, kind, microbatch, len(slots)) + 1
        lists, grid = slots[device], grids[device]
        for slot in range(earliest, time):
            if slot not in occupied[device]:
                grid[lists[kind][microbatch]] = v_shape.IDLE
                grid[slot] = kind
                lists[kind][microbatch] = slot
                if slot_peak(grid, explicit) <= budget:
                    break
        else:
            grid[lists[kind][microbatch]] = v_shape.IDLE
            grid[time] = kind
            lists[kind][microbatch] = time
        occupied[device].add(lists[kind][microbatch])
    if not with_weights:
        slots = [v_shape.fill_weights(lists, split=False) for lists in slots]
    return v_shape.squeeze(slots)


@given(variant=st.sampled_from(["v-half", "v-min"]), devices=st.integers(1, 9),
       microbatches=st.integers(1, 20))
def test_v_reorder_equals_the_op_by_op_loop(variant, devices, microbatches):
    from tabsched.schedules import v_shape
    blocks = block_offsets(variant, devices)
    slots = [[list(range(offset, offset + 6 * microbatches, 6)) for offset in offsets]
             for offsets in blocks]
    first = v_shape.reorder(slots, with_weights=True)
    assert first == _reorder_op_by_op(slots, True)
    first = [lists[:4] for lists in first]
    assert v_shape.reorder(first, with_weights=False) == _reorder_op_by_op(first, False)
    # the slot order's columns are the sorted tuples
    time, device, kind, microbatch = v_shape._slot_order(first)[:4]
    assert list(zip(time.tolist(), device.tolist(), kind.tolist(), microbatch.tolist())) \
        == v_shape._in_slot_order(first)
