"""Option groups the commands share, and turning their values into library objects."""

import functools
import os

import click

from tabsched.costs import ModelCosts, StageCosts, UnitCosts
from tabsched.costs.parallel import ATTENTION_IMPLEMENTATIONS
from tabsched.evaluate import evaluate
from tabsched.exceptions import InvalidParameterError
from tabsched.formats import TABLE_SUFFIXES, read_table
from tabsched.lower import CONTENTION_MODES
from tabsched.schedules import describe_parameters, families, generate, get_family

#: Help sections: which heading each option is listed under in ``--help`` (by the
#: option's parameter name; options not listed go under "Other options").
HELP_SECTIONS = {
    "Schedule": ("devices", "microbatches", "chunks", "waves", "variant", "pipelines",
                 "group_size", "stage_layers", "stage_layers_ratio", "layers", "extra_params",
                 "torch_legacy", "p2p"),
    "Costs without a model (slots)": ("forward", "backward", "input_grad", "weight_grad",
                                      "comm", "contention"),
    "Model, system and parallelism": ("model", "system", "microbatch_size", "recompute",
                                      "global_batch", "tensor_parallel", "sequence_parallel",
                                      "data_parallel", "attention", "optimizer_sharding",
                                      "overlap_grad_reduce", "blocking_sends"),
    "Memory and the iteration's tail": ("memory_budget", "strict", "grad_sync", "optimizer"),
    "Run-time variation (Monte Carlo)": ("cv", "transfer_cv", "stragglers", "slow_links",
                                         "replay", "replay_partial", "samples", "seed"),
    "Search": ("objective", "split_factor", "max_rounds"),
    "Running": ("jobs", "dask", "quiet"),
    "Output": ("level", "as_json", "out", "out_path", "output", "show_log", "width", "target",
               "drop_metadata", "no_transfers", "labels", "time_range", "metric", "logx",
               "logy", "capacity"),
}
_SECTION_OF = {name: section for section, names in HELP_SECTIONS.items() for name in names}


class SectionedCommand(click.Command):
    """A command whose ``--help`` lists its options under headings (``HELP_SECTIONS``).

    A command with options in one section only keeps click's plain "Options" list.
    """

    def format_options(self, ctx, formatter):
        sections = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                sections.setdefault(_SECTION_OF.get(param.name, "Other options"),
                                    []).append(record)
        if len(sections) <= 2:   # one section and --help: headings would only add noise
            super().format_options(ctx, formatter)
            return
        order = list(HELP_SECTIONS) + ["Other options"]
        for section in sorted(sections, key=order.index):
            with formatter.section(section):
                formatter.write_dl(sections[section])


def complete_schedule(ctx, param, incomplete):
    """Shell completion of SCHEDULE: family names, then table files."""
    from click.shell_completion import CompletionItem
    names = sorted({name for family in families() for name in (family.name, *family.aliases)})
    items = [CompletionItem(name) for name in names if name.startswith(incomplete)]
    return items + [CompletionItem(incomplete, type="file")]


def complete_preset(kind):
    """Shell completion of --model / --system: preset names, then TOML files."""
    def complete(ctx, param, incomplete):
        from click.shell_completion import CompletionItem

        from tabsched.costs._presets import preset_index
        last = incomplete.rpartition(",")[0]   # sweep takes comma lists
        prefix = f"{last}," if last else ""
        typed = incomplete[len(prefix):]
        items = [CompletionItem(prefix + name) for name in sorted(preset_index()[kind])
                 if name.startswith(typed)]
        return items + [CompletionItem(incomplete, type="file")]
    return complete


def complete_family(ctx, param, incomplete):
    """Shell completion of FAMILY... (compare, sweep): family names."""
    from click.shell_completion import CompletionItem
    return [CompletionItem(family.name) for family in families()
            if family.name.startswith(incomplete)]


RECOMPUTE_HELP = ("Activation recomputation: none, selective (the attention core) or full "
                  "(every layer; default: the model's).")
CONTENTION_HELP = ("none: transfers never wait; link: one FIFO per directed device pair; nic: "
                   "transfers between nodes also share each node's ports. Default: the "
                   "system's.")


