import numpy as np
import pytest

from tabsched import InvalidParameterError, StageCosts, UnitCosts, evaluate, generate
from tabsched.lower import lower


def test_unit_costs_per_kind_and_size():
    table = generate("1f1b", devices=2, microbatches=2).replace(microbatch_sizes=(1.0, 0.5))
    costs = UnitCosts(f=1, b=3)
    durations = costs.op_durations(table)
    expected = [costs.lengths[k] * (1.0 if m == 0 else 0.5)
                for k, m in zip(table.kind, table.microbatch)]
    np.testing.assert_allclose(durations, expected)
    assert costs.level == "table"


def test_stage_costs_defaults_and_per_link_comm():
    table = generate("gpipe", devices=3, microbatches=2)
    costs = StageCosts([1.0, 2.0, 3.0])
    assert costs.backward.tolist() == [2.0, 4.0, 6.0]
    assert costs.input_grad.tolist() == [1.0, 2.0, 3.0]
    comm = np.zeros((3, 3))
    comm[1, 2] = 5.0
    lowered = lower(table)
    durations, nbytes = StageCosts(1.0, comm=comm).transfer_costs(table, lowered.transfers)
    on_link = (lowered.transfers.src == 1) & (lowered.transfers.dst == 2)
    assert np.all(durations[on_link] == 5.0) and np.all(durations[~on_link] == 0.0)
    assert np.all(nbytes == 0)


def test_slow_link_slows_exactly_that_link():
    table = generate("1f1b", devices=4, microbatches=8)
    comm = np.full((4, 4), 0.1)
    fast = evaluate(table, StageCosts(1.0, comm=comm))
    comm[2, 3] = 2.0
    slow = evaluate(table, StageCosts(1.0, comm=comm))
    assert slow.makespan > fast.makespan
    links = {(l.src, l.dst): l.busy for l in slow.links}
    assert links[2, 3] == pytest.approx(8 * 2.0)
    assert links[3, 2] == pytest.approx(8 * 0.1)


@pytest.mark.parametrize("make,message", [
    (lambda: UnitCosts(f=-1), r"f must be finite and >= 0, not -1.0"),
    (lambda: UnitCosts(b="x"), r"b must be a number, not 'x'"),
    (lambda: UnitCosts(input_grad_release=2), r"input_grad_release must be between 0 and 1"),
    (lambda: StageCosts([1.0, -2.0]), r"forward\[1\] must be finite and >= 0, not -2.0"),
    (lambda: StageCosts(1.0, comm=[[0, 1]]), r"comm must be a number or a square matrix"),
    (lambda: StageCosts(1.0, comm=[[0, -1], [0, 0]]), r"comm\[0\]\[1\] must be finite"),
    (lambda: StageCosts(1.0, contention="bus"), r"contention 'bus' is not one of"),
])
def test_cost_errors(make, message):
    with pytest.raises(InvalidParameterError, match=message):
        make()


def test_stage_count_mismatch_names_the_argument():
    with pytest.raises(InvalidParameterError, match="forward has 2 entries but the table has 4"):
        evaluate(generate("1f1b", devices=4, microbatches=4), StageCosts([1.0, 1.0]))
    with pytest.raises(InvalidParameterError, match="comm is a 2x2 matrix but the table has 4"):
        evaluate(generate("1f1b", devices=4, microbatches=4), StageCosts(1.0, comm=np.ones((2, 2))))


# ------------------------------------------------------------- ring collectives
from tabsched.costs.collectives import ring_steps, ring_time  # noqa: E402


def test_ring_collective_arithmetic():
    """Patarasuk and Yuan 2009: n-1 steps of nbytes/n for reduce-scatter and all-gather,
    twice that for an all-reduce; each step pays the link's latency."""
    nbytes, bandwidth, latency = 8e9, 10e9, 1e-5
    for n in (2, 4, 8):
        step = latency + nbytes / n / bandwidth
        assert ring_time("reduce_scatter", nbytes, n, bandwidth, latency) == pytest.approx(
            (n - 1) * step)
        assert ring_time("all_gather", nbytes, n, bandwidth, latency) == pytest.approx(
            (n - 1) * step)
        assert ring_time("all_reduce", nbytes, n, bandwidth, latency) == pytest.approx(
            2 * (n - 1) / n * nbytes / bandwidth + 2 * (n - 1) * latency)
    assert ring_time("all_reduce", nbytes, 1, bandwidth, latency) == 0.0
    assert ring_steps("all_reduce", 8) == 14 and ring_steps("all_gather", 8) == 7
    np.testing.assert_allclose(ring_time("all_gather", np.array([8e9, 4e9]), 2, bandwidth, 0.0),
                               [0.4, 0.2])
    with pytest.raises(InvalidParameterError, match=r"collective 'broadcast' is not one of "
                                                    r"all_reduce, reduce_scatter, all_gather"):
        ring_time("broadcast", nbytes, 4, bandwidth, latency)


def test_every_cost_model_states_no_working_memory_by_default():
    table = generate("1f1b", devices=2, microbatches=3)
    for costs in (UnitCosts(), StageCosts(1.0)):
        assert costs.transient_sizes(table).tolist() == [0.0] * len(table)
