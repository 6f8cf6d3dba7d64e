"""Plain-Python twins of the kernel's entry points: the test oracle.

Each function takes the same arguments as its twin in ``tabsched._kernel`` and
follows the same steps in the same order, so results agree to the bit; ``Graph``
and ``Scratch`` are plain classes that check what the compiled ones check.
Nothing in the library calls this module at run time.
"""

import heapq
import re
from collections import deque

import numpy as np

from tabsched._kernel import (BAD_INDEX, BAD_SHAPE, DEADLOCK, NO_DEVICE_ID, NO_NODE_ID,
                              NO_RESOURCE_ID, OK, SUMMARY_BLOCK)


def _indegree(indptr, successors, n):
    indegree = [0] * n
    for v in range(n):
        for e in range(indptr[v], indptr[v + 1]):
            indegree[successors[e]] += 1
    return indegree


def _csr_status(indptr, successors, n):
    """The kernel's status for CSR offsets and targets of ``n`` nodes."""
    if indptr[0] != 0 or indptr[n] != len(successors):
        return BAD_SHAPE
    if any(indptr[v + 1] < indptr[v] for v in range(n)):
        return BAD_SHAPE
    if any(u < 0 or u >= n for u in successors):
        return BAD_INDEX
    return OK


def _topological_order(indptr, successors, n):
    """Kahn's order with a FIFO queue, and the indegrees left (> 0 on a cycle)."""
    remaining = _indegree(indptr, successors, n)
    queue = [v for v in range(n) if remaining[v] == 0]
    head = 0
    while head < len(queue):
        v = queue[head]
        head += 1
        for e in range(indptr[v], indptr[v + 1]):
            u = successors[e]
            remaining[u] -= 1
            if remaining[u] == 0:
                queue.append(u)
    return queue, remaining


class Graph:
    """Twin of ``tabsched._kernel.Graph``: the same checks, the arrays as lists."""

    def __init__(self, num_nodes):
        if num_nodes < 0:
            raise ValueError(f"a graph has at least 0 nodes, not {num_nodes}")
        self.num_nodes = num_nodes
        self.num_resources = self.num_devices = 0
        self.has_edges = self.has_layout = self.has_devices = False

    def add_edges(self, indptr, successors, resources, num_resources):
        n = self.num_nodes
        if (self.has_edges or len(indptr) != n + 1 or num_resources < 0
                or (resources.shape[1] > 0 and resources.shape[0] != n)):
            return BAD_SHAPE
        indptr = [int(x) for x in indptr]
        successors = [int(x) for x in successors]
        status = _csr_status(indptr, successors, n)
        if status != OK:
            return status
        held = [[int(r) for r in row if r != NO_RESOURCE_ID] for row in resources] \
            if resources.shape[1] > 0 else [[] for _ in range(n)]
        if any(r < 0 or r >= num_resources for rs in held for r in rs):
            return BAD_INDEX
        self.indptr, self.successors, self.held = indptr, successors, held
        self.num_resources = num_resources
        self.has_edges = True
        return OK

    def add_layout(self, order, pred_indptr, predecessors):
        n = self.num_nodes
        if (self.has_layout or len(order) != n or len(pred_indptr) != n + 1
                or pred_indptr[0] != 0 or pred_indptr[n] != len(predecessors)):
            return BAD_SHAPE
        for i in range(n):
            low, high = int(pred_indptr[i]), int(pred_indptr[i + 1])
            if high < low or high > len(predecessors):
                return BAD_SHAPE
            if not 0 <= int(order[i]) < n:
                return BAD_INDEX
            if any(not 0 <= int(p) < i for p in predecessors[low:high]):
                return BAD_INDEX
        self.order = [int(v) for v in order]
        self.lists = [[int(p) for p in predecessors[pred_indptr[i]:pred_indptr[i + 1]]]
                      for i in range(n)]
        self.has_layout = True
        return OK

    def add_devices(self, node_device, num_devices):
        if self.has_devices or len(node_device) != self.num_nodes or num_devices < 0:
            return BAD_SHAPE
        if any(not NO_DEVICE_ID <= int(d) < num_devices for d in node_device):
            return BAD_INDEX
        self.node_device = [int(d) for d in node_device]
        self.num_devices = num_devices
        self.has_devices = True
        return OK


class Scratch:
    """Twin of ``tabsched._kernel.Scratch``: the arrays the kernel's passes work in."""

    def __init__(self, indegree, heap_time, heap_node, free_at, holder, finish):
        self.indegree, self.heap_time, self.heap_node = indegree, heap_time, heap_node
        self.free_at, self.holder, self.finish = free_at, holder, finish

    def fits_events(self, graph):
        n = graph.num_nodes
        return (len(self.indegree) == n and len(self.heap_time) == n
                and len(self.heap_node) == n and len(self.free_at) >= graph.num_resources
                and len(self.holder) >= graph.num_resources)


def find_cycle(pred_indptr, predecessors, remaining, cycle, position):
    """Twin of ``tabsched._kernel.find_cycle``."""
    n = len(pred_indptr) - 1
    if n < 0 or len(remaining) != n or len(cycle) != n or len(position) != n:
        return -1
    if _csr_status(pred_indptr, predecessors, n) != OK:
        return -1
    unfinished = [v for v in range(n) if remaining[v] > 0]
    if not unfinished:
        return 0
    seen = {}
    path = []
    v = unfinished[0]
    while v not in seen:
        seen[v] = len(path)
        path.append(v)
        nxt = next((int(p) for p in predecessors[pred_indptr[v]:pred_indptr[v + 1]]
                    if remaining[p] > 0), None)
        if nxt is None:
            return -1
        v = nxt
    loop = path[seen[v]:][::-1]
    cycle[:len(loop)] = loop
    return len(loop)


def topological(indptr, successors, order, pred_indptr, predecessors, scratch):
    """Twin of ``tabsched._kernel.topological``."""
    n = len(indptr) - 1
    if (n < 0 or len(order) != n or len(pred_indptr) != n + 1 or len(scratch) != n
            or len(predecessors) != len(successors)):
        return BAD_SHAPE
    indptr = [int(x) for x in indptr]
    successors = [int(x) for x in successors]
    status = _csr_status(indptr, successors, n)
    if status != OK:
        return status
    queue, remaining = _topological_order(indptr, successors, n)
    scratch[:] = remaining
    if len(queue) < n:
        return DEADLOCK
    position = {v: i for i, v in enumerate(queue)}
    lists = [[] for _ in range(n)]
    for i, v in enumerate(queue):
        for e in range(indptr[v], indptr[v + 1]):
            lists[position[successors[e]]].append(i)
    order[:] = queue
    pred_indptr[0] = 0
    pred_indptr[1:] = np.cumsum([len(items) for items in lists])
    predecessors[:] = [p for items in lists for p in items]
    scratch[:] = [position[v] for v in range(n)]
    return OK


def longest_path_starts(graph, durations, start, binding, scratch, by_position=False):
    """Twin of ``tabsched._kernel.longest_path_starts``: a pull pass over positions."""
    n = graph.num_nodes
    samples = durations.shape[0]
    if (not graph.has_layout or durations.shape[1] != n or start.shape != (samples, n)
            or len(binding) not in (0, n) or len(scratch.finish) != n):
        return BAD_SHAPE
    node = list(range(n)) if by_position else graph.order
    for s in range(samples):
        ends = [0.0] * n
        for i, items in enumerate(graph.lists):
            v = node[i]
            begin, bound = 0.0, NO_NODE_ID
            for p in items:
                if ends[p] > begin:
                    begin, bound = ends[p], p
            ends[i] = begin + float(durations[s, v])
            start[s, v] = begin
            if len(binding) and s == 0:
                binding[v] = NO_NODE_ID if bound == NO_NODE_ID else node[bound]
        scratch.finish[:] = ends
    return OK


