"""PyTorch's compute_comms CSV: the communication its runtime executes, read and written.

compute_comms is what PyTorch's runtime executes after lowering a compute_only
schedule: ``UNSHARD``/``RESHARD`` around compute (FSDP), ``REDUCE_GRAD`` after
each stage's last backward, and ``SEND_F``/``RECV_F``/``SEND_B``/``RECV_B`` for
every dependency between ranks; no empty cells. Its cells are read by
:func:`tabsched.cells.parse_torch_token`, its rows by
:func:`tabsched.formats.pytorch_csv.from_pytorch_csv`, which hands the SEND and
RECV cells to :func:`comm_edges`.

Communication
-------------
PyTorch's runtime posts each SEND and RECV without blocking its rank
(``isend``/``irecv``); the compute that needs a RECV waits for it. With NCCL,
point-to-point operations are queued on the rank's communication stream
behind the compute issued before them, and those between one pair of ranks
share one stream, so they run one at a time in the order each rank issues
them. tabsched turns every SEND/RECV pair into the transfer of the dependency
it carries, which starts only after

* the producer ended, and the compute cell before the SEND in the sender's row;
* the compute cell before the RECV in the receiver's row (the RECV is posted);
* with ``p2p="ordered"`` (default), the previous SEND/RECV between the same two
  devices, as both devices list them.

If the two devices of a pair list their transfers in different orders, each
waits for the other: a deadlock, reported naming both cells. ``p2p="free"``
drops the third rule (for backends that do not serialise a pair's traffic).
A RECV without its SEND, a RECV after the compute that needs it, a SEND before
the compute whose output it sends, and orders that deadlock with the compute
are errors naming the cells. The table of a compute_comms file holds its
compute cells laid out in unit slots (:func:`unit_layout`); the communication
rides along in :class:`~tabsched.formats.pytorch_csv.TorchSchedule` as the
``transfer_after`` edges of the lowered DAG.

Writing
-------
:func:`to_compute_comms` (:mod:`tabsched.formats.pytorch_lowering`, importable
from here too) lowers a table exactly as PyTorch's ``_PipelineScheduleRuntime``
does (without ``defer_pp_recv``), so the bytes equal PyTorch's
``_dump_csv(format="compute_comms")``.
"""

from collections import defaultdict

import numpy as np

from tabsched.cells import BACKWARD, FORWARD, INPUT_GRAD, Action
from tabsched.edges import dependencies
from tabsched.exceptions import DeadlockError, InvalidScheduleError
from tabsched.formats.cell_arrays import WORD_CODES
from tabsched.formats.pytorch_lowering import to_compute_comms
from tabsched.layout import lay_out
from tabsched.lower import lower
from tabsched.nodes import CELL, TRANSFER

__all__ = ["comm_edges", "explain_comm_edges", "fsdp_windows", "unit_layout", "to_compute_comms"]

_SEND_F, _RECV_F, _SEND_B = (WORD_CODES[word] for word in ("SEND_F", "RECV_F", "SEND_B"))


def _where(source, device, slot):
    return f"{source}: device {device}, slot {slot}"


def _row_ranges(table):
    bounds = np.searchsorted(table.device, np.arange(table.num_devices + 1))
    return [(int(bounds[d]), int(bounds[d + 1])) for d in range(table.num_devices)]


def _comm_partner(cell):
    """``(producer stage, kind letter group, consumer stage, sender side?)`` of a comm cell."""
    kind, stage = cell.kind, cell.stage
    if kind == "SEND_F":
        return stage, "F", stage + 1, True
    if kind == "RECV_F":
        return stage - 1, "F", stage, False
    if kind == "SEND_B":
        return stage, "B", stage - 1, True
    return stage + 1, "B", stage, False


