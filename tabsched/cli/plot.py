"""``tabsched plot`` (gantt, memory, sweep) and ``tabsched trace``: pictures and traces."""


import click

from tabsched.cli.format import translate_errors
from tabsched.cli.options import evaluation_options, prepare_evaluation, run_evaluation


@click.group("plot")
def plot_group():
    """Draw pictures: gantt, memory (of an evaluated table), sweep (of a sweep CSV)."""


def _picture_output(command):
    return click.option("--out", "-o", required=True, metavar="FILE",
                        help="Picture to write: .png, .svg or .pdf.")(command)


@plot_group.command("gantt")
@click.argument("schedule")
@evaluation_options
@_picture_output
@click.option("--no-transfers", is_flag=True, help="Leave out the link lanes.")
@click.option("--labels/--no-labels", default=None, help="Label ops (default: small tables).")
@translate_errors
def plot_gantt_command(schedule, schedule_params, evaluation, out, no_transfers, labels):
    """A Gantt chart of SCHEDULE: a lane per device and per link, the critical path outlined."""
    from tabsched.plot import check_picture_path, gantt
    check_picture_path(out)
    table, torch_schedule, costs = prepare_evaluation(schedule, schedule_params, evaluation)
    result = run_evaluation(table, torch_schedule, costs, evaluation)
    gantt(result, out, transfers=not no_transfers, labels=labels)
    click.echo(f"wrote {out}", err=True)


@plot_group.command("memory")
@click.argument("schedule")
@evaluation_options
@_picture_output
@translate_errors
def plot_memory_command(schedule, schedule_params, evaluation, out):
    """Memory over time per device of SCHEDULE, with --memory-budget as a line."""
    from tabsched.plot import check_picture_path, memory_plot
    check_picture_path(out)
    table, torch_schedule, costs = prepare_evaluation(schedule, schedule_params, evaluation)
    result = run_evaluation(table, torch_schedule, costs, evaluation)
    memory_plot(result, out)
    click.echo(f"wrote {out}", err=True)


@plot_group.command("sweep")
@click.argument("csv_file", metavar="SWEEP.csv")
@_picture_output
@click.option("--devices", "-p", type=int, help="The pipeline depth to plot (if several).")
@click.option("--metric", default="simulation_makespan_s", show_default=True,
              help="A numeric column of the sweep CSV.")
@translate_errors
def plot_sweep_command(csv_file, out, devices, metric):
    """Iteration time against microbatches, a line per family and a panel per system."""
    from tabsched.plot import check_picture_path, sweep_plot
    from tabsched.sweep import COLUMNS, read_sweep_csv
    check_picture_path(out)
    if metric not in COLUMNS:
        raise click.ClickException(f"--metric {metric!r} is not a sweep column; numeric columns: "
                                   + ", ".join(c for c in COLUMNS if c.startswith(
                                       ("formula_", "table_", "simulation_"))))
    sweep_plot(read_sweep_csv(csv_file), out, devices=devices, metric=metric)
    click.echo(f"wrote {out}", err=True)


@click.command("trace")
@click.argument("schedule")
@evaluation_options
@click.option("--out", "-o", required=True, metavar="FILE.json",
              help="Chrome trace / Perfetto JSON to write.")
@translate_errors
def trace_command(schedule, schedule_params, evaluation, out):
    """Export one simulated iteration of SCHEDULE as a Perfetto / Chrome trace."""
    from tabsched.io import check_output_path
    from tabsched.trace import write_trace
    check_output_path(out)
    table, torch_schedule, costs = prepare_evaluation(schedule, schedule_params, evaluation)
    result = run_evaluation(table, torch_schedule, costs, evaluation)
    write_trace(result, out)
    click.echo(f"wrote {out}: open it in https://ui.perfetto.dev", err=True)
