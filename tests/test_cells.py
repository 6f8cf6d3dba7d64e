"""The cell grammar (tabsched/cells.py): every token kind read and written back, in each
dialect, and the one-line message each dialect gives for what it refuses."""

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tabsched.cells import (COMM_ACTIONS, KINDS, MAX_ID, STAGE_ACTIONS, Action, Op, Overlap,
                            coerce_cell, is_overlap_pair, parse_cell, parse_pp_label, parse_token,
                            parse_torch_token, split_token)
from tabsched.exceptions import InvalidScheduleError

IDS = st.integers(0, MAX_ID)
SMALL_IDS = st.integers(0, 10**9 - 1)   # what a profiler label holds (at most 9 digits)


def ops(ids=IDS, kinds=KINDS):
    return st.builds(Op, st.sampled_from(kinds), ids, ids)


@st.composite
def overlaps(draw, ids=IDS):
    forward = draw(ops(ids, ("F",)))
    backward = draw(ops(ids, ("B", "I")))
    parts = (forward, backward) if draw(st.booleans()) else (backward, forward)
    return Overlap(parts)


@st.composite
def actions(draw, ids=IDS):
    kind = draw(st.sampled_from(COMM_ACTIONS + STAGE_ACTIONS))
    return Action(kind, draw(ids), draw(ids) if kind in COMM_ACTIONS else None)


# ------------------------------------------------------------------ round trips
@given(st.one_of(ops(), overlaps()))
def test_a_table_cell_reads_back_from_its_text(cell):
    text = str(cell)
    assert parse_cell(text) == cell and str(parse_cell(text)) == text
    assert parse_token(text) == cell
    assert parse_torch_token(text, legacy=False) == cell
    assert coerce_cell(text) == cell == coerce_cell(cell)


@given(actions())
def test_an_action_reads_back_in_pytorch_s_tokens(action):
    text = str(action)
    assert parse_torch_token(text, legacy=False) == action
    assert parse_torch_token(text, legacy=True) == action
    if action.kind == "REDUCE_GRAD":        # the one action tabsched's own files hold
        assert parse_token(text) == action
    else:
        with pytest.raises(InvalidScheduleError, match="one of PyTorch's runtime actions"):
            parse_token(text)


@given(st.one_of(ops(SMALL_IDS), overlaps(SMALL_IDS), actions(SMALL_IDS)))
def test_a_profiler_label_reads_back(cell):
    assert parse_pp_label(str(cell)) == cell


@given(ops(kinds=("F", "I", "W")), st.booleans())
def test_legacy_tokens_name_the_kinds_anew(op, spaced):
    legacy = {"F": "F", "I": "B", "W": "W"}[op.kind]
    text = f"{op.stage}{legacy}{op.microbatch}"
    assert parse_torch_token(f" {text} " if spaced else text, legacy=True) == op
    full = f"{op.stage}BW{op.microbatch}"
    assert parse_torch_token(full, legacy=True) == Op("B", op.stage, op.microbatch)


@st.composite
def written(draw):
    """The text of a cell as a person might write it: leading zeros, spaces."""
    def op_text(op):
        zeros = st.text("0", max_size=2)
        return f"{draw(zeros)}{op.stage}{op.kind}{draw(zeros)}{op.microbatch}"

    spaces = st.text(" ", max_size=2)
    cell = draw(st.one_of(ops(st.integers(0, 999)), overlaps(st.integers(0, 999))))
    if isinstance(cell, Op):
        return draw(spaces) + op_text(cell) + draw(spaces)
    return (draw(spaces) + "(" + f"{draw(spaces)};{draw(spaces)}".join(
        op_text(part) for part in cell.parts) + ")OVERLAP_F_B" + draw(spaces))


@given(st.one_of(written(), st.text("0123456789FBIWSENDRCV_UHAOLP()x; ", max_size=14)))
def test_text_that_reads_as_a_cell_is_written_back_as_read(text):
    """text -> cell -> text: a token that reads writes back as itself, spaces aside."""
    try:
        cell = parse_cell(text)
    except InvalidScheduleError:
        return
    if cell is None:
        assert not text.strip()
        return
    normal = re.sub(r"[0-9]+", lambda digits: str(int(digits[0])), "".join(text.split()))
    assert str(cell) == normal    # spaces and leading zeros are not kept
    assert parse_cell(str(cell)) == cell


