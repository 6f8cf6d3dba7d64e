"""evaluate(): exact values on known tables and the invariants of execution."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tabsched import (DeadlockError, InvalidParameterError, ScheduleTable, StageCosts,
                      UnitCosts, evaluate, generate)
from tabsched._testing import random_table
from tabsched import engine
from tabsched.lower import lower
from tabsched.nodes import TRANSFER


def dependencies(table):
    """(producer op, consumer op) pairs straight from DESIGN.md, independent of lowering."""
    index = {(str(table.op(k))): k for k in range(len(table))}
    S = table.num_stages
    pairs = []
    for k in range(len(table)):
        op = table.op(k)
        s, m = op.stage, op.microbatch
        needs = []
        if op.kind == "F" and s > 0:
            needs.append(f"{s - 1}F{m}")
        if op.kind in "BI":
            needs.append(f"{s}F{m}")
            if s < S - 1:
                needs.append(f"{s + 1}B{m}" if f"{s + 1}B{m}" in index else f"{s + 1}I{m}")
        if op.kind == "W":
            needs.append(f"{s}I{m}")
        pairs.extend((index[need], k) for need in needs)
    return pairs


def random_stage_costs(table, seed, comm=True):
    rng = np.random.default_rng(seed)
    S = table.num_stages
    forward = rng.integers(1, 4, size=S).astype(float)
    backward = rng.integers(1, 6, size=S).astype(float)
    input_grad = np.floor(backward / 2)
    return StageCosts(forward, backward, input_grad, backward - input_grad,
                      comm=float(rng.integers(0, 3)) if comm else 0.0,
                      activation=rng.integers(1, 4, size=S).astype(float),
                      input_grad_release=float(rng.choice([0.0, 0.25, 1.0])))


seeds = st.integers(0, 2**32 - 1)


@given(seed=seeds, contention=st.sampled_from(["none", "link"]))
def test_execution_invariants(seed, contention):
    table = random_table(seed)
    costs = random_stage_costs(table, seed)
    result = evaluate(table, costs, contention=contention)
    start, end = result.op_start, result.op_end
    # no two cells overlap on one device (overlapped parts share their cell)
    for device in range(table.num_devices):
        mine = np.flatnonzero(table.device == device)
        cells = sorted(set(zip(start[mine].tolist(), end[mine].tolist())))
        for (_, end_a), (start_b, _) in zip(cells, cells[1:]):
            assert start_b >= end_a
    # every op starts after each dependency's end plus its transfer
    for producer, consumer in dependencies(table):
        crossing = table.device[producer] != table.device[consumer]
        assert start[consumer] >= end[producer] + (costs.comm if crossing else 0.0) - 1e-9
    # makespan bounds: busiest device, every chain of dependencies
    busy = max(d.busy for d in result.devices)
    assert result.makespan >= busy - 1e-9
    chain = np.zeros(len(table))
    durations = end - start
    by_consumer = {}
    for producer, consumer in dependencies(table):
        by_consumer.setdefault(consumer, []).append(producer)
    for k in np.argsort(start, kind="stable"):
        arrival = [chain[p] + (costs.comm if table.device[p] != table.device[k] else 0.0)
                   for p in by_consumer.get(k, [])]
        chain[k] = max(arrival, default=0.0) + durations[k]
    assert result.makespan >= chain.max() - 1e-9
    # memory is never negative and ends at zero
    for _, values in result.memory_timeline():
        assert np.all(values >= -1e-9)
        if len(values):
            assert abs(values[-1]) < 1e-9
    assert 0.0 <= result.bubble_ratio < 1.0


@given(seed=seeds, contention=st.sampled_from(["none", "link"]), data=st.data())
def test_raising_a_duration_never_lowers_the_makespan(seed, contention, data):
    """Monotone under `none`, and under `link` too: every transfer on a directed link
    leaves one device, in that device's row order, so a link's FIFO order never changes."""
    table = random_table(seed)
    lowered = lower(table, contention=contention)
    rng = np.random.default_rng(seed)
    durations = rng.integers(1, 4, size=lowered.num_nodes).astype(float)
    _, end, _ = lowered.run(durations, binding=False)
    node = data.draw(st.integers(0, lowered.num_nodes - 1))
    raised = durations.copy()
    raised[node] += data.draw(st.sampled_from([0.5, 1.0, 3.0]))
    _, end_raised, _ = lowered.run(raised, binding=False)
    assert end_raised.max() >= end.max()


def test_nic_ports_can_show_a_list_scheduling_anomaly():
    """Ports shared by several senders are FIFO by arrival: slowing one op can reorder a
    port's queue and shorten the iteration (Graham's anomaly). Documented, not a bug."""
    table = random_table(153, max_devices=4, max_stages=4, max_microbatches=3, overlap=0,
                         replicate=0.3, uneven=0)
    lowered = lower(table, contention="nic", devices_per_node=2)
    durations = np.random.default_rng(153).integers(1, 4, size=lowered.num_nodes).astype(float)
    _, end, _ = lowered.run(durations, binding=False)
    raised = durations.copy()
    raised[4] += 1
    _, end_raised, _ = lowered.run(raised, binding=False)
    assert (end.max(), end_raised.max()) == (41.0, 39.0)


@given(seed=seeds)
def test_no_contention_is_never_slower_than_link(seed):
    table = random_table(seed)
    costs = random_stage_costs(table, seed)
    none = evaluate(table, costs, contention="none")
    link = evaluate(table, costs, contention="link")
    assert none.makespan <= link.makespan + 1e-9
    assert np.all(none.op_start <= link.op_start + 1e-9)


@pytest.mark.parametrize("p,m", [(1, 1), (2, 1), (4, 2), (4, 8), (8, 3), (8, 32), (5, 7)])
@pytest.mark.parametrize("b", [1.0, 2.0, 3.0])
def test_flush_schedules_bubble_and_memory(p, m, b):
    expected = (p - 1) / (m + p - 1)
    gpipe = evaluate(generate("gpipe", devices=p, microbatches=m), UnitCosts(b=b))
    one = evaluate(generate("1f1b", devices=p, microbatches=m), UnitCosts(b=b))
    assert gpipe.bubble_ratio == pytest.approx(expected)
    assert one.bubble_ratio == pytest.approx(expected)
    assert gpipe.makespan == one.makespan == (m + p - 1) * (1 + b)
    assert [d.peak_memory for d in one.devices] == [min(p - d, m) for d in range(p)]
    assert [d.peak_memory for d in gpipe.devices] == [m] * p


def test_device_idle_split():
    result = evaluate(generate("1f1b", devices=4, microbatches=8), UnitCosts(b=2))
    d1 = result.devices[1]
    assert (d1.busy, d1.warmup, d1.cooldown) == (24.0, 1.0, 2.0)
    assert d1.idle == d1.warmup + d1.inside + d1.cooldown == 33 - 24
    assert result.total_compute == 96


def test_critical_path_is_a_chain_that_ends_at_the_makespan():
    result = evaluate(generate("1f1b", devices=4, microbatches=8), StageCosts(1.0, comm=0.5))
    path = result.critical_path
    assert path[0].start == 0.0 and path[-1].end == result.makespan
    for before, after in zip(path, path[1:]):
        assert after.start == pytest.approx(before.end)
    labels = [step.label for step in path]
    assert labels[:3] == ["0F0", "0F0 d0->d1", "1F0"]
    assert any(step.is_transfer and step.link == (1, 0) for step in path)


def _path_one_node_at_a_time(result):
    """The critical path as the lowering describes each node on its own (the oracle)."""
    from tabsched.nodes import CELL, TRANSFER
    lowered, steps = result._lowered, []
    for node in result.critical_nodes():
        start = float(result._node_start[node])
        end = start + float(result._node_durations[node])
        kind, label = lowered.kind_of(node), lowered.describe_node(node)
        if kind == CELL:
            steps.append((label, start, end, lowered.describe_cell(node)[1], None, "op"))
        elif kind == TRANSFER:
            k = node - lowered.nodes(TRANSFER).start
            link = (int(lowered.transfers.src[k]), int(lowered.transfers.dst[k]))
            steps.append((label, start, end, None, link, "transfer"))
        else:
            steps.append((label, start, end,
                          int(lowered.node_device[node]) if kind.on_device else None, None,
                          kind.label))
    return steps


@pytest.mark.parametrize("family, params, costs", [
    ("1f1b", {"devices": 4, "microbatches": 8}, StageCosts(1.0, comm=0.5)),
    ("dualpipev", {"devices": 4, "microbatches": 8}, StageCosts(1.0, comm=0.25)),
    ("chimera", {"devices": 4, "microbatches": 8}, StageCosts(1.0, comm=0.1)),
    ("interleaved-1f1b", {"devices": 4, "microbatches": 8, "chunks": 2}, UnitCosts()),
])
def test_critical_path_steps_are_what_each_node_describes(family, params, costs):
    """The path built at once (kinds, times and operations looked up together, overlapped
    cells from their neighbours) holds what describing each node on its own gives."""
    result = evaluate(generate(family, **params), costs)
    found = [(s.label, s.start, s.end, s.device, s.link, s.kind) for s in result.critical_path]
    assert found == _path_one_node_at_a_time(result)


def test_critical_counts_are_the_steps_kinds():
    from collections import Counter
    result = evaluate(generate("1f1b", devices=4, microbatches=8), StageCosts(1.0, comm=0.5))
    assert result.critical_counts() == dict(Counter(s.kind for s in result.critical_path)) \
        == {"op": 22, "transfer": 16}
    table = ScheduleTable([["0F0", "0B0", None, None], [None, None, "0F1", "0B1"]])
    tail = evaluate(table, UnitCosts(sync=2, optimizer=1), grad_sync="replicas",
                    optimizer=True)
    assert tail.critical_counts() == {"op": 2, "sync": 1, "optimizer": 1}


def test_links_report_transfers_and_busy_time():
    result = evaluate(generate("gpipe", devices=3, microbatches=4), StageCosts(1.0, comm=0.25))
    links = {(link.src, link.dst): link for link in result.links}
    assert set(links) == {(0, 1), (1, 2), (1, 0), (2, 1)}
    assert links[0, 1].transfers == 4 and links[0, 1].busy == pytest.approx(1.0)


def test_split_backward_memory_release():
    table = ScheduleTable([["0F0", "0I0", "0W0"]])
    times, values = evaluate(table, UnitCosts(input_grad_release=0.25)).memory_timeline(0)
    assert times.tolist() == [0.0, 2.0, 3.0]
    assert values.tolist() == [1.0, 0.75, 0.0]


def test_microbatch_sizes_scale_time_and_memory():
    table = ScheduleTable([["0F0", "0F1", "0B0", "0B1"]], microbatch_sizes=[1.0, 0.5])
    result = evaluate(table)
    assert result.makespan == 4.5   # (1 + 0.5) x (F=1 + B=2)
    assert result.devices[0].peak_memory == 1.5


def test_overlap_factor():
    table = ScheduleTable([["0F0", "0F1", "(0F2;0B0)OVERLAP_F_B", "0B1", "0B2"]])
    assert evaluate(table).makespan == 9.0     # 1 + 1 + (1 + 2) + 2 + 2
    assert evaluate(table, UnitCosts(overlap=0.5)).makespan == 7.5


def test_deadlock_names_a_cycle_with_devices_and_slots():
    # device 0 waits for 1B0 before sending 0F1... and device 1 waits for 0F1 first
    table = ScheduleTable([["0F0", "0B0", "0F1", "0B1"], ["1F1", "1F0", "1B0", "1B1"]])
    with pytest.raises(DeadlockError, match=r"^deadlock: the row orders contradict the "
                                            r"dependencies; each of these must end before "
                                            r"the next can start: ") as error:
        evaluate(table)
    cycle = [text for text, _, _ in error.value.cycle]
    assert set(cycle) == {"0F1", "1F1", "1F0", "1B0", "0B0"}
    assert "(device 1, slot 0)" in str(error.value)


def test_deadlock_is_fast_on_a_large_table():
    import time
    table = generate("1f1b", devices=32, microbatches=1024)
    orders = table.orders()
    orders[5][10], orders[5][600] = orders[5][600], orders[5][10]
    from tabsched.table import KIND_CODES
    device, slot, kind, stage, microbatch = [], [], [], [], []
    for d, order in enumerate(orders):
        for position, op in enumerate(order):
            device.append(d), slot.append(position), kind.append(KIND_CODES[op.kind])
            stage.append(op.stage), microbatch.append(op.microbatch)
    broken = ScheduleTable.from_arrays(device, slot, kind, stage, microbatch, table.row_lengths)
    began = time.perf_counter()
    with pytest.raises(DeadlockError, match="device 5"):
        evaluate(broken)
    assert time.perf_counter() - began < 5.0


def test_bad_arguments():
    table = generate("gpipe", devices=2, microbatches=2)
    with pytest.raises(InvalidParameterError, match="table must be a ScheduleTable, not list"):
        evaluate([[]])
    with pytest.raises(InvalidParameterError, match="costs must be a cost model, not dict"):
        evaluate(table, {"f": 1})
    lowered = lower(table)
    with pytest.raises(InvalidParameterError, match="durations have 3 columns for"):
        lowered.run(np.ones(3))
    with pytest.raises(InvalidParameterError, match="finite and not negative"):
        lowered.run(-np.ones(lowered.num_nodes))


def test_samples_axis_evaluates_each_row():
    table = generate("1f1b", devices=4, microbatches=8)
    lowered = lower(table)
    base = UnitCosts().node_durations(lowered)
    durations = np.stack([base, base * 2, base * 0.5])
    _, end, _ = lowered.run(durations)
    assert end.max(axis=1).tolist() == [33.0, 66.0, 16.5]


def test_to_dict_is_json_ready():
    import json
    data = evaluate(generate("1f1b", devices=2, microbatches=2)).to_dict(ops=True)
    text = json.dumps(data)
    assert {"makespan", "bubble_ratio", "level", "devices"} <= set(json.loads(text))
    assert data["devices"][0].keys() >= {"busy", "idle", "peak_memory"}
    assert len(data["ops"]) == 8


def test_tail_extends_the_iteration_and_counts_the_optimizer_as_busy():
    table = ScheduleTable([["0F0", "0B0", None, None], [None, None, "0F1", "0B1"]])
    result = evaluate(table, UnitCosts(1, 1, 1, 1, sync=2, optimizer=1),
                      grad_sync="replicas", optimizer=True)
    assert result.makespan == 5.0
    assert [step.kind for step in result.critical_path] == ["op", "op", "sync", "optimizer"]
    assert [d.busy for d in result.devices] == [3.0, 3.0]
    assert result.devices[0].cooldown == 0.0
    plain = evaluate(table, UnitCosts(1, 1, 1, 1, sync=2, optimizer=1))
    assert plain.makespan == 2.0


def test_stage_costs_tail():
    table = generate("1f1b", devices=2, microbatches=2)
    result = evaluate(table, StageCosts(1.0, sync=0.5, optimizer=0.25), grad_sync="all",
                      optimizer=True)
    base = evaluate(table, StageCosts(1.0))
    assert result.makespan == pytest.approx(base.makespan + 0.5 + 0.25)


def test_evaluate_many_equals_one_by_one():
    from tabsched.evaluate import evaluate_many
    table = generate("1f1b", devices=4, microbatches=8)
    models = [StageCosts(1.0), StageCosts(2.0, comm=1.0), UnitCosts(b=2),
              StageCosts(1.0, comm=0.5, contention="link"), StageCosts([1, 2, 3, 4], comm=0.1)]
    batched = evaluate_many(table, models)
    for costs, result in zip(models, batched):
        single = evaluate(table, costs)
        assert result.makespan == single.makespan
        assert [d.peak_memory for d in result.devices] == [d.peak_memory for d in single.devices]
        assert [d.idle for d in result.devices] == [d.idle for d in single.devices]
        assert [s.label for s in result.critical_path] == [s.label for s in single.critical_path]
        assert result.contention == single.contention
    with pytest.raises(InvalidParameterError, match="cost_models must hold cost models, not int"):
        evaluate_many(table, [3])


def test_table_grad_sync_is_the_default_tail_and_notes_reach_the_dict():
    table = generate("1f1b", devices=2, microbatches=2)
    assert evaluate(table, UnitCosts(sync=5)).makespan == 9
    synced = table.replace(grad_sync=[0])
    assert evaluate(synced, UnitCosts(sync=5)).makespan == 14   # stage 0's last B ends at 9
    assert evaluate(synced, UnitCosts(sync=5), grad_sync=[]).makespan == 9
    result = evaluate(synced)
    assert result.notes == [] and result.to_dict()["notes"] == []


@settings(max_examples=40)
@given(seed=st.integers(0, 2**32 - 1), blocking=st.booleans(), tail=st.booleans())
def test_link_contention_takes_the_chains_with_the_heaps_numbers(seed, blocking, tail):
    # evaluate() runs contention link as chains where they are exact (cells longer
    # than zero); the event heap on the same DAG gives the same starts to the bit
    from tabsched._testing import random_table
    table = random_table(seed)
    rng = np.random.default_rng(seed)
    costs = StageCosts(rng.exponential(1.0, table.num_stages) + 0.01,
                       comm=rng.exponential(0.5, (table.num_devices,) * 2),
                       contention="link", blocking_sends=blocking, sync=0.3,
                       optimizer=0.2)
    lowered = lower(table, contention="link", blocking_sends=blocking,
                    grad_sync="all" if tail else None, optimizer=tail)
    durations = costs.node_durations(lowered)
    heap, _, heap_binding = lowered.run(durations, end=False, method="events")
    if not len(lowered.transfers):      # nothing to chain: the heap runs
        assert engine.choose(lowered, durations) == "events"
        return
    assert engine.choose(lowered, durations) == "chained"
    chained, _, chained_binding = lowered.run(durations, end=False, method="chained")
    np.testing.assert_array_equal(chained, heap)
    transfers = lowered.nodes(TRANSFER)
    # a transfer waits for its producer or the previous one on its link, as the heap says
    np.testing.assert_array_equal(chained_binding[transfers], heap_binding[transfers])
    result = evaluate(table, costs, grad_sync="all" if tail else None, optimizer=tail)
    assert result.makespan == float((heap + durations).max())


@pytest.mark.parametrize("family, devices, microbatches, lowering", [
    ("1f1b", 4, 8, {}), ("chimera", 4, 8, {"grad_sync": "replicas", "optimizer": True}),
    ("zbv", 3, 70, {"optimizer": True}), ("gpipe", 1, 1, {}), ("interleaved-1f1b", 4, 300, {}),
])
def test_makespans_of_all_samples_are_each_samples_to_the_bit(family, devices, microbatches,
                                                              lowering):
    """The totals a summary takes, computed a device at a time over all samples, are
    _device_times' per sample (rows long enough for numpy's pairwise sums included)."""
    from tabsched.evaluate import _device_times, _makespans
    from tabsched.lower import lower
    table = generate(family, devices=devices, microbatches=microbatches)
    lowered = lower(table, **lowering)
    rng = np.random.default_rng(7)
    durations = rng.random((5, lowered.num_nodes)) * 10.0 ** rng.uniform(-6, 3, (5, 1))
    start, _, _ = lowered.run(durations, end=False)
    spans = _makespans(lowered, start, durations)
    for row in range(len(durations)):
        *_, makespan, bubble = _device_times(lowered, start[row], durations[row])
        assert spans[row] == (makespan, bubble)


def test_a_device_busy_all_along_has_no_idle_not_minus_zero():
    from tabsched.evaluate import _idle_share
    busy = sum([0.1] * 10)          # 0.9999999999999999: a makespan of 1.0 summed in parts
    assert _idle_share(busy, 1, 1.0) > 0 and _idle_share(1.0 + 2e-16, 1, 1.0) == 0.0
    assert f"{_idle_share(3 * (1.0 + 1e-16), 3, 1.0):.1%}" == "0.0%"
    assert _idle_share(0.0, 0, 0.0) == 0.0 and _idle_share(1.0, 2, 1.0) == 0.5
    table = generate("interleaved-1f1b", devices=1, microbatches=16, chunks=3)
    assert evaluate(table, StageCosts([0.1, 0.2, 0.3])).bubble_ratio >= 0.0


def test_checked_durations_names_the_first_bad_node_and_passes_large_finite_ones():
    """A sum and a minimum decide most durations at once; a NaN, an infinity or a
    negative one is still named (the first), and finite ones whose sum overflows pass."""
    import sys
    import numpy as np
    from tabsched import InvalidParameterError, UnitCosts, generate, lower
    checked = sys.modules["tabsched.evaluate"].checked_durations
    lowered = lower(generate("1f1b", devices=2, microbatches=2))
    costs = UnitCosts()
    durations = costs.node_durations(lowered)
    assert checked(costs, lowered, durations) is not None
    huge = np.full(lowered.num_nodes, 1e308)
    assert np.array_equal(checked(costs, lowered, huge), huge)
    for value, shown in ((np.nan, "nan"), (np.inf, "inf"), (-1.0, "-1.0")):
        bad = durations.copy()
        bad[[1, 2]] = value
        with pytest.raises(InvalidParameterError,
                           match=rf"^the costs give {lowered.describe_node(1)} a duration of "
                                 rf"{shown} "):
            checked(costs, lowered, bad)
