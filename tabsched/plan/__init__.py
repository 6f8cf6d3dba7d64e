"""``tabsched.plan``: the fastest way to train a model on N GPUs, searched.

:func:`plan` searches every execution of a model on ``gpus`` devices of a system at a
global batch (samples per iteration over all replicas, Megatron-LM's meaning): the
split ``t x p x d`` (tensor degree dividing the heads, the key/value heads and the
MLP inside a node; pipeline depth; data degree), the schedule family and its model
chunks, the microbatch size, the layer split (even, or lighter first and last
stages), recompute, sequence parallelism and ZeRO-1 and, with ``sequence_slices``,
each sequence cut into slices (Seq1F1B, beside whole sequences), each evaluated by the
execution simulation (:class:`~tabsched.costs.ModelCosts` on the family's table).

It is fast because it prunes, not because it skips:

1. :mod:`tabsched.plan.space`: what the sizes alone decide (divisibility, layers
   per stage, the families' constraints) before any table is built;
2. :mod:`tabsched.plan.bounds`: a proven lower bound on each configuration's peak
   memory (a configuration over the budget is never simulated) and on its
   iteration time;
3. :mod:`tabsched.plan.search`: branch and bound; configurations are simulated in
   ascending bound order, sharing tables and kernel calls, until the next bound
   exceeds both the ``top``-th best time and the best plus the tie band. What it
   returns is what the exhaustive search (``prune=False``) returns.

Configurations within :data:`TIE_BAND` of the best are tied (the model's measured
error); :class:`PlanResult` (:mod:`tabsched.plan.result`) holds the ranked rows with
their throughput, memory, bubble, exposed communication, the ``tabsched eval``
command, Megatron-LM arguments and torchtitan settings, and the counts of what was
considered, refused, pruned and simulated.

>>> result = plan("llama3-8b", "dgx-h100", 16, 64, families=["1f1b", "zb-h1"],
...               tensor_parallel=[4], microbatch_sizes=[1], recompute=["selective"])
>>> best = result.best
>>> best.family in ("1f1b", "zb-h1"), best.execution.tensor_parallel
(True, 4)
>>> result.counts.simulated <= result.counts.configurations
True
"""

from __future__ import annotations

import time

from tabsched.costs.units import format_quantity
from tabsched.exceptions import InvalidParameterError, MemoryBudgetError
from tabsched._untrusted import shown_value
from tabsched.execution import MAX_SAMPLES, RECOMPUTE_MODES, ZERO_STAGES, Execution
from tabsched.plan.result import Evaluated, PlanResult, PlanRow

__all__ = ["plan", "slicing_problem", "PlanResult", "PlanRow", "Evaluated", "Configuration",
           "Layout", "Split",
           "TIE_BAND", "PRUNING_RULES", "DEFAULT_MAX_CHUNKS", "DEFAULT_UNEVEN"]

#: The names of the rooms, imported when first asked for (``import tabsched`` imports
#: this package for :func:`plan`; the search is imported when a plan runs).
_LAZY = {"Configuration": "space", "Layout": "space", "Split": "space",
         "DEFAULT_MAX_CHUNKS": "space", "DEFAULT_UNEVEN": "space", "TIE_BAND": "search",
         "PRUNING_RULES": "search"}


