"""ScheduleTable: one row per device, one column per time slot, a cell per operation.

An operation is ``(kind, stage, microbatch)`` with kind ``F`` (forward), ``B``
(full backward), ``I`` (backward for inputs only) or ``W`` (backward for weights
only); its text form is PyTorch's ``<stage><kind><microbatch>``, e.g. ``3F12``.
A cell may also hold an *overlapped* pair, PyTorch's ``(0F7;7B3)OVERLAP_F_B``,
which its device runs as one step (DualPipe's fused forward+backward). The
grammar of a cell's text, ``Op`` and ``Overlap`` live in :mod:`tabsched.cells`;
this module imports them, so ``tabsched.table.Op`` and the kind codes
(``FORWARD``, ...) are the same objects.

The order of the non-empty cells in a row is the order in which that device
runs them; empty cells are idle slots of the idealized layout.

Internally a table is columnar: one entry per operation, sorted by device and
slot, in numpy arrays (``device``, ``slot``, ``kind``, ``stage``,
``microbatch``). Two operations share a (device, slot) only as the parts of an
overlapped cell. ``rows`` gives the familiar list-of-lists view.

Examples
--------
>>> table = ScheduleTable([["0F0", "0F1", None, "0B0", "0B1"],
...                        [None, "1F0", "1B0", "1F1", "1B1"]])
>>> table.num_devices, table.num_stages, table.num_microbatches
(2, 2, 2)
>>> str(table.rows[1][2])
'1B0'
>>> ScheduleTable([["0F0", "0B0", "0B1"]])
Traceback (most recent call last):
...
tabsched.exceptions.InvalidScheduleError: device 0, slot 2: 0B1 has no forward (0F1)
"""

import math
import numbers

import numpy as np

from tabsched import _build
from tabsched.cells import (  # noqa: F401  (the cell grammar; these names were table's first)
    BACKWARD, FORWARD, INPUT_GRAD, KIND_CODES, KIND_NAMES, KINDS, MAX_ID, WEIGHT_GRAD, Op,
    Overlap, coerce_cell, cut, lone_surrogate, parse_cell, shown, shown_repr)
from tabsched.exceptions import InvalidParameterError, InvalidScheduleError

__all__ = ["Op", "Overlap", "ScheduleTable", "KINDS", "parse_cell", "shown", "shown_repr", "cut",
           "MAX_ID", "certainly_valid", "SLICE_PARTITIONS"]

#: How a table's sequences were cut into slices (``ScheduleTable.slice_partition``):
#: ``even``, equal tokens; ``compute``, equal FLOPs (Seq1F1B's computation-wise
#: partition; the bounds: :func:`tabsched.costs.transformer.slice_bounds`).
SLICE_PARTITIONS = ("even", "compute")


def cell_columns(rows, place="slot", idle_error=None):
    """The operations in ``rows`` (one row of cells a device) as columns.

    Returns ``(devices, places, kinds, stages, microbatches, lengths)``: lists with
    an entry per operation (an overlap's parts each get one; ``places`` is the
    cell's index in its row) and the length of each row. A cell that is not one
    is refused naming its device and ``place`` ("slot", "position"); an idle cell
    is skipped, or refused with ``idle_error`` when that is given.
    """
    devices, places, kinds, stages, microbatches, lengths = [], [], [], [], [], []
    if isinstance(rows, (str, bytes)) or not hasattr(rows, "__iter__"):
        raise InvalidScheduleError(f"rows must be a list of rows (one list of cells per "
                                   f"device), not {shown_repr(rows)}")
    for device, row in enumerate(rows):
        if isinstance(row, (str, bytes)) or not hasattr(row, "__iter__"):
            raise InvalidScheduleError(f"device {device}: a row must be a list of cells, not "
                                       f"{shown_repr(row)}")
        row = list(row)
        lengths.append(len(row))
        for index, cell in enumerate(row):
            try:
                cell = coerce_cell(cell)
            except InvalidScheduleError as error:
                raise InvalidScheduleError(f"device {device}, {place} {index}: {error}") \
                    from None
            if cell is None:
                if idle_error is None:
                    continue
                raise InvalidScheduleError(f"device {device}, {place} {index}: {idle_error}")
            for op in (cell.parts if isinstance(cell, Overlap) else (cell,)):
                devices.append(device)
                places.append(index)
                kinds.append(KIND_CODES[op.kind])
                stages.append(op.stage)
                microbatches.append(op.microbatch)
    return devices, places, kinds, stages, microbatches, lengths


