"""Sequence slices: each microbatch's sequence cut into ``k`` slices (Seq1F1B, SlimPipe).

Data model
    A microbatch of whole sequences becomes ``k`` consecutive microbatches, its
    slices ``0 .. k-1`` (``table.sequence_slices``), each with the microbatch's
    samples and ``s/k`` of its tokens. Seq1F1B (Sun et al. 2024, "Seq1F1B: Efficient
    Sequence-Level Pipeline Parallelism for Large Language Model Training", arXiv
    2406.03488, section 3.1) states the dependencies of slice ``i`` on a stage:

    * its forward needs the forward of slice ``i-1`` on that stage (its causal
      attention reads the keys and values slices ``0 .. i-1`` left there) and, as
      any forward, its own forward on the stage before;
    * its backward needs the backward of slice ``i+1`` on that stage (the gradients
      of its keys and values come back from the later slices' attention over them)
      and, as any backward, its own backward on the stage after.

    So a stage runs one sequence's slices on one device, forwards in slice order and
    backwards in reverse slice order; :class:`~tabsched.table.ScheduleTable` refuses
    a table that does not, and the row order is then the dependency.

    Costs: the cost model prices slice ``i`` as its view of the model
    (:meth:`tabsched.costs.ModelCosts.slice_view`): linear layers, norms, the
    embedding and the output layer on ``s/k`` tokens, the attention of ``s/k``
    queries over ``(i+1) s/k`` keys; memory likewise (see
    :meth:`~tabsched.costs.ModelCosts.activation_sizes`). A model without a sequence
    (slot lengths) refuses slices.

    Partition: slices are equal in tokens by default (``partition="even"``), so later
    slices cost more (their attention meets more keys). ``partition="compute"`` cuts
    by Seq1F1B's computation-wise partition (section 3.3): bounds giving each slice
    the same FLOPs, earlier slices longer (:func:`tabsched.costs.transformer.slice_bounds`;
    the table records it as ``slice_partition``).

>>> from tabsched.costs import ModelCosts
>>> from tabsched.schedules import generate
>>> costs = ModelCosts("llama3-8b", "dgx-h100")
>>> table = generate("1f1b", devices=2, microbatches=2)
>>> sliced = SplitSequence(2).apply(table, costs)
>>> sliced.sequence_slices
((0, 2), (1, 2), (0, 2), (1, 2))
>>> [str(op) for op in sliced.orders()[1]]      # a lead of k slices, then one B, one F
['1F0', '1F1', '1B1', '1F2', '1B0', '1F3', '1B3', '1B2']
"""

import numpy as np

from tabsched.adapt.transforms import (MemoryEffect, Transform, activations, cell_positions,
                                       check_int, ordered_table)
from tabsched.exceptions import InvalidParameterError
from tabsched.costs.transformer import slice_bounds
from tabsched.table import FORWARD, SLICE_PARTITIONS, WEIGHT_GRAD

__all__ = ["SplitSequence", "LEADS", "leads_agree"]

#: How far a device's forward slices run ahead of its backward slices: ``seq1f1b`` a lead
#: of ``L - 1 + k`` slices where the unsliced row led by ``L`` microbatches (Seq1F1B's
#: warm-up, the least memory), ``kept`` ``max(L - 1 + k, (L - 1) k + 1)`` slices (the
#: unsliced row's lead at slice grain: about its memory; ``L`` for ``k = 1``).
LEADS = ("seq1f1b", "kept")


