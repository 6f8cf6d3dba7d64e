"""Monte Carlo evaluation: one lowered table, many sampled iterations, one kernel pass.

:func:`monte_carlo` lowers a table once, draws the durations of ``samples``
iterations from a variation model and runs them through the kernel's samples
axis (:meth:`tabsched.LoweredSchedule.run_summary`), which keeps per sample
only the makespan and, per device, busy time, first start and last end.

Memory: the durations of a chunk of samples are a (chunk x nodes) float64
matrix, plus the variation model's parts; chunks are sized to ``chunk_bytes``
(256 MiB by default, about 40 samples of a 200k-node table), so a thousand
samples of a large table never hold a 1.6 GB matrix. Chunking does not change
any number: draws are keyed by sample index, not by chunk.

Link contention without a heap
    Under contention ``link`` each directed link serves its transfers first
    come, first served. They are ready when their producers end, and the
    producers of one link all run on its sending device, one after the other:
    when every cell lasts longer than zero, the serving order is the sending
    row's order (transfers of one cell by node id, as the kernel breaks ties),
    whatever the durations. The FIFO is then the same as an edge from each
    transfer to the next on its link, and :func:`link_chains` adds those edges
    so that Monte Carlo runs the kernel's longest-path pass, several times
    faster than its event heap, with the same starts to the bit. A chunk with a
    cell of zero duration runs the heap.

Run-time bubble
    ``mean makespan under variation - makespan at mean durations``: the time
    the variation costs beyond what its average durations explain (Jensen's
    gap of the max-plus recursion; never negative under contention ``none``
    or ``link``). Per device, the same for its idle time: ``mean idle -
    idle at mean durations``.
"""

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from tabsched.adapt.variation import VariationContext, check_variation
from tabsched.evaluate import checked_costs, lower_for
from tabsched.exceptions import InvalidParameterError
from tabsched.lower import INDEX
from tabsched.table import ScheduleTable

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
    busy: np.ndarray = field(default=None, repr=False)

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
    """``lowered`` under contention ``link`` as a DAG without resources (see the module
    docstring), or ``None`` if it is not under contention ``link``.

    Valid for durations whose cells all last longer than zero, and only when a
    transfer is ready as its producer ends (no ``transfer_after`` edges).
    """
    if (lowered.contention != "link" or len(lowered.transfers) == 0
            or lowered.extra_transfer_edges):
        return None
    transfers = lowered.transfers
    D = lowered.table.num_devices
    node = lowered.num_cells + np.arange(len(transfers), dtype=np.int64)
    producer = lowered.cell_of_op[transfers.producer].astype(np.int64)
    link = transfers.src.astype(np.int64) * D + transfers.dst
    order = np.lexsort((node, producer, link))
    same = link[order][1:] == link[order][:-1]
    n = lowered.num_nodes
    sources = np.concatenate([np.repeat(np.arange(n, dtype=np.int64), np.diff(lowered.indptr)),
                              node[order][:-1][same]])
    targets = np.concatenate([lowered.successors.astype(np.int64), node[order][1:][same]])
    by_source = np.argsort(sources, kind="stable")
    indptr = np.zeros(n + 1, dtype=INDEX)
    np.cumsum(np.bincount(sources, minlength=n), out=indptr[1:])
    return dataclasses.replace(lowered, indptr=indptr,
                               successors=targets[by_source].astype(INDEX),
                               resources=np.empty((n, 0), dtype=INDEX), num_resources=0)


def _summary(lowered, chained, durations, node_devices):
    """``run_summary`` on the chained DAG when it is exact for these durations."""
    if chained is not None and np.all(durations[:, :lowered.num_cells] > 0):
        return chained.run_summary(durations, node_devices=node_devices)
    return lowered.run_summary(durations, node_devices=node_devices)


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


def monte_carlo(table, costs=None, variation=None, *, samples=1000, seed=0, iteration=0,
                contention=None, grad_sync=None, optimizer=None, transfer_after=None,
                chunk_bytes=DEFAULT_CHUNK_BYTES):
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
    contention, grad_sync, optimizer, transfer_after :
        As in :func:`tabsched.evaluate` (the gradient sync defaults to the table's own,
        e.g. PyTorch's REDUCE_GRAD, else the cost model's).
    chunk_bytes : int
        Memory for the durations of one chunk of samples (see the module docstring).

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
    costs = checked_costs(table, costs)
    check_variation(variation)
    lowered = lower_for(table, costs, contention=contention, grad_sync=grad_sync,
                        optimizer=optimizer, transfer_after=transfer_after)
    context = VariationContext(lowered, costs, seed=seed, iteration=iteration)
    return run_monte_carlo(context, variation, samples=samples, chunk_bytes=chunk_bytes)


def run_monte_carlo(context, variation, *, samples, chunk_bytes=DEFAULT_CHUNK_BYTES,
                    keep_busy=False):
    """:func:`monte_carlo` on a prepared :class:`VariationContext` (the search reuses one)."""
    samples = _check_count("samples", samples)
    chunk_bytes = _check_count("chunk_bytes", chunk_bytes)
    lowered = context.lowered
    table = context.table
    D = table.num_devices
    node_devices = lowered.node_devices()
    chained = link_chains(lowered)
    with np.errstate(over="ignore", invalid="ignore"):
        nominal_durations = context.mean_durations(variation)[None, :]
    _refuse_overflow(nominal_durations, context, variation)
    nominal, nominal_busy, _, _ = _summary(lowered, chained, nominal_durations, node_devices)
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
        makespans[rows], busy[rows], _, finish[rows] = _summary(lowered, chained, durations,
                                                                node_devices)
        del durations
        chunks += 1
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
        time_unit=context.costs.time_unit,
        variation=None if variation is None else variation.describe(), chunks=chunks,
        busy=busy if keep_busy else None)
