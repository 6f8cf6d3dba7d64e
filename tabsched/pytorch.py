"""PyTorch pipelining interop: read, write and evaluate its CSV schedules.

``torch.distributed.pipelining`` stores a schedule as CSV, one row per rank,
written by ``csv.writer`` (lines end in ``\\r\\n``). This module reads and
writes both of its formats without importing torch.

Formats
-------
``compute_only``
    The compute cells a schedule class builds (``_dump_csv(format=
    "compute_only")``, ``_schedule_visualizer.get_schedule_ops``); an empty
    cell is idle. Single-stage classes (``Schedule1F1B``, ``ScheduleGPipe``)
    also put a ``REDUCE_GRAD`` cell after each stage's last backward.
``compute_comms``
    What PyTorch's runtime executes after lowering a compute_only schedule:
    ``UNSHARD``/``RESHARD`` around compute (FSDP), ``REDUCE_GRAD`` after each
    stage's last backward, and ``SEND_F``/``RECV_F``/``SEND_B``/``RECV_B`` for
    every dependency between ranks; no empty cells. A file with any SEND or
    RECV cell is read as compute_comms.

Tokens
------
``<stage><kind><microbatch>``: ``F`` forward, ``I`` input-grad backward, ``W``
weight-grad backward, ``B`` full backward, and ``(<op>;<op>)OVERLAP_F_B`` for a
forward and a backward run as one step (DualPipeV). Earlier releases of
torch.distributed.pipelining used ``B`` for the input-grad backward and ``BW``
for the full backward: read such files with ``legacy=True`` (CLI
``--torch-legacy``), since the same letter meant something else.

An ``OVERLAP_F_B`` cell is one step (one node when lowered): it starts when
the inputs of both parts are there, its outputs appear when it ends, and it
lasts the sum of its parts times the cost model's ``overlap``. That is the
overlapped execution DualPipeV is built for (a registered ``OVERLAP_F_B``
function); PyTorch's runtime without one runs the parts one after the other,
which can start the forward earlier than tabsched does.

``UNSHARD`` and ``RESHARD`` (``<stage>UNSHARD``) fetch and free FSDP-sharded
parameters; tabsched gives them no cost, so they are dropped with a note.
``REDUCE_GRAD`` becomes the table's ``grad_sync`` for its stage: one gradient
sync after the stage's last backward (see :func:`tabsched.lower.lower`).

Communication (compute_comms)
-----------------------------
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
compute cells laid out in unit slots; the communication rides along in
:class:`TorchSchedule`.

Writing
-------
:func:`to_compute_only` writes the table as it is; :func:`to_compute_comms`
lowers it exactly as PyTorch's ``_PipelineScheduleRuntime`` does (without
``defer_pp_recv``), so the bytes equal PyTorch's ``_dump_csv(format=
"compute_comms")``. Both refuse what PyTorch cannot express: a stage on two
devices (Chimera's replicas), microbatches of unequal size, a device with no
operations.

Examples
--------
>>> schedule = from_pytorch_csv("0F0,0F1,0I0,0W0,0B1,0REDUCE_GRAD\\r\\n")
>>> str(schedule.table.rows[0][2]), schedule.table.grad_sync
('0I0', (0,))
>>> from_pytorch_csv("0F0,0B0,0BW1\\r\\n").table
Traceback (most recent call last):
...
tabsched.exceptions.InvalidScheduleError: <csv>: device 0, slot 2: "0BW1" is a full backward in PyTorch's legacy tokens; read the file with legacy=True (--torch-legacy)
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from tabsched.evaluate import evaluate
from tabsched.exceptions import DeadlockError, InvalidParameterError, InvalidScheduleError
from tabsched.io import Action as _Action
from tabsched.io import (apply_reduce_grad, atomic_write, csv_row_texts, csv_rows, parse_rows,
                         read_text, refuse_loss, rows_to_table, write_rows)
from tabsched.layout import from_order_arrays
from tabsched.lower import lower
from tabsched.nodes import CELL, TRANSFER
from tabsched.table import (BACKWARD, FORWARD, INPUT_GRAD, Op, Overlap, compound_parts,
                            cut, parse_id, parse_op, shown)

if TYPE_CHECKING:
    from tabsched.table import ScheduleTable

__all__ = ["TorchSchedule", "read_pytorch", "from_pytorch_csv", "to_compute_only",
           "to_compute_comms", "write_pytorch", "pytorch_refusal", "stage_map",
           "torch_stage_to_device", "describe_stage_map", "FORMATS", "P2P_MODES",
           "STAGE_MAPS"]

FORMATS = ("compute_only", "compute_comms")
P2P_MODES = ("ordered", "free")
STAGE_MAPS = ("loop", "v")

_COMMS = ("SEND_F", "RECV_F", "SEND_B", "RECV_B")
_FSDP = ("UNSHARD", "RESHARD")
_REDUCE = "REDUCE_GRAD"
_OVERLAP = "OVERLAP_F_B"
# ASCII digits only (\d would read other scripts' digits as 0-9).
_ACTION = re.compile(r"([0-9]+)(SEND_F|RECV_F|SEND_B|RECV_B|UNSHARD|RESHARD|REDUCE_GRAD|BW|F|I|B|W)"
                     r"([0-9]*)")
_EXPECTED = ("expected <stage><F|I|B|W><microbatch>, (<op>;<op>)OVERLAP_F_B, "
             "<stage><SEND_F|RECV_F|SEND_B|RECV_B><microbatch> or "
             "<stage><UNSHARD|RESHARD|REDUCE_GRAD>")
_KIND_OF = {False: {"F": "F", "I": "I", "B": "B", "W": "W"},
            True: {"F": "F", "B": "I", "BW": "B", "W": "W"}}


# ---------------------------------------------------------------------- reading
def _parse_action(token, legacy):
    """An ``Op``, ``Overlap``, ``_Action`` or None (idle) for one cell's text."""
    token = token.strip()
    if not token:
        return None
    inner = compound_parts(token, _EXPECTED)
    if inner is not None:
        parts = []
        for part in inner:
            op = _parse_action(part, legacy) if part else None
            if not isinstance(op, Op):
                raise InvalidScheduleError(f'{shown(token)}: {shown(part)} is not a compute '
                                           f'operation (expected <stage><F|I|B|W><microbatch>)')
            parts.append(op)
        return Overlap(tuple(parts))  # the table checks that it is one F and one B or I
    match = _ACTION.fullmatch(token)
    if match is None:
        parse_op(token, _EXPECTED)   # the same message as tabsched's own cells give
        raise InvalidScheduleError(f"{shown(token)} is not an operation ({_EXPECTED})")
    stage, kind, microbatch = parse_id(match[1], "stage", token), match[2], match[3]
    if kind in _FSDP or kind == _REDUCE:
        if microbatch:
            raise InvalidScheduleError(f'{shown(token)}: {kind} takes no microbatch '
                                       f'(expected {stage}{kind})')
        return _Action(kind, stage)
    if not microbatch:
        raise InvalidScheduleError(f'{shown(token)} has no microbatch (expected e.g. '
                                   f'{cut(token + "0")})')
    microbatch = parse_id(microbatch, "microbatch", token)
    if kind in _COMMS:
        return _Action(kind, stage, microbatch)
    if kind not in _KIND_OF[legacy]:
        if legacy:
            raise InvalidScheduleError(f'{shown(token)}: PyTorch\'s legacy tokens have no I; '
                                       f'read the file without legacy=True (--torch-legacy)')
        raise InvalidScheduleError(f'{shown(token)} is a full backward in PyTorch\'s legacy '
                                   f'tokens; read the file with legacy=True (--torch-legacy)')
    return Op(_KIND_OF[legacy][kind], stage, microbatch)


