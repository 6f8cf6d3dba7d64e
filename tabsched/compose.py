"""The duration composer: what cost models charge becomes the duration of every node.

Cost models only price (:mod:`tabsched.costs.base`): every operation
(``op_durations``), every transfer (``transfer_costs``), the nodes of each extra kind
(``node_prices(lowered, kind)``: gradient syncs, optimizer steps, and the kinds to
come), and the factor on an overlapped cell (``overlap``). This module is the one
place those prices become node durations of a lowering
(:class:`tabsched.lower.LoweredSchedule`), numbered as the lowering numbers its
nodes (:mod:`tabsched.nodes`):

cells
    The sum of its operations' durations in table order, from 0.0 (``0.0 + a + b``,
    as ``np.bincount`` sums), times ``overlap`` where the cell holds more than one
    operation;
transfers
    Their price, in the lowering's transfer order;
the extra kinds
    Their price per node (none: 0).

:func:`node_durations` composes one set of prices; :func:`stacked_node_durations`
composes :class:`Prices` of many rows at once (many cost models in a sweep, many
samples in Monte Carlo), each row the same numbers, to the bit, as
:func:`node_durations` gives it. The cost models of one class may price their rows
together (``CostModel.stacked_prices``); the composition is done only here.

>>> from tabsched import UnitCosts, generate, lower
>>> from tabsched.nodes import OPTIMIZER
>>> lowered = lower(generate("1f1b", devices=2, microbatches=2), optimizer=True)
>>> durations = node_durations(lowered, UnitCosts(b=2).op_durations(lowered.table),
...                            [0.5] * len(lowered.transfers), {OPTIMIZER: [3.0, 4.0]})
>>> durations.tolist()
[1.0, 1.0, 2.0, 2.0, 1.0, 2.0, 1.0, 2.0, 0.5, 0.5, 0.5, 0.5, 3.0, 4.0]
"""

from dataclasses import dataclass

import numpy as np

from tabsched.nodes import CELL, TRANSFER

__all__ = ["Prices", "cell_durations", "node_durations", "stacked_node_durations"]


@dataclass(frozen=True)
class Prices:
    """What cost models charge for one lowering, one row per cost model (or sample).

    Attributes
    ----------
    op : float64 array (rows, operations)
    transfer : float64 array (rows, transfers)
    extra : dict
        ``{kind: (rows, nodes of that kind)}`` for the extra kinds priced; a kind not
        given costs 0.
    overlap : float64 array (rows,) or (rows or 1, overlapped cells)
        The factor on a cell of several operations: one per row, or one per row (or one
        row for all) and overlapped cell (``lowered.overlapped_cells``' order).
    """

    op: np.ndarray
    transfer: np.ndarray
    extra: dict
    overlap: np.ndarray

    @classmethod
    def stack(cls, rows):
        """One :class:`Prices` of ``rows``: ``(op, transfer, extra, overlap)`` per row."""
        rows = list(rows)
        kinds = {kind for _, _, extra, _ in rows for kind in extra}
        return cls(op=np.array([row[0] for row in rows], dtype=np.float64),
                   transfer=np.array([row[1] for row in rows], dtype=np.float64),
                   extra={kind: np.array([row[2][kind] for row in rows], dtype=np.float64)
                          for kind in kinds},
                   overlap=np.array([row[3] for row in rows], dtype=np.float64))


def cell_durations(cell_of_op, num_cells, op_durations, overlap=1.0):
    """Each cell's duration: the sum of its operations' from 0.0, times ``overlap`` for a
    cell of several (``cell_of_op``: the cell of each operation, cells in table order;
    ``overlap`` one factor, or one per cell of several, in order: a cost model's
    :meth:`~tabsched.costs.base.CostModel.overlap_factors`)."""
    if num_cells == len(cell_of_op):    # a cell per operation: each sum is 0.0 + it
        return np.add(np.asarray(op_durations, dtype=np.float64), 0.0)
    cells = np.bincount(cell_of_op, weights=op_durations, minlength=num_cells)
    factors = np.asarray(overlap, dtype=np.float64)
    if (factors.ndim and factors.size) or (not factors.ndim and factors != 1.0):
        parts = np.bincount(cell_of_op, minlength=num_cells)
        cells[parts > 1] *= factors
    return cells


def node_durations(lowered, op_durations, transfer_durations, extra=None, overlap=1.0):
    """The duration of every node of ``lowered`` from one set of prices.

    Parameters
    ----------
    lowered : LoweredSchedule
    op_durations : array (operations,)
    transfer_durations : array (transfers,)
    extra : dict, optional
        ``{kind: prices of its nodes}`` for the extra kinds (:data:`tabsched.nodes.EXTRA_KINDS`).
    overlap : float

    Returns
    -------
    float64 array (nodes,)
    """
    durations = np.empty(lowered.num_nodes)
    durations[lowered.nodes(CELL)] = cell_durations(lowered.cell_of_op, lowered.num_cells,
                                                    op_durations, overlap)
    durations[lowered.nodes(TRANSFER)] = np.asarray(transfer_durations, dtype=np.float64)
    _fill_extra(lowered, durations, extra)
    return durations


def stacked_node_durations(lowered, prices):
    """The node durations of every row of ``prices`` (a :class:`Prices`), shape
    (rows, nodes): row ``r`` is :func:`node_durations` of row ``r``'s prices, to the bit.

    A cell of one operation is that operation's duration plus 0.0; a cell of several
    is ``np.add.reduceat`` over them plus 0.0 (the sum from 0.0, as ``np.bincount``
    adds), then times the row's overlap.
    """
    op = prices.op
    rows = len(op)
    durations = np.empty((rows, lowered.num_nodes))
    cells = durations[:, lowered.nodes(CELL)]
    if lowered.num_cells == op.shape[1]:      # a cell per operation, in order
        np.add(op, 0.0, out=cells)
    elif lowered.num_cells:
        np.add(np.add.reduceat(op, lowered.cell_first_op[:-1], axis=1), 0.0, out=cells)
    overlap = np.asarray(prices.overlap, dtype=np.float64)
    if overlap.ndim == 2:     # a factor per row (or one row for all) and overlapped cell
        if len(lowered.overlapped_cells):
            cells[:, lowered.overlapped_cells] *= overlap
        scaled = ()
    else:
        scaled = (range(rows) if overlap != 1.0 else ()) if overlap.ndim == 0 else \
            np.flatnonzero(overlap != 1.0).tolist()
    if len(scaled) and len(lowered.overlapped_cells):
        factors = np.broadcast_to(overlap, (rows,))
        for row in scaled:
            cells[row, lowered.overlapped_cells] *= factors[row]
    durations[:, lowered.nodes(TRANSFER)] = prices.transfer
    _fill_extra(lowered, durations, prices.extra)
    return durations


def _fill_extra(lowered, durations, extra):
    """The extra kinds' columns of ``durations``: their prices, else 0."""
    for kind in lowered.extra_kinds:
        given = None if extra is None else extra.get(kind)
        durations[..., lowered.nodes(kind)] = 0.0 if given is None else given
