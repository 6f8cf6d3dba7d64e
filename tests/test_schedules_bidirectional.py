"""Chimera, BitPipe, DualPipe, DualPipeV and Hanayo against the worked tables of SCHEDULES.md.

Each worked table is compared by its op order per device and its length
(makespan at the unit costs it states). Idle positions are not compared: the
grids of §8-§11 are simulations of the authors' orders or official figures
whose idle slots differ from as-soon-as-possible execution (BitPipe, §9).
"""

import json
import pathlib

import pytest

from tabsched import DeadlockError, UnitCosts, evaluate, generate
from tabsched.schedules.chimera import grid_orders, phase_orders
from tabsched.table import Op

DATA = pathlib.Path(__file__).resolve().parent / "data"


def grid_rows(grid):
    """``{device: [token, ...]}`` of a SCHEDULES.md grid (labels ``d0:``, ``P1:``, ``r0:``...).

    A multi-slot op is printed once per slot: consecutive equal tokens are one op.
    Returns the op tokens per device and the grid's length in slots.
    """
    rows, length = {}, 0
    for line in grid.strip().splitlines():
        label, *tokens = line.split()
        length = max(length, len(tokens))
        ops = []
        for k, token in enumerate(tokens):
            if token != "." and (k == 0 or tokens[k - 1] != token):
                ops.append(token)
        rows[label.rstrip(":")] = ops
    return rows, length


def assert_order_and_length(table, grid, to_op, device_of, costs, makespan=None):
    """Every listed device runs the grid's ops in the grid's order; same makespan
    (the grid's length unless the grid shows no idle slots and ``makespan`` says it)."""
    rows, length = grid_rows(grid)
    orders = table.orders()
    for label, tokens in rows.items():
        device = device_of(label)
        expected = [to_op(device, token) for token in tokens]
        assert [tuple(cell) if isinstance(cell, Op) else cell for cell in orders[device]] \
            == [tuple(op) for op in expected], label
    result = evaluate(table, costs)
    assert result.makespan == (length if makespan is None else makespan)
    return result


def d_label(label):
    return int(label[1:])


# ------------------------------------------------------------------ Chimera §8
CHIMERA_4_4_EQUAL = """
d0: F0 F1 .  F2 B2 F3 B3 B0 .  B1
d1: .  F0 F2 F1 F3 B2 B0 B3 B1 .
d2: .  F2 F0 F3 F1 B0 B2 B1 B3 .
d3: F2 F3 .  F0 B0 F1 B1 B2 .  B3
"""
CHIMERA_4_4_DOUBLE_B = """
d0: F0 F1 .  F2 B2 B2 F3 B3 B3 .  B0 B0 .  .  B1 B1
d1: .  F0 F2 F1 F3 .  B2 B2 B0 B0 B3 B3 B1 B1 .  .
"""
CHIMERA_4_8_DIRECT = """
d0: F0 F1 .  F2 B2 F3 B3 B0 F4 B1 F5 F6 B6 F7 B7 B4 .  B5
d1: .  F0 F2 F1 F3 B2 B0 B3 B1 F4 F6 F5 F7 B6 B4 B7 B5 .
d2: .  F2 F0 F3 F1 B0 B2 B1 B3 F6 F4 F7 F5 B4 B6 B5 B7 .
d3: F2 F3 .  F0 B0 F1 B1 B2 F6 B3 F7 F4 B4 F5 B5 B6 .  B7
"""
CHIMERA_4_8_DOUBLING = """
d0: F0 F1 F2 F3 F4 F5 B4 B4 F6 F7 B5 B5 .  B0 B0 B6 B6 B1 B1 B7 B7 B2 B2 .  .  B3 B3
d3: F4 F5 F6 F7 F0 F1 B0 B0 F2 F3 B1 B1 .  B4 B4 B2 B2 B5 B5 B3 B3 B6 B6 .  .  B7 B7
"""
# §11: Chimera as the Hanayo paper draws it (P=8, M=8), an official figure (order only).
CHIMERA_8_8_HANAYO_FIGURE = """
d0: F0 F1 F2 F3 F4 B4 F5 B5 F6 B6 F7 B7 B0 B1 B2 B3
d1: F0 F1 F2 F4 F3 F5 B4 F6 B5 F7 B6 B0 B7 B1 B2 B3
d2: F0 F1 F4 F2 F5 F3 F6 B4 F7 B5 B0 B6 B1 B7 B2 B3
d3: F0 F4 F1 F5 F2 F6 F3 F7 B4 B0 B5 B1 B6 B2 B7 B3
d4: F4 F0 F5 F1 F6 F2 F7 F3 B0 B4 B1 B5 B2 B6 B3 B7
d5: F4 F5 F0 F6 F1 F7 F2 B0 F3 B1 B4 B2 B5 B3 B6 B7
d6: F4 F5 F6 F0 F7 F1 B0 F2 B1 F3 B2 B4 B3 B5 B6 B7
d7: F4 F5 F6 F7 F0 B0 F1 B1 F2 B2 F3 B3 B4 B5 B6 B7
"""


