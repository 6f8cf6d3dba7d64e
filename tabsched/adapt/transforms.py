"""Granularity transforms: new valid tables that cut the same work differently.

Every transform takes a valid table (any family, any placement) and returns a
new valid table; the cost model prices it from the table's own metadata, so
costs stay consistent: a microbatch split in two is two microbatches of half
the samples, whose durations come from the roofline at that size (launch
latency, weights read once per operation, the efficiency curve: smaller is not
proportionally faster) and whose transfers carry half the bytes at the full
latency. A transform whose new row orders contradict the dependencies raises
:class:`~tabsched.DeadlockError` (the table is never returned).

Each transform also states its **memory effect**: per device, bounds on how
much its activation peak may change (:class:`MemoryEffect`). The bounds follow
from the row orders alone, because a device's memory rises and falls in the
order of its own row; the search checks every candidate's evaluated peaks
against them and drops a candidate that breaks its statement.

Transforms
    :class:`SplitMicrobatches`
        Microbatch ``m`` becomes ``k`` microbatches of ``1/k`` the size, whose
        operations run back to back where ``m``'s ran. Peak: never higher; the
        pipeline fills and drains in finer steps.
    :class:`MergeMicrobatches`
        Groups of consecutive microbatches become one, run from the group's
        first forward to its last backward. Peak: never lower, up to the merged
        activations higher.
    :class:`SplitBackward`
        ``B`` becomes ``I`` + ``W``; the gradient goes upstream as soon as
        ``I`` ends and every ``W`` of the device waits for an idle slot (list
        scheduling at the cost model's durations), at most ``max_deferred`` of
        them past the device's next other operation. Peak: up to the deferred
        ``W``'s held activations higher.
    :class:`Warmup`
        Every forward of the chosen devices moves ``delta`` backward operations
        earlier (deeper warm-up: slack that absorbs late inputs) or later.
        Peak: up to ``delta`` forward activations higher (or lower).
    :class:`SplitPhases`
        :class:`SplitMicrobatches` on the first microbatches to enter the
        pipeline and the last to leave it only: fine grain where it fills and
        drains, coarse grain in the steady state.

>>> from tabsched.schedules import generate
>>> table = generate("1f1b", devices=2, microbatches=2)
>>> [str(op) for op in Warmup([1], 1).apply(table).orders()[1]]
['1F0', '1F1', '1B0', '1B1']
>>> SplitMicrobatches([0], 2).apply(table).microbatch_sizes
(0.5, 0.5, 1.0)
"""

import contextlib
import contextvars
from dataclasses import dataclass

import numpy as np

from tabsched import _build as _compiled
from tabsched.compose import cell_durations
from tabsched.costs import UnitCosts
from tabsched.exceptions import InvalidParameterError, TabschedError
from tabsched.layout import lay_out, order_table
from tabsched.lower import Transfers
from tabsched.table import BACKWARD, FORWARD, INPUT_GRAD, WEIGHT_GRAD

__all__ = ["Transform", "MemoryEffect", "SplitMicrobatches", "MergeMicrobatches",
           "SplitBackward", "Warmup", "SplitPhases", "describe_microbatches",
           "deferred_weight_grads", "warmup_depths"]


# ------------------------------------------------------------------ helpers
def describe_microbatches(microbatches):
    """Compact text of microbatch numbers: ``0-3,8``.

    >>> describe_microbatches([0, 1, 2, 3, 8])
    '0-3,8'
    """
    values = sorted(int(m) for m in microbatches)
    parts = []
    k = 0
    while k < len(values):
        run = k
        while run + 1 < len(values) and values[run + 1] == values[run] + 1:
            run += 1
        parts.append(str(values[k]) if run == k else f"{values[k]}-{values[run]}")
        k = run + 1
    return ",".join(parts)


def _positions(table):
    """Each operation's cell position within its device's row order."""
    cell = np.cumsum(table.cell_starts()) - 1
    first = np.searchsorted(table.device, table.device)
    return (cell - cell[first]).astype(np.int64)


def _derived(table, transform):
    """Metadata of a table ``transform`` made from ``table``."""
    params = dict(table.params)
    if "transforms" in params:
        steps = list(params["transforms"])
        origin = params.get("adapted_from")
    else:
        steps = []
        origin = table.family
        if table.family and table.params:
            origin += " " + " ".join(f"{key}={value}" for key, value in table.params.items())
    params = {"transforms": steps + [transform.describe()]}
    if origin:
        params["adapted_from"] = origin
    return {"num_stages": table.num_stages, "stage_layers": table.stage_layers,
            "family": None, "params": params}


#: True while transforms should build row orders, not layouts (``Transform.orders``).
_ORDERS_ONLY = contextvars.ContextVar("tabsched_orders_only", default=False)


@contextlib.contextmanager
def _orders_only():
    token = _ORDERS_ONLY.set(True)
    try:
        yield
    finally:
        _ORDERS_ONLY.reset(token)


def _laid_out(*columns, **metadata):
    return lay_out(order_table(*columns, **metadata))


