"""``tabsched plan``: the fastest execution of a model on N GPUs, searched and explained."""

import os

import click

from tabsched.cli.build import int_list, name_list
from tabsched.cli.format import (OverBudget, check_html_path, echo_json, format_columns,
                                 format_memory, format_time, progress_reporter, translate_errors,
                                 write_html_report)
from tabsched.cli.options import (SectionedCommand, complete_preset, html_option,
                                  slice_partition_option)
from tabsched.exceptions import MemoryBudgetError


def _choices(flag, text, allowed):
    values = name_list(text)
    for value in values:
        if value not in allowed:
            raise click.ClickException(f"{flag} {value!r} is not one of {', '.join(allowed)}")
    return values


def _zero_stages(text):
    """``--zero``: ``both`` (0 and 1), ``all`` (0 to 3) or a list of stages."""
    if text in ("both", "all"):
        return (0, 1) if text == "both" else (0, 1, 2, 3)
    stages = _choices("--zero", text, ("0", "1", "2", "3"))
    if not stages:
        raise click.ClickException("--zero names no stage: give a list of 0 to 3, both or "
                                   "all")
    return tuple(sorted({int(stage) for stage in stages}))


@click.command("plan", cls=SectionedCommand)
@click.argument("model", shell_complete=complete_preset("model"))
@click.argument("system", shell_complete=complete_preset("system"))
@click.option("--gpus", "-n", type=int, required=True,
              help="Every GPU of the run (t x cp x p x d).")
@click.option("--global-batch", type=int, required=True,
              help="Samples per iteration over all data-parallel replicas (Megatron-LM's "
                   "--global-batch-size).")
@click.option("--families", metavar="NAME,...",
              help="Schedule families (or name:key=value specs) to search; default all.")
@click.option("--tensor-parallel", "-t", "tensor_degrees", metavar="T,...",
              help="Tensor degrees to consider, e.g. 4,8 (default every one that divides).")
@click.option("--pipeline-parallel", "-p", "pipeline_degrees", metavar="P,...",
              help="Pipeline depths to consider (default every one that divides).")
@click.option("--context-parallel", "context_degrees", metavar="CP,...",
              help="Context degrees to consider, e.g. 1,2,4 (default the execution's, 1): "
                   "the sequence split CP ways (needs attention flash in --execution).")
@click.option("--expert-parallel", "expert_degrees", metavar="EP,...",
              help="Expert degrees to consider for a mixture-of-experts model, e.g. 1,8 "
                   "(default the execution's, 1): the routed experts split over EP of the "
                   "data-parallel ranks.")
@click.option("--microbatch-size", "microbatch_sizes", metavar="B,...",
              help="Microbatch sizes to consider, e.g. 1,2 (default every one that divides).")
@click.option("--recompute", "recompute_modes", metavar="MODE,...",
              help="Recompute modes to consider: none, selective, full (default all).")
@click.option("--max-chunks", type=int, help="Most model chunks per device (default 4).")
@click.option("--zero", default="both", show_default=True, metavar="STAGE,...",
              help="ZeRO stages to consider: a list of 0 to 3 (1: optimizer state sharded, "
                   "2: and gradients, 3: and parameters, FSDP), both (0,1) or all.")
@click.option("--sequence-parallel", "sequence_parallel_choice",
              type=click.Choice(["both", "on", "off"]), default="both", show_default=True,
              help="Sequence parallelism (where t > 1).")
@click.option("--uneven", type=int,
              help="Most layers the first and last stage may hold fewer than a middle one "
                   "(default 3; 0: even splits only).")
@click.option("--cross-node-tensor", "--cross-node", "cross_node", is_flag=True,
              help="Also consider tensor groups larger than a node (whole nodes; their "
                   "collectives run on the network).")
@click.option("--sequence-slices", "slice_counts", metavar="K[,K...]",
              help="Also search each configuration with every sequence cut into K slices "
                   "(Seq1F1B), beside whole sequences; K must divide the model's sequence, "
                   "and named families must slice (not zb-auto, zbv-auto, dualpipe, "
                   "dualpipev).")
@click.option("--slice-lead", "slice_leads", type=click.Choice(["both", "seq1f1b", "kept"]),
              default="both", show_default=True,
              help="--sequence-slices: the leads to search: Seq1F1B's short warm-up (least "
                   "memory), the unsliced row's lead at slice grain, or both.")
@slice_partition_option
@click.option("--memory-budget", metavar="SIZE",
              help="A device's memory, e.g. 80GB (default 'capacity': the system's "
                   "memory_capacity).")
