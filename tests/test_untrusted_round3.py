"""Untrusted input, round three (issue 24): the cases the earlier rounds left open.

Each case is checked through the CLI (exit 1, exactly one ``Error:`` line naming the
place, no traceback) and through the API (tabsched's own exception and its message).
"""

import json

import numpy as np
import pytest

from tabsched import InvalidScheduleError, ScheduleTable, generate, read_table, write_table


# ------------------------------------------- text that is not Unicode (a lone surrogate)
@pytest.mark.parametrize("change,message", [
    (lambda data: data.update(family="\ud800"), r'"family": "\ud800" holds a lone surrogate at '
                                                 r'character 0'),
    (lambda data: data["params"].update(note="x\udc80y"),
     r'"params": note = "x\udc80y" holds a lone surrogate at character 1'),
    (lambda data: data["params"].update({"\ud800": 3}),
     r'"params": the name "\ud800" holds a lone surrogate at character 0'),
    (lambda data: data["params"].update(pairs=["serial", "\udfff"]),
     r'"params": pairs = "\udfff" holds a lone surrogate at character 0'),
])
@pytest.mark.parametrize("command", ["eval", "show", "convert"])
def test_a_lone_surrogate_in_the_family_or_a_parameter_is_one_line(cli_error, tmp_path, change,
                                                                    message, command):
    path = tmp_path / "t.json"
    write_table(generate("1f1b", devices=2, microbatches=2), path)
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))        # JSON's \u escapes hold the surrogate
    extra = [tmp_path / "o.csv"] if command == "convert" else []
    whole = f"{path}: {message}, which is not Unicode text"
    assert cli_error(command, path, *extra) == whole
    with pytest.raises(InvalidScheduleError) as refused:
        read_table(path)
    assert str(refused.value) == whole
    assert not (tmp_path / "o.csv").exists()


def test_the_table_refuses_a_lone_surrogate_from_python_too():
    rows = [["0F0", "0B0"]]
    with pytest.raises(InvalidScheduleError, match=r'^family: "\\ud800" holds a lone '
                                                   r'surrogate at character 0'):
        ScheduleTable(rows, family="\ud800")
    with pytest.raises(InvalidScheduleError, match=r'^params: pairs = "a\\udc80" holds a '
                                                   r'lone surrogate at character 1'):
        ScheduleTable(rows, params={"pairs": "a\udc80"})
    assert ScheduleTable(rows, family="1f1b \u00e9\U0001f600").family.startswith("1f1b")


# ------------------------------------------- hostile values through the public API
#: Values of every kind a caller might pass by mistake: wrong types, non-integers where
#: integers are meant, non-finite and huge numbers, text that is no Unicode, containers.
HOSTILE = [None, True, -1, 0, 4.5, float("nan"), float("inf"), 10**30, "4", "x", "",
           "\ud800", [], [4.5], {"a": 1}, object(), b"4", 1j, (4,), np.array([1, 2])]


def _table():
    return generate("1f1b", devices=2, microbatches=2)


