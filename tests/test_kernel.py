"""The Cython kernel against its plain-Python twin, and its status codes."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tabsched import _kernel, _reference
from tabsched._testing import random_durations, random_table
from tabsched.lower import lower


def run_both(lowered, durations, *, end=True, binding=True):
    outputs = []
    for module in (_kernel, _reference):
        samples, n = durations.shape
        start = np.full((samples, n), np.nan)
        finish = np.full((samples, n) if end else (0, n), np.nan)
        bound = np.full(n if binding else 0, -7, dtype=np.int32)
        indegree = np.zeros(n, dtype=np.int32)
        order = np.zeros(n, dtype=np.int32)
        heap = n if lowered.resources.shape[1] else 0
        status = module.evaluate(
            lowered.indptr, lowered.successors, durations, lowered.resources,
            lowered.num_resources, start, finish, bound, indegree, order,
            np.zeros(heap), np.zeros(heap, dtype=np.int32),
            np.zeros(lowered.num_resources), np.zeros(lowered.num_resources, dtype=np.int32))
        outputs.append((status, start, finish, bound, indegree))
    return outputs


@given(seed=st.integers(0, 2**32 - 1), contention=st.sampled_from(["none", "link", "nic"]),
       samples=st.integers(1, 3), integer=st.booleans())
def test_kernel_equals_reference(seed, contention, samples, integer):
    table = random_table(seed)
    lowered = lower(table, contention=contention, devices_per_node=2)
    durations = random_durations(lowered, seed, samples=samples, integer=integer)
    (status_k, start_k, end_k, bind_k, _), (status_r, start_r, end_r, bind_r, _) = \
        run_both(lowered, durations)
    assert status_k == status_r == _kernel.OK
    np.testing.assert_array_equal(start_k, start_r)
    np.testing.assert_array_equal(end_k, end_r)
    np.testing.assert_array_equal(bind_k, bind_r)
    np.testing.assert_array_equal(end_k, start_k + durations)


@given(seed=st.integers(0, 2**32 - 1))
def test_kernel_equals_reference_on_deadlocks(seed):
    table = random_table(seed)
    rng = np.random.default_rng(seed)
    orders = table.orders()
    device = int(rng.integers(len(orders)))
    rng.shuffle(orders[device])
    from tabsched import ScheduleTable
    shuffled = ScheduleTable.from_arrays(*_order_arrays(orders), table.row_lengths,
                                         **table.metadata)
    lowered = lower(shuffled, contention="link")
    durations = random_durations(lowered, seed)
    (status_k, *_, deg_k), (status_r, *_, deg_r) = run_both(lowered, durations)
    assert status_k == status_r
    if status_k == _kernel.DEADLOCK:
        np.testing.assert_array_equal(deg_k > 0, deg_r > 0)


def _order_arrays(orders):
    from tabsched.table import KIND_CODES, Overlap
    columns = ([], [], [], [], [])
    for device, order in enumerate(orders):
        for slot, cell in enumerate(order):
            for op in (cell.parts if isinstance(cell, Overlap) else (cell,)):
                for column, value in zip(columns, (device, slot, KIND_CODES[op.kind],
                                                   op.stage, op.microbatch)):
                    column.append(value)
    return columns


def _raw(indptr, successors, n, durations=None, resources=None, n_resources=0):
    indptr = np.asarray(indptr, dtype=np.int32)
    successors = np.asarray(successors, dtype=np.int32)
    durations = np.ones((1, n)) if durations is None else durations
    resources = np.empty((n, 0), dtype=np.int32) if resources is None else resources
    return _kernel.evaluate(indptr, successors, durations, resources, n_resources,
                            np.zeros((1, n)), np.zeros((1, n)), np.zeros(n, dtype=np.int32),
                            np.zeros(n, dtype=np.int32), np.zeros(n, dtype=np.int32),
                            np.zeros(n), np.zeros(n, dtype=np.int32),
                            np.zeros(max(n_resources, 1)), np.zeros(max(n_resources, 1),
                                                                    dtype=np.int32))


def test_kernel_status_codes_guard_memory():
    assert _raw([0, 1, 1], [1], 2) == _kernel.OK
    assert _raw([0, 1, 1], [5], 2) == _kernel.BAD_INDEX
    assert _raw([0, 1, 1], [-1], 2) == _kernel.BAD_INDEX
    assert _raw([0, 2, 1], [1, 0], 2) == _kernel.BAD_SHAPE      # indptr decreasing
    assert _raw([0, 1, 3], [1], 2) == _kernel.BAD_SHAPE         # indptr past successors
    assert _raw([0, 1, 1], [1], 2, durations=np.ones((1, 3))) == _kernel.BAD_SHAPE
    bad_resource = np.array([[3], [-1]], dtype=np.int32)
    assert _raw([0, 1, 1], [1], 2, resources=bad_resource, n_resources=1) == _kernel.BAD_INDEX
    assert _raw([0, 1, 2], [1, 0], 2) == _kernel.DEADLOCK


def test_find_cycle_matches_reference():
    # 0 -> 1 -> 2 -> 1 (cycle 1, 2), and 2 -> 3
    pred_indptr = np.array([0, 0, 2, 3, 4], dtype=np.int32)
    predecessors = np.array([0, 2, 1, 2], dtype=np.int32)
    remaining = np.array([0, 1, 1, 1], dtype=np.int32)
    out = []
    for module in (_kernel, _reference):
        cycle = np.zeros(4, dtype=np.int32)
        length = module.find_cycle(pred_indptr, predecessors, remaining, cycle,
                                   np.zeros(4, dtype=np.int32))
        out.append(list(cycle[:length]))
    assert out[0] == out[1]
    assert sorted(out[0]) == [1, 2]


def test_find_cycle_on_nothing_unfinished():
    cycle = np.zeros(2, dtype=np.int32)
    assert _kernel.find_cycle(np.array([0, 0, 1], dtype=np.int32), np.array([0], dtype=np.int32),
                              np.zeros(2, dtype=np.int32), cycle,
                              np.zeros(2, dtype=np.int32)) == 0


def test_kernel_rejects_wrong_dtypes_without_crashing():
    with pytest.raises((TypeError, ValueError)):
        _kernel.evaluate(np.array([0, 0], dtype=np.int64), np.zeros(0, dtype=np.int32),
                         np.ones((1, 1)), np.empty((1, 0), dtype=np.int32), 0,
                         np.zeros((1, 1)), np.zeros((1, 1)), np.zeros(1, dtype=np.int32),
                         np.zeros(1, dtype=np.int32), np.zeros(1, dtype=np.int32),
                         np.zeros(0), np.zeros(0, dtype=np.int32), np.zeros(0),
                         np.zeros(0, dtype=np.int32))
