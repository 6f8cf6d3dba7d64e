"""When pipeline sends and receives run, as the runtimes that execute schedules post them.

A transfer of the lowered DAG (:mod:`tabsched.lower`) starts when its producer ends
and lasts ``latency + bytes / bandwidth``. How the runtime posts and waits on it is
the ``p2p`` mode (:data:`P2P_MODES`, an :class:`~tabsched.execution.Execution`
field), expressed as edges into and out of transfer nodes, so the kernel is the
same for every mode:

``free``
    Transfers overlap compute freely: the consumer waits for its input, nothing else.
``blocking``
    A transfer also keeps its sender's compute stream until it is delivered: an
    edge to the sender's next cell (``--blocking-sends``, the older flag).
``megatron-batched``
    Megatron-LM without ``--overlap-p2p-communication``
    (``megatron/core/pipeline_parallel/schedules.py`` and ``p2p_communication.py``,
    core_r0.5 to r0.8; ``batch_p2p_comm`` on): between two computes a device makes
    one or two communication calls; each posts its sends and receives together
    (``torch.distributed.batch_isend_irecv``) and waits for all of them before the
    device goes on. Which calls, per schedule:

    * 1F1B (one stage per device, ``forward_backward_pipelining_without_interleaving``):
      warm-up ``recv_forward``, F, ``send_forward`` (each alone, waited); steady
      state F, ``send_forward_recv_backward`` (one batch), B,
      ``send_backward_recv_forward`` (one batch; the last is ``send_backward``
      alone); cool-down ``recv_backward``, B, ``send_backward`` (each alone).
      The warm-up count is Megatron's ``min(p - r - 1, M)`` for rank ``r``.
    * interleaved (several stages per device, ``..._with_interleaving``): one
      batch after each warm-up F (``send_forward_recv_forward``, with the
      first backward's ``recv_next`` after the last warm-up F), one batch after
      each steady (F, B) pair (``send_forward_backward_recv_forward_backward``),
      one after each cool-down B (``send_backward_recv_backward``); each batch
      sends what the computes before it produced and receives what the computes
      up to the next batch need. Warm-up: ``(p - r - 1) * 2 + (v - 1) * g``
      microbatch-chunks (``g`` the microbatch group size, default ``p``), capped at
      the total; when every forward is warm-up the
      first ``recv_backward`` is a call of its own.
``megatron-overlap``
    ``--overlap-p2p-communication`` (interleaved schedule only: Megatron-LM's
    ``arguments.py`` turns it off without a virtual pipeline, so one stage per
    device runs as ``megatron-batched``): after a forward, its send and the next
    forward's receive are posted and waited only before the next forward; after
    a backward, its send and the next backward's receive, waited before the next
    backward (``fwd_wait_handles`` / ``bwd_wait_handles``, core_r0.5 to r0.7); the
    first backward's receive is posted after the last warm-up forward. The
    operations are individual ``isend``/``irecv``, each starting when both ends
    have posted it; NCCL's serialisation of one pair's operations on one
    communicator stream is not modelled.
``pytorch``
    ``torch.distributed.pipelining`` (``schedules.py``): ``Schedule1F1B`` for a
    1F1B table (warm-up ``min(M, p - r)``: blocking receive, F, the previous
    send waited after the next F, the last warm-up send fused with the first
    backward's receive; steady 1B1F batches ``fwd_send + bwd_recv`` and
    ``bwd_send + fwd_recv``, waited; cool-down blocking receive, B, the previous
    send waited), ``ScheduleGPipe`` for GPipe (blocking receives; forward sends
    waited before the backwards, backward sends at the end), and
    ``PipelineScheduleMulti`` for every other table: at each time step of the
    table, one batch of the step's sends and the receives of what the
    neighbours computed in the same step, waited at once.

In every mode but ``free`` and ``blocking`` a transfer is a rendezvous (an NCCL
send of more than its few-MiB FIFO buffer cannot finish before the peer's
receive runs): it starts when its producer ended and **both** devices posted it
(the compute before each call has ended), and each device's compute after the
wait waits for it. For the batched modes (``megatron-batched``, ``pytorch``), a
device's calls also run one after another: batched point-to-point operations go
on the communicator of the whole group and so on one NCCL stream
(``ProcessGroupNCCL::pointToPoint`` in PyTorch's
``torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp``: ``isP2POp`` is false inside
a batch, so the device's communicator is used, not a two-rank one).

A table that is none of the orders Megatron-LM's loops or PyTorch's
``Schedule1F1B`` walk (each row: the runtime's warm-up count of forwards,
alternating pairs, backwards) runs as ``PipelineScheduleMulti`` runs it, one
waited batch per time step, which runs any valid table without deadlock.
"""

