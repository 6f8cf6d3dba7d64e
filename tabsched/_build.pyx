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
from libc.stdlib cimport calloc, free, malloc, realloc

from tabsched._types cimport (
    index_t, time_t, NO_NODE, STATUS_OK, STATUS_BAD_SHAPE, STATUS_BAD_INDEX,
    STATUS_DEADLOCK,
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
    FILL_NO_MEMORY = -1

OK = STATUS_OK
BAD_SHAPE = STATUS_BAD_SHAPE
BAD_INDEX = STATUS_BAD_INDEX
DEADLOCK = STATUS_DEADLOCK
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
                 const index_t[::1] device not None,
                 index_t num_stages, index_t num_microbatches,
                 index_t[::1] forward_of not None,
                 index_t[::1] backward_of not None,
                 index_t[::1] input_of not None,
                 index_t[::1] producer not None,
                 index_t[::1] consumer not None,
                 int8_t[::1] group not None,
                 int8_t[::1] crossing not None):
    """The data dependencies of a table's operations, group by group.

    Groups, in this order: ``F(s-1,m) -> F(s,m)`` (activation); ``F(s,m) ->
    B/I(s,m)`` (own forward); ``B/I(s+1,m) -> B/I(s,m)`` (input gradient);
    ``I(s,m) -> W(s,m)``. Within a group, dependencies follow the consumer's
    operation index.

    Parameters
    ----------
    kind : int8 array (operations,)
        Kind codes: 0 F, 1 B, 2 I, 3 W.
    stage, microbatch, device : int32 arrays (operations,)
        In range (the table validated them).
    num_stages, num_microbatches : int
    forward_of, backward_of, input_of : int32 scratch, shape (stages * microbatches,)
    producer, consumer : int32 arrays, shape (2 * operations,)
        Output: operation indices of each dependency.
    group, crossing : int8 arrays, shape (2 * operations,)
        Output: the group of each dependency, and 1 where its producer and
        consumer are on different devices (a transfer), else 0.

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
            or microbatch.shape[0] != ops or device.shape[0] != ops
            or forward_of.shape[0] != pairs
            or backward_of.shape[0] != pairs or input_of.shape[0] != pairs
            or producer.shape[0] != 2 * ops or consumer.shape[0] != 2 * ops
            or group.shape[0] != 2 * ops or crossing.shape[0] != 2 * ops):
        return -1 - STATUS_BAD_SHAPE
    with nogil:
        count = _dependencies(kind, stage, microbatch, device, num_stages, num_microbatches,
                              forward_of, backward_of, input_of, producer, consumer, group,
                              crossing)
    return count


cdef inline bint _bad_op(int8_t kind, index_t stage, index_t microbatch, index_t S,
                         index_t M) noexcept nogil:
    """An operation whose stage, microbatch or kind is outside the table's ranges."""
    return (stage < 0 or stage >= S or microbatch < 0 or microbatch >= M
            or kind < KIND_F or kind > KIND_W)


cdef inline void _clear_lookups(index_t[::1] first, index_t[::1] second,
                                index_t[::1] third) noexcept nogil:
    """Every (stage, microbatch) lookup of three operation kinds set to 'none yet'."""
    cdef Py_ssize_t pair
    for pair in range(first.shape[0]):
        first[pair] = NO_NODE
        second[pair] = NO_NODE
        third[pair] = NO_NODE


cdef index_t _dependencies(const int8_t[::1] kind, const index_t[::1] stage,
                           const index_t[::1] microbatch, const index_t[::1] device,
                           index_t S, index_t M,
                           index_t[::1] forward_of, index_t[::1] backward_of,
                           index_t[::1] input_of, index_t[::1] producer,
                           index_t[::1] consumer, int8_t[::1] group,
                           int8_t[::1] crossing) noexcept nogil:
    cdef Py_ssize_t ops = kind.shape[0]
    cdef Py_ssize_t pairs = forward_of.shape[0]
    cdef Py_ssize_t k, pair
    cdef index_t g, count, source
    cdef index_t[GROUPS] cursor
    cdef int8_t code
    for g in range(GROUPS):
        cursor[g] = 0
    _clear_lookups(forward_of, backward_of, input_of)
    for k in range(ops):
        if _bad_op(kind[k], stage[k], microbatch[k], S, M):
            return -1 - STATUS_BAD_INDEX
        pair = <Py_ssize_t>stage[k] * M + microbatch[k]
        code = kind[k]
        # each group's size, counted here; then one pass writes every dependency at
        # its group's cursor: group by group, in the consumer's order within a group
        if code == KIND_F:
            forward_of[pair] = <index_t>k
            if stage[k] != 0:
                cursor[GROUP_ACTIVATION] += 1
        elif code == KIND_B or code == KIND_I:
            backward_of[pair] = <index_t>k
            if code == KIND_I:
                input_of[pair] = <index_t>k
            cursor[GROUP_OWN_FORWARD] += 1
            if stage[k] != S - 1:
                cursor[GROUP_INPUT_GRADIENT] += 1
        else:
            cursor[GROUP_WEIGHT_AFTER_INPUT] += 1
    count = 0
    for g in range(GROUPS):
        source = cursor[g]
        cursor[g] = count
        count += source
    if count == 0:
        return 0
    cdef Out out
    out.producer, out.consumer = &producer[0], &consumer[0]
    out.group, out.crossing, out.device = &group[0], &crossing[0], &device[0]
    for k in range(ops):
        code = kind[k]
        pair = <Py_ssize_t>stage[k] * M + microbatch[k]
        if code == KIND_F:
            if stage[k] != 0 and _put(&out, forward_of[pair - M], k, GROUP_ACTIVATION,
                                      cursor):
                return MISSING_PRODUCER
        elif code == KIND_B or code == KIND_I:
            if _put(&out, forward_of[pair], k, GROUP_OWN_FORWARD, cursor):
                return MISSING_PRODUCER
            if stage[k] != S - 1 and _put(&out, backward_of[pair + M], k,
                                          GROUP_INPUT_GRADIENT, cursor):
                return MISSING_PRODUCER
        elif _put(&out, input_of[pair], k, GROUP_WEIGHT_AFTER_INPUT, cursor):
            return MISSING_PRODUCER
    return count


cdef struct Out:
    # where _dependencies writes (its outputs' first entries)
    index_t *producer
    index_t *consumer
    int8_t *group
    int8_t *crossing
    const index_t *device


cdef inline bint _put(Out *out, index_t source, Py_ssize_t k, int g,
                      index_t *cursor) noexcept nogil:
    """Write dependency ``source -> k`` of group ``g`` at its cursor; True when the
    producer is missing."""
    cdef index_t at = cursor[g]
    if source == NO_NODE:
        return True
    out.producer[at] = source
    out.consumer[at] = <index_t>k
    out.group[at] = <int8_t>g
    out.crossing[at] = out.device[source] != out.device[k]
    cursor[g] = at + 1
    return False


@boundscheck(False)
@wraparound(False)
def direct_csr(const int8_t[::1] kind not None, const index_t[::1] stage not None,
               const index_t[::1] microbatch not None, const index_t[::1] cell_of_op not None,
               const index_t[::1] cell_device not None, index_t num_stages,
               index_t num_microbatches, index_t[::1] forward_of not None,
               index_t[::1] backward_of not None, index_t[::1] weight_of not None,
               index_t[::1] indptr not None, index_t[::1] successors not None):
    """The CSR of a plain lowering whose dependencies across devices are direct edges
    (free transfers: no transfer node), from the table's columns, with no list of
    dependencies in between: :func:`plain_csr` of :func:`dependencies` with nothing
    crossing, every node's successors the same, in the same order for a cell of one
    operation.

    Each cell's successors: its next cell on its device (row order), then each data
    dependency its operations produce, group by group (activation ``F(s,m) ->
    F(s+1,m)``, own forward ``F(s,m) -> B/I(s,m)``, input gradient ``B/I(s,m) ->
    B/I(s-1,m)``, ``I(s,m) -> W(s,m)``), within a group in the order of the cell's
    operations (:func:`plain_csr` orders a group by the consumer: the two differ only
    in a cell of several operations). Written from the producers' side, each cell's
    list as it comes, the indegrees' count-then-fill pass is not needed; that every
    consumer found its producer is checked by counting the dependencies from the
    consumers' side.

    Parameters
    ----------
    kind, stage, microbatch : int8 / int32 arrays (operations,)
        The table's columns.
    cell_of_op : int32 array (operations,)
        Each operation's cell: 0, then each the previous one's or the next.
    cell_device : int32 array (cells,)
    num_stages, num_microbatches : int
    forward_of, backward_of, weight_of : int32 scratch, shape (stages * microbatches,)
    indptr : int32 array, shape (cells + 1,)
    successors : int32 array, at least as long as the edges
        Outputs: the CSR, in ``successors[:count]``.

    Returns
    -------
    int
        ``count``, the number of edges; MISSING if a consumer's producer is not in the
        table; -1 - STATUS for bad shapes (``successors`` too short) or ids.
    """
    cdef Py_ssize_t ops = kind.shape[0]
    cdef Py_ssize_t pairs = <Py_ssize_t>num_stages * num_microbatches
    cdef index_t count
    if (num_stages < 0 or num_microbatches < 0 or stage.shape[0] != ops
            or microbatch.shape[0] != ops or cell_of_op.shape[0] != ops
            or forward_of.shape[0] != pairs or backward_of.shape[0] != pairs
            or weight_of.shape[0] != pairs or indptr.shape[0] != cell_device.shape[0] + 1):
        return -1 - STATUS_BAD_SHAPE
    with nogil:
        count = _direct_csr(kind, stage, microbatch, cell_of_op, cell_device, num_stages,
                            num_microbatches, forward_of, backward_of, weight_of, indptr,
                            successors)
    return count


