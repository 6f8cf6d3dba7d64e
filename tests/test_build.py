"""The compiled construction steps (tabsched._build) against their plain-Python twins."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from tabsched import _build, _reference
from tabsched._testing import random_table

I32 = np.int32


def dependencies_both(kind, stage, microbatch, S, M, device=None):
    outputs = []
    ops = len(kind)
    device = np.zeros(ops, I32) if device is None else np.asarray(device, I32)
    for module in (_build, _reference):
        producer, consumer = np.full(2 * ops, -9, I32), np.full(2 * ops, -9, I32)
        group = np.full(2 * ops, -9, np.int8)
        crossing = np.full(2 * ops, -9, np.int8)
        count = module.dependencies(np.asarray(kind, np.int8), np.asarray(stage, I32),
                                    np.asarray(microbatch, I32), device, S, M,
                                    np.zeros(S * M, I32), np.zeros(S * M, I32),
                                    np.zeros(S * M, I32), producer, consumer, group, crossing)
        outputs.append((count, producer[:max(count, 0)], consumer[:max(count, 0)],
                        group[:max(count, 0)], crossing[:max(count, 0)]))
    return outputs


@given(seed=st.integers(0, 2**32 - 1))
def test_dependencies_equal_reference(seed):
    table = random_table(seed)
    mine, theirs = dependencies_both(table.kind, table.stage, table.microbatch,
                                     table.num_stages, table.num_microbatches, table.device)
    assert mine[0] == theirs[0] > 0
    for a, b in zip(mine[1:], theirs[1:]):
        np.testing.assert_array_equal(a, b)
    producer, consumer, group, crossing = mine[1:]
    np.testing.assert_array_equal(crossing, table.device[producer] != table.device[consumer])
    assert np.all(np.diff(group) >= 0)
    assert np.all(table.stage[producer[group == _build.ACTIVATION]] + 1
                  == table.stage[consumer[group == _build.ACTIVATION]])


def test_dependencies_report_missing_producers_and_bad_ids():
    # 0B0 without 0F0
    assert [out[0] for out in dependencies_both([1], [0], [0], 1, 1)] == [_build.MISSING] * 2
    counts = [out[0] for out in dependencies_both([0], [3], [0], 1, 1)]   # stage out of range
    assert counts[0] == counts[1] == -1 - _build.BAD_INDEX
    counts = [out[0] for out in dependencies_both([7], [0], [0], 1, 1)]   # not a kind
    assert counts[0] == counts[1] < -1


@given(edges=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), max_size=30))
def test_csr_keeps_each_nodes_successors_in_list_order(edges):
    sources = np.array([v for v, _ in edges], I32)
    targets = np.array([u for _, u in edges], I32)
    outputs = []
    for module in (_build, _reference):
        indptr, successors = np.zeros(7, I32), np.zeros(len(edges), I32)
        assert module.csr(sources, targets, indptr, successors) == _build.OK
        outputs.append((indptr, successors))
    for a, b in zip(*outputs):
        np.testing.assert_array_equal(a, b)
    indptr, successors = outputs[0]
    for v in range(6):
        assert successors[indptr[v]:indptr[v + 1]].tolist() == [u for s, u in edges if s == v]


def test_csr_checks_ids():
    for module in (_build, _reference):
        assert module.csr(np.array([0, 9], I32), np.array([1, 1], I32), np.zeros(3, I32),
                          np.zeros(2, I32)) == _build.BAD_INDEX
        assert module.csr(np.array([0], I32), np.array([-1], I32), np.zeros(3, I32),
                          np.zeros(1, I32)) == _build.BAD_INDEX
        assert module.csr(np.array([0], I32), np.array([1], I32), np.zeros(3, I32),
                          np.zeros(2, I32)) == _build.BAD_SHAPE


def edge_list_csr(table):
    """The plain lowering's CSR as lowering built it before ``plain_csr``: its three
    edge groups (row order, dependencies through transfer nodes, transfers to their
    consumers) as edge lists, then ``csr``; with the arrays ``plain_csr`` reads."""
    from tabsched.edges import dependencies
    fresh = table.cell_starts()
    cell_of_op = (np.cumsum(fresh, dtype=I32) - 1).astype(I32)
    cell_device = table.device[fresh].astype(I32)
    cells = len(cell_device)
    producers, consumers, _, crossing = dependencies(table)
    transfers = int(crossing.sum())
    transfer_node = np.arange(cells, cells + transfers, dtype=I32)
    same_row = np.flatnonzero(cell_device[1:] == cell_device[:-1]).astype(I32)
    targets = cell_of_op[consumers]
    targets[crossing] = transfer_node
    sources = np.concatenate([same_row, cell_of_op[producers], transfer_node])
    targets = np.concatenate([same_row + 1, targets, cell_of_op[consumers[crossing]]])
    indptr, successors = np.empty(cells + transfers + 1, I32), np.empty(len(sources), I32)
    assert _build.csr(sources.astype(I32), targets.astype(I32), indptr, successors) == _build.OK
    return (indptr, successors), (cell_device, cell_of_op, producers, consumers,
                                  crossing.view(np.int8))


@given(seed=st.integers(0, 2**32 - 1))
def test_plain_csr_is_the_csr_of_the_edge_lists(seed):
    """The plain lowering's CSR written at once is the one the edge lists give, every
    node's successors in the same order (Kahn's order and the binding depend on it)."""
    table = random_table(seed)
    (indptr, successors), arrays = edge_list_csr(table)
    for module in (_build, _reference):
        mine_indptr, mine = np.full(len(indptr), -9, I32), np.full(len(successors), -9, I32)
        assert module.plain_csr(*arrays, mine_indptr, mine) == _build.OK
        np.testing.assert_array_equal(mine_indptr, indptr)
        np.testing.assert_array_equal(mine, successors)


def test_plain_csr_checks_ids_and_shapes():
    table = random_table(7)
    (indptr, successors), arrays = edge_list_csr(table)
    cell_device, cell_of_op, producers, consumers, crossing = arrays
    bad_cell = cell_of_op.copy()
    bad_cell[0] = len(cell_device)
    bad_op = producers.copy()
    bad_op[0] = len(cell_of_op)
    for module in (_build, _reference):
        def status(*given, nodes=len(indptr), edges=len(successors)):
            return module.plain_csr(*given, np.empty(nodes, I32), np.empty(edges, I32))
        assert status(*arrays) == _build.OK
        assert status(cell_device, bad_cell, producers, consumers, crossing) == _build.BAD_INDEX
        assert status(cell_device, cell_of_op, bad_op, consumers, crossing) == _build.BAD_INDEX
        assert status(*arrays, nodes=len(indptr) + 1) == _build.BAD_SHAPE  # transfers missing
        assert status(*arrays, edges=len(successors) - 1) == _build.BAD_SHAPE
        assert status(cell_device, cell_of_op, producers, consumers[:-1],
                      crossing) == _build.BAD_SHAPE


@given(seed=st.integers(0, 2**32 - 1), release=st.sampled_from([0.0, 0.3, 1.0]),
       integer=st.booleans())
def test_activation_peaks_equal_the_timelines(seed, release, integer):
    from tabsched import StageCosts, evaluate
    from tabsched.memory import activation_peaks
    table = random_table(seed)
    rng = np.random.default_rng(seed)
    forward = rng.integers(0, 3, table.num_stages) * 1.0 if integer else \
        rng.exponential(1.0, table.num_stages)
    costs = StageCosts(forward, comm=0.5, input_grad_release=release,
                       activation=rng.exponential(1.0, table.num_stages))
    result = evaluate(table, costs, formula=False)
    expected = [max(0.0, float(values.max())) if len(values) else 0.0
                for _, values in result.memory_timeline()]
    assert activation_peaks(result) == expected          # to the bit
    assert [d.peak_memory for d in result.devices] == expected
    lowered = result._lowered
    activation = rng.integers(0, 3, len(table)) * 1.0
    transient = rng.integers(0, 2, len(table)) * rng.exponential(1.0, len(table))
    durations = result._node_durations.copy()
    durations[rng.integers(0, lowered.num_nodes, 3)] = 0.0     # zero-length cells: ties
    start, _, _ = lowered.run(durations, binding=False, end=False)
    outputs = []
    for module in (_build, _reference):
        peaks = np.full(table.num_devices, np.nan)
        status = module.activation_peaks(table.device, table.kind, lowered.cell_of_op,
                                         start[0], durations, activation, transient, release,
                                         peaks)
        if module is _build and status == _build.BAD_SHAPE:    # an overlapped cell: the
            return                                             # caller sorts instead
        assert status == _build.OK
        outputs.append(peaks)
    np.testing.assert_array_equal(*outputs)


def test_activation_peaks_count_working_memory_as_the_timeline_does():
    from tabsched import ModelCosts, evaluate, generate
    from tabsched.memory import activation_peaks
    for family in ("1f1b", "zbv", "interleaved-1f1b"):
        table = generate(family, devices=4, microbatches=8, **(
            {"chunks": 2} if family == "interleaved-1f1b" else {}))
        costs = ModelCosts("paper-128l", "mid_nw_mid_cp", recompute="full")
        assert np.any(costs.transient_sizes(table) > 0)
        result = evaluate(table, costs, formula=False)
        expected = [max(0.0, float(values.max())) for _, values in result.memory_timeline()]
        assert activation_peaks(result) == expected                 # to the bit


def _peaks(module, device, kind, cells, start, durations):
    n = len(device)
    return module.activation_peaks(np.array(device, I32), np.array(kind, np.int8),
                                   np.array(cells, I32), np.array(start, float),
                                   np.array(durations, float), np.ones(n), np.zeros(n), 0.0,
                                   np.zeros(2))


def test_activation_peaks_refuse_what_they_cannot_order():
    for module in (_build, _reference):
        assert _peaks(module, [1, 0], [0, 1], [0, 1], [0, 1], [1, 1]) == _build.BAD_INDEX
        assert _peaks(module, [0, 2], [0, 1], [0, 1], [0, 1], [1, 1]) == _build.BAD_INDEX
        assert _peaks(module, [0, 0], [0, 1], [0, 5], [0, 1], [1, 1]) == _build.BAD_INDEX
    # device 0's times fall (F at 2..3, then B ending at 1): the kernel leaves it to a sort
    assert _peaks(_build, [0, 0], [0, 1], [0, 1], [2, 0], [1, 1]) == _build.BAD_SHAPE


@given(lists=st.lists(st.lists(st.integers(0, 9), max_size=4), min_size=1, max_size=6),
       extra=st.lists(st.integers(-1, 9), min_size=6, max_size=6))
def test_append_one_equals_reference(lists, extra):
    indptr = np.concatenate([[0], np.cumsum([len(items) for items in lists])]).astype(I32)
    items = np.array([item for row in lists for item in row], I32)
    extra = np.array(extra[:len(lists)], I32)
    size = len(items) + int(np.sum(extra != -1))
    outputs = []
    for module in (_build, _reference):
        new_indptr, new_items = np.zeros(len(lists) + 1, I32), np.zeros(size, I32)
        assert module.append_one(indptr, items, extra, new_indptr, new_items) == _build.OK
        outputs.append((new_indptr, new_items))
        # too little room is refused, not overrun
        assert module.append_one(indptr, items, extra, np.zeros(len(lists) + 1, I32),
                                 np.zeros(max(size - 1, 0), I32)) in (
            _build.BAD_SHAPE, _build.OK if size == 0 else _build.BAD_SHAPE)
    for a, b in zip(*outputs):
        np.testing.assert_array_equal(a, b)
    new_indptr, new_items = outputs[0]
    for row, items_of_row in enumerate(lists):
        expected = items_of_row + ([int(extra[row])] if extra[row] != -1 else [])
        assert new_items[new_indptr[row]:new_indptr[row + 1]].tolist() == expected


@given(seed=st.integers(0, 2**32 - 1), cap=st.sampled_from([None, 0, 1, 3, "mixed"]))
def test_fill_idle_equals_reference(seed, cap):
    from tabsched import StageCosts
    from tabsched.adapt.split_backward import SplitBackward, _fill_idle_arrays
    table = random_table(seed, split=0.0)
    rng = np.random.default_rng(seed)
    costs = StageCosts(rng.exponential(1.0, table.num_stages),
                       comm=rng.exponential(0.3, (table.num_devices,) * 2))
    chosen = rng.random(table.num_devices) < 0.7
    staged = SplitBackward()._staged(table, np.ones(table.num_devices, dtype=bool))
    caps = ([None if rng.random() < 0.3 else int(rng.integers(0, 3))
             for _ in range(table.num_devices)] if cap == "mixed"
            else [cap] * table.num_devices)
    arrays = _fill_idle_arrays(staged, costs, chosen, caps)
    outputs = []
    for module in (_build, _reference):
        rows = np.full(len(arrays[0]), -9, I32)
        count = np.full(table.num_devices, -9, I32)
        placed = module.fill_idle(*arrays, rows, count)
        outputs.append((placed, rows, count))
    assert outputs[0][0] == outputs[1][0] == len(arrays[0])
    for a, b in zip(outputs[0][1:], outputs[1][1:]):
        np.testing.assert_array_equal(a, b)


def test_fill_idle_checks_its_arrays():
    f64, i8 = np.float64, np.int8
    base = [np.ones(2, f64), np.array([0, 0], I32), np.zeros(2, i8),
            np.array([0, 0, 1], I32), np.array([0], I32), np.zeros(1, f64),
            np.zeros(3, I32), np.zeros(0, I32), np.array([0, 2], I32), np.array([0, 1], I32),
            np.array([-1], I32)]
    for module in (_build, _reference):
        rows, count = np.zeros(2, I32), np.zeros(1, I32)
        assert module.fill_idle(*base, rows, count) == 2
        assert rows.tolist() == [0, 1]
    bad = list(base)
    bad[4] = np.array([5], I32)                 # a producer that is not a cell
    assert _build.fill_idle(*bad, np.zeros(2, I32), np.zeros(1, I32)) == -1 - _build.BAD_INDEX
    bad = list(base)
    bad[3] = np.array([0, 3, 1], I32)           # offsets past the end
    assert _build.fill_idle(*bad, np.zeros(2, I32), np.zeros(1, I32)) == -1 - _build.BAD_SHAPE
    bad = list(base)
    bad[9] = np.array([1, 0], I32)              # the row is fine; a main cell on the wrong
    bad[1] = np.array([0, 1], I32)              # device is not
    assert _build.fill_idle(*bad, np.zeros(2, I32), np.zeros(1, I32)) == -1 - _build.BAD_INDEX


@given(seed=st.integers(0, 2**32 - 1), damage=st.sampled_from(
    ["none", "drop", "twice", "move", "kind", "stage", "split"]))
def test_table_is_valid_equals_reference_and_validate(seed, damage):
    from tabsched import ScheduleTable
    from tabsched.exceptions import InvalidScheduleError
    table = random_table(seed)
    rng = np.random.default_rng(seed)
    device, kind = table.device.copy(), table.kind.copy()
    stage, microbatch = table.stage.copy(), table.microbatch.copy()
    k = int(rng.integers(len(table)))
    keep = np.ones(len(table), dtype=bool)
    if damage == "drop":
        keep[k] = False
    elif damage == "twice":
        j = (k + 1) % len(table)
        kind[j], stage[j], microbatch[j] = kind[k], stage[k], microbatch[k]
    elif damage == "move":
        device[k] = (device[k] + 1) % max(table.num_devices, 2)
    elif damage == "kind":
        kind[k] = (kind[k] + 1) % 4
    elif damage == "stage":
        stage[k] = table.num_stages + 3
    elif damage == "split":
        kind[kind == 1] = 2
    columns = [np.ascontiguousarray(c[keep]) for c in (device, kind, stage, microbatch)]
    S, M = table.num_stages, table.num_microbatches
    answers = [module.table_is_valid(*columns, S, M, np.zeros(4 * S * M, np.int8),
                                     np.zeros(S * M, I32)) for module in (_build, _reference)]
    assert answers[0] == answers[1]
    lengths = np.full(max(table.num_devices, int(columns[0].max()) + 1), 10**6, dtype=I32)
    try:
        ScheduleTable.from_arrays(columns[0], np.arange(len(columns[0])), columns[1],
                                  columns[2], columns[3], lengths, num_stages=S,
                                  num_microbatches=M)
        valid = True
    except InvalidScheduleError:
        valid = False
    assert answers[0] == int(valid)


def test_fill_idle_refuses_a_cell_listed_twice():
    f64, i8 = np.float64, np.int8
    length, device = np.ones(2, f64), np.array([0, 0], I32)
    no_deps = (np.zeros(3, I32), np.zeros(0, I32), np.zeros(0, f64))
    twice = _build.fill_idle(length, device, np.zeros(2, i8), *no_deps, np.zeros(3, I32),
                             np.zeros(0, I32), np.array([0, 3], I32), np.array([0, 1, 1], I32),
                             np.array([-1], I32), np.zeros(2, I32), np.zeros(1, I32))
    assert twice == _build.NO_MEMORY
    released_twice = _build.fill_idle(
        length, device, np.array([0, 1], i8), *no_deps, np.array([0, 2, 2], I32),
        np.array([1, 1], I32), np.array([0, 1], I32), np.array([0], I32),
        np.array([-1], I32), np.zeros(2, I32), np.zeros(1, I32))
    assert released_twice == _build.NO_MEMORY


@given(kinds=st.lists(st.integers(0, 7), max_size=300), explicit=st.booleans())
def test_slot_peak_equals_reference(kinds, explicit):
    grid = np.asarray(kinds, np.int8)
    assert _build.slot_peak(grid, explicit) == _reference.slot_peak(grid, explicit) >= 0


def test_slot_peak_counts_the_implicit_weight_queue():
    from tabsched.schedules.v_shape import IDLE
    # F F I I idle idle: two W's queue behind the I's and the idle slots run them
    grid = np.array([0, 1, 2, 3, IDLE, IDLE], np.int8)
    assert _build.slot_peak(grid, False) == 2
    # with the W's explicit (4, 5) the peak is the same two forwards
    assert _build.slot_peak(np.array([0, 1, 2, 3, 4, 5], np.int8), True) == 2
    # idle slots before any I drain nothing: F idle F I idle -> 2
    assert _build.slot_peak(np.array([0, IDLE, 1, 2, IDLE], np.int8), False) == 2


def _v_profile(draw_seed, p, m):
    """A random V profile: durations, delays, activations, a release and limits (some
    without bound, some tight enough that settings fail)."""
    rng = np.random.default_rng(draw_seed)
    stages = 2 * p
    duration = np.ascontiguousarray(rng.uniform(0.2, 3.0, (3, stages)))
    delay = np.ascontiguousarray(rng.choice([0.0, 0.05, 0.5], (2, stages)))
    activation = rng.uniform(0.5, 2.0, stages)
    pair = activation[:p] + activation[::-1][:p]
    limit = np.where(rng.random(p) < 0.3, np.inf, pair / 2 * rng.integers(1, 2 * p + 2, p))
    return duration, delay, activation, float(rng.choice([0.0, 0.5, 0.8])), limit


@given(seed=st.integers(0, 2**32 - 1), p=st.integers(1, 6), m=st.integers(1, 12),
       fill_forward=st.booleans(), fill_backward=st.booleans(), refine=st.booleans())
def test_v_heuristic_run_equals_reference(seed, p, m, fill_forward, fill_backward, refine):
    duration, delay, activation, release, limit = _v_profile(seed, p, m)
    allowance = np.random.default_rng(seed + 1).uniform(0.0, 2.0, p) if refine else None
    outputs = []
    for module in (_build, _reference):
        idle = np.full(p, -7.0)
        orders = (np.zeros(6 * m * p, np.int8), np.zeros(6 * m * p, I32),
                  np.zeros(6 * m * p, I32), np.zeros(p, I32))
        status = module.v_heuristic_run(duration, delay, activation, release, limit,
                                        allowance, m, fill_forward, fill_backward, idle,
                                        *orders)
        outputs.append((status, idle, orders))
    (mine, my_idle, my_orders), (theirs, their_idle, their_orders) = outputs
    assert mine == theirs and mine in (_build.OK, _build.INFEASIBLE)
    if mine == _build.OK:
        np.testing.assert_array_equal(my_idle, their_idle)          # to the bit
        for a, b in zip(my_orders, their_orders):
            np.testing.assert_array_equal(a, b)
        # every device runs each of its 2m F, I and W once
        np.testing.assert_array_equal(my_orders[3], np.full(p, 6 * m))


def test_v_heuristic_run_refuses_disagreeing_shapes():
    duration, delay, activation, release, limit = _v_profile(0, 3, 4)
    status = _build.v_heuristic_run(duration[:, :-1].copy(), delay, activation, release,
                                    limit, None, 4, True, True, np.zeros(3),
                                    np.zeros(72, np.int8), np.zeros(72, I32),
                                    np.zeros(72, I32), np.zeros(3, I32))
    assert status == _build.BAD_SHAPE


def _zb_profile(draw_seed, p):
    """A random zb-auto profile: durations (some all equal, for ties), transfer times,
    activations, a release and the room per stage (some without bound, some a whole
    number of activations, which the tolerance decides, some in between)."""
    rng = np.random.default_rng(draw_seed)
    if rng.random() < 0.3:
        duration = np.ascontiguousarray(np.repeat(rng.choice([0.5, 1.0], (3, 1)), p, axis=1))
    else:
        duration = np.ascontiguousarray(rng.uniform(0.2, 3.0, (3, p)))
    send_forward, send_backward = (rng.choice([0.0, 0.05, 0.5], max(p - 1, 0))
                                   for _ in range(2))
    activation = rng.uniform(0.5, 2.0, p)
    count = np.where(rng.random(p) < 0.5, rng.integers(1, 2 * p + 2, p),
                     rng.uniform(1.0, 2.5 * p, p))
    room = np.where(rng.random(p) < 0.2, np.inf, count * activation)
    return (duration, send_forward, send_backward, activation,
            float(rng.choice([0.0, 0.5, 0.8])), room)


@given(seed=st.integers(0, 2**32 - 1), p=st.integers(1, 8), m=st.integers(1, 16),
       delay_first_backward=st.booleans(), skip_forward=st.booleans(),
       greedy_weights=st.booleans())
def test_zb_heuristic_run_equals_reference(seed, p, m, delay_first_backward, skip_forward,
                                           greedy_weights):
    from tabsched.schedules.zb_auto import _TOLERANCE
    profile = _zb_profile(seed, p)
    outputs = []
    for module in (_build, _reference):
        orders = (np.full(3 * m * p, -7, np.int8), np.full(3 * m * p, -7, I32),
                  np.zeros(p, I32), np.full(1, -7.0))
        status = module.zb_heuristic_run(*profile, _TOLERANCE, m, delay_first_backward,
                                         skip_forward, greedy_weights, *orders)
        outputs.append((status, orders))
    (mine, my_orders), (theirs, their_orders) = outputs
    assert mine == theirs == _build.OK
    for a, b in zip(my_orders, their_orders):
        np.testing.assert_array_equal(a, b)                     # the span to the bit
    # every stage runs each of its m F, I and W once
    np.testing.assert_array_equal(my_orders[2], np.full(p, 3 * m))


def test_zb_heuristic_run_refuses_disagreeing_shapes():
    duration, send_forward, send_backward, activation, release, room = _zb_profile(0, 3)
    orders = (np.zeros(36, np.int8), np.zeros(36, I32), np.zeros(3, I32), np.zeros(1))
    status = _build.zb_heuristic_run(duration[:, :-1].copy(), send_forward, send_backward,
                                     activation, release, room, 1e-9, 4, True, True, True,
                                     *orders)
    assert status == _build.BAD_SHAPE
    status = _build.zb_heuristic_run(duration, send_forward, send_backward, activation,
                                     release, room, 1e-9, 5, True, True, True, *orders)
    assert status == _build.BAD_SHAPE


@given(devices=st.integers(0, 12), microbatches=st.integers(0, 20))
def test_one_f_one_b_order_is_its_twins_and_megatrons(devices, microbatches):
    """The 1F1B generator's columns, written in one compiled pass, are its plain twin's,
    and each device's are ``device_order`` of its warm-up (Megatron's order)."""
    from tabsched.schedules.one_f_one_b import device_order
    total = 2 * devices * microbatches
    columns = []
    for module in (_build, _reference):
        written = [np.full(total, -9, I32), np.full(total, -9, I32),
                   np.full(total, -9, np.int8), np.full(total, -9, I32)]
        assert module.one_f_one_b_order(devices, microbatches, *written) == _build.OK
        columns.append(written)
    for mine, theirs in zip(*columns):
        np.testing.assert_array_equal(mine, theirs)
    device, position, kind, microbatch = columns[0]
    steps = 2 * microbatches
    for d in range(devices):
        kinds, mbs = device_order(min(devices - d - 1, microbatches), microbatches)
        row = slice(d * steps, (d + 1) * steps)
        assert (device[row] == d).all() and position[row].tolist() == list(range(steps))
        assert kind[row].tolist() == kinds.tolist() and microbatch[row].tolist() == mbs.tolist()


def test_one_f_one_b_order_checks_its_shapes():
    for module in (_build, _reference):
        def status(devices, microbatches, total):
            return module.one_f_one_b_order(devices, microbatches, np.empty(total, I32),
                                            np.empty(total, I32), np.empty(total, np.int8),
                                            np.empty(total, I32))
        assert status(2, 3, 12) == _build.OK
        assert status(2, 3, 11) == _build.BAD_SHAPE
        assert status(-1, 3, 0) == _build.BAD_SHAPE


def direct_csr_both(table, cell_of_op=None, cell_device=None, spare=0):
    """``direct_csr`` of ``table`` by both modules: [(count, indptr, successors[:count])]."""
    fresh = table.cell_starts()
    cell_of_op = (np.cumsum(fresh, dtype=I32) - 1) if cell_of_op is None else cell_of_op
    cell_device = table.device[fresh].astype(I32) if cell_device is None else cell_device
    S, M, ops = table.num_stages, table.num_microbatches, len(table)
    outputs = []
    for module in (_build, _reference):
        indptr = np.full(len(cell_device) + 1, -9, I32)
        successors = np.full(len(cell_device) + 2 * ops + spare, -9, I32)
        count = module.direct_csr(table.kind, table.stage, table.microbatch, cell_of_op,
                                  cell_device, S, M, np.zeros(S * M, I32), np.zeros(S * M, I32),
                                  np.zeros(S * M, I32), indptr, successors)
        outputs.append((count, indptr, successors[:max(count, 0)]))
    return outputs


@given(seed=st.integers(0, 2**32 - 1))
def test_direct_csr_is_its_twins_and_the_plain_csr_with_nothing_crossing(seed):
    """The direct lowering's CSR, written from the table's columns, is its twin's; every
    cell's successors are those ``plain_csr`` writes from ``dependencies`` when no
    dependency crosses (in the same order where a cell holds one operation)."""
    table = random_table(seed)
    (count, indptr, successors), theirs = direct_csr_both(table)
    assert count >= 0
    for mine, twin in zip((count, indptr, successors), theirs):
        np.testing.assert_array_equal(mine, twin)
    _, (cell_device, cell_of_op, producers, consumers, crossing) = edge_list_csr(table)
    plain_indptr = np.empty(len(cell_device) + 1, I32)
    plain = np.empty(count, I32)
    assert _build.plain_csr(cell_device, cell_of_op, producers, consumers,
                            np.zeros_like(crossing), plain_indptr, plain) == _build.OK
    np.testing.assert_array_equal(indptr, plain_indptr)
    one_op = np.bincount(cell_of_op, minlength=len(cell_device)) == 1
    for c in range(len(cell_device)):
        row, their_row = successors[indptr[c]:indptr[c + 1]], plain[indptr[c]:indptr[c + 1]]
        if one_op[c]:
            np.testing.assert_array_equal(row, their_row)
        else:
            assert sorted(row.tolist()) == sorted(their_row.tolist())


def test_direct_csr_checks_ids_shapes_and_missing_producers():
    from tabsched import generate
    table = generate("1f1b", devices=3, microbatches=4)
    ops = len(table)
    cells = np.arange(ops, dtype=I32)
    # 3 rows of 7 edges; activations 2 x 4, own forwards 12, input gradients 2 x 4
    assert [result[0] for result in direct_csr_both(table)] == [21 + 28, 21 + 28]
    skipped = cells.copy()
    skipped[5:] += 1                 # a cell id skipped
    assert {result[0] for result in direct_csr_both(table, skipped, np.r_[table.device,
                                                                          [2]].astype(I32))} \
        == {-1 - _build.BAD_INDEX}
    assert {result[0] for result in direct_csr_both(
        table, cells, np.r_[table.device, [2]].astype(I32))} == {-1 - _build.BAD_SHAPE}
    # a backward without its forward: its producer is missing
    forward = np.flatnonzero(table.kind == 0)[-1]
    keep = np.arange(ops) != forward
    lacking = tabsched_table(table, keep)
    assert {result[0] for result in direct_csr_both(lacking)} == {_build.MISSING}
    for module in (_build, _reference):
        short = module.direct_csr(table.kind, table.stage, table.microbatch, cells,
                                  table.device.astype(I32), 3, 4, *(np.zeros(12, I32),) * 3,
                                  np.empty(ops + 1, I32), np.empty(41, I32))
        assert short == -1 - _build.BAD_SHAPE


def tabsched_table(table, keep):
    """``table``'s operations where ``keep``, unvalidated (a table lacking one)."""
    from tabsched import ScheduleTable
    return ScheduleTable.from_arrays(table.device[keep], table.slot[keep], table.kind[keep],
                                     table.stage[keep], table.microbatch[keep],
                                     table.row_lengths, validate=False,
                                     num_stages=table.num_stages,
                                     num_microbatches=table.num_microbatches)