@click.option("--execution", metavar="FILE",
              help="The execution every configuration starts from (contention, blocking "
                   "sends, attention...); the search sets its degrees, batch, recompute, ZeRO.")
@click.option("--tie-band", type=float,
              help="Fraction of the best within which configurations are tied (default "
                   "0.035: the model's measured error).")
@click.option("--exhaustive", is_flag=True,
              help="Simulate every configuration (no bound prunes): the same answer, slower.")
@click.option("--top", type=int, default=10, show_default=True, help="Rows to show.")
@click.option("--explain", is_flag=True, help="Say why the winner beats the next best.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
@click.option("--out", "-o", metavar="FILE.csv", help="Write the rows as CSV here.")
@click.option("--save-executions", metavar="DIR",
              help="Write each row's execution as DIR/rank-<k>.toml.")
@click.option("--jobs", "-j", type=int, default=1, show_default=True, help="Local processes.")
@click.option("--dask", metavar="ADDRESS|local", help="Run the simulations on a Dask cluster.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar on stderr.")
@html_option("the ranked executions with their tie band and the best one's run")
@translate_errors
def plan_command(model, system, gpus, global_batch, families, tensor_degrees,
                 pipeline_degrees, context_degrees, expert_degrees, microbatch_sizes,
                 recompute_modes,
                 max_chunks, zero, sequence_parallel_choice, uneven, cross_node,
                 slice_counts, slice_leads, slice_partition, memory_budget, execution, tie_band, exhaustive,
                 top, explain, as_json,
                 out, save_executions, jobs, dask, quiet, html_path):
    """Search the executions of MODEL on --gpus GPUs of SYSTEM for the fastest that fits.

    Every split t x p x d (t x cp x p x d with --context-parallel), schedule family and its
    chunks, microbatch size, layer split (even, or lighter first and last stages),
    recompute, sequence parallelism and ZeRO stage is bounded from its sizes; what cannot
    fit the memory budget or beat the best is never simulated. Rows within the tie band of
    the best are marked ~: the model cannot rank them. Exit 1 when no configuration is
    left, 3 when nothing fits the budget.
    """
    from tabsched.execution import RECOMPUTE_MODES, load_execution
    from tabsched.files import atomic_write, check_output_folder, check_output_path
    from tabsched.plan import plan
    if out:
        check_output_path(out)
    if html_path:
        check_html_path(html_path, inputs=(execution, model, system), outputs={"--out": out})
    if save_executions:
        check_output_folder(save_executions)
    if top < 1:
        raise click.ClickException(f"--top must be >= 1, not {top}")
    family_names = name_list(families) or None if families else None
    options = dict(
        families=family_names,
        sequence_slices=_slice_counts(slice_counts, model, family_names, slice_partition),
        slice_leads=("seq1f1b", "kept") if slice_leads == "both" else (slice_leads,),
        slice_partition=slice_partition,
        tensor_parallel=int_list("--tensor-parallel", tensor_degrees) if tensor_degrees
        else None,
        pipeline_parallel=int_list("--pipeline-parallel", pipeline_degrees) if
        pipeline_degrees else None,
        context_parallel=int_list("--context-parallel", context_degrees) if context_degrees
        else None,
        expert_parallel=int_list("--expert-parallel", expert_degrees) if expert_degrees
        else None,
        microbatch_sizes=int_list("--microbatch-size", microbatch_sizes) if microbatch_sizes
        else None,
        recompute=(_choices("--recompute", recompute_modes, RECOMPUTE_MODES)
                   if recompute_modes else None),
        max_chunks=max_chunks, uneven=uneven, cross_node=cross_node,
        zero_stages=_zero_stages(zero),
        sequence_parallel={"both": (False, True), "on": (True,),
                           "off": (False,)}[sequence_parallel_choice],
        memory_budget=None if memory_budget == "capacity" else memory_budget,
        tie_band=tie_band, top=top, prune=not exhaustive,
        jobs=jobs, dask=dask,
        execution=load_execution(execution) if execution else None)
    try:
        result = plan(model, system, gpus, global_batch,
                      progress=progress_reporter("plan", quiet=quiet, unit="simulations"),
                      **options)
    except MemoryBudgetError as error:
        raise OverBudget(str(error)) from None
    if out:
        atomic_write(out, result.to_csv(), newline="")
        click.echo(f"wrote {out}: {len(result.rows)} configurations", err=True)
    if save_executions:
        from tabsched.files import make_output_folder
        make_output_folder(save_executions)
        for row in result.rows:
            path = os.path.join(save_executions, f"rank-{row.rank}.toml")
            row.execution.write(path)
        click.echo(f"wrote {len(result.rows)} executions into {save_executions}", err=True)
    if html_path:
        write_html_report(result, html_path)
    if as_json:
        echo_json(result.to_dict())
        return
    click.echo(_text(result, explain))


def _slice_counts(text, model, families, partition="even"):
    """``--sequence-slices`` as slice counts, checked against the model and the families
    and cut by ``--slice-partition`` (one line naming the option when they cannot be
    searched)."""
    from tabsched.cli.eval import check_partition
    check_partition(partition, text)
    if text is None:
        return None
    from tabsched.costs.transformer import load_model
    from tabsched.plan import _family_specs, slicing_problem
    counts = int_list("--sequence-slices", text)
    specs = _family_specs(families) if families else None
    problem = slicing_problem(load_model(model), counts, specs, partition)
    if problem is not None:
        raise click.ClickException(f"--sequence-slices {problem}")
    return counts


def _text(result, explain):
    """The human report: the setting, the ranked rows, what was counted, the best's
    commands, and (``explain``) why it wins."""
    context = any(row.execution.context_parallel > 1 for row in result.rows)
    expert = any(row.execution.expert_parallel > 1 for row in result.rows)
    sliced = bool(result.sequence_slices)
    lines = [f"{result.model} on {result.gpus} GPUs of {result.system}, global batch "
             f"{result.global_batch}, memory budget "
             f"{format_memory(result.memory_budget, 'bytes')}"]
    header = ["rank", "family", "t", *(["cp"] if context else []), "p", "d",
              *(["ep"] if expert else []), "b", "m",
              "recompute", "sp", "zero", *(["slices"] if sliced else []),
              "iteration", "period", "tokens/s/GPU", "TFLOP/s/GPU", "MFU", "HFU", "peak mem", "bubble",
              "exposed comm"]
    body = []
    for row in result.rows:
        run = row.execution
        flops = row.throughput
        body.append([f"{row.rank}{'~' if row.tied else ''}", row.layout.label,
                     str(run.tensor_parallel),
                     *([str(run.context_parallel)] if context else []),
                     str(row.layout.devices),
                     str(run.data_parallel),
                     *([str(run.expert_parallel)] if expert else []),
                     str(run.microbatch_size),
                     str(row.configuration.microbatches), run.recompute,
                     "yes" if run.sequence_parallel else "-", str(run.zero_stage),
                     *([_slices_cell(row.layout)] if sliced else []),
                     format_time(row.iteration_s, "s"), format_time(row.steady_period_s, "s"),
                     f"{flops.tokens_per_s_per_gpu:.0f}",
                     f"{flops.model_flops_per_gpu / 1e12:.1f}", f"{flops.mfu:.1%}",
                     f"{flops.hfu:.1%}", format_memory(row.peak_memory_max, "bytes"),
                     f"{row.bubble_ratio:.1%}", f"{row.exposed_communication:.1%}"])
    lines.append(format_columns([header] + body))
    tied = len(result.tied)
    if tied > 1:
        lines.append(f"~ {tied} configurations within {result.tie_band:.1%} of the best "
                     f"(the model's mean error against measured iterations): tied, not ranked")
    uneven = [row for row in result.rows if row.layout.stage_layers is not None]
    if uneven:
        lines.append("layer splits: " + "; ".join(
            f"rank {row.rank}: {','.join(map(str, row.layout.stage_layers))}"
            for row in uneven[:3]))
    lines.extend(result.summary_lines())
    best = result.best
    lines.append(f"reproduce the best: {best.eval_command}")
    if best.megatron is not None:
        lines.append(f"Megatron-LM: {best.megatron['command_line']}")
    else:
        lines.append(f"Megatron-LM: {best.megatron_refusal}")
    if best.torchtitan is not None:
        sections = best.torchtitan["sections"]
        lines.append("torchtitan: " + "; ".join(
            f"[{name}] " + ", ".join(f"{key} = {value}" for key, value in values.items())
            for name, values in sections.items()))
    else:
        lines.append(f"torchtitan: {best.torchtitan_refusal}")
    if explain:
        lines.extend(f"explain: {line}" for line in result.explain())
    return "\n".join(lines)


def _slices_cell(layout):
    """The ``slices`` column: ``-`` for whole sequences, ``k`` at Seq1F1B's lead, ``k kept``."""
    if layout.slices == 1:
        return "-"
    return str(layout.slices) + ("" if layout.lead == "seq1f1b" else " kept")
