"""The space ``tabsched plan`` searches, and what the sizes alone decide about it.

A configuration runs a model on ``N`` GPUs as one :class:`Configuration`: a
**split** ``t x cp x p x d = N`` (tensor degree, context degree, 1 unless asked,
pipeline depth, data degree), a **layout** (the schedule family and its parameters at
depth ``p``, the layers of each stage), a microbatch size ``b`` dividing
``global_batch / d`` (so a pipeline runs ``M = global_batch / (d * b)`` microbatches),
recompute (none, selective, full), sequence parallelism (``t > 1``) and the ZeRO stage
(1 and above with ``d * cp > 1``: with one replica it is the same run as ZeRO-0 and not
a configuration of its own).

What the sizes alone decide, before any table is built (each refusal is counted
under its reason, and the candidate that came closest is kept for the message
when nothing is left):

* a tensor degree divides ``N``, the hidden size, the heads, the key/value heads
  and the MLP width, and a node; with ``cross_node`` it may instead fill whole
  nodes (its collectives then run on the network, NCCL's multi-rail ring:
  :mod:`tabsched.costs.collectives`; off by default, as such groups are almost
  never the fastest);
* a data degree divides the global batch, and the ``t * d`` GPUs of a pipeline
  rank divide a node or fill whole nodes (:meth:`Execution.check`);
* a layout's ``S`` stages fit the model's ``L`` layers: an even split needs ``S``
  to divide ``L`` (as Megatron-LM and torchtitan split layers), and the uneven
  splits give the first and the last stage up to ``uneven`` layers fewer than the
  middle ones (Megatron-LM's ``--decoder-first-pipeline-num-layers`` and
  ``--decoder-last-pipeline-num-layers``; :func:`layer_splits`);
* a family's own constraints at ``(p, M)``, checked by the family's ``check``
  without building its table (:func:`tabsched.schedules.check_parameters`).

Cost-driven families (``zb-auto``, ``zbv-auto``) are built per cost model and
memory budget; whether they can be built at all is known only then.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from tabsched._memo import memo
from tabsched.exceptions import InvalidParameterError, TabschedError
from tabsched.execution import RECOMPUTE_MODES, Execution
from tabsched.schedules import check_parameters, generate, get_family
from tabsched.table import FORWARD

__all__ = ["Split", "Layout", "Configuration", "Refusals", "layer_splits", "splits",
           "family_variants", "layout_of", "probe_table", "slicing_refusal",
           "DEFAULT_MAX_CHUNKS", "DEFAULT_UNEVEN",
           "MAX_CONFIGURATIONS"]

#: Model chunks per device searched for the multi-chunk families unless told: Megatron-LM
#: ran 3 for GPT-3 175B and 530B (Korthikanti et al. 2022, Table 3).
DEFAULT_MAX_CHUNKS = 4
#: How many layers fewer than a middle stage the first and the last stage may hold.
DEFAULT_UNEVEN = 3
#: The most configurations one plan takes on (about 100 bytes of bounds each, and the
#: bounds' arrays are built per split): a space above it is refused before any work.
MAX_CONFIGURATIONS = 5_000_000
#: The cost-driven families' placement is that of a fixed-pattern sibling: stage r on
#: device r with a split backward (zb-auto, as ZB-H1), or the V (zbv-auto, as ZB-V).
_PLACED_AS = {"zb-auto": "zb-h1", "zbv-auto": "zbv"}


def divisors(number):
    """The divisors of ``number`` in ascending order.

    >>> divisors(12)
    [1, 2, 3, 4, 6, 12]
    """
    small = [k for k in range(1, math.isqrt(number) + 1) if number % k == 0]
    return sorted(set(small + [number // k for k in small]))


@dataclass(frozen=True)
class Split:
    """``tensor x context x pipeline x data = gpus``."""

    tensor: int
    pipeline: int
    data: int
    context: int = 1
    #: The expert degree (inside the data ranks: it divides ``data``).
    expert: int = 1

    def __str__(self):
        context = f" cp={self.context}" if self.context > 1 else ""
        expert = f" ep={self.expert}" if self.expert > 1 else ""
        return f"t={self.tensor}{context} p={self.pipeline} d={self.data}{expert}"


@dataclass(frozen=True)
class Layout:
    """A family at one pipeline depth, with its layer split.

    ``params``: the family's parameters besides devices and microbatches, as sorted
    ``(name, value)`` pairs; ``stage_layers``: None for the even split, else one
    count per stage; ``stages``: the table's stage count.
    """

    family: str
    params: tuple
    devices: int
    stages: int
    stage_layers: tuple | None = None
    #: Sequence slices per microbatch (1: whole sequences); a sliced layout's table is
    #: the family's cut by :class:`tabsched.adapt.SplitSequence` at ``lead``, its
    #: sequences cut by ``partition`` (``even`` tokens, or ``compute``: equal FLOPs).
    slices: int = 1
    lead: str | None = None
    partition: str = "even"

    @property
    def whole(self):
        """This layout with whole sequences: the family's own table, its placement."""
        if self.slices == 1:
            return self
        return Layout(self.family, self.params, self.devices, self.stages, self.stage_layers)

    @property
    def label(self):
        """``interleaved-1f1b:chunks=3``: the family and its parameters."""
        if not self.params:
            return self.family
        return self.family + ":" + ",".join(f"{key}={value}" for key, value in self.params)

    @property
    def cost_driven(self):
        return get_family(self.family).cost_driven

    def generate_params(self, microbatches):
        """The keywords of :func:`tabsched.generate` for this layout at ``microbatches``."""
        params = dict(self.params, devices=self.devices, microbatches=microbatches)
        if self.stage_layers is not None:
            params["stage_layers"] = self.stage_layers
        return params


