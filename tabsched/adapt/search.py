"""Adaptive search: the granularity with the lowest expected (or p95) makespan in budget.

:func:`adapt` starts from a table and descends greedily: each round applies
every move of a neighbourhood (:func:`default_moves`: deeper or shallower
warm-up per device, split backward with W in idle slots, fine grain at the
edges, whole splits and merges) to the current table, evaluates each candidate
-- peak memory from :func:`tabsched.evaluate`, makespan statistics from Monte
Carlo over the variation model -- and moves to the best one if it is better.
Every candidate is logged with what happened to it: evaluated, deadlocked,
not applicable (with the reason), or dropped because its memory broke the
transform's own statement.

Ranking
    A candidate that fits the budget beats one that does not; among those that
    do not, the smaller overshoot (summed over the devices) wins; then the
    objective (``mean`` or ``p95``
    makespan). With a variation model a move is taken only if its gain exceeds
    ``significance`` standard errors of the paired per-sample difference (the
    candidates share their random draws where they share operations), so the
    search does not chase sampling noise; without one, any gain is taken, and
    the result is never slower than the start.
References
    Every schedule the user could run instead (:mod:`tabsched.adapt.references`:
    every registry family at the start's devices and microbatches, multi-chunk
    ones at more chunks, ``zb-auto`` built for the same costs and budget) is
    measured on the search's samples; when the best one that fits beats the
    start, the search starts from it (``AdaptResult.started_from``). A start that
    does not fit still has its own moves tried in the first round (one may fit and
    beat the reference: a long sequence cut into slices); ``started_from`` is None
    when the search went on from one of them.
Report
    The chosen table and the references are evaluated again on fresh samples
    (``validation_seed``, default ``seed + 1``): the gains reported are not the
    search's own, selection-biased, numbers. If on those samples the best
    fitting reference beats the adapted table, the reference is returned
    instead (``AdaptResult.returned_reference`` names it).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from tabsched.adapt.montecarlo import run_monte_carlo
from tabsched.adapt.references import ALL, reference_tables
from tabsched.adapt.microbatches import MergeMicrobatches, SplitMicrobatches, SplitPhases
from tabsched.adapt.sequence import SplitSequence
from tabsched.adapt.split_backward import (SplitBackward, deferred_weight_grads,
                                           shared_staging)
from tabsched.adapt.transforms import Transform, cell_positions
from tabsched.adapt.warmup import Warmup
from tabsched.adapt.variation import VariationContext, check_variation
from tabsched.evaluate import checked_costs, evaluate_lowered, lower_for
from tabsched.memory import checked_budget
from tabsched.exceptions import (DeadlockError, InvalidParameterError, MemoryBudgetError,
                                 TabschedError)
from tabsched.layout import lay_out
from tabsched.table import BACKWARD, WEIGHT_GRAD, ScheduleTable

if TYPE_CHECKING:
    from collections.abc import Callable
    
    from tabsched.adapt.variation import Variation
    from tabsched.costs.base import CostModel

__all__ = ["adapt", "AdaptResult", "Candidate", "TableReport", "default_moves", "OBJECTIVES",
           "check_budget"]

OBJECTIVES = ("mean", "p95")
#: Screened candidates of a round measured on all the samples.
FINALISTS = 3


@dataclass(eq=False)
class Candidate:
    """One table the search tried.

    ``status``: ``"start"``, ``"evaluated"``, ``"deadlock"``, ``"not applicable"``,
    ``"memory statement broken"`` or ``"duplicate"`` (a table already seen);
    ``reason`` says why for the rejected ones. Figures are the search's own
    samples; ``peak_memory`` is persistent + activations per device.
    """

    id: int
    parent: int
    transforms: tuple
    status: str
    round: int = 0
    reason: str | None = None
    mean: float | None = None
    p95: float | None = None
    objective: float | None = None
    peak_memory: list | None = None
    over: float | None = None
    excess: float = 0.0
    table: ScheduleTable | None = field(default=None, repr=False)
    makespans: np.ndarray | None = field(default=None, repr=False)
    activation_peaks: np.ndarray | None = field(default=None, repr=False)
    context: object = field(default=None, repr=False)
    pending: object = field(default=None, repr=False, compare=False)

    @property
    def samples(self):
        """Monte Carlo samples behind ``mean``, ``p95`` and ``objective``."""
        return None if self.makespans is None else len(self.makespans)

    @property
    def evaluated(self):
        return self.status in ("start", "evaluated")

    @property
    def feasible(self):
        return self.evaluated and self.over <= 0

    def score(self):
        """Smaller is better: fits, then the summed overshoot of the devices, then the
        objective (the sum, not the largest, so that bringing any device closer to the
        budget counts as progress)."""
        return (0 if self.over <= 0 else 1, self.excess, self.objective)

    def to_dict(self):
        return {"id": self.id, "parent": self.parent, "round": self.round,
                "transforms": list(self.transforms), "status": self.status,
                "reason": self.reason, "samples": self.samples, "mean_makespan": self.mean,
                "p95_makespan": self.p95, "peak_memory": self.peak_memory,
                "feasible": self.feasible if self.evaluated else None}


@dataclass
class TableReport:
    """A table's figures on the validation samples, and whether it fits the budget."""

    name: str
    table: ScheduleTable
    transforms: tuple
    mean: float
    p50: float
    p95: float
    max: float
    nominal: float
    peak_memory: list
    feasible: bool

    @property
    def runtime_bubble(self):
        return self.mean - self.nominal

    def statistic(self, objective):
        return getattr(self, objective)

    def to_dict(self):
        return {"name": self.name, "mean_makespan": self.mean, "p50_makespan": self.p50,
                "p95_makespan": self.p95, "max_makespan": self.max,
                "nominal_makespan": self.nominal, "runtime_bubble": self.runtime_bubble,
                "peak_memory": list(self.peak_memory), "feasible": self.feasible,
                "transforms": list(self.transforms)}


