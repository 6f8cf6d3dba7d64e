"""From the command line's option values to library objects.

A command collects its options (:mod:`tabsched.cli.options`) and asks here for what
they describe: the table (a family's or a file's), the execution (``--execution
FILE`` changed by the flags), the cost model that runs it, the memory budget, the
run-time variation; every problem is one line naming the option or file.
"""

import functools
import os

import click

from tabsched.cli.options import (EXECUTION_FLAGS, LAYER_PARAMETERS, PARALLEL_FLAGS,
                                  PARALLEL_OPTIONS, _flag)
from tabsched.costs import ModelCosts, StageCosts, UnitCosts
from tabsched.evaluate import evaluate
from tabsched.exceptions import InvalidParameterError, UnknownNameError
from tabsched.execution import Execution, load_execution
from tabsched.formats import TABLE_SUFFIXES, check_placement, read_table
from tabsched.schedules import describe_parameters, generate, get_family


def is_table_file(schedule):
    """True if ``schedule`` names a table file, not a family: it ends in a table suffix,
    or holds a path separator, or is an existing regular file that no family is called
    (a folder named ``1f1b`` in the working directory does not hide the family, nor a
    file of that name: ``./1f1b`` reads it)."""
    if os.path.splitext(schedule)[1].lower() in TABLE_SUFFIXES or os.sep in schedule:
        return True
    try:
        get_family(schedule)
    except UnknownNameError:
        return os.path.isfile(schedule)
    return False


COST_OPTIONS = "--f/--i/--w (and --comm) or --model/--system"


def load_schedule(schedule, costs=None, memory_budget=None, **params):
    """A table from a family name and its parameters, or from a .csv/.json file.

    A cost-driven family (``zb-auto``) is built for ``costs`` (``None``: the
    user gave no cost option, which such a family refuses) and, unless its
    parameters say otherwise, within ``memory_budget``; other families ignore both.
    """
    if is_table_file(schedule):
        return apply_to_file(schedule, read_table(schedule), params)
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
        # a missing option is a usage error (exit 2, with the usage line), as click's own
        raise click.UsageError(f"{family.name} needs {flags}",
                               ctx=click.get_current_context(silent=True))
    return generate(family.name, **given)


def apply_to_file(schedule, table, params):
    """``table`` (read from the file ``schedule``) with the options that can apply to a
    file applied: the layer split (``--stage-layers``, ``--layers`` split evenly, or
    ``--stage-layers-ratio`` with ``--layers`` or the model's), stored in the table as a
    family's would be. Every other
    schedule option (``-p``, ``-m``, ``--chunks``, ``--waves``, ``--param`` ...) would be
    ignored, since the file's cells fix them: it is refused, naming the option."""
    given = {key: value for key, value in params.items()
             if value is not None and key not in ("costs", "memory_budget")}
    fixed = sorted(key for key in given if key not in LAYER_PARAMETERS)
    if fixed:
        flags = ", ".join(_flag(name) for name in fixed)
        raise click.ClickException(
            f"{schedule}: {flags} cannot apply to a table file (its cells fix its devices, "
            f"microbatches and order); drop {'it' if len(fixed) == 1 else 'them'}, or give a "
            f"family name instead of the file")
    layers = {key: given[key] for key in LAYER_PARAMETERS if key in given}
    if not layers:
        return table
    from tabsched.schedules._layers import resolve_stage_layers
    if set(layers) == {"layers"} and table.stage_layers is not None:
        # the file's own split stands where it holds that many layers
        if sum(table.stage_layers) != layers["layers"]:
            raise click.ClickException(
                f"{schedule}: --layers {layers['layers']}: the file's stage_layers "
                f"({','.join(map(str, table.stage_layers))}) add up to "
                f"{sum(table.stage_layers)}; give --stage-layers to split them anew")
        return table
    split = resolve_stage_layers(os.path.basename(schedule), table.num_stages,
                                 stage_layers=layers.get("stage_layers"),
                                 ratio=layers.get("stage_layers_ratio"),
                                 layers=layers.get("layers"))
    return table if split is None else table.replace(stage_layers=split)


