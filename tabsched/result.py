"""What an evaluation found: :class:`Result` and its parts, and :class:`Summary`.

A :class:`Result` holds one sample of a run of a lowered table (the start and
duration of every node) and derives the rest when asked: per device busy and idle
time and activation peak (:class:`DeviceStats`), the critical path
(:class:`PathStep`: the binding is found by rerunning the sample with it the
first time), the load of every link (:class:`LinkStats`), the memory timelines
(:mod:`tabsched.memory`), the devices over a memory budget and over the
device's own memory (:class:`MemoryViolation`, defined with the memory
accounting; ``fits``), and under model costs the iteration's throughput
(:class:`~tabsched.throughput.Throughput`: tokens/s, FLOP/s per GPU, MFU). It
says which level produced it (``"table"`` under ``UnitCosts``, ``"simulation"``
under cost models with real times and communication) and, where the family has
one, carries the formula level's numbers beside it. ``steady_period`` is the
period of iterations run back to back (:mod:`tabsched.steady`), computed when first
asked for. A :class:`Summary` is what a sweep row keeps of one.

**Memory over the device's capacity is never silent.** A cost model that knows
its device (``ModelCosts`` on a system that states ``memory_capacity``) gives
the result its ``memory_capacity``; ``capacity_violations`` lists every device
whose persistent plus activation memory goes over it, whether or not a budget
was asked for. ``fits`` is what rules: no device over the budget when one was
given (a budget may be smaller or larger than the device), else none over the
device's memory, else True (nothing to check against).

:func:`tabsched.evaluate` builds them; ``from tabsched.evaluate import Result``
works too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from tabsched import engine
from tabsched.exceptions import MemoryBudgetError
from tabsched.execution import Execution
from tabsched.memory import MemoryViolation, memory_events, memory_violations
from tabsched.sharding import shard_memory_events
from tabsched.nodes import CELL, KINDS, TRANSFER
from tabsched.table import ScheduleTable

__all__ = ["Result", "DeviceStats", "PathStep", "LinkStats", "MemoryViolation", "Summary"]

INDEX = np.int32


@dataclass
class DeviceStats:
    """Time and memory of one device.

    ``idle = warmup + inside + cooldown``: idle before its first operation,
    between its operations, after its last one until the makespan.
    ``peak_memory`` is activations only (with ZeRO-2/3, also the gathered
    parameters and unsharded gradients while held); ``persistent_memory`` is what
    the device holds all the time (weights, gradients, optimizer state, as sharded),
    so the device's total peak is their sum.
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
        """The activation peak plus the memory held for the whole iteration (bytes)."""
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
        """Whether this step of the critical path is a transfer rather than an operation."""
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
    memory_capacity : float or None
        Memory of one device (``memory_unit``): the system's ``memory_capacity``
        under model costs, None where the costs know no device.
    capacity_violations : list of MemoryViolation
        One per device over ``memory_capacity``, in device order (computed on first
        access; empty without a capacity).
    fits : bool
        No device over the budget if one was given, else over the capacity.
    throughput : Throughput or None
        Tokens/s, model and hardware FLOP/s per GPU, MFU and HFU of the iteration
        (:func:`tabsched.throughput.throughput`; computed on first access), None
        under costs that do no FLOPs (slot lengths). Per the makespan (one
        iteration alone), not per the steady period.
    steady_period : float
        The steady-state iteration period: when iterations run back to back, the time
        from one iteration's end to the next (computed on first access, by
        :func:`tabsched.steady.steady_periods`). Each device starts the next iteration
        after its own optimizer step; every step waits for the global gradient norm
        unless the execution has ``post_validation``. At most the makespan where the
        steps are equal (then equal to it with the synchronization), at least each
        device's work per iteration under contention ``none`` or ``link``.
    steady_period_bounds : (float, float)
        The least and greatest advance of the last iteration unrolled, which bound
        the period (equal where the period is exact).
    notes : list of str
        What the reader of the schedule left out or changed (e.g. the
        ``UNSHARD``/``RESHARD`` cells of a PyTorch file), to show with the result.
    execution : Execution
        How the table ran (echoed by ``to_dict``: every ``--json``).
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
    #: How the table ran: the cost model's execution, every field resolved, with the
    #: contention, blocking sends and optimizer step it was lowered with.
    execution: Execution | None = None
    #: Memory of one device in ``memory_unit`` (None: the costs know no device).
    memory_capacity: float | None = None

    def __post_init__(self):
        # A run of a direct lowering (free transfers, no transfer node: LoweredSchedule.
        # direct) is kept as the cells' run; _lowered, _node_start and _node_durations
        # (with the transfer nodes) are made when first read (__getattr__), so that
        # everything said about transfers and node ids is the lowering's with them.
        lowered = self._lowered
        if lowered is not None and getattr(lowered, "direct", False):
            self.__dict__["_cells"] = (lowered, self._node_start, self._node_durations)
            for name in _WITH_TRANSFERS:
                del self.__dict__[name]
            self._binding = None    # a binding is of the lowering with transfers

    def __getattr__(self, name):
        # only for attributes not found: those of the run with transfers, before made
        if name in _WITH_TRANSFERS and "_cells" in self.__dict__:
            self._with_transfers()
            return self.__dict__[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _with_transfers(self):
        """The run over the lowering with a node per transfer, from the direct one's: the
        same cells and starts, each transfer starting as its producer ends and lasting
        0 (the costs' durations of that lowering)."""
        lowered, start, durations = self.__dict__["_cells"]
        full = lowered.with_transfers()
        full_durations = np.asarray(self._cost_model.node_durations(full), dtype=np.float64)
        self.__dict__.update(_lowered=full, _node_durations=full_durations,
                             _node_start=lowered.transfer_starts(start, durations, full))
        del self.__dict__["_cells"]

    def _cell_run(self):
        """``(lowering, node_start, node_durations)`` good for the cells (their ids are
        the same with or without transfer nodes): the direct run's while the one with
        transfers is not made."""
        kept = self.__dict__.get("_cells")
        return kept if kept is not None else (self._lowered, self._node_start,
                                              self._node_durations)

    # ------------------------------------------------------------ derived views
    @cached_property
    def op_start(self):
        lowered, start, _ = self._cell_run()
        return start[lowered.cell_of_op]

    @cached_property
    def op_end(self):
        lowered, start, durations = self._cell_run()
        cells = lowered.cell_of_op
        return start[cells] + durations[cells]


    @cached_property
    def _steady(self):
        from tabsched.steady import steady_periods
        synchronized = not (self.execution is not None and self.execution.post_validation)
        periods, bounds = steady_periods(self._lowered, self._node_durations,
                                         synchronized=synchronized, makespans=[self.makespan])
        return float(periods[0]), (float(bounds[0, 0]), float(bounds[0, 1]))

    @property
    def steady_period(self):
        """The steady-state iteration period (see the class docstring)."""
        return self._steady[0]

    @property
    def steady_period_bounds(self):
        """The bounds on :attr:`steady_period` the unrolled iterations give."""
        return self._steady[1]

    @cached_property
    def capacity_violations(self):
        """The devices over the device's memory (see the module docstring)."""
        if self.memory_capacity is None:
            return []
        return memory_violations(self, self.memory_capacity)

    @property
    def memory_limit(self):
        """The memory per device that rules: the budget if one was given, else the
        device's capacity, else None."""
        return self.memory_budget if self.memory_budget is not None else self.memory_capacity

    @property
    def fits(self):
        """No device over :attr:`memory_limit` (True when there is none to check)."""
        limit = self.memory_limit
        return limit is None or all(d.peak_total_memory <= limit for d in self.devices)

    @cached_property
    def throughput(self):
        """The iteration's :class:`~tabsched.throughput.Throughput`, or None under costs
        that do no FLOPs."""
        from tabsched.throughput import counts_flops, throughput
        if not counts_flops(self._cost_model):
            return None
        return throughput(self._cost_model, self.table, self.makespan)

    @property
    def total_compute(self):
        """The sum over devices of their busy time (compute only, no idle time)."""
        return float(sum(device.busy for device in self.devices))

    # ------------------------------------------------------------------ notebooks
    def __repr__(self):
        """One line: the table, the level, makespan, bubble and the fullest device."""
        from tabsched.costs.units import format_number, format_quantity
        top = max(self.devices, key=lambda d: d.peak_total_memory, default=None)
        time = (format_quantity(self.makespan, "s") if self.time_unit == "s"
                else f"{format_number(self.makespan)} {self.time_unit}")
        peak = "" if top is None else (
            f", peak memory {format_quantity(top.peak_total_memory, 'B')} on d{top.device}"
            if self.memory_unit == "bytes" else
            f", peak {format_number(top.peak_total_memory)} {self.memory_unit} on "
            f"d{top.device}")
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

    def critical_counts(self):
        """How many nodes of each kind the critical path holds, by the label its steps
        carry (``{"op": 12, "transfer": 11, "optimizer": 1}``), without building the
        steps: what a summary line needs of a path of millions of operations."""
        nodes = np.asarray(self.critical_nodes(), dtype=np.int64)
        kinds = np.searchsorted(self._lowered.kind_bounds, nodes, side="right") - 1
        counts = np.bincount(kinds, minlength=len(KINDS))
        return {("op" if KINDS[k] == CELL else KINDS[k].label): int(count)
                for k, count in enumerate(counts.tolist()) if count}

    @property
    def critical_path(self):
        """Operations and transfers, in time order, that decided the makespan.

        Walks back from the node that ends last: each node's start was set by the
        predecessor that ended last (or by the previous user of a link it waited for).
        Linear in the path's length: the kinds, times and operations of its nodes are
        looked up at once, and a cell's text from its neighbours in the table's arrays.
        """
        lowered, table = self._lowered, self.table
        nodes = np.asarray(self.critical_nodes(), dtype=np.int64)
        if len(nodes) == 0:
            return []
        starts = self._node_start[nodes].tolist()
        ends = (self._node_start[nodes] + self._node_durations[nodes]).tolist()
        kinds = (np.searchsorted(lowered.kind_bounds, nodes, side="right") - 1).tolist()
        cells, transfer_ids = lowered.nodes(CELL), lowered.nodes(TRANSFER)
        # each cell node's first operation (cell_of_op is sorted), each transfer's ends
        ops = np.searchsorted(lowered.cell_of_op, nodes.astype(lowered.cell_of_op.dtype))
        in_transfers = (nodes >= transfer_ids.start) & (nodes < transfer_ids.stop)
        k = np.where(in_transfers, nodes - transfer_ids.start, 0)
        transfers = lowered.transfers
        src = table.device[transfers.producer[k]] if len(transfers) else np.zeros_like(k)
        dst = table.device[transfers.consumer[k]] if len(transfers) else np.zeros_like(k)
        ops, src, dst = ops.tolist(), src.tolist(), dst.tolist()
        device_of = table.device.tolist()
        steps = []
        for i, node in enumerate(nodes.tolist()):
            kind = KINDS[kinds[i]]
            if cells.start <= node < cells.stop:
                steps.append(PathStep(table.cell_text(ops[i]), starts[i], ends[i],
                                      device=device_of[ops[i]]))
            elif kind == TRANSFER:
                producer = int(transfers.producer[node - transfer_ids.start])
                label = f"{table.op(producer)} d{src[i]}->d{dst[i]}"
                steps.append(PathStep(label, starts[i], ends[i], link=(src[i], dst[i]),
                                      kind="transfer"))
            elif kind.on_device:
                steps.append(PathStep(lowered.describe_node(node), starts[i], ends[i],
                                      kind=kind.label, device=int(lowered.node_device[node])))
            else:
                steps.append(PathStep(lowered.describe_node(node), starts[i], ends[i],
                                      kind=kind.label))
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
        only from its start to its end, unless ``working=False``; with ZeRO-2/3,
        a stage's gathered parameters and full gradients while held
        (:func:`tabsched.sharding.shard_memory_events`). At equal times
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
        lowered, node_start, node_durations = self._cell_run()
        cells = lowered.cell_of_op[lo:hi]
        start = node_start[cells]
        times, deltas = memory_events(table.kind[lo:hi], activation[lo:hi],
                                      None if transient is None else transient[lo:hi],
                                      self._cost_model.input_grad_release, start,
                                      start + node_durations[cells])
        keep = deltas != 0
        times, deltas = times[keep], deltas[keep]
        if lowered.sharding is not None:     # ZeRO-2/3: gathered stages, gradients
            gathered, gradients = self._cost_model.shard_sizes(table)
            more = shard_memory_events(self._lowered, device, self._node_start,
                                       self._node_durations, gathered, gradients)
            times, deltas = np.concatenate([times, more[0]]), np.concatenate([deltas, more[1]])
        order = np.lexsort((deltas, times))
        return times[order], np.cumsum(deltas[order])

    def check_memory(self):
        """Raise ``MemoryBudgetError`` (one line) if a device went over the budget."""
        if not self.violations:
            return self
        from tabsched.costs.units import format_number, format_quantity

        def amount(value):
            if self.memory_unit == "bytes":
                return format_quantity(value, "B")
            return f"{format_number(value)} {self.memory_unit}"

        def moment(value):
            return (format_quantity(value, "s") if self.time_unit == "s"
                    else f"{format_number(value)} {self.time_unit}")
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
            "steady_period": self.steady_period,
            "bubble_ratio": self.bubble_ratio,
            "time_unit": self.time_unit,
            "memory_unit": self.memory_unit,
            # what ran: the model and system by name (slot lengths: the cost model's
            # class, no system), then every setting of the costs
            "model": _named(self.costs, "transformer"),
            "system": _named(self.costs, "system"),
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
            "violations": [_violation(v) for v in self.violations],
            "notes": list(self.notes),
        }
        if self.memory_capacity is not None:
            data["memory_capacity"] = self.memory_capacity
            data["capacity_violations"] = [_violation(v) for v in self.capacity_violations]
            data["fits"] = self.fits
        if self.throughput is not None:
            data["throughput"] = self.throughput.to_dict()
        if self.execution is not None:
            data["execution"] = self.execution.to_dict()
        if ops:
            table = self.table
            data["ops"] = [{"op": str(table.op(k)), "device": int(table.device[k]),
                            "start": float(self.op_start[k]), "end": float(self.op_end[k])}
                           for k in range(len(table))]
        return data


