"""The entry points of the evaluator: lower a table, run the engine, build the result.

:func:`evaluate` gives one :class:`~tabsched.result.Result`; :func:`evaluate_many`
one per cost model, sharing lowerings and kernel calls; :func:`evaluate_summaries`
what a sweep writes (a :class:`~tabsched.result.Summary` each, the same numbers to
the bit); :func:`table_level` the idealized-table level. The Result and its parts
live in :mod:`tabsched.result`, the memory accounting in :mod:`tabsched.memory`;
both are importable from here too.
"""

from __future__ import annotations

import numpy as np

from tabsched.formats import table_notes
from tabsched import engine
from tabsched.costs import CostModel, UnitCosts
from tabsched.exceptions import InvalidParameterError
from tabsched.execution import Execution
from tabsched.lower import INDEX, lower
from tabsched.memory import (activation_peaks, checked_budget, device_peaks, memory_events,
                             memory_sizes, memory_violations)
from tabsched.nodes import CELL, OPTIMIZER, TRANSFER
from tabsched.result import (DeviceStats, LinkStats, MemoryViolation, PathStep, Result,
                             Summary)
from tabsched.sharding import gathered_note
from tabsched.table import ScheduleTable

__all__ = ["evaluate", "evaluate_many", "evaluate_summaries", "table_level", "Result",
           "DeviceStats", "PathStep", "LinkStats", "MemoryViolation", "Summary",
           "memory_events", "activation_peaks", "memory_violations"]


def checked_costs(table, costs):
    """``costs`` (default ``UnitCosts()``) after the checks every evaluation of ``table`` makes."""
    if not isinstance(table, ScheduleTable):
        raise InvalidParameterError(f"table must be a ScheduleTable, not {type(table).__name__}")
    costs = UnitCosts() if costs is None else costs
    if not isinstance(costs, CostModel):
        raise InvalidParameterError(f"costs must be a cost model, not {type(costs).__name__}")
    return costs


def run_as(costs, execution):
    """``costs`` run as ``execution`` (``None``: as they are); see ``with_execution``."""
    if execution is None:
        return costs
    if not isinstance(execution, Execution):
        raise InvalidParameterError(f"execution must be an Execution, not "
                                    f"{type(execution).__name__}")
    return costs.with_execution(execution)


def lower_for(table, costs, *, contention=None, grad_sync=None, optimizer=None,
              transfer_after=None, shard_windows=None, free_transfers=False):
    """``table`` lowered the way ``costs`` runs it, unless an argument says otherwise.

    The cost model's execution gives the contention mode, devices per node, blocking
    sends, the optimizer step and the sharding nodes (ZeRO-2/3); the gradient sync is the execution's when it names
    one, else the table's own (PyTorch's REDUCE_GRAD) if it has one, else every stage
    when the data-parallel reduction overlaps the backwards, else none.
    ``free_transfers``: ``lower``'s, where ``costs`` price every transfer at 0
    (``costs.free_transfers``).
    """
    return lower(table, contention=costs.contention if contention is None else contention,
                 devices_per_node=costs.devices_per_node, p2p=costs.p2p,
                 grad_sync=_default_grad_sync(table, costs) if grad_sync is None else grad_sync,
                 optimizer=costs.optimizer_step if optimizer is None else optimizer,
                 transfer_after=transfer_after, sharding=costs.sharding,
                 shard_windows=shard_windows,
                 free_transfers=free_transfers and costs.free_transfers)


