"""``tabsched list``, ``show`` and ``convert``: the families and their tables."""

import shutil
import textwrap

import click

from tabsched.cli.build import load_with_torch
from tabsched.cli.format import echo_json, translate_errors
from tabsched.cli.options import (SectionedCommand, complete_schedule, schedule_options,
                                  torch_options)
from tabsched.files import atomic_write, check_output_path
from tabsched.formats import find_format, get_format
from tabsched.formats.pytorch_csv import pytorch_text
from tabsched.formats.pytorch_ranks import describe_stage_map, pytorch_refusal
from tabsched.formats.table_csv import csv_loss, csv_omits
from tabsched.schedules import describe_parameters, families, get_family

#: The formats of the registry (:mod:`tabsched.formats`) that ``show`` prints.
SHOW_FORMATS = ("grid", "csv", "json")
DROP_METADATA_HELP = ("Write a CSV even if it cannot hold what the table's numbers depend on "
                      "(microbatch sizes, layers per stage): the cells alone.")


def refuse_csv_loss(table, what, keep, drop_metadata):
    """One-line refusal when a CSV would lose part of ``table``, saying how to go on."""
    lost = [] if drop_metadata else csv_loss(table)
    if lost:
        raise click.ClickException(f"{what} cannot hold {'; '.join(lost)}: {keep} to keep "
                                   f"them, or add --drop-metadata to write the cells alone")


