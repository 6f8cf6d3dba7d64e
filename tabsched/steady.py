"""The steady-state iteration period: iterations run back to back.

A lowering (:func:`tabsched.lower.lower`) is one training iteration. Training runs
iterations one after the other, and the next iteration's warm-up may start where
the optimizer step allows. :func:`unroll` builds the DAG of ``K`` consecutive
iterations (copies of one lowering, linked by the cross-iteration edges below);
:func:`steady_periods` runs it with the engine and takes the difference of
consecutive iterations' ends.

Cross-iteration edges (iteration ``k`` -> ``k + 1``)
    * **Each device after its own step.** Device ``d``'s first cell of iteration
      ``k + 1`` follows its optimizer step of iteration ``k`` (its last cell when the
      lowering has no step, and then the gradient syncs of its stages too).
      Megatron-LM's ``train_step`` (megatron/training/training.py) calls
      ``forward_backward_func`` and then ``optimizer.step()`` on every rank before it
      returns, and the next ``train_step`` starts the next schedule; a PyTorch loop
      (``schedule.step(...)``; ``optimizer.step()``) does the same.
    * **The global synchronization** (``synchronized=True``, the default). Megatron-LM
      clips gradients by their global norm by default (``--clip-grad``, default 1.0,
      "Gradient clipping based on global L2 norm", megatron/training/arguments.py):
      ``get_grad_norm_fp32`` (megatron/core/optimizer/clip_grads.py) all-reduces the
      norm over ``grad_stats_parallel_group`` (the model-parallel group, which spans
      every pipeline rank, or every rank with the distributed optimizer) inside
      ``optimizer.step()`` before the update (a loss-scaled fp16 step's found-inf
      check is another such all-reduce). So every device's step waits for every
      device's gradients:
      one barrier node per iteration after every device's last cell and every
      gradient sync, before every optimizer step (before every first cell of the next
      iteration when the lowering has no step). The barrier lasts zero: it is an
      all-reduce of one float per rank, whose few microseconds of latency are not
      priced here.
    * **Post-validation** (``synchronized=False``): Zero Bubble's optimizer
      post-validation (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", section 4,
      "Bypassing optimizer synchronizations") lets each stage step with the partial
      global state it has and validates it one step later, rolling back on the rare
      failure (not modelled: its cost is the failure's rate times an iteration). The
      barrier is removed; only the per-device edges remain.
    * Under contention ``link`` the chain of each link (its FIFO) continues from one
      iteration's last transfer on it to the next iteration's first.

Why ``K`` iterations reach the periodic regime
    Under contention ``none`` or ``link`` (where the link chains are exact) the
    unrolled graph is a timed event graph: the end times of iteration ``k + 1``'s
    *state nodes* (those with an edge into iteration ``k + 2``: the steps or last
    cells, the syncs, the barrier, each link's last transfer) are
    ``x(k+1) = A (x) x(k)`` in the max-plus algebra, every node of an iteration
    without a predecessor inside it being a device's first cell, which has a
    cross-iteration edge (Baccelli, Cohen, Olsder and Quadrat, "Synchronization and
    Linearity", 1992, chapter 3: such systems become periodic after a transient,
    with the maximal cycle mean of ``A`` as period). Directly: ``A (x)`` is monotone
    and adds a constant through, so if ``a <= x(k) - x(k-1) <= b`` componentwise, then
    ``a <= x(k+1) - x(k) <= b``, and every later iteration advances by between ``a``
    and ``b``: the steady period lies in ``[a, b]``. When ``a == b`` the regime is
    periodic from iteration ``k - 1`` on and the period is exact. The passes below
    unroll 2 iterations, then 4, then 8 where the advances of the last one still
    differ (two iterations suffice for most schedules here: with the barrier the state
    is one number, the barrier's time, so iteration 1 is already periodic; without it,
    in 1F1B and GPipe device 0 starts first and ends last, so iteration 1 is iteration
    0 shifted by its end). The advances may stay apart for ever where ``A`` is
    reducible: a device (or a sync) that depends on nothing slower than itself runs
    ahead and idles longer in each iteration, its advance below the period, while the
    iteration end (the greatest state node) advances by the period once the
    transient is over; the upper bound holds for it in any case (every advance is at
    most ``b``), and so does the lower one (the part that ends last advances by at
    least ``a``). Past 8, the period is the mean advance of the iteration end over the
    last half of the iterations, inside ``[a, b]`` (on random tables where 8 did not
    give ``a == b``, it agreed with 64 iterations' to 1e-12). Under
    contention ``nic`` (or a zero-length cell under ``link``) the event heap runs the
    unrolled graph, which is not max-plus linear: the same passes give an estimate.

Cost: two iterations are one lowering's arrays tiled twice (numpy; the CSR compiled),
laid out as copies of the lowering's own order (Kahn's pass runs again only where the
barrier precedes the steps, which moves them) and one pass over twice the nodes:
``bench/bench_steady.py`` measures about 1.5x one ``evaluate()`` under contention
``none`` and 2x under ``link`` (1F1B, S=64, M=512, post-validation); with the
synchronization and equal steps the period costs nothing (the makespan).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tabsched import _build, engine
from tabsched.exceptions import InvalidParameterError, TabschedError
from tabsched.nodes import CELL, OPTIMIZER, SYNC, TRANSFER

__all__ = ["UnrolledSchedule", "unroll", "steady_periods", "ITERATIONS"]

INDEX = np.int32
#: The numbers of iterations unrolled in turn, until the last one's advances agree.
ITERATIONS = (2, 4, 8)
#: Advances that differ by at most this fraction of the iteration's end are one.
_TOLERANCE = 1e-9


@dataclass(eq=False)
class UnrolledSchedule:
    """``iterations`` copies of a lowering linked by the cross-iteration edges.

    Node ``i`` of copy ``k`` is node ``k * base_nodes + i``; the barrier of copy ``k``
    (with ``synchronized``) is node ``iterations * base_nodes + k``. ``state`` holds the
    base ids of the state nodes (ends compared between iterations); ``release`` the
    base id of each busy device's last node (its step, else its last cell).
    """

    indptr: np.ndarray
    successors: np.ndarray
    resources: np.ndarray
    num_resources: int
    contention: str
    iterations: int
    base_nodes: int
    synchronized: bool
    state: np.ndarray
    release: np.ndarray
    method: str
    topo_order: np.ndarray | None = None
    topo_pred_indptr: np.ndarray | None = None
    topo_predecessors: np.ndarray | None = None
    _graph: object = field(default=None, init=False, repr=False)

    def __post_init__(self):
        if self.topo_order is not None or self.method == "events":
            return      # laid out by unroll, or not needed (the event heap reads edges)
        layout, unfinished = engine.lay_out(self.indptr, self.successors)
        if layout is None:
            raise TabschedError("internal error: an unrolled lowering has a cycle "
                                "(please report this)")
        self.topo_order, self.topo_pred_indptr, self.topo_predecessors = layout

    @property
    def num_nodes(self):
        return len(self.indptr) - 1

    def check_acyclic(self):
        """Unrolled from an acyclic lowering, every cross edge pointing to a later copy."""

    def link_chains(self):
        """The link chains are built in already (see :func:`unroll`)."""
        return None

    def durations(self, durations):
        """The unrolled graph's durations from the base lowering's, shape (samples, nodes):
        every copy's the same, the barriers zero."""
        durations = np.asarray(durations, dtype=np.float64)
        samples = durations.reshape(-1, self.base_nodes)
        barriers = self.iterations if self.synchronized else 0
        tiled = np.zeros((len(samples), self.iterations * self.base_nodes + barriers))
        tiled[:, :self.iterations * self.base_nodes] = np.tile(samples, (1, self.iterations))
        return tiled


