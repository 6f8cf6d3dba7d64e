"""Reading and writing tables: PyTorch's compute_only CSV, JSON, a terminal grid.

CSV is byte-compatible with ``torch.distributed.pipelining``'s compute_only
format: one row per device, no header, an empty cell per idle slot, cells such
as ``3F12`` or ``(0F7;7B3)OVERLAP_F_B``, written by ``csv.writer`` (so lines end
in ``\\r\\n``). A table's ``grad_sync`` stages are written as PyTorch's
``<stage>REDUCE_GRAD`` cells, as its single-stage classes write them. JSON holds
the same rows plus the metadata CSV cannot hold: microbatch sizes, the layers of
each stage, the family and its parameters.

Files are untrusted. Every reading error names the file and the place
(``path: device 3, slot 17: ...``) on one line; ids are bounded by the table's
own content before anything is sized from them; a JSON document is checked
against one schema, key by key. Formats never lose data silently: a writer that
cannot hold part of a table refuses it, naming what would be lost, unless told to
drop it (``drop_metadata=True``).

Every file is written through :func:`tabsched.files.atomic_write` (also
importable from here): the content goes to a temporary file in the same folder,
which replaces the target only once written in full, so a failed write (disk
full, quota, ``ulimit -f``) leaves the previous file as it was and no partial
file behind.
"""

from __future__ import annotations

import csv
import io as _io
import json
import math
import os
import re
import shutil
from typing import Any

import numpy as np

from tabsched.cells import (BACKWARD, KINDS_AS_WRITTEN, REDUCE_GRAD, SIMPLE_OP, WEIGHT_GRAD,
                            Action, Op, Overlap, cut, parse_token, shown, shown_repr)
from tabsched.exceptions import InvalidScheduleError
from tabsched.files import (atomic_write, check_output_folder, check_output_path,  # noqa: F401
                            make_output_folder, read_text)
from tabsched.table import ScheduleTable


__all__ = ["read_table", "write_table", "read_csv", "write_csv", "to_csv", "from_csv",
           "read_json", "write_json", "to_json", "from_json", "render_grid",
           "TABLE_SUFFIXES", "csv_loss", "atomic_write", "check_output_path",
           "check_output_folder"]

JSON_FORMAT = "tabsched.table"
JSON_VERSION = 1
TABLE_SUFFIXES = (".csv", ".json")


# ------------------------------------------------------------------ reading rows
def parse_rows(raw_rows, source, parse=parse_token, row_name="line", kinds=KINDS_AS_WRITTEN):
    """Cells of every row, the Actions met, and the first empty cell.

    The rules every table reader shares, CSV and JSON alike: at least one row;
    a cell is one line (a quoted line break is an error); an Action takes an
    idle slot, except at the end of its row, where it takes none (PyTorch's
    single-stage classes end each row with ``REDUCE_GRAD``); every row runs at
    least one operation. ``row_name`` says what a row is in the file's terms
    (a CSV ``line``, a JSON ``row``). A cell ``<stage><kind><microbatch>`` with
    ids of at most 9 digits and a letter in ``kinds`` is read at once as
    ``Op(kinds[letter], stage, microbatch)``; every other cell goes to ``parse``.

    Returns
    -------
    rows : list of lists of None, Op or Overlap
    actions : list of (device, slot, Action)
    first_empty : (device, slot) of the first empty cell, or None
    """
    rows, actions, first_empty = [], [], None
    simple = SIMPLE_OP.fullmatch
    for device, raw in enumerate(raw_rows):
        joined = "\x1f".join(raw)
        if "\n" in joined or "\r" in joined:
            slot = next(slot for slot, token in enumerate(raw) if "\n" in token or "\r" in token)
            raise InvalidScheduleError(f"{source}: device {device}, slot {slot}: "
                                       f"{shown(raw[slot])} spans several lines (a quoted line "
                                       f"break, or a quote never closed); a cell holds one "
                                       f"operation")
        row, trailing = [], 0
        for slot, token in enumerate(raw):
            match = simple(token)
            if match is not None and match[2] in kinds:
                row.append(Op(kinds[match[2]], int(match[1]), int(match[3])))
                trailing = 0
                continue
            try:
                cell = parse(token)
            except InvalidScheduleError as error:
                raise InvalidScheduleError(f"{source}: device {device}, slot {slot}: "
                                           f"{error}") from None
            if isinstance(cell, Action):
                actions.append((device, slot, cell))
                trailing += 1
                cell = None
            else:
                trailing = 0
                if cell is None and first_empty is None:
                    first_empty = (device, slot)
            row.append(cell)
        if trailing:
            del row[len(row) - trailing:]
        if all(cell is None for cell in row):
            what = ("compute operations" if any(token.strip() for token in raw)
                    else "operations")
            raise InvalidScheduleError(f"{source}: device {device} ({row_name} {device + 1}) has "
                                       f"no {what}; every row of a schedule runs something")
        rows.append(row)
    if not rows:
        raise InvalidScheduleError(f"{source}: no rows; expected one row per device")
    return rows, actions, first_empty