from __future__ import annotations

import numpy as np

from tabsched.cells import FORWARD
from tabsched.exceptions import InvalidParameterError
from tabsched.execution import P2P_MODES

__all__ = ["P2P_MODES", "check_mode", "resolve_mode", "p2p_edges"]

INDEX = np.int32
NO_CELL = -1


def check_mode(mode, where="p2p"):
    """``mode`` if it is one of :data:`P2P_MODES`, else one line naming ``where``."""
    if not isinstance(mode, str) or mode not in P2P_MODES:
        shown = repr(mode) if isinstance(mode, str) else type(mode).__name__
        raise InvalidParameterError(f"{where} {shown} is not one of {', '.join(P2P_MODES)}")
    return mode


def resolve_mode(p2p, blocking_sends):
    """The mode ``lower`` runs: ``p2p``, else ``blocking`` with ``blocking_sends`` (its
    older spelling), else ``free``; the two may not disagree."""
    if p2p is None:
        return "blocking" if blocking_sends else "free"
    if check_mode(p2p) != "blocking" and blocking_sends:
        raise InvalidParameterError(f"p2p {p2p!r} contradicts blocking_sends (the older "
                                    f"spelling of p2p 'blocking')")
    return p2p


class _Row:
    """One device's cells in row order: which transfers each sends and receives."""

    def __init__(self, cells, forward, sends, receives, slots):
        self.cells = cells          # global cell ids, in row order
        self.forward = forward      # per cell: every operation a forward
        self.sends = sends          # per cell: transfer nodes it produces
        self.receives = receives    # per cell: transfer nodes it consumes
        self.slots = slots          # per cell: its slot in the table

    def __len__(self):
        return len(self.cells)


def _rows(table, cell_of_op, cell_device, transfer_producer, transfer_consumer, first_transfer):
    """A :class:`_Row` per device."""
    num_cells = len(cell_device)
    forward = np.ones(num_cells, dtype=bool)
    np.logical_and.at(forward, cell_of_op, table.kind == FORWARD)
    slot = np.empty(num_cells, dtype=np.int64)
    slot[cell_of_op[::-1]] = table.slot[::-1]        # each cell's first operation's slot
    sends = [[] for _ in range(num_cells)]
    receives = [[] for _ in range(num_cells)]
    for index, (producer, consumer) in enumerate(zip(cell_of_op[transfer_producer].tolist(),
                                                     cell_of_op[transfer_consumer].tolist())):
        sends[producer].append(first_transfer + index)
        receives[consumer].append(first_transfer + index)
    bounds = np.searchsorted(cell_device, np.arange(table.num_devices + 1))
    rows = []
    for device in range(table.num_devices):
        lo, hi = int(bounds[device]), int(bounds[device + 1])
        rows.append(_Row(list(range(lo, hi)), forward[lo:hi].tolist(), sends[lo:hi],
                         receives[lo:hi], slot[lo:hi].tolist()))
    return rows


