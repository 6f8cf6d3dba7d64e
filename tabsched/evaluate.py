"""evaluate(): lower a table, run the kernel, build the Result.

The Result says which level produced it (``"table"`` under ``UnitCosts``,
``"simulation"`` under cost models with real times and communication) and,
where the family has one, carries the formula level's numbers beside it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from tabsched import _build, engine
from tabsched.costs import CostModel, UnitCosts
from tabsched.exceptions import InvalidParameterError, MemoryBudgetError
from tabsched.lower import INDEX, lower
from tabsched.nodes import CELL, OPTIMIZER, TRANSFER
from tabsched.table import BACKWARD, FORWARD, INPUT_GRAD, WEIGHT_GRAD, ScheduleTable

__all__ = ["evaluate", "Result", "DeviceStats", "PathStep", "LinkStats", "MemoryViolation",
           "Summary", "evaluate_summaries"]


@dataclass
class DeviceStats:
    """Time and memory of one device.

    ``idle = warmup + inside + cooldown``: idle before its first operation,
    between its operations, after its last one until the makespan.
    ``peak_memory`` is activations only; ``persistent_memory`` is what the
    device holds all the time (weights, gradients, optimizer state), so the
    device's total peak is their sum.
    """

    device: int
    busy: float
    idle: float
    warmup: float
    inside: float
    cooldown: float
    peak_memory: float
    persistent_memory: float = 0.0

    @property
    def peak_total_memory(self):
        return self.peak_memory + self.persistent_memory


@dataclass
class PathStep:
    """One node of the critical path.

    ``kind`` is ``"op"`` (a cell, on ``device``), ``"transfer"`` (on ``link``),
    ``"sync"`` (a gradient all-reduce) or ``"optimizer"`` (on ``device``).
    """

    label: str
    start: float
    end: float
    device: int | None = None
    link: tuple | None = None
    kind: str = "op"

    @property
    def is_transfer(self):
        return self.kind == "transfer"


@dataclass
class LinkStats:
    """Traffic on one directed link ``src -> dst``."""

    src: int
    dst: int
    transfers: int
    nbytes: float
    busy: float


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
        return self.memory - self.budget


@dataclass
class Result:
    """What an evaluation found; times in ``time_unit``, memory in ``memory_unit``.

    Attributes
    ----------
    level : str
        ``"table"`` (idealized, unit costs) or ``"simulation"``.
    makespan : float
    bubble_ratio : float
        ``1 - total compute / (devices x makespan)``.
    devices : list of DeviceStats
    op_start, op_end : float arrays
        Start and end of every operation, aligned with the table's arrays
        (computed on first access).
    formula : dict or None
        The formula level's numbers for the table's family, marked as such.
    memory_budget : float or None
        Memory per device the evaluation checked against (``memory_unit``).
    violations : list of MemoryViolation
        One per device over ``memory_budget``, in device order.
    notes : list of str
        What the reader of the schedule left out or changed (e.g. the
        ``UNSHARD``/``RESHARD`` cells of a PyTorch file), to show with the result.
    """

    table: ScheduleTable
    level: str
    makespan: float
    bubble_ratio: float
    devices: list
    time_unit: str
    memory_unit: str
    costs: dict
    contention: str
    formula: dict | None = None
    memory_budget: float | None = None
    violations: list = field(default_factory=list)
    _lowered: object = field(default=None, repr=False)
    _node_start: np.ndarray | None = field(default=None, repr=False)
    _node_durations: np.ndarray | None = field(default=None, repr=False)
    _binding: np.ndarray | None = field(default=None, repr=False)
    _cost_model: object = field(default=None, repr=False)
    notes: list = field(default_factory=list)

    # ------------------------------------------------------------ derived views
    @cached_property
    def op_start(self):
        return self._node_start[self._lowered.cell_of_op]

    @cached_property
    def op_end(self):
        cells = self._lowered.cell_of_op
        return self._node_start[cells] + self._node_durations[cells]


    @property
    def total_compute(self):
        return float(sum(device.busy for device in self.devices))

    # ------------------------------------------------------------------ notebooks
    def __repr__(self):
        """One line: the table, the level, makespan, bubble and the fullest device."""
        from tabsched.costs.units import format_quantity
        top = max(self.devices, key=lambda d: d.peak_total_memory, default=None)
        time = (format_quantity(self.makespan, "s") if self.time_unit == "s"
                else f"{self.makespan:g} {self.time_unit}")
        peak = "" if top is None else (
            f", peak memory {format_quantity(top.peak_total_memory, 'B')} on d{top.device}"
            if self.memory_unit == "bytes" else
            f", peak {top.peak_total_memory:g} {self.memory_unit} on d{top.device}")
        return (f"<Result {self.level}: {_label(self.table)}, makespan {time}, "
                f"bubble {self.bubble_ratio:.1%}{peak}>")

    def to_dataframe(self, *, ops=False):
        """A pandas DataFrame: a row per device, or per operation with ``ops=True``
        (see :func:`tabsched.frames.result_frame`; pandas is the ``notebook`` extra)."""
        from tabsched.frames import result_frame
        return result_frame(self, ops=ops)

    def _repr_html_(self):
        from tabsched._html import result_html
        from tabsched.plot import gantt_svg
        return result_html(self, gantt_svg(self))

    @property
    def peak_memory(self):
        """Largest activation peak over the devices."""
        return max((device.peak_memory for device in self.devices), default=0.0)

    def critical_nodes(self):
        """Node ids of the critical path in time order (see ``critical_path``)."""
        lowered = self._lowered
        if lowered.num_nodes == 0:
            return []
        if self._binding is None:  # found on first use: rerun this sample with it
            self._binding = engine.run(lowered, self._node_durations, binding=True)[1]
        node = int(np.argmax(self._node_start + self._node_durations))
        nodes = []
        while node >= 0:
            nodes.append(node)
            node = int(self._binding[node])
        return nodes[::-1]

    @property
    def critical_path(self):
        """Operations and transfers, in time order, that decided the makespan.

        Walks back from the node that ends last: each node's start was set by the
        predecessor that ended last (or by the previous user of a link it waited for).
        """
        lowered = self._lowered
        steps = []
        for node in self.critical_nodes():
            start = float(self._node_start[node])
            end = start + float(self._node_durations[node])
            kind = lowered.kind_of(node)
            label = lowered.describe_node(node)
            if kind == CELL:
                steps.append(PathStep(label, start, end, device=lowered.describe_cell(node)[1]))
            elif kind == TRANSFER:
                k = node - lowered.nodes(TRANSFER).start
                link = (int(lowered.transfers.src[k]), int(lowered.transfers.dst[k]))
                steps.append(PathStep(label, start, end, link=link, kind="transfer"))
            elif kind.on_device:
                steps.append(PathStep(label, start, end, kind=kind.label,
                                      device=int(lowered.node_device[node])))
            else:
                steps.append(PathStep(label, start, end, kind=kind.label))
        return steps

    @property
    def links(self):
        """Per directed link with traffic: transfers, bytes and busy time."""
        transfers = self._lowered.transfers
        if len(transfers) == 0:
            return []
        D = self.table.num_devices
        link = transfers.src.astype(np.int64) * D + transfers.dst
        durations = self._node_durations[self._lowered.nodes(TRANSFER)]
        counts = np.bincount(link, minlength=D * D)
        _, transfer_bytes = self._cost_model.transfer_costs(self.table, transfers)
        nbytes = np.bincount(link, weights=transfer_bytes, minlength=D * D)
        busy = np.bincount(link, weights=durations, minlength=D * D)
        return [LinkStats(int(k // D), int(k % D), int(counts[k]), float(nbytes[k]),
                          float(busy[k])) for k in np.flatnonzero(counts)]

    def memory_timeline(self, device=None, *, working=True):
        """Activation memory over time.

        Returns ``(times, values)`` for one device: the memory held right after
        each change; or, with ``device=None``, a list of such pairs per device.
        An activation is held from the start of its ``F`` to the end of its ``B``
        (with a split backward, ``I`` frees the released part and ``W`` the rest);
        an operation's working memory (the cost model's ``transient_sizes``)
        only from its start to its end, unless ``working=False``. At equal times
        frees come before allocations.
        """
        activation = np.asarray(self._cost_model.activation_sizes(self.table), np.float64)
        transient = (np.asarray(self._cost_model.transient_sizes(self.table), np.float64)
                     if working else None)
        if device is None:
            return [self._device_timeline(d, activation, transient)
                    for d in range(self.table.num_devices)]
        return self._device_timeline(device, activation, transient)

    def _device_timeline(self, device, activation, transient=None):
        table = self.table
        lo, hi = np.searchsorted(table.device, np.array([device, device + 1], dtype=INDEX))
        cells = self._lowered.cell_of_op[lo:hi]
        start = self._node_start[cells]
        times, deltas = memory_events(table.kind[lo:hi], activation[lo:hi],
                                      None if transient is None else transient[lo:hi],
                                      self._cost_model.input_grad_release, start,
                                      start + self._node_durations[cells])
        keep = deltas != 0
        times, deltas = times[keep], deltas[keep]
        order = np.lexsort((deltas, times))
        return times[order], np.cumsum(deltas[order])

    def check_memory(self):
        """Raise ``MemoryBudgetError`` (one line) if a device went over the budget."""
        if not self.violations:
            return self
        from tabsched.costs.units import format_quantity

        def amount(value):
            if self.memory_unit == "bytes":
                return format_quantity(value, "B")
            return f"{value:.6g} {self.memory_unit}"

        def moment(value):
            return (format_quantity(value, "s") if self.time_unit == "s"
                    else f"{value:.6g} {self.time_unit}")
        shown = [f"d{v.device} by {amount(v.over)} at {moment(v.time)}"
                 for v in self.violations[:4]]
        more = len(self.violations) - len(shown)
        raise MemoryBudgetError(
            f"memory budget {amount(self.memory_budget)} exceeded on {len(self.violations)} of "
            f"{self.table.num_devices} devices: {', '.join(shown)}"
            + (f" and {more} more" if more else ""))

    def to_dict(self, *, ops=False):
        """Plain data for JSON (times in ``time_unit``, memory in ``memory_unit``)."""
        data = {
            "level": self.level,
            "family": self.table.family,
            "params": self.table.params,
            "num_devices": self.table.num_devices,
            "num_stages": self.table.num_stages,
            "num_microbatches": self.table.num_microbatches,
            "slots": self.table.num_slots,
            "makespan": self.makespan,
            "bubble_ratio": self.bubble_ratio,
            "time_unit": self.time_unit,
            "memory_unit": self.memory_unit,
            "costs": self.costs,
            "contention": self.contention,
            "peak_memory": self.peak_memory,
            "devices": [
                {"device": d.device, "busy": d.busy, "idle": d.idle, "warmup": d.warmup,
                 "inside": d.inside, "cooldown": d.cooldown, "peak_memory": d.peak_memory,
                 "persistent_memory": d.persistent_memory}
                for d in self.devices],
            "critical_path": [
                {"label": s.label, "start": s.start, "end": s.end, "device": s.device,
                 "link": list(s.link) if s.link else None} for s in self.critical_path],
            "links": [vars(link) for link in self.links],
            "formula": self.formula,
            "memory_budget": self.memory_budget,
            "violations": [{"device": v.device, "since": v.since, "time": v.time,
                            "memory": v.memory, "over": v.over} for v in self.violations],
            "notes": list(self.notes),
        }
        if ops:
            table = self.table
            data["ops"] = [{"op": str(table.op(k)), "device": int(table.device[k]),
                            "start": float(self.op_start[k]), "end": float(self.op_end[k])}
                           for k in range(len(table))]
        return data


def _label(table):
    """``1f1b devices=8 microbatches=32``, or the table's shape when it names no family."""
    if table.family:
        return " ".join([table.family] + [f"{key}={value}" for key, value in table.params.items()
                                          if key != "transforms"])
    return f"{table.num_devices} devices, {table.num_microbatches} microbatches"


