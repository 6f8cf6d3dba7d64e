"""The format registry (tabsched/formats/__init__.py): lookup by name and by suffix, the
one-line errors, lazy imports; and every reader refusing bad input with its message."""

import json
import subprocess
import sys

import pytest

from tabsched import InvalidParameterError, InvalidScheduleError, generate
from tabsched.exceptions import UnknownNameError
from tabsched.formats import (FORMATS, HOLDS, TABLE_SUFFIXES, find_format, format_for, formats,
                              get_format, read_table, write_table)
from tabsched.formats.kineto import TRACE_SUFFIXES, profile_from_trace
from tabsched.formats.pytorch_csv import from_pytorch_csv
from tabsched.formats.table_csv import from_csv, to_csv
from tabsched.formats.table_json import from_json, json_text, to_json

ROLES = ("read", "write", "loads", "dumps")


# ------------------------------------------------------------------ the registry
def test_every_entry_is_well_formed_and_its_functions_resolve():
    assert len({entry.name for entry in FORMATS}) == len(FORMATS)
    for entry in FORMATS:
        assert entry.holds in HOLDS and entry.summary
        assert all(suffix.startswith(".") and suffix == suffix.lower()
                   for suffix in entry.suffixes), entry
        assert set(entry.options) <= {"drop_metadata", "width", "max_active_stages"}
        assert any(getattr(entry, role) for role in ROLES), entry
        for role, get in zip(ROLES, (entry.reader, entry.writer, entry.loader, entry.dumper)):
            if getattr(entry, role) is None:
                with pytest.raises(InvalidParameterError, match=f"^the {entry.name} format has no"):
                    get()
            else:
                assert callable(get()), (entry.name, role)
    assert get_format("csv").pytorch == "compute_only"
    assert get_format("torch-comms").pytorch == "compute_comms"


def test_lookup_by_name():
    assert [entry.name for entry in formats("table")] == ["csv", "json", "grid", "torch-comms"]
    assert [entry.name for entry in formats("profile")] == ["kineto"]
    assert [entry.name for entry in formats("result")] == ["perfetto"]
    assert get_format("json").reader().__name__ == "read_json"
    with pytest.raises(UnknownNameError) as unknown:
        get_format("xml")
    assert str(unknown.value) == ("unknown format 'xml'; formats: csv, json, grid, torch-comms, "
                                  "kineto, perfetto")


@pytest.mark.parametrize("path, holds, role, name", [
    ("t.csv", "table", "read", "csv"), ("dir.v2/T.CSV", "table", "read", "csv"),
    ("t.json", "table", "write", "json"), ("t.csv", "table", "dumps", "csv"),
    ("t.json", "profile", "read", "kineto"),
    ("rank0.pt.trace.json.GZ", "profile", "read", "kineto"),
    ("t.json", "result", "write", "perfetto"),
    ("t.txt", "table", "read", None), (".csv", "table", "read", None),
    ("t.json.gz", "table", "read", None), ("t.csv", "result", "write", None),
    ("t.json", "profile", "write", None),
])
def test_lookup_by_suffix(path, holds, role, name):
    found = find_format(path, holds, role)
    assert (found.name if found else None) == name


def test_the_suffixes_come_from_the_registry():
    assert TABLE_SUFFIXES == (".csv", ".json")
    assert TRACE_SUFFIXES == (".json", ".json.gz")


@pytest.mark.parametrize("name, shown", [("t.txt", "'.txt'"), ("table", "'(no suffix)'"),
                                         ("t.tar.gz", "'.gz'")])
def test_an_unknown_suffix_is_one_line_naming_the_file(tmp_path, name, shown):
    path = tmp_path / name
    expected = f"{path}: unknown table format {shown}; expected one of .csv, .json"
    for call in (lambda: read_table(path),
                 lambda: write_table(generate("gpipe", devices=1, microbatches=1), path),
                 lambda: format_for(path)):
        with pytest.raises(InvalidScheduleError) as unknown:
            call()
        assert str(unknown.value) == expected
    assert not path.exists()
    with pytest.raises(InvalidScheduleError, match=r": unknown result format '\.csv'; expected "
                                                   r"one of \.json$"):
        format_for("t.csv", "result", "write")