def _edges(indptr, successors):
    """``(sources, targets)`` of a CSR, in its order."""
    sources = np.repeat(np.arange(len(indptr) - 1, dtype=INDEX), np.diff(indptr))
    return sources, successors


def _device_bounds(lowered):
    """The busy devices and, for each, its first and last cell (base ids)."""
    D = lowered.table.num_devices
    first_cell = lowered.nodes(CELL).start
    bounds = first_cell + np.searchsorted(lowered.cell_device, np.arange(D + 1, dtype=INDEX))
    busy = np.flatnonzero(bounds[1:] > bounds[:-1])
    return busy, bounds[:-1][busy].astype(INDEX), (bounds[1:][busy] - 1).astype(INDEX)


def _link_ends(lowered):
    """``(first, last)`` transfer node of each link that carries one, in FIFO order:
    the producers' cells in row order, a cell's transfers by id (as the chains)."""
    transfers = lowered.transfers
    if not len(transfers):
        return np.empty(0, INDEX), np.empty(0, INDEX)
    ids = np.arange(lowered.nodes(TRANSFER).start, lowered.nodes(TRANSFER).stop, dtype=INDEX)
    link = transfers.src.astype(np.int64) * lowered.table.num_devices + transfers.dst
    order = np.lexsort((ids, lowered.cell_of_op[transfers.producer], link))
    link = link[order]
    opens = np.ones(len(link), dtype=bool)
    opens[1:] = link[1:] != link[:-1]
    closes = np.ones(len(link), dtype=bool)
    closes[:-1] = opens[1:]
    return ids[order][opens], ids[order][closes]