cdef index_t _direct_csr(const int8_t[::1] kind, const index_t[::1] stage,
                         const index_t[::1] microbatch, const index_t[::1] cell_of_op,
                         const index_t[::1] cell_device, index_t S, index_t M,
                         index_t[::1] forward_of, index_t[::1] backward_of,
                         index_t[::1] weight_of, index_t[::1] indptr,
                         index_t[::1] successors) noexcept nogil:
    cdef Py_ssize_t ops = kind.shape[0]
    cdef Py_ssize_t pairs = forward_of.shape[0]
    cdef index_t cells = cell_device.shape[0]
    cdef Py_ssize_t k, q, first, pair, deps = 0, rows = 0, e = 0
    cdef index_t c, previous = -1, target, g
    cdef int8_t code
    _clear_lookups(forward_of, backward_of, weight_of)
    # the lookups, the cells' ids, and the dependencies counted from the consumers' side
    for k in range(ops):
        if _bad_op(kind[k], stage[k], microbatch[k], S, M):
            return -1 - STATUS_BAD_INDEX
        c = cell_of_op[k]
        if c < 0 or c >= cells or (c != previous and c != previous + 1):
            return -1 - STATUS_BAD_INDEX
        previous = c
        pair = <Py_ssize_t>stage[k] * M + microbatch[k]
        code = kind[k]
        if code == KIND_F:
            forward_of[pair] = <index_t>k
            if stage[k] != 0:
                deps += 1
        elif code == KIND_B or code == KIND_I:
            backward_of[pair] = <index_t>k
            deps += 1 if stage[k] == S - 1 else 2
        else:
            weight_of[pair] = <index_t>k
            deps += 1
    if previous != cells - 1:                   # a cell with no operation
        return -1 - STATUS_BAD_SHAPE
    for c in range(cells - 1):
        if cell_device[c + 1] == cell_device[c]:
            rows += 1
    if successors.shape[0] < rows + deps or rows + deps > 2147483646:   # int32 ids
        return -1 - STATUS_BAD_SHAPE
    k = 0
    for c in range(cells):
        indptr[c] = <index_t>e
        if c + 1 < cells and cell_device[c + 1] == cell_device[c]:
            successors[e] = c + 1
            e += 1
        first = k
        while k < ops and cell_of_op[k] == c:
            k += 1
        if k == first + 1:                      # one operation: its groups in order
            code = kind[first]
            pair = <Py_ssize_t>stage[first] * M + microbatch[first]
            if code == KIND_F:
                if stage[first] != S - 1:
                    target = forward_of[pair + M]
                    if target != NO_NODE:
                        if e == rows + deps:
                            return MISSING_PRODUCER
                        successors[e] = cell_of_op[target]
                        e += 1
                target = backward_of[pair]
            elif code == KIND_W:
                continue
            else:
                if stage[first] != 0:
                    target = backward_of[pair - M]
                    if target != NO_NODE:
                        if e == rows + deps:
                            return MISSING_PRODUCER
                        successors[e] = cell_of_op[target]
                        e += 1
                target = weight_of[pair] if code == KIND_I else NO_NODE
            if target != NO_NODE:
                if e == rows + deps:
                    return MISSING_PRODUCER
                successors[e] = cell_of_op[target]
                e += 1
            continue
        for g in range(GROUPS):
            for q in range(first, k):
                code = kind[q]
                pair = <Py_ssize_t>stage[q] * M + microbatch[q]
                target = NO_NODE
                if g == GROUP_ACTIVATION:
                    if code == KIND_F and stage[q] != S - 1:
                        target = forward_of[pair + M]
                elif g == GROUP_OWN_FORWARD:
                    if code == KIND_F:
                        target = backward_of[pair]
                elif g == GROUP_INPUT_GRADIENT:
                    if (code == KIND_B or code == KIND_I) and stage[q] != 0:
                        target = backward_of[pair - M]
                elif code == KIND_I:
                    target = weight_of[pair]
                if target != NO_NODE:
                    if e == rows + deps:        # more than the consumers counted
                        return MISSING_PRODUCER
                    successors[e] = cell_of_op[target]
                    e += 1
    indptr[cells] = <index_t>e
    if e != rows + deps:                        # a consumer whose producer is missing
        return MISSING_PRODUCER
    return <index_t>e


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


@boundscheck(False)
@wraparound(False)
def plain_csr(const index_t[::1] cell_device not None,
              const index_t[::1] cell_of_op not None,
              const index_t[::1] producer not None,
              const index_t[::1] consumer not None,
              const int8_t[::1] crossing not None,
              index_t[::1] indptr not None, index_t[::1] successors not None):
    """The CSR of a plain lowering (no extra edges), written straight from the
    dependencies: what :func:`csr` builds from lowering's three edge groups, in
    their order, without the edge lists.

    Groups, each node's successors in this order: row order (cell ``c`` -> ``c +
    1`` when both are on one device); every dependency, in the order given, from
    its producer's cell to its consumer's cell, or to its transfer node when it
    is ``crossing`` (transfer ``j``, node ``cells + j``, is the ``j``-th crossing
    dependency); each transfer node to its consumer's cell.

    Parameters
    ----------
    cell_device : int32 array (cells,)
        The device of each compute node.
    cell_of_op : int32 array (operations,)
        The compute node of each operation, in ``0 .. cells - 1``.
    producer, consumer : int32 arrays (dependencies,)
        Operation indices.
    crossing : int8 array (dependencies,)
        1 where the dependency is a transfer.
    indptr : int32 array, shape (cells + transfers + 1,)
    successors : int32 array, shape (edges,)
        Outputs: every row edge, dependency and transfer, exactly.

    Returns
    -------
    int
        A status: OK, BAD_SHAPE or BAD_INDEX.
    """
    cdef Py_ssize_t deps = producer.shape[0]
    cdef index_t status
    if consumer.shape[0] != deps or crossing.shape[0] != deps or indptr.shape[0] < 1:
        return STATUS_BAD_SHAPE
    with nogil:
        status = _plain_csr(cell_device, cell_of_op, producer, consumer, crossing, indptr,
                            successors)
    return status


cdef index_t _plain_csr(const index_t[::1] cell_device, const index_t[::1] cell_of_op,
                        const index_t[::1] producer, const index_t[::1] consumer,
                        const int8_t[::1] crossing, index_t[::1] indptr,
                        index_t[::1] successors) noexcept nogil:
    cdef index_t cells = cell_device.shape[0]
    cdef index_t n = indptr.shape[0] - 1
    cdef Py_ssize_t ops = cell_of_op.shape[0]
    cdef Py_ssize_t deps = producer.shape[0]
    cdef Py_ssize_t k, edges = 0
    cdef index_t v, c, cursor, previous, transfer
    # the ids first: every operation's cell, every dependency's operations, and the
    # transfers (one node each after the cells) exactly the nodes left
    for k in range(ops):
        if <size_t>cell_of_op[k] >= <size_t>cells:
            return STATUS_BAD_INDEX
    transfer = cells
    for k in range(deps):
        if <size_t>producer[k] >= <size_t>ops or <size_t>consumer[k] >= <size_t>ops:
            return STATUS_BAD_INDEX
        if crossing[k]:
            transfer += 1
    if transfer != n:
        return STATUS_BAD_SHAPE
    for v in range(n + 1):
        indptr[v] = 0
    for c in range(cells - 1):
        if cell_device[c + 1] == cell_device[c]:
            indptr[c + 1] += 1
    for k in range(deps):
        indptr[cell_of_op[producer[k]] + 1] += 1
    for v in range(cells, n):
        indptr[v + 1] += 1
    for v in range(n):
        indptr[v + 1] += indptr[v]
    if indptr[n] != successors.shape[0]:
        return STATUS_BAD_SHAPE
    # indptr[v] serves as v's cursor (as in _csr), group by group
    for c in range(cells - 1):
        if cell_device[c + 1] == cell_device[c]:
            successors[indptr[c]] = c + 1
            indptr[c] += 1
    transfer = cells
    for k in range(deps):
        v = cell_of_op[producer[k]]
        if crossing[k]:
            successors[indptr[v]] = transfer     # whose own list is filled below
            transfer += 1
        else:
            successors[indptr[v]] = cell_of_op[consumer[k]]
        indptr[v] += 1
    transfer = cells
    for k in range(deps):
        if crossing[k]:
            successors[indptr[transfer]] = cell_of_op[consumer[k]]
            indptr[transfer] += 1
            transfer += 1
    previous = 0
    for v in range(n):
        cursor = indptr[v]
        indptr[v] = previous
        previous = cursor
    return STATUS_OK


