# cython: language_level=3
"""Compiled construction steps: what lowering and the transforms build, op by op.

The evaluation kernel (``_kernel``) runs a DAG; this module builds one, and
shapes tables: the dependencies of a table's operations, a CSR from edge lists,
and the list scheduler that places split-backward's ``W`` cells in idle time.
As in the kernel, the functions see typed memoryviews and C scalars only, run
without the GIL, check every id they dereference and return a status or a
count; ``tabsched._reference`` holds their plain-Python twins, and the
property tests assert that both agree.
"""

from cython cimport boundscheck, wraparound
from libc.stdint cimport int8_t

from tabsched._types cimport (
    index_t, time_t, NO_NODE, STATUS_OK, STATUS_BAD_SHAPE, STATUS_BAD_INDEX,
)

cdef enum:
    # operation kinds, as tabsched.table numbers them
    KIND_F = 0
    KIND_B = 1
    KIND_I = 2
    KIND_W = 3
    # dependency groups, in the order lowering numbers transfers and lists edges
    GROUP_ACTIVATION = 0
    GROUP_OWN_FORWARD = 1
    GROUP_INPUT_GRADIENT = 2
    GROUP_WEIGHT_AFTER_INPUT = 3
    GROUPS = 4
    MISSING_PRODUCER = -1

OK = STATUS_OK
BAD_SHAPE = STATUS_BAD_SHAPE
BAD_INDEX = STATUS_BAD_INDEX
ACTIVATION = GROUP_ACTIVATION
OWN_FORWARD = GROUP_OWN_FORWARD
INPUT_GRADIENT = GROUP_INPUT_GRADIENT
WEIGHT_AFTER_INPUT = GROUP_WEIGHT_AFTER_INPUT
#: ``dependencies`` returns this when a consumer's producer is not in the table.
MISSING = MISSING_PRODUCER


@boundscheck(False)
@wraparound(False)
def dependencies(const int8_t[::1] kind not None,
                 const index_t[::1] stage not None,
                 const index_t[::1] microbatch not None,
                 index_t num_stages, index_t num_microbatches,
                 index_t[::1] forward_of not None,
                 index_t[::1] backward_of not None,
                 index_t[::1] input_of not None,
                 index_t[::1] producer not None,
                 index_t[::1] consumer not None,
                 int8_t[::1] group not None):
    """The data dependencies of a table's operations, group by group.

    Groups, in this order: ``F(s-1,m) -> F(s,m)`` (activation); ``F(s,m) ->
    B/I(s,m)`` (own forward); ``B/I(s+1,m) -> B/I(s,m)`` (input gradient);
    ``I(s,m) -> W(s,m)``. Within a group, dependencies follow the consumer's
    operation index.

    Parameters
    ----------
    kind : int8 array (operations,)
        Kind codes: 0 F, 1 B, 2 I, 3 W.
    stage, microbatch : int32 arrays (operations,)
        In range (the table validated them).
    num_stages, num_microbatches : int
    forward_of, backward_of, input_of : int32 scratch, shape (stages * microbatches,)
    producer, consumer : int32 arrays, shape (2 * operations,)
        Output: operation indices of each dependency.
    group : int8 array, shape (2 * operations,)
        Output: the group of each dependency.

    Returns
    -------
    int
        The number of dependencies; MISSING if a consumer's producer is not in
        the table; -1 - STATUS for bad shapes or ids.
    """
    cdef Py_ssize_t ops = kind.shape[0]
    cdef Py_ssize_t pairs = <Py_ssize_t>num_stages * num_microbatches
    cdef index_t count
    if (num_stages < 0 or num_microbatches < 0 or stage.shape[0] != ops
            or microbatch.shape[0] != ops or forward_of.shape[0] != pairs
            or backward_of.shape[0] != pairs or input_of.shape[0] != pairs
            or producer.shape[0] != 2 * ops or consumer.shape[0] != 2 * ops
            or group.shape[0] != 2 * ops):
        return -1 - STATUS_BAD_SHAPE
    with nogil:
        count = _dependencies(kind, stage, microbatch, num_stages, num_microbatches,
                              forward_of, backward_of, input_of, producer, consumer, group)
    return count