def chimera_op(D, unit):
    """Grid token -> Op: microbatches in the first half of their unit go down."""
    def to_op(device, token):
        microbatch = int(token[1:])
        down = microbatch % unit < unit // 2
        return Op(token[0], device if down else D - 1 - device, microbatch)
    return to_op


@pytest.mark.parametrize("devices,microbatches,variant,grid,f,b", [
    (4, 4, "direct", CHIMERA_4_4_EQUAL, 1, 1),
    (4, 4, "direct", CHIMERA_4_4_DOUBLE_B, 1, 2),
    (4, 8, "direct", CHIMERA_4_8_DIRECT, 1, 1),
    (4, 8, "doubling", CHIMERA_4_8_DOUBLING, 1, 2),
])
def test_chimera_worked_tables(devices, microbatches, variant, grid, f, b):
    table = generate("chimera", devices=devices, microbatches=microbatches, variant=variant)
    unit = devices if variant == "direct" else 2 * devices
    result = assert_order_and_length(table, grid, chimera_op(devices, unit), d_label,
                                     UnitCosts(f=f, b=b))
    assert table.family == "chimera" and table.params["variant"] == variant
    if (microbatches, f, b) == (4, 1, 1):
        assert result.bubble_ratio == pytest.approx(0.20)
    if variant == "doubling":
        assert result.bubble_ratio == pytest.approx(3 / 27)


def test_chimera_as_the_hanayo_paper_draws_it():
    table = generate("chimera", devices=8, microbatches=8)
    result = assert_order_and_length(table, CHIMERA_8_8_HANAYO_FIGURE, chimera_op(8, 8),
                                     d_label, UnitCosts(f=1, b=1), makespan=22)
    assert result.bubble_ratio == pytest.approx(6 / 22)
    assert evaluate(table, UnitCosts(f=1, b=2)).makespan == 36


@pytest.mark.parametrize("devices,microbatches,variant,f,b,makespan,bubble", [
    (4, 8, "direct", 1, 2, 30, 0.200),       # SCHEDULES.md §8 bubble table
    (8, 16, "direct", 1, 2, 66, 0.2727),
    (4, 8, "direct", 1, 3, 42, 0.2381),
    (8, 16, "direct", 1, 1, 38, 0.1579),
    (4, 16, "doubling", 1, 3, 70, 0.0857),
    (8, 16, "doubling", 1, 2, 57, 0.1579),
])
def test_chimera_bubble_table(devices, microbatches, variant, f, b, makespan, bubble):
    table = generate("chimera", devices=devices, microbatches=microbatches, variant=variant)
    result = evaluate(table, UnitCosts(f=f, b=b))
    assert result.makespan == makespan
    assert result.bubble_ratio == pytest.approx(bubble, abs=5e-5)


@pytest.mark.parametrize("devices,microbatches", [(2, 2), (4, 4), (4, 12), (6, 12), (8, 24)])
def test_chimera_code_grid_equals_the_phase_rule_for_two_pipelines(devices, microbatches):
    # chimera_pipeline_rank.py's slot grid and main_with_runtime_direct.py's phases agree
    grid = [[op[:3] for op in order] for order in grid_orders(devices, microbatches, 2)]
    assert grid == phase_orders(devices, microbatches, "direct")


def test_chimera_more_pipelines_rotate_the_replicas():
    table = generate("chimera", devices=8, microbatches=8, pipelines=4)
    assert table.params["pipelines"] == 4
    # pipeline k is rotated by k*D/f = 4 workers: stage 0 runs on workers 0, 4 (down)
    # and 7, 3 (up): four replicas per stage, one per pipeline
    assert table.placement()[0] == (0, 3, 4, 7)
    assert all(len(devices) == 4 for devices in table.placement().values())
    assert evaluate(table, UnitCosts(f=1, b=1)).makespan == 18   # 2D + D/f - 2


