"""The overlapped forward-backward cell on two streams (tabsched.costs.streams).

Invariants of the two-stream time (bounded by the streams' loads, never shorter with one
hardware queue, monotone in every segment's length), and what it does to real tables: a
DualPipeV cell of a mixture of experts with its all-to-alls is shorter than its parts'
sum, a cell with nothing to overlap is exactly the sum, the formula level's F&B is the
same model's, and the constant factor is still there for a user who gives one.
"""

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from tabsched import evaluate, lower
from tabsched.adapt import Noise, monte_carlo
from tabsched.cli import cli
from tabsched.costs import ModelCosts
from tabsched.costs.streams import segments, two_streams
from tabsched.costs.transformer import TransformerModel
from tabsched.exceptions import InvalidParameterError
from tabsched.execution import Execution
from tabsched.formulas import formula_for
from tabsched.schedules import generate

_segment = st.tuples(st.booleans(), st.integers(1, 8).map(float))
_chain = st.lists(_segment, min_size=1, max_size=6)


@given(_chain, _chain, st.sampled_from([0.0, 0.189]))
def test_two_streams_lie_between_the_busier_stream_and_the_sum(first, second, slowdown):
    compute = sum(value for comm, value in first + second if not comm)
    communication = sum(value for comm, value in first + second if comm)
    for serial in (False, True):
        both = two_streams(first, second, slowdown, serial_launch=serial)
        assert max(compute, communication) - 1e-9 <= both
        assert both <= (1 + slowdown) * compute + communication + 1e-9


@given(_chain, _chain, st.sampled_from([0.0, 0.189]))
def test_one_hardware_queue_is_never_faster_than_two(first, second, slowdown):
    # each stream runs its segments in launch order, so one queue only adds waits (a
    # stream that took any ready segment could be faster on one queue: Graham's anomaly)
    assert two_streams(first, second, slowdown, serial_launch=True) >= \
        two_streams(first, second, slowdown) - 1e-9


@given(_chain, _chain, st.data())
def test_two_streams_never_shorten_when_a_segment_grows(first, second, data):
    index = data.draw(st.integers(0, len(first) - 1))
    longer = list(first)
    longer[index] = (first[index][0], first[index][1] + data.draw(st.integers(1, 4)))
    assert two_streams(longer, second, 0.189) >= two_streams(first, second, 0.189) - 1e-9


def test_segments_merge_runs_of_one_class():
    assert segments([1.0, 2.0, 0.0, 3.0, 4.0], [False, False, True, True, False]) == [
        (False, 3.0, 2.0), (True, 3.0, 3.0), (False, 4.0, 4.0)]


def _moe():
    return TransformerModel(layers=8, hidden=1024, heads=16, sequence=1024, vocab=8000,
                            gated_ffn=True, dropout=False, norm="rmsnorm",
                            tied_embeddings=False, experts=16, top_k=4, expert_ffn=1024)


def test_dualpipev_cells_hide_the_all_to_alls():
    table = generate("dualpipev", devices=2, microbatches=8)
    lowered = lower(table)
    run = dict(data_parallel=16, expert_parallel=16, attention="flash")   # across 2 nodes
    costs = ModelCosts(_moe(), "dgx-a100", **run)
    factors = costs.overlap_factors(lowered)
    assert len(factors) and (factors < 1.0).all() and (factors > 0.5).all()
    summed = ModelCosts(_moe(), "dgx-a100", overlap=1.0, **run)
    assert (summed.overlap_factors(lowered) == 1.0).all()
    assert evaluate(table, costs).makespan < evaluate(table, summed).makespan
    serial = ModelCosts(_moe(), "dgx-a100", max_connections=1, **run)
    assert evaluate(table, serial).makespan >= evaluate(table, costs).makespan
    # the formula level's F&B is the same model's pair
    assert formula_for(table, costs)["bubble_time"] < formula_for(table, summed)["bubble_time"]
    # and Monte Carlo composes the same factors (its nominal is the evaluation's)
    runs = monte_carlo(table, costs, Noise(0.05), samples=20, seed=1)
    assert runs.nominal_makespan == pytest.approx(evaluate(table, costs).makespan, rel=1e-12)


def test_a_cell_with_nothing_to_overlap_is_its_sum():
    dense = TransformerModel(layers=4, hidden=512, heads=8, sequence=256, vocab=1000)
    table = generate("dualpipev", devices=2, microbatches=4)
    factors = ModelCosts(dense, "dgx-h100").overlap_factors(lower(table))
    assert factors == pytest.approx(np.ones(len(factors)), rel=1e-12)


def test_max_connections_is_checked():
    with pytest.raises(InvalidParameterError, match="max_connections must be an integer "
                                                    "from 1 to 32, not 33"):
        Execution(max_connections=33)
    result = CliRunner().invoke(cli, ["eval", "dualpipev", "-p", "2", "-m", "4", "--model",
                                      "llama3-8b", "--system", "dgx-h100",
                                      "--max-connections", "0"])
    assert result.exit_code == 1 and "--max-connections" in result.output
    assert "Traceback" not in result.output
