"""Online mode: conditions drift from iteration to iteration, the schedule follows.

:func:`adapt_online` simulates a run of training iterations under a variation
model whose parts may hold only in some iterations (a link that slows down at
iteration ``k``: ``SlowLink(..., iterations=range(k, n))``; a device that
recovers at ``j``: ``Straggler(..., iterations=range(j))``). Two schedules run
every iteration on the same draws:

* **static**: the starting table, never changed;
* **adaptive**: after each iteration, the durations observed in it are fitted
  to a variation model (:func:`~tabsched.adapt.estimate_variation`: a slowdown
  per device, a bandwidth factor per link, the noise left over) and, when that
  fit has moved by more than ``retune`` since the last search, :func:`adapt`
  searches again from the starting table under the fitted model; the table it
  returns runs the next iteration.

The adaptive schedule sees only what a real run could see -- the durations of
its own past iterations -- never the variation model itself.
"""

from dataclasses import dataclass

import numpy as np

from tabsched.adapt.search import adapt, check_budget
from tabsched.adapt.variation import (Noise, SlowLink, Straggler, VariationContext,
                                      check_variation, estimate_variation)
from tabsched.evaluate import checked_costs, lower_for
from tabsched.exceptions import InvalidParameterError

__all__ = ["adapt_online", "OnlineResult", "OnlineIteration"]


@dataclass
class OnlineIteration:
    """One iteration: its time under both schedules, and what the adaptive side did.

    ``transforms`` are those of the table that ran this iteration; ``searched``
    says whether a search ran after it (its table runs the next iteration).
    """

    iteration: int
    static: float
    adaptive: float
    transforms: tuple
    feasible: bool
    searched: bool
    estimate: object

    def to_dict(self):
        return {"iteration": self.iteration, "static": self.static,
                "adaptive": self.adaptive, "transforms": list(self.transforms),
                "feasible": self.feasible, "searched": self.searched,
                "estimate": self.estimate}


@dataclass
class OnlineResult:
    """Iteration times with and without re-adaptation."""

    iterations: list
    searches: int
    time_unit: str
    budget: float | None = None

    @property
    def static_total(self):
        return float(sum(item.static for item in self.iterations))

    @property
    def adaptive_total(self):
        return float(sum(item.adaptive for item in self.iterations))

    @property
    def gain(self):
        """``1 - adaptive total / static total``."""
        static = self.static_total
        return 1.0 - self.adaptive_total / static if static else 0.0

    def to_dict(self):
        return {"static_total": self.static_total, "adaptive_total": self.adaptive_total,
                "gain": self.gain, "searches": self.searches, "time_unit": self.time_unit,
                "budget": self.budget,
                "iterations": [item.to_dict() for item in self.iterations]}


def _signature(estimate, num_devices):
    """Device factors, link factors and CVs of a fitted model, for comparing fits."""
    devices = np.ones(num_devices)
    links = {}
    noise = (0.0, 0.0)
    for part in estimate.parts:
        if isinstance(part, Straggler):
            devices[part.device] = part.factor
        elif isinstance(part, SlowLink):
            links[part.devices] = part.bandwidth_factor
        elif isinstance(part, Noise):
            noise = (part.cv, part.transfers)
    return devices, links, noise


def _moved(new, old, tolerance):
    devices, links, noise = new
    old_devices, old_links, old_noise = old
    if np.any(np.abs(devices / old_devices - 1.0) > tolerance):
        return True
    for key in set(links) | set(old_links):
        if abs(links.get(key, 1.0) / old_links.get(key, 1.0) - 1.0) > tolerance:
            return True
    return any(abs(a - b) > tolerance for a, b in zip(noise, old_noise))


def adapt_online(table, costs=None, variation=None, memory_budget=None, *, iterations=20,
                 seed=0, samples=64, objective="mean", retune=0.05, max_rounds=8,
                 significance=2.0):
    """Simulate ``iterations`` iterations with and without re-adapting the schedule.

    Parameters
    ----------
    table : ScheduleTable
        The starting table (the static schedule).
    costs : CostModel, optional
    variation : Variation, optional
        The conditions of the run, iteration by iteration (the truth the
        simulation draws from; the adaptive side never sees it).
    memory_budget : optional
        As in :func:`adapt`.
    iterations : int
    seed : int
        Of the simulated run; the searches use ``seed + 1``.
    samples, objective, max_rounds, significance :
        Passed to each :func:`adapt` search.
    retune : float
        Search again when a fitted device or link factor moved by more than
        this (relative), or a fitted CV by more than this (absolute).

    Returns
    -------
    OnlineResult

    Examples
    --------
    >>> from tabsched import StageCosts, generate
    >>> from tabsched.adapt import SlowLink
    >>> run = adapt_online(generate("1f1b", devices=4, microbatches=8),
    ...                    StageCosts(1.0, comm=0.5), SlowLink((1, 2), 4.0, iterations="2-5"),
    ...                    memory_budget=6, iterations=6)
    >>> [item.static for item in run.iterations][:3]
    [41.0, 41.0, 52.0]
    >>> run.adaptive_total < run.static_total
    True
    """
    costs = checked_costs(table, costs)
    check_variation(variation)
    if isinstance(iterations, bool) or not isinstance(iterations, (int, np.integer)) \
            or iterations < 1:
        raise InvalidParameterError(f"iterations must be an integer >= 1, not {iterations!r}")
    if variation is not None:
        variation.validate(table)
    budget = check_budget(table, costs, memory_budget)

    def context_of(chosen):
        lowered = lower_for(chosen, costs)
        return VariationContext(lowered, costs, seed=seed)

    def run(context, iteration):
        context.iteration = iteration
        durations = context.sample_durations(variation, [0])
        makespan = context.lowered.run_summary(durations)[0]
        return float(makespan[0]), durations[0]

    static_context = context_of(table)
    current, transforms, feasible = table, (), True
    current_context = static_context
    fitted = None
    history = []
    searches = 0
    for iteration in range(iterations):
        static_time, _ = run(static_context, iteration)
        adaptive_time, observed = run(current_context, iteration)
        estimate = estimate_variation(current_context, observed)
        signature = _signature(estimate, table.num_devices)
        searched = fitted is None or _moved(signature, fitted, retune)
        record = OnlineIteration(iteration=iteration, static=static_time,
                                 adaptive=adaptive_time, transforms=transforms,
                                 feasible=feasible, searched=searched,
                                 estimate=estimate.describe())
        history.append(record)
        if searched and iteration + 1 < iterations:
            found = adapt(table, costs, estimate, budget, objective=objective,
                          samples=samples, seed=seed + 1, max_rounds=max_rounds,
                          significance=significance, references=())
            searches += 1
            fitted = signature
            current, transforms, feasible = found.table, found.transforms, found.feasible
            current_context = context_of(current)
        elif searched:
            record.searched = False
    return OnlineResult(iterations=history, searches=searches, time_unit=costs.time_unit,
                        budget=budget)