def test_every_token_kind():
    assert parse_cell("3F12") == Op("F", 3, 12)
    assert [parse_cell(f"0{kind}1").kind for kind in KINDS] == list(KINDS)
    assert parse_cell(" (0F7 ; 7I3)OVERLAP_F_B ") == Overlap((Op("F", 0, 7), Op("I", 7, 3)))
    assert parse_token("2REDUCE_GRAD") == Action("REDUCE_GRAD", 2)
    assert [parse_torch_token(f"1{kind}4", legacy=False) for kind in COMM_ACTIONS] == \
        [Action(kind, 1, 4) for kind in COMM_ACTIONS]
    assert [parse_torch_token(f"1{kind}", legacy=False) for kind in STAGE_ACTIONS] == \
        [Action(kind, 1) for kind in STAGE_ACTIONS]
    assert parse_torch_token("", legacy=False) is None and parse_cell(" ") is None
    assert parse_pp_label("3RECV_B12") == Action("RECV_B", 3, 12)


def test_the_lexer_splits_each_token_one_way_with_ascii_digits():
    assert split_token("0BW1") == ("0", "BW", "1")
    assert split_token("0B1") == ("0", "B", "1")
    assert split_token("12REDUCE_GRAD") == ("12", "REDUCE_GRAD", "")
    assert split_token("\u0660F\u0660") is None and split_token("F0") is None
    assert split_token(" 0F0") is None   # callers strip first


def test_overlap_pairs():
    assert is_overlap_pair("FB") and is_overlap_pair("IF")
    assert not any(is_overlap_pair(kinds) for kinds in ("FW", "FF", "BI", "F", "FBI", ""))


def test_profiler_labels_are_read_as_the_runtime_writes_them():
    assert parse_pp_label("999999999F0") == Op("F", 999999999, 0)
    for text in ("1234567890F0", "0F1234567890", "0F 0", "(0F0; 1B0)OVERLAP_F_B", "0BW1",
                 "0REDUCE_GRAD1", "0SEND_F", "(0F0;1B0;2B0)OVERLAP_F_B", "()OVERLAP_F_B", ""):
        assert parse_pp_label(text) is None, text
    # the kinds of an overlap are the reader's to check (its message names the event)
    assert parse_pp_label("(0F0;0W0)OVERLAP_F_B") == Overlap((Op("F", 0, 0), Op("W", 0, 0)))


# ------------------------------------------------------------------ messages
EXPECTED = ("expected <stage><F|B|I|W><microbatch>, e.g. 3F12, or (<op>;<op>)OVERLAP_F_B")
TORCH_EXPECTED = ("expected <stage><F|I|B|W><microbatch>, (<op>;<op>)OVERLAP_F_B, "
                  "<stage><SEND_F|RECV_F|SEND_B|RECV_B><microbatch> or "
                  "<stage><UNSHARD|RESHARD|REDUCE_GRAD>")
RUNTIME = "is one of PyTorch's runtime actions; read the file with tabsched.read_pytorch " \
          "(the CLI does)"
