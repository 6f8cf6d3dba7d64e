"""The search: every configuration bounded from its sizes, then simulated in bound order.

:func:`candidates` enumerates the space (:mod:`tabsched.plan.space`), refuses what
the sizes refuse, and gives every configuration its lower bounds on iteration time
and peak memory (:mod:`tabsched.plan.bounds`). :func:`search` is branch and bound
over them: a configuration whose memory bound exceeds the budget cannot fit and is
never simulated; the others are simulated in ascending order of their time bound,
and the search stops when the next bound exceeds the **threshold**: the larger of
the ``top``-th best iteration time found so far and the best times ``1 + tie_band``.
Every configuration that is not simulated is therefore proven slower than both, so
the ``top`` best and every configuration tied with the best are exactly what the
exhaustive search (``prune=False``: simulate everything) finds; ties are broken by
:meth:`Configuration.sort_key`, the same way in both.

Simulations go through :func:`tabsched.evaluate.evaluate_summaries`: the configurations
that share a table (family, pipeline depth, layer split, microbatch count) share one
lowering and one kernel call, with a cost model each. A cost-driven family
(``zb-auto``, ``zbv-auto``) builds one table per cost model, for the memory budget.
With ``jobs > 1`` or Dask the tables are grouped into tasks of about
:data:`TASK_SECONDS` of work each and run in rounds (:func:`tabsched.parallel.run_parallel`),
the threshold updated between rounds.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import numpy as np

from tabsched._memo import memo
from tabsched.costs import ModelCosts
from tabsched.costs.sharded import persistent_bytes_per_parameter
from tabsched.evaluate import evaluate_summaries
from tabsched.exceptions import InvalidParameterError, TabschedError
from tabsched.execution import RECOMPUTE_MODES, Execution
from tabsched.plan.bounds import (LayoutArrays, RunGroups, bound_costs, formula_counts,
                                  memory_bounds, step_seconds, time_bounds)
from tabsched.plan.space import (MAX_CONFIGURATIONS, Configuration, Layout, Refusals,
                                 divisors, family_accepts, layer_splits, slicing_refusal,
                                 stage_count)
from tabsched.schedules import fixed_table, generate

__all__ = ["TIE_BAND", "TASK_SECONDS", "Candidates", "Outcome", "PlanCounts", "candidates",
           "search", "simulate", "run_costs", "cost_driven_table", "fixed_table_of",
           "sliced_table_of", "PRUNING_RULES"]

#: Configurations within this fraction of the best are tied: tabsched's mean |error|
#: against the eight measured iterations of Korthikanti et al. 2022, Table 5, is 3.88%
#: (``tabsched study megatron-recompute``; README), so a ranking closer than that is not
#: known. ``tests/test_plan.py`` pins the band to the study's current mean error.
TIE_BAND = 0.039
#: Work a parallel task holds at least, in seconds (starting and collecting a task
#: costs a few milliseconds).
TASK_SECONDS = 0.1
#: The pruning rules ``prune=`` may name: the memory bound and the time bound.
PRUNING_RULES = ("memory", "time")
#: A bound is compared with the threshold allowing for its own float rounding (the bound
#: and the simulation sum the same durations in different orders).
_ROUNDING = 1.0 + 1e-9
#: Seconds per operation to generate and lower a table, and per operation and cost
#: model to price and run it (measured on this project's 2-core machine; only used to
#: size parallel tasks).
_SECONDS_PER_OP = 6e-7
_SECONDS_PER_OP_AND_MODEL = 2e-7


@dataclass
class PlanCounts:
    """What the plan considered, refused, pruned and simulated, and why.

    ``splits``: the ``t x p x d`` splits the sizes allow; ``split_refusals``: the
    degree choices refused, by reason; ``configurations``: what was considered over the
    valid splits; ``refused``: configurations the sizes refuse (layers, a family's
    constraints), by reason; ``pruned_memory``: proven over the budget by the memory
    bound; ``pruned_time``: proven slower than the threshold by the time bound;
    ``simulated``: configurations simulated (``over_budget`` of them went over it in
    simulation; ``failed``: cost-driven tables that could not be built, by reason);
    ``tables``: tables generated and lowered for the simulations.
    """

    splits: int = 0
    split_refusals: dict = field(default_factory=dict)
    configurations: int = 0
    refused: dict = field(default_factory=dict)
    pruned_memory: int = 0
    pruned_time: int = 0
    simulated: int = 0
    over_budget: int = 0
    failed: dict = field(default_factory=dict)
    tables: int = 0

    @property
    def fit(self):
        """Simulated configurations that fit the budget."""
        return self.simulated - self.over_budget - sum(self.failed.values())

    def to_dict(self):
        return {"splits": self.splits, "split_refusals": dict(self.split_refusals),
                "configurations": self.configurations, "refused": dict(self.refused),
                "pruned_memory": self.pruned_memory, "pruned_time": self.pruned_time,
                "simulated": self.simulated, "over_budget": self.over_budget,
                "failed": dict(self.failed), "fit": self.fit, "tables": self.tables}


@dataclass(frozen=True)
class Outcome:
    """A simulated configuration: its iteration time, bubble ratio, peak memory per
    device (bytes, persistent included), or the reason no table could be built."""

    makespan: float | None
    bubble_ratio: float | None
    peak_memory: tuple = ()
    error: str | None = None


@dataclass
class Candidates:
    """Every configuration the sizes allow, with its bounds, as arrays.

    ``time_bound`` and ``memory_bound`` per configuration (and the persistent bytes of
    its fullest device, ``persistent``); ``layout``, ``group``,
    ``zero`` index :attr:`layouts`, :attr:`groups` (``(execution, microbatches)`` of
    each run group, zero stage 0) and the ZeRO stage. :meth:`configuration` builds
    one. ``refusals``: what the sizes refused, for the message when nothing is left.
    """

    layouts: list
    groups: list
    layout: np.ndarray
    group: np.ndarray
    zero: np.ndarray
    time_bound: np.ndarray
    memory_bound: np.ndarray
    persistent: np.ndarray
    counts: PlanCounts
    refusals: Refusals

    def __len__(self):
        return len(self.time_bound)

    def configuration(self, index):
        run, microbatches = self.groups[int(self.group[index])]
        return Configuration(self.layouts[int(self.layout[index])], microbatches,
                             run.replace(zero_stage=int(self.zero[index])))


def _recompute_order(recompute):
    return tuple(mode for mode in RECOMPUTE_MODES if mode in set(recompute))


def candidates(model, system, gpus, global_batch, valid_splits, variants, base, *,
               microbatch_sizes=None, recompute=RECOMPUTE_MODES, sequence_parallel=(False,
                                                                                    True),
               zero=(0, 1), uneven=3, counts=None, refusals=None, slicings=(),
               slice_partition="even"):
    """The :class:`Candidates` of the space: ``valid_splits`` (from
    :func:`tabsched.plan.space.splits`) x microbatch sizes x ``variants`` (``(family,
    params)`` pairs) x layer splits x recompute x sequence parallelism x ZeRO stage
    (``zero``; a replica alone, ``d = 1``, runs ZeRO-0 only) x sequence slicing:
    whole sequences and each ``(slices, lead)`` of ``slicings`` (a family that cannot
    be sliced, :func:`~tabsched.plan.space.slicing_refusal`, and a split with context
    parallelism run whole sequences only), the slices cut by ``slice_partition``."""
    counts = PlanCounts() if counts is None else counts
    refusals = Refusals() if refusals is None else refusals
    recompute = _recompute_order(recompute)
    layouts, layout_index = [], {}
    groups = []
    columns = {"layout": [], "group": [], "zero": [], "time": [], "memory": [],
               "persistent": []}
    plans = []      # (split, group indices, zero choices, layouts at p)
    for split in valid_splits:
        t, p, d = split.tensor, split.pipeline, split.data
        sizes = [b for b in divisors(global_batch // d)
                 if microbatch_sizes is None or b in microbatch_sizes]
        if not sizes:
            refusals.record("no microbatch size divides the global batch", 7,
                            min(global_batch // d % b for b in microbatch_sizes),
                            f"{split}: none of the microbatch sizes "
                            f"{', '.join(map(str, sorted(microbatch_sizes)))} divides the "
                            f"{global_batch // d} samples of a replica")
            counts.split_refusals["no microbatch size divides the global batch"] = \
                counts.split_refusals.get("no microbatch size divides the global batch",
                                          0) + 1
            continue
        group_indices, unfit = [], 0
        for parallel in ((False,) if t == 1 else tuple(sorted(set(sequence_parallel)))):
            for mode in recompute:
                for b in sizes:
                    run = base.replace(tensor_parallel=t, sequence_parallel=parallel,
                                       data_parallel=d, microbatch_size=b,
                                       global_batch=global_batch, recompute=mode,
                                       zero_stage=0, context_parallel=split.context,
                                       expert_parallel=split.expert)
                    try:
                        run.check(model, system)
                    except InvalidParameterError as error:
                        refusals.record("the execution does not fit the model", 7, 0,
                                        f"{split} b={b}: {error}")
                        unfit += 1
                        continue
                    group_indices.append(len(groups))
                    groups.append((run, global_batch // (d * b)))
        # ZeRO over the d x cp gradient replicas; ZeRO-2/3 with context parallelism are
        # not priced (Execution refuses them)
        cp = split.context
        zeros = tuple(sorted({0 if d * cp == 1 else stage for stage in zero
                              if cp == 1 or stage < 2}))
        if not zeros:      # only ZeRO-2/3 asked, with context parallelism
            reason = "ZeRO-2/3 with context parallelism (not priced)"
            counts.refused[reason] = counts.refused.get(reason, 0) + len(group_indices)
            refusals.record(reason, 7, 0, f"{split}: {reason}", count=len(group_indices))
            continue
        at_p = []
        for family, params in variants:
            stages = stage_count(family, params, p)
            if stages is None:
                reason = f"{family} has no table on {p} devices"
                counts.refused[reason] = counts.refused.get(reason, 0) + \
                    len(group_indices) * len(zeros)
                refusals.record(reason, 8, stages or 0, f"{split}: {reason}")
                continue
            options = layer_splits(model.layers, stages, uneven)
            if not options:
                reason = "the layers do not split over the stages"
                counts.refused[reason] = counts.refused.get(reason, 0) + \
                    len(group_indices) * len(zeros)
                refusals.record(reason, 9, stages - model.layers if stages > model.layers
                                else model.layers % stages,
                                f"{split} {family}: {model.layers} layers do not split "
                                f"evenly over {stages} stages, nor with the first and last "
                                f"{uneven} or fewer layers lighter")
                continue
            refusal = None
            if slicings:
                refusal = (slicing_refusal(family, params) if split.context == 1 else
                           "sequence slices with context parallelism (it cuts the sequence "
                           "already)")
                if refusal is not None:
                    counts.refused[refusal] = counts.refused.get(refusal, 0) + \
                        len(group_indices) * len(zeros) * len(options) * len(slicings)
                    refusals.record(refusal, 8, 0, f"{split} {family}: {refusal}")
            for option in options:
                for slices, lead in ((1, None),) + (() if refusal else tuple(slicings)):
                    layout = Layout(family, params, p, stages, option, slices, lead,
                                    "even" if slices == 1 else slice_partition)
                    if layout not in layout_index:
                        layout_index[layout] = len(layouts)
                        layouts.append(layout)
                    at_p.append(layout_index[layout])
        if unfit:
            reason = "the execution does not fit the model"
            counts.refused[reason] = counts.refused.get(reason, 0) + unfit * len(zeros) * len(at_p)
        plans.append((split, group_indices, zeros, at_p))
    total = sum(len(g) * len(z) * len(a) for _, g, z, a in plans)
    counts.configurations += total + sum(counts.refused.values())
    if total > MAX_CONFIGURATIONS:
        raise InvalidParameterError(
            f"the space holds {total:,} configurations, more than a plan takes on "
            f"({MAX_CONFIGURATIONS:,}); narrow it (--tensor-parallel, --microbatch-size, "
            f"--families, --max-chunks, --recompute, --uneven 0)")
    for split, group_indices, zeros, at_p in plans:
        if not group_indices or not at_p:
            continue
        run_groups = RunGroups([bound_costs(model, system, groups[g][0]) for g in group_indices],
                               [groups[g][1] for g in group_indices])
        sliced_groups = {1: run_groups}     # (slices, partition) -> their bound numbers
        # ZeRO-2/3 hold less still (their gathered parameters and unsharded gradients
        # come on top while a stage runs: left out, so the bound stays below the peak)
        replicas = [Execution(data_parallel=split.data, zero_stage=z,
                              context_parallel=split.context,
                              expert_parallel=split.expert) for z in zeros]
        persistent_bytes = np.array([[persistent_bytes_per_parameter(model, run, experts)
                                      for experts in (False, True)] for run in replicas])
        for index in at_p:
            layout = layouts[index]
            microbatches = run_groups.microbatches.astype(int)
            accepted = np.ones(len(group_indices), dtype=bool)
            for k, m in enumerate(microbatches.tolist()):
                reason = family_accepts(layout.family, layout.params, layout.devices, m)
                if reason is not None:
                    accepted[k] = False
                    key = f"{layout.family}'s constraints at this depth and microbatch count"
                    counts.refused[key] = counts.refused.get(key, 0) + len(zeros)
                    refusals.record(key, 10, 0, f"{split}: {reason}")
                elif layout.lead == "kept" and (layout.slices, "seq1f1b") in slicings and \
                        _leads_agree(layout.whole, m):
                    accepted[k] = False     # the same table as at Seq1F1B's lead
                    key = "the kept lead is Seq1F1B's at these sizes (searched once)"
                    counts.refused[key] = counts.refused.get(key, 0) + len(zeros)
            if not accepted.any():
                continue
            arrays = _layout_arrays(layout.whole, run_groups.cost_models[0])
            layout_zeros = _layout_zeros(zeros, arrays, split, layout, int(accepted.sum()),
                                         counts, refusals)
            if not layout_zeros:
                continue
            cut = (layout.slices, layout.partition) if layout.slices > 1 else 1
            if cut not in sliced_groups:
                sliced_groups[cut] = RunGroups.over_slices(run_groups, layout.slices,
                                                           layout.partition)
            bounded = sliced_groups[cut]
            first = groups[group_indices[0]][0]
            bounds = [time_bounds(arrays, bounded, step=step_seconds(
                          layout.whole, run_costs(model, system, first.replace(zero_stage=stage))))
                      for stage in layout_zeros]
            # the formula counts and warm-up forwards state whole sequences' orders
            formula = (_count_arrays(layout, microbatches) if layout.slices == 1 else
                       (None, None, None))
            per_zero = persistent_bytes[[zeros.index(z) for z in layout_zeros]]
            dense, experts = arrays.device_rank_parameters()
            persistent = (per_zero[:, :1] * dense[None, :] + per_zero[:, 1:] * experts[None, :])
            memory = memory_bounds(arrays, bounded, formula, persistent)        # G x Z
            keep = np.flatnonzero(accepted)
            for z_index, stage in enumerate(layout_zeros):
                columns["layout"].append(np.full(len(keep), index))
                columns["group"].append(np.asarray(group_indices)[keep])
                columns["zero"].append(np.full(len(keep), stage))
                columns["time"].append(bounds[z_index][keep])
                columns["memory"].append(memory[keep, z_index])
                columns["persistent"].append(np.full(len(keep), persistent[z_index].max()))
    counts.splits = len(valid_splits)

    def joined(name, dtype):
        parts = columns[name]
        return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype=dtype)
    return Candidates(layouts, groups, joined("layout", np.int64), joined("group", np.int64),
                      joined("zero", np.int64), joined("time", np.float64),
                      joined("memory", np.float64), joined("persistent", np.float64), counts,
                      refusals)


@memo(limit=4096)
def _leads_agree(layout, microbatches):
    """Whether both leads slice this layout's table at ``microbatches`` into one table."""
    from tabsched.adapt.sequence import leads_agree
    return leads_agree(fixed_table_of(layout, microbatches))


