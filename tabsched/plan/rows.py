"""The rows of a plan: each ranked configuration measured for the report, and why the
winner wins.

For every row the table is built again (in this process) and priced twice: as the
search simulated it, for the throughput (:func:`tabsched.throughput.throughput`),
and on the communication-free copy of the system, for the exposed communication
(see :mod:`tabsched.plan.result`). The ``tabsched eval`` command, the Megatron-LM
arguments (:mod:`tabsched.megatron`) and the torchtitan settings
(:mod:`tabsched.torchtitan`) come from the same table and execution.
"""

from __future__ import annotations

import numpy as np

from tabsched._memo import memo
from tabsched.costs import ModelCosts
from tabsched.costs.units import format_quantity
from tabsched.evaluate import evaluate_summaries
from tabsched.exceptions import TabschedError
from tabsched.execution import RECOMPUTE_MODES, Execution
from tabsched.plan.result import PlanRow
from tabsched.plan.search import cost_driven_table, fixed_table_of, run_costs, sliced_table_of
from tabsched.throughput import throughput

__all__ = ["build_rows", "eval_command", "free_network", "explain"]

#: The communication-free system's links: the largest bandwidth a system may state.
FREE_BANDWIDTH = 1e15


@memo(limit=64)
def free_network(system):
    """``system`` with every link at 1 PB/s, no latency and no overrides (see
    :mod:`tabsched.plan.result`: communication priced as free)."""
    return system.replace(intra_node_bandwidth=FREE_BANDWIDTH,
                          inter_node_bandwidth=FREE_BANDWIDTH, intra_node_latency=0.0,
                          inter_node_latency=0.0, intra_node_efficiency=1.0,
                          inter_node_efficiency=1.0, link_overrides=(), node_overrides=(),
                          name=f"{system.name} (free network)")


def table_for(configuration, costs, budget):
    """The table of ``configuration`` (cost-driven families: built for ``costs``)."""
    layout = configuration.layout
    if layout.cost_driven:
        return cost_driven_table(layout, configuration.microbatches, costs, budget)
    if layout.slices > 1:
        return sliced_table_of(layout, configuration.microbatches, costs)
    return fixed_table_of(layout, configuration.microbatches)


def _budget_text(budget):
    gigabytes = budget / 1e9
    return f"{gigabytes:g}GB" if gigabytes == round(gigabytes, 6) else f"{budget:.0f}"


#: Execution fields ``tabsched eval`` has a flag for, and the flag.
_FLAGS = {"attention": "--attention", "contention": "--contention", "fp8": "--fp8",
          "expert_parallel": "--expert-parallel", "max_connections": "--max-connections"}


def eval_command(configuration, model, system, budget, base=None, replicated=False):
    """The ``tabsched eval`` command line that evaluates ``configuration``: the same
    table, execution and budget (the microbatch count from the global batch);
    ``replicated``: the table holds a stage on two devices, whose gradients sync."""
    run = configuration.execution
    layout = configuration.layout
    base = Execution() if base is None else base
    parts = [f"tabsched eval {layout.family} -p {layout.devices} -m {configuration.microbatches}"]
    for key, value in layout.params:
        option = {"chunks": "--chunks", "waves": "--waves", "variant": "--variant",
                  "pipelines": "--pipelines", "group_size": "--group-size"}.get(key)
        parts.append(f"{option} {value}" if option else f"--param {key}={value}")
    if layout.stage_layers is not None:
        parts.append("--stage-layers " + ",".join(map(str, layout.stage_layers)))
    if layout.slices > 1:
        parts.append(f"--sequence-slices {layout.slices} --slice-lead {layout.lead}")
        if layout.partition != "even":
            parts.append(f"--slice-partition {layout.partition}")
    parts.append(f"--model {model} --system {system} -t {run.tensor_parallel}")
    if run.sequence_parallel:
        parts.append("--sequence-parallel")
    if run.context_parallel > 1:
        parts.append(f"--context-parallel {run.context_parallel}")
        if run.cp_comm is not None:
            parts.append(f"--cp-comm {run.cp_comm}")
    if run.data_parallel > 1:
        parts.append(f"-d {run.data_parallel}")
    parts.append(f"--microbatch-size {run.microbatch_size} --recompute {run.recompute}")
    if run.zero_stage == 1:
        parts.append("--optimizer-sharding")
    elif run.zero_stage:
        parts.append(f"--zero {run.zero_stage}")
        if run.reshard_after_forward is not None:
            parts.append("--reshard-after-forward" if run.reshard_after_forward
                         else "--no-reshard-after-forward")
        if run.prefetch is not None:
            parts.append(f"--prefetch {run.prefetch}")
    if run.optimizer_step:
        parts.append("--optimizer")
    if run.p2p_mode == "blocking":
        parts.append("--blocking-sends")
    elif run.p2p_mode != "free":
        parts.append(f"--p2p {run.p2p_mode}")
    if run.overlap_grad_reduce:
        parts.append("--overlap-grad-reduce")
        if run.grad_bucket_size is not None:
            parts.append(f"--grad-bucket-size {run.grad_bucket_size}")
        if not run.align_grad_reduce:
            parts.append("--no-align-grad-reduce")
    if run.post_validation:
        parts.append("--post-validation")
    if replicated and run.grad_sync == "replicas":
        parts.append("--grad-sync replicas")
    default = Execution()
    for key, flag in _FLAGS.items():
        # the searched expert degree is the row's own; the rest are the base's
        value = getattr(run if key == "expert_parallel" else base, key)
        if value is not None and value != getattr(default, key):
            parts.append(f"{flag} {value}")
    parts.append(f"--memory-budget {_budget_text(budget)}")
    return " ".join(parts)