cdef index_t _dependencies(const int8_t[::1] kind, const index_t[::1] stage,
                           const index_t[::1] microbatch, index_t S, index_t M,
                           index_t[::1] forward_of, index_t[::1] backward_of,
                           index_t[::1] input_of, index_t[::1] producer,
                           index_t[::1] consumer, int8_t[::1] group) noexcept nogil:
    cdef Py_ssize_t ops = kind.shape[0]
    cdef Py_ssize_t pairs = forward_of.shape[0]
    cdef Py_ssize_t k, pair
    cdef index_t g, count, source
    cdef int8_t code
    for pair in range(pairs):
        forward_of[pair] = NO_NODE
        backward_of[pair] = NO_NODE
        input_of[pair] = NO_NODE
    for k in range(ops):
        if (stage[k] < 0 or stage[k] >= S or microbatch[k] < 0 or microbatch[k] >= M
                or kind[k] < KIND_F or kind[k] > KIND_W):
            return -1 - STATUS_BAD_INDEX
        pair = <Py_ssize_t>stage[k] * M + microbatch[k]
        code = kind[k]
        if code == KIND_F:
            forward_of[pair] = <index_t>k
        elif code == KIND_B or code == KIND_I:
            backward_of[pair] = <index_t>k
            if code == KIND_I:
                input_of[pair] = <index_t>k
    count = 0
    for g in range(GROUPS):
        for k in range(ops):
            code = kind[k]
            pair = <Py_ssize_t>stage[k] * M + microbatch[k]
            if g == GROUP_ACTIVATION:
                if code != KIND_F or stage[k] == 0:
                    continue
                source = forward_of[pair - M]
            elif g == GROUP_OWN_FORWARD:
                if code != KIND_B and code != KIND_I:
                    continue
                source = forward_of[pair]
            elif g == GROUP_INPUT_GRADIENT:
                if (code != KIND_B and code != KIND_I) or stage[k] == S - 1:
                    continue
                source = backward_of[pair + M]
            else:
                if code != KIND_W:
                    continue
                source = input_of[pair]
            if source == NO_NODE:
                return MISSING_PRODUCER
            producer[count] = source
            consumer[count] = <index_t>k
            group[count] = <int8_t>g
            count += 1
    return count


@boundscheck(False)
@wraparound(False)
def csr(const index_t[::1] sources not None, const index_t[::1] targets not None,
        index_t[::1] indptr not None, index_t[::1] successors not None):
    """A CSR from an edge list, each node's successors in the order of the list.

    Parameters
    ----------
    sources, targets : int32 arrays, shape (edges,)
        Node ids, ``0 <= id < len(indptr) - 1``.
    indptr : int32 array, shape (nodes + 1,)
    successors : int32 array, shape (edges,)
        Outputs.

    Returns
    -------
    int
        A status: OK, BAD_SHAPE or BAD_INDEX.
    """
    cdef index_t n = indptr.shape[0] - 1
    cdef Py_ssize_t edges = sources.shape[0]
    cdef index_t status
    if n < 0 or targets.shape[0] != edges or successors.shape[0] != edges:
        return STATUS_BAD_SHAPE
    with nogil:
        status = _csr(sources, targets, indptr, successors)
    return status