def rows_to_table(rows, *, source, **metadata):
    """A table from parsed rows, inferring the microbatch count from stage 0."""
    if "num_microbatches" not in metadata and "microbatch_sizes" not in metadata:
        first_stage = {part.microbatch for row in rows for cell in row if cell is not None
                       for part in (cell.parts if isinstance(cell, Overlap) else (cell,))
                       if part.stage == 0 and part.kind == "F"}
        if first_stage:
            metadata["num_microbatches"] = len(first_stage)
    try:
        return ScheduleTable(rows, **metadata)
    except InvalidScheduleError as error:
        raise InvalidScheduleError(f"{source}: {error}") from None


def apply_reduce_grad(table, actions, source, notes=None):
    """The table with ``grad_sync`` from its ``REDUCE_GRAD`` cells, each checked.

    A ``REDUCE_GRAD`` must name a stage its device runs, appear once per stage
    and device, and come after the stage's last backward there (PyTorch reduces
    once the gradients are complete). One that comes later than right after it
    adds a note: tabsched starts the sync at the end of that backward.
    """
    if not any(cell.kind == REDUCE_GRAD for _, _, cell in actions):
        return table
    placement = table.placement()
    bounds = np.searchsorted(table.device, np.arange(table.num_devices + 1))
    is_backward = (table.kind == BACKWARD) | (table.kind == WEIGHT_GRAD)
    reduced, late = {}, []
    for device, slot, cell in actions:
        where = f"{source}: device {device}, slot {slot}: {cell}"
        if cell.kind != REDUCE_GRAD:
            continue
        if device not in placement.get(cell.stage, ()):
            runs = sorted(stage for stage, devices in placement.items() if device in devices)
            raise InvalidScheduleError(f"{where}: stage {cell.stage} does not run on device "
                                       f"{device} (it runs stage{'s' if len(runs) > 1 else ''} "
                                       f"{', '.join(map(str, runs[:8]))}"
                                       f"{', ...' if len(runs) > 8 else ''})")
        if (cell.stage, device) in reduced:
            raise InvalidScheduleError(f"{where} appears twice (also at slot "
                                       f"{reduced[(cell.stage, device)]})")
        reduced[(cell.stage, device)] = slot
        lo, hi = int(bounds[device]), int(bounds[device + 1])
        mine = lo + np.flatnonzero(is_backward[lo:hi] & (table.stage[lo:hi] == cell.stage))
        last = int(mine[-1])
        if int(table.slot[last]) > slot:
            raise InvalidScheduleError(
                f"{where} comes before {table.op(last)} (slot {int(table.slot[last])}), a "
                f"backward of stage {cell.stage}; PyTorch would reduce gradients that are not "
                f"complete")
        between = np.unique(table.slot[lo:hi][(table.slot[lo:hi] > table.slot[last])
                                              & (table.slot[lo:hi] < slot)])
        if len(between):
            late.append(f"{cell} on device {device} comes {len(between)} compute cell"
                        f"{'s' if len(between) > 1 else ''} after {table.op(last)}")
    if late and notes is not None:
        notes.append("the gradient sync starts at the end of the stage's last backward even "
                     "where REDUCE_GRAD comes later: " + "; ".join(late))
    if reduced:
        table = table.replace(grad_sync=sorted({stage for stage, _ in reduced}))
    return table