def _megatron(table, run, layers):
    from tabsched.megatron import megatron_arguments
    try:
        launch = megatron_arguments(table, micro_batch_size=run.microbatch_size,
                                    data_parallel=run.data_parallel, execution=run,
                                    num_layers=None if table.stage_layers else layers)
    except TabschedError as error:
        return None, str(error)
    return launch.to_dict(), None


def _torchtitan(table, run, sequence):
    from tabsched.torchtitan import torchtitan_settings
    try:
        settings = torchtitan_settings(table, run, sequence)
    except TabschedError as error:
        return None, str(error)
    return settings.to_dict(), None


def build_rows(entries, found, outcomes, model, system, budget, *, top, tie_band,
               model_name, system_name, base):
    """The :class:`PlanRow` s of the ``top`` ranked entries (``(makespan, key, index)``)."""
    if not entries:
        return []
    best = entries[0][0]
    rows = []
    for rank, (makespan, _, index) in enumerate(entries[:top], 1):
        configuration = found.configuration(index)
        run = configuration.execution
        costs = run_costs(model, system, run)
        table = table_for(configuration, costs, budget)
        free = ModelCosts(model, free_network(system), costs.execution)
        summary, free_summary = (evaluate_summaries(table, [costs], formula=False,
                                                    steady=True)[0],
                                 evaluate_summaries(table, [free], formula=False)[0])
        if configuration.layout.slices > 1:     # neither framework runs sequence slices
            megatron = torchtitan = None
            megatron_refusal = torchtitan_refusal = (
                f"runs no sequence slices (Seq1F1B's {configuration.layout.slices} slices "
                f"per sequence need its own pipeline code)")
        else:
            megatron, megatron_refusal = _megatron(table, run, model.layers)
            torchtitan, torchtitan_refusal = _torchtitan(table, run, model.sequence)
        rows.append(PlanRow(
            rank=rank, tied=makespan <= best * (1.0 + tie_band), configuration=configuration,
            iteration_s=float(summary.makespan), steady_period_s=summary.steady_period,
            lower_bound_s=float(found.time_bound[index]),
            throughput=throughput(costs, table, summary.makespan),
            peak_memory=tuple(float(peak) for peak in summary.peak_memory),
            memory_budget=float(budget), bubble_ratio=float(summary.bubble_ratio),
            exposed_communication=max(0.0, 1.0 - free_summary.makespan / summary.makespan),
            communication_free_s=float(free_summary.makespan), operations=len(table),
            eval_command=eval_command(configuration, model_name, system_name, budget, base,
                                      replicated=any(len(devices) > 1 for devices in
                                                     table.placement().values())),
            megatron=megatron, megatron_refusal=megatron_refusal, torchtitan=torchtitan,
            torchtitan_refusal=torchtitan_refusal))
    return rows


def _differences(a, b):
    """The fields two configurations differ in, as ``name a vs b`` texts."""
    ra, rb = a.execution, b.execution
    pairs = [("family", a.layout.label, b.layout.label),
             ("t", ra.tensor_parallel, rb.tensor_parallel),
             ("cp", ra.context_parallel, rb.context_parallel),
             ("p", a.layout.devices, b.layout.devices),
             ("d", ra.data_parallel, rb.data_parallel),
             ("ep", ra.expert_parallel, rb.expert_parallel),
             ("microbatch size", ra.microbatch_size, rb.microbatch_size),
             ("recompute", ra.recompute, rb.recompute),
             ("sequence parallel", ra.sequence_parallel, rb.sequence_parallel),
             ("ZeRO", ra.zero_stage, rb.zero_stage),
             ("stage layers", a.layout.stage_layers or "even", b.layout.stage_layers or "even"),
             ("sequence slices", _slicing(a.layout), _slicing(b.layout))]
    return [f"{name} {x} vs {y}" for name, x, y in pairs if x != y]


def _slicing(layout):
    if layout.slices == 1:
        return "none"
    cut = "" if layout.partition == "even" else f", {layout.partition} partition"
    return f"{layout.slices} ({layout.lead} lead{cut})"