cdef index_t _csr(const index_t[::1] sources, const index_t[::1] targets,
                  index_t[::1] indptr, index_t[::1] successors) noexcept nogil:
    cdef index_t n = indptr.shape[0] - 1
    cdef Py_ssize_t edges = sources.shape[0]
    cdef Py_ssize_t e
    cdef index_t v, cursor, previous
    for v in range(n + 1):
        indptr[v] = 0
    for e in range(edges):
        if <size_t>sources[e] >= <size_t>n or <size_t>targets[e] >= <size_t>n:
            return STATUS_BAD_INDEX
        indptr[sources[e] + 1] += 1
    for v in range(n):
        indptr[v + 1] += indptr[v]
    # indptr[v] serves as v's cursor, which leaves the offsets shifted by one list
    for e in range(edges):
        v = sources[e]
        successors[indptr[v]] = targets[e]
        indptr[v] += 1
    previous = 0
    for v in range(n):
        cursor = indptr[v]
        indptr[v] = previous
        previous = cursor
    return STATUS_OK


# ------------------------------------------------------------ memory peaks
@boundscheck(False)
@wraparound(False)
def activation_peaks(const index_t[::1] device not None,
                     const int8_t[::1] kind not None,
                     const index_t[::1] cell_of_op not None,
                     const time_t[::1] node_start not None,
                     const time_t[::1] node_durations not None,
                     const time_t[::1] activation not None,
                     time_t release,
                     time_t[::1] peaks not None):
    """Each device's peak of held activations, without sorting its events.

    An operation's event is an allocation of its activation at the start of an
    ``F``, or a free at the end of a backward: all of it for ``B``, ``release``
    of it for ``I``, the rest for ``W``. Events come per device in row order
    (the table's order), which is their time order: a device runs its row one
    cell after another. Only events at equal times need ordering -- frees
    before allocations, as :meth:`Result.memory_timeline` sorts them, by delta
    then row order -- and such runs are short, so each is put in order by
    insertion. The running sum then adds exactly what the timeline's
    cumulative sum adds, in the same order, so the peaks are the same to the
    bit. Events with a zero delta change nothing and are skipped, as the
    timeline drops them.

    Parameters
    ----------
    device, kind, cell_of_op : arrays (operations,)
        The table's columns (``device`` non-decreasing) and each operation's cell.
    node_start, node_durations : float64 arrays (nodes,)
    activation : float64 array (operations,)
    release : float
        The part of an activation ``I`` frees.
    peaks : float64 array (devices,)
        Output: ``max(0, largest running sum)`` per device.

    Returns
    -------
    int
        A status: OK; BAD_SHAPE if lengths differ or a device's event times
        fall (the caller then sorts); BAD_INDEX for an id out of range or a
        device out of order.
    """
    cdef Py_ssize_t events = device.shape[0]
    cdef index_t status
    if (kind.shape[0] != events or cell_of_op.shape[0] != events
            or activation.shape[0] != events or node_durations.shape[0] != node_start.shape[0]):
        return STATUS_BAD_SHAPE
    with nogil:
        status = _activation_peaks(device, kind, cell_of_op, node_start, node_durations,
                                   activation, release, peaks)
    return status


cdef inline int _event(const int8_t[::1] kind, const index_t[::1] cell_of_op,
                       const time_t[::1] node_start, const time_t[::1] node_durations,
                       const time_t[::1] activation, time_t release, Py_ssize_t k,
                       time_t *time, time_t *delta) noexcept nogil:
    cdef index_t cell = cell_of_op[k]
    cdef int8_t code = kind[k]
    if <size_t>cell >= <size_t>node_start.shape[0]:
        return -1
    if code == KIND_F:
        time[0] = node_start[cell]
        delta[0] = activation[k]
        return 0
    time[0] = node_start[cell] + node_durations[cell]
    delta[0] = -activation[k]
    if code == KIND_I:
        delta[0] *= release
    elif code == KIND_W:
        delta[0] *= 1.0 - release
    return 0


