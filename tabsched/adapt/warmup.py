"""Warm-up depth: how many forwards a device runs ahead of its backwards.

Data model
    In a device's row, the warm-up depth is the number of forward cells before
    its first other cell (:func:`warmup_depths`); more generally each
    non-forward cell (``B``, ``I``, ``W``, an overlap) has a count of forwards
    before it. :class:`Warmup` shifts those counts by ``delta`` on the chosen
    devices: one more (or fewer) microbatch in flight, slack that absorbs a late
    input at the price of one more activation.

>>> from tabsched.schedules import generate
>>> table = generate("1f1b", devices=2, microbatches=2)
>>> [str(op) for op in Warmup([1], 1).apply(table).orders()[1]]
['1F0', '1F1', '1B0', '1B1']
"""

import numpy as np

from tabsched.adapt.transforms import (MemoryEffect, Transform, activations, cell_positions,
                                       check_int, describe_microbatches, largest_sum,
                                       ordered_table)
from tabsched.exceptions import InvalidParameterError
from tabsched.table import BACKWARD, FORWARD, INPUT_GRAD

__all__ = ["Warmup", "warmup_depths"]


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
            self.devices = (check_int("warmup device", devices, 0),)
        else:
            self.devices = tuple(sorted({check_int("warmup device", d, 0) for d in devices}))
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
        position = cell_positions(table)
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
                # (the forward cells' pairs and ranks, the last one where a pair repeats;
                # each other cell needs one more than the rank of its ops' own forwards)
                in_forward = is_forward_cell[local]
                pairs, last = np.unique(pair[in_forward][::-1], return_index=True)
                ranks = rank[local[in_forward]][::-1][last]
                behind = np.flatnonzero(~in_forward & (table.kind[ops] != FORWARD))
                at = np.minimum(np.searchsorted(pairs, pair[behind]), max(len(pairs) - 1, 0))
                found = (pairs[at] == pair[behind]) if len(pairs) else \
                    np.zeros(len(behind), dtype=bool)
                need = np.zeros(local[-1] + 1, dtype=np.int64)
                np.maximum.at(need, local[behind[found]], ranks[at[found]] + 1)
                after = np.maximum(np.minimum(before + self.delta, forwards),
                                   np.maximum.accumulate(need[others]))
            key = np.empty(local[-1] + 1, dtype=np.int64)
            key[is_forward_cell] = 2 * rank[is_forward_cell] + 1
            key[others] = 2 * after
            primary[lo:hi] = key[local]
        return ordered_table(table, self, table.device, primary, position, table.kind, table.stage,
                      table.microbatch, table.microbatch_sizes)

    def memory_effect(self, table, costs=None):
        activation, _ = activations(table, costs)
        lower = np.zeros(table.num_devices)
        upper = np.zeros(table.num_devices)
        for d in self._devices(table):
            forward = (table.device == d) & (table.kind == FORWARD)
            moved = largest_sum(activation[forward], abs(self.delta))
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
