"""The ``tabsched`` command line: parse, call the library, print.

Machine output (``--json``) goes to stdout; progress and errors to stderr. Every
error is one line, ``Error: <what and where>``, and exit status 1.
"""

import functools
import json
import os
import sys

import click

from tabsched.costs import StageCosts, UnitCosts
from tabsched.evaluate import evaluate
from tabsched.exceptions import TabschedError
from tabsched.io import TABLE_SUFFIXES, read_table, render_grid, to_csv, to_json
from tabsched.lower import CONTENTION_MODES
from tabsched.pytorch import (P2P_MODES, describe_stage_map, read_pytorch, to_compute_comms,
                              to_compute_only)
from tabsched.schedules import describe_parameters, families, generate, get_family


# ------------------------------------------------------------------ plumbing
def translate_errors(command):
    """Turn library errors into one-line ClickExceptions (exit 1)."""
    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except TabschedError as error:
            raise click.ClickException(str(error)) from None
        except OSError as error:
            where = f"{error.filename}: " if error.filename else ""
            raise click.ClickException(f"{where}{error.strerror or error}") from None
    return wrapper


def schedule_options(command):
    """Options that pick a table: a family's parameters (a FILE ignores them)."""
    options = [
        click.option("--devices", "-p", type=int, help="Pipeline depth (number of devices)."),
        click.option("--microbatches", "-m", type=int, help="Microbatches per iteration."),
        click.option("--chunks", "-v", type=int, help="Model chunks per device (multi-chunk families)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def is_table_file(schedule):
    return os.path.splitext(schedule)[1].lower() in TABLE_SUFFIXES or os.path.exists(schedule)


def load_schedule(schedule, **params):
    """A table from a family name and its parameters, or from a .csv/.json file."""
    if is_table_file(schedule):
        return read_table(schedule)
    family = get_family(schedule)
    accepted = set(family.parameter_names())
    given = {key: value for key, value in params.items() if value is not None}
    ignored = sorted(set(given) - accepted)
    if ignored:
        flags = ", ".join("--" + name.replace("_", "-") for name in ignored)
        raise click.ClickException(f"{family.name} does not take {flags}; its parameters "
                                   f"are {describe_parameters(family)}")
    missing = [name for name in ("devices", "microbatches")
               if name in accepted and name not in given]
    if missing:
        flags = " and ".join(f"--{name}" for name in missing)
        raise click.ClickException(f"{family.name} needs {flags}")
    return generate(family.name, **given)


def torch_options(command):
    """Options for reading PyTorch's CSV files."""
    options = [
        click.option("--torch-legacy", is_flag=True,
                     help="Read a .csv in PyTorch's legacy tokens (B = input-grad, BW = full "
                          "backward)."),
        click.option("--p2p", type=click.Choice(P2P_MODES), default="ordered", show_default=True,
                     help="compute_comms files: ordered = the SEND/RECV between two devices run "
                          "in the order each lists them; free = each SEND/RECV pair on its own."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def load_with_torch(schedule, torch_legacy, p2p, **params):
    """``(table, TorchSchedule or None)``: a .csv is read as PyTorch writes it."""
    if is_table_file(schedule) and os.path.splitext(schedule)[1].lower() == ".csv":
        torch_schedule = read_pytorch(schedule, legacy=torch_legacy, p2p=p2p)
        return torch_schedule.table, torch_schedule
    return load_schedule(schedule, **params), None


def echo_json(data):
    click.echo(json.dumps(data, indent=1, default=_json_default))


def _json_default(value):
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _number(value):
    return f"{value:.6g}"


# ------------------------------------------------------------------ commands
@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tabsched")
def cli():
    """Compare and improve pipeline-parallel schedules without GPUs.

    A SCHEDULE is a family name (see `tabsched list`) or a .csv/.json table file.
    """


@cli.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the families as JSON.")
@translate_errors
def list_command(as_json):
    """List the schedule families with their parameters and constraints."""
    rows = [{"name": family.name, "summary": family.summary,
             "parameters": [{"name": p.name, "default": p.default, "help": p.help}
                            for p in family.parameters],
             "constraints": family.constraints, "notes": family.notes,
             "aliases": list(family.aliases)} for family in families()]
    if as_json:
        echo_json(rows)
        return
    for row, family in zip(rows, families()):
        click.echo(f"{family.name}: {family.summary}")
        click.echo(f"  parameters:  {describe_parameters(family)}")
        if family.constraints:
            click.echo(f"  valid:       {family.constraints}")
        if family.notes:
            click.echo(f"  notes:       {family.notes}")
        if family.aliases:
            click.echo(f"  also called: {', '.join(family.aliases)}")


@cli.command("show")
@click.argument("schedule")
@schedule_options
@click.option("--format", "output", type=click.Choice(["grid", "csv", "json"]), default="grid",
              show_default=True, help="How to print the table.")
@click.option("--width", type=int, help="Columns for the grid (default: the terminal's).")
@torch_options
@translate_errors
def show_command(schedule, devices, microbatches, chunks, output, width, torch_legacy, p2p):
    """Print the table of SCHEDULE."""
    table, torch_schedule = load_with_torch(schedule, torch_legacy, p2p, devices=devices,
                                            microbatches=microbatches, chunks=chunks)
    if output == "csv":
        click.echo(to_csv(table), nl=False)
    elif output == "json":
        click.echo(to_json(table, indent=1))
    else:
        click.echo(render_grid(table, width=width))
        click.echo(f"stage map: {describe_stage_map(table)}")
        for note in torch_schedule.notes if torch_schedule else ():
            click.echo(f"note: {note}")


def cost_options(command):
    options = [
        click.option("--f", "forward", type=float, help="Forward length (default 1)."),
        click.option("--b", "backward", type=float, help="Full backward length (default 1)."),
        click.option("--i", "input_grad", type=float, help="Input-grad length (default 1)."),
        click.option("--w", "weight_grad", type=float, help="Weight-grad length (default 1)."),
        click.option("--comm", type=float,
                     help="Time of every transfer; turns the table into a simulation."),
        click.option("--contention", type=click.Choice(CONTENTION_MODES[:2]), default="none",
                     show_default=True,
                     help="none: transfers never wait; link: one FIFO per directed device pair."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def build_costs(forward, backward, input_grad, weight_grad, comm, contention):
    lengths = {"f": forward, "b": backward, "i": input_grad, "w": weight_grad}
    given = {key: value for key, value in lengths.items() if value is not None}
    if comm is None:
        return UnitCosts(**given)
    unit = UnitCosts(**given).lengths
    return StageCosts(unit[0], unit[1], unit[2], unit[3], comm=comm, contention=contention,
                      time_unit="slots")


@cli.command("eval")
@click.argument("schedule")
@schedule_options
@cost_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
@torch_options
@translate_errors
def eval_command(schedule, devices, microbatches, chunks, forward, backward, input_grad,
                 weight_grad, comm, contention, as_json, torch_legacy, p2p):
    """Evaluate SCHEDULE and summarise time, idle and memory per device."""
    table, torch_schedule = load_with_torch(schedule, torch_legacy, p2p, devices=devices,
                                            microbatches=microbatches, chunks=chunks)
    costs = build_costs(forward, backward, input_grad, weight_grad, comm, contention)
    if torch_schedule is not None:
        result = torch_schedule.evaluate(costs, contention=contention)
    else:
        result = evaluate(table, costs, contention=contention)
    if as_json:
        echo_json(result.to_dict())
        return
    click.echo(summary(result))


def summary(result):
    """A short human summary of a Result."""
    table = result.table
    name = table.family or "table"
    params = " ".join(f"{key}={value}" for key, value in table.params.items())
    costs = " ".join(f"{key}={value}" for key, value in result.costs.items() if key != "model")
    lines = [f"{name} {params}".rstrip() + f": {table.num_devices} devices, "
             f"{table.num_stages} stages, {table.num_microbatches} microbatches, "
             f"{len(table)} ops",
             f"level         {result.level} ({result.costs.get('model')} {costs}; "
             f"contention {result.contention})"]
    unit = result.time_unit
    lines.append(f"makespan      {_number(result.makespan)} {unit}")
    bubble = f"bubble ratio  {result.bubble_ratio:.2%}"
    if result.formula and result.formula.get("bubble_ratio") is not None:
        bubble += f"   (formula level: {result.formula['bubble_ratio']:.2%})"
    lines.append(bubble)
    path = result.critical_path
    ops = sum(1 for step in path if step.kind == "op")
    lines.append(f"critical path {ops} ops, {len(path) - ops} transfers")
    header = ["device", "busy", "idle", "warm-up", "inside", "cool-down",
              f"peak memory ({result.memory_unit})"]
    body = [[f"d{d.device}", _number(d.busy), _number(d.idle), _number(d.warmup),
             _number(d.inside), _number(d.cooldown), _number(d.peak_memory)]
            for d in result.devices]
    widths = [max(len(row[k]) for row in [header] + body) for k in range(len(header))]
    for row in [header] + body:
        lines.append("  ".join(cell.rjust(widths[k]) if k else cell.ljust(widths[k])
                               for k, cell in enumerate(row)).rstrip())
    lines.extend(f"note: {note}" for note in result.notes)
    return "\n".join(lines)


CONVERT_TARGETS = ("csv", "json", "torch-comms")


@cli.command("convert")
@click.argument("schedule")
@click.argument("output")
@schedule_options
@click.option("--to", "target", type=click.Choice(CONVERT_TARGETS),
              help="csv: PyTorch compute_only; json: tabsched's table with its metadata; "
                   "torch-comms: PyTorch compute_comms, lowered as PyTorch's runtime does. "
                   "Default: from OUTPUT's suffix (.json, else csv).")
@torch_options
@translate_errors
def convert_command(schedule, output, devices, microbatches, chunks, target, torch_legacy, p2p):
    """Write SCHEDULE (a family or a .csv/.json file) to OUTPUT ("-": stdout)."""
    table, torch_schedule = load_with_torch(schedule, torch_legacy, p2p, devices=devices,
                                            microbatches=microbatches, chunks=chunks)
    if target is None:
        target = "json" if os.path.splitext(output)[1].lower() == ".json" else "csv"
    if target == "json":
        text = to_json(table, indent=1) + "\n"
    elif target == "csv":
        text = to_compute_only(table)
    else:
        text = to_compute_comms(table)
    notes = list(torch_schedule.notes) if torch_schedule else []
    if torch_schedule is not None and torch_schedule.format == "compute_comms":
        notes.append("the file's own SEND/RECV positions are not written: "
                     + ("PyTorch's lowering placed them anew" if target == "torch-comms"
                        else "the output holds the compute cells"))
    if output == "-":
        click.echo(text, nl=False)
    else:
        with open(output, "w", newline="") as handle:
            handle.write(text)
        click.echo(f"wrote {output} ({target}, {table.num_devices} devices, "
                   f"{table.num_stages} stages, {table.num_microbatches} microbatches)", err=True)
    for note in notes:
        click.echo(f"note: {note}", err=True)


def main(argv=None):
    """Entry point: every error is one line on stderr and exit status 1."""
    try:
        cli.main(args=argv, prog_name="tabsched", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("Error: aborted", err=True)
        sys.exit(1)
    except click.exceptions.NoArgsIsHelpError as error:
        click.echo(error.ctx.get_help() if error.ctx else str(error))
        sys.exit(0)
    except click.ClickException as error:
        click.echo(f"Error: {error.format_message()}", err=True)
        sys.exit(1)
    except BrokenPipeError:
        sys.exit(1)
    sys.exit(0)
