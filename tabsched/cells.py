"""The cell grammar: the text of an operation, an overlapped cell and PyTorch's actions.

Every reader of a schedule reads its cells here, and every writer writes them
with these types' ``str``, so that one grammar says what a cell is:

* an **operation** ``<stage><kind><microbatch>`` (``3F12``): an :class:`Op`, the
  value ``(kind, stage, microbatch)`` with kind ``F`` (forward), ``B`` (full
  backward), ``I`` (backward for inputs) or ``W`` (backward for weights), as
  PyTorch's ``_Action`` writes it; stage and microbatch in ASCII digits, at most
  :data:`MAX_ID` (the table's ids are int32);
* an **overlapped cell** ``(<op>;<op>)OVERLAP_F_B``: an :class:`Overlap`, one
  forward and one backward (``B`` or ``I``) that a device runs as one step;
* an **action** of PyTorch's runtime that is not computation: an :class:`Action`,
  ``<stage>REDUCE_GRAD``, ``<stage>UNSHARD``, ``<stage>RESHARD`` (no microbatch)
  or ``<stage><SEND_F|RECV_F|SEND_B|RECV_B><microbatch>``;
* an empty cell: idle.

The words after the stage are read by one lexer (:func:`split_token`), in the
dialect of the file at hand:

==========================  =============================================================
:func:`parse_cell`          a table's cell (``ScheduleTable``'s rows): operations, overlaps
:func:`parse_token`         a cell of tabsched's CSV and JSON rows: also ``REDUCE_GRAD``;
                            PyTorch's other actions are refused with the reader to use
:func:`parse_torch_token`   a cell of PyTorch's CSVs: every action, in current tokens or
                            the legacy ones (``B`` input-grad, ``BW`` full backward)
:func:`parse_pp_label`      a ``PP:`` label of a profiler trace (without ``PP:``): current
                            tokens, ids of at most 9 digits, no spaces
==========================  =============================================================

Each error is an ``InvalidScheduleError`` with one line that names the token
(:func:`shown`) but not its place; readers add the file, device and slot.

>>> parse_cell("3F12")
Op(kind='F', stage=3, microbatch=12)
>>> str(parse_cell("(0F7; 7B3)OVERLAP_F_B"))
'(0F7;7B3)OVERLAP_F_B'
>>> parse_torch_token("0B1", legacy=True)
Op(kind='I', stage=0, microbatch=1)
>>> parse_torch_token("2RECV_F5", legacy=False)
Action(kind='RECV_F', stage=2, microbatch=5)
"""

import numbers
import re
from typing import NamedTuple

from tabsched.exceptions import InvalidScheduleError

__all__ = ["Op", "Overlap", "Action", "KINDS", "KIND_CODES", "MAX_ID", "parse_cell",
           "parse_token", "parse_torch_token", "parse_pp_label", "coerce_cell", "split_token",
           "is_overlap_pair", "shown", "shown_repr", "cut"]

#: Operation kinds, in the order of their integer codes in the table arrays.
KINDS = ("F", "B", "I", "W")
FORWARD, BACKWARD, INPUT_GRAD, WEIGHT_GRAD = range(4)
KIND_CODES = {kind: code for code, kind in enumerate(KINDS)}
KIND_NAMES = {"F": "forward", "B": "full backward", "I": "input-grad backward",
              "W": "weight-grad backward"}

#: Largest stage or microbatch id: ids are int32 in the table arrays.
MAX_ID = 2 ** 31 - 1