def evaluate(table: ScheduleTable, costs: CostModel | None = None, *,
             execution: Execution | None = None, contention: str | None = None,
             grad_sync: object = None, optimizer: bool | None = None, formula: bool = True,
             memory_budget: float | str | None = None,
             transfer_after: tuple | None = None,
             shard_windows: tuple | None = None) -> Result:
    """Evaluate ``table`` under ``costs`` (default ``UnitCosts()``) run as ``execution``.

    Parameters
    ----------
    table : ScheduleTable
    costs : CostModel, optional
    execution : Execution, optional
        How the table runs (default: the cost model's own execution): its parallel
        degrees, batch and recompute price the operations, its contention and tail
        lower the table. The keywords below are conveniences that change one thing.
    contention : {"none", "link", "nic"}, optional
        Overrides the execution's mode.
    grad_sync, optimizer : optional
        The iteration's tail (see :func:`tabsched.lower.lower`); default the
        execution's ``grad_sync`` if it names one, else the table's if it has one
        (PyTorch's REDUCE_GRAD), else the execution's default, and the execution's
        ``optimizer_step``.
    formula : bool
        Attach the formula level's numbers for the table's family.
    memory_budget : float or str, optional
        Memory per device, in the cost model's ``memory_unit`` (``"80GB"`` for
        bytes): every device whose persistent plus activation memory goes over
        it is reported in ``result.violations`` (``result.check_memory()``
        raises for them).
    transfer_after : optional
        Extra edges into transfer nodes (see :func:`tabsched.lower.lower`).
    shard_windows : optional
        ZeRO-3's windows as a file places them (PyTorch's UNSHARD/RESHARD; see
        :func:`tabsched.lower.lower`); default tabsched's own.

    Returns
    -------
    Result

    Raises
    ------
    DeadlockError
        If the row orders contradict the dependencies.

    Examples
    --------
    >>> from tabsched.schedules import generate
    >>> result = evaluate(generate("1f1b", devices=4, microbatches=8))
    >>> result.level, result.makespan, round(result.bubble_ratio, 4)
    ('table', 33.0, 0.2727)
    >>> [d.peak_memory for d in result.devices]
    [4.0, 3.0, 2.0, 1.0]
    """
    costs = run_as(checked_costs(table, costs), execution)
    if not isinstance(formula, (bool, np.bool_)):
        raise InvalidParameterError(f"formula must be True or False, not "
                                    f"{type(formula).__name__}")
    if memory_budget is not None:
        memory_budget = checked_budget(memory_budget, costs.memory_unit)
    # free transfers (UnitCosts): a direct edge each, no node; the Result lowers the
    # table with them when asked about them
    lowered = lower_for(table, costs, contention=contention, grad_sync=grad_sync,
                        optimizer=optimizer, transfer_after=transfer_after,
                        shard_windows=shard_windows, free_transfers=True)
    return evaluate_lowered(table, costs, lowered, formula=formula,
                            memory_budget=memory_budget)


def evaluate_lowered(table, costs, lowered, *, formula=True, memory_budget=None):
    """:func:`evaluate`'s result for ``table`` already lowered (``lowered``, by
    :func:`lower_for`) under ``costs`` (checked, run as its execution) and a checked
    ``memory_budget``: for a caller that holds the lowering's link chains across this
    run and its own passes (the adaptive search), so that they are made once."""
    durations = checked_durations(costs, lowered, costs.node_durations(lowered))
    # the binding (for the critical path) is found when the path is first asked for
    start, _ = engine.run(lowered, durations)
    result = build_result(table, costs, lowered, start[0], None, durations,
                          lowered.contention)
    result.notes.extend(table_notes(table))
    if formula:
        from tabsched.formulas import formula_level
        result.formula, note = formula_level(table, costs, lowered)
        result.notes.extend([note] if note else [])
    if lowered.sharding is not None:
        note = gathered_note(lowered)
        result.notes.extend([note] if note else [])
    if memory_budget is not None:
        result.memory_budget = memory_budget
        result.violations = memory_violations(result, memory_budget)
    return result


def _default_grad_sync(table, costs):
    """The execution's gradient syncs if it names them, else the table's own (e.g.
    PyTorch's REDUCE_GRAD), else the execution's default."""
    named = costs.execution.grad_sync
    if named is not None:
        return list(named) if isinstance(named, tuple) else named
    return list(table.grad_sync) if table.grad_sync is not None else costs.grad_sync


def _cost_inputs(costs):
    """What a cost model was built from, for a message: ``ModelCosts transformer=... system=...``."""
    described = dict(costs.describe())
    text = " ".join([str(described.pop("model", type(costs).__name__))]
                    + [f"{key}={value}" for key, value in described.items()])
    return text if len(text) <= 200 else text[:200] + "..."


