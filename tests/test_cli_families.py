"""The CLI for the families of issue 4: parameters, the formula level, list and show."""

import json

import pytest

from tabsched import generate
from tabsched.io import render_grid, write_table

SIZES = {
    "chimera": ["-p", "4", "-m", "8"],
    "bitpipe": ["-p", "4", "-m", "4"],
    "dualpipe": ["-p", "4", "-m", "8"],
    "dualpipev": ["-p", "4", "-m", "8"],
    "hanayo": ["-p", "4", "-m", "4", "--waves", "2"],
}


@pytest.mark.parametrize("family", sorted(SIZES))
def test_show_renders_every_family_readably(cli, family):
    code, out, err = cli("show", family, *SIZES[family], "--width", "100")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].startswith(f"{family} devices=4")
    assert all(len(line) <= 100 for line in lines[1:])
    # a device holding several stages gets a legend naming them
    legend = [line for line in lines if line.startswith("stages on each device:")]
    assert len(legend) == 1 and "d0: 0," in legend[0]
    table = generate(family, **{key: int(value) for key, value in zip(
        ["devices", "microbatches", "waves"], SIZES[family][1::2])})
    cells = [token for line in lines if line.startswith("d") and line[1].isdigit()
             for token in line.split()[1:] if token != "."]
    parts = sum(len(cell.split("+")) for cell in cells)
    assert parts == len(table)


def test_show_marks_replicas_and_keeps_fused_cells_narrow():
    table = generate("dualpipe", devices=4, microbatches=8)
    text = render_grid(table, width=200)
    assert "replicas: every stage on up to 2 devices, each microbatch on one" in text
    row = next(line for line in text.splitlines() if line.startswith("d0 "))
    # plain cells keep their own width next to the wider fused ones
    assert "0F0 0F1 0F2 3F4" in row and "0F3+3B5 3F6+0B0" in row


def test_show_lists_stage_layers(cli):
    code, out, _ = cli("show", "chimera", "-p", "4", "-m", "4", "--stage-layers-ratio", "1:2",
                       "--layers", "96")
    assert code == 0 and "layers per stage:  16  16  32  32" in out
    code, out, _ = cli("show", "chimera", "-p", "4", "-m", "4", "--stage-layers", "1,2,3,4",
                       "--format", "json")
    assert json.loads(out)["stage_layers"] == [1, 2, 3, 4]


def test_family_parameters_from_options(cli):
    code, out, _ = cli("show", "chimera", "-p", "8", "-m", "16", "--variant", "doubling",
                       "--format", "json")
    assert code == 0 and json.loads(out)["params"]["variant"] == "doubling"
    code, out, _ = cli("show", "chimera", "-p", "8", "-m", "8", "--pipelines", "4",
                       "--format", "json")
    assert json.loads(out)["params"]["pipelines"] == 4
    code, out, _ = cli("show", "dualpipev", "-p", "2", "-m", "4", "--param", "pairs=serial",
                       "--format", "csv", "--drop-metadata")
    assert code == 0 and "OVERLAP" not in out
    code, out, _ = cli("show", "gpipe", "-p", "2", "-m", "3", "--param",
                       "backward-order=descending", "--format", "json")
    assert json.loads(out)["params"]["backward_order"] == "descending"


def test_eval_shows_formula_beside_table_marked(cli):
    code, out, _ = cli("eval", "chimera", "-p", "8", "-m", "16", "--b", "2")
    assert code == 0
    assert "bubble ratio  27.27%   (formula level: 15.79%)" in out
    assert "formula       exact when F = B, no communication: not met by these costs" in out
    assert "formula peak  5 .. 8 per device" in out
    code, out, _ = cli("eval", "dualpipev", "-p", "4", "-m", "8", "--b", "2")
    assert "bubble ratio  11.11%   (formula level: 11.11%)" in out
    assert ": met by these costs" in out
    header = next(line for line in out.splitlines() if line.startswith("device"))
    assert header.endswith("formula peak")
    code, out, _ = cli("eval", "bitpipe", "-p", "4", "-m", "4")
    assert "(formula level: no closed form)" in out and "no closed form published" in out


def test_eval_level_formula_alone(cli):
    code, out, err = cli("eval", "hanayo", "-p", "4", "-m", "4", "--waves", "1", "--b", "2",
                         "--level", "formula")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == "hanayo devices=4 microbatches=4 waves=1: formula level"
    assert "bubble ratio  40.00%" in lines
    assert "exactness     never exact (see the note)" in lines
    assert "peak memory   5 .. 8 per device (chunk (stage) activations of one microbatch)" \
        in lines
    assert "its table gives 33.33% here" in out
    assert "makespan" not in out        # no evaluation at the formula level
    code, out, _ = cli("eval", "hanayo", "-p", "4", "-m", "8", "--level", "formula")
    assert "bubble ratio  none (no closed form)" in out and "memory grows with M" in out
    code, out, _ = cli("eval", "dualpipe", "-p", "4", "-m", "8", "--b", "2", "--level",
                       "formula", "--json")
    data = json.loads(out)
    assert data["level"] == "formula" and data["bubble_time"] == 2
    assert data["peak_activation"] == [5, 5, 5, 5] and data["exact"] is True
    code, out, _ = cli("eval", "1f1b", "-p", "4", "-m", "8", "--level", "formula")
    assert "peak memory   4 3 2 1 (stage activations of one microbatch; per device)" in out


def test_eval_levels_table_and_simulation(cli):
    code, out, _ = cli("eval", "chimera", "-p", "4", "-m", "4", "--level", "table", "--json")
    assert code == 0 and json.loads(out)["level"] == "table"
    code, out, _ = cli("eval", "chimera", "-p", "4", "-m", "4", "--level", "simulation",
                       "--comm", "0.5", "--json")
    assert json.loads(out)["level"] == "simulation"


