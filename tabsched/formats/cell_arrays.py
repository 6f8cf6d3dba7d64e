"""A PyTorch schedule CSV's cells as arrays, read by the compiled scan in one pass.

PyTorch's CSVs (:mod:`tabsched.formats.pytorch_csv`) hold one cell per action,
tens of thousands of them for a schedule of 32 ranks. Reading each cell into a
Python object and checking it one by one took most of the time of reading and
evaluating such a file, so the plain files are read here as arrays:
:func:`tabsched._csv_cells.scan_cells` splits the bytes and reads every cell
spelt the plainest way (``3F12``, ``0SEND_F5``, ``1UNSHARD``); the few others
(an overlapped ``(..)OVERLAP_F_B``, a cell with spaces) are read by the one cell
grammar, :func:`tabsched.cells.parse_torch_token`.

Data model
----------
:class:`Cells`: one entry per cell, in row order: ``device`` (the row),
``slot`` (the cell's column), ``word`` (a code of :data:`WORDS`: the kind letter
or action as written, ``EMPTY``), ``stage`` and ``microbatch`` (``-1`` where
the cell has none). :class:`PlainRead`: what :func:`read_plain` gives a reader:
the operations (``device, slot, kind, stage, microbatch`` arrays, as
:meth:`tabsched.table.ScheduleTable.from_arrays` takes them, an overlapped
cell's parts side by side in the order written), each row's length (an action
at the end of its row takes no slot), the action cells and the first empty cell.

This module decides nothing about a file's validity: where a file is not plain
(a quote, a cell the grammar refuses, a row without an operation, a token of
the other dialect), :func:`read_plain` returns ``None`` and the general reader
(:func:`tabsched.formats.rows.parse_rows`) reads it and names the problem, so
every message stays the one that reader gives. ``tests/test_cell_arrays.py``
pins both readers to the same tables on random and mutated files.
"""

from dataclasses import dataclass

import numpy as np

from tabsched import _csv_cells
from tabsched.cells import (KIND_CODES, TOKEN_KINDS, Action, Op, Overlap, is_overlap_pair,
                            parse_torch_token)
from tabsched.exceptions import InvalidScheduleError

__all__ = ["WORDS", "WORD_CODES", "Cells", "PlainRead", "read_plain", "is_comm", "is_action"]

#: The word of each code (``""``: an empty cell, ``None``: a cell the scan left to the grammar).
WORDS = _csv_cells.WORDS
WORD_CODES = {word: code for code, word in enumerate(WORDS) if word}
EMPTY = _csv_cells.EMPTY
OTHER = _csv_cells.OTHER
_FIRST_COMM, _LAST_COMM = _csv_cells.COMMS
_LAST_ACTION = _csv_cells.STAGE_ACTIONS[1]
#: Per dialect (``legacy``), the kind code of each word (-1: not an operation).
_KIND_OF_WORD = {legacy: np.array([KIND_CODES[letters[word]] if word in letters else -1
                                   for word in WORDS], dtype=np.int8)
                 for legacy, letters in TOKEN_KINDS.items()}
#: Per dialect, the word that is no operation in it (legacy has no I, current no BW).
_FOREIGN = {False: WORD_CODES["BW"], True: WORD_CODES["I"]}


def is_comm(word):
    """Mask of the SEND/RECV cells among word codes."""
    return (word >= _FIRST_COMM) & (word <= _LAST_COMM)


def is_action(word):
    """Mask of the action cells (SEND/RECV, UNSHARD, RESHARD, REDUCE_GRAD) among word codes."""
    return (word >= _FIRST_COMM) & (word <= _LAST_ACTION)


@dataclass(frozen=True, eq=False)
class Cells:
    """Cells of a file, one entry each in row order (see the module docstring)."""

    device: np.ndarray
    slot: np.ndarray
    word: np.ndarray
    stage: np.ndarray
    microbatch: np.ndarray

    def __len__(self):
        return len(self.device)

    def take(self, mask):
        """The cells where ``mask`` holds."""
        return Cells(self.device[mask], self.slot[mask], self.word[mask], self.stage[mask],
                     self.microbatch[mask])

    def entries(self):
        """``(device, slot, Action)`` of every cell, as the general reader lists actions."""
        return [(device, slot, Action(WORDS[word], stage, None if microbatch < 0 else microbatch))
                for device, slot, word, stage, microbatch in zip(
                    self.device.tolist(), self.slot.tolist(), self.word.tolist(),
                    self.stage.tolist(), self.microbatch.tolist())]

    @classmethod
    def from_entries(cls, entries):
        """The cells of ``(device, slot, Action)`` entries (the general reader's actions)."""
        columns = list(zip(*[(device, slot, WORD_CODES[cell.kind], cell.stage,
                              -1 if cell.microbatch is None else cell.microbatch)
                             for device, slot, cell in entries])) or [()] * 5
        return cls(*(np.array(column, dtype=dtype) for column, dtype in
                     zip(columns, (np.int32, np.int32, np.int8, np.int64, np.int64))))


