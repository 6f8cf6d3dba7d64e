"""Untrusted input, round three (issue 24): the cases the earlier rounds left open.

Each case is checked through the CLI (exit 1, exactly one ``Error:`` line naming the
place, no traceback) and through the API (tabsched's own exception and its message).
"""

import json

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