def kahn_starts(graph, durations, start, binding, scratch):
    """Twin of ``tabsched._kernel.kahn_starts``: Kahn's loop pushing each end on."""
    n = graph.num_nodes
    samples = durations.shape[0]
    if (not graph.has_edges or durations.shape[1] != n or start.shape != (samples, n)
            or len(binding) not in (0, n) or len(scratch.indegree) != n
            or len(scratch.heap_node) != n):
        return BAD_SHAPE
    indptr, successors = graph.indptr, graph.successors
    for s in range(samples):
        remaining = _indegree(indptr, successors, n)
        begins = [0.0] * n
        record = len(binding) and s == 0
        if record:
            binding[:] = NO_NODE_ID
        queue = deque(v for v in range(n) if remaining[v] == 0)
        taken = 0
        while queue:
            v = queue.popleft()
            scratch.heap_node[taken] = v        # the queue as the kernel keeps it
            taken += 1
            finish = begins[v] + float(durations[s, v])
            for e in range(indptr[v], indptr[v + 1]):
                u = successors[e]
                if finish > begins[u]:
                    begins[u] = finish
                    if record:
                        binding[u] = v
                remaining[u] -= 1
                if remaining[u] == 0:
                    queue.append(u)
        start[s, :] = begins
        scratch.indegree[:] = remaining
        if taken < n:
            return DEADLOCK
    return OK


def ordered_starts(graph, order, durations, start, binding):
    """Twin of ``tabsched._kernel.ordered_starts``: the pushes in a given order."""
    n = graph.num_nodes
    samples = durations.shape[0]
    if (not graph.has_edges or len(order) != n or durations.shape[1] != n
            or start.shape != (samples, n) or len(binding) not in (0, n)):
        return BAD_SHAPE
    if any(not 0 <= int(v) < n for v in order):
        return BAD_INDEX
    indptr, successors = graph.indptr, graph.successors
    for s in range(samples):
        begins = [0.0] * n
        record = len(binding) and s == 0
        if record:
            binding[:] = NO_NODE_ID
        for v in order:
            v = int(v)
            finish = begins[v] + float(durations[s, v])
            for e in range(indptr[v], indptr[v + 1]):
                u = successors[e]
                if finish > begins[u]:
                    begins[u] = finish
                    if record:
                        binding[u] = v
        start[s, :] = begins
    return OK


def _summary_shapes(graph, samples, makespan, busy, first_start, last_end):
    devices = graph.num_devices
    return (graph.has_devices and len(makespan) == samples and busy.shape == (samples, devices)
            and first_start.shape == (samples, devices)
            and last_end.shape == (samples, devices))


def longest_path_summary(graph, durations, makespan, busy, first_start, last_end, scratch):
    """Twin of ``tabsched._kernel.longest_path_summary``, one sample at a time
    (the kernel's blocks of samples change no number)."""
    n = graph.num_nodes
    samples = durations.shape[0]
    if (not graph.has_layout or durations.shape[1] != n
            or not _summary_shapes(graph, samples, makespan, busy, first_start, last_end)
            or len(scratch.finish) != n * SUMMARY_BLOCK):
        return BAD_SHAPE
    for s in range(samples):
        busy[s, :] = 0.0
        first_start[s, :] = float("inf")
        last_end[s, :] = 0.0
        ends = [0.0] * n
        for i, items in enumerate(graph.lists):
            v = graph.order[i]
            begin = max([0.0] + [ends[p] for p in items])
            length = float(durations[s, v])
            ends[i] = begin + length
            d = graph.node_device[v]
            if d != NO_DEVICE_ID:
                busy[s, d] += length
                first_start[s, d] = min(first_start[s, d], begin)
                last_end[s, d] = max(last_end[s, d], ends[i])
        makespan[s] = max(ends, default=0.0)
    return OK


def _events(graph, durations, s, visit):
    """One sample in event order: ``visit(v, begin, finish, bound)`` for each node as it
    starts (``bound``: the previous holder of a resource it waited for, or NO_NODE_ID),
    then ``begin`` per node and the indegrees left (> 0: never ran)."""
    n = graph.num_nodes
    indptr, successors = graph.indptr, graph.successors
    remaining = _indegree(indptr, successors, n)
    free = [0.0] * graph.num_resources
    last_holder = [NO_NODE_ID] * graph.num_resources
    begin = [0.0] * n
    heap = [(0.0, v) for v in range(n) if remaining[v] == 0]
    heapq.heapify(heap)
    while heap:
        ready, v = heapq.heappop(heap)
        bound = NO_NODE_ID
        for r in graph.held[v]:
            if free[r] > ready:
                ready = free[r]
                bound = last_holder[r]
        finish = ready + float(durations[s, v])
        for r in graph.held[v]:
            free[r] = finish
            last_holder[r] = v
        begin[v] = ready
        visit(v, ready, finish, bound)
        for e in range(indptr[v], indptr[v + 1]):
            u = successors[e]
            if finish > begin[u]:
                begin[u] = finish
                visit.raised(u, v)
            remaining[u] -= 1
            if remaining[u] == 0:
                heapq.heappush(heap, (begin[u], u))
    return begin, remaining


class _Visit:
    """What :func:`_events` tells a pass: each node's start, and each raise of a start."""

    def __init__(self, on_start=None, on_raise=None):
        self.on_start, self.on_raise = on_start, on_raise

    def __call__(self, v, begin, finish, bound):
        if self.on_start:
            self.on_start(v, begin, finish, bound)

    def raised(self, u, v):
        if self.on_raise:
            self.on_raise(u, v)


def fifo_starts(graph, durations, start, binding, scratch):
    """Twin of ``tabsched._kernel.fifo_starts``; ``heapq`` with (time, node) keys gives
    the kernel heap's order."""
    n = graph.num_nodes
    samples = durations.shape[0]
    if (not graph.has_edges or durations.shape[1] != n or start.shape != (samples, n)
            or len(binding) not in (0, n) or not scratch.fits_events(graph)):
        return BAD_SHAPE
    record = len(binding) > 0
    for s in range(samples):
        if record and s == 0:
            binding[:] = NO_NODE_ID

            def on_start(v, begin, finish, bound):
                if bound != NO_NODE_ID:
                    binding[v] = bound

            def on_raise(u, v):
                binding[u] = v
            visit = _Visit(on_start, on_raise)
        else:
            visit = _Visit()
        begin, remaining = _events(graph, durations, s, visit)
        start[s, :] = begin
        if any(count > 0 for count in remaining):
            scratch.indegree[:] = remaining
            return DEADLOCK
    return OK


def fifo_summary(graph, durations, makespan, busy, first_start, last_end, scratch):
    """Twin of ``tabsched._kernel.fifo_summary``: each device's busy time summed in the
    order the nodes run."""
    n = graph.num_nodes
    samples = durations.shape[0]
    if (not graph.has_edges or durations.shape[1] != n
            or not _summary_shapes(graph, samples, makespan, busy, first_start, last_end)
            or not scratch.fits_events(graph) or len(scratch.finish) != n):
        return BAD_SHAPE
    for s in range(samples):
        busy[s, :] = 0.0
        first_start[s, :] = float("inf")
        last_end[s, :] = 0.0
        longest = [0.0]

        def on_start(v, begin, finish, bound, s=s):
            longest[0] = max(longest[0], finish)
            d = graph.node_device[v]
            if d != NO_DEVICE_ID:
                busy[s, d] += float(durations[s, v])
                if begin < first_start[s, d]:
                    first_start[s, d] = begin
                if finish > last_end[s, d]:
                    last_end[s, d] = finish
        begin, remaining = _events(graph, durations, s, _Visit(on_start))
        scratch.finish[:] = begin
        if any(count > 0 for count in remaining):
            scratch.indegree[:] = remaining
            return DEADLOCK
        makespan[s] = longest[0]
    return OK