def load_with_torch(schedule, torch_legacy, p2p, **params):
    """``(table, TorchSchedule or None)``: a .csv is read as PyTorch writes it."""
    from tabsched.execution import P2P_MODES
    if p2p is not None and p2p not in ("ordered",) + P2P_MODES:
        raise click.ClickException(f"--p2p {p2p!r} is not one of ordered, "
                                   f"{', '.join(P2P_MODES)}")
    if is_table_file(schedule) and os.path.splitext(schedule)[1].lower() == ".csv":
        import dataclasses

        from tabsched.formats.pytorch_csv import read_pytorch
        torch_schedule = read_pytorch(schedule, legacy=torch_legacy,
                                      p2p="free" if p2p == "free" else "ordered")
        # as read_table refuses it: a CSV holds no family, so no replica family vouches
        check_placement(torch_schedule.table, schedule)
        table = apply_to_file(schedule, torch_schedule.table, params)
        if table is not torch_schedule.table:
            torch_schedule = dataclasses.replace(torch_schedule, table=table)
        return table, torch_schedule
    return load_schedule(schedule, **params), None


def build_costs(forward, backward, input_grad, weight_grad, comm, execution=None):
    """Slot-length costs (``UnitCosts``, or ``StageCosts`` with ``--comm``) run as
    ``execution`` (its contention and tail: these costs price no parallelism)."""
    execution = Execution() if execution is None else execution
    lengths = {"f": forward, "b": backward, "i": input_grad, "w": weight_grad}
    given = {key: value for key, value in lengths.items() if value is not None}
    if comm is None:
        return UnitCosts(**given, execution=execution)
    unit = UnitCosts(**given).lengths
    return StageCosts(unit[0], unit[1], unit[2], unit[3], comm=comm, time_unit="slots",
                      execution=execution.replace(contention=execution.contention or "none"))


#: The option each field is read from when it is not the field's own name.
_OPTION_OF = {"zero_stage": "optimizer_sharding", "optimizer_step": "optimizer"}


#: Fields that only model costs price: slot-length costs refuse them (a flag or a file).
MODEL_FIELDS = ("tensor_parallel", "sequence_parallel", "context_parallel", "expert_parallel",
                "data_parallel", "microbatch_size", "global_batch", "recompute", "zero_stage",
                "reshard_after_forward", "prefetch",
                "attention", "fp8", "cp_comm", "scatter_gather", "overlap_grad_reduce",
                "grad_bucket_size", "align_grad_reduce", "blocking_sends")


def execution_from_options(options, replicas_checked=True):
    """``(execution, sources)``: ``--execution FILE`` (else the default execution) with
    the run options that were given as field changes, and ``{field: source}`` of every
    field set, by a flag (``"--tensor-parallel/-t"``) or the file (its path), for messages.

    ``replicas_checked``: a data-parallel setting (ZeRO-1, the overlapped reduction and
    its buckets) with one replica is refused, naming it: it would change nothing (the
    ``execution`` command, which writes a base for later ``-d``, leaves it).

    ``options`` holds the commands' option values by name (``tensor_parallel``,
    ``optimizer_sharding``, ``optimizer``, ``grad_sync`` as its text...); a missing or
    None value was not given.
    """
    path = options.get("execution")
    base = load_execution(path) if path else Execution()
    default = Execution()
    sources = {field: path for field, value in base.to_dict().items()
               if value != default.to_dict()[field]} if path else {}
    for name in ("tensor_parallel", "context_parallel", "expert_parallel", "data_parallel"):
        value = options.get(name)
        if value is not None and value < 1:
            raise click.ClickException(f"{PARALLEL_FLAGS[name]} must be >= 1, not {value}")
    changes = {}
    for field, flag in EXECUTION_FLAGS.items():
        value = options.get(_OPTION_OF.get(field, field))
        if value is None or (field == "optimizer_step" and not value) or (
                field == "p2p" and value == "ordered"):     # compute_comms files' own order
            continue
        if field == "zero_stage":
            value = 1 if value else 0
        elif field == "grad_sync":
            value = parse_grad_sync(value)
        changes[field] = value
        sources[field] = flag
    _zero_options(options, base, changes, sources)
    if changes.get("sequence_parallel") and changes.get("tensor_parallel",
                                                        base.tensor_parallel) == 1:
        raise click.ClickException("--sequence-parallel needs --tensor-parallel/-t > 1 (it "
                                   "splits the sequence over the tensor ranks)")
    try:
        execution = base.replace(**changes) if changes else base
    except InvalidParameterError as error:
        raise click.ClickException(_named(str(error), sources)) from None
    for field in ("grad_bucket_size", "align_grad_reduce"):
        if field in sources and not execution.overlap_grad_reduce:
            raise click.ClickException(
                f"{_given(field, execution, sources)} applies to the overlapped reduction "
                f"only (with --overlap-grad-reduce); the reduction after the backward is "
                f"priced as one message per device")
    if "cp_comm" in sources and execution.context_parallel == 1:
        raise click.ClickException(f"{_given('cp_comm', execution, sources)} applies to "
                                   f"--context-parallel > 1 only")
    if replicas_checked and execution.gradient_replicas == 1:
        _refuse_without_replicas(execution, sources)
    return execution, sources