# --------------------------------------------------------------- BitPipe §9
BITPIPE_4_4_FIGURE = """
P1: F1 .  F2 F3 f3 F4 f4 f1 b1 b1 f2 .  b2 b2 b3 b3 B3 B3 b4 b4 B4 B4 B1 B1 .  .  B2 B2
P2: .  F1 F3 F2 F4 f3 f1 f4 f2 .  b1 b1 b3 b3 b2 b2 b4 b4 B3 B3 B1 B1 B4 B4 B2 B2 .  .
P3: .  F3 F1 F4 F2 f1 f3 f2 f4 .  b3 b3 b1 b1 b4 b4 b2 b2 B1 B1 B3 B3 B2 B2 B4 B4 .  .
P4: F3 .  F4 F1 f1 F2 f2 f3 b3 b3 f4 .  b4 b4 b1 b1 B1 B1 b2 b2 B2 B2 B3 B3 .  .  B4 B4
"""


def bitpipe_op(P):
    def to_op(device, token):
        microbatch = int(token[1:]) - 1            # the figure counts from 1
        down = microbatch % P < P // 2
        upper = token[0].isupper()                 # upper case: stage < P
        stage = {(True, True): device, (True, False): 2 * P - 1 - device,
                 (False, True): P - 1 - device, (False, False): P + device}[down, upper]
        return Op(token[0].upper(), stage, microbatch)
    return to_op


def test_bitpipe_official_figure():
    table = generate("bitpipe", devices=4, microbatches=4)
    result = assert_order_and_length(table, BITPIPE_4_4_FIGURE, bitpipe_op(4),
                                     lambda label: int(label[1:]) - 1, UnitCosts(f=1, b=2))
    assert result.bubble_ratio == pytest.approx(4 / 28)
    assert [d.peak_memory for d in result.devices] == [7, 8, 8, 7]


@pytest.mark.parametrize("devices,microbatches,makespan,bubble", [
    (4, 8, 54, 0.1111), (8, 8, 60, 0.2000), (8, 16, 114, 0.1579)])
def test_bitpipe_numbers(devices, microbatches, makespan, bubble):
    result = evaluate(generate("bitpipe", devices=devices, microbatches=microbatches),
                      UnitCosts(f=1, b=2))
    assert result.makespan == makespan
    assert result.bubble_ratio == pytest.approx(bubble, abs=5e-5)


def test_bitpipe_placement_is_two_v_shaped_replicas():
    table = generate("bitpipe", devices=4, microbatches=4)
    placement = table.placement()
    # down V: stages 0..3 on devices 0..3, 4..7 back on 3..0; up V mirrored
    assert [placement[s] for s in range(8)] == [(0, 3), (1, 2), (1, 2), (0, 3),
                                                (0, 3), (1, 2), (1, 2), (0, 3)]


# --------------------------------------------------------------- DualPipe §10
DUALPIPEV_4_8 = """
d0: F0 F1 F2 F3 F4 F5 F6 f0 b0 w0 f1 b1 w1 f2 b2 w2 f3 F7 x3 x3 f4 X0 X0 x4 x4 f5 .  X1 X1 x5 x5 f6 .  X2 X2 x6 x6 f7 .  X3 X3 x7 x7 B4 W4 B5 W5 B6 W6 B7 W7
d1: .  F0 F1 F2 F3 F4 f0 F5 f1 b0 w0 f2 b1 w1 f3 F6 x2 x2 f4 X0 X0 F7 x3 x3 f5 X1 X1 x4 x4 f6 .  X2 X2 x5 x5 f7 .  X3 X3 x6 x6 X4 X4 b7 B5 w7 B6 W5 B7 W6 W7
d2: .  .  F0 F1 F2 f0 F3 f1 F4 f2 b0 w0 f3 F5 x1 x1 f4 X0 X0 F6 x2 x2 f5 X1 X1 F7 x3 x3 f6 X2 X2 x4 x4 f7 .  X3 X3 x5 x5 X4 X4 x6 x6 B5 b7 B6 W5 B7 w7 W6 W7
d3: .  .  .  F0 f0 F1 f1 F2 f2 F3 f3 F4 x0 x0 f4 X0 X0 F5 x1 x1 f5 X1 X1 F6 x2 x2 f6 X2 X2 F7 x3 x3 f7 X3 X3 x4 x4 X4 X4 x5 x5 X5 X5 b6 B6 b7 B7 w6 W6 w7 W7
"""
DUALPIPE_4_8 = """
d0: F0 F1 F2 f0 b0 w0 f1 F3 x1 x1 f2 X0 X0 x2 x2 f3 .  X1 X1 x3 x3 B2 W2 B3 W3
d1: .  F0 f0 F1 f1 F2 x0 x0 f2 X0 X0 F3 x1 x1 f3 X1 X1 x2 x2 X2 X2 b3 B3 w3 W3
d2: .  f0 F0 f1 F1 f2 X0 X0 F2 x0 x0 f3 X1 X1 F3 x1 x1 X2 X2 x2 x2 B3 b3 W3 w3
d3: f0 f1 f2 F0 B0 W0 F1 f3 X1 X1 F2 x0 x0 X2 X2 F3 .  x1 x1 X3 X3 b2 w2 b3 w3
"""
KINDS = {"F": "F", "B": "I", "W": "W", "X": "B"}   # SCHEDULES.md: B = input-grad, X = full