@click.command("list", cls=SectionedCommand)
@click.argument("name", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print the families as JSON.")
@translate_errors
def list_command(name, as_json):
    """List the schedule families with their parameters and constraints.

    With NAME, only that family, with the help of every parameter.
    """
    chosen = [get_family(name)] if name else families()
    rows = [{"name": family.name, "summary": family.summary,
             "parameters": [{"name": p.name, "default": p.default, "help": p.help}
                            for p in family.parameters],
             "constraints": family.constraints, "notes": family.notes,
             "aliases": list(family.aliases), "cost_driven": family.cost_driven}
            for family in chosen]
    if as_json:
        echo_json(rows)
        return
    width = max(60, shutil.get_terminal_size((100, 24)).columns)
    for index, family in enumerate(chosen):
        if index:
            click.echo("")
        click.echo(textwrap.fill(f"{family.name}: {family.summary}", width=width,
                                 subsequent_indent="  "))
        click.echo(textwrap.fill(describe_parameters(family), width=width,
                                 initial_indent=f"  {'parameters:':<12} ",
                                 subsequent_indent=" " * 15))
        if name:
            for parameter in family.parameters:
                click.echo(textwrap.fill(parameter.help, width=width,
                                         initial_indent=f"    {parameter.name}: ",
                                         subsequent_indent=" " * 8))
        built = ("costs: its order is searched for the costs given (--f/--i/--w/--comm or "
                 "--model/--system; --memory-budget)" if family.cost_driven else "")
        for label, text in [("built from:", built), ("valid:", family.constraints),
                            ("notes:", family.notes),
                            ("also called:", ", ".join(family.aliases))]:
            if text:
                click.echo(textwrap.fill(text, width=width, initial_indent=f"  {label:<12} ",
                                         subsequent_indent=" " * 15))
    click.echo("")
    click.echo(textwrap.fill(
        "Every family also takes --stage-layers, --stage-layers-ratio and --layers (how the "
        "model's layers split over its stages); --param NAME=VALUE passes any parameter "
        "without an option of its own. Families 'built from: costs' depend on the costs: "
        "the same sizes give different tables under different costs, so they need cost "
        "options (eval, plot, trace, adapt) and show and convert cannot build them.",
        width=width))


@click.command("show", cls=SectionedCommand)
@click.argument("schedule", shell_complete=complete_schedule)
@schedule_options
@click.option("--format", "output", type=click.Choice(SHOW_FORMATS), default="grid",
              show_default=True, help="How to print the table.")
@click.option("--width", type=int, help="Columns for the grid (default: the terminal's).")
@click.option("--drop-metadata", is_flag=True, help=DROP_METADATA_HELP)
@torch_options
@translate_errors
def show_command(schedule, schedule_params, output, width, drop_metadata, torch_legacy, p2p):
    """Print the table of SCHEDULE."""
    table, torch_schedule = load_with_torch(schedule, torch_legacy, p2p, **schedule_params)
    chosen = get_format(output)
    if chosen.cells_only:
        refuse_csv_loss(table, f"--format {output}", "use --format json", drop_metadata)
    click.echo(chosen.dump(table, width=width, drop_metadata=True), nl=False)
    if chosen.cells_only:
        for lost in (csv_loss(table) if drop_metadata else []) + csv_omits(table):
            click.echo(f"note: the CSV leaves out {lost}", err=True)
    if not chosen.suffixes:   # the view for people (the grid): also the stage map and notes
        columns = width or shutil.get_terminal_size((120, 24)).columns
        click.echo(textwrap.fill(f"stage map: {describe_stage_map(table)}", width=columns,
                                 subsequent_indent="  "))
        for note in torch_schedule.notes if torch_schedule else ():
            click.echo(textwrap.fill(f"note: {note}", width=columns, subsequent_indent="  "))


#: The formats of the registry (:mod:`tabsched.formats`) that ``convert`` writes.
CONVERT_TARGETS = ("csv", "json", "torch-comms")


@click.command("convert", cls=SectionedCommand)
@click.argument("schedule", shell_complete=complete_schedule)
@click.argument("output", required=False, type=click.Path(dir_okay=False))
@schedule_options
@click.option("--out", "-o", "out", metavar="FILE", type=click.Path(dir_okay=False),
              help="OUTPUT as an option, as every command that writes takes it.")
@click.option("--to", "target", type=click.Choice(CONVERT_TARGETS),
              help="csv: PyTorch compute_only; json: tabsched's table with its metadata; "
                   "torch-comms: PyTorch compute_comms, lowered as PyTorch's runtime does. "
                   "Default: from OUTPUT's suffix (.json, else csv).")
@click.option("--drop-metadata", is_flag=True, help=DROP_METADATA_HELP)
@torch_options
@translate_errors
def convert_command(schedule, output, schedule_params, out, target, drop_metadata, torch_legacy,
                    p2p):
    """Write SCHEDULE (a family or a .csv/.json file) to OUTPUT or -o FILE ("-": stdout).

    A CSV holds the cells only: a table with microbatch sizes or layers per stage
    is refused unless --drop-metadata, and the family label is left out with a
    note; .json keeps everything. The file is replaced only once written in full.
    """
    if output is not None and out is not None and output != out:
        raise click.UsageError(f"give the output once: OUTPUT {output!r} or -o {out!r}")
    output = output if output is not None else out
    if output is None:
        raise click.UsageError("convert needs OUTPUT (or -o FILE; '-' for stdout)")
    if output != "-":
        check_output_path(output, inputs=(schedule,))
    table, torch_schedule = load_with_torch(schedule, torch_legacy, p2p, **schedule_params)
    if target is None:
        target = (find_format(output, role="dumps") or get_format("csv")).name
    chosen = get_format(target)
    if chosen.pytorch is None:
        text = chosen.dump(table)
    else:   # a PyTorch schedule: what its runtime can run, in its bytes
        refusal = pytorch_refusal(table)
        if refusal is not None:
            raise click.ClickException(f"{refusal}; write .json (--to json) to keep it")
        refuse_csv_loss(table, f"{output}: a CSV" if output != "-" else "a CSV",
                        "write a .json table (--to json)", drop_metadata)
        text = pytorch_text(table, format=chosen.pytorch, drop_metadata=True)
    notes = list(torch_schedule.notes) if torch_schedule else []
    if torch_schedule is not None and torch_schedule.format == "compute_comms":
        notes.append("the file's own SEND/RECV positions are not written: "
                     + ("PyTorch's lowering placed them anew" if target == "torch-comms"
                        else "the output holds the compute cells"))
    if output == "-":
        click.echo(text, nl=False)
    else:
        atomic_write(output, text, newline="")
        click.echo(f"wrote {output} ({target}, {table.num_devices} devices, "
                   f"{table.num_stages} stages, {table.num_microbatches} microbatches)", err=True)
    if chosen.cells_only:
        notes.extend(f"the CSV leaves out {lost}"
                     for lost in (csv_loss(table) if drop_metadata else []) + csv_omits(table))
    for note in notes:
        click.echo(f"note: {note}", err=True)
