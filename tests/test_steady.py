"""The steady-state period (tabsched/steady.py): the unrolled graph run by the kernel
and by its twin, a hand-checked example, and the bounds the period obeys."""

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tabsched import (StageCosts, UnitCosts, _kernel, _reference, engine, evaluate, generate,
                      lower)
from tabsched._testing import kernel_scratch, random_durations, random_table
from tabsched.cells import Op
from tabsched.exceptions import InvalidParameterError
from tabsched.layout import from_order
from tabsched.steady import steady_periods, unroll

CONTENTIONS = ("none", "link", "nic")


def _starts(module, unrolled, durations):
    """Starts of every node of ``unrolled`` under ``module``'s pass (the one the engine
    would run)."""
    graph = module.Graph(unrolled.num_nodes)
    assert not graph.add_edges(unrolled.indptr, unrolled.successors, unrolled.resources,
                               unrolled.num_resources)
    if unrolled.method != "events":
        assert not graph.add_layout(unrolled.topo_order, unrolled.topo_pred_indptr,
                                    unrolled.topo_predecessors)
    start = np.full(durations.shape, np.nan)
    bound = np.empty(0, dtype=np.int32)
    if unrolled.method == "events":
        status = module.fifo_starts(graph, durations, start, bound,
                                    kernel_scratch(module, graph))
    else:
        status = module.longest_path_starts(graph, durations, start, bound,
                                            kernel_scratch(module, graph,
                                                           unrolled.num_nodes))
    assert status == _kernel.OK
    return start


@given(seed=st.integers(0, 2**32 - 1), contention=st.sampled_from(CONTENTIONS),
       synchronized=st.booleans(), optimizer=st.booleans(), iterations=st.integers(2, 4))
def test_unrolled_kernel_equals_reference(seed, contention, synchronized, optimizer,
                                          iterations):
    lowered = lower(random_table(seed), contention=contention, devices_per_node=2,
                    optimizer=optimizer, grad_sync="replicas")
    durations = random_durations(lowered, seed, samples=2)
    unrolled = unroll(lowered, iterations, synchronized=synchronized, durations=durations)
    tiled = unrolled.durations(durations)
    np.testing.assert_array_equal(_starts(_kernel, unrolled, tiled),
                                  _starts(_reference, unrolled, tiled))


@given(seed=st.integers(0, 2**32 - 1), contention=st.sampled_from(CONTENTIONS),
       synchronized=st.booleans(), optimizer=st.booleans())
@example(seed=22, contention="nic", synchronized=False, optimizer=False)
def test_first_copy_is_one_iteration_and_copies_keep_dependency_order(
        seed, contention, synchronized, optimizer):
    """Copy 0 runs as the lowering alone (without the barrier, which only delays the
    steps), and every cross edge goes to a later copy: each copy starts after the
    previous one's first node. Under ``nic`` contention the next copy's transfers, once
    the copies overlap, queue for the same ports as copy 0's later ones and may go
    first (the event heap serves the port in the order transfers become ready): copy 0
    is then only never earlier than alone (seed 22 delays six of its nodes)."""
    lowered = lower(random_table(seed), contention=contention, devices_per_node=2,
                    optimizer=optimizer)
    durations = random_durations(lowered, seed)
    alone, _, _ = lowered.run(durations, binding=False)
    unrolled = unroll(lowered, 3, synchronized=synchronized, durations=durations)
    n = lowered.num_nodes
    start, _ = engine.run(unrolled, unrolled.durations(durations), method=unrolled.method)
    ends = start + unrolled.durations(durations)
    if contention == "nic":
        assert np.all(start[0, :n] >= alone[0])
    elif not (synchronized and optimizer):
        np.testing.assert_array_equal(start[0, :n], alone[0])
    # a copy's cells start no earlier than the same cells of the previous copy end
    cells = lowered.nodes(0)
    for k in (1, 2):
        assert np.all(start[0, k * n + cells.start:k * n + cells.stop]
                      >= start[0, (k - 1) * n + cells.start:(k - 1) * n + cells.stop])
    assert np.isfinite(ends).all()