def _partner_text(cell):
    kind, stage, microbatch = cell
    partner_kind = {"SEND_F": "RECV_F", "RECV_F": "SEND_F", "SEND_B": "RECV_B",
                    "RECV_B": "SEND_B"}[kind]
    partner_stage = {"SEND_F": stage + 1, "RECV_F": stage - 1, "SEND_B": stage - 1,
                     "RECV_B": stage + 1}[kind]
    return str(Action(partner_kind, partner_stage, microbatch))


def comm_edges(table, comms, source, p2p):
    """Validate a compute_comms file's SEND/RECV cells; ``transfer_after`` edges for lower().

    ``comms`` are the file's SEND/RECV :class:`~tabsched.formats.cell_arrays.Cells`.
    Every rule is checked at once over the arrays; a file that breaks one, or whose
    order deadlocks, is handed to :func:`explain_comm_edges`, which checks the cells
    one by one and names the first problem. Both give the same edges.
    """
    S, M = table.num_stages, table.num_microbatches
    word = comms.word
    stage = comms.stage.astype(np.int64)
    microbatch = comms.microbatch.astype(np.int64)
    is_send = (word == _SEND_F) | (word == _SEND_B)
    forward = (word == _SEND_F) | (word == _RECV_F)
    producer_stage = np.where(is_send, stage, np.where(forward, stage - 1, stage + 1))
    consumer_stage = np.where(is_send, np.where(forward, stage + 1, stage - 1), stage)
    fine = ((stage >= 0) & (stage < S) & (producer_stage >= 0) & (producer_stage < S)
            & (consumer_stage >= 0) & (consumer_stage < S) & (microbatch >= 0) & (microbatch < M))
    if not fine.all():
        return explain_comm_edges(table, comms.entries(), source, p2p)
    # each (stage, microbatch)'s forward and its B or I (a valid table has both)
    op_of = np.full((2, S * M), -1, dtype=np.int64)
    backward = (table.kind == BACKWARD) | (table.kind == INPUT_GRAD)
    pair = table.stage.astype(np.int64) * M + table.microbatch
    op_of[0, pair[table.kind == FORWARD]] = np.flatnonzero(table.kind == FORWARD)
    op_of[1, pair[backward]] = np.flatnonzero(backward)
    group = (~forward).astype(np.intp)
    producer = op_of[group, producer_stage * M + microbatch]
    consumer = op_of[group, consumer_stage * M + microbatch]
    mine = np.where(is_send, producer, consumer)
    producers, consumers, _, crossing = dependencies(table)
    receiver = np.full(len(table), -1, dtype=np.int64)     # of each transfer's producer
    receiver[producers[crossing]] = consumers[crossing]
    mine_slot = table.slot[mine]
    sides = producer * 2 + is_send
    fine = ((table.device[mine] == comms.device) & (receiver[producer] >= 0)
            & np.where(is_send, mine_slot <= comms.slot, mine_slot >= comms.slot))
    if (not fine.all() or len(sides) != 2 * np.count_nonzero(crossing)
            or len(sides) and np.bincount(sides).max() > 1):
        return explain_comm_edges(table, comms.entries(), source, p2p)

    # what each transfer waits for besides its producer: the compute cell before each side
    starts = table.cell_starts()
    first_op = np.flatnonzero(starts)
    width = max(int(table.slot.max()), int(comms.slot.max(initial=0))) + 2  # keys (device, slot)
    position = np.searchsorted(table.device.astype(np.int64) * width + table.slot,
                               comms.device.astype(np.int64) * width + comms.slot) - 1
    inside = (position >= 0) & (table.device[np.maximum(position, 0)] == comms.device)
    cell_of_op = np.cumsum(starts) - 1
    before = np.where(inside, first_op[cell_of_op[np.maximum(position, 0)]], -1)
    waits = (inside & (before != producer)
             & ~(is_send & (table.slot[np.maximum(before, 0)] == table.slot[producer])))
    producers, afters = [producer[waits]], [before[waits]]
    if p2p == "ordered":
        # the previous SEND/RECV between the same two devices, as both list them
        peer = table.device[np.where(is_send, receiver[producer], producer)].astype(np.int64)
        low, high = np.minimum(comms.device, peer), np.maximum(comms.device, peer)
        pair = low * table.num_devices + high
        # each side's cells by (pair, slot): they are in (device, slot) order already
        queue = [np.flatnonzero(side)[np.argsort(pair[side], kind="stable")]
                 for side in (comms.device < peer, comms.device > peer)]
        if not np.array_equal(producer[queue[0]], producer[queue[1]]):
            return explain_comm_edges(table, comms.entries(), source, p2p)
        mine = queue[0]
        follows = pair[mine][1:] == pair[mine][:-1]
        producers.append(producer[mine][1:][follows])
        afters.append(-1 - producer[mine][:-1][follows])
    transfer_after = (np.concatenate(producers).astype(np.int64),
                      np.concatenate(afters).astype(np.int64))
    try:
        _run_unit(table, transfer_after)
    except DeadlockError:
        return explain_comm_edges(table, comms.entries(), source, p2p)
    return transfer_after


