"""Split backward: ``B`` becomes ``I`` + ``W``, and each ``W`` runs in idle time.

Data model
    A staged table holds the chosen devices' ``I`` with its ``W`` right after
    it. Placing the ``W`` cells is a list-scheduling simulation at the cost
    model's durations over the staged table's cells: per cell its length (the
    composer's, :func:`tabsched.compose.cell_durations`), device and whether it
    is a filler (a ``W`` to place); per main cell its data dependencies with the
    transfer time each waits; per ``I`` the ``W`` it releases; per device its
    main cells in row order and the cap on ``W`` pending past another cell
    (:func:`_fill_idle_arrays`). The compiled list scheduler
    (``tabsched._build.fill_idle``, its twin ``tabsched._reference.fill_idle``)
    returns each device's cells in the order they ran, the new row orders.

>>> from tabsched.schedules import generate
>>> table = generate("1f1b", devices=4, microbatches=8)
>>> deferred_weight_grads(SplitBackward(max_deferred="cooldown").apply(table))   # as ZB-H1
[0, 1, 2, 3]
"""

import contextlib
import contextvars

import numpy as np

from tabsched import _build as _compiled
from tabsched.adapt.transforms import (MemoryEffect, Transform, activations, cell_positions,
                                       check_int, describe_microbatches, largest_sum,
                                       ordered_table, orders_are_wanted, orders_only,
                                       run_firsts)
from tabsched.compose import cell_durations
from tabsched.costs import UnitCosts
from tabsched.exceptions import InvalidParameterError, TabschedError
from tabsched.layout import lay_out
from tabsched.lower import Transfers
from tabsched.table import BACKWARD, FORWARD, INPUT_GRAD, WEIGHT_GRAD