@dataclass
class AdaptResult:
    """What :func:`adapt` found.

    Attributes
    ----------
    table : ScheduleTable
        The adapted table (the start itself if nothing beat it).
    feasible : bool
        Whether ``table`` fits the budget on every device. When nothing in
        budget was found, ``table`` is the candidate that overshoots least
        (summed over the devices), marked infeasible here.
    baseline, adapted : TableReport
        The start and the adapted table on the validation samples.
    references : dict
        ``{label: TableReport}`` of every reference that could be built and
        measured (``reference_errors``: ``{label: reason}`` of the others).
    log : list of Candidate
        Every candidate, in the order tried.
    started_from : str or None
        The reference the search started from, when it beat the given table;
        None when it started from the given table.
    returned_reference : str or None
        The reference returned because the search did not beat it on the
        validation samples (``adapted`` is then that reference's report).
    """

    table: ScheduleTable
    feasible: bool
    objective: str
    budget: float
    baseline: TableReport
    adapted: TableReport
    references: dict
    reference_errors: dict
    log: list
    rounds: int
    seconds: float
    samples: int
    seed: int
    validation_seed: int
    time_unit: str
    memory_unit: str
    variation: object = None
    started_from: str | None = None
    returned_reference: str | None = None

    @property
    def transforms(self):
        return self.adapted.transforms

    def __repr__(self):
        """One line: the adapted table's objective, its gain, and whether it fits."""
        unit = self.time_unit
        value = self.adapted.statistic(self.objective)
        shown = f"{value:.4g} {unit}"
        gain = self.gain(self.baseline)
        return (f"<AdaptResult {self.objective} makespan {shown}"
                + (f" ({gain:+.1%} over the start)" if gain is not None else "")
                + f", {len(self.transforms)} transforms, "
                + ("fits the budget" if self.feasible else "INFEASIBLE") + ">")

    def to_dataframe(self):
        """A pandas DataFrame, a row per table: baseline, adapted and the references
        (see :func:`tabsched.frames.adapt_frame`)."""
        from tabsched.frames import adapt_frame
        return adapt_frame(self)

    @property
    def best_reference(self):
        """Label of the fastest reference that fits the budget (objective, validation
        samples), or None."""
        fitting = [(report.statistic(self.objective), name)
                   for name, report in self.references.items()
                   if report is not None and report.feasible]
        return min(fitting)[1] if fitting else None

    def gain(self, over):
        """Relative gain of the objective over a report: ``1 - adapted / other``."""
        if over is None:
            return None
        value = over.statistic(self.objective)
        return 1.0 - self.adapted.statistic(self.objective) / value if value else None

    @property
    def headroom(self):
        """Budget minus the adapted table's peak memory, per device (None without budget)."""
        if self.budget is None:
            return None
        return [self.budget - peak for peak in self.adapted.peak_memory]

    def to_dict(self, *, log=True):
        """Plain data for JSON (times in ``time_unit``, memory in ``memory_unit``)."""
        statuses = {}
        for candidate in self.log:
            statuses[candidate.status] = statuses.get(candidate.status, 0) + 1
        data = {
            "budget": self.budget, "feasible": self.feasible, "objective": self.objective,
            "samples": self.samples, "seed": self.seed, "validation_seed": self.validation_seed,
            "time_unit": self.time_unit, "memory_unit": self.memory_unit,
            "variation": self.variation,
            "baseline": self.baseline.to_dict(), "adapted": self.adapted.to_dict(),
            "references": {name: None if report is None else report.to_dict()
                           for name, report in self.references.items()},
            "reference_errors": dict(self.reference_errors),
            "best_reference": self.best_reference,
            "started_from": self.started_from,
            "returned_reference": self.returned_reference,
            "gain": {"baseline": self.gain(self.baseline),
                     **{name: self.gain(report) for name, report in self.references.items()}},
            "headroom": self.headroom,
            "search": {"rounds": self.rounds, "candidates": len(self.log),
                       "statuses": statuses, "seconds": self.seconds},
        }
        if log:
            data["search"]["log"] = [candidate.to_dict() for candidate in self.log]
        return data


