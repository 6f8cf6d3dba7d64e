# cython: language_level=3
"""Evaluation kernel: earliest start times over a lowered schedule DAG.

Its one caller is :mod:`tabsched.engine`, which validates, allocates every output
and every scratch array, picks the pass and turns a status into an exception; the
functions here see typed memoryviews and C scalars only, run without the GIL and
return a status code. tabsched._reference holds the plain-Python twin of every
entry point; the property tests assert that both agree to the bit.

The data
    A :class:`Graph` holds one lowering's arrays as the passes read them, each part
    checked once when it is added (then the passes index without checking): the
    CSR successor lists and every node's resources (``add_edges``), Kahn's order
    with the predecessor lists in positions of that order (``add_layout``, made by
    :func:`topological`), and the device whose compute stream runs each node
    (``add_devices``). A :class:`Scratch` holds a pass's working arrays.

The passes
    ``longest_path_starts`` / ``longest_path_summary``
        The pull pass over the layout: each node starts at the latest end of its
        predecessors. No resources (a lowering under contention ``none``, or the
        link-chain rewrite of one under ``link``).
    ``kahn_starts`` / ``ordered_starts``
        The same starts by Kahn's loop itself, pushing each end to the successors:
        for a lowering run once or twice, no layout to make first; the second run
        follows the order the first one took.
    ``fifo_starts`` / ``fifo_summary``
        The event order with first-come-first-served resources (links, ports), a
        binary heap of ready nodes.
    ``monte_carlo_summary``
        The pull pass with lognormal noise drawn while it runs (``_montecarlo.pxi``).
    The ``_starts`` passes write every node's start (and, for sample 0, the node
    that decided it); the ``_summary`` passes per sample the makespan and per
    device its busy time, first start and last end, with no (samples x nodes) output.

Semantics (DESIGN.md, "Dependencies and execution semantics"):

* a node starts when all its predecessors have ended and, if it names
  resources, when every one of them is free; it then holds them until it ends;
* a resource serves the nodes that want it first come, first served: in order
  of the time they became ready, ties broken by the lower node id;
* with no resources at all this is the longest-path problem, which the pull
  pass solves in one sweep of a topological order shared by all samples.

``binding[v]`` (sample 0 only, when ``binding`` is not empty) is the node that
decided when ``v`` started: the predecessor whose end came strictly latest
(first one in processing order on ties), or the previous holder of a resource
``v`` waited for, or NO_NODE when ``v`` started at time 0.
"""

from cython cimport boundscheck, wraparound
from libc.math cimport INFINITY, copysignf, fabsf, sqrtf
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.string cimport memcpy

cdef extern from *:
    """
    #if defined(__GNUC__) || defined(__clang__)
    #define TABSCHED_PREFETCH(address) __builtin_prefetch((address))
    #else
    #define TABSCHED_PREFETCH(address) ((void)0)
    #endif
    """
    void TABSCHED_PREFETCH(const void *address) noexcept nogil

# How far ahead (in positions) a pass with an order asks for the durations and
# starts it will touch: the nodes of one position step lie far apart by id.
cdef enum:
    PREFETCH_AHEAD = 16

from tabsched._types cimport (
    index_t, time_t, NO_NODE, NO_RESOURCE, NO_DEVICE, BLOCK, PAIRS,
    STATUS_OK, STATUS_DEADLOCK, STATUS_BAD_SHAPE, STATUS_BAD_INDEX,
)

# The same values for the Python side.
OK = STATUS_OK
DEADLOCK = STATUS_DEADLOCK
BAD_SHAPE = STATUS_BAD_SHAPE
BAD_INDEX = STATUS_BAD_INDEX
NO_NODE_ID = NO_NODE
NO_RESOURCE_ID = NO_RESOURCE
NO_DEVICE_ID = NO_DEVICE


cdef inline bint _heap_less(time_t time_a, index_t node_a,
                            time_t time_b, index_t node_b) noexcept nogil:
    return time_a < time_b or (time_a == time_b and node_a < node_b)


cdef inline void _heap_push(time_t[::1] heap_time, index_t[::1] heap_node,
                            index_t size, time_t time, index_t node) noexcept nogil:
    """Insert (time, node) into a binary min-heap holding ``size`` entries."""
    cdef index_t child = size
    cdef index_t parent
    while child > 0:
        parent = (child - 1) >> 1
        if _heap_less(time, node, heap_time[parent], heap_node[parent]):
            heap_time[child] = heap_time[parent]
            heap_node[child] = heap_node[parent]
            child = parent
        else:
            break
    heap_time[child] = time
    heap_node[child] = node


cdef inline void _heap_pop(time_t[::1] heap_time, index_t[::1] heap_node,
                           index_t size) noexcept nogil:
    """Remove the minimum of a heap holding ``size`` > 0 entries."""
    cdef index_t last = size - 1
    cdef time_t time = heap_time[last]
    cdef index_t node = heap_node[last]
    cdef index_t parent = 0
    cdef index_t child
    while True:
        child = 2 * parent + 1
        if child >= last:
            break
        if child + 1 < last and _heap_less(heap_time[child + 1], heap_node[child + 1],
                                           heap_time[child], heap_node[child]):
            child += 1
        if _heap_less(heap_time[child], heap_node[child], time, node):
            heap_time[parent] = heap_time[child]
            heap_node[parent] = heap_node[child]
            parent = child
        else:
            break
    heap_time[parent] = time
    heap_node[parent] = node

cdef int _count_indegree(const index_t[::1] indptr, const index_t[::1] successors,
                         index_t[::1] indegree) noexcept nogil:
    cdef index_t n = indptr.shape[0] - 1
    cdef index_t v, e
    for v in range(n):
        indegree[v] = 0
    for v in range(n):
        for e in range(indptr[v], indptr[v + 1]):
            indegree[successors[e]] += 1
    return 0

cdef index_t _kahn(const index_t[::1] indptr, const index_t[::1] successors,
                   index_t[::1] indegree, index_t[::1] order) noexcept nogil:
    """Kahn's loop from the indegrees in ``indegree`` (which it uses up)."""
    cdef index_t n = indptr.shape[0] - 1
    cdef index_t head = 0, tail = 0
    cdef index_t v, u, e
    for v in range(n):
        if indegree[v] == 0:
            order[tail] = v
            tail += 1
    while head < tail:
        v = order[head]
        head += 1
        for e in range(indptr[v], indptr[v + 1]):
            u = successors[e]
            indegree[u] -= 1
            if indegree[u] == 0:
                order[tail] = u
                tail += 1
    return tail