@dataclass(eq=False)
class TorchSchedule:
    """A schedule read from PyTorch's CSV: its table and what the table cannot hold.

    Attributes
    ----------
    table : ScheduleTable
        The compute cells (a compute_comms file's laid out in unit slots), with
        ``grad_sync`` set from the file's ``REDUCE_GRAD`` cells.
    format : {"compute_only", "compute_comms"}
    notes : list of str
        What reading dropped or changed; :meth:`evaluate` copies them into the Result.
    transfer_after : pair of int arrays or None
        For compute_comms, the edges its SEND/RECV positions add to the lowered
        DAG (see :func:`tabsched.lower.lower`).
    p2p : {"ordered", "free"}
        How the communication was read (see the module docstring).
    """

    table: object
    format: str
    notes: list = field(default_factory=list)
    transfer_after: tuple | None = None
    p2p: str = "ordered"

    def evaluate(self, costs=None, **options):
        """:func:`tabsched.evaluate` with the file's communication order and notes.

        >>> schedule = from_pytorch_csv("0F0,0SEND_F0,0RECV_B0,0B0\\r\\n"
        ...                             "1RECV_F0,1F0,1B0,1SEND_B0\\r\\n")
        >>> schedule.evaluate().makespan
        4.0
        """
        result = evaluate(self.table, costs, transfer_after=self.transfer_after, **options)
        result.notes = list(self.notes) + list(result.notes)
        return result


