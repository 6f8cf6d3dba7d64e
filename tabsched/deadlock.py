"""Deadlock reports: the operations on one cycle of a table whose rows cannot run.

A table whose row orders contradict its dependencies still lowers
(:func:`tabsched.lower.lower`); Kahn's order then leaves some nodes with
predecessors that never ran. Every such node waits for one of them, so walking
from one to such a predecessor comes back to a node already visited: the nodes
from that visit on form a cycle (:func:`tabsched.engine.find_cycle`). The report
names its cells with their devices and slots, in dependency order, a run of four
or more steps on one device folded::

    deadlock: the row orders contradict the dependencies; each of these must end
    before the next can start: 0F1 (device 0, slot 2) -> 1F1 (device 1, slot 1) -> ...
"""

import numpy as np

from tabsched import engine
from tabsched.exceptions import DeadlockError
from tabsched.nodes import CELL

__all__ = ["deadlock_error", "reverse_edges"]


def reverse_edges(lowered):
    """The reverse CSR (``pred_indptr``, ``predecessors``) of ``lowered``'s DAG.

    Within each node's list, the row-order predecessor (the previous cell of the
    same device) comes last, so a walk that takes the first candidate follows data
    dependencies across devices where it can.
    """
    n = lowered.num_nodes
    sources = np.repeat(np.arange(n, dtype=np.int32), np.diff(lowered.indptr))
    targets = lowered.successors
    device = lowered.node_device
    row_edge = ((targets == sources + 1) & (lowered.node_kind[targets] == CELL)
                & (device[sources] == device[targets]))
    order = np.lexsort((row_edge, targets))
    pred_indptr = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.bincount(targets, minlength=n), out=pred_indptr[1:])
    return pred_indptr, np.ascontiguousarray(sources[order], dtype=np.int32)


def deadlock_error(lowered, remaining):
    """The :class:`DeadlockError` of ``lowered``, whose nodes ``remaining`` marks (> 0)
    never ran: its message names the cells of one cycle; ``error.nodes`` holds every
    node of it (transfers too)."""
    cycle = engine.find_cycle(*reverse_edges(lowered), remaining)
    described = [lowered.describe_cell(int(node)) for node in cycle
                 if lowered.node_kind[node] == CELL]
    message = ("deadlock: the row orders contradict the dependencies; each of these "
               "must end before the next can start: " + cycle_text(described))
    error = DeadlockError(message, described)
    error.nodes = tuple(int(node) for node in cycle)
    return error


def cycle_text(described):
    """One line for a cycle of ``(text, device, slot)``; a run of four or more steps on
    one device is folded."""
    if not described:
        return "(no operation on the cycle)"
    parts = []
    k = 0
    while k < len(described):
        run = k
        while (run + 1 < len(described) and described[run + 1][1] == described[k][1]
               and described[run + 1][2] > described[run][2]):
            run += 1
        text, device, slot = described[k]
        parts.append(f"{text} (device {device}, slot {slot})")
        if run - k >= 3:
            parts.append(f"[{run - k - 1} more on device {device}]")
        elif run - k == 2:
            text, device, slot = described[k + 1]
            parts.append(f"{text} (device {device}, slot {slot})")
        if run > k:
            text, device, slot = described[run]
            parts.append(f"{text} (device {device}, slot {slot})")
        k = run + 1
    limit = 16
    if len(parts) > limit:
        parts = parts[:limit] + [f"... {len(parts) - limit} more steps"]
    return " -> ".join(parts + [described[0][0]])