def checked_durations(costs, lowered, durations):
    """``durations`` of ``lowered``'s nodes, refused unless finite and >= 0, naming the node.

    A cost model built from validated inputs gives finite durations; this is the
    second line of defence, so that no result holds ``inf`` or ``nan``.
    """
    durations = np.asarray(durations, dtype=np.float64)
    # a sum and a minimum first, no temporaries: the sum is finite only if every
    # duration is (or they overflow it: then look closer, as for a negative one)
    with np.errstate(over="ignore", invalid="ignore"):
        total = durations.sum()
    if np.isfinite(total) and (not durations.size or durations.min() >= 0):
        return durations
    bad = np.flatnonzero(~np.isfinite(durations) | (durations < 0))
    if len(bad):
        node = int(bad[0])
        raise InvalidParameterError(
            f"the costs give {lowered.describe_node(node)} a duration of "
            f"{float(durations[node])} {costs.time_unit}; check the cost inputs "
            f"({_cost_inputs(costs)})")
    return durations


def _check_finite(numbers, costs, lowered, durations):
    """Refuse a result whose times overflowed: no result reports ``inf`` or ``nan``."""
    if all(np.isfinite(number) for number in numbers):
        return
    node = int(np.argmax(durations)) if len(durations) else 0
    longest = (f" (the longest, {lowered.describe_node(node)}, takes "
               f"{float(durations[node]):.3g} {costs.time_unit})" if len(durations) else "")
    raise InvalidParameterError(
        f"the simulated makespan is {numbers[0]} {costs.time_unit}: the durations are too "
        f"large to add up{longest}; check the cost inputs ({_cost_inputs(costs)})")


def _device_times(lowered, node_start, durations):
    """``(busy, first, last, has_ops, makespan, bubble_ratio)`` of one sample: what a
    Result's devices and totals are made of (one place, so summaries agree to the bit)."""
    D = lowered.table.num_devices
    # Cells are numbered device by device in row order, and a device runs its row in
    # order: its first cell starts first and its last cell ends last.
    bounds = lowered.nodes(CELL).start + np.searchsorted(lowered.cell_device,
                                                         np.arange(D + 1, dtype=INDEX))
    busy = np.array([durations[bounds[d]:bounds[d + 1]].sum() for d in range(D)])
    has_ops = bounds[1:] > bounds[:-1]
    first = np.array([node_start[bounds[d]] if has_ops[d] else np.inf for d in range(D)])
    last = np.array([node_start[bounds[d + 1] - 1] + durations[bounds[d + 1] - 1]
                     if has_ops[d] else 0.0 for d in range(D)])
    if lowered.count(OPTIMIZER):      # one step per device, in device order
        steps = lowered.nodes(OPTIMIZER)
        step = durations[steps]
        busy = busy + step
        last = np.where(has_ops, node_start[steps] + step, last)
    # Every transfer feeds a cell that starts after it ends, so the last end is a
    # cell's or an extra node's (the tail).
    tail = lowered.extra_nodes
    tail_end = float((node_start[tail] + durations[tail]).max()) if lowered.num_nodes > \
        tail.start else 0.0
    makespan = max(float(last.max()) if D else 0.0, tail_end)
    first = np.where(has_ops, first, makespan)
    last = np.where(has_ops, last, makespan)
    total = float(busy.sum())
    bubble = _idle_share(total, D, makespan)
    return busy, first, last, has_ops, makespan, bubble


def _idle_share(busy, devices, makespan):
    """``1 - busy / (devices x makespan)``; a sum of busy times that rounds a hair past
    the makespan (a device busy all along) is no idle, not -0.0%."""
    if not (makespan > 0 and devices):
        return 0.0
    share = 1.0 - busy / (devices * makespan)
    return 0.0 if -1e-12 < share < 0.0 else share


