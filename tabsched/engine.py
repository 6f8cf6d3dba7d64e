"""The evaluation engine: which compiled pass evaluates a lowering, and its one caller.

Every run of a lowered table (:class:`tabsched.lower.LoweredSchedule`) comes here,
and this module alone imports the compiled kernel (:mod:`tabsched._kernel`). Each
public function has the same three steps (scipy's csgraph): check the arguments,
allocate the outputs and the scratch arrays (here, nowhere else), call a pass that
sees only arrays, and turn its status into an exception.

Choosing the pass (``method="auto"``, as scipy's ``shortest_path`` chooses)
    ``"pull"``
        No node holds a resource (contention ``none``): the longest path, one pull
        pass over the lowering's Kahn order, every edge pointing backwards. A
        lowering not laid out yet takes its first runs of one sample by Kahn's loop
        itself, pushing each end to the successors (:data:`PUSH_RUNS`; the same
        starts and binding, to the bit), rather than make a layout for them; a run
        after the first follows the order the first took.
    ``"chained"``
        Contention ``link`` where the link-chain rewrite is exact
        (:meth:`~tabsched.lower.LoweredSchedule.link_chains`: every cell lasts longer
        than zero and no ``transfer_after`` edge), and no binding is asked for: the
        pull pass over the rewrite, the event heap's starts to the bit.
    ``"events"``
        Otherwise (``nic`` ports, a zero-length cell, ``transfer_after`` edges, or a
        binding under contention): the event order with first-come-first-served
        resources, a heap of ready nodes. The binding (the critical path) under
        contention is the heap's, whose tie-breaks define it.
    The fused Monte Carlo pass (:func:`monte_carlo_summary`) draws lognormal noise
    while a pull pass runs, over the lowering or its rewrite, where one of the first
    two applies.

What a pass returns
    :func:`run`: every node's start for each sample (row) of the durations, and for
    sample 0 the node that decided each start. :func:`summarize`: per sample the
    makespan and, per device, busy time, first start and last end, with no
    (samples x nodes) output. The numbers of one lowering and one set of durations
    are those of every pass that applies, to the bit (busy time may differ in the
    last bits: each pass sums it in its own order).

Construction steps of the lowering also run here: Kahn's order with the
predecessor lists (:func:`lay_out`) and a cycle after a deadlock (:func:`find_cycle`),
as do the lognormal draws of :mod:`tabsched.adapt.streams`
(:func:`lognormal_factors`).

>>> from tabsched import StageCosts, generate, lower
>>> table = generate("1f1b", devices=2, microbatches=2)
>>> lowered = lower(table, contention="link")
>>> durations = StageCosts(1.0, comm=0.5).node_durations(lowered)
>>> choose(lowered, durations), choose(lowered, durations, binding=True)
('chained', 'events')
>>> start, _ = run(lowered, durations)
>>> float((start + durations).max())
10.0
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from tabsched import _kernel
from tabsched.exceptions import InvalidParameterError, TabschedError
from tabsched.nodes import CELL

__all__ = ["METHODS", "choose", "choose_target", "run", "summarize", "NoisyDurations", "monte_carlo_summary",
           "lay_out", "find_cycle", "lognormal_factors", "checked_durations", "carry_layout",
           "FUSED_PATH", "SUMMARY_BLOCK", "NO_NODE", "NO_RESOURCE", "NO_DEVICE"]

INDEX = np.int32
#: The kernel's sentinels (``_types.pxd``): no node, no resource, no device.
NO_NODE = _kernel.NO_NODE_ID
NO_RESOURCE = _kernel.NO_RESOURCE_ID
NO_DEVICE = _kernel.NO_DEVICE_ID
#: Samples the blocked passes carry at once.
SUMMARY_BLOCK = _kernel.SUMMARY_BLOCK
#: The build of the fused Monte Carlo pass this process runs (``"avx2"`` or
#: ``"baseline"``; ``TABSCHED_SIMD=baseline`` keeps to the second).
FUSED_PATH = _kernel.FUSED_PATH
#: What ``method`` may say.
METHODS = ("auto", "pull", "chained", "events")


# ------------------------------------------------------------------ choosing
def choose(lowered, durations=None, *, binding=False):
    """The pass ``method="auto"`` takes for ``lowered`` and ``durations``.

    Parameters
    ----------
    lowered : LoweredSchedule
    durations : array (nodes,) or (samples, nodes), optional
        Without them, the chains are taken as exact (every cell longer than zero).
    binding : bool
        Whether the run records, for the critical path, the node that decided each
        start: under contention that is the event heap's.

    Returns
    -------
    str
        ``"pull"``, ``"chained"`` or ``"events"`` (see the module docstring).
    """
    return _choose(lowered, durations, binding)[0]


def choose_target(lowered, durations=None):
    """``(method, lowering the pass runs on)``: :func:`choose`'s answer without a
    binding, with the link-chain rewrite it made for ``"chained"`` (the lowering keeps
    it only while someone holds it), for callers that build on the graph the pass
    runs (:mod:`tabsched.steady` unrolls it)."""
    return _choose(lowered, durations, False)


def _choose(lowered, durations, binding):
    """``(method, lowering it runs on)``: :func:`choose`'s answer, and the link-chain
    rewrite for ``"chained"`` (made once here, held by the caller for the pass)."""
    if lowered.resources.shape[1] == 0:
        return "pull", lowered
    if not binding and _cells_last(lowered, durations):
        chained = lowered.link_chains()
        if chained is not None:
            return "chained", chained
    return "events", lowered


def _cells_last(lowered, durations):
    """Whether every cell lasts longer than zero in every sample (a minimum: no
    temporary array)."""
    if durations is None:
        return True
    cells = np.asarray(durations)[..., lowered.nodes(CELL)]
    return not cells.size or cells.min() > 0


def _method(lowered, durations, method, binding):
    """The pass to run: ``method``, or the one ``"auto"`` chooses; the lowering it runs
    on (the rewrite for ``"chained"``)."""
    if method == "auto":
        return _choose(lowered, durations, binding)
    if method not in METHODS:
        raise InvalidParameterError(f"method {method!r} is not one of {', '.join(METHODS)}")
    if method == "pull" and lowered.resources.shape[1] > 0:
        raise InvalidParameterError(f"method 'pull' would ignore the {lowered.contention} "
                                    f"contention of this lowering (use 'auto' or 'events')")
    if method == "chained":
        chained = lowered.link_chains()
        if chained is None:
            raise InvalidParameterError("method 'chained' needs a lowering under contention "
                                        "'link' with transfers and no transfer_after edges")
        return method, chained
    return method, lowered


# -------------------------------------------------------------- the graph
def _graph(lowered, *, edges=False, layout=False, devices=False):
    """The kernel's :class:`~tabsched._kernel.Graph` of ``lowered``, made once per
    lowering, each part added (and checked) the first time a pass needs it."""
    graph = lowered._graph
    if graph is None:
        graph = lowered._graph = _kernel.Graph(lowered.num_nodes)
    if edges and not graph.has_edges:
        _check(graph.add_edges(lowered.indptr, lowered.successors, lowered.resources,
                               lowered.num_resources))
    if layout and not graph.has_layout:
        _check(graph.add_layout(lowered.topo_order, lowered.topo_pred_indptr,
                                lowered.topo_predecessors))
    if devices and not graph.has_devices:
        _check(graph.add_devices(lowered.node_device, lowered.table.num_devices))
    return graph


def carry_layout(source, target):
    """Let ``target``, a lowering of the same DAG as ``source`` (another table object,
    other resources), use the layout ``source``'s compiled view checked, instead of
    checking it again; only a view without edges (whose resources may differ) is
    shared, and ``source`` is not run again."""
    graph = source._graph
    if graph is not None and graph.has_layout and not graph.has_edges:
        target._graph = graph


def _scratch(graph, *, events=False, queue=False, finish=0):
    """The working arrays of one pass, the one place they are allocated: the event
    passes' indegrees, heap and resource state (``events``), the push pass's
    indegrees and queue (``queue``), and ``finish`` floats."""
    nodes = graph.num_nodes if events or queue else 0
    times = graph.num_nodes if events else 0
    resources = graph.num_resources if events else 0
    return _kernel.Scratch(np.empty(nodes, dtype=INDEX), np.empty(times),
                           np.empty(nodes, dtype=INDEX), np.empty(resources),
                           np.empty(resources, dtype=INDEX), np.empty(finish))


def _check(status, lowered=None, scratch=None):
    """Raise for a status other than OK: a deadlock as the lowering reports it, anything
    else as an internal error (the engine checked and allocated every array)."""
    if status == _kernel.OK:
        return
    if status == _kernel.DEADLOCK and lowered is not None:
        raise lowered.deadlock_error(scratch.indegree)
    raise TabschedError(f"internal error: the kernel returned status {status} for a "
                        f"lowered table (please report this)")


def checked_durations(lowered, durations):
    """``durations`` as a C-contiguous (samples, nodes) float64 array, refused unless
    they have a column per node and are finite and not negative."""
    durations = np.asarray(durations, dtype=np.float64)
    if durations.ndim == 1:
        durations = durations[None, :]
    durations = np.ascontiguousarray(durations)
    if durations.ndim != 2 or durations.shape[1] != lowered.num_nodes:
        raise InvalidParameterError(
            f"durations have {durations.shape[-1]} columns for {lowered.num_nodes} nodes")
    # a sum and a minimum, no temporaries: a sum is finite only if every term is
    # (or the terms overflow it: then look closer)
    with np.errstate(over="ignore", invalid="ignore"):
        total = durations.sum()
    if not np.isfinite(total) or (durations.size and durations.min() < 0):
        if not np.all(np.isfinite(durations)) or np.any(durations < 0):
            raise InvalidParameterError("durations must be finite and not negative")
    return durations


# ------------------------------------------------------------------ the runs
def run(lowered, durations, *, binding=False, method="auto"):
    """Start of every node for each row (sample) of ``durations``.

    Parameters
    ----------
    lowered : LoweredSchedule
    durations : array, shape (nodes,) or (samples, nodes)
    binding : bool
        Also return, for sample 0, the node that decided each node's start (for the
        critical path), or ``NO_NODE`` where it started at 0.
    method : {"auto", "pull", "chained", "events"}
        The pass (see the module docstring); ``"auto"`` chooses.

    Returns
    -------
    start : float64 array, shape (samples, nodes)
    binding : int32 array (nodes,) or None

    Raises
    ------
    DeadlockError
        If the row orders contradict the dependencies (the message names the
        operations on one cycle).
    """
    durations = checked_durations(lowered, durations)
    method, target = _method(lowered, durations, method, binding)
    n = lowered.num_nodes
    start = np.empty(durations.shape)
    bound = np.empty(n if binding else 0, dtype=INDEX)
    if method == "pull" and _push_instead(target, durations.shape[0]):
        # no layout yet, and this run may be one of the few: Kahn's loop pushes the ends,
        # and a later run follows the order it took
        graph = _graph(target, edges=True)
        order = target.__dict__.get(KAHN_ORDER)
        if order is None:
            scratch = _scratch(graph, queue=True)
            _check(_kernel.kahn_starts(graph, durations, start, bound, scratch), lowered,
                   scratch)
            order = scratch.heap_node
            order.flags.writeable = False
            target.__dict__[KAHN_ORDER] = order
        else:
            _check(_kernel.ordered_starts(graph, order, durations, start, bound))
        return start, (bound if binding else None)
    lowered.check_acyclic()
    if method == "events":
        graph = _graph(target, edges=True)
        scratch = _scratch(graph, events=True)
        _check(_kernel.fifo_starts(graph, durations, start, bound, scratch), lowered, scratch)
    else:
        graph = _graph(target, layout=True)
        _check(_kernel.longest_path_starts(graph, durations, start, bound,
                                           _scratch(graph, finish=n)))
    return start, (bound if binding else None)


#: Where a lowering keeps the order its first push pass took (int32, read-only; a copy
#: of the lowering with the same edges takes it along).
KAHN_ORDER = "_kahn_order"
#: Runs of one sample a lowering takes by Kahn's push pass before it is laid out:
#: a layout costs about two push passes, and each pull pass over it half of one.
PUSH_RUNS = 2


def _push_instead(lowered, samples):
    """Whether a pull run of ``samples`` samples over ``lowered`` (no resources) takes
    the push pass (:func:`tabsched._kernel.kahn_starts`, the same starts) instead of
    laying the lowering out first: while it has no layout, for its first
    :data:`PUSH_RUNS` runs of one sample. Counted on the lowering; a lowering-like
    object without ``laid_out`` (an unrolled one, laid out when made) never takes it."""
    if getattr(lowered, "laid_out", True) or samples != 1:
        return False
    runs = lowered.__dict__.get("_push_runs", 0)
    if runs >= PUSH_RUNS:
        return False
    lowered.__dict__["_push_runs"] = runs + 1
    return True


def summarize(lowered, durations, *, method="auto"):
    """Makespan per sample and, per device, busy time, first start and last end.

    What Monte Carlo needs, without a (samples x nodes) output; the starts behind
    them are those :func:`run` finds for the same durations, to the bit.

    Parameters
    ----------
    lowered : LoweredSchedule
    durations : array, shape (nodes,) or (samples, nodes)
    method : {"auto", "pull", "chained", "events"}

    Returns
    -------
    makespan : float64 array, shape (samples,)
    busy, first_start, last_end : float64 arrays, shape (samples, devices)
        ``first_start`` is +inf and ``last_end`` 0 on a device with no node.

    Raises
    ------
    DeadlockError
        As :func:`run`.
    """
    durations = checked_durations(lowered, durations)
    lowered.check_acyclic()
    method, target = _method(lowered, durations, method, False)
    n, samples, devices = lowered.num_nodes, durations.shape[0], lowered.table.num_devices
    makespan = np.empty(samples)
    busy, first_start, last_end = (np.empty((samples, devices)) for _ in range(3))
    if method == "events":
        graph = _graph(target, edges=True, devices=True)
        scratch = _scratch(graph, events=True, finish=n)
        _check(_kernel.fifo_summary(graph, durations, makespan, busy, first_start, last_end,
                                    scratch), lowered, scratch)
    else:
        graph = _graph(target, layout=True, devices=True)
        _check(_kernel.longest_path_summary(graph, durations, makespan, busy, first_start,
                                            last_end,
                                            _scratch(graph, finish=n * SUMMARY_BLOCK)))
    return makespan, busy, first_start, last_end


# -------------------------------------------------------------- Monte Carlo
@dataclass(frozen=True)
class NoisyDurations:
    """What the fused Monte Carlo pass draws a sample's node durations from.

    The composition is the lowering's (:meth:`~tabsched.lower.LoweredSchedule.compose`):
    cell ``c`` holds operations ``cell_first_op[c] .. cell_first_op[c+1]-1`` and lasts
    the sum of their drawn durations, times ``overlap`` for several; transfers follow,
    then the extra nodes with their fixed durations ``extra``. An operation's drawn
    duration is ``op_base * exp(op_sigma * Z - op_shift)`` with Z keyed by
    ``noise_stream``, the sample and ``op_key`` (``op_sigma = op_shift = 0``: no
    noise); a transfer's likewise with one ``transfer_sigma`` and ``transfer_shift``
    and ``transfer_stream``.
    """

    cell_first_op: np.ndarray
    op_base: np.ndarray
    op_key: np.ndarray
    op_sigma: np.ndarray
    op_shift: np.ndarray
    overlap: float
    transfer_base: np.ndarray
    transfer_key: np.ndarray
    transfer_sigma: float
    transfer_shift: float
    extra: np.ndarray
    noise_stream: int
    transfer_stream: int


#: Fewest node-samples worth a thread of their own (below, starting threads costs more
#: than the pass they would share).
_THREAD_WORK = 2_000_000


def _thread_ranges(samples, nodes):
    """``[(first, last), ...]``: samples split over the cores this process may use, in
    blocks of whole pairs of samples (each range starts at an even sample)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):      # not Linux
        cores = os.cpu_count() or 1
    threads = max(1, min(cores, samples * max(nodes, 1) // _THREAD_WORK))
    if threads == 1:
        return [(0, samples)]
    block = 2 * SUMMARY_BLOCK
    per = -(-samples // threads)
    per = -(-per // block) * block
    return [(first, min(samples, first + per)) for first in range(0, samples, per)]


def monte_carlo_summary(lowered, draws, samples, *, nominal):
    """Makespan, busy time and last end per device of ``samples`` samples drawn from
    ``draws`` (a :class:`NoisyDurations`) while a pull pass runs, or None where no
    pull pass applies (the event heap would run: see :func:`choose`).

    ``nominal``: node durations whose cells are positive exactly when every sample's
    are (the fixed part of the draws), for the choice. Large runs are split into
    ranges of samples on as many threads as the process may use cores (the pass
    holds no GIL and keys its draws by each sample's index): the numbers are those
    of one pass, to the bit.

    Returns
    -------
    (makespans (samples,), busy (samples, devices), last_end (samples, devices)) or None
    """
    method, target = _choose(lowered, nominal, False)
    if method == "events":
        return None
    graph = _graph(target, layout=True, devices=True)
    n, devices = graph.num_nodes, graph.num_devices
    makespans = np.empty(samples)
    busy, first_start, last_end = (np.empty((samples, devices)) for _ in range(3))

    def run_range(bounds):
        """Samples ``first .. last - 1``: the same numbers as in one call (the kernel
        keys its draws by the sample's index), so ranges may run in threads."""
        first, last = bounds
        return _kernel.monte_carlo_summary(
            graph, draws, makespans[first:last], busy[first:last], first_start[first:last],
            last_end[first:last], _scratch(graph, finish=(n + 3 * devices) * SUMMARY_BLOCK),
            first)

    ranges = _thread_ranges(samples, n)
    if len(ranges) == 1:
        statuses = [run_range(ranges[0])]
    else:
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(max_workers=len(ranges)) as pool:   # the pass holds no GIL
            statuses = list(pool.map(run_range, ranges))
    for status in statuses:
        _check(status)
    return makespans, busy, last_end


# -------------------------------------------------------- construction steps
def lay_out(indptr, successors):
    """Kahn's order of the DAG ``indptr``/``successors`` (int32 CSR) and its predecessor
    lists in positions of that order.

    Returns
    -------
    (order, pred_indptr, predecessors), None
        The layout (read-only int32 arrays), when the DAG has no cycle.
    None, unfinished
        Else the indegrees Kahn's order left (> 0: the nodes on or behind a cycle).
    """
    n = len(indptr) - 1
    order = np.empty(n, dtype=INDEX)
    pred_indptr = np.empty(n + 1, dtype=INDEX)
    predecessors = np.empty(len(successors), dtype=INDEX)
    scratch = np.empty(n, dtype=INDEX)
    status = _kernel.topological(indptr, successors, order, pred_indptr, predecessors, scratch)
    if status == _kernel.DEADLOCK:
        return None, scratch
    _check(status)
    for array in (order, pred_indptr, predecessors):
        array.flags.writeable = False
    return (order, pred_indptr, predecessors), None


def find_cycle(pred_indptr, predecessors, remaining):
    """A cycle among the nodes ``remaining`` marks (> 0) after a deadlock, in dependency
    order (int32 node ids; empty if none is marked), walking the reverse CSR
    ``pred_indptr``/``predecessors``: each such node waits for one marked
    predecessor (the first in its list)."""
    n = len(pred_indptr) - 1
    cycle = np.empty(n, dtype=INDEX)
    length = _kernel.find_cycle(pred_indptr, predecessors, remaining, cycle,
                                np.empty(n, dtype=INDEX))
    return cycle[:max(length, 0)]


def lognormal_factors(stream, samples, keys, sigma, shift):
    """``exp(sigma[k] * Z - shift[k])`` for each sample index of ``samples`` and key of
    ``keys``, Z standard normal drawn from the counter-based hash of ``stream``, the
    sample and the key (float32 ``sigma`` and ``shift`` per key); shape (samples, keys).
    Samples ``2j`` and ``2j+1`` take the two Box-Muller normals of one hash, as the
    fused Monte Carlo pass draws them."""
    samples = np.ascontiguousarray(samples, dtype=np.int64)
    keys = np.ascontiguousarray(keys, dtype=np.uint64)
    factors = np.empty((len(samples), len(keys)))
    status = _kernel.lognormal_factors(stream, samples, keys, sigma, shift, factors)
    if status != _kernel.OK:
        raise TabschedError(f"internal error: the kernel returned status {status} drawing "
                            f"noise (please report this)")
    return factors