def __getattr__(name):
    import importlib
    if name not in _LAZY:
        raise AttributeError(f"module 'tabsched.plan' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"tabsched.plan.{_LAZY[name]}"), name)
    globals()[name] = value
    return value


#: Most GPUs a plan searches: 2**24, a thousand times the largest published training runs
#: (Llama 3 405B: 16,384 H100s; Dubey et al. 2024, section 3.3), so that factoring the
#: count into t x cp x p x d stays instant.
MAX_GPUS = 2**24


def _positive(name, value, low=1, high=None):
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InvalidParameterError(f"{name} must be an integer >= {low}, not "
                                    f"{shown_value(value)}")
    if high is not None and value > high:
        # the search factors both (their divisors by trial division up to the square root)
        raise InvalidParameterError(f"{name} must be an integer from {low} to {high}, not "
                                    f"{shown_value(value)}")
    return value


def _degrees(name, values):
    if values is None:
        return None
    values = sorted({_positive(name, int(value)) if not isinstance(value, bool) else
                     _positive(name, value) for value in values})
    if not values:
        raise InvalidParameterError(f"{name} is empty")
    return values


def _family_specs(families):
    """``[(family, fixed params)]`` of family names or ``name:key=value`` specs."""
    from tabsched.compare import parse_spec
    from tabsched.schedules import families as all_families
    if families is None:
        return [(family.name, ()) for family in all_families()]
    specs = [parse_spec(spec) for spec in families]
    if not specs:
        raise InvalidParameterError("families is empty")
    return [(spec.family, spec.params) for spec in specs]


def plan(model, system, gpus: int, global_batch: int, *, families=None,
         tensor_parallel=None, pipeline_parallel=None, microbatch_sizes=None, recompute=None,
         context_parallel=None, expert_parallel=None,
         max_chunks: int | None = None, zero_stages=(0, 1), sequence_parallel=(False, True),
         uneven: int | None = None, cross_node: bool = False, memory_budget=None,
         execution: Execution | None = None, top: int = 10, tie_band: float | None = None,
         prune=True, jobs: int = 1, dask=None, executor=None, progress=None,
         sequence_slices=None, slice_leads=("seq1f1b", "kept"),
         slice_partition="even") -> PlanResult:
    """Search the executions of ``model`` on ``gpus`` devices of ``system``.

    Parameters
    ----------
    model, system : str or description
        Presets, TOML files or loaded descriptions.
    gpus : int
        Every GPU of the run: ``t x p x d``.
    global_batch : int
        Samples per iteration over all data-parallel replicas (Megatron-LM's
        ``--global-batch-size``).
    families : list of str, optional
        Family names or ``name:key=value`` specs (default every family).
    tensor_parallel, pipeline_parallel, microbatch_sizes : list of int, optional
        The degrees and microbatch sizes to consider (default every one that divides).
    context_parallel : list of int, optional
        Context degrees to consider (default the execution's, 1 unless it says): each
        splits the sequence, with the execution's ``cp_comm`` and ``attention`` (which
        must be ``flash`` above 1); ``t x cp x p x d = gpus``.
    expert_parallel : list of int, optional
        Expert degrees to consider for a mixture-of-experts model (default the
        execution's, 1 unless it says): each splits the routed experts over that many of
        the data-parallel ranks (it must divide ``d`` and the experts).
    recompute : list of str, optional
        Recompute modes (default none, selective and full).
    max_chunks : int, optional
        Most model chunks per device for the multi-chunk families (default
        :data:`~tabsched.plan.space.DEFAULT_MAX_CHUNKS`, 4).
    zero_stages : tuple of int
        ZeRO stages to consider (default 0 and 1; 2 shards the gradients too, 3 the
        parameters as FSDP does, each priced with its all-gathers and reduce-scatters:
        :mod:`tabsched.sharding`). A split with ``d = 1`` runs stage 0 only.
    sequence_parallel : tuple of bool
        Whether to consider sequence parallelism off and on (where ``t > 1``).
    uneven : int, optional
        Most layers the first and the last stage may hold fewer than a middle stage
        (0: even splits only; default :data:`~tabsched.plan.space.DEFAULT_UNEVEN`, 3).
    cross_node : bool
        Consider tensor groups larger than a node, filling whole nodes (their
        collectives priced on the network; default off).
    memory_budget : float or str, optional
        A device's memory (``"80GB"``); default the system's ``memory_capacity``.
    execution : Execution, optional
        The execution every configuration starts from (contention, blocking sends,
        attention...); the search sets its degrees, batch, recompute and ZeRO stage.
        Its ``optimizer_step`` defaults to on (an iteration ends with the step), its
        ``grad_sync`` to ``"replicas"`` (stages two devices hold, Chimera's, all-reduce
        their gradients; every stage with an overlapped data-parallel reduction).
    top : int
        Rows to return.
    tie_band : float, optional
        Relative distance from the best within which configurations are tied (default
        :data:`~tabsched.plan.search.TIE_BAND`, the model's measured error).
    prune : bool or set of {"memory", "time"}
        Which bounds prune (``False``: the exhaustive search).
    jobs : int
        Local processes; ``dask``: a Dask scheduler, ``"local"`` or a Client;
        ``executor``: any ``concurrent.futures.Executor`` instead.
    progress : callable, optional
        ``progress(configurations done, total, simulated)``.
    sequence_slices : list of int, optional
        Also search every configuration with each sequence cut into ``k`` slices
        (Seq1F1B: :class:`tabsched.adapt.SplitSequence`), at each lead of
        ``slice_leads``, beside whole sequences (which stay in the space, ``k = 1``).
        Each ``k`` must divide the model's sequence; named families must be ones that
        slice (not cost-driven, no overlapped cells: not zb-auto, zbv-auto, dualpipe,
        dualpipev); with every family (the default) those run whole sequences only,
        as do splits with context parallelism. Sliced candidates are bounded by what
        their slices cost and hold (:mod:`tabsched.plan.bounds`) and simulated with
        the slices' costs and memory.
    slice_leads : tuple of str
        The leads of ``SplitSequence`` to search (default both: ``seq1f1b``, the least
        memory; ``kept``, the unsliced row's lead at slice grain).
    slice_partition : {"even", "compute"}
        How the sliced candidates' sequences are cut: equal tokens, or Seq1F1B's
        computation-wise partition (equal FLOPs:
        :func:`tabsched.costs.transformer.slice_bounds`).

    Returns
    -------
    PlanResult

    Raises
    ------
    InvalidParameterError
        When no configuration is left (one line naming the constraint, the closest
        configuration and by how much it misses).
    MemoryBudgetError
        When nothing fits the memory budget (the closest, and by how much).
    """
    from tabsched.costs.system import load_system
    from tabsched.costs.transformer import load_model
    from tabsched.plan.rows import build_rows, explain
    from tabsched.plan.search import PRUNING_RULES, TIE_BAND, PlanCounts, candidates, search
    from tabsched.plan.space import (DEFAULT_MAX_CHUNKS, DEFAULT_UNEVEN, family_variants,
                                     splits)
    from tabsched.schedules import get_family
    began = time.perf_counter()
    max_chunks = DEFAULT_MAX_CHUNKS if max_chunks is None else max_chunks
    uneven = DEFAULT_UNEVEN if uneven is None else uneven
    tie_band = TIE_BAND if tie_band is None else tie_band
    model_name = model if isinstance(model, str) else getattr(model, "name", "model")
    system_name = system if isinstance(system, str) else getattr(system, "name", "system")
    model, system = load_model(model), load_system(system)
    gpus = _positive("gpus", gpus, high=MAX_GPUS)
    global_batch = _positive("global_batch", global_batch, high=MAX_SAMPLES)
    top = _positive("top", top)
    max_chunks = _positive("max_chunks", max_chunks)
    uneven = _positive("uneven", uneven, 0)
    if not isinstance(tie_band, (int, float)) or isinstance(tie_band, bool) or \
            not 0 <= tie_band < 1:
        raise InvalidParameterError(f"tie_band must be a fraction in [0, 1), not {tie_band!r}")
    if prune not in (True, False):
        unknown = sorted(set(prune) - set(PRUNING_RULES))
        if unknown:
            raise InvalidParameterError(f"prune names {unknown[0]!r}; the rules are "
                                        f"{', '.join(PRUNING_RULES)}")
    recompute = _choices("recompute", recompute) if recompute is not None else RECOMPUTE_MODES
    for mode in recompute:
        if mode not in RECOMPUTE_MODES:
            raise InvalidParameterError(f"recompute {mode!r} is not one of "
                                        f"{', '.join(RECOMPUTE_MODES)}")
    zero_stages = _choices("zero_stages", zero_stages)
    sequence_parallel = _choices("sequence_parallel", sequence_parallel)
    for stage in zero_stages:
        if isinstance(stage, bool) or stage not in ZERO_STAGES:
            raise InvalidParameterError(f"zero stage {stage!r} is not a ZeRO stage: 0, 1, 2 "
                                        f"or 3")
    if not recompute or not zero_stages or not tuple(sequence_parallel):
        raise InvalidParameterError("recompute, zero_stages and sequence_parallel need at "
                                    "least one choice each")
    budget = _budget(memory_budget, system)
    base = _base(execution)
    if base.expert_parallel > 1 and not model.experts:
        raise InvalidParameterError(f"execution: expert_parallel {base.expert_parallel} but "
                                    f"model {model.name} has no experts (a dense model)")
    experts = (tuple(_degrees("expert_parallel", expert_parallel))
               if expert_parallel is not None else (base.expert_parallel,))
    if max(experts) > 1 and not model.experts:
        raise InvalidParameterError(f"expert_parallel {', '.join(map(str, experts))}: model "
                                    f"{model.name} has no experts (a dense model)")
    contexts = (tuple(_degrees("context_parallel", context_parallel))
                if context_parallel is not None else (base.context_parallel,))
    if min(contexts) > 1 and min(zero_stages) >= 2:
        raise InvalidParameterError(
            f"zero stages {', '.join(map(str, zero_stages))} with context parallelism "
            f"{', '.join(map(str, contexts))} are not priced yet (FSDP would shard over the "
            f"data and context ranks together): give zero stages 0 or 1")
    specs = _family_specs(families)
    slicings = _slicings(model, sequence_slices, slice_leads, specs, families is not None,
                         slice_partition)
    tensor = _degrees("tensor_parallel", tensor_parallel)
    pipeline = _degrees("pipeline_parallel", pipeline_parallel)
    sizes = _degrees("microbatch_sizes", microbatch_sizes)
    variants = []
    for family, fixed in specs:
        variants += [(family, params) for params in
                     family_variants(get_family(family), max_chunks, fixed)]
    valid, refused_splits = splits(model, system, gpus, global_batch, tensor=tensor,
                                   pipeline=pipeline, cross_node=cross_node, base=base,
                                   context=contexts, expert=experts)
    where = where_text(model, system, gpus, global_batch)
    if not valid:
        raise InvalidParameterError(
            f"gpus {gpus}: no split {_split_text(gpus, contexts)} runs "
            f"{where}: "
            f"{_reasons(refused_splits.counts)}; closest: "
            f"{refused_splits.closest_description}")
    counts = PlanCounts(split_refusals=dict(refused_splits.counts))
    found = candidates(model, system, gpus, global_batch, valid, variants, base,
                       microbatch_sizes=sizes, recompute=recompute,
                       sequence_parallel=tuple(sequence_parallel), zero=zero_stages,
                       uneven=uneven, counts=counts, slicings=slicings,
                       slice_partition=slice_partition)
    if not len(found):
        refusals = found.refusals
        raise InvalidParameterError(
            f"no configuration of {where} is left: {_reasons(refusals.counts)}; closest: "
            f"{refusals.closest_description}")
    entries, outcomes = search(found, model, system, budget, top=top, tie_band=tie_band,
                               prune=prune, jobs=jobs, dask=dask, executor=executor,
                               progress=progress)
    if not entries:
        raise MemoryBudgetError(_nothing_fits(found, outcomes, budget, where))
    rows = build_rows(entries, found, outcomes, model, system, budget, top=top,
                      tie_band=tie_band, model_name=model_name, system_name=system_name,
                      base=base)
    evaluated = [Evaluated(found.configuration(index), float(found.time_bound[index]),
                           float(found.memory_bound[index]), outcome.makespan,
                           max(outcome.peak_memory) if outcome.peak_memory else None,
                           outcome.error is None and max(outcome.peak_memory) <= budget,
                           outcome.error)
                 for index, outcome in outcomes.items()]
    rules = PRUNING_RULES if prune is True else () if not prune else tuple(sorted(prune))
    return PlanResult(model=model.name, system=system.name, gpus=gpus,
                      global_batch=global_batch, memory_budget=budget, tie_band=tie_band,
                      rows=rows, evaluated=evaluated, counts=found.counts,
                      explanation=explain(rows, entries[0][2], found, outcomes, budget,
                                          tie_band),
                      seconds=time.perf_counter() - began, pruning=rules,
                      sequence_slices=tuple(sorted({k for k, _ in slicings})))


def slicing_problem(model, counts, families=None, partition="even"):
    """Why ``counts`` sequence slices cannot be searched for ``model`` (a loaded
    :class:`~tabsched.costs.transformer.TransformerModel`) with ``families``
    (``[(family, params)]`` named, or None for every family) cut by ``partition``, as
    ``"K: reason"``; or None. What ``sequence_slices`` and ``tabsched plan
    --sequence-slices`` refuse."""
    from tabsched.plan.space import DEFAULT_MAX_CHUNKS, family_variants, slicing_refusal
    from tabsched.schedules import get_family
    for count in counts:
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            return f"{count!r}: expected an integer >= 1"
    for count in counts:
        if count == 1:
            continue
        if partition == "even" and model.sequence % count:
            return (f"{count}: does not divide model {model.name}'s sequence "
                    f"{model.sequence} (a slice must hold whole tokens)")
        try:
            model.sliced(count - 1, count, partition)
        except InvalidParameterError as error:
            return f"{count}: {error}"
    if families is not None and any(count > 1 for count in counts):
        for family, fixed in families:
            for params in family_variants(get_family(family), DEFAULT_MAX_CHUNKS, fixed):
                refusal = slicing_refusal(family, params)
                if refusal is not None:
                    return f"{max(counts)}: family {refusal}; leave it out of the families"
    return None


def _slicings(model, sequence_slices, leads, specs, named, partition="even"):
    """``((slices, lead), ...)`` to search beside whole sequences, checked (cut by
    ``partition``)."""
    from tabsched.adapt.sequence import LEADS
    from tabsched.table import SLICE_PARTITIONS
    if not isinstance(partition, str) or partition not in SLICE_PARTITIONS:
        raise InvalidParameterError(f"slice_partition {partition!r} is not one of "
                                    f"{', '.join(SLICE_PARTITIONS)}")
    if sequence_slices is None:
        return ()
    counts = _choices("sequence_slices", sequence_slices)
    problem = slicing_problem(model, counts, specs if named else None, partition)
    if problem is not None:
        raise InvalidParameterError(f"sequence_slices {problem}")
    leads = _choices("slice_leads", leads)
    for lead in leads:
        if lead not in LEADS:
            raise InvalidParameterError(f"slice_leads {lead!r} is not one of "
                                        f"{', '.join(LEADS)}")
    if not leads:
        raise InvalidParameterError("slice_leads is empty")
    return tuple((k, lead) for k in sorted(set(counts)) if k > 1
                 for lead in LEADS if lead in leads)


def _split_text(gpus, contexts):
    """``t x p x d = 16``, or with context degrees ``t x cp x p x d = 16``."""
    return f"t x p x d = {gpus}" if contexts == (1,) else f"t x cp x p x d = {gpus}"


def where_text(model, system, gpus, global_batch):
    return f"{model.name} on {gpus} GPUs of {system.name} at a global batch of {global_batch}"


def _budget(memory_budget, system):
    from tabsched.memory import checked_budget
    if memory_budget is None:
        if system.memory_capacity is None:
            raise InvalidParameterError(f"system {system.name} states no memory_capacity: "
                                        f"give memory_budget")
        return float(system.memory_capacity)
    return checked_budget(memory_budget, "bytes")


def _base(execution):
    base = Execution() if execution is None else execution
    if not isinstance(base, Execution):
        raise InvalidParameterError(f"execution must be an Execution, not "
                                    f"{type(base).__name__}")
    if base.optimizer_step is None:
        base = base.replace(optimizer_step=True)
    if base.grad_sync is None:      # replicated stages (Chimera's) reduce their gradients
        base = base.replace(grad_sync="all" if base.overlap_grad_reduce else "replicas")
    return base


def _reasons(counts):
    """``"12 tensor degree does not divide the model, 3 ..."``, the largest first."""
    ordered = sorted(counts.items(), key=lambda item: -item[1])
    return ", ".join(f"{count} {reason}" for reason, count in ordered[:3]) + \
        (", ..." if len(ordered) > 3 else "")


def _nothing_fits(found, outcomes, budget, where):
    """The message when no configuration fits the budget: the closest, and by how much."""
    simulated = [(max(outcome.peak_memory), index) for index, outcome in outcomes.items()
                 if outcome.error is None]
    bounded = [(float(found.memory_bound[index]), index) for index in range(len(found))
               if index not in outcomes]
    limit = format_quantity(budget, "B")
    if simulated and (not bounded or min(simulated)[0] <= min(bounded)[0]):
        need, index = min(simulated)
        how = "needs"
    elif bounded:
        need, index = min(bounded)
        how = "needs at least"
    else:
        errors = [outcome.error for outcome in outcomes.values() if outcome.error]
        return f"no table of {where} could be built within {limit}: {errors[0]}"
    closest = found.configuration(index)
    persistent = float(found.persistent[index])
    what = ("the weights, gradients and optimizer state alone take "
            f"{format_quantity(persistent, 'B')}" if persistent > budget else
            f"{format_quantity(persistent, 'B')} of it persistent")
    return (f"nothing fits the {limit} memory budget for {where}: the closest, "
            f"{closest.describe()}, {how} {format_quantity(need, 'B')} per device "
            f"({what}), {format_quantity(need - budget, 'B')} over")


def _choices(name, values):
    """``values`` as a tuple of choices: one text or number is a choice of one; anything else
    that is no list (None, an object) is refused naming ``name``."""
    if isinstance(values, (str, bool, int, float)):
        return (values,)
    if isinstance(values, (bytes, dict)) or not hasattr(values, "__iter__"):
        raise InvalidParameterError(f"{name} must be a list of choices, not {values!r:.60}")
    return tuple(values)