@dataclass(frozen=True)
class Configuration:
    """One way to run the model: a layout at ``microbatches``, run as ``execution``.

    ``execution`` holds every degree, the microbatch size, the global batch (over all
    replicas, Megatron-LM's meaning), recompute and the ZeRO stage; its other fields
    are the plan's base execution.
    """

    layout: Layout
    microbatches: int
    execution: Execution

    @property
    def split(self):
        run = self.execution
        return Split(run.tensor_parallel, self.layout.devices, run.data_parallel,
                     run.context_parallel, run.expert_parallel)

    def sort_key(self):
        """A total order for ties (the plan's stated tie-break, after the makespan)."""
        run = self.execution
        return (self.layout.family, self.layout.params, run.tensor_parallel,
                self.layout.devices, run.data_parallel, run.microbatch_size,
                RECOMPUTE_MODES.index(run.recompute), run.sequence_parallel, run.zero_stage,
                self.layout.stage_layers or (), self.layout.slices, self.layout.lead or "",
                self.layout.partition)

    def describe(self):
        """``zbv t=8 p=16 d=8 b=1 recompute=selective sp zero1``, one line."""
        run = self.execution
        parts = [self.layout.label, f"t={run.tensor_parallel}", f"p={self.layout.devices}",
                 f"d={run.data_parallel}", f"b={run.microbatch_size}", f"m={self.microbatches}",
                 f"recompute={run.recompute}"]
        if run.sequence_parallel:
            parts.append("sp")
        if run.zero_stage:
            parts.append(f"zero{run.zero_stage}")
        if self.layout.stage_layers is not None:
            layers = self.layout.stage_layers
            parts.append(f"layers={layers[0]},{layers[1]}..{layers[-1]}")
        if self.layout.slices > 1:
            parts.append(f"slices={self.layout.slices}"
                         + ("" if self.layout.lead == "seq1f1b" else f",lead={self.layout.lead}")
                         + ("" if self.layout.partition == "even"
                            else f",partition={self.layout.partition}"))
        return " ".join(parts)


@dataclass
class Refusals:
    """What the sizes refused: a count per reason, and the candidate that came closest.

    ``record(reason, depth, miss, description)``: ``depth`` orders the checks (a
    candidate refused later got further), ``miss`` how far it missed (smaller is
    closer), ``description`` the one-line account of it. ``closest`` is the deepest,
    then the smallest miss.
    """

    counts: dict = field(default_factory=dict)
    closest: tuple | None = None

    def record(self, reason, depth, miss, description, count=1):
        self.counts[reason] = self.counts.get(reason, 0) + count
        rank = (-depth, miss)
        if self.closest is None or rank < self.closest[0]:
            self.closest = (rank, description)

    @property
    def total(self):
        return sum(self.counts.values())

    @property
    def closest_description(self):
        return None if self.closest is None else self.closest[1]