cdef int _check_csr(const index_t[::1] indptr, const index_t[::1] targets) noexcept nogil:
    """A CSR whose offsets run from 0 to len(targets) without falling and whose
    targets are node ids (``0 <= t < len(indptr) - 1``)."""
    cdef index_t n = indptr.shape[0] - 1
    cdef index_t v, e
    if n < 0 or indptr[0] != 0 or indptr[n] != targets.shape[0]:
        return STATUS_BAD_SHAPE
    for v in range(n):
        if indptr[v + 1] < indptr[v]:
            return STATUS_BAD_SHAPE
    for e in range(targets.shape[0]):
        if targets[e] < 0 or targets[e] >= n:
            return STATUS_BAD_INDEX
    return STATUS_OK


cdef int _check_resources(const index_t[:, ::1] resources, index_t n_resources) noexcept nogil:
    """Every resource id a node names is ``NO_RESOURCE`` or below ``n_resources``."""
    cdef index_t v, k, r
    for v in range(resources.shape[0]):
        for k in range(resources.shape[1]):
            r = resources[v, k]
            if r != NO_RESOURCE and (r < 0 or r >= n_resources):
                return STATUS_BAD_INDEX
    return STATUS_OK


cdef int _check_devices(const index_t[::1] node_device, index_t devices) noexcept nogil:
    """Every device a node names is ``NO_DEVICE`` or below ``devices``."""
    cdef index_t v
    for v in range(node_device.shape[0]):
        if node_device[v] < NO_DEVICE or node_device[v] >= devices:
            return STATUS_BAD_INDEX
    return STATUS_OK


def _read_only(*arrays):
    """The passes trust what a Graph checked: its arrays are not written again."""
    for array in arrays:
        array.flags.writeable = False


# ------------------------------------------------------------------ the graph
cdef class Graph:
    """One lowering's DAG as the passes read it, each part checked once.

    Made empty for ``num_nodes`` nodes; each ``add_*`` method checks its arrays,
    makes them read-only (a view, not a copy) and returns a status (OK, or
    BAD_SHAPE / BAD_INDEX and nothing added; a part is added once). A pass
    returns BAD_SHAPE when a part it reads is missing.

    Attributes
    ----------
    num_nodes, num_resources, num_devices : int
    has_edges, has_layout, has_devices : bool
    indptr, successors, resources, order, pred_indptr, predecessors, node_device :
        The arrays added (read-only), or None.
    """

    cdef readonly index_t num_nodes
    cdef readonly index_t num_resources
    cdef readonly index_t num_devices
    cdef readonly bint has_edges
    cdef readonly bint has_layout
    cdef readonly bint has_devices
    cdef readonly object indptr
    cdef readonly object successors
    cdef readonly object resources
    cdef readonly object order
    cdef readonly object pred_indptr
    cdef readonly object predecessors
    cdef readonly object node_device
    cdef const index_t[::1] _indptr
    cdef const index_t[::1] _successors
    cdef const index_t[:, ::1] _resources
    cdef const index_t[::1] _order
    cdef const index_t[::1] _offsets
    cdef const index_t[::1] _lists
    cdef const index_t[::1] _node_device

    def __cinit__(self, index_t num_nodes):
        if num_nodes < 0:
            raise ValueError(f"a graph has at least 0 nodes, not {num_nodes}")
        self.num_nodes = num_nodes

    def add_edges(self, indptr not None, successors not None, resources not None,
                  index_t num_resources):
        """The CSR successor lists (int32 ``indptr`` of nodes + 1 offsets and
        ``successors``) and each node's resources (int32, shape (nodes, R), padded with
        NO_RESOURCE_ID; R = 0: no node waits for one) among ``num_resources``."""
        cdef const index_t[::1] offsets = indptr
        cdef const index_t[::1] targets = successors
        cdef const index_t[:, ::1] held = resources
        cdef int status
        if (self.has_edges or offsets.shape[0] != self.num_nodes + 1 or num_resources < 0
                or (held.shape[1] > 0 and held.shape[0] != self.num_nodes)):
            return STATUS_BAD_SHAPE
        with nogil:
            status = _check_csr(offsets, targets)
            if status == STATUS_OK:
                status = _check_resources(held, num_resources)
        if status != STATUS_OK:
            return status
        _read_only(indptr, successors, resources)
        self.indptr, self.successors, self.resources = indptr, successors, resources
        self._indptr, self._successors, self._resources = offsets, targets, held
        self.num_resources = num_resources
        self.has_edges = True
        return STATUS_OK

    def add_layout(self, order not None, pred_indptr not None, predecessors not None):
        """Kahn's order (``order[i]``: the node at position ``i``) and the predecessor
        lists in positions of that order (CSR), as :func:`topological` writes them:
        offsets from 0 to ``len(predecessors)`` that never fall, every predecessor an
        earlier position, every order entry a node."""
        cdef const index_t[::1] nodes = order
        cdef const index_t[::1] offsets = pred_indptr
        cdef const index_t[::1] lists = predecessors
        cdef int status
        if self.has_layout or nodes.shape[0] != self.num_nodes:
            return STATUS_BAD_SHAPE
        with nogil:
            status = _check_layout(offsets, lists, nodes)
        if status != STATUS_OK:
            return status
        _read_only(order, pred_indptr, predecessors)
        self.order, self.pred_indptr, self.predecessors = order, pred_indptr, predecessors
        self._order, self._offsets, self._lists = nodes, offsets, lists
        self.has_layout = True
        return STATUS_OK

    def add_devices(self, node_device not None, index_t num_devices):
        """The device whose compute stream runs each node (int32, NO_DEVICE_ID for none)
        among ``num_devices``: the summary passes add a node's duration to its device."""
        cdef const index_t[::1] devices = node_device
        cdef int status
        if self.has_devices or devices.shape[0] != self.num_nodes or num_devices < 0:
            return STATUS_BAD_SHAPE
        with nogil:
            status = _check_devices(devices, num_devices)
        if status != STATUS_OK:
            return status
        _read_only(node_device)
        self.node_device, self._node_device = node_device, devices
        self.num_devices = num_devices
        self.has_devices = True
        return STATUS_OK