def test_list_shows_every_family_readably(cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = cli("list")
    assert code == 0
    for family in ("chimera", "bitpipe", "dualpipe", "dualpipev", "hanayo", "1f1b", "gpipe"):
        assert f"\n{family}: " in "\n" + out
    assert "  parameters:  devices, microbatches, variant=direct, pipelines=2" in out
    assert "M = P only" in out     # what changes for Hanayo beyond the paper's regime
    assert all(len(line) <= 80 for line in out.splitlines())
    assert "--stage-layers-ratio" in out
    code, out, _ = cli("list", "hanayo")
    assert code == 0 and out.startswith("hanayo: ") and "    waves: waves W" in out
    assert "chimera" not in out


def test_eval_formula_of_a_file_without_family(cli, tmp_path):
    path = tmp_path / "t.csv"
    write_table(generate("1f1b", devices=2, microbatches=2), path, drop_metadata=True)
    code, _, err = cli("eval", str(path), "--level", "formula")
    assert code == 1 and err == ("Error: the table names no family, so it has no formula "
                                 "level\n")


@pytest.mark.parametrize("argv,message", [
    (["eval", "chimera", "-p", "5", "-m", "10"], "chimera: devices must be even"),
    (["show", "chimera", "-p", "4", "-m", "4", "--variant", "halving"],
     "chimera: variant must be one of direct, doubling, not 'halving'"),
    (["show", "chimera", "-p", "8", "-m", "8", "--pipelines", "6"],
     "pipelines must be 2f with f dividing devices/2 = 4"),
    (["show", "bitpipe", "-p", "4", "-m", "6"], "bitpipe: microbatches must be a multiple of"),
    (["eval", "dualpipe", "-p", "3", "-m", "8"], "dualpipe: devices must be even"),
    (["eval", "dualpipev", "-p", "4", "-m", "7"],
     "dualpipev: microbatches must be at least 2 x devices = 8"),
    (["show", "dualpipev", "-p", "4", "-m", "8", "--param", "pairs=both"],
     "dualpipev: pairs must be one of fused, serial, not 'both'"),
    (["show", "hanayo", "-p", "4", "-m", "4", "--waves", "0"], "hanayo: waves must be >= 1"),
    (["show", "hanayo", "-p", "8", "-m", "8", "--waves", "8", "--layers", "64"],
     "use at least 128 layers or waves <= 4"),
    (["show", "chimera", "-p", "4", "-m", "4", "--group-size", "2"],
     "chimera does not take --group-size; its parameters are devices, microbatches, "
     "variant=direct, pipelines=2"),
    (["show", "chimera", "-p", "4", "-m", "4", "--param", "pairs=serial"],
     "chimera does not take --param pairs=..."),
    (["show", "chimera", "-p", "4", "-m", "4", "--param", "pairs"],
     "--param 'pairs': expected NAME=VALUE, e.g. pairs=serial"),
    (["show", "hanayo", "-p", "4", "-m", "4", "--waves", "2", "--param", "waves=3"],
     "--param waves=3: waves is given twice"),
    (["show", "1f1b", "-p", "4", "-m", "4", "--stage-layers-ratio", "1:2:3"],
     "stage_layers_ratio 1:2:3 has 3 groups, which do not divide the 4 stages evenly"),
    (["eval", "chimera", "-p", "4", "-m", "4", "--level", "table", "--comm", "1"],
     "--level table has no communication; drop --comm/--model/--system or use --level "
     "simulation"),
    (["eval", "chimera", "-p", "4", "-m", "4", "--level", "simulation"],
     "--level simulation needs --comm"),
    (["list", "chimaera"], "unknown schedule family 'chimaera' (did you mean 'chimera'?)"),
])
def test_bad_family_input_is_one_line_and_exit_1(cli, argv, message):
    code, out, err = cli(*argv)
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith("Error: ")
    assert message in err


@pytest.mark.parametrize("param, message", [
    ("costs=1", "--param costs=1: costs is not a family parameter here: the options describe "
                "the costs (--model and --system, or the slot lengths)"),
    ("p2p=1", "--param p2p=1: p2p is not a family parameter here: use --p2p"),
    ("torch_legacy=1", "--param torch_legacy=1: torch_legacy is not a family parameter here: "
                       "use --torch-legacy"),
    ("schedule=x", "--param schedule=x: schedule is not a family parameter here: the "
                   "SCHEDULE argument names the family or the table file"),
])
def test_a_param_the_command_sets_itself_is_one_line(cli, param, message):
    code, _, err = cli("eval", "1f1b", "-p", "2", "-m", "4", "--param", param)
    assert code == 1 and err.strip() == f"Error: {message}"


def test_param_memory_budget_is_the_memory_budget(cli):
    """The README's other spelling of --memory-budget (for zb-auto): the same table."""
    common = ("eval", "zb-auto", "-p", "8", "-m", "32", "--model", "paper-128l", "--system",
              "slow_nw_mid_cp", "--recompute", "full", "--json")
    code, by_param, _ = cli(*common, "--param", "memory_budget=80GB")
    assert code == 0
    code, by_option, _ = cli(*common, "--memory-budget", "80GB")
    assert code == 0 and by_param == by_option
    code, _, err = cli(*common, "--param", "memory_budget=80GB", "--memory-budget", "80GB")
    assert code == 1 and "the memory budget is given twice (--memory-budget)" in err
    code, _, err = cli("show", "1f1b", "-p", "2", "-m", "2", "--param", "memory_budget=1")
    assert code == 1 and "--param memory_budget=1: this command takes no memory budget" in err