def unroll(lowered, iterations, *, synchronized=True, durations=None):
    """The DAG of ``iterations`` consecutive iterations of ``lowered`` (see the module
    docstring for the edges between them).

    Parameters
    ----------
    lowered : LoweredSchedule
        An acyclic lowering (a deadlocking one raises its DeadlockError).
    iterations : int
        At least 2.
    synchronized : bool
        The global synchronization before every optimizer step (False:
        post-validation).
    durations : array, optional
        The node durations the graph will run with; they choose the pass (a
        zero-length cell under ``link`` needs the event heap).

    Returns
    -------
    UnrolledSchedule
    """
    if isinstance(iterations, bool) or not isinstance(iterations, (int, np.integer)) \
            or iterations < 2:
        raise InvalidParameterError(f"iterations must be an integer >= 2, not {iterations!r}")
    lowered.check_acyclic()
    # the pull pass over the lowering or its link-chain rewrite where one is exact,
    # else the event heap over the lowering
    method, base = engine.choose_target(lowered, durations)
    n, K = lowered.num_nodes, int(iterations)
    if K * (n + 1) + K * (len(base.successors) + 4 * n) > int(np.iinfo(INDEX).max) - 1:
        # ids and edges (at most a few cross edges per node) must fit in int32
        raise InvalidParameterError(f"{K} unrolled iterations of {n} nodes and "
                                    f"{len(base.successors)} edges each are too many for the "
                                    f"kernel's int32 ids")
    busy, first, last = _device_bounds(lowered)
    steps = lowered.nodes(OPTIMIZER)
    has_steps = steps.stop > steps.start
    release = (steps.start + busy).astype(INDEX) if has_steps else last
    syncs = np.arange(lowered.nodes(SYNC).start, lowered.nodes(SYNC).stop, dtype=INDEX)

    # within one iteration: the graph itself, copy by copy
    sources, targets = _edges(base.indptr, base.successors)
    offsets = (np.arange(K, dtype=INDEX) * INDEX(n))[:, None]
    groups = [((sources + offsets).ravel(), (targets + offsets).ravel())]
    # from one iteration to the next: (source in copy k, target in copy k + 1)
    cross = [(release, first)]
    if not has_steps and len(syncs):
        devices = [lowered.sync_devices(k) for k in range(len(syncs))]
        position = np.full(lowered.table.num_devices, -1, dtype=np.int64)
        position[busy] = np.arange(len(busy))
        pairs = [(syncs[k], first[position[d]]) for k, held in enumerate(devices)
                 for d in held if position[d] >= 0]
        if pairs:
            cross.append(tuple(np.array(side, dtype=INDEX) for side in zip(*pairs)))
    state = [release, syncs]
    if method == "chained":
        opening, closing = _link_ends(lowered)
        cross.append((closing, opening))
        state.append(closing)
    for source, target in cross:
        groups.append(((source + offsets[:-1]).ravel(), (target + offsets[1:]).ravel()))
    num_nodes = K * n
    if synchronized:
        barrier = (num_nodes + np.arange(K)).astype(INDEX)
        num_nodes += K
        before = np.concatenate([last, syncs])
        groups.append(((before + offsets).ravel(), np.repeat(barrier, len(before))))
        if has_steps:
            after = np.arange(steps.start, steps.stop, dtype=INDEX)
            groups.append((np.repeat(barrier, len(after)), (after + offsets).ravel()))
        else:
            groups.append((np.repeat(barrier[:-1], len(first)),
                           (first + offsets[1:]).ravel()))
    edge_sources = np.concatenate([np.asarray(s, dtype=INDEX) for s, _ in groups])
    edge_targets = np.concatenate([np.asarray(t, dtype=INDEX) for _, t in groups])
    indptr = np.empty(num_nodes + 1, dtype=INDEX)
    successors = np.empty(len(edge_sources), dtype=INDEX)
    status = _build.csr(edge_sources, edge_targets, indptr, successors)
    if status != _build.OK:
        raise TabschedError(f"internal error: building an unrolled lowering returned status "
                            f"{status} (please report this)")
    if method == "events":
        resources = np.full((num_nodes, lowered.resources.shape[1]), engine.NO_RESOURCE,
                            dtype=INDEX)
        resources[:K * n] = np.tile(lowered.resources, (K, 1))
        num_resources = lowered.num_resources
    else:
        resources, num_resources = np.empty((num_nodes, 0), dtype=INDEX), 0
    layout = {}
    if method != "events" and not (synchronized and has_steps):
        layout = _copied_layout(base.topo_order, K, n, synchronized, edge_sources,
                                edge_targets)
    return UnrolledSchedule(
        indptr=indptr, successors=successors, resources=resources,
        num_resources=num_resources, contention=lowered.contention, iterations=K,
        base_nodes=n, synchronized=bool(synchronized),
        state=np.concatenate(state).astype(INDEX), release=release,
        method="events" if method == "events" else "pull", **layout)