cdef index_t _activation_peaks(const index_t[::1] device, const int8_t[::1] kind,
                               const index_t[::1] cell_of_op, const time_t[::1] node_start,
                               const time_t[::1] node_durations,
                               const time_t[::1] activation, time_t release,
                               time_t[::1] peaks) noexcept nogil:
    cdef Py_ssize_t events = device.shape[0]
    cdef index_t devices = peaks.shape[0]
    cdef Py_ssize_t k, run_end, a, b, count
    cdef index_t d, previous = 0
    cdef time_t level, peak, value, time, next_time, delta
    cdef time_t run[64]
    for d in range(devices):
        peaks[d] = 0.0
    if events == 0:
        return STATUS_OK
    if _event(kind, cell_of_op, node_start, node_durations, activation, release, 0,
              &time, &delta) < 0:
        return STATUS_BAD_INDEX
    k = 0
    while k < events:
        d = device[k]
        if d < previous or d >= devices:
            return STATUS_BAD_INDEX
        previous = d
        level = 0.0
        peak = 0.0
        while k < events and device[k] == d:
            # the run of events at this time, zero deltas left out, frees first
            run_end = k
            count = 0
            while True:
                if delta != 0.0:
                    if count == 64:
                        return STATUS_BAD_SHAPE      # an implausibly long run: sort instead
                    b = count
                    while b > 0 and run[b - 1] > delta:   # stable: equal deltas keep order
                        run[b] = run[b - 1]
                        b -= 1
                    run[b] = delta
                    count += 1
                run_end += 1
                if run_end == events:
                    break
                if _event(kind, cell_of_op, node_start, node_durations, activation, release,
                          run_end, &next_time, &delta) < 0:
                    return STATUS_BAD_INDEX
                if device[run_end] != d or next_time != time:
                    if device[run_end] == d and next_time < time:
                        return STATUS_BAD_SHAPE
                    break
            for a in range(count):
                level += run[a]
                peak = level if level > peak else peak
            k = run_end
            time = next_time
        peaks[d] = peak
    return STATUS_OK


# ------------------------------------------------------------- CSR editing
@boundscheck(False)
@wraparound(False)
def append_one(const index_t[::1] indptr not None, const index_t[::1] items not None,
               const index_t[::1] extra not None, index_t[::1] new_indptr not None,
               index_t[::1] new_items not None):
    """A CSR with ``extra[row]`` appended to each row where it is not NO_NODE.

    Parameters
    ----------
    indptr, items : int32 arrays
        The CSR (offsets from 0 to ``len(items)``, not falling).
    extra : int32 array, shape (rows,)
    new_indptr : int32 array, shape (rows + 1,)
    new_items : int32 array, shape (len(items) + appended,)
        Outputs.

    Returns
    -------
    int
        A status: OK or BAD_SHAPE.
    """
    cdef index_t rows = indptr.shape[0] - 1
    cdef index_t status
    if rows < 0 or extra.shape[0] != rows or new_indptr.shape[0] != rows + 1:
        return STATUS_BAD_SHAPE
    with nogil:
        status = _append_one(indptr, items, extra, new_indptr, new_items)
    return status


cdef index_t _append_one(const index_t[::1] indptr, const index_t[::1] items,
                         const index_t[::1] extra, index_t[::1] new_indptr,
                         index_t[::1] new_items) noexcept nogil:
    cdef index_t rows = indptr.shape[0] - 1
    cdef Py_ssize_t size = items.shape[0], room = new_items.shape[0]
    cdef Py_ssize_t cursor = 0
    cdef index_t row, e
    if indptr[0] != 0 or indptr[rows] != size:
        return STATUS_BAD_SHAPE
    for row in range(rows):
        if indptr[row + 1] < indptr[row]:
            return STATUS_BAD_SHAPE
        if cursor + (indptr[row + 1] - indptr[row]) + (extra[row] != NO_NODE) > room:
            return STATUS_BAD_SHAPE
        new_indptr[row] = <index_t>cursor
        for e in range(indptr[row], indptr[row + 1]):
            new_items[cursor] = items[e]
            cursor += 1
        if extra[row] != NO_NODE:
            new_items[cursor] = extra[row]
            cursor += 1
    if cursor != room:
        return STATUS_BAD_SHAPE
    new_indptr[rows] = <index_t>cursor
    return STATUS_OK
