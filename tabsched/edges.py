"""The edges and resources of a lowering, group by group (:func:`tabsched.lower.lower`).

Each function returns what one rule of the lowering adds, vectorised over
operations: the data dependencies between operations (:func:`dependencies`,
compiled in ``tabsched._build``), the ``transfer_after`` edges of a schedule that
places its communication itself (:func:`transfer_after_edges`), the tail's
gradient-sync nodes and their edges (:func:`sync_nodes`, the devices holding each
stage: :func:`stage_holders`) and the edges into the optimizer steps
(:func:`optimizer_edges`), and every node's resources under a contention mode
(:func:`node_resources`). An edge group is ``(sources, targets)``, int32, each
source at most once in a group (the CSR fill keeps the order of groups).
"""

import numpy as np

from tabsched import _build, engine
from tabsched.exceptions import InvalidParameterError, TabschedError
from tabsched.table import BACKWARD, WEIGHT_GRAD

__all__ = ["dependencies", "transfer_after_edges", "distinct_groups", "stage_holders",
           "sync_nodes", "optimizer_edges", "node_resources"]

INDEX = np.int32


def dependencies(table):
    """``(producer, consumer, gradient, crossing)`` arrays of every data dependency,
    group by group (activation, own forward, input gradient, W after I), each
    group in the consumer's order (``_build.dependencies``); ``crossing`` marks those
    between two devices."""
    S, M = table.num_stages, table.num_microbatches
    num_ops = len(table)
    pairs = S * M
    limit = int(np.iinfo(INDEX).max)
    if pairs > limit or 2 * num_ops > limit:
        raise InvalidParameterError(f"the table has {S} stages x {M} microbatches and "
                                    f"{num_ops} operations; the kernel's int32 ids hold at "
                                    f"most {limit}")
    producer = np.empty(2 * num_ops, dtype=INDEX)
    consumer = np.empty(2 * num_ops, dtype=INDEX)
    group = np.empty(2 * num_ops, dtype=np.int8)
    crossing = np.empty(2 * num_ops, dtype=np.int8)
    count = _build.dependencies(table.kind, table.stage, table.microbatch, table.device, S, M,
                                np.empty(pairs, INDEX), np.empty(pairs, INDEX),
                                np.empty(pairs, INDEX), producer, consumer, group, crossing)
    if count < 0:
        raise TabschedError("internal error: lowering met a dependency the table lacks "
                            "(tables validate when built; please report this)")
    return (producer[:count], consumer[:count], group[:count] != _build.ACTIVATION,
            crossing[:count].view(bool))


def transfer_after_edges(transfer_after, tr_producer, cell_of_op, num_cells):
    """Edge groups (each with distinct sources) for ``lower``'s ``transfer_after``."""
    try:
        producer, after = (np.asarray(array, dtype=np.int64).ravel() for array in transfer_after)
    except (TypeError, ValueError):
        raise InvalidParameterError("transfer_after must be a pair of integer arrays "
                                    "(producer, after)") from None
    if len(producer) != len(after):
        raise InvalidParameterError(f"transfer_after: {len(producer)} producers but "
                                    f"{len(after)} predecessors")
    num_ops = len(cell_of_op)
    transfer_of = np.full(num_ops, -1, dtype=np.int64)
    transfer_of[tr_producer] = num_cells + np.arange(len(tr_producer))
    carried = np.where(after < 0, -1 - after, 0)
    bad = np.flatnonzero((producer < 0) | (producer >= num_ops) | (after >= num_ops)
                         | (carried >= num_ops))
    if len(bad):
        k = int(bad[0])
        raise InvalidParameterError(f"transfer_after[{k}]: ({producer[k]}, {after[k]}) names "
                                    f"an operation the table does not have")
    targets = transfer_of[producer]
    sources = np.where(after >= 0, cell_of_op[np.maximum(after, 0)], transfer_of[carried])
    bad = np.flatnonzero((targets < 0) | (sources < 0))
    if len(bad):
        k = int(bad[0])
        op = int(producer[k]) if targets[k] < 0 else int(carried[k])
        raise InvalidParameterError(f"transfer_after[{k}]: operation {op} sends nothing to "
                                    f"another device")
    return distinct_groups(sources, targets)


def distinct_groups(sources, targets):
    """Edges ``sources -> targets`` as groups in which every source appears once (the CSR
    fill needs that): the k-th edge of a source goes to group k, in the edges' order."""
    sources = np.asarray(sources, dtype=np.int64)
    targets = np.asarray(targets, dtype=np.int64)
    if not len(sources):
        return []
    order = np.argsort(sources, kind="stable")
    sources, targets = sources[order], targets[order]
    first = np.ones(len(sources), dtype=bool)
    first[1:] = sources[1:] != sources[:-1]
    position = np.arange(len(sources))
    rank = position - np.maximum.accumulate(np.where(first, position, 0))
    return [(sources[rank == r].astype(INDEX), targets[rank == r].astype(INDEX))
            for r in range(int(rank.max()) + 1)]


