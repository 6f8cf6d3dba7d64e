"""The array reading of PyTorch's CSVs (tabsched.formats.cell_arrays, tabsched._csv_cells)
against the general reader and the plain-Python twin: the same tables, edges, notes and
errors on random and mutated files."""

from unittest import mock

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tabsched import _csv_cells, _reference
from tabsched._testing import random_table
from tabsched.exceptions import TabschedError
from tabsched.formats import pytorch_comms, pytorch_csv, rows
from tabsched.formats.cell_arrays import WORDS, read_plain
from tabsched.formats.pytorch_comms import explain_comm_edges
from tabsched.pytorch import from_pytorch_csv, pytorch_refusal, to_compute_comms, to_compute_only

#: Cells a mutation writes: plain ones, ones only the grammar reads, and broken ones.
TOKENS = ["0F0", "1F1", "0B0", "1I0", "0W1", "0BW1", "", " ", " 0F1 ", "0F01", "00F0",
          "(0F1;1B0)OVERLAP_F_B", "( 1F0 ; 0B0 )OVERLAP_F_B", "(0F1)OVERLAP_F_B",
          "(0F1;0W0)OVERLAP_F_B", "(0F1;1B0", "0SEND_F0", "1RECV_F0", "1SEND_B0", "0RECV_B0",
          "0SEND_F9", "9RECV_B0", "0UNSHARD", "1RESHARD", "0REDUCE_GRAD", "0UNSHARD1",
          "0SEND_F", "0F", "F0", "0X1", "0f0", "٣F0", "0F" + "9" * 12, "9" * 10 + "F0", '"0F0"',
          "0F\u00e90", "1234567890"]
#: Bytes a mutation inserts.
SPLICES = [",", "\r\n", "\n", "\r", '"', " ", ";", "(", ")", "0", "9", "F", "\r\n\r\n"]


def scan(module, data):
    bound = data.count(b",") + data.count(b"\n") + 1
    arrays = [np.full(bound, 7, dtype=np.int32) for _ in range(2)] + [
        np.full(bound, 7, dtype=np.int8)] + [np.full(bound, 7, dtype=np.int32) for _ in range(2)]
    count = module.scan_cells(data, *arrays)
    return count, [array[:max(count, 0)].tolist() for array in arrays]


def mutate(text, rng, mutations):
    """``text`` with ``mutations`` random edits of its cells, rows and bytes."""
    rows = [line.split(",") for line in text.split("\r\n") if line]
    for _ in range(mutations):
        choice = rng.integers(9)
        row = rows[int(rng.integers(len(rows)))] if rows else None
        place = int(rng.integers(len(row))) if row else 0
        if choice == 0 and row:
            del row[place]
        elif choice == 1 and row:
            row.insert(int(rng.integers(len(row) + 1)), row[place])
        elif choice == 2 and row and len(row) > 1:
            other = int(rng.integers(len(row)))
            row[place], row[other] = row[other], row[place]
        elif choice == 3 and row and len(rows) > 1:
            cell = row.pop(place)
            target = rows[int(rng.integers(len(rows)))]
            target.insert(int(rng.integers(len(target) + 1)), cell)
        elif choice == 4 and row:
            row[place] = TOKENS[int(rng.integers(len(TOKENS)))]
        elif choice == 5 and row and any(ch.isdigit() for ch in row[place]):
            digits = [k for k, ch in enumerate(row[place]) if ch.isdigit()]
            k = digits[int(rng.integers(len(digits)))]
            row[place] = row[place][:k] + str(int(rng.integers(10))) + row[place][k + 1:]
        elif choice == 6 and len(rows) > 1:
            del rows[int(rng.integers(len(rows)))]
        elif choice == 7 and row:
            neighbour = place + (1 if rng.random() < 0.5 else -1)
            if 0 <= neighbour < len(row):
                row[place], row[neighbour] = row[neighbour], row[place]
        else:
            flat = "\r\n".join(",".join(cells) for cells in rows) + "\r\n"
            at = int(rng.integers(len(flat) + 1))
            flat = flat[:at] + SPLICES[int(rng.integers(len(SPLICES)))] + flat[at:]
            return flat
    ending = "\n" if rng.random() < 0.1 else "\r\n"
    return "".join(",".join(cells) + ending for cells in rows)


def outcome(text, general=False, **options):
    """What reading ``text`` gives: the schedule's parts, or the error's class and message.

    ``general``: through the general reader and the cell-by-cell checks only (SEND/RECV,
    REDUCE_GRAD, FSDP windows)."""
    patches = []
    if general:
        patches = [mock.patch.object(pytorch_csv, "read_plain", return_value=None),
                   mock.patch.object(rows, "_right_after_backwards", return_value=False),
                   mock.patch.object(pytorch_comms, "_windows_at_once", return_value=None),
                   mock.patch.object(pytorch_csv, "comm_edges",
                                     lambda table, comms, source, p2p: explain_comm_edges(
                                         table, comms.entries(), source, p2p))]
    for patch in patches:
        patch.start()
    try:
        schedule = from_pytorch_csv(text, source="f.csv", **options)
    except TabschedError as error:
        return type(error).__name__, str(error)
    finally:
        for patch in patches:
            patch.stop()
    table = schedule.table
    arrays = [table.device, table.slot, table.kind, table.stage, table.microbatch,
              table.row_lengths]
    extra = [] if schedule.transfer_after is None else list(schedule.transfer_after)
    extra += [] if schedule.shard_windows is None else list(schedule.shard_windows)
    return ("ok", [array.tolist() for array in arrays + extra], table.metadata, schedule.format,
            schedule.notes, schedule.p2p, [str(cell) for row in table.rows for cell in row])