__all__ = ["SplitBackward", "deferred_weight_grads"]


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
            {check_int("split-backward device", d, 0) for d in devices}))
        if max_deferred is None or isinstance(max_deferred, str):
            if max_deferred not in (None, "cooldown"):
                raise InvalidParameterError(f"max_deferred must be an integer, None, "
                                            f"'cooldown' or one per device, "
                                            f"not {max_deferred!r}")
            self.max_deferred = max_deferred
        elif isinstance(max_deferred, (int, np.integer)):
            self.max_deferred = check_int("max_deferred", max_deferred, 0)
        else:
            self.max_deferred = tuple(None if cap is None else check_int("max_deferred", cap, 0)
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
        with orders_only():
            return self._staged_orders(table, chosen)

    def _staged_orders(self, table, chosen):
        split = (table.kind == BACKWARD) & chosen[table.device]
        if not np.any(split) and not np.any((table.kind == WEIGHT_GRAD) & chosen[table.device]):
            raise InvalidParameterError(f"{self.describe()}: the chosen devices run no B or W")
        position = cell_positions(table)
        source = np.concatenate([np.arange(len(table)), np.flatnonzero(split)])
        second = np.r_[np.zeros(len(table), dtype=np.int64), np.ones(int(split.sum()), np.int64)]
        kind = table.kind[source].copy()
        kind[:len(table)][split] = INPUT_GRAD
        kind[len(table):] = WEIGHT_GRAD
        return ordered_table(table, self, table.device[source], position[source], second, kind,
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
        chosen = self._chosen(table)
        staged = self._staged(table, chosen)
        rows = _fill_idle(staged, costs, chosen, [0] * D, base=_base(table, staged, costs, chosen))
        with orders_only():      # evaluation reads row orders, not slots
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
        rows = _fill_idle(staged, costs, chosen, caps, base=_base(table, staged, costs, chosen))
        if _in_staged_order(rows):
            # every device runs its cells as staged: ``_from_rows`` would rebuild the
            # staged orders column for column (and metadata), so they are the result.
            # At 64 devices two of three single-device moves of a zero-bubble table
            # end here (the search's duplicates), and the rebuild is a quarter of a
            # move's time
            return lay_out(staged) if not orders_are_wanted() else staged
        return _from_rows(table, self, staged, rows)

    def memory_effect(self, table, costs=None):
        activation, costs = activations(table, costs)
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
            upper[d] = largest_sum(held, caps[d])
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


def _in_staged_order(rows):
    """Whether ``rows`` (cell ids per device, as ``_fill_idle`` gives them) list every
    cell in the order the staged table numbers them."""
    expected = 0
    for row in rows:
        if not np.array_equal(row, np.arange(expected, expected + len(row))):
            return False
        expected += len(row)
    return True


def _from_rows(table, transform, staged, rows):
    """The staged table with each device's cells in the order ``rows`` lists them."""
    device = np.repeat(np.arange(staged.num_devices), [len(row) for row in rows])
    order = np.concatenate([np.asarray(row, dtype=np.int64) for row in rows]) \
        if len(device) else np.zeros(0, dtype=np.int64)
    cell = np.cumsum(staged.cell_starts()) - 1
    rank = np.empty(int(cell[-1]) + 1 if len(cell) else 0, dtype=np.int64)
    rank[order] = np.arange(len(order)) - run_firsts(device)
    return ordered_table(table, transform, staged.device, rank[cell], np.zeros(len(staged)),
                  staged.kind, staged.stage, staged.microbatch, staged.microbatch_sizes)


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


def _fill_idle(table, costs, chosen, max_deferred, base=None):
    """Row orders (cell ids per device, int32 arrays) with the chosen devices' W cells as
    fillers.

    A list-scheduling simulation at the cost model's durations, in time order:
    a device runs its next other cell as soon as its inputs have arrived; while
    it would wait, it runs its oldest pending W if the wait is known to last at
    least that long (a producer that has not started yet ends no earlier than
    now plus its duration, its output arrives no earlier than that plus the
    transfer). The simulation is compiled (``tabsched._build.fill_idle``; its twin
    ``_reference.fill_idle`` is the test oracle); this prepares its arrays.
    """
    arrays = _fill_idle_arrays(table, costs, chosen, max_deferred, base)
    rows = np.empty(len(arrays[0]), dtype=np.int32)
    count = np.empty(table.num_devices, dtype=np.int32)
    placed = _compiled.fill_idle(*arrays, rows, count)
    if placed != len(rows):
        raise TabschedError(f"internal error: W placement stopped before every cell ran "
                            f"({placed}; please report this)")
    bounds = np.concatenate([[0], np.cumsum(count)])
    # int32 views, not lists: at 64 devices the lists cost as much as the placement's
    # check of its own arrays, and their only readers take arrays
    return [rows[bounds[d]:bounds[d + 1]] for d in range(table.num_devices)]


#: Inside :func:`shared_staging`, a dict that holds the last ``_fill_idle_base`` made for
#: moves on one table that split no ``B`` (its ``table``, ``costs`` and ``base``).
_SHARED_STAGING = contextvars.ContextVar("tabsched_shared_staging", default=None)


@contextlib.contextmanager
def shared_staging():
    """While inside, the split-backward moves on one table whose chosen devices run no
    ``B`` (their staged rows are the table's own, whichever devices they choose) share
    the staged arrays that do not depend on the devices. The search tries a split
    backward on each device of one parent; at 64 devices these arrays were half of each
    move's preparation."""
    token = _SHARED_STAGING.set({})
    try:
        yield
    finally:
        _SHARED_STAGING.reset(token)


def _base(table, staged, costs, chosen):
    """``_fill_idle_base(staged, costs)``, made once for the moves on ``table`` whose
    chosen devices run no ``B`` (``staged`` then has ``table``'s rows) inside
    :func:`shared_staging`."""
    kept = _SHARED_STAGING.get()
    if kept is None or np.any((table.kind == BACKWARD) & chosen[table.device]):
        return _fill_idle_base(staged, costs)
    if kept.get("table") is table and kept.get("costs") is costs:
        return kept["base"]
    base = _fill_idle_base(staged, costs)
    kept.update(table=table, costs=costs, base=base)
    return base


def _fill_idle_base(table, costs):
    """What ``_fill_idle_arrays`` reads of the staged ``table`` whichever devices are
    chosen: each op's cell, the cells' lengths and devices, and each data
    dependency's producer and consumer cells with the transfer time it waits
    (read-only arrays)."""
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
    producer_cell = cell[producers].astype(index)
    consumer_cell = cell[consumers].astype(index)
    base = (cell, length, cell_device, producer_cell, consumer_cell, delay)
    for array in base:
        array.flags.writeable = False
    return base


def _fill_idle_arrays(table, costs, chosen, max_deferred, base=None):
    """The arguments of ``tabsched._build.fill_idle`` (before its outputs) for ``_fill_idle``
    (``base``: ``_fill_idle_base(table, costs)`` if the caller has it)."""
    index = np.int32
    cell, length, cell_device, producer_cell, consumer_cell, delay = \
        _fill_idle_base(table, costs) if base is None else base
    num_cells = len(length)
    filler = np.zeros(num_cells, dtype=np.int8)
    is_w = (table.kind == WEIGHT_GRAD) & chosen[table.device]
    filler[cell[is_w]] = 1
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
