import csv
import io
import json

import pytest

from tabsched import InvalidScheduleError, ScheduleTable, generate
from tabsched.io import (csv_loss, csv_omits, from_csv, from_json, read_table, render_grid, to_csv,
                         to_json, write_table)


def torch_style_csv(rows):
    """What PyTorch's _dump_csv writes: csv.writer over the actions, None as ''."""
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer)
    for row in rows:
        writer.writerow([None if cell is None else str(cell) for cell in row])
    return buffer.getvalue()


@pytest.mark.parametrize("family,p,m", [("gpipe", 3, 4), ("1f1b", 4, 8), ("1f1b", 8, 3)])
def test_csv_bytes_match_torch_writer_and_round_trip(family, p, m, tmp_path):
    table = generate(family, devices=p, microbatches=m)
    text = to_csv(table, drop_metadata=True)
    assert text == torch_style_csv(table.rows)
    assert text.endswith("\r\n")
    back = from_csv(text)
    assert back.rows == table.rows
    path = tmp_path / "t.csv"
    write_table(table, path, drop_metadata=True)
    assert path.read_bytes() == text.encode()
    assert to_csv(read_table(path)) == text


def test_overlap_cells_in_csv():
    table = ScheduleTable([["0F0", "0F1", "(0F2;0B0)OVERLAP_F_B", "0B1", "0B2"]])
    text = to_csv(table)
    assert text == "0F0,0F1,(0F2;0B0)OVERLAP_F_B,0B1,0B2\r\n"
    assert from_csv(text) == table


def test_json_round_trip_keeps_metadata(tmp_path):
    table = generate("1f1b", devices=2, microbatches=3, stage_layers=[3, 5])
    table = table.replace(microbatch_sizes=(1.0, 0.5, 0.5))
    back = from_json(to_json(table))
    assert back == table
    path = tmp_path / "t.json"
    write_table(table, path)
    assert read_table(path) == table
    assert json.loads(path.read_text())["format"] == "tabsched.table"


@pytest.mark.parametrize("content,message", [
    (b"", r"^x\.csv: the file is empty"),
    (b"  \r\n", r"^x\.csv: the file is empty"),
    (b"0F0,0B0\r\n0F\x000\r\n", r"^x\.csv: line 2 contains a NUL byte"),
    (b"0F0,0X0\r\n", r'^x\.csv: device 0, slot 1: "0X0" is not an operation'),
    (b"0F0,(0F1;0B0,0B1\r\n", r"^x\.csv: device 0, slot 1: \"\(0F1;0B0\" has no closing "
                              r"parenthesis"),
    (b"0F0,0B0\r\n,,,\r\n", r"^x\.csv: device 1 \(line 2\) has no operations"),
    (b"0F0,0B0,0B1\r\n", r"^x\.csv: device 0, slot 2: 0B1: microbatch 1 is out of range"),
    (b"\xff\xfe0F0\r\n", r"^x\.csv: byte 0 is not UTF-8 text"),
])
def test_malformed_csv(tmp_path, content, message):
    path = tmp_path / "x.csv"
    path.write_bytes(content)
    with pytest.raises(InvalidScheduleError, match=message.replace("x\\.csv", ".*x\\.csv")):
        read_table(path)


@pytest.mark.parametrize("text,message", [
    ("[1]", r'expected a JSON object with "rows"'),
    ("{", r"not valid JSON: Expecting property name"),
    ('{"rows": [["0F0", "0B0"]], "colour": 1}', r'unknown key "colour"'),
    ('{"rows": 3}', r'"rows" must be a list of lists'),
    ('{"rows": [["0F0", 7]]}', r"device 0, slot 1: 7 is not a cell string"),
    ('{"rows": [["0F0", "0B0"]], "format": "other"}', r'"format" is \'other\''),
])
def test_malformed_json(text, message):
    with pytest.raises(InvalidScheduleError, match=message):
        from_json(text, source="j.json")


def test_unknown_suffix(tmp_path):
    with pytest.raises(InvalidScheduleError, match=r"unknown table format '\.txt'"):
        read_table(tmp_path / "t.txt")
    with pytest.raises(InvalidScheduleError, match="cannot read: No such file"):
        read_table(tmp_path / "missing.csv")


