"""PyTorch pipelining's schedule CSVs: read both formats, write compute_only.

``torch.distributed.pipelining`` stores a schedule as CSV, one row per rank,
written by ``csv.writer`` (lines end in ``\\r\\n``). This module reads and
writes its formats without importing torch; a file read is a
:class:`TorchSchedule`: its table and what the table cannot hold.

Formats
-------
``compute_only``
    The compute cells a schedule class builds (``_dump_csv(format=
    "compute_only")``, ``_schedule_visualizer.get_schedule_ops``); an empty
    cell is idle. Single-stage classes (``Schedule1F1B``, ``ScheduleGPipe``)
    also put a ``REDUCE_GRAD`` cell after each stage's last backward.
``compute_comms``
    What PyTorch's runtime executes after lowering a compute_only schedule:
    FSDP, gradient-sync and SEND/RECV actions around the compute
    (:mod:`tabsched.formats.pytorch_comms`). A file with any SEND or RECV cell
    is read as compute_comms.

Tokens
------
``<stage><kind><microbatch>``: ``F`` forward, ``I`` input-grad backward, ``W``
weight-grad backward, ``B`` full backward, and ``(<op>;<op>)OVERLAP_F_B`` for a
forward and a backward run as one step (DualPipeV). Earlier releases of
torch.distributed.pipelining used ``B`` for the input-grad backward and ``BW``
for the full backward: read such files with ``legacy=True`` (CLI
``--torch-legacy``), since the same letter meant something else. The grammar
is :func:`tabsched.cells.parse_torch_token`'s.

An ``OVERLAP_F_B`` cell is one step (one node when lowered): it starts when
the inputs of both parts are there, its outputs appear when it ends, and it
lasts the sum of its parts times the cost model's ``overlap``. That is the
overlapped execution DualPipeV is built for (a registered ``OVERLAP_F_B``
function); PyTorch's runtime without one runs the parts one after the other,
which can start the forward earlier than tabsched does.

``UNSHARD`` and ``RESHARD`` (``<stage>UNSHARD``) fetch and free FSDP-sharded
parameters: their positions are kept as the schedule's FSDP windows
(:func:`~tabsched.formats.pytorch_comms.fsdp_windows`), which an execution with
``zero_stage`` 3 prices (the all-gather issued where the file issues it) and
every other execution runs free, as PyTorch does without FSDP.
``REDUCE_GRAD`` becomes the table's ``grad_sync`` for its stage: one gradient
sync after the stage's last backward (see :func:`tabsched.lower.lower`).

Writing
-------
:func:`to_compute_only` writes the table as it is, and
:func:`~tabsched.formats.pytorch_comms.to_compute_comms` as PyTorch's runtime
lowers it. Both refuse what PyTorch cannot express
(:func:`~tabsched.formats.pytorch_ranks.pytorch_refusal`): a stage on two
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
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from tabsched.cells import (COMM_ACTIONS, FORWARD, FSDP_ACTIONS, TOKEN_KINDS, Overlap,
                            parse_torch_token)
from tabsched.evaluate import evaluate
from tabsched.exceptions import InvalidParameterError, InvalidScheduleError
from tabsched.files import atomic_write, read_text
from tabsched.formats.cell_arrays import Cells, is_comm, read_plain
from tabsched.formats.pytorch_comms import comm_edges, fsdp_windows, to_compute_comms, unit_layout
from tabsched.formats.pytorch_ranks import check_expressible
from tabsched.formats.rows import apply_reduce_grad, parse_rows, rows_to_table
from tabsched.formats.table_csv import csv_row_texts, csv_rows, refuse_loss, write_rows
from tabsched.lower import lower
from tabsched.table import ScheduleTable

__all__ = ["TorchSchedule", "read_pytorch", "from_pytorch_csv", "to_compute_only",
           "pytorch_text", "write_pytorch", "FORMATS", "P2P_MODES"]

FORMATS = ("compute_only", "compute_comms")
P2P_MODES = ("ordered", "free")


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
        How the communication was read (see :mod:`tabsched.formats.pytorch_comms`).
    shard_windows : tuple of int arrays or None
        The file's UNSHARD..RESHARD windows ``(stage, issue, first, last)``
        (:func:`~tabsched.formats.pytorch_comms.fsdp_windows`), for ZeRO-3.
    """

    table: object
    format: str
    notes: list = field(default_factory=list)
    transfer_after: tuple | None = None
    p2p: str = "ordered"
    shard_windows: tuple | None = None

    def evaluate(self, costs=None, **options):
        """:func:`tabsched.evaluate` with the file's communication order and notes.

        >>> schedule = from_pytorch_csv("0F0,0SEND_F0,0RECV_B0,0B0\\r\\n"
        ...                             "1RECV_F0,1F0,1B0,1SEND_B0\\r\\n")
        >>> schedule.evaluate().makespan
        6.0
        """
        result = evaluate(self.table, costs, transfer_after=self.transfer_after,
                          shard_windows=self.shard_windows, **options)
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
    """Parse PyTorch schedule CSV text (see :func:`read_pytorch`).

    A plain file is read as arrays (:mod:`tabsched.formats.cell_arrays`); any other,
    and every file with a problem, by the general reader, which names the problem.
    """
    if format is not None and format not in FORMATS:
        raise InvalidParameterError(f"format {format!r} is not one of {', '.join(FORMATS)}")
    if p2p not in P2P_MODES:
        raise InvalidParameterError(f"p2p {p2p!r} is not one of {', '.join(P2P_MODES)}")
    table, extras, comms = (_read_plain(text, legacy, format)
                            or _read_general(text, source, legacy, format))
    format = format or ("compute_comms" if len(comms) else "compute_only")
    notes = []
    if legacy:
        notes.append("read PyTorch's legacy tokens: B as input-grad (I), BW as full backward (B)")
    table = _apply_extras(table, extras, source, notes)
    windows = fsdp_windows(table, extras, source)
    if format == "compute_only":
        return TorchSchedule(table, format, notes, shard_windows=windows)
    transfer_after = comm_edges(table, comms, source, p2p)
    notes.append(f"{len(comms) // 2} SEND/RECV pairs are the transfers, each starting once its "
                 f"SEND and RECV are reached" + (" and, between two devices, in the order both "
                                                 "list them" if p2p == "ordered" else ""))
    table = unit_layout(table)
    return TorchSchedule(table, format, notes, transfer_after, p2p, windows)


