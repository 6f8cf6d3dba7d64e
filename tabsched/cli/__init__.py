"""The ``tabsched`` command line: parse, call the library, print.

Machine output (``--json``) goes to stdout; progress and errors to stderr. Every
error is one line, ``Error: <what and where>``, and exit status 1.
"""

import functools
import json
import os
import shutil
import sys
import textwrap

import click
import numpy as np

from tabsched.costs import ModelCosts, StageCosts, UnitCosts
from tabsched.evaluate import evaluate
from tabsched.exceptions import TabschedError, UnknownNameError
from tabsched.formulas import formula_for
from tabsched.io import TABLE_SUFFIXES, read_table, render_grid, to_csv, to_json
from tabsched.lower import CONTENTION_MODES
from tabsched.pytorch import (P2P_MODES, describe_stage_map, read_pytorch, to_compute_comms,
                              to_compute_only)
from tabsched.schedules import describe_parameters, families, generate, get_family
from tabsched.units import format_quantity


# ------------------------------------------------------------------ plumbing
def translate_errors(command):
    """Turn library errors into one-line ClickExceptions (exit 1)."""
    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except TabschedError as error:
            raise click.ClickException(str(error)) from None
        except BrokenPipeError:
            raise  # the reader went away (e.g. `| head`); main() exits quietly
        except MemoryError:
            raise click.ClickException("out of memory: the table or sweep is too large for "
                                       "this machine; try fewer devices or microbatches") \
                from None
        except OSError as error:
            where = f"{error.filename}: " if error.filename else ""
            raise click.ClickException(f"{where}{error.strerror or error}") from None
    return wrapper


#: Family parameters with an option of their own; any other goes through --param.
NAMED_PARAMETERS = ("devices", "microbatches", "chunks", "waves", "variant", "pipelines",
                    "group_size")
#: Parameters every family accepts: how the model's layers split over the stages.
LAYER_PARAMETERS = ("stage_layers", "stage_layers_ratio", "layers")


def schedule_options(command):
    """Options that pick a table: a family's parameters (a FILE ignores them).

    The command receives them as one dict, ``schedule_params``; ``--param
    NAME=VALUE`` passes any other parameter a family takes.
    """
    options = [
        click.option("--devices", "-p", type=int, help="Pipeline depth (number of devices)."),
        click.option("--microbatches", "-m", type=int, help="Microbatches per iteration."),
        click.option("--chunks", "-v", type=int, help="Model chunks per device (multi-chunk families)."),
        click.option("--waves", type=int, help="Waves W (hanayo)."),
        click.option("--variant", help="Family variant (chimera: direct or doubling)."),
        click.option("--pipelines", type=int, help="Number of pipelines, 2f (chimera)."),
        click.option("--group-size", type=int,
                     help="Microbatch group size per virtual stage (interleaved-1f1b)."),
        click.option("--stage-layers", help="Layers of every stage, e.g. 4,4,8,8 (any family)."),
        click.option("--stage-layers-ratio",
                     help="Layer weights of consecutive stage groups, e.g. 1:2 (any family)."),
        click.option("--layers", type=int,
                     help="Total layers, split over the stages (with the ratio if given)."),
        click.option("--param", "extra_params", multiple=True, metavar="NAME=VALUE",
                     help="Any other family parameter, e.g. --param pairs=serial "
                          "(see `tabsched list`)."),
    ]
    names = NAMED_PARAMETERS + LAYER_PARAMETERS

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        params = {name: kwargs.pop(name) for name in names}
        for text in kwargs.pop("extra_params"):
            name, value = parse_param(text)
            if params.get(name) is not None:
                raise click.ClickException(f"--param {text}: {name} is given twice")
            params[name] = value
        return command(*args, schedule_params=params, **kwargs)

    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper


def parse_param(text):
    """``("name", value)`` of ``--param NAME=VALUE``; integer values become ints."""
    name, equals, value = text.partition("=")
    name = name.strip().replace("-", "_")
    if not equals or not name or not value.strip():
        raise click.ClickException(f"--param {text!r}: expected NAME=VALUE, e.g. pairs=serial")
    value = value.strip()
    try:
        return name, int(value)
    except ValueError:
        return name, value


def _flag(name):
    return ("--" + name.replace("_", "-") if name in NAMED_PARAMETERS + LAYER_PARAMETERS
            else f"--param {name}=...")


def is_table_file(schedule):
    return os.path.splitext(schedule)[1].lower() in TABLE_SUFFIXES or os.path.exists(schedule)


def load_schedule(schedule, **params):
    """A table from a family name and its parameters, or from a .csv/.json file."""
    if is_table_file(schedule):
        return read_table(schedule)
    family = get_family(schedule)
    accepted = set(family.parameter_names()) | set(LAYER_PARAMETERS)
    given = {key: value for key, value in params.items() if value is not None}
    ignored = sorted(set(given) - accepted)
    if ignored:
        flags = ", ".join(_flag(name) for name in ignored)
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
             "aliases": list(family.aliases)} for family in chosen]
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
        for label, text in [("valid:", family.constraints), ("notes:", family.notes),
                            ("also called:", ", ".join(family.aliases))]:
            if text:
                click.echo(textwrap.fill(text, width=width, initial_indent=f"  {label:<12} ",
                                         subsequent_indent=" " * 15))
    click.echo("")
    click.echo(textwrap.fill(
        "Every family also takes --stage-layers, --stage-layers-ratio and --layers (how the "
        "model's layers split over its stages); --param NAME=VALUE passes any parameter "
        "without an option of its own.", width=width))