def _build(table, transform, device, primary, secondary, kind, stage, microbatch, sizes):
    """Lay out new row orders: operations sort by (device, primary, secondary), and
    operations with equal keys on one device share a cell (an overlap)."""
    device = np.asarray(device, dtype=np.int64)
    primary = np.asarray(primary, dtype=np.int64)
    secondary = np.asarray(secondary, dtype=np.int64)
    order = np.lexsort((secondary, primary, device))
    device, primary, secondary = device[order], primary[order], secondary[order]
    fresh = np.ones(len(order), dtype=bool)
    fresh[1:] = ((device[1:] != device[:-1]) | (primary[1:] != primary[:-1])
                 | (secondary[1:] != secondary[:-1]))
    cell = np.cumsum(fresh) - 1
    first = np.searchsorted(device, device)
    position = cell - cell[first]
    build = order_table if _ORDERS_ONLY.get() else _laid_out
    return build(
        device, position, np.asarray(kind)[order], np.asarray(stage)[order],
        np.asarray(microbatch)[order], num_devices=table.num_devices,
        microbatch_sizes=tuple(float(size) for size in sizes), **_derived(table, transform))


def _activations(table, costs):
    costs = UnitCosts() if costs is None else costs
    return np.asarray(costs.activation_sizes(table), dtype=np.float64), costs


def _largest_sum(values, count):
    """Sum of the ``count`` largest values (all of them for ``count=None``)."""
    values = np.sort(np.asarray(values, dtype=np.float64))[::-1]
    return float(values.sum() if count is None else values[:max(0, count)].sum())


def _check_microbatches(table, microbatches, name):
    if isinstance(microbatches, str):
        if microbatches != "all":
            raise InvalidParameterError(f"{name}: microbatches must be 'all' or a list of "
                                        f"microbatches, not {microbatches!r}")
        return np.arange(table.num_microbatches)
    try:
        values = np.unique(np.asarray(list(microbatches), dtype=np.int64))
    except (TypeError, ValueError):
        raise InvalidParameterError(f"{name}: microbatches must be 'all' or a list of "
                                    f"microbatches, not {microbatches!r}") from None
    bad = values[(values < 0) | (values >= table.num_microbatches)]
    if len(bad):
        raise InvalidParameterError(f"{name}: microbatch {int(bad[0])} is out of range (the "
                                    f"table has microbatches 0..{table.num_microbatches - 1})")
    return values


def _microbatch_list(name, microbatches):
    """``"all"`` or a sorted tuple of distinct microbatch numbers."""
    if isinstance(microbatches, str):
        return microbatches
    try:
        values = [int(m) for m in microbatches]
        if any(value != m for value, m in zip(values, microbatches)):
            raise ValueError
    except (TypeError, ValueError):
        raise InvalidParameterError(f"{name}: microbatches must be 'all' or a list of "
                                    f"microbatches, not {microbatches!r}") from None
    return tuple(sorted(set(values)))


def _check_int(name, value, minimum):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise InvalidParameterError(f"{name} must be an integer >= {minimum}, not {value!r}")
    return int(value)


# ------------------------------------------------------------ memory effect
@dataclass
class MemoryEffect:
    """What a transform states about each device's activation peak.

    ``lower[d] <= new peak - old peak <= upper[d]``, in the cost model's memory
    unit; ``statement`` says why in words.
    """

    lower: np.ndarray
    upper: np.ndarray
    statement: str

    def check(self, before, after, *, tolerance=1e-9):
        """Devices whose change of peak breaks the statement.

        Parameters
        ----------
        before, after : sequences of float
            Activation peak per device of the table and of the transformed table.
        """
        before = np.asarray(before, dtype=np.float64)
        after = np.asarray(after, dtype=np.float64)
        slack = tolerance * np.maximum(1.0, np.maximum(np.abs(before), np.abs(after)))
        change = after - before
        outside = (change < self.lower - slack) | (change > self.upper + slack)
        return np.flatnonzero(outside).tolist()


# --------------------------------------------------------------- transforms
class Transform:
    """A granularity transform; see the module docstring."""

    name = "transform"

    def apply(self, table, costs=None):
        """The transformed table (``costs``: the cost model it will be priced with)."""
        raise NotImplementedError

    def orders(self, table, costs=None):
        """The transformed table's row orders, as a table whose slots are positions
        (:func:`tabsched.layout.order_table`), without laying it out: what makes two
        candidates the same table, and all that evaluating one needs.
        ``lay_out(transform.orders(table))`` is ``transform.apply(table)``.
        """
        with _orders_only():
            return self.apply(table, costs)

    def memory_effect(self, table, costs=None):
        """The :class:`MemoryEffect` of applying this transform to ``table``."""
        raise NotImplementedError

    def describe(self):
        """Short text, e.g. ``warmup(d3,+1)``."""
        raise NotImplementedError

    def to_dict(self):
        raise NotImplementedError

    def __repr__(self):
        return f"<{type(self).__name__} {self.describe()}>"

    def __eq__(self, other):
        return type(self) is type(other) and self.to_dict() == other.to_dict()

    def __hash__(self):
        return hash(self.describe())


