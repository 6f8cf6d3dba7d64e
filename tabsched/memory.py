"""Memory accounting: what each device holds over an iteration, and the budget.

An activation is held from the start of its ``F`` to the end of its backward
(with a split backward, ``I`` frees ``input_grad_release`` of it and ``W`` the
rest); an operation's working memory (the cost model's ``transient_sizes``) only
while it runs; a device's persistent memory (weights, gradients, optimizer
state) all the time; with ZeRO-2/3, a stage's gathered parameters and full
gradients between the nodes that gather and free them
(:func:`tabsched.sharding.shard_memory_events`). Memory is in bytes under ``ModelCosts``, else in units of
one stage's activation for one full microbatch.

:func:`memory_events` are a device's deltas; sorted by (time, delta) and summed
they are its timeline (``Result.memory_timeline``). :func:`activation_peaks` and
:func:`device_peaks` find each device's peak without the timelines
(``_build.activation_peaks``); :func:`memory_violations` the devices over a
budget (:func:`checked_budget`).
"""

from dataclasses import dataclass

import numpy as np

from tabsched import _build
from tabsched.exceptions import InvalidParameterError
from tabsched.table import BACKWARD, FORWARD, INPUT_GRAD, WEIGHT_GRAD

__all__ = ["memory_events", "activation_peaks", "device_peaks", "memory_sizes",
           "memory_violations", "checked_budget", "MemoryViolation"]


@dataclass
class MemoryViolation:
    """A device whose total memory (persistent + activations) goes over the budget.

    ``since`` is the first time it is over, ``time`` when it reaches its peak
    ``memory``; ``over = memory - budget``. Memory that is over from the start
    (persistent memory alone) is over ``since`` 0.
    """

    device: int
    since: float
    time: float
    memory: float
    budget: float

    @property
    def over(self):
        """By how much the device's memory exceeds its budget (bytes, positive)."""
        return self.memory - self.budget


def memory_events(kind, activation, transient, release, start, end):
    """``(times, deltas)``: the memory events of a device's operations, unsorted.

    Each operation has one event at its start, ``+activation`` for a forward plus
    its working memory (``transient``), and one at its end, ``-working memory``
    for a forward, else minus what it frees (all of the activation for ``B``,
    ``release`` of it for ``I``, the rest for ``W``) and its working memory. Zero
    deltas are dropped. Sorted by (time, delta) and summed, they are the memory
    timeline; ``_build.activation_peaks`` sums the same deltas in the same order.
    """
    is_f = kind == FORWARD
    held = np.zeros(len(kind)) if transient is None else transient
    freed = np.select([kind == BACKWARD, kind == INPUT_GRAD, kind == WEIGHT_GRAD],
                      [activation, activation * release, activation * (1.0 - release)], 0.0)
    times = np.concatenate([start, end])
    deltas = np.concatenate([np.where(is_f, activation, 0.0) + held,
                             np.where(is_f, -held, -(freed + held))])
    keep = deltas != 0
    return times[keep], deltas[keep]


def activation_peaks(result):
    """Each device's activation peak: the largest value of its memory timeline (or 0),
    computed without building the timelines (``_build.activation_peaks``)."""
    peaks = device_peaks(result.table, result._cost_model, *result._cell_run())
    if peaks is not None:
        return peaks
    return [max(0.0, float(values.max())) if len(values) else 0.0
            for _, values in result.memory_timeline()]


def device_peaks(table, costs, lowered, node_start, durations, sizes=None):
    """Activation peaks per device by ``_build.activation_peaks``, or None if it cannot
    order the events (then the timelines decide). ``sizes``: ``memory_sizes(table,
    costs)`` if at hand. With ZeRO-2/3 nodes (``lowered.sharding``) the timelines
    decide, since they hold what those nodes gather and free."""
    if getattr(lowered, "sharding", None) is not None:
        return None
    activation, transient, _ = memory_sizes(table, costs) if sizes is None else sizes
    peaks = np.zeros(table.num_devices)
    status = _build.activation_peaks(table.device, table.kind, lowered.cell_of_op,
                                     np.ascontiguousarray(node_start),
                                     np.ascontiguousarray(durations), activation, transient,
                                     float(costs.input_grad_release), peaks)
    return peaks.tolist() if status == _build.OK else None


def memory_sizes(table, costs):
    """``(activation, transient, persistent)``: the arrays the memory of ``table`` under
    ``costs`` is made of (the first two per operation, contiguous; the last per device)."""
    return (np.ascontiguousarray(costs.activation_sizes(table), dtype=np.float64),
            np.ascontiguousarray(costs.transient_sizes(table), dtype=np.float64),
            np.asarray(costs.persistent_memory(table), dtype=np.float64))


def checked_budget(value, memory_unit):
    """A memory budget as a number of ``memory_unit`` (``"80GB"`` for bytes), > 0."""
    if memory_unit == "bytes" and isinstance(value, str):
        from tabsched.costs.units import parse_quantity
        number = parse_quantity(value, "B", name="memory_budget")
    else:
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise InvalidParameterError(f"memory_budget must be a number of {memory_unit}, "
                                        f"not {value!r}") from None
    if not np.isfinite(number) or number <= 0:
        raise InvalidParameterError(f"memory_budget must be > 0, not {value!r}")
    return number


def memory_violations(result, budget):
    """The devices of ``result`` whose persistent + activation memory exceeds ``budget``."""
    violations = []
    for stats, (times, values) in zip(result.devices, result.memory_timeline()):
        base = stats.persistent_memory
        total = base + values
        peak = max(base, float(total.max()) if len(total) else base)
        if peak <= budget:
            continue
        if base > budget or not len(total):
            since = 0.0
        else:
            since = float(times[np.argmax(total > budget)])
        when = float(times[np.argmax(total)]) if len(total) and peak > base else 0.0
        violations.append(MemoryViolation(device=stats.device, since=since, time=when,
                                          memory=peak, budget=budget))
    return violations
