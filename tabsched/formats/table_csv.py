"""Tables as CSV: PyTorch's compute_only bytes.

CSV is byte-compatible with ``torch.distributed.pipelining``'s compute_only
format: one row per device, no header, an empty cell per idle slot, cells such
as ``3F12`` or ``(0F7;7B3)OVERLAP_F_B`` (:mod:`tabsched.cells`), written by
``csv.writer`` (so lines end in ``\\r\\n``). A table's ``grad_sync`` stages are
written as PyTorch's ``<stage>REDUCE_GRAD`` cells, as its single-stage classes
write them. The file holds the cells only: a table whose numbers depend on
metadata the cells cannot say (microbatch sizes, layers per stage) is refused,
naming what would be lost (:func:`csv_loss`), unless told to drop it
(``drop_metadata=True``); the family label is left out with a note
(:func:`csv_omits`).

Files are untrusted: reading follows :mod:`tabsched.formats.rows`, and every
error names the file and the place on one line.
"""

from __future__ import annotations

import csv
import io as _io
import os
from typing import Any

import numpy as np

from tabsched.cells import BACKWARD, REDUCE_GRAD, WEIGHT_GRAD, cut, shown_repr
from tabsched.exceptions import InvalidScheduleError
from tabsched.files import atomic_write, read_text
from tabsched.formats.rows import apply_reduce_grad, parse_rows, refuse_unreadable, rows_to_table
from tabsched.table import ScheduleTable

__all__ = ["to_csv", "from_csv", "read_csv", "write_csv", "csv_loss", "csv_omits", "csv_rows",
           "csv_row_texts", "write_rows", "refuse_loss"]


def csv_loss(table):
    """What a CSV (or PyTorch) file cannot hold of ``table`` that changes its numbers.

    A list of descriptions, empty when the cells say everything that evaluation
    reads: equal full-size microbatches and no layer split. ``grad_sync`` is kept,
    as ``REDUCE_GRAD`` cells. The family label, which only the formula level
    reads, is :func:`csv_omits`: writers drop it with a note rather than refuse.

    >>> from tabsched.schedules import generate
    >>> csv_loss(generate("1f1b", devices=2, microbatches=2))
    []
    >>> csv_loss(generate("1f1b", devices=2, microbatches=2, stage_layers="1,3"))
    ['the layers of each stage (1,3; a CSV reads back an even split)']
    """
    lost = []
    sizes = table.microbatch_sizes
    if any(size != 1.0 for size in sizes):
        listed = ", ".join(f"{size:g}" for size in sizes[:6])
        lost.append(f"the microbatch sizes ({listed}{', ...' if len(sizes) > 6 else ''}; a CSV "
                    f"reads back every microbatch at full size)")
    if table.stage_layers is not None:
        layers = table.stage_layers
        listed = ",".join(map(str, layers[:8]))
        lost.append(f"the layers of each stage ({listed}{',...' if len(layers) > 8 else ''}; a "
                    f"CSV reads back an even split)")
    if table.sequence_slices is not None:
        lost.append("the sequence slices (a CSV reads back every microbatch as whole "
                    "sequences)")
    return lost


def csv_omits(table):
    """The family label a CSV leaves out (it changes no number but the formula level's).

    >>> from tabsched.schedules import generate
    >>> csv_omits(generate("1f1b", devices=2, microbatches=2))
    ['the family and its parameters (1f1b devices=2 microbatches=2); read back, the table has no formula level']
    """
    if table.family is None and not table.params:
        return []
    params = " ".join(f"{key}={value}" for key, value in table.params.items())
    label = f"{table.family or ''} {params}".strip()
    label = label if len(label) <= 100 else label[:100] + "..."
    return [f"the family and its parameters ({label}); read back, the table has no formula "
            f"level" if table.family is not None else f"the table's parameters ({label})"]


def refuse_loss(table, format_name, drop_metadata, target=None):
    """Raise ``InvalidScheduleError`` if ``format_name`` would lose part of ``table``."""
    refuse_unreadable(table, format_name)
    lost = [] if drop_metadata else csv_loss(table)
    if lost:
        where = f"{target}: " if target else ""
        raise InvalidScheduleError(f"{where}a {format_name} cannot hold {'; '.join(lost)}: "
                                   f"write JSON (.json), which keeps them, or pass "
                                   f"drop_metadata=True to write the cells alone")