def dualpipev_op(p):
    def to_op(device, token):
        stage = device if token[0].isupper() else 2 * p - 1 - device
        return Op(KINDS[token[0].upper()], stage, int(token[1:]))
    return to_op


def dualpipe_op(PP, microbatches):
    def to_op(device, token):
        replica_a = token[0].isupper()
        stage = device if replica_a else PP - 1 - device
        offset = 0 if replica_a else microbatches // 2
        return Op(KINDS[token[0].upper()], stage, offset + int(token[1:]))
    return to_op


def test_dualpipev_worked_table_with_serial_pairs():
    table = generate("dualpipev", devices=4, microbatches=8, pairs="serial")
    result = assert_order_and_length(table, DUALPIPEV_4_8, dualpipev_op(4), d_label,
                                     UnitCosts(f=1, b=2, i=1, w=1))
    assert result.bubble_ratio == pytest.approx(3 / 51)
    assert [d.peak_memory for d in result.devices] == [9] * 4


def test_dualpipe_worked_table_with_serial_pairs():
    table = generate("dualpipe", devices=4, microbatches=8, pairs="serial")
    result = assert_order_and_length(table, DUALPIPE_4_8, dualpipe_op(4, 8), d_label,
                                     UnitCosts(f=1, b=2, i=1, w=1))
    assert result.bubble_ratio == pytest.approx(1 / 25)
    assert [d.peak_memory for d in result.devices] == [5] * 4


@pytest.mark.parametrize("family,devices,microbatches,bubble", [
    ("dualpipev", 8, 16, 0.068), ("dualpipev", 8, 32, 0.035),
    ("dualpipe", 8, 16, 0.059), ("dualpipe", 8, 32, 0.030)])
def test_dualpipe_simulated_bubbles(family, devices, microbatches, bubble):
    table = generate(family, devices=devices, microbatches=microbatches, pairs="serial")
    result = evaluate(table, UnitCosts(f=1, b=2, i=1, w=1))
    assert result.bubble_ratio == pytest.approx(bubble, abs=5e-4)


def test_dualpipev_equals_pytorch_schedule_dualpipev():
    data = json.loads((DATA / "pytorch_dualpipev_orders.json").read_text())
    assert len(data["orders"]) >= 8
    for size, ranks in data["orders"].items():
        devices, microbatches = map(int, size.split(","))
        table = generate("dualpipev", devices=devices, microbatches=microbatches)
        assert [[str(cell) for cell in order] for order in table.orders()] == ranks, size


def test_dualpipe_pairs_are_overlapped_cells_whose_length_is_a_cost():
    table = generate("dualpipe", devices=4, microbatches=8)
    row = [str(cell) for cell in table.orders()[0]]
    assert "(0F3;3B5)OVERLAP_F_B" in row          # <F0 B1>: replica A forward, B backward
    full = evaluate(table, UnitCosts(f=1, b=2, i=1, w=1))
    faster = evaluate(table, UnitCosts(f=1, b=2, i=1, w=1, overlap=0.7))
    assert full.makespan == 26 and faster.makespan < full.makespan
    # the middle ranks run their first pair unoverlapped (DeepSeek's note)
    assert [str(cell) for cell in table.orders()[1]][4:6] == ["1F2", "2B4"]