cdef class Scratch:
    """The working arrays of a pass, allocated by the caller (one place: the engine).

    ``indegree`` (int32, nodes; after a DEADLOCK, > 0 marks the nodes that never
    ran), ``heap_time`` and ``heap_node`` (nodes each, for the event passes),
    ``free_at`` and ``holder`` (resources each, for the event passes; ``heap_node`` is
    also :func:`kahn_starts`' FIFO queue), ``finish``
    (float64: nodes for the starts passes; nodes x SUMMARY_BLOCK for the pull
    summary; (nodes + 3 x devices) x SUMMARY_BLOCK for Monte Carlo). Each pass
    checks the sizes of the arrays it uses; the others may be empty.
    """

    cdef readonly object indegree
    cdef readonly object heap_time
    cdef readonly object heap_node
    cdef readonly object free_at
    cdef readonly object holder
    cdef readonly object finish
    cdef index_t[::1] _indegree
    cdef time_t[::1] _heap_time
    cdef index_t[::1] _heap_node
    cdef time_t[::1] _free_at
    cdef index_t[::1] _holder
    cdef time_t[::1] _finish

    def __init__(self, indegree not None, heap_time not None, heap_node not None,
                 free_at not None, holder not None, finish not None):
        self._indegree, self._heap_time, self._heap_node = indegree, heap_time, heap_node
        self._free_at, self._holder, self._finish = free_at, holder, finish
        self.indegree, self.heap_time, self.heap_node = indegree, heap_time, heap_node
        self.free_at, self.holder, self.finish = free_at, holder, finish

    cdef bint _fits_events(self, Graph graph):
        cdef index_t n = graph.num_nodes
        return (self._indegree.shape[0] == n and self._heap_time.shape[0] == n
                and self._heap_node.shape[0] == n
                and self._free_at.shape[0] >= graph.num_resources
                and self._holder.shape[0] >= graph.num_resources)

# ------------------------------------------------------ topological layout
# A lowering is validated and ordered once: ``topological`` checks the CSR,
# finds Kahn's order with a FIFO queue and writes the
# predecessor lists in *positions* of that order, so that every edge points
# backwards. The pull passes then take each node's start from its
# predecessors in one forward sweep, with no indegree count, no queue and no
# data-dependent write to another node (Graph.add_layout checks the lists once).

@boundscheck(False)
@wraparound(False)
def topological(const index_t[::1] indptr not None,
                const index_t[::1] successors not None,
                index_t[::1] order not None,
                index_t[::1] pred_indptr not None,
                index_t[::1] predecessors not None,
                index_t[::1] scratch not None):
    """Kahn's order of a DAG and its predecessor CSR in positions of that order.

    Parameters
    ----------
    indptr, successors : int32 arrays
        The DAG in CSR form, by node id.
    order : int32 array, shape (nodes,)
        Output: ``order[i]`` is the node at position ``i`` (Kahn's order with a
        FIFO queue).
    pred_indptr : int32 array, shape (nodes + 1,)
    predecessors : int32 array, shape (edges,)
        Output: the positions of the predecessors of the node at position ``i``
        are ``predecessors[pred_indptr[i]:pred_indptr[i+1]]``, ascending, all
        below ``i``.
    scratch : int32 array, shape (nodes,)
        On DEADLOCK, ``scratch[v] > 0`` marks the nodes on or behind a cycle.

    Returns
    -------
    int
        A status: OK, DEADLOCK, BAD_SHAPE or BAD_INDEX.
    """
    cdef index_t n = indptr.shape[0] - 1
    cdef index_t status
    if (n < 0 or order.shape[0] != n or pred_indptr.shape[0] != n + 1
            or scratch.shape[0] != n or predecessors.shape[0] != successors.shape[0]):
        return STATUS_BAD_SHAPE
    with nogil:
        status = _check_csr(indptr, successors)
        if status == STATUS_OK:
            status = _topological(indptr, successors, order, pred_indptr, predecessors,
                                  scratch)
    return status


cdef index_t _topological(const index_t[::1] indptr, const index_t[::1] successors,
                          index_t[::1] order, index_t[::1] pred_indptr,
                          index_t[::1] predecessors, index_t[::1] scratch) noexcept nogil:
    cdef index_t n = indptr.shape[0] - 1
    cdef index_t i, v, u, e, p, cursor, previous
    if n == 0:
        pred_indptr[0] = 0
        return STATUS_OK
    # predecessors[] is free until the fill: it keeps each node's indegree by id
    # through Kahn's loop when it is long enough (then the list lengths by position
    # are one gather, not a pass over the edges through the positions)
    cdef bint kept = predecessors.shape[0] >= n
    _count_indegree(indptr, successors, scratch)
    if kept:
        for v in range(n):
            predecessors[v] = scratch[v]
    if _kahn(indptr, successors, scratch, order) < n:
        return STATUS_DEADLOCK
    # scratch: position of every node
    for i in range(n):
        scratch[order[i]] = i
    pred_indptr[0] = 0
    if kept:
        for i in range(n):
            pred_indptr[i + 1] = predecessors[order[i]]
    else:
        for i in range(n):
            pred_indptr[i + 1] = 0
        for e in range(successors.shape[0]):
            pred_indptr[scratch[successors[e]] + 1] += 1
    for i in range(n):
        pred_indptr[i + 1] += pred_indptr[i]
    # fill by ascending source position, using pred_indptr[p] as p's cursor ...
    for i in range(n):
        v = order[i]
        for e in range(indptr[v], indptr[v + 1]):
            p = scratch[successors[e]]
            predecessors[pred_indptr[p]] = i
            pred_indptr[p] += 1
    # ... which leaves pred_indptr shifted by one list
    previous = 0
    for i in range(n):
        cursor = pred_indptr[i]
        pred_indptr[i] = previous
        previous = cursor
    return STATUS_OK

@boundscheck(False)
@wraparound(False)
def find_cycle(const index_t[::1] pred_indptr not None,
               const index_t[::1] predecessors not None,
               const index_t[::1] remaining not None,
               index_t[::1] cycle not None,
               index_t[::1] position not None):
    """A cycle among the nodes that never ran after a deadlock.

    Every such node (``remaining[v] > 0``) has a predecessor that never ran, so
    walking from one to such a predecessor must come back to a node already
    visited; the nodes from that visit on form a cycle.

    Parameters
    ----------
    pred_indptr, predecessors : int32 arrays
        The DAG's reverse CSR.
    remaining : int32 array
        The indegrees left after a deadlock (by :func:`topological` or an event pass).
    cycle, position : int32 scratch of length nodes
        ``cycle[:length]`` receives the cycle in dependency order.

    Returns
    -------
    int
        The cycle's length, 0 if no node is unfinished, -1 on inconsistent input.
    """
    cdef index_t n = pred_indptr.shape[0] - 1
    cdef index_t length = -1
    if (n < 0 or remaining.shape[0] != n or cycle.shape[0] != n
            or position.shape[0] != n):
        return -1
    with nogil:
        if _check_csr(pred_indptr, predecessors) == STATUS_OK:
            length = _find_cycle(pred_indptr, predecessors, remaining, cycle, position)
    return length