REFUSED = [
    ("cell", "3X12", f'"3X12" is not an operation ({EXPECTED})'),
    ("cell", "\u0660F\u0660", '"\u0660F\u0660" is not an operation: write the stage and '
                              'microbatch in ASCII digits 0-9'),
    ("cell", "0F2147483648", '"0F2147483648": microbatch 2147483648 is too large (ids go up '
                             'to 2147483647)'),
    ("cell", "0F" + "9" * 30, f'"0F{"9" * 30}": microbatch 999999999999... (30 digits) is too '
                              f'large (ids go up to 2147483647)'),
    ("cell", "(0F0;1B0", f'"(0F0;1B0" has no closing parenthesis ({EXPECTED})'),
    ("cell", "(0F0;1B0)X", '"(0F0;1B0)X" is not an operation: a compound cell must end in '
                           'OVERLAP_F_B, not "X"'),
    ("cell", "(0F0;)OVERLAP_F_B", f'"(0F0;)OVERLAP_F_B": "" is not an operation ({EXPECTED})'),
    ("cell", "(0F0;3X1)OVERLAP_F_B", f'"3X1" is not an operation ({EXPECTED})'),
    ("cell", "(0F0;0W0)OVERLAP_F_B", '"(0F0;0W0)OVERLAP_F_B": an overlapped cell holds one '
                                     'forward and one backward (F with B or I)'),
    ("cell", "0BW1", f'"0BW1" is not an operation ({EXPECTED})'),
    ("token", "0SEND_F1", f'"0SEND_F1" {RUNTIME}'),
    ("token", "0UNSHARD", f'"0UNSHARD" {RUNTIME}'),
    ("token", "0BW1", f'"0BW1" {RUNTIME}'),
    ("token", "0REDUCE_GRAD1", f'"0REDUCE_GRAD1" is not an operation ({EXPECTED})'),
    ("token", "99999999999REDUCE_GRAD", '"99999999999REDUCE_GRAD": stage 99999999999 is too '
                                        'large (ids go up to 2147483647)'),
    ("torch", "0BW1", '"0BW1" is a full backward in PyTorch\'s legacy tokens; read the file '
                      'with legacy=True (--torch-legacy)'),
    ("torch", "0UNSHARD3", '"0UNSHARD3": UNSHARD takes no microbatch (expected 0UNSHARD)'),
    ("torch", "0REDUCE_GRAD1", '"0REDUCE_GRAD1": REDUCE_GRAD takes no microbatch (expected '
                               '0REDUCE_GRAD)'),
    ("torch", "0F", '"0F" has no microbatch (expected e.g. 0F0)'),
    ("torch", "0SEND_F", '"0SEND_F" has no microbatch (expected e.g. 0SEND_F0)'),
    ("torch", "(0F0;0SEND_F0)OVERLAP_F_B", '"(0F0;0SEND_F0)OVERLAP_F_B": "0SEND_F0" is not a '
                                           'compute operation (expected '
                                           '<stage><F|I|B|W><microbatch>)'),
    ("torch", "x", f'"x" is not an operation ({TORCH_EXPECTED})'),
    ("torch", "(0F0;1B0", f'"(0F0;1B0" has no closing parenthesis ({TORCH_EXPECTED})'),
    ("legacy", "0I1", '"0I1": PyTorch\'s legacy tokens have no I; read the file without '
                      'legacy=True (--torch-legacy)'),
]
DIALECTS = {"cell": parse_cell, "token": parse_token,
            "torch": lambda text: parse_torch_token(text, legacy=False),
            "legacy": lambda text: parse_torch_token(text, legacy=True)}


@pytest.mark.parametrize("dialect, text, message", REFUSED,
                         ids=[f"{dialect}-{text[:20]}" for dialect, text, _ in REFUSED])
def test_each_dialect_refuses_with_one_line_naming_the_token(dialect, text, message):
    with pytest.raises(InvalidScheduleError) as refused:
        DIALECTS[dialect](text)
    assert str(refused.value) == message


@pytest.mark.parametrize("cell, message", [
    (("X", 1, 2), "('X', 1, 2): kind must be one of F, B, I, W"),
    (("F", -1, 2), "('F', -1, 2): stage must be an integer 0..2147483647"),
    (("F", 0, True), "('F', 0, True): microbatch must be an integer 0..2147483647"),
    (3.5, "3.5 is not a cell (expected None, an Op, an Overlap or a string)"),
    (Overlap((Op("F", 0, 0),)), '"(0F0)OVERLAP_F_B": an overlapped cell holds one forward '
                                'and one backward (F with B or I)'),
])
def test_coerce_cell_refuses_what_is_not_a_cell(cell, message):
    with pytest.raises(InvalidScheduleError) as refused:
        coerce_cell(cell)
    assert str(refused.value) == message
