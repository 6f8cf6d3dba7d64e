"""The rules every table file's rows obey, whatever the format around them.

A table file (a CSV, a JSON document's ``"rows"``, PyTorch's CSVs) is a list of
rows, one per device, each a list of cell texts in the order the device runs
them; :mod:`tabsched.cells` reads each cell. The shared rules: at least one row;
a cell is one line; an action (``REDUCE_GRAD``, and in PyTorch's files its other
actions) takes an idle slot, except at the end of its row, where it takes none;
every row runs at least one operation. A row's ``REDUCE_GRAD`` cells become the
table's ``grad_sync`` (:func:`apply_reduce_grad`), checked against the rows.

Every error names the file and the place (``path: device 3, slot 17: ...``) on
one line.
"""

import numpy as np

from tabsched.cells import (BACKWARD, KINDS_AS_WRITTEN, REDUCE_GRAD, SIMPLE_OP, WEIGHT_GRAD,
                            Action, Op, Overlap, parse_token, shown)
from tabsched.exceptions import InvalidScheduleError
from tabsched.table import ScheduleTable, check_table

__all__ = ["parse_rows", "rows_to_table", "apply_reduce_grad", "refuse_unreadable"]


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
    reduce_grads = [entry for entry in actions if entry[2].kind == REDUCE_GRAD]
    if not reduce_grads:
        return table
    if _right_after_backwards(table, reduce_grads):
        return table.replace(grad_sync=sorted({cell.stage for _, _, cell in reduce_grads}))
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


def _right_after_backwards(table, reduce_grads):
    """True if every ``REDUCE_GRAD`` of ``(device, slot, Action)`` entries names a stage its
    device runs, once, and comes after the stage's last backward there with no compute
    cell between: where :func:`apply_reduce_grad` has nothing to refuse or note (checked
    over arrays; its loop explains the rest)."""
    device, slot, stage = (np.array(column, dtype=np.int64) for column in
                           zip(*[(device, slot, cell.stage) for device, slot, cell in reduce_grads]))
    devices = max(table.num_devices, 1)
    if stage.min() < 0 or stage.max() >= table.num_stages or device.max() >= devices:
        return False
    key = stage * devices + device
    if np.bincount(key).max() > 1:
        return False
    # each (stage, device)'s last backward: backwards by key, in slot order within one
    backward = np.flatnonzero((table.kind == BACKWARD) | (table.kind == WEIGHT_GRAD))
    backward_key = table.stage[backward].astype(np.int64) * devices + table.device[backward]
    order = np.argsort(backward_key, kind="stable")
    position = np.searchsorted(backward_key[order], key, side="right") - 1
    if np.any(position < 0) or np.any(backward_key[order][position] != key):
        return False                      # the device runs no backward of the stage
    last = table.slot[backward[order][position]].astype(np.int64)
    if np.any(last > slot):
        return False
    starts = table.cell_starts()
    width = max(int(table.slot.max()), int(slot.max())) + 2
    cells = table.device[starts].astype(np.int64) * width + table.slot[starts]
    between = (np.searchsorted(cells, device * width + slot)
               - np.searchsorted(cells, device * width + last, side="right"))
    return not between.any()


def refuse_unreadable(table, format_name):
    """Refuse a table with a device that runs nothing: no reader takes such a row back."""
    check_table(table)
    counts = np.bincount(table.device, minlength=table.num_devices)
    idle = np.flatnonzero(counts == 0)
    if len(idle):
        raise InvalidScheduleError(f"a {format_name} cannot hold this table: device "
                                   f"{int(idle[0])} runs nothing, and every row of a schedule "
                                   f"file runs something")