def _shaped(forward, w, pairs):
    """Whether ``forward`` is ``w`` forwards, ``pairs`` alternating pairs, then backwards."""
    steady = forward[w:w + 2 * pairs]
    return (all(forward[:w]) and not any(forward[w + 2 * pairs:])
            and all(steady[j] == steady[0] and steady[j + 1] != steady[0]
                    for j in range(0, len(steady), 2)))


class _Calls:
    """The communication calls of one device: ``(post, transfers, wait)``, in posting order.

    ``post`` is the index in the row of the cell after which the call is posted
    (``NO_CELL``: before the first), ``wait`` the cell that waits for it (``NO_CELL``:
    the end of the iteration)."""

    def __init__(self, row):
        self.row = row
        self.calls = []

    def add(self, post, transfers, wait):
        if transfers:
            self.calls.append((post, list(transfers), wait))

    def sends(self, *cells):
        return [t for cell in cells if 0 <= cell < len(self.row) for t in self.row.sends[cell]]

    def receives(self, *cells):
        return [t for cell in cells if 0 <= cell < len(self.row)
                for t in self.row.receives[cell]]


def _runtime_phases(forward, warmup, opens_with_forward=True):
    """``(w, k)`` of a row of exactly the shape a runtime's loops walk with warm-up count
    ``warmup`` (capped at the forwards): ``w`` forwards, ``k`` alternating pairs opening
    with a forward (Megatron-LM's F B) or a backward (PyTorch's 1B1F), backwards; else
    None."""
    forwards = sum(forward)
    w = min(warmup, forwards)
    if len(forward) != 2 * forwards or not _shaped(forward, w, forwards - w) or (
            forwards > w and forward[w] != opens_with_forward):
        return None
    return w, forwards - w


def _megatron_1f1b(row, rank, devices):
    """Calls of Megatron-LM's ``forward_backward_pipelining_without_interleaving``
    (None for a row not of its shape)."""
    calls, n = _Calls(row), len(row)
    phases = _runtime_phases(row.forward, devices - rank - 1)
    if phases is None:
        return None
    w, pairs = phases
    steady = range(w, w + 2 * pairs)
    calls.add(NO_CELL, calls.receives(0), 0)
    for i in range(n - 1):
        if i in steady and i + 1 in steady:         # send_forward_recv_backward and back
            calls.add(i, calls.sends(i) + calls.receives(i + 1), i + 1)
        else:                                       # send_*, then recv_*, each waited
            calls.add(i, calls.sends(i), i + 1)
            calls.add(i, calls.receives(i + 1), i + 1)
    calls.add(n - 1, calls.sends(n - 1), NO_CELL)
    return calls


def _groups(row, warmup):
    """Megatron's interleaved groups of cells: warm-up singles, (F, B) pairs, cool-down
    singles; with the warm-up and pair counts (None for a row not of its shape)."""
    phases = _runtime_phases(row.forward, warmup)
    if phases is None:
        return None, 0, 0
    w, pairs = phases
    groups = [[i] for i in range(w)]
    groups += [[w + 2 * j, w + 2 * j + 1] for j in range(pairs)]
    groups += [[i] for i in range(w + 2 * pairs, len(row))]
    return groups, w, pairs


def _group_size(table, devices):
    """Megatron-LM's ``microbatch_group_size_per_vp_stage``: the table's ``group_size``,
    else the pipeline depth (its default)."""
    params = table.metadata.get("params") or {}
    size = params.get("group_size") if isinstance(params, dict) else None
    return size if isinstance(size, int) and size > 0 else devices


def _megatron_interleaved(row, rank, devices, chunks, group):
    """Calls of Megatron-LM's ``forward_backward_pipelining_with_interleaving`` (no overlap)."""
    calls = _Calls(row)
    groups, w, pairs = _groups(row, (devices - rank - 1) * 2 + (chunks - 1) * group)
    if groups is None:
        return None
    calls.add(NO_CELL, calls.receives(*groups[0]), groups[0][0])
    for here, after in zip(groups, groups[1:]):
        last, first = here[-1], after[0]
        if not pairs and last == w - 1:             # all warm-up: recv_backward alone
            calls.add(last, calls.sends(*here), first)
            calls.add(last, calls.receives(*after), first)
        else:
            calls.add(last, calls.sends(*here) + calls.receives(*after), first)
    calls.add(groups[-1][-1], calls.sends(*groups[-1]), NO_CELL)
    return calls


