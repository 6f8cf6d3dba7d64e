"""Run-time variation: how the durations of one iteration differ from the cost model's.

A variation model turns the cost model's durations of a lowered table into the
durations of sampled iterations, and states their expectation exactly (not by
sampling), so the run-time bubble -- mean makespan under variation minus the
makespan at mean durations -- is measured against the right reference.

Data model
    :class:`VariationContext`
        One lowered table under one cost model: the prices of its operations,
        transfers (latency and volume apart) and extra nodes, the labels of its
        operations, and its random streams (:mod:`tabsched.adapt.streams`).
    :class:`Draw`
        The durations of some samples by part (operations, transfer latency and
        volume, optimizer steps), which the models change in place before the
        context composes them into node durations.
    :class:`Variation`
        A model: ``apply`` changes a draw to sampled durations, ``expect`` to
        the expected ones, ``describe`` says what it is in plain data.

Models
    :class:`Noise`
        Multiplicative lognormal noise per operation with a coefficient of
        variation (mean 1, so the expected duration is the model's), optionally
        per kind or per stage, and optionally on transfers.
    :class:`Straggler`
        One device computes ``factor`` times slower, optionally only in some
        iterations.
    :class:`SlowLink`
        The link between two devices: its bandwidth divided by a factor (the
        ``bytes / bandwidth`` part of each transfer grows, its latency does not)
        and a latency spike added to each transfer, with some probability.
    :class:`~tabsched.adapt.replay.Replay`
        Measured durations, ``op,duration`` rows as a profiler gives them
        (:mod:`tabsched.adapt.replay`).

Models add up: ``Noise(0.1) + Straggler(3, 1.5)``. They apply in a fixed
order whatever the order of the sum: replayed measurements first, then
stragglers and slow links, then noise. Every random number they draw comes
from the context's streams, keyed so that the same seed gives the same numbers
to the bit (:mod:`tabsched.adapt.streams` states the contract).

Examples
--------
>>> from tabsched import StageCosts, generate
>>> from tabsched.lower import lower
>>> from tabsched.nodes import CELL
>>> table = generate("1f1b", devices=2, microbatches=2)
>>> context = VariationContext(lower(table), StageCosts(1.0, comm=0.5))
>>> context.mean_durations(Straggler(1, 2.0))[context.lowered.nodes(CELL)].tolist()
[1.0, 1.0, 2.0, 2.0, 2.0, 4.0, 2.0, 4.0]
"""

import numbers

import numpy as np

from tabsched.adapt.streams import RandomStreams
from tabsched.compose import Prices
from tabsched.exceptions import InvalidParameterError
from tabsched.nodes import CELL, OPTIMIZER, TRANSFER
from tabsched.table import KINDS

__all__ = ["Variation", "Noise", "Straggler", "SlowLink", "Combined", "VariationContext",
           "estimate_variation", "parse_iterations"]


def _check_factor(name, value, *, minimum=0.0, inclusive=False):
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise InvalidParameterError(f"{name} must be a number, not {value!r}") from None
    if not np.isfinite(number) or number < minimum or (number == minimum and not inclusive):
        bound = ">=" if inclusive else ">"
        raise InvalidParameterError(f"{name} must be {bound} {minimum:g}, not {value!r}")
    return number


def _check_cv(name, value):
    return _check_factor(name, value, minimum=0.0, inclusive=True)


def _check_device(name, value):
    if isinstance(value, bool) or not isinstance(value, (numbers.Integral,)) or value < 0:
        raise InvalidParameterError(f"{name} must be a device number >= 0, not {value!r}")
    return int(value)