# ------------------------------------------------------------- tabsched._build
def dependencies(kind, stage, microbatch, device, num_stages, num_microbatches, forward_of,
                 backward_of, input_of, producer, consumer, group, crossing):
    """Twin of ``tabsched._build.dependencies`` (the scratch arrays are not used)."""
    ops = len(kind)
    S, M = num_stages, num_microbatches
    if (S < 0 or M < 0 or len(stage) != ops or len(microbatch) != ops or len(device) != ops
            or len(producer) != 2 * ops or len(consumer) != 2 * ops or len(group) != 2 * ops
            or len(crossing) != 2 * ops
            or len(forward_of) != S * M or len(backward_of) != S * M
            or len(input_of) != S * M):
        return -1 - BAD_SHAPE
    kinds = [int(code) for code in kind]
    stages = [int(s) for s in stage]
    mbs = [int(m) for m in microbatch]
    if any(not (0 <= s < S and 0 <= m < M and 0 <= k <= 3)
           for k, s, m in zip(kinds, stages, mbs)):
        return -1 - BAD_INDEX
    forward, backward, input_grad = {}, {}, {}
    for k, (code, s, m) in enumerate(zip(kinds, stages, mbs)):
        if code == 0:
            forward[s, m] = k
        elif code in (1, 2):
            backward[s, m] = k
            if code == 2:
                input_grad[s, m] = k
    rules = [  # (consumes?, producer lookup) per group
        (lambda code, s: code == 0 and s > 0, lambda s, m: forward.get((s - 1, m))),
        (lambda code, s: code in (1, 2), lambda s, m: forward.get((s, m))),
        (lambda code, s: code in (1, 2) and s < S - 1, lambda s, m: backward.get((s + 1, m))),
        (lambda code, s: code == 3, lambda s, m: input_grad.get((s, m))),
    ]
    count = 0
    for g, (consumes, lookup) in enumerate(rules):
        for k, (code, s, m) in enumerate(zip(kinds, stages, mbs)):
            if not consumes(code, s):
                continue
            source = lookup(s, m)
            if source is None:
                return -1
            producer[count], consumer[count], group[count] = source, k, g
            crossing[count] = int(device[source] != device[k])
            count += 1
    return count


def csr(sources, targets, indptr, successors):
    """Twin of ``tabsched._build.csr``."""
    n = len(indptr) - 1
    if n < 0 or len(targets) != len(sources) or len(successors) != len(sources):
        return BAD_SHAPE
    if any(not (0 <= int(v) < n and 0 <= int(u) < n) for v, u in zip(sources, targets)):
        return BAD_INDEX
    lists = [[] for _ in range(n)]
    for v, u in zip(sources, targets):
        lists[int(v)].append(int(u))
    indptr[0] = 0
    indptr[1:] = np.cumsum([len(items) for items in lists])
    successors[:] = [u for items in lists for u in items]
    return OK


def plain_csr(cell_device, cell_of_op, producer, consumer, crossing, indptr, successors):
    """Twin of ``tabsched._build.plain_csr``: the three edge groups as lists, then
    :func:`csr` of them."""
    cells, n, ops = len(cell_device), len(indptr) - 1, len(cell_of_op)
    if len(consumer) != len(producer) or len(crossing) != len(producer) or n < 0:
        return BAD_SHAPE
    if any(not 0 <= int(c) < cells for c in cell_of_op) or any(
            not (0 <= int(p) < ops and 0 <= int(q) < ops) for p, q in zip(producer, consumer)):
        return BAD_INDEX
    crossing_at = [k for k in range(len(producer)) if crossing[k]]
    if cells + len(crossing_at) != n:
        return BAD_SHAPE
    transfer_of = {k: cells + j for j, k in enumerate(crossing_at)}
    sources, targets = [], []
    for c in range(cells - 1):                          # row order
        if cell_device[c + 1] == cell_device[c]:
            sources.append(c)
            targets.append(c + 1)
    for k in range(len(producer)):                      # dependencies
        sources.append(int(cell_of_op[producer[k]]))
        targets.append(transfer_of[k] if crossing[k] else int(cell_of_op[consumer[k]]))
    for k in crossing_at:                               # transfers to their consumers
        sources.append(transfer_of[k])
        targets.append(int(cell_of_op[consumer[k]]))
    if len(successors) != len(sources):
        return BAD_SHAPE
    return csr(np.array(sources, dtype=np.int32), np.array(targets, dtype=np.int32), indptr,
               successors)


def direct_csr(kind, stage, microbatch, cell_of_op, cell_device, num_stages,
               num_microbatches, forward_of, backward_of, weight_of, indptr, successors):
    """Twin of ``tabsched._build.direct_csr`` (the scratch arrays are not used): each
    cell's row edge, then its operations' consumers group by group."""
    ops, S, M, cells = len(kind), num_stages, num_microbatches, len(cell_device)
    if (S < 0 or M < 0 or any(len(column) != ops for column in (stage, microbatch,
                                                                 cell_of_op))
            or any(len(lookup) != S * M for lookup in (forward_of, backward_of, weight_of))
            or len(indptr) != cells + 1):
        return -1 - BAD_SHAPE
    kinds, stages, mbs = ([int(value) for value in column]
                          for column in (kind, stage, microbatch))
    cell = [int(c) for c in cell_of_op]
    if any(not (0 <= s < S and 0 <= m < M and 0 <= code <= 3)
           for code, s, m in zip(kinds, stages, mbs)):
        return -1 - BAD_INDEX
    if any(not 0 <= c < cells for c in cell) or any(
            now not in (before, before + 1) for before, now in zip([-1] + cell, cell)):
        return -1 - BAD_INDEX
    if (cell[-1] if cell else -1) != cells - 1:
        return -1 - BAD_SHAPE
    forward = {(s, m): k for k, (code, s, m) in enumerate(zip(kinds, stages, mbs)) if code == 0}
    backward = {(s, m): k for k, (code, s, m) in enumerate(zip(kinds, stages, mbs))
                if code in (1, 2)}
    weight = {(s, m): k for k, (code, s, m) in enumerate(zip(kinds, stages, mbs)) if code == 3}
    # the dependencies, counted from the consumers' side (as dependencies() finds them)
    deps = sum((code == 0 and s > 0) + (code in (1, 2)) * (1 + (s < S - 1)) + (code == 3)
               for code, s, m in zip(kinds, stages, mbs))
    rows = sum(cell_device[c + 1] == cell_device[c] for c in range(cells - 1))
    if len(successors) < rows + deps:
        return -1 - BAD_SHAPE
    consumers = [  # the consumer of operation (code, s, m) in each group, or None
        lambda code, s, m: forward.get((s + 1, m)) if code == 0 and s < S - 1 else None,
        lambda code, s, m: backward.get((s, m)) if code == 0 else None,
        lambda code, s, m: backward.get((s - 1, m)) if code in (1, 2) and s > 0 else None,
        lambda code, s, m: weight.get((s, m)) if code == 2 else None,
    ]
    lists = []
    for c in range(cells):
        edges = [c + 1] if c + 1 < cells and cell_device[c + 1] == cell_device[c] else []
        members = [k for k in range(ops) if cell[k] == c]
        for consumer in consumers:
            for k in members:
                target = consumer(kinds[k], stages[k], mbs[k])
                if target is not None:
                    edges.append(cell[target])
        lists.append(edges)
    count = sum(len(edges) for edges in lists)
    if count != rows + deps:
        return -1      # MISSING: a consumer's producer is not in the table
    indptr[0] = 0
    indptr[1:] = np.cumsum([len(edges) for edges in lists])
    successors[:count] = [u for edges in lists for u in edges]
    return count