def _copied_layout(base_order, K, n, barriers, sources, targets):
    """The pull pass's layout of ``K`` copies without Kahn's pass: each copy in the
    base lowering's order, its barrier after it, is topological (every edge inside a
    copy follows the base order, every cross edge and every edge into a barrier points
    to a later copy or out of its own copy), and the predecessor lists are the edges
    reversed, in positions (the compiled CSR fill). The kernel checks it when it is
    added (every predecessor at an earlier position)."""
    width = n + (1 if barriers else 0)
    order = np.empty((K, width), dtype=INDEX)
    order[:, :n] = base_order[None, :] + (np.arange(K, dtype=INDEX) * INDEX(n))[:, None]
    if barriers:
        order[:, n] = K * n + np.arange(K, dtype=INDEX)
    order = order.ravel()
    position = np.empty(len(order), dtype=INDEX)
    position[order] = np.arange(len(order), dtype=INDEX)
    pred_indptr = np.empty(len(order) + 1, dtype=INDEX)
    predecessors = np.empty(len(sources), dtype=INDEX)
    status = _build.csr(position[targets], position[sources], pred_indptr, predecessors)
    if status != _build.OK:
        raise TabschedError(f"internal error: laying out an unrolled lowering returned "
                            f"status {status} (please report this)")
    for array in (order, pred_indptr, predecessors):
        array.flags.writeable = False
    return {"topo_order": order, "topo_pred_indptr": pred_indptr,
            "topo_predecessors": predecessors}


def _iteration_ends(unrolled, ends):
    """Per sample and copy, the end of the iteration: its last state node's."""
    n = unrolled.base_nodes
    copies = ends[:, :unrolled.iterations * n].reshape(len(ends), unrolled.iterations, n)
    return copies[:, :, unrolled.state].max(axis=2)