def checked_costs(table, costs):
    """``costs`` (default ``UnitCosts()``) after the checks every evaluation of ``table`` makes."""
    if not isinstance(table, ScheduleTable):
        raise InvalidParameterError(f"table must be a ScheduleTable, not {type(table).__name__}")
    costs = UnitCosts() if costs is None else costs
    if not isinstance(costs, CostModel):
        raise InvalidParameterError(f"costs must be a cost model, not {type(costs).__name__}")
    return costs


def lower_for(table, costs, *, contention=None, grad_sync=None, optimizer=None,
              transfer_after=None):
    """``table`` lowered the way ``costs`` runs it, unless an argument says otherwise.

    The cost model gives the contention mode, devices per node, blocking sends and
    the optimizer step; the gradient sync is the table's own (PyTorch's
    REDUCE_GRAD) if it has one, else the cost model's.
    """
    return lower(table, contention=costs.contention if contention is None else contention,
                 devices_per_node=costs.devices_per_node, blocking_sends=costs.blocking_sends,
                 grad_sync=_default_grad_sync(table, costs) if grad_sync is None else grad_sync,
                 optimizer=costs.optimizer_step if optimizer is None else optimizer,
                 transfer_after=transfer_after)


def evaluate(table: ScheduleTable, costs: CostModel | None = None, *,
             contention: str | None = None, grad_sync: object = None,
             optimizer: bool | None = None, formula: bool = True,
             memory_budget: float | str | None = None,
             transfer_after: tuple | None = None) -> Result:
    """Evaluate ``table`` under ``costs`` (default ``UnitCosts()``).

    Parameters
    ----------
    table : ScheduleTable
    costs : CostModel, optional
    contention : {"none", "link", "nic"}, optional
        Overrides the cost model's own mode.
    grad_sync, optimizer : optional
        The iteration's tail (see :func:`tabsched.lower.lower`); default the
        table's ``grad_sync`` if it has one, else the cost model's ``grad_sync``,
        and the cost model's ``optimizer_step``.
    formula : bool
        Attach the formula level's numbers for the table's family.
    memory_budget : float or str, optional
        Memory per device, in the cost model's ``memory_unit`` (``"80GB"`` for
        bytes): every device whose persistent plus activation memory goes over
        it is reported in ``result.violations`` (``result.check_memory()``
        raises for them).
    transfer_after : optional
        Extra edges into transfer nodes (see :func:`tabsched.lower.lower`).

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
    ('table', 22.0, 0.2727)
    >>> [d.peak_memory for d in result.devices]
    [4.0, 3.0, 2.0, 1.0]
    """
    costs = checked_costs(table, costs)
    if memory_budget is not None:
        memory_budget = _budget(memory_budget, costs.memory_unit)
    lowered = lower_for(table, costs, contention=contention, grad_sync=grad_sync,
                        optimizer=optimizer, transfer_after=transfer_after)
    durations = checked_durations(costs, lowered, costs.node_durations(lowered))
    # the binding (for the critical path) is found when the path is first asked for
    start, _ = engine.run(lowered, durations)
    result = build_result(table, costs, lowered, start[0], None, durations,
                          lowered.contention)
    if formula:
        from tabsched.formulas import formula_level
        result.formula, note = formula_level(table, costs, lowered)
        result.notes.extend([note] if note else [])
    if memory_budget is not None:
        result.memory_budget = memory_budget
        result.violations = memory_violations(result, memory_budget)
    return result


