"""Reading and writing tables: PyTorch's compute_only CSV, JSON, a terminal grid.

CSV is byte-compatible with ``torch.distributed.pipelining``'s compute_only
format: one row per device, no header, an empty cell per idle slot, cells such
as ``3F12`` or ``(0F7;7B3)OVERLAP_F_B``, written by ``csv.writer`` (so lines end
in ``\\r\\n``). JSON holds the same rows plus the metadata CSV cannot hold.

Every reading error names the file and the place: ``path: device 3, slot 17: ...``.
"""

import csv
import io as _io
import json
import os
import shutil

from tabsched.exceptions import InvalidScheduleError
from tabsched.table import Overlap, ScheduleTable, parse_cell

__all__ = ["read_table", "write_table", "read_csv", "write_csv", "to_csv", "from_csv",
           "read_json", "write_json", "to_json", "from_json", "render_grid",
           "TABLE_SUFFIXES"]

JSON_FORMAT = "tabsched.table"
JSON_VERSION = 1
TABLE_SUFFIXES = (".csv", ".json")


# ------------------------------------------------------------------------ CSV
def to_csv(table):
    """The compute_only CSV text of ``table`` (PyTorch's bytes, ``\\r\\n`` endings).

    >>> from tabsched.schedules import generate
    >>> to_csv(generate("gpipe", devices=2, microbatches=1))
    '0F0,,,0B0\\r\\n,1F0,1B0,\\r\\n'
    """
    buffer = _io.StringIO(newline="")
    writer = csv.writer(buffer)
    for row in table.rows:
        writer.writerow(["" if cell is None else str(cell) for cell in row])
    return buffer.getvalue()


def from_csv(text, *, source="<csv>", **metadata):
    """Parse compute_only CSV text into a table (``source`` names it in errors).

    The number of microbatches is the number of forwards of stage 0 unless
    ``num_microbatches`` or ``microbatch_sizes`` is given: the first stage sees
    every microbatch that enters the pipeline, so a cell numbering one past them
    is reported where it stands.
    """
    raw_rows = csv_rows(text, source)
    rows = []
    for device, raw in enumerate(raw_rows):
        row = []
        for slot, token in enumerate(raw):
            try:
                row.append(parse_cell(token))
            except InvalidScheduleError as error:
                raise InvalidScheduleError(f"{source}: device {device}, slot {slot}: "
                                           f"{error}") from None
        if all(cell is None for cell in row):
            raise InvalidScheduleError(f"{source}: device {device} (line {device + 1}) has no "
                                       f"operations; every row of a schedule runs something")
        rows.append(row)
    return rows_to_table(rows, source=source, **metadata)


def csv_rows(text, source):
    """The rows of cell texts of a schedule CSV, after the checks every reader needs.

    A NUL byte, an empty file or text the csv module rejects is an error naming
    ``source``; trailing empty lines are dropped.
    """
    if "\x00" in text:
        line = text[:text.index("\x00")].count("\n") + 1
        raise InvalidScheduleError(f"{source}: line {line} contains a NUL byte; "
                                   f"this is not a CSV schedule")
    if not text.strip():
        raise InvalidScheduleError(f"{source}: the file is empty; expected one row per device")
    try:
        rows = list(csv.reader(_io.StringIO(text, newline="")))
    except csv.Error as error:
        raise InvalidScheduleError(f"{source}: not valid CSV: {error}") from None
    while rows and not rows[-1]:
        rows.pop()
    return rows


def rows_to_table(rows, *, source, **metadata):
    """A table from parsed rows, inferring the microbatch count from stage 0."""
    if "num_microbatches" not in metadata and "microbatch_sizes" not in metadata:
        first_stage = [part.microbatch for row in rows for cell in row if cell is not None
                       for part in (cell.parts if isinstance(cell, Overlap) else (cell,))
                       if part.stage == 0 and part.kind == "F"]
        if first_stage:
            metadata["num_microbatches"] = len(set(first_stage))
    try:
        return ScheduleTable(rows, **metadata)
    except InvalidScheduleError as error:
        raise InvalidScheduleError(f"{source}: {error}") from None