class SplitSequence(Transform):
    """Cut every microbatch's sequence into ``slices`` slices, interleaved at slice grain.

    Every operation becomes its ``k`` slices (forwards in slice order, backwards in
    reverse), and each device's row is interleaved again at slice grain: where the
    device ran its ``j``-th backward with ``f_j`` forwards before it (a lead of
    ``L = f_j - j`` microbatches), its backward slices run with a lead of ``L - 1 + k``
    slices (so 1F1B, lead ``p - d``, becomes Seq1F1B's sliced 1F1B: device ``d`` warms
    up with ``p - d - 1 + k - 1`` forward slices, then alternates at slice grain), with
    forward slices at most one microbatch ahead of where the unsliced row ran them, and
    never before their own sequence's forwards on the device. ``k = 1`` is the table
    itself. With ``lead="kept"`` the lead is ``max(L - 1 + k, (L - 1) k + 1)`` slices.

    Memory: every slice a device holds at any moment belongs to a microbatch the
    unsliced row held at the matching moment or to the one after it, and a microbatch's
    slices hold at most its activations together (``s/k`` tokens each; scores
    ``s/k x (i+1) s/k``), so a device's peak rises by at most one microbatch's
    activations on it (where the lead was one microbatch, the last stages); it falls
    where the lead was longer.

    Parameters
    ----------
    slices : int
        ``k >= 1``; with ``even`` it must divide the model's sequence, with ``compute``
        the sequence must hold ``k`` FlashAttention tiles (128 tokens).
    lead : {"seq1f1b", "kept"}
        How far forward slices run ahead (:data:`LEADS`). Equal slices cost more the
        later they are (their attention meets more keys), and under ``seq1f1b``'s short
        lead the uneven slices can leave more idle time than they remove; ``kept``
        keeps the lead long enough to absorb them.
    partition : {"even", "compute"}
        Equal tokens, or Seq1F1B's computation-wise partition (section 3.3): equal
        FLOPs per slice (:func:`~tabsched.costs.transformer.slice_bounds`).

    Raises
    ------
    InvalidParameterError
        For ``k`` that is not an integer >= 1, that does not divide the sequence (or,
        with ``compute``, cannot give each slice a tile), an unknown partition, a cost
        model without a sequence, a table with overlapped cells, or one sliced
        already.
    """

    name = "split-sequence"

    def __init__(self, slices=2, lead="seq1f1b", partition="even"):
        self.slices = check_int("sequence slices", slices, 1)
        if lead not in LEADS:
            raise InvalidParameterError(f"split-sequence: lead must be one of "
                                        f"{', '.join(LEADS)}, not {lead!r}")
        if not isinstance(partition, str) or partition not in SLICE_PARTITIONS:
            raise InvalidParameterError(f"split-sequence: partition must be one of "
                                        f"{', '.join(SLICE_PARTITIONS)}, not {partition!r}")
        self.lead = lead
        self.partition = partition

    def _check(self, table, costs):
        if costs is None or not hasattr(costs, "slice_view"):
            raise InvalidParameterError(
                f"{self.describe()}: sequence slices need a model with a sequence (ModelCosts: "
                f"--model and --system), not {type(costs).__name__ if costs else 'slot lengths'}")
        sequence = costs.model.sequence
        if self.partition == "even" and sequence % self.slices:
            raise InvalidParameterError(
                f"sequence slices {self.slices} do not divide model {costs.model.name}'s "
                f"sequence {sequence} (a slice must hold whole tokens)")
        if self.slices > 1:
            slice_bounds(costs.model, self.slices, self.partition)
            costs.slice_view(self.slices - 1, self.slices, self.partition)   # what it refuses
        if table.sequence_slices is not None:
            raise InvalidParameterError(f"{self.describe()}: the table's sequences are "
                                        f"sliced already")
        solo = table.cell_starts()
        if not np.all(solo & np.append(solo[1:], True)):
            raise InvalidParameterError(f"{self.describe()}: the table has overlapped cells; "
                                        f"slicing them is not supported")

    def apply(self, table, costs=None):
        self._check(table, costs)
        k = self.slices
        M = table.num_microbatches
        position = cell_positions(table)
        device_of = table.device.astype(np.int64)
        primary = np.empty(len(table) * k, dtype=np.int64)
        source = np.repeat(np.arange(len(table)), k)
        part = np.tile(np.arange(k), len(table))
        forward = table.kind == FORWARD
        stages_on = np.zeros(table.num_devices, dtype=np.int64)
        pairs = np.unique(np.stack([device_of, table.stage.astype(np.int64)]), axis=1)
        np.add.at(stages_on, pairs[0], 1)
        for d in range(table.num_devices):
            one_stage = stages_on[d] == 1
            ops = np.flatnonzero(device_of == d)          # in row order (sorted by slot)
            ops = ops[np.argsort(position[ops], kind="stable")]
            is_f = forward[ops]
            f_before = np.cumsum(is_f) - is_f              # forwards before each op
            # the forward of each backward's (stage, microbatch) on this device
            f_index = {}
            for n, op in enumerate(ops[is_f].tolist()):
                f_index[int(table.stage[op]), int(table.microbatch[op])] = n
            total = int(is_f.sum())
            done = 0                                       # backward slices before
            floor = 0
            weight = table.kind[ops] == WEIGHT_GRAD
            # a W needs only its own I: its slices go after the device's last backward
            # slices before it (reverse slice order, as the I's)
            anchor_of = {}
            backward_ops = ops[~is_f & ~weight]
            lead = None
            for j, op in enumerate(backward_ops.tolist()):
                f_j = int(f_before[~is_f & ~weight][j])
                own = f_index.get((int(table.stage[op]), int(table.microbatch[op])), -1) + 1
                if lead is None or f_j < total or not one_stage:
                    # on a device of one stage, a lead that falls only because the row's
                    # forwards ran out (1F1B's cool-down) is kept: its last microbatches'
                    # later slices still come, and one backward slice follows each of them
                    # (Seq1F1B's steady state; shrinking it ran two backward slices per
                    # forward there and starved the stages below). Leads fall from each
                    # device to the next, so the kept ones order every device alike; with
                    # several stages a device (interleaved) keeps the row's own lead
                    lead = f_j - j - 1 + k                 # Seq1F1B's: L - 1 + k slices
                    if self.lead == "kept":                # (L - 1) k + 1: the row's, at slice grain
                        lead = max(lead, (f_j - j - 1) * k + 1)
                ahead = min(f_j + 1, total) * k      # one microbatch ahead at most
                for r in range(k):
                    target = min(max(done + r + lead, own * k), ahead)
                    floor = max(floor, target)
                    primary[op * k + r] = 2 * floor - 1
                anchor_of[op] = 2 * floor - 1
                done += k
            for n, op in enumerate(ops[is_f].tolist()):
                primary[op * k: op * k + k] = 2 * (n * k + np.arange(k))
            last = -1
            for row, op in enumerate(ops.tolist()):
                if op in anchor_of:
                    last = anchor_of[op]
                elif table.kind[op] == WEIGHT_GRAD:
                    # after its own I's slices, and after the forwards it followed
                    primary[op * k: op * k + k] = max(last, 2 * int(f_before[row]) * k - 1)
        kind = table.kind[source]
        backward = kind != FORWARD
        slice_index = np.where(backward, k - 1 - part, part)
        microbatch = table.microbatch[source].astype(np.int64) * k + slice_index
        # equal primaries (backward slices placed after the same forward slice) keep the
        # row order, and one backward's slices their reverse slice order
        secondary = np.arange(len(source))
        sizes = np.repeat(np.asarray(table.microbatch_sizes, dtype=np.float64), k)
        slices = None if k == 1 else tuple((i, k) for _ in range(M) for i in range(k))
        return ordered_table(table, self, table.device[source], primary, secondary, kind,
                             table.stage[source], microbatch, sizes, slices,
                             self.partition if k > 1 else "even")

    def memory_effect(self, table, costs=None):
        self._check(table, costs)
        activation, _ = activations(table, costs)
        forward = table.kind == FORWARD
        held = np.bincount(table.device[forward], weights=activation[forward],
                           minlength=table.num_devices)
        largest = np.zeros(table.num_devices)
        np.maximum.at(largest, table.device[forward], activation[forward])
        return MemoryEffect(lower=-held, upper=largest,
                            statement="slicing sequences raises a device's peak by at most one "
                                      "microbatch's activations (its slices run at most one "
                                      "microbatch ahead of the unsliced row)")

    def describe(self):
        lead = "" if self.lead == "seq1f1b" else f",lead={self.lead}"
        partition = "" if self.partition == "even" else f",partition={self.partition}"
        return f"split-sequence(k={self.slices}{lead}{partition})"

    def to_dict(self):
        return {"transform": self.name, "slices": self.slices, "lead": self.lead,
                "partition": self.partition}


def leads_agree(table):
    """Whether :class:`SplitSequence`'s two leads cut ``table`` into the same rows, at
    every slice count: where every backward (``B`` or ``I``) of every device runs with a
    lead ``L`` of at most two microbatches, ``max(L - 1 + k, (L - 1) k + 1) = L - 1 + k``,
    so ``kept`` places every slice where ``seq1f1b`` does (the plan then searches one).

    >>> from tabsched.schedules import generate
    >>> leads_agree(generate("1f1b", devices=2, microbatches=4))
    True
    >>> leads_agree(generate("1f1b", devices=4, microbatches=8))
    False
    """
    position = cell_positions(table)
    forward = table.kind == FORWARD
    chained = ~forward & (table.kind != WEIGHT_GRAD)
    for d in range(table.num_devices):
        ops = np.flatnonzero(table.device == d)
        ops = ops[np.argsort(position[ops], kind="stable")]
        is_f = forward[ops]
        f_before = (np.cumsum(is_f) - is_f)[chained[ops]]
        if len(f_before) and (f_before - np.arange(len(f_before))).max() > 2:
            return False
    return True