def test_dualpipe_replicas_sync_gradients():
    table = generate("dualpipe", devices=4, microbatches=8)
    assert table.placement() == {0: (0, 3), 1: (1, 2), 2: (1, 2), 3: (0, 3)}
    result = evaluate(table, UnitCosts(f=1, b=2, sync=5), grad_sync="replicas")
    assert result.makespan > evaluate(table, UnitCosts(f=1, b=2)).makespan
    assert any(step.kind == "sync" for step in result.critical_path)


# ---------------------------------------------------------------- Hanayo §11
HANAYO_4_4_W1 = """
P0: F0 F1 F2 F3 .  .  .  f0 b0 b0 f1 b1 b1 f2 b2 b2 f3 b3 b3 .  .  .  B0 B0 .  .  B1 B1 .  .  B2 B2 .  .  B3 B3
P1: .  F0 F1 F2 .  .  f0 F3 f1 .  b0 b0 f2 b1 b1 f3 b2 b2 .  .  B0 B0 b3 b3 B1 B1 .  .  B2 B2 .  .  B3 B3 .  .
P2: .  .  F0 F1 .  f0 F2 f1 F3 f2 .  .  b0 b0 f3 b1 b1 .  B0 B0 b2 b2 B1 B1 b3 b3 B2 B2 .  .  B3 B3 .  .  .  .
P3: .  .  .  F0 f0 F1 f1 F2 f2 F3 f3 .  .  .  b0 b0 B0 B0 b1 b1 B1 B1 b2 b2 B2 B2 b3 b3 B3 B3 .  .  .  .  .  .
"""
# Figure order for P=4, W=2, M=4 (Fm.c: microbatch m on local chunk c; Fa-b.c: a..b)
HANAYO_4_4_W2 = {
    0: "F0-3.0 F0.1 F0.2 F1.1 F1.2 F2.1 F2.2 F3.1 F3.2 F0.3 B0.3 F1.3 B1.3 F2.3 B2.3 F3.3 "
       "B3.3 B0.2 B0.1 B1.2 B1.1 B2.2 B2.1 B3.2 B3.1 B0-3.0",
    1: "F0-2.0 F0.1 F3.0 F1.1 F0.2 F2.1 F1.2 F3.1 F2.2 F0.3 F3.2 F1.3 B0.3 F2.3 B1.3 F3.3 "
       "B2.3 B0.2 B3.3 B1.2 B0.1 B2.2 B1.1 B3.2 B2.1 B0.0 B3.1 B1.0 B2.0 B3.0",
}


def hanayo_stage(P, device, chunk):
    return chunk * P + device if chunk % 2 == 0 else (chunk + 1) * P - 1 - device


def test_hanayo_worked_table_one_wave():
    table = generate("hanayo", devices=4, microbatches=4, waves=1)

    def to_op(device, token):
        return Op(token[0].upper(), hanayo_stage(4, device, 0 if token[0].isupper() else 1),
                  int(token[1:]))

    result = assert_order_and_length(table, HANAYO_4_4_W1, to_op, lambda label: int(label[1:]),
                                     UnitCosts(f=1, b=2))
    assert result.bubble_ratio == pytest.approx(1 / 3)
    assert evaluate(table, UnitCosts(f=1, b=1)).makespan == 22


def test_hanayo_figure_order_two_waves():
    table = generate("hanayo", devices=4, microbatches=4, waves=2)
    for device, text in HANAYO_4_4_W2.items():
        expected = []
        for token in text.split():
            kind, rest = token[0], token[1:]
            micro, chunk = rest.split(".")
            first, _, last = micro.partition("-")
            for microbatch in range(int(first), int(last or first) + 1):
                expected.append(Op(kind, hanayo_stage(4, device, int(chunk)), microbatch))
        assert table.orders()[device] == expected, device
    result = evaluate(table, UnitCosts(f=1, b=2))
    assert result.makespan == 60 and result.bubble_ratio == pytest.approx(0.20)


@pytest.mark.parametrize("devices,waves,makespan", [(8, 2, 124), (4, 4, 108)])
def test_hanayo_paper_figure_sizes(devices, waves, makespan):
    # Fig. 6(a): 124 units for 96 of work per device; Fig. 6(b): about 108 for 96
    result = evaluate(generate("hanayo", devices=devices, microbatches=devices, waves=waves),
                      UnitCosts(f=1, b=2))
    assert result.makespan == makespan
    assert result.devices[0].busy == 96


