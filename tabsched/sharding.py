"""Sharded data parallelism in the lowering: ZeRO-2/3 and FSDP as UNSHARD, RESHARD and
REDUCE_GRAD nodes.

With ZeRO (Rajbhandari et al. 2020, section 5) the state of every pipeline rank is
divided over its data-parallel group of ``d`` replicas. Stage 2 shards the
gradients: each device reduce-scatters a stage's gradients after its last backward
of that stage (``REDUCE_GRAD``) and keeps ``1/d`` of them. Stage 3 (PyTorch FSDP's
``FULL_SHARD``, FSDP2's ``fully_shard``) shards the parameters too: before a device
uses a stage it all-gathers the stage's parameters (``UNSHARD``) and after its last
use it frees them (``RESHARD``). The names and their places are PyTorch pipelining's
(torch/distributed/pipelining/schedules.py: ``_ComputationType`` UNSHARD, RESHARD,
REDUCE_GRAD; ``_add_unshard_reshard`` fetches a stage before the actions that use it
and frees it after, ``_add_reduce_grad`` reduces after a stage's last backward).

Windows
    A device uses stage ``s`` from its first operation of ``s`` to its last: one
    *window*, one UNSHARD before it and one RESHARD after it. With
    ``reshard_after_forward`` (FSDP2's default) a stage whose forwards all come
    before its first backward (GPipe) has two windows: its forwards, then its
    backwards, gathered again. Where forwards and backwards interleave (1F1B's
    steady state) the stage stays gathered, as FSDP cannot free what the next
    operation needs.
Edges
    The UNSHARD of a window starting at the device's ``k``-th operation may start
    when operation ``k - 1 - prefetch`` ends (``prefetch = 0``: the all-gather
    starts when the operation before the window ends and is exposed; 1: it runs
    beside that operation, FSDP's one-ahead prefetch), and not before the end of
    the stage's earlier window (it gathers what that one freed); the window's
    first operation waits for it. A device's UNSHARDs run one after another in window
    order on its all-gather stream, its REDUCE_GRADs one after another on its
    reduce-scatter stream (FSDP2 keeps one stream for each: ``FSDPCommContext`` in
    torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py); neither holds the
    compute stream. A RESHARD follows its window's last operation and lasts 0. The
    optimizer step of a device waits for its REDUCE_GRADs.
Memory (:func:`shard_memory_events`)
    A window holds the stage's gathered parameters from its UNSHARD's start (the
    all-gather's output buffer) to its RESHARD's end; the full gradients of a stage
    are held from the device's first backward of it to the end of its REDUCE_GRAD.
    What stays all the time (``1/d`` of what is sharded) is the cost model's
    persistent memory.

Node ids follow :mod:`tabsched.nodes`: the UNSHARDs, then the RESHARDs (RESHARD
``k`` frees the gather of UNSHARD ``k``), then the REDUCE_GRADs, after the
optimizer steps; each kind device by device, in the order its stream runs them. Sharding options are ``(zero_stage, reshard_after_forward,
prefetch)`` (:attr:`tabsched.execution.Execution.sharding`).

>>> from tabsched import generate, lower
>>> from tabsched.nodes import UNSHARD, REDUCE_GRAD
>>> lowered = lower(generate("gpipe", devices=2, microbatches=2), sharding=(3, True, 0))
>>> lowered.count(UNSHARD), lowered.count(REDUCE_GRAD)
(4, 2)
>>> [lowered.describe_node(node) for node in lowered.node_ids(UNSHARD)]
['unshard stage 0 d0', 'unshard stage 0 d0', 'unshard stage 1 d1', 'unshard stage 1 d1']
"""

from dataclasses import dataclass

import numpy as np

from tabsched.edges import distinct_groups
from tabsched.exceptions import InvalidParameterError
from tabsched.table import BACKWARD, FORWARD, INPUT_GRAD, WEIGHT_GRAD

__all__ = ["ShardNodes", "shard_nodes", "check_sharding", "shard_memory_events",
           "gathered_at_once", "gathered_note"]

INDEX = np.int32


