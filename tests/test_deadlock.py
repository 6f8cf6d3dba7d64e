"""Deadlock reports (tabsched/deadlock.py): the walk's edges and the one-line cycle."""

import numpy as np
import pytest

from tabsched import DeadlockError, ScheduleTable
from tabsched._testing import random_table
from tabsched.deadlock import cycle_text, deadlock_error, reverse_edges
from tabsched.lower import lower
from tabsched.nodes import CELL


@pytest.mark.parametrize("seed", range(10))
def test_reverse_edges_hold_every_edge_the_row_predecessor_last(seed):
    lowered = lower(random_table(seed), contention="link")
    pred_indptr, predecessors = reverse_edges(lowered)
    sources = np.repeat(np.arange(lowered.num_nodes), np.diff(lowered.indptr))
    assert sorted(zip(sources.tolist(), lowered.successors.tolist())) == sorted(
        zip(predecessors.tolist(), np.repeat(np.arange(lowered.num_nodes),
                                             np.diff(pred_indptr)).tolist()))
    for node in range(lowered.num_nodes):
        mine = predecessors[pred_indptr[node]:pred_indptr[node + 1]].tolist()
        row = [p for p in mine if p == node - 1 and lowered.node_kind[node] == CELL
               and lowered.node_device[p] == lowered.node_device[node]]
        if row:                           # the previous cell of the device comes last
            assert mine[-1] == row[0]


def test_the_error_names_the_cells_of_one_cycle_and_keeps_every_node():
    table = ScheduleTable([["0F0", "0B0", "0F1", "0B1"], ["1F1", "1F0", "1B0", "1B1"]])
    lowered = lower(table)
    assert lowered.unfinished is not None
    error = deadlock_error(lowered, lowered.unfinished)
    assert isinstance(error, DeadlockError)
    assert {text for text, _, _ in error.cycle} == {"0F1", "1F1", "1F0", "1B0", "0B0"}
    assert any(lowered.node_kind[node] != CELL for node in error.nodes)   # transfers too
    with pytest.raises(DeadlockError, match=r"^deadlock: the row orders contradict"):
        lowered.check_acyclic()


def test_a_run_on_one_device_is_folded():
    steps = [(f"0F{k}", 0, k) for k in range(6)] + [("1B0", 1, 3)]
    text = cycle_text(steps)
    assert text == ("0F0 (device 0, slot 0) -> [4 more on device 0] -> 0F5 (device 0, slot 5)"
                    " -> 1B0 (device 1, slot 3) -> 0F0")
    assert cycle_text([]) == "(no operation on the cycle)"