def stage_holders(table):
    """Sorted devices holding each stage."""
    # the (stage, device) pairs, sorted and each once (np.unique's answer, without the
    # numpy.ma import that np.unique costs the first time it is called without indices)
    pairs = np.sort(table.stage.astype(np.int64) * table.num_devices + table.device)
    pairs = pairs[np.concatenate([[True], pairs[1:] != pairs[:-1]])] if len(pairs) else pairs
    holders = {stage: [] for stage in range(table.num_stages)}
    for pair in pairs.tolist():
        holders[pair // table.num_devices].append(pair % table.num_devices)
    return holders


def optimizer_edges(table, cell_device, sync_stage, first_sync, first_optimizer):
    """Edge groups into the optimizer steps (one per device from ``first_optimizer``):
    each device's last cell, and each sync node (from ``first_sync``) into the step of
    every device holding its stage, one group per replica rank (each source once)."""
    D = table.num_devices
    groups = []
    bounds = np.searchsorted(cell_device, np.arange(D + 1, dtype=INDEX))
    busy = np.flatnonzero(bounds[1:] > bounds[:-1]).astype(INDEX)
    groups.append(((bounds[1:][busy] - 1).astype(INDEX), first_optimizer + busy))
    holders = stage_holders(table)
    rank = 0
    while True:
        sources, targets = [], []
        for k, stage in enumerate(sync_stage):
            devices = holders[int(stage)]
            if rank < len(devices):
                sources.append(first_sync + k)
                targets.append(first_optimizer + devices[rank])
        if not sources:
            break
        groups.append((np.array(sources, dtype=INDEX), np.array(targets, dtype=INDEX)))
        rank += 1
    return groups


def sync_nodes(table, grad_sync, cell_of_op, first_id):
    """Stages that get a sync node, and the edges into those nodes."""
    empty = np.empty(0, dtype=INDEX)
    if grad_sync is None or grad_sync is False:
        return empty, []
    if isinstance(grad_sync, np.ndarray):   # a comparison with text would be elementwise
        grad_sync = grad_sync.tolist()
    holders = stage_holders(table)
    S = table.num_stages
    if grad_sync == "replicas":
        stages = [stage for stage in range(S) if len(holders[stage]) >= 2]
    elif grad_sync == "all" or grad_sync is True:
        stages = list(range(S))
    else:
        try:
            stages = sorted({int(stage) for stage in grad_sync})
        except (TypeError, ValueError):
            raise InvalidParameterError(
                f"grad_sync must be None, 'replicas', 'all' or a list of stages, "
                f"not {grad_sync!r}") from None
        bad = [stage for stage in stages if not 0 <= stage < S]
        if bad:
            raise InvalidParameterError(f"grad_sync: stage {bad[0]} is out of range "
                                        f"(the table has stages 0..{S - 1})")
    sync_stage = np.array(stages, dtype=INDEX)
    if not stages:
        return sync_stage, []
    D = table.num_devices
    node_of_stage = np.full(S, -1, dtype=np.int64)
    node_of_stage[sync_stage] = first_id + np.arange(len(stages))
    # the last B or W (in row order) of each (stage, device) pair
    backward = np.flatnonzero((table.kind == BACKWARD) | (table.kind == WEIGHT_GRAD))
    key = table.stage[backward].astype(np.int64) * D + table.device[backward]
    last = np.full(S * D, -1, dtype=np.int64)
    np.maximum.at(last, key, backward)
    pairs = np.flatnonzero((last >= 0) & (node_of_stage[np.arange(S * D) // D] >= 0))
    sources = cell_of_op[last[pairs]].astype(INDEX)
    targets = node_of_stage[pairs // D].astype(INDEX)
    return sync_stage, [(sources, targets)]


def node_resources(contention, num_nodes, rows, transfers, num_devices, devices_per_node):
    """Each node's resources: the transfers' (at ``rows``) links and ports; no other
    node holds one."""
    if contention == "none":
        return np.empty((num_nodes, 0), dtype=INDEX), 0
    link = transfers.src.astype(np.int64) * num_devices + transfers.dst
    num_links = num_devices * num_devices
    if contention == "link":
        resources = np.full((num_nodes, 1), engine.NO_RESOURCE, dtype=INDEX)
        resources[rows, 0] = link
        return resources, num_links
    num_machines = -(-num_devices // devices_per_node)
    src_node = transfers.src // devices_per_node
    dst_node = transfers.dst // devices_per_node
    between = src_node != dst_node
    resources = np.full((num_nodes, 3), engine.NO_RESOURCE, dtype=INDEX)
    resources[rows, 0] = link
    resources[rows, 1] = np.where(between, num_links + src_node, engine.NO_RESOURCE)
    resources[rows, 2] = np.where(between, num_links + num_machines + dst_node,
                                  engine.NO_RESOURCE)
    return resources, num_links + 2 * num_machines
