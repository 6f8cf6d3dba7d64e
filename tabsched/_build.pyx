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