def test_read_and_write_table_go_by_the_registry(tmp_path):
    table = generate("1f1b", devices=2, microbatches=3)
    write_table(table, tmp_path / "t.json")
    assert read_table(tmp_path / "t.json") == table
    assert (tmp_path / "t.json").read_text() == json_text(table) == to_json(table, indent=1) + "\n"
    write_table(table, tmp_path / "t.CSV", drop_metadata=True)
    assert (tmp_path / "t.CSV").read_bytes() == to_csv(table, drop_metadata=True).encode()
    assert read_table(tmp_path / "t.CSV") == table.replace(family=None, params={})
    # a file of cells only takes the metadata it cannot hold; a JSON table holds its own
    sized = read_table(tmp_path / "t.CSV", microbatch_sizes=[0.5, 0.5, 1.0])
    assert sized.microbatch_sizes == (0.5, 0.5, 1.0)
    assert read_table(tmp_path / "t.json", microbatch_sizes=[0.5, 0.5, 1.0]) == table


def test_dump_passes_the_options_each_format_takes():
    table = generate("gpipe", devices=2, microbatches=2).replace(stage_layers=[1, 3])
    options = {"width": 30, "drop_metadata": True}
    assert get_format("csv").dump(table, **options) == to_csv(table, drop_metadata=True)
    assert get_format("json").dump(table, **options) == json_text(table)
    assert get_format("grid").dump(table, **options).endswith("\n")
    with pytest.raises(InvalidScheduleError, match="cannot hold the layers of each stage"):
        get_format("csv").dump(table, width=30)