class SplitMicrobatches(Transform):
    """Split microbatches into ``parts`` equal microbatches each.

    The parts of a microbatch are numbered consecutively where it stood (later
    microbatches are renumbered), and on every device each of its operations is
    replaced by its parts, back to back. An overlapped cell keeps its other
    operation with the first part. Replacing one operation by a chain of parts
    that depend part by part can never create a cycle, so a valid table stays
    deadlock-free.

    Memory: a device's activation peak never rises (the parts together hold
    what the microbatch held, and part by part) and falls by at most the split
    microbatches' activations on it.

    Parameters
    ----------
    microbatches : "all" or sequence of int
    parts : int
        ``k >= 2``. Under ``ModelCosts`` it must divide each split microbatch's
        samples.
    """

    name = "split"

    def __init__(self, microbatches, parts=2):
        self.microbatches = _microbatch_list("split", microbatches)
        self.parts = _check_int("split factor", parts, 2)

    def _selected(self, table, costs):
        selected = _check_microbatches(table, self.microbatches, self.describe())
        if costs is not None and hasattr(costs, "microbatch_samples"):
            samples = costs.microbatch_samples(table)
            for m in selected.tolist():
                if int(samples[m]) % self.parts:
                    raise InvalidParameterError(
                        f"split factor {self.parts} does not divide microbatch {m}'s "
                        f"{int(samples[m])} samples (a part must hold whole samples; raise "
                        f"the microbatch size or pick a factor that divides it)")
        return selected

    def apply(self, table, costs=None):
        return _split(table, self._selected(table, costs), self.parts, self)

    def memory_effect(self, table, costs=None):
        selected = self._selected(table, costs)
        activation, _ = _activations(table, costs)
        split = np.isin(table.microbatch, selected) & (table.kind == FORWARD)
        held = np.bincount(table.device[split], weights=activation[split],
                           minlength=table.num_devices)
        return MemoryEffect(lower=-held, upper=np.zeros(table.num_devices),
                            statement="splitting never raises a device's peak; it lowers it by "
                                      "at most the split microbatches' activations")

    def describe(self):
        which = "all" if isinstance(self.microbatches, str) else \
            "m" + describe_microbatches(self.microbatches)
        return f"split({which},k={self.parts})"

    def to_dict(self):
        return {"transform": self.name, "microbatches": self.microbatches if isinstance(
            self.microbatches, str) else list(self.microbatches), "parts": self.parts}


def _split(table, selected, parts, transform):
    M = table.num_microbatches
    count = np.ones(M, dtype=np.int64)
    count[selected] = parts
    new_first = np.cumsum(count) - count
    sizes = np.repeat(np.asarray(table.microbatch_sizes, dtype=np.float64) / count, count)
    per_op = count[table.microbatch]
    source = np.repeat(np.arange(len(table)), per_op)
    part = np.arange(len(source)) - np.repeat(np.cumsum(per_op) - per_op, per_op)
    position = _positions(table)
    return _build(table, transform, table.device[source], position[source], part,
                  table.kind[source], table.stage[source],
                  new_first[table.microbatch[source]] + part, sizes)


class SplitPhases(Transform):
    """Split only the microbatches of the warm-up and cool-down phases.

    The first ``warmup`` microbatches to enter the pipeline (by the slot of
    their first forward on stage 0) and the last ``cooldown`` to leave it (by
    the slot of their last operation) are split into ``parts``; the steady
    state keeps full microbatches. Memory: as :class:`SplitMicrobatches`.
    """

    name = "split-phases"

    def __init__(self, parts=2, warmup=1, cooldown=1):
        self.parts = _check_int("split factor", parts, 2)
        self.warmup = _check_int("warmup microbatches", warmup, 0)
        self.cooldown = _check_int("cooldown microbatches", cooldown, 0)
        if self.warmup + self.cooldown == 0:
            raise InvalidParameterError("split-phases: give warmup or cooldown microbatches")

    def microbatches(self, table):
        """The microbatches this transform splits on ``table``."""
        M = table.num_microbatches
        entry = np.full(M, np.iinfo(np.int64).max, dtype=np.int64)
        first = (table.kind == FORWARD) & (table.stage == 0)
        np.minimum.at(entry, table.microbatch[first], table.slot[first].astype(np.int64))
        leave = np.zeros(M, dtype=np.int64)
        np.maximum.at(leave, table.microbatch, table.slot.astype(np.int64))
        entering = np.lexsort((np.arange(M), entry))[:min(self.warmup, M)]
        leaving = np.lexsort((-np.arange(M), -leave))[:min(self.cooldown, M)]
        return np.union1d(entering, leaving)

    def _inner(self, table):
        return SplitMicrobatches(self.microbatches(table).tolist(), self.parts)

    def apply(self, table, costs=None):
        inner = self._inner(table)
        return _split(table, inner._selected(table, costs), self.parts, self)

    def memory_effect(self, table, costs=None):
        return self._inner(table).memory_effect(table, costs)

    def describe(self):
        return f"split-phases(k={self.parts},warmup={self.warmup},cooldown={self.cooldown})"

    def to_dict(self):
        return {"transform": self.name, "parts": self.parts, "warmup": self.warmup,
                "cooldown": self.cooldown}


