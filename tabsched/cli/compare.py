"""``tabsched compare``, ``sweep`` and ``study``: families side by side, grids, paper studies."""


import click

from tabsched.cli.build import build_model_costs, execution_from_options, int_list, name_list
from tabsched.cli.format import (check_html_path, echo_json, format_columns, format_memory,
                                 format_number, format_time, format_tokens, progress_reporter,
                                 translate_errors, write_html_report)
from tabsched.cli.options import (CONTENTION_HELP, PARALLEL_OPTIONS, RECOMPUTE_HELP,
                                  SectionedCommand, complete_family, complete_preset,
                                  complete_study, execution_option, html_option,
                                  parallel_options)
from tabsched.execution import CONTENTION_MODES, RECOMPUTE_MODES


def slot_length_options(default_note):
    """``--f/--b/--i/--w``: slot lengths of the table level."""
    options = [click.option(f"--{kind}", f"length_{kind}", type=float,
                            help=f"{name} slot length at the table level ({default_note}).")
               for kind, name in (("f", "Forward"), ("b", "Full backward"),
                                  ("i", "Input-grad"), ("w", "Weight-grad"))]

    def decorator(command):
        for option in reversed(options):
            command = option(command)
        return command
    return decorator


#: What --global-batch means, in every command that takes it.
GLOBAL_BATCH_HELP = ("Samples per iteration over all data-parallel replicas, as Megatron-LM's "
                     "--global-batch-size counts them: a microbatch holds global-batch / "
                     "(d x M). (It used to count one replica's samples; with d = 1 nothing "
                     "changes.)")