def read_pytorch(path: str | os.PathLike[str], *, legacy: bool = False, format: str | None = None,
                 p2p: str = "ordered") -> TorchSchedule:
    """Read a PyTorch schedule CSV (compute_only or compute_comms).

    Parameters
    ----------
    path : str or path-like
    legacy : bool
        Read the legacy tokens (``B`` input-grad, ``BW`` full backward).
    format : {"compute_only", "compute_comms"}, optional
        Default: compute_comms if the file has a SEND or RECV cell.
    p2p : {"ordered", "free"}
        Whether the SEND/RECV between two devices run in the order each lists them.

    Returns
    -------
    TorchSchedule

    Raises
    ------
    InvalidScheduleError
        For the first problem, as ``path: device 3, slot 17: ...``.
    DeadlockError
        If the compute or communication order cannot run.
    """
    return from_pytorch_csv(read_text(path), source=os.fspath(path), legacy=legacy,
                            format=format, p2p=p2p)


def from_pytorch_csv(text: str, *, source: str = "<csv>", legacy: bool = False,
                     format: str | None = None, p2p: str = "ordered") -> TorchSchedule:
    """Parse PyTorch schedule CSV text (see :func:`read_pytorch`)."""
    if format is not None and format not in FORMATS:
        raise InvalidParameterError(f"format {format!r} is not one of {', '.join(FORMATS)}")
    if p2p not in P2P_MODES:
        raise InvalidParameterError(f"p2p {p2p!r} is not one of {', '.join(P2P_MODES)}")
    rows, actions, empty = parse_rows(csv_rows(text, source), source,
                                      parse=lambda token: _parse_action(token, legacy),
                                      kinds=_KIND_OF[legacy])
    comms = [entry for entry in actions if entry[2].kind in _COMMS]
    extras = [entry for entry in actions if entry[2].kind not in _COMMS]
    detected = "compute_comms" if comms else "compute_only"
    format = format or detected
    if format == "compute_only" and comms:
        device, slot, cell = comms[0]
        raise InvalidScheduleError(f"{source}: device {device}, slot {slot}: {cell} is a "
                                   f"communication action, which a compute_only schedule has none "
                                   f"of (read it as compute_comms)")
    if format == "compute_comms" and empty is not None:
        raise InvalidScheduleError(f"{source}: device {empty[0]}, slot {empty[1]}: empty cell; "
                                   f"a compute_comms row lists actions without gaps")
    try:
        table = rows_to_table(rows, source=source)
    except InvalidScheduleError as error:
        raise InvalidScheduleError(_legacy_hint(str(error), rows, legacy)) from None

    notes = []
    if legacy:
        notes.append("read PyTorch's legacy tokens: B as input-grad (I), BW as full backward (B)")
    table = _apply_extras(table, extras, source, notes)
    if format == "compute_only":
        return TorchSchedule(table, format, notes)
    transfer_after = _comm_edges(table, comms, source, p2p)
    notes.append(f"{len(comms) // 2} SEND/RECV pairs are the transfers, each starting once its "
                 f"SEND and RECV are reached" + (" and, between two devices, in the order both "
                                                 "list them" if p2p == "ordered" else ""))
    table = _unit_layout(table)
    return TorchSchedule(table, format, notes, transfer_after, p2p)


