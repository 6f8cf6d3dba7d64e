"""The command line's conventions: help everywhere, sections, completion, -o, progress."""

import click
import pytest
from click.shell_completion import ShellComplete

from tabsched.cli import cli as group

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def all_commands(command=group, path=("tabsched",)):
    yield path, command
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from all_commands(sub, path + (name,))


@pytest.mark.parametrize("path, command", list(all_commands()),
                         ids=lambda value: " ".join(value) if isinstance(value, tuple) else "")
def test_every_option_has_help(path, command):
    for param in command.params:
        if isinstance(param, click.Option) and param.name not in ("help", "version"):
            assert (param.help or "").strip(), f"{' '.join(path)} {param.opts[0]} has no help"


def test_eval_help_is_grouped_in_sections(cli):
    code, out, _ = cli("eval", "--help")
    headings = [line.rstrip(":") for line in out.splitlines()
                if line and not line.startswith(" ") and line.endswith(":")]
    assert code == 0 and headings == [
        "Arguments", "Schedule", "Costs without a model (slots)",
        "Model, system and parallelism", "Memory and the iteration's tail",
        "Run-time variation (Monte Carlo)", "Output", "Other options", "Examples"]
    assert "Options:" not in out
    # the argument is explained first, not listed bare among "Other options"
    other = out[out.index("Other options:"):out.index("Examples:")]
    assert "SCHEDULE" not in other
    assert "SCHEDULE  A family name" in out


@pytest.mark.parametrize("path,command", [pair for pair in all_commands()],
                         ids=lambda value: " ".join(value) if isinstance(value, tuple) else "")
def test_every_argument_is_explained(path, command):
    from tabsched.cli.options import ARGUMENT_HELP, SectionedCommand
    if not isinstance(command, SectionedCommand):
        return
    for param in command.params:
        if isinstance(param, click.Argument):
            metavar = (param.metavar or param.name.upper())
            assert metavar in ARGUMENT_HELP, f"{' '.join(path)} {metavar} has no help"


def test_every_help_example_runs(cli, tmp_path, monkeypatch):
    """The examples at the end of each --help, in order in one folder (a later one may read
    an earlier one's file). `study` is left out: it runs for minutes (test_cli_study)."""
    import shlex

    from tabsched.cli.options import EXAMPLES
    monkeypatch.chdir(tmp_path)
    for path, examples in EXAMPLES.items():
        assert any(" ".join(found[1:]) == path for found, _ in all_commands()), path
        _, out, _ = cli(*path.split(), "--help")
        for example in examples:
            assert example in out, (path, example)
            if path == "study":
                continue
            code, _, err = cli(*shlex.split(example)[1:])
            assert code == 0, (example, err)


def test_a_small_command_keeps_one_options_list(cli):
    _, out, _ = cli("presets", "--help")
    assert "Options:" in out


def test_every_command_that_writes_takes_o(cli, tmp_path):
    for path, command in all_commands():
        flags = {opt for param in command.params for opt in getattr(param, "opts", ())}
        if "--out" in flags:
            assert "-o" in flags, f"{' '.join(path)} has --out without -o"
    for argv in (["convert", "1f1b", "-p", "2", "-m", "2", "-o", str(tmp_path / "a.json")],
                 ["convert", "1f1b", "-p", "2", "-m", "2", str(tmp_path / "b.json")]):
        code, _, err = cli(*argv)
        assert code == 0, err
    code, _, err = cli("convert", "1f1b", "-p", "2", "-m", "2", str(tmp_path / "c.json"), "-o",
                       str(tmp_path / "d.json"))
    assert code == 2 and "give the output once" in err


def test_model_and_system_have_the_same_names_in_eval_compare_and_sweep():
    for name in ("eval", "compare", "sweep"):
        flags = {opt for param in group.commands[name].params for opt in param.opts}
        assert {"--model", "--system"} <= flags, name


def completions(args, incomplete):
    complete = ShellComplete(group, {}, "tabsched", "_TABSCHED_COMPLETE")
    return [item.value for item in complete.get_completions(args, incomplete)]


def test_shell_completion_offers_families_presets_and_studies():
    assert {"zb-h1", "zb-h2", "zbv", "zb-auto", "zbv-auto"} <= set(completions(["eval"], "zb"))
    assert "dgx-h100" in completions(["eval", "1f1b", "--system"], "dgx")
    assert "paper-128l" in completions(["eval", "1f1b", "--model"], "pap")
    assert "paper-128l,gpt3-175b" in completions(["sweep", "gpipe", "--models"], "paper-128l,gpt")
    assert completions(["study"], "tab") == ["tabular-paper"]
    assert set(completions(["compare"], "chim")) == {"chimera"}


def test_completion_is_documented(cli):
    _, out, _ = cli("--help")
    assert "_TABSCHED_COMPLETE=bash_source tabsched" in " ".join(out.split())


def test_adapt_reports_progress_on_a_terminal(cli, monkeypatch):
    import sys
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    code, _, err = cli("adapt", "1f1b", "-p", "4", "-m", "8", "--memory-budget", "12",
                       "--max-rounds", "2", "--samples", "8")
    assert code == 0 and "adapt  [" in err and "2/2" in err and "candidates" in err
    code, _, err = cli("adapt", "1f1b", "-p", "4", "-m", "8", "--memory-budget", "12",
                       "--max-rounds", "2", "--samples", "8", "-q")
    assert code == 0 and "adapt  [" not in err