def _advances(unrolled, ends):
    """Per sample, the least and greatest advance of a state node over the last copy."""
    n, K = unrolled.base_nodes, unrolled.iterations
    advance = ends[:, (K - 1) * n + unrolled.state] - ends[:, (K - 2) * n + unrolled.state]
    return advance.min(axis=1), advance.max(axis=1)


def _equal_steps(lowered, durations):
    """Per sample, whether every device's optimizer step lasts as long (True without
    steps)."""
    steps = durations[:, lowered.nodes(OPTIMIZER)]
    if not steps.shape[1]:
        return np.ones(len(durations), dtype=bool)
    return steps.min(axis=1) == steps.max(axis=1)


def steady_periods(lowered, durations, *, synchronized=True, makespans=None):
    """The steady-state period of each sample (row) of ``durations``.

    Parameters
    ----------
    lowered : LoweredSchedule
    durations : array, shape (nodes,) or (samples, nodes)
        The lowering's node durations, checked (finite, not negative).
    synchronized : bool
        The global synchronization before the optimizer step (False:
        post-validation); see the module docstring.
    makespans : array (samples,), optional
        The makespan of each sample alone. With the synchronization and equal steps
        (or none) the period is the makespan, exactly, and nothing is unrolled:
        every cell and transfer of iteration ``k`` ends before its barrier ``G``, and
        every device starts iteration ``k + 1`` at ``G + s`` (``s`` the step), so
        iteration ``k + 1`` is iteration ``k`` shifted by ``G + s``, the makespan, in
        every contention mode (no resource is held at the barrier).

    Returns
    -------
    periods : float64 array (samples,)
    bounds : float64 array (samples, 2)
        The least and greatest advance of the last iteration unrolled, which bound
        the period (equal where it is exact; see the module docstring).

    Examples
    --------
    >>> from tabsched import StageCosts, generate, lower
    >>> lowered = lower(generate("1f1b", devices=2, microbatches=2))
    >>> durations = StageCosts(1.0, comm=0.5).node_durations(lowered)
    >>> periods, bounds = steady_periods(lowered, durations, synchronized=False)
    >>> float(periods[0]), bounds.tolist()
    (10.0, [[10.0, 10.0]])
    """
    durations = np.asarray(durations, dtype=np.float64).reshape(-1, lowered.num_nodes)
    samples = len(durations)
    periods = np.empty(samples)
    bounds = np.empty((samples, 2))
    todo = np.arange(samples)
    if synchronized and makespans is not None:
        shifted = np.flatnonzero(_equal_steps(lowered, durations))
        makespans = np.asarray(makespans, dtype=np.float64).reshape(samples)
        periods[shifted] = makespans[shifted]
        bounds[shifted] = makespans[shifted, None]
        todo = np.flatnonzero(~_equal_steps(lowered, durations))
    for iterations in ITERATIONS:
        if not len(todo):
            break
        unrolled = unroll(lowered, iterations, synchronized=synchronized,
                          durations=durations[todo])
        tiled = unrolled.durations(durations[todo])
        start, _ = engine.run(unrolled, tiled, method=unrolled.method)
        ends = start + tiled
        low, high = _advances(unrolled, ends)
        finished = _iteration_ends(unrolled, ends)
        scale = np.maximum(1.0, np.abs(finished[:, -1]))
        exact = high - low <= _TOLERANCE * scale
        last = iterations == ITERATIONS[-1]
        half = iterations // 2
        # exact: every state node advanced alike, the iteration end with them
        mean = (finished[:, -1] - finished[:, half - 1]) / (iterations - half)
        value = np.where(exact, finished[:, -1] - finished[:, -2], np.clip(mean, low, high))
        keep = exact | last
        periods[todo[keep]] = value[keep]
        bounds[todo[keep], 0] = low[keep]
        bounds[todo[keep], 1] = high[keep]
        todo = todo[~keep]
    return periods, bounds