# ------------------------------------------------------------------------ CSV
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


def refuse_unreadable(table, format_name):
    """Refuse a table with a device that runs nothing: no reader takes such a row back."""
    counts = np.bincount(table.device, minlength=table.num_devices)
    idle = np.flatnonzero(counts == 0)
    if len(idle):
        raise InvalidScheduleError(f"a {format_name} cannot hold this table: device "
                                   f"{int(idle[0])} runs nothing, and every row of a schedule "
                                   f"file runs something")


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


# ----------------------------------------------------------------------- JSON
#: The deepest nesting a table document needs is 3 (object, rows, row); anything
#: much deeper is not a table, and Python's parser would recurse on it.
MAX_JSON_DEPTH = 32
_JSON_KEYS = ("format", "version", "family", "params", "num_stages", "microbatch_sizes",
              "stage_layers", "rows", "grad_sync")
_MAX_NAME = 200


def to_json(table: ScheduleTable, *, indent: int | None = None) -> str:
    """JSON text: the rows and the metadata CSV cannot hold.

    Refuses a table with a device that runs nothing, which no reader takes back.
    """
    refuse_unreadable(table, "JSON table")
    data = {
        "format": JSON_FORMAT,
        "version": JSON_VERSION,
        "family": table.family,
        "params": table.params,
        "num_stages": table.num_stages,
        "microbatch_sizes": list(table.microbatch_sizes),
        "stage_layers": list(table.stage_layers) if table.stage_layers is not None else None,
        "rows": [["" if cell is None else str(cell) for cell in row] for row in table.rows],
    }
    if table.grad_sync is not None:  # only tables that say which stages sync carry the key
        data["grad_sync"] = list(table.grad_sync)
    return json.dumps(data, indent=indent)


def _json_depth(text):
    """The deepest nesting of brackets in JSON text, strings skipped (no recursion).

    >>> _json_depth('{"rows": [["0F0", "[["]]}')
    3
    """
    outside = _JSON_STRING.sub("", text).encode("utf-8", "replace")
    codes = np.frombuffer(outside, dtype=np.uint8)
    steps = (np.isin(codes, _OPENING).astype(np.int64) - np.isin(codes, _CLOSING))
    return int(np.cumsum(steps).max(initial=0))


_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_OPENING = np.frombuffer(b"[{", dtype=np.uint8)
_CLOSING = np.frombuffer(b"]}", dtype=np.uint8)


