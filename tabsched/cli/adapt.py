"""``tabsched adapt``: the granularity search under a memory budget, and its report."""

import json
import os
import shutil
import textwrap

import click
import numpy as np

from tabsched.cli.build import (build_variation, check_layer_options, check_samples,
                                costs_from_options, is_table_file, layers_from_model,
                                load_schedule, memory_budget_value, microbatches_from_execution)
from tabsched.cli.format import (OverBudget, check_html_path, echo_json, format_memory,
                                 format_time, progress_reporter, translate_errors,
                                 write_html_report)
from tabsched.cli.options import (SectionedCommand, complete_schedule, cost_options,
                                  html_option, model_options, schedule_options,
                                  slice_partition_option, variation_options)
from tabsched.files import check_output_path
from tabsched.formats.grid import render_grid
from tabsched.formats.table_json import write_json


@click.command("adapt", cls=SectionedCommand)
@click.argument("schedule", shell_complete=complete_schedule)
@schedule_options
@cost_options
@model_options
@variation_options(default_samples=256)
@click.option("--objective", type=click.Choice(["mean", "p95"]), default="mean",
              show_default=True, help="Which makespan statistic the search lowers.")
@click.option("--split-factor", type=int,
              help="Parts the search splits a microbatch into; must divide its samples "
                   "(default 2, tried where it divides).")
@click.option("--sequence-slices", "sequence_slices", metavar="K[,K...]",
              help="Also try cutting each sequence into K slices (Seq1F1B: forwards in slice "
                   "order, backwards reversed); K must divide the model's sequence. Needs "
                   "--model and --system.")
@slice_partition_option
@click.option("--max-rounds", type=int, default=24, show_default=True,
              help="Greedy steps at most.")
@click.option("--out", "-o", "out_path", metavar="TABLE.json",
              help="Write the adapted table as JSON (it keeps the microbatch sizes of splits).")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar on stderr.")