class MergeMicrobatches(Transform):
    """Merge groups of ``count`` consecutive microbatches into one each.

    ``first`` lists the first microbatch of each group, or ``"all"`` for
    ``0..count-1``, ``count..2count-1``, ... (a remainder is left alone). The
    merged microbatch has the group's summed size; its forward runs where the
    group's first forward ran and each of its backward operations where the
    group's last one of that kind ran: it enters the pipeline as early as its
    first member did and leaves it when its last one did. Merging needs every
    stage to run the group's
    microbatches on one device, with the same kind of backward (whole or split),
    and outside overlapped cells. A merge may deadlock (one operation now waits
    for a whole group); the search rejects such candidates.

    Memory: the merged microbatch is held from the group's first forward to its
    last backward, a window that covers every member's, so a device's peak
    never falls and rises by at most the merged activations on it.

    Parameters
    ----------
    first : "all" or sequence of int
    count : int
        ``>= 2``.
    """

    name = "merge"

    def __init__(self, first="all", count=2):
        self.first = _microbatch_list("merge", first)
        self.count = _check_int("merge count", count, 2)

    def groups(self, table):
        """``group[m]``: the group of microbatch ``m`` (or -1)."""
        M = table.num_microbatches
        if isinstance(self.first, str):
            if self.first != "all":
                raise InvalidParameterError(f"{self.describe()}: first must be 'all' or a list "
                                            f"of microbatches")
            starts = np.arange(0, M - self.count + 1, self.count)
        else:
            starts = _check_microbatches(table, self.first, self.describe())
        group = np.full(M, -1, dtype=np.int64)
        for g, start in enumerate(starts.tolist()):
            members = np.arange(start, start + self.count)
            if members[-1] >= M:
                raise InvalidParameterError(
                    f"{self.describe()}: microbatches {start}..{members[-1]} run past the "
                    f"table's {M} microbatches")
            if np.any(group[members] >= 0):
                raise InvalidParameterError(f"{self.describe()}: groups overlap at "
                                            f"microbatch {start}")
            group[members] = g
        if not len(starts):
            raise InvalidParameterError(f"{self.describe()}: the table has only {M} "
                                        f"microbatches")
        return group

    def _checked(self, table):
        group = self.groups(table)
        op_group = group[table.microbatch]
        member = op_group >= 0
        solo = table.cell_starts()
        solo = solo & np.append(solo[1:], True)
        if np.any(member & ~solo):
            k = int(np.flatnonzero(member & ~solo)[0])
            raise InvalidParameterError(
                f"{self.describe()}: {table.op(k)} is in an overlapped cell on device "
                f"{int(table.device[k])}; merging it is not supported")
        key = op_group[member] * table.num_stages + table.stage[member]
        devices = table.device[member]
        order = np.lexsort((devices, key))
        key, devices = key[order], devices[order]
        clash = np.flatnonzero((key[1:] == key[:-1]) & (devices[1:] != devices[:-1]))
        if len(clash):
            k = int(clash[0])
            g, stage = divmod(int(key[k]), table.num_stages)
            members = np.flatnonzero(group == g)
            raise InvalidParameterError(
                f"cannot merge microbatches {members[0]}..{members[-1]}: stage {stage} runs "
                f"them on devices {int(devices[k])} and {int(devices[k + 1])}")
        whole = np.bincount(key, weights=(table.kind[member][order] == BACKWARD),
                            minlength=int(key.max()) + 1 if len(key) else 0)
        mixed = np.flatnonzero((whole > 0) & (whole < self.count))
        if len(mixed):
            g, stage = divmod(int(mixed[0]), table.num_stages)
            members = np.flatnonzero(group == g)
            raise InvalidParameterError(
                f"cannot merge microbatches {members[0]}..{members[-1]}: stage {stage} runs "
                f"some of their backwards whole and some split into I and W")
        return group

    def apply(self, table, costs=None):
        group = self._checked(table)
        M = table.num_microbatches
        leader = np.ones(M, dtype=bool)
        members = group >= 0
        leader[members] = np.r_[True, group[members][1:] != group[members][:-1]]
        new_id = np.cumsum(leader) - 1
        sizes = np.bincount(new_id, weights=np.asarray(table.microbatch_sizes, np.float64))
        position = _positions(table)
        op_group = group[table.microbatch]
        keep = op_group < 0
        merged = np.flatnonzero(~keep)
        if len(merged):
            # the forward where the group's first forward ran, every backward kind where
            # the group's last one ran
            key = (op_group[merged] * table.num_stages + table.stage[merged]) * 4 \
                + table.kind[merged]
            rank = np.where(table.kind[merged] == FORWARD, -position[merged], position[merged])
            order = np.lexsort((rank, key))
            last = np.r_[key[order][1:] != key[order][:-1], True]
            keep[merged[order][last]] = True
        index = np.flatnonzero(keep)
        return _build(table, self, table.device[index], position[index],
                      np.zeros(len(index)), table.kind[index], table.stage[index],
                      new_id[table.microbatch[index]], sizes)

    def memory_effect(self, table, costs=None):
        group = self._checked(table)
        activation, _ = _activations(table, costs)
        forward = np.flatnonzero((table.kind == FORWARD) & (group[table.microbatch] >= 0))
        bound = np.bincount(table.device[forward], weights=activation[forward],
                            minlength=table.num_devices)
        return MemoryEffect(lower=np.zeros(table.num_devices), upper=bound,
                            statement="a merged microbatch is held from its group's first "
                                      "forward to its last backward: the peak never falls and "
                                      "rises by at most the merged activations")

    def describe(self):
        which = "all" if isinstance(self.first, str) else "m" + describe_microbatches(self.first)
        return f"merge({which},count={self.count})"

    def to_dict(self):
        return {"transform": self.name, "first": self.first if isinstance(self.first, str)
                else list(self.first), "count": self.count}