def activation_peaks(device, kind, cell_of_op, node_start, node_durations, activation,
                     transient, release, peaks):
    """Twin of ``tabsched._build.activation_peaks``: each device's events (a start and an
    end per operation) sorted by (time, delta), stable, as ``Result.memory_timeline``
    sorts them, then the peak."""
    operations = len(device)
    if (len(kind) != operations or len(cell_of_op) != operations
            or len(activation) != operations or len(transient) != operations
            or len(node_durations) != len(node_start)):
        return BAD_SHAPE
    if (any(not 0 <= int(d) < len(peaks) for d in device) or np.any(np.diff(device) < 0)
            or any(not 0 <= int(c) < len(node_start) for c in cell_of_op)):
        return BAD_INDEX
    kind = np.asarray(kind)
    activation = np.asarray(activation, dtype=np.float64)
    held = np.asarray(transient, dtype=np.float64)
    start = np.asarray(node_start)[cell_of_op]
    end = start + np.asarray(node_durations)[cell_of_op]
    is_f = kind == 0
    freed = np.where(kind == 1, activation, np.where(kind == 2, activation * release,
                                                     activation * (1.0 - release)))
    on_device = np.concatenate([np.asarray(device), np.asarray(device)])
    times = np.concatenate([start, end])
    deltas = np.concatenate([np.where(is_f, activation, 0.0) + held,
                             np.where(is_f, -held, -(freed + held))])
    peaks[:] = 0.0
    for d in range(len(peaks)):
        mine = np.flatnonzero((on_device == d) & (deltas != 0))
        order = np.lexsort((deltas[mine], times[mine]))
        values = np.cumsum(deltas[mine][order])
        peaks[d] = max(0.0, float(values.max())) if len(values) else 0.0
    return OK


def squeeze_slots(device, kind, microbatch, list_first, num_kinds, start, missing):
    """Twin of ``tabsched._build.squeeze_slots``: the slot order's loop in plain Python."""
    ops, lists = len(device), len(list_first) - 1
    if (len(kind) != ops or len(microbatch) != ops or len(start) != ops or len(missing) != 1
            or num_kinds < 1 or lists < 0 or lists % num_kinds):
        return -1 - BAD_SHAPE
    devices = lists // num_kinds
    first = [int(x) for x in list_first]
    if first[0] != 0 or first[lists] != ops or any(b < a for a, b in zip(first, first[1:])):
        return -1 - BAD_SHAPE

    def size(d, k):
        return first[d * num_kinds + k + 1] - first[d * num_kinds + k]

    steps = list(zip(*(np.asarray(column).tolist() for column in (device, kind, microbatch))))
    if any(not (0 <= d < devices and 0 <= k < num_kinds and 0 <= m < size(d, k))
           for d, k, m in steps):
        return -1 - BAD_INDEX
    end = [None] * ops
    free_at = [0] * devices
    missing[0] = -1
    for d, k, m in steps:
        needs = []
        if k in (0, 2) and d > 0:
            needs.append((d - 1, k, m))
        if k in (1, 3) and d + 1 < devices:
            needs.append((d + 1, k, m))
        if 0 < k < 4:
            needs.append((d, k - 1, m))
        if m > 0:
            needs.append((d, k, m - 1))
        ready = free_at[d]
        for need_d, need_k, need_m in needs:
            if need_m >= size(need_d, need_k):
                missing[0] = -1
                return -1 - DEADLOCK
            at = first[need_d * num_kinds + need_k] + need_m
            if end[at] is None:
                missing[0] = at
                return -1 - DEADLOCK
            ready = max(ready, end[at])
        at = first[d * num_kinds + k] + m
        if end[at] is not None:
            return -1 - BAD_INDEX
        end[at] = free_at[d] = ready + 1
        start[at] = ready
    return ops


def slot_peak(kind_at, explicit_weights):
    """Twin of ``tabsched._build.slot_peak``: the running sums with numpy."""
    kind_at = np.asarray(kind_at, dtype=np.int64)
    forwards = np.cumsum((kind_at == 0) | (kind_at == 1))
    inputs = (kind_at == 2) | (kind_at == 3)
    weights = (kind_at == 4) | (kind_at == 5)
    if explicit_weights:
        held = forwards - np.cumsum(weights)
    else:
        idle = ~(inputs | weights | (kind_at == 0) | (kind_at == 1))
        walk = np.cumsum(inputs.astype(np.int64) - idle)
        held = forwards - np.cumsum(inputs) + walk - np.minimum(np.minimum.accumulate(walk), 0)
    return max(0, int(held.max())) if len(held) else 0


def append_one(indptr, items, extra, new_indptr, new_items):
    """Twin of ``tabsched._build.append_one``."""
    rows = len(indptr) - 1
    if rows < 0 or len(extra) != rows or len(new_indptr) != rows + 1:
        return BAD_SHAPE
    if indptr[0] != 0 or indptr[rows] != len(items) or np.any(np.diff(indptr) < 0):
        return BAD_SHAPE
    lists = [list(items[indptr[row]:indptr[row + 1]])
             + ([int(extra[row])] if extra[row] != NO_NODE_ID else []) for row in range(rows)]
    if sum(len(items) for items in lists) != len(new_items):
        return BAD_SHAPE
    new_indptr[0] = 0
    new_indptr[1:] = np.cumsum([len(items) for items in lists])
    new_items[:] = [item for items in lists for item in items]
    return OK


def fill_idle(length, cell_device, filler, dep_indptr, dep_producer, dep_wait, release_indptr,
              released, main_indptr, main_cells, cap, rows, row_count):
    """Twin of ``tabsched._build.fill_idle``: the list scheduler in plain Python."""
    cells, devices = len(length), len(cap)
    if (len(cell_device) != cells or len(filler) != cells or len(dep_indptr) != cells + 1
            or len(dep_wait) != len(dep_producer) or len(release_indptr) != cells + 1
            or len(main_indptr) != devices + 1 or len(rows) != cells
            or len(row_count) != devices):
        return -1 - BAD_SHAPE
    deps = [[(int(dep_producer[e]), float(dep_wait[e]))
             for e in range(dep_indptr[c], dep_indptr[c + 1])] for c in range(cells)]
    releases = [[int(x) for x in released[release_indptr[c]:release_indptr[c + 1]]]
                for c in range(cells)]
    main = [[int(x) for x in main_cells[main_indptr[d]:main_indptr[d + 1]]]
            for d in range(devices)]
    limit = [float("inf") if value < 0 else int(value) for value in cap]
    end = [None] * cells
    pointer = [0] * devices
    free = [0.0] * devices
    pending = [[] for _ in range(devices)]
    placed_rows = [[] for _ in range(devices)]
    waiting = {}
    events = [(0.0, d, d) for d in range(devices)]
    sequence = devices

    def push(time, device):
        nonlocal sequence
        heapq.heappush(events, (time, sequence, device))
        sequence += 1

    def run(d, c, now):
        end[c] = now + float(length[c])
        free[d] = end[c]
        placed_rows[d].append(c)
        push(end[c], d)
        for other in sorted(waiting.pop(c, ())):
            push(now, other)

    while events:
        now, _, d = heapq.heappop(events)
        if now < free[d]:
            continue
        queue = pending[d]
        if len(queue) > limit[d]:
            run(d, queue.pop(0), now)
            continue
        if pointer[d] == len(main[d]):
            if queue:
                run(d, queue.pop(0), now)
            continue
        c = main[d][pointer[d]]
        ready, blocker = now, None
        for producer, wait in deps[c]:
            if end[producer] is not None:
                ready = max(ready, end[producer] + wait)
            else:
                ready = max(ready, now + float(length[producer]) + wait)
                blocker = producer
        if blocker is None and ready <= now:
            pointer[d] += 1
            queue.extend(releases[c])
            run(d, c, now)
        elif queue and ready - now >= float(length[queue[0]]):
            run(d, queue.pop(0), now)
        elif blocker is None:
            push(ready, d)
        else:
            waiting.setdefault(blocker, set()).add(d)
    flat = [c for row in placed_rows for c in row]
    rows[:len(flat)] = flat
    row_count[:] = [len(row) for row in placed_rows]
    return len(flat)