def complete_study(ctx, param, incomplete):
    """Shell completion of a study's NAME."""
    from click.shell_completion import CompletionItem

    from tabsched.study import STUDIES
    return [CompletionItem(name) for name in STUDIES if name.startswith(incomplete)]


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
        click.option("--chunks", "-v", type=int,
                     help="Model chunks per device (multi-chunk families)."),
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


COST_OPTIONS = "--f/--i/--w (and --comm) or --model/--system"


def load_schedule(schedule, costs=None, memory_budget=None, **params):
    """A table from a family name and its parameters, or from a .csv/.json file.

    A cost-driven family (``zb-auto``) is built for ``costs`` (``None``: the
    user gave no cost option, which such a family refuses) and, unless its
    parameters say otherwise, within ``memory_budget``; other families ignore both.
    """
    if is_table_file(schedule):
        return read_table(schedule)
    family = get_family(schedule)
    accepted = set(family.parameter_names()) | set(LAYER_PARAMETERS)
    given = {key: value for key, value in params.items() if value is not None}
    if family.cost_driven:
        if costs is None:
            raise click.ClickException(
                f"{family.name} builds its order from costs: give {COST_OPTIONS} (commands "
                f"without cost options, such as show and convert, cannot build it)")
        given["costs"] = costs
        if memory_budget is not None:
            given.setdefault("memory_budget", memory_budget)
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
    from tabsched.formats.pytorch_csv import P2P_MODES     # only the commands that read tables need it
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
        from tabsched.formats.pytorch_csv import read_pytorch
        torch_schedule = read_pytorch(schedule, legacy=torch_legacy, p2p=p2p)
        return torch_schedule.table, torch_schedule
    return load_schedule(schedule, **params), None


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


#: Parallelism options: (option name, its flags, the keyword of ModelCosts).
PARALLEL_FLAGS = {"tensor_parallel": "--tensor-parallel/-t",
                  "sequence_parallel": "--sequence-parallel",
                  "data_parallel": "--data-parallel/-d", "attention": "--attention",
                  "optimizer_sharding": "--optimizer-sharding",
                  "overlap_grad_reduce": "--overlap-grad-reduce"}
PARALLEL_OPTIONS = tuple(PARALLEL_FLAGS) + ("blocking_sends",)