@dataclass(frozen=True, eq=False)
class ShardNodes:
    """The sharding nodes of a lowering, one entry per node of each kind.

    ``unshard_device``, ``unshard_stage``, ``window_first``, ``window_last`` (cell
    ids) describe UNSHARD ``k`` and its RESHARD ``k``; ``reduce_device``,
    ``reduce_stage`` and ``reduce_first_backward`` (the cell of the device's first
    backward of the stage) each REDUCE_GRAD.
    """

    zero_stage: int
    unshard_device: np.ndarray
    unshard_stage: np.ndarray
    window_first: np.ndarray
    window_last: np.ndarray
    reduce_device: np.ndarray
    reduce_stage: np.ndarray
    reduce_first_backward: np.ndarray

    def describe(self, kind, index):
        """``"unshard stage 3 d1"``: the label of the ``index``-th node of ``kind``."""
        if kind.label == "reduce-grad":
            return f"reduce-grad stage {int(self.reduce_stage[index])} " \
                f"d{int(self.reduce_device[index])}"
        return f"{kind.label} stage {int(self.unshard_stage[index])} " \
            f"d{int(self.unshard_device[index])}"


def check_sharding(sharding):
    """``(zero_stage, reshard_after_forward, prefetch)`` checked, or None."""
    if sharding is None:
        return None
    try:
        zero, reshard, prefetch = sharding
    except (TypeError, ValueError):
        raise InvalidParameterError(f"sharding must be (zero_stage, reshard_after_forward, "
                                    f"prefetch), not {sharding!r}") from None
    if zero not in (2, 3):
        raise InvalidParameterError(f"sharding: zero_stage {zero!r} lowers no sharding node "
                                    f"(2 or 3)")
    if isinstance(prefetch, bool) or not isinstance(prefetch, (int, np.integer)) \
            or prefetch < 0:
        raise InvalidParameterError(f"sharding: prefetch must be an integer >= 0, not "
                                    f"{prefetch!r}")
    return int(zero), bool(reshard), int(prefetch)


def _chain(devices, keys, ids):
    """Edges from each node to the next of its device in ``keys`` order."""
    order = np.lexsort((ids, keys, devices))
    same = devices[order][1:] == devices[order][:-1]
    return ids[order][:-1][same], ids[order][1:][same]


def _pair_extremes(pair, cell, mask, pairs):
    """First and last cell of each (device, stage) pair among the operations ``mask``
    (``-1`` where the pair has none)."""
    first = np.full(pairs, np.iinfo(np.int64).max, dtype=np.int64)
    last = np.full(pairs, -1, dtype=np.int64)
    np.minimum.at(first, pair[mask], cell[mask])
    np.maximum.at(last, pair[mask], cell[mask])
    first[last < 0] = -1
    return first, last