def _layout_zeros(zeros, arrays, split, layout, groups, counts, refusals):
    """The ZeRO stages a layout can run: 2 and 3 shard a stage over the data-parallel
    group of the one device that holds it, so a table that holds a stage on two devices
    (Chimera's, BitPipe's replicas) runs 0 and 1 only; the others are counted refused."""
    if not zeros or zeros[-1] < 2 or not (arrays.holds.sum(axis=0) > 1).any():
        return zeros
    kept = tuple(stage for stage in zeros if stage < 2)
    reason = "ZeRO-2/3 on a table that holds a stage on two devices"
    refused = (len(zeros) - len(kept)) * groups
    counts.refused[reason] = counts.refused.get(reason, 0) + refused
    refusals.record(reason, 10, 0, f"{split} {layout.family}: ZeRO-2/3 shard a stage over "
                    f"the replicas of the one device holding it; this table holds a stage "
                    f"on two devices", count=refused)
    return kept


def _layout_arrays(layout, costs):
    return LayoutArrays.of(layout, costs)


def _count_arrays(layout, microbatches):
    """The formula counts and warm-up forwards of a layout at each run group's microbatch
    count, as :func:`memory_bounds` takes them."""
    kinds, counts, warmups = [], [], []
    for m in microbatches.tolist():
        kind, count, warmup = formula_counts(layout.family, layout.params, layout.devices, m)
        kinds.append(kind)
        counts.append(count)
        warmups.append(warmup)
    kind = next((k for k in kinds if k is not None), None)
    width = layout.devices if kind != "largest" else 1
    count = (None if kind is None else
             np.array([c if c is not None else (0.0,) * width for c in counts]))
    warmup = (None if all(w is None for w in warmups) else
              np.array([w if w is not None else (0.0,) * layout.devices for w in warmups]))
    return kind, count, warmup