def _megatron_overlap(row, rank, devices, chunks, group):
    """Calls of the interleaved schedule with ``--overlap-p2p-communication``."""
    calls, n = _Calls(row), len(row)
    phases = _runtime_phases(row.forward, (devices - rank - 1) * 2 + (chunks - 1) * group)
    if phases is None:
        return None
    w, pairs = phases
    calls.add(NO_CELL, calls.receives(0), 0)
    following = [NO_CELL] * n       # the next cell of the same direction
    seen = {True: NO_CELL, False: NO_CELL}
    for i in range(n - 1, -1, -1):
        following[i] = seen[row.forward[i]]
        seen[row.forward[i]] = i
    first_backward = seen[False]
    for i in range(n):
        nxt = following[i]
        calls.add(i, calls.sends(i) + calls.receives(nxt), nxt)
        if i == (w - 1 if pairs else first_backward - 1) and first_backward > 0:
            calls.add(i, calls.receives(first_backward), first_backward)
    return calls


def _pytorch_1f1b(row, rank, devices):
    """Calls of PyTorch's ``Schedule1F1B._step_microbatches`` (None for a row not of
    its shape)."""
    calls, n = _Calls(row), len(row)
    phases = _runtime_phases(row.forward, devices - rank, opens_with_forward=False)
    if phases is None:
        return None
    w, pairs = phases

    def later(cell):            # a send waited after the next compute: before the one after
        return cell + 2 if cell + 2 < n else NO_CELL
    for i in range(w):                       # warm-up
        calls.add(i - 1, calls.receives(i), i)
        if i != w - 1:
            calls.add(i, calls.sends(i), later(i))
    end = w + 2 * pairs                      # the 1B1F loop: B (F B)...; its last B
    for i in range(w - 1, min(end, n - 1)):  # fused batches, waited
        calls.add(i, calls.sends(i) + calls.receives(i + 1), i + 1)
    if end < n:
        calls.add(end, calls.sends(end), later(end))
    for i in range(end + 1, n):              # cool-down
        calls.add(i - 1, calls.receives(i), i)
        calls.add(i, calls.sends(i), later(i))
    return calls


def _pytorch_gpipe(row):
    """Calls of PyTorch's ``ScheduleGPipe._step_microbatches``."""
    calls, n = _Calls(row), len(row)
    first_backward = next((i for i in range(n) if not row.forward[i]), NO_CELL)
    for i in range(n):
        calls.add(i - 1, calls.receives(i), i)
        calls.add(i, calls.sends(i), first_backward if row.forward[i] else NO_CELL)
    return calls


def _pytorch_multi(rows, device):
    """Calls of PyTorch's ``PipelineScheduleMulti``: one batch per time step of the table."""
    row = rows[device]
    calls, n = _Calls(row), len(row)
    by_slot = {}
    for index in range(n):
        by_slot.setdefault(row.slots[index], []).extend(row.sends[index])
    # the receives of what a neighbour produced at a slot belong to that slot's batch
    mine = {t for index in range(n) for t in row.receives[index]}
    for other in rows:
        if other is row:
            continue
        for index in range(len(other)):
            taken = [t for t in other.sends[index] if t in mine]
            if taken:
                by_slot.setdefault(other.slots[index], []).extend(taken)
    slots = np.asarray(row.slots, dtype=np.int64)
    for slot in sorted(by_slot):
        post = int(np.searchsorted(slots, slot, side="right")) - 1
        wait = post + 1 if post + 1 < n else NO_CELL
        calls.add(post, by_slot[slot], wait)
    return calls


