"""Microbatch transforms: the same samples cut into smaller or larger microbatches.

Data model
    A microbatch is a share of the iteration's batch (``table.microbatch_sizes``,
    1.0 a full microbatch). :class:`SplitMicrobatches` and :class:`SplitPhases`
    turn one microbatch into ``k`` of ``1/k`` the size, numbered where it stood
    and run back to back where it ran; :class:`MergeMicrobatches` turns groups
    of consecutive microbatches into one of their summed size, run from the
    group's first forward to its last backward. The cost model prices each
    microbatch at its size (:mod:`tabsched.adapt.transforms` says how).

>>> from tabsched.schedules import generate
>>> table = generate("1f1b", devices=2, microbatches=2)
>>> SplitMicrobatches([0], 2).apply(table).microbatch_sizes
(0.5, 0.5, 1.0)
>>> MergeMicrobatches("all", 2).apply(table).microbatch_sizes
(2.0,)
"""

import numpy as np

from tabsched.adapt.transforms import (MemoryEffect, Transform, activations, cell_positions,
                                       check_int, describe_microbatches, ordered_table)
from tabsched.exceptions import InvalidParameterError
from tabsched.table import BACKWARD, FORWARD

__all__ = ["SplitMicrobatches", "SplitPhases", "MergeMicrobatches"]


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
        self.parts = check_int("split factor", parts, 2)

    def _selected(self, table, costs):
        selected = _check_microbatches(table, self.microbatches, self.describe())
        _refuse_slices(table, selected, self.describe())
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
        activation, _ = activations(table, costs)
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
    position = cell_positions(table)
    return ordered_table(table, transform, table.device[source], position[source], part,
                  table.kind[source], table.stage[source],
                  new_first[table.microbatch[source]] + part, sizes,
                  _carried_slices(table, np.repeat(np.arange(M), count)))


def _carried_slices(table, source):
    """The sequence slices of new microbatches made from ``source`` (one old microbatch
    each, never a slice: :func:`_refuse_slices` has checked)."""
    if table.sequence_slices is None:
        return None
    return tuple(table.sequence_slices[m] for m in np.asarray(source).tolist())


def _refuse_slices(table, chosen, what):
    """Refuse splitting or merging a microbatch that is a sequence slice."""
    if table.sequence_slices is None:
        return
    for m in np.asarray(chosen).tolist():
        if table.sequence_slices[m][1] > 1:
            raise InvalidParameterError(f"{what}: microbatch {m} is a sequence slice; split "
                                        f"or merge microbatches before slicing sequences")


class SplitPhases(Transform):
    """Split only the microbatches of the warm-up and cool-down phases.

    The first ``warmup`` microbatches to enter the pipeline (by the slot of
    their first forward on stage 0) and the last ``cooldown`` to leave it (by
    the slot of their last operation) are split into ``parts``; the steady
    state keeps full microbatches. Memory: as :class:`SplitMicrobatches`.
    """

    name = "split-phases"

    def __init__(self, parts=2, warmup=1, cooldown=1):
        self.parts = check_int("split factor", parts, 2)
        self.warmup = check_int("warmup microbatches", warmup, 0)
        self.cooldown = check_int("cooldown microbatches", cooldown, 0)
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
        self.count = check_int("merge count", count, 2)

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
        _refuse_slices(table, np.flatnonzero(group >= 0), self.describe())
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
        position = cell_positions(table)
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
        return ordered_table(table, self, table.device[index], position[index],
                      np.zeros(len(index)), table.kind[index], table.stage[index],
                      new_id[table.microbatch[index]], sizes,
                      _carried_slices(table, np.flatnonzero(leader)))

    def memory_effect(self, table, costs=None):
        group = self._checked(table)
        activation, _ = activations(table, costs)
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