def one_f_one_b_order(devices, microbatches, device, position, kind, microbatch):
    """Twin of ``_build.one_f_one_b_order``: each device's order from its definition,
    warm-up forwards, the F/B pairs, the cool-down backwards."""
    total = 2 * devices * microbatches
    if (devices < 0 or microbatches < 0
            or any(len(column) != total for column in (device, position, kind, microbatch))):
        return BAD_SHAPE
    k = 0
    for d in range(devices):
        w = min(devices - d - 1, microbatches)
        steady = microbatches - w
        order = ([(0, m) for m in range(w)]
                 + [op for m in range(steady) for op in ((0, w + m), (1, m))]
                 + [(1, m) for m in range(steady, microbatches)])
        for i, (code, m) in enumerate(order):
            device[k], position[k], kind[k], microbatch[k] = d, i, code, m
            k += 1
    return OK


def table_is_valid(device, kind, stage, microbatch, num_stages, num_microbatches, seen, home):
    """Twin of ``tabsched._build.table_is_valid``."""
    S, M = num_stages, num_microbatches
    ops = len(device)
    if (S < 0 or M < 0 or len(kind) != ops or len(stage) != ops or len(microbatch) != ops
            or len(seen) != 4 * S * M or len(home) != S * M):
        return -1 - BAD_SHAPE
    kinds, devices = {}, {}
    for d, k, s, m in zip(device, kind, stage, microbatch):
        if not (0 <= s < S and 0 <= m < M and 0 <= k <= 3 and d >= 0):
            return 0
        if (s, m, k) in kinds:
            return 0
        kinds[s, m, k] = True
        if devices.setdefault((s, m), d) != d:
            return 0
    for s in range(S):
        for m in range(M):
            has = [(s, m, k) in kinds for k in range(4)]
            if not has[0] or not (has[1] and not has[2] and not has[3]
                                  or not has[1] and has[2] and has[3]):
                return 0
    return 1


# ------------------------------------------------------------ Monte Carlo draws
_F = np.float32
_GOLDEN, _M1, _M2 = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9),
                     np.uint64(0x94D049BB133111EB))


def _mix64(z):
    with np.errstate(over="ignore"):
        z = z + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def _ln(u):
    bits = u.view(np.uint32)
    e = ((bits >> np.uint32(23)) & np.uint32(0xFF)).astype(np.int32) - 127
    m = ((bits & np.uint32(0x007FFFFF)) | np.uint32(0x3F800000)).view(_F)
    big = (m > _F(1.41421356237)).astype(np.int32)
    e = e + big
    m = m * (_F(1.0) - _F(0.5) * big.astype(_F))
    t = (m - _F(1.0)) / (m + _F(1.0))
    t2 = t * t
    poly = _F(1.0) + t2 * (_F(0.333333333333) + t2 * (_F(0.2) + t2 * (
        _F(0.142857142857) + t2 * _F(0.111111111111))))
    return e.astype(_F) * _F(0.693147180560) + _F(2.0) * t * poly


def _cos_turns(u):
    a = np.abs(u - _F(0.5))
    big = (a > _F(0.25)).astype(_F)
    b = a + big * (_F(0.5) - _F(2.0) * a)
    x2 = b * b * _F(39.4784176044)
    c = _F(1.0) + x2 * (_F(-0.5) + x2 * (_F(4.16666666667e-2) + x2 * (
        _F(-1.38888888889e-3) + x2 * (_F(2.48015873016e-5) + x2 * (
            _F(-2.75573192240e-7) + x2 * _F(2.08767569879e-9))))))
    return c * (_F(2.0) * big - _F(1.0))


def _exp(x):
    x = x + (x < _F(-87.0)).astype(_F) * (_F(-87.0) - x)
    x = x + (x > _F(88.0)).astype(_F) * (_F(88.0) - x)
    y = x * _F(1.44269504089)
    n = (y + np.copysign(_F(0.5), y)).astype(np.int32)
    r = x - n.astype(_F) * _F(0.693359375) + n.astype(_F) * _F(2.12194440e-4)
    p = _F(1.0) + r * (_F(1.0) + r * (_F(0.5) + r * (_F(0.166666666667) + r * (
        _F(4.16666666667e-2) + r * (_F(8.33333333333e-3) + r * _F(1.38888888889e-3))))))
    return p * ((n + 127).astype(np.uint32) << np.uint32(23)).view(_F)


def lognormal_factors(stream, samples, keys, sigma, shift, factors):
    """Twin of ``tabsched._kernel.lognormal_factors``: the same float32 steps in numpy."""
    if (len(sigma) != len(keys) or len(shift) != len(keys)
            or factors.shape != (len(samples), len(keys))):
        return BAD_SHAPE
    samples = np.asarray(samples, dtype=np.int64)
    pair = _mix64((samples >> 1).astype(np.uint64) ^ np.uint64(stream))
    z = _mix64(pair[:, None] ^ np.asarray(keys, dtype=np.uint64)[None, :])
    radius = np.sqrt(_F(-2.0) * _ln(((z >> np.uint64(40)).astype(np.int32).astype(_F)
                                     + _F(0.5)) * _F(5.96046447754e-8)))
    turn = (((z >> np.uint64(8)) & np.uint64(0xFFFFFF)).astype(np.int32).astype(_F)
            + _F(0.5)) * _F(5.96046447754e-8)
    turn = turn - _F(0.25) * (samples & 1).astype(_F)[:, None]
    turn = turn + (turn < _F(0.0)).astype(_F)
    sigma = np.asarray(sigma, dtype=_F)[None, :]
    shift = np.asarray(shift, dtype=_F)[None, :]
    factors[:] = _exp(sigma * radius * _cos_turns(turn) - shift).astype(np.float64)
    return OK