@cli.command("show")
@click.argument("schedule")
@schedule_options
@click.option("--format", "output", type=click.Choice(["grid", "csv", "json"]), default="grid",
              show_default=True, help="How to print the table.")
@click.option("--width", type=int, help="Columns for the grid (default: the terminal's).")
@torch_options
@translate_errors
def show_command(schedule, schedule_params, output, width, torch_legacy, p2p):
    """Print the table of SCHEDULE."""
    table, torch_schedule = load_with_torch(schedule, torch_legacy, p2p, **schedule_params)
    if output == "csv":
        click.echo(to_csv(table), nl=False)
    elif output == "json":
        click.echo(to_json(table, indent=1))
    else:
        click.echo(render_grid(table, width=width))
        columns = width or shutil.get_terminal_size((120, 24)).columns
        click.echo(textwrap.fill(f"stage map: {describe_stage_map(table)}", width=columns,
                                 subsequent_indent="  "))
        for note in torch_schedule.notes if torch_schedule else ():
            click.echo(textwrap.fill(f"note: {note}", width=columns, subsequent_indent="  "))


def cost_options(command):
    options = [
        click.option("--f", "forward", type=float, help="Forward length (default 1)."),
        click.option("--b", "backward", type=float, help="Full backward length (default 1)."),
        click.option("--i", "input_grad", type=float, help="Input-grad length (default 1)."),
        click.option("--w", "weight_grad", type=float, help="Weight-grad length (default 1)."),
        click.option("--comm", type=float,
                     help="Time of every transfer; turns the table into a simulation."),
        click.option("--contention", type=click.Choice(CONTENTION_MODES),
                     help="none: transfers never wait; link: one FIFO per directed device "
                          "pair; nic: transfers between nodes also share each node's ports "
                          "(needs --system). Default: the system's, else none."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


LEVELS = ("formula", "table", "simulation")


def build_costs(forward, backward, input_grad, weight_grad, comm, contention):
    lengths = {"f": forward, "b": backward, "i": input_grad, "w": weight_grad}
    given = {key: value for key, value in lengths.items() if value is not None}
    if comm is None:
        return UnitCosts(**given)
    unit = UnitCosts(**given).lengths
    return StageCosts(unit[0], unit[1], unit[2], unit[3], comm=comm,
                      contention=contention or "none", time_unit="slots")


def model_options(command):
    """Options for model-based costs (seconds and bytes), the memory budget and the tail."""
    options = [
        click.option("--model", metavar="NAME|FILE", help="Transformer preset (see `tabsched presets`) or TOML "
                                     "file; needs --system."),
        click.option("--system", metavar="NAME|FILE", help="System preset or TOML file; needs --model."),
        click.option("--microbatch-size", type=int,
                     help="Samples per full microbatch (default: the model's)."),
        click.option("--recompute", type=click.Choice(["none", "selective", "full"]),
                     help="Activation recomputation (default: the model's)."),
        click.option("--memory-budget", metavar="SIZE",
                     help="Memory per device, e.g. 80GB (or 'capacity': the system's); "
                          "devices over it are reported."),
        click.option("--strict", is_flag=True,
                     help="Exit 1 if a device goes over --memory-budget."),
        click.option("--grad-sync", metavar="WHICH",
                     help="Gradient sync at the end: 'replicas', 'all' or stages (0,3,5)."),
        click.option("--optimizer", is_flag=True, help="An optimizer step per device at the end."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def build_model_costs(model, system, microbatch_size, recompute, contention, unit_options):
    """ModelCosts from the CLI's options; one-line errors for options that do not fit."""
    if model is None or system is None:
        given, missing = ("--model", "--system") if system is None else ("--system", "--model")
        raise click.ClickException(f"{given} needs {missing} (see `tabsched presets`)")
    clashing = [flag for flag, value in unit_options.items() if value is not None]
    if clashing:
        raise click.ClickException(f"--model and --system replace {', '.join(clashing)}; "
                                   f"give one or the other")
    return ModelCosts(model, system, microbatch_size=microbatch_size, recompute=recompute,
                      contention=contention)


def parse_grad_sync(text):
    if text is None or text in ("replicas", "all"):
        return text
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise click.ClickException(f"--grad-sync {text!r} is not 'replicas', 'all' or a "
                                   f"comma-separated list of stages") from None


def memory_budget_value(text, costs):
    if text != "capacity":
        return text
    capacity = getattr(getattr(costs, "system", None), "memory_capacity", None)
    if capacity is None:
        raise click.ClickException("--memory-budget capacity needs a --system that states "
                                   "its memory_capacity")
    return capacity


def evaluation_options(command):
    """Everything that picks a table and its costs: what eval, plot and trace share.

    The command receives ``schedule_params`` and one dict ``evaluation`` with the
    cost, model, memory, tail and PyTorch-reader options.
    """
    names = ("forward", "backward", "input_grad", "weight_grad", "comm", "contention", "model",
             "system", "microbatch_size", "recompute", "memory_budget", "strict", "grad_sync",
             "optimizer", "torch_legacy", "p2p")

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        evaluation = {name: kwargs.pop(name) for name in names}
        return command(*args, evaluation=evaluation, **kwargs)

    for decorate in (torch_options, model_options, cost_options, schedule_options):
        wrapper = decorate(wrapper)
    return wrapper


def prepare_evaluation(schedule, schedule_params, options, level=None):
    """``(table, TorchSchedule or None, costs)`` from the evaluation options."""
    table, torch_schedule = load_with_torch(schedule, options["torch_legacy"], options["p2p"],
                                            **schedule_params)
    modelled = options["model"] is not None or options["system"] is not None
    if level == "table" and (options["comm"] is not None or modelled):
        raise click.ClickException("--level table has no communication; drop --comm/--model/"
                                   "--system or use --level simulation")
    if level == "simulation" and options["comm"] is None and not modelled:
        raise click.ClickException("--level simulation needs --comm (the time of a transfer) "
                                   "or --model and --system")
    units = {"--f": options["forward"], "--b": options["backward"],
             "--i": options["input_grad"], "--w": options["weight_grad"],
             "--comm": options["comm"]}
    if modelled:
        costs = build_model_costs(options["model"], options["system"],
                                  options["microbatch_size"], options["recompute"],
                                  options["contention"], units)
    else:
        for flag, name in (("--microbatch-size", "microbatch_size"),
                           ("--recompute", "recompute")):
            if options[name] is not None:
                raise click.ClickException(f"{flag} needs --model and --system")
        if options["contention"] == "nic":
            raise click.ClickException("--contention nic needs --system (it says which "
                                       "devices share a node)")
        costs = build_costs(options["forward"], options["backward"], options["input_grad"],
                            options["weight_grad"], options["comm"], options["contention"])
    return table, torch_schedule, costs


def run_evaluation(table, torch_schedule, costs, options):
    """Evaluate with the memory budget and tail the options ask for."""
    if options["strict"] and options["memory_budget"] is None:
        raise click.ClickException("--strict needs --memory-budget")
    budget = (None if options["memory_budget"] is None
              else memory_budget_value(options["memory_budget"], costs))
    run = torch_schedule.evaluate if torch_schedule is not None else functools.partial(
        evaluate, table)
    grad_sync = options["grad_sync"]
    return run(costs, contention=options["contention"], memory_budget=budget,
               grad_sync=parse_grad_sync(grad_sync) if grad_sync else None,
               optimizer=True if options["optimizer"] else None)


def variation_options(default_samples):
    """Options of run-time variation and Monte Carlo, passed as one dict, ``variation_params``."""
    options = [
        click.option("--cv", type=float,
                     help="Coefficient of variation of every operation's duration "
                          "(lognormal noise, mean 1)."),
        click.option("--transfer-cv", type=float,
                     help="Coefficient of variation of every transfer's duration."),
        click.option("--straggler", "stragglers", multiple=True, metavar="DEVICE:FACTOR",
                     help="A device computing FACTOR times slower, e.g. 3:1.5 (repeatable)."),
        click.option("--slow-link", "slow_links", multiple=True, metavar="A-B:FACTOR",
                     help="The link between devices A and B with its bandwidth divided by "
                          "FACTOR (latency unchanged), e.g. 3-4:3 (repeatable)."),
        click.option("--replay", metavar="FILE",
                     help="Measured durations: CSV rows op,duration (e.g. 3F12,31ms)."),
        click.option("--samples", type=int, default=default_samples,
                     help="Monte Carlo samples" + (f" (default {default_samples})."
                                                   if default_samples else
                                                   " (default 1000 with a variation option).")),
        click.option("--seed", type=int, default=0, show_default=True,
                     help="Seed of the random draws; the same seed gives the same numbers."),
    ]
    names = ("cv", "transfer_cv", "stragglers", "slow_links", "replay", "samples", "seed")

    def decorator(command):
        @functools.wraps(command)
        def wrapper(*args, **kwargs):
            params = {name: kwargs.pop(name) for name in names}
            return command(*args, variation_params=params, **kwargs)
        for option in reversed(options):
            wrapper = option(wrapper)
        return wrapper
    return decorator


def _split_pair(text, flag, separator, example):
    head, colon, factor = text.partition(":")
    try:
        if not colon:
            raise ValueError
        value = float(factor)
        if separator is None:
            return int(head), value
        a, dash, b = head.partition(separator)
        if not dash:
            raise ValueError
        return (int(a), int(b)), value
    except ValueError:
        raise click.ClickException(f"{flag} {text!r}: expected {example}") from None


def build_variation(table, cv=None, transfer_cv=None, stragglers=(), slow_links=(),
                    replay=None, **_):
    """The variation model the options describe (None if they describe none)."""
    from tabsched.adapt import Noise, Replay, SlowLink, Straggler
    from tabsched.adapt.variation import Combined
    parts = []
    if replay is not None:
        parts.append(Replay.from_csv(replay))
    for text in stragglers:
        device, factor = _split_pair(text, "--straggler", None, "DEVICE:FACTOR, e.g. 3:1.5")
        parts.append(Straggler(device, factor))
    for text in slow_links:
        devices, factor = _split_pair(text, "--slow-link", "-", "A-B:FACTOR, e.g. 3-4:3")
        parts.append(SlowLink(devices, factor))
    if cv is not None or transfer_cv is not None:
        parts.append(Noise(cv or 0.0, transfers=transfer_cv or 0.0))
    if not parts:
        return None
    variation = Combined(*parts)
    variation.validate(table)
    return variation


def _check_samples(params):
    samples = params.get("samples")
    if samples is not None and samples < 1:
        raise click.ClickException(f"--samples must be >= 1, not {samples}")
    if params.get("seed") is not None and params["seed"] < 0:
        raise click.ClickException(f"--seed must be >= 0, not {params['seed']}")


def monte_carlo_from_options(table, costs, params, **lowering):
    """Monte Carlo for `eval` when a variation option or --samples asks for it."""
    from tabsched.adapt import monte_carlo
    _check_samples(params)
    variation = build_variation(table, **params)
    if variation is None and params.get("samples") is None:
        return None
    samples = params["samples"] if params.get("samples") is not None else 1000
    return monte_carlo(table, costs, variation, samples=samples, seed=params["seed"],
                       **lowering)


def monte_carlo_summary(runs):
    """Monte Carlo figures and the run-time bubble per device, for humans."""
    unit = runs.time_unit
    mean = runs.mean
    share = runs.runtime_bubble / mean if mean else 0.0
    lines = [f"monte carlo   {runs.samples} samples (seed {runs.seed}): mean "
             f"{_time(mean, unit)}, p50 {_time(runs.p50, unit)}, p95 {_time(runs.p95, unit)}, "
             f"max {_time(runs.max, unit)}",
             f"run-time bubble {_time(runs.runtime_bubble, unit)} ({share:.2%} of the mean "
             f"makespan) over {_time(runs.nominal_makespan, unit)} at mean durations"]
    header = ["device", "mean busy", "mean idle", "idle at mean durations", "run-time bubble"]
    body = [[f"d{d.device}"] + [_time(value, unit, with_unit=False) for value in
                                (d.mean_busy, d.mean_idle, d.nominal_idle, d.runtime_bubble)]
            for d in runs.devices]
    widths = [max(len(row[k]) for row in [header] + body) for k in range(len(header))]
    for row in [header] + body:
        lines.append("  ".join(cell.rjust(widths[k]) if k else cell.ljust(widths[k])
                               for k, cell in enumerate(row)).rstrip())
    return "\n".join(lines)


@cli.command("eval")
@click.argument("schedule")
@evaluation_options
@click.option("--level", type=click.Choice(LEVELS),
              help="formula: only the family's closed forms; table: unit slots, no "
                   "communication; simulation: needs --comm or --model/--system. Default: "
                   "table, or simulation with --comm or --model/--system.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
@variation_options(default_samples=None)
@translate_errors
def eval_command(schedule, schedule_params, evaluation, level, as_json, variation_params):
    """Evaluate SCHEDULE and summarise time, idle and memory per device.

    With --model and --system, times are seconds and memory is bytes. The summary
    shows the formula level's numbers beside the table's or the simulation's,
    marked as such; --level formula prints them alone. With --cv, --straggler,
    --slow-link, --replay or --samples, Monte Carlo figures follow: mean, p50,
    p95 and max makespan and the run-time bubble, per device too.
    """
    table, torch_schedule, costs = prepare_evaluation(schedule, schedule_params, evaluation,
                                                      level)
    if level == "formula" and (any(variation_params[name] for name in
                                   ("cv", "transfer_cv", "stragglers", "slow_links", "replay"))
                               or variation_params["samples"] is not None):
        raise click.ClickException("--level formula has no run-time variation; drop --cv, "
                                   "--straggler, --slow-link, --replay and --samples")
    if level == "formula":
        numbers = formula_for(table, costs)
        if numbers is None:
            what = (f"family {table.family!r} has no formula level" if table.family
                    else "the table names no family, so it has no formula level")
            raise click.ClickException(what)
        if as_json:
            echo_json(numbers)
        else:
            click.echo(formula_summary(table, numbers))
        return
    result = run_evaluation(table, torch_schedule, costs, evaluation)
    grad_sync = evaluation["grad_sync"]
    runs = monte_carlo_from_options(
        table, costs, variation_params, contention=evaluation["contention"],
        grad_sync=parse_grad_sync(grad_sync) if grad_sync else None,
        optimizer=True if evaluation["optimizer"] else None,
        **({"transfer_after": torch_schedule.transfer_after} if torch_schedule else {}))
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
        result.check_memory()


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
    lines.append(f"makespan      {_time(result.makespan, unit)}")
    bubble = f"bubble ratio  {result.bubble_ratio:.2%}"
    formula = result.formula
    if formula and formula.get("bubble_ratio") is not None:
        bubble += f"   (formula level: {formula['bubble_ratio']:.2%})"
    elif formula:
        bubble += "   (formula level: no closed form)"
    lines.append(bubble)
    if formula:
        lines.append(f"formula       {_exactness(formula)}")
        lines.append(f"              {formula.get('source')}")
        bounds = formula.get("peak_activation_bounds")
        if bounds is not None:
            lines.append(f"formula peak  {bounds[0]} .. {bounds[1]} per device "
                         f"({formula.get('activation_unit')})")
    path = result.critical_path
    ops = sum(1 for step in path if step.kind == "op")
    lines.append(f"critical path {ops} ops, {len(path) - ops} transfers")
    header = ["device", "busy", "idle", "warm-up", "inside", "cool-down",
              f"peak memory ({result.memory_unit})"]
    body = [[f"d{d.device}", _number(d.busy), _number(d.idle), _number(d.warmup),
             _number(d.inside), _number(d.cooldown), _number(d.peak_memory)]
            for d in result.devices]
    if unit == "s" or result.memory_unit == "bytes":
        header, body = _human_device_rows(result)
        lines.extend(_memory_lines(result))
    formula_peaks = (formula or {}).get("peak_activation")
    if (formula_peaks is not None and len(formula_peaks) == len(body)
            and result.memory_unit != "bytes"):
        header.append("formula peak")
        for row, peak in zip(body, formula_peaks):
            row.append(_number(peak))
    widths = [max(len(row[k]) for row in [header] + body) for k in range(len(header))]
    for row in [header] + body:
        lines.append("  ".join(cell.rjust(widths[k]) if k else cell.ljust(widths[k])
                               for k, cell in enumerate(row)).rstrip())
    lines.extend(f"note: {note}" for note in result.notes)
    return "\n".join(lines)


def _exactness(formula):
    """When the formula level is exact, and whether these costs meet it."""
    if formula.get("bubble_ratio") is None and formula.get("peak_activation") is None:
        return "no closed form published"
    exact_when = formula.get("exact_when")
    if exact_when is None:
        return "never exact (see the note)"
    verdict = {True: ": met by these costs", False: ": not met by these costs"}
    return f"exact when {exact_when}{verdict.get(formula.get('exact'), '')}"


def formula_summary(table, numbers):
    """The formula level alone, for ``eval --level formula``."""
    params = " ".join(f"{key}={value}" for key, value in table.params.items())
    lines = [f"{table.family} {params}".rstrip() + ": formula level",
             f"source        {numbers.get('source')}"]
    bubble = numbers.get("bubble_ratio")
    lines.append("bubble ratio  " + (f"{bubble:.2%}" if bubble is not None
                                     else "none (no closed form)"))
    if numbers.get("bubble_time") is not None:
        lines.append(f"bubble time   {_number(numbers['bubble_time'])} per device")
    lines.append(f"exactness     {_exactness(numbers)}")
    unit = numbers.get("activation_unit")
    if numbers.get("peak_activation") is not None:
        peaks = " ".join(_number(peak) for peak in numbers["peak_activation"])
        lines.append(f"peak memory   {peaks} ({unit}; per device)")
    elif numbers.get("peak_activation_bounds") is not None:
        low, high = numbers["peak_activation_bounds"]
        lines.append(f"peak memory   {low} .. {high} per device ({unit})")
    else:
        lines.append("peak memory   none (no closed form)")
    if numbers.get("note"):
        lines.append(f"note          {numbers['note']}")
    return "\n".join(lines)


def _time(value, unit, *, with_unit=True):
    """A time in human units for seconds, else the number and its unit."""
    if unit == "s":
        return format_quantity(value, "s")
    return f"{_number(value)} {unit}" if with_unit else _number(value)


def _memory(value, unit):
    return format_quantity(value, "B") if unit == "bytes" else f"{_number(value)} {unit}"


def _human_device_rows(result):
    """The per-device table with times in s/ms/us and memory in B/GB when the costs say so."""
    unit, memory_unit = result.time_unit, result.memory_unit
    header = ["device", "busy", "idle", "warm-up", "inside", "cool-down", "peak activations",
              "persistent", "peak total"]
    body = [[f"d{d.device}"]
            + [_time(value, unit, with_unit=False)
               for value in (d.busy, d.idle, d.warmup, d.inside, d.cooldown)]
            + [_memory(value, memory_unit)
               for value in (d.peak_memory, d.persistent_memory, d.peak_total_memory)]
            for d in result.devices]
    return header, body


def _memory_lines(result):
    """The memory peak, and the budget with its violations, in one or two lines."""
    memory_unit = result.memory_unit
    devices = result.devices
    if not devices:
        return []
    top = max(devices, key=lambda d: d.peak_total_memory)
    lines = [f"peak memory   {_memory(top.peak_total_memory, memory_unit)} on d{top.device} "
             f"({_memory(top.persistent_memory, memory_unit)} persistent + "
             f"{_memory(top.peak_memory, memory_unit)} activations)"]
    if result.memory_budget is not None:
        budget = _memory(result.memory_budget, memory_unit)
        if not result.violations:
            lines.append(f"memory budget {budget}: every device fits")
        else:
            worst = max(result.violations, key=lambda v: v.over)
            lines.append(f"memory budget {budget}: {len(result.violations)} of {len(devices)} "
                         f"devices over (worst d{worst.device} by "
                         f"{_memory(worst.over, memory_unit)} at "
                         f"{_time(worst.time, result.time_unit)})")
    return lines


@cli.command("adapt")
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
                  out_path, show_log, as_json):
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
    if model is not None or system is not None:
        costs = build_model_costs(model, system, microbatch_size, recompute, contention,
                                  {"--f": forward, "--b": backward, "--i": input_grad,
                                   "--w": weight_grad, "--comm": comm})
    else:
        for flag, value in (("--microbatch-size", microbatch_size), ("--recompute", recompute)):
            if value is not None:
                raise click.ClickException(f"{flag} needs --model and --system")
        costs = build_costs(forward, backward, input_grad, weight_grad, comm, contention)
    if grad_sync or optimizer:
        costs.grad_sync = parse_grad_sync(grad_sync) if grad_sync else costs.grad_sync
        costs.optimizer_step = bool(optimizer) or costs.optimizer_step
    if max_rounds < 1:
        raise click.ClickException(f"--max-rounds must be >= 1, not {max_rounds}")
    _check_samples(variation_params)
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
                                       f"{_memory(found.budget, found.memory_unit)} "
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
             f"budget        {_memory(found.budget, memory_unit)} per device; objective "
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
        lines.append(f"INFEASIBLE    no candidate fits the budget; the closest is over it by "
                     f"{_memory(found.adapted.peak_memory[worst] - found.budget, memory_unit)} "
                     f"on d{worst}")
    rows = [["", "mean", "p95", "run-time bubble", "peak memory", "fits", "gain"]]
    reports = [(f"baseline ({name})", found.baseline), ("adapted", found.adapted)]
    reports += [(family, report) for family, report in found.references.items()
                if report is not None]
    for label, report in reports:
        gain = "" if report is found.adapted else f"{found.gain(report):+.2%}"
        rows.append([label, _time(report.mean, unit), _time(report.p95, unit),
                     _time(report.runtime_bubble, unit),
                     _memory(max(report.peak_memory), memory_unit),
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
        lines.append(f"headroom      {_memory(headroom[least], memory_unit)} on d{least} (least); "
                     + " ".join(f"d{d}:{_memory(value, memory_unit)}"
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
        figures = (f"{_time(candidate.mean, unit)} {_time(candidate.p95, unit)}"
                   if candidate.mean is not None else "-")
        reason = f"  [{candidate.reason}]" if candidate.reason else ""
        lines.append(f"  {candidate.id:4d} {candidate.parent:4d} {candidate.round:3d} "
                     f"{candidate.status:<24} {figures:<22} "
                     f"{' -> '.join(candidate.transforms) or '(start)'}{reason}")
    return "\n".join(lines)


@cli.command("presets")
@click.option("--show", "name", help="Print the TOML of one preset (copy it to make your own).")
@click.option("--json", "as_json", is_flag=True, help="Print the presets as JSON (SI units).")
@translate_errors
def presets_command(name, as_json):
    """List the model and system presets with their key numbers."""
    from tabsched._presets import preset_index
    from tabsched.models import model_presets
    from tabsched.systems import system_presets
    index = preset_index()
    if name is not None:
        for kind in ("model", "system"):
            if name in index[kind]:
                click.echo(index[kind][name], nl=False)
                return
        names = [preset for kind in ("model", "system") for preset in index[kind]]
        raise UnknownNameError(f"unknown preset {name!r}; valid presets: {', '.join(names)}")
    models, systems = model_presets(), system_presets()
    if as_json:
        echo_json({"models": [model.summary() for model in models.values()],
                   "systems": [system.summary() for system in systems.values()]})
        return
    rows = [["model", "layers", "hidden", "heads/kv", "ffn", "sequence", "vocab", "params",
             "recompute", "description"]]
    for model in models.values():
        rows.append([model.name, str(model.layers), str(model.hidden),
                     f"{model.heads}/{model.kv_heads}", str(model.ffn), str(model.sequence),
                     str(model.vocab), f"{model.parameters / 1e9:.3g}B", model.recompute,
                     model.description])
    click.echo(_columns(rows))
    click.echo("")
    rows = [["system", "compute", "memory bw", "capacity", "per node", "intra-node",
             "inter-node", "contention"]]
    for system in systems.values():
        capacity = system.memory_capacity
        rows.append([
            system.name,
            f"{format_quantity(system.peak_flops, 'FLOP/s')} x {system.compute_efficiency:g}",
            format_quantity(system.memory_bandwidth, "B/s"),
            "-" if capacity is None else format_quantity(capacity, "B"),
            str(system.devices_per_node),
            f"{format_quantity(system.intra_node_bandwidth, 'B/s')}, "
            f"{format_quantity(system.intra_node_latency, 's')}",
            f"{format_quantity(system.inter_node_bandwidth, 'B/s')}, "
            f"{format_quantity(system.inter_node_latency, 's')}",
            system.contention])
    click.echo(_columns(rows))


def _columns(rows):
    widths = [max(len(row[k]) for row in rows) for k in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(widths[k]) for k, cell in enumerate(row)).rstrip()
                     for row in rows)


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
def convert_command(schedule, output, schedule_params, target, torch_legacy, p2p):
    """Write SCHEDULE (a family or a .csv/.json file) to OUTPUT ("-": stdout)."""
    table, torch_schedule = load_with_torch(schedule, torch_legacy, p2p, **schedule_params)
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


# ------------------------------------------------ comparison, sweeps, studies
def _int_list(flag, text):
    try:
        values = [int(part) for part in str(text).split(",") if part.strip()]
    except ValueError:
        raise click.ClickException(f"{flag} {text!r}: expected integers separated by commas, "
                                   f"e.g. 4,8") from None
    if not values or min(values) < 1:
        raise click.ClickException(f"{flag} {text!r}: expected positive integers, e.g. 4,8")
    return values


def _names(text):
    return [part.strip() for part in str(text).split(",") if part.strip()]


@cli.command("compare")
@click.argument("families", nargs=-1, required=True, metavar="FAMILY...")
@click.option("--devices", "-p", type=int, required=True, help="Pipeline depth.")
@click.option("--microbatches", "-m", type=int, required=True, help="Microbatches per iteration.")
@click.option("--model", default="paper-128l", show_default=True, metavar="NAME|FILE",
              help="Transformer for the simulation level.")
@click.option("--system", default="mid_nw_mid_cp", show_default=True, metavar="NAME|FILE",
              help="System for the simulation level.")
@click.option("--global-batch", type=int,
              help="Samples per iteration; a microbatch holds global-batch / M.")
@click.option("--recompute", type=click.Choice(["none", "selective", "full"]))
@click.option("--contention", type=click.Choice(CONTENTION_MODES))
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list, one object per family.")
@translate_errors
def compare_command(families, devices, microbatches, model, system, global_batch, recompute,
                    contention, as_json):
    """Compare FAMILY... at the formula, table and simulation levels.

    A FAMILY may carry parameters: hanayo:waves=2, chimera:stage_layers_ratio=1:2.
    Each level ranks the families (1 = best); a * marks a family whose rank
    differs between levels.
    """
    from tabsched.compare import compare, disagreements
    rows = compare(families, devices, microbatches, model=model, system=system,
                   global_batch=global_batch, recompute=recompute, contention=contention)
    if as_json:
        echo_json([row.to_dict() for row in rows])
        return
    header = ["family", "formula bubble", "peak", "rank", "table bubble", "slots", "rank",
              "iteration", "idle", "peak act", "peak mem", "rank", ""]
    body = []
    skipped = [row for row in rows if row.error]
    for row in rows:
        if row.error:
            continue
        f, t, sim = row.formula, row.table, row.simulation
        peak = f["peak_activation"]
        body.append([
            row.label,
            "-" if f["bubble_ratio"] is None else f"{f['bubble_ratio']:.1%}",
            "-" if not peak else _number(max(peak)),
            str(row.ranks["formula"] or "-"),
            f"{t['bubble_ratio']:.1%}", str(t["slots"]), str(row.ranks["table"]),
            _time(sim["makespan"], sim["time_unit"]), f"{sim['bubble_ratio']:.1%}",
            _memory(max(sim["peak_activation"]), sim["memory_unit"]),
            _memory(max(sim["peak_memory"]), sim["memory_unit"]),
            str(row.ranks["simulation"]), "*" if row.disagrees else ""])
    click.echo(f"{devices} devices, {microbatches} microbatches; simulation: {model} on "
               f"{system}" + (f", global batch {global_batch}" if global_batch else ""))
    click.echo("levels: formula (closed form) | table (idle cells, unit slots) | simulation "
               "(peak act / peak mem: the fullest device)")
    if body:
        click.echo(_columns([header] + body))
    for row in skipped:
        click.echo(f"skipped {row.label}: {row.error}")
    pairs = disagreements(rows)
    if len(body) < 2:
        click.echo("fewer than two families evaluated: nothing to rank")
    elif pairs:
        levels = sorted({f"{a} vs {b}" for a, b, _, _ in pairs})
        click.echo(f"* rankings disagree ({'; '.join(levels)}): "
                   + ", ".join(f"{x} vs {y} ({a}/{b})" for a, b, x, y in pairs[:6])
                   + (" ..." if len(pairs) > 6 else ""))
    else:
        click.echo("rankings agree at every level")


def _progress(label):
    """Progress on stderr: one updated line on a terminal, a line per tenth in a log."""
    interactive = sys.stderr.isatty()
    shown = set()

    def report(done, total, configurations):
        text = f"{label}: {done}/{total} tables, {configurations} configurations"
        if interactive:
            click.echo(f"\r{text}", err=True, nl=done == total)
        elif done == total or (10 * done) // total not in shown:
            shown.add((10 * done) // total)
            click.echo(text, err=True)
    return report


@cli.command("sweep")
@click.argument("families", nargs=-1, required=True, metavar="FAMILY...")
@click.option("--devices", "-p", required=True, metavar="P,...", help="Pipeline depths, e.g. 4,8.")
@click.option("--microbatches", "-m", required=True, metavar="M,...",
              help="Microbatch counts, e.g. 8,16,32.")
@click.option("--models", default="paper-128l", show_default=True, metavar="NAME,...")
@click.option("--systems", default="grid", show_default=True, metavar="NAME,...|grid",
              help="Systems; 'grid' is the tabular paper's 3x3 grid.")
@click.option("--global-batch", type=int,
              help="Samples per iteration; a microbatch holds global-batch / M.")
@click.option("--recompute", type=click.Choice(["none", "selective", "full"]))
@click.option("--contention", type=click.Choice(CONTENTION_MODES))
@click.option("--jobs", "-j", type=int, default=1, show_default=True, help="Local processes.")
@click.option("--dask", metavar="ADDRESS|local",
              help="Run on a Dask cluster (needs pip install -e '.[dask]').")
@click.option("--out", "-o", metavar="FILE", help="Write the CSV here (default stdout).")
@translate_errors
def sweep_command(families, devices, microbatches, models, systems, global_batch, recompute,
                  contention, jobs, dask, out):
    """Evaluate a grid of configurations into a tidy CSV (one row per configuration).

    Columns name their level: formula_*, table_*, simulation_* (seconds, bytes).
    Invalid combinations are kept as rows with status=skipped and a reason.
    """
    from tabsched.sweep import SYSTEM_GRID, grid_tasks, rows_to_csv, run_sweep
    chosen_systems = SYSTEM_GRID if systems == "grid" else _names(systems)
    tasks = grid_tasks(families, _int_list("--devices", devices),
                       _int_list("--microbatches", microbatches), models=_names(models),
                       systems=chosen_systems, global_batch=global_batch, recompute=recompute,
                       contention=contention)
    rows = run_sweep(tasks, jobs=jobs, dask=dask, progress=_progress("sweep"))
    text = rows_to_csv(rows)
    skipped = sum(row["status"] != "ok" for row in rows)
    if out:
        with open(out, "w", newline="") as handle:
            handle.write(text)
        click.echo(f"wrote {out}: {len(rows)} configurations, {skipped} skipped", err=True)
    else:
        click.echo(text, nl=False)


@cli.command("study")
@click.argument("name")
@click.option("--out", "-o", default="study", show_default=True, metavar="DIR",
              help="Folder for the CSV, the figures and report.md.")
@click.option("--global-batch", type=int, help="Override the study's global batch.")
@click.option("--jobs", "-j", type=int, default=1, show_default=True, help="Local processes.")
@click.option("--dask", metavar="ADDRESS|local", help="Run on a Dask cluster.")
@translate_errors
def study_command(name, out, global_batch, jobs, dask):
    """Rerun a paper's experiment set (NAME: tabular-paper) and report its findings."""
    from tabsched.study import run_study
    report = run_study(name, out, jobs=jobs, dask=dask, global_batch=global_batch,
                       progress=_progress(name))
    click.echo(f"{report.configurations} configurations in {report.seconds:.2f} s; "
               f"wrote {', '.join(report.files)}", err=True)
    for number, finding in enumerate(report.findings, 1):
        click.echo(f"{number}. {finding.verdict}: {finding.claim}")


# -------------------------------------------------------------- pictures, traces
@cli.group("plot")
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
    from tabsched.plot import gantt
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
    from tabsched.plot import memory_plot
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
    from tabsched.plot import sweep_plot
    from tabsched.sweep import COLUMNS, read_sweep_csv
    if metric not in COLUMNS:
        raise click.ClickException(f"--metric {metric!r} is not a sweep column; numeric columns: "
                                   + ", ".join(c for c in COLUMNS if c.startswith(
                                       ("formula_", "table_", "simulation_"))))
    sweep_plot(read_sweep_csv(csv_file), out, devices=devices, metric=metric)
    click.echo(f"wrote {out}", err=True)


@cli.command("trace")
@click.argument("schedule")
@evaluation_options
@click.option("--out", "-o", required=True, metavar="FILE.json",
              help="Chrome trace / Perfetto JSON to write.")
@translate_errors
def trace_command(schedule, schedule_params, evaluation, out):
    """Export one simulated iteration of SCHEDULE as a Perfetto / Chrome trace."""
    from tabsched.trace import write_trace
    table, torch_schedule, costs = prepare_evaluation(schedule, schedule_params, evaluation)
    result = run_evaluation(table, torch_schedule, costs, evaluation)
    write_trace(result, out)
    click.echo(f"wrote {out}: open it in https://ui.perfetto.dev", err=True)


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