def _legacy_hint(message, rows, legacy):
    """Point at --torch-legacy when a current-token read of W without I fails on B + W."""
    kinds = {part.kind for row in rows for cell in row if cell is not None
             for part in (cell.parts if isinstance(cell, Overlap) else (cell,))}
    if not legacy and "W" in kinds and "I" not in kinds and "splits a backward" in message:
        message += (" (with W but no I, this may be PyTorch's legacy tokens, B = input-grad; "
                    "read it with legacy=True, --torch-legacy)")
    return message


def _where(source, device, slot):
    return f"{source}: device {device}, slot {slot}"


def _row_ranges(table):
    bounds = np.searchsorted(table.device, np.arange(table.num_devices + 1))
    return [(int(bounds[d]), int(bounds[d + 1])) for d in range(table.num_devices)]


def _apply_extras(table, extras, source, notes):
    """Check UNSHARD/RESHARD/REDUCE_GRAD cells; the table with its grad_sync."""
    if not extras:
        return table
    placement = table.placement()
    dropped = defaultdict(int)
    for device, slot, cell in extras:
        if cell.kind in _FSDP:
            if device not in placement.get(cell.stage, ()):
                runs = sorted(stage for stage, devices in placement.items() if device in devices)
                raise InvalidScheduleError(f"{_where(source, device, slot)}: {cell}: stage "
                                           f"{cell.stage} does not run on device {device} (it "
                                           f"runs stage{'s' if len(runs) > 1 else ''} "
                                           f"{', '.join(map(str, runs[:8]))}"
                                           f"{', ...' if len(runs) > 8 else ''})")
            dropped[cell.kind] += 1
    if dropped:
        notes.append(f"dropped {dropped['UNSHARD']} UNSHARD and {dropped['RESHARD']} RESHARD "
                     f"cells: FSDP's parameter all-gather and free cost nothing in tabsched's "
                     f"model")
    return apply_reduce_grad(table, extras, source, notes)


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
    return str(_Action(partner_kind, partner_stage, microbatch))


def _comm_edges(table, comms, source, p2p):
    """Validate a compute_comms file's SEND/RECV cells; ``transfer_after`` edges for lower()."""
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


def _check_comm_deadlock(table, transfer_after, sides, source):
    """Raise a DeadlockError naming compute and SEND/RECV cells if the file cannot run."""
    lowered = lower(table, transfer_after=transfer_after)
    durations = np.zeros(lowered.num_nodes)
    durations[lowered.nodes(CELL)] = 1.0
    try:
        lowered.run(durations, binding=False, end=False)
    except DeadlockError as error:
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


def _unit_layout(table):
    """The same per-device orders laid out in unit slots (op indices unchanged)."""
    fresh = table.cell_starts()
    cell = np.cumsum(fresh) - 1
    first_cell = cell[np.searchsorted(table.device, table.device)]
    return from_order_arrays(table.device, cell - first_cell, table.kind,
                                         table.stage, table.microbatch,
                                         num_devices=table.num_devices, **table.metadata)


# ---------------------------------------------------------------------- writing
def pytorch_refusal(table):
    """Why PyTorch cannot run ``table`` as one schedule, or None if it can.

    >>> from tabsched import ScheduleTable
    >>> print(pytorch_refusal(ScheduleTable([["0F0", "0B0"], ["0F1", "0B1"]])))
    PyTorch cannot express this table: stage 0 runs on devices 0 and 1 (replicas, as in Chimera); torch.distributed.pipelining places each stage on exactly one rank
    """
    for stage, devices in sorted(table.placement().items()):
        if len(devices) > 1:
            return (f"PyTorch cannot express this table: stage {stage} runs on devices "
                    f"{', '.join(map(str, devices[:-1]))} and {devices[-1]} (replicas, as in "
                    f"Chimera); torch.distributed.pipelining places each stage on exactly one "
                    f"rank")
    sizes = table.microbatch_sizes
    unequal = next((k for k, size in enumerate(sizes) if size != sizes[0]), None)
    if unequal is not None:
        return (f"PyTorch cannot express this table: microbatch {unequal} has size "
                f"{sizes[unequal]:g} but microbatch 0 has {sizes[0]:g}; PyTorch splits a batch "
                f"into microbatches of equal size")
    idle = np.flatnonzero(np.bincount(table.device, minlength=table.num_devices) == 0)
    if len(idle):
        return (f"PyTorch cannot express this table: device {int(idle[0])} runs nothing; "
                f"every PyTorch rank holds at least one stage")
    return None