def explain_comm_edges(table, comms, source, p2p):
    """:func:`comm_edges` cell by cell over ``(device, slot, Action)`` entries: the first
    problem named, or the same edges."""
    S, M = table.num_stages, table.num_microbatches
    forward_of, backward_of = {}, {}
    for index in range(len(table)):
        kind = int(table.kind[index])
        key = (int(table.stage[index]), int(table.microbatch[index]))
        if kind == FORWARD:
            forward_of[key] = index
        elif kind in (BACKWARD, INPUT_GRAD):
            backward_of[key] = index
    lowered = lower(table)
    transfer_of = {int(producer): (int(producer), int(consumer)) for producer, consumer
                   in zip(lowered.transfers.producer, lowered.transfers.consumer)}

    def op_text(index):
        return str(table.op(index))

    problems = []   # ((device, slot), message)
    sides = {}      # (producer, is_send) -> (device, slot, cell)
    for device, slot, cell in comms:
        here = _where(source, device, slot)
        producer_stage, group, consumer_stage, is_send = _comm_partner(cell)
        microbatch = cell.microbatch
        if not 0 <= cell.stage < S:
            problems.append(((device, slot), f"{here}: {cell}: stage {cell.stage} is out of "
                                             f"range (the table has stages 0..{S - 1})"))
            continue
        if not (0 <= producer_stage < S and 0 <= consumer_stage < S):
            edge = "first" if min(producer_stage, consumer_stage) < 0 else "last"
            problems.append(((device, slot), f"{here}: {cell}: stage {cell.stage} is the "
                                             f"{edge} stage; there is no neighbour to "
                                             f"{'send to' if is_send else 'receive from'}"))
            continue
        if not 0 <= microbatch < M:
            problems.append(((device, slot), f"{here}: {cell}: microbatch {microbatch} is out "
                                             f"of range (the table has microbatches 0..{M - 1})"))
            continue
        lookup = forward_of if group == "F" else backward_of
        producer = lookup[(producer_stage, microbatch)]
        consumer = lookup[(consumer_stage, microbatch)]
        mine = producer if is_send else consumer
        if int(table.device[mine]) != device:
            problems.append(((device, slot), f"{here}: {cell} belongs to {op_text(mine)}, which "
                                             f"runs on device {int(table.device[mine])}"))
            continue
        if producer not in transfer_of:
            problems.append(((device, slot), f"{here}: {cell}: {op_text(producer)} and "
                                             f"{op_text(consumer)} both run on device {device}, "
                                             f"which hands the data over without SEND/RECV"))
            continue
        mine_slot = int(table.slot[mine])
        if mine_slot > slot if is_send else mine_slot < slot:
            order = "before" if is_send else "after"
            reason = "whose output it sends" if is_send else "which needs it"
            problems.append(((device, slot), f"{here}: {cell} comes {order} {op_text(mine)} "
                                             f"(slot {mine_slot}), {reason}"))
        if (producer, is_send) in sides:
            other = sides[(producer, is_send)]
            problems.append(((device, slot), f"{here}: {cell} appears twice (also at device "
                                             f"{other[0]}, slot {other[1]})"))
            continue
        sides[(producer, is_send)] = (device, slot, cell)
    for producer, consumer in transfer_of.values():
        send, recv = sides.get((producer, True)), sides.get((producer, False))
        if send and recv:
            continue
        if send or recv:
            device, slot, cell = send or recv
            peer = int(table.device[consumer if send else producer])
            anchor = consumer if send else producer
            problems.append(((device, slot), f"{_where(source, device, slot)}: {cell} has no "
                                             f"matching {_partner_text(cell)} on device {peer} "
                                             f"({'before' if send else 'after'} "
                                             f"{op_text(anchor)}, slot {int(table.slot[anchor])})"))
            continue
        device, slot = int(table.device[consumer]), int(table.slot[consumer])
        problems.append(((device, slot), f"{_where(source, device, slot)}: {op_text(consumer)} "
                                         f"needs {op_text(producer)}'s output from device "
                                         f"{int(table.device[producer])}, but the file has no "
                                         f"SEND/RECV for it"))
    if problems:
        raise InvalidScheduleError(min(problems)[1])

    # Edges: what each transfer waits for besides its producer.
    starts = table.cell_starts()
    ranges = _row_ranges(table)

    def cell_before(device, slot):
        """The first operation of the last compute cell before ``slot`` on ``device``, or -1."""
        lo, hi = ranges[device]
        position = lo + int(np.searchsorted(table.slot[lo:hi], slot)) - 1
        if position < lo:
            return -1
        while not starts[position]:
            position -= 1
        return position

    producers, afters = [], []
    queues = defaultdict(list)   # (device, peer) -> [(slot, producer, cell)]
    for (producer, is_send), (device, slot, cell) in sides.items():
        before = cell_before(device, slot)
        if before >= 0 and before != producer and not (
                is_send and int(table.slot[before]) == int(table.slot[producer])):
            producers.append(producer)
            afters.append(before)
        consumer = transfer_of[producer][1]
        peer = int(table.device[consumer if is_send else producer])
        queues[(device, peer)].append((slot, producer, cell))
    for queue in queues.values():
        queue.sort()
    if p2p == "ordered":
        for (device, peer), queue in sorted(queues.items()):
            if device > peer:
                continue
            other = queues[(peer, device)]
            mismatch = next((k for k, (mine, theirs) in enumerate(zip(queue, other))
                             if mine[1] != theirs[1]), None)
            if mismatch is not None:
                raise DeadlockError(_order_deadlock(source, device, peer, queue, other,
                                                    mismatch))
            for (_, earlier, _), (_, later, _) in zip(queue, queue[1:]):
                producers.append(later)
                afters.append(-1 - earlier)
    transfer_after = (np.array(producers, dtype=np.int64), np.array(afters, dtype=np.int64))
    _check_comm_deadlock(table, transfer_after, sides, source)
    return transfer_after


