"""Every file a user hands tabsched is untrusted (issue 13): a test per class of bad input.

Each class is checked through the CLI (exit 1, exactly one ``Error:`` line, no
traceback) and through the API (the exception type and its message). The
classes follow the issue: numbers in tables, JSON metadata, replay files, other
tracebacks, data loss in formats, and the smaller points.
"""

import json
import pathlib
import re
import tracemalloc

import numpy as np
import pytest

from tabsched import (InvalidParameterError, InvalidScheduleError, ScheduleTable, TabschedError,
                      evaluate, from_csv, from_json, generate, read_table, to_csv, to_json,
                      write_table)
from tabsched.adapt import Replay, SplitMicrobatches
from tabsched.compare import parse_spec
from tabsched.formulas import formula_for, formula_mismatch
from tabsched.pytorch import from_pytorch_csv, read_pytorch, to_compute_only
from tabsched.sweeps import read_sweep_csv

PYTORCH_DATA = pathlib.Path(__file__).resolve().parent / "data" / "pytorch"


def write(tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


# ------------------------------------------------------------ 1. numbers in tables
NUMBER_CASES = [
    ("0F2147483648,0B0\r\n", r'"0F2147483648": microbatch 2147483648 is too large'),
    ("0F" + "1" + "0" * 30 + ",0B0\r\n", r"microbatch 100000000000\.\.\. \(31 digits\) is too "
                                          r"large"),
    ("0F" + "9" * 5000 + ",0B0\r\n", r"\(5000 digits\) is too large"),
    ("1F100000000,1B100000000\r\n", r"device 0, slot 0: 1F100000000: microbatch 100000000 "
                                    r"cannot exist in a table of 2 operations"),
    ("0F0,0B0,2147483646F0,2147483646B0\r\n", r"device 0, slot 2: 2147483646F0: stage "
                                              r"2147483646 cannot exist in a table of 4 "
                                              r"operations"),
    ("\u0660F\u0660,\u0660B\u0660\r\n", r"write the stage and microbatch in ASCII digits"),
    ("\uff10F\uff10,\uff10B\uff10\r\n", r"write the stage and microbatch in ASCII digits"),
]


@pytest.mark.parametrize("text,message", NUMBER_CASES)
def test_ids_are_ascii_and_bounded_before_anything_is_sized(cli_error, tmp_path, text, message):
    path = write(tmp_path, "t.csv", text)
    assert re.search(message, cli_error("eval", path))
    tracemalloc.start()
    try:
        for reader in (lambda: read_table(path), lambda: read_pytorch(path)):
            with pytest.raises(InvalidScheduleError, match=message):
                reader()
        rows = [[cell for cell in line.split(",")] for line in text.strip().splitlines()]
        with pytest.raises(InvalidScheduleError, match=message):
            from_json(json.dumps({"rows": rows}), source="t.json")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20e6   # bounded by the file's few bytes, not by its ids


def test_explicit_counts_and_arrays_are_bounded_too():
    rows = [["0F0", "0B0"]]
    with pytest.raises(InvalidScheduleError, match=r"num_microbatches is 1000000000000, more "
                                                   r"than a table of 2 operations can hold"):
        ScheduleTable(rows, num_microbatches=10**12)
    with pytest.raises(InvalidScheduleError, match=r"num_stages must be an integer, not '2'"):
        ScheduleTable(rows, num_stages="2")
    with pytest.raises(InvalidScheduleError, match=r"stage must be an integer 0\.\.2147483647"):
        ScheduleTable([[("F", 2**40, 0)]])
    with pytest.raises(InvalidScheduleError, match=r"stage ids must be integers"):
        ScheduleTable.from_arrays([0, 0], [0, 1], [0, 1], np.array([0, 2**40]), [0, 0], [2])
    with pytest.raises(InvalidScheduleError, match=r"stage_layers must be integers >= 0, "
                                                   r"not 2\.5"):
        ScheduleTable(rows, stage_layers=[2.5])
    with pytest.raises(InvalidScheduleError, match=r"microbatch_sizes must be a list of "
                                                   r"positive numbers"):
        ScheduleTable(rows, microbatch_sizes=[{"a": 1}])
    with pytest.raises(InvalidScheduleError, match=r"family must be a name \(text\)"):
        ScheduleTable(rows, family=["gpipe"])


def test_missing_pairs_are_found_without_an_array_of_every_pair():
    # 2 x 3 operations name stages up to 2 and microbatches up to 2: 9 pairs, 3 present
    with pytest.raises(InvalidScheduleError, match=r"^stage 0, microbatch 1: no operation at "
                                                   r"all"):
        ScheduleTable([["0F0", "0B0", "2F2", "2B2"], ["1F1", "1B1"]], num_microbatches=3)


# ------------------------------------------------------------ 2. JSON metadata
GOOD_ROWS = [["0F0", "0B0"]]
JSON_CASES = [
    ({"num_stages": "1"}, r'"num_stages" must be an integer >= 1, not \'1\''),
    ({"num_stages": [1]}, r'"num_stages" must be an integer >= 1, not \[1\]'),
    ({"num_stages": 1.0}, r'"num_stages" must be an integer >= 1, not 1\.0'),
    ({"num_stages": 1e30}, r'"num_stages" must be an integer >= 1, not 1e\+30'),
    ({"num_stages": 3}, r'"num_stages" is 3, but the rows hold stages 0\.\.0'),
    ({"microbatch_sizes": "1"}, r'"microbatch_sizes" must be a list of positive numbers'),
    ({"microbatch_sizes": {"a": 1}}, r'"microbatch_sizes" must be a list of positive numbers'),
    ({"microbatch_sizes": [1, 1]}, r'"microbatch_sizes" has 2 entries, but the rows hold '
                                   r'microbatches 0\.\.0'),
    ({"microbatch_sizes": [True]}, r'"microbatch_sizes" must be a list of positive numbers'),
    ({"stage_layers": "4"}, r'"stage_layers" must be a list of layer counts'),
    ({"stage_layers": [4, 4]}, r'"stage_layers" has 2 entries, but the rows hold stages'),
    ({"params": [1], "family": "gpipe"}, r'"params" must be an object of parameter values'),
    ({"params": "devices=4", "family": "gpipe"}, r'"params" must be an object'),
    ({"params": {"devices": {"deep": 1}}, "family": "gpipe"},
     r'"params" "devices" must be a number, text'),
    ({"family": ["gpipe"]}, r'"family" must be a family name, not \[\'gpipe\'\]'),
    ({"grad_sync": [0, 4]}, r'"grad_sync" names stage 4, but the rows hold stages 0\.\.0'),
    ({"version": 2}, r'"version" is 2; this tabsched reads version 1'),
    ({"rows": []}, r"no rows; expected one row per device"),
    ({"rows": [["", None]]}, r"device 0 \(row 1\) has no operations"),
    ({"rows": [["0F0", "0B0"], []]}, r"device 1 \(row 2\) has no operations"),
    ({"rows": [["0F0", "0B0", 7]]}, r"device 0, slot 2: 7 is not a cell string"),
    ({"rows": [["0F0", "0B0 \n"]]}, r'device 0, slot 1: "0B0 \\n" spans several lines'),
]


@pytest.mark.parametrize("change,message", JSON_CASES)
def test_json_documents_follow_one_schema(cli_error, tmp_path, change, message):
    document = {"format": "tabsched.table", "version": 1, "rows": GOOD_ROWS, **change}
    text = json.dumps(document)
    with pytest.raises(InvalidScheduleError, match=r"^t\.json: (.*: )?" + message):
        from_json(text, source="t.json")
    path = write(tmp_path, "t.json", text)
    assert re.search(message, cli_error("eval", path))


@pytest.mark.parametrize("text,message", [
    ('{"rows": [["0F0", "0B0"]], "microbatch_sizes": [NaN]}', r"NaN is not a number a table "
                                                             r"may hold"),
    ('{"rows": [["0F0", "0B0"]], "microbatch_sizes": [Infinity]}', r"Infinity is not a number"),
    ('{"rows": [["0F0", "0B0"]], "microbatch_sizes": [1e400]}', r'"1e400" is out of range'),
    ('{"rows": [["0F0", "0B0"]], "num_stages": 1' + "0" * 5000 + "}",
     r"the integer 100000000000000000000000\.\.\. \(5001 characters\) is out of range"),
    ('{"rows": [["0F0", "0B0"]], "rows": []}', r'key "rows" appears twice'),
    ("[" * 100_000 + "]" * 100_000, r"not a table: nested more than 32 levels deep"),
    ('{"rows": ' + "[" * 40 + "]" * 40 + "}", r"nested more than 32 levels deep"),
])
def test_json_text_that_python_would_misread_or_recurse_on(cli_error, tmp_path, text, message):
    with pytest.raises(InvalidScheduleError, match=message):
        from_json(text, source="t.json")
    assert re.search(message, cli_error("eval", write(tmp_path, "t.json",
                                                                         text)))


def test_json_and_csv_accept_the_same_rows():
    # REDUCE_GRAD cells, trailing or not, mean the same in both
    csv_text = "0F0,0F1,0B0,0B1,0REDUCE_GRAD\r\n"
    from_rows = from_json(json.dumps({"rows": [csv_text.strip().split(",")]}))
    assert from_rows == from_csv(csv_text) and from_rows.grad_sync == (0,)
    with pytest.raises(InvalidScheduleError, match=r'"grad_sync" is \[\], but the rows\' '
                                                   r'REDUCE_GRAD cells name stages \[0\]'):
        from_json(json.dumps({"rows": [csv_text.strip().split(",")], "grad_sync": []}))


def test_a_family_tag_that_does_not_match_the_table_gets_no_formula_level(cli, cli_error,
                                                                           tmp_path):
    one_device = generate("gpipe", devices=1, microbatches=1)
    tagged = one_device.replace(params={"devices": 4, "microbatches": 8})
    assert formula_for(tagged) is None
    result = evaluate(tagged)
    assert result.formula is None and result.notes == [
        "formula level omitted: the table is tagged gpipe devices=4 microbatches=8 (4 devices, "
        "4 stages, 8 microbatches) but has 1 device, 1 stage, 1 microbatch"]
    path = write(tmp_path, "tagged.json", to_json(tagged))
    code, out, _ = cli("eval", str(path))
    assert code == 0 and "formula level:" not in out and "note: formula level omitted" in out
    code, out, _ = cli("eval", str(path), "--json")
    assert json.loads(out)["formula"] is None
    assert "formula level omitted" in cli_error("eval", path, "--level", "formula")
    # no devices in the params, or a devices count far beyond the table: omitted, never a hang
    assert "does not state devices" in formula_mismatch(one_device.replace(params={}))
    huge = one_device.replace(family="1f1b", params={"devices": 10**12, "microbatches": 1})
    assert evaluate(huge).formula is None
    code, out, _ = cli("eval", str(write(tmp_path, "huge.json", to_json(huge))))
    assert code == 0 and "1000000000000 devices" in out
    # every family's own table matches its metadata
    for family in ("gpipe", "interleaved-1f1b", "hanayo", "bitpipe", "dualpipev", "chimera"):
        table = generate(family, devices=4, microbatches=8)
        assert formula_mismatch(table) is None and evaluate(table).formula is not None


# ------------------------------------------------------------ 3. replay files
#: Measured durations are seconds: they replay into costs that count seconds.
SECONDS = ("--model", "paper-128l", "--system", "mid_nw_mid_cp")


def replay_case(tmp_path, content):
    return write(tmp_path, "profile.csv", content)


@pytest.mark.parametrize("content,message", [
    (b"op,duration\r\n0F0,\xff1ms\r\n", r"byte 17 is not UTF-8 text"),
    (b"0F0," + b"1" * 200_000 + b"\r\n", r"line 1: not valid CSV: field larger than field "
                                         r"limit"),
    (b"0F0,\"1ms\r\n", r"line \d: not valid CSV: unexpected end of data"),
    (b"0F0,1ms,2ms\r\n", r"line 1: expected op,duration, not 3 fields"),
    (b"0F0,fast\r\n", r"line 1: "),
    (b"0F0\x00,1ms\r\n", r"line 1 contains a NUL byte"),
    (b"x" * 300 + b",1ms\r\n", r"is not an operation or transfer label"),
])
def test_replay_files_are_untrusted(cli_error, tmp_path, content, message):
    path = replay_case(tmp_path, content)
    with pytest.raises(InvalidParameterError, match=message):
        Replay.from_csv(path)
    assert re.search(message, cli_error(
        "eval", "gpipe", "-p", "2", "-m", "2", *SECONDS, "--replay", path, "--samples",
        "2"))


def test_replay_with_a_byte_order_mark_reads_its_header(cli, tmp_path):
    path = replay_case(tmp_path, "\ufeffop,duration\r\n0F0,2\r\n".encode("utf-8"))
    assert Replay.from_csv(path).measurements["0F0"].tolist() == [2.0]
    code, out, _ = cli("eval", "gpipe", "-p", "2", "-m", "2", *SECONDS, "--replay", str(path),
                       "--replay-partial", "--samples", "2")   # device 1 measured nothing
    assert code == 0 and "monte carlo" in out


def test_unmatched_replay_labels_are_an_error_unless_partial(cli, cli_error, tmp_path):
    path = replay_case(tmp_path, "0F0,2\n0F9,3\n1B0 d1->d0,1\n7W7,1\n0X0,1\n5F5,1\n6F6,1\n"
                                 "8F8,1\n1F0 d1->d0,1\n")
    message = cli_error("eval", "gpipe", "-p", "2", "-m", "2", *SECONDS, "--replay",
                        path, "--samples", "2")
    assert message == (f"{path}: 7 of 9 labels match no operation or transfer of the table: 0F9, "
                       f"7W7, 0X0, 5F5, 6F6 and 2 more; correct them, or accept them with "
                       f"--replay-partial (partial=True)")
    table = generate("gpipe", devices=2, microbatches=2)
    with pytest.raises(InvalidParameterError, match=r"7 of 9 labels match no operation"):
        Replay.from_csv(path).check(table)
    partial = Replay.from_csv(path, partial=True)
    assert partial.check(table) == ["0F9", "7W7", "0X0", "5F5", "6F6", "8F8", "1F0 d1->d0"]
    code, out, _ = cli("eval", "gpipe", "-p", "2", "-m", "2", *SECONDS, "--replay", str(path),
                       "--replay-partial", "--samples", "2")
    assert code == 0 and ("note: replay: 7 of 9 labels match nothing in the table and were left "
                          "out (partial replay) (0F9, 7W7, 0X0, 5F5, 6F6, ...)") in out
    code, out, _ = cli("eval", "gpipe", "-p", "2", "-m", "2", *SECONDS, "--replay", str(path),
                       "--replay-partial", "--samples", "2", "--json")
    variation = json.loads(out)["monte_carlo"]["variation"]
    variation = variation[0] if isinstance(variation, list) else variation
    assert variation["unmatched"] == 7 and variation["unmatched_labels"][0] == "0F9"
    assert "--replay-partial needs --replay" in cli_error(
        "eval", "gpipe", "-p", "2", "-m", "2", "--replay-partial", "--samples", "2")


# ------------------------------------------------------------ 5. other tracebacks
def test_a_spec_cannot_repeat_what_the_command_sets(cli_error):
    with pytest.raises(InvalidParameterError, match=r"devices is set for every family at once"):
        parse_spec("gpipe:devices=4")
    with pytest.raises(InvalidParameterError, match=r"waves is given twice"):
        parse_spec("hanayo:waves=2,waves=3")
    assert "devices is set for every family at once (--devices, -p)" in cli_error(
        "compare", "gpipe:devices=4", "-p", "8", "-m", "8")
    assert "microbatches is set for every family" in cli_error(
        "sweep", "gpipe:microbatches=4", "-p", "2", "-m", "4")


@pytest.mark.parametrize("content,message", [
    (b"spec,devices\r\n\xff\r\n", r"byte 14 is not UTF-8 text"),
    (b"spec,devices,microbatches,system,simulation_makespan_s\r\ngpipe,4,8,x,1,2,3\r\n",
     r"line 2: more values than the 5 columns"),
    (b"spec,devices,microbatches,system,simulation_makespan_s\r\ngpipe,4,8,x,\"fast\r\n",
     r"not valid CSV: unexpected end of data"),
    (b"spec,devices,microbatches,system,simulation_makespan_s\r\ngpipe,four,8,x,1\r\n",
     r'line 2, column devices: "four" is not a number'),
    (b"a,b\r\n", r"not a sweep CSV \(no column 'spec'\)"),
    # what no sweep writes, and a plot would draw without a word
    (b"spec,devices,microbatches,system,simulation_makespan_s\r\ngpipe,4,8,x,nan\r\n",
     r'line 2, column simulation_makespan_s: "nan" is not a finite number >= 0'),
    (b"spec,devices,microbatches,system,simulation_makespan_s\r\ngpipe,4,8,x,inf\r\n",
     r'line 2, column simulation_makespan_s: "inf" is not a finite number >= 0'),
    (b"spec,devices,microbatches,system,simulation_makespan_s\r\ngpipe,4,8,x,-3\r\n",
     r'line 2, column simulation_makespan_s: "-3" is not a finite number >= 0'),
    (b"spec,devices,microbatches,system,simulation_makespan_s\r\ngpipe,-4,8,x,1\r\n",
     r'line 2, column devices: "-4" is not a finite number >= 0'),
])
def test_sweep_csv_reader(cli_error, tmp_path, content, message):
    path = write(tmp_path, "sweep.csv", content)
    with pytest.raises(InvalidParameterError, match=message):
        read_sweep_csv(path)
    assert re.search(message, cli_error("plot", "sweep", path, "-o",
                                                      tmp_path / "s.png"))


@pytest.mark.parametrize("content,message", [
    (b'0F0,0B0,"0F\n0"\r\n', r'device 0, slot 2: "0F\\n0" spans several lines'),
    (b'0F0,0B0,"0F0' + b"x" * 120_000, r"line 1: not valid CSV: unexpected end of data"),
    (b'0F0,0B0,"' + b"0F1,0B1\r\n" * 20_000, r"not valid CSV: unexpected end of data|field "
                                              r"larger than field limit|spans several lines"),
    (b"0F0,0B0," + b"Q" * 100_000 + b"\r\n", r'"QQQQQQQQ.*\.\.\." \(100000 characters\) is not '
                                             r"an operation"),
])
def test_quotes_and_long_tokens_give_one_short_line(cli_error, tmp_path, content, message):
    path = write(tmp_path, "t.csv", content)
    assert re.search(message, cli_error("eval", path))
    with pytest.raises(InvalidScheduleError, match=message):
        read_table(path)


# ------------------------------------------------------------ 7. no silent data loss
def test_csv_refuses_what_it_cannot_hold_and_says_how_to_go_on(cli_error, tmp_path):
    uneven = tmp_path / "x.csv"
    message = cli_error("convert", "gpipe", "-p", "4", "-m", "8", "--stage-layers",
                        "16,16,32,64", uneven)
    assert "a CSV cannot hold the layers of each stage (16,16,32,64; a CSV reads back an even " \
           "split)" in message and "write a .json table (--to json)" in message
    assert "--drop-metadata" in message and not uneven.exists()
    costs = __import__("tabsched").UnitCosts()
    adapted = SplitMicrobatches("all", 2).apply(generate("1f1b", devices=2, microbatches=2),
                                                costs)
    with pytest.raises(InvalidScheduleError, match=r"x\.csv: a CSV table cannot hold the "
                                                   r"microbatch sizes \(0\.5, 0\.5, 0\.5, 0\.5; "
                                                   r"a CSV reads back every microbatch at full "
                                                   r"size\): write JSON"):
        write_table(adapted, uneven)
    assert not uneven.exists()
    plain = generate("1f1b", devices=2, microbatches=2)   # only the family label is left out
    assert from_csv(to_csv(plain)) == plain.replace(family=None, params={})
    json_path = tmp_path / "x.json"
    write_table(adapted, json_path)
    assert read_table(json_path) == adapted


def test_what_pytorch_writes_tabsched_writes_back(cli, tmp_path):
    source = PYTORCH_DATA / "gpipe_pp4_m4.csv"
    schedule = read_pytorch(source)
    assert schedule.table.grad_sync == (0, 1, 2, 3) and schedule.table.num_slots == 8
    assert to_compute_only(schedule.table) == source.read_bytes().decode()
    assert to_csv(schedule.table) == source.read_bytes().decode()
    out = tmp_path / "g.csv"
    code, _, _ = cli("convert", str(source), str(out))
    assert code == 0 and out.read_bytes() == source.read_bytes()
    code, shown_csv, _ = cli("show", str(source), "--format", "csv")
    assert shown_csv == source.read_bytes().decode()
    # a REDUCE_GRAD that a compute cell follows keeps its idle slot; one at the end takes none
    # (one device running both stages, in an order that can run)
    middle = from_csv("0F0,1F0,1B0,0B0,0F1,1F1,1B1,1REDUCE_GRAD,0B1\r\n")
    assert middle.num_slots == 9 and middle.rows[0][7] is None
    assert to_csv(middle) == "0F0,1F0,1B0,0B0,0F1,1F1,1B1,1REDUCE_GRAD,0B1\r\n"
    end = from_pytorch_csv("0F0,1F0,1B0,0B0,0F1,1F1,1B1,,0B1,1REDUCE_GRAD,0REDUCE_GRAD\r\n")
    assert end.table.num_slots == 9 and end.table.grad_sync == (0, 1)
    assert to_compute_only(end.table) == ("0F0,1F0,1B0,0B0,0F1,1F1,1B1,1REDUCE_GRAD,0B1,"
                                          "0REDUCE_GRAD\r\n")


# ------------------------------------------------------------ 8. smaller points
def test_options_that_would_change_nothing_say_so(cli, cli_error, tmp_path):
    assert "--slow-link varies transfers, which these costs do not have: add --comm" in \
        cli_error("eval", "1f1b", "-p", "4", "-m", "8", "--slow-link", "1-2:3")
    assert "--transfer-cv varies transfers" in cli_error(
        "adapt", "1f1b", "-p", "4", "-m", "8", "--memory-budget", "8", "--transfer-cv",
        "0.1")
    code, _, err = cli("eval", "1f1b", "-p", "4", "-m", "8", "--stage-layers-ratio", "1:2")
    assert code == 0 and err == ("note: --stage-layers-ratio split the model's layers over the "
                                 "stages, which only --model/--system costs read; these numbers "
                                 "are the same without it\n")
    # with a model, a ratio without --layers splits the model's own layers
    code, out, _ = cli("eval", "1f1b", "-p", "4", "-m", "8", "--stage-layers-ratio", "1:2",
                       "--model", "paper-128l", "--system", "mid_nw_mid_cp", "--json")
    assert code == 0 and json.loads(out)["makespan"] > 0


def test_out_of_memory_advice_fits_the_command(cli_error, monkeypatch):
    import tabsched.adapt

    def no_memory(*args, **kwargs):
        raise MemoryError
    monkeypatch.setattr(tabsched.adapt, "monte_carlo", no_memory)
    assert cli_error("eval", "1f1b", "-p", "4", "-m", "8", "--cv", "0.1", "--samples",
                     "10000000") == ("out of memory: 10000000 Monte Carlo samples do not fit "
                                     "this machine; try fewer --samples")


def test_every_reader_error_is_a_tabsched_error():
    assert issubclass(InvalidScheduleError, TabschedError)
    assert issubclass(InvalidParameterError, TabschedError)


def test_replayed_seconds_do_not_mix_with_slots(cli_error, tmp_path):
    path = replay_case(tmp_path, b"op,duration\n0F0,2ms\n")
    for costs in (["--comm", "1"], ["--f", "1", "--comm", "0.5"]):
        assert cli_error("eval", "gpipe", "-p", "2", "-m", "2", *costs, "--replay", path) \
            .endswith("measured durations are seconds, but --comm prices the transfers in "
                      "slots; drop --comm, or evaluate with --model and --system, whose times "
                      "are seconds")