def test_a_format_module_is_imported_when_first_asked_for():
    code = ("import sys, tabsched, tabsched.formats as formats\n"
            "lazy = ['tabsched.formats.pytorch_csv', 'tabsched.formats.pytorch_comms',\n"
            "        'tabsched.formats.kineto', 'tabsched.formats.perfetto']\n"
            "assert not [m for m in lazy if m in sys.modules], sorted(sys.modules)\n"
            "formats.get_format('torch-comms').dumper()\n"
            "assert 'tabsched.formats.pytorch_comms' in sys.modules\n"
            "assert 'tabsched.formats.kineto' not in sys.modules\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


# ------------------------------------------------------------------ refusals
#: (reader, text, message): each reader's one line for a bad file, naming file and place.
READERS = {"csv": lambda text: from_csv(text, source="t.csv"),
           "json": lambda text: from_json(text, source="t.json"),
           "torch": lambda text: from_pytorch_csv(text, source="t.csv"),
           "legacy": lambda text: from_pytorch_csv(text, source="t.csv", legacy=True),
           "kineto": lambda text: profile_from_trace(json.loads(text), source="t.json")}
EXPECTED = "expected <stage><F|B|I|W><microbatch>, e.g. 3F12, or (<op>;<op>)OVERLAP_F_B"
RUNTIME = "is one of PyTorch's runtime actions; read the file with tabsched.read_pytorch " \
          "(the CLI does)"
PP_EXPECTED = ("expected PP:<stage><F|I|B|W><microbatch>, PP:(<op>;<op>)OVERLAP_F_B, "
               "PP:<stage><SEND_F|RECV_F|SEND_B|RECV_B><microbatch> or "
               "PP:<stage><UNSHARD|RESHARD|REDUCE_GRAD>")


def trace(name, dur=1):
    return json.dumps({"traceEvents": [{"ph": "X", "cat": "user_annotation", "name": name,
                                        "ts": 0, "dur": dur, "tid": 1}]})


REFUSED = [
    ("csv", "0F0,0X0\r\n", f't.csv: device 0, slot 1: "0X0" is not an operation ({EXPECTED})'),
    ("csv", "0F0,0B0\r\n,\r\n", "t.csv: device 1 (line 2) has no operations; every row of a "
                                "schedule runs something"),
    ("csv", "", "t.csv: the file is empty; expected one row per device"),
    ("csv", '0F0,"0B0\n"\r\n', 't.csv: device 0, slot 1: "0B0\\n" spans several lines (a '
                               'quoted line break, or a quote never closed); a cell holds one '
                               'operation'),
    ("csv", "0F0,0SEND_F0,0B0\r\n", f't.csv: device 0, slot 1: "0SEND_F0" {RUNTIME}'),
    ("csv", "0F0,0B0,1REDUCE_GRAD\r\n", "t.csv: device 0, slot 2: 1REDUCE_GRAD: stage 1 does not "
                                        "run on device 0 (it runs stage 0)"),
    ("csv", "0F0,0B1\r\n", "t.csv: device 0, slot 0: 0F0 has no backward (0B0, or 0I0 and 0W0)"),
    ("csv", "0F0\x00,0B0\r\n", "t.csv: line 1 contains a NUL byte; this is not a CSV schedule"),
    ("csv", "0F0,0F99999999999\r\n", 't.csv: device 0, slot 1: "0F99999999999": microbatch '
                                     '99999999999 is too large (ids go up to 2147483647)'),
    ("csv", "0F0,(0F1;0W0)OVERLAP_F_B\r\n", 't.csv: device 0, slot 1: "(0F1;0W0)OVERLAP_F_B": an '
                                            'overlapped cell holds one forward and one backward '
                                            '(F with B or I)'),
    ("json", '{"rows": [["0F0", "0B0"]], "x": 1}', 't.json: unknown key "x"; valid keys: family, '
                                                   'format, grad_sync, microbatch_sizes, '
                                                   'num_stages, params, rows, '
                                                   'sequence_slices, slice_partition, '
                                                   'stage_layers, version'),
    ("json", '{"rows": [["0F0", 3]]}', "t.json: device 0, slot 1: 3 is not a cell string"),
    ("json", '{"rows": [["0F0", "0Q0"]]}', f't.json: device 0, slot 1: "0Q0" is not an '
                                           f'operation ({EXPECTED})'),
    ("json", "[", "t.json: not valid JSON: Expecting value at line 1, column 2"),
    ("json", '{"rows": [["0F0", "0B0"]], "num_stages": 2}', 't.json: "num_stages" is 2, but the '
                                                            'rows hold stages 0..0'),
    ("json", '{"rows": [["0F0", "0B0"]], "microbatch_sizes": [NaN]}',
     "t.json: NaN is not a number a table may hold"),
    ("json", '{"rows": [["0F0", "1UNSHARD", "0B0"]]}', f't.json: device 0, slot 1: "1UNSHARD" '
                                                       f'{RUNTIME}'),
    ("torch", "0F0,0BW0\r\n", 't.csv: device 0, slot 1: "0BW0" is a full backward in PyTorch\'s '
                              'legacy tokens; read the file with legacy=True (--torch-legacy)'),
    ("torch", "0F0,0SEND_F0,0B0\r\n", "t.csv: device 0, slot 1: 0SEND_F0: stage 0 is the last "
                                      "stage; there is no neighbour to send to"),
    ("torch", "0F0,,0SEND_F0,0RECV_B0,0B0\r\n1RECV_F0,1F0,1B0,1SEND_B0\r\n",
     "t.csv: device 0, slot 1: empty cell; a compute_comms row lists actions without gaps"),
    ("torch", "0F0,0W0,0B0\r\n", "t.csv: device 0, slot 2: 0B0 splits a backward that 0B0 "
                                 "already runs whole (with W but no I, this may be PyTorch's "
                                 "legacy tokens, B = input-grad; read it with legacy=True, "
                                 "--torch-legacy)"),
    ("torch", "0F0,0UNSHARD7,0B0\r\n", 't.csv: device 0, slot 1: "0UNSHARD7": UNSHARD takes no '
                                       'microbatch (expected 0UNSHARD)'),
    ("torch", "0F0,1UNSHARD,0B0\r\n", "t.csv: device 0, slot 1: 1UNSHARD: stage 1 does not run "
                                      "on device 0 (it runs stage 0)"),
    ("legacy", "0F0,0I0,0W0\r\n", 't.csv: device 0, slot 1: "0I0": PyTorch\'s legacy tokens have '
                                  'no I; read the file without legacy=True (--torch-legacy)'),
    ("kineto", trace("PP:0BW1"), f"t.json: event 0: 'PP:0BW1' is not an action of PyTorch's "
                                 f"pipelining runtime ({PP_EXPECTED})"),
    ("kineto", trace("PP:1234567890F0"), f"t.json: event 0: 'PP:1234567890F0' is not an action "
                                         f"of PyTorch's pipelining runtime ({PP_EXPECTED})"),
    ("kineto", trace("PP:(0F0;0W0)OVERLAP_F_B"), "t.json: event 0: PP:(0F0;0W0)OVERLAP_F_B: an "
                                                 "overlapped step holds one forward and one "
                                                 "backward (F with B or I)"),
    ("kineto", trace("PP:0F0", dur=-1), "t.json: event 0 (PP:0F0): 'dur' must be >= 0, not -1"),
    ("kineto", trace("x"), "t.json: no pipeline operations (PP:<stage><F|I|B|W><microbatch> "
                           "events); profile a schedule that _PipelineScheduleRuntime runs (a "
                           "multi-stage schedule or one loaded with _load_csv), with the "
                           "profiler's CPU activity on"),
]


@pytest.mark.parametrize("reader, text, message", REFUSED,
                         ids=[f"{reader}-{index}" for index, (reader, _, _) in enumerate(REFUSED)])
def test_every_reader_refuses_bad_input_with_its_one_line(reader, text, message):
    with pytest.raises((InvalidScheduleError, InvalidParameterError)) as refused:
        READERS[reader](text)
    assert str(refused.value) == message


# ------------------------------------------- a stage on two devices, an unknown family (24)
def test_a_stage_on_two_devices_is_refused_unless_a_replica_family_says_so(tmp_path):
    import json

    from tabsched import InvalidScheduleError, generate, read_table, write_table
    chimera = generate("chimera", devices=4, microbatches=4)
    path = tmp_path / "chimera.json"
    write_table(chimera, path)
    assert read_table(path).num_stages == chimera.num_stages      # tagged: its replicas
    data = json.loads(path.read_text())
    for family in (None, "1f1b", "my-own"):
        data["family"] = family
        if family is None:
            data.pop("family")
            data.pop("params", None)
        path.write_text(json.dumps(data))
        with pytest.raises(InvalidScheduleError, match=r"chimera\.json: stage 0 runs on "
                           r"devices 0 and 3; only a table of a replica family \(bitpipe, "
                           r"chimera, dualpipe\)"):
            read_table(path)


def test_a_family_tabsched_does_not_know_is_noted_in_the_result(tmp_path, cli):
    import json

    from tabsched import evaluate, generate, read_table, write_table
    path = tmp_path / "t.json"
    write_table(generate("1f1b", devices=2, microbatches=4), path)
    data = json.loads(path.read_text())
    data["family"] = "my-own-1f1b"
    path.write_text(json.dumps(data))
    result = evaluate(read_table(path))
    assert any("family 'my-own-1f1b', which tabsched does not know" in note
               for note in result.notes)
    code, out, _ = cli("eval", str(path))
    assert code == 0 and "note: the table says family 'my-own-1f1b'" in out
    assert not any("does not know" in note
                   for note in evaluate(generate("1f1b", devices=2, microbatches=4)).notes)