def test_commands_are_imported_when_they_run(tmp_path):
    """``tabsched sweep`` starts without the modules of the other commands (adapt,
    plot, tables, pytorch...) nor what only other paths need (processes, package
    metadata, masked arrays); every command still resolves under its own name."""
    import subprocess
    import sys
    out = str(tmp_path / "s.csv")
    code = (
        "import sys\n"
        "from tabsched.cli import main\n"
        "try:\n"
        f"    main(['sweep', 'gpipe', '-p', '2', '-m', '2', '-q', '-o', {out!r}])\n"
        "except SystemExit as done:\n"
        "    assert done.code == 0\n"
        "loaded = [m for m in ('tabsched.cli.adapt', 'tabsched.cli.plot', 'tabsched.cli.tables',\n"
        "                      'tabsched.cli.eval', 'tabsched.pytorch', 'tabsched.adapt',\n"
        "                      'tabsched.formats.pytorch_csv', 'tabsched.formats.kineto',\n"
        "                      'multiprocessing', 'importlib.metadata',\n"
        "                      'numpy.ma') if m in sys.modules]\n"
        "assert not loaded, loaded\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    for name, command in group.commands.items():
        assert command.name == name


def test_lazy_commands_are_a_mapping():
    from tabsched.cli import COMMANDS, LazyCommands
    commands = LazyCommands(COMMANDS)
    assert list(commands) == list(COMMANDS) and len(commands) == len(COMMANDS)
    assert commands.get("no-such-command") is None and "sweep" in commands
    extra = click.Command("extra")
    commands["extra"] = extra
    commands["sweep"] = extra          # replaced before it was ever imported
    assert commands["sweep"] is extra and len(commands) == len(COMMANDS) + 1
    del commands["extra"], commands["list"]
    assert "list" not in commands and len(commands) == len(COMMANDS) - 1
    with pytest.raises(KeyError):
        del commands["list"]


# ------------------------------------------- names a folder or file cannot hide (issue 24)
def test_a_folder_or_file_named_like_a_family_or_preset_does_not_hide_it(cli, tmp_path,
                                                                          monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "1f1b").mkdir()                          # a folder named like a family
    (tmp_path / "dgx-a100").mkdir()                      # and one named like a preset
    (tmp_path / "gpt3-175b").write_text("not a model\n")  # a file named like a preset
    code, out, err = cli("eval", "1f1b", "-p", "2", "-m", "4", "--model", "gpt3-175b",
                         "--system", "dgx-a100", "-t", "8", "--stage-layers", "48,48")
    assert code == 0 and err == "" and out.startswith("1f1b devices=2 microbatches=4")
    # a path names the file, as the docstrings say
    code, _, err = cli("eval", "./1f1b")
    assert code == 1 and err.startswith("Error: ") and "1f1b" in err
    code, _, err = cli("costs", "./gpt3-175b", "dgx-a100")
    assert code == 1 and err.startswith("Error: ") and "gpt3-175b" in err


# ------------------------------------------ schedule options with a table file (issue 24)
@pytest.mark.parametrize("option, flag", [(["-p", "4"], "--devices"),
                                          (["-m", "8"], "--microbatches"),
                                          (["--chunks", "2"], "--chunks"),
                                          (["--param", "x=1"], "--param x=...")])
def test_an_option_a_table_file_fixes_is_refused_naming_it(cli, tmp_path, option, flag):
    table = tmp_path / "t.json"
    assert cli("convert", "1f1b", str(table), "-p", "2", "-m", "4")[0] == 0
    code, out, err = cli("eval", str(table), *option)
    assert code == 1 and out == "" and err == (
        f"Error: {table}: {flag} cannot apply to a table file (its cells fix its devices, "
        f"microbatches and order); drop it, or give a family name instead of the file\n")


def test_the_layer_split_applies_to_a_table_file(cli, tmp_path):
    import json
    table, out = tmp_path / "t.json", tmp_path / "o.json"
    assert cli("convert", "1f1b", str(table), "-p", "2", "-m", "4")[0] == 0
    assert cli("convert", str(table), str(out), "--stage-layers", "3,5")[0] == 0
    assert json.loads(out.read_text())["stage_layers"] == [3, 5]
    code, text, _ = cli("eval", str(table), "--model", "gpt3-175b", "--system", "dgx-a100",
                        "-t", "8", "--stage-layers-ratio", "1:2", "--json")
    assert code == 0
    split = cli("eval", "1f1b", "-p", "2", "-m", "4", "--model", "gpt3-175b", "--system",
                "dgx-a100", "-t", "8", "--stage-layers-ratio", "1:2", "--json")[1]
    assert json.loads(text)["makespan"] == json.loads(split)["makespan"]
    csv = tmp_path / "t.csv"                        # PyTorch's CSV takes the split too
    assert cli("convert", "1f1b", str(csv), "-p", "2", "-m", "4")[0] == 0
    code, text, _ = cli("eval", str(csv), "--model", "gpt3-175b", "--system", "dgx-a100",
                        "-t", "8", "--stage-layers", "32,64", "--json")
    assert code == 0 and json.loads(text)["makespan"] == json.loads(split)["makespan"]
    code, _, err = cli("eval", str(table), "--stage-layers", "3,5,1")
    assert code == 1 and "stage_layers has 3 entries but the table has 2 stages" in err