def parse_iterations(value):
    """``None`` (every iteration), or a sorted tuple of iteration numbers.

    Accepts a ``range``, an iterable of ints, or text such as ``"5-9"`` or
    ``"0,2,4-6"`` (ranges include both ends).

    >>> parse_iterations("0,2,4-6")
    (0, 2, 4, 5, 6)
    >>> parse_iterations(range(3))
    (0, 1, 2)
    """
    if value is None:
        return None
    if isinstance(value, str):
        iterations = []
        for part in value.split(","):
            low, dash, high = part.strip().partition("-")
            try:
                if dash:
                    iterations.extend(range(int(low), int(high) + 1))
                else:
                    iterations.append(int(low))
            except ValueError:
                raise InvalidParameterError(f"iterations {value!r}: expected numbers and "
                                            f"ranges such as 0,2,4-6") from None
        value = iterations
    try:
        iterations = sorted({int(iteration) for iteration in value})
    except (TypeError, ValueError):
        raise InvalidParameterError(f"iterations must be iteration numbers, "
                                    f"not {value!r}") from None
    if iterations and iterations[0] < 0:
        raise InvalidParameterError(f"iterations must be >= 0, not {iterations[0]}")
    return tuple(iterations)


class VariationContext:
    """What a variation model needs to know about one lowered table.

    Parameters
    ----------
    lowered : LoweredSchedule
    costs : CostModel
        The cost model whose durations vary.
    seed : int
        Seed of every random draw.
    iteration : int
        Which iteration of a run the samples are (models limited to some
        iterations act only in those).

    Attributes
    ----------
    nominal : float64 array (nodes,)
        The cost model's duration of every node.
    op_durations : float64 array (operations,)
    latency, volume : float64 arrays (transfers,)
        The parts of each transfer's duration (:meth:`CostModel.transfer_parts`).
    streams : RandomStreams
        The keyed random streams every draw comes from (:mod:`tabsched.adapt.streams`).
    """

    def __init__(self, lowered, costs, *, seed=0, iteration=0):
        self.lowered = lowered
        self.costs = costs
        self.table = table = lowered.table
        self.streams = RandomStreams(lowered, seed=seed, iteration=iteration)
        self.op_durations = np.asarray(costs.op_durations(table), dtype=np.float64)
        self.latency, self.volume = (np.asarray(part, dtype=np.float64) for part in
                                     costs.transfer_parts(table, lowered.transfers))
        #: The prices of the extra nodes (gradient syncs, optimizer steps) by kind.
        self.extra_prices = costs.extra_prices(lowered)
        self._nominal = None
        self.num_ops = len(table)
        self.num_transfers = len(lowered.transfers)
        self._labels = None

    @property
    def nominal(self):
        """The cost model's duration of every node, made when first asked for (few
        models read it; the search makes a context for each of hundreds of candidates)."""
        if self._nominal is None:
            self._nominal = self.costs.node_durations(self.lowered, self.op_durations)
        return self._nominal

    @property
    def seed(self):
        """The seed of every draw (the streams')."""
        return self.streams.seed

    @property
    def iteration(self):
        """The iteration the samples are (the streams'); assigning it moves the context
        to another iteration of the run."""
        return self.streams.iteration

    @iteration.setter
    def iteration(self, iteration):
        self.streams.iteration = iteration

    # ---------------------------------------------------------------- labels
    @property
    def op_labels(self):
        """Text of every operation (``3F12``) and transfer (``3F12 d3->d4``)."""
        if self._labels is None:
            table, transfers = self.table, self.lowered.transfers
            kinds = np.array(KINDS)[table.kind]
            ops = np.char.add(np.char.add(table.stage.astype(str), kinds),
                              table.microbatch.astype(str))
            sends = np.char.add(np.char.add(np.char.add(ops[transfers.producer], " d"),
                                            transfers.src.astype(str)), "->d")
            sends = np.char.add(sends, transfers.dst.astype(str))
            self._labels = (ops.tolist(), sends.tolist())
        return self._labels

    # ------------------------------------------------------------- durations
    def new_draw(self, samples):
        """The cost model's durations for ``samples`` (sample indices), by part."""
        samples = np.asarray(samples, dtype=np.int64)
        count = len(samples)
        optimizer = self.extra_prices.get(OPTIMIZER, np.zeros(0))
        return Draw(samples=samples,
                    op=np.repeat(self.op_durations[None, :], count, axis=0),
                    latency=self.latency, volume=self.volume,
                    optimizer=np.repeat(optimizer[None, :], count, axis=0))

    def node_durations(self, draw):
        """Node durations (samples, nodes) from a draw: its parts composed by the
        lowering (:meth:`~tabsched.lower.LoweredSchedule.compose_stacked`), as
        ``CostModel.node_durations`` composes the cost model's."""
        count = draw.op.shape[0]
        transfers = np.empty((count, self.num_transfers))
        draw.transfer_durations(transfers)
        extra = dict(self.extra_prices)
        if OPTIMIZER in extra:
            extra[OPTIMIZER] = draw.optimizer
        factors = self.costs.overlap_factors(self.lowered)[None, :]   # a draw keeps them
        return self.lowered.compose_stacked(Prices(op=draw.op, transfer=transfers, extra=extra,
                                                   overlap=factors))

    def sample_durations(self, variation, samples):
        """Node durations of ``samples`` (sample indices) under ``variation``."""
        draw = self.new_draw(samples)
        if variation is not None:
            variation.validate(self.table)
            variation.apply(self, draw)
        return self.node_durations(draw)

    def mean_durations(self, variation):
        """The expected duration of every node under ``variation`` (exact)."""
        draw = self.new_draw([0])
        if variation is not None:
            variation.validate(self.table)
            variation.expect(self, draw)
        return self.node_durations(draw)[0]