def _load_json(text, source):
    """``json.loads`` for untrusted text: no NaN or Infinity, no duplicate keys, bounded."""
    def constant(name):
        raise InvalidScheduleError(f"{source}: {name} is not a number a table may hold")

    def number(text_value):
        value = float(text_value)
        if not math.isfinite(value):
            raise InvalidScheduleError(f"{source}: {shown(text_value)} is out of range")
        return value

    def integer(text_value):
        if len(text_value.lstrip("-")) > 18:
            raise InvalidScheduleError(f"{source}: the integer {cut(text_value, 24)} "
                                       f"is out of range")
        return int(text_value)

    def pairs(items):
        data = {}
        for key, value in items:
            if key in data:
                raise InvalidScheduleError(f"{source}: key {shown(key)} appears twice in one "
                                           f"object")
            data[key] = value
        return data

    if _json_depth(text) > MAX_JSON_DEPTH:
        raise InvalidScheduleError(f"{source}: not a table: nested more than "
                                   f"{MAX_JSON_DEPTH} levels deep")
    try:
        return json.loads(text, parse_constant=constant, parse_float=number,
                          parse_int=integer, object_pairs_hook=pairs)
    except json.JSONDecodeError as error:
        raise InvalidScheduleError(f"{source}: not valid JSON: {error.msg} at line "
                                   f"{error.lineno}, column {error.colno}") from None
    except RecursionError:
        raise InvalidScheduleError(f"{source}: not a table: nested too deeply") from None


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_document(data, source):
    """The JSON table document checked key by key (types and ranges; one schema).

    Returns the metadata keyword arguments it states. Consistency with the rows
    is checked once the rows are read (:func:`_check_against_rows`).
    """
    def fail(key, message):
        raise InvalidScheduleError(f'{source}: "{key}" {message}')

    if not isinstance(data, dict):
        raise InvalidScheduleError(f'{source}: expected a JSON object with "rows"')
    unknown = [key for key in data if key not in _JSON_KEYS]
    if unknown:
        raise InvalidScheduleError(f"{source}: unknown key {shown(unknown[0])}; valid keys: "
                                   f"{', '.join(sorted(_JSON_KEYS))}")
    if data.get("format", JSON_FORMAT) != JSON_FORMAT:
        fail("format", f"is {shown_repr(data['format'])}, expected {JSON_FORMAT!r}")
    version = data.get("version", JSON_VERSION)
    if not _is_int(version) or not 1 <= version <= JSON_VERSION:
        fail("version", f"is {shown_repr(version)}; this tabsched reads version "
                        f"{JSON_VERSION}")
    rows = data.get("rows")
    if not isinstance(rows, list) or not all(isinstance(row, list) for row in rows):
        fail("rows", "must be a list of lists of cells")
    metadata = {}
    family = data.get("family")
    if family is not None:
        if not isinstance(family, str) or not family.strip() or len(family) > _MAX_NAME:
            fail("family", f"must be a family name, not {shown_repr(family)}")
        metadata["family"] = family
    params = data.get("params")
    if params is not None:
        if not isinstance(params, dict):
            fail("params", f"must be an object of parameter values, not {shown_repr(params)}")
        def scalar(value):
            return (value is None or isinstance(value, bool) or _is_number(value)
                    or (isinstance(value, str) and len(value) <= _MAX_NAME))
        for name, value in params.items():
            listed = isinstance(value, list) and all(scalar(entry) for entry in value)
            if not (scalar(value) or listed) or len(name) > _MAX_NAME:
                fail("params", f"{shown(name)} must be a number, text, true/false, null or a "
                               f"list of them, not {shown_repr(value)}")
        metadata["params"] = params
    num_stages = data.get("num_stages")
    if num_stages is not None:
        if not _is_int(num_stages) or num_stages < 1:
            fail("num_stages", f"must be an integer >= 1, not {shown_repr(num_stages)}")
        metadata["num_stages"] = num_stages
    sizes = data.get("microbatch_sizes")
    if sizes is not None:
        if not isinstance(sizes, list) or not sizes or not all(
                _is_number(size) and size > 0 for size in sizes):
            fail("microbatch_sizes", f"must be a list of positive numbers, not "
                                     f"{shown_repr(sizes)}")
        metadata["microbatch_sizes"] = sizes
    layers = data.get("stage_layers")
    if layers is not None:
        if not isinstance(layers, list) or not all(_is_int(count) and count >= 0
                                                   for count in layers):
            fail("stage_layers", f"must be a list of layer counts (integers >= 0), not "
                                 f"{shown_repr(layers)}")
        metadata["stage_layers"] = layers
    grad_sync = data.get("grad_sync")
    if grad_sync is not None:
        if not isinstance(grad_sync, list) or not all(_is_int(stage) and stage >= 0
                                                      for stage in grad_sync):
            fail("grad_sync", f"must be a list of stages (integers >= 0), not "
                              f"{shown_repr(grad_sync)}")
        metadata["grad_sync"] = grad_sync
    return rows, metadata