def _zero_bubble_pair():
    """Two stages, one microbatch; device 1 splits its backward and its weight gradient
    is long: F=1, B=2, I=1, W=5.

    d0: F [0,1]                 B [3,5]
    d1:        F [1,2] I [2,3] W [3,8]          makespan 8 (device 1's W)

    With the barrier, iteration 1 starts at 8 on both devices: period 8. With
    post-validation device 0 starts iteration 1 at 5 (F [5,6]), device 1 at 8 (its W):
    F [8,9] I [9,10] W [10,15], device 0's B [10,12]; both devices advanced by 7, so
    the period is 7, device 1's work per iteration (1 + 1 + 5).
    """
    orders = [[Op("F", 0, 0), Op("B", 0, 0)],
              [Op("F", 1, 0), Op("I", 1, 0), Op("W", 1, 0)]]
    return from_order(orders, num_stages=2, num_microbatches=1)


def test_hand_checked_split_backward_pair():
    table = _zero_bubble_pair()
    costs = UnitCosts(f=1, b=2, i=1, w=5)
    result = evaluate(table, costs)
    assert result.makespan == 8.0
    lowered = lower(table)
    durations = costs.node_durations(lowered)
    periods, bounds = steady_periods(lowered, durations, synchronized=True)
    assert periods.tolist() == [8.0] and bounds.tolist() == [[8.0, 8.0]]
    periods, bounds = steady_periods(lowered, durations, synchronized=False)
    assert periods.tolist() == [7.0] and bounds.tolist() == [[7.0, 7.0]]


def test_hand_checked_one_f_one_b_two_devices():
    """1F1B, p=2, m=2, F=1 B=2, comm 0.5, steps of 1: device 0 starts first and ends
    last (d0: F0 [0,1] F1 [1,2] B0 [5,7] B1 [8,10], step [10,11]; d1: F0 [1.5,2.5]
    B0 [2.5,4.5] F1 [4.5,5.5] B1 [5.5,7.5], step [7.5,8.5]). Iteration 1 starts device
    0 at 11 (after its step; with the barrier, both steps run [10,11]) and device 1's
    first input arrives at 12.5, after its own release: iteration 1 is iteration 0
    shifted by 11, with or without the barrier."""
    table = generate("1f1b", devices=2, microbatches=2)
    costs = StageCosts(1.0, 2.0, comm=0.5, optimizer=1.0)
    result = evaluate(table, costs, optimizer=True)
    assert result.makespan == 11.0
    lowered = lower(table, optimizer=True)
    durations = costs.node_durations(lowered)
    for synchronized in (True, False):
        periods, bounds = steady_periods(lowered, durations, synchronized=synchronized)
        assert periods.tolist() == [11.0] and bounds.tolist() == [[11.0, 11.0]]


def _busy(lowered, durations):
    """Each device's compute time per iteration (its cells and its step)."""
    per_node = np.asarray(durations)[0] if np.ndim(durations) == 2 else np.asarray(durations)
    device = lowered.node_device
    return np.bincount(device[device >= 0], per_node[device >= 0],
                       minlength=lowered.table.num_devices)


@given(seed=st.integers(0, 2**32 - 1), contention=st.sampled_from(("none", "link")),
       optimizer=st.booleans())