def _family(table):
    family = table.metadata.get("family")
    return family if isinstance(family, str) else None


def device_calls(table, mode, rows):
    """Every device's :class:`_Calls` under ``mode`` (one of the scheduled modes), and
    whether a device's calls run one after another (batched on one stream).

    Megatron-LM runs only its 1F1B and interleaved orders (every row of the shape
    its loops walk: warm-up forwards, steady pairs, cool-down backwards, with a
    single direction per cell); any other table runs in the Megatron modes as
    PyTorch's ``PipelineScheduleMulti`` runs it, one waited batch per time step
    (it can run every valid table, where Megatron's calls applied to a foreign
    order would deadlock).
    """
    D = table.num_devices
    chunks = max((len(set(stages)) for stages in _stages_per_device(table)), default=1)
    if mode == "pytorch":
        family = _family(table)
        if chunks == 1 and family == "gpipe":
            return [_pytorch_gpipe(row) for row in rows], True
        if chunks == 1 and family in ("1f1b", None):
            built = [_pytorch_1f1b(row, device, D) for device, row in enumerate(rows)]
            if all(calls is not None for calls in built):
                return built, True
    else:
        if chunks == 1:      # Megatron-LM turns --overlap-p2p-communication off here
            built = [_megatron_1f1b(row, device, D) for device, row in enumerate(rows)]
        elif mode == "megatron-overlap":
            built = [_megatron_overlap(row, device, D, chunks, _group_size(table, D))
                     for device, row in enumerate(rows)]
        else:
            built = [_megatron_interleaved(row, device, D, chunks, _group_size(table, D))
                     for device, row in enumerate(rows)]
        if all(calls is not None for calls in built):
            return built, mode == "megatron-batched" or chunks == 1
    return [_pytorch_multi(rows, device) for device in range(D)], True


def _stages_per_device(table):
    order = np.argsort(table.device, kind="stable")
    devices, stages = table.device[order], table.stage[order]
    bounds = np.searchsorted(devices, np.arange(table.num_devices + 1))
    return [stages[bounds[d]:bounds[d + 1]].tolist() for d in range(table.num_devices)]


def p2p_edges(table, mode, cell_of_op, cell_device, transfer_producer, transfer_consumer,
              first_transfer):
    """The edge groups ``(sources, targets)`` a scheduled ``mode`` adds to a lowering.

    Per call of a device: the cell it is posted after -> each of its transfers; each
    transfer -> the cell that waits for it; with a serial mode, each transfer of the
    device's previous call -> each of this call's. Duplicates dropped.
    """
    check_mode(mode)
    if mode in ("free", "blocking") or len(transfer_producer) == 0:
        return []
    rows = _rows(table, cell_of_op, cell_device, transfer_producer, transfer_consumer,
                 first_transfer)
    sources, targets = [], []
    built, serial = device_calls(table, mode, rows)
    for row, calls in zip(rows, built):
        previous = []
        for post, transfers, wait in calls.calls:
            for transfer in transfers:
                if post != NO_CELL:
                    sources.append(row.cells[post])
                    targets.append(transfer)
                if wait != NO_CELL:
                    sources.append(transfer)
                    targets.append(row.cells[wait])
                for earlier in previous:
                    sources.append(earlier)
                    targets.append(transfer)
            if serial:
                previous = transfers
    if not sources:
        return []
    # duplicates dropped on one int64 key per edge: np.unique(axis=1) sorts the pairs as
    # structured records, 20x slower at the 10^6 edges of a 280-device interleaved table
    sources = np.asarray(sources, dtype=np.int64)
    targets = np.asarray(targets, dtype=np.int64)
    width = int(targets.max()) + 1
    keys = np.sort(sources * width + targets)   # a sort: numpy's hashed unique is slower
    keys = keys[np.concatenate([[True], keys[1:] != keys[:-1]])]
    return [((keys // width).astype(INDEX), (keys % width).astype(INDEX))]