def test_hanayo_placement_snakes_down_and_up():
    table = generate("hanayo", devices=3, microbatches=3, waves=2)
    placement = table.placement()
    assert [placement[s][0] for s in range(12)] == [0, 1, 2, 2, 1, 0, 0, 1, 2, 2, 1, 0]


# -------------------------------------------------- no deadlock beyond the examples
@pytest.mark.parametrize("family,sizes", [
    ("chimera", [dict(devices=d, microbatches=k * d) for d in (2, 4, 6) for k in (1, 2)]),
    ("bitpipe", [dict(devices=d, microbatches=k * d) for d in (2, 4, 6) for k in (1, 2)]),
    ("dualpipe", [dict(devices=d, microbatches=m) for d in (2, 4) for m in (2 * d, 2 * d + 2)]),
    ("dualpipev", [dict(devices=d, microbatches=m) for d in (1, 3) for m in (2 * d, 2 * d + 1)]),
    ("hanayo", [dict(devices=d, microbatches=m, waves=w) for d in (1, 3) for m in (1, 4)
                for w in (1, 3)]),
])
def test_small_sizes_never_deadlock(family, sizes):
    for params in sizes:
        try:
            evaluate(generate(family, **params), UnitCosts(f=1, b=3, i=2, w=1))
        except DeadlockError as error:  # pragma: no cover - reported with its size
            pytest.fail(f"{family} {params}: {error}")


# --------------------------------------------------------- invalid parameters
INVALID = [
    ("chimera", dict(devices=5, microbatches=10),
     r"chimera: devices must be even \(the down and up pipelines split every worker's "
     r"microbatches\), not 5; try 4 or 6"),
    ("chimera", dict(devices=4, microbatches=6),
     r"chimera: variant 'direct' runs units of devices = 4 microbatches, so microbatches must "
     r"be a multiple of 4 \(e.g. 4 or 8\), not 6"),
    ("chimera", dict(devices=4, microbatches=4, variant="doubling"),
     r"variant 'doubling' runs units of 2 x devices = 8 microbatches, so microbatches must be "
     r"a multiple of 8 \(e.g. 8 or 16\), not 4"),
    ("chimera", dict(devices=4, microbatches=4, variant="halving"),
     r"chimera: variant must be one of direct, doubling, not 'halving'"),
    ("chimera", dict(devices=8, microbatches=8, pipelines=6),
     r"chimera: pipelines must be 2f with f dividing devices/2 = 4 \(f down and f up "
     r"pipelines\), i.e. one of 2, 4, 8; not 6"),
    ("chimera", dict(devices=8, microbatches=16, variant="doubling", pipelines=4),
     r"chimera: forward doubling is defined for two pipelines only; use variant='direct' with "
     r"pipelines=4, or pipelines=2"),
    ("bitpipe", dict(devices=3, microbatches=6),
     r"bitpipe: devices must be even \(each unit sends P/2 microbatches each way\), not 3; "
     r"try 2 or 4"),
    ("bitpipe", dict(devices=4, microbatches=6),
     r"bitpipe: microbatches must be a multiple of devices = 4 \(units of P/2 per direction\), "
     r"e.g. 4 or 8; not 6"),
    ("dualpipe", dict(devices=3, microbatches=8),
     r"dualpipe: devices must be even \(rank r pairs with rank PP-1-r\), not 3; try 2 or 4"),
    ("dualpipe", dict(devices=4, microbatches=6),
     r"dualpipe: microbatches must be even and at least 2 x devices = 8 \(half go each way\), "
     r"e.g. 8; not 6"),
    ("dualpipe", dict(devices=4, microbatches=9),
     r"dualpipe: microbatches must be even and at least 2 x devices = 8 \(half go each way\), "
     r"e.g. 10; not 9"),
    ("dualpipe", dict(devices=4, microbatches=8, pairs="overlap"),
     r"dualpipe: pairs must be one of fused, serial, not 'overlap'"),
    ("dualpipev", dict(devices=4, microbatches=7),
     r"dualpipev: microbatches must be at least 2 x devices = 8 \(the number of stages\), "
     r"not 7"),
    ("dualpipev", dict(devices=4, microbatches=8, pairs=1),
     r"dualpipev: pairs must be one of fused, serial, not 1"),
    ("hanayo", dict(devices=4, microbatches=4, waves=0), r"hanayo: waves must be >= 1, not 0"),
    ("hanayo", dict(devices=8, microbatches=8, waves=8, layers=64),
     r"hanayo: 64 layers cannot fill the table's 128 stages \(every stage needs at least one "
     r"layer\); use at least 128 layers or waves <= 4"),
    ("hanayo", dict(devices=4, microbatches=4, chunks=2),
     r"hanayo does not take chunks; its parameters are devices, microbatches, waves"),
]