def test_period_bounds(seed, contention, optimizer):
    """Where the unrolled graph is max-plus linear (contention none, link):
    each device's work per iteration <= post-validation's period <= the barrier's
    period; the barrier's period is the time to the barrier from starts offset by
    each device's step, so it lies within [G + least step, G + greatest step], G
    being the last gradient's time (the makespan when the steps are equal)."""
    lowered = lower(random_table(seed), contention=contention, devices_per_node=2,
                    optimizer=optimizer)
    durations = random_durations(lowered, seed, integer=True)
    durations[:, lowered.nodes(0)] += 1.0      # cells longer than zero: exact chains
    synced, synced_bounds = steady_periods(lowered, durations, synchronized=True)
    free, free_bounds = steady_periods(lowered, durations, synchronized=False)
    scale = 1e-9 * max(1.0, float(synced[0]))
    assert synced_bounds[0, 0] <= synced[0] <= synced_bounds[0, 1]
    assert free_bounds[0, 0] <= free[0] <= free_bounds[0, 1]
    assert free[0] <= synced[0] + scale
    assert _busy(lowered, durations).max() <= free_bounds[0, 1] + scale
    start, ends, _ = lowered.run(durations, binding=False)
    steps = lowered.nodes(3)
    last = np.concatenate([ends[0, lowered.nodes(0)], ends[0, lowered.nodes(2)]])
    gradients = float(last.max()) if len(last) else 0.0
    step = durations[0, steps] if steps.stop > steps.start else np.zeros(1)
    assert gradients + step.min() - scale <= synced[0] <= gradients + step.max() + scale


@pytest.mark.parametrize("family, params", [("1f1b", {}), ("zbv", {}), ("dualpipev", {}),
                                            ("chimera", {}), ("interleaved", {"chunks": 2}),
                                            ("zb-h2", {})])
@pytest.mark.parametrize("contention", CONTENTIONS)
def test_barrier_period_is_the_makespan_with_equal_steps(family, params, contention):
    """With the global synchronization and equal steps, no iteration overlaps the
    next: every transfer and cell ends before the barrier, so the period is the
    makespan, in every contention mode; post-validation never takes longer here."""
    table = generate(family, devices=4, microbatches=8, **params)
    costs = StageCosts(1.0, 2.0, comm=0.3, optimizer=0.5)
    result = evaluate(table, costs, contention=contention, optimizer=True) \
        if contention != "nic" else None
    lowered = lower(table, contention=contention, devices_per_node=2, optimizer=True)
    durations = costs.node_durations(lowered)
    synced, _ = steady_periods(lowered, durations, synchronized=True)
    free, _ = steady_periods(lowered, durations, synchronized=False)
    _, ends, _ = lowered.run(durations, binding=False)
    makespan = result.makespan if result else float(ends.max())
    assert synced[0] == pytest.approx(makespan, rel=1e-12)
    assert free[0] <= synced[0] * (1 + 1e-12)


def test_post_validation_shortens_a_v_schedule():
    """ZB-V's cool-down (device 0's last weight gradients) overlaps the next warm-up."""
    table = generate("zbv", devices=4, microbatches=8)
    lowered = lower(table)
    durations = UnitCosts(f=1, b=2).node_durations(lowered)
    free, _ = steady_periods(lowered, durations, synchronized=False)
    synced, _ = steady_periods(lowered, durations, synchronized=True)
    assert free[0] < synced[0]


@pytest.mark.parametrize("iterations", [1, 0, 2.5, True])
def test_unroll_refuses_fewer_than_two_iterations(iterations):
    lowered = lower(generate("1f1b", devices=2, microbatches=2))
    with pytest.raises(InvalidParameterError, match="iterations must be an integer >= 2"):
        unroll(lowered, iterations)


# ------------------------------------------------------------- reports
def test_result_reports_the_period_of_its_execution():
    from tabsched import Execution
    table = generate("zbv", devices=4, microbatches=8)
    synced = evaluate(table, UnitCosts())
    free = evaluate(table, UnitCosts(), execution=Execution(post_validation=True))
    lowered = lower(table)
    durations = UnitCosts().node_durations(lowered)
    assert synced.steady_period == synced.makespan == free.makespan
    assert free.steady_period == float(steady_periods(lowered, durations,
                                                      synchronized=False)[0][0])
    assert free.steady_period_bounds[0] <= free.steady_period <= free.steady_period_bounds[1]
    data = free.to_dict()
    assert data["steady_period"] == free.steady_period
    assert data["execution"]["post_validation"] is True