def fsdp_windows(table, actions, source):
    """The file's FSDP windows: ``(stage, issue, first, last)`` int64 arrays, or None.

    Per device and stage, an ``UNSHARD`` opens a window and the next ``RESHARD``
    closes it (an open one closes at the row's end); the window holds the
    stage's operations between them, ``first`` and ``last`` of them (operation
    indices), and its all-gather is issued where PyTorch's runtime issues it
    (``unshard(async_op=True)``): after the compute operation before the
    ``UNSHARD`` in the row, ``issue`` (``-1``: at the start). Lowered with
    ``zero_stage`` 3 these windows replace tabsched's own
    (:mod:`tabsched.sharding`). An UNSHARD of a stage already gathered, a
    RESHARD of one not gathered and an operation outside every window of its
    stage are errors naming the cell.
    """
    fsdp = sorted((entry for entry in actions if entry[2].kind in ("UNSHARD", "RESHARD")),
                  key=lambda entry: (entry[0], entry[1]))
    if not fsdp:
        return None
    windows = _windows_at_once(table, fsdp)
    if windows is not None:
        return windows
    ranges = _row_ranges(table)
    opened, windows = {}, []

    def close(device, stage, begin, end):
        lo, hi = ranges[device]
        mine = lo + np.flatnonzero((table.stage[lo:hi] == stage) & (table.slot[lo:hi] > begin)
                                   & (table.slot[lo:hi] < end))
        if len(mine):     # a window nothing uses gathers for nobody: no node
            windows.append((stage, opened[(device, stage)][1], int(mine[0]), int(mine[-1])))
        del opened[(device, stage)]

    for device, slot, cell in fsdp:
        key = (device, cell.stage)
        if cell.kind == "UNSHARD":
            if key in opened:
                raise InvalidScheduleError(
                    f"{_where(source, device, slot)}: {cell}: stage {cell.stage} is gathered "
                    f"already (UNSHARD at slot {opened[key][0]}, no RESHARD since)")
            lo, hi = ranges[device]
            before = lo + int(np.searchsorted(table.slot[lo:hi], slot)) - 1
            opened[key] = (slot, before if before >= lo else -1)
        else:
            if key not in opened:
                raise InvalidScheduleError(
                    f"{_where(source, device, slot)}: {cell}: stage {cell.stage} is not "
                    f"gathered (no UNSHARD before it since its last RESHARD)")
            close(device, cell.stage, opened[key][0], slot)
    for device, stage in sorted(opened):
        close(device, stage, opened[(device, stage)][0], np.inf)
    columns = list(zip(*windows)) or [()] * 4        # no window holds an operation
    stage, issue, first, last = (np.array(column, dtype=np.int64) for column in columns)
    covered = np.zeros(len(table), dtype=bool)
    for begin, end in zip(first.tolist(), last.tolist()):
        covered[begin:end + 1] |= table.stage[begin:end + 1] == table.stage[begin]
    loose = np.flatnonzero(~covered)
    if len(loose):
        op = int(loose[0])
        device, slot = int(table.device[op]), int(table.slot[op])
        raise InvalidScheduleError(
            f"{_where(source, device, slot)}: {table.op(op)} runs while stage "
            f"{int(table.stage[op])}'s parameters are not gathered (no UNSHARD before it, or "
            f"a RESHARD between)")
    return stage, issue, first, last