def pytorch_texts(seed):
    table = random_table(seed, replicate=0.0, uneven=0.0)
    if pytorch_refusal(table) is not None:
        return []
    return [to_compute_only(table, drop_metadata=True), to_compute_comms(table, drop_metadata=True)]


# ------------------------------------------------------------------ the compiled scan
@pytest.mark.parametrize("data", [
    b"0F0,0B0\r\n", b"0F0,,0REDUCE_GRAD\r\n1F0\r\n\r\n", b"", b"\r\n", b"0F0\r\n\r\n1F0",
    b'"0F0"', b"0F0\r1F0", b"0F0,", b",", b"0" * 300, b"12SEND_B3,0RECV_F99",
    b" 0F1,(0F1;1B0)OVERLAP_F_B,0F1234567890,0UNSHARD1,0SEND_F,0BW1,0x1,\xc3\xa91",
    b"999999999F999999999,0RESHARD\n1UNSHARD\r\n",
])
def test_scan_equals_reference_on_cases(data):
    assert scan(_csv_cells, data) == scan(_reference, data)


def test_scan_reads_words_ids_and_leaves_the_rest():
    count, (row, column, word, stage, microbatch) = scan(
        _csv_cells, b"0F0,,1UNSHARD\r\n 0F1,12SEND_B3\r\n")
    assert count == 5
    assert (row, column) == ([0, 0, 0, 1, 1], [0, 1, 2, 0, 1])
    assert [WORDS[code] for code in word] == ["F", "", "UNSHARD", None, "SEND_B"]
    assert (stage, microbatch) == ([0, -1, 1, 15, 12], [0, -1, -1, 19, 3])   # " 0F1": bytes 15..19


def test_scan_refuses_what_csv_must_read_and_short_arrays():
    not_plain = -1 - _csv_cells.NOT_PLAIN
    for data in (b'0F0,"0B0"\r\n', b"0F0\r0B0", b"0F0\r\n\r\n0B0\r\n", b"0" * 257):
        assert scan(_csv_cells, data)[0] == not_plain
    short = [np.zeros(1, np.int32)] * 2 + [np.zeros(1, np.int8)] + [np.zeros(1, np.int32)] * 2
    for module in (_csv_cells, _reference):
        assert module.scan_cells(b"0F0,0B0", *short) == -1 - _csv_cells.BAD_SHAPE


@given(data=st.lists(st.sampled_from([b"0", b"1", b"9", b"F", b"B", b"W", b"I", b"_", b"SEND_F",
                                      b"RECV_B", b"UNSHARD", b"REDUCE_GRAD", b",", b"\r\n",
                                      b"\n", b"\r", b'"', b" ", b"(", b"\xc3\xa9"]),
                     max_size=60).map(b"".join))
def test_scan_equals_reference_on_random_bytes(data):
    assert scan(_csv_cells, data) == scan(_reference, data)


# ------------------------------------------------------------------ the two readers
@given(seed=st.integers(0, 2**32 - 1))
def test_array_reading_equals_the_general_reader_on_pytorch_files(seed):
    for text in pytorch_texts(seed):
        assert read_plain(text, False) is not None
        for p2p in ("ordered", "free"):
            fast, general = outcome(text, p2p=p2p), outcome(text, general=True, p2p=p2p)
            assert fast == general
            assert fast[0] == "ok"


@given(seed=st.integers(0, 2**32 - 1), mutations=st.integers(1, 4),
       legacy=st.booleans(), format=st.sampled_from([None, "compute_only", "compute_comms"]),
       p2p=st.sampled_from(["ordered", "free"]))
def test_array_reading_equals_the_general_reader_on_mutated_files(seed, mutations, legacy,
                                                                  format, p2p):
    rng = np.random.default_rng(seed)
    for text in pytorch_texts(seed):
        damaged = mutate(text, rng, mutations)
        data = damaged.encode("utf-8")
        assert scan(_csv_cells, data) == scan(_reference, data)
        options = {"legacy": legacy, "format": format, "p2p": p2p}
        assert outcome(damaged, **options) == outcome(damaged, general=True, **options)


def test_reordered_sends_deadlock_with_the_general_message():
    text = ("0F0,0F1,0SEND_F0,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\r\n"
            "1RECV_F1,1RECV_F0,1F0,1B0,1SEND_B0,1F1,1B1,1SEND_B1\r\n")
    fast, general = outcome(text), outcome(text, general=True)
    assert fast == general
    assert fast[0] == "DeadlockError" and "deadlock" in fast[1]