def monte_carlo_summary(graph, draws, makespan, busy, first_start, last_end, scratch,
                        first_sample=0):
    """Twin of ``tabsched._kernel.monte_carlo_summary``: the draws by
    :func:`lognormal_factors`, the node durations summed as the kernel sums them, then
    :func:`longest_path_summary` (whose finish scratch has the kernel's first part)."""
    samples = len(makespan)
    devices = busy.shape[1]
    n = graph.num_nodes
    cell_first_op, op_base, overlap = draws.cell_first_op, draws.op_base, draws.overlap
    transfer_base, transfer_key = draws.transfer_base, draws.transfer_key
    cells = len(cell_first_op) - 1
    if (not (graph.has_layout and graph.has_devices) or devices != graph.num_devices
            or len(scratch.finish) != (n + 3 * devices) * SUMMARY_BLOCK):
        return BAD_SHAPE
    if first_sample < 0 or first_sample % 2:
        return BAD_SHAPE
    indices = first_sample + np.arange(samples)
    ops = np.empty((samples, len(op_base)))
    lognormal_factors(draws.noise_stream, indices, draws.op_key, draws.op_sigma,
                      draws.op_shift, ops)
    ops = np.asarray(op_base)[None, :] * ops
    durations = np.empty((samples, n))
    for cell in range(cells):
        low, high = int(cell_first_op[cell]), int(cell_first_op[cell + 1])
        total = ops[:, low]
        for part in range(low + 1, high):
            total = total + ops[:, part]
        if high - low > 1 and overlap != 1.0:
            total = total * overlap
        durations[:, cell] = total
    sends = np.repeat(np.asarray(transfer_base, dtype=np.float64)[None, :], samples, axis=0)
    if draws.transfer_sigma != 0.0 or draws.transfer_shift != 0.0:
        factors = np.empty(sends.shape)
        lognormal_factors(draws.transfer_stream, indices, transfer_key,
                          np.full(len(transfer_key), draws.transfer_sigma, _F),
                          np.full(len(transfer_key), draws.transfer_shift, _F), factors)
        sends = sends * factors
    durations[:, cells:cells + len(transfer_base)] = sends
    durations[:, cells + len(transfer_base):] = np.asarray(draws.extra)[None, :]
    blocks = Scratch(*([np.zeros(0, dtype=np.int32)] * 5), np.zeros(n * SUMMARY_BLOCK))
    return longest_path_summary(graph, durations, makespan, busy, first_start, last_end,
                                blocks)


# ------------------------------------------------ zbv-auto's V heuristic
class VPlanner:
    """Twin of ``tabsched._build``'s V heuristic run: per device the ops placed, their
    times and memory, in plain Python.

    Keys of a device's counters: ``"F0"``, ``"F1"`` (forwards of chunk 0 and
    1), ``"I1"``, ``"I0"`` (input-grads of chunk 1, which come first, and of
    chunk 0). Times are the heuristic's estimate; tabsched simulates the result.
    """

    def __init__(self, duration, delay, activation, release, limit, allowance,
                 microbatches):
        p = len(limit)
        self.num_devices = p
        self.microbatches = microbatches
        self.release = release
        self.count = [{"F0": 0, "F1": 0, "I1": 0, "I0": 0} for _ in range(p)]
        self.free_at = [0.0] * p
        self.idle = [0.0] * p
        self.memory = [0.0] * p
        self.pending = [deque() for _ in range(p)]
        self.end = {}
        self.orders = [[] for _ in range(p)]
        self.allowance = None if allowance is None else [float(a) for a in allowance]
        self._stages = [{"F0": device, "I0": device, "F1": 2 * p - 1 - device,
                         "I1": 2 * p - 1 - device} for device in range(p)]
        self._last = 2 * p - 1
        self._duration = {kind: [float(v) for v in duration[k]] for k, kind in enumerate("FIW")}
        self._delay = {kind: [float(v) for v in delay[k]] for k, kind in enumerate("FI")}
        self._activation = [float(value) for value in activation]
        self._limit = [float(value) for value in limit]

    def stage(self, device, key):
        return self._stages[device][key]

    def largest_idle(self, device):
        largest = max(self.idle)
        if self.allowance is not None:
            largest = max(largest, max(self.allowance) - self.allowance[device])
        return largest

    def arrival(self, kind, stage, microbatch):
        """When ``kind`` of ``microbatch`` on ``stage`` has its input, or None if not yet."""
        last = self._last
        if kind == "F":
            if stage == 0:
                return 0.0
            producer = ("F", stage - 1, microbatch)
        else:
            producer = ("F", last, microbatch) if stage == last else \
                ("I", stage + 1, microbatch)
        end = self.end.get(producer)
        if end is None:
            return None
        return end + self._delay[kind][stage]

    def fits(self, device, amount):
        return self.memory[device] + amount <= self._limit[device]

    def _place(self, device, kind, stage, microbatch, start):
        if self.count[device]["F0"] > 0:
            self.idle[device] += start - self.free_at[device]
        end = start + self._duration[kind][stage]
        self.end[kind, stage, microbatch] = self.free_at[device] = end
        self.orders[device].append((kind, stage, microbatch))

    def put(self, device, key):
        kind, stage = key[0], self.stage(device, key)
        microbatch = self.count[device][key]
        if microbatch >= self.microbatches:
            raise _VInfeasible(f"{key} exhausted on device {device}")
        ready = self.arrival(kind, stage, microbatch)
        if ready is None:
            raise _VInfeasible(f"{key} {microbatch} on device {device} before its input")
        activation = self._activation[stage]
        change = activation if kind == "F" else -self.release * activation
        if not self.fits(device, change):
            raise _VInfeasible(f"memory of device {device}")
        self._place(device, kind, stage, microbatch, max(self.free_at[device], ready))
        self.memory[device] += change
        self.count[device][key] += 1
        if kind == "I":
            self.pending[device].append((stage, microbatch))

    def put_weight(self, device):
        stage, microbatch = self.pending[device].popleft()
        self._place(device, "W", stage, microbatch, self.free_at[device])
        self.memory[device] -= (1.0 - self.release) * self._activation[stage]

    def make_room(self, device, amount):
        while not self.fits(device, amount):
            if not self.pending[device]:
                raise _VInfeasible(f"memory of device {device}")
            self.put_weight(device)

    def fill_weights(self, device, key, overrun):
        """``W`` s into the wait for ``key``'s input; ``overrun``: may one more run past it."""
        kind, stage = key[0], self.stage(device, key)
        last = self.num_devices - 1
        # the input comes from another device: F0 and I1 from device d-1, F1 and I0 from d+1
        if (device == 0 and key in ("F0", "I1")) or (device == last and key in ("F1", "I0")):
            return
        arrival = self.arrival(kind, stage, self.count[device][key])
        if arrival is None:
            return
        pending = self.pending[device]
        weight = self._duration["W"]
        while pending and arrival >= self.free_at[device] + weight[pending[0][0]]:
            self.put_weight(device)
        if pending and overrun and \
                arrival - self.free_at[device] > self.largest_idle(device) - self.idle[device]:
            self.put_weight(device)

    def warm_up(self):
        p, m = self.num_devices, self.microbatches
        for device in range(p):
            self.put(device, "F0")
        for device in range(p - 1, -1, -1):
            if device < p - 1:
                arrival = self.arrival("F", self.stage(device, "F1"), 0)
                forward = self._duration["F"][device]
                reserve = self._activation[device] * (2 + 2 * device)
                while (self.fits(device, reserve)
                       and self.free_at[device] + forward <= arrival
                       and self.count[device]["F0"] < m
                       and all(self.fits(j, self._activation[j]) for j in range(device))):
                    for j in range(device + 1):
                        self.put(j, "F0")
            self.put(device, "F1")
        turn = 0
        guard = 4 * p * m + 8
        for device in range(1, p):
            mine, previous = self.count[device], self.count[device - 1]
            while (mine["F0"] + mine["F1"] < previous["F0"] + previous["F1"]
                   or mine["F1"] <= previous["F1"] < m):
                guard -= 1
                if guard < 0:
                    raise _VNoConvergence
                key = f"F{turn}"
                for j in range(p - 1, device - 1, -1):
                    if self.count[j][key] < m:
                        self.put(j, key)
                turn = 1 - turn

    def backward_key(self, device):
        count = self.count[device]
        if count["I0"] >= count["I1"]:
            return "I1"
        if device == self.num_devices - 1:
            return "I0"
        ready = self.arrival("I", self.stage(device, "I0"), count["I0"]) is not None
        return "I0" if ready or count["I1"] >= self.microbatches else "I1"

    def forward_key(self, device):
        count, m = self.count[device], self.microbatches
        if count["F1"] >= m:
            return None
        if count["F1"] >= count["F0"]:
            return "F0"
        if device == self.num_devices - 1:
            return "F1"
        if self.arrival("F", self.stage(device, "F1"), count["F1"]) is not None:
            return "F1"
        if count["F0"] < m and (device == 0 or self.arrival(
                "F", self.stage(device, "F0"), count["F0"]) is not None):
            return "F0"
        return None

    def round(self, fill_forward, fill_backward):
        p = self.num_devices
        keys = [self.backward_key(device) for device in range(p)]
        order = [(d, "I0") for d in range(p - 1, -1, -1) if keys[d] == "I0"] + \
                [(d, "I1") for d in range(p) if keys[d] == "I1"]
        for device, key in order:
            self.fill_weights(device, key, overrun=key == "I0" or fill_backward)
            self.put(device, key)
        for device in range(p):
            key = self.forward_key(device)
            if key is None:
                continue
            self.make_room(device, self._activation[self.stage(device, key)])
            self.fill_weights(device, key, overrun=fill_forward)
            self.put(device, key)

    def run(self, fill_forward, fill_backward):
        self.warm_up()
        for _ in range(2 * self.microbatches):
            self.round(fill_forward, fill_backward)
        for device in range(self.num_devices):
            while self.pending[device]:
                self.put_weight(device)
        return self