#: One public call per place a hostile value goes, each ``call(value)``.
API_CALLS = {
    "generate devices": lambda value: generate("1f1b", devices=value, microbatches=4),
    "generate microbatches": lambda value: generate("1f1b", devices=2, microbatches=value),
    "generate chunks": lambda value: generate("interleaved-1f1b", devices=2, microbatches=4,
                                              chunks=value),
    "generate layers": lambda value: generate("1f1b", devices=2, microbatches=4, layers=value),
    "generate name": lambda value: generate(value, devices=2, microbatches=4),
    "ScheduleTable rows": lambda value: ScheduleTable(value),
    "ScheduleTable row": lambda value: ScheduleTable([value]),
    "ScheduleTable family": lambda value: ScheduleTable([["0F0", "0B0"]], family=value),
    "from_csv": lambda value: __import__("tabsched").from_csv(value),
    "from_json": lambda value: __import__("tabsched").from_json(value),
    "to_csv": lambda value: __import__("tabsched").to_csv(value),
    "to_json": lambda value: __import__("tabsched").to_json(value),
    "render_grid": lambda value: __import__("tabsched").render_grid(value),
    "formula_for": lambda value: __import__("tabsched").formula_for(value),
    "lower": lambda value: __import__("tabsched").lower(value),
    "evaluate table": lambda value: __import__("tabsched").evaluate(value),
    "evaluate costs": lambda value: __import__("tabsched").evaluate(_table(), value),
    "evaluate contention": lambda value: __import__("tabsched").evaluate(_table(),
                                                                         contention=value),
    "evaluate optimizer": lambda value: __import__("tabsched").evaluate(_table(),
                                                                        optimizer=value),
    "evaluate grad_sync": lambda value: __import__("tabsched").evaluate(_table(),
                                                                        grad_sync=value),
    "evaluate formula": lambda value: __import__("tabsched").evaluate(_table(), formula=value),
    "read_table": lambda value: read_table(value),
    "read_pytorch": lambda value: __import__("tabsched").read_pytorch(value),
    "read_kineto": lambda value: __import__("tabsched").read_kineto(value),
    "write_table path": lambda value: write_table(_table(), value),
    "load_model": lambda value: __import__("tabsched").load_model(value),
    "load_system": lambda value: __import__("tabsched").load_system(value),
    "load_execution": lambda value: __import__("tabsched").load_execution(value),
    "ModelCosts model": lambda value: __import__("tabsched").ModelCosts(value, "dgx-a100"),
    "sweep families": lambda value: __import__("tabsched").sweep(value, [2], [4],
                                                                 systems=["mid_nw_mid_cp"]),
    "sweep devices": lambda value: __import__("tabsched").sweep(["1f1b"], value, [4],
                                                                systems=["mid_nw_mid_cp"]),
    "sweep microbatches": lambda value: __import__("tabsched").sweep(
        ["1f1b"], [2], value, systems=["mid_nw_mid_cp"]),
    "compare specs": lambda value: _compare(value, 2, 4),
    "compare devices": lambda value: _compare(["1f1b"], value, 4),
    "compare microbatches": lambda value: _compare(["1f1b"], 2, value),
    "compare costs": lambda value: _compare(["1f1b"], 2, 4, costs=value),
    "compare execution": lambda value: _compare(["1f1b"], 2, 4, execution=value),
    "compare global_batch": lambda value: _compare(["1f1b"], 2, 4, global_batch=value),
    "compare lengths": lambda value: _compare(["1f1b"], 2, 4, lengths=value),
    "compare parallel": lambda value: _compare(["1f1b"], 2, 4, parallel=value),
}


def _compare(*args, **kwargs):
    from tabsched.compare import compare
    return compare(*args, costs=kwargs.pop("costs", __import__("tabsched").UnitCosts()),
                   **kwargs)


#: The loaders of presets and files say a file that cannot be read with the system's
#: OSError, as documented (the CLI names the file); a value that is no path is refused.
MAY_RAISE_OS_ERROR = ("load_model", "load_system", "load_execution", "ModelCosts model")


def _only_own_errors(call, value, place=""):
    from tabsched import TabschedError
    try:
        call(value)
    except TabschedError as error:
        assert "\n" not in str(error)
    except OSError:
        assert place in MAY_RAISE_OS_ERROR and isinstance(value, str), (place, value)
    except Exception as error:   # noqa: BLE001 - the point: nothing else may escape
        pytest.fail(f"{type(error).__name__} escaped for {value!r}: {error}")


@pytest.mark.parametrize("place", sorted(API_CALLS))
def test_hostile_values_raise_only_tabscheds_own_errors(place, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)    # a value taken for a path reads and writes here only
    for value in HOSTILE:
        _only_own_errors(API_CALLS[place], value, place)


