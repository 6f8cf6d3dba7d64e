"""Variation models: distributions, expectations, their order in a sum, and fitting
(the keyed draws: test_adapt_streams.py; replay: test_adapt_replay.py)."""

import numpy as np
import pytest

from tabsched import InvalidParameterError, ModelCosts, StageCosts, UnitCosts, generate
from tabsched.adapt import (Combined, Noise, Replay, SlowLink, Straggler, VariationContext,
                            estimate_variation)
from tabsched.adapt.variation import parse_iterations
from tabsched.lower import lower
from tabsched.nodes import OPTIMIZER, TRANSFER

PAPER = ModelCosts("paper-128l", "mid_nw_mid_cp", recompute="full")


def context_of(table, costs, **options):
    return VariationContext(lower(table, contention=costs.contention), costs, **options)


def on_the_link(transfers, a, b):
    """Mask of the transfers between devices a and b, either way."""
    src, dst = transfers.src, transfers.dst
    return ((src == a) & (dst == b)) | ((src == b) & (dst == a))


def test_no_variation_is_the_cost_model_to_the_bit():
    table = generate("interleaved-1f1b", devices=4, microbatches=8, chunks=2)
    context = context_of(table, PAPER)
    lowered = context.lowered
    np.testing.assert_array_equal(context.mean_durations(None), PAPER.node_durations(lowered))
    drawn = context.sample_durations(None, np.arange(3))
    np.testing.assert_array_equal(drawn, np.repeat(PAPER.node_durations(lowered)[None], 3, 0))


def test_overlapped_cells_keep_the_overlap_factor():
    table = generate("dualpipev", devices=4, microbatches=8)
    costs = StageCosts(1.0, comm=0.5, overlap=0.8)
    context = context_of(table, costs)
    np.testing.assert_array_equal(context.mean_durations(Noise(0.3)),
                                  costs.node_durations(context.lowered))


@pytest.mark.parametrize("cv", [0.05, 0.3])
def test_noise_has_mean_one_and_the_given_cv(cv):
    table = generate("1f1b", devices=4, microbatches=16)
    context = context_of(table, UnitCosts(1, 1, 1, 1))   # each duration is its factor
    cells = slice(0, context.lowered.num_cells)
    factors = context.sample_durations(Noise(cv), np.arange(4000))[:, cells]
    assert factors.mean() == pytest.approx(1.0, abs=4 * cv / np.sqrt(factors.size))
    assert factors.std() == pytest.approx(cv, rel=0.02)
    assert np.all(factors > 0)


def test_noise_per_kind_and_per_stage():
    table = generate("zb-h1", devices=4, microbatches=8)
    noise = Noise(0.1, kinds={"W": 0.0, "F": 0.2}, stages={3: 0.0})
    cv = noise.op_cv(table)
    assert np.all(cv[table.stage == 3] == 0.0)
    assert np.all(cv[(table.kind == 3) & (table.stage < 3)] == 0.0)
    assert np.all(cv[(table.kind == 0) & (table.stage < 3)] == 0.2)
    assert np.all(cv[(table.kind == 2) & (table.stage < 3)] == 0.1)
    context = context_of(table, UnitCosts())
    drawn = context.sample_durations(noise, np.arange(50))
    ops = context.lowered.cell_of_op
    steady = (table.kind == 3) | (table.stage == 3)
    assert np.all(drawn[:, ops[steady]] == 1.0)
    assert np.all(drawn[:, ops[~steady]] != 1.0)
    assert Noise(0.0, kinds={"F": 0.0}).random is False and noise.random


def test_transfer_noise_only_touches_transfers():
    table = generate("1f1b", devices=4, microbatches=8)
    context = context_of(table, StageCosts(1.0, comm=0.5))
    drawn = context.sample_durations(Noise(transfers=0.2), np.arange(400))
    cells = context.lowered.num_cells
    assert np.all(drawn[:, :cells] == context.nominal[:cells])
    sends = drawn[:, context.lowered.nodes(TRANSFER)] / 0.5
    assert sends.mean() == pytest.approx(1.0, abs=0.01)
    assert sends.std() == pytest.approx(0.2, rel=0.05)


def test_straggler_scales_its_device_and_optimizer_step():
    table = generate("1f1b", devices=4, microbatches=8)
    lowered = lower(table, optimizer=True)
    costs = StageCosts(1.0, comm=0.5, optimizer=2.0)
    context = VariationContext(lowered, costs)
    mean = context.mean_durations(Straggler(2, 1.5))
    ratio = mean / costs.node_durations(lowered)
    devices = lowered.node_device
    assert np.all(ratio[devices == 2] == 1.5)
    assert np.all(ratio[devices != 2] == 1.0)
    assert mean[lowered.nodes(OPTIMIZER)][2] == 3.0


def test_slow_link_stretches_bytes_not_latency():
    table = generate("1f1b", devices=8, microbatches=8)
    context = context_of(table, PAPER)
    lowered = context.lowered
    mean = context.mean_durations(SlowLink((3, 4), 3.0))
    transfers = lowered.transfers
    sends = mean[lowered.nodes(TRANSFER)]
    bandwidth, latency = PAPER.system.link_matrices(8)
    _, nbytes = PAPER.transfer_costs(table, transfers)
    on_link = on_the_link(transfers, 3, 4)
    assert on_link.sum() == 16
    expected = latency[3, 4] + 3.0 * nbytes[on_link] / bandwidth[3, 4]
    np.testing.assert_allclose(sends[on_link], expected, rtol=1e-15)
    np.testing.assert_array_equal(sends[~on_link], context.nominal[lowered.num_cells:][~on_link])
    assert sends[on_link][0] < 3.0 * context.nominal[lowered.num_cells:][on_link][0]