class Warmup(Transform):
    """Change a device's warm-up depth by ``delta``.

    In a device's row, count before each non-forward cell (``B``, ``I``, ``W``,
    an overlap) the forwards that precede it. ``delta > 0`` lets every forward
    overtake ``delta`` more of those cells (capped at the device's forwards):
    one more microbatch in flight, which absorbs a late gradient at the price of
    one more activation; for 1F1B it is Megatron's warm-up ``p-d-1+delta``.
    ``delta < 0`` holds forwards back, never past a backward of their own.

    Memory: the device's peak rises by at most its ``delta`` largest forward
    activations (``delta > 0``) or falls by at most ``|delta|`` of them; other
    devices keep theirs.

    A device's warm-up must stay deeper than the next one's for 1F1B-like tables
    to keep their pipelining (each device then has its forward in flight when
    the gradient comes back); the search therefore deepens an upstream prefix of
    devices, or makes a downstream suffix shallower, together.

    Parameters
    ----------
    devices : int, sequence of int, or None
        The devices to change; ``None``: every device.
    delta : int
        Not 0.
    """

    name = "warmup"

    def __init__(self, devices, delta):
        if devices is None:
            self.devices = None
        elif isinstance(devices, (int, np.integer)) and not isinstance(devices, bool):
            self.devices = (_check_int("warmup device", devices, 0),)
        else:
            self.devices = tuple(sorted({_check_int("warmup device", d, 0) for d in devices}))
            if not self.devices:
                raise InvalidParameterError("warmup: give at least one device")
        if isinstance(delta, bool) or not isinstance(delta, (int, np.integer)) or delta == 0:
            raise InvalidParameterError(f"warmup delta must be a non-zero integer, "
                                        f"not {delta!r}")
        self.delta = int(delta)

    def _devices(self, table):
        if self.devices is None:
            return range(table.num_devices)
        bad = [d for d in self.devices if d >= table.num_devices]
        if bad:
            raise InvalidParameterError(f"warmup on device {bad[0]}, but the table has "
                                        f"devices 0..{table.num_devices - 1}")
        return self.devices

    def apply(self, table, costs=None):
        position = _positions(table)
        primary = np.empty(len(table), dtype=np.int64)
        fresh = table.cell_starts()
        cell = np.cumsum(fresh) - 1
        parts = np.bincount(cell)
        chosen = set(self._devices(table))
        for d in range(table.num_devices):
            lo, hi = np.searchsorted(table.device, [d, d + 1])
            if d not in chosen or lo == hi:
                primary[lo:hi] = 2 * position[lo:hi]
                continue
            ops = np.arange(lo, hi)
            local = cell[ops] - cell[lo]
            is_forward_cell = np.zeros(local[-1] + 1, dtype=bool)
            single = parts[cell[ops]] == 1
            is_forward_cell[local[single & (table.kind[ops] == FORWARD)]] = True
            rank = np.cumsum(is_forward_cell) - is_forward_cell
            forwards = int(is_forward_cell.sum())
            others = np.flatnonzero(~is_forward_cell)
            before = rank[others]
            if self.delta > 0:
                after = np.minimum(before + self.delta, forwards)
            else:
                # In the cool-down every cell already follows every forward (the count
                # is capped); continue the steady state there, one forward per cell that
                # holds a B or I, so that the last forwards move |delta| such steps later.
                steps = np.zeros(local[-1] + 1, dtype=bool)
                steps[local[(table.kind[ops] == BACKWARD) | (table.kind[ops] == INPUT_GRAD)]] = True
                trailing = before == forwards
                if np.any(trailing):
                    counted = np.cumsum(steps[others][trailing])
                    first_step = steps[others][trailing][0]
                    before = before.copy()
                    before[trailing] = forwards + counted - (1 if first_step else 0)
                # a backward may not move before its own forward
                pair = table.stage[ops].astype(np.int64) * table.num_microbatches \
                    + table.microbatch[ops]
                own = dict(zip(pair[is_forward_cell[local]].tolist(),
                               rank[local[is_forward_cell[local]]].tolist()))
                need = np.zeros(local[-1] + 1, dtype=np.int64)
                for k in np.flatnonzero(~is_forward_cell[local]).tolist():
                    if table.kind[ops[k]] != FORWARD and int(pair[k]) in own:
                        need[local[k]] = max(need[local[k]], own[int(pair[k])] + 1)
                after = np.maximum(np.minimum(before + self.delta, forwards),
                                   np.maximum.accumulate(need[others]))
            key = np.empty(local[-1] + 1, dtype=np.int64)
            key[is_forward_cell] = 2 * rank[is_forward_cell] + 1
            key[others] = 2 * after
            primary[lo:hi] = key[local]
        return _build(table, self, table.device, primary, position, table.kind, table.stage,
                      table.microbatch, table.microbatch_sizes)

    def memory_effect(self, table, costs=None):
        activation, _ = _activations(table, costs)
        lower = np.zeros(table.num_devices)
        upper = np.zeros(table.num_devices)
        for d in self._devices(table):
            forward = (table.device == d) & (table.kind == FORWARD)
            moved = _largest_sum(activation[forward], abs(self.delta))
            if self.delta > 0:
                upper[d] = moved
            else:
                lower[d] = -moved
        return MemoryEffect(lower=lower, upper=upper,
                            statement=f"each forward moves {abs(self.delta)} backward step(s) "
                                      f"{'earlier' if self.delta > 0 else 'later'}: the peak "
                                      f"moves by at most that many forward activations")

    def describe(self):
        where = "all" if self.devices is None else "d" + describe_microbatches(self.devices)
        return f"warmup({where},{self.delta:+d})"

    def to_dict(self):
        return {"transform": self.name, "devices": None if self.devices is None
                else list(self.devices), "delta": self.delta}