def read_csv(path, **metadata):
    """Read a compute_only CSV file."""
    return from_csv(_read_text(path), source=os.fspath(path), **metadata)


def write_csv(table, path):
    """Write ``table`` as compute_only CSV."""
    with open(path, "w", newline="") as handle:
        handle.write(to_csv(table))


# ----------------------------------------------------------------------- JSON
_JSON_KEYS = {"format", "version", "family", "params", "num_stages", "microbatch_sizes",
              "stage_layers", "rows", "grad_sync"}


def to_json(table, *, indent=None):
    """JSON text: the rows and the metadata CSV cannot hold."""
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


def from_json(text, *, source="<json>"):
    """Parse the JSON form of a table."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise InvalidScheduleError(f"{source}: not valid JSON: {error.msg} at line "
                                   f"{error.lineno}, column {error.colno}") from None
    if not isinstance(data, dict):
        raise InvalidScheduleError(f"{source}: expected a JSON object with \"rows\"")
    unknown = sorted(set(data) - _JSON_KEYS)
    if unknown:
        raise InvalidScheduleError(f"{source}: unknown key {unknown[0]!r}; valid keys: "
                                   f"{', '.join(sorted(_JSON_KEYS))}")
    if data.get("format", JSON_FORMAT) != JSON_FORMAT:
        raise InvalidScheduleError(f"{source}: format is {data['format']!r}, "
                                   f"expected {JSON_FORMAT!r}")
    rows = data.get("rows")
    if not isinstance(rows, list) or not all(isinstance(row, list) for row in rows):
        raise InvalidScheduleError(f"{source}: \"rows\" must be a list of lists of cells")
    parsed = []
    for device, row in enumerate(rows):
        cells = []
        for slot, token in enumerate(row):
            if token is not None and not isinstance(token, str):
                raise InvalidScheduleError(f"{source}: device {device}, slot {slot}: "
                                           f"{token!r} is not a cell string")
            try:
                cells.append(parse_cell(token or ""))
            except InvalidScheduleError as error:
                raise InvalidScheduleError(f"{source}: device {device}, slot {slot}: "
                                           f"{error}") from None
        parsed.append(cells)
    metadata = {key: data[key] for key in ("num_stages", "microbatch_sizes", "stage_layers",
                                           "family", "params", "grad_sync")
                if data.get(key) is not None}
    return rows_to_table(parsed, source=source, **metadata)


def read_json(path):
    return from_json(_read_text(path), source=os.fspath(path))


def write_json(table, path):
    with open(path, "w") as handle:
        handle.write(to_json(table, indent=1))
        handle.write("\n")


# ------------------------------------------------------------------ dispatch
def read_table(path, **options):
    """Read a ``.csv`` (PyTorch compute_only) or ``.json`` table."""
    suffix = os.path.splitext(os.fspath(path))[1].lower()
    if suffix == ".csv":
        return read_csv(path, **options)
    if suffix == ".json":
        return read_json(path)
    raise InvalidScheduleError(f"{path}: unknown table format {suffix or '(no suffix)'!r}; "
                               f"expected one of {', '.join(TABLE_SUFFIXES)}")


def write_table(table, path):
    suffix = os.path.splitext(os.fspath(path))[1].lower()
    if suffix == ".csv":
        return write_csv(table, path)
    if suffix == ".json":
        return write_json(table, path)
    raise InvalidScheduleError(f"{path}: unknown table format {suffix or '(no suffix)'!r}; "
                               f"expected one of {', '.join(TABLE_SUFFIXES)}")


def _read_text(path):
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except OSError as error:
        raise InvalidScheduleError(f"{path}: cannot read: {error.strerror}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise InvalidScheduleError(f"{path}: byte {error.start} is not UTF-8 text; "
                                   f"this is not a schedule file") from None


# ----------------------------------------------------------------------- grid
def _grid_token(cell):
    if cell is None:
        return "."
    if isinstance(cell, Overlap):
        return "+".join(str(part) for part in cell.parts)
    return str(cell)


def render_grid(table, *, width=None):
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
