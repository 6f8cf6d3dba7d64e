"""Granularity transforms: new valid tables that cut the same work differently.

Data model
    A :class:`Transform` maps a valid table (any family, any placement) to a new
    valid table: new row orders -- per device, its operations in order, those
    that share a cell overlapped -- laid out in unit slots by
    :mod:`tabsched.layout` (:meth:`Transform.apply`), or left as orders, all
    that evaluating a candidate needs (:meth:`Transform.orders`). The new table
    records what made it (``params["transforms"]``, ``params["adapted_from"]``).
    Every transform builds its table with :func:`ordered_table` from sort keys
    per operation.

    A :class:`MemoryEffect` is what a transform states about each device's
    activation peak: bounds on how much it may change.

The cost model prices a transformed table from the table's own metadata, so
costs stay consistent: a microbatch split in two is two microbatches of half
the samples, whose durations come from the roofline at that size (launch
latency, weights read once per operation, the efficiency curve: smaller is not
proportionally faster) and whose transfers carry half the bytes at the full
latency. A transform whose new row orders contradict the dependencies raises
:class:`~tabsched.DeadlockError` (the table is never returned).

The memory bounds follow from the row orders alone, because a device's memory
rises and falls in the order of its own row; the search checks every
candidate's evaluated peaks against them and drops a candidate that breaks its
statement.

Transforms
    :class:`~tabsched.adapt.microbatches.SplitMicrobatches`
        Microbatch ``m`` becomes ``k`` microbatches of ``1/k`` the size, whose
        operations run back to back where ``m``'s ran. Peak: never higher; the
        pipeline fills and drains in finer steps.
    :class:`~tabsched.adapt.microbatches.MergeMicrobatches`
        Groups of consecutive microbatches become one, run from the group's
        first forward to its last backward. Peak: never lower, up to the merged
        activations higher.
    :class:`~tabsched.adapt.split_backward.SplitBackward`
        ``B`` becomes ``I`` + ``W``; the gradient goes upstream as soon as
        ``I`` ends and every ``W`` of the device waits for an idle slot (list
        scheduling at the cost model's durations), at most ``max_deferred`` of
        them past the device's next other operation. Peak: up to the deferred
        ``W``'s held activations higher.
    :class:`~tabsched.adapt.warmup.Warmup`
        Every forward of the chosen devices moves ``delta`` backward operations
        earlier (deeper warm-up: slack that absorbs late inputs) or later.
        Peak: up to ``delta`` forward activations higher (or lower).
    :class:`~tabsched.adapt.microbatches.SplitPhases`
        :class:`SplitMicrobatches` on the first microbatches to enter the
        pipeline and the last to leave it only: fine grain where it fills and
        drains, coarse grain in the steady state.
    :class:`~tabsched.adapt.sequence.SplitSequence`
        Each sequence cut into ``k`` slices (Seq1F1B): forwards in slice order,
        backwards in reverse, interleaved at slice grain. Peak: never higher.

>>> from tabsched.adapt import SplitMicrobatches, Warmup
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

from tabsched.costs import UnitCosts
from tabsched.exceptions import InvalidParameterError
from tabsched.layout import lay_out, order_table

__all__ = ["Transform", "MemoryEffect", "describe_microbatches"]


# -------------------------------------------------- helpers of every transform
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


def run_firsts(values):
    """``np.searchsorted(values, values)`` for sorted ``values``: each entry's index of
    the first entry equal to it, in one linear pass (the binary searches were a
    millisecond a call at 64 devices, several calls a candidate).

    >>> run_firsts(np.array([0, 0, 1, 3, 3, 3]))
    array([0, 0, 2, 3, 3, 3])
    """
    count = len(values)
    if count == 0:
        return np.zeros(0, dtype=np.intp)
    fresh = np.empty(count, dtype=bool)
    fresh[0] = True
    np.not_equal(values[1:], values[:-1], out=fresh[1:])
    starts = np.flatnonzero(fresh)
    return np.repeat(starts, np.diff(np.append(starts, count)))


def _lexsort3(first, second, third):
    """``np.lexsort((third, second, first))`` of int64 arrays: one stable argsort of a
    combined key where the three ranges' product fits in 62 bits (the rows are mostly
    in order already, which a stable sort of one key profits from: ten times faster
    than lexsort's three passes at 64 devices), else lexsort itself."""
    if len(first) == 0:
        return np.zeros(0, dtype=np.intp)
    keys = []
    span = 1
    for column in (third, second, first):
        low = int(column.min())
        width = int(column.max()) - low + 1
        keys.append((column, low, span))
        span *= width
    if span >= 2**62:
        return np.lexsort((third, second, first))
    combined = np.zeros(len(first), dtype=np.int64)
    for column, low, weight in keys:
        combined += (column - low) * weight
    return np.argsort(combined, kind="stable")