# ------------------------------------------------------- V slot squeeze
@boundscheck(False)
@wraparound(False)
def squeeze_slots(const index_t[::1] device not None, const index_t[::1] kind not None,
                  const index_t[::1] microbatch not None,
                  const index_t[::1] list_first not None, index_t num_kinds,
                  index_t[::1] start not None, index_t[::1] missing not None):
    """A V schedule's ops run in slot order, one slot each, as early as they may.

    ``tabsched.schedules.v_shape.squeeze`` on flat arrays: op ``i`` of the slot
    order is entry ``microbatch[i]`` of list ``kind[i]`` of device ``device[i]``,
    stored at ``list_first[device * num_kinds + kind] + microbatch`` (the lists
    one after the other, ``list_first`` their offsets, from 0 to the number of
    ops). Kinds as ``v_shape`` numbers them: 0, 1 forwards of chunk 0, 1; 2, 3
    input gradients of chunk 1, 0; 4 and up weight gradients. An op needs its
    microbatch's op of the same kind on the device before (kinds 0, 2) or after
    (1, 3), the previous kind of its microbatch on its device (kinds 1 to 3),
    and the previous microbatch of its own list; it starts when its device is
    free and every op it needs has ended.

    Returns
    -------
    int
        The number of ops, their starts in ``start`` (by stored position); or
        ``-1 - DEADLOCK`` with ``missing[0]`` the stored position of an op needed
        before it ran (or -1: an op it needs is not in the lists); or ``-1 -
        BAD_SHAPE``, ``-1 - BAD_INDEX`` for bad arrays (or an op listed twice).
    """
    cdef Py_ssize_t ops = device.shape[0], i
    cdef Py_ssize_t lists = list_first.shape[0] - 1
    cdef index_t devices, d, k, m, ready, at, status = STATUS_OK
    cdef index_t *end
    cdef index_t *free_at
    if (kind.shape[0] != ops or microbatch.shape[0] != ops or start.shape[0] != ops
            or missing.shape[0] != 1 or num_kinds < 1 or lists < 0
            or lists % num_kinds != 0):
        return -1 - STATUS_BAD_SHAPE
    devices = <index_t>(lists // num_kinds)
    if list_first[0] != 0 or list_first[lists] != ops:
        return -1 - STATUS_BAD_SHAPE
    for i in range(lists):
        if list_first[i + 1] < list_first[i]:
            return -1 - STATUS_BAD_SHAPE
    for i in range(ops):
        if (<size_t>device[i] >= <size_t>devices or <size_t>kind[i] >= <size_t>num_kinds
                or microbatch[i] < 0 or microbatch[i] >= list_first[device[i] * num_kinds
                                                                   + kind[i] + 1]
                - list_first[device[i] * num_kinds + kind[i]]):
            return -1 - STATUS_BAD_INDEX
    end = <index_t *>malloc(max(ops, 1) * sizeof(index_t))
    free_at = <index_t *>calloc(max(devices, 1), sizeof(index_t))
    if end == NULL or free_at == NULL:
        free(end)
        free(free_at)
        raise MemoryError()
    with nogil:
        for i in range(ops):
            end[i] = -1
        missing[0] = -1
        for i in range(ops):
            d, k, m = device[i], kind[i], microbatch[i]
            ready = free_at[d]
            if (k == 0 or k == 2) and d > 0:
                status = _squeeze_need(d - 1, k, m, num_kinds, list_first, end, &ready,
                                       missing)
            if status == STATUS_OK and (k == 1 or k == 3) and d + 1 < devices:
                status = _squeeze_need(d + 1, k, m, num_kinds, list_first, end, &ready,
                                       missing)
            if status == STATUS_OK and 0 < k < 4:
                status = _squeeze_need(d, k - 1, m, num_kinds, list_first, end, &ready,
                                       missing)
            if status == STATUS_OK and m > 0:
                status = _squeeze_need(d, k, m - 1, num_kinds, list_first, end, &ready,
                                       missing)
            if status != STATUS_OK:
                break
            at = list_first[d * num_kinds + k] + m
            if end[at] >= 0:             # listed twice in the slot order
                status = STATUS_BAD_INDEX
                break
            end[at] = ready + 1
            free_at[d] = ready + 1
            start[at] = ready
    free(end)
    free(free_at)
    return <index_t>ops if status == STATUS_OK else -1 - status


cdef inline index_t _squeeze_need(index_t d, index_t k, index_t m, index_t num_kinds,
                                  const index_t[::1] list_first, const index_t *end,
                                  index_t *ready, index_t[::1] missing) noexcept nogil:
    """Raise ``ready`` to the end of op (d, k, m); DEADLOCK if it has not run (or
    is not in the lists)."""
    cdef index_t at = list_first[d * num_kinds + k] + m
    if m >= list_first[d * num_kinds + k + 1] - list_first[d * num_kinds + k]:
        missing[0] = -1
        return STATUS_DEADLOCK
    if end[at] < 0:
        missing[0] = at
        return STATUS_DEADLOCK
    if end[at] > ready[0]:
        ready[0] = end[at]
    return STATUS_OK


# ------------------------------------------------------- V slot-grid peaks
@boundscheck(False)
@wraparound(False)
def slot_peak(const int8_t[::1] kind_at not None, bint explicit_weights):
    """The peak of chunk activations a V schedule's slot grid holds on one device.

    ``kind_at[t]`` is the kind in slot ``t`` as ``tabsched.schedules.v_shape`` numbers
    them (0, 1: a forward of chunk 0 or 1; 2, 3: an input gradient; 4, 5: a weight
    gradient; anything else: idle). A forward holds one activation more and a weight
    gradient one less. With ``explicit_weights`` false the grid has no weight
    gradients: each input gradient queues one, and each idle slot runs one that is
    queued, a queue ``q_t = max(0, q_{t-1} + a_t)`` that the running sum ``w_t`` of
    ``a`` (+1 an input gradient, -1 an idle slot) solves as
    ``q_t = w_t - min(0, min_{s <= t} w_s)`` (Lindley's recursion); what a device
    holds is then forwards less input gradients plus the queue. Returns
    ``max(0, largest held)``: what ``v_shape.peak_memory`` computes with numpy.
    """
    cdef Py_ssize_t slots = kind_at.shape[0], t
    cdef long held = 0, peak = 0, walk = 0, lowest = 0, forwards = 0, inputs = 0, value
    cdef int8_t code
    with nogil:
        for t in range(slots):
            code = kind_at[t]
            if code == 0 or code == 1:
                forwards += 1
            elif code == 2 or code == 3:
                inputs += 1
                walk += 1
            elif code == 4 or code == 5:
                held += 1
            else:
                walk -= 1
            if explicit_weights:
                value = forwards - held
            else:
                if walk < lowest:
                    lowest = walk
                value = forwards - inputs + walk - lowest
            if value > peak:
                peak = value
    return peak


# ------------------------------------------------------------ memory peaks
@boundscheck(False)
@wraparound(False)
def activation_peaks(const index_t[::1] device not None,
                     const int8_t[::1] kind not None,
                     const index_t[::1] cell_of_op not None,
                     const time_t[::1] node_start not None,
                     const time_t[::1] node_durations not None,
                     const time_t[::1] activation not None,
                     const time_t[::1] transient not None,
                     time_t release,
                     time_t[::1] peaks not None):
    """Each device's peak of held memory, without sorting its events.

    Each operation has two events (``tabsched.evaluate.memory_events``): at its
    start ``+activation`` for an ``F`` plus its working memory (``transient``);
    at its end ``-working memory`` for an ``F``, else minus what it frees (all of
    its activation for ``B``, ``release`` of it for ``I``, the rest for ``W``)
    and its working memory. Events come per device in row order, start then end
    of each operation, which is their time order: a device runs its row one cell
    after another. Only events at equal times need ordering -- frees before
    allocations, as :meth:`Result.memory_timeline` sorts them, by delta then row
    order -- and such runs are short, so each is put in order by insertion. The
    running sum then adds exactly what the timeline's cumulative sum adds, in
    the same order, so the peaks are the same to the bit. Events with a zero
    delta change nothing and are skipped, as the timeline drops them.

    Parameters
    ----------
    device, kind, cell_of_op : arrays (operations,)
        The table's columns (``device`` non-decreasing) and each operation's cell.
    node_start, node_durations : float64 arrays (nodes,)
    activation, transient : float64 arrays (operations,)
    release : float
        The part of an activation ``I`` frees.
    peaks : float64 array (devices,)
        Output: ``max(0, largest running sum)`` per device.

    Returns
    -------
    int
        A status: OK; BAD_SHAPE if lengths differ or a device's event times
        fall (an overlapped cell; the caller then sorts); BAD_INDEX for an id out
        of range or a device out of order.
    """
    cdef Py_ssize_t operations = device.shape[0]
    cdef index_t status
    if (kind.shape[0] != operations or cell_of_op.shape[0] != operations
            or activation.shape[0] != operations or transient.shape[0] != operations
            or node_durations.shape[0] != node_start.shape[0]):
        return STATUS_BAD_SHAPE
    with nogil:
        status = _activation_peaks(device, kind, cell_of_op, node_start, node_durations,
                                   activation, transient, release, peaks)
    return status


cdef inline int _event(const int8_t[::1] kind, const index_t[::1] cell_of_op,
                       const time_t[::1] node_start, const time_t[::1] node_durations,
                       const time_t[::1] activation, const time_t[::1] transient,
                       time_t release, Py_ssize_t e, time_t *time,
                       time_t *delta) noexcept nogil:
    """Event ``e``: the start (even ``e``) or the end (odd ``e``) of operation ``e // 2``."""
    cdef Py_ssize_t k = e >> 1
    cdef index_t cell = cell_of_op[k]
    cdef int8_t code = kind[k]
    cdef time_t held = transient[k], freed
    if <size_t>cell >= <size_t>node_start.shape[0]:
        return -1
    if (e & 1) == 0:
        time[0] = node_start[cell]
        delta[0] = (activation[k] if code == KIND_F else 0.0) + held
        return 0
    time[0] = node_start[cell] + node_durations[cell]
    if code == KIND_F:
        delta[0] = -held
        return 0
    freed = activation[k]
    if code == KIND_I:
        freed = freed * release
    elif code == KIND_W:
        freed = freed * (1.0 - release)
    delta[0] = -(freed + held)
    return 0


cdef index_t _activation_peaks(const index_t[::1] device, const int8_t[::1] kind,
                               const index_t[::1] cell_of_op, const time_t[::1] node_start,
                               const time_t[::1] node_durations,
                               const time_t[::1] activation, const time_t[::1] transient,
                               time_t release, time_t[::1] peaks) noexcept nogil:
    cdef Py_ssize_t events = 2 * device.shape[0]
    cdef index_t devices = peaks.shape[0]
    cdef Py_ssize_t k, run_end, a, b, count
    cdef index_t d, previous = 0
    cdef time_t level, peak, time, delta
    cdef time_t next_time = 0.0
    cdef time_t run[64]
    for d in range(devices):
        peaks[d] = 0.0
    if events == 0:
        return STATUS_OK
    if _event(kind, cell_of_op, node_start, node_durations, activation, transient, release, 0,
              &time, &delta) < 0:
        return STATUS_BAD_INDEX
    k = 0
    while k < events:
        d = device[k >> 1]
        if d < previous or d >= devices:
            return STATUS_BAD_INDEX
        previous = d
        level = 0.0
        peak = 0.0
        while k < events and device[k >> 1] == d:
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
                if _event(kind, cell_of_op, node_start, node_durations, activation, transient,
                          release, run_end, &next_time, &delta) < 0:
                    return STATUS_BAD_INDEX
                if device[run_end >> 1] != d or next_time != time:
                    if device[run_end >> 1] == d and next_time < time:
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


# -------------------------------------------------- list scheduler (W in idle time)
cdef struct Events:
    time_t *time
    Py_ssize_t *seq
    index_t *device
    Py_ssize_t size
    Py_ssize_t room
    Py_ssize_t next_seq


cdef inline bint _event_less(time_t time_a, Py_ssize_t seq_a, time_t time_b,
                             Py_ssize_t seq_b) noexcept nogil:
    return time_a < time_b or (time_a == time_b and seq_a < seq_b)


cdef int _event_push(Events *events, time_t time, index_t device) noexcept nogil:
    """Add (time, next sequence number, device); -1 if memory runs out."""
    cdef Py_ssize_t child, parent, room
    cdef Py_ssize_t seq = events.next_seq
    cdef void *grown
    if events.size == events.room:
        room = 2 * events.room
        grown = realloc(events.time, room * sizeof(time_t))
        if grown == NULL:
            return -1
        events.time = <time_t *>grown
        grown = realloc(events.seq, room * sizeof(Py_ssize_t))
        if grown == NULL:
            return -1
        events.seq = <Py_ssize_t *>grown
        grown = realloc(events.device, room * sizeof(index_t))
        if grown == NULL:
            return -1
        events.device = <index_t *>grown
        events.room = room
    events.next_seq += 1
    child = events.size
    while child > 0:
        parent = (child - 1) >> 1
        if _event_less(time, seq, events.time[parent], events.seq[parent]):
            events.time[child] = events.time[parent]
            events.seq[child] = events.seq[parent]
            events.device[child] = events.device[parent]
            child = parent
        else:
            break
    events.time[child] = time
    events.seq[child] = seq
    events.device[child] = device
    events.size += 1
    return 0


cdef void _event_pop(Events *events) noexcept nogil:
    cdef Py_ssize_t last = events.size - 1, parent = 0, child
    cdef time_t time = events.time[last]
    cdef Py_ssize_t seq = events.seq[last]
    cdef index_t device = events.device[last]
    while True:
        child = 2 * parent + 1
        if child >= last:
            break
        if child + 1 < last and _event_less(events.time[child + 1], events.seq[child + 1],
                                            events.time[child], events.seq[child]):
            child += 1
        if _event_less(events.time[child], events.seq[child], time, seq):
            events.time[parent] = events.time[child]
            events.seq[parent] = events.seq[child]
            events.device[parent] = events.device[child]
            parent = child
        else:
            break
    events.time[parent] = time
    events.seq[parent] = seq
    events.device[parent] = device
    events.size = last


#: ``fill_idle`` could not get the memory it needed, or its lists name a cell twice.
NO_MEMORY = FILL_NO_MEMORY


@boundscheck(False)
@wraparound(False)
def fill_idle(const time_t[::1] length not None,
              const index_t[::1] cell_device not None,
              const int8_t[::1] filler not None,
              const index_t[::1] dep_indptr not None,
              const index_t[::1] dep_producer not None,
              const time_t[::1] dep_wait not None,
              const index_t[::1] release_indptr not None,
              const index_t[::1] released not None,
              const index_t[::1] main_indptr not None,
              const index_t[::1] main_cells not None,
              const index_t[::1] cap not None,
              index_t[::1] rows not None,
              index_t[::1] row_count not None):
    """Row orders with filler cells (split backward's ``W``) run in idle time.

    A list-scheduling simulation in time order (see
    ``tabsched.adapt.split_backward._fill_idle``): a device runs its next main cell
    as soon as its inputs have arrived; while it would wait, it runs its oldest
    pending filler if the wait is known to last at least that long (a producer
    that has not started ends no earlier than now plus its length, its output
    arrives ``dep_wait`` after that), and it runs one anyway when more than
    its cap are pending. Events at equal times go in the order they were made;
    the devices waiting for a producer are woken, when it starts, in ascending
    order.

    Parameters
    ----------
    length, cell_device, filler : arrays (cells,)
    dep_indptr, dep_producer, dep_wait :
        Each main cell's dependencies (CSR over cells; fillers have none).
    release_indptr, released :
        The fillers each cell releases when it runs (CSR over cells), all on
        that cell's device.
    main_indptr, main_cells :
        Each device's main cells in order (CSR over devices).
    cap : int32 array (devices,)
        Most fillers a device lets wait (-1: no limit).
    rows : int32 array (cells,)
        Output: device by device, the cells in the order the device runs them.
    row_count : int32 array (devices,)
        Output: how many cells each device ran.

    Returns
    -------
    int
        The number of cells placed (all of them unless the orders cannot run),
        NO_MEMORY (out of memory, or a cell listed or released twice), or
        -1 - STATUS for bad arrays.
    """
    cdef index_t cells = length.shape[0]
    cdef index_t devices = cap.shape[0]
    cdef index_t status
    if (cell_device.shape[0] != cells or filler.shape[0] != cells
            or dep_indptr.shape[0] != cells + 1 or dep_wait.shape[0] != dep_producer.shape[0]
            or release_indptr.shape[0] != cells + 1 or main_indptr.shape[0] != devices + 1
            or rows.shape[0] != cells or row_count.shape[0] != devices):
        return -1 - STATUS_BAD_SHAPE
    with nogil:
        status = _check_fill_idle(length, cell_device, filler, dep_indptr, dep_producer,
                                  release_indptr, released, main_indptr, main_cells)
        if status == STATUS_OK:
            status = _fill_idle(length, cell_device, filler, dep_indptr, dep_producer,
                                dep_wait, release_indptr, released, main_indptr, main_cells,
                                cap, rows, row_count)
        else:
            status = -1 - status
    return status


cdef index_t _check_csr_ids(const index_t[::1] indptr, const index_t[::1] items,
                            index_t limit) noexcept nogil:
    cdef index_t count = indptr.shape[0] - 1
    cdef Py_ssize_t e
    cdef index_t row
    if indptr[0] != 0 or indptr[count] != items.shape[0]:
        return STATUS_BAD_SHAPE
    for row in range(count):
        if indptr[row + 1] < indptr[row]:
            return STATUS_BAD_SHAPE
    for e in range(items.shape[0]):
        if <size_t>items[e] >= <size_t>limit:
            return STATUS_BAD_INDEX
    return STATUS_OK


cdef index_t _check_fill_idle(const time_t[::1] length, const index_t[::1] cell_device,
                              const int8_t[::1] filler, const index_t[::1] dep_indptr,
                              const index_t[::1] dep_producer,
                              const index_t[::1] release_indptr,
                              const index_t[::1] released, const index_t[::1] main_indptr,
                              const index_t[::1] main_cells) noexcept nogil:
    cdef index_t cells = length.shape[0]
    cdef index_t devices = main_indptr.shape[0] - 1
    cdef index_t c, e, status
    for c in range(cells):
        if <size_t>cell_device[c] >= <size_t>devices:
            return STATUS_BAD_INDEX
    status = _check_csr_ids(dep_indptr, dep_producer, cells)
    if status == STATUS_OK:
        status = _check_csr_ids(release_indptr, released, cells)
    if status == STATUS_OK:
        status = _check_csr_ids(main_indptr, main_cells, cells)
    if status != STATUS_OK:
        return status
    # a released filler waits in its releasing cell's device's queue; a main cell is
    # listed under its own device
    for c in range(cells):
        for e in range(release_indptr[c], release_indptr[c + 1]):
            if cell_device[released[e]] != cell_device[c] or not filler[released[e]]:
                return STATUS_BAD_INDEX
    for c in range(devices):
        for e in range(main_indptr[c], main_indptr[c + 1]):
            if cell_device[main_cells[e]] != c or filler[main_cells[e]]:
                return STATUS_BAD_INDEX
    return STATUS_OK


cdef index_t _fill_idle(const time_t[::1] length, const index_t[::1] cell_device,
                        const int8_t[::1] filler, const index_t[::1] dep_indptr,
                        const index_t[::1] dep_producer, const time_t[::1] dep_wait,
                        const index_t[::1] release_indptr, const index_t[::1] released,
                        const index_t[::1] main_indptr, const index_t[::1] main_cells,
                        const index_t[::1] cap, index_t[::1] rows,
                        index_t[::1] row_count) noexcept nogil:
    cdef index_t cells = length.shape[0]
    cdef index_t devices = cap.shape[0]
    cdef index_t placed = 0
    cdef index_t d, c, e, k, blocker, entry, count, waiting, queued, head
    cdef time_t now, ready, candidate
    cdef Events events
    cdef bint failed = False
    # per cell: its end (NAN-free: `started` says whether it ran) and the devices
    # waiting for it (a linked list of entries); per device: its pointer into its
    # main cells, its free time, its queue of pending fillers (a segment of
    # `queue`, one slot per filler of the device), and its row segment
    cdef time_t *end = <time_t *>malloc(max(cells, 1) * sizeof(time_t))
    cdef char *started = <char *>calloc(max(cells, 1), 1)
    cdef index_t *waiting_head = <index_t *>malloc(max(cells, 1) * sizeof(index_t))
    cdef Py_ssize_t entry_room = 4 * (<Py_ssize_t>cells + devices) + 16
    cdef index_t *entry_device = <index_t *>malloc(entry_room * sizeof(index_t))
    cdef index_t *entry_next = <index_t *>malloc(entry_room * sizeof(index_t))
    cdef Py_ssize_t entries = 0
    cdef index_t *pointer = <index_t *>calloc(max(devices, 1), sizeof(index_t))
    cdef time_t *free_at = <time_t *>calloc(max(devices, 1), sizeof(time_t))
    cdef index_t *queue = <index_t *>malloc(max(cells, 1) * sizeof(index_t))
    cdef index_t *queue_first = <index_t *>calloc(max(devices, 1) + 1, sizeof(index_t))
    cdef index_t *queue_head = <index_t *>calloc(max(devices, 1), sizeof(index_t))
    cdef index_t *queue_tail = <index_t *>calloc(max(devices, 1), sizeof(index_t))
    cdef index_t *row_first = <index_t *>calloc(max(devices, 1) + 1, sizeof(index_t))
    cdef index_t *woken = <index_t *>malloc(max(devices, 1) * sizeof(index_t))
    events.room = 2 * (<Py_ssize_t>devices + 8)
    events.size = 0
    events.next_seq = 0
    events.time = <time_t *>malloc(events.room * sizeof(time_t))
    events.seq = <Py_ssize_t *>malloc(events.room * sizeof(Py_ssize_t))
    events.device = <index_t *>malloc(events.room * sizeof(index_t))
    if (end == NULL or started == NULL or waiting_head == NULL or entry_device == NULL
            or entry_next == NULL or pointer == NULL or free_at == NULL or queue == NULL
            or queue_first == NULL or queue_head == NULL or queue_tail == NULL
            or row_first == NULL or woken == NULL or events.time == NULL
            or events.seq == NULL or events.device == NULL):
        failed = True
    else:
        for c in range(cells):
            waiting_head[c] = NO_NODE
            queue_first[cell_device[c] + 1] += filler[c] != 0
            row_first[cell_device[c] + 1] += 1
        for d in range(devices):
            queue_first[d + 1] += queue_first[d]
            row_first[d + 1] += row_first[d]
            queue_head[d] = queue_first[d]
            queue_tail[d] = queue_first[d]
            row_count[d] = 0
        for d in range(devices):
            if _event_push(&events, 0.0, d) < 0:
                failed = True
                break
    while not failed and events.size > 0:
        now = events.time[0]
        d = events.device[0]
        _event_pop(&events)
        if now < free_at[d]:
            continue
        queued = queue_tail[d] - queue_head[d]
        c = NO_NODE
        if cap[d] >= 0 and queued > cap[d]:
            c = queue[queue_head[d]]                 # too many waiting: run the oldest
            queue_head[d] += 1
        elif pointer[d] == main_indptr[d + 1] - main_indptr[d]:
            if queued > 0:
                c = queue[queue_head[d]]
                queue_head[d] += 1
            else:
                continue
        else:
            k = main_cells[main_indptr[d] + pointer[d]]
            ready = now
            blocker = NO_NODE
            for e in range(dep_indptr[k], dep_indptr[k + 1]):
                if started[dep_producer[e]]:
                    candidate = end[dep_producer[e]] + dep_wait[e]
                else:
                    candidate = now + length[dep_producer[e]] + dep_wait[e]
                    blocker = dep_producer[e]
                ready = candidate if candidate > ready else ready
            if blocker == NO_NODE and ready <= now:
                pointer[d] += 1
                for e in range(release_indptr[k], release_indptr[k + 1]):
                    if queue_tail[d] == queue_first[d + 1]:
                        failed = True          # a filler released twice: refuse
                        break
                    queue[queue_tail[d]] = released[e]
                    queue_tail[d] += 1
                if failed:
                    continue
                c = k
            elif queued > 0 and ready - now >= length[queue[queue_head[d]]]:
                c = queue[queue_head[d]]
                queue_head[d] += 1
            elif blocker == NO_NODE:
                if _event_push(&events, ready, d) < 0:
                    failed = True
                continue
            else:
                # wait for the blocker to start (once per blocker and device)
                entry = waiting_head[blocker]
                while entry != NO_NODE and entry_device[entry] != d:
                    entry = entry_next[entry]
                if entry == NO_NODE:
                    if entries == entry_room:
                        failed = True
                        continue
                    entry_device[entries] = d
                    entry_next[entries] = waiting_head[blocker]
                    waiting_head[blocker] = <index_t>entries
                    entries += 1
                continue
        # run c on d now
        if row_count[d] == row_first[d + 1] - row_first[d]:
            failed = True                      # a cell listed twice: refuse
            continue
        end[c] = now + length[c]
        started[c] = 1
        free_at[d] = end[c]
        rows[row_first[d] + row_count[d]] = c
        row_count[d] += 1
        placed += 1
        if _event_push(&events, end[c], d) < 0:
            failed = True
            continue
        count = 0
        entry = waiting_head[c]
        while entry != NO_NODE:
            # insertion into the ascending list of woken devices
            waiting = count
            while waiting > 0 and woken[waiting - 1] > entry_device[entry]:
                woken[waiting] = woken[waiting - 1]
                waiting -= 1
            woken[waiting] = entry_device[entry]
            count += 1
            entry = entry_next[entry]
        waiting_head[c] = NO_NODE
        for head in range(count):
            if _event_push(&events, now, woken[head]) < 0:
                failed = True
                break
    free(end)
    free(started)
    free(waiting_head)
    free(entry_device)
    free(entry_next)
    free(pointer)
    free(free_at)
    free(queue)
    free(queue_first)
    free(queue_head)
    free(queue_tail)
    free(row_first)
    free(woken)
    free(events.time)
    free(events.seq)
    free(events.device)
    return FILL_NO_MEMORY if failed else placed


# ------------------------------------------------------------ generators
@boundscheck(False)
@wraparound(False)
def one_f_one_b_order(index_t devices, index_t microbatches, index_t[::1] device not None,
                      index_t[::1] position not None, int8_t[::1] kind not None,
                      index_t[::1] microbatch not None):
    """Every device's 1F1B order (Megatron's) as the order's columns, device by device.

    Step ``i`` of device ``d`` (warm-up ``w = min(devices - d - 1, microbatches)``,
    ``n = microbatches``) is ``F(i)`` while ``i < w``, then ``F(w + j/2)`` and
    ``B(j/2)`` by turns (``j = i - w``), then ``B(i - n)`` from ``i = 2n - w``; its
    stage is its device (a stage per device).

    Parameters
    ----------
    devices, microbatches : int
    device, position : int32 arrays (2 x devices x microbatches,)
    kind : int8 array (same length)
    microbatch : int32 array (same length)
        Outputs: the device, the step, the kind (0 F, 1 B) and the microbatch of each
        operation, in device order, then step order.

    Returns
    -------
    int
        A status: OK, or BAD_SHAPE when a size is negative or an array's length is
        not ``2 x devices x microbatches``.
    """
    cdef Py_ssize_t steps = 2 * <Py_ssize_t>microbatches
    cdef Py_ssize_t total = steps * devices
    cdef Py_ssize_t i, k = 0
    cdef index_t d, w, j
    if (devices < 0 or microbatches < 0 or device.shape[0] != total
            or position.shape[0] != total or kind.shape[0] != total
            or microbatch.shape[0] != total):
        return STATUS_BAD_SHAPE
    with nogil:
        for d in range(devices):
            w = devices - d - 1
            if w > microbatches:
                w = microbatches
            for i in range(steps):
                device[k] = d
                position[k] = <index_t>i
                if i < w:                               # warm-up
                    kind[k] = KIND_F
                    microbatch[k] = <index_t>i
                elif i >= steps - w:                    # cool-down
                    kind[k] = KIND_B
                    microbatch[k] = <index_t>(i - microbatches)
                else:                                   # the F/B pairs
                    j = <index_t>(i - w)
                    if j & 1:
                        kind[k] = KIND_B
                        microbatch[k] = j >> 1
                    else:
                        kind[k] = KIND_F
                        microbatch[k] = w + (j >> 1)
                k += 1
    return STATUS_OK


# ------------------------------------------------------------- validity
@boundscheck(False)
@wraparound(False)
def table_is_valid(const index_t[::1] device not None, const int8_t[::1] kind not None,
                   const index_t[::1] stage not None, const index_t[::1] microbatch not None,
                   index_t num_stages, index_t num_microbatches,
                   int8_t[::1] seen not None, index_t[::1] home not None):
    """1 if every (stage, microbatch) has exactly one ``F`` and one ``B`` or one ``I``
    and one ``W``, all on one device, and nothing else is in the table; else 0.

    Parameters
    ----------
    device, kind, stage, microbatch : the table's columns
    num_stages, num_microbatches : int
    seen : int8 scratch, shape (stages * microbatches * 4,)
    home : int32 scratch, shape (stages * microbatches,)

    Returns
    -------
    int
        1 or 0; -1 - BAD_SHAPE for arrays of the wrong sizes.
    """
    cdef Py_ssize_t ops = device.shape[0]
    cdef Py_ssize_t pairs = <Py_ssize_t>num_stages * num_microbatches
    cdef index_t answer
    if (num_stages < 0 or num_microbatches < 0 or kind.shape[0] != ops
            or stage.shape[0] != ops or microbatch.shape[0] != ops
            or seen.shape[0] != 4 * pairs or home.shape[0] != pairs):
        return -1 - STATUS_BAD_SHAPE
    with nogil:
        answer = _table_is_valid(device, kind, stage, microbatch, num_stages,
                                 num_microbatches, seen, home)
    return answer


cdef index_t _table_is_valid(const index_t[::1] device, const int8_t[::1] kind,
                             const index_t[::1] stage, const index_t[::1] microbatch,
                             index_t S, index_t M, int8_t[::1] seen,
                             index_t[::1] home) noexcept nogil:
    cdef Py_ssize_t ops = device.shape[0]
    cdef Py_ssize_t pairs = home.shape[0]
    cdef Py_ssize_t k, pair
    for pair in range(pairs):
        home[pair] = NO_NODE
    for pair in range(4 * pairs):
        seen[pair] = 0
    for k in range(ops):
        if (stage[k] < 0 or stage[k] >= S or microbatch[k] < 0 or microbatch[k] >= M
                or kind[k] < KIND_F or kind[k] > KIND_W or device[k] < 0):
            return 0
        pair = <Py_ssize_t>stage[k] * M + microbatch[k]
        if seen[4 * pair + kind[k]]:
            return 0                                 # listed twice
        seen[4 * pair + kind[k]] = 1
        if home[pair] == NO_NODE:
            home[pair] = device[k]
        elif home[pair] != device[k]:
            return 0                                 # on two devices
    for pair in range(pairs):
        if not seen[4 * pair + KIND_F]:
            return 0
        if seen[4 * pair + KIND_B]:
            if seen[4 * pair + KIND_I] or seen[4 * pair + KIND_W]:
                return 0
        elif not (seen[4 * pair + KIND_I] and seen[4 * pair + KIND_W]):
            return 0
    return 1


# ------------------------------------------------------ zbv-auto's V heuristic
cdef enum:
    # a device's counters (tabsched.schedules.zbv_auto's keys "F0", "F1", "I1", "I0")
    KEY_F0 = 0
    KEY_F1 = 1
    KEY_I1 = 2
    KEY_I0 = 3
    NO_KEY = -1
    # the kinds a V order holds (its letters "F", "I", "W")
    V_F = 0
    V_I = 1
    V_W = 2
    # how a run ends, beside STATUS_OK
    V_INFEASIBLE = 10         # an order cannot complete within the memory limit
    V_NO_CONVERGENCE = 11     # the warm-up's balancing loop ran past its guard
    V_OUT_OF_MEMORY = 12      # scratch could not be allocated

#: ``v_heuristic_run`` returns this when the setting cannot complete within the limit.
INFEASIBLE = V_INFEASIBLE
#: ... when the warm-up does not converge (an internal error).
NO_CONVERGENCE = V_NO_CONVERGENCE
#: ... when its scratch could not be allocated.
OUT_OF_MEMORY = V_OUT_OF_MEMORY


cdef struct VRun:
    Py_ssize_t p, stages, m, per_device, ring
    const double *duration      # (3, stages): F, I, W
    const double *delay         # (2, stages): F, I
    const double *activation    # (stages,)
    double release
    const double *limit         # (p,)
    const double *allowance     # (p,) or NULL
    double *idle                # (p,) out
    long *count                 # (p, 4)
    double *free_at             # (p,)
    double *memory              # (p,)
    long *pending_stage         # (p, ring): a ring per device (2m input gradients)
    long *pending_microbatch
    long *pending_head
    long *pending_size
    double *end_f               # (stages, m): -1 until placed
    double *end_i
    int8_t *order_kind          # (p, per_device) out
    index_t *order_stage
    index_t *order_microbatch
    index_t *order_length       # (p,) out


cdef inline long _v_stage(VRun *r, long device, int key) noexcept nogil:
    # chunk 0 (F0, I0) on stage device, chunk 1 (F1, I1) on stage 2p-1-device
    if key == KEY_F0 or key == KEY_I0:
        return device
    return 2 * r.p - 1 - device


cdef inline double _v_arrival(VRun *r, int kind, long stage, long microbatch) noexcept nogil:
    """When ``kind`` (V_F or V_I) of ``microbatch`` on ``stage`` has its input; -1: not yet."""
    cdef long last = 2 * r.p - 1
    cdef double end
    if microbatch < 0 or microbatch >= r.m:
        return -1.0
    if kind == V_F:
        if stage == 0:
            return 0.0
        end = r.end_f[(stage - 1) * r.m + microbatch]
    elif stage == last:
        end = r.end_f[last * r.m + microbatch]
    else:
        end = r.end_i[(stage + 1) * r.m + microbatch]
    if end < 0.0:
        return -1.0
    return end + r.delay[kind * r.stages + stage]


cdef inline bint _v_fits(VRun *r, long device, double amount) noexcept nogil:
    return r.memory[device] + amount <= r.limit[device]


cdef inline int _v_place(VRun *r, long device, int kind, long stage, long microbatch,
                         double start) noexcept nogil:
    cdef double end
    cdef index_t at
    if r.count[device * 4 + KEY_F0] > 0:
        r.idle[device] += start - r.free_at[device]
    end = start + r.duration[kind * r.stages + stage]
    if kind == V_F:
        r.end_f[stage * r.m + microbatch] = end
    elif kind == V_I:
        r.end_i[stage * r.m + microbatch] = end
    r.free_at[device] = end
    at = r.order_length[device]
    if at >= r.per_device:
        return STATUS_BAD_SHAPE
    r.order_kind[device * r.per_device + at] = <int8_t>kind
    r.order_stage[device * r.per_device + at] = <index_t>stage
    r.order_microbatch[device * r.per_device + at] = <index_t>microbatch
    r.order_length[device] = at + 1
    return STATUS_OK


cdef int _v_put(VRun *r, long device, int key) noexcept nogil:
    cdef int kind = V_F if key == KEY_F0 or key == KEY_F1 else V_I
    cdef long stage = _v_stage(r, device, key)
    cdef long microbatch = r.count[device * 4 + key], slot
    cdef double ready, activation, change, start
    cdef int status
    if microbatch >= r.m:
        return V_INFEASIBLE
    ready = _v_arrival(r, kind, stage, microbatch)
    if ready < 0.0:
        return V_INFEASIBLE
    activation = r.activation[stage]
    change = activation if kind == V_F else -r.release * activation
    if not _v_fits(r, device, change):
        return V_INFEASIBLE
    start = r.free_at[device]
    if ready > start:
        start = ready
    status = _v_place(r, device, kind, stage, microbatch, start)
    if status != STATUS_OK:
        return status
    r.memory[device] += change
    r.count[device * 4 + key] += 1
    if kind == V_I:
        if r.pending_size[device] >= r.ring:
            return STATUS_BAD_SHAPE
        slot = (r.pending_head[device] + r.pending_size[device]) % r.ring
        r.pending_stage[device * r.ring + slot] = stage
        r.pending_microbatch[device * r.ring + slot] = microbatch
        r.pending_size[device] += 1
    return STATUS_OK


cdef inline long _v_pending_stage(VRun *r, long device) noexcept nogil:
    return r.pending_stage[device * r.ring + r.pending_head[device]]


cdef int _v_put_weight(VRun *r, long device) noexcept nogil:
    cdef long head = r.pending_head[device]
    cdef long stage = r.pending_stage[device * r.ring + head]
    cdef long microbatch = r.pending_microbatch[device * r.ring + head]
    cdef int status
    r.pending_head[device] = (head + 1) % r.ring
    r.pending_size[device] -= 1
    status = _v_place(r, device, V_W, stage, microbatch, r.free_at[device])
    r.memory[device] -= (1.0 - r.release) * r.activation[stage]
    return status


cdef int _v_make_room(VRun *r, long device, double amount) noexcept nogil:
    cdef int status
    while not _v_fits(r, device, amount):
        if r.pending_size[device] == 0:
            return V_INFEASIBLE
        status = _v_put_weight(r, device)
        if status != STATUS_OK:
            return status
    return STATUS_OK


cdef double _v_largest_idle(VRun *r, long device) noexcept nogil:
    cdef double largest = r.idle[0], most
    cdef long j
    for j in range(1, r.p):
        if r.idle[j] > largest:
            largest = r.idle[j]
    if r.allowance != NULL:
        most = r.allowance[0]
        for j in range(1, r.p):
            if r.allowance[j] > most:
                most = r.allowance[j]
        if most - r.allowance[device] > largest:
            largest = most - r.allowance[device]
    return largest


cdef int _v_fill_weights(VRun *r, long device, int key, bint overrun) noexcept nogil:
    """``W`` s into the wait for ``key``'s input; ``overrun``: may one more run past it."""
    cdef int kind = V_F if key == KEY_F0 or key == KEY_F1 else V_I
    cdef long stage = _v_stage(r, device, key)
    cdef double arrival
    cdef int status
    # the input comes from another device: F0 and I1 from device d-1, F1 and I0 from d+1
    if (device == 0 and (key == KEY_F0 or key == KEY_I1)) or \
            (device == r.p - 1 and (key == KEY_F1 or key == KEY_I0)):
        return STATUS_OK
    arrival = _v_arrival(r, kind, stage, r.count[device * 4 + key])
    if arrival < 0.0:
        return STATUS_OK
    while r.pending_size[device] > 0 and arrival >= r.free_at[device] + \
            r.duration[V_W * r.stages + _v_pending_stage(r, device)]:
        status = _v_put_weight(r, device)
        if status != STATUS_OK:
            return status
    if r.pending_size[device] > 0 and overrun and arrival - r.free_at[device] > \
            _v_largest_idle(r, device) - r.idle[device]:
        return _v_put_weight(r, device)
    return STATUS_OK


cdef int _v_warm_up(VRun *r) noexcept nogil:
    cdef long p = r.p, m = r.m, device, j, guard, turn, key
    cdef long *mine
    cdef long *previous
    cdef double arrival, forward, reserve
    cdef bint room
    cdef int status
    for device in range(p):
        status = _v_put(r, device, KEY_F0)
        if status != STATUS_OK:
            return status
    for device in range(p - 1, -1, -1):
        if device < p - 1:
            arrival = _v_arrival(r, V_F, _v_stage(r, device, KEY_F1), 0)
            if arrival < 0.0:
                return V_NO_CONVERGENCE
            forward = r.duration[V_F * r.stages + device]
            reserve = r.activation[device] * <double>(2 + 2 * device)
            while True:
                if not (_v_fits(r, device, reserve)
                        and r.free_at[device] + forward <= arrival
                        and r.count[device * 4 + KEY_F0] < m):
                    break
                room = True
                for j in range(device):
                    if not _v_fits(r, j, r.activation[j]):
                        room = False
                        break
                if not room:
                    break
                for j in range(device + 1):
                    status = _v_put(r, j, KEY_F0)
                    if status != STATUS_OK:
                        return status
        status = _v_put(r, device, KEY_F1)
        if status != STATUS_OK:
            return status
    turn = 0
    guard = 4 * p * m + 8
    for device in range(1, p):
        mine = &r.count[device * 4]
        previous = &r.count[(device - 1) * 4]
        while (mine[KEY_F0] + mine[KEY_F1] < previous[KEY_F0] + previous[KEY_F1]
               or (mine[KEY_F1] <= previous[KEY_F1] and previous[KEY_F1] < m)):
            guard -= 1
            if guard < 0:
                return V_NO_CONVERGENCE
            key = KEY_F0 if turn == 0 else KEY_F1
            for j in range(p - 1, device - 1, -1):
                if r.count[j * 4 + key] < m:
                    status = _v_put(r, j, <int>key)
                    if status != STATUS_OK:
                        return status
            turn = 1 - turn
    return STATUS_OK


cdef int _v_backward_key(VRun *r, long device) noexcept nogil:
    cdef long *count = &r.count[device * 4]
    cdef bint ready
    if count[KEY_I0] >= count[KEY_I1]:
        return KEY_I1
    if device == r.p - 1:
        return KEY_I0
    ready = _v_arrival(r, V_I, _v_stage(r, device, KEY_I0), count[KEY_I0]) >= 0.0
    return KEY_I0 if ready or count[KEY_I1] >= r.m else KEY_I1


cdef int _v_forward_key(VRun *r, long device) noexcept nogil:
    cdef long *count = &r.count[device * 4]
    if count[KEY_F1] >= r.m:
        return NO_KEY
    if count[KEY_F1] >= count[KEY_F0]:
        return KEY_F0
    if device == r.p - 1:
        return KEY_F1
    if _v_arrival(r, V_F, _v_stage(r, device, KEY_F1), count[KEY_F1]) >= 0.0:
        return KEY_F1
    if count[KEY_F0] < r.m and (device == 0 or _v_arrival(
            r, V_F, _v_stage(r, device, KEY_F0), count[KEY_F0]) >= 0.0):
        return KEY_F0
    return NO_KEY


cdef int _v_round(VRun *r, bint fill_forward, bint fill_backward, int *keys) noexcept nogil:
    cdef long p = r.p, device
    cdef int key, status
    for device in range(p):
        keys[device] = _v_backward_key(r, device)
    # the I0's from the last device down, then the I1's from the first up
    for device in range(p - 1, -1, -1):
        if keys[device] == KEY_I0:
            status = _v_fill_weights(r, device, KEY_I0, True)
            if status == STATUS_OK:
                status = _v_put(r, device, KEY_I0)
            if status != STATUS_OK:
                return status
    for device in range(p):
        if keys[device] == KEY_I1:
            status = _v_fill_weights(r, device, KEY_I1, fill_backward)
            if status == STATUS_OK:
                status = _v_put(r, device, KEY_I1)
            if status != STATUS_OK:
                return status
    for device in range(p):
        key = _v_forward_key(r, device)
        if key == NO_KEY:
            continue
        status = _v_make_room(r, device, r.activation[_v_stage(r, device, key)])
        if status == STATUS_OK:
            status = _v_fill_weights(r, device, key, fill_forward)
        if status == STATUS_OK:
            status = _v_put(r, device, key)
        if status != STATUS_OK:
            return status
    return STATUS_OK


cdef int _v_run(VRun *r, bint fill_forward, bint fill_backward, int *keys) noexcept nogil:
    cdef long step, device
    cdef int status = _v_warm_up(r)
    if status != STATUS_OK:
        return status
    for step in range(2 * r.m):
        status = _v_round(r, fill_forward, fill_backward, keys)
        if status != STATUS_OK:
            return status
    for device in range(r.p):
        while r.pending_size[device] > 0:
            status = _v_put_weight(r, device)
            if status != STATUS_OK:
                return status
    return STATUS_OK


@boundscheck(False)
@wraparound(False)
def v_heuristic_run(const double[:, ::1] duration not None,
                    const double[:, ::1] delay not None,
                    const double[::1] activation not None,
                    double release,
                    const double[::1] limit not None,
                    const double[::1] allowance,
                    Py_ssize_t microbatches,
                    bint fill_forward, bint fill_backward,
                    double[::1] idle not None,
                    int8_t[::1] order_kind not None,
                    index_t[::1] order_stage not None,
                    index_t[::1] order_microbatch not None,
                    index_t[::1] order_length not None):
    """One run of zbv-auto's V heuristic (``tabsched.schedules.zbv_auto``), compiled.

    The steps, tie-breaks and arithmetic of ``tabsched._reference.VPlanner`` (its twin),
    on the V placement of ``p = limit.shape[0]`` devices and ``2p`` stages: a warm-up
    of forwards as memory and arrivals allow, ``2 * microbatches`` rounds of input
    gradients then forwards with weight gradients filled into the waits, then the
    weight gradients left.

    Parameters
    ----------
    duration : float64 array (3, 2p)
        Per stage the time of a forward, an input gradient and a weight gradient.
    delay : float64 array (2, 2p)
        The transfer that brings a forward's and an input gradient's input to a stage.
    activation : float64 array (2p,)
        The activation a forward of a stage holds (an input gradient frees ``release``
        of it, the weight gradient the rest).
    limit : float64 array (p,)
        The activation memory a device may hold (its room with the tolerance added).
    allowance : float64 array (p,) or None
        The previous run's idle times (a refinement), or None.
    idle : float64 array (p,)
        Output: each device's idle time after its first forward.
    order_kind, order_stage, order_microbatch : arrays (p * 6 * microbatches,)
        Output: device ``d``'s order from ``d * 6 * microbatches``, kinds 0 (F), 1 (I),
        2 (W).
    order_length : int32 array (p,)
        Output: the operations in each device's order.

    Returns
    -------
    int
        OK; INFEASIBLE when the order cannot complete within the limit; NO_CONVERGENCE
        (an internal error); BAD_SHAPE when the arrays disagree; OUT_OF_MEMORY.
    """
    cdef Py_ssize_t p = limit.shape[0], stages = 2 * limit.shape[0], m = microbatches
    cdef Py_ssize_t per_device = 6 * microbatches, k
    cdef VRun r
    cdef int status
    cdef int *keys
    if (p < 1 or m < 1 or duration.shape[0] != 3 or duration.shape[1] != stages
            or delay.shape[0] != 2 or delay.shape[1] != stages
            or activation.shape[0] != stages or idle.shape[0] != p
            or order_length.shape[0] != p or order_kind.shape[0] != p * per_device
            or order_stage.shape[0] != p * per_device
            or order_microbatch.shape[0] != p * per_device
            or (allowance is not None and allowance.shape[0] != p)):
        return STATUS_BAD_SHAPE
    r.p, r.stages, r.m, r.per_device, r.ring = p, stages, m, per_device, 2 * m + 1
    r.duration, r.delay, r.activation = &duration[0, 0], &delay[0, 0], &activation[0]
    r.release, r.limit = release, &limit[0]
    r.allowance = NULL if allowance is None else &allowance[0]
    r.idle = &idle[0]
    r.order_kind, r.order_stage = &order_kind[0], &order_stage[0]
    r.order_microbatch, r.order_length = &order_microbatch[0], &order_length[0]
    r.count = <long *>calloc(p * 4, sizeof(long))
    r.free_at = <double *>calloc(p, sizeof(double))
    r.memory = <double *>calloc(p, sizeof(double))
    r.pending_stage = <long *>calloc(p * r.ring, sizeof(long))
    r.pending_microbatch = <long *>calloc(p * r.ring, sizeof(long))
    r.pending_head = <long *>calloc(p, sizeof(long))
    r.pending_size = <long *>calloc(p, sizeof(long))
    r.end_f = <double *>malloc(stages * m * sizeof(double))
    r.end_i = <double *>malloc(stages * m * sizeof(double))
    keys = <int *>calloc(p, sizeof(int))
    if (r.count == NULL or r.free_at == NULL or r.memory == NULL or r.pending_stage == NULL
            or r.pending_microbatch == NULL or r.pending_head == NULL
            or r.pending_size == NULL or r.end_f == NULL or r.end_i == NULL or keys == NULL):
        status = V_OUT_OF_MEMORY
    else:
        with nogil:
            for k in range(stages * m):
                r.end_f[k] = -1.0
                r.end_i[k] = -1.0
            for k in range(p):
                r.idle[k] = 0.0
                r.order_length[k] = 0
            status = _v_run(&r, fill_forward, fill_backward, keys)
    free(r.count)
    free(r.free_at)
    free(r.memory)
    free(r.pending_stage)
    free(r.pending_microbatch)
    free(r.pending_head)
    free(r.pending_size)
    free(r.end_f)
    free(r.end_i)
    free(keys)
    return status


# ------------------------------------------------------- zb-auto's heuristic
cdef enum:
    # a stage's counters (tabsched.schedules.zb_auto's kinds "F", "I", "W")
    ZB_F = 0
    ZB_I = 1
    ZB_W = 2
    ZB_KINDS = 3
    # how a run ends, beside STATUS_OK
    ZB_INTERNAL = 13          # the heuristic placed an operation it could not

#: ``zb_heuristic_run`` returns this when the heuristic placed an operation with none
#: left, before its input, or past the memory with no ``W`` to free it (an internal error).
PLACEMENT_ERROR = ZB_INTERNAL


cdef struct ZBRun:
    Py_ssize_t p, m, per_stage
    const double *duration      # (3, p): F, I, W
    const double *send_forward  # (p - 1,): stage s to s + 1; NULL when p == 1
    const double *send_backward # (p - 1,): stage s + 1 to s
    const double *activation    # (p,)
    const double *room          # (p,)
    double release, tolerance
    long *count                 # (3, p)
    double *free_at             # (p,)
    double *idle                # (p,)
    double *memory              # (p,)
    double *first_start         # (p,): start of each stage's first operation
    double *end_f               # (p, m): -1 until placed
    double *end_i
    long *extra                 # (p,): the warm-up's extra forwards
    bint *wanted                # (p,): a round's forwards
    int8_t *order_kind          # (p, per_stage) out, table kind codes
    index_t *order_microbatch
    index_t *order_length       # (p,) out


cdef inline double _zb_change(ZBRun *r, int kind, long stage) noexcept nogil:
    """Memory ``kind`` adds on ``stage`` (negative: frees), as ``_Planner.change``."""
    cdef double activation = r.activation[stage]
    if kind == ZB_F:
        return activation
    if kind == ZB_I:
        return -r.release * activation
    return -(1.0 - r.release) * activation


cdef inline double _zb_at_least_one(double value) noexcept nogil:
    # Python's max(1.0, value): 1.0 unless value is larger (NaN too gives 1.0)
    return value if value > 1.0 else 1.0


cdef inline bint _zb_fits(ZBRun *r, long stage, double amount) noexcept nogil:
    cdef double room = r.room[stage]
    cdef double scale = _zb_at_least_one(room if room >= 0.0 else -room)
    return r.memory[stage] + amount <= room + r.tolerance * scale


cdef inline long _zb_pending(ZBRun *r, long stage) noexcept nogil:
    return r.count[ZB_I * r.p + stage] - r.count[ZB_W * r.p + stage]


cdef inline double _zb_largest_idle(ZBRun *r) noexcept nogil:
    cdef double largest = r.idle[0]
    cdef long j
    for j in range(1, r.p):
        if r.idle[j] > largest:
            largest = r.idle[j]
    return largest


cdef inline int _zb_arrival(ZBRun *r, int kind, long stage, long microbatch,
                            double *arrival) noexcept nogil:
    """When the input of ``kind`` of ``microbatch`` on ``stage`` arrives; ZB_INTERNAL if
    its producer is not placed yet."""
    cdef double end
    arrival[0] = 0.0
    if microbatch < 0 or microbatch >= r.m:
        return ZB_INTERNAL
    if kind == ZB_F and stage > 0:
        end = r.end_f[(stage - 1) * r.m + microbatch]
        if end < 0.0:
            return ZB_INTERNAL
        arrival[0] = end + r.send_forward[stage - 1]
    elif kind == ZB_I and stage + 1 < r.p:
        end = r.end_i[(stage + 1) * r.m + microbatch]
        if end < 0.0:
            return ZB_INTERNAL
        arrival[0] = end + r.send_backward[stage]
    return STATUS_OK


cdef int _zb_put(ZBRun *r, long stage, int kind) noexcept nogil:
    cdef long microbatch = r.count[kind * r.p + stage]
    cdef double change, ready, start, end
    cdef index_t at = r.order_length[stage]
    if (kind != ZB_W and microbatch >= r.m) or \
            (kind == ZB_W and microbatch >= r.count[ZB_I * r.p + stage]):
        return ZB_INTERNAL
    change = _zb_change(r, kind, stage)
    if not _zb_fits(r, stage, change):
        return ZB_INTERNAL
    if _zb_arrival(r, kind, stage, microbatch, &ready) != STATUS_OK:
        return ZB_INTERNAL
    if at >= r.per_stage:
        return STATUS_BAD_SHAPE
    # Python's max(free_at, ready): free_at unless ready is later
    start = ready if ready > r.free_at[stage] else r.free_at[stage]
    if at > 0:
        r.idle[stage] += start - r.free_at[stage]
    end = start + r.duration[kind * r.p + stage]
    if at == 0:
        # the span is measured from end - duration, as the Python planner does
        r.first_start[stage] = end - r.duration[kind * r.p + stage]
    if kind == ZB_F:
        r.end_f[stage * r.m + microbatch] = end
    elif kind == ZB_I:
        r.end_i[stage * r.m + microbatch] = end
    r.free_at[stage] = end
    r.memory[stage] += change
    r.count[kind * r.p + stage] += 1
    r.order_kind[stage * r.per_stage + at] = <int8_t>(
        KIND_F if kind == ZB_F else KIND_I if kind == ZB_I else KIND_W)
    r.order_microbatch[stage * r.per_stage + at] = <index_t>microbatch
    r.order_length[stage] = at + 1
    return STATUS_OK


cdef int _zb_make_room(ZBRun *r, long stage, double amount) noexcept nogil:
    """``W`` s until ``amount`` more memory fits on ``stage``."""
    cdef int status
    while not _zb_fits(r, stage, amount):
        if _zb_pending(r, stage) == 0:
            return ZB_INTERNAL
        status = _zb_put(r, stage, ZB_W)
        if status != STATUS_OK:
            return status
    return STATUS_OK


cdef int _zb_fill_weights(ZBRun *r, long stage, double arrival, bint greedy) noexcept nogil:
    """``W`` s into the wait for an input arriving at ``arrival``."""
    cdef double weight = r.duration[ZB_W * r.p + stage], gap
    cdef int status
    while _zb_pending(r, stage) and r.free_at[stage] + weight <= arrival:
        status = _zb_put(r, stage, ZB_W)
        if status != STATUS_OK:
            return status
    gap = arrival - r.free_at[stage]
    if _zb_pending(r, stage) and gap > 0:
        if gap > _zb_largest_idle(r) - r.idle[stage] or greedy:
            return _zb_put(r, stage, ZB_W)
    return STATUS_OK


cdef int _zb_warm_up(ZBRun *r, bint delay_first_backward) noexcept nogil:
    cdef long p = r.p, m = r.m, stage, previous, cap, k
    cdef long *forwards = &r.count[ZB_F * r.p]
    cdef double gradient_end, arrival, memory, clock, activation, forward, room
    cdef int status
    for stage in range(p):
        status = _zb_put(r, stage, ZB_F)
        if status != STATUS_OK:
            return status
    for stage in range(p):
        r.extra[stage] = 0
    gradient_end = r.end_f[(p - 1) * m] + r.duration[ZB_I * p + p - 1]
    for stage in range(p - 2, -1, -1):
        arrival = gradient_end + r.send_backward[stage]
        memory, clock = r.memory[stage], r.free_at[stage]
        activation, forward = r.activation[stage], r.duration[ZB_F * p + stage]
        # the Python planner's max(1.0, room) here, without the abs of its fits
        room = r.room[stage] + r.tolerance * _zb_at_least_one(r.room[stage])
        while forwards[stage] + r.extra[stage] < m and memory + activation <= room:
            if delay_first_backward and clock >= arrival:
                break
            if not delay_first_backward and clock + forward > arrival:
                break
            memory += activation
            clock += forward
            r.extra[stage] += 1
        gradient_end = (arrival if arrival > clock else clock) + r.duration[ZB_I * p + stage]
    for stage in range(1, p):
        previous = forwards[stage - 1] + r.extra[stage - 1]
        # a stage stays at least one forward behind the previous one unless forwards
        # run out; never ahead of it
        cap = previous if previous >= m else previous - 1
        cap -= forwards[stage]
        if r.extra[stage] > cap:
            r.extra[stage] = cap
        if r.extra[stage] < 0:
            r.extra[stage] = 0
    for stage in range(p):
        for k in range(r.extra[stage]):
            status = _zb_put(r, stage, ZB_F)
            if status != STATUS_OK:
                return status
    for stage in range(p - 1, -1, -1):
        status = _zb_put(r, stage, ZB_I)
        if status != STATUS_OK:
            return status
    return STATUS_OK


cdef bint _zb_wants_forward(ZBRun *r, long stage, bint skip_forward) noexcept nogil:
    """Whether ``stage`` runs its next forward in this round."""
    cdef long p = r.p, nxt = stage + 1, pending
    cdef long *forwards = &r.count[ZB_F * r.p]
    cdef double horizon, memory, weights, gap
    if forwards[stage] >= r.m:
        return False
    if not (skip_forward and stage + 1 < p and forwards[stage] >= forwards[stage + 1] + 2):
        return True
    horizon = (r.free_at[nxt] + r.duration[ZB_F * p + nxt] + r.duration[ZB_I * p + nxt]
               + r.send_backward[stage])
    if r.free_at[stage] >= horizon:
        return False
    # the W's the forward would need first to fit in memory
    memory = r.memory[stage] + _zb_change(r, ZB_F, stage)
    weights = 0.0
    pending = _zb_pending(r, stage)
    while not _zb_fits(r, stage, memory - r.memory[stage]) and pending:
        memory += _zb_change(r, ZB_W, stage)
        weights += r.duration[ZB_W * p + stage]
        pending -= 1
    if r.free_at[stage] + r.duration[ZB_F * p + stage] + weights <= horizon:
        return True
    gap = horizon - r.free_at[stage]
    return gap > _zb_largest_idle(r) - r.idle[stage]


cdef int _zb_steady(ZBRun *r, long microbatch, bint skip_forward,
                    bint greedy_weights) noexcept nogil:
    """One round: a forward on each stage that wants one, then I of ``microbatch``."""
    cdef long p = r.p, stage
    cdef double arrival
    cdef int status
    for stage in range(p):
        r.wanted[stage] = _zb_wants_forward(r, stage, skip_forward)
    for stage in range(p - 2, -1, -1):
        r.wanted[stage] = r.wanted[stage] and r.wanted[stage + 1]
    for stage in range(p):
        if not r.wanted[stage]:
            continue
        status = _zb_make_room(r, stage, _zb_change(r, ZB_F, stage))
        if status == STATUS_OK and stage > 0:
            status = _zb_arrival(r, ZB_F, stage, r.count[ZB_F * p + stage], &arrival)
            if status == STATUS_OK:
                status = _zb_fill_weights(r, stage, arrival, greedy_weights)
        if status == STATUS_OK:
            status = _zb_put(r, stage, ZB_F)
        if status != STATUS_OK:
            return status
    for stage in range(p - 1, -1, -1):
        status = STATUS_OK
        if stage + 1 < p:
            status = _zb_arrival(r, ZB_I, stage, microbatch, &arrival)
            if status == STATUS_OK:
                status = _zb_fill_weights(r, stage, arrival, greedy_weights)
        if status == STATUS_OK and stage == 0 and r.count[ZB_F * p] >= r.m:
            while status == STATUS_OK and _zb_pending(r, 0):
                status = _zb_put(r, 0, ZB_W)
        if status == STATUS_OK:
            status = _zb_put(r, stage, ZB_I)
        if status != STATUS_OK:
            return status
    return STATUS_OK


cdef int _zb_run(ZBRun *r, bint delay_first_backward, bint skip_forward,
                 bint greedy_weights, double *span) noexcept nogil:
    cdef long microbatch, stage
    cdef int status = _zb_warm_up(r, delay_first_backward)
    if status != STATUS_OK:
        return status
    for microbatch in range(1, r.m):
        status = _zb_steady(r, microbatch, skip_forward, greedy_weights)
        if status != STATUS_OK:
            return status
    for stage in range(r.p):
        while _zb_pending(r, stage):
            status = _zb_put(r, stage, ZB_W)
            if status != STATUS_OK:
                return status
    # the paper's cost: the longest time from a stage's first operation to its last
    span[0] = r.free_at[0] - r.first_start[0]
    for stage in range(1, r.p):
        if r.free_at[stage] - r.first_start[stage] > span[0]:
            span[0] = r.free_at[stage] - r.first_start[stage]
    return STATUS_OK


@boundscheck(False)
@wraparound(False)
def zb_heuristic_run(const double[:, ::1] duration not None,
                     const double[::1] send_forward not None,
                     const double[::1] send_backward not None,
                     const double[::1] activation not None,
                     double release,
                     const double[::1] room not None,
                     double tolerance,
                     Py_ssize_t microbatches,
                     bint delay_first_backward, bint skip_forward, bint greedy_weights,
                     int8_t[::1] order_kind not None,
                     index_t[::1] order_microbatch not None,
                     index_t[::1] order_length not None,
                     double[::1] span not None):
    """One setting of zb-auto's heuristic (``tabsched.schedules.zb_auto``), compiled.

    The steps, tie-breaks and arithmetic of ``tabsched._reference.ZBPlanner`` (its twin),
    on ``p = room.shape[0]`` stages, one per device: the warm-up, ``microbatches - 1``
    steady rounds with weight gradients filled into the waits, then the weight
    gradients left.

    Parameters
    ----------
    duration : float64 array (3, p)
        Per stage the time of a forward, an input gradient and a weight gradient.
    send_forward, send_backward : float64 arrays (p - 1,)
        The activation transfer from stage ``s`` to ``s + 1`` and the gradient's back.
    activation : float64 array (p,)
        The activation a forward of a stage holds (an input gradient frees ``release``
        of it, the weight gradient the rest).
    room : float64 array (p,)
        The activation memory each stage may hold (``inf``: no limit).
    tolerance : float
        Relative slack on memory comparisons (``zb_auto._TOLERANCE``).
    delay_first_backward, skip_forward, greedy_weights : bool
        The setting (``zb_auto.Settings``).
    order_kind, order_microbatch : int8, int32 arrays (p * 3 * microbatches,)
        Output: stage ``s``'s order from ``s * 3 * microbatches``, kinds as
        ``tabsched.table`` numbers them (F, I, W).
    order_length : int32 array (p,)
        Output: the operations in each stage's order.
    span : float64 array (1,)
        Output: the heuristic's estimated span.

    Returns
    -------
    int
        OK; PLACEMENT_ERROR (an internal error); BAD_SHAPE when the arrays disagree;
        OUT_OF_MEMORY when the scratch could not be allocated.
    """
    cdef Py_ssize_t p = room.shape[0], m = microbatches, per_stage = 3 * microbatches, k
    cdef ZBRun r
    cdef int status
    if (p < 1 or m < 1 or duration.shape[0] != ZB_KINDS or duration.shape[1] != p
            or send_forward.shape[0] != p - 1 or send_backward.shape[0] != p - 1
            or activation.shape[0] != p or order_length.shape[0] != p
            or order_kind.shape[0] != p * per_stage
            or order_microbatch.shape[0] != p * per_stage or span.shape[0] != 1):
        return STATUS_BAD_SHAPE
    r.p, r.m, r.per_stage = p, m, per_stage
    r.duration, r.activation, r.room = &duration[0, 0], &activation[0], &room[0]
    r.send_forward = &send_forward[0] if p > 1 else NULL
    r.send_backward = &send_backward[0] if p > 1 else NULL
    r.release, r.tolerance = release, tolerance
    r.order_kind, r.order_microbatch = &order_kind[0], &order_microbatch[0]
    r.order_length = &order_length[0]
    r.count = <long *>calloc(ZB_KINDS * p, sizeof(long))
    r.free_at = <double *>calloc(p, sizeof(double))
    r.idle = <double *>calloc(p, sizeof(double))
    r.memory = <double *>calloc(p, sizeof(double))
    r.first_start = <double *>calloc(p, sizeof(double))
    r.end_f = <double *>malloc(p * m * sizeof(double))
    r.end_i = <double *>malloc(p * m * sizeof(double))
    r.extra = <long *>calloc(p, sizeof(long))
    r.wanted = <bint *>calloc(p, sizeof(bint))
    if (r.count == NULL or r.free_at == NULL or r.idle == NULL or r.memory == NULL
            or r.first_start == NULL or r.end_f == NULL or r.end_i == NULL
            or r.extra == NULL or r.wanted == NULL):
        status = V_OUT_OF_MEMORY
    else:
        with nogil:
            for k in range(p * m):
                r.end_f[k] = -1.0
                r.end_i[k] = -1.0
            for k in range(p):
                r.order_length[k] = 0
            status = _zb_run(&r, delay_first_backward, skip_forward, greedy_weights,
                             &span[0])
    free(r.count)
    free(r.free_at)
    free(r.idle)
    free(r.memory)
    free(r.first_start)
    free(r.end_f)
    free(r.end_i)
    free(r.extra)
    free(r.wanted)
    return status