def _check_against_rows(table, metadata, source):
    """Metadata lengths and ranges against the table the rows make."""
    S, M = table.num_stages, table.num_microbatches
    if metadata.get("num_stages", S) != S:
        raise InvalidScheduleError(f'{source}: "num_stages" is {metadata["num_stages"]}, but '
                                   f'the rows hold stages 0..{S - 1}')
    sizes = metadata.get("microbatch_sizes")
    if sizes is not None and len(sizes) != M:
        raise InvalidScheduleError(f'{source}: "microbatch_sizes" has {len(sizes)} entries, '
                                   f'but the rows hold microbatches 0..{M - 1}')
    layers = metadata.get("stage_layers")
    if layers is not None and len(layers) != S:
        raise InvalidScheduleError(f'{source}: "stage_layers" has {len(layers)} entries, but '
                                   f'the rows hold stages 0..{S - 1}')
    grad_sync = metadata.get("grad_sync")
    if grad_sync is not None:
        outside = [stage for stage in grad_sync if stage >= S]
        if outside:
            raise InvalidScheduleError(f'{source}: "grad_sync" names stage {outside[0]}, but '
                                       f'the rows hold stages 0..{S - 1}')
        if table.grad_sync is not None and tuple(sorted(set(grad_sync))) != table.grad_sync:
            raise InvalidScheduleError(f'{source}: "grad_sync" is {sorted(set(grad_sync))[:8]}, '
                                       f'but the rows\' REDUCE_GRAD cells name stages '
                                       f'{list(table.grad_sync)[:8]}')


def from_json(text: str, *, source: str = "<json>") -> ScheduleTable:
    """Parse the JSON form of a table.

    The document is checked against one schema (each key's type and range, its
    lengths against the rows) and its rows are read by the same rules as a CSV
    file's (:func:`parse_rows`); every error names the key or the cell.
    """
    data = _load_json(text, source)
    raw_rows, metadata = _check_document(data, source)
    texts = []
    for device, row in enumerate(raw_rows):
        for slot, token in enumerate(row):
            if token is not None and not isinstance(token, str):
                raise InvalidScheduleError(f"{source}: device {device}, slot {slot}: "
                                           f"{shown_repr(token)} is not a cell string")
        texts.append([token or "" for token in row])
    rows, actions, _ = parse_rows(texts, source, row_name="row")
    table = apply_reduce_grad(rows_to_table(rows, source=source), actions, source)
    _check_against_rows(table, metadata, source)
    if metadata:
        try:
            table = table.replace(**metadata)
        except InvalidScheduleError as error:
            raise InvalidScheduleError(f"{source}: {error}") from None
    return table


def read_json(path):
    """Read a table written by :func:`write_json` (or by hand, to the same schema)."""
    return from_json(read_text(path), source=os.fspath(path))


def write_json(table, path):
    """Write ``table`` as JSON with its metadata (atomically)."""
    atomic_write(path, to_json(table, indent=1) + "\n")


# ------------------------------------------------------------------ dispatch
def _suffix(path):
    return os.path.splitext(os.fspath(path))[1].lower()


def read_table(path: str | os.PathLike[str], **options: Any) -> ScheduleTable:
    """Read a ``.csv`` (PyTorch compute_only) or ``.json`` table."""
    suffix = _suffix(path)
    if suffix == ".csv":
        return read_csv(path, **options)
    if suffix == ".json":
        return read_json(path)
    raise InvalidScheduleError(f"{path}: unknown table format {suffix or '(no suffix)'!r}; "
                               f"expected one of {', '.join(TABLE_SUFFIXES)}")


def write_table(table: ScheduleTable, path: str | os.PathLike[str], *,
                drop_metadata: bool = False) -> None:
    """Write ``table`` by the suffix of ``path``: ``.csv`` or ``.json``, atomically.

    A ``.csv`` refuses a table whose metadata it cannot hold unless
    ``drop_metadata`` (see :func:`csv_loss`); ``.json`` keeps everything.
    """
    suffix = _suffix(path)
    if suffix == ".csv":
        return write_csv(table, path, drop_metadata=drop_metadata)
    if suffix == ".json":
        return write_json(table, path)
    raise InvalidScheduleError(f"{path}: unknown table format {suffix or '(no suffix)'!r}; "
                               f"expected one of {', '.join(TABLE_SUFFIXES)}")


# ----------------------------------------------------------------------- grid
def _grid_token(cell):
    if cell is None:
        return "."
    if isinstance(cell, Overlap):
        return "+".join(str(part) for part in cell.parts)
    return str(cell)