def squeeze_both(device, kind, microbatch, list_first, num_kinds):
    answers = []
    for module in (_build, _reference):
        start = np.full(len(device), -7, I32)
        missing = np.full(1, -7, I32)
        status = module.squeeze_slots(np.asarray(device, I32), np.asarray(kind, I32),
                                      np.asarray(microbatch, I32), np.asarray(list_first, I32),
                                      num_kinds, start, missing)
        answers.append((status, start.tolist(), missing.tolist()))
    return answers


@given(devices=st.integers(1, 4), num_kinds=st.integers(1, 6),
       sizes=st.lists(st.integers(0, 4), min_size=24, max_size=24),
       seed=st.integers(0, 2**32 - 1), shuffle=st.floats(0.0, 1.0), bad=st.booleans())
def test_squeeze_slots_equals_reference(devices, num_kinds, sizes, seed, shuffle, bad):
    # the lists' ops in an order that runs (microbatch, then kind, then device, as a
    # slot order may), partly shuffled so that some op comes before one it needs
    rng = np.random.default_rng(seed)
    sizes = np.asarray(sizes[:devices * num_kinds])
    first = np.r_[0, np.cumsum(sizes)]
    ids = np.repeat(np.arange(len(sizes)), sizes)
    device, kind = ids // num_kinds, ids % num_kinds
    microbatch = np.arange(len(ids)) - first[ids]
    order = np.lexsort((device, kind, microbatch))
    swaps = int(shuffle * len(order))
    for _ in range(swaps if shuffle > 0.5 else 0):
        a, b = rng.integers(0, len(order), 2)
        order[[a, b]] = order[[b, a]]
    device, kind, microbatch = device[order], kind[order], microbatch[order]
    if bad and len(order):
        microbatch[rng.integers(0, len(order))] += rng.integers(1, 3) * rng.choice([-1, 1]) * 5
    ours, theirs = squeeze_both(device, kind, microbatch, first, num_kinds)
    assert ours == theirs