def simulation_options(command=None, *, lists=False):
    """What compare and sweep share: the batch, recompute, contention and parallelism of
    the simulation level, and the slot lengths of the table level. ``lists=True``
    (``sweep``): the tensor and data degrees, the microbatch size and recompute take
    lists, one configuration each."""
    if command is None:
        return lambda command: simulation_options(command, lists=lists)
    recompute = (click.option("--recompute", multiple=True, metavar="MODE,...",
                              help=RECOMPUTE_HELP + " A list (none,full) sweeps them.")
                 if lists else
                 click.option("--recompute", type=click.Choice(["none", "selective", "full"]),
                              help=RECOMPUTE_HELP))
    batch = GLOBAL_BATCH_HELP + (" With --microbatch-size and no -m, each replica runs "
                                 "global-batch / (d x microbatch size) microbatches."
                                 if lists else "")
    options = [click.option("--global-batch", type=int, help=batch)]
    if lists:
        options.append(click.option("--microbatch-size", multiple=True, metavar="B,...",
                                    help="Samples per microbatch, e.g. 1,2 (default: the "
                                         "model's, or global-batch / (d x M))."))
    options += [
        recompute,
        click.option("--contention", type=click.Choice(CONTENTION_MODES),
                     help=CONTENTION_HELP),
        execution_option,
        parallel_options(lists=lists),
        slot_length_options("default 1"),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _fits(simulation):
    """``yes``, or how far the fullest device goes over its memory (``+53 GB``)."""
    if simulation["fits"]:
        return "yes"
    return "+" + format_memory(simulation["over_capacity"], simulation["memory_unit"])


def _capacity_line(rows, capacity, system):
    """Which families go over the device's memory, and how that ranks them."""
    over = [row for row in rows if not row.simulation["fits"]]
    memory = format_memory(capacity, rows[0].simulation["memory_unit"])
    if not over:
        return f"device memory {memory} ({system}): every family fits"
    if len(over) == len(rows):
        return (f"device memory {memory} ({system}): no family fits (fits: how far the "
                f"fullest device goes over); ranked by iteration time among themselves")
    return (f"device memory {memory} ({system}): {len(over)} of {len(rows)} families go over "
            f"(fits: by how much on the fullest device); they rank after every family "
            f"that fits")


def _lengths(options):
    """``{"f": ..., ...}`` of the slot-length options given (pops them from ``options``)."""
    return {kind: options.pop(f"length_{kind}") for kind in "fbiw"
            if options.get(f"length_{kind}") is not None} or None


def _parallel(options):
    """The parallelism options given (popped from ``options``)."""
    values = {name: options.pop(name, None) for name in PARALLEL_OPTIONS}
    return {name: value for name, value in values.items() if value is not None}


def _execution(options, parallel, recompute, contention):
    """``(execution, sources, file's execution or None)`` of ``--execution FILE`` and the
    run options (see :func:`~tabsched.cli.options.execution_from_options`)."""
    path = options.pop("execution", None)
    execution, sources = execution_from_options(dict(parallel, execution=path,
                                                     recompute=recompute,
                                                     contention=contention))
    base = execution_from_options({"execution": path})[0] if path else None
    return execution, sources, base


@click.command("compare", cls=SectionedCommand)
@click.argument("families", nargs=-1, required=True, metavar="FAMILY...",
                shell_complete=complete_family)
@click.option("--devices", "-p", type=int, required=True, help="Pipeline depth.")
@click.option("--microbatches", "-m", type=int, required=True, help="Microbatches per iteration.")
@click.option("--model", default="paper-128l", show_default=True, metavar="NAME|FILE",
              shell_complete=complete_preset("model"),
              help="Transformer for the simulation level.")
@click.option("--system", default="mid_nw_mid_cp", show_default=True, metavar="NAME|FILE",
              shell_complete=complete_preset("system"),
              help="System for the simulation level.")
@simulation_options
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list, one object per family.")
@html_option("the table of the families and a Gantt chart of each one's simulation")
@translate_errors
def compare_command(families, devices, microbatches, model, system, global_batch, recompute,
                    contention, as_json, html_path, **options):
    """Compare FAMILY... at the formula, table and simulation levels.

    A FAMILY may carry parameters: hanayo:waves=2, chimera:stage_layers_ratio=1:2.
    Each level ranks the families (1 = best); a * marks a family whose rank
    differs between levels. The table level runs the table with the slot
    lengths --f/--b/--i/--w (default F=1 B=2 I=1 W=1) and no communication.
    """
    from tabsched.compare import compare, describe_lengths, disagreements
    if html_path:
        check_html_path(html_path, inputs=(options.get("execution"), model, system))
    lengths = _lengths(options)
    parallel = _parallel(options)
    path = options.get("execution")
    execution, sources, base = _execution(options, parallel, recompute, contention)
    if parallel or base is not None:  # the options against the model and system, up front
        build_model_costs(model, system, execution, sources)
    rows = compare(families, devices, microbatches, model=model, system=system,
                   global_batch=global_batch, recompute=recompute, contention=contention,
                   lengths=lengths, parallel=parallel, execution=base)
    if html_path:
        write_html_report(rows, html_path)
    if as_json:
        echo_json([row.to_dict() for row in rows])
        return
    evaluated = [row for row in rows if not row.error]
    capacity = next((row.simulation["memory_capacity"] for row in evaluated), None)
    speeds = any(row.simulation["throughput"] is not None for row in evaluated)
    header = (["family", "formula bubble", "peak (mb)", "rank", "table bubble", "slots", "rank",
               "iteration", "idle"] + (["tokens/s/GPU", "MFU"] if speeds else [])
              + ["peak act", "peak mem"] + (["fits"] if capacity is not None else [])
              + ["rank", ""])
    body = []
    skipped = [row for row in rows if row.error]
    for row in evaluated:
        f, t, sim = row.formula, row.table, row.simulation
        peak = f["peak_activation"]
        run = sim["throughput"]
        body.append(
            [row.label,
             "-" if f["bubble_ratio"] is None else f"{f['bubble_ratio']:.1%}",
             "-" if not peak else format_number(max(peak)),
             str(row.ranks["formula"] or "-"),
             f"{t['bubble_ratio']:.1%}", format_number(t['slots']), str(row.ranks["table"]),
             format_time(sim["makespan"], sim["time_unit"]), f"{sim['bubble_ratio']:.1%}"]
            + ([format_tokens(run["tokens_per_s_per_gpu"]), f"{run['mfu']:.1%}"]
               if speeds else [])
            + [format_memory(max(sim["peak_activation"]), sim["memory_unit"]),
               format_memory(max(sim["peak_memory"]), sim["memory_unit"])]
            + ([_fits(sim)] if capacity is not None else [])
            + [str(row.ranks["simulation"]), "*" if row.disagrees else ""])
    setting = " ".join(f"{key}={value}" for key, value in parallel.items())
    click.echo(f"{devices} devices, {microbatches} microbatches; simulation: {model} on "
               f"{system}" + (f", global batch {global_batch}" if global_batch else "")
               + (f", {setting}" if setting else "")
               + (f", execution {path}" if path else ""))
    click.echo(f"levels: formula (closed form at the table's slot lengths; peak in "
               f"microbatches' stage activations) | table (idle share, slot lengths "
               f"{describe_lengths(lengths)}, no communication) | simulation "
               f"(peak act / peak mem: the fullest device)")
    if body:
        click.echo(format_columns([header] + body))
    if capacity is not None and evaluated:
        click.echo(_capacity_line(evaluated, capacity, system))
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
    elif any(row.disagrees for row in rows if not row.error):
        # ranks differ, but no two families are in opposite orders: one level ties what
        # another orders (a family over the device's memory ranks after those that fit)
        click.echo("no two families in opposite orders at two levels; * marks a rank that "
                   "differs where one level ties families another orders")
    else:
        click.echo("rankings agree at every level")


@click.command("sweep", cls=SectionedCommand)
@click.argument("families", nargs=-1, required=True, metavar="FAMILY...",
                shell_complete=complete_family)
@click.option("--devices", "-p", required=True, multiple=True, metavar="P,...",
              help="Pipeline depths, e.g. 4,8 or -p 4 -p 8.")
@click.option("--microbatches", "-m", multiple=True, metavar="M,...",
              help="Microbatch counts per replica, e.g. 8,16,32 or -m 8 -m 16 (default: "
                   "global-batch / (d x microbatch size)).")
@click.option("--model", "--models", "models", multiple=True, metavar="NAME,...",
              shell_complete=complete_preset("model"),
              help="Transformer presets or TOML files, e.g. paper-128l,gpt3-175b (repeatable; "
                   "default paper-128l).")
@click.option("--system", "--systems", "systems", multiple=True, metavar="NAME,...|grid",
              shell_complete=complete_preset("system"),
              help="Systems (repeatable); 'grid', the default, is the tabular paper's 3x3 "
                   "grid.")
@simulation_options(lists=True)
@click.option("--jobs", "-j", type=int, default=1, show_default=True, help="Local processes.")
@click.option("--dask", metavar="ADDRESS|local",
              help="Run on a Dask cluster (needs the dask extra: pip install 'tabsched[dask]').")
@click.option("--out", "-o", metavar="FILE", help="Write the CSV here (default stdout).")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar on stderr.")
@translate_errors
def sweep_command(families, devices, microbatches, models, systems, global_batch,
                  microbatch_size, recompute, contention, jobs, dask, out, quiet, **options):
    """Evaluate a grid of configurations into a tidy CSV (one row per configuration).

    Columns name their level: formula_*, table_*, simulation_* (seconds, bytes),
    and every field of the execution has a column. -t, -d, --microbatch-size and
    --recompute take lists: every combination is a configuration. Invalid
    combinations are kept as rows with status=skipped and a reason. The table
    level uses the slot lengths --f/--b/--i/--w (default F=1 B=2 I=1 W=1).
    """
    from tabsched.files import atomic_write, check_output_path
    from tabsched.sweeps import SYSTEM_GRID, grid_tasks, rows_to_csv, run_sweep
    if out:
        check_output_path(out)   # before the sweep, not after it
    models = name_list(",".join(models)) or ["paper-128l"]
    systems = name_list(",".join(systems)) or ["grid"]
    chosen_systems = [name for system in systems
                      for name in (SYSTEM_GRID if system == "grid" else (system,))]
    lengths = _lengths(options)
    axes = {"tensor_parallel": _int_axis("--tensor-parallel/-t",
                                         options.pop("tensor_parallel")),
            "data_parallel": _int_axis("--data-parallel/-d", options.pop("data_parallel")),
            "microbatch_size": _int_axis("--microbatch-size", microbatch_size),
            "recompute": _recompute_axis(recompute)}
    single = {name: values[0] for name, values in axes.items()
              if values is not None and len(values) == 1}
    parallel = _parallel(options)
    # the options as one execution: each degree's largest value stands for its list (the
    # combinations are checked one by one, as rows)
    degrees = {name: max(axes[name]) for name in ("tensor_parallel", "data_parallel")
               if axes[name] is not None}
    path = options.get("execution")
    execution, sources, base = _execution(options, {**parallel, **degrees},
                                          single.get("recompute"), contention)
    batch = global_batch if global_batch is not None else (base.global_batch if base
                                                           else None)
    given_size = axes["microbatch_size"] is not None
    if not microbatches and (batch is None or not (given_size or (base and
                                                                  base.microbatch_size))):
        raise click.ClickException("--microbatches/-m is needed unless --global-batch and "
                                   "--microbatch-size give it (each replica runs global-batch "
                                   "/ (d x microbatch size) microbatches)")
    if microbatches and batch is not None and given_size:
        whose = "--global-batch" if global_batch is not None else \
            f"the global_batch of {path}"
        raise click.ClickException(f"give two of --microbatches/-m, --microbatch-size and "
                                   f"{whose}: the third follows (global batch = d x M x "
                                   f"microbatch size)")
    if (parallel or base is not None or {"tensor_parallel", "data_parallel"} & set(single)) \
            and all(
            values is None or len(values) == 1 for values in axes.values()):
        # a bad -t or -d is a mistake, not a configuration to skip (lists: a combination
        # the model or system refuses is a skipped row, as in any grid)
        check = execution.replace(global_batch=None, microbatch_size=None)
        for model in models:
            for system in chosen_systems:
                build_model_costs(model, system, check, sources)
    tasks = grid_tasks(families, int_list("--devices", ",".join(devices)),
                       int_list("--microbatches", ",".join(microbatches))
                       if microbatches else None,
                       models=models, systems=chosen_systems, global_batch=global_batch,
                       contention=contention, lengths=lengths, parallel=parallel,
                       execution=base, **axes)
    rows = run_sweep(tasks, jobs=jobs, dask=dask,
                     progress=progress_reporter("sweep", quiet=quiet))
    text = rows_to_csv(rows)
    skipped = sum(row["status"] != "ok" for row in rows)
    if out:
        atomic_write(out, text, newline="")
        click.echo(f"wrote {out}: {len(rows)} configurations, {skipped} skipped", err=True)
    else:
        click.echo(text, nl=False)


def _int_axis(flag, given):
    """The values of a list option (``-t 4,8`` or ``-t 4 -t 8``), or None if not given."""
    return int_list(flag, ",".join(given)) if given else None


def _recompute_axis(given):
    """The recompute modes of ``--recompute none,full``, or None if not given."""
    if not given:
        return None
    modes = name_list(",".join(given))
    for mode in modes:
        if mode not in RECOMPUTE_MODES:
            raise click.ClickException(f"--recompute {','.join(given)!r}: {mode!r} is not one "
                                       f"of {', '.join(RECOMPUTE_MODES)}")
    if not modes:
        raise click.ClickException(f"--recompute {','.join(given)!r}: expected modes "
                                   f"separated by commas, e.g. none,full")
    return modes


@click.command("study", cls=SectionedCommand)
@click.argument("name", shell_complete=complete_study)
@click.option("--out", "-o", default="study", show_default=True, metavar="DIR",
              help="Folder for the CSV, the figures and report.md.")
@click.option("--global-batch", type=int,
              help="Override the study's global batch: samples per iteration over all "
                   "data-parallel replicas, as Megatron-LM counts them (the studies run d = "
                   "1, so a microbatch holds global-batch / M, as before).")
@slot_length_options("tabular-paper default: F=1 B=2 I=1 W=1")
@click.option("--jobs", "-j", type=int, default=1, show_default=True, help="Local processes.")
@click.option("--dask", metavar="ADDRESS|local", help="Run on a Dask cluster.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar on stderr.")
@translate_errors
def study_command(name, out, global_batch, jobs, dask, quiet, **options):
    """Rerun a paper's experiment set and report its findings.

    NAME: tabular-paper (the tabular-schedule paper's comparison) or
    megatron-recompute (Korthikanti et al. 2022, Table 5: measured iteration
    times against tabsched's).
    """
    from tabsched.compare import slot_lengths
    from tabsched.study import STUDIES, run_study
    lengths = _lengths(options)
    if name == "megatron-recompute":
        # its eight runs are measured ones: their batch is the paper's, and they take
        # seconds serially; an option that would change nothing is refused, not ignored
        given = [option for option, value in (("--global-batch", global_batch),
                                              ("-j/--jobs", jobs != 1), ("--dask", dask))
                 if value not in (None, False)]
        if given:
            raise click.ClickException(
                f"{given[0]} does not apply to megatron-recompute: its eight runs are "
                f"measured iterations at the paper's own global batch, evaluated serially "
                f"in seconds")
    if lengths is not None:
        if name == "megatron-recompute":
            raise click.ClickException("--f/--b/--i/--w set the table level of "
                                       "tabular-paper; megatron-recompute has no table level")
        base = dict(zip("fbiw", STUDIES.get(name, {}).get("lengths", (1.0,) * 4)))
        lengths = slot_lengths({**base, **lengths})
    report = run_study(name, out, jobs=jobs, dask=dask, global_batch=global_batch,
                       progress=progress_reporter(name, quiet=quiet), lengths=lengths)
    click.echo(f"{report.configurations} configurations in {report.seconds:.2f} s; "
               f"wrote {', '.join(report.files)}", err=True)
    for number, finding in enumerate(report.findings, 1):
        click.echo(f"{number}. {finding.verdict}: {finding.claim}")