OVERLAP_SUFFIX = "OVERLAP_F_B"
REDUCE_GRAD = "REDUCE_GRAD"
#: PyTorch's point-to-point actions: each carries one microbatch's data to a neighbour stage.
COMM_ACTIONS = ("SEND_F", "RECV_F", "SEND_B", "RECV_B")
#: FSDP's parameter all-gather and free.
FSDP_ACTIONS = ("UNSHARD", "RESHARD")
#: The actions that name a stage and no microbatch.
STAGE_ACTIONS = FSDP_ACTIONS + (REDUCE_GRAD,)
#: How tabsched's own files read the common ``<stage><F|B|I|W><microbatch>`` cell.
KINDS_AS_WRITTEN = {"F": "F", "B": "B", "I": "I", "W": "W"}
#: How the letters of each PyTorch dialect read (``legacy`` -> letter -> kind): its current
#: tokens are tabsched's; its legacy tokens used ``B`` for the input-grad backward and ``BW``
#: for the full one.
TOKEN_KINDS = {False: KINDS_AS_WRITTEN, True: {"F": "F", "B": "I", "BW": "B", "W": "W"}}

# One lexer for every dialect: a stage in ASCII digits, a word, a microbatch (digits, or
# none). str.isdigit and \d also take Arabic-Indic or fullwidth digits, which int() reads
# as 0-9, so "٠F٠" would silently become 0F0. The words never share a split: a token
# matches one way or not at all.
_WORDS = COMM_ACTIONS + STAGE_ACTIONS + ("BW",) + KINDS
_TOKEN = re.compile(r"([0-9]+)(" + "|".join(_WORDS) + r")([0-9]*)")
#: The common case, read without further checks: ids of at most 9 digits fit int32.
SIMPLE_OP = re.compile(r"([0-9]{1,9})([FBIW])([0-9]{1,9})")
_ANY_DIGITS = re.compile(r"\d+[FBIW]\d+")
#: The actions tabsched's own files leave to PyTorch's reader (and the legacy ``BW``).
_RUNTIME_ONLY = frozenset(COMM_ACTIONS + FSDP_ACTIONS + ("BW",))
#: Digits of an id in a profiler label: few enough to fit any index.
_LABEL_DIGITS = 9

EXPECTED = "expected <stage><F|B|I|W><microbatch>, e.g. 3F12, or (<op>;<op>)OVERLAP_F_B"
TORCH_EXPECTED = ("expected <stage><F|I|B|W><microbatch>, (<op>;<op>)OVERLAP_F_B, "
                  "<stage><SEND_F|RECV_F|SEND_B|RECV_B><microbatch> or "
                  "<stage><UNSHARD|RESHARD|REDUCE_GRAD>")
#: Characters of a token that an error message shows at most.
SHOWN_LIMIT = 40


# ------------------------------------------------------------------ messages
def cut(text, limit=SHOWN_LIMIT):
    """``text`` for a one-line message, unquoted: control characters escaped, cut if long.

    >>> cut("x" * 50, 10)
    'xxxxxxxxxx... (50 characters)'
    """
    text = str(text)
    escaped = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text[:limit])
    return f"{escaped}... ({len(text)} characters)" if len(text) > limit else escaped


def shown(text, limit=SHOWN_LIMIT):
    """``text`` quoted for a one-line message: control characters escaped, cut if long.

    >>> shown("3F12")
    '"3F12"'
    >>> shown("0F" + "9" * 100)
    '"0F99999999999999999999999999999999999999..." (102 characters)'
    >>> shown("0F\\n0")
    '"0F\\\\n0"'
    """
    text = str(text)
    escaped = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text[:limit])
    if len(text) > limit:
        return f'"{escaped}..." ({len(text)} characters)'
    return f'"{escaped}"'