@dataclass(frozen=True, eq=False)
class PlainRead:
    """A plain file's operations, row lengths, action cells and first empty cell."""

    ops: tuple
    row_lengths: np.ndarray
    actions: Cells
    first_empty: tuple | None


def read_plain(text, legacy):
    """The cells of PyTorch CSV ``text`` as a :class:`PlainRead`, or ``None`` where the
    general reader must read it (it explains every problem a file has).

    ``legacy``: PyTorch's legacy tokens (``B`` input-grad, ``BW`` full backward).

    >>> read = read_plain("0F0,0SEND_F0,0RECV_B0,0B0\\r\\n1RECV_F0,1F0,1B0,1SEND_B0\\r\\n", False)
    >>> read.ops[0].tolist(), read.ops[1].tolist(), read.row_lengths.tolist()
    ([0, 0, 1, 1], [0, 3, 1, 2], [4, 3])
    >>> [str(cell) for _, _, cell in read.actions.entries()]
    ['0SEND_F0', '0RECV_B0', '1RECV_F0', '1SEND_B0']
    >>> read_plain('"0F0",0B0', False) is None     # quoted: csv's to read
    True
    """
    if not isinstance(text, str) or "\x00" in text:
        return None
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:      # a lone surrogate: the general reader says where
        return None
    if len(data) >= 2**31 - 1:
        return None
    bound = data.count(b",") + data.count(b"\n") + 1
    device, slot, stage, microbatch = (np.empty(bound, dtype=np.int32) for _ in range(4))
    word = np.empty(bound, dtype=np.int8)
    count = _csv_cells.scan_cells(data, device, slot, word, stage, microbatch)
    if count <= 0:
        return None
    device, slot, word, stage, microbatch = (array[:count] for array in
                                             (device, slot, word, stage, microbatch))
    if np.any(word == _FOREIGN[legacy]):
        return None
    kind = _KIND_OF_WORD[legacy][word]
    overlaps = {}
    for k in np.flatnonzero(word == OTHER).tolist():
        try:
            cell = parse_torch_token(data[stage[k]:microbatch[k]].decode("utf-8"), legacy)
        except (InvalidScheduleError, UnicodeDecodeError):
            return None
        stage[k] = microbatch[k] = -1
        if cell is None:
            word[k] = EMPTY
        elif isinstance(cell, Action):
            word[k] = WORD_CODES[cell.kind]
            stage[k] = cell.stage
            microbatch[k] = -1 if cell.microbatch is None else cell.microbatch
        elif isinstance(cell, Op):
            kind[k], stage[k], microbatch[k] = KIND_CODES[cell.kind], cell.stage, cell.microbatch
        elif isinstance(cell, Overlap) and is_overlap_pair(part.kind for part in cell.parts):
            overlaps[k] = cell.parts
        else:
            return None
    ops = _operations(device, slot, kind, stage, microbatch, overlaps)
    rows = int(device[-1]) + 1
    if np.count_nonzero(np.bincount(ops[0], minlength=rows)) < rows:
        return None                 # a row that runs nothing: the general reader says which
    actions = is_action(word)
    kept = np.flatnonzero(~actions)     # the cells that take a slot
    kept_device = device[kept]
    last = kept[np.append(kept_device[1:] != kept_device[:-1], True)]
    empty = np.flatnonzero(word == EMPTY)
    first_empty = (int(device[empty[0]]), int(slot[empty[0]])) if len(empty) else None
    return PlainRead(ops, slot[last] + 1,
                     Cells(device, slot, word, stage, microbatch).take(actions), first_empty)


def _operations(device, slot, kind, stage, microbatch, overlaps):
    """The operation arrays of the cells: one per operation cell, an overlap's parts each."""
    size = (kind >= 0).astype(np.intp)
    for k, parts in overlaps.items():
        size[k] = len(parts)
    if not overlaps:
        cell = np.flatnonzero(size)
    else:
        cell = np.repeat(np.arange(len(size)), size)
    ops = [device[cell], slot[cell], kind[cell], stage[cell], microbatch[cell]]
    if overlaps:
        first = np.cumsum(size) - size
        for k, parts in overlaps.items():
            for offset, part in enumerate(parts):
                at = first[k] + offset
                ops[2][at], ops[3][at], ops[4][at] = (KIND_CODES[part.kind], part.stage,
                                                      part.microbatch)
    return tuple(ops)
