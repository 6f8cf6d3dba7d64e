"""``tabsched adapt``: the granularity search under a memory budget, and its report."""

import json
import os
import shutil
import textwrap

import click
import numpy as np

from tabsched.cli.format import echo_json, format_memory, format_time, translate_errors
from tabsched.cli.options import (PARALLEL_OPTIONS, build_costs, build_model_costs,
                                  build_variation, check_parallel_without_model, check_samples,
                                  cost_options, given_parallel, load_schedule,
                                  memory_budget_value, model_options, parse_grad_sync,
                                  schedule_options, variation_options)
from tabsched.io import render_grid


@click.command("adapt")
@click.argument("schedule")
@schedule_options
@cost_options
@model_options
@variation_options(default_samples=256)
@click.option("--objective", type=click.Choice(["mean", "p95"]), default="mean",
              show_default=True, help="Which makespan statistic the search lowers.")
@click.option("--split-factor", type=int,
              help="Parts the search splits a microbatch into; must divide its samples "
                   "(default 2, tried where it divides).")
@click.option("--max-rounds", type=int, default=24, show_default=True,
              help="Greedy steps at most.")
@click.option("--out", "out_path", metavar="TABLE",
              help="Write the adapted table (.json keeps microbatch sizes; .csv for PyTorch).")
@click.option("--log", "show_log", is_flag=True,
              help="List every candidate the search tried (in JSON: search.log).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
@translate_errors
def adapt_command(schedule, schedule_params, forward, backward, input_grad, weight_grad, comm,
                  contention, model, system, microbatch_size, recompute, memory_budget, strict,
                  grad_sync, optimizer, variation_params, objective, split_factor, max_rounds,
                  out_path, show_log, as_json, **parallel):
    """Search granularity transforms of SCHEDULE for the fastest table in a memory budget.

    Transforms: deeper or shallower warm-up, split backward with W in idle
    slots, split microbatches (at the pipeline's edges or all), merge them. The
    search minimises the mean (or p95) makespan under the variation options over
    --samples Monte Carlo samples, keeps every device's peak memory within
    --memory-budget, and reports the decision, the gain over SCHEDULE, 1F1B and
    ZB-H1 at the same budget (on fresh samples), the headroom left and the table.
    With --strict, exit 1 when nothing fits the budget.
    """
    from tabsched.adapt import SplitMicrobatches, adapt, default_moves
    from tabsched.io import write_table
    table = load_schedule(schedule, **schedule_params)
    if memory_budget is None:
        raise click.ClickException("adapt needs --memory-budget (e.g. 80GB, or 'capacity' "
                                   "with a --system that states its memory)")
    parallel = {name: parallel.get(name) for name in PARALLEL_OPTIONS}
    if model is not None or system is not None:
        costs = build_model_costs(model, system, microbatch_size, recompute, contention,
                                  {"--f": forward, "--b": backward, "--i": input_grad,
                                   "--w": weight_grad, "--comm": comm}, given_parallel(parallel))
    else:
        for flag, value in (("--microbatch-size", microbatch_size), ("--recompute", recompute)):
            if value is not None:
                raise click.ClickException(f"{flag} needs --model and --system")
        check_parallel_without_model(parallel)
        costs = build_costs(forward, backward, input_grad, weight_grad, comm, contention)
    if grad_sync or optimizer:
        costs.grad_sync = parse_grad_sync(grad_sync) if grad_sync else costs.grad_sync
        costs.optimizer_step = bool(optimizer) or costs.optimizer_step
    if max_rounds < 1:
        raise click.ClickException(f"--max-rounds must be >= 1, not {max_rounds}")
    check_samples(variation_params)
    if split_factor is not None:  # a factor the user chose must fit: say so up front
        SplitMicrobatches("all", split_factor).apply(table, costs)
    split_factor = 2 if split_factor is None else split_factor
    variation = build_variation(table, **variation_params)
    budget = memory_budget_value(memory_budget, costs)

    def moves(current):
        return [_with_factor(move, split_factor) for move in default_moves(current)]

    found = adapt(table, costs, variation, budget, objective=objective,
                  samples=variation_params["samples"], seed=variation_params["seed"],
                  moves=moves, max_rounds=max_rounds)
    if out_path:
        _write_adapted(found.table, out_path, write_table)
    if as_json:
        from tabsched.io import to_json
        data = found.to_dict(log=show_log)
        data["table"] = json.loads(to_json(found.table))
        echo_json(data)
    else:
        click.echo(adapt_summary(found, costs))
        if show_log:
            click.echo(adapt_log(found))
        click.echo(render_grid(found.table))
        if out_path:
            click.echo(f"wrote the adapted table to {out_path}")
    if not found.feasible:
        click.echo("warning: no table fits the memory budget; the one shown is the closest "
                   "and is over it", err=True)
        if strict:
            raise click.ClickException(f"no table within the memory budget "
                                       f"{format_memory(found.budget, found.memory_unit)} "
                                       f"(--strict)")


def _with_factor(move, factor):
    """A default move with the split factor the user chose."""
    from tabsched.adapt import SplitMicrobatches, SplitPhases
    if isinstance(move, SplitPhases):
        return SplitPhases(factor, move.warmup, move.cooldown)
    if isinstance(move, SplitMicrobatches):
        return SplitMicrobatches(move.microbatches, factor)
    return move


def _write_adapted(table, path, write_table):
    uneven = any(size != 1.0 for size in table.microbatch_sizes)
    if uneven and os.path.splitext(path)[1].lower() == ".csv":
        raise click.ClickException(
            f"--out {path}: a CSV table cannot hold the adapted microbatch sizes "
            f"({', '.join(f'{size:g}' for size in table.microbatch_sizes[:6])}"
            f"{', ...' if table.num_microbatches > 6 else ''}); write a .json table")
    write_table(table, path)


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
    steps = " -> ".join(found.transforms) if found.transforms else "none (the start is best)"
    width = max(60, shutil.get_terminal_size((100, 24)).columns)
    lines.append(textwrap.fill(steps, width=width, initial_indent="decision      ",
                               subsequent_indent=" " * 14, break_on_hyphens=False))
    if found.transforms:
        lines.append(textwrap.fill(_net_change(start, found.table), width=width,
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
    reports += [(family, report) for family, report in found.references.items()
                if report is not None]
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
    lines.append(f"              (gain: 1 - adapted / row, {found.objective} makespan)")
    for family, error in found.reference_errors.items():
        lines.append(f"{family:<13} not comparable: {error}")
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
            texts.append(f"replay of {part.get('source') or 'measurements'} "
                         f"({part['labels']} labels)")
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