class Draw:
    """Durations of some samples, by part, before they become node durations.

    ``op`` (samples, operations); ``latency``, ``volume`` (samples, transfers):
    a transfer lasts ``(latency + volume) * transfer_scale``; ``optimizer``
    (samples, optimizer steps). Variation models change these in place; the
    transfer parts are per-sample copies only once a model asks for them.
    """

    __slots__ = ("samples", "op", "_latency", "_volume", "transfer_scale", "optimizer")

    def __init__(self, samples, op, latency, volume, optimizer):
        self.samples = samples
        self.op = op
        self._latency = latency
        self._volume = volume
        self.transfer_scale = None
        self.optimizer = optimizer

    def _rows(self, part):
        if part.ndim == 1:
            part = np.repeat(part[None, :], len(self.samples), axis=0)
        return part

    @property
    def latency(self):
        self._latency = self._rows(self._latency)
        return self._latency

    @property
    def volume(self):
        self._volume = self._rows(self._volume)
        return self._volume

    def transfer_durations(self, out):
        """``(latency + volume) * transfer_scale`` into ``out`` (samples, transfers)."""
        np.add(self._latency, self._volume, out=out)
        if self.transfer_scale is not None:
            out *= self.transfer_scale

    def scale_transfers(self, factor, columns=slice(None)):
        """Multiply the transfers' durations by ``factor``; returns the scale array."""
        if self.transfer_scale is None:
            self.transfer_scale = np.ones((len(self.samples), self._volume.shape[-1]))
        if not (np.isscalar(factor) and factor == 1.0):
            self.transfer_scale[:, columns] *= factor
        return self.transfer_scale


class Variation:
    """Base class: a model of run-time durations. Models add up with ``+``."""

    #: Models apply in this order: 0 replay, 1 stragglers and links, 2 noise.
    phase = 1
    iterations = None

    def active(self, context):
        """Whether the model acts in ``context.iteration``."""
        return self.iterations is None or context.iteration in self.iterations

    @property
    def random(self):
        """Whether samples can differ (else every sample is the expectation)."""
        return True

    def validate(self, table):
        """Raise ``InvalidParameterError`` if the model does not fit ``table``."""

    def apply(self, context, draw):
        """Change ``draw`` (sampled durations of ``draw.samples``) in place."""
        raise NotImplementedError

    def expect(self, context, draw):
        """Change the one-row ``draw`` to the expected durations."""
        raise NotImplementedError

    def describe(self):
        """Plain data for reports and JSON."""
        raise NotImplementedError

    def time_unit(self, context):
        """The unit of the sampled durations: the cost model's, unless the model brings
        measured ones (:class:`tabsched.adapt.replay.Replay`: seconds)."""
        return context.costs.time_unit

    def __add__(self, other):
        if other is None:
            return self
        if not isinstance(other, Variation):
            return NotImplemented
        return Combined(self, other)

    __radd__ = __add__

    def __repr__(self):
        return f"<{type(self).__name__} {self.describe()}>"

    def _iteration_info(self, info):
        if self.iterations is not None:
            info["iterations"] = list(self.iterations)
        return info