def _check_expressible(table):
    refusal = pytorch_refusal(table)
    if refusal is not None:
        raise InvalidScheduleError(refusal)


def _write_rows(rows):
    return write_rows([["" if cell is None else str(cell) for cell in row] for row in rows])


def to_compute_only(table, *, drop_metadata=False):
    """The compute_only CSV text of ``table``, as PyTorch's ``csv.writer`` writes it.

    Raises ``InvalidScheduleError`` with :func:`pytorch_refusal`'s reason for a
    table PyTorch cannot express, for one whose layers per stage or microbatch
    sizes the file cannot hold unless ``drop_metadata`` (see
    :func:`tabsched.io.csv_loss`), and ``DeadlockError`` naming a cycle for row
    orders that cannot run (PyTorch's ``_load_csv`` would fail placing SEND/RECV:
    "Malformed compute schedule"). A table's ``grad_sync`` stages are written as
    ``REDUCE_GRAD`` cells after each stage's last backward, as PyTorch's
    single-stage classes (``ScheduleGPipe``, ``Schedule1F1B``) write them, so a
    file read from PyTorch is written back as it was. PyTorch's runtime
    (``_PipelineScheduleRuntime._load_csv``) refuses such cells in a compute_only
    file and adds them itself: write ``table.replace(grad_sync=None)`` for it.

    >>> from tabsched.schedules import generate
    >>> to_compute_only(generate("1f1b", devices=2, microbatches=2), drop_metadata=True)
    '0F0,0F1,,0B0,,0B1\\r\\n,1F0,1B0,1F1,1B1,\\r\\n'
    """
    _check_expressible(table)
    refuse_loss(table, "PyTorch CSV", drop_metadata)
    _check_runs(table)
    return write_rows(csv_row_texts(table))


def _check_runs(table):
    """Raise ``DeadlockError`` (naming a cycle) if the row orders contradict the dependencies."""
    lowered = lower(table)
    lowered.run_summary(np.ones((1, lowered.num_nodes)))


def to_compute_comms(table, *, max_active_stages=3, drop_metadata=False):
    """The compute_comms CSV text PyTorch's runtime would build from ``table``.

    The three passes of ``_PipelineScheduleRuntime._prepare_schedule_with_comms``
    (PyTorch 2.13, ``defer_pp_recv=False``), re-derived: FSDP ``UNSHARD``/``RESHARD``
    around the next ``max_active_stages`` stages a rank computes, ``REDUCE_GRAD``
    after a stage's last ``B`` or ``W``, then ``SEND``/``RECV`` placed by stepping
    the ranks in lock-step.

    Raises
    ------
    InvalidScheduleError
        If PyTorch cannot express the table (see :func:`pytorch_refusal`), or the
        file cannot hold its metadata and ``drop_metadata`` is not set.
    DeadlockError
        If no rank can take its next step (the row orders cannot run).

    >>> from tabsched.schedules import generate
    >>> to_compute_comms(generate("gpipe", devices=2, microbatches=1),
    ...                  drop_metadata=True).splitlines()
    ['0UNSHARD,0F0,0SEND_F0,0RECV_B0,0B0,0REDUCE_GRAD,0RESHARD', '1UNSHARD,1RECV_F0,1F0,1B0,1SEND_B0,1REDUCE_GRAD,1RESHARD']
    """
    _check_expressible(table)
    refuse_loss(table, "PyTorch CSV", drop_metadata)
    orders = [[cell for cell in row if cell is not None] for row in table.rows]
    lowered = [_add_reduce_grad(_add_unshard_reshard(order, max_active_stages),
                                table.num_microbatches) for order in orders]
    stage_device = {stage: devices[0] for stage, devices in table.placement().items()}
    return _write_rows(_add_send_recv(lowered, stage_device, table.num_stages, table))


def _parts(action):
    return action.parts if isinstance(action, Overlap) else (action,)


