"""Lower bounds on a configuration's iteration time and peak memory, from its sizes.

Nothing here builds a schedule table: a layout (:mod:`tabsched.plan.space`) says
which device holds which stage and how many layers each stage has; a **run group**
(one split's tensor degree, sequence parallelism, recompute and microbatch size)
says what one microbatch of a layer, of the embedding and of the output layer
costs and holds (the cost model's own numbers). The bounds of every run group of a
layout come out of a few numpy operations.

Time
----
Write ``F_s``, ``B_s``, ``I_s``, ``W_s`` for what one microbatch costs on stage
``s`` per kind, ``X_s`` for its backward chain's part (``B_s`` or ``I_s``, the
smaller where the family runs both), ``n_k[d, s]`` for the operations of kind ``k``
of stage ``s`` that device ``d`` runs per microbatch, and ``M`` for the microbatch
count. What the lowering guarantees (:mod:`tabsched.lower`): a device runs its row
one operation at a time; ``F(s, m)`` needs ``F(s-1, m)``; ``B(s, m)`` or ``I(s, m)``
needs ``F(s, m)`` and the backward of ``(s+1, m)``; ``W(s, m)`` needs ``I(s, m)``;
every transfer, sync and optimizer step takes >= 0; the makespan is at least every
operation's end. So, with

* ``a_s = sum_{s' < s} F_s'``: no operation of stage ``s`` starts before ``a_s``
  (its forward's chain);
* ``c_s = sum_all F + sum_{s' > s} X_s'``: no backward operation of stage ``s``
  starts before ``c_s`` (the last stage's forward, then the backward chain back);
* ``e_s = sum_{s' < s} X_s'``: after ``B(s, m)`` ends, ``B(s-1, m) ... B(0, m)``
  still run, one after another,

every device ``d`` gives two bounds. Its first operation starts at or after
``min_{s on d} a_s`` and it is then busy for ``busy_d = M sum_s (n_F[d, s] F_s +
(n_B + n_I)[d, s] Y_s)``, ``Y_s`` the cheaper of ``B_s`` and ``I_s + W_s`` among
those the family runs on stage ``s`` (each microbatch of a stage runs one ``B`` or
one ``I`` and one ``W``; DualPipe mixes them, in a share that changes with ``M``),
so its last operation ends at or after ``min a + busy_d``. Its last
operation is a backward of a stage it holds (every forward is followed on the same
device by its backward). Where the device runs no ``W`` it is a ``B(s, m)``, and
none of the chain ``B(s-1, m) .. B(0, m)`` can run on ``d`` (it would follow ``d``'s
last operation), so ``T >= min a + busy_d + min_{s on d} e_s``; a ``W`` may be last
with nothing after it, and then the tail term is 0. Likewise the device's backward
work (its B, I and W) all starts at or after ``min_{s on d} c_s``:
``T >= min c + backward_d + tail_d``. The device's end-of-iteration step (its
optimizer update, the data-parallel reduction when not overlapped, the tied
embedding's all-reduce) waits for its last cell, so ``tail_d`` is at least the
step's price too (:func:`step_seconds`). The bound is the largest over devices and
both forms; for 1F1B with equal stages it is exactly ``(M + p - 1)(F + B)``, the
flush pipeline's makespan without communication, and ``(M + (p-1)/v)(F + B)`` for
the interleaved schedule. A fused cell (DualPipe's overlapped pairs) lasts at least
a fraction of the sum of its parts (:func:`pair_floor`: its busier stream under the
two-stream model, at least half), and that floor scales the busy times and chains of
layouts with fused cells.

Memory
------
A device holds its persistent bytes (weights, gradients, optimizer state: its
stages' parameters over ``t`` times the bytes per parameter, the optimizer state
over ``d`` with ZeRO-1) all the time; a stage's activation from the start of its
forward to the end of its backward (an ``I`` frees the fraction ``r`` of it, the
``W`` the rest); a backward's working memory while it runs. So each device's peak
is at least

* ``max_{s on d} (act_s + transient_s)``: while any backward of stage ``s`` runs,
  its activation is still held whole and its working memory is live;
* ``(1 - r) c_d min_{s on d} act_s``, ``c_d`` the formula level's activation peak
  of the family (:data:`FORMULA_PEAKS` says where it bounds each device, only the
  fullest one, or nothing). Which activations a device holds at a moment is decided
  by its row's order alone (one operation at a time, each holding from its start to
  its end), whatever the durations; the formula's count is at most the table
  level's peak, where an ``I`` frees nothing (``UnitCosts``), so at that moment at
  least ``c_d`` activations are held, none below ``1 - r`` of its size;
* ``w_d min_{s on d} act_s`` plus the least working memory of its stages, where
  the order is known to run ``w_d`` forwards before its first backward
  (:data:`WARMUP_FORWARDS`): while that backward runs, nothing has been freed yet;

plus its persistent bytes. A configuration whose bound exceeds the budget on some
device cannot fit: its simulated peak is at least the bound.
``tests/test_plan_bounds.py`` checks the formula counts against the table level and
both bounds against simulated tables of every family on random configurations.

Sequence slices
---------------
A sliced layout (``k`` slices per microbatch, :class:`tabsched.adapt.SplitSequence`)
runs each microbatch's operations as ``k`` operations, slice ``i`` priced by its view
(``s/k`` tokens, attention over ``(i+1) s/k`` keys). The time proof holds operation by
operation, so it holds with ``busy_d`` and ``backward_d`` summed over every slice
(:meth:`RunGroups.over_slices`: ``parts``) and each chain term (``a_s``, ``c_s``,
``e_s``: one operation per stage) at the cheapest slice (``least``). For memory, the
backward of slice ``k-1`` of a microbatch on a stage runs before those of slices
``0 .. k-2`` (reverse slice order) and after all their forwards (slice order, one
device), so while it runs the stage holds every slice's activation whole: the bound
takes the slices' activations summed, and the least working memory of any slice.
The formula counts and warm-up forwards state unsliced orders and are left out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tabsched._memo import memo
from tabsched.costs import ModelCosts
from tabsched.formulas import FORMULAS
from tabsched.lower import lower
from tabsched.nodes import OPTIMIZER
from tabsched.plan.space import layout_of, probe_table
from tabsched.table import BACKWARD, FORWARD, INPUT_GRAD, WEIGHT_GRAD

__all__ = ["RunGroups", "LayoutArrays", "time_bounds", "memory_bounds", "formula_counts",
           "FORMULA_PEAKS", "WARMUP_FORWARDS", "bound_costs", "step_seconds"]

#: Where the formula level's activation peak bounds a device's table-level peak, per
#: family: "device" (every device's), "largest" (only the fullest device's: V-Half and
#: V-Min state the largest device's peak), "low" (the low end of the stated per-worker
#: range, Chimera's [D/2+1, D]), with the condition the family's entry states for it
#: (ZB-V: once M >= 2p - 1; Hanayo's range: one wave). Families not named (zb-auto,
#: zbv-auto, bitpipe: no count published) get the other bounds only.
FORMULA_PEAKS = {
    "gpipe": ("device", None), "1f1b": ("device", None),
    "interleaved-1f1b": ("device", None), "looped-bfs": ("device", None),
    "zb-h1": ("device", None), "zb-h2": ("device", None),
    "zbv": ("device", lambda params, p, m: m >= 2 * p - 1),
    "dualpipe": ("device", None), "dualpipev": ("device", None),
    "v-half": ("largest", None), "v-min": ("largest", None), "chimera": ("low", None),
    "hanayo": ("low", lambda params, p, m: dict(params).get("waves", 1) == 1),
}


def _zero_bubble_warmup(factor):
    """ZB-H1 (``factor`` 1) and ZB-H2 (2): device ``r`` runs ``min(factor (p-r-1), M)``
    warm-up forwards and one more before its first ``I``
    (``schedules/zb_handcrafted.py``, ``device_columns``)."""
    def forwards(params, p, m):
        return [min(factor * (p - r - 1) + 1, m) for r in range(p)]
    return forwards


def _zbv_warmup(params, p, m):
    """ZB-V: device ``r`` runs ``2(p-r)-1`` forwards of chunk 0, ``r`` pairs (chunk 1,
    chunk 0), then a forward of chunk 1 before its first ``I``, microbatches past ``M``
    dropped (``schedules/zbv.py``, ``device_columns``)."""
    return [min(2 * p - r - 1, m) + min(r + 1, m) for r in range(p)]


def _hanayo_warmup(params, p, m):
    """Hanayo: device ``r`` runs ``k = min(P-r, M)`` warm-up forwards, then each step of
    its forward phase a forward of an up chunk and the next pending down forward until
    the ``W M`` down forwards are done, then the up forward before its first backward:
    ``2 W M - k + 1`` (``schedules/hanayo.py``, ``build``)."""
    waves = dict(params).get("waves", 1)
    return [2 * waves * m - min(p - r, m) + 1 for r in range(p)]


#: Forwards each device runs before its first backward, all held whole at that moment,
#: where a family's order states them: the split-backward families whose formula count
#: includes partly freed activations, and Hanayo, whose formula states nothing for M != P.
WARMUP_FORWARDS = {"zb-h1": _zero_bubble_warmup(1), "zb-h2": _zero_bubble_warmup(2),
                   "zbv": _zbv_warmup, "hanayo": _hanayo_warmup}

#: Times the formula functions are called with for their counts (the counts do not
#: depend on them; the functions take them for the bubble).
_UNIT_TIMES = {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0, "comm": 0.0, "overlap": 1.0,
               "uniform_stages": True, "uniform_comm": True}


def bound_costs(model, system, execution):
    """The cost model the bounds read one microbatch's costs from: ``execution`` with
    one replica. The layers' kernels and collectives run over the tensor group only,
    which sits on the same links whatever the data degree, so every data degree gives
    the same per-operation numbers (``tests/test_plan_bounds.py`` pins it)."""
    return _one_replica(model, system, execution.replace(
        data_parallel=execution.expert_parallel, zero_stage=0, global_batch=None))


@memo(limit=4096)
def _one_replica(model, system, execution):
    return ModelCosts(model, system, execution)


class RunGroups:
    """The run groups of one split, as arrays over ``g``: what one microbatch of a
    layer, of the embedding and of the output layer costs (``parts[part]``, ``G x 4``
    seconds by kind F, B, I, W) and holds (``activation[part]``, ``G`` bytes; the
    layer's backward working memory ``transient``), and the microbatch counts ``M``.
    """

    def __init__(self, cost_models, microbatches):
        self.cost_models = list(cost_models)
        self.microbatches = np.asarray(microbatches, dtype=np.float64)
        parts = {"layer": [], "embedding": [], "output": []}
        activation = {"layer": [], "embedding": [], "output": []}
        transient = []
        for costs in self.cost_models:
            samples = np.array([float(costs.model.microbatch_size)])
            times = costs.part_times(samples)
            for part in parts:
                parts[part].append(np.asarray(times[part], dtype=np.float64)[:, 0])
            model, run = costs.model, costs.execution
            activation["layer"].append(float(np.asarray(
                model.layer_activation(samples, parallel=run), dtype=np.float64)[0]))
            activation["embedding"].append(float(np.asarray(
                model.embedding_activation(samples, run), dtype=np.float64)[0]))
            activation["output"].append(float(np.asarray(
                model.output_activation(samples, run), dtype=np.float64)[0]))
            transient.append(float(np.asarray(model.layer_transient(samples, run))[0]))
        shape = (len(self.cost_models), 4)
        self.parts = {part: np.array(values, dtype=np.float64).reshape(shape)
                      for part, values in parts.items()}
        self.activation = {part: np.array(values, dtype=np.float64)
                           for part, values in activation.items()}
        self.transient = np.array(transient, dtype=np.float64)
        #: The part of an activation an ``I`` frees, per run group.
        self.release = np.array([float(costs.input_grad_release)
                                 for costs in self.cost_models], dtype=np.float64)
        #: The least an overlapped cell can take of its operations' sum, per run group
        #: (:func:`pair_floor`).
        self.pair_floor = np.array([pair_floor(costs) for costs in self.cost_models],
                                   dtype=np.float64)
        #: What the chains of :func:`time_bounds` take per part (``G x 4``): None, the
        #: parts themselves; for sequence slices the least any slice costs.
        self.least = None

    @classmethod
    def over_slices(cls, groups, slices, partition="even"):
        """The run groups of ``groups`` with every sequence cut into ``slices`` slices:
        per microbatch, what its ``k`` slices cost together (``parts``, the busy time) and
        hold together (``activation``), and the least any one slice costs (``least``, the
        chains) and needs while its backward runs (``transient``); each slice priced by its
        view (:meth:`~tabsched.costs.ModelCosts.slice_view`). See :func:`memory_bounds`
        for why the slices' activations are held together."""
        views = [cls([costs.slice_view(index, slices, partition)
                      for costs in groups.cost_models],
                     groups.microbatches) for index in range(slices)]
        sliced = cls.__new__(cls)
        sliced.cost_models = groups.cost_models
        sliced.microbatches = groups.microbatches
        sliced.parts = {part: sum(view.parts[part] for view in views) for part in groups.parts}
        sliced.least = {part: np.minimum.reduce([view.parts[part] for view in views])
                        for part in groups.parts}
        sliced.activation = {part: sum(view.activation[part] for view in views)
                             for part in groups.activation}
        sliced.transient = np.minimum.reduce([view.transient for view in views])
        sliced.release = np.minimum.reduce([view.release for view in views])
        sliced.pair_floor = np.minimum.reduce([view.pair_floor for view in views])
        return sliced

    def __len__(self):
        return len(self.cost_models)


def pair_floor(costs):
    """The least fraction of its operations' sum an overlapped cell lasts under ``costs``'
    two-stream model (:mod:`tabsched.costs.streams`): a cell lasts at least its busier
    stream, ``max(C, A) >= max(x, 1 - x) (C + A)`` with ``x = C / (C + A)`` its compute
    share, and a cell's share lies between the least and the largest share of any part
    and kind of operation (a stage's operation sums parts, a cell two operations), so the
    floor is ``max(x, 1 - x)`` at the end of that range nearer 1/2 (1/2 if it holds 1/2);
    1.0 under a constant ``overlap`` of 1 or more."""
    if getattr(costs, "overlap_factor", 1.0) is not None:
        return min(1.0, float(costs.overlap))
    from tabsched.costs.model_work import part_kernel_seconds
    samples = (float(costs.model.microbatch_size),)
    shares = []
    for kinds in part_kernel_seconds(costs.model, costs.system, costs.placement,
                                     samples).values():
        for seconds, communication in kinds.values():
            total = float(seconds[:, 0].sum())
            if total > 0:
                shares.append(float(seconds[~communication, 0].sum()) / total)
    if not shares:
        return 1.0
    low, high = min(shares), max(shares)
    if low <= 0.5 <= high:
        return 0.5
    return min(max(low, 1 - low), max(high, 1 - high))


@dataclass(frozen=True)
class LayoutArrays:
    """A layout as arrays: layers per stage, the embedding and output masks, which
    device holds each stage (``holds``, ``D x S``), the operations of each kind per
    microbatch each device runs of each stage (``work``, ``4 x D x S``), and each
    stage's parameters (all tensor ranks together)."""

    layers: np.ndarray
    first: np.ndarray
    last: np.ndarray
    holds: np.ndarray
    work: np.ndarray
    stage_parameters: np.ndarray
    #: ``(dense, experts)`` parameters of each stage one GPU holds.
    rank_parameters: tuple = ()
    #: Whether the layout's tables hold overlapped cells (DualPipe's fused pairs).
    overlapped: bool = False

    @property
    def split_backward(self):
        """Whether the family runs input-grad operations (an ``I`` frees part of an
        activation, the ``W`` the rest)."""
        return bool(self.work[INPUT_GRAD].any())

    @classmethod
    def of(cls, layout, costs):
        holds, work = layout_of(layout)
        S = layout.stages
        shape = _Shape(S, layout.stage_layers)
        layers = np.asarray(costs.stage_layers(shape), dtype=np.float64)
        first, last = np.zeros(S), np.zeros(S)
        first[0] = last[-1] = 1.0
        probe = probe_table(layout)
        return cls(layers, first, last, holds, work,
                   np.asarray(costs.stage_parameters(shape), dtype=np.float64),
                   tuple(np.asarray(part, dtype=np.float64)
                         for part in costs._stage_rank_parameters(shape)),
                   bool(len(probe) and not probe.cell_starts().all()))

    def device_parameters(self):
        """Parameters each device holds (every stage it holds counted once)."""
        return self.holds.astype(np.float64) @ self.stage_parameters

    def device_rank_parameters(self):
        """``(dense, experts)`` parameters one GPU of each device holds."""
        return tuple(self.holds.astype(np.float64) @ part for part in self.rank_parameters)


class _Shape:
    """What a cost model reads of a table to price one microbatch: its stage count and
    layer split (so that the bounds price stages without a table)."""

    def __init__(self, num_stages, stage_layers):
        self.num_stages, self.stage_layers = num_stages, stage_layers


def _per_stage(arrays, per_part):
    """``per_part[part]`` (``G x ...``) summed over a stage's parts: ``G x ... x S``."""
    layer, embedding, output = (np.asarray(per_part[part])[..., None]
                                for part in ("layer", "embedding", "output"))
    return arrays.layers * layer + arrays.first * embedding + arrays.last * output


def _masked(values, holds, reduce, empty):
    """``reduce`` over the stages each device holds: ``G x S`` values -> ``G x D``."""
    spread = np.where(holds[None, :, :], values[:, None, :], empty)
    return reduce(spread, axis=2)


@memo(limit=1024)
def _probe_lowering(layout):
    return lower(probe_table(layout), optimizer=True)


def step_seconds(layout, costs):
    """Each device's end-of-iteration step under ``costs`` (seconds, ``D``): the data-
    parallel gradient reduction when it is not overlapped, the tied embedding's
    all-reduce, the optimizer update and, with ZeRO-1, the all-gather of the updated
    parameters, priced by the cost model on the layout's probe table (they depend on the
    placement and the layer split, not on the microbatches); zeros without the step."""
    if not costs.optimizer_step:
        return np.zeros(layout.devices)
    return np.asarray(costs.node_prices(_probe_lowering(layout), OPTIMIZER), dtype=np.float64)


def time_bounds(arrays, groups, overlap=None, step=None):
    """Lower bounds on the makespan of a layout for every run group (``G`` seconds);
    ``step``: each device's end-of-iteration step (``D`` seconds, :func:`step_seconds`);
    ``overlap``: the least factor on an overlapped cell (default: each run group's
    :func:`pair_floor` where the layout has overlapped cells). See the module docstring
    for the proof."""
    durations = _per_stage(arrays, groups.parts)        # G x 4 x S
    # the chains: one operation of each stage (with sequence slices, the cheapest slice's)
    least = durations if groups.least is None else _per_stage(arrays, groups.least)
    work = arrays.work                                  # 4 x D x S
    if overlap is None:
        overlap = groups.pair_floor if arrays.overlapped else 1.0
    # an operation in a cell of two ends no sooner than the floor of its own duration
    # after the cell starts: the floor scales every duration, in the chains too
    scale = np.minimum(1.0, np.asarray(overlap, dtype=np.float64))
    if np.any(scale < 1.0):
        durations = durations * (scale[:, None, None] if scale.ndim else scale)
        least = least * (scale[:, None, None] if scale.ndim else scale)
    M = groups.microbatches[:, None]
    forward = durations[:, FORWARD]
    runs = work.sum(axis=1) > 0                                          # 4 x S
    # each (stage, microbatch) runs one B or one I + W: the cheaper of those its stage runs
    whole = np.where(runs[BACKWARD], durations[:, BACKWARD], np.inf)
    split = np.where(runs[INPUT_GRAD], durations[:, INPUT_GRAD] + durations[:, WEIGHT_GRAD],
                     np.inf)
    backward = np.minimum(whole, split)
    backward = np.where(np.isfinite(backward), backward, 0.0)           # G x S
    backwards = work[BACKWARD] + work[INPUT_GRAD]                        # D x S
    backward_work = M * (backward @ backwards.T)                         # G x D
    busy = M * (forward @ work[FORWARD].T) + backward_work
    chain = np.minimum(np.where(runs[BACKWARD], least[:, BACKWARD], np.inf),
                       np.where(runs[INPUT_GRAD], least[:, INPUT_GRAD], np.inf))
    chain = np.where(np.isfinite(chain), chain, 0.0)
    forward_chain = least[:, FORWARD]
    before = np.cumsum(forward_chain, axis=1) - forward_chain           # a_s
    first_start = _masked(before, arrays.holds, np.min, np.inf)
    after = chain.sum(axis=1)[:, None] - np.cumsum(chain, axis=1)        # sum over s' > s
    backward_start = forward_chain.sum(axis=1)[:, None] + after         # c_s
    first_backward = _masked(backward_start, arrays.holds, np.min, np.inf)
    tail = _masked(np.cumsum(chain, axis=1) - chain, arrays.holds, np.min, np.inf)
    tail = np.where(work[WEIGHT_GRAD].sum(axis=1)[None, :] > 0, 0.0, tail)
    if step is not None:
        tail = np.maximum(tail, np.asarray(step, dtype=np.float64)[None, :])
    bound = np.maximum(first_start + busy, first_backward + backward_work) + tail
    return np.where(np.isfinite(bound), bound, 0.0).max(axis=1)


@memo(limit=8192)
def formula_counts(family, params, devices, microbatches):
    """``(kind, counts, warmup)``: the formula level's activations held at once
    (``kind`` "device": one count per device; "largest": one count, the fullest
    device's; None: no count bound) and the forwards before the first backward per
    device (or None)."""
    warmup = WARMUP_FORWARDS.get(family)
    warmup = (None if warmup is None else
              tuple(float(count) for count in warmup(params, devices, microbatches)))
    kind, condition = FORMULA_PEAKS.get(family, (None, None))
    function = FORMULAS.get(family)
    if kind is None or function is None or (
            condition is not None and not condition(params, devices, microbatches)):
        return None, None, warmup
    numbers = function(dict(params, devices=devices, microbatches=microbatches), _UNIT_TIMES)
    if kind == "low":
        bounds = numbers.get("peak_activation_bounds")
        if bounds is None:
            return None, None, warmup
        return "device", (float(bounds[0]),) * devices, warmup
    peaks = numbers.get("peak_activation")
    if peaks is None:
        return None, None, warmup
    if kind == "largest":
        return "largest", (float(max(peaks)),), warmup
    return "device", tuple(float(peak) for peak in peaks), warmup


def memory_bounds(arrays, groups, counts, persistent):
    """Lower bounds on the fullest device's total memory (``G x Z`` bytes).

    ``counts``: ``(kind, G x D or G x 1 counts, G x D warm-up forwards or None)``
    from :func:`formula_counts` per run group; ``persistent``: ``Z x D`` persistent
    bytes (one row per ZeRO choice). See the module docstring for the proof.
    """
    activation = _per_stage(arrays, groups.activation)                  # G x S
    transient = np.where(arrays.layers > 0, groups.transient[:, None], 0.0)
    held = _masked(activation + transient, arrays.holds, np.max, 0.0)
    smallest = _masked(activation, arrays.holds, np.min, np.inf)
    smallest = np.where(np.isfinite(smallest), smallest, 0.0)
    release = groups.release if arrays.split_backward else np.zeros(len(groups))
    whole = (1.0 - release)[:, None]
    kind, count, warmup = counts
    if kind == "device":
        held = np.maximum(held, whole * count * smallest)
    if warmup is not None:     # and the first backward's working memory
        least = _masked(np.where(arrays.layers > 0, transient, np.inf), arrays.holds, np.min,
                        np.inf)
        held = np.maximum(held, warmup * smallest + np.where(np.isfinite(least), least, 0.0))
    bound = (persistent[None, :, :] + held[:, None, :]).max(axis=2)    # G x Z
    if kind == "largest":   # the fullest device holds the count: at least the least persistent
        fullest = whole * count[:, :1] * activation.min(axis=1)[:, None]
        bound = np.maximum(bound, persistent.min(axis=1)[None, :] + fullest)
    return bound