def test_grid_is_readable_at_8_devices_and_64_slots():
    table = generate("1f1b", devices=8, microbatches=25)
    assert table.num_slots == 64
    text = render_grid(table, width=100)
    lines = text.splitlines()
    assert all(len(line) <= 100 for line in lines)
    device_lines = [line for line in lines if line.startswith("d")]
    assert len(device_lines) % 8 == 0 and len(device_lines) >= 16   # wrapped into bands
    rulers = [line for line in lines if line.startswith("slot")]
    assert rulers[0].split()[1] == "0"
    # every op appears exactly once
    tokens = [token for line in device_lines for token in line.split()[1:] if token != "."]
    assert len(tokens) == len(table)


def test_grid_shows_overlaps_compactly():
    table = ScheduleTable([["0F0", "0F1", "(0F2;0B0)OVERLAP_F_B", "0B1", "0B2"]])
    assert "0F2+0B0" in render_grid(table, width=80)


def test_json_keeps_grad_sync_and_leaves_it_out_when_unset():
    table = generate("1f1b", devices=2, microbatches=2)
    assert "grad_sync" not in json.loads(to_json(table))
    synced = table.replace(grad_sync=[1])
    assert json.loads(to_json(synced))["grad_sync"] == [1]
    assert from_json(to_json(synced)) == synced


@pytest.mark.parametrize("rows,grad_sync,written", [
    # the first idle slot after the stage's last backward that a compute cell follows
    ([["0F0", "0B0", None, "1F0", "1B0"]], [0], "0F0,0B0,0REDUCE_GRAD,1F0,1B0\r\n"),
    # no such slot: at the end of the row, after its idle slots
    ([["0F0", "0B0", None]], [0], "0F0,0B0,,0REDUCE_GRAD\r\n"),
    ([["0F0", "1F0", "1B0", "0B0"]], [0, 1], "0F0,1F0,1B0,0B0,1REDUCE_GRAD,0REDUCE_GRAD\r\n"),
    ([["0F0", "0B0", "1F0", "1B0"]], [0], "0F0,0B0,1F0,1B0,0REDUCE_GRAD\r\n"),
])
def test_grad_sync_is_written_as_reduce_grad_and_reads_back_the_same(rows, grad_sync, written):
    table = ScheduleTable(rows, grad_sync=grad_sync)
    assert to_csv(table) == written
    assert from_csv(written) == table
    assert from_json(to_json(table)) == table


def test_csv_loss_names_what_a_csv_cannot_hold():
    table = generate("chimera", devices=4, microbatches=4, stage_layers_ratio="1:2", layers=12)
    lost = csv_loss(table.replace(microbatch_sizes=(1.0, 0.5, 0.5, 1.0)))
    assert lost == ["the microbatch sizes (1, 0.5, 0.5, 1; a CSV reads back every microbatch at "
                    "full size)", "the layers of each stage (2,2,4,4; a CSV reads back an even "
                    "split)"]
    assert csv_omits(table) == ["the family and its parameters (chimera devices=4 microbatches=4 "
                                "variant=direct); read back, the table has no formula level"]
    assert csv_loss(table.replace(stage_layers=None)) == []
    assert csv_omits(table.replace(family=None, params={})) == []
    with pytest.raises(InvalidScheduleError, match=r"write JSON \(\.json\), which keeps them, "
                                                   r"or pass drop_metadata=True"):
        to_csv(table)
    assert from_csv(to_csv(table, drop_metadata=True)).rows == table.rows


def test_a_device_that_runs_nothing_is_refused_by_every_writer():
    idle = ScheduleTable([["0F0", "0B0"], []])
    for writer in (to_csv, to_json):
        with pytest.raises(InvalidScheduleError, match=r"device 1 runs nothing"):
            writer(idle)


def test_json_depth_skips_strings_and_stops_at_the_limit():
    from tabsched.formats.table_json import MAX_JSON_DEPTH, _json_depth
    assert _json_depth('{"rows": [["[[[[", "]"]]}') == 3
    assert _json_depth("[" * 10_000) > MAX_JSON_DEPTH


def test_output_checks(tmp_path):
    from tabsched import OutputError
    from tabsched.io import check_output_folder, check_output_path
    check_output_path(tmp_path / "new.csv")
    check_output_folder(tmp_path / "a" / "b")
    with pytest.raises(OutputError, match=r"the output must end in \.json, not \.csv"):
        check_output_path(tmp_path / "x.csv", suffixes=(".json",))
    with pytest.raises(OutputError, match=r"is a folder"):
        check_output_path(tmp_path)
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputError, match=r"exists and is not a folder"):
        check_output_folder(tmp_path / "file")