class Combined(Variation):
    """Several models at once, applied replay first, then stragglers and links, then noise."""

    def __init__(self, *parts):
        flat = []
        for part in parts:
            if part is None:
                continue
            if not isinstance(part, Variation):
                raise InvalidParameterError(f"Combined takes variation models, not "
                                            f"{type(part).__name__}")
            flat.extend(part.parts if isinstance(part, Combined) else [part])
        self.parts = tuple(sorted(flat, key=lambda part: part.phase))

    @property
    def random(self):
        return any(part.random for part in self.parts)

    def validate(self, table):
        for part in self.parts:
            part.validate(table)

    def apply(self, context, draw):
        for part in self.parts:
            part.apply(context, draw)

    def expect(self, context, draw):
        for part in self.parts:
            part.expect(context, draw)

    def describe(self):
        return [part.describe() for part in self.parts]

    def time_unit(self, context):
        units = {part.time_unit(context) for part in self.parts}
        units.discard(context.costs.time_unit)
        return units.pop() if units else context.costs.time_unit


class Noise(Variation):
    """Multiplicative lognormal noise on every operation (and optionally transfer).

    Each duration is multiplied by ``exp(sigma*Z - sigma^2/2)`` with ``Z``
    standard normal and ``sigma^2 = ln(1 + cv^2)``: the factor has mean 1 and
    coefficient of variation ``cv`` exactly.

    Parameters
    ----------
    cv : float
        Coefficient of variation of every operation's duration (>= 0).
    kinds : dict, optional
        Per-kind CV, e.g. ``{"F": 0.05, "W": 0.2}``; overrides ``cv``.
    stages : dict or sequence, optional
        Per-stage CV (``{stage: cv}`` or one per stage); overrides ``kinds``.
    transfers : float
        CV of every transfer's duration (default 0: transfers do not vary).
    iterations : optional
        Iterations in which the noise acts (default: every one).

    >>> Noise(0.1).describe()
    {'model': 'noise', 'cv': 0.1}
    >>> Noise(-0.1)
    Traceback (most recent call last):
    ...
    tabsched.exceptions.InvalidParameterError: cv must be >= 0, not -0.1
    """

    phase = 2

    def __init__(self, cv=0.0, *, kinds=None, stages=None, transfers=0.0, iterations=None):
        self.cv = _check_cv("cv", cv)
        self.kinds = {}
        for kind, value in dict(kinds or {}).items():
            if kind not in KINDS:
                raise InvalidParameterError(f"noise kinds: {kind!r} is not one of "
                                            f"{', '.join(KINDS)}")
            self.kinds[kind] = _check_cv(f"cv of kind {kind}", value)
        if stages is not None and not isinstance(stages, dict):
            stages = dict(enumerate(stages))
        self.stages = {}
        for stage, value in dict(stages or {}).items():
            stage = _check_device("noise stage", stage)
            self.stages[stage] = _check_cv(f"cv of stage {stage}", value)
        self.transfers = _check_cv("transfer cv", transfers)
        self.iterations = parse_iterations(iterations)

    @property
    def random(self):
        return bool(self.cv or self.transfers or any(self.kinds.values())
                    or any(self.stages.values()))

    def validate(self, table):
        bad = [stage for stage in self.stages if stage >= table.num_stages]
        if bad:
            raise InvalidParameterError(f"noise: stage {bad[0]} is out of range (the table "
                                        f"has stages 0..{table.num_stages - 1})")

    def op_cv(self, table):
        """The CV of every operation of ``table``."""
        cv = np.full(len(table), self.cv)
        for kind, value in self.kinds.items():
            cv[table.kind == KINDS.index(kind)] = value
        for stage, value in self.stages.items():
            cv[table.stage == stage] = value
        return cv

    def apply(self, context, draw):
        if not self.active(context):
            return
        cv = self.op_cv(context.table)
        streams = context.streams
        if np.any(cv > 0):
            streams.scale_lognormal(draw.op, "noise", draw.samples, streams.op_keys, cv)
        if self.transfers > 0 and context.num_transfers:
            streams.scale_lognormal(draw.scale_transfers(1.0), "transfer-noise", draw.samples,
                                    streams.transfer_keys, self.transfers)

    def expect(self, context, draw):
        """Mean 1: the expected durations are the model's."""

    def describe(self):
        info = {"model": "noise", "cv": self.cv}
        if self.kinds:
            info["kinds"] = dict(self.kinds)
        if self.stages:
            info["stages"] = {str(stage): value for stage, value in self.stages.items()}
        if self.transfers:
            info["transfers"] = self.transfers
        return self._iteration_info(info)


