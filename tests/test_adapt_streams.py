"""Random streams: keyed, reproducible draws, the same whatever the chunking or the table."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tabsched import InvalidParameterError, StageCosts, generate
from tabsched.adapt import Noise, SlowLink, SplitMicrobatches, VariationContext
from tabsched.adapt import streams as streams_module
from tabsched.adapt.streams import RandomStreams, _mix, _mix_int, lognormal_parameters
from tabsched.lower import lower


def context_of(table, costs, **options):
    return VariationContext(lower(table, contention=costs.contention), costs, **options)


@given(values=st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=20))
def test_the_array_mix_is_the_integer_mix(values):
    mixed = _mix(np.array(values, dtype=np.uint64))
    assert mixed.tolist() == [_mix_int(value) for value in values]


def test_stream_keys_differ_by_stream_seed_and_iteration():
    lowered = lower(generate("1f1b", devices=2, microbatches=2))
    keys = {(seed, iteration, stream): RandomStreams(lowered, seed=seed, iteration=iteration)
            .stream_key(stream)
            for seed in (0, 1) for iteration in (0, 1)
            for stream in ("noise", "transfer-noise", "spike")}
    assert len(set(keys.values())) == len(keys)
    assert RandomStreams(lowered, seed=2**64 + 1).stream_key("noise") == \
        RandomStreams(lowered, seed=1).stream_key("noise")      # seeds are taken mod 2**64


@pytest.mark.parametrize("seed", [-1, True, 1.5, "1"])
def test_a_seed_is_an_integer_at_least_zero(seed):
    lowered = lower(generate("1f1b", devices=2, microbatches=2))
    with pytest.raises(InvalidParameterError, match=r"^seed must be an integer >= 0, not "):
        RandomStreams(lowered, seed=seed)


def test_nested_splits_give_the_parts_the_keys_of_one_split():
    table = generate("1f1b", devices=2, microbatches=2)
    nested = SplitMicrobatches([0], 2).apply(SplitMicrobatches([0], 2).apply(table))
    once = SplitMicrobatches([0], 4).apply(table)
    assert nested.microbatch_sizes[:2] == once.microbatch_sizes[:2] == (0.25, 0.25)
    keys = {}
    for name, split in (("nested", nested), ("once", once)):
        streams = RandomStreams(lower(split))
        first = split.microbatch < 2
        keys[name] = sorted(streams.op_keys[first].tolist())
    assert keys["nested"] == keys["once"]


def test_blocks_of_samples_draw_what_one_block_draws(monkeypatch):
    lowered = lower(generate("1f1b", devices=4, microbatches=8))
    streams = RandomStreams(lowered, seed=5)
    samples = np.arange(37)
    whole = streams.lognormal_factors("noise", samples, streams.op_keys, 0.2)
    monkeypatch.setattr(streams_module, "_BLOCK", 3 * len(streams.op_keys))
    scaled = np.ones((len(samples), len(streams.op_keys)))
    streams.scale_lognormal(scaled, "noise", samples, streams.op_keys, 0.2)
    assert scaled.tobytes() == whole.tobytes()


def test_lognormal_parameters_per_key():
    sigma, shift = lognormal_parameters([0.0, 0.5], 2)
    assert sigma.dtype == shift.dtype == np.float32
    assert sigma[0] == shift[0] == 0.0
    assert float(sigma[1]) == pytest.approx(np.sqrt(np.log1p(0.25)), rel=1e-7)
    assert float(shift[1]) == pytest.approx(np.log1p(0.25) / 2, rel=1e-7)
    assert lognormal_parameters(0.1, 3)[0].shape == (3,)


def test_uniforms_lie_inside_the_unit_interval():
    lowered = lower(generate("1f1b", devices=4, microbatches=8), contention="none")
    streams = RandomStreams(lowered, seed=9)
    high, low = streams.uniforms("spike", np.arange(2000), streams.transfer_keys)
    for values in (high, low):
        assert values.shape == (2000, len(streams.transfer_keys))
        assert np.all((values > 0) & (values < 1))
        assert values.mean() == pytest.approx(0.5, abs=0.01)
    assert not np.array_equal(high, low)


def test_draws_are_keyed_reproducible_and_chunk_free():
    table = generate("1f1b", devices=4, microbatches=8)
    costs = StageCosts(1.0, comm=0.5)
    variation = Noise(0.2, transfers=0.1) + SlowLink((0, 1), 2.0, latency_spike=1.0,
                                                     spike_probability=0.5)
    first = context_of(table, costs, seed=7).sample_durations(variation, np.arange(10))
    again = context_of(table, costs, seed=7).sample_durations(variation, np.arange(10))
    assert first.tobytes() == again.tobytes()
    part = context_of(table, costs, seed=7).sample_durations(variation, np.arange(4, 7))
    assert part.tobytes() == first[4:7].tobytes()
    other = context_of(table, costs, seed=8).sample_durations(variation, np.arange(10))
    assert not np.any(other == first)
    later = context_of(table, costs, seed=7, iteration=1).sample_durations(variation,
                                                                          np.arange(10))
    assert not np.array_equal(later, first)


def test_moving_a_context_to_another_iteration_moves_its_streams():
    table = generate("1f1b", devices=4, microbatches=8)
    costs = StageCosts(1.0, comm=0.5)
    moved = context_of(table, costs, seed=7)
    moved.iteration = 1
    assert moved.streams.iteration == 1 and moved.seed == moved.streams.seed == 7
    fresh = context_of(table, costs, seed=7, iteration=1)
    noise = Noise(0.2)
    assert moved.sample_durations(noise, np.arange(4)).tobytes() == \
        fresh.sample_durations(noise, np.arange(4)).tobytes()


def test_a_transform_keeps_the_draws_of_the_operations_it_left_alone():
    table = generate("1f1b", devices=4, microbatches=8)
    costs = StageCosts(1.0, comm=0.5)
    split = SplitMicrobatches([7], 2).apply(table)
    noise = Noise(0.3)
    before = context_of(table, costs, seed=3)
    after = context_of(split, costs, seed=3)
    a = before.sample_durations(noise, np.arange(5))[:, before.lowered.cell_of_op]
    b = after.sample_durations(noise, np.arange(5))[:, after.lowered.cell_of_op]
    kept_before = table.microbatch < 7
    kept_after = split.microbatch < 7
    order_a = np.lexsort((table.microbatch[kept_before], table.stage[kept_before],
                          table.kind[kept_before]))
    order_b = np.lexsort((split.microbatch[kept_after], split.stage[kept_after],
                          split.kind[kept_after]))
    np.testing.assert_array_equal(a[:, kept_before][:, order_a], b[:, kept_after][:, order_b])
    assert not np.any(np.isin(b[:, ~kept_after], a))