@np.errstate(over="ignore", invalid="ignore")
def _makespans(lowered, start, durations):
    """``(makespan, bubble_ratio)`` of every sample (row) of ``start`` and ``durations``:
    :func:`_device_times`' totals, the same numbers to the bit, a device at a time
    over all samples rather than a sample at a time."""
    D = lowered.table.num_devices
    bounds = lowered.nodes(CELL).start + np.searchsorted(lowered.cell_device,
                                                         np.arange(D + 1, dtype=INDEX))
    has_ops = bounds[1:] > bounds[:-1]
    samples = len(durations)
    busy = np.empty((samples, D))
    for d in range(D):      # each sample's row slice summed alone, as _device_times does
        busy[:, d] = durations[:, bounds[d]:bounds[d + 1]].sum(axis=1)
    ends = np.maximum(bounds[1:] - 1, 0)
    last = np.where(has_ops, start[:, ends] + durations[:, ends], 0.0)
    if lowered.count(OPTIMIZER):
        steps = lowered.nodes(OPTIMIZER)
        step = durations[:, steps]
        busy = busy + step
        last = np.where(has_ops, start[:, steps] + step, last)
    tail = lowered.extra_nodes
    tail_end = ((start[:, tail] + durations[:, tail]).max(axis=1)
                if lowered.num_nodes > tail.start else np.zeros(samples))
    totals = []
    for row in range(samples):
        makespan = max(float(last[row].max()) if D else 0.0, float(tail_end[row]))
        total = float(busy[row].sum())
        totals.append((makespan, _idle_share(total, D, makespan)))
    return totals


@np.errstate(over="ignore", invalid="ignore")   # an overflow is refused, not warned about
def build_result(table, costs, lowered, node_start, binding, durations, contention):
    """Assemble a Result from one sample of a kernel run (``durations`` of that sample)."""
    D = table.num_devices
    busy, first, last, has_ops, makespan, bubble = _device_times(lowered, node_start,
                                                                 durations)
    _check_finite((makespan, bubble), costs, lowered, durations)
    persistent = np.asarray(costs.persistent_memory(table), dtype=np.float64)
    result = Result(
        table=table, level=costs.level, makespan=makespan, bubble_ratio=bubble, devices=[],
        time_unit=costs.time_unit, memory_unit=costs.memory_unit, costs=costs.describe(),
        contention=contention, _lowered=lowered, _node_start=node_start,
        _node_durations=durations, _binding=binding, _cost_model=costs,
        execution=lowered_execution(costs, lowered), memory_capacity=costs.memory_capacity)
    peaks = activation_peaks(result)
    for d in range(D):
        idle = makespan - float(busy[d])
        warmup = float(first[d]) if has_ops[d] else makespan
        cooldown = makespan - float(last[d]) if has_ops[d] else 0.0
        result.devices.append(DeviceStats(
            device=d, busy=float(busy[d]), idle=idle, warmup=warmup,
            inside=max(0.0, idle - warmup - cooldown), cooldown=cooldown,
            peak_memory=float(peaks[d]),
            persistent_memory=float(persistent[d]) if len(persistent) > d else 0.0))
    return result


def lowered_execution(costs, lowered):
    """The execution ``lowered`` ran: the cost model's, resolved (against no model or
    system, for costs that price none), with the contention and optimizer step the
    lowering was given."""
    run = costs.execution.resolved()
    step = bool(lowered.count(OPTIMIZER))
    if (run.contention, run.optimizer_step) == (lowered.contention, step):
        return run
    return run.replace(contention=lowered.contention, optimizer_step=step)


