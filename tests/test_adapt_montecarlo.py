"""Monte Carlo: reproducible to the bit, chunk-free, consistent with evaluate()."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tabsched import InvalidParameterError, ModelCosts, StageCosts, evaluate, generate
from tabsched._testing import random_table
from tabsched.adapt import Noise, SlowLink, Straggler, VariationContext, monte_carlo
from tabsched import engine
from tabsched.adapt.montecarlo import link_chains
from tabsched.lower import lower

PAPER = ModelCosts("paper-128l", "slow_nw_mid_cp", recompute="full")


def chunked(table, costs, variation, *, samples, seed, chunk_bytes):
    """Monte Carlo by numpy draws in chunks and the summary pass (no fused pass)."""
    from tabsched.adapt.montecarlo import run_monte_carlo
    from tabsched.evaluate import lower_for
    context = VariationContext(lower_for(table, costs), costs, seed=seed)
    return run_monte_carlo(context, variation, samples=samples, chunk_bytes=chunk_bytes,
                           fused=False)


def test_same_seed_same_bits_whatever_the_chunks():
    table = generate("1f1b", devices=8, microbatches=32)
    variation = Noise(0.1, transfers=0.05) + SlowLink((3, 4), 3.0)
    first = monte_carlo(table, PAPER, variation, samples=300, seed=11)
    again = monte_carlo(table, PAPER, variation, samples=300, seed=11)
    small = chunked(table, PAPER, variation, samples=300, seed=11, chunk_bytes=200_000)
    assert first.makespans.tobytes() == again.makespans.tobytes()
    assert small.chunks > 1 and first.chunks == 1
    # the fused pass draws what numpy draws chunk by chunk, to the bit
    assert small.makespans.tobytes() == first.makespans.tobytes()
    assert small.to_dict()["devices"] == first.to_dict()["devices"]
    prefix = monte_carlo(table, PAPER, variation, samples=50, seed=11)
    assert prefix.makespans.tobytes() == first.makespans[:50].tobytes()
    other = monte_carlo(table, PAPER, variation, samples=300, seed=12)
    assert other.mean != first.mean


def test_statistics_come_from_the_samples():
    table = generate("zb-h1", devices=4, microbatches=8)
    runs = monte_carlo(table, StageCosts(1.0, comm=0.3), Noise(0.2), samples=400, seed=1)
    m = runs.makespans
    assert (runs.mean, runs.p50, runs.p95, runs.max) == (
        m.mean(), np.percentile(m, 50), np.percentile(m, 95), m.max())
    assert runs.statistic("p95") == runs.p95
    with pytest.raises(InvalidParameterError, match=r"objective 'p99' is not one of mean, p95"):
        runs.statistic("p99")
    data = runs.to_dict()
    assert data["runtime_bubble"] == runs.mean - runs.nominal_makespan
    assert len(data["devices"]) == 4 and data["samples"] == 400


@pytest.mark.parametrize("family", ["1f1b", "zb-h1", "chimera", "interleaved-1f1b"])
def test_without_variation_it_is_evaluate(family):
    params = {"chunks": 2} if family == "interleaved-1f1b" else {}
    table = generate(family, devices=4, microbatches=8, **params)
    costs = ModelCosts("paper-128l", "mid_nw_mid_cp", recompute="full")
    result = evaluate(table, costs, optimizer=True)
    runs = monte_carlo(table, costs, None, samples=3, optimizer=True)
    assert runs.nominal_makespan == result.makespan
    assert np.all(runs.makespans == result.makespan)
    for stats, device in zip(result.devices, runs.devices):
        assert device.nominal_idle == pytest.approx(stats.idle, rel=1e-12, abs=1e-15)
        assert device.mean_finish == pytest.approx(result.makespan - stats.cooldown,
                                                   rel=1e-12)


def test_the_bubble_is_measured_against_mean_durations():
    table = generate("1f1b", devices=8, microbatches=32)
    slow = SlowLink((3, 4), 3.0)
    runs = monte_carlo(table, PAPER, slow + Straggler(2, 1.2), samples=4)
    # deterministic models move the reference, not the bubble
    assert runs.runtime_bubble == 0.0
    assert runs.nominal_makespan > evaluate(table, PAPER).makespan
    noisy = monte_carlo(table, PAPER, slow + Noise(0.1), samples=200, seed=2)
    assert noisy.nominal_makespan == monte_carlo(table, PAPER, slow, samples=1).nominal_makespan
    assert noisy.runtime_bubble > 0
    per_device = np.array([d.runtime_bubble for d in noisy.devices])
    busy = np.array([d.mean_busy for d in noisy.devices])
    nominal_busy = noisy.nominal_makespan - np.array([d.nominal_idle for d in noisy.devices])
    np.testing.assert_allclose(per_device, noisy.runtime_bubble - (busy - nominal_busy),
                               rtol=1e-9)


def test_the_sample_mean_converges_as_the_cv_goes_to_zero():
    table = generate("1f1b", devices=8, microbatches=32)
    gaps = []
    for cv in (0.2, 0.05, 0.01, 0.001, 0.0):
        runs = monte_carlo(table, PAPER, Noise(cv) + SlowLink((3, 4), 3.0), samples=200, seed=4)
        gaps.append(abs(runs.mean - runs.nominal_makespan) / runs.nominal_makespan)
    assert gaps == sorted(gaps, reverse=True)
    # cv = 0: every sample is the nominal makespan; their mean equals it up to the
    # rounding of a sum of 200 equal floats
    assert gaps[-2] < 1e-4 and gaps[-1] < 1e-15


@settings(max_examples=30)
@given(seed=st.integers(0, 2**32 - 1), contention=st.sampled_from(["none", "link"]))
def test_the_mean_makespan_is_at_least_the_makespan_of_the_mean(seed, contention):
    # Under contention none and link the makespan is a convex, non-decreasing function
    # of the durations (a longest path; a link's FIFO order is fixed by its sender's
    # row), so Jensen holds for the samples themselves: the mean of the makespans is at
    # least the makespan of the samples' mean durations.
    table = random_table(seed)
    costs = StageCosts(1.0, comm=0.25, contention=contention)
    variation = Noise(0.3, transfers=0.3)
    runs = monte_carlo(table, costs, variation, samples=64, seed=seed)
    context = VariationContext(lower(table, contention=contention), costs, seed=seed)
    drawn = context.sample_durations(variation, np.arange(64))
    np.testing.assert_array_equal(context.lowered.run_summary(drawn)[0], runs.makespans)
    at_mean = context.lowered.run_summary(drawn.mean(axis=0))[0][0]
    assert runs.mean >= at_mean * (1 - 1e-12)


@pytest.mark.parametrize("kwargs,message", [
    ({"samples": 0}, r"samples must be an integer >= 1, not 0"),
    ({"chunk_bytes": 0}, r"chunk_bytes must be an integer >= 1, not 0"),
    ({"seed": -1}, r"seed must be an integer >= 0, not -1"),
])
def test_monte_carlo_errors(kwargs, message):
    table = generate("1f1b", devices=2, microbatches=2)
    with pytest.raises(InvalidParameterError, match=message):
        monte_carlo(table, None, Noise(0.1), **kwargs)


def test_monte_carlo_rejects_what_is_not_a_model():
    table = generate("1f1b", devices=2, microbatches=2)
    with pytest.raises(InvalidParameterError, match=r"variation must be a variation model"):
        monte_carlo(table, None, 0.1)
    with pytest.raises(InvalidParameterError, match=r"costs must be a cost model"):
        monte_carlo(table, "paper-128l")
    with pytest.raises(InvalidParameterError, match=r"table must be a ScheduleTable"):
        monte_carlo([["0F0", "0B0"]])


@given(seed=st.integers(0, 2**32 - 1), tail=st.booleans(), blocking=st.booleans())
def test_link_contention_as_chains_is_the_fifo_exactly(seed, tail, blocking):
    table = random_table(seed)
    lowered = lower(table, contention="link", blocking_sends=blocking,
                    grad_sync="all" if tail else None, optimizer=tail)
    chained = link_chains(lowered)
    rng = np.random.default_rng(seed)
    durations = rng.exponential(1.0, size=(3, lowered.num_nodes)) + 1e-3
    durations[:, lowered.num_cells:] *= rng.integers(0, 2, size=lowered.num_nodes
                                                     - lowered.num_cells)  # zero transfers too
    if chained is None:
        assert len(lowered.transfers) == 0
        return
    assert chained.num_resources == 0 and chained.resources.shape == (lowered.num_nodes, 0)
    fifo = lowered.run_summary(durations, method="events")
    static = chained.run_summary(durations)
    for index in (0, 2, 3):  # makespan, first start, last end: the same to the bit
        np.testing.assert_array_equal(static[index], fifo[index])
    np.testing.assert_allclose(static[1], fifo[1], rtol=1e-12)
    start, _, _ = lowered.run(durations, binding=False, method="events")
    chained_start, _, _ = chained.run(durations, binding=False)
    np.testing.assert_array_equal(chained_start, start)


def test_a_zero_length_cell_falls_back_to_the_heap():
    # cells that end at the same time tie on a link; the heap serves them by node id,
    # which the row's order need not follow: the chains are exact only without them
    table = random_table(16, overlap=0.4)
    lowered = lower(table, contention="link")
    durations = np.random.default_rng(16).integers(0, 3, size=(1, lowered.num_nodes)) * 1.0
    chained = link_chains(lowered)
    fifo = lowered.run_summary(durations, method="events")[0]
    assert chained.run_summary(durations)[0] != fifo
    assert engine.choose(lowered, durations) == "events"
    assert engine.summarize(lowered, durations)[0] == fifo
    positive = durations + 0.5
    assert engine.choose(lowered, positive) == "chained"
    assert chained.run_summary(positive)[0] == lowered.run_summary(positive,
                                                                   method="events")[0]


@pytest.mark.parametrize("contention", ["none", "link"])
def test_monte_carlo_keeps_a_pytorch_files_send_recv_order(contention):
    """A compute_comms file's transfers wait for their SEND/RECV: Monte Carlo must too
    (and must not chain a link's transfers by producer, which those edges can reorder)."""
    import pathlib

    from tabsched import StageCosts, read_pytorch
    from tabsched.adapt import monte_carlo
    path = pathlib.Path(__file__).parent / "data" / "pytorch" / "dualpipev_pp4_m8_comms.csv"
    schedule = read_pytorch(path)
    costs = StageCosts(1.0, 2.0, comm=1.0, contention=contention)
    expected = schedule.evaluate(costs).makespan
    plain = monte_carlo(schedule.table, costs, samples=2, seed=0)
    ordered = monte_carlo(schedule.table, costs, samples=2, seed=0,
                          transfer_after=schedule.transfer_after)
    assert ordered.nominal_makespan == ordered.mean == expected
    assert plain.nominal_makespan < expected


@settings(max_examples=30)
@given(seed=st.integers(0, 2**32 - 1), contention=st.sampled_from(["none", "link", "nic"]),
       transfers=st.sampled_from([0.0, 0.2]), samples=st.sampled_from([1, 7, 16, 33]))
def test_the_fused_pass_draws_what_numpy_draws(seed, contention, transfers, samples):
    # the fused kernel pass (noise drawn while it runs) and numpy's chunks then the
    # summary pass give the same makespans, busy times and last ends, to the bit
    table = random_table(seed, overlap=0.3)
    costs = StageCosts(1.0, comm=0.25, contention=contention, devices_per_node=2,
                       overlap=0.8)
    variation = Noise(0.2, kinds={"B": 0.4}, transfers=transfers) + Straggler(0, 1.5)
    if table.num_devices > 1:
        variation = variation + SlowLink((0, 1), 2.0, latency_spike=0.1)
    fused = monte_carlo(table, costs, variation, samples=samples, seed=seed)
    plain = chunked(table, costs, variation, samples=samples, seed=seed, chunk_bytes=5_000)
    assert fused.makespans.tobytes() == plain.makespans.tobytes()
    assert fused.to_dict()["devices"] == plain.to_dict()["devices"]


@pytest.mark.parametrize("variation", [None, Noise(0.1), Noise(0.1) + Straggler(1, 2.0)])
def test_a_table_without_operations(variation):
    from tabsched import ScheduleTable
    empty = ScheduleTable([[], []])
    runs = monte_carlo(empty, None, variation, samples=20)
    assert runs.makespans.tolist() == [0.0] * 20 and runs.nominal_makespan == 0.0