class Straggler(Variation):
    """One device computes ``factor`` times slower (its operations and optimizer step).

    Parameters
    ----------
    device : int
    factor : float
        Slowdown (> 0; 1.5 is 50% slower, below 1 faster).
    iterations : optional
        Iterations in which the device straggles (``range(10)``, ``"0-9"``);
        default every one.

    >>> Straggler(3, 1.5, iterations="0-4").describe()
    {'model': 'straggler', 'device': 3, 'factor': 1.5, 'iterations': [0, 1, 2, 3, 4]}
    """

    def __init__(self, device, factor, *, iterations=None):
        self.device = _check_device("straggler device", device)
        self.factor = _check_factor("straggler factor", factor)
        self.iterations = parse_iterations(iterations)

    random = False

    def validate(self, table):
        if self.device >= table.num_devices:
            raise InvalidParameterError(f"straggler on device {self.device}, but the table "
                                        f"has devices 0..{table.num_devices - 1}")

    def apply(self, context, draw):
        if not self.active(context):
            return
        draw.op[:, context.table.device == self.device] *= self.factor
        if draw.optimizer.shape[1]:
            draw.optimizer[:, self.device] *= self.factor

    expect = apply

    def describe(self):
        return self._iteration_info({"model": "straggler", "device": self.device,
                                     "factor": self.factor})


class SlowLink(Variation):
    """The link between two devices (both directions) slows down.

    A transfer lasts ``latency + bytes / bandwidth``. The link's bandwidth is
    divided by ``bandwidth_factor``, so the volume part of each transfer on it is
    multiplied by the factor and its latency is not; with a ``latency_spike``,
    each transfer on the link waits that much longer with probability
    ``spike_probability``. Under a cost model that states no bandwidth
    (``StageCosts``) the whole transfer time is volume.

    Parameters
    ----------
    devices : (int, int)
    bandwidth_factor : float
        > 0; 3 makes the link three times slower.
    latency_spike : float
        Added latency per transfer, in the cost model's time unit (>= 0).
    spike_probability : float
        Probability that a transfer meets the spike (default 1: every one).
    iterations : optional
        Iterations in which the link is slow; default every one.

    >>> SlowLink((3, 4), 3.0).describe()
    {'model': 'slow-link', 'devices': [3, 4], 'bandwidth_factor': 3.0}
    """

    def __init__(self, devices, bandwidth_factor=1.0, *, latency_spike=0.0,
                 spike_probability=1.0, iterations=None):
        try:
            a, b = devices
        except (TypeError, ValueError):
            raise InvalidParameterError(f"slow link devices must be two devices, "
                                        f"not {devices!r}") from None
        self.devices = (_check_device("slow link device", a), _check_device("slow link device", b))
        if self.devices[0] == self.devices[1]:
            raise InvalidParameterError(f"slow link {a}-{b}: a link joins two different devices")
        self.bandwidth_factor = _check_factor("slow link bandwidth factor", bandwidth_factor)
        self.latency_spike = _check_factor("latency spike", latency_spike, inclusive=True)
        self.spike_probability = _check_factor("spike probability", spike_probability,
                                               inclusive=True)
        if self.spike_probability > 1:
            raise InvalidParameterError(f"spike probability must be between 0 and 1, "
                                        f"not {spike_probability!r}")
        self.iterations = parse_iterations(iterations)

    @property
    def random(self):
        return bool(self.latency_spike) and 0 < self.spike_probability < 1

    def validate(self, table):
        for device in self.devices:
            if device >= table.num_devices:
                a, b = self.devices
                raise InvalidParameterError(f"slow link {a}-{b}: device {device} does not "
                                            f"exist (the table has devices "
                                            f"0..{table.num_devices - 1})")

    def _columns(self, context):
        transfers = context.lowered.transfers
        a, b = self.devices
        src, dst = transfers.src, transfers.dst
        return np.flatnonzero(((src == a) & (dst == b)) | ((src == b) & (dst == a)))

    def apply(self, context, draw):
        if not self.active(context):
            return
        columns = self._columns(context)
        if not len(columns):
            return
        draw.volume[:, columns] *= self.bandwidth_factor
        if self.latency_spike:
            if self.spike_probability >= 1:
                draw.latency[:, columns] += self.latency_spike
            elif self.spike_probability > 0:
                streams = context.streams
                hit, _ = streams.uniforms("spike", draw.samples, streams.transfer_keys[columns])
                draw.latency[:, columns] += self.latency_spike * (hit < self.spike_probability)

    def expect(self, context, draw):
        if not self.active(context):
            return
        columns = self._columns(context)
        draw.volume[:, columns] *= self.bandwidth_factor
        draw.latency[:, columns] += self.latency_spike * self.spike_probability

    def describe(self):
        info = {"model": "slow-link", "devices": list(self.devices),
                "bandwidth_factor": self.bandwidth_factor}
        if self.latency_spike:
            info["latency_spike"] = self.latency_spike
            info["spike_probability"] = self.spike_probability
        return self._iteration_info(info)