def test_a_path_is_never_a_file_descriptor(tmp_path, capsys):
    from tabsched import InvalidParameterError, OutputError, TabschedError, atomic_write
    with pytest.raises(TabschedError, match=r"^path must be a file path \(text or os\.PathLike\), "
                                            r"not True$"):
        write_table(_table(), True)           # open(True) would write to stdout, then close it
    with pytest.raises(OutputError, match=r"^path must be a file path .*, not 1$"):
        atomic_write(1, "text")
    with pytest.raises(InvalidParameterError, match=r"^path must be a file path .*, not 1$"):
        read_table(1)
    with pytest.raises(InvalidParameterError, match=r'"t\\x00\.csv" holds a NUL character'):
        read_table("t\x00.csv")
    with pytest.raises(InvalidParameterError, match=r'"\\ud800\.csv" holds a lone surrogate'):
        read_table("\ud800.csv")
    print("standard output is still open")
    assert "still open" in capsys.readouterr().out


def test_a_huge_or_infinite_count_is_refused_by_name():
    from tabsched import InvalidParameterError
    with pytest.raises(InvalidParameterError, match=r"^1f1b: devices must be an integer, "
                                                    r"not inf$"):
        generate("1f1b", devices=float("inf"), microbatches=4)
    with pytest.raises(InvalidParameterError, match=r"^1f1b: layers must be an integer, "
                                                    r"not inf$"):
        generate("1f1b", devices=2, microbatches=4, layers=float("inf"))
    with pytest.raises(InvalidParameterError, match=r"would have up to 10\^\d+ operations"):
        generate("1f1b", devices=2, microbatches=10**400)


hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, strategies as st  # noqa: E402

_ANY = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8),
                 st.binary(max_size=4), st.lists(st.integers(-2, 8), max_size=3),
                 st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


@given(place=st.sampled_from(sorted(name for name in API_CALLS
                                    if not name.startswith(("sweep", "compare")))),
       value=_ANY)
def test_random_values_raise_only_tabscheds_own_errors(place, value):
    """Random values of every kind (bounded: the sweep and compare calls, slower per call,
    take the hand list above only)."""
    if place.startswith(("read", "write")) and isinstance(value, str):
        value = "no-such-folder-24/" + value   # never a real file
    _only_own_errors(API_CALLS[place], value, place)


# ------------------------------------------- schedule options and placement of a table file
def test_layers_with_a_table_file_split_its_stages_or_are_refused(cli, cli_error, tmp_path):
    plain = tmp_path / "t.csv"
    write_table(generate("1f1b", devices=4, microbatches=4), plain, drop_metadata=True)
    out = tmp_path / "o.json"
    code, _, _ = cli("convert", str(plain), str(out), "--layers", "18")   # was ignored
    assert code == 0 and json.loads(out.read_text())["stage_layers"] == [5, 5, 4, 4]
    split = tmp_path / "split.json"
    write_table(generate("1f1b", devices=4, microbatches=4, stage_layers="1,2,3,4"), split)
    code, _, _ = cli("convert", str(split), str(out), "--layers", "10")   # holds 10
    assert code == 0 and json.loads(out.read_text())["stage_layers"] == [1, 2, 3, 4]
    assert cli_error("eval", split, "--layers", "16") == (
        f"{split}: --layers 16: the file's stage_layers (1,2,3,4) add up to 10; give "
        f"--stage-layers to split them anew")


def test_a_csv_with_a_stage_on_two_devices_is_refused_by_the_cli_as_by_read_table(cli_error,
                                                                                  tmp_path):
    path = tmp_path / "two.csv"
    path.write_text("0F0,0B0\r\n0F1,0B1\r\n", newline="")   # stage 0 on devices 0 and 1
    message = (f"{path}: stage 0 runs on devices 0 and 1; only a table of a replica family "
               f"(bitpipe, chimera, dualpipe) places a stage on two devices")
    for command in ("eval", "show", "trace"):
        extra = ["-o", tmp_path / "t.json"] if command == "trace" else []
        assert cli_error(command, path, *extra).startswith(message)
    with pytest.raises(InvalidScheduleError, match=r"stage 0 runs on devices 0 and 1"):
        read_table(path)
    assert not (tmp_path / "t.json").exists()


