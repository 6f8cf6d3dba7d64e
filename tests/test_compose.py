"""The one duration composer (tabsched/compose.py) against a plain oracle of the
composition every cost model used before it, for every cost model class."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tabsched import ModelCosts, StageCosts, UnitCosts, generate
from tabsched._testing import random_table
from tabsched.compose import Prices, cell_durations
from tabsched.lower import lower
from tabsched.nodes import CELL, EXTRA_KINDS, OPTIMIZER, SYNC, TRANSFER


def oracle(lowered, op, transfers, extra, overlap):
    """Node durations composed in plain Python, as ``CostModel.node_durations`` did at
    fd6294b: a cell is ``0.0 + its operations' durations`` in table order, times
    ``overlap`` when it holds several; then transfers, syncs, optimizer steps."""
    table = lowered.table
    fresh = table.cell_starts().tolist()
    cells, parts = [], []
    for k, opens in enumerate(fresh):
        if opens:
            cells.append(0.0)
            parts.append(0)
        cells[-1] += float(op[k])
        parts[-1] += 1
    cells = [total * overlap if count > 1 and overlap != 1.0 else total
             for total, count in zip(cells, parts)]
    tail = [float(value) for kind in (SYNC, OPTIMIZER) for value in extra.get(kind, ())]
    return np.array(cells + [float(value) for value in transfers] + tail)


def prices_of(costs, lowered):
    table = lowered.table
    extra = {kind: np.asarray(costs.node_prices(lowered, kind), dtype=np.float64)
             for kind in (SYNC, OPTIMIZER)}
    return (np.asarray(costs.op_durations(table), dtype=np.float64),
            np.asarray(costs.transfer_costs(table, lowered.transfers)[0], dtype=np.float64),
            extra, float(costs.overlap))


def even_layers(table, layers=128):
    """``table`` with ``layers`` split over its stages (for ModelCosts)."""
    S = table.num_stages
    split = [layers // S + (1 if s < layers % S else 0) for s in range(S)]
    return table.replace(stage_layers=split)


def cost_models(rng, table):
    """One of each class with random settings, tails, overlap, link and nic contention."""
    S, D = table.num_stages, table.num_devices
    overlap = float(rng.choice([1.0, 0.7, 1.3]))
    yield UnitCosts(*rng.uniform(0.0, 3.0, 4), overlap=overlap,
                    sync=float(rng.uniform(0, 2)), optimizer=float(rng.uniform(0, 2)))
    yield StageCosts(rng.exponential(1.0, S), rng.exponential(2.0, S), overlap=overlap,
                     comm=rng.exponential(0.5, (D, D)), contention="link",
                     sync=float(rng.uniform(0, 1)), optimizer=float(rng.uniform(0, 1)))
    yield StageCosts(float(rng.uniform(0.1, 2)), comm=float(rng.uniform(0, 1)), contention="nic",
                     devices_per_node=2, overlap=overlap)
    for system, parallel in (("mid_nw_mid_cp", {}), ("slow_nw_mid_cp", {"data_parallel": 2})):
        yield ModelCosts("paper-128l", system, microbatch_size=4, overlap=overlap,
                         optimizer=True, grad_sync="all", **parallel)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), tail=st.booleans())
def test_the_composer_gives_todays_node_durations_for_every_cost_model(seed, tail):
    rng = np.random.default_rng(seed)
    table = even_layers(random_table(seed, overlap=0.3))
    models = list(cost_models(rng, table))
    for costs in models:
        lowered = lower(table, contention=costs.contention,
                        devices_per_node=costs.devices_per_node or 2,
                        grad_sync="all" if tail else None, optimizer=tail)
        op, transfers, extra, overlap = prices_of(costs, lowered)
        expected = oracle(lowered, op, transfers, extra, overlap)
        np.testing.assert_array_equal(costs.node_durations(lowered), expected)
        np.testing.assert_array_equal(lowered.compose(op, transfers, extra, overlap),
                                      expected)
        # stacked, alone and beside the others of its class: every row its own
        same_class = [other for other in models if type(other) is type(costs)
                      and other.contention == costs.contention]
        stacked = type(costs).stacked_node_durations(lowered, same_class)
        for row, other in zip(stacked, same_class):
            np.testing.assert_array_equal(row, oracle(lowered, *prices_of(other, lowered)))


@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 4))
def test_stacked_composition_is_each_rows_composition_to_the_bit(seed, rows):
    rng = np.random.default_rng(seed)
    table = random_table(seed, overlap=0.4)
    lowered = lower(table, grad_sync="all", optimizer=True)
    # durations of every scale, some zero, some negative zero
    op = rng.exponential(1.0, (rows, len(table))) * 10.0 ** rng.integers(-300, 300, (rows, 1))
    op[rng.random(op.shape) < 0.1] = 0.0
    op[rng.random(op.shape) < 0.1] = -0.0
    transfers = rng.exponential(1.0, (rows, len(lowered.transfers)))
    extra = {SYNC: rng.random((rows, lowered.count(SYNC))),
             OPTIMIZER: rng.random((rows, lowered.count(OPTIMIZER)))}
    overlap = rng.choice([1.0, 0.5, 1.5], rows)
    stacked = lowered.compose_stacked(Prices(op=op, transfer=transfers, extra=extra,
                                             overlap=overlap))
    for row in range(rows):
        expected = oracle(lowered, op[row], transfers[row],
                          {kind: part[row] for kind, part in extra.items()}, overlap[row])
        assert stacked[row].tobytes() == expected.tobytes()     # -0.0 and 0.0 told apart
        assert stacked[row].tobytes() == lowered.compose(
            op[row], transfers[row], {kind: part[row] for kind, part in extra.items()},
            overlap[row]).tobytes()


def test_a_kind_without_prices_costs_nothing_and_every_kind_is_composed():
    lowered = lower(generate("chimera", devices=4, microbatches=4), grad_sync="replicas",
                    optimizer=True)
    op = np.ones(len(lowered.table))
    durations = lowered.compose(op, np.full(len(lowered.transfers), 0.5))
    assert np.all(durations[lowered.extra_nodes] == 0.0)
    assert np.all(durations[lowered.nodes(TRANSFER)] == 0.5)
    assert np.all(durations[lowered.nodes(CELL)] >= 1.0)
    for kind in EXTRA_KINDS:       # the kinds to come have no node yet: nothing to price
        assert len(UnitCosts().node_prices(lowered, kind)) == lowered.count(kind)


def test_cell_durations_is_the_cells_of_the_lowering():
    table = random_table(5, overlap=0.5)
    lowered = lower(table)
    op = np.random.default_rng(5).random(len(table))
    np.testing.assert_array_equal(cell_durations(lowered.cell_of_op, lowered.num_cells, op, 0.8),
                                  lowered.compose(op, np.zeros(len(lowered.transfers)),
                                                  overlap=0.8)[lowered.nodes(CELL)])
    assert lowered.cell_first_op[-1] == len(table)
    np.testing.assert_array_equal(np.diff(lowered.cell_first_op),
                                  np.bincount(lowered.cell_of_op))


@pytest.mark.parametrize("family", ["1f1b", "zbv", "chimera"])
def test_model_costs_stacked_prices_are_each_models_prices(family):
    table = generate(family, devices=4, microbatches=8)
    lowered = lower(table, grad_sync="all", optimizer=True)
    models = [ModelCosts("paper-128l", system, microbatch_size=size, optimizer=True)
              for system in ("mid_nw_mid_cp", "fast_nw_fast_cp") for size in (1, 2)]
    prices = ModelCosts.stacked_prices(lowered, models)
    for row, costs in enumerate(models):
        op, transfers, extra, overlap = prices_of(costs, lowered)
        np.testing.assert_array_equal(prices.op[row], op)
        np.testing.assert_array_equal(prices.transfer[row], transfers)
        for kind in (SYNC, OPTIMIZER):
            np.testing.assert_array_equal(prices.extra[kind][row], extra[kind])
        np.testing.assert_array_equal(prices.overlap[row], costs.overlap_factors(lowered))