def _grouped_runs(table, cost_models, contention, grad_sync, optimizer):
    """Each group of cost models that lower ``table`` alike, run as one kernel call.

    Yields ``(lowered, contention mode, start, durations, indices)``: the lowering,
    the starts and durations of every node for each cost model of the group (one
    row each, in the order of ``indices`` into ``cost_models``).
    """
    if not isinstance(table, ScheduleTable):
        raise InvalidParameterError(f"table must be a ScheduleTable, not {type(table).__name__}")
    for costs in cost_models:
        if not isinstance(costs, CostModel):
            raise InvalidParameterError(f"cost_models must hold cost models, not "
                                        f"{type(costs).__name__}")
    groups = {}
    for index, costs in enumerate(cost_models):
        key = _lowering_key(table, costs, contention, grad_sync, optimizer)
        groups.setdefault(key, []).append(index)
    for (mode, per_node, p2p, sync, step, sharding), members in groups.items():
        lowered = lower(table, contention=mode, devices_per_node=per_node,
                        p2p=p2p, grad_sync=sync, optimizer=step, sharding=sharding)
        durations = _stacked_durations(lowered, [cost_models[index] for index in members])
        start, _ = engine.run(lowered, durations)
        yield lowered, mode, start, durations, members


def _stacked_durations(lowered, cost_models):
    """The node durations of each cost model, one row each, checked: the cost models of
    one class give theirs together (:meth:`CostModel.stacked_node_durations`)."""
    by_class = {}
    for row, costs in enumerate(cost_models):
        by_class.setdefault(type(costs), []).append(row)
    if len(by_class) == 1:
        durations = np.asarray(type(cost_models[0]).stacked_node_durations(
            lowered, cost_models), dtype=np.float64)
    else:
        durations = np.empty((len(cost_models), lowered.num_nodes))
        for cls, rows in by_class.items():
            durations[rows] = cls.stacked_node_durations(lowered,
                                                         [cost_models[row] for row in rows])
    # a minimum and a maximum, no temporaries: NaN fails the first comparison
    if durations.size and not (durations.min() >= 0 and np.isfinite(durations.max())):
        for costs, row in zip(cost_models, durations):   # the first bad one, named
            checked_durations(costs, lowered, row)
    return durations


def _lowering_key(table, costs, contention, grad_sync, optimizer):
    """What a cost model changes about the DAG (not only its durations)."""
    sync = _default_grad_sync(table, costs) if grad_sync is None else grad_sync
    if sync is not None and not isinstance(sync, str):
        sync = tuple(sorted(int(stage) for stage in sync))
    return (costs.contention if contention is None else contention, costs.devices_per_node,
            costs.p2p, sync,
            bool(costs.optimizer_step if optimizer is None else optimizer), costs.sharding)


def evaluate_many(table, cost_models, *, execution=None, contention=None, grad_sync=None,
                  optimizer=None, formula=True):
    """Evaluate one table under several cost models, sharing lowerings and kernel calls.

    Cost models that lower the table the same way (same contention, nodes per
    machine, blocking sends and tail) share one lowering and run as the samples of
    one kernel call; the results are the same as ``evaluate`` would give one by one.
    ``execution`` runs every cost model as that execution (see :func:`evaluate`).

    Returns
    -------
    list of Result, in the order of ``cost_models``.

    >>> from tabsched import StageCosts, generate
    >>> table = generate("1f1b", devices=4, microbatches=8)
    >>> [r.makespan for r in evaluate_many(table, [StageCosts(1.0), StageCosts(2.0, comm=1)])]
    [33.0, 82.0]
    """
    cost_models = [run_as(costs, execution) if isinstance(costs, CostModel) else costs
                   for costs in cost_models]
    results = [None] * len(cost_models)
    for lowered, mode, start, durations, rows in _grouped_runs(table, cost_models, contention,
                                                              grad_sync, optimizer):
        # each result finds its binding (the critical path) when it is asked for
        for row, index in enumerate(rows):
            costs = cost_models[index]
            result = build_result(table, costs, lowered, start[row], None, durations[row],
                                  mode)
            result.notes.extend(table_notes(table))
            if formula:
                from tabsched.formulas import formula_level
                result.formula, note = formula_level(table, costs, lowered)
                result.notes.extend([note] if note else [])
            results[index] = result
    return results