@memo(limit=4096)
def run_costs(model, system, execution):
    """The cost model a configuration is simulated with: its execution, the global batch
    left to the table (the table's microbatches hold one replica's share of it)."""
    return ModelCosts(model, system, execution.replace(global_batch=None))


@dataclass(frozen=True)
class SimulationJob:
    """One table and the executions it runs as (one cost model each)."""

    layout: Layout
    microbatches: int
    executions: tuple


@dataclass(frozen=True)
class SimulationTask:
    """Jobs to simulate in one process: picklable, for forked processes and Dask."""

    model: object
    system: object
    budget: float
    jobs: tuple


def simulate(task):
    """``[[Outcome per execution] per job]`` of a :class:`SimulationTask`."""
    return [_simulate_job(task.model, task.system, task.budget, job) for job in task.jobs]


@memo(limit=64)
def cost_driven_table(layout, microbatches, costs, budget):
    """A cost-driven family's table for ``costs`` and the memory budget (remembered: the
    plan's report builds the tables of its rows again)."""
    return generate(layout.family, costs=costs, memory_budget=budget,
                    **layout.generate_params(microbatches))


def _simulate_job(model, system, budget, job):
    layout = job.layout
    models = [run_costs(model, system, run) for run in job.executions]
    if layout.cost_driven:
        outcomes = []
        for costs in models:
            try:
                table = cost_driven_table(layout, job.microbatches, costs, budget)
                summary = evaluate_summaries(table, [costs], formula=False)[0]
            except TabschedError as error:
                outcomes.append(Outcome(None, None, (), str(error)))
                continue
            outcomes.append(_outcome(summary))
        return outcomes
    table = (fixed_table_of(layout, job.microbatches) if layout.slices == 1 else
             sliced_table_of(layout, job.microbatches, models[0]))
    return [_outcome(summary) for summary in evaluate_summaries(table, models, formula=False)]


