"""Formula level vs table level for Chimera, BitPipe, DualPipe, DualPipeV and Hanayo.

Property tests over each family's valid parameters: the table validates and
evaluates without deadlock, every stage runs every microbatch forward once,
the unit-cost bubble equals the formula where the formula says it is exact
(and otherwise relates to it as the source explains), and the unit-cost
activation peaks match the stated ones.
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tabsched import StageCosts, UnitCosts, evaluate, formula_for, generate
from tabsched.table import FORWARD


def check_table(table, stages, microbatches):
    assert table.num_stages == stages and table.num_microbatches == microbatches
    forwards = np.bincount(table.stage[table.kind == FORWARD], minlength=stages)
    assert forwards.tolist() == [microbatches] * stages


def peaks(result):
    return [device.peak_memory for device in result.devices]


# ------------------------------------------------------------------ Chimera
@st.composite
def chimera_params(draw):
    devices = draw(st.sampled_from([2, 4, 6, 8, 12]))
    variant = draw(st.sampled_from(["direct", "doubling"]))
    half = devices // 2
    pipelines = 2
    if variant == "direct":
        pipelines = 2 * draw(st.sampled_from([f for f in range(1, half + 1) if half % f == 0]))
    unit = devices if variant == "direct" else 2 * devices
    return dict(devices=devices, microbatches=unit * draw(st.integers(1, 3)), variant=variant,
                pipelines=pipelines)


@given(chimera_params(), st.integers(1, 3), st.integers(1, 3))
def test_chimera_properties(params, f, b):
    table = generate("chimera", **params)
    D, N = params["devices"], params["microbatches"]
    check_table(table, D, N)
    assert table.params["variant"] == params["variant"]
    result = evaluate(table, UnitCosts(f=f, b=b))
    formula = result.formula
    if params["pipelines"] == 2:
        assert formula["bubble_ratio"] == pytest.approx((D - 2) / (2 * N + D - 2))
        if formula["exact"]:
            assert result.bubble_ratio == pytest.approx(formula["bubble_ratio"], abs=1e-12)
        else:
            assert result.bubble_ratio >= formula["bubble_ratio"] - 1e-12
        assert formula["exact"] == (f == b or (params["variant"] == "doubling" and b == 2 * f))
    else:
        assert formula["bubble_ratio"] is None and "pipelines" in formula["note"]
        f_ = params["pipelines"] // 2
        if f == b:   # what the note says the table gives at F = B
            expected = (D / f_ - 2) / (2 * N + D / f_ - 2)
            assert result.bubble_ratio == pytest.approx(expected, abs=1e-12)
    # memory: per worker within [D/2+1, D] stage activations; doubling twice that
    low, high = D // 2 + 1, D
    if params["variant"] == "doubling":
        low, high = 2 * low, 2 * high
    assert low <= min(peaks(result)) and max(peaks(result)) <= high
    if params["pipelines"] == 2 and params["variant"] == "direct":
        assert (min(peaks(result)), max(peaks(result))) == (low, high)
        assert formula["peak_activation_bounds"] == (low, high)


def test_chimera_activations_per_worker():
    result = evaluate(generate("chimera", devices=8, microbatches=16), UnitCosts(f=1, b=2))
    assert peaks(result) == [5, 6, 7, 8, 8, 7, 6, 5]
    result = evaluate(generate("chimera", devices=8, microbatches=16, variant="doubling"),
                      UnitCosts(f=1, b=2))
    assert peaks(result) == [13, 14, 15, 16, 16, 15, 14, 13]


# ------------------------------------------------------------------ BitPipe
@given(st.sampled_from([2, 4, 6, 8, 10]), st.integers(1, 3), st.integers(1, 3))
def test_bitpipe_properties(devices, units, b):
    N = devices * units
    table = generate("bitpipe", devices=devices, microbatches=N)
    check_table(table, 2 * devices, N)
    result = evaluate(table, UnitCosts(f=1, b=b))
    assert result.formula["bubble_ratio"] is None and result.formula["peak_activation"] is None
    if b == 1:   # SCHEDULES.md §9 [I]: the code order gives (D-2)/(4N+D-2) at F = B
        assert result.bubble_ratio == pytest.approx((devices - 2) / (4 * N + devices - 2),
                                                    abs=1e-12)
    # §9 [I]: 7,8,8,7 at P=4 and 13..16 at P=8, i.e. 3P/2+1+min(d, P-1-d)
    assert peaks(result) == [3 * devices // 2 + 1 + min(d, devices - 1 - d)
                             for d in range(devices)]


# ------------------------------------------------------- DualPipe, DualPipeV
@given(st.sampled_from([2, 4, 6, 8, 10]), st.integers(0, 4), st.sampled_from(["fused", "serial"]),
       st.integers(1, 3))
def test_dualpipe_properties(devices, extra, pairs, scale):
    N = 2 * devices + 2 * extra
    table = generate("dualpipe", devices=devices, microbatches=N, pairs=pairs)
    check_table(table, devices, N)
    assert table.placement() == {s: tuple(sorted({s, devices - 1 - s})) for s in range(devices)}
    costs = UnitCosts(f=scale, b=2 * scale, i=scale, w=scale)
    result = evaluate(table, costs)
    formula = result.formula
    bubble_time = (devices // 2 - 1) * (3 * scale + 2 * scale - 3 * scale)
    assert formula["bubble_time"] == pytest.approx(bubble_time)
    if pairs == "fused":
        assert formula["exact"]
        assert result.bubble_ratio == pytest.approx(formula["bubble_ratio"], abs=1e-12)
        assert [d.idle for d in result.devices] == pytest.approx([bubble_time] * devices)
    else:   # the README counts a pair as one block; run serially, pairs idle less
        assert not formula["exact"]
        assert result.bubble_ratio <= formula["bubble_ratio"] + 1e-12
    assert peaks(result) == formula["peak_activation"] == [devices + 1] * devices


@given(st.integers(1, 8), st.integers(0, 5), st.sampled_from(["fused", "serial"]),
       st.integers(1, 3))
def test_dualpipev_properties(devices, extra, pairs, scale):
    N = 2 * devices + extra
    table = generate("dualpipev", devices=devices, microbatches=N, pairs=pairs)
    check_table(table, 2 * devices, N)
    result = evaluate(table, UnitCosts(f=scale, b=2 * scale, i=scale, w=scale))
    formula = result.formula
    assert formula["bubble_time"] == pytest.approx((devices - 1) * 2 * scale)
    if pairs == "fused":
        assert result.bubble_ratio == pytest.approx(formula["bubble_ratio"], abs=1e-12)
    else:
        assert result.bubble_ratio <= formula["bubble_ratio"] + 1e-12
    assert peaks(result) == formula["peak_activation"] == [2 * devices + 1] * devices


def test_dualpipe_formula_is_not_exact_for_other_ratios():
    table = generate("dualpipe", devices=8, microbatches=16)
    result = evaluate(table, UnitCosts(f=1, b=3, i=2, w=1))
    assert not result.formula["exact"]
    # README (PP/2-1)(F&B+B-3W) = 3 x (4+3-3) = 12, but every device idles 11
    assert result.formula["bubble_time"] == 12
    assert [d.idle for d in result.devices] == [11] * 8
    faster = evaluate(table, UnitCosts(f=1, b=2, i=1, w=1, overlap=0.7))
    assert not faster.formula["exact"]
    # with a shorter pair the README's bubble is the middle ranks' idle time
    assert max(d.idle for d in faster.devices) == pytest.approx(faster.formula["bubble_time"])


# ------------------------------------------------------------------ Hanayo
def hanayo_table_level(P, W, f, b):
    """The paper's order at M = P without communication idles (P-1) max(T_F, T_B)/W per
    device: SCHEDULES.md §11 [I] states it for T_B >= T_F, where it is T_B."""
    t_f, t_b = 2 * W * f, 2 * W * b
    idle = (P - 1) * max(t_f, t_b) / W
    return idle / (idle + P * (t_f + t_b))


@given(st.integers(1, 8), st.integers(1, 4), st.integers(1, 24), st.integers(1, 3),
       st.integers(1, 3))
def test_hanayo_properties(P, W, M, f, b):
    table = generate("hanayo", devices=P, microbatches=M, waves=W)
    check_table(table, 2 * P * W, M)
    result = evaluate(table, UnitCosts(f=f, b=b))
    formula = result.formula
    # beyond M = P memory grows with M: the last device holds every activation
    assert peaks(result)[-1] == 2 * W * M
    if M == P and P >= 2:
        eq1 = (b / W) / ((P / (P - 1)) * f + (1 / (2 * W) + P / (P - 1)) * b)
        assert formula["bubble_ratio"] == pytest.approx(eq1)
        assert result.bubble_ratio == pytest.approx(hanayo_table_level(P, W, f, b), abs=1e-12)
        if b >= f:   # they disagree: Eq. 1 is above the table (below it when F > B)
            assert result.bubble_ratio < formula["bubble_ratio"]
        assert formula["exact"] is False
        low, high = formula["peak_activation_bounds"]
        assert max(peaks(result)) == high == 2 * W * P
        if W == 1:
            assert min(peaks(result)) == low
        else:   # the paper's minimum is not reached: the table's is lower
            assert min(peaks(result)) < low
    else:
        assert formula["bubble_ratio"] is None and formula["peak_activation"] is None
        assert "M = P" in formula["note"] or "P >= 2" in formula["note"]


@pytest.mark.parametrize("P,W,value", [(4, 1, 0.400), (4, 2, 0.2222), (4, 4, 0.1176)])
def test_hanayo_eq1_values(P, W, value):
    formula = formula_for(generate("hanayo", devices=P, microbatches=P, waves=W),
                          UnitCosts(f=1, b=2))
    assert formula["bubble_ratio"] == pytest.approx(value, abs=5e-5)
    assert formula["bubble_ratio"] == pytest.approx((2 * P - 2) / (3 * P * W + P - 1))


def test_hanayo_eq1_takes_communication_from_the_costs():
    table = generate("hanayo", devices=4, microbatches=4, waves=1)
    quiet = formula_for(table, StageCosts(1.0, 2.0))
    loud = formula_for(table, StageCosts(1.0, 2.0, comm=0.5))
    assert quiet["bubble_ratio"] == pytest.approx(0.4)
    t_f, t_b, t_c = 2.0, 4.0, 0.5
    expected = ((t_b + (1 + 2 + 0.5 + 2 / 3) * t_c)
                / ((4 / 3) * t_f + (0.5 + 4 / 3) * t_b + (1 + 4) * t_c))
    assert loud["bubble_ratio"] == pytest.approx(expected)


def test_hanayo_beyond_the_papers_regime_is_said():
    formula = formula_for(generate("hanayo", devices=4, microbatches=8, waves=2))
    assert formula["bubble_ratio"] is None
    assert "M = P = 4 only" in formula["note"] and "32 chunk activations" in formula["note"]
