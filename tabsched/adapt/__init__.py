"""Run-time bubbles and granularity-adaptive scheduling under memory limits.

A static table assumes fixed durations. At run time they vary -- kernel jitter,
a straggling device, a degraded link -- and idle time appears that no table
shows: **run-time bubbles**. How work is cut into operations (its granularity)
decides how much of that variation becomes idle time, and how much memory it
costs. This package measures run-time bubbles and searches for the granularity
that removes them within each device's memory.

* :mod:`~tabsched.adapt.variation` -- variation models: :class:`Noise`
  (lognormal, by CV), :class:`Straggler`, :class:`SlowLink` (bandwidth factor
  on the bytes/bandwidth part, latency spikes), and the context they act in.
* :mod:`~tabsched.adapt.replay` -- :class:`Replay`: measured durations
  (``op,duration`` rows, profiler traces) replayed sample by sample.
* :mod:`~tabsched.adapt.streams` -- the random streams every model draws from:
  keyed by seed, iteration, sample and operation, reproducible to the bit.
* :mod:`~tabsched.adapt.montecarlo` -- :func:`monte_carlo`: one lowered table,
  N sampled iterations through the kernel's samples axis; mean, p50, p95, max
  of the makespan and the run-time bubble, per device too.
* :mod:`~tabsched.adapt.transforms` -- granularity transforms, each a valid
  table with consistent costs and a stated memory effect (:class:`Transform`,
  :class:`MemoryEffect`): :class:`SplitMicrobatches`, :class:`SplitPhases`
  and :class:`MergeMicrobatches` (:mod:`~tabsched.adapt.microbatches`),
  :class:`Warmup` (:mod:`~tabsched.adapt.warmup`), :class:`SplitBackward`
  (W in idle slots, :mod:`~tabsched.adapt.split_backward`), :class:`SplitSequence`
  (sequence slices, Seq1F1B: :mod:`~tabsched.adapt.sequence`).
* :mod:`~tabsched.adapt.references` -- :func:`reference_tables`: every
  family at the start's devices and microbatches (``zb-auto`` built for the
  same costs and budget), what the search is measured against.
* :mod:`~tabsched.adapt.search` -- :func:`adapt`: greedy descent over the
  transforms for the lowest mean (or p95) makespan whose peak memory fits every
  device, starting from the best reference when it beats the start, with a log
  of every candidate and the gains over the start and every reference at the
  same budget.
* :mod:`~tabsched.adapt.online` -- :func:`adapt_online`: drifting conditions,
  re-adaptation from observed durations, iteration times with and without.

>>> import tabsched
>>> from tabsched.adapt import Noise, SlowLink, adapt, monte_carlo
>>> table = tabsched.generate("1f1b", devices=4, microbatches=8)
>>> costs = tabsched.StageCosts(1.0, comm=0.2)
>>> runs = monte_carlo(table, costs, Noise(0.1) + SlowLink((1, 2), 3.0), samples=100, seed=1)
>>> runs.runtime_bubble > 0
True
>>> found = adapt(table, costs, Noise(0.1) + SlowLink((1, 2), 3.0), memory_budget=6)
>>> found.feasible and found.adapted.mean < found.baseline.mean
True
"""

from tabsched.adapt.montecarlo import DeviceRuntime, MonteCarloResult, monte_carlo
from tabsched.adapt.online import OnlineIteration, OnlineResult, adapt_online
from tabsched.adapt.references import reference_tables
from tabsched.adapt.search import AdaptResult, Candidate, TableReport, adapt, default_moves
from tabsched.adapt.microbatches import MergeMicrobatches, SplitMicrobatches, SplitPhases
from tabsched.adapt.sequence import SplitSequence
from tabsched.adapt.split_backward import SplitBackward, deferred_weight_grads
from tabsched.adapt.transforms import MemoryEffect, Transform
from tabsched.adapt.warmup import Warmup, warmup_depths
from tabsched.adapt.replay import Replay
from tabsched.adapt.variation import (Combined, Noise, SlowLink, Straggler, Variation,
                                      VariationContext, estimate_variation)

__all__ = [
    "Variation", "Noise", "Straggler", "SlowLink", "Replay", "Combined", "VariationContext",
    "estimate_variation",
    "monte_carlo", "MonteCarloResult", "DeviceRuntime",
    "Transform", "MemoryEffect", "SplitMicrobatches", "MergeMicrobatches", "SplitBackward",
    "Warmup", "SplitPhases", "SplitSequence", "deferred_weight_grads", "warmup_depths",
    "adapt", "AdaptResult", "Candidate", "TableReport", "default_moves", "reference_tables",
    "adapt_online", "OnlineResult", "OnlineIteration",
]