@memo(limit=64)
def sliced_table_of(layout, microbatches, costs):
    """A sliced layout's table: the family's cut into ``layout.slices`` sequence slices
    at ``layout.lead`` by ``layout.partition`` (:class:`tabsched.adapt.SplitSequence`;
    ``costs`` only checks that the model's sequence can be cut so: the rows do not
    depend on it)."""
    from tabsched.adapt.sequence import SplitSequence
    return SplitSequence(layout.slices, layout.lead, layout.partition).apply(
        fixed_table_of(layout.whole, microbatches), costs)


def fixed_table_of(layout, microbatches):
    """A fixed-pattern layout's table: the family's (remembered: zbv-auto's candidates and
    the report ask for the same sizes) with the layout's layer split."""
    params = layout.generate_params(microbatches)
    params.pop("stage_layers", None)
    table = fixed_table(layout.family, **params)
    return table if layout.stage_layers is None else table.replace(
        stage_layers=layout.stage_layers)


def _outcome(summary):
    return Outcome(float(summary.makespan), float(summary.bubble_ratio),
                   tuple(float(peak) for peak in summary.peak_memory))


def _job_seconds(job):
    """What a job costs to run, roughly (only to size parallel tasks)."""
    layout = job.layout
    ops = 3.0 * layout.stages * job.microbatches * layout.slices
    models = len(job.executions)
    if layout.cost_driven:
        return models * 10 * ops * (_SECONDS_PER_OP + _SECONDS_PER_OP_AND_MODEL)
    return ops * (_SECONDS_PER_OP + models * _SECONDS_PER_OP_AND_MODEL)