def _given(field, execution, sources):
    """Where the user set ``field``: its flag as given (``--no-align-grad-reduce``,
    ``--zero 1``) or ``FILE: field``."""
    source = sources[field]
    if not source.startswith("--"):
        return f"{source}: {field}"
    if field == "align_grad_reduce":
        return "--align-grad-reduce" if execution.align_grad_reduce else \
            "--no-align-grad-reduce"
    if source == "--zero":
        return f"--zero {execution.zero_stage}"
    return source


def _refuse_without_replicas(execution, sources):
    """One line for a data-parallel setting given with ``d = 1``, where it does nothing."""
    for field, given, what in (
            ("zero_stage", execution.zero_stage == 1,
             "ZeRO-1 (optimizer state sharded over the replicas)"),
            ("overlap_grad_reduce", execution.overlap_grad_reduce,
             "the overlapped data-parallel reduction")):
        if given and field in sources:
            raise click.ClickException(f"{_given(field, execution, sources)} needs "
                                       f"--data-parallel/-d > 1: with one replica {what} "
                                       f"changes nothing")


def _zero_options(options, base, changes, sources):
    """``--zero N`` (``--optimizer-sharding`` is ``--zero 1``) and the FSDP options that
    only ZeRO-3 reads, into ``changes``; one line for a combination that cannot be."""
    zero = options.get("zero_stage")
    if zero is not None:
        if options.get("optimizer_sharding") and zero != 1:
            raise click.ClickException(f"--optimizer-sharding is --zero 1; it contradicts "
                                       f"--zero {zero}")
        changes["zero_stage"], sources["zero_stage"] = zero, "--zero"
    stage = changes.get("zero_stage", base.zero_stage)
    for field in ("reshard_after_forward", "prefetch"):
        if changes.get(field) is not None and stage != 3:
            flag = "--prefetch" if field == "prefetch" else (
                "--reshard-after-forward" if changes[field] else "--no-reshard-after-forward")
            raise click.ClickException(f"{flag} applies to --zero 3 only (FSDP's parameter "
                                       f"all-gathers), not to ZeRO stage {stage}")


def _named(text, sources):
    """An execution's message with the field it starts with named as the user set it: the
    flag (``--tensor-parallel/-t 3 does not divide ...``) or the file (``run.toml: ...``)."""
    field = next((field for field in sorted(sources, key=len, reverse=True)
                  if text.startswith(field)), None)
    if field is None:
        return text
    source = sources[field]
    if source.startswith("--"):
        return f"{source}{text[len(field):]}"
    return f"{source}: {text}"


def check_execution_without_model(execution, sources):
    """Slot-length costs price no parallelism: a field only model costs read, set by a flag
    or a file, is one line naming it; so is ``nic`` contention, which needs a system."""
    for field in MODEL_FIELDS:
        source = sources.get(field)
        if source is None:
            continue
        if source.startswith("--"):
            raise click.ClickException(f"{source} needs --model and --system")
        raise click.ClickException(f"{source}: {field} {_shown(getattr(execution, field))} "
                                   f"needs --model and --system")
    if execution.contention == "nic":
        source = sources.get("contention", "--contention")
        where = "--contention nic" if source.startswith("--") else \
            f"{source}: contention 'nic'"
        raise click.ClickException(f"{where} needs --system (it says which devices share a "
                                   f"node)")