def cell_positions(table):
    """Each operation's cell position within its device's row order."""
    cell = np.cumsum(table.cell_starts()) - 1
    first = run_firsts(table.device)
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
def orders_only():
    """While inside, :func:`ordered_table` returns row orders (the slots are positions),
    not laid-out tables."""
    token = _ORDERS_ONLY.set(True)
    try:
        yield
    finally:
        _ORDERS_ONLY.reset(token)


def orders_are_wanted():
    """Whether :func:`ordered_table` returns row orders now (inside :func:`orders_only`)."""
    return _ORDERS_ONLY.get()


def _laid_out(*columns, **metadata):
    return lay_out(order_table(*columns, **metadata))


def ordered_table(table, transform, device, primary, secondary, kind, stage, microbatch, sizes,
                  slices=None, partition=None):
    """The table ``transform`` makes from ``table``, laid out from new row orders:
    operations sort by (device, primary, secondary), and operations with equal keys on
    one device share a cell (an overlap). ``slices``: the new microbatches' sequence
    slices (``ScheduleTable.sequence_slices``); by default ``table``'s when the
    microbatches are the same ones; ``partition`` how they were cut
    (``ScheduleTable.slice_partition``), by default ``table``'s."""
    if slices is None and len(sizes) == table.num_microbatches:
        slices = table.sequence_slices
    if partition is None:
        partition = table.slice_partition
    device = np.asarray(device, dtype=np.int64)
    primary = np.asarray(primary, dtype=np.int64)
    secondary = np.asarray(secondary, dtype=np.int64)
    order = _lexsort3(device, primary, secondary)
    device, primary, secondary = device[order], primary[order], secondary[order]
    fresh = np.ones(len(order), dtype=bool)
    fresh[1:] = ((device[1:] != device[:-1]) | (primary[1:] != primary[:-1])
                 | (secondary[1:] != secondary[:-1]))
    cell = np.cumsum(fresh) - 1
    first = run_firsts(device)
    position = cell - cell[first]
    build = order_table if _ORDERS_ONLY.get() else _laid_out
    return build(
        device, position, np.asarray(kind)[order], np.asarray(stage)[order],
        np.asarray(microbatch)[order], num_devices=table.num_devices,
        microbatch_sizes=tuple(float(size) for size in sizes), sequence_slices=slices,
        slice_partition=partition if slices is not None else None,
        **_derived(table, transform))


def activations(table, costs):
    """Every operation's activation size under ``costs`` (``UnitCosts`` for None), and
    the cost model."""
    costs = UnitCosts() if costs is None else costs
    return np.asarray(costs.activation_sizes(table), dtype=np.float64), costs


def largest_sum(values, count):
    """Sum of the ``count`` largest values (all of them for ``count=None``)."""
    values = np.sort(np.asarray(values, dtype=np.float64))[::-1]
    return float(values.sum() if count is None else values[:max(0, count)].sum())


def check_int(name, value, minimum):
    """``value`` as an int, or one line naming ``name`` unless it is an integer >= ``minimum``."""
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
        with orders_only():
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