@pytest.mark.parametrize("family,params,message", INVALID)
def test_invalid_parameters_say_what_is_valid(family, params, message):
    from tabsched import InvalidParameterError
    with pytest.raises(InvalidParameterError, match=message):
        generate(family, **params)


def test_every_new_family_has_an_error_case():
    assert {family for family, _, _ in INVALID} == {"chimera", "bitpipe", "dualpipe",
                                                    "dualpipev", "hanayo"}


# ----------------------------------------------------------------- golden files
GOLDEN_FILES = [
    ("chimera_p4_m8.csv", "chimera", dict(devices=4, microbatches=8)),
    ("bitpipe_p4_m4.csv", "bitpipe", dict(devices=4, microbatches=4)),
    ("dualpipe_p4_m8.csv", "dualpipe", dict(devices=4, microbatches=8)),
    ("dualpipev_p4_m8.csv", "dualpipev", dict(devices=4, microbatches=8)),
    ("hanayo_p4_m4_w2.csv", "hanayo", dict(devices=4, microbatches=4, waves=2)),
]


@pytest.mark.parametrize("name,family,params", GOLDEN_FILES)
def test_golden_files(golden, name, family, params):
    from tabsched import read_table
    from tabsched.io import to_csv
    table = generate(family, **params)
    path = golden(name)
    assert to_csv(table, drop_metadata=True).encode() == path.read_bytes()
    stored = read_table(path, family=family)   # a CSV holds no family: the replicas need it
    assert stored.rows == table.rows and stored.num_stages == table.num_stages


def test_chimera_golden_file_is_the_equal_slot_grid_of_schedules_md(golden):
    # at unit slots the layout is SCHEDULES.md §8's F = B grid, idle cells included
    lines = golden("chimera_p4_m8.csv").read_text().splitlines()
    to_op = chimera_op(4, 4)
    for device, (line, grid) in enumerate(zip(lines, CHIMERA_4_8_DIRECT.strip().splitlines())):
        cells = line.split(",")
        tokens = grid.split()[1:]
        assert [cell or "." for cell in cells] == \
            ["." if token == "." else str(to_op(device, token)) for token in tokens]


def _chimera_phase_loop(D, N, variant):
    """The phase rule op by op, a counter per (kind, direction) (the oracle)."""
    from tabsched.schedules.chimera import _microbatch
    H, unit = D // 2, D if variant == "direct" else 2 * D
    repeat, extra_p4 = (1, 0) if variant == "direct" else (2, H)
    orders = []
    for r in range(D):
        a = H - r if r < H else r - H + 1
        b, home = H - a, 0 if r < H else 1
        other, taken, order = 1 - home, {}, []

        def op(kind, direction, count=1):
            for _ in range(count):
                k = taken.get((kind, direction), 0)
                taken[kind, direction] = k + 1
                order.append((kind, direction, _microbatch(direction, k, unit)))
        for u in range(N // unit):
            for _ in range(a):
                if u:
                    op("B", home)
                op("F", home, repeat)
            for _ in range(b):
                op("F", other, repeat), op("F", home, repeat)
            for _ in range(a):
                op("F", other, repeat), op("B", other)
            for _ in range(b + extra_p4):
                op("B", home), op("B", other)
        for _ in range(a):
            op("B", home)
        orders.append(order)
    return orders


@pytest.mark.parametrize("devices", [2, 4, 6, 8, 12])
@pytest.mark.parametrize("variant", ["direct", "doubling"])
def test_chimera_phase_columns_follow_the_phase_loop(devices, variant):
    unit = devices if variant == "direct" else 2 * devices
    for microbatches in (unit, 2 * unit, 5 * unit):
        assert phase_orders(devices, microbatches, variant) == _chimera_phase_loop(
            devices, microbatches, variant)