def _budget(value, memory_unit):
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


def _default_grad_sync(table, costs):
    """The table's own gradient syncs (e.g. PyTorch's REDUCE_GRAD), else the cost model's."""
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
    bubble = 1.0 - total / (D * makespan) if makespan > 0 and D else 0.0
    return busy, first, last, has_ops, makespan, bubble


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
        totals.append((makespan, 1.0 - total / (D * makespan) if makespan > 0 and D
                       else 0.0))
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
        _node_durations=durations, _binding=binding, _cost_model=costs)
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
    peaks = _peaks(result.table, result._cost_model, result._lowered, result._node_start,
                   result._node_durations)
    if peaks is not None:
        return peaks
    return [max(0.0, float(values.max())) if len(values) else 0.0
            for _, values in result.memory_timeline()]


def _peaks(table, costs, lowered, node_start, durations, sizes=None):
    """Activation peaks per device by ``_build.activation_peaks``, or None if it cannot
    order the events (then the timelines decide). ``sizes``: ``_memory_sizes(table,
    costs)`` if at hand."""
    activation, transient, _ = _memory_sizes(table, costs) if sizes is None else sizes
    peaks = np.zeros(table.num_devices)
    status = _build.activation_peaks(table.device, table.kind, lowered.cell_of_op,
                                     np.ascontiguousarray(node_start),
                                     np.ascontiguousarray(durations), activation, transient,
                                     float(costs.input_grad_release), peaks)
    return peaks.tolist() if status == _build.OK else None


