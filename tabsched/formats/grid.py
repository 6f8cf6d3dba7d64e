"""Tables as a text grid for the terminal (written only).

The grid wraps into bands that fit a width: a title (the family, its parameters
and the sizes), a legend of the stages of each device when some device holds
several (and of the layers per stage, when the table says), then per band a
ruler of slot numbers and one line per device: ``.`` for an idle slot, a cell's
text (:mod:`tabsched.cells`) otherwise, ``0F7+7B3`` for an overlapped cell.
"""

from __future__ import annotations

import shutil

from tabsched.cells import Overlap
from tabsched.table import ScheduleTable, check_table

__all__ = ["render_grid", "grid_text"]


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
    check_table(table)
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


def grid_text(table: ScheduleTable, *, width: int | None = None) -> str:
    """The grid as printed: :func:`render_grid` and a final newline."""
    return render_grid(table, width=width) + "\n"


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