def csv_row_texts(table):
    """The text of every cell, row by row, with ``REDUCE_GRAD`` cells for ``grad_sync``.

    A stage's ``REDUCE_GRAD`` goes on each device that runs the stage, into the
    first idle slot after the stage's last backward there that a later compute
    cell follows, else at the end of the row. Read back, the first kind is an
    idle slot again and the second takes no slot: the table is the same.
    """
    texts = [["" if cell is None else str(cell) for cell in row] for row in table.rows]
    if not table.grad_sync:
        return texts
    is_backward = (table.kind == BACKWARD) | (table.kind == WEIGHT_GRAD)
    appended = [[] for _ in texts]
    wanted = []
    for stage in table.grad_sync:
        for device in table.placement().get(stage, ()):
            mine = np.flatnonzero(is_backward & (table.stage == stage) & (table.device == device))
            wanted.append((int(table.slot[mine[-1]]), device, stage))
    for last, device, stage in sorted(wanted):
        row = texts[device]
        busy = [slot for slot, text in enumerate(row) if text]
        free = next((slot for slot in range(last + 1, busy[-1] if busy else 0)
                     if not row[slot]), None)
        if free is None:
            appended[device].append((last, stage))
        else:
            row[free] = f"{stage}{REDUCE_GRAD}"
    for device, extra in enumerate(appended):
        texts[device].extend(f"{stage}{REDUCE_GRAD}" for _, stage in sorted(extra))
    return texts


def write_rows(rows):
    """CSV text of rows of cell texts, as ``csv.writer`` (and so PyTorch) writes it."""
    buffer = _io.StringIO(newline="")
    writer = csv.writer(buffer)
    for row in rows:
        writer.writerow(row)
    return buffer.getvalue()


def to_csv(table: ScheduleTable, *, drop_metadata: bool = False) -> str:
    """The compute_only CSV text of ``table`` (PyTorch's bytes, ``\\r\\n`` endings).

    Parameters
    ----------
    table : ScheduleTable
    drop_metadata : bool
        Write the cells even if the CSV cannot hold the table's microbatch
        sizes, layers per stage or family (see :func:`csv_loss`); by default
        such a table is refused, since it would read back different.

    Examples
    --------
    >>> from tabsched.schedules import generate
    >>> to_csv(generate("gpipe", devices=2, microbatches=1), drop_metadata=True)
    '0F0,,,0B0\\r\\n,1F0,1B0,\\r\\n'
    >>> to_csv(generate("gpipe", devices=2, microbatches=1).replace(grad_sync=[0, 1]),
    ...        drop_metadata=True)
    '0F0,,,0B0,0REDUCE_GRAD\\r\\n,1F0,1B0,,1REDUCE_GRAD\\r\\n'
    """
    refuse_loss(table, "CSV table", drop_metadata)
    return write_rows(csv_row_texts(table))


def from_csv(text: str, *, source: str = "<csv>", **metadata: Any) -> ScheduleTable:
    """Parse compute_only CSV text into a table (``source`` names it in errors).

    The number of microbatches is the number of forwards of stage 0 unless
    ``num_microbatches`` or ``microbatch_sizes`` is given: the first stage sees
    every microbatch that enters the pipeline, so a cell numbering one past them
    is reported where it stands. ``REDUCE_GRAD`` cells set ``grad_sync``.
    """
    rows, actions, _ = parse_rows(csv_rows(text, source), source)
    return apply_reduce_grad(rows_to_table(rows, source=source, **metadata), actions, source)


def csv_rows(text, source):
    """The rows of cell texts of a schedule CSV, after the checks every reader needs.

    A NUL byte, an empty file or text the csv module rejects (an unclosed quote,
    a field over its size limit) is an error naming ``source``; trailing empty
    lines are dropped.
    """
    if not isinstance(text, str):
        raise InvalidScheduleError(f"{source}: the CSV must be text (str), not "
                                   f"{shown_repr(text)}")
    if "\x00" in text:
        line = text[:text.index("\x00")].count("\n") + 1
        raise InvalidScheduleError(f"{source}: line {line} contains a NUL byte; "
                                   f"this is not a CSV schedule")
    if not text.strip():
        raise InvalidScheduleError(f"{source}: the file is empty; expected one row per device")
    reader = csv.reader(_io.StringIO(text, newline=""), strict=True)
    try:
        rows = list(reader)
    except csv.Error as error:
        raise InvalidScheduleError(f"{source}: line {reader.line_num}: not valid CSV: "
                                   f"{cut(error, 80)}") from None
    while rows and not rows[-1]:
        rows.pop()
    return rows


def read_csv(path, **metadata):
    """Read a compute_only CSV file."""
    return from_csv(read_text(path), source=os.fspath(path), **metadata)


def write_csv(table, path, *, drop_metadata=False):
    """Write ``table`` as compute_only CSV (atomically; see :func:`to_csv`)."""
    refuse_loss(table, "CSV table", drop_metadata, os.fspath(path))
    atomic_write(path, to_csv(table, drop_metadata=True), newline="")