def lone_surrogate(text):
    """Where ``text`` holds a lone surrogate (``"\\ud800"``, which JSON's escapes can
    write but no UTF-8 text holds and no terminal prints), or -1 if it is Unicode text.

    >>> lone_surrogate("1f1b"), lone_surrogate("ab\\udc80")
    (-1, 2)
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        return error.start
    return -1


def shown_repr(value, limit=SHOWN_LIMIT):
    """``repr(value)`` for a one-line message, cut if long.

    >>> shown_repr([1] * 30)
    '[1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, ... (90 characters)'
    """
    text = repr(value)
    if len(text) > limit:
        return f"{text[:limit]}... ({len(text)} characters)"
    return text


# ------------------------------------------------------------------ values
class Op(NamedTuple):
    """One operation: ``kind`` of ``microbatch`` on model chunk ``stage``.

    >>> str(Op("F", 3, 12))
    '3F12'
    """

    kind: str
    stage: int
    microbatch: int

    def __str__(self):
        return f"{self.stage}{self.kind}{self.microbatch}"


class Overlap(NamedTuple):
    """Operations a device runs as one step (PyTorch's ``OVERLAP_F_B``).

    >>> str(Overlap((Op("F", 0, 7), Op("B", 7, 3))))
    '(0F7;7B3)OVERLAP_F_B'
    """

    parts: tuple

    def __str__(self):
        return "(" + ";".join(str(part) for part in self.parts) + ")" + OVERLAP_SUFFIX


class Action(NamedTuple):
    """A cell that is not computation: ``kind`` (``REDUCE_GRAD``, PyTorch's SEND/RECV,
    UNSHARD, RESHARD) of ``stage``, and ``microbatch`` (None where it takes none).

    >>> str(Action("REDUCE_GRAD", 3))
    '3REDUCE_GRAD'
    """

    kind: str
    stage: int
    microbatch: object = None

    def __str__(self):
        return f"{self.stage}{self.kind}{'' if self.microbatch is None else self.microbatch}"


def is_overlap_pair(kinds):
    """Whether an overlapped cell's part kinds are one forward and one ``B`` or ``I``.

    >>> is_overlap_pair(["B", "F"]), is_overlap_pair(["F", "W"])
    (True, False)
    """
    kinds = sorted(kinds)
    return len(kinds) == 2 and kinds[0] != kinds[1] and "F" in kinds and "W" not in kinds


# ------------------------------------------------------------------ the lexer
def split_token(token):
    """``(stage digits, word, microbatch digits)`` of a stripped token, or None.

    The word is a kind letter, ``BW`` or an action; the microbatch is ``""`` where the
    token has none. Digits are ASCII and unbounded: the dialects bound them.

    >>> split_token("12SEND_B3"), split_token("0UNSHARD"), split_token("0X1")
    (('12', 'SEND_B', '3'), ('0', 'UNSHARD', ''), None)
    """
    match = _TOKEN.fullmatch(token)
    return None if match is None else match.groups()


def parse_id(digits, what, token):
    """An id from ASCII digits, refused if it does not fit the table's int32 ids."""
    if len(digits) > len(str(MAX_ID)) or int(digits) > MAX_ID:
        number = digits if len(digits) <= 20 else f"{digits[:12]}... ({len(digits)} digits)"
        raise InvalidScheduleError(f"{shown(token)}: {what} {number} is too large (ids go up "
                                   f"to {MAX_ID})")
    return int(digits)


# ------------------------------------------------------------------ a table's cells
def parse_cell(text):
    """The cell a text stands for: ``None`` (idle), an ``Op`` or an ``Overlap``.

    Raises ``InvalidScheduleError`` without a location; callers add theirs.

    >>> parse_cell("3F12")
    Op(kind='F', stage=3, microbatch=12)
    >>> parse_cell("")
    >>> parse_cell("3X12")
    Traceback (most recent call last):
    ...
    tabsched.exceptions.InvalidScheduleError: "3X12" is not an operation (expected <stage><F|B|I|W><microbatch>, e.g. 3F12, or (<op>;<op>)OVERLAP_F_B)
    """
    token = text.strip()
    simple = SIMPLE_OP.fullmatch(token)
    if simple is not None:
        return Op(simple[2], int(simple[1]), int(simple[3]))
    if not token:
        return None
    inner = compound_parts(token)
    if inner is not None:
        parts = []
        for part in inner:
            op = parse_cell(part) if not part.startswith("(") else None
            if not isinstance(op, Op):
                raise InvalidScheduleError(f'{shown(token)}: {shown(part)} is not an operation '
                                           f'({EXPECTED})')
            parts.append(op)
        return checked_overlap(tuple(parts), token)
    return parse_op(token, EXPECTED)


def parse_op(token, expected=EXPECTED):
    """The ``Op`` of a stripped ``<stage><kind><microbatch>`` token, ids bounded."""
    split = split_token(token)
    if split is None or split[1] not in KIND_CODES or not split[2]:
        if _ANY_DIGITS.fullmatch(token):
            raise InvalidScheduleError(f"{shown(token)} is not an operation: write the stage "
                                       f"and microbatch in ASCII digits 0-9")
        raise InvalidScheduleError(f"{shown(token)} is not an operation ({expected})")
    stage, kind, microbatch = split
    return Op(kind, parse_id(stage, "stage", token), parse_id(microbatch, "microbatch", token))


def compound_parts(token, expected=EXPECTED):
    """The part texts of a compound cell ``(<op>;<op>)OVERLAP_F_B``, or None if not one.

    >>> compound_parts("(0F7; 7B3)OVERLAP_F_B")
    ['0F7', '7B3']
    """
    if not token.startswith("("):
        return None
    closing = token.find(")")
    if closing < 0:
        raise InvalidScheduleError(f'{shown(token)} has no closing parenthesis ({expected})')
    suffix = token[closing + 1:]
    if suffix != OVERLAP_SUFFIX:
        raise InvalidScheduleError(f'{shown(token)} is not an operation: a compound cell must '
                                   f'end in {OVERLAP_SUFFIX}, not {shown(suffix)}')
    return [part.strip() for part in token[1:closing].split(";")]


def checked_overlap(parts, token):
    """``Overlap(parts)``, refused naming ``token`` unless one forward and one B or I."""
    if not is_overlap_pair(part.kind for part in parts):
        raise InvalidScheduleError(
            f'{shown(token)}: an overlapped cell holds one forward and one backward (F with B '
            f'or I)')
    return Overlap(parts)


def coerce_cell(cell):
    """``cell`` (None, an Op, an Overlap, a string or a ``(kind, stage, microbatch)`` tuple)
    as None, an Op or an Overlap; ``InvalidScheduleError`` if it is none of these."""
    if cell is None or isinstance(cell, Op):
        return cell
    if isinstance(cell, Overlap):
        return checked_overlap(tuple(cell.parts), str(cell))
    if isinstance(cell, str):
        return parse_cell(cell)
    if isinstance(cell, tuple) and len(cell) == 3:
        kind, stage, microbatch = cell
        if not isinstance(kind, str) or kind not in KIND_CODES:
            raise InvalidScheduleError(f'{shown_repr((cell))}: kind must be one of F, B, I, W')
        for what, value in (("stage", stage), ("microbatch", microbatch)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) \
                    or not 0 <= value <= MAX_ID:
                raise InvalidScheduleError(f"{shown_repr((cell))}: {what} must be an integer "
                                           f"0..{MAX_ID}")
        return Op(kind, int(stage), int(microbatch))
    raise InvalidScheduleError(f"{shown_repr((cell))} is not a cell (expected None, an Op, an "
                               f"Overlap or a string)")


# ------------------------------------------------------------------ files' cells
def parse_token(token):
    """A cell of tabsched's CSV and JSON rows: None, an Op, an Overlap or a REDUCE_GRAD Action.

    >>> parse_token("2REDUCE_GRAD")
    Action(kind='REDUCE_GRAD', stage=2, microbatch=None)
    """
    token = token.strip()
    split = split_token(token)
    if split is not None:
        stage, word, microbatch = split
        if word == REDUCE_GRAD and not microbatch:
            return Action(REDUCE_GRAD, parse_id(stage, "stage", token))
        if word in _RUNTIME_ONLY:
            raise InvalidScheduleError(f"{shown(token)} is one of PyTorch's runtime actions; "
                                       f"read the file with tabsched.read_pytorch (the CLI does)")
    return parse_cell(token)


def parse_torch_token(token, legacy):
    """An ``Op``, ``Overlap``, ``Action`` or None (idle) for one cell of PyTorch's CSV.

    ``legacy``: read PyTorch's legacy tokens (``B`` input-grad, ``BW`` full backward).
    An overlap's parts are not checked here: the table checks that they are one F
    and one B or I.

    >>> parse_torch_token("0BW1", legacy=False)
    Traceback (most recent call last):
    ...
    tabsched.exceptions.InvalidScheduleError: "0BW1" is a full backward in PyTorch's legacy tokens; read the file with legacy=True (--torch-legacy)
    """
    token = token.strip()
    if not token:
        return None
    inner = compound_parts(token, TORCH_EXPECTED)
    if inner is not None:
        parts = []
        for part in inner:
            op = parse_torch_token(part, legacy) if part else None
            if not isinstance(op, Op):
                raise InvalidScheduleError(f'{shown(token)}: {shown(part)} is not a compute '
                                           f'operation (expected <stage><F|I|B|W><microbatch>)')
            parts.append(op)
        return Overlap(tuple(parts))
    split = split_token(token)
    if split is None:
        parse_op(token, TORCH_EXPECTED)   # the same message as tabsched's own cells give
        raise InvalidScheduleError(f"{shown(token)} is not an operation ({TORCH_EXPECTED})")
    stage, kind, microbatch = parse_id(split[0], "stage", token), split[1], split[2]
    if kind in STAGE_ACTIONS:
        if microbatch:
            raise InvalidScheduleError(f'{shown(token)}: {kind} takes no microbatch '
                                       f'(expected {stage}{kind})')
        return Action(kind, stage)
    if not microbatch:
        raise InvalidScheduleError(f'{shown(token)} has no microbatch (expected e.g. '
                                   f'{cut(token + "0")})')
    microbatch = parse_id(microbatch, "microbatch", token)
    if kind in COMM_ACTIONS:
        return Action(kind, stage, microbatch)
    kinds = TOKEN_KINDS[legacy]
    if kind not in kinds:
        if legacy:
            raise InvalidScheduleError(f'{shown(token)}: PyTorch\'s legacy tokens have no I; '
                                       f'read the file without legacy=True (--torch-legacy)')
        raise InvalidScheduleError(f'{shown(token)} is a full backward in PyTorch\'s legacy '
                                   f'tokens; read the file with legacy=True (--torch-legacy)')
    return Op(kinds[kind], stage, microbatch)


def parse_pp_label(text):
    """The cell a profiler's ``PP:`` label names (``text`` without ``PP:``), or None.

    An ``Op``, an ``Overlap`` of two operations (their kinds not checked; see
    :func:`is_overlap_pair`) or an ``Action``, in PyTorch's current tokens, exactly
    as its runtime writes them: no spaces, ids of at most 9 digits.

    >>> parse_pp_label("(0F7;7B3)OVERLAP_F_B")
    Overlap(parts=(Op(kind='F', stage=0, microbatch=7), Op(kind='B', stage=7, microbatch=3)))
    >>> parse_pp_label("0BW1") is None
    True
    """
    split = split_token(text)
    if split is not None:
        stage, word, microbatch = split
        if len(stage) > _LABEL_DIGITS or len(microbatch) > _LABEL_DIGITS:
            return None
        if microbatch and word in KIND_CODES:
            return Op(word, int(stage), int(microbatch))
        if microbatch and word in COMM_ACTIONS:
            return Action(word, int(stage), int(microbatch))
        if not microbatch and word in STAGE_ACTIONS:
            return Action(word, int(stage))
        return None
    closing = ")" + OVERLAP_SUFFIX
    if text.startswith("(") and text.endswith(closing):
        parts = [SIMPLE_OP.fullmatch(part) for part in text[1:-len(closing)].split(";")]
        if len(parts) == 2 and all(parts):
            return Overlap(tuple(Op(part[2], int(part[1]), int(part[3])) for part in parts))
    return None