def evaluate_summaries(table, cost_models, *, execution=None, contention=None, grad_sync=None,
                       optimizer=None, formula=True, steady=False):
    """:func:`evaluate_many` reduced to what a sweep writes: one :class:`Summary` each.

    The same lowerings and kernel calls, the same numbers to the bit, without the
    Results: no binding for the critical path, no per-device records, no memory
    timelines (the peaks come from one compiled pass). A sweep spends most of its
    time building what it does not write, so ``tabsched sweep`` takes this path.
    ``steady=True`` also gives each its ``steady_period`` (the Result's, from one
    unrolled run per lowering and synchronization: :mod:`tabsched.steady`).

    >>> from tabsched import StageCosts, generate
    >>> table = generate("1f1b", devices=4, microbatches=8)
    >>> [s.makespan for s in evaluate_summaries(table, [StageCosts(1.0), StageCosts(2.0)])]
    [33.0, 66.0]
    """
    cost_models = [run_as(costs, execution) if isinstance(costs, CostModel) else costs
                   for costs in cost_models]
    summaries = [None] * len(cost_models)
    memory = {}     # cost models with one memory key share the table's memory sizes
    for lowered, mode, start, durations, rows in _grouped_runs(table, cost_models, contention,
                                                              grad_sync, optimizer):
        spans = _makespans(lowered, start, durations)
        periods = _steady_periods(lowered, durations, [cost_models[index] for index in rows],
                                  [span[0] for span in spans]) if steady else [None] * len(rows)
        for row, index in enumerate(rows):
            costs = cost_models[index]
            makespan, bubble = spans[row]
            _check_finite((makespan, bubble), costs, lowered, durations[row])
            key = costs.memory_key()
            shared = memory.get(key)
            if shared is None:
                sizes = memory_sizes(table, costs)
                # each device's persistent memory as a float (0 for a device it omits)
                held = sizes[2].tolist()[:table.num_devices]
                shared = memory[key] = sizes, held + [0.0] * (table.num_devices - len(held))
            sizes, persistent = shared
            peaks = device_peaks(table, costs, lowered, start[row], durations[row], sizes)
            if peaks is None:
                result = build_result(table, costs, lowered, start[row], None, durations[row],
                                      mode)
                peaks = [d.peak_memory for d in result.devices]
            totals = [float(peak) + extra for peak, extra in zip(peaks, persistent)]
            summaries[index] = Summary(makespan=makespan, bubble_ratio=bubble,
                                       peak_activation=[float(peak) for peak in peaks],
                                       peak_memory=totals,
                                       memory_capacity=costs.memory_capacity,
                                       steady_period=periods[row],
                                       _cost_model=costs, _table=table)
        if formula:
            from tabsched.formulas import formula_levels
            levels = formula_levels(table, [cost_models[index] for index in rows], lowered,
                                    durations[:, lowered.nodes(TRANSFER)])
            for index, (numbers, _) in zip(rows, levels):
                summaries[index].formula = numbers
    return summaries


def _steady_periods(lowered, durations, cost_models, makespans):
    """The steady period of each row of ``durations`` (one per cost model), the rows of
    one synchronization run together."""
    from tabsched.steady import steady_periods
    periods = [None] * len(cost_models)
    synchronized = [not costs.execution.post_validation for costs in cost_models]
    for flag in (True, False):
        rows = [row for row, synced in enumerate(synchronized) if synced == flag]
        if rows:
            found, _ = steady_periods(lowered, durations[rows], synchronized=flag,
                                      makespans=[makespans[row] for row in rows])
            for row, period in zip(rows, found.tolist()):
                periods[row] = period
    return periods


def table_level(table):
    """The idealized-table level: idle cells / all cells of the layout, and its length.

    Every cell counts as one slot, an overlapped cell included; this is the
    table as drawn, without durations or communication.

    >>> from tabsched.schedules import generate
    >>> table_level(generate("1f1b", devices=4, microbatches=8))
    {'bubble_ratio': 0.2727272727272727, 'slots': 22, 'cells': 64}
    """
    cells = int(table.cell_starts().sum())
    area = table.num_devices * table.num_slots
    return {"bubble_ratio": 1.0 - cells / area if area else 0.0, "slots": table.num_slots,
            "cells": cells}