def shard_nodes(table, sharding, cell_of_op, cell_device, first_id, first_optimizer=None,
                windows=None):
    """``(ShardNodes, (unshards, reshards, reduces), edge groups)`` for ``lower``.

    ``first_id`` is the id of the first UNSHARD; ``first_optimizer`` that of the
    first optimizer step (None: no step); ``windows``: ZeRO-3's windows as a file
    places them, ``(stage, issue, first, last)`` operation indices (``issue``
    ``-1``: the all-gather starts at once), instead of the ones found here.
    """
    zero, reshard, prefetch = sharding
    D, S = table.num_devices, table.num_stages
    pairs = D * S
    pair = table.device.astype(np.int64) * S + table.stage
    _refuse_replicated_stages(pair, D, S, zero)
    cell = cell_of_op.astype(np.int64)
    kind = table.kind
    is_forward = kind == FORWARD
    is_backward = (kind == BACKWARD) | (kind == INPUT_GRAD) | (kind == WEIGHT_GRAD)
    first_f, last_f = _pair_extremes(pair, cell, is_forward, pairs)
    first_b, last_b = _pair_extremes(pair, cell, is_backward, pairs)
    used = np.flatnonzero((last_f >= 0) | (last_b >= 0))
    # REDUCE_GRAD: after the last B or W (the last backward that writes weight grads)
    weights = (kind == BACKWARD) | (kind == WEIGHT_GRAD)
    _, last_w = _pair_extremes(pair, cell, weights, pairs)
    reduced = np.flatnonzero(last_w >= 0)
    # numbered in the order each device's reduce-scatter stream runs them
    reduced = reduced[np.lexsort((last_w[reduced], reduced // S))]
    if zero >= 3 and windows is not None:
        win_pair, win_first, win_last, issue = _given_windows(table, windows, cell)
        order = np.lexsort((win_pair, win_first, win_pair // S))
        win_pair, win_first, win_last, issue = (win_pair[order], win_first[order],
                                                win_last[order], issue[order])
    elif zero >= 3:
        both = (last_f >= 0) & (first_b >= 0)
        split = (both & reshard & (last_f < first_b))[used]
        anywhere_first = np.where(first_f[used] >= 0, first_f[used], first_b[used])
        anywhere_last = np.maximum(last_f[used], last_b[used])
        win_pair = np.concatenate([used, used[split]])
        win_first = np.concatenate([np.where(split, first_f[used], anywhere_first),
                                    first_b[used][split]])
        win_last = np.concatenate([np.where(split, last_f[used], anywhere_last),
                                   last_b[used][split]])
        # a backward window's all-gather starts after the forward window it follows
        floor = np.concatenate([np.full(len(used), -1, dtype=np.int64), last_f[used][split]])
        order = np.lexsort((win_pair, win_first, win_pair // S))
        win_pair, win_first, win_last, floor = (win_pair[order], win_first[order],
                                                win_last[order], floor[order])
        issue = np.maximum(win_first - 1 - prefetch, floor)
    else:
        win_pair = win_first = win_last = issue = np.empty(0, dtype=np.int64)
    U, R = len(win_pair), len(reduced)
    unshard = first_id + np.arange(U, dtype=np.int64)
    reshard_ids = first_id + U + np.arange(U, dtype=np.int64)
    reduce_ids = first_id + 2 * U + np.arange(R, dtype=np.int64)
    groups = []
    if U:
        device = win_pair // S
        row_first = np.searchsorted(cell_device, device)        # the device's first cell
        early = issue >= row_first
        groups.extend(distinct_groups(issue[early], unshard[early]))
        groups.append((unshard.astype(INDEX), win_first.astype(INDEX)))
        groups.append(tuple(array.astype(INDEX) for array in _chain(device, win_first,
                                                                     unshard)))
        groups.extend(distinct_groups(win_last, reshard_ids))
    if R:
        device = reduced // S
        groups.extend(distinct_groups(last_w[reduced], reduce_ids))
        groups.append(tuple(array.astype(INDEX) for array in _chain(device, last_w[reduced],
                                                                     reduce_ids)))
        if first_optimizer is not None:
            groups.append((reduce_ids.astype(INDEX), (first_optimizer + device).astype(INDEX)))
    first_backward = np.where(first_b[reduced] >= 0, first_b[reduced], last_w[reduced])
    nodes = ShardNodes(zero_stage=zero,
                       unshard_device=(win_pair // S).astype(INDEX),
                       unshard_stage=(win_pair % S).astype(INDEX),
                       window_first=win_first.astype(INDEX), window_last=win_last.astype(INDEX),
                       reduce_device=(reduced // S).astype(INDEX),
                       reduce_stage=(reduced % S).astype(INDEX),
                       reduce_first_backward=first_backward.astype(INDEX))
    for array in vars(nodes).values():
        if isinstance(array, np.ndarray):
            array.flags.writeable = False
    return nodes, (U, U, R), groups


def _given_windows(table, windows, cell):
    """``(pair, first, last, issue)`` cells of windows given as operation indices."""
    try:
        stage, issue, first, last = (np.asarray(column, dtype=np.int64).ravel()
                                     for column in windows)
    except (TypeError, ValueError):
        raise InvalidParameterError("shard_windows must be four integer arrays (stage, issue, "
                                    "first, last)") from None
    num_ops = len(table)
    bad = np.flatnonzero((first < 0) | (first >= num_ops) | (last < first)
                         | (last >= num_ops) | (issue < -1) | (issue >= first))
    if len(stage) != len(first) or len(issue) != len(first) or len(last) != len(first):
        raise InvalidParameterError("shard_windows: the four arrays differ in length")
    if len(bad) == 0:
        device = table.device[first].astype(np.int64)
        bad = np.flatnonzero((table.device[last] != device) | (table.stage[first] != stage)
                             | ((issue >= 0) & (table.device[np.maximum(issue, 0)] != device)))
    if len(bad):
        k = int(bad[0])
        raise InvalidParameterError(f"shard_windows[{k}]: stage {stage[k]}, operations "
                                    f"{issue[k]}, {first[k]}..{last[k]} are not a window of "
                                    f"one device's operations of that stage")
    pair = device * table.num_stages + stage
    return pair, cell[first], cell[last], np.where(issue >= 0, cell[np.maximum(issue, 0)], -1)


def _refuse_replicated_stages(pair, num_devices, num_stages, zero):
    """ZeRO shards a stage over the data-parallel group of the one pipeline rank that
    holds it; a stage on two devices of the table (Chimera's replicas) would need its
    shards and gradients reduced across both groups, which no runtime does.
    ``pair``: ``device * num_stages + stage`` of every operation."""
    held = np.zeros(num_devices * num_stages, dtype=bool)
    held[pair] = True
    holders = held.reshape(num_devices, num_stages)
    shared = np.flatnonzero(holders.sum(axis=0) > 1)
    if len(shared):
        stage = int(shared[0])
        devices = np.flatnonzero(holders[:, stage]).tolist()
        raise InvalidParameterError(
            f"zero_stage {zero}: stage {stage} runs on devices "
            f"{', '.join(map(str, devices[:4]))}{', ...' if len(devices) > 4 else ''} "
            f"(replicas inside the pipeline); ZeRO-2/3 shard a stage over the "
            f"data-parallel group of the one device that holds it (use zero_stage 0 or 1)")


def gathered_at_once(lowered):
    """Per device, the most stages whose parameters ZeRO-3 holds gathered at the same
    time (windows that overlap in row order; 0 without UNSHARD nodes)."""
    nodes = lowered.sharding
    devices = lowered.table.num_devices
    most = np.zeros(devices, dtype=np.int64)
    if nodes is None or not len(nodes.unshard_device):
        return most
    # +1 at a window's first cell, -1 after its last: the running sum, device by device
    device = np.concatenate([nodes.unshard_device, nodes.unshard_device]).astype(np.int64)
    where = np.concatenate([nodes.window_first, nodes.window_last + 0.5])
    step = np.concatenate([np.ones(len(nodes.unshard_device)),
                           -np.ones(len(nodes.unshard_device))])
    order = np.lexsort((step, where, device))
    device, step = device[order], step[order]
    running = np.cumsum(step)
    np.maximum.at(most, device, running.astype(np.int64))
    return most


def gathered_note(lowered):
    """A result's note when ZeRO-3 holds several stages gathered at once on a device
    (interleaved and V-shaped schedules: their chunks alternate), else None."""
    most = gathered_at_once(lowered)
    if not len(most) or most.max() <= 1:
        return None
    device = int(np.argmax(most))
    return (f"ZeRO-3 holds up to {int(most[device])} stages' parameters gathered at once "
            f"(device {device}): the schedule alternates its chunks, so their all-gathers "
            f"cannot free them in between")


def shard_memory_events(lowered, device, node_start, node_durations, gathered, gradients):
    """``(times, deltas)`` of what sharding holds on ``device`` beyond its persistent
    memory, unsorted: ``gathered[stage]`` bytes from each of its UNSHARDs' start to
    its RESHARD's end, ``gradients[stage]`` from the first backward of the stage to
    the end of its REDUCE_GRAD (zero deltas dropped)."""
    from tabsched.nodes import REDUCE_GRAD, RESHARD, UNSHARD
    nodes = lowered.sharding
    if nodes is None:
        return np.empty(0), np.empty(0)
    gathered = np.asarray(gathered, dtype=np.float64)
    gradients = np.asarray(gradients, dtype=np.float64)
    mine = np.flatnonzero(nodes.unshard_device == device)
    unshard = lowered.nodes(UNSHARD).start + mine
    reshard = lowered.nodes(RESHARD).start + mine
    held = gathered[nodes.unshard_stage[mine]]
    mine_r = np.flatnonzero(nodes.reduce_device == device)
    reduce = lowered.nodes(REDUCE_GRAD).start + mine_r
    backward = nodes.reduce_first_backward[mine_r]
    grads = gradients[nodes.reduce_stage[mine_r]]
    times = np.concatenate([node_start[unshard], node_start[reshard] + node_durations[reshard],
                            node_start[backward],
                            node_start[reduce] + node_durations[reduce]])
    deltas = np.concatenate([held, -held, grads, -grads])
    keep = deltas != 0
    return times[keep], deltas[keep]