def parallel_options(command):
    """Tensor, sequence and data parallelism, attention, sends: options of model costs."""
    options = [
        click.option("--tensor-parallel", "-t", type=int,
                     help="Tensor ranks per pipeline stage (Megatron-LM; inside a node)."),
        click.option("--sequence-parallel", is_flag=True, default=None,
                     help="Sequence parallelism (needs -t > 1)."),
        click.option("--data-parallel", "-d", type=int,
                     help="Replicas of the pipeline; their gradient all-reduce ends the "
                          "iteration."),
        click.option("--attention", type=click.Choice(ATTENTION_IMPLEMENTATIONS),
                     help="eager: the s x s scores in memory; flash: fused (default eager)."),
        click.option("--optimizer-sharding", is_flag=True, default=None,
                     help="ZeRO-1: optimizer state divided over the -d replicas."),
        click.option("--overlap-grad-reduce", is_flag=True, default=None,
                     help="The data-parallel all-reduce runs beside the remaining backwards."),
        click.option("--blocking-sends", is_flag=True, default=None,
                     help="A transfer keeps its sender busy until it ends (Megatron-LM's "
                          "pipeline sends)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def model_options(command):
    """Options for model-based costs (seconds and bytes), the memory budget and the tail."""
    options = [
        click.option("--model", metavar="NAME|FILE", shell_complete=complete_preset("model"),
                     help="Transformer preset (see `tabsched presets`) or TOML file; needs "
                          "--system."),
        click.option("--system", metavar="NAME|FILE", shell_complete=complete_preset("system"),
                     help="System preset or TOML file; needs --model."),
        click.option("--microbatch-size", type=int,
                     help="Samples per full microbatch (default: the model's)."),
        click.option("--recompute", type=click.Choice(["none", "selective", "full"]),
                     help=RECOMPUTE_HELP),
        click.option("--memory-budget", metavar="SIZE",
                     help="Memory per device, e.g. 80GB (or 'capacity': the system's); "
                          "devices over it are reported."),
        click.option("--strict", is_flag=True,
                     help="Exit 3 if a device goes over --memory-budget."),
        click.option("--grad-sync", metavar="WHICH",
                     help="Gradient sync at the end: 'replicas', 'all' or stages (0,3,5)."),
        click.option("--optimizer", is_flag=True, help="An optimizer step per device at the end."),
    ]
    command = parallel_options(command)
    for option in reversed(options):
        command = option(command)
    return command


def given_parallel(options):
    """The parallelism options the user gave: ``{name: value}``."""
    return {name: options.get(name) for name in PARALLEL_OPTIONS
            if options.get(name) is not None}


def check_parallel_without_model(options):
    """Parallelism options need --model and --system: one line naming the first one given."""
    for name in PARALLEL_OPTIONS:
        if options.get(name) is not None:
            flag = PARALLEL_FLAGS.get(name, "--" + name.replace("_", "-"))
            raise click.ClickException(f"{flag} needs --model and --system")


def build_model_costs(model, system, microbatch_size, recompute, contention, unit_options,
                      parallel=None):
    """ModelCosts from the CLI's options; one-line errors for options that do not fit.

    ``parallel``: ``{name: value}`` of the parallelism options given (see
    ``PARALLEL_OPTIONS``).
    """
    if model is None or system is None:
        given, missing = ("--model", "--system") if system is None else ("--system", "--model")
        raise click.ClickException(f"{given} needs {missing} (see `tabsched presets`)")
    clashing = [flag for flag, value in unit_options.items() if value is not None]
    if clashing:
        raise click.ClickException(f"--model and --system replace {', '.join(clashing)}; "
                                   f"give one or the other")
    parallel = dict(parallel or {})
    for name in ("tensor_parallel", "data_parallel"):
        value = parallel.get(name)
        if value is not None and value < 1:
            raise click.ClickException(f"{PARALLEL_FLAGS[name]} must be >= 1, not {value}")
    if parallel.get("sequence_parallel") and (parallel.get("tensor_parallel") or 1) == 1:
        raise click.ClickException("--sequence-parallel needs --tensor-parallel/-t > 1 (it "
                                   "splits the sequence over the tensor ranks)")
    try:
        return ModelCosts(model, system, microbatch_size=microbatch_size, recompute=recompute,
                          contention=contention, **parallel)
    except InvalidParameterError as error:
        text = str(error)
        for name, flag in PARALLEL_FLAGS.items():
            if text.startswith(name):
                raise click.ClickException(f"{flag}{text[len(name):]}") from None
        raise


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
             "optimizer", "torch_legacy", "p2p") + PARALLEL_OPTIONS

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        evaluation = {name: kwargs.pop(name) for name in names}
        return command(*args, evaluation=evaluation, **kwargs)

    for decorate in (torch_options, model_options, cost_options, schedule_options):
        wrapper = decorate(wrapper)
    return wrapper


def check_layer_options(schedule_params, modelled):
    """Layer options change only model costs: say so on stderr rather than ignore them."""
    given = [name for name in LAYER_PARAMETERS if schedule_params.get(name) is not None]
    if given and not modelled:
        flags = ", ".join(_flag(name) for name in given)
        click.echo(f"note: {flags} split the model's layers over the stages, which only "
                   f"--model/--system costs read; these numbers are the same without "
                   f"{'it' if len(given) == 1 else 'them'}", err=True)


def layers_from_model(schedule_params, costs):
    """``--stage-layers-ratio`` without ``--layers`` splits the model's own layers."""
    if (schedule_params.get("stage_layers_ratio") is not None
            and schedule_params.get("layers") is None
            and schedule_params.get("stage_layers") is None
            and getattr(getattr(costs, "model", None), "layers", None)):
        return {**schedule_params, "layers": costs.model.layers}
    return schedule_params


def prepare_evaluation(schedule, schedule_params, options, level=None):
    """``(table, TorchSchedule or None, costs)`` from the evaluation options.

    The costs come first: a cost-driven family is built for them, and with a model a
    layer ratio without ``--layers`` takes the model's layers.
    """
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
    if not is_table_file(schedule):
        check_layer_options(schedule_params, modelled)
    if modelled:
        costs = build_model_costs(options["model"], options["system"],
                                  options["microbatch_size"], options["recompute"],
                                  options["contention"], units, given_parallel(options))
        schedule_params = layers_from_model(schedule_params, costs)
    else:
        for flag, name in (("--microbatch-size", "microbatch_size"),
                           ("--recompute", "recompute")):
            if options[name] is not None:
                raise click.ClickException(f"{flag} needs --model and --system")
        check_parallel_without_model(options)
        if options["contention"] == "nic":
            raise click.ClickException("--contention nic needs --system (it says which "
                                       "devices share a node)")
        costs = build_costs(options["forward"], options["backward"], options["input_grad"],
                            options["weight_grad"], options["comm"], options["contention"])
    given = modelled or any(value is not None for value in units.values())
    budget = (None if options["memory_budget"] is None
              else memory_budget_value(options["memory_budget"], costs))
    table, torch_schedule = load_with_torch(schedule, options["torch_legacy"], options["p2p"],
                                            costs=costs if given else None,
                                            memory_budget=budget, **schedule_params)
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
                     help="Measured durations: CSV rows op,duration (e.g. 3F12,31ms), or a "
                          "PyTorch profiler trace of a pipeline run (.json, .json.gz, or a "
                          "directory of them, one per rank). Every label must name an "
                          "operation or transfer of the table."),
        click.option("--replay-partial", is_flag=True,
                     help="Accept --replay labels that match nothing in the table (they are "
                          "listed in a note)."),
        click.option("--samples", type=int, default=default_samples,
                     help="Monte Carlo samples" + (f" (default {default_samples})."
                                                   if default_samples else
                                                   " (default 1000 with a variation option).")),
        click.option("--seed", type=int, default=0, show_default=True,
                     help="Seed of the random draws; the same seed gives the same numbers."),
    ]
    names = ("cv", "transfer_cv", "stragglers", "slow_links", "replay", "replay_partial",
             "samples", "seed")

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
                    replay=None, replay_partial=False, costs=None, **_):
    """The variation model the options describe (None if they describe none).

    ``costs`` (the run's cost model) lets options that need communication say so.
    """
    from tabsched.adapt import Noise, Replay, SlowLink, Straggler
    from tabsched.adapt.variation import Combined
    from tabsched.formats.kineto import TRACE_SUFFIXES
    parts = []
    if replay_partial and replay is None:
        raise click.ClickException("--replay-partial needs --replay FILE")
    if (slow_links or transfer_cv) and isinstance(costs, UnitCosts):
        flag = "--slow-link" if slow_links else "--transfer-cv"
        raise click.ClickException(f"{flag} varies transfers, which these costs do not have: "
                                   f"add --comm (the time of a transfer) or --model and "
                                   f"--system")
    if replay is not None:
        if isinstance(costs, StageCosts) and getattr(costs, "time_unit", "s") != "s":
            # measured seconds would be added to transfers priced in slots
            raise click.ClickException(
                f"--replay {replay}: measured durations are seconds, but --comm prices the "
                f"transfers in {costs.time_unit}; drop --comm, or evaluate with --model and "
                f"--system, whose times are seconds")
        if os.path.isdir(replay) or replay.endswith(TRACE_SUFFIXES):
            parts.append(Replay.from_kineto(replay, table=table, partial=replay_partial))
        else:
            replayed = Replay.from_csv(replay, partial=replay_partial)
            replayed.check(table)
            parts.append(replayed)
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


def check_samples(params):
    samples = params.get("samples")
    if samples is not None and samples < 1:
        raise click.ClickException(f"--samples must be >= 1, not {samples}")
    if params.get("seed") is not None and params["seed"] < 0:
        raise click.ClickException(f"--seed must be >= 0, not {params['seed']}")


def monte_carlo_from_options(table, costs, params, **lowering):
    """Monte Carlo for `eval` when a variation option or --samples asks for it."""
    from tabsched.adapt import monte_carlo
    check_samples(params)
    variation = build_variation(table, costs=costs, **params)
    if variation is None and params.get("samples") is None:
        return None
    samples = params["samples"] if params.get("samples") is not None else 1000
    return monte_carlo(table, costs, variation, samples=samples, seed=params["seed"],
                       **lowering)


def int_list(flag, text):
    try:
        values = [int(part) for part in str(text).split(",") if part.strip()]
    except ValueError:
        raise click.ClickException(f"{flag} {text!r}: expected integers separated by commas, "
                                   f"e.g. 4,8") from None
    if not values or min(values) < 1:
        raise click.ClickException(f"{flag} {text!r}: expected positive integers, e.g. 4,8")
    return values


def name_list(text):
    return [part.strip() for part in str(text).split(",") if part.strip()]