class ScheduleTable:
    """A pipeline schedule as a table of operations.

    Parameters
    ----------
    rows : sequence of sequences
        One row per device; each cell is ``None`` or ``""`` (idle), an ``Op``, an
        ``Overlap``, a ``(kind, stage, microbatch)`` tuple or a cell's text.
    num_stages : int, optional
        Number of model chunks S; default: the largest stage + 1.
    num_microbatches : int, optional
        Number of microbatches M; default: ``len(microbatch_sizes)`` or the
        largest microbatch + 1.
    microbatch_sizes : sequence of float, optional
        Size of each microbatch relative to a full one (1.0); a microbatch split
        in two gives two of 0.5. Default all 1.0.
    stage_layers : sequence of int, optional
        Transformer layers in each stage; default ``None``, an even split.
    family, params :
        The schedule family that generated the table and its parameters.
    grad_sync : sequence of int, optional
        Stages whose gradients are synchronised after their last backward
        (PyTorch's ``REDUCE_GRAD``); :func:`tabsched.evaluate` adds these syncs
        unless told otherwise. Default ``None``: the table says nothing.
    sequence_slices : sequence of (int, int), optional
        Per microbatch, ``(slice, count)``: the microbatch is slice ``slice`` of a
        sequence cut into ``count`` slices (Seq1F1B; :class:`tabsched.adapt.SplitSequence`),
        the ``count`` slices consecutive microbatches of one size. Default ``None``:
        every microbatch holds whole sequences.
    slice_partition : {"even", "compute"}, optional
        How the sliced sequences were cut (:data:`SLICE_PARTITIONS`): ``even`` (the
        default) equal tokens, ``compute`` equal FLOPs. A table of whole sequences
        holds ``even``.

    Raises
    ------
    InvalidScheduleError
        For the first problem in row order, with its device and slot.
    """

    __slots__ = ("device", "_slot", "kind", "stage", "microbatch", "_row_lengths",
                 "num_stages", "microbatch_sizes", "stage_layers", "family", "params",
                 "grad_sync", "sequence_slices", "slice_partition", "_rows", "_lowering", "_order",
                 "_place")
    #: What a table is made of and pickles as (a pending layout is made first).
    _STATE = ("device", "slot", "kind", "stage", "microbatch", "row_lengths", "num_stages",
              "microbatch_sizes", "stage_layers", "family", "params", "grad_sync",
              "sequence_slices", "slice_partition", "_rows")

    def __init__(self, rows, *, num_stages=None, num_microbatches=None,
                 microbatch_sizes=None, stage_layers=None, family=None, params=None,
                 grad_sync=None, sequence_slices=None, slice_partition=None):
        devices, slots, kinds, stages, microbatches, lengths = cell_columns(rows)
        self._init(devices, slots, kinds, stages, microbatches, lengths, num_stages,
                   num_microbatches, microbatch_sizes, stage_layers, family, params, grad_sync,
                   sequence_slices=sequence_slices, slice_partition=slice_partition)
        self.validate()

    @classmethod
    def from_arrays(cls, device, slot, kind, stage, microbatch, row_lengths, *,
                    num_stages=None, num_microbatches=None, microbatch_sizes=None,
                    stage_layers=None, family=None, params=None, grad_sync=None,
                    sequence_slices=None, slice_partition=None, validate=True):
        """Build a table from per-operation arrays (any order; sorted here).

        ``kind`` holds codes (0=F, 1=B, 2=I, 3=W); operations sharing a device
        and slot form one overlapped cell.
        """
        table = cls.__new__(cls)
        table._init(device, slot, kind, stage, microbatch, row_lengths, num_stages,
                    num_microbatches, microbatch_sizes, stage_layers, family, params, grad_sync,
                    bounded=validate, sequence_slices=sequence_slices,
                    slice_partition=slice_partition)
        if validate:
            table.validate()
        return table

    def _init(self, device, slot, kind, stage, microbatch, row_lengths, num_stages,
              num_microbatches, microbatch_sizes, stage_layers, family, params, grad_sync=None,
              bounded=True, sequence_slices=None, slice_partition=None):
        device, slot, stage, microbatch = (_int32_array(values, name) for values, name in (
            (device, "device"), (slot, "slot"), (stage, "stage"), (microbatch, "microbatch")))
        kind = np.asarray(kind, dtype=np.int8).ravel()
        if not (len(device) == len(slot) == len(kind) == len(stage) == len(microbatch)):
            raise InvalidScheduleError("table arrays have different lengths")
        if len(device) and (np.any(np.diff(device) < 0) or np.any(
                (np.diff(slot) < 0) & (np.diff(device) == 0))):
            order = np.lexsort((kind, slot, device))
            device, slot, kind, stage, microbatch = (
                device[order], slot[order], kind[order], stage[order], microbatch[order])
        row_lengths = _int32_array(row_lengths, "row length")
        if len(device) and (int(device.min()) < 0 or int(device.max()) >= len(row_lengths)):
            raise InvalidScheduleError("an operation is on a device the table has no row for")
        if np.any(row_lengths < 0):
            raise InvalidScheduleError("row lengths must not be negative")
        if len(device) and np.any(slot < 0):
            raise InvalidScheduleError("slots must not be negative")
        if len(device):
            # sorted by device, then slot: each row's last operation holds its last slot
            ends = np.append(np.flatnonzero(device[1:] != device[:-1]), len(device) - 1)
            last = np.zeros(len(row_lengths), dtype=np.int32)
            last[device[ends]] = slot[ends] + 1
            row_lengths = np.maximum(row_lengths, last)
        if np.any((kind < 0) | (kind >= len(KINDS))):
            raise InvalidScheduleError("kind codes must be 0..3 (F, B, I, W)")
        for array in (device, slot, kind, stage, microbatch, row_lengths):
            array.flags.writeable = False
        self.device, self.slot, self.kind = device, slot, kind
        self.stage, self.microbatch, self.row_lengths = stage, microbatch, row_lengths

        # Sizes come from the ids only after the ids are bounded by the table's own
        # content: a valid table has a forward and a backward of every (stage,
        # microbatch), so no id and no count reaches its number of operations. A
        # 25-byte file naming microbatch 10^8 must not allocate for 10^8 of them.
        count = len(device)
        if num_stages is None:
            if bounded:
                self._check_ids(stage, "stage", count)
            num_stages = int(stage.max()) + 1 if count else 0
        num_stages = _count_value("num_stages", num_stages, count if bounded else None)
        if microbatch_sizes is not None:
            microbatch_sizes = _sizes(microbatch_sizes)
            if num_microbatches is not None and num_microbatches != len(microbatch_sizes):
                raise InvalidScheduleError(
                    f"microbatch_sizes has {len(microbatch_sizes)} entries for "
                    f"{num_microbatches} microbatches")
            _count_value("the number of microbatch_sizes", len(microbatch_sizes),
                         count if bounded else None)
        else:
            if num_microbatches is None:
                if bounded:
                    self._check_ids(microbatch, "microbatch", count)
                num_microbatches = int(microbatch.max()) + 1 if count else 0
            num_microbatches = _count_value("num_microbatches", num_microbatches,
                                            count if bounded else None)
            microbatch_sizes = (1.0,) * num_microbatches
        if stage_layers is not None:
            stage_layers = _layer_counts(stage_layers)
            if len(stage_layers) != num_stages:
                raise InvalidScheduleError(
                    f"stage_layers has {len(stage_layers)} entries for {num_stages} stages")
        if grad_sync is not None:
            grad_sync = _stage_list(grad_sync)
            if grad_sync and not 0 <= grad_sync[0] <= grad_sync[-1] < num_stages:
                raise InvalidScheduleError(f"grad_sync names stages {list(grad_sync)[:8]} but "
                                           f"the table has stages 0..{num_stages - 1}")
        if family is not None and not isinstance(family, str):
            raise InvalidScheduleError(f"family must be a name (text), not "
                                       f"{shown_repr((family))}")
        if params is not None and not isinstance(params, dict):
            try:
                params = dict(params)
            except (TypeError, ValueError):
                raise InvalidScheduleError(f"params must be a mapping of names to values, not "
                                           f"{shown_repr((params))}") from None
        problem = metadata_text_problem(family, params)
        if problem:
            raise InvalidScheduleError(f"{problem[0]}: {problem[1]}")
        self.grad_sync = grad_sync
        self.sequence_slices = _slice_list(sequence_slices, microbatch_sizes)
        self.slice_partition = _partition(slice_partition, self.sequence_slices)
        self.num_stages = num_stages
        self.microbatch_sizes = microbatch_sizes
        self.stage_layers = stage_layers
        self.family = family
        self.params = dict(params or {})
        self._rows = None
        # the lowering a layout made of these row orders, for the table's next lower()
        # (tabsched.lower owns it; not compared, copied or pickled)
        self._lowering = None
        # a layout not made yet (_laid_out_later): the order table and what places it
        self._order = self._place = None

    def _check_ids(self, ids, what, count):
        """Refuse, naming its cell, the first id a table of ``count`` operations cannot hold."""
        beyond = np.flatnonzero(ids >= max(count, 1))
        if len(beyond):
            i = int(beyond[0])
            raise InvalidScheduleError(
                f"device {int(self.device[i])}, slot {int(self.slot[i])}: {self.op(i)}: {what} "
                f"{int(ids[i])} cannot exist in a table of {count} operation"
                f"{'s' if count != 1 else ''} (each {what} needs a forward and a backward of "
                f"every {'microbatch' if what == 'stage' else 'stage'})")

    # ------------------------------------------------------------------ views
    @property
    def slot(self):
        """The slot of every operation (int32, read-only); a layout left for later
        (:func:`tabsched.layout.lay_out` with ``lazy=True``) is made on first read."""
        if self._slot is None:
            self._make_layout()
        return self._slot

    @slot.setter
    def slot(self, value):
        self._slot = value

    @property
    def row_lengths(self):
        """Every row's length in slots (int32, read-only); as :attr:`slot`, a layout
        left for later is made on first read."""
        if self._row_lengths is None:
            self._make_layout()
        return self._row_lengths

    @row_lengths.setter
    def row_lengths(self, value):
        self._row_lengths = value

    @property
    def laid_out(self):
        """Whether the slots are made (False only for a layout left for later)."""
        return self._slot is not None

    def _laid_out_later(self, place):
        """This table (a valid order table: its slots are its rows' positions) whose
        slots ``place(order, table)`` gives, as ``(slots, row_lengths)``, when first read
        (``place`` may offer ``table`` the lowering it made).

        Everything but the slots reads the row orders, which the order table holds:
        lowering and evaluating the table do not make the layout. ``place`` must keep
        every row's order (the layout does), so the cells, and so ``cell_starts``, are
        the order table's."""
        table = self._copy()
        table._slot = table._row_lengths = None
        table._order, table._place = self, place
        return table

    def _make_layout(self):
        order, place = self._order, self._place
        # raises (a DeadlockError) before anything changes
        slots, lengths = place(order, self)
        slots = np.array(slots, dtype=np.int32)
        lengths = np.array(lengths, dtype=np.int32)
        slots.flags.writeable = lengths.flags.writeable = False
        self._slot, self._row_lengths = slots, lengths
        self._order = self._place = None

    def _placed_slot(self):
        """Slots that order every row as :attr:`slot` does, without making a layout
        left for later (the order table's positions)."""
        return self._order.slot if self._slot is None else self._slot

    @property
    def num_devices(self):
        """Rows of the table: the pipeline's devices."""
        lengths = self._order.row_lengths if self._row_lengths is None else self._row_lengths
        return len(lengths)

    @property
    def num_microbatches(self):
        """Microbatches of one iteration (split ones counted apiece)."""
        return len(self.microbatch_sizes)

    @property
    def num_slots(self):
        """Length of the longest row, in slots."""
        return int(self.row_lengths.max()) if len(self.row_lengths) else 0

    @property
    def num_ops(self):
        """Operations in the table (every F, B, I and W of every stage and microbatch)."""
        return len(self.device)

    def __len__(self):
        return len(self.device)

    @property
    def metadata(self):
        """Everything but the cells, as keyword arguments of the constructors."""
        metadata = {"num_stages": self.num_stages, "microbatch_sizes": self.microbatch_sizes,
                    "stage_layers": self.stage_layers, "family": self.family,
                    "params": dict(self.params)}
        if self.grad_sync is not None:
            metadata["grad_sync"] = self.grad_sync
        if self.sequence_slices is not None:
            metadata["sequence_slices"] = self.sequence_slices
        if self.slice_partition != "even":
            metadata["slice_partition"] = self.slice_partition
        return metadata

    def _with_slots(self, slot, row_lengths):
        """This table's operations in ``slot`` with rows ``row_lengths`` long: what
        ``from_arrays`` builds from them and this table's metadata, without checking
        again what this table passed. Only for slots that keep every row's order
        (not decreasing along a row) and rows that reach past their last slot, as
        a row order laid out gives them (``layout.lay_out``)."""
        table = self._copy()
        table.slot = np.array(slot, dtype=np.int32)
        table.row_lengths = np.array(row_lengths, dtype=np.int32)
        for array in (table.slot, table.row_lengths):
            array.flags.writeable = False
        return table

    def _copy(self):
        """A new table object with this one's arrays and metadata (its own params, no
        rows view, no lowering offered, no layout pending: the slots are set after)."""
        table = ScheduleTable.__new__(ScheduleTable)
        for name in ScheduleTable.__slots__:
            setattr(table, name, getattr(self, name))
        table.params = dict(self.params)
        table._rows = None
        table._lowering = None
        table._order = table._place = None
        return table

    def replace(self, **metadata):
        """The same cells with some metadata changed."""
        merged = {**self.metadata, **metadata}
        if "num_microbatches" in metadata and "microbatch_sizes" not in metadata:
            merged.pop("microbatch_sizes")
        return ScheduleTable.from_arrays(self.device, self.slot, self.kind, self.stage,
                                         self.microbatch, self.row_lengths, **merged)

    def kind_letter(self, index):
        """``"F"``, ``"B"``, ``"I"`` or ``"W"`` for operation ``index``."""
        return KINDS[self.kind[index]]

    def op(self, index):
        """The ``Op`` at position ``index`` of the arrays."""
        return Op(KINDS[self.kind[index]], int(self.stage[index]), int(self.microbatch[index]))

    def cell_text(self, index):
        """Text of the cell that holds operation ``index`` (an overlap shows all parts).

        The arrays are sorted by device and slot, so the parts of a cell are neighbours:
        the cell is found by looking either side of ``index``, not through the table."""
        device, slot, last = self.device[index], self.slot[index], len(self.device) - 1
        first = end = int(index)
        while first > 0 and self.device[first - 1] == device and self.slot[first - 1] == slot:
            first -= 1
        while end < last and self.device[end + 1] == device and self.slot[end + 1] == slot:
            end += 1
        if first == end:
            return str(self.op(index))
        return str(Overlap(tuple(self.op(i) for i in range(first, end + 1))))

    @property
    def rows(self):
        """List of rows; each a list of ``None``, ``Op`` or ``Overlap`` cells."""
        if self._rows is None:
            rows = [[None] * int(length) for length in self.row_lengths]
            for index in range(len(self.device)):
                device, slot = int(self.device[index]), int(self.slot[index])
                op = self.op(index)
                cell = rows[device][slot]
                if cell is None:
                    rows[device][slot] = op
                elif isinstance(cell, Overlap):
                    rows[device][slot] = Overlap(cell.parts + (op,))
                else:
                    rows[device][slot] = Overlap((cell, op))
            self._rows = rows
        return self._rows

    def orders(self):
        """Per device, its non-idle cells in the order it runs them."""
        return [[cell for cell in row if cell is not None] for row in self.rows]

    def placement(self):
        """Map each stage to the sorted tuple of devices that run it."""
        # distinct (stage, device) pairs as keys stage * D + device, in sorted order: a
        # count per key where the keys are few, else a sort
        devices = max(self.num_devices, 1)
        keys = self.stage.astype(np.int64) * devices + self.device
        span = (int(keys.max()) + 1) if len(keys) else 0
        if span <= 8 * len(keys) + 1024 and (not len(keys) or int(keys.min()) >= 0):
            pairs = np.flatnonzero(np.bincount(keys, minlength=span))
        else:
            pairs = np.unique(keys)
        placement = {stage: [] for stage in range(self.num_stages)}
        for stage, device in zip((pairs // devices).tolist(), (pairs % devices).tolist()):
            placement.setdefault(stage, []).append(device)
        return {stage: tuple(devices) for stage, devices in placement.items()}

    def cell_starts(self):
        """Boolean mask: True where an operation opens a new cell (overlaps share one)."""
        fresh = np.ones(len(self.device), dtype=bool)
        if len(self.device) > 1:
            # a layout keeps the rows' orders: the order table's positions tell the cells
            slot = self._placed_slot()
            fresh[1:] = (self.device[1:] != self.device[:-1]) | (slot[1:] != slot[:-1])
        return fresh

    def __eq__(self, other):
        if not isinstance(other, ScheduleTable):
            return NotImplemented
        return (all(np.array_equal(getattr(self, name), getattr(other, name))
                    for name in ("device", "slot", "kind", "stage", "microbatch", "row_lengths"))
                and self.metadata == other.metadata)

    __hash__ = None  # type: ignore[assignment]  # equal tables compare arrays: no hash

    def __getstate__(self):
        """The slots (a layout left for later made first), less the lowering a layout
        left for the next ``lower()``."""
        return None, {name: getattr(self, name) for name in ScheduleTable._STATE}

    def __setstate__(self, state):
        self._order = self._place = None
        self.slice_partition = "even"        # a table pickled before partitions
        for name, value in state[1].items():
            setattr(self, name, value)
        self._lowering = None

    def _repr_html_(self):
        """The table as a coloured grid in a notebook (:mod:`tabsched._html`)."""
        from tabsched._html import table_html
        return table_html(self)

    def __repr__(self):
        family = f"{self.family!r}, " if self.family else ""
        return (f"<ScheduleTable {family}{self.num_devices} devices x {self.num_slots} slots, "
                f"{self.num_stages} stages, {self.num_microbatches} microbatches, "
                f"{len(self)} ops>")

    # ------------------------------------------------------------- validation
    def validate(self, *, place="slot"):
        """Raise ``InvalidScheduleError`` for the first problem in row order.

        Problems, each reported at the cell where reading the table row by row
        first meets it: a stage or microbatch out of range; an operation listed
        twice; the operations of one (stage, microbatch) on two devices; a
        backward without its forward; a forward without a backward; ``I``
        without ``W`` or ``W`` without ``I``; ``B`` together with ``I``/``W``.
        A (stage, microbatch) with no operation at all is reported last.
        """
        if certainly_valid(self):
            return _check_slice_order(self)
        problems = _find_problems(self, place)
        if problems:
            raise InvalidScheduleError(min(problems)[1])
        if len(self.device) == 0 and (self.num_stages or self.num_microbatches):
            raise InvalidScheduleError("the table has no operations")
        return _check_slice_order(self)


def certainly_valid(table):
    """True if ``table`` passes :meth:`ScheduleTable.validate`, decided in linear time.

    Counts the kinds of every (stage, microbatch) directly (``_build.table_is_valid``):
    exactly one ``F``, and one ``B`` or one ``I`` and one ``W``, all on one device.
    ``False`` means "look closer" (``validate`` names the first problem), also for a
    table whose stage x microbatch grid is much larger than its operations.
    """
    S, M, count = table.num_stages, table.num_microbatches, len(table)
    if count == 0 or S * M > count + 1024:
        return False
    answer = _build.table_is_valid(table.device, table.kind, table.stage, table.microbatch,
                                   S, M, np.empty(4 * S * M, dtype=np.int8),
                                   np.empty(S * M, dtype=np.int32))
    return answer == 1


def check_table(table, name="table"):
    """Refuse, naming the argument, a value that is not a :class:`ScheduleTable`."""
    if not isinstance(table, ScheduleTable):
        raise InvalidParameterError(f"{name} must be a ScheduleTable, not "
                                    f"{type(table).__name__}")
    return table


def metadata_text_problem(family, params):
    """``(key, why)`` for the first text of ``family`` or ``params`` (its names, its text
    values and the texts in its lists) that is not Unicode text, or ``None``.

    A lone surrogate (``"\\ud800"``) is one: JSON's escapes can write it, but no
    output can print it, so a summary naming the family would fail when printed.

    >>> key, why = metadata_text_problem("1f1b", {"pairs": ["serial", "x\\udc80"]})
    >>> key, why[:40]
    ('params', 'pairs = "x\\\\udc80" holds a lone surrogate')
    """
    def why(text):
        return (f"{shown(text)} holds a lone surrogate at character {lone_surrogate(text)}, "
                f"which is not Unicode text")
    if isinstance(family, str) and lone_surrogate(family) >= 0:
        return "family", why(family)
    for name, value in (params or {}).items():
        if isinstance(name, str) and lone_surrogate(name) >= 0:
            return "params", f"the name {why(name)}"
        values = value if isinstance(value, (list, tuple)) else [value]
        for text in values:
            if isinstance(text, str) and lone_surrogate(text) >= 0:
                return "params", f"{cut(name)} = {why(text)}"
    return None


def _int32_array(values, name):
    """``values`` as a flat int32 array; ids that do not fit int32 are an error, not a wrap."""
    array = np.asarray(values)
    if array.dtype == np.int32:
        return array.ravel()
    if array.size and array.dtype.kind not in "iub":
        try:
            array = np.asarray(values, dtype=np.int64)
        except (OverflowError, TypeError, ValueError):
            raise InvalidScheduleError(f"{name} ids must be integers 0..{MAX_ID}") from None
    if array.size and (int(array.min()) < -MAX_ID - 1 or int(array.max()) > MAX_ID):
        raise InvalidScheduleError(f"{name} ids must be integers 0..{MAX_ID}")
    return array.astype(np.int32).ravel()


def _count_value(name, value, limit):
    """A count (stages, microbatches) as an int, at most ``limit`` when one is given."""
    if isinstance(value, bool) or not isinstance(value, (numbers.Integral, np.integer)):
        raise InvalidScheduleError(f"{name} must be an integer, not {shown_repr((value))}")
    value = int(value)
    if value < 0:
        raise InvalidScheduleError(f"{name} must not be negative, not {value}")
    if limit is not None and value > limit:
        raise InvalidScheduleError(f"{name} is {value}, more than a table of {limit} operations "
                                   f"can hold (every stage runs a forward and a backward of "
                                   f"every microbatch)")
    return value


def _sizes(values):
    """Microbatch sizes as a tuple of positive finite floats."""
    try:
        sizes = tuple(float(size) for size in values)
    except (TypeError, ValueError):
        raise InvalidScheduleError(f"microbatch_sizes must be a list of positive numbers, not "
                                   f"{shown_repr((values))}") from None
    if any(isinstance(size, (bool, str)) for size in values):
        raise InvalidScheduleError(f"microbatch_sizes must be numbers, not "
                                   f"{shown_repr((values))}")
    if any(not math.isfinite(size) or size <= 0 for size in sizes):
        raise InvalidScheduleError("microbatch_sizes must be positive finite numbers")
    return sizes


def _slice_list(values, microbatch_sizes):
    """``sequence_slices`` as a tuple of ``(index, count)`` per microbatch, or None.

    A microbatch cut into ``k`` sequence slices is ``k`` consecutive microbatches with
    slices ``0 .. k-1`` of one size; an unsliced microbatch is ``(0, 1)``. A table of
    unsliced microbatches only holds None, so that slicing by 1 is the table itself.
    """
    if values is None:
        return None
    try:
        pairs = tuple((int(index), int(count)) for index, count in values)
        if any(isinstance(v, (bool, float, str)) for pair in values for v in pair):
            raise TypeError
    except (TypeError, ValueError):
        raise InvalidScheduleError(f"sequence_slices must be a list of [slice, count] pairs, "
                                   f"one per microbatch, not {shown_repr(values)}") from None
    if len(pairs) != len(microbatch_sizes):
        raise InvalidScheduleError(f"sequence_slices has {len(pairs)} entries for "
                                   f"{len(microbatch_sizes)} microbatches")
    m = 0
    while m < len(pairs):
        count = pairs[m][1]
        group = pairs[m:m + count]
        if count < 1 or len(group) != count or \
                any(pair != (i, count) for i, pair in enumerate(group)):
            raise InvalidScheduleError(
                f"sequence_slices: microbatch {m} starts a sequence of {count} slices, so "
                f"microbatches {m}..{m + count - 1} must be its slices 0..{count - 1} "
                f"(found {[list(pair) for pair in group]})")
        if len(set(microbatch_sizes[m:m + count])) != 1:
            raise InvalidScheduleError(f"sequence_slices: the slices of microbatches "
                                       f"{m}..{m + count - 1} have different sizes")
        m += count
    return None if all(count == 1 for _, count in pairs) else pairs


def _partition(value, slices):
    """``slice_partition`` checked: one of :data:`SLICE_PARTITIONS` (None: ``even``), and
    ``even`` for a table of whole sequences, whose partition changes nothing."""
    if value is None:
        value = "even"
    if not isinstance(value, str) or value not in SLICE_PARTITIONS:
        raise InvalidScheduleError(f"slice_partition must be one of "
                                   f"{', '.join(SLICE_PARTITIONS)}, not {shown_repr(value)}")
    return "even" if slices is None else value


def _check_slice_order(table):
    """Refuse a sliced table whose rows break the slices' dependencies.

    Seq1F1B (Sun et al. 2024, arXiv 2406.03488, section 3.1): slice ``i``'s forward on a
    stage attends to the keys and values that slices ``0 .. i-1`` left on that stage, and
    its backward needs the key and value gradients of the later slices' attention over
    them. So every slice of one sequence runs each stage on one device, the forwards in
    slice order and the backwards (``B``, or ``I``) in reverse slice order; the device's
    row order is then the dependency, and the lowering needs no other edge.
    """
    slices = table.sequence_slices
    if slices is None:
        return table
    index = np.array([pair[0] for pair in slices], dtype=np.int64)
    first = np.arange(len(slices)) - index          # the sequence's slice 0
    position = np.arange(len(table))                 # rows are sorted by device and slot
    for kinds, step, what in (((FORWARD,), 1, "forwards in slice order"),
                              ((BACKWARD, INPUT_GRAD), -1, "backwards in reverse order")):
        chosen = np.flatnonzero(np.isin(table.kind, kinds))
        m = table.microbatch[chosen]
        key = first[m] * max(table.num_stages, 1) + table.stage[chosen]
        order = np.lexsort((index[m] * step, key))
        chosen, key = chosen[order], key[order]
        same = key[1:] == key[:-1]
        bad = same & ((table.device[chosen[1:]] != table.device[chosen[:-1]])
                      | (position[chosen[1:]] < position[chosen[:-1]]))
        if np.any(bad):
            k = int(chosen[1:][np.argmax(bad)])
            raise InvalidScheduleError(
                f"device {int(table.device[k])}, slot {int(table.slot[k])}: {table.op(k)} is a "
                f"sequence slice; each stage runs a sequence's slices on one device, "
                f"{what} (Seq1F1B's key-value dependencies)")
    return table


def _layer_counts(values):
    """Stage layer counts as a tuple of ints >= 0 (no bools, no fractions, no text)."""
    try:
        entries = list(values)
    except TypeError:
        raise InvalidScheduleError(f"stage_layers must be a list of layer counts, not "
                                   f"{shown_repr((values))}") from None
    counts = []
    for entry in entries:
        if isinstance(entry, bool) or not isinstance(entry, (numbers.Integral, np.integer)) \
                or entry < 0:
            raise InvalidScheduleError(f"stage_layers must be integers >= 0, not "
                                       f"{shown_repr((entry))}")
        counts.append(int(entry))
    return tuple(counts)


def _stage_list(values):
    """A sorted tuple of distinct stage numbers."""
    try:
        entries = list(values)
    except TypeError:
        raise InvalidScheduleError(f"grad_sync must be a list of stages, not "
                                   f"{shown_repr((values))}") from None
    if any(isinstance(entry, bool) or not isinstance(entry, (numbers.Integral, np.integer))
           for entry in entries):
        raise InvalidScheduleError(f"grad_sync must be a list of stages, not "
                                   f"{shown_repr((values))}")
    return tuple(sorted({int(entry) for entry in entries}))


def _find_problems(table, place):
    """(rank, message) pairs, rank = operation index (row order) of the problem."""
    problems = []
    count = len(table.device)
    S, M = table.num_stages, table.num_microbatches
    stage, microbatch, kind = table.stage, table.microbatch, table.kind
    unlocated = count  # ranks after every located problem

    def where(index):
        return f"device {int(table.device[index])}, {place} {int(table.slot[index])}"

    def text(index):
        return str(table.op(index))

    bad_stage = np.flatnonzero((stage < 0) | (stage >= S))
    if len(bad_stage):
        i = int(bad_stage[0])
        problems.append((i, f"{where(i)}: {text(i)}: stage {int(stage[i])} is out of range "
                            f"(the table has stages 0..{S - 1})"))
    bad_mb = np.flatnonzero((microbatch < 0) | (microbatch >= M))
    if len(bad_mb):
        i = int(bad_mb[0])
        problems.append((i, f"{where(i)}: {text(i)}: microbatch {int(microbatch[i])} is out of "
                            f"range (the table has microbatches 0..{M - 1})"))
    if problems:
        # Keep looking among the operations in range: a problem in an earlier
        # cell (say, a backward whose forward the row skipped) is the first one.
        keep = np.flatnonzero((stage >= 0) & (stage < S) & (microbatch >= 0) & (microbatch < M))
        inner = ScheduleTable.from_arrays(
            table.device[keep], table.slot[keep], kind[keep], stage[keep], microbatch[keep],
            table.row_lengths, num_stages=S, microbatch_sizes=table.microbatch_sizes,
            validate=False)
        for rank, message in _find_problems(inner, place):
            problems.append((int(keep[rank]) if rank < len(keep) else unlocated, message))
        return problems

    pair = stage.astype(np.int64) * M + microbatch
    full = pair * len(KINDS) + kind
    unique_full, first_full, counts_full = np.unique(full, return_index=True, return_counts=True)
    if np.any(counts_full > 1):
        seen = np.zeros(len(full), dtype=bool)
        seen[first_full] = True
        second = int(np.flatnonzero(~seen)[0])
        first = int(first_full[np.searchsorted(unique_full, full[second])])
        problems.append((second, f"{where(second)}: {text(second)} appears twice "
                                 f"(also at {where(first)})"))

    unique_pair, first_pair, inverse = np.unique(pair, return_index=True, return_inverse=True)
    home = table.device[first_pair][inverse]
    away = np.flatnonzero(table.device != home)
    if len(away):
        i = int(away[0])
        j = int(first_pair[inverse[i]])
        problems.append((i, f"{where(i)}: {text(i)} is on device {int(table.device[i])} but "
                            f"{text(j)} is on device {int(table.device[j])} (all operations of "
                            f"one stage and microbatch run on one device)"))

    # First index of each (pair, kind), or `count` when absent.
    first_of = np.full((len(unique_pair), len(KINDS)), count, dtype=np.int64)
    slot_of_unique = np.searchsorted(unique_pair, unique_full // len(KINDS))
    first_of[slot_of_unique, unique_full % len(KINDS)] = first_full
    has = first_of < count
    f_, b_, i_, w_ = (first_of[:, code] for code in range(len(KINDS)))
    has_f, has_b, has_i, has_w = (has[:, code] for code in range(len(KINDS)))

    def report(mask, rank, describe):
        rows = np.flatnonzero(mask)
        if len(rows):
            row = int(rows[np.argmin(rank[rows])])
            problems.append((int(rank[row]), describe(row)))

    def pair_text(row, kind_letter):
        value = int(unique_pair[row])
        return f"{value // M}{kind_letter}{value % M}" if M else "?"

    report(~has_f, np.minimum(np.minimum(b_, i_), w_),
           lambda row: f"{where(int(min(b_[row], i_[row], w_[row])))}: "
                       f"{text(int(min(b_[row], i_[row], w_[row])))} has no forward "
                       f"({pair_text(row, 'F')})")
    report(has_f & ~has_b & ~has_i & ~has_w, f_,
           lambda row: f"{where(int(f_[row]))}: {text(int(f_[row]))} has no backward "
                       f"({pair_text(row, 'B')}, or {pair_text(row, 'I')} and "
                       f"{pair_text(row, 'W')})")
    mixed_rank = np.maximum(b_, np.minimum(i_, w_))
    report(has_b & (has_i | has_w), mixed_rank,
           lambda row: f"{where(int(mixed_rank[row]))}: {text(int(mixed_rank[row]))} "
                       f"splits a backward that {pair_text(row, 'B')} already runs whole")
    report(has_i & ~has_w & ~has_b, i_,
           lambda row: f"{where(int(i_[row]))}: {text(int(i_[row]))} has no weight-grad "
                       f"({pair_text(row, 'W')})")
    report(has_w & ~has_i & ~has_b, w_,
           lambda row: f"{where(int(w_[row]))}: {text(int(w_[row]))} has no input-grad "
                       f"({pair_text(row, 'I')})")

    if len(unique_pair) < S * M and not problems:
        # The first value absent from the sorted pairs, without an array of S*M flags.
        gaps = np.flatnonzero(unique_pair != np.arange(len(unique_pair)))
        missing = int(gaps[0]) if len(gaps) else len(unique_pair)
        problems.append((unlocated, f"stage {missing // M}, microbatch {missing % M}: no "
                                    f"operation at all (expected {missing // M}F{missing % M} "
                                    f"and its backward)"))
    return problems