class SplitBackward(Transform):
    """Split ``B`` into ``I`` + ``W`` and run the ``W`` ops in idle slots.

    On the chosen devices every ``B`` becomes an ``I`` (so the input gradient
    leaves as soon as ``I`` ends) and a ``W``; then the device's row is
    list-scheduled at the cost model's durations (communication included,
    contention not): its other cells keep their order, and a pending ``W``
    (its ``I`` done) runs when the device would otherwise wait at least as long
    as the ``W`` takes. At most ``max_deferred`` ``W`` ops may wait past the
    device's next other cell (then the oldest runs first); the rest run at the
    end. ``W`` ops already in the table are placed the same way, so this also
    re-places the ``W`` ops of a zero-bubble table. ``W`` has no successor, so
    the new rows cannot deadlock.

    Memory: after ``I`` a stage keeps ``1 - input_grad_release`` of its
    activation until ``W``; the peak rises by at most that much for the
    ``max_deferred`` largest (all of them when unbounded) and falls by at most
    what the table's own deferred ``W`` ops held.

    Parameters
    ----------
    devices : None or sequence of int
        ``None``: every device.
    max_deferred : int, None, "cooldown" or sequence
        ``0`` runs each ``W`` right after its ``I``; ``None`` is unbounded;
        ``"cooldown"`` lets each device defer as many ``W`` as fit in its
        cool-down idle time (at the cost model's durations, with every ``W``
        right after its ``I``) -- ZB-H1 defers ``d`` on device ``d`` for the same
        reason; a sequence gives one cap (or ``None``) per device of the table.
    """

    name = "split-backward"

    def __init__(self, devices=None, max_deferred=None):
        self.devices = None if devices is None else tuple(sorted(
            {_check_int("split-backward device", d, 0) for d in devices}))
        if max_deferred is None or isinstance(max_deferred, str):
            if max_deferred not in (None, "cooldown"):
                raise InvalidParameterError(f"max_deferred must be an integer, None, "
                                            f"'cooldown' or one per device, "
                                            f"not {max_deferred!r}")
            self.max_deferred = max_deferred
        elif isinstance(max_deferred, (int, np.integer)):
            self.max_deferred = _check_int("max_deferred", max_deferred, 0)
        else:
            self.max_deferred = tuple(None if cap is None else _check_int("max_deferred", cap, 0)
                                      for cap in max_deferred)

    def _chosen(self, table):
        if self.devices is None:
            return np.ones(table.num_devices, dtype=bool)
        bad = [d for d in self.devices if d >= table.num_devices]
        if bad:
            raise InvalidParameterError(f"split-backward on device {bad[0]}, but the table has "
                                        f"devices 0..{table.num_devices - 1}")
        chosen = np.zeros(table.num_devices, dtype=bool)
        chosen[list(self.devices)] = True
        return chosen

    def _staged(self, table, chosen):
        """The table with the chosen devices' B split into I and W right after it
        (row orders: nothing reads its slots)."""
        with _orders_only():
            return self._staged_orders(table, chosen)

    def _staged_orders(self, table, chosen):
        split = (table.kind == BACKWARD) & chosen[table.device]
        if not np.any(split) and not np.any((table.kind == WEIGHT_GRAD) & chosen[table.device]):
            raise InvalidParameterError(f"{self.describe()}: the chosen devices run no B or W")
        position = _positions(table)
        source = np.concatenate([np.arange(len(table)), np.flatnonzero(split)])
        second = np.r_[np.zeros(len(table), dtype=np.int64), np.ones(int(split.sum()), np.int64)]
        kind = table.kind[source].copy()
        kind[:len(table)][split] = INPUT_GRAD
        kind[len(table):] = WEIGHT_GRAD
        return _build(table, self, table.device[source], position[source], second, kind,
                      table.stage[source], table.microbatch[source], table.microbatch_sizes)

    def caps(self, table, costs=None):
        """The cap on deferred ``W`` per device (``None``: unbounded) on ``table``."""
        D = table.num_devices
        if self.max_deferred is None or isinstance(self.max_deferred, int):
            return [self.max_deferred] * D
        if isinstance(self.max_deferred, tuple):
            if len(self.max_deferred) != D:
                raise InvalidParameterError(f"{self.describe()}: max_deferred has "
                                            f"{len(self.max_deferred)} entries for {D} devices")
            return list(self.max_deferred)
        from tabsched.evaluate import evaluate
        costs = UnitCosts() if costs is None else costs
        staged = self._staged(table, self._chosen(table))
        rows = _fill_idle(staged, costs, self._chosen(table), [0] * D)
        with _orders_only():      # evaluation reads row orders, not slots
            filled = _from_rows(table, self, staged, rows)
        result = evaluate(filled, costs, formula=False)
        durations = np.asarray(costs.op_durations(staged), dtype=np.float64)
        weight = staged.kind == WEIGHT_GRAD
        total = np.bincount(staged.device[weight], weights=durations[weight], minlength=D)
        count = np.bincount(staged.device[weight], minlength=D)
        mean = np.divide(total, count, out=np.zeros(D), where=count > 0)
        return [int(device.cooldown // mean[d]) if mean[d] > 0 else 0
                for d, device in enumerate(result.devices)]

    def apply(self, table, costs=None):
        costs = UnitCosts() if costs is None else costs
        chosen = self._chosen(table)
        caps = self.caps(table, costs)
        staged = self._staged(table, chosen)
        rows = _fill_idle(staged, costs, chosen, caps)
        return _from_rows(table, self, staged, rows)

    def memory_effect(self, table, costs=None):
        activation, costs = _activations(table, costs)
        keep = 1.0 - costs.input_grad_release
        chosen = self._chosen(table)
        caps = self.caps(table, costs)
        backward = (table.kind == BACKWARD) | (table.kind == WEIGHT_GRAD)
        forward = np.flatnonzero(table.kind == FORWARD)
        pair = table.stage.astype(np.int64) * table.num_microbatches + table.microbatch
        forward_of = dict(zip(pair[forward].tolist(), activation[forward].tolist()))
        lower = np.zeros(table.num_devices)
        upper = np.zeros(table.num_devices)
        for d in np.flatnonzero(chosen).tolist():
            mine = np.flatnonzero(backward & (table.device == d))
            held = np.array([forward_of[p] for p in pair[mine].tolist()]) * keep
            upper[d] = _largest_sum(held, caps[d])
            existing = table.kind[mine] == WEIGHT_GRAD
            lower[d] = -float(held[existing].sum())
        return MemoryEffect(lower=lower, upper=upper,
                            statement=f"a deferred W holds {keep:.3g} of its activation until it "
                                      f"runs: the peak rises by at most that much for the "
                                      f"capped number of W ops")

    def describe(self):
        where = "all" if self.devices is None else "d" + describe_microbatches(self.devices)
        if isinstance(self.max_deferred, tuple):
            defer = "/".join("inf" if cap is None else str(cap) for cap in self.max_deferred)
        else:
            defer = "inf" if self.max_deferred is None else self.max_deferred
        return f"split-backward({where},defer<={defer})"

    def to_dict(self):
        return {"transform": self.name, "devices": None if self.devices is None
                else list(self.devices), "max_deferred": list(self.max_deferred)
                if isinstance(self.max_deferred, tuple) else self.max_deferred}


def _from_rows(table, transform, staged, rows):
    """The staged table with each device's cells in the order ``rows`` lists them."""
    device = np.repeat(np.arange(staged.num_devices), [len(row) for row in rows])
    order = np.concatenate([np.asarray(row, dtype=np.int64) for row in rows]) \
        if len(device) else np.zeros(0, dtype=np.int64)
    cell = np.cumsum(staged.cell_starts()) - 1
    rank = np.empty(int(cell[-1]) + 1 if len(cell) else 0, dtype=np.int64)
    rank[order] = np.arange(len(order)) - np.searchsorted(device, device)
    return _build(table, transform, staged.device, rank[cell], np.zeros(len(staged)),
                  staged.kind, staged.stage, staged.microbatch, staged.microbatch_sizes)


def warmup_depths(table):
    """Per device, the forward cells its row runs before its first other cell.

    >>> from tabsched.schedules import generate
    >>> warmup_depths(generate("1f1b", devices=4, microbatches=8))
    [4, 3, 2, 1]
    """
    depths = []
    fresh = table.cell_starts()
    cell = np.cumsum(fresh) - 1
    single = np.bincount(cell)[cell] == 1
    for d in range(table.num_devices):
        lo, hi = np.searchsorted(table.device, [d, d + 1])
        forward = single[lo:hi] & (table.kind[lo:hi] == FORWARD)
        other = np.flatnonzero(~forward)
        depths.append(int(forward.sum()) if not len(other) else
                      int(forward[:other[0]].sum()))
    return depths


def deferred_weight_grads(table):
    """Per device, the most ``W`` ops its row leaves pending (``I`` done) past another cell.

    What :class:`SplitBackward`'s ``max_deferred`` bounds; ZB-H1 gives ``d``
    on device ``d`` (for ``M >= 2p``).

    >>> from tabsched.schedules import generate
    >>> deferred_weight_grads(generate("zb-h1", devices=4, microbatches=8))
    [0, 1, 2, 3]
    """
    result = []
    cell = np.cumsum(table.cell_starts()) - 1
    for d in range(table.num_devices):
        lo, hi = np.searchsorted(table.device, [d, d + 1])
        if lo == hi:
            result.append(0)
            continue
        local = cell[lo:hi] - cell[lo]
        kind = table.kind[lo:hi]
        released = np.bincount(local, weights=kind == INPUT_GRAD, minlength=local[-1] + 1)
        weights = np.bincount(local, weights=kind == WEIGHT_GRAD, minlength=local[-1] + 1)
        pending = np.cumsum(released - weights) - (released - weights)
        others = weights == 0
        result.append(int(pending[others].max()) if np.any(others) else 0)
    return result


def _data_dependencies(table):
    """``(producer, consumer)`` operation pairs of every data dependency (as ``lower``)."""
    S, M = table.num_stages, table.num_microbatches
    kind = table.kind
    index = np.arange(len(table))
    pair = table.stage.astype(np.int64) * M + table.microbatch
    is_f = kind == FORWARD
    is_bwd = (kind == BACKWARD) | (kind == INPUT_GRAD)
    forward_of = np.full(S * M, -1, dtype=np.int64)
    forward_of[pair[is_f]] = index[is_f]
    backward_of = np.full(S * M, -1, dtype=np.int64)
    backward_of[pair[is_bwd]] = index[is_bwd]
    input_of = np.full(S * M, -1, dtype=np.int64)
    input_of[pair[kind == INPUT_GRAD]] = index[kind == INPUT_GRAD]
    f_next = is_f & (table.stage > 0)
    b_next = is_bwd & (table.stage < S - 1)
    is_w = kind == WEIGHT_GRAD
    producers = np.concatenate([forward_of[pair[f_next] - M], forward_of[pair[is_bwd]],
                                backward_of[pair[b_next] + M], input_of[pair[is_w]]])
    consumers = np.concatenate([index[f_next], index[is_bwd], index[b_next], index[is_w]])
    gradient = np.concatenate([np.zeros(int(f_next.sum()), bool),
                               np.ones(len(consumers) - int(f_next.sum()), bool)])
    return producers, consumers, gradient


def _fill_idle(table, costs, chosen, max_deferred):
    """Row orders (cell ids per device) with the chosen devices' W cells as fillers.

    A list-scheduling simulation at the cost model's durations, in time order:
    a device runs its next other cell as soon as its inputs have arrived; while
    it would wait, it runs its oldest pending W if the wait is known to last at
    least that long (a producer that has not started yet ends no earlier than
    now plus its duration, its output arrives no earlier than that plus the
    transfer). The simulation is compiled (``tabsched._build.fill_idle``; its twin
    ``_reference.fill_idle`` is the test oracle); this prepares its arrays.
    """
    arrays = _fill_idle_arrays(table, costs, chosen, max_deferred)
    rows = np.empty(len(arrays[0]), dtype=np.int32)
    count = np.empty(table.num_devices, dtype=np.int32)
    placed = _compiled.fill_idle(*arrays, rows, count)
    if placed != len(rows):
        raise TabschedError(f"internal error: W placement stopped before every cell ran "
                            f"({placed}; please report this)")
    bounds = np.concatenate([[0], np.cumsum(count)])
    return [rows[bounds[d]:bounds[d + 1]].tolist() for d in range(table.num_devices)]


def _fill_idle_arrays(table, costs, chosen, max_deferred):
    """The arguments of ``tabsched._build.fill_idle`` (before its outputs) for ``_fill_idle``."""
    index = np.int32
    cell = np.cumsum(table.cell_starts()) - 1
    num_cells = int(cell[-1]) + 1 if len(cell) else 0
    op_durations = np.asarray(costs.op_durations(table), dtype=np.float64)
    # the composer's cells (the table's cells are the lowering's, before it lowers)
    length = cell_durations(cell, num_cells, op_durations, costs.overlap)
    cell_device = np.zeros(num_cells, dtype=index)
    cell_device[cell] = table.device
    producers, consumers, gradient = _data_dependencies(table)
    crossing = table.device[producers] != table.device[consumers]
    delay = np.zeros(len(producers))
    if np.any(crossing):
        sends = Transfers(table=table, producer=producers[crossing],
                          consumer=consumers[crossing], gradient=gradient[crossing])
        delay[crossing] = np.asarray(costs.transfer_costs(table, sends)[0], dtype=np.float64)
    filler = np.zeros(num_cells, dtype=np.int8)
    is_w = (table.kind == WEIGHT_GRAD) & chosen[table.device]
    filler[cell[is_w]] = 1
    producer_cell = cell[producers].astype(index)
    consumer_cell = cell[consumers].astype(index)
    into_filler = filler[consumer_cell].astype(bool)
    # dependencies of the main cells, and the W each I releases, in dependency order
    keep = ~into_filler
    dep_indptr, (dep_producer, dep_wait) = _grouped(consumer_cell[keep], num_cells,
                                                    producer_cell[keep], delay[keep])
    release_indptr, (released,) = _grouped(producer_cell[into_filler], num_cells,
                                           consumer_cell[into_filler])
    main = np.flatnonzero(filler == 0).astype(index)
    main_indptr = np.zeros(table.num_devices + 1, dtype=index)
    np.cumsum(np.bincount(cell_device[main], minlength=table.num_devices),
              out=main_indptr[1:])
    cap = np.array([-1 if value is None else value for value in max_deferred], dtype=index)
    return (length, cell_device, filler, dep_indptr, dep_producer, dep_wait, release_indptr,
            released, main_indptr, main, cap)


def _grouped(keys, count, *columns):
    """CSR offsets of ``keys`` (``0 <= key < count``) and ``columns`` grouped by key, in
    list order within a key."""
    order = np.argsort(keys, kind="stable")
    indptr = np.zeros(count + 1, dtype=np.int32)
    np.cumsum(np.bincount(keys, minlength=count), out=indptr[1:])
    return indptr, tuple(np.ascontiguousarray(column[order]) for column in columns)