def layer_splits(layers, stages, uneven=DEFAULT_UNEVEN):
    """The layer splits of ``layers`` over ``stages`` the plan searches.

    ``None`` (the even split) when ``stages`` divides ``layers``; and every split
    whose middle stages hold ``m`` layers each and whose first and last stage hold
    ``f`` and ``l``, ``m - uneven <= f, l <= m`` (at least 1), not both ``m``: the
    shape of Megatron-LM's ``--decoder-first/last-pipeline-num-layers``, lighter
    edges for the embedding and the output layer. ``m`` runs over the values that
    allow such ``f`` and ``l``: ``L/S <= m <= (L + 2 uneven)/S``.

    >>> layer_splits(96, 8)
    [None]
    >>> layer_splits(32, 4, uneven=3)
    [None, (7, 9, 9, 7), (8, 9, 9, 6), (6, 9, 9, 8)]
    >>> layer_splits(30, 4, uneven=1)
    [(7, 8, 8, 7)]
    >>> layer_splits(3, 4)
    []
    """
    if stages > layers or stages < 1:
        return []
    found = [None] if layers % stages == 0 else []
    if uneven < 1 or stages < 3:
        return found
    for middle in range(-(-layers // stages), (layers + 2 * uneven) // stages + 1):
        rest = layers - (stages - 2) * middle
        low = max(1, middle - uneven)
        # the first stage no lighter than the last first (the output layer weighs more)
        for first in sorted(range(low, middle + 1), key=lambda f: (abs(2 * f - rest), -f)):
            last = rest - first
            if low <= last <= middle and not first == last == middle:
                found.append((first,) + (middle,) * (stages - 2) + (last,))
    return found


def splits(model, system, gpus, global_batch, *, tensor=None, pipeline=None,
           cross_node=False, base=None, context=None, expert=None):
    """``(valid splits, Refusals)``: every ``t x cp x p x d = gpus`` the sizes allow.

    ``tensor``/``pipeline``: the degrees to consider (default every divisor of
    ``gpus``); ``context``: the context degrees (default the base's own, 1 unless
    given); ``expert``: the expert degrees (default the base's own), each inside the data
    ranks; ``base``: the execution the degrees change (its node size counts).
    """
    base = Execution() if base is None else base
    refusals = Refusals()
    valid = []
    for e in sorted(expert) if expert else (base.expert_parallel,):
        routed = getattr(model, "experts", 0)
        if e > 1 and routed % e:
            refusals.record("expert degree does not divide the experts", 1, routed % e,
                            f"ep={e}: does not divide the {routed} experts of {model.name}")
            continue
        valid += _splits_over_contexts(model, system, gpus, global_batch, tensor, pipeline,
                                       cross_node, base.replace(expert_parallel=e), context,
                                       refusals)
    return valid, refusals


def _splits_over_contexts(model, system, gpus, global_batch, tensor, pipeline, cross_node,
                          base, context, refusals):
    """The splits of :func:`splits` at the base's expert degree, over the context degrees."""
    valid = []
    for cp in sorted(context) if context else (base.context_parallel,):
        if gpus % cp:
            refusals.record("context degree does not divide the GPUs", 0, gpus % cp,
                            f"cp={cp}: does not divide the {gpus} GPUs")
            continue
        run = base.replace(context_parallel=cp, zero_stage=0)
        try:
            # the context degree alone (the expert degree is checked with each data degree)
            run.replace(tensor_parallel=1, sequence_parallel=False, expert_parallel=1).check(model)
        except InvalidParameterError as error:
            refusals.record("context degree does not fit the model", 1, cp, f"cp={cp}: {error}")
            continue
        valid += _splits_at(model, system, gpus // cp, global_batch, tensor, pipeline,
                            cross_node, run, refusals)
    return valid


def _splits_at(model, system, gpus, global_batch, tensor, pipeline, cross_node, base,
               refusals):
    """The ``t x p x d = gpus`` splits of ``splits`` at the base's context degree."""
    valid = []
    cp = base.context_parallel
    node = base.node_size(system)
    for t in sorted(tensor) if tensor else divisors(gpus):
        if gpus % t:
            refusals.record("tensor degree does not divide the GPUs", 0, gpus % t,
                            f"t={t}: does not divide the {gpus} GPUs")
            continue
        missing = next(((what, size) for what, size in (
            ("hidden", model.hidden), ("heads", model.heads), ("kv_heads", model.kv_heads),
            ("ffn", model.ffn)) if size % t), None)
        if missing:
            refusals.record("tensor degree does not divide the model", 1, missing[1] % t,
                            f"t={t}: does not divide {missing[0]} {missing[1]} of "
                            f"{model.name}")
            continue
        if t > node and not cross_node:
            refusals.record("tensor group larger than a node", 2, t - node,
                            f"t={t}: a tensor group larger than a {node}-GPU node of "
                            f"{system.name} (--cross-node-tensor considers it)")
            continue
        if (t > node and t % node) or (t <= node and node % t):
            refusals.record("tensor group straddles nodes", 2, t,
                            f"t={t}: tensor groups would straddle the {node}-GPU nodes of "
                            f"{system.name} (a group fills whole nodes or shares one)")
            continue
        for p in sorted(pipeline) if pipeline else divisors(gpus // t):
            if (gpus // t) % p:
                refusals.record("pipeline depth does not divide the GPUs", 3, (gpus // t) % p,
                                f"t={t} p={p}: does not divide the {gpus // t} GPUs left")
                continue
            d = gpus // (t * p)
            where = str(Split(t, p, d, cp, base.expert_parallel))
            if p > model.layers:
                refusals.record("more pipeline ranks than layers", 4, p - model.layers,
                                f"{where}: {p} pipeline ranks for {model.layers} layers")
                continue
            if global_batch % d:
                refusals.record("data degree does not divide the global batch", 5,
                                global_batch % d,
                                f"{where}: global batch {global_batch} does not split over "
                                f"{d} replicas ({global_batch % d} samples left over)")
                continue
            if d % base.expert_parallel:
                refusals.record("expert degree does not divide the data degree", 5,
                                d % base.expert_parallel,
                                f"{where}: expert_parallel {base.expert_parallel} does not "
                                f"divide the {d} data-parallel ranks it is formed inside")
                continue
            try:
                # experts under tensor parallelism run with sequence parallelism only
                base.replace(tensor_parallel=t, data_parallel=d, global_batch=None,
                             microbatch_size=None,
                             sequence_parallel=t > 1 and bool(model.experts)).check(model,
                                                                                    system)
            except InvalidParameterError as error:
                refusals.record("ranks do not tile the nodes", 6, t * d,
                                f"{where}: {error}")
                continue
            valid.append(Split(t, p, d, cp, base.expert_parallel))
    return valid


def family_variants(family, max_chunks, fixed=()):
    """The parameter sets the plan searches for ``family`` (sorted ``(name, value)``
    tuples): model chunks 1..``max_chunks`` where the family takes ``chunks`` (those it
    accepts), waves 1..``max_chunks // 2`` (Hanayo holds ``2W`` chunks), the defaults
    otherwise; ``fixed`` parameters (from a ``name:key=value`` spec) are kept as given.

    >>> family_variants(get_family("interleaved-1f1b"), 3)
    [(('chunks', 2),), (('chunks', 3),)]
    >>> family_variants(get_family("zbv"), 4)
    [(('chunks', 2),)]
    """
    fixed = dict(fixed)
    names = family.parameter_names()
    if family.cost_driven:
        return [tuple(sorted(fixed.items()))]
    if "chunks" in names and "chunks" not in fixed:
        choices = [("chunks", v) for v in range(1, max(1, max_chunks) + 1)]
    elif "waves" in names and "waves" not in fixed:
        choices = [("waves", w) for w in range(1, max(1, max_chunks // 2) + 1)]
    else:
        choices = [None]
    variants = []
    for choice in choices:
        params = dict(fixed)
        if choice is not None:
            params[choice[0]] = choice[1]
        try:    # a parameter value the family never takes is no configuration
            check_parameters(family.name, devices=2, microbatches=64, **params)
        except InvalidParameterError as error:
            if choice is None:
                raise InvalidParameterError(f"{family.name}: {error}") from None
            continue
        variants.append(tuple(sorted(params.items())))
    return variants


@memo(limit=4096)
def stage_count(family, params, devices):
    """Stages of ``family``'s table at ``devices`` (for the smallest valid microbatch
    count), or None if no microbatch count up to ``4 * devices`` is valid."""
    probe = probe_microbatches(family, params, devices)
    if probe is None:
        return None
    if get_family(family).cost_driven:
        sibling = _PLACED_AS[family]
        return check_parameters(sibling, devices=devices, microbatches=probe,
                                **dict(params))
    return check_parameters(family, devices=devices, microbatches=probe, **dict(params))


@memo(limit=4096)
def probe_microbatches(family, params, devices):
    """The smallest microbatch count ``family`` accepts at ``devices`` (up to 4x the
    devices: every family's constraints are met by then), or None."""
    name = _PLACED_AS.get(family, family)
    keep = {} if name != family else dict(params)
    for microbatches in range(1, 4 * devices + 1):
        try:
            check_parameters(name, devices=devices, microbatches=microbatches, **keep)
        except InvalidParameterError:
            continue
        return microbatches
    return None


@memo(limit=4096)
def family_accepts(family, params, devices, microbatches):
    """``None`` if ``family`` builds a table at these sizes, else the one-line reason
    (its ``check``, no table built). Cost-driven families: their sibling's sizes."""
    name = _PLACED_AS.get(family, family)
    keep = {} if name != family else dict(params)
    try:
        check_parameters(name, devices=devices, microbatches=microbatches, **keep)
    except TabschedError as error:
        return str(error)
    return None


@memo(limit=1024)
def probe_table(layout):
    """The family's own table for this layout at its smallest valid microbatch count
    (a cost-driven family's fixed-pattern sibling's), with the layout's layer split:
    what the stage placement and each device's parameters are read from (a sliced
    layout's: its whole sequences', the same placement)."""
    if layout.slices > 1:
        return probe_table(layout.whole)
    name = _PLACED_AS.get(layout.family, layout.family)
    keep = {} if name != layout.family else dict(layout.params)
    probe = probe_microbatches(layout.family, layout.params, layout.devices)
    return generate(name, devices=layout.devices, microbatches=probe,
                    stage_layers=layout.stage_layers, **keep)


@memo(limit=1024)
def layout_of(layout):
    """``(holds, work)`` of a layout: which devices hold each stage (``D x S``
    booleans) and, per kind F, B, I, W, how many operations of that kind of each stage
    each device runs per microbatch (``4 x D x S``; over the devices of a stage, F sums
    to 1, and B + I to 1).

    Read from :func:`probe_table`: the placement of stages on devices does not depend
    on the microbatch count, and for the families that replicate stages (Chimera,
    BitPipe, DualPipe) each replica runs a fixed share of every microbatch count the
    family accepts (``tests/test_plan_space.py`` checks both). A cost-driven family is
    placed as its fixed-pattern sibling (``zb-auto`` as ZB-H1, ``zbv-auto`` as ZB-V).
    """
    if layout.slices > 1:     # per microbatch of whole sequences: the same work
        return layout_of(layout.whole)
    table = probe_table(layout)
    probe = table.num_microbatches
    D, S = table.num_devices, table.num_stages
    work = np.zeros((4, D, S))
    np.add.at(work, (table.kind, table.device, table.stage), 1.0 / probe)
    holds = work[FORWARD] > 0
    holds.flags.writeable = False
    work.flags.writeable = False
    return holds, work


@memo(limit=1024)
def slicing_refusal(family, params):
    """Why ``family`` with ``params`` cannot run sequence slices, or None.

    :class:`tabsched.adapt.SplitSequence` cuts a fixed-pattern table's rows; a
    cost-driven family (``zb-auto``, ``zbv-auto``) builds its table for the memory of
    whole sequences, and a family with overlapped cells (DualPipe's fused pairs) has
    cells the transform does not cut.

    >>> slicing_refusal("1f1b", ()) is None
    True
    >>> slicing_refusal("zb-auto", ())
    'zb-auto builds its table for whole sequences (cost-driven)'
    """
    if get_family(family).cost_driven:
        return f"{family} builds its table for whole sequences (cost-driven)"
    for devices in (2, 4, 3, 8):
        stages = stage_count(family, params, devices)
        if stages is None:
            continue
        table = probe_table(Layout(family, params, devices, stages))
        starts = table.cell_starts()
        if len(table) and not np.all(starts & np.append(starts[1:], True)):
            return f"{family} runs overlapped cells, which slices do not cut"
        return None
    return None
