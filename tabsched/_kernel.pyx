# cython: language_level=3
"""Evaluation kernel: earliest start times over a lowered schedule DAG.

The caller (tabsched.lower) validates and allocates everything; the functions
here see typed memoryviews and C scalars only, run without the GIL and return a
status code. tabsched._reference holds the plain-Python twin of every entry point;
the property tests assert that both agree to the bit.

Semantics (DESIGN.md, "Dependencies and execution semantics"):

* a node starts when all its predecessors have ended and, if it names
  resources, when every one of them is free; it then holds them until it ends;
* a resource serves the nodes that want it first come, first served: in order
  of the time they became ready, ties broken by the lower node id;
* with no resources at all (``resources`` has zero columns) this is the
  longest-path problem, solved by one topological order shared by all samples.

``binding[v]`` (sample 0 only, when ``binding`` is not empty) is the node that
decided when ``v`` started: the predecessor whose end came strictly latest
(first one in processing order on ties), or the previous holder of a resource
``v`` waited for, or NO_NODE when ``v`` started at time 0.
"""

from cython cimport boundscheck, wraparound
from libc.math cimport INFINITY

from tabsched._types cimport (
    index_t, time_t, NO_NODE, NO_RESOURCE, NO_DEVICE,
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


cdef index_t _topological_order(const index_t[::1] indptr, const index_t[::1] successors,
                                index_t[::1] indegree, index_t[::1] order) noexcept nogil:
    """Kahn's order with a FIFO queue into ``order``; returns how many nodes it reached.

    Fewer than all nodes means a cycle; ``indegree[v] > 0`` then marks the nodes left.
    """
    cdef index_t n = indptr.shape[0] - 1
    cdef index_t head = 0, tail = 0
    cdef index_t v, u, e
    _count_indegree(indptr, successors, indegree)
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


cdef int _check_graph(const index_t[::1] indptr, const index_t[::1] successors,
                      const index_t[:, ::1] resources, index_t n_resources) noexcept nogil:
    """Bounds of every id the kernel will dereference (bounds checks are off)."""
    cdef index_t n = indptr.shape[0] - 1
    cdef index_t v, e, k, r
    if indptr[0] != 0 or indptr[n] != successors.shape[0]:
        return STATUS_BAD_SHAPE
    for v in range(n):
        if indptr[v + 1] < indptr[v]:
            return STATUS_BAD_SHAPE
    for e in range(successors.shape[0]):
        if successors[e] < 0 or successors[e] >= n:
            return STATUS_BAD_INDEX
    for v in range(resources.shape[0]):
        for k in range(resources.shape[1]):
            r = resources[v, k]
            if r != NO_RESOURCE and (r < 0 or r >= n_resources):
                return STATUS_BAD_INDEX
    return STATUS_OK


@boundscheck(False)
@wraparound(False)
def evaluate(const index_t[::1] indptr not None,
             const index_t[::1] successors not None,
             const time_t[:, ::1] durations not None,
             const index_t[:, ::1] resources not None,
             index_t n_resources,
             time_t[:, ::1] start not None,
             time_t[:, ::1] end not None,
             index_t[::1] binding not None,
             index_t[::1] indegree not None,
             index_t[::1] order not None,
             time_t[::1] heap_time not None,
             index_t[::1] heap_node not None,
             time_t[::1] free_at not None,
             index_t[::1] holder not None):
    """Start and end of every node for every sample of durations.

    Parameters
    ----------
    indptr, successors : int32 arrays
        The DAG in CSR form: the successors of node v are
        ``successors[indptr[v]:indptr[v+1]]``.
    durations : float64 array, shape (samples, nodes)
    resources : int32 array, shape (nodes, R)
        Resource ids each node holds while it runs, padded with NO_RESOURCE_ID.
        R = 0 means no node ever waits for a resource.
    n_resources : int
    start, end : float64 arrays, shape (samples, nodes)
        Outputs; ``end`` may have 0 rows, and is then not written
        (``end = start + durations``, exactly, for every node).
    binding : int32 array, shape (nodes,) or (0,)
        Output for sample 0 (see the module docstring); skipped when empty.
    indegree, order : int32 scratch, shape (nodes,)
        On a deadlock, ``indegree[v] > 0`` marks the nodes that never ran.
    heap_time, heap_node : scratch, shape (nodes,); may be empty when R = 0
    free_at, holder : scratch, shape (n_resources,)

    Returns
    -------
    int
        A status: OK, DEADLOCK, BAD_SHAPE or BAD_INDEX.
    """
    cdef index_t n = indptr.shape[0] - 1
    cdef index_t samples = durations.shape[0]
    cdef index_t width = resources.shape[1]
    cdef bint record = binding.shape[0] > 0
    cdef bint write_end = end.shape[0] > 0
    cdef index_t status
    if n < 0:
        return STATUS_BAD_SHAPE
    if (durations.shape[1] != n or start.shape[0] != samples or start.shape[1] != n
            or (end.shape[0] != 0 and (end.shape[0] != samples or end.shape[1] != n))
            or (width > 0 and resources.shape[0] != n)
            or (record and binding.shape[0] != n)
            or indegree.shape[0] != n or order.shape[0] != n
            or (width > 0 and (heap_time.shape[0] != n or heap_node.shape[0] != n))
            or free_at.shape[0] < n_resources or holder.shape[0] < n_resources):
        return STATUS_BAD_SHAPE
    with nogil:
        status = _check_graph(indptr, successors, resources, n_resources)
        if status == STATUS_OK:
            if width == 0:
                status = _evaluate_static(indptr, successors, durations, start, end,
                                          write_end, binding, record, indegree, order)
            else:
                status = _evaluate_fifo(indptr, successors, durations, resources,
                                        n_resources, start, end, write_end, binding, record,
                                        indegree, heap_time, heap_node, free_at, holder)
    return status


cdef index_t _evaluate_static(const index_t[::1] indptr, const index_t[::1] successors,
                              const time_t[:, ::1] durations,
                              time_t[:, ::1] start, time_t[:, ::1] end, bint write_end,
                              index_t[::1] binding, bint record,
                              index_t[::1] indegree, index_t[::1] order) noexcept nogil:
    """Longest path: one topological order (Kahn, FIFO queue), then one pass per sample."""
    cdef index_t n = indptr.shape[0] - 1
    cdef index_t samples = durations.shape[0]
    cdef index_t v, u, e, i, s
    cdef time_t finish
    if _topological_order(indptr, successors, indegree, order) < n:
        return STATUS_DEADLOCK
    if record:
        for v in range(n):
            binding[v] = NO_NODE
    for s in range(samples):
        for v in range(n):
            start[s, v] = 0.0
        for i in range(n):
            v = order[i]
            finish = start[s, v] + durations[s, v]
            if write_end:
                end[s, v] = finish
            for e in range(indptr[v], indptr[v + 1]):
                u = successors[e]
                if finish > start[s, u]:
                    start[s, u] = finish
                    if record and s == 0:
                        binding[u] = v
    return STATUS_OK


cdef index_t _evaluate_fifo(const index_t[::1] indptr, const index_t[::1] successors,
                            const time_t[:, ::1] durations,
                            const index_t[:, ::1] resources, index_t n_resources,
                            time_t[:, ::1] start, time_t[:, ::1] end, bint write_end,
                            index_t[::1] binding, bint record,
                            index_t[::1] indegree,
                            time_t[::1] heap_time, index_t[::1] heap_node,
                            time_t[::1] free_at, index_t[::1] holder) noexcept nogil:
    """Event order: nodes run in order of their ready time, resources are FIFO."""
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
            if write_end:
                end[s, v] = finish
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
        The ``indegree`` scratch left by ``evaluate`` after a deadlock.
    cycle, position : int32 scratch of length nodes
        ``cycle[:length]`` receives the cycle in dependency order.

    Returns
    -------
    int
        The cycle's length, 0 if no node is unfinished, -1 on inconsistent input.
    """
    cdef index_t n = pred_indptr.shape[0] - 1
    cdef index_t length
    if (n < 0 or remaining.shape[0] != n or cycle.shape[0] != n
            or position.shape[0] != n or pred_indptr[n] != predecessors.shape[0]):
        return -1
    with nogil:
        length = _find_cycle(pred_indptr, predecessors, remaining, cycle, position)
    return length


cdef index_t _find_cycle(const index_t[::1] pred_indptr, const index_t[::1] predecessors,
                         const index_t[::1] remaining, index_t[::1] cycle,
                         index_t[::1] position) noexcept nogil:
    cdef index_t n = pred_indptr.shape[0] - 1
    cdef index_t v, p, e, steps, first, length, i
    for e in range(predecessors.shape[0]):
        if predecessors[e] < 0 or predecessors[e] >= n:
            return -1
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


# ---------------------------------------------------------------- summaries
# Monte Carlo needs, per sample, only the makespan and, per device, its busy
# time, first start and last end. ``evaluate_summary`` computes those without a
# (samples x nodes) output: one row of starts is reused as scratch.

@boundscheck(False)
@wraparound(False)
def evaluate_summary(const index_t[::1] indptr not None,
                     const index_t[::1] successors not None,
                     const time_t[:, ::1] durations not None,
                     const index_t[:, ::1] resources not None,
                     index_t n_resources,
                     const index_t[::1] node_device not None,
                     time_t[::1] makespan not None,
                     time_t[:, ::1] busy not None,
                     time_t[:, ::1] first_start not None,
                     time_t[:, ::1] last_end not None,
                     time_t[::1] start not None,
                     index_t[::1] indegree not None,
                     index_t[::1] order not None,
                     time_t[::1] heap_time not None,
                     index_t[::1] heap_node not None,
                     time_t[::1] free_at not None,
                     index_t[::1] holder not None):
    """Per-sample makespan and per-device busy time, first start and last end.

    The same schedule as :func:`evaluate` (same processing order, so the same
    start of every node, to the bit), summarised while it runs.

    Parameters
    ----------
    indptr, successors, durations, resources, n_resources :
        As in :func:`evaluate`.
    node_device : int32 array, shape (nodes,)
        The device whose compute stream runs each node, or NO_DEVICE_ID.
    makespan : float64 array, shape (samples,)
        Output: the latest end of any node (0 for an empty graph).
    busy, first_start, last_end : float64 arrays, shape (samples, devices)
        Outputs: per device, the summed durations of its nodes (in processing
        order), the earliest start (+inf if it has none) and the latest end
        (0 if it has none).
    start : float64 scratch, shape (nodes,)
        Holds the starts of the last sample on return.
    indegree, order, heap_time, heap_node, free_at, holder :
        Scratch, as in :func:`evaluate`.

    Returns
    -------
    int
        A status: OK, DEADLOCK, BAD_SHAPE or BAD_INDEX.
    """
    cdef index_t n = indptr.shape[0] - 1
    cdef index_t samples = durations.shape[0]
    cdef index_t width = resources.shape[1]
    cdef index_t devices = busy.shape[1]
    cdef index_t status, v
    if n < 0:
        return STATUS_BAD_SHAPE
    if (durations.shape[1] != n or (width > 0 and resources.shape[0] != n)
            or node_device.shape[0] != n or makespan.shape[0] != samples
            or busy.shape[0] != samples
            or first_start.shape[0] != samples or first_start.shape[1] != devices
            or last_end.shape[0] != samples or last_end.shape[1] != devices
            or start.shape[0] != n or indegree.shape[0] != n or order.shape[0] != n
            or (width > 0 and (heap_time.shape[0] != n or heap_node.shape[0] != n))
            or free_at.shape[0] < n_resources or holder.shape[0] < n_resources):
        return STATUS_BAD_SHAPE
    with nogil:
        status = _check_graph(indptr, successors, resources, n_resources)
        if status == STATUS_OK:
            for v in range(n):
                if node_device[v] != NO_DEVICE and (node_device[v] < 0
                                                    or node_device[v] >= devices):
                    status = STATUS_BAD_INDEX
                    break
        if status == STATUS_OK:
            if width == 0:
                status = _summary_static(indptr, successors, durations, node_device,
                                         makespan, busy, first_start, last_end, start,
                                         indegree, order)
            else:
                status = _summary_fifo(indptr, successors, durations, resources, n_resources,
                                       node_device, makespan, busy, first_start, last_end,
                                       start, indegree, heap_time, heap_node, free_at, holder)
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


cdef index_t _summary_static(const index_t[::1] indptr, const index_t[::1] successors,
                             const time_t[:, ::1] durations, const index_t[::1] node_device,
                             time_t[::1] makespan, time_t[:, ::1] busy,
                             time_t[:, ::1] first_start, time_t[:, ::1] last_end,
                             time_t[::1] start, index_t[::1] indegree,
                             index_t[::1] order) noexcept nogil:
    """Longest path, as ``_evaluate_static``: one Kahn order, one pass per sample."""
    cdef index_t n = indptr.shape[0] - 1
    cdef index_t samples = durations.shape[0]
    cdef index_t v, u, e, i, s, d
    cdef time_t finish, longest
    if _topological_order(indptr, successors, indegree, order) < n:
        return STATUS_DEADLOCK
    for s in range(samples):
        _summary_reset(start, busy, first_start, last_end, s)
        longest = 0.0
        for i in range(n):
            v = order[i]
            finish = start[v] + durations[s, v]
            if finish > longest:
                longest = finish
            d = node_device[v]
            if d != NO_DEVICE:
                _summary_add(d, start[v], durations[s, v], finish, busy, first_start,
                             last_end, s)
            for e in range(indptr[v], indptr[v + 1]):
                u = successors[e]
                if finish > start[u]:
                    start[u] = finish
        makespan[s] = longest
    return STATUS_OK


cdef index_t _summary_fifo(const index_t[::1] indptr, const index_t[::1] successors,
                           const time_t[:, ::1] durations,
                           const index_t[:, ::1] resources, index_t n_resources,
                           const index_t[::1] node_device, time_t[::1] makespan,
                           time_t[:, ::1] busy, time_t[:, ::1] first_start,
                           time_t[:, ::1] last_end, time_t[::1] start,
                           index_t[::1] indegree, time_t[::1] heap_time,
                           index_t[::1] heap_node, time_t[::1] free_at,
                           index_t[::1] holder) noexcept nogil:
    """Event order with FIFO resources, as ``_evaluate_fifo``, one sample at a time."""
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
