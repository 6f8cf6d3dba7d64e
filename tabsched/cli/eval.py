"""``tabsched eval``: one table at one level, with Monte Carlo on request."""


import click

from tabsched.cli.build import monte_carlo_from_options, prepare_evaluation, run_evaluation
from tabsched.cli.format import (OverBudget, check_html_path, echo_json, formula_summary,
                                 monte_carlo_summary, summary, translate_errors,
                                 write_html_report)
from tabsched.cli.options import (LEVELS, SectionedCommand, complete_schedule, evaluation_options,
                                  html_option, slice_partition_option, variation_options)
from tabsched.exceptions import MemoryBudgetError
from tabsched.formulas import formula_level


@click.command("eval", cls=SectionedCommand)
@click.argument("schedule", shell_complete=complete_schedule)
@evaluation_options
@click.option("--level", type=click.Choice(LEVELS),
              help="formula: only the family's closed forms; table: unit slots, no "
                   "communication; simulation: needs --comm or --model/--system. Default: "
                   "table, or simulation with --comm or --model/--system.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
@click.option("--sequence-slices", "sequence_slices", type=int, metavar="K",
              help="Cut each sequence into K slices first (Seq1F1B: forwards in slice order, "
                   "backwards reversed, rows interleaved at slice grain); K must divide the "
                   "model's sequence. Needs --model and --system.")
@click.option("--slice-lead", type=click.Choice(["seq1f1b", "kept"]), default="seq1f1b",
              show_default=True,
              help="--sequence-slices: Seq1F1B's short warm-up (least memory) or the "
                   "unsliced row's lead at slice grain.")
@slice_partition_option
@variation_options(default_samples=None)
@html_option("the evaluated run")
@translate_errors
def eval_command(schedule, schedule_params, evaluation, level, as_json, sequence_slices,
                 slice_lead, slice_partition, variation_params, html_path):
    """Evaluate SCHEDULE and summarise time, idle and memory per device.

    With --model and --system, times are seconds and memory is bytes. The summary
    shows the formula level's numbers beside the table's or the simulation's,
    marked as such; --level formula prints them alone. With --cv, --straggler,
    --slow-link, --replay or --samples, Monte Carlo figures follow: mean, p50,
    p95 and max makespan and the run-time bubble, per device too.
    """
    if html_path:
        if level == "formula":
            raise click.ClickException(f"--html {html_path}: --level formula has no times "
                                       f"per operation to draw; drop --html or use --level "
                                       f"table or simulation")
        check_html_path(html_path, inputs=(schedule, evaluation["execution"],
                                           evaluation["model"], evaluation["system"],
                                           variation_params["replay"]))
    table, torch_schedule, costs = prepare_evaluation(schedule, schedule_params, evaluation,
                                                      level)
    check_partition(slice_partition, sequence_slices)
    if sequence_slices is not None:
        table = _sliced(table, torch_schedule, costs, sequence_slices, slice_lead, level,
                        slice_partition)
    if level == "formula" and (any(variation_params[name] for name in
                                   ("cv", "transfer_cv", "stragglers", "slow_links", "replay",
                                    "replay_partial"))
                               or variation_params["samples"] is not None):
        raise click.ClickException("--level formula has no run-time variation; drop --cv, "
                                   "--straggler, --slow-link, --replay and --samples")
    if level == "formula":
        numbers, omitted = formula_level(table, costs)
        if numbers is None:
            what = (omitted or f"family {table.family!r} has no formula level" if table.family
                    else "the table names no family, so it has no formula level")
            raise click.ClickException(what)
        if as_json:
            described = costs.describe()
            echo_json({**numbers, "model": described.get("transformer")
                       or described.get("model"), "system": described.get("system"),
                       "costs": described, "execution": costs.execution.to_dict()})
        else:
            click.echo(formula_summary(table, numbers))
        return
    result = run_evaluation(table, torch_schedule, costs, evaluation)
    runs = monte_carlo_from_options(
        table, costs, variation_params,
        **({"transfer_after": torch_schedule.transfer_after,
            "shard_windows": torch_schedule.shard_windows} if torch_schedule else {}))
    if html_path:
        write_html_report(result, html_path, monte_carlo=runs)
    if as_json:
        data = result.to_dict()
        if runs is not None:
            data["monte_carlo"] = runs.to_dict()
        echo_json(data)
    else:
        click.echo(summary(result))
        if runs is not None:
            click.echo(monte_carlo_summary(runs))
    if evaluation["strict"]:
        try:
            result.check_memory()
        except MemoryBudgetError as error:
            raise OverBudget(str(error)) from None


def check_partition(partition, slices):
    """``--slice-partition``: one of even, compute, and only beside ``--sequence-slices``."""
    from tabsched.table import SLICE_PARTITIONS
    if partition not in SLICE_PARTITIONS:
        raise click.ClickException(f"--slice-partition {partition!r}: expected one of "
                                   f"{', '.join(SLICE_PARTITIONS)}")
    if partition != "even" and slices is None:
        raise click.ClickException("--slice-partition goes with --sequence-slices")


def check_slices(option, count, costs, partition):
    """Refuse, naming ``option``, a slice count the partition cannot cut the model's
    sequence into."""
    from tabsched.costs.transformer import SLICE_GRANULE
    sequence, name = costs.model.sequence, costs.model.name
    if partition == "even" and sequence % count:
        raise click.ClickException(f"{option} {count}: does not divide model {name}'s "
                                   f"sequence {sequence}")
    if partition == "compute" and count > 1 and sequence < count * SLICE_GRANULE:
        raise click.ClickException(f"--slice-partition compute: model {name}'s sequence "
                                   f"{sequence} cannot give each of {count} slices "
                                   f"{SLICE_GRANULE} tokens")


def _sliced(table, torch_schedule, costs, slices, lead, level, partition="even"):
    """``table`` with its sequences cut into ``slices`` (``--sequence-slices``) by
    ``partition`` (``--slice-partition``)."""
    from tabsched.adapt import SplitSequence
    if slices < 1:
        raise click.ClickException(f"--sequence-slices {slices}: expected an integer >= 1")
    if not hasattr(costs, "slice_view"):
        raise click.ClickException("--sequence-slices: slices need a model with a sequence "
                                   "(give --model and --system)")
    if torch_schedule is not None:
        raise click.ClickException("--sequence-slices: a PyTorch compute_comms schedule runs "
                                   "its own sends; slice a compute_only table")
    if level == "formula":
        raise click.ClickException("--sequence-slices: --level formula has no closed form "
                                   "for sliced tables; use --level simulation")
    check_slices("--sequence-slices", slices, costs, partition)
    return SplitSequence(slices, lead, partition).apply(table, costs)