def _windows_at_once(table, fsdp):
    """:func:`fsdp_windows` over arrays for a file it refuses nothing in, else None (its
    loop names the problem). Windows in the loop's order: closed ones by their
    RESHARD's place, then the open ones by device and stage."""
    device, slot, stage = (np.array(column, dtype=np.int64) for column in
                           zip(*[(device, slot, cell.stage) for device, slot, cell in fsdp]))
    unshard = np.array([cell.kind == "UNSHARD" for _, _, cell in fsdp])
    S, ops = max(table.num_stages, 1), len(table)
    if stage.min() < 0 or stage.max() >= S or not ops:
        return None
    # each (device, stage)'s actions in row order: UNSHARD, RESHARD, UNSHARD, ...
    order = np.argsort(device * S + stage, kind="stable")
    key, unshard, slot = (device * S + stage)[order], unshard[order], slot[order]
    opens = np.append(True, key[1:] != key[:-1])
    if not np.where(opens, unshard, unshard != np.append(False, unshard[:-1])).all():
        return None
    begin = np.flatnonzero(unshard)
    closed = (begin + 1 < len(key)) & (key[np.minimum(begin + 1, len(key) - 1)] == key[begin])
    width = max(int(table.slot.max()), int(slot.max())) + 2
    end = np.where(closed, slot[np.minimum(begin + 1, len(key) - 1)], width - 1)
    window_key, start = key[begin], slot[begin]
    window_device, window_stage = window_key // S, window_key % S
    # the operation before each UNSHARD in its row issues the all-gather (-1: none)
    cells = table.device.astype(np.int64) * width + table.slot
    issue = np.searchsorted(cells, window_device * width + start) - 1
    issue = np.where((issue >= 0) & (table.device[np.maximum(issue, 0)] == window_device),
                     issue, -1)
    # the stage's operations on the device strictly inside each window
    op_key = table.device.astype(np.int64) * S + table.stage
    by_key = np.argsort(op_key, kind="stable")
    places = op_key[by_key] * width + table.slot[by_key]
    first = np.searchsorted(places, window_key * width + start, side="right")
    stop = np.searchsorted(places, window_key * width + end)
    if int((stop - first).sum()) != ops:
        return None                   # an operation outside every window of its stage
    used = stop > first
    rank = np.lexsort((np.where(closed, end, window_stage), window_device, ~closed))
    rank = rank[used[rank]]
    return (window_stage[rank], issue[rank], by_key[first[rank]].astype(np.int64),
            by_key[stop[rank] - 1].astype(np.int64))