#: The fields of a Result's run that a direct lowering's makes when first read.
_WITH_TRANSFERS = ("_lowered", "_node_start", "_node_durations")
# no class-level default (dataclass leaves None there): a Result holding a direct run
# has no such attribute until made, so reading one reaches __getattr__
for _name in _WITH_TRANSFERS:
    delattr(Result, _name)
del _name


def _named(costs, key):
    """The model (``transformer``) or ``system`` a costs description names; a model
    without a transformer is named by its class (``UnitCosts``), a system-less one None."""
    if not isinstance(costs, dict):
        return None
    if key == "transformer":
        return costs.get("transformer") or costs.get("model")
    return costs.get(key)


def _violation(violation):
    """A :class:`MemoryViolation` as JSON holds it."""
    return {"device": violation.device, "since": violation.since, "time": violation.time,
            "memory": violation.memory, "over": violation.over}


def _label(table):
    """``1f1b devices=8 microbatches=32``, or the table's shape when it names no family."""
    if table.family:
        return " ".join([table.family] + [f"{key}={value}" for key, value in table.params.items()
                                          if key != "transforms"])
    return f"{table.num_devices} devices, {table.num_microbatches} microbatches"


@dataclass
class Summary:
    """What a sweep row needs of an evaluation: :func:`evaluate_summaries` returns one
    per cost model, with the numbers the full :class:`Result` would hold, to the bit.

    ``peak_activation`` and ``peak_memory`` (persistent + activations) are per device;
    ``memory_capacity`` is the device's memory (None where the costs know none), and
    ``fits`` and ``over_capacity`` say how the fullest device stands against it.
    ``throughput`` is computed when first asked for, as the Result's.
    ``steady_period`` is the Result's (None where the summary was made without it:
    ``evaluate_summaries(..., steady=False)``).
    """

    makespan: float
    bubble_ratio: float
    peak_activation: list
    peak_memory: list
    formula: dict | None = None
    memory_capacity: float | None = None
    steady_period: float | None = None
    _cost_model: object = field(default=None, repr=False, compare=False)
    _table: object = field(default=None, repr=False, compare=False)

    @property
    def fits(self):
        """No device over ``memory_capacity`` (True without one)."""
        return self.memory_capacity is None or max(self.peak_memory, default=0.0) <= \
            self.memory_capacity

    @property
    def over_capacity(self):
        """How far the fullest device goes over ``memory_capacity`` (0 when every device
        fits; None without a capacity)."""
        if self.memory_capacity is None:
            return None
        return max(0.0, max(self.peak_memory, default=0.0) - self.memory_capacity)

    @cached_property
    def throughput(self):
        """The iteration's :class:`~tabsched.throughput.Throughput`, or None under costs
        that do no FLOPs (or a summary built without its costs)."""
        from tabsched.throughput import counts_flops, throughput
        if self._table is None or not counts_flops(self._cost_model):
            return None
        return throughput(self._cost_model, self._table, self.makespan)