# ------------------------------------------- a replay of some devices only
def test_a_replay_that_measures_some_devices_only_is_an_error_unless_partial(cli, cli_error,
                                                                            tmp_path):
    from tabsched import InvalidParameterError
    from tabsched.adapt import Replay
    path = tmp_path / "rank0.csv"
    path.write_text("op,duration\n0F0,2\n0B0,3\n")       # device 0's operations only
    message = (f"{path}: measures no operation on devices 1, 2 and 3, which would keep their "
               f"modelled times beside the measured ones of the others; replay every device, "
               f"or accept it with --replay-partial (partial=True)")
    assert cli_error("eval", "1f1b", "-p", "4", "-m", "4", "--replay", path) == message
    table = generate("1f1b", devices=4, microbatches=4)
    with pytest.raises(InvalidParameterError) as refused:
        Replay.from_csv(path).check(table)
    assert str(refused.value) == message
    partial = Replay.from_csv(path, partial=True)
    partial.check(table)
    assert partial.describe()["modelled_devices"] == [1, 2, 3]
    # modelled times in seconds beside the measured ones: the partial replay runs
    code, out, _ = cli("eval", "1f1b", "-p", "4", "-m", "4", "--replay", str(path),
                       "--replay-partial", "--samples", "2", "--model", "paper-128l",
                       "--system", "mid_nw_mid_cp")
    assert code == 0 and ("note          devices 1, 2 and 3 measured nothing and keep "
                          "modelled times (partial replay)") in out
    # in slots, those devices' times could not become seconds: refused, naming them
    assert "devices 1, 2 and 3 have no measured operation to convert slots to seconds" in \
        cli_error("eval", "1f1b", "-p", "4", "-m", "4", "--replay", path, "--replay-partial",
                  "--samples", "2")
    every = tmp_path / "all.csv"
    every.write_text("".join(f"{stage}F0,2\n" for stage in range(4)))
    code, _, _ = cli("eval", "1f1b", "-p", "4", "-m", "4", "--replay", str(every),
                     "--samples", "2")
    assert code == 0


@pytest.mark.parametrize("keyword", ["zero_stages", "sequence_parallel", "recompute"])
def test_plan_refuses_a_choice_list_that_is_no_list_by_name(keyword):
    from tabsched import InvalidParameterError, plan
    with pytest.raises(InvalidParameterError, match=rf"^{keyword} must be a list of choices, "
                                                    rf"not b'x'$"):
        plan("llama3-8b", "dgx-a100", 8, 16, **{keyword: b"x"})


def test_a_profile_of_one_rank_is_a_partial_replay(cli, cli_error, tmp_path):
    events = [{"ph": "X", "cat": "user_annotation", "name": f"PP:0{kind}{microbatch}",
               "ts": 20 * step, "dur": 10, "pid": 7, "tid": 1}
              for step, (kind, microbatch) in enumerate([("F", 0), ("F", 1), ("B", 0),
                                                         ("B", 1)])]
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({"traceEvents": events}))     # rank 0's profile only
    assert cli_error("eval", "1f1b", "-p", "2", "-m", "2", "--replay", path) == (
        f"{path}: measures no operation on device 1, which would keep its modelled times "
        f"beside the measured ones of the others; replay every device, or accept it with "
        f"--replay-partial (partial=True)")
    code, out, _ = cli("eval", "1f1b", "-p", "2", "-m", "2", "--replay", str(path),
                       "--replay-partial", "--samples", "1", "--model", "paper-128l",
                       "--system", "mid_nw_mid_cp")
    assert code == 0 and "device 1 measured nothing and keeps modelled times" in out
    assert "device 1 has no measured operation to convert slots to seconds" in cli_error(
        "eval", "1f1b", "-p", "2", "-m", "2", "--replay", path, "--replay-partial")