def default_moves(table, *, min_microbatch_size=0.25, max_microbatch_size=4.0,
                  sequence_slices=(), slice_partition="even"):
    """The neighbourhood of ``table``: the transforms the search tries from it.

    * warm-up one deeper on devices ``0..d`` and one shallower on ``d..P-1``,
      for every ``d`` (a device keeps a deeper warm-up than the next);
    * split backward on every device, deferring at most 0, 1, 2, any number or
      the cool-down's worth of ``W`` ops; and, on a table with ``W`` ops, one
      more, twice as many (plus one) or one fewer deferred ``W`` on one device;
    * split in two the first ``P-1`` microbatches to enter, the last ``P-1`` to
      leave, or both; split every microbatch in two; merge consecutive pairs.

    Splits stop at ``min_microbatch_size`` and merges at ``max_microbatch_size``
    (relative sizes, 1.0 = the model's microbatch), so the table stays finite.
    With ``sequence_slices`` (slice counts ``k``), each sequence cut into ``k``
    slices (:class:`~tabsched.adapt.sequence.SplitSequence`, at Seq1F1B's lead and at
    the row's, cut by ``slice_partition``: ``even`` or ``compute``) on a table not
    sliced yet.
    """
    P = table.num_devices
    moves = []
    for device in range(P):
        moves.append(Warmup(range(device + 1), 1))
    for device in range(P):
        moves.append(Warmup(range(device, P), -1))
    if np.any((table.kind == BACKWARD) | (table.kind == WEIGHT_GRAD)):
        moves.extend(SplitBackward(max_deferred=cap) for cap in (0, 1, 2, None, "cooldown"))
    if np.any(table.kind == WEIGHT_GRAD):
        for device, deferred in enumerate(deferred_weight_grads(table)):
            if not np.any((table.device == device) & (table.kind == WEIGHT_GRAD)):
                continue
            moves.append(SplitBackward([device], deferred + 1))
            if deferred > 0:
                moves.append(SplitBackward([device], 2 * deferred + 1))
                moves.append(SplitBackward([device], deferred - 1))
    sizes = np.asarray(table.microbatch_sizes, dtype=np.float64)
    edge = max(1, P - 1)
    for phases in (SplitPhases(2, edge, 0), SplitPhases(2, 0, edge), SplitPhases(2, edge, edge)):
        if np.all(sizes[phases.microbatches(table)] / 2 >= min_microbatch_size):
            moves.append(phases)
    if len(sizes) and sizes.min() / 2 >= min_microbatch_size:
        moves.append(SplitMicrobatches("all", 2))
    pairs = sizes[:len(sizes) // 2 * 2].reshape(-1, 2).sum(axis=1)
    if len(pairs) and pairs.max() <= max_microbatch_size:
        moves.append(MergeMicrobatches("all", 2))
    if table.sequence_slices is None:
        moves.extend(SplitSequence(k, lead, slice_partition) for k in sequence_slices
                     if k > 1 for lead in ("seq1f1b", "kept"))
    return moves


def check_budget(table, costs, memory_budget):
    """The budget as a number; ``MemoryBudgetError`` if some device cannot fit it at all."""
    if memory_budget is None:
        return None
    budget = checked_budget(memory_budget, costs.memory_unit)
    persistent = np.asarray(costs.persistent_memory(table), dtype=np.float64)
    if len(persistent) and float(persistent.max()) > budget:
        device = int(np.argmax(persistent))
        raise MemoryBudgetError(
            f"memory budget {_amount(budget, costs.memory_unit)} is below the persistent "
            f"memory of device {device} ({_amount(float(persistent[device]), costs.memory_unit)}"
            f" of weights, gradients and optimizer state); no schedule fits it")
    return budget


def _amount(value, unit):
    if unit == "bytes":
        from tabsched.costs.units import format_quantity
        return format_quantity(value, "B")
    return f"{value:.6g} {unit}"


def _table_key(table):
    """What makes two tables the same schedule: their row orders and microbatch sizes
    (slots follow from the orders), for a laid-out table or an order table alike; as
    a 32-byte BLAKE2 digest, so that remembering a thousand candidates costs little."""
    digest = hashlib.blake2b(digest_size=32)
    digest.update(repr((table.num_devices, len(table), table.microbatch_sizes)).encode())
    for column in (table.device, cell_positions(table).astype(np.int32), table.kind, table.stage,
                   table.microbatch):
        digest.update(np.ascontiguousarray(column).tobytes())
    return digest.digest()


class _Evaluator:
    """Evaluates candidate tables: memory from evaluate(), makespans from Monte Carlo."""

    def __init__(self, costs, variation, budget, *, samples, seed, iteration, objective):
        self.costs = costs
        self.variation = variation
        self.budget = budget
        self.samples = samples if variation is not None and variation.random else 1
        self.screen = min(self.samples, max(32, self.samples // 8))
        self.seed = seed
        self.iteration = iteration
        self.objective = objective

    def statistic(self, makespans):
        if self.objective == "mean":
            return float(makespans.mean())
        return float(np.percentile(makespans, 95))

    def memory(self, table, lowered):
        """Memory of ``table`` (``lowered``: its lowering, by ``lower_for``) from its run at
        the cost model's durations."""
        result = evaluate_lowered(table, self.costs, lowered, formula=False)
        totals = [d.peak_total_memory for d in result.devices]
        peaks = np.array([d.peak_memory for d in result.devices])
        over = max(totals) - self.budget if self.budget is not None and totals else -np.inf
        return result, totals, peaks, float(over)

    def excess(self, totals):
        if self.budget is None:
            return 0.0
        return float(np.maximum(np.asarray(totals) - self.budget, 0.0).sum())

    def measure(self, table, *, seed, samples):
        """Monte Carlo and memory of ``table`` on other samples (for the report)."""
        lowered = lower_for(table, self.costs)
        chains = lowered.link_chains()   # one rewrite for the nominal run and Monte Carlo
        result, totals, _, over = self.memory(table, lowered)
        context = VariationContext(result._lowered, self.costs, seed=seed,
                                   iteration=self.iteration)
        runs = run_monte_carlo(context, self.variation, samples=samples)
        del chains
        return runs, totals, over

    def fill(self, candidate, table, *, screen=False, pool=None):
        """Memory and Monte Carlo of ``candidate``'s ``table``. With ``pool`` (an executor
        of one thread) the Monte Carlo runs there and ``candidate.pending`` is its future
        (``settle`` waits for it): the kernel holds no GIL, so the next candidate is
        prepared meanwhile on the other core."""
        # the lowering's link chains (a rewrite of its DAG) are made once and held while
        # the nominal run and the Monte Carlo passes use them: both ran them at 64 devices
        lowered = lower_for(table, self.costs)
        chains = lowered.link_chains()
        result, totals, peaks, over = self.memory(table, lowered)
        candidate.table = table
        candidate.peak_memory = totals
        candidate.activation_peaks = peaks
        candidate.over = over
        candidate.excess = self.excess(totals)
        candidate.context = VariationContext(result._lowered, self.costs, seed=self.seed,
                                             iteration=self.iteration)
        samples = self.screen if screen else self.samples
        if pool is None:
            self.run(candidate, samples)
        else:
            candidate.pending = pool.submit(self.run, candidate, samples, chains)
        del chains
        return candidate

    @staticmethod
    def settle(candidate):
        """Wait for ``candidate``'s Monte Carlo if it runs in a pool (its error raised here)."""
        if candidate.pending is not None:
            pending, candidate.pending = candidate.pending, None
            pending.result()

    def run(self, candidate, samples, chains=None):
        """``samples`` Monte Carlo samples of ``candidate`` (``chains``: its lowering's link
        chains, held for the passes by a caller that made them)."""
        runs = run_monte_carlo(candidate.context, self.variation, samples=samples)
        del chains
        candidate.mean, candidate.p95 = runs.mean, runs.p95
        candidate.objective = runs.statistic(self.objective)
        candidate.makespans = runs.makespans

    def confirm(self, candidate):
        """Measure a screened candidate on all the samples."""
        if len(candidate.makespans) < self.samples:
            self.run(candidate, self.samples)

    def screened_score(self, candidate):
        """A candidate's score on the screening samples (a prefix of all of them)."""
        objective = self.statistic(candidate.makespans[:self.screen])
        return candidate.score()[:2] + (objective,)


def adapt(table: ScheduleTable, costs: CostModel | None = None,
          variation: Variation | None = None, memory_budget: float | str | None = None, *,
          objective: str = "mean", samples: int = 256, seed: int = 0, iteration: int = 0,
          moves: Callable | None = None, max_rounds: int = 24, significance: float = 2.0,
          min_microbatch_size: float = 0.25, max_microbatch_size: float = 4.0,
          validation_seed: int | None = None, validation_samples: int | None = None,
          references: object = ALL, start_from_reference: bool = True,
          progress: Callable[[int, int, int], None] | None = None) -> AdaptResult:
    """Search transforms of ``table`` for the fastest table that fits ``memory_budget``.

    Parameters
    ----------
    table : ScheduleTable
        The start (any family, or a table read from a file).
    costs : CostModel, optional
        Default ``UnitCosts()``.
    variation : Variation, optional
        Run-time variation; default none (the cost model's durations).
    memory_budget : float or str, optional
        Per device, in the cost model's memory unit (``"80GB"``); persistent plus
        activation memory must fit it. Default: no limit.
    objective : {"mean", "p95"}
    samples : int
        Monte Carlo samples per candidate (1 when the variation model draws
        nothing at random).
    seed, iteration : int
        Of the search's samples.
    moves : callable, optional
        ``moves(table) -> list of Transform``; default :func:`default_moves`
        with the two microbatch size limits below.
    max_rounds : int
        Greedy steps at most.
    significance : float
        A move with variation must gain this many standard errors of the paired
        per-sample difference (0: any gain).
    min_microbatch_size, max_microbatch_size : float
        Relative microbatch sizes the default moves do not split below or merge
        above.
    validation_seed, validation_samples : int, optional
        Fresh samples for the report; default ``seed + 1`` and ``samples``.
    references : "all" or sequence of str
        Families to compare with at the same budget (see
        :mod:`tabsched.adapt.references`); ``()`` for none.
    start_from_reference : bool
        Start the search from the best reference that fits, when it beats
        ``table`` on the search's samples.
    progress : callable, optional
        Called as ``progress(round, max_rounds, candidates)`` after each round (and
        with ``round = max_rounds`` when the search stops early).

    Returns
    -------
    AdaptResult

    Raises
    ------
    MemoryBudgetError
        If the budget is below some device's persistent memory.

    Examples
    --------
    >>> from tabsched import StageCosts, generate
    >>> found = adapt(generate("1f1b", devices=4, microbatches=8), StageCosts(1.0, comm=0.3),
    ...               memory_budget=6)
    >>> found.feasible, found.adapted.mean < found.baseline.mean
    (True, True)
    """
    started = time.perf_counter()
    costs = checked_costs(table, costs)
    check_variation(variation)
    if objective not in OBJECTIVES:
        raise InvalidParameterError(f"objective {objective!r} is not one of "
                                    f"{', '.join(OBJECTIVES)}")
    for name, value in (("samples", samples), ("max_rounds", max_rounds)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise InvalidParameterError(f"{name} must be an integer >= 1, not {value!r}")
    if variation is not None:
        variation.validate(table)
    budget = check_budget(table, costs, memory_budget)
    if moves is None:
        def moves(current):
            return default_moves(current, min_microbatch_size=min_microbatch_size,
                                 max_microbatch_size=max_microbatch_size)
    evaluator = _Evaluator(costs, variation, budget, samples=samples, seed=seed,
                           iteration=iteration, objective=objective)

    log = []
    seen = {}
    start = evaluator.fill(Candidate(id=0, parent=-1, transforms=(), status="start"), table)
    log.append(start)
    seen[_table_key(table)] = start
    current = start
    built, errors = reference_tables(table, costs, budget, references)
    better = _better_reference(evaluator, built, errors, variation) if start_from_reference \
        else None
    started_from = None
    if better is not None and better[1].score() < start.score():
        started_from, current = better
        current.id, current.reason = len(log), f"reference {started_from}"
        log.append(current)
        seen[_table_key(current.table)] = current
    rounds = 0
    with shared_staging():   # split-backward's moves on one parent share its staged arrays
        for rounds in range(1, max_rounds + 1):
            parent = current
            screened: list[tuple[Candidate, Transform]] = []
            with _screening_pool() as pool:
                # each candidate's screening Monte Carlo runs in the pool while the next one
                # is prepared (orders, layout, memory); taken in the moves' order, so the
                # screened list and the contexts freed are those of one candidate at a time
                previous = None
                # a start that does not fit is left for a reference that does, but the
                # first round also tries the start's own moves: one of them may fit and beat
                # the reference (a long sequence cut into slices, where no whole-sequence
                # table fits)
                parents = [parent] + ([start] if rounds == 1 and started_from is not None
                                      and start.over > 0 else [])
                for origin in parents:
                    for move in moves(origin.table):
                        candidate = _try(evaluator, origin, move, rounds, len(log), seen,
                                         screen=True, pool=pool)
                        log.append(candidate)
                        if previous is not None:
                            _screened(evaluator, screened, *previous)
                        previous = (candidate, move)
                if previous is not None:
                    _screened(evaluator, screened, *previous)
            screened.sort(key=lambda pair: pair[0].score())
            finalists = [candidate for candidate, _ in screened[:FINALISTS]]
            for candidate in finalists:
                evaluator.confirm(candidate)
            best = min(finalists, key=Candidate.score, default=None)
            if best is None or not _better(best, current, evaluator, significance):
                break
            current = best
            # the round's other promising moves, one by one on top of the best
            bar = evaluator.screened_score(parent)
            for candidate, move in screened:
                if candidate is best or evaluator.screened_score(candidate) >= bar:
                    continue
                if move not in moves(current.table):  # e.g. a split now below the size limit
                    continue
                stacked = _try(evaluator, current, move, rounds, len(log), seen, screen=True)
                log.append(stacked)
                if stacked.status != "evaluated" or \
                        stacked.score() >= evaluator.screened_score(current):
                    continue
                evaluator.confirm(stacked)
                if _better(stacked, current, evaluator, significance):
                    current = stacked
            for candidate in log:  # only the current table is measured again
                if candidate is not current:
                    candidate.context = None
            if progress is not None and rounds < max_rounds:
                progress(rounds, max_rounds, len(log))
    if progress is not None:   # the last round, or an early stop: the bar completes
        progress(max_rounds, max_rounds, len(log))

    for candidate in log:
        candidate.context = None
    validation_seed = seed + 1 if validation_seed is None else validation_seed
    validation_samples = evaluator.samples if validation_samples is None else validation_samples

    units = []   # the sampled durations' unit: seconds when a replay brings them
    measured = {}  # id of a table measured -> (table, its measure): the search returns
    # a reference it started from as the adapted table, measured once for both rows

    def report(name, chosen, transforms):
        if id(chosen) not in measured:
            measured[id(chosen)] = chosen, evaluator.measure(chosen, seed=validation_seed,
                                                             samples=validation_samples)
        runs, totals, over = measured[id(chosen)][1]
        units.append(runs.time_unit)
        return TableReport(name=name, table=chosen, transforms=tuple(transforms),
                           mean=runs.mean, p50=runs.p50, p95=runs.p95, max=runs.max,
                           nominal=runs.nominal_makespan, peak_memory=totals,
                           feasible=over <= 0)

    baseline = report(table.family or "start", table, ())
    adapted = baseline if current is start else report("adapted", current.table,
                                                       current.transforms)
    found = {}
    for name, reference in built.items():
        if name in errors:
            continue
        try:
            if variation is not None:
                variation.validate(reference)
            found[name] = report(name, reference, ())
        except TabschedError as error:
            errors[name] = str(error)
    if started_from is not None and _root(log, current) == start.id:
        started_from = None          # the search went on from the start's own moves
    chosen, feasible, returned = current.table, current.feasible, None
    fitting = [(found[name].statistic(objective), name) for name in found
               if found[name].feasible]
    if fitting and min(fitting)[0] < adapted.statistic(objective):
        returned = min(fitting)[1]
        adapted, chosen, feasible = found[returned], found[returned].table, True
    return AdaptResult(
        table=chosen, feasible=feasible, objective=objective, budget=budget,
        baseline=baseline, adapted=adapted, references=found, reference_errors=errors,
        log=log, rounds=rounds, seconds=time.perf_counter() - started,
        samples=evaluator.samples, seed=seed, validation_seed=validation_seed,
        time_unit=units[0], memory_unit=costs.memory_unit,
        variation=None if variation is None else variation.describe(),
        started_from=started_from, returned_reference=returned)


def _root(log, candidate):
    """The id of the first candidate of ``candidate``'s line: the start's, or the
    reference's the search started from."""
    by_id = {entry.id: entry for entry in log}
    while candidate.parent >= 0 and candidate.parent in by_id:
        candidate = by_id[candidate.parent]
    return candidate.id


def _better_reference(evaluator, built, errors, variation):
    """``(label, Candidate)`` of the best reference on the search's samples, or None.

    References the variation model does not fit (a straggler on a device the
    reference lacks...) move to ``errors``.
    """
    best = None
    for name, reference in built.items():
        try:
            if variation is not None:
                variation.validate(reference)
            candidate = evaluator.fill(Candidate(id=-1, parent=-1, transforms=(),
                                                 status="start"), reference, screen=True)
        except TabschedError as error:
            errors[name] = str(error)
            continue
        if best is None or candidate.score() < best[1].score():
            if best is not None:
                best[1].context = None
            best = (name, candidate)
        else:
            candidate.context = None
    if best is not None:
        evaluator.confirm(best[1])
    return best


def _screening_pool():
    """An executor of one thread for the screening Monte Carlo where this process may use
    two cores or more, else a context that gives None (every pass in this thread)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):      # not Linux
        cores = os.cpu_count() or 1
    if cores < 2:
        return contextlib.nullcontext()
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="tabsched-screen")


def _screened(evaluator, screened, candidate, move):
    """Wait for ``candidate``'s screening; keep it among ``screened`` if it was evaluated."""
    evaluator.settle(candidate)
    if candidate.status == "evaluated":
        screened.append((candidate, move))
        _keep_finalists(screened)


def _try(evaluator, parent, move, round_, index, seen, *, screen=False, pool=None):
    """Apply one move to the parent's table and evaluate the candidate (its Monte Carlo
    in ``pool`` if given: see ``_Evaluator.fill``)."""
    if not isinstance(move, Transform):
        raise InvalidParameterError(f"moves must give transforms, not {type(move).__name__}")
    transforms = parent.transforms + (move.describe(),)
    candidate = Candidate(id=index, parent=parent.id, transforms=transforms,
                          status="evaluated", round=round_)
    try:
        # the row orders first: a duplicate is recognised before it is laid out
        orders = move.orders(parent.table, evaluator.costs)
        key = _table_key(orders)
        if key in seen:
            candidate.status = "duplicate"
            candidate.reason = f"same table as candidate {seen[key].id}"
            return candidate
        table = lay_out(orders)
        effect = move.memory_effect(parent.table, evaluator.costs)
    except DeadlockError as error:
        candidate.status, candidate.reason = "deadlock", str(error)
        return candidate
    except InvalidParameterError as error:
        candidate.status, candidate.reason = "not applicable", str(error)
        return candidate
    evaluator.fill(candidate, table, screen=screen, pool=pool)
    seen[key] = candidate
    broken = effect.check(parent.activation_peaks, candidate.activation_peaks)
    if broken:
        d = broken[0]
        candidate.status = "memory statement broken"
        candidate.reason = (f"device {d}: peak changed by "
                            f"{candidate.activation_peaks[d] - parent.activation_peaks[d]:.6g}, "
                            f"outside [{effect.lower[d]:.6g}, {effect.upper[d]:.6g}] "
                            f"({effect.statement})")
    return candidate


def _keep_finalists(screened):
    """Free the lowered DAG of every screened candidate that can no longer be a finalist.

    Only the ``FINALISTS`` best screened candidates are measured again on all the
    samples; a candidate pushed out of them never returns (a later one that ties
    ranks after it, as the stable sort of the round ranks it), so its context goes
    now and a round holds ``FINALISTS + 1`` DAGs, not one per move (at 64 devices,
    hundreds of moves of about 8 MB each).
    """
    if len(screened) <= FINALISTS:
        return
    ranked = sorted(range(len(screened)), key=lambda at: screened[at][0].score())
    for at in ranked[FINALISTS:]:
        screened[at][0].context = None


def _better(candidate, current, evaluator, significance):
    """Whether moving to ``candidate`` is an improvement the samples can tell."""
    if candidate.score()[:2] != current.score()[:2]:
        return candidate.score() < current.score()
    if not candidate.objective < current.objective:
        return False
    if evaluator.samples == 1 or significance <= 0:
        return True
    difference = current.makespans - candidate.makespans
    error = float(difference.std(ddof=1)) / np.sqrt(len(difference)) \
        if len(difference) > 1 else 0.0
    return current.objective - candidate.objective > significance * error