def test_squeeze_slots_checks_its_arrays():
    assert squeeze_both([0], [0], [0], [0, 1], 1)[0][0] == 1
    assert squeeze_both([0], [0], [0], [0, 1], 2) == [(-1 - _build.BAD_SHAPE, [-7], [-7])] * 2
    assert squeeze_both([1], [0], [0], [0, 1], 1) == [(-1 - _build.BAD_INDEX, [-7], [-7])] * 2
    # an op listed twice, and one that needs an op the lists do not hold
    assert squeeze_both([0, 0], [0, 0], [0, 0], [0, 2], 1)[0][0] == -1 - _build.BAD_INDEX
    needs_missing = squeeze_both([0], [1], [0], [0, 0, 1], 2)
    assert needs_missing[0] == needs_missing[1] == (-1 - _build.DEADLOCK, [-7], [-1])


@given(variant=st.sampled_from(["v-half", "v-min"]), devices=st.integers(1, 6),
       microbatches=st.integers(1, 10))
def test_v_schedule_squeeze_equals_reference(variant, devices, microbatches):
    from unittest import mock

    from tabsched.schedules import v_shape
    compiled = v_shape.v_schedule_slots(variant, devices, microbatches)
    with mock.patch.object(v_shape, "squeeze_slots", _reference.squeeze_slots):
        assert v_shape.v_schedule_slots(variant, devices, microbatches) == compiled


def test_v_schedule_squeeze_names_the_op_that_runs_too_late():
    import pytest

    from tabsched.exceptions import TabschedError
    from tabsched.schedules.v_shape import squeeze
    # device 1's F0 in slot 0 needs device 0's, in slot 5
    with pytest.raises(TabschedError, match=r"op \(0, 0, 0\) runs after an op that needs it"):
        squeeze([[[5], [6], [7], [8]], [[0], [1], [2], [3]]])
    assert squeeze([[[0], [3], [4], [7]], [[1], [2], [5], [6]]]) == \
        [[[0], [3], [4], [7]], [[1], [2], [5], [6]]]