def explain(rows, winner_index, found, outcomes, budget, tie_band):
    """Why the winner beats the next best: time, bubble, exposed communication, compute,
    and memory where it forced recomputation."""
    if not rows:
        return []
    winner = rows[0]
    lines = [f"winner: {winner.label()}: {format_quantity(winner.iteration_s, 's')}"]
    if len(rows) < 2:
        return lines + ["no other configuration fits the budget"]
    second = rows[1]
    gap = second.iteration_s / winner.iteration_s - 1.0
    lines.append(f"next:   {second.label()}: {format_quantity(second.iteration_s, 's')} "
                 f"(+{gap:.2%})" + (f", within the tie band of {tie_band:.1%}: the model "
                                     f"cannot tell them apart" if second.tied else ""))
    differs = _differences(winner.configuration, second.configuration)
    if differs:
        lines.append("differs in: " + "; ".join(differs))

    def shares(row):
        compute = row.iteration_s * (1.0 - row.bubble_ratio)
        return compute, row.bubble_ratio, row.exposed_communication

    (c1, b1, x1), (c2, b2, x2) = shares(winner), shares(second)
    lines.append(f"compute per device {format_quantity(c1, 's')} vs "
                 f"{format_quantity(c2, 's')}; bubble {b1:.1%} vs {b2:.1%}; exposed "
                 f"communication {x1:.1%} vs {x2:.1%}")
    causes = []
    if abs(b2 - b1) * second.iteration_s > 0.25 * abs(second.iteration_s - winner.iteration_s):
        causes.append("its smaller bubble" if b1 < b2 else "despite a larger bubble")
    if abs(x2 - x1) * second.iteration_s > 0.25 * abs(second.iteration_s - winner.iteration_s):
        causes.append("less exposed communication" if x1 < x2 else
                      "despite more exposed communication")
    if abs(c2 - c1) > 0.25 * abs(second.iteration_s - winner.iteration_s):
        causes.append("less compute per device (" + ", ".join(
            _compute_causes(winner, second)) + ")" if c1 < c2 else
            "despite more compute per device")
    gains = [cause for cause in causes if not cause.startswith("despite")]
    costs = [cause for cause in causes if cause.startswith("despite")]
    if gains:
        lines.append("the winner wins by " + ", ".join(gains)
                     + (", " + ", ".join(costs) if costs else ""))
    elif costs:
        lines.append("the winner wins " + ", ".join(costs))
    forced = _forced_recompute(winner, winner_index, found, outcomes, budget)
    if forced:
        lines.append(forced)
    lines.append(f"memory: {format_quantity(winner.peak_memory_max, 'B')} of "
                 f"{format_quantity(budget, 'B')} on the fullest device")
    return lines


def _compute_causes(a, b):
    causes = []
    if a.execution.recompute != b.execution.recompute:
        causes.append(f"recompute {a.execution.recompute} instead of {b.execution.recompute}")
    if a.execution.tensor_parallel != b.execution.tensor_parallel:
        causes.append(f"tensor degree {a.execution.tensor_parallel} instead of "
                      f"{b.execution.tensor_parallel}")
    if a.execution.microbatch_size != b.execution.microbatch_size:
        causes.append(f"microbatch size {a.execution.microbatch_size} instead of "
                      f"{b.execution.microbatch_size}")
    if a.execution.sequence_parallel != b.execution.sequence_parallel:
        causes.append("sequence parallelism " + ("on" if a.execution.sequence_parallel
                                                 else "off"))
    if a.execution.zero_stage != b.execution.zero_stage:
        causes.append(f"ZeRO-{a.execution.zero_stage} instead of ZeRO-{b.execution.zero_stage}"
                      f" (the optimizer step and its collectives)")
    return causes or ["the kernels' efficiency at this split"]


def _forced_recompute(winner, index, found, outcomes, budget):
    """A line saying that lighter recomputation of the winner's configuration does not
    fit, with by how much, or None."""
    run = winner.execution
    level = RECOMPUTE_MODES.index(run.recompute)
    if level == 0:
        return None
    same = np.flatnonzero((found.layout == found.layout[index]) & (found.zero == found.zero[index]))
    lighter = []
    for other in same.tolist():
        candidate = found.configuration(other)
        mode = candidate.execution.recompute
        if (candidate.microbatches == winner.configuration.microbatches
                and candidate.execution.replace(recompute=run.recompute) == run
                and RECOMPUTE_MODES.index(mode) < level):
            outcome = outcomes.get(other)
            if outcome is not None and outcome.error is None:
                need, how = max(outcome.peak_memory), "simulated"
            else:
                need, how = float(found.memory_bound[other]), "at least"
            lighter.append((mode, need, how))
    over = [(mode, need, how) for mode, need, how in lighter if need > budget]
    if not over:
        return None
    text = "; ".join(f"recompute {mode} needs {how} {format_quantity(need, 'B')}"
                     for mode, need, how in sorted(over))
    return f"memory forces recompute {run.recompute}: {text}, over the budget"