cdef index_t _find_cycle(const index_t[::1] pred_indptr, const index_t[::1] predecessors,
                         const index_t[::1] remaining, index_t[::1] cycle,
                         index_t[::1] position) noexcept nogil:
    cdef index_t n = pred_indptr.shape[0] - 1
    cdef index_t v, p, e, steps, first, length, i
    v = NO_NODE
    for i in range(n):
        position[i] = NO_NODE
        if v == NO_NODE and remaining[i] > 0:
            v = i
    if v == NO_NODE:
        return 0
    steps = 0
    while position[v] == NO_NODE:
        position[v] = steps
        cycle[steps] = v
        steps += 1
        p = NO_NODE
        for e in range(pred_indptr[v], pred_indptr[v + 1]):
            if remaining[predecessors[e]] > 0:
                p = predecessors[e]
                break
        if p == NO_NODE:
            return -1
        v = p
    # cycle[position[v]:steps] was walked against the edges: reverse it.
    first = position[v]
    length = steps - first
    for i in range(length // 2):
        p = cycle[first + i]
        cycle[first + i] = cycle[steps - 1 - i]
        cycle[steps - 1 - i] = p
    for i in range(length):
        cycle[i] = cycle[first + i]
    return length

# ------------------------------------------------------------- the pull passes
@boundscheck(False)
@wraparound(False)
def longest_path_starts(Graph graph not None, const time_t[:, ::1] durations not None,
                        time_t[:, ::1] start not None, index_t[::1] binding not None,
                        Scratch scratch not None, bint by_position=False):
    """Earliest starts over a laid-out DAG: one pull pass a sample.

    The node at position ``i`` starts at the latest end of its predecessors
    (0 without any); the binding takes the predecessor whose end is strictly
    latest, the first in Kahn's order on ties.

    Parameters
    ----------
    graph : Graph
        With its layout.
    durations : float64 array, shape (samples, nodes)
    start : float64 array, shape (samples, nodes)
        Output.
    binding : int32 array, shape (nodes,) or (0,)
        Output for sample 0 (skipped when empty): the node that decided each
        node's start, or NO_NODE_ID.
    scratch : Scratch
        ``finish`` of nodes entries (the ends of the last sample, by position).
    by_position : bool
        ``durations``, ``start`` and ``binding`` are by position in Kahn's order
        (the arrays renumbered), not by node id.

    Returns
    -------
    int
        A status: OK or BAD_SHAPE.
    """
    cdef index_t n = graph.num_nodes
    cdef index_t samples = durations.shape[0]
    cdef index_t status
    if (not graph.has_layout or durations.shape[1] != n or start.shape[0] != samples
            or start.shape[1] != n or (binding.shape[0] != 0 and binding.shape[0] != n)
            or scratch._finish.shape[0] != n):
        return STATUS_BAD_SHAPE
    with nogil:
        status = _longest_path(graph._offsets, graph._lists, graph._order, not by_position,
                               durations, start, binding, binding.shape[0] != 0,
                               scratch._finish)
    return status

cdef index_t _longest_path(const index_t[::1] pred_indptr, const index_t[::1] predecessors,
                           const index_t[::1] order, bint ordered,
                           const time_t[:, ::1] durations, time_t[:, ::1] start,
                           index_t[::1] binding, bint record,
                           time_t[::1] finish) noexcept nogil:
    cdef index_t n = pred_indptr.shape[0] - 1
    cdef index_t samples = durations.shape[0]
    cdef index_t edges = predecessors.shape[0]
    cdef index_t s, i, v, e, p, low, high, bound
    cdef time_t begin, candidate
    # raw pointers: the layout was checked when it was made
    cdef const index_t *offsets = &pred_indptr[0]
    cdef const index_t *lists = &predecessors[0] if edges > 0 else NULL
    cdef time_t *ends = &finish[0] if n > 0 else NULL
    cdef const time_t *length
    cdef time_t *begins
    for s in range(samples):
        if n == 0:
            break
        length = &durations[s, 0]
        begins = &start[s, 0]
        low = 0
        for i in range(n):
            high = offsets[i + 1]
            if ordered:
                v = order[i]
                if i + PREFETCH_AHEAD < n:
                    p = order[i + PREFETCH_AHEAD]
                    TABSCHED_PREFETCH(length + p)
                    TABSCHED_PREFETCH(begins + p)
                    if record and s == 0:
                        TABSCHED_PREFETCH(&binding[p])
            else:
                v = i
            begin = 0.0
            if record and s == 0:
                bound = NO_NODE
                for e in range(low, high):
                    p = lists[e]
                    candidate = ends[p]
                    bound = p if candidate > begin else bound     # branch-free: the
                    begin = candidate if candidate > begin else begin   # ties are data
                binding[v] = NO_NODE if bound == NO_NODE else (order[bound] if ordered
                                                                else bound)
            else:
                for e in range(low, high):
                    p = lists[e]
                    candidate = ends[p]
                    begin = candidate if candidate > begin else begin
            low = high
            ends[i] = begin + length[v]
            begins[v] = begin
    return STATUS_OK


@boundscheck(False)
@wraparound(False)
def kahn_starts(Graph graph not None, const time_t[:, ::1] durations not None,
                time_t[:, ::1] start not None, index_t[::1] binding not None,
                Scratch scratch not None):
    """Earliest starts by Kahn's loop itself: one push pass a sample, no layout.

    For a lowering run once or twice, laying it out (:func:`topological`: the
    order, the positions, the predecessor lists) costs more than the runs it
    serves. This pass takes the nodes in the order Kahn's loop with a FIFO queue
    gives them (the layout's order) and pushes each node's end to its successors:
    a successor starts at the latest end pushed to it (0 without any), and its
    binding is the node whose end was strictly latest, the first in Kahn's order
    on ties. That is :func:`longest_path_starts` over the layout, to the bit: the
    same comparisons in the same order.

    Parameters
    ----------
    graph : Graph
        With its edges (the resources are not read).
    durations : float64 array, shape (samples, nodes)
    start : float64 array, shape (samples, nodes)
        Output.
    binding : int32 array, shape (nodes,) or (0,)
        Output for sample 0 (skipped when empty): the node that decided each
        node's start, or NO_NODE_ID.
    scratch : Scratch
        ``indegree`` and ``heap_node`` (the FIFO queue) of nodes entries each.
        After OK, ``heap_node`` holds Kahn's order (:func:`ordered_starts` follows
        it); after a DEADLOCK, ``indegree[v] > 0`` marks the nodes that never ran
        (the indegrees :func:`topological` leaves).

    Returns
    -------
    int
        A status: OK, DEADLOCK or BAD_SHAPE.
    """
    cdef index_t n = graph.num_nodes
    cdef index_t samples = durations.shape[0]
    cdef index_t status = STATUS_OK
    cdef index_t s
    if (not graph.has_edges or durations.shape[1] != n or start.shape[0] != samples
            or start.shape[1] != n or (binding.shape[0] != 0 and binding.shape[0] != n)
            or scratch._indegree.shape[0] != n or scratch._heap_node.shape[0] != n):
        return STATUS_BAD_SHAPE
    with nogil:
        for s in range(samples):
            status = _kahn_push(graph._indptr, graph._successors, durations[s], start[s],
                                binding, binding.shape[0] != 0 and s == 0,
                                scratch._indegree, scratch._heap_node)
            if status != STATUS_OK:
                break
    return status


cdef index_t _kahn_push(const index_t[::1] indptr, const index_t[::1] successors,
                        const time_t[::1] length, time_t[::1] begins, index_t[::1] binding,
                        bint record, index_t[::1] indegree,
                        index_t[::1] queue) noexcept nogil:
    cdef index_t n = indptr.shape[0] - 1
    cdef index_t head = 0, tail = 0
    cdef index_t v, u, e
    cdef time_t finish
    _count_indegree(indptr, successors, indegree)
    for v in range(n):
        begins[v] = 0.0
        if record:
            binding[v] = NO_NODE
        if indegree[v] == 0:
            queue[tail] = v
            tail += 1
    while head < tail:
        v = queue[head]
        head += 1
        finish = begins[v] + length[v]
        for e in range(indptr[v], indptr[v + 1]):
            u = successors[e]
            if finish > begins[u]:
                begins[u] = finish
                if record:
                    binding[u] = v
            indegree[u] -= 1
            if indegree[u] == 0:
                queue[tail] = u
                tail += 1
    return STATUS_OK if tail == n else STATUS_DEADLOCK


@boundscheck(False)
@wraparound(False)
def ordered_starts(Graph graph not None, const index_t[::1] order not None,
                   const time_t[:, ::1] durations not None, time_t[:, ::1] start not None,
                   index_t[::1] binding not None):
    """:func:`kahn_starts` again, in the order a run of it took (its queue, which it
    leaves in ``scratch.heap_node``): the same pushes without the indegrees.

    Parameters
    ----------
    graph : Graph
        With its edges.
    order : int32 array, shape (nodes,)
        Kahn's order of the graph's nodes as :func:`kahn_starts` left it (every
        entry a node id; that it is that order is the caller's to keep).
    durations, start, binding :
        As :func:`kahn_starts`.

    Returns
    -------
    int
        A status: OK, BAD_SHAPE or BAD_INDEX.
    """
    cdef index_t n = graph.num_nodes
    cdef index_t samples = durations.shape[0]
    cdef index_t s, i, v, u, e
    cdef bint record
    cdef time_t finish
    cdef index_t status = STATUS_OK
    if (not graph.has_edges or order.shape[0] != n or durations.shape[1] != n
            or start.shape[0] != samples or start.shape[1] != n
            or (binding.shape[0] != 0 and binding.shape[0] != n)):
        return STATUS_BAD_SHAPE
    with nogil:
        for i in range(n):
            if order[i] < 0 or order[i] >= n:
                status = STATUS_BAD_INDEX
                break
        for s in range(samples if status == STATUS_OK else 0):
            record = binding.shape[0] != 0 and s == 0
            for v in range(n):
                start[s, v] = 0.0
                if record:
                    binding[v] = NO_NODE
            for i in range(n):
                v = order[i]
                finish = start[s, v] + durations[s, v]
                for e in range(graph._indptr[v], graph._indptr[v + 1]):
                    u = graph._successors[e]
                    if finish > start[s, u]:
                        start[s, u] = finish
                        if record:
                            binding[u] = v
    return status


# Samples a summary pass carries at once, node-major (BLOCK, _types.pxd).
SUMMARY_BLOCK = BLOCK


cdef bint _summary_shapes(Graph graph, index_t samples, time_t[::1] makespan,
                          time_t[:, ::1] busy, time_t[:, ::1] first_start,
                          time_t[:, ::1] last_end):
    """The outputs of a summary pass fit ``samples`` and the graph's devices."""
    cdef index_t devices = graph.num_devices
    return (graph.has_devices and makespan.shape[0] == samples
            and busy.shape[0] == samples and busy.shape[1] == devices
            and first_start.shape[0] == samples and first_start.shape[1] == devices
            and last_end.shape[0] == samples and last_end.shape[1] == devices)


@boundscheck(False)
@wraparound(False)
def longest_path_summary(Graph graph not None, const time_t[:, ::1] durations not None,
                         time_t[::1] makespan not None, time_t[:, ::1] busy not None,
                         time_t[:, ::1] first_start not None,
                         time_t[:, ::1] last_end not None, Scratch scratch not None):
    """Per-sample makespan and per-device busy time, first start and last end.

    The starts of :func:`longest_path_starts` (busy time summed in Kahn's order),
    from a pull pass over blocks of ``SUMMARY_BLOCK`` samples laid out
    node-major: memory is ``scratch.finish``, one block of ends per node,
    whatever the number of samples.

    Parameters
    ----------
    graph : Graph
        With its layout and devices.
    durations : float64 array, shape (samples, nodes)
    makespan : float64 array, shape (samples,)
        Output: the latest end of any node (0 for an empty graph).
    busy, first_start, last_end : float64 arrays, shape (samples, devices)
        Outputs: per device, the summed durations of its nodes, the earliest start
        (+inf if it has none) and the latest end (0 if it has none).
    scratch : Scratch
        ``finish`` of nodes x SUMMARY_BLOCK entries.

    Returns
    -------
    int
        A status: OK or BAD_SHAPE.
    """
    cdef index_t n = graph.num_nodes
    cdef index_t samples = durations.shape[0]
    cdef index_t status
    if (not graph.has_layout or durations.shape[1] != n
            or not _summary_shapes(graph, samples, makespan, busy, first_start, last_end)
            or scratch._finish.shape[0] != <Py_ssize_t>n * BLOCK):
        return STATUS_BAD_SHAPE
    with nogil:
        status = _longest_path_summary(graph._offsets, graph._lists, graph._order, True,
                                       graph._node_device, durations, makespan, busy,
                                       first_start, last_end, scratch._finish)
    return status


cdef index_t _longest_path_summary(const index_t[::1] pred_indptr,
                                   const index_t[::1] predecessors,
                                   const index_t[::1] order, bint ordered,
                                   const index_t[::1] node_device,
                                   const time_t[:, ::1] durations, time_t[::1] makespan,
                                   time_t[:, ::1] busy, time_t[:, ::1] first_start,
                                   time_t[:, ::1] last_end, time_t[::1] finish) noexcept nogil:
    cdef index_t n = pred_indptr.shape[0] - 1
    cdef index_t samples = durations.shape[0]
    cdef index_t devices = busy.shape[1]
    cdef index_t edges = predecessors.shape[0]
    cdef index_t first, width, b, i, v, e, d, low, high
    cdef time_t begin[BLOCK]
    cdef time_t length[BLOCK]
    cdef time_t longest[BLOCK]
    cdef time_t *row
    cdef time_t *ends = &finish[0] if n > 0 else NULL
    cdef time_t start, end, most
    first = 0
    while first < samples:
        width = samples - first if samples - first < BLOCK else BLOCK
        if width == 1:
            # one sample (a nominal run): the same sums and maxima lane by lane, without
            # carrying a block of BLOCK lanes through every node (it cost 30x as much)
            most = 0.0
            for d in range(devices):
                busy[first, d] = 0.0
                first_start[first, d] = INFINITY
                last_end[first, d] = 0.0
            low = 0
            for i in range(n):
                high = pred_indptr[i + 1]
                v = order[i] if ordered else i
                d = node_device[v]
                start = 0.0
                for e in range(low, high):
                    end = ends[predecessors[e]]
                    start = end if end > start else start
                low = high
                end = start + durations[first, v]
                ends[i] = end
                most = end if end > most else most
                if d != NO_DEVICE:
                    busy[first, d] += durations[first, v]
                    if start < first_start[first, d]:
                        first_start[first, d] = start
                    if end > last_end[first, d]:
                        last_end[first, d] = end
            makespan[first] = most
            first += 1
            continue
        for b in range(width):
            makespan[first + b] = 0.0
            for d in range(devices):
                busy[first + b, d] = 0.0
                first_start[first + b, d] = INFINITY
                last_end[first + b, d] = 0.0
        for b in range(BLOCK):
            longest[b] = 0.0
            length[b] = 0.0
        low = 0
        for i in range(n):
            high = pred_indptr[i + 1]
            v = order[i] if ordered else i
            d = node_device[v]
            _fill(begin, 0.0)
            for e in range(low, high):
                _max_into(begin, ends + <Py_ssize_t>predecessors[e] * BLOCK)
            low = high
            for b in range(width):
                length[b] = durations[first + b, v]
            row = ends + <Py_ssize_t>i * BLOCK
            _end_into(row, begin, length, longest)
            if d != NO_DEVICE:
                for b in range(width):
                    busy[first + b, d] += length[b]
                    if begin[b] < first_start[first + b, d]:
                        first_start[first + b, d] = begin[b]
                    if row[b] > last_end[first + b, d]:
                        last_end[first + b, d] = row[b]
        for b in range(width):
            makespan[first + b] = longest[b]
        first += BLOCK
    return STATUS_OK


# ------------------------------------------------------------ the event passes
@boundscheck(False)
@wraparound(False)
def fifo_starts(Graph graph not None, const time_t[:, ::1] durations not None,
                time_t[:, ::1] start not None, index_t[::1] binding not None,
                Scratch scratch not None):
    """Start of every node for every sample in event order, resources first come,
    first served.

    Nodes run in order of the time they became ready (ties by the lower id); a
    node then waits until every resource it names is free and holds them until it
    ends.

    Parameters
    ----------
    graph : Graph
        With its edges.
    durations : float64 array, shape (samples, nodes)
    start : float64 array, shape (samples, nodes)
        Output.
    binding : int32 array, shape (nodes,) or (0,)
        Output for sample 0 (see the module docstring); skipped when empty.
    scratch : Scratch
        ``indegree``, ``heap_time``, ``heap_node`` of nodes entries, ``free_at`` and
        ``holder`` of resources entries.

    Returns
    -------
    int
        A status: OK, DEADLOCK (``scratch.indegree > 0`` marks the nodes that never
        ran) or BAD_SHAPE.
    """
    cdef index_t n = graph.num_nodes
    cdef index_t samples = durations.shape[0]
    cdef index_t status
    if (not graph.has_edges or durations.shape[1] != n or start.shape[0] != samples
            or start.shape[1] != n or (binding.shape[0] != 0 and binding.shape[0] != n)
            or not scratch._fits_events(graph)):
        return STATUS_BAD_SHAPE
    with nogil:
        status = _fifo_starts(graph._indptr, graph._successors, durations, graph._resources,
                              graph.num_resources, start, binding, binding.shape[0] != 0,
                              scratch._indegree, scratch._heap_time, scratch._heap_node,
                              scratch._free_at, scratch._holder)
    return status


cdef index_t _fifo_starts(const index_t[::1] indptr, const index_t[::1] successors,
                          const time_t[:, ::1] durations,
                          const index_t[:, ::1] resources, index_t n_resources,
                          time_t[:, ::1] start, index_t[::1] binding, bint record,
                          index_t[::1] indegree,
                          time_t[::1] heap_time, index_t[::1] heap_node,
                          time_t[::1] free_at, index_t[::1] holder) noexcept nogil:
    cdef index_t n = indptr.shape[0] - 1
    cdef index_t samples = durations.shape[0]
    cdef index_t width = resources.shape[1]
    cdef index_t size, done, v, u, e, k, r, s, bound
    cdef time_t begin, finish
    for s in range(samples):
        _count_indegree(indptr, successors, indegree)
        for r in range(n_resources):
            free_at[r] = 0.0
            holder[r] = NO_NODE
        size = 0
        for v in range(n):
            start[s, v] = 0.0
            if record and s == 0:
                binding[v] = NO_NODE
            if indegree[v] == 0:
                _heap_push(heap_time, heap_node, size, 0.0, v)
                size += 1
        done = 0
        while size > 0:
            v = heap_node[0]
            begin = heap_time[0]
            _heap_pop(heap_time, heap_node, size)
            size -= 1
            done += 1
            bound = NO_NODE
            for k in range(width):
                r = resources[v, k]
                if r != NO_RESOURCE and free_at[r] > begin:
                    begin = free_at[r]
                    bound = holder[r]
            finish = begin + durations[s, v]
            for k in range(width):
                r = resources[v, k]
                if r != NO_RESOURCE:
                    free_at[r] = finish
                    holder[r] = v
            if record and s == 0 and bound != NO_NODE:
                binding[v] = bound
            start[s, v] = begin
            for e in range(indptr[v], indptr[v + 1]):
                u = successors[e]
                if finish > start[s, u]:
                    start[s, u] = finish
                    if record and s == 0:
                        binding[u] = v
                indegree[u] -= 1
                if indegree[u] == 0:
                    _heap_push(heap_time, heap_node, size, start[s, u], u)
                    size += 1
        if done < n:
            return STATUS_DEADLOCK
    return STATUS_OK


@boundscheck(False)
@wraparound(False)
def fifo_summary(Graph graph not None, const time_t[:, ::1] durations not None,
                 time_t[::1] makespan not None, time_t[:, ::1] busy not None,
                 time_t[:, ::1] first_start not None, time_t[:, ::1] last_end not None,
                 Scratch scratch not None):
    """Per-sample makespan and per-device busy time, first start and last end, in the
    event order of :func:`fifo_starts` (the same start of every node, to the bit;
    busy time summed in processing order), one sample at a time.

    Parameters
    ----------
    graph : Graph
        With its edges and devices.
    durations, makespan, busy, first_start, last_end :
        As in :func:`longest_path_summary`.
    scratch : Scratch
        As in :func:`fifo_starts`, and ``finish`` of nodes entries (the starts of the
        last sample on return).

    Returns
    -------
    int
        A status: OK, DEADLOCK or BAD_SHAPE.
    """
    cdef index_t n = graph.num_nodes
    cdef index_t samples = durations.shape[0]
    cdef index_t status
    if (not graph.has_edges or durations.shape[1] != n
            or not _summary_shapes(graph, samples, makespan, busy, first_start, last_end)
            or not scratch._fits_events(graph) or scratch._finish.shape[0] != n):
        return STATUS_BAD_SHAPE
    with nogil:
        status = _fifo_summary(graph._indptr, graph._successors, durations, graph._resources,
                               graph.num_resources, graph._node_device, makespan, busy,
                               first_start, last_end, scratch._finish, scratch._indegree,
                               scratch._heap_time, scratch._heap_node, scratch._free_at,
                               scratch._holder)
    return status

cdef inline void _summary_reset(time_t[::1] start, time_t[:, ::1] busy,
                                time_t[:, ::1] first_start, time_t[:, ::1] last_end,
                                index_t s) noexcept nogil:
    cdef index_t v, d
    for v in range(start.shape[0]):
        start[v] = 0.0
    for d in range(busy.shape[1]):
        busy[s, d] = 0.0
        first_start[s, d] = INFINITY
        last_end[s, d] = 0.0


cdef inline void _summary_add(index_t d, time_t begin, time_t length, time_t finish,
                              time_t[:, ::1] busy, time_t[:, ::1] first_start,
                              time_t[:, ::1] last_end, index_t s) noexcept nogil:
    busy[s, d] += length
    if begin < first_start[s, d]:
        first_start[s, d] = begin
    if finish > last_end[s, d]:
        last_end[s, d] = finish

cdef index_t _fifo_summary(const index_t[::1] indptr, const index_t[::1] successors,
                           const time_t[:, ::1] durations,
                           const index_t[:, ::1] resources, index_t n_resources,
                           const index_t[::1] node_device, time_t[::1] makespan,
                           time_t[:, ::1] busy, time_t[:, ::1] first_start,
                           time_t[:, ::1] last_end, time_t[::1] start,
                           index_t[::1] indegree, time_t[::1] heap_time,
                           index_t[::1] heap_node, time_t[::1] free_at,
                           index_t[::1] holder) noexcept nogil:
    """Event order with FIFO resources, as ``_fifo_starts``, one sample at a time."""
    cdef index_t n = indptr.shape[0] - 1
    cdef index_t samples = durations.shape[0]
    cdef index_t width = resources.shape[1]
    cdef index_t size, done, v, u, e, k, r, s, d
    cdef time_t begin, finish, longest
    for s in range(samples):
        _count_indegree(indptr, successors, indegree)
        _summary_reset(start, busy, first_start, last_end, s)
        for r in range(n_resources):
            free_at[r] = 0.0
            holder[r] = NO_NODE
        size = 0
        for v in range(n):
            if indegree[v] == 0:
                _heap_push(heap_time, heap_node, size, 0.0, v)
                size += 1
        done = 0
        longest = 0.0
        while size > 0:
            v = heap_node[0]
            begin = heap_time[0]
            _heap_pop(heap_time, heap_node, size)
            size -= 1
            done += 1
            for k in range(width):
                r = resources[v, k]
                if r != NO_RESOURCE and free_at[r] > begin:
                    begin = free_at[r]
            finish = begin + durations[s, v]
            for k in range(width):
                r = resources[v, k]
                if r != NO_RESOURCE:
                    free_at[r] = finish
                    holder[r] = v
            start[v] = begin
            if finish > longest:
                longest = finish
            d = node_device[v]
            if d != NO_DEVICE:
                _summary_add(d, begin, durations[s, v], finish, busy, first_start,
                             last_end, s)
            for e in range(indptr[v], indptr[v + 1]):
                u = successors[e]
                if finish > start[u]:
                    start[u] = finish
                indegree[u] -= 1
                if indegree[u] == 0:
                    _heap_push(heap_time, heap_node, size, start[u], u)
                    size += 1
        if done < n:
            return STATUS_DEADLOCK
        makespan[s] = longest
    return STATUS_OK


# ------------------------------------------------------------ Monte Carlo
# The draws and the fused pass: _montecarlo.pxi (shared with _kernel_avx2).
include "_montecarlo.pxi"


@boundscheck(False)
@wraparound(False)
def lognormal_factors(uint64_t stream,
                      const int64_t[::1] samples not None,
                      const uint64_t[::1] keys not None,
                      const float[::1] sigma not None,
                      const float[::1] shift not None,
                      time_t[:, ::1] factors not None):
    """``factors[i, k] = exp(sigma[k] * Z - shift[k])`` for sample ``samples[i]`` and
    key ``keys[k]``, Z standard normal: the draws :func:`monte_carlo_summary` makes.

    Samples ``2j`` and ``2j+1`` share the hash of ``(pair j's key ^ keys[k])``
    and take its two Box-Muller normals (cosine, sine), so a sample's draw does
    not depend on which other samples are drawn with it.

    Returns
    -------
    int
        A status: OK or BAD_SHAPE.
    """
    cdef Py_ssize_t count = samples.shape[0], width = keys.shape[0]
    cdef Py_ssize_t i, k
    cdef uint64_t pair
    cdef int32_t odd
    if (sigma.shape[0] != width or shift.shape[0] != width or factors.shape[0] != count
            or factors.shape[1] != width):
        return STATUS_BAD_SHAPE
    with nogil:
        for i in range(count):
            pair = _pair_key(stream, samples[i])
            odd = <int32_t>(samples[i] & 1)
            for k in range(width):
                factors[i, k] = _factor(_mix64(pair ^ keys[k]), odd, sigma[k], shift[k])
    return STATUS_OK

cdef extern from *:
    """
    static int tabsched_cpu_has_avx2(void) {
    #if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2");   /* the CPU's flag and the OS's YMM state */
    #else
        return 0;
    #endif
    }
    """
    int tabsched_cpu_has_avx2() noexcept nogil


def _fused_passes():
    """The builds of the Monte Carlo pass this process may run, best first.

    ``_kernel_avx2`` is imported only on a CPU with AVX2 (its code would fault on
    another) and only if the build made it (x86-64 with GCC or Clang);
    ``TABSCHED_SIMD=baseline`` in the environment keeps to this module's build
    (``auto``, ``avx2`` or unset: the best this CPU runs; another value is named in a
    warning and read as ``auto``).
    """
    import os
    choice = os.environ.get("TABSCHED_SIMD", "").strip().lower()
    if choice not in ("", "auto", "avx2", "baseline"):
        import warnings
        warnings.warn(f"TABSCHED_SIMD={choice[:40]!r} is not auto, avx2 or baseline: "
                      f"read as auto", RuntimeWarning, stacklevel=1)
    passes = {}
    if tabsched_cpu_has_avx2() and choice != "baseline":
        try:
            from tabsched import _kernel_avx2
        except ImportError:
            pass
        else:
            passes["avx2"] = _kernel_avx2.monte_carlo_pass
    passes["baseline"] = monte_carlo_pass
    return passes


#: Every build of the fused Monte Carlo pass usable here, by name, best first
#: (the tests hold each to the reference); ``FUSED_PATH`` names the one in use.
FUSED_PASSES = _fused_passes()
FUSED_PATH = next(iter(FUSED_PASSES))
_fused = FUSED_PASSES[FUSED_PATH]


def monte_carlo_summary(Graph graph not None, draws not None, makespan, busy, first_start,
                        last_end, Scratch scratch not None, first_sample=0):
    """Monte Carlo of lognormal noise over a laid-out DAG, drawn as the pass runs.

    Samples ``first_sample .. first_sample + len(makespan) - 1`` (``first_sample``
    even, so that the pairs of samples that share a hash are those of a single
    call): calls over consecutive ranges give the numbers of one call over all of
    them, to the bit, and may run at once in threads (the pass holds no GIL and
    writes only its own outputs and ``scratch.finish``). Node durations are never
    stored: for each block of ``SUMMARY_BLOCK`` samples, node by node in
    topological order, a cell lasts the sum of its operations' ``op_base *
    factor`` (times ``overlap`` for several), a transfer ``transfer_base *
    factor``, an extra node (after the transfers) its ``extra`` duration; each
    factor is ``exp(sigma * Z - shift)`` as :func:`lognormal_factors` draws it for
    the stream and key. The numbers are the same, to the bit, as drawing the
    factors with :func:`lognormal_factors`, composing the node durations as the
    lowering's composer does and running :func:`longest_path_summary`.

    Parameters
    ----------
    graph : Graph
        With its layout and devices. Cells are nodes ``0 .. len(cell_first_op) -
        2``, transfers follow, then the extra nodes.
    draws :
        What the durations are drawn from (``tabsched.engine.NoisyDurations``):
        ``cell_first_op`` (int32, cells + 1: cell ``c`` holds operations
        ``cell_first_op[c] .. cell_first_op[c+1]-1``), ``op_base``, ``op_key``,
        ``op_sigma``, ``op_shift`` (per operation: durations before noise, hash
        keys, the noise's parameters, 0 and 0 for none), ``overlap`` (the factor on
        a cell of several operations), ``transfer_base``, ``transfer_key`` (per
        transfer), ``transfer_sigma``, ``transfer_shift`` (0, 0: transfers do not
        vary), ``extra`` (float64, the extra nodes), ``noise_stream``,
        ``transfer_stream`` (the keys of the two random streams).
    makespan, busy, first_start, last_end :
        As in :func:`longest_path_summary`.
    scratch : Scratch
        ``finish`` of (nodes + 3 x devices) x SUMMARY_BLOCK entries.
    first_sample : int
        The index of the first sample (even, >= 0).

    Returns
    -------
    int
        A status: OK, BAD_SHAPE or BAD_INDEX.
    """
    if not (graph.has_layout and graph.has_devices) or busy.shape[1] != graph.num_devices:
        return STATUS_BAD_SHAPE
    return _fused(graph.pred_indptr, graph.predecessors, graph.order, graph.node_device,
                  draws.cell_first_op, draws.op_base, draws.op_key, draws.op_sigma,
                  draws.op_shift, draws.overlap, draws.transfer_base, draws.transfer_key,
                  draws.transfer_sigma, draws.transfer_shift, draws.extra, draws.noise_stream,
                  draws.transfer_stream, makespan, busy, first_start, last_end, scratch.finish,
                  first_sample)