class _VInfeasible(Exception):
    """A setting cannot complete its order within the memory limit."""


class _VNoConvergence(Exception):
    """The warm-up's balancing loop ran past its guard."""


def v_heuristic_run(duration, delay, activation, release, limit, allowance, microbatches,
                    fill_forward, fill_backward, idle, order_kind, order_stage,
                    order_microbatch, order_length):
    """Twin of ``tabsched._build.v_heuristic_run``: :class:`VPlanner` run, its orders
    written as the compiled run writes them."""
    from tabsched._build import INFEASIBLE, NO_CONVERGENCE
    planner = VPlanner(duration, delay, activation, release, limit, allowance, microbatches)
    try:
        planner.run(fill_forward, fill_backward)
    except _VInfeasible:
        return INFEASIBLE
    except _VNoConvergence:
        return NO_CONVERGENCE
    per_device = 6 * microbatches
    idle[:] = planner.idle
    for device, order in enumerate(planner.orders):
        order_length[device] = len(order)
        for position, (kind, stage, microbatch) in enumerate(order):
            at = device * per_device + position
            order_kind[at] = "FIW".index(kind)
            order_stage[at] = stage
            order_microbatch[at] = microbatch
    return OK


# ------------------------------------------------------- zb-auto's heuristic
class ZBPlanner:
    """Twin of ``tabsched._build``'s zb-auto heuristic run: per stage the ops placed,
    their times and memory, in plain Python (zb-auto's planner before it was compiled).

    Times are the heuristic's own estimate (transfers never wait for each other);
    the table it produces is judged by tabsched's simulation. Every slip (an
    operation with none left, before its input, past the memory) raises
    ``_ZBPlacementError``.
    """

    def __init__(self, duration, send_forward, send_backward, activation, release, room,
                 tolerance, microbatches):
        p = len(room)
        self.num_stages = p
        self.microbatches = microbatches
        self.release = float(release)
        self.tolerance = float(tolerance)
        self.duration = {kind: [float(v) for v in duration[k]] for k, kind in enumerate("FIW")}
        self.send_forward = [float(v) for v in send_forward]
        self.send_backward = [float(v) for v in send_backward]
        self.activation = [float(v) for v in activation]
        self.room = [float(v) for v in room]
        self.count = {kind: [0] * p for kind in "FIW"}
        self.free_at = [0.0] * p
        self.idle = [0.0] * p
        self.memory = [0.0] * p
        self.end = {}
        self.orders = [[] for _ in range(p)]

    def change(self, kind, stage):
        """Memory ``kind`` adds on ``stage`` (negative: frees)."""
        activation = self.activation[stage]
        if kind == "F":
            return activation
        if kind == "I":
            return -self.release * activation
        return -(1.0 - self.release) * activation

    def fits(self, stage, amount):
        room = self.room[stage]
        return self.memory[stage] + amount <= room + self.tolerance * max(1.0, abs(room))

    def arrival(self, kind, stage, microbatch):
        """When the input of ``kind`` of ``microbatch`` on ``stage`` reaches its device."""
        try:
            if kind == "F" and stage > 0:
                return self.end["F", stage - 1, microbatch] + self.send_forward[stage - 1]
            if kind == "I" and stage + 1 < self.num_stages:
                return self.end["I", stage + 1, microbatch] + self.send_backward[stage]
        except KeyError:
            raise _ZBPlacementError(f"{kind} {microbatch} on stage {stage} before its "
                                    f"input") from None
        return 0.0

    def put(self, stage, kind):
        microbatch = self.count[kind][stage]
        if kind in "FI" and microbatch >= self.microbatches or \
                kind == "W" and microbatch >= self.count["I"][stage]:
            raise _ZBPlacementError(f"{kind} {microbatch} on stage {stage} with none left")
        if not self.fits(stage, self.change(kind, stage)):
            raise _ZBPlacementError(f"overran the memory of stage {stage}")
        start = max(self.free_at[stage], self.arrival(kind, stage, microbatch))
        if self.orders[stage]:
            self.idle[stage] += start - self.free_at[stage]
        end = start + self.duration[kind][stage]
        self.end[kind, stage, microbatch] = self.free_at[stage] = end
        self.memory[stage] += self.change(kind, stage)
        self.count[kind][stage] += 1
        self.orders[stage].append((kind, microbatch))

    def pending_weights(self, stage):
        return self.count["I"][stage] - self.count["W"][stage]

    def make_room(self, stage, amount):
        """Run ``W`` s until ``amount`` more memory fits on ``stage``."""
        while not self.fits(stage, amount):
            if not self.pending_weights(stage):
                raise _ZBPlacementError(f"no W to free memory on stage {stage}")
            self.put(stage, "W")

    def fill_weights(self, stage, arrival, greedy):
        """``W`` s into the wait for an input arriving at ``arrival``."""
        weight = self.duration["W"][stage]
        while self.pending_weights(stage) and self.free_at[stage] + weight <= arrival:
            self.put(stage, "W")
        gap = arrival - self.free_at[stage]
        if self.pending_weights(stage) and gap > 0:
            grows_largest = gap > max(self.idle) - self.idle[stage]
            if grows_largest or greedy:
                self.put(stage, "W")

    def warm_up(self, delay_first_backward):
        """Microbatch 0 everywhere, the extra warm-up forwards, then I of microbatch 0."""
        m, p = self.microbatches, self.num_stages
        for stage in range(p):
            self.put(stage, "F")
        extra = [0] * p
        gradient_end = self.end["F", p - 1, 0] + self.duration["I"][p - 1]
        for stage in range(p - 2, -1, -1):
            arrival = gradient_end + self.send_backward[stage]
            memory, clock = self.memory[stage], self.free_at[stage]
            activation, forward = self.activation[stage], self.duration["F"][stage]
            room = self.room[stage] + self.tolerance * max(1.0, self.room[stage])
            while self.count["F"][stage] + extra[stage] < m and memory + activation <= room:
                if delay_first_backward and clock >= arrival:
                    break
                if not delay_first_backward and clock + forward > arrival:
                    break
                memory += activation
                clock += forward
                extra[stage] += 1
            gradient_end = max(clock, arrival) + self.duration["I"][stage]
        for stage in range(1, p):
            previous = self.count["F"][stage - 1] + extra[stage - 1]
            # a stage stays at least one forward behind the previous one (the paper's
            # step 3) unless forwards run out; never ahead of it
            cap = previous if previous >= m else previous - 1
            extra[stage] = max(0, min(extra[stage], cap - self.count["F"][stage]))
        for stage in range(p):
            for _ in range(extra[stage]):
                self.put(stage, "F")
        for stage in range(p - 1, -1, -1):
            self.put(stage, "I")

    def wants_forward(self, stage, skip_forward):
        """Whether ``stage`` runs its next forward in this round."""
        count, duration = self.count, self.duration
        if count["F"][stage] >= self.microbatches:
            return False
        if not (skip_forward and stage + 1 < self.num_stages
                and count["F"][stage] >= count["F"][stage + 1] + 2):
            return True
        nxt = stage + 1
        horizon = (self.free_at[nxt] + duration["F"][nxt] + duration["I"][nxt]
                   + self.send_backward[stage])
        if self.free_at[stage] >= horizon:
            return False
        # the W's the forward would need first to fit in memory
        memory = self.memory[stage] + self.change("F", stage)
        weights, pending = 0.0, self.pending_weights(stage)
        while not self.fits(stage, memory - self.memory[stage]) and pending:
            memory += self.change("W", stage)
            weights += duration["W"][stage]
            pending -= 1
        if self.free_at[stage] + duration["F"][stage] + weights <= horizon:
            return True
        gap = horizon - self.free_at[stage]
        return gap > max(self.idle) - self.idle[stage]

    def steady(self, microbatch, skip_forward, greedy_weights):
        """One round: a forward on each stage that wants one, then I of ``microbatch``."""
        p = self.num_stages
        wanted = [self.wants_forward(stage, skip_forward) for stage in range(p)]
        for stage in range(p - 2, -1, -1):
            wanted[stage] = wanted[stage] and wanted[stage + 1]
        for stage in range(p):
            if not wanted[stage]:
                continue
            self.make_room(stage, self.change("F", stage))
            if stage > 0:
                self.fill_weights(stage, self.arrival("F", stage, self.count["F"][stage]),
                                  greedy_weights)
            self.put(stage, "F")
        for stage in range(p - 1, -1, -1):
            if stage + 1 < p:
                self.fill_weights(stage, self.arrival("I", stage, microbatch), greedy_weights)
            if stage == 0 and self.count["F"][0] >= self.microbatches:
                while self.pending_weights(0):
                    self.put(0, "W")
            self.put(stage, "I")

    def span(self):
        """The paper's cost: the longest time from a stage's first op to its last."""
        spans = []
        for stage, order in enumerate(self.orders):
            kind, microbatch = order[0]
            first_start = self.end[kind, stage, microbatch] - self.duration[kind][stage]
            spans.append(self.free_at[stage] - first_start)
        return max(spans)

    def run(self, delay_first_backward, skip_forward, greedy_weights):
        self.warm_up(delay_first_backward)
        for microbatch in range(1, self.microbatches):
            self.steady(microbatch, skip_forward, greedy_weights)
        for stage in range(self.num_stages):
            while self.pending_weights(stage):
                self.put(stage, "W")
        return self