def _add_unshard_reshard(order, max_active_stages):
    """FSDP fetch/free around compute, as PyTorch's ``_add_unshard_reshard``.

    Before each action, the stages of the next actions are gathered until
    ``max_active_stages`` distinct ones are found (whole actions at a time);
    active stages not among them are resharded, missing ones unsharded. The
    active set is a Python ``set`` handled in PyTorch's order of operations,
    so eviction iterates in the same order.
    """
    # upcoming[i]: distinct stages from action i on, in order of first appearance,
    # each with the index of the action that brings it (built backwards: O(actions x stages)).
    upcoming = [None] * len(order)
    firsts = []
    for index in range(len(order) - 1, -1, -1):
        stages = list(dict.fromkeys(part.stage for part in _parts(order[index])))
        firsts = [(stage, index) for stage in stages] + [entry for entry in firsts
                                                         if entry[0] not in stages]
        upcoming[index] = firsts
    active, actions = set(), []
    for index, action in enumerate(order):
        wanted = []
        for position, (stage, owner) in enumerate(upcoming[index]):
            wanted.append(stage)
            following = upcoming[index][position + 1] if position + 1 < len(
                upcoming[index]) else None
            if len(wanted) >= max_active_stages and (following is None or following[1] != owner):
                break
        evict = [stage for stage in active if stage not in wanted]
        fetch = [stage for stage in wanted if stage not in active]
        for stage in evict:
            active.remove(stage)
            actions.append(_Action("RESHARD", stage))
        for stage in fetch:
            active.add(stage)
            actions.append(_Action("UNSHARD", stage))
        actions.append(action)
    for stage in list(active):
        active.remove(stage)
        actions.append(_Action("RESHARD", stage))
    return actions


def _add_reduce_grad(actions, num_microbatches):
    """A ``REDUCE_GRAD`` after the action that completes a stage's ``B``/``W`` count."""
    counted = defaultdict(int)
    result = []
    for action in actions:
        result.append(action)
        if isinstance(action, _Action):
            continue
        for part in _parts(action):
            if part.kind in ("B", "W"):
                counted[part.stage] += 1
                if counted[part.stage] == num_microbatches:
                    result.append(_Action(_REDUCE, part.stage))
    return result


def _add_send_recv(orders, stage_device, num_stages, table):
    """SEND/RECV placement by PyTorch's ``_add_send_recv`` (lock-step over the ranks).

    In each round every rank, in rank order, takes its next action if its
    inputs are there (a RECV or the producing action in its own history); each
    compute action whose output goes to another rank is followed by its SEND,
    and the matching RECV is appended to the receiver's list at once.
    """
    pending = [list(order) for order in orders]
    heads = [0] * len(pending)
    result = [[] for _ in pending]
    history = [set() for _ in pending]

    def crosses(part):
        if part.kind == "F":
            return part.stage != num_stages - 1 and \
                stage_device[part.stage + 1] != stage_device[part.stage]
        if part.kind in ("I", "B"):
            return part.stage != 0 and stage_device[part.stage - 1] != stage_device[part.stage]
        return False

    def ready(part, seen):
        stage, microbatch = part.stage, part.microbatch
        if part.kind == "F" and stage != 0:
            return ("RECV_F", stage, microbatch) in seen or ("F", stage - 1, microbatch) in seen
        if part.kind in ("I", "B") and stage != num_stages - 1:
            return (("RECV_B", stage, microbatch) in seen or ("I", stage + 1, microbatch) in seen
                    or ("B", stage + 1, microbatch) in seen)
        return True

    while any(head < len(order) for head, order in zip(heads, pending)):
        progress = False
        for rank, order in enumerate(pending):
            if heads[rank] >= len(order):
                continue
            action = order[heads[rank]]
            parts = (action,) if isinstance(action, _Action) else _parts(action)
            if not all(isinstance(part, _Action) or ready(part, history[rank])
                       for part in parts):
                continue
            result[rank].append(action)
            for part in parts:
                history[rank].add(tuple(part))
                if isinstance(part, _Action) or not crosses(part):
                    continue
                forward = part.kind == "F"
                send = _Action("SEND_F" if forward else "SEND_B", part.stage, part.microbatch)
                peer_stage = part.stage + 1 if forward else part.stage - 1
                recv = _Action("RECV_F" if forward else "RECV_B", peer_stage, part.microbatch)
                result[rank].append(send)
                history[rank].add(tuple(send))
                peer = stage_device[peer_stage]
                result[peer].append(recv)
                history[peer].add(tuple(recv))
            heads[rank] += 1
            progress = True
        if not progress:
            stuck = [f"device {rank} at {order[heads[rank]]}" for rank, order
                     in enumerate(pending) if heads[rank] < len(order)]
            raise DeadlockError(f"PyTorch cannot place SEND/RECV for this table: no device can "
                                f"take its next step ({'; '.join(stuck[:8])}"
                                f"{'; ...' if len(stuck) > 8 else ''}); the row orders "
                                f"contradict the dependencies")
    return result