class _Ranking:
    """The simulated configurations that fit, in order: (makespan, sort key, index)."""

    def __init__(self, top, tie_band):
        self.top, self.tie_band = top, tie_band
        self.entries = []

    def add(self, makespan, key, index):
        bisect.insort(self.entries, (makespan, key, index))

    @property
    def threshold(self):
        """No configuration with a larger lower bound can be among the ``top`` or tied
        with the best."""
        if len(self.entries) < self.top:
            return np.inf
        return max(self.entries[self.top - 1][0], self.entries[0][0] * (1.0 + self.tie_band))


def search(found, model, system, budget, *, top=10, tie_band=TIE_BAND, prune=True, jobs=1,
           dask=None, executor=None, progress=None):
    """Branch and bound over ``found`` (:class:`Candidates`); see the module docstring.

    Returns ``(ranking, outcomes)``: the fitting configurations' ``(makespan, key,
    index)`` in order, and ``{index: Outcome}`` of every simulated one.
    """
    rules = set(PRUNING_RULES) if prune is True else set() if not prune else set(prune)
    counts = found.counts
    fits_memory = (found.memory_bound <= budget if "memory" in rules
                   else np.ones(len(found), dtype=bool))
    counts.pruned_memory += int((~fits_memory).sum())
    live = np.flatnonzero(fits_memory)
    order = live[np.argsort(found.time_bound[live], kind="stable")]
    members = {}            # table key -> live indices in bound order
    for index in order.tolist():
        members.setdefault(_table_key(found, index), []).append(index)
    ranking = _Ranking(top, tie_band)
    outcomes = {}
    done = np.zeros(len(found), dtype=bool)
    use_bound = "time" in rules
    position = 0
    total = len(order)
    parallel = jobs > 1 or dask is not None or executor is not None
    while position < total:
        threshold = ranking.threshold if use_bound else np.inf
        batch, seconds = [], 0.0
        while position < total:
            index = int(order[position])
            if done[index]:
                position += 1
                continue
            if found.time_bound[index] > threshold * _ROUNDING:
                break
            key = _table_key(found, index)
            chosen = [j for j in members[key]
                      if not done[j] and found.time_bound[j] <= threshold * _ROUNDING]
            done[chosen] = True
            job = SimulationJob(found.layouts[int(found.layout[index])],
                                found.groups[int(found.group[index])][1],
                                tuple(found.configuration(j).execution for j in chosen))
            batch.append((job, chosen))
            seconds += _job_seconds(job)
            if not parallel or seconds >= 4 * TASK_SECONDS * max(jobs, 1):
                break
        if not batch:
            break
        _run(batch, model, system, budget, (jobs, dask, executor), outcomes, counts)
        for _, chosen in batch:
            for index in chosen:
                outcome = outcomes[index]
                if outcome.error is None and max(outcome.peak_memory) <= budget:
                    ranking.add(outcome.makespan, found.configuration(index).sort_key(), index)
        if progress is not None:
            progress(min(position, total), total, counts.simulated)
    left = int((~done[order]).sum()) if total else 0
    counts.pruned_time += left
    if progress is not None and total:
        progress(total, total, counts.simulated)
    return ranking.entries, outcomes


