"""Monte Carlo evaluation: one lowered table, many sampled iterations, one kernel pass.

:func:`monte_carlo` lowers a table once and runs ``samples`` iterations drawn
from a variation model through the kernel, which keeps per sample only the
makespan and, per device, busy time, first start and last end.

The fused pass
    Lognormal noise on top of models that change every sample alike
    (stragglers, slow links without random spikes, single measurements) is
    drawn inside the kernel while it runs (:func:`tabsched.engine.monte_carlo_summary`):
    blocks of ``engine.SUMMARY_BLOCK`` (32) samples, node-major, each node's
    durations composed as the pass reaches it. Memory is one block of end times
    per node, whatever the number of samples.
Chunks
    Other models (random latency spikes, replayed measurements that cycle)
    draw the durations of a chunk of samples with numpy, a (chunk x nodes)
    float64 matrix plus the model's parts, sized to ``chunk_bytes`` (256 MiB by
    default, about 40 samples of a 200k-node table), then run the engine's
    summary pass (:func:`tabsched.engine.summarize`). The noise draws are the
    same compiled ones, so both ways give the same numbers to the bit, and
    chunking changes none: draws are keyed by sample, not by chunk.

Link contention without a heap
    Under contention ``link`` a link's FIFO serves its transfers in the
    sending row's order whenever every cell lasts longer than zero, so the
    engine runs :meth:`tabsched.lower.LoweredSchedule.link_chains` (an edge from
    each transfer to the next on its link) through the pull pass, with the same
    starts to the bit; a chunk with a cell of zero duration runs the heap.
    ``evaluate()`` takes the same choice (:func:`tabsched.engine.choose`).

Run-time bubble
    ``mean makespan under variation - makespan at mean durations``: the time
    the variation costs beyond what its average durations explain (Jensen's
    gap of the max-plus recursion; never negative under contention ``none``
    or ``link``). Per device, the same for its idle time: ``mean idle -
    idle at mean durations``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from tabsched import engine
from tabsched.adapt.streams import lognormal_parameters
from tabsched.adapt.variation import Combined, Noise, VariationContext, check_variation
from tabsched.evaluate import checked_costs, lower_for, run_as
from tabsched.exceptions import InvalidParameterError
from tabsched.execution import Execution
from tabsched.table import ScheduleTable

if TYPE_CHECKING:
    from tabsched.adapt.variation import Variation
    from tabsched.costs.base import CostModel

__all__ = ["monte_carlo", "MonteCarloResult", "DeviceRuntime", "link_chains"]

DEFAULT_CHUNK_BYTES = 256 * 2**20


@dataclass
class DeviceRuntime:
    """One device under variation: means over the samples and the run-time bubble.

    ``idle = makespan - busy`` per sample; ``runtime_bubble = mean_idle -
    nominal_idle``, where ``nominal_idle`` is the idle time at mean durations.
    ``mean_finish`` is the mean end of the device's last operation.
    """

    device: int
    mean_busy: float
    mean_idle: float
    nominal_idle: float
    mean_finish: float

    @property
    def runtime_bubble(self):
        return self.mean_idle - self.nominal_idle


@dataclass
class MonteCarloResult:
    """Makespan statistics of ``samples`` sampled iterations of one table.

    Attributes
    ----------
    makespans : float64 array (samples,)
        Every sample's makespan, in sample order.
    mean, p50, p95, max, std : float
        Of ``makespans`` (percentiles by linear interpolation).
    nominal_makespan : float
        The makespan at the mean durations of the variation model.
    runtime_bubble : float
        ``mean - nominal_makespan``.
    devices : list of DeviceRuntime
    """

    table: ScheduleTable
    samples: int
    seed: int
    iteration: int
    makespans: np.ndarray
    nominal_makespan: float
    devices: list
    time_unit: str
    variation: object = None
    chunks: int = 1
    busy: np.ndarray | None = field(default=None, repr=False)

    @property
    def mean(self):
        return float(self.makespans.mean())

    @property
    def p50(self):
        return float(np.percentile(self.makespans, 50))

    @property
    def p95(self):
        return float(np.percentile(self.makespans, 95))

    @property
    def max(self):
        return float(self.makespans.max())

    @property
    def std(self):
        return float(self.makespans.std())

    @property
    def runtime_bubble(self):
        return self.mean - self.nominal_makespan

    def __repr__(self):
        """One line of figures, not the makespan of every sample."""
        unit = self.time_unit

        def shown(value):
            if unit == "s":
                from tabsched.costs.units import format_quantity
                return format_quantity(value, "s")
            return f"{value:.4g} {unit}"
        return (f"<MonteCarloResult {self.samples} samples (seed {self.seed}): mean "
                f"{shown(self.mean)}, p95 {shown(self.p95)}, run-time bubble "
                f"{shown(self.runtime_bubble)} over {shown(self.nominal_makespan)} at mean "
                f"durations>")

    def to_dataframe(self, *, samples=False):
        """A pandas DataFrame: a row per device, or per sample with ``samples=True``
        (see :func:`tabsched.frames.monte_carlo_frame`)."""
        from tabsched.frames import monte_carlo_frame
        return monte_carlo_frame(self, samples=samples)

    def statistic(self, objective):
        """``"mean"`` or ``"p95"`` (or ``"p50"``, ``"max"``) of the makespan."""
        if objective not in ("mean", "p50", "p95", "max"):
            raise InvalidParameterError(f"objective {objective!r} is not one of mean, p95")
        return getattr(self, objective)

    def to_dict(self):
        """Plain data for JSON (times in ``time_unit``)."""
        return {"samples": self.samples, "seed": self.seed, "iteration": self.iteration,
                "mean_makespan": self.mean, "p50_makespan": self.p50,
                "p95_makespan": self.p95, "max_makespan": self.max,
                "std_makespan": self.std, "nominal_makespan": self.nominal_makespan,
                "runtime_bubble": self.runtime_bubble, "time_unit": self.time_unit,
                "variation": self.variation, "chunks": self.chunks,
                "devices": [{"device": d.device, "mean_busy": d.mean_busy,
                             "mean_idle": d.mean_idle, "nominal_idle": d.nominal_idle,
                             "runtime_bubble": d.runtime_bubble,
                             "mean_finish": d.mean_finish} for d in self.devices]}


def link_chains(lowered):
    """``lowered`` under contention ``link`` as a DAG without resources, or ``None``
    (:meth:`tabsched.lower.LoweredSchedule.link_chains`).

    Valid for durations whose cells all last longer than zero.
    """
    return lowered.link_chains()


def _refuse_overflow(values, context, variation):
    """One error naming the inputs when durations or makespans are not finite (no inf, no nan)."""
    if np.all(np.isfinite(values)):
        return
    described = "none" if variation is None else variation.describe()
    raise InvalidParameterError(
        f"the Monte Carlo durations or makespans are too large to add up (largest "
        f"{float(np.max(np.abs(values))):.3g} {context.costs.time_unit}); check the cost "
        f"inputs and the variation ({str(described)[:160]})")


def _check_count(name, value, minimum=1):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise InvalidParameterError(f"{name} must be an integer >= {minimum}, not {value!r}")
    return int(value)


def monte_carlo(table: ScheduleTable, costs: CostModel | None = None,
                variation: Variation | None = None, *, samples: int = 1000, seed: int = 0,
                iteration: int = 0, execution: Execution | None = None,
                contention: str | None = None, grad_sync: object = None,
                optimizer: bool | None = None, transfer_after: tuple | None = None,
                chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                shard_windows: tuple | None = None) -> MonteCarloResult:
    """Makespan statistics of ``table`` over ``samples`` iterations drawn from ``variation``.

    Parameters
    ----------
    table : ScheduleTable
    costs : CostModel, optional
        Default ``UnitCosts()``.
    variation : Variation, optional
        Default none: every sample takes the cost model's durations.
    samples : int
    seed : int
        Same seed, same numbers, to the bit.
    iteration : int
        The iteration the samples stand for (models limited to some iterations).
    execution, contention, grad_sync, optimizer, transfer_after, shard_windows :
        As in :func:`tabsched.evaluate`: how the table runs (default the cost model's
        execution), and the conveniences that change one thing of it.
    chunk_bytes : int
        Memory for the durations of one chunk of samples, where durations are
        drawn in chunks (see the module docstring).

    Returns
    -------
    MonteCarloResult

    Examples
    --------
    >>> from tabsched import StageCosts, generate
    >>> from tabsched.adapt import Noise
    >>> table = generate("1f1b", devices=4, microbatches=8)
    >>> result = monte_carlo(table, StageCosts(1.0), Noise(0.2), samples=200, seed=7)
    >>> result.nominal_makespan, result.mean > result.nominal_makespan
    (33.0, True)
    """
    costs = run_as(checked_costs(table, costs), execution)
    check_variation(variation)
    lowered = lower_for(table, costs, contention=contention, grad_sync=grad_sync,
                        optimizer=optimizer, transfer_after=transfer_after,
                        shard_windows=shard_windows)
    context = VariationContext(lowered, costs, seed=seed, iteration=iteration)
    return run_monte_carlo(context, variation, samples=samples, chunk_bytes=chunk_bytes)


def _fused(context, variation, samples):
    """Makespans, busy time and last ends of ``samples`` from the fused kernel pass
    (:func:`tabsched.engine.monte_carlo_summary`: noise drawn while the pass runs, no
    duration matrix), or None where it does not apply: a model that draws
    something other than lognormal noise (random spikes, replayed
    measurements), two noise models, or resources the pull pass cannot hold."""
    parts = [] if variation is None else (
        list(variation.parts) if isinstance(variation, Combined) else [variation])
    noises = [part for part in parts if isinstance(part, Noise)]
    fixed = [part for part in parts if not isinstance(part, Noise)]
    if len(noises) > 1 or any(part.random for part in fixed):
        return None
    lowered = context.lowered
    draw = context.new_draw([0])       # what every sample shares: the models but noise
    for part in fixed:
        part.validate(context.table)
        part.apply(context, draw)
    # the composer's answer for the fixed part; the pass composes each sample's noise alike
    base = context.node_durations(draw)[0]
    if engine.choose(lowered, base) == "events":    # factors are > 0: so are the cells
        return None
    factors = context.costs.overlap_factors(lowered)
    if len(factors) and np.any(factors != factors[0]):   # the fused pass takes one factor
        return None
    num_ops = context.num_ops
    op_sigma = op_shift = np.zeros(num_ops, dtype=np.float32)
    transfer_sigma = transfer_shift = np.float32(0.0)
    if noises and noises[0].active(context):
        noise = noises[0]
        noise.validate(context.table)
        cv = noise.op_cv(context.table)
        if np.any(cv > 0):
            op_sigma, op_shift = lognormal_parameters(cv, num_ops)
        if noise.transfers > 0 and context.num_transfers:
            (transfer_sigma,), (transfer_shift,) = lognormal_parameters(noise.transfers, 1)
    transfer_base = np.empty((1, context.num_transfers))
    draw.transfer_durations(transfer_base)
    streams = context.streams
    draws = engine.NoisyDurations(
        cell_first_op=lowered.cell_first_op,
        op_base=np.ascontiguousarray(draw.op[0]), op_key=streams.op_keys, op_sigma=op_sigma,
        op_shift=op_shift, overlap=float(factors[0]) if len(factors) else 1.0,
        transfer_base=transfer_base[0], transfer_key=streams.transfer_keys,
        transfer_sigma=float(transfer_sigma), transfer_shift=float(transfer_shift),
        extra=np.ascontiguousarray(base[lowered.extra_nodes]),
        noise_stream=streams.stream_key("noise"),
        transfer_stream=streams.stream_key("transfer-noise"))
    return engine.monte_carlo_summary(lowered, draws, samples, nominal=base)


def run_monte_carlo(context, variation, *, samples, chunk_bytes=DEFAULT_CHUNK_BYTES,
                    keep_busy=False, fused=True):
    """:func:`monte_carlo` on a prepared :class:`VariationContext` (the search reuses one).

    ``fused=False`` draws every chunk's durations with numpy and runs them through
    the kernel's summary pass, even where the fused pass applies (the same numbers).
    """
    samples = _check_count("samples", samples)
    chunk_bytes = _check_count("chunk_bytes", chunk_bytes)
    lowered = context.lowered
    table = context.table
    D = table.num_devices
    lowered.check_acyclic()
    chains = lowered.link_chains()    # held while the passes below run (made once for them)
    with np.errstate(over="ignore", invalid="ignore"):
        nominal_durations = context.mean_durations(variation)[None, :]
    _refuse_overflow(nominal_durations, context, variation)
    nominal, nominal_busy, _, _ = engine.summarize(lowered, nominal_durations)
    fused = _fused(context, variation, samples) if fused else None
    if fused is not None:
        makespans, busy, finish = fused
        _refuse_overflow(makespans, context, variation)
        chunks = 1
    else:
        # a sample holds its durations, their parts, and the noise's temporaries
        per_sample = 8 * (lowered.num_nodes + 4 * context.num_ops + 5 * context.num_transfers)
        chunk = max(1, min(samples, chunk_bytes // max(per_sample, 1)))
        makespans = np.empty(samples)
        busy = np.empty((samples, D))
        finish = np.empty((samples, D))
        chunks = 0
        for first in range(0, samples, chunk):
            indices = np.arange(first, min(samples, first + chunk))
            with np.errstate(over="ignore", invalid="ignore"):
                durations = context.sample_durations(variation, indices)
            _refuse_overflow(durations, context, variation)
            rows = slice(first, first + len(indices))
            makespans[rows], busy[rows], _, finish[rows] = engine.summarize(lowered, durations)
            del durations
            chunks += 1
    del chains
    nominal_makespan = float(nominal[0])
    with np.errstate(over="ignore", invalid="ignore"):   # an overflow is refused, not warned
        mean_makespan = float(makespans.mean())
    _refuse_overflow(np.array([nominal_makespan, mean_makespan]), context, variation)
    devices = [DeviceRuntime(device=d, mean_busy=float(busy[:, d].mean()),
                             mean_idle=mean_makespan - float(busy[:, d].mean()),
                             nominal_idle=nominal_makespan - float(nominal_busy[0, d]),
                             mean_finish=float(finish[:, d].mean()))
               for d in range(D)]
    return MonteCarloResult(
        table=table, samples=samples, seed=context.seed, iteration=context.iteration,
        makespans=makespans, nominal_makespan=nominal_makespan, devices=devices,
        time_unit=(context.costs.time_unit if variation is None
                   else variation.time_unit(context)),
        variation=None if variation is None else variation.describe(), chunks=chunks,
        busy=busy if keep_busy else None)