def render_grid(table: ScheduleTable, *, width: int | None = None) -> str:
    """The table as a text grid that wraps into bands to fit ``width`` columns.

    Idle slots show as ``.``; an overlapped cell as ``0F7+7B3``. A ruler above
    each band numbers every fifth slot. Each column is as wide as its widest
    cell, so a few overlapped cells do not widen the whole grid. When a device
    holds several stages (multi-chunk and bidirectional families) a legend
    under the title lists them, marking stages that live on several devices
    (replicas); a table with ``stage_layers`` shows them too.

    >>> from tabsched.schedules import generate
    >>> print(render_grid(generate("1f1b", devices=2, microbatches=2), width=80))
    1f1b devices=2 microbatches=2: 2 devices x 6 slots, 2 stages, 2 microbatches
    slot 0                 5
    d0   0F0 0F1 .   0B0 .   0B1
    d1   .   1F0 1B0 1F1 1B1 .
    """
    if width is None:
        width = shutil.get_terminal_size((120, 24)).columns
    rows = table.rows
    tokens = [[_grid_token(cell) for cell in row] for row in rows]
    slots = table.num_slots
    widths = [max([len(row[slot]) for row in tokens if slot < len(row)] + [1])
              for slot in range(slots)]
    label_width = max(5, len(f"d{max(table.num_devices - 1, 0)}") + 1)
    params = " ".join(f"{key}={value}" for key, value in table.params.items())
    title = f"{table.family} {params}: " if table.family else ""
    lines = [f"{title}{table.num_devices} devices x {slots} slots, {table.num_stages} stages, "
             f"{table.num_microbatches} microbatches"]
    lines.extend(_legend(table, width))
    band_start = 0
    while band_start < max(slots, 1):
        band_end, used = band_start, label_width
        while band_end < slots and (band_end - band_start < 5
                                    or used + widths[band_end] + 1 <= width):
            used += widths[band_end] + 1
            band_end += 1
        band_widths = widths[band_start:band_end]
        lines.append(("slot".ljust(label_width)
                      + _fit_ruler(band_start, band_end, band_widths)).rstrip())
        for device, row in enumerate(tokens):
            cells = [row[slot] if slot < len(row) else "" for slot in range(band_start, band_end)]
            lines.append((f"d{device}".ljust(label_width)
                          + " ".join(token.ljust(w) for token, w in zip(cells, band_widths))
                          ).rstrip())
        band_start = max(band_end, band_start + 1)
    return "\n".join(lines)


def _legend(table, width):
    """Lines naming the stages of each device, when some device holds several."""
    placement = table.placement()
    held = [[] for _ in range(table.num_devices)]
    for stage, devices in sorted(placement.items()):
        for device in devices:
            held[device].append(stage)
    lines = []
    if any(len(stages) > 1 for stages in held):
        entries = [f"d{device}: " + ",".join(map(str, stages))
                   for device, stages in enumerate(held)]
        lines.extend(_wrap_entries("stages on each device:", entries, width))
        replicated = [stage for stage, devices in sorted(placement.items()) if len(devices) > 1]
        if replicated:
            which = ("every stage" if len(replicated) == table.num_stages
                     else "stages " + ",".join(map(str, replicated)))
            copies = max(len(devices) for devices in placement.values())
            lines.append(f"replicas: {which} on up to {copies} devices, each microbatch on one")
    if table.stage_layers is not None:
        lines.extend(_wrap_entries("layers per stage:", [str(n) for n in table.stage_layers],
                                   width))
    return lines


def _wrap_entries(head, entries, width):
    """``head`` then the entries two spaces apart, continued on indented lines."""
    lines, line = [], head
    for entry in entries:
        if len(line) + 2 + len(entry) > width and line.strip():
            lines.append(line)
            line = ""
        line += "  " + entry
    lines.append(line)
    return lines


def _fit_ruler(band_start, band_end, widths):
    """Slot numbers at every fifth slot, dropping any that would touch its neighbour."""
    offsets = [0]
    for w in widths:
        offsets.append(offsets[-1] + w + 1)
    ruler = [" "] * offsets[-1]
    for slot in range(band_start, band_end):
        if slot % 5:
            continue
        label = str(slot)
        at = offsets[slot - band_start]
        if all(ch == " " for ch in ruler[max(0, at - 1):at + len(label) + 1]):
            ruler[at:at + len(label)] = label
    return "".join(ruler)