def test_latency_spikes_hit_with_their_probability():
    table = generate("1f1b", devices=4, microbatches=16)
    context = context_of(table, StageCosts(1.0, comm=0.5))
    link = SlowLink((1, 2), 1.0, latency_spike=2.0, spike_probability=0.25)
    assert link.random
    drawn = context.sample_durations(link, np.arange(2000))
    lowered = context.lowered
    transfers = lowered.transfers
    on_link = on_the_link(transfers, 1, 2)
    sends = drawn[:, lowered.nodes(TRANSFER)][:, on_link]
    assert set(np.unique(sends)) == {0.5, 2.5}
    assert (sends == 2.5).mean() == pytest.approx(0.25, abs=0.01)
    mean = context.mean_durations(link)[lowered.nodes(TRANSFER)][on_link]
    assert np.all(mean == 0.5 + 0.25 * 2.0)


def test_models_act_only_in_their_iterations():
    table = generate("1f1b", devices=4, microbatches=8)
    lowered = lower(table)
    costs = StageCosts(1.0, comm=0.5)
    straggler = Straggler(1, 2.0, iterations="3-4")
    for iteration, slowed in [(2, False), (3, True), (4, True), (5, False)]:
        context = VariationContext(lowered, costs, iteration=iteration)
        changed = not np.array_equal(context.mean_durations(straggler), context.nominal)
        assert changed == slowed


@pytest.mark.parametrize("build,message", [
    (lambda: Noise(-0.1), r"^cv must be >= 0, not -0.1$"),
    (lambda: Noise(0.1, kinds={"X": 0.1}), r"noise kinds: 'X' is not one of F, B, I, W"),
    (lambda: Noise(0.1, transfers=-1), r"transfer cv must be >= 0, not -1"),
    (lambda: Straggler(-1, 2.0), r"straggler device must be a device number >= 0, not -1"),
    (lambda: Straggler(1, 0.0), r"straggler factor must be > 0, not 0.0"),
    (lambda: SlowLink((2, 2), 3.0), r"slow link 2-2: a link joins two different devices"),
    (lambda: SlowLink((1,), 3.0), r"slow link devices must be two devices"),
    (lambda: SlowLink((1, 2), 3.0, spike_probability=2), r"spike probability must be between"),
    (lambda: parse_iterations("a-b"), r"iterations 'a-b': expected numbers and ranges"),
    (lambda: parse_iterations([-1]), r"iterations must be >= 0, not -1"),
    (lambda: Combined(Noise(0.1), 3), r"Combined takes variation models, not int"),
])
def test_parameter_errors(build, message):
    with pytest.raises(InvalidParameterError, match=message):
        build()


@pytest.mark.parametrize("variation,message", [
    (Straggler(9, 1.5), r"^straggler on device 9, but the table has devices 0..7$"),
    (SlowLink((3, 8), 3.0),
     r"^slow link 3-8: device 8 does not exist \(the table has devices 0..7\)$"),
    (Noise(0.1, stages={9: 0.1}),
     r"^noise: stage 9 is out of range \(the table has stages 0..7\)$"),
])
def test_models_check_the_table(variation, message):
    table = generate("1f1b", devices=8, microbatches=8)
    context = context_of(table, UnitCosts())
    with pytest.raises(InvalidParameterError, match=message):
        context.sample_durations(variation, [0])


def test_combined_applies_replay_then_links_then_noise():
    combined = Noise(0.1) + Straggler(1, 2.0) + Replay({"0F0": [1.0]})
    assert [type(part).__name__ for part in combined.parts] == ["Replay", "Straggler", "Noise"]
    assert (Noise(0.1) + None) is not None and combined.random


def test_estimate_recovers_stragglers_links_and_noise():
    table = generate("1f1b", devices=8, microbatches=32)
    context = context_of(table, PAPER, seed=5)
    truth = Straggler(2, 1.4) + SlowLink((3, 4), 3.0) + Noise(0.1)
    observed = context.sample_durations(truth, [0])[0]
    fitted = estimate_variation(context, observed)
    stragglers = {part.device: part.factor for part in fitted.parts if isinstance(part, Straggler)}
    links = {part.devices: part.bandwidth_factor for part in fitted.parts
             if isinstance(part, SlowLink)}
    noise = [part for part in fitted.parts if isinstance(part, Noise)][0]
    assert stragglers[2] == pytest.approx(1.4, rel=0.05)
    assert stragglers[5] == pytest.approx(1.0, rel=0.05)
    assert links[3, 4] == pytest.approx(3.0, rel=1e-9)
    assert links[0, 1] == pytest.approx(1.0, rel=1e-9)
    assert noise.cv == pytest.approx(0.1, rel=0.2) and noise.transfers < 1e-9


@pytest.mark.parametrize("build,message", [
    (lambda: Straggler(1, "slow"), r"^straggler factor must be a number, not 'slow'$"),
    (lambda: Straggler(True, 2.0), r"straggler device must be a device number >= 0, not True"),
    (lambda: Noise(0.1, kinds={"F": -0.1}), r"^cv of kind F must be >= 0, not -0.1$"),
    (lambda: Noise(0.1, stages=[0.1, -0.2]), r"^cv of stage 1 must be >= 0, not -0.2$"),
    (lambda: Noise(0.1, stages={-1: 0.1}), r"noise stage must be a device number >= 0, not -1"),
    (lambda: SlowLink((1, 2), 0.0), r"^slow link bandwidth factor must be > 0, not 0.0$"),
    (lambda: SlowLink((1, 2), 2.0, latency_spike=-1e-3), r"^latency spike must be >= 0"),
    (lambda: parse_iterations(3), r"^iterations must be iteration numbers, not 3$"),
])
def test_more_parameter_errors(build, message):
    with pytest.raises(InvalidParameterError, match=message):
        build()