def _read_plain(text, legacy, format):
    """``(table, extras, comms)`` of a plain file without a problem, else None."""
    plain = read_plain(text, legacy)
    if plain is None:
        return None
    comm = is_comm(plain.actions.word)
    has_comms = bool(comm.any())
    if has_comms and format == "compute_only" or plain.first_empty is not None and (
            format == "compute_comms" or format is None and has_comms):
        return None
    device, slot, kind, stage, microbatch = plain.ops
    metadata = {}
    first_stage = np.unique(microbatch[(stage == 0) & (kind == FORWARD)])
    if len(first_stage):
        metadata["num_microbatches"] = len(first_stage)
    try:
        table = ScheduleTable.from_arrays(device, slot, kind, stage, microbatch,
                                          plain.row_lengths, **metadata)
    except InvalidScheduleError:
        return None
    return table, plain.actions.take(~comm).entries(), plain.actions.take(comm)


def _read_general(text, source, legacy, format):
    """``(table, extras, comms)`` of any file; raises naming the first problem."""
    rows, actions, empty = parse_rows(csv_rows(text, source), source,
                                      parse=lambda token: parse_torch_token(token, legacy),
                                      kinds=TOKEN_KINDS[legacy])
    comms = [entry for entry in actions if entry[2].kind in COMM_ACTIONS]
    extras = [entry for entry in actions if entry[2].kind not in COMM_ACTIONS]
    format = format or ("compute_comms" if comms else "compute_only")
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
    return table, extras, Cells.from_entries(comms)


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


def _apply_extras(table, extras, source, notes):
    """Check UNSHARD/RESHARD/REDUCE_GRAD cells; the table with its grad_sync."""
    if not extras:
        return table
    placement = table.placement()
    dropped = defaultdict(int)
    for device, slot, cell in extras:
        if cell.kind in FSDP_ACTIONS:
            if device not in placement.get(cell.stage, ()):
                runs = sorted(stage for stage, devices in placement.items() if device in devices)
                raise InvalidScheduleError(f"{_where(source, device, slot)}: {cell}: stage "
                                           f"{cell.stage} does not run on device {device} (it "
                                           f"runs stage{'s' if len(runs) > 1 else ''} "
                                           f"{', '.join(map(str, runs[:8]))}"
                                           f"{', ...' if len(runs) > 8 else ''})")
            dropped[cell.kind] += 1
    if dropped:
        notes.append(f"read {dropped['UNSHARD']} UNSHARD and {dropped['RESHARD']} RESHARD "
                     f"cells as FSDP's parameter windows: all-gathers priced under zero_stage "
                     f"3, free otherwise")
    return apply_reduce_grad(table, extras, source, notes)


def to_compute_only(table, *, drop_metadata=False):
    """The compute_only CSV text of ``table``, as PyTorch's ``csv.writer`` writes it.

    Raises ``InvalidScheduleError`` with :func:`pytorch_refusal`'s reason for a
    table PyTorch cannot express, for one whose layers per stage or microbatch
    sizes the file cannot hold unless ``drop_metadata`` (see
    :func:`tabsched.formats.table_csv.csv_loss`), and ``DeadlockError`` naming a cycle for row
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
    check_expressible(table)
    refuse_loss(table, "PyTorch CSV", drop_metadata)
    _check_runs(table)
    return write_rows(csv_row_texts(table))


def _check_runs(table):
    """Raise ``DeadlockError`` (naming a cycle) if the row orders contradict the dependencies."""
    lowered = lower(table)
    lowered.run_summary(np.ones((1, lowered.num_nodes)))


def pytorch_text(table: ScheduleTable, *, format: str = "compute_only",
                 drop_metadata: bool = False) -> str:
    """The CSV text of ``table`` in PyTorch's ``format`` (compute_only or compute_comms):
    :func:`to_compute_only` or :func:`~tabsched.formats.pytorch_comms.to_compute_comms`."""
    if format not in FORMATS:
        raise InvalidParameterError(f"format {format!r} is not one of {', '.join(FORMATS)}")
    write = to_compute_only if format == "compute_only" else to_compute_comms
    return write(table, drop_metadata=drop_metadata)


def write_pytorch(table: ScheduleTable, path: str | os.PathLike[str], *,
                  format: str = "compute_only", drop_metadata: bool = False) -> None:
    """Write ``table`` as PyTorch CSV (``format``: compute_only or compute_comms), atomically.

    ``drop_metadata``: write a table whose metadata the file cannot hold (see
    :func:`to_compute_only`); by default it is refused.
    """
    try:
        text = pytorch_text(table, format=format, drop_metadata=drop_metadata)
    except InvalidScheduleError as error:
        raise InvalidScheduleError(f"{os.fspath(path)}: {error}") from None
    atomic_write(path, text, newline="")