def _memory_sizes(table, costs):
    """``(activation, transient, persistent)``: the arrays the memory of ``table`` under
    ``costs`` is made of (the first two per operation, contiguous; the last per device)."""
    return (np.ascontiguousarray(costs.activation_sizes(table), dtype=np.float64),
            np.ascontiguousarray(costs.transient_sizes(table), dtype=np.float64),
            np.asarray(costs.persistent_memory(table), dtype=np.float64))


@dataclass
class Summary:
    """What a sweep row needs of an evaluation: :func:`evaluate_summaries` returns one
    per cost model, with the numbers the full :class:`Result` would hold, to the bit.

    ``peak_activation`` and ``peak_memory`` (persistent + activations) are per device.
    """

    makespan: float
    bubble_ratio: float
    peak_activation: list
    peak_memory: list
    formula: dict | None = None


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
    for (mode, per_node, blocking, sync, step), members in groups.items():
        lowered = lower(table, contention=mode, devices_per_node=per_node,
                        blocking_sends=blocking, grad_sync=sync, optimizer=step)
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
            bool(costs.blocking_sends), sync,
            bool(costs.optimizer_step if optimizer is None else optimizer))


def evaluate_many(table, cost_models, *, contention=None, grad_sync=None, optimizer=None,
                  formula=True):
    """Evaluate one table under several cost models, sharing lowerings and kernel calls.

    Cost models that lower the table the same way (same contention, nodes per
    machine, blocking sends and tail) share one lowering and run as the samples of
    one kernel call; the results are the same as ``evaluate`` would give one by one.

    Returns
    -------
    list of Result, in the order of ``cost_models``.

    >>> from tabsched import StageCosts, generate
    >>> table = generate("1f1b", devices=4, microbatches=8)
    >>> [r.makespan for r in evaluate_many(table, [StageCosts(1.0), StageCosts(2.0, comm=1)])]
    [33.0, 82.0]
    """
    cost_models = list(cost_models)
    results = [None] * len(cost_models)
    for lowered, mode, start, durations, rows in _grouped_runs(table, cost_models, contention,
                                                              grad_sync, optimizer):
        # each result finds its binding (the critical path) when it is asked for
        for row, index in enumerate(rows):
            costs = cost_models[index]
            result = build_result(table, costs, lowered, start[row], None, durations[row],
                                  mode)
            if formula:
                from tabsched.formulas import formula_level
                result.formula, note = formula_level(table, costs, lowered)
                result.notes.extend([note] if note else [])
            results[index] = result
    return results