@click.option("--log", "show_log", is_flag=True,
              help="List every candidate the search tried (in JSON: search.log).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
@html_option("the start and the adapted table's runs, side by side, and the transforms")
@click.option("--follow", "follow_dir", metavar="DIR",
              help="Follow a running job of SCHEDULE: each new entry of DIR (a step's trace "
                   "file, or a folder of per-rank traces) refits the costs, re-plans, and "
                   "says when a changed table pays for its switch; Ctrl-C stops.")
@click.option("--follow-log", metavar="FILE.jsonl",
              help="With --follow: append each switch and skipped entry as a JSON line.")
@click.option("--threshold", type=float, default=0.02, show_default=True,
              help="With --follow: least net saving reported, a fraction of the horizon's time.")
@click.option("--horizon", type=int, default=100, show_default=True,
              help="With --follow: steps a saving is counted over.")
@click.option("--switch-cost", type=float, metavar="SECONDS",
              help="With --follow: what a switch costs (default one iteration of the current "
                   "table, an assumption: see tabsched.adapt.follow).")
@click.option("--max-files", type=int, help="With --follow: stop after this many entries.")
@click.option("--timeout", type=float, metavar="SECONDS",
              help="With --follow: stop after this long.")
@click.option("--poll", type=float, default=1.0, show_default=True,
              help="With --follow: seconds between looks at DIR.")
@translate_errors
def adapt_command(schedule, schedule_params, forward, backward, input_grad, weight_grad, comm,
                  contention, model, system, microbatch_size, recompute, memory_budget, strict,
                  grad_sync, optimizer, variation_params, objective, split_factor,
                  sequence_slices, slice_partition, max_rounds, out_path, quiet, show_log,
                  as_json, html_path, follow_dir, follow_log, threshold, horizon, switch_cost,
                  max_files, timeout, poll, **parallel):
    """Search granularity transforms of SCHEDULE for the fastest table in a memory budget.

    Transforms: deeper or shallower warm-up, split backward with W in idle
    slots, split microbatches (at the pipeline's edges or all), merge them. The
    search minimises the mean (or p95) makespan under the variation options over
    --samples Monte Carlo samples, keeps every device's peak memory within
    --memory-budget, and reports the decision, the gain over SCHEDULE and over
    every reference (each family at the same devices and microbatches, zb-auto
    built for the same costs and budget; on fresh samples), the best reference
    that fits, the headroom left and the table. The search starts from the best
    fitting reference when it beats SCHEDULE, and returns it when it cannot beat
    it. With --strict, exit 3 when nothing fits the budget.
    """
    from tabsched.adapt import SplitMicrobatches, adapt, default_moves
    if follow_dir is not None:
        ignored = [flag for flag, value in (
            ("--model", model), ("--system", system), ("--out", out_path),
            ("--html", html_path), ("--f", forward), ("--b", backward), ("--comm", comm),
            ("--replay", variation_params.get("replay")),
            ("--sequence-slices", sequence_slices),
            ("--slice-partition", None if slice_partition == "even" else slice_partition))
            if value is not None]
        if ignored:
            raise click.ClickException(f"{ignored[0]} does not go with --follow DIR: the costs "
                                       f"and their variation are fitted to the traces")
        return _follow(schedule, schedule_params, follow_dir, follow_log, memory_budget,
                       threshold, horizon, switch_cost, max_files, timeout, poll,
                       variation_params, quiet)
    for name, value in (("--follow-log", follow_log), ("--switch-cost", switch_cost),
                        ("--max-files", max_files), ("--timeout", timeout)):
        if value is not None:
            raise click.ClickException(f"{name} goes with --follow DIR")
    if out_path:
        if os.path.splitext(out_path)[1].lower() != ".json":
            raise click.ClickException(
                f"--out {out_path}: write the adapted table as .json, which keeps the "
                f"microbatch sizes a split gives and the table's metadata; a CSV cannot hold "
                f"them (`tabsched convert adapted.json adapted.csv` says what it would drop)")
        check_output_path(out_path, inputs=(schedule, variation_params.get("replay")))
    if html_path:
        check_html_path(html_path, inputs=(schedule, variation_params.get("replay"),
                                           parallel.get("execution"), model, system),
                        outputs={"--out": out_path})
    if memory_budget is None:
        raise click.ClickException("adapt needs --memory-budget (e.g. 80GB, or 'capacity' "
                                   "with a --system that states its memory)")
    modelled = model is not None or system is not None
    costs = costs_from_options(dict(
        parallel, forward=forward, backward=backward, input_grad=input_grad,
        weight_grad=weight_grad, comm=comm, contention=contention, model=model, system=system,
        microbatch_size=microbatch_size, recompute=recompute, grad_sync=grad_sync,
        optimizer=optimizer), modelled)
    if modelled:
        schedule_params = layers_from_model(schedule_params, costs)
    if not is_table_file(schedule):
        check_layer_options(schedule_params, modelled)
        schedule_params = microbatches_from_execution(schedule_params, costs)
    given = modelled or any(value is not None for value in (
        forward, backward, input_grad, weight_grad, comm))
    table = load_schedule(schedule, costs=costs if given else None,
                          memory_budget=memory_budget_value(memory_budget, costs),
                          **schedule_params)
    if max_rounds < 1:
        raise click.ClickException(f"--max-rounds must be >= 1, not {max_rounds}")
    check_samples(variation_params)
    if split_factor is not None:  # a factor the user chose must fit: say so up front
        SplitMicrobatches("all", split_factor).apply(table, costs)
    split_factor = 2 if split_factor is None else split_factor
    slice_counts = _slice_counts(sequence_slices, costs, modelled, slice_partition)
    variation = build_variation(table, costs=costs, **variation_params)
    budget = memory_budget_value(memory_budget, costs)

    def moves(current):
        return [_with_factor(move, split_factor)
                for move in default_moves(current, sequence_slices=slice_counts,
                                          slice_partition=slice_partition)]

    found = adapt(table, costs, variation, budget, objective=objective,
                  samples=variation_params["samples"], seed=variation_params["seed"],
                  moves=moves, max_rounds=max_rounds,
                  progress=progress_reporter("adapt", quiet=quiet, unit="candidates"))
    if out_path:
        write_json(found.table, out_path)
    if html_path:
        write_html_report(found, html_path, costs=costs)
    if as_json:
        from tabsched.formats.table_json import to_json
        data = found.to_dict(log=show_log)
        data["table"] = json.loads(to_json(found.table))
        described = costs.describe()
        data["model"] = described.get("transformer") or described.get("model")
        data["system"] = described.get("system")
        data["costs"] = described
        data["execution"] = costs.execution.to_dict()
        echo_json(data)
    else:
        click.echo(adapt_summary(found, costs))
        if show_log:
            click.echo(adapt_log(found))
        if out_path:   # the table is in the file; the terminal keeps the decision
            click.echo(f"wrote the adapted table to {out_path} (`tabsched show {out_path}` "
                       f"draws it)")
        else:
            click.echo(render_grid(found.table))
    if not found.feasible:
        click.echo("warning: no table fits the memory budget; the one shown is the closest "
                   "and is over it", err=True)
        if strict:
            raise OverBudget(f"no table within the memory budget "
                             f"{format_memory(found.budget, found.memory_unit)} (--strict)")


def _follow(schedule, schedule_params, directory, log, memory_budget, threshold, horizon,
            switch_cost, max_files, timeout, poll, variation_params, quiet):
    """``adapt --follow``: the loop of :func:`tabsched.adapt.follow.follow`, its lines on
    stdout (skips on stderr), stopped cleanly by Ctrl-C or SIGTERM."""
    from tabsched.adapt.follow import follow
    from tabsched.cli import Terminated
    for name, value, least in (("--horizon", horizon, 1), ("--max-files", max_files, 1)):
        if value is not None and value < least:
            raise click.ClickException(f"{name} must be >= {least}, not {value}")
    for name, value in (("--threshold", threshold), ("--poll", poll), ("--timeout", timeout),
                        ("--switch-cost", switch_cost)):
        if value is not None and not value >= 0:
            raise click.ClickException(f"{name} must be >= 0, not {value}")
    if not os.path.isdir(directory):
        raise click.ClickException(f"--follow {directory}: not a directory")
    if log is not None:
        check_output_path(log)
    table = load_schedule(schedule, **schedule_params)
    budget = None
    if memory_budget is not None:
        try:
            budget = float(memory_budget)
        except ValueError:
            raise click.ClickException(f"--memory-budget {memory_budget}: with --follow, give "
                                       f"a number of stage activations (the fitted costs "
                                       f"know no bytes)") from None

    def report(line):
        click.echo(line, err=line.startswith("skipped "))
    try:
        result = follow(directory, table, memory_budget=budget, threshold=threshold,
                        horizon=horizon, switch_cost=switch_cost, poll=poll,
                        max_files=max_files, timeout=timeout, log=log,
                        samples=min(variation_params.get("samples") or 32, 64),
                        seed=variation_params.get("seed") or 0, report=report)
    except Terminated:
        click.echo("stopped by a signal; the log holds every line whole", err=True)
        return
    click.echo(f"followed {len(result.processed)} entries ({len(result.skipped)} skipped, "
               f"{result.searches} searches, {len(result.switches)} switches reported); "
               f"stopped: {result.stopped}")


def _slice_counts(text, costs, modelled, partition="even"):
    """``--sequence-slices`` as slice counts, each checked against the model's sequence
    (cut by ``--slice-partition``)."""
    from tabsched.cli.eval import check_partition, check_slices
    check_partition(partition, text)
    if text is None:
        return ()
    from tabsched.cli.build import int_list
    counts = int_list("--sequence-slices", text)
    if not modelled:
        raise click.ClickException("--sequence-slices: slices need a model with a sequence "
                                   "(give --model and --system)")
    for count in counts:
        check_slices("--sequence-slices", count, costs, partition)
    return tuple(counts)


def _with_factor(move, factor):
    """A default move with the split factor the user chose."""
    from tabsched.adapt import SplitMicrobatches, SplitPhases
    if isinstance(move, SplitPhases):
        return SplitPhases(factor, move.warmup, move.cooldown)
    if isinstance(move, SplitMicrobatches):
        return SplitMicrobatches(move.microbatches, factor)
    return move


def adapt_summary(found, costs):
    """The decision, the figures of the start, the adapted table and the references."""
    unit, memory_unit = found.time_unit, found.memory_unit
    start = found.baseline.table
    name = start.family or "table"
    params = " ".join(f"{key}={value}" for key, value in start.params.items())
    described = " ".join(f"{key}={value}" for key, value in costs.describe().items()
                         if key != "model")
    lines = [f"adapt {name} {params}".rstrip() + f": {start.num_devices} devices, "
             f"{start.num_microbatches} microbatches ({costs.describe().get('model')} "
             f"{described})",
             f"budget        {format_memory(found.budget, memory_unit)} per device; objective "
             f"{found.objective} makespan over {found.samples} samples (search seed "
             f"{found.seed}, figures below on seed {found.validation_seed})",
             f"variation     {_describe_variation(found.variation)}"]
    origin = start
    steps = list(found.transforms)
    if found.returned_reference is not None:
        steps = [f"none: the search did not beat the reference {found.returned_reference}, "
                 f"which is returned"]
    elif found.started_from is not None:
        origin = found.references[found.started_from].table \
            if found.started_from in found.references else start
        steps = [f"start from the reference {found.started_from} (it beat {name} on the "
                 f"search's samples)"] + steps
    text = " -> ".join(steps) if steps else (
        f"none: no transform helped ({len(found.log)} candidates tried; the start is best)")
    width = max(60, shutil.get_terminal_size((100, 24)).columns)
    lines.append(textwrap.fill(text, width=width, initial_indent="decision      ",
                               subsequent_indent=" " * 14, break_on_hyphens=False))
    if found.transforms and found.returned_reference is None:
        lines.append(textwrap.fill(_net_change(origin, found.table), width=width,
                                   initial_indent="net           ",
                                   subsequent_indent=" " * 14))
    statuses = {}
    for candidate in found.log:
        statuses[candidate.status] = statuses.get(candidate.status, 0) + 1
    lines.append(f"search        {found.rounds} rounds, {len(found.log)} candidates ("
                 + ", ".join(f"{count} {status}" for status, count in statuses.items())
                 + f") in {found.seconds:.1f} s")
    if not found.feasible:
        worst = int(np.argmax(found.adapted.peak_memory))
        over = found.adapted.peak_memory[worst] - found.budget
        lines.append(f"INFEASIBLE    no candidate fits the budget; the closest is over it by "
                     f"{format_memory(over, memory_unit)} on d{worst}")
    rows = [["", "mean", "p95", "run-time bubble", "peak memory", "fits", "gain"]]
    reports = [(f"baseline ({name})", found.baseline), ("adapted", found.adapted)]
    reports += sorted(((family, report) for family, report in found.references.items()
                       if report is not None),
                      key=lambda pair: (not pair[1].feasible, pair[1].statistic(found.objective)))
    for label, report in reports:
        gain = "" if report is found.adapted else f"{found.gain(report):+.2%}"
        rows.append([label, format_time(report.mean, unit), format_time(report.p95, unit),
                     format_time(report.runtime_bubble, unit),
                     format_memory(max(report.peak_memory), memory_unit),
                     "yes" if report.feasible else "NO", gain])
    widths = [max(len(row[k]) for row in rows) for k in range(len(rows[0]))]
    for row in rows:
        lines.append("  ".join(cell.rjust(widths[k]) if k else cell.ljust(widths[k])
                               for k, cell in enumerate(row)).rstrip())
    lines.append(f"              (gain: 1 - adapted / row, {found.objective} makespan; references "
                 f"that fit first, fastest first)")
    best = found.best_reference
    if best is None:
        lines.append("best ref.     none of the references fits the budget")
    else:
        lines.append(f"best ref.     {best}: the fastest reference that fits; adapted "
                     f"{found.gain(found.references[best]):+.2%} against it")
    for family, error in found.reference_errors.items():
        lines.append(textwrap.shorten(f"{family:<13} not comparable: {error}", width=width,
                                      placeholder=" ..."))
    if found.headroom is not None:
        headroom = found.headroom
        least = int(np.argmin(headroom))
        lines.append(f"headroom      {format_memory(headroom[least], memory_unit)} on d{least} "
                     f"(least); "
                     + " ".join(f"d{d}:{format_memory(value, memory_unit)}"
                                for d, value in enumerate(headroom)))
    return "\n".join(lines)


def _net_change(start, adapted):
    """What the chain of transforms changed, per device, in one line."""
    from tabsched.adapt import deferred_weight_grads, warmup_depths

    def listed(values):
        return ",".join(str(value) for value in values)
    parts = []
    before, after = warmup_depths(start), warmup_depths(adapted)
    if before != after:
        parts.append(f"warm-up per device {listed(before)} -> {listed(after)}")
    before, after = deferred_weight_grads(start), deferred_weight_grads(adapted)
    if np.any(adapted.kind == 3) and before != after:
        parts.append(f"W deferred at most {listed(after)}")
    if start.num_microbatches != adapted.num_microbatches or \
            start.microbatch_sizes != adapted.microbatch_sizes:
        sizes = sorted(set(adapted.microbatch_sizes))
        parts.append(f"{start.num_microbatches} -> {adapted.num_microbatches} microbatches "
                     f"(sizes {', '.join(f'{size:g}' for size in sizes)})")
    if np.any(adapted.kind == 2) and not np.any(start.kind == 2):
        parts.append("backward split into I and W")
    return "; ".join(parts) or "the same orders"


def _describe_variation(described):
    if not described:
        return "none (the cost model's durations)"
    parts = described if isinstance(described, list) else [described]
    texts = []
    for part in parts:
        kind = part["model"]
        if kind == "noise":
            texts.append(f"noise cv {part['cv']:g}"
                         + (f", transfers cv {part['transfers']:g}" if part.get("transfers")
                            else ""))
        elif kind == "straggler":
            texts.append(f"d{part['device']} {part['factor']:g}x slower")
        elif kind == "slow-link":
            a, b = part["devices"]
            texts.append(f"link {a}-{b} bandwidth / {part['bandwidth_factor']:g}")
        else:
            unmatched = ""
            if part.get("unmatched"):
                listed = part["unmatched_labels"]
                more = ", ..." if part["unmatched"] > len(listed) else ""
                unmatched = f", {part['unmatched']} matching nothing: {', '.join(listed)}{more}"
            texts.append(f"replay of {part.get('source') or 'measurements'} "
                         f"({part['labels']} labels{unmatched})")
    return "; ".join(texts)


def adapt_log(found):
    """One line per candidate the search tried."""
    unit = found.time_unit
    lines = ["candidates (id, parent, round, status, mean, p95, transforms):"]
    for candidate in found.log:
        figures = (f"{format_time(candidate.mean, unit)} {format_time(candidate.p95, unit)}"
                   if candidate.mean is not None else "-")
        reason = f"  [{candidate.reason}]" if candidate.reason else ""
        lines.append(f"  {candidate.id:4d} {candidate.parent:4d} {candidate.round:3d} "
                     f"{candidate.status:<24} {figures:<22} "
                     f"{' -> '.join(candidate.transforms) or '(start)'}{reason}")
    return "\n".join(lines)