def _table_key(found, index):
    layout = int(found.layout[index])
    microbatches = found.groups[int(found.group[index])][1]
    if found.layouts[layout].cost_driven:
        return (layout, microbatches, index)
    return (layout, microbatches)


def _run(batch, model, system, budget, where, outcomes, counts):
    """Simulate ``batch`` (jobs with the candidate indices they hold) here or in parallel
    (``where``: jobs, Dask, an executor), recording each outcome and the counts."""
    jobs, dask, executor = where
    serial = jobs == 1 and dask is None and executor is None
    if serial:
        tasks = [SimulationTask(model, system, budget, (job,)) for job, _ in batch]
    else:
        tasks, current, seconds = [], [], 0.0
        for job, _ in batch:
            current.append(job)
            seconds += _job_seconds(job)
            if seconds >= TASK_SECONDS:
                tasks.append(SimulationTask(model, system, budget, tuple(current)))
                current, seconds = [], 0.0
        if current:
            tasks.append(SimulationTask(model, system, budget, tuple(current)))
    results = [None] * len(tasks)

    def record(index, value, done):
        results[index] = value

    if serial:
        for index, task in enumerate(tasks):
            record(index, simulate(task), index + 1)
    else:
        from tabsched.parallel import run_parallel
        run_parallel(simulate, tasks, jobs=jobs, dask=dask, executor=executor, record=record)
    flat = [outcome for result in results for outcome in result]
    for (job, chosen), job_outcomes in zip(batch, flat):
        counts.tables += 1 if not job.layout.cost_driven else len(chosen)
        for index, outcome in zip(chosen, job_outcomes):
            outcomes[index] = outcome
            counts.simulated += 1
            if outcome.error is not None:
                reason = f"{job.layout.family} could not be built"
                counts.failed[reason] = counts.failed.get(reason, 0) + 1
            elif max(outcome.peak_memory) > budget:
                counts.over_budget += 1