def evaluate_summaries(table, cost_models, *, contention=None, grad_sync=None, optimizer=None,
                       formula=True):
    """:func:`evaluate_many` reduced to what a sweep writes: one :class:`Summary` each.

    The same lowerings and kernel calls, the same numbers to the bit, without the
    Results: no binding for the critical path, no per-device records, no memory
    timelines (the peaks come from one compiled pass). A sweep spends most of its
    time building what it does not write, so ``tabsched sweep`` takes this path.

    >>> from tabsched import StageCosts, generate
    >>> table = generate("1f1b", devices=4, microbatches=8)
    >>> [s.makespan for s in evaluate_summaries(table, [StageCosts(1.0), StageCosts(2.0)])]
    [33.0, 66.0]
    """
    cost_models = list(cost_models)
    summaries = [None] * len(cost_models)
    memory = {}     # cost models with one memory key share the table's memory sizes
    for lowered, mode, start, durations, rows in _grouped_runs(table, cost_models, contention,
                                                              grad_sync, optimizer):
        spans = _makespans(lowered, start, durations)
        for row, index in enumerate(rows):
            costs = cost_models[index]
            makespan, bubble = spans[row]
            _check_finite((makespan, bubble), costs, lowered, durations[row])
            key = costs.memory_key()
            sizes = memory.get(key)
            if sizes is None:
                sizes = memory[key] = _memory_sizes(table, costs)
            peaks = _peaks(table, costs, lowered, start[row], durations[row], sizes)
            if peaks is None:
                result = build_result(table, costs, lowered, start[row], None, durations[row],
                                      mode)
                peaks = [d.peak_memory for d in result.devices]
            persistent = sizes[2]
            totals = [float(peak) + (float(persistent[d]) if len(persistent) > d else 0.0)
                      for d, peak in enumerate(peaks)]
            summaries[index] = Summary(makespan=makespan, bubble_ratio=bubble,
                                       peak_activation=[float(peak) for peak in peaks],
                                       peak_memory=totals)
        if formula:
            from tabsched.formulas import formula_levels
            levels = formula_levels(table, [cost_models[index] for index in rows], lowered,
                                    durations[:, lowered.nodes(TRANSFER)])
            for index, (numbers, _) in zip(rows, levels):
                summaries[index].formula = numbers
    return summaries


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