def write_pytorch(table: ScheduleTable, path: str | os.PathLike[str], *,
                  format: str = "compute_only", drop_metadata: bool = False) -> None:
    """Write ``table`` as PyTorch CSV (``format``: compute_only or compute_comms), atomically.

    ``drop_metadata``: write a table whose metadata the file cannot hold (see
    :func:`to_compute_only`); by default it is refused.
    """
    if format not in FORMATS:
        raise InvalidParameterError(f"format {format!r} is not one of {', '.join(FORMATS)}")
    try:
        text = (to_compute_only(table, drop_metadata=drop_metadata) if format == "compute_only"
                else to_compute_comms(table, drop_metadata=drop_metadata))
    except InvalidScheduleError as error:
        raise InvalidScheduleError(f"{os.fspath(path)}: {error}") from None
    atomic_write(path, text, newline="")


# ------------------------------------------------------------------ stage maps
def torch_stage_to_device(num_devices, num_stages, style):
    """PyTorch's stage -> rank map of a style (``generate_stage_to_rank_mapping``).

    ``loop``: stage ``s`` on device ``s mod D``. ``v``: down the devices and back
    up, keeping the device at each turn (stages ``D-1`` and ``D`` share the last
    device); needs ``S`` to be a multiple of ``D``.

    >>> torch_stage_to_device(4, 8, "loop")
    [0, 1, 2, 3, 0, 1, 2, 3]
    >>> torch_stage_to_device(4, 8, "v")
    [0, 1, 2, 3, 3, 2, 1, 0]
    """
    if style not in STAGE_MAPS:
        raise InvalidParameterError(f"stage map {style!r} is not one of {', '.join(STAGE_MAPS)}")
    if style == "loop":
        return [stage % num_devices for stage in range(num_stages)]
    if num_stages % num_devices:
        raise InvalidParameterError(f"a v stage map needs the stages ({num_stages}) to be a "
                                    f"multiple of the devices ({num_devices})")
    return [stage % num_devices if (stage // num_devices) % 2 == 0
            else num_devices - 1 - stage % num_devices for stage in range(num_stages)]


def stage_map(table):
    """PyTorch's name for the table's stage -> device map: ``"loop"``, ``"v"`` or None.

    A table with one stage per device is ``"loop"`` (the two styles agree there).
    None if a stage runs on several devices or the map is neither style.

    >>> from tabsched import ScheduleTable
    >>> stage_map(ScheduleTable([["0F0", "3F0", "3B0", "0B0"], ["1F0", "2F0", "2B0", "1B0"]]))
    'v'
    """
    placement = table.placement()
    if any(len(devices) != 1 for devices in placement.values()):
        return None
    actual = [placement[stage][0] for stage in range(table.num_stages)]
    for style in STAGE_MAPS:
        if style == "v" and table.num_stages % table.num_devices:
            continue
        if actual == torch_stage_to_device(table.num_devices, table.num_stages, style):
            return style
    return None


def describe_stage_map(table):
    """One line for ``tabsched show``: the map's PyTorch name and what it means."""
    style = stage_map(table)
    D, S = table.num_devices, table.num_stages
    if style == "loop":
        return (f"loop (stage s on device s mod {D})" if S > D
                else "loop (stage s on device s)")
    if style == "v":
        return f"v (stages 0..{D - 1} down the devices, {D}..{2 * D - 1} back up, and so on)"
    refusal = pytorch_refusal(table)
    if refusal is not None and "runs on devices" in refusal:
        return "none: " + refusal.split(": ", 1)[1]
    placement = table.placement()
    pairs = ", ".join(f"{stage}->{devices[0]}" for stage, devices in sorted(placement.items()))
    return f"custom, neither PyTorch's loop nor v (stage->device {pairs})"