def _order_deadlock(source, device, peer, queue, other, k):
    """The message for two devices that list their transfers to each other in different orders."""
    mine_slot, mine_producer, mine_cell = queue[k]
    their_slot, their_producer, their_cell = other[k]
    mine_partner = next(entry for entry in other if entry[1] == mine_producer)
    their_partner = next(entry for entry in queue if entry[1] == their_producer)
    return (f"{_where(source, device, mine_slot)}: {mine_cell} and device {peer}, slot "
            f"{their_slot}: {their_cell} deadlock: the SEND/RECV between devices {device} and "
            f"{peer} run one at a time in the order each device lists them, and {mine_cell} "
            f"waits for {mine_partner[2]} (device {peer}, slot {mine_partner[0]}), listed after "
            f"{their_cell}, which waits for {their_partner[2]} (device {device}, slot "
            f"{their_partner[0]}), listed after {mine_cell} (p2p='free' drops this rule)")


def _run_unit(table, transfer_after):
    """The table lowered with its transfer edges, or the DeadlockError of a cycle: without
    contention a run waits only along edges, so it finishes exactly when the DAG is
    acyclic (which lowering decides, ordering it)."""
    lowered = lower(table, transfer_after=transfer_after)
    lowered.check_acyclic()
    return lowered


def _check_comm_deadlock(table, transfer_after, sides, source):
    """Raise a DeadlockError naming compute and SEND/RECV cells if the file cannot run."""
    try:
        lowered = _run_unit(table, transfer_after)
    except DeadlockError as error:
        lowered = lower(table, transfer_after=transfer_after)
        steps = []
        for node in getattr(error, "nodes", ()):
            kind = lowered.kind_of(node)
            if kind == CELL:
                text, device, slot = lowered.describe_cell(node)
                steps.append(f"{text} (device {device}, slot {slot})")
            elif kind == TRANSFER:
                producer = int(lowered.transfers.producer[node - lowered.nodes(TRANSFER).start])
                send, recv = sides[(producer, True)], sides[(producer, False)]
                steps.append(f"{send[2]} (device {send[0]}, slot {send[1]}) / {recv[2]} "
                             f"(device {recv[0]}, slot {recv[1]})")
        if not steps:
            raise
        raise DeadlockError(f"{source}: deadlock: the compute and SEND/RECV order cannot run; "
                            f"each of these waits for the one before: " + " -> ".join(steps)
                            + f" -> {steps[0]}", error.cycle) from None


def unit_layout(table):
    """The same per-device orders laid out in unit slots (op indices unchanged)."""
    fresh = table.cell_starts()
    cell = np.cumsum(fresh) - 1
    first_cell = cell[np.searchsorted(table.device, table.device)]
    position = cell - first_cell
    # the valid table's own orders, one cell a position: what from_order_arrays would
    # build and check again
    lengths = np.zeros(table.num_devices, dtype=np.int32)
    last = np.append(table.device[1:] != table.device[:-1], True)   # of each row
    lengths[table.device[last]] = position[last] + 1
    return lay_out(table._with_slots(position, lengths))