def test_summaries_carry_the_results_period():
    from tabsched import Execution
    from tabsched.evaluate import evaluate_summaries
    table = generate("zbv", devices=4, microbatches=8)
    models = [StageCosts(1.0, comm=0.2, execution=Execution(post_validation=flag))
              for flag in (False, True)]
    summaries = evaluate_summaries(table, models, steady=True)
    assert [s.steady_period for s in summaries] == \
        [evaluate(table, costs).steady_period for costs in models]
    assert evaluate_summaries(table, models)[0].steady_period is None


def test_sweep_rows_have_the_period_as_a_last_column():
    from tabsched.sweeps import COLUMNS, sweep
    # the execution fields added since the columns' order was set, then the period
    period = COLUMNS.index("simulation_steady_period_s")
    assert COLUMNS[period - 4:period + 1] == ("p2p", "post_validation", "reshard_after_forward",
                                              "prefetch", "simulation_steady_period_s")
    # the fields added after it follow it
    assert COLUMNS[period + 1:] == ("grad_bucket_size", "align_grad_reduce", "fp8", "cp_comm",
                                    "max_connections")
    rows = sweep(["zbv"], [4], [8], systems=["mid_nw_mid_cp"])
    assert rows[0]["simulation_steady_period_s"] == pytest.approx(
        rows[0]["simulation_makespan_s"], rel=1e-12)


def test_eval_prints_the_period_beside_the_makespan(cli, tmp_path):
    import json
    from tabsched import Execution
    table = generate("zbv", devices=4, microbatches=8)
    free = evaluate(table, UnitCosts(), execution=Execution(post_validation=True))
    code, out, _ = cli("eval", "zbv", "-p", "4", "-m", "8", "--post-validation")
    assert code == 0
    line = next(line for line in out.splitlines() if line.startswith("steady period"))
    below = 1 - free.steady_period / free.makespan
    assert f"{below:.1%} below the makespan; post-validation" in line
    code, out, _ = cli("eval", "zbv", "-p", "4", "-m", "8", "--post-validation", "--json")
    assert json.loads(out)["steady_period"] == free.steady_period
    code, out, _ = cli("eval", "zbv", "-p", "4", "-m", "8")
    line = next(line for line in out.splitlines() if line.startswith("steady period"))
    assert "= the makespan" in line and "global sync" in line


def test_a_bad_post_validation_in_an_execution_file_is_one_line(cli_error, tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('post_validation = "yes"\n')
    message = cli_error("eval", "1f1b", "-p", "2", "-m", "2", "--execution", path)
    assert "post_validation must be true or false" in message and "run.toml" in message


@given(seed=st.integers(0, 2**32 - 1), synchronized=st.booleans(), optimizer=st.booleans())
def test_an_exact_period_repeats_in_longer_unrollings(seed, synchronized, optimizer):
    """Where the advances of the last iteration agree (the bounds meet), the regime is
    periodic: every iteration of a longer unrolling advances by the same period."""
    lowered = lower(random_table(seed), optimizer=optimizer)
    durations = random_durations(lowered, seed)
    periods, bounds = steady_periods(lowered, durations, synchronized=synchronized)
    if bounds[0, 1] - bounds[0, 0] > 1e-9 * max(1.0, periods[0]):
        return      # not exact: bounded (test_period_bounds)
    unrolled = unroll(lowered, 6, synchronized=synchronized)
    tiled = unrolled.durations(durations)
    start, _ = engine.run(unrolled, tiled, method=unrolled.method)
    n = lowered.num_nodes
    ends = (start + tiled)[0, :6 * n].reshape(6, n)[:, unrolled.state].max(axis=1)
    np.testing.assert_allclose(np.diff(ends)[1:], periods[0], rtol=1e-9, atol=1e-9)