def _shown(value):
    """A field's value as the file wrote it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, str) else str(value)


def check_parallel_without_model(options):
    """Parallelism options need --model and --system: one line naming the first one given."""
    for name in PARALLEL_OPTIONS:
        if options.get(name) is not None:
            flag = PARALLEL_FLAGS.get(name, "--" + name.replace("_", "-"))
            raise click.ClickException(f"{flag} needs --model and --system")


def build_model_costs(model, system, execution, sources=None, unit_options=None):
    """ModelCosts of ``model`` on ``system`` run as ``execution``; one-line errors naming
    the option or file of a field that does not fit (``sources``: see
    :func:`execution_from_options`)."""
    if model is None or system is None:
        given, missing = ("--model", "--system") if system is None else ("--system", "--model")
        raise click.ClickException(f"{given} needs {missing} (see `tabsched presets`)")
    clashing = [flag for flag, value in (unit_options or {}).items() if value is not None]
    if clashing:
        raise click.ClickException(f"--model and --system replace {', '.join(clashing)}; "
                                   f"give one or the other")
    try:
        return ModelCosts(model, system, execution)
    except InvalidParameterError as error:
        raise click.ClickException(_named(str(error), sources or {})) from None


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


def costs_from_options(options, modelled=None):
    """The cost model the run options describe, and the execution it runs.

    With ``--model``/``--system``: ``ModelCosts`` run as ``--execution FILE`` changed by
    the flags; without: slot lengths (``--f/--b/--i/--w``, ``--comm``) run as the same
    execution, whose parallel degrees, batch and recompute they cannot price (a flag or a
    file field that sets one is refused, naming it).
    """
    if modelled is None:
        modelled = options.get("model") is not None or options.get("system") is not None
    units = {"--f": options.get("forward"), "--b": options.get("backward"),
             "--i": options.get("input_grad"), "--w": options.get("weight_grad"),
             "--comm": options.get("comm")}
    if modelled:
        execution, sources = execution_from_options(options)
        return build_model_costs(options.get("model"), options.get("system"), execution,
                                 sources, units)
    for flag, name in (("--microbatch-size", "microbatch_size"),
                       ("--recompute", "recompute")):
        if options.get(name) is not None:
            raise click.ClickException(f"{flag} needs --model and --system")
    check_parallel_without_model(options)
    execution, sources = execution_from_options(options)
    check_execution_without_model(execution, sources)
    return build_costs(options.get("forward"), options.get("backward"),
                       options.get("input_grad"), options.get("weight_grad"),
                       options.get("comm"), execution)


def microbatches_from_execution(schedule_params, costs):
    """``--microbatches`` from the execution's global batch when it is not given; when it
    is, it must be what the global batch gives (one line naming both otherwise)."""
    execution = costs.execution
    derived = execution.microbatches
    if derived is None:
        return schedule_params
    given = schedule_params.get("microbatches")
    if given is None:
        return {**schedule_params, "microbatches": derived}
    if given != derived:
        raise click.ClickException(
            f"--microbatches {given}, but the execution's global_batch "
            f"{execution.global_batch} over data_parallel {execution.data_parallel} x "
            f"microbatch_size {execution.microbatch_size} gives {derived} microbatches per "
            f"pipeline")
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
    if not is_table_file(schedule):
        check_layer_options(schedule_params, modelled)
    costs = costs_from_options(options, modelled)
    if modelled:
        schedule_params = layers_from_model(schedule_params, costs)
    if not is_table_file(schedule):
        schedule_params = microbatches_from_execution(schedule_params, costs)
    units = (options["forward"], options["backward"], options["input_grad"],
             options["weight_grad"], options["comm"])
    given = modelled or any(value is not None for value in units)
    budget = (None if options["memory_budget"] is None
              else memory_budget_value(options["memory_budget"], costs))
    table, torch_schedule = load_with_torch(schedule, options["torch_legacy"], options["p2p"],
                                            costs=costs if given else None,
                                            memory_budget=budget, **schedule_params)
    return table, torch_schedule, costs


def run_evaluation(table, torch_schedule, costs, options):
    """Evaluate with the memory budget the options ask for; the costs run their execution
    (its contention and tail: ``--grad-sync``, ``--optimizer``, an execution file)."""
    if options["strict"] and options["memory_budget"] is None:
        raise click.ClickException("--strict needs --memory-budget")
    budget = (None if options["memory_budget"] is None
              else memory_budget_value(options["memory_budget"], costs))
    run = torch_schedule.evaluate if torch_schedule is not None else functools.partial(
        evaluate, table)
    return run(costs, memory_budget=budget)


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