def estimate_variation(context, observed):
    """A variation model fitted to one observed iteration of ``context``'s table.

    Per device, a :class:`Straggler` with the ratio of observed to modelled
    compute time; per pair of devices with transfers, a :class:`SlowLink` with
    the ratio of the observed to the modelled volume part (latency taken as
    modelled); and :class:`Noise` with the CVs of what is left (operations and
    transfers). Factors are not limited to iterations: they describe now.

    Parameters
    ----------
    context : VariationContext
    observed : float64 array (nodes,)
        Durations of the nodes in one iteration.

    Returns
    -------
    Combined
    """
    observed = np.asarray(observed, dtype=np.float64)
    lowered, table = context.lowered, context.table
    D = table.num_devices
    cells = lowered.nodes(CELL)
    nominal_cells = context.nominal[cells]
    seen = observed[cells]
    device = lowered.cell_device
    modelled = np.bincount(device, weights=nominal_cells, minlength=D)
    measured = np.bincount(device, weights=seen, minlength=D)
    factor = np.divide(measured, modelled, out=np.ones(D), where=modelled > 0)
    parts = []
    for d in range(D):
        if modelled[d] > 0 and factor[d] > 0:
            parts.append(Straggler(d, float(factor[d])))
    expected = nominal_cells * factor[device]
    positive = expected > 0
    op_cv = float(np.std(seen[positive] / expected[positive])) if np.any(positive) else 0.0
    transfer_cv = 0.0
    if context.num_transfers:
        transfers = lowered.transfers
        sends = observed[lowered.nodes(TRANSFER)]
        low = np.minimum(transfers.src, transfers.dst).astype(np.int64)
        high = np.maximum(transfers.src, transfers.dst).astype(np.int64)
        pair = low * D + high
        excess = np.bincount(pair, weights=sends - context.latency, minlength=D * D)
        volume = np.bincount(pair, weights=context.volume, minlength=D * D)
        ratio = np.divide(excess, volume, out=np.ones(D * D), where=volume > 0)
        ratio = np.maximum(ratio, 1e-9)
        for key in np.flatnonzero(volume > 0).tolist():
            parts.append(SlowLink((key // D, key % D), float(ratio[key])))
        expected = context.latency + context.volume * ratio[pair]
        positive = expected > 0
        if np.any(positive):
            transfer_cv = float(np.std(sends[positive] / expected[positive]))
    parts.append(Noise(op_cv, transfers=transfer_cv))
    return Combined(*parts)


def check_variation(variation):
    """Raise unless ``variation`` is None or a variation model."""
    if variation is not None and not isinstance(variation, Variation):
        raise InvalidParameterError(f"variation must be a variation model, "
                                    f"not {type(variation).__name__}")