class _ZBPlacementError(Exception):
    """The heuristic placed an operation it could not (an internal error)."""


def zb_heuristic_run(duration, send_forward, send_backward, activation, release, room,
                     tolerance, microbatches, delay_first_backward, skip_forward,
                     greedy_weights, order_kind, order_microbatch, order_length, span):
    """Twin of ``tabsched._build.zb_heuristic_run``: :class:`ZBPlanner` run, its orders
    written as the compiled run writes them."""
    from tabsched._build import PLACEMENT_ERROR
    from tabsched.table import FORWARD, INPUT_GRAD, WEIGHT_GRAD
    planner = ZBPlanner(duration, send_forward, send_backward, activation, release, room,
                        tolerance, microbatches)
    try:
        planner.run(delay_first_backward, skip_forward, greedy_weights)
    except _ZBPlacementError:
        return PLACEMENT_ERROR
    codes = {"F": FORWARD, "I": INPUT_GRAD, "W": WEIGHT_GRAD}
    per_stage = 3 * microbatches
    for stage, order in enumerate(planner.orders):
        order_length[stage] = len(order)
        for position, (kind, microbatch) in enumerate(order):
            order_kind[stage * per_stage + position] = codes[kind]
            order_microbatch[stage * per_stage + position] = microbatch
    span[0] = planner.span()
    return OK


# ------------------------------------------------------------ a schedule CSV's cells
_PLAIN_CELL = re.compile(rb"([0-9]{1,9})([A-Z_]+)([0-9]{0,9})")


def scan_cells(text, row, column, word, stage, microbatch):
    """Twin of ``tabsched._csv_cells.scan_cells``: lines split at ``\\n``, cells at ``,``,
    each cell matched by a regular expression."""
    from tabsched._csv_cells import LONGEST_OTHER, NOT_PLAIN, OTHER, WORDS
    text = bytes(text)
    capacity = len(row)
    if (any(len(array) != capacity for array in (column, word, stage, microbatch))
            or len(text) > 2**31 - 1 or capacity < text.count(b",") + text.count(b"\n") + 1):
        return -1 - BAD_SHAPE
    if b'"' in text or re.search(rb"\r(?!\n)", text):
        return -1 - NOT_PLAIN
    lines, begin = [], 0       # (first byte, end byte) of each line, without its ending
    while begin < len(text):
        feed = text.find(b"\n", begin)
        end = len(text) if feed < 0 else feed
        lines.append((begin, end - 1 if end > begin and text[end - 1] == 13 else end))
        if feed < 0:
            break
        begin = feed + 1
    while lines and lines[-1][0] == lines[-1][1]:
        lines.pop()
    if any(first == end for first, end in lines):
        return -1 - NOT_PLAIN
    codes = {name: code for code, name in enumerate(WORDS) if name}
    count = 0
    for line, (first, end) in enumerate(lines):
        for place, cell in enumerate(text[first:end].split(b",")):
            row[count], column[count] = line, place
            stage[count] = microbatch[count] = -1
            match = _PLAIN_CELL.fullmatch(cell)
            code = codes.get(match[2].decode(), OTHER) if match else OTHER
            takes_microbatch = code < codes["UNSHARD"]
            if match and code != OTHER and bool(match[3]) == takes_microbatch:
                stage[count] = int(match[1])
                if takes_microbatch:
                    microbatch[count] = int(match[3])
            elif cell:
                if len(cell) > LONGEST_OTHER:
                    return -1 - NOT_PLAIN
                code = OTHER
                stage[count], microbatch[count] = first, first + len(cell)
            else:
                code = 0
            word[count] = code
            count += 1
            first += len(cell) + 1
    return count
