"""``tabsched plot`` (gantt, memory, sweep) and ``tabsched trace``: pictures and traces."""


import click

from tabsched.cli.build import prepare_evaluation, run_evaluation
from tabsched.cli.format import translate_errors
from tabsched.cli.options import SectionedCommand, complete_schedule, evaluation_options


@click.group("plot")
def plot_group():
    """Draw pictures: gantt, memory (of an evaluated table), sweep (of a sweep CSV)."""


def _picture_output(command):
    return click.option("--out", "-o", required=True, metavar="FILE",
                        help="Picture to write: .png, .svg or .pdf.")(command)


@plot_group.command("gantt", cls=SectionedCommand)
@click.argument("schedule", shell_complete=complete_schedule)
@evaluation_options
@_picture_output
@click.option("--no-transfers", is_flag=True, help="Leave out the link lanes.")
@click.option("--labels/--no-labels", default=None,
              help="Label ops (default: when at most 600 are in view).")
@click.option("--time-range", metavar="START:END",
              help="Zoom on this span of the iteration, e.g. 0:2.5 (slots) or 1.2s:1.5s "
                   "(with --model/--system).")
@click.option("--downsample/--no-downsample", default=None,
              help="Draw runs of columns of the dominant kind, the critical path as a "
                   "stripe (default: when ops are under a few pixels wide).")
@translate_errors
def plot_gantt_command(schedule, schedule_params, evaluation, out, no_transfers, labels,
                       time_range, downsample):
    """A Gantt chart of SCHEDULE: a lane per device and per link, the critical path outlined."""
    from tabsched.plot import check_picture_path, gantt
    check_picture_path(out, inputs=(schedule,))
    table, torch_schedule, costs = prepare_evaluation(schedule, schedule_params, evaluation)
    result = run_evaluation(table, torch_schedule, costs, evaluation)
    span = None if time_range is None else _parse_time_range(time_range, result.time_unit)
    gantt(result, out, transfers=not no_transfers, labels=labels, time_range=span,
          downsample=downsample)
    click.echo(f"wrote {out}", err=True)


def _parse_time_range(text, time_unit):
    """``(start, end)`` of ``--time-range START:END`` in the result's time unit."""
    from tabsched.costs.units import parse_quantity
    head, colon, tail = text.partition(":")
    if not colon:
        raise click.ClickException(f"--time-range {text!r}: expected START:END, e.g. 0:2.5")
    try:
        if time_unit == "s":
            return (parse_quantity(head, "s", name="--time-range start"),
                    parse_quantity(tail, "s", name="--time-range end"))
        return float(head), float(tail)
    except ValueError:
        raise click.ClickException(f"--time-range {text!r}: expected START:END in "
                                   f"{time_unit}, e.g. 0:2.5") from None


@plot_group.command("memory", cls=SectionedCommand)
@click.argument("schedule", shell_complete=complete_schedule)
@evaluation_options
@_picture_output
@translate_errors
def plot_memory_command(schedule, schedule_params, evaluation, out):
    """Memory over time per device of SCHEDULE, with --memory-budget as a line."""
    from tabsched.plot import check_picture_path, memory_plot
    check_picture_path(out, inputs=(schedule,))
    table, torch_schedule, costs = prepare_evaluation(schedule, schedule_params, evaluation)
    result = run_evaluation(table, torch_schedule, costs, evaluation)
    memory_plot(result, out)
    click.echo(f"wrote {out}", err=True)


@plot_group.command("sweep", cls=SectionedCommand)
@click.argument("csv_file", metavar="SWEEP.csv")
@_picture_output
@click.option("--devices", "-p", type=int, help="The pipeline depth to plot (if several).")
@click.option("--metric", default="simulation_makespan_s", show_default=True,
              help="A numeric column of the sweep CSV.")
@click.option("--log-x/--linear-x", "logx", default=True, show_default=True,
              help="Microbatches on a log2 axis.")
@click.option("--log-y/--linear-y", "logy", default=False, show_default=True,
              help="The metric on a log axis.")
@click.option("--capacity/--no-capacity", default=None,
              help="Draw each system's memory capacity (default: on memory metrics).")
@translate_errors
def plot_sweep_command(csv_file, out, devices, metric, logx, logy, capacity):
    """A metric against microbatches: a line per configuration, a panel per system.

    One panel when the metric does not depend on the system (formula and table levels).
    """
    from tabsched.plot import check_picture_path, sweep_plot
    from tabsched.sweeps import COLUMNS, read_sweep_csv
    check_picture_path(out, inputs=(csv_file,))
    numeric = [c for c in COLUMNS if c.startswith(("formula_", "table_", "simulation_"))]
    if metric not in numeric:
        what = ("a configuration column, not a metric" if metric in COLUMNS
                else "not a sweep column")
        raise click.ClickException(f"--metric {metric!r} is {what}; numeric columns: "
                                   + ", ".join(numeric))
    sweep_plot(read_sweep_csv(csv_file), out, devices=devices, metric=metric, logx=logx,
               logy=logy, capacity=capacity)
    click.echo(f"wrote {out}", err=True)


@click.command("trace", cls=SectionedCommand)
@click.argument("schedule", shell_complete=complete_schedule)
@evaluation_options
@click.option("--out", "-o", required=True, metavar="FILE.json",
              help="Chrome trace / Perfetto JSON to write.")
@translate_errors
def trace_command(schedule, schedule_params, evaluation, out):
    """Export one simulated iteration of SCHEDULE as a Perfetto / Chrome trace."""
    from tabsched.files import check_output_path
    from tabsched.formats.perfetto import write_trace
    check_output_path(out, inputs=(schedule,))
    table, torch_schedule, costs = prepare_evaluation(schedule, schedule_params, evaluation)
    result = run_evaluation(table, torch_schedule, costs, evaluation)
    write_trace(result, out)
    click.echo(f"wrote {out}: open it in https://ui.perfetto.dev", err=True)
