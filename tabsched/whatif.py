"""What-if from one trace: fit per-operation costs to a profiled step, predict another schedule.

A profiler (Kineto) trace of a pipeline run -- one file per rank, the ``PP:`` action
events PyTorch's pipelining runtime writes (:mod:`tabsched.formats.kineto`) -- says
what each rank ran, in which order, and how long each operation took. From it:

1. :func:`read_step` recovers the **table that ran** (each rank's operations of the
   first profiled iteration, in start order; every later iteration must run the same
   order, and the ranks' rows must make one valid table) and the **measured iteration
   times** (first operation start to last operation end over all ranks, per iteration);
2. :func:`fit_costs` fits **per-operation costs**: per stage and kind (F, B, I, W) the
   mean duration of the profiled iteration, its spread (op-to-op coefficient of
   variation, and one fitted value per iteration), and a **point-to-point time**;
3. :func:`whatif` builds the other table (another family, microbatch count or depth),
   re-partitions the model's layers over its stages and evaluates it once per profiled
   iteration's costs: the prediction is their mean, the spread their range.

What one trace allows, and the assumptions made where it does not
-----------------------------------------------------------------
* **Per-layer cost.** A stage's measured time is spread evenly over the layers it holds
  (``stage_layers`` of the traced run; even when not given): a stage of the other table
  costs the sum over its layers of ``stage cost / layers per stage``, or, when the depths
  do not divide the layers, the same uniform density integrated over the fraction of the
  model it holds. The embedding and the output layer live in the first and last stage
  and are spread with them: the trace's ``PP:`` ranges cannot tell them apart.
* **Kinds the trace lacks.** A table that needs I and W from a trace of full backwards
  takes ``I = W = B / 2`` (the StageCosts default, after Qi et al. 2023, "Zero Bubble
  Pipeline Parallelism", Section 2, who take T_B ~= T_W); one that needs B from a trace of
  I and W takes ``B = I + W``. Either is listed in :attr:`Fit.unmatched`.
* **Microbatch size** is the traced one: more microbatches is a larger batch, not smaller
  microbatches (operation times do not change with the count).
* **Point to point.** On a CPU trace the rank posts a send in a ``PP:<s>SEND_*`` action
  (counted in the producer's time, :mod:`tabsched.formats.kineto`); the consumer's
  ``recv`` event ends when the data is there. The transfer time fitted is what lies
  beyond the posting: the arrival minus the end of the SEND action, over the receives
  that waited for data (the receive began before the send ended), clock offsets between
  ranks ignored (the runner's ranks share one host clock). Every activation of one model
  has one size, so the fit is one number (latency plus bytes / bandwidth at that size):
  latency and bandwidth cannot be told apart from one message size, and a prediction for
  other sizes would need a second trace. Traces read from GPU timelines give no transfer
  fit (their streams' waits are not kernels); the transfer time is then 0, and so noted.

Examples
--------
>>> import os, tempfile
>>> from tabsched import StageCosts, generate
>>> from tabsched.whatif import synthetic_trace, whatif
>>> folder = tempfile.mkdtemp()
>>> table = generate("1f1b", devices=2, microbatches=4)
>>> synthetic_trace(table, StageCosts([1e-3, 1e-3], comm=0.0), folder, iterations=2)
>>> result = whatif(folder, "1f1b", microbatches=8)
>>> round(result.predicted * 1e3, 3)           # (8 + 2 - 1) * (1 + 2) ms
27.0
"""

import json
import math
import os
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from tabsched.cells import KINDS, Op, parse_pp_label
from tabsched.exceptions import InvalidParameterError, TabschedError
from tabsched.formats import kineto
from tabsched.synthetic_trace import synthetic_trace

__all__ = ["TracedStep", "Fit", "WhatIf", "read_step", "fit_costs", "whatif",
           "synthetic_trace", "KNOWN_SCHEMA_VERSIONS"]

#: Kineto's ``schemaVersion`` values this reader knows (PyTorch 2.x writes 1; the key
#: is absent in traces written by ``export_chrome_trace`` before 1.13). A trace from an
#: unknown framework version is refused with one line, not half-read.
KNOWN_SCHEMA_VERSIONS = (1,)
_PER_SECOND = 1e6          # the trace's ts and dur are microseconds (kineto)


@dataclass
class TracedStep:
    """What one trace holds: the table that ran, its iterations, its measurements.

    Attributes
    ----------
    table : ScheduleTable
        Each rank's operations of the first profiled iteration, in start order.
    iterations : list of float
        Measured seconds per profiled iteration (first start to last end, all ranks).
    profile : KinetoProfile
        The measured durations per operation label (:func:`tabsched.read_kineto`).
    transfers : list of float
        Seconds each waited-for transfer took beyond its send's posting.
    files : tuple of str
    timeline : str
        ``"cpu"`` or ``"gpu"``.
    """

    table: object
    iterations: list
    profile: object
    transfers: list
    files: tuple
    timeline: str = "cpu"


@dataclass
class Fit:
    """Per-operation costs fitted to a traced step.

    Attributes
    ----------
    stage_costs : dict
        ``{kind: array (stages,)}``, seconds, the mean over every profiled operation.
    per_iteration : dict
        ``{kind: array (iterations, stages)}``: the same fitted on each iteration alone.
    cv : dict
        ``{kind: array (stages,)}``: op-to-op coefficient of variation (std / mean).
    counts : dict
        ``{kind: array (stages,)}``: operations measured.
    transfer : float
        Seconds of one point-to-point transfer (median; 0 when none was observed).
    transfer_spread : tuple of float
        ``(min, max)`` of the observed transfers, or ``(0, 0)``.
    stage_layers : tuple of int
        Layers of each traced stage (the density the re-partition uses).
    unmatched : list of str
        What the trace could not give, and what was assumed instead.
    """

    stage_costs: dict
    per_iteration: dict
    cv: dict
    counts: dict
    transfer: float
    transfer_spread: tuple
    stage_layers: tuple
    unmatched: list = field(default_factory=list)

    def to_dict(self):
        """JSON-safe: seconds per stage and kind, spreads, the transfer, the notes."""
        return {"stage_costs": {kind: values.tolist() for kind, values in self.stage_costs.items()},
                "cv": {kind: values.tolist() for kind, values in self.cv.items()},
                "counts": {kind: values.tolist() for kind, values in self.counts.items()},
                "transfer": self.transfer, "transfer_spread": list(self.transfer_spread),
                "stage_layers": list(self.stage_layers), "unmatched": list(self.unmatched)}


@dataclass
class WhatIf:
    """A prediction for another table from one trace's fitted costs.

    Attributes
    ----------
    table : ScheduleTable
        The table predicted.
    predicted : float
        Mean predicted iteration time (seconds) over the profiled iterations' costs.
    spread : tuple of float
        ``(min, max)`` of those predictions.
    samples : list of float
        One prediction per profiled iteration.
    traced : TracedStep
    fit : Fit
    replayed : float
        The traced table evaluated with the same fitted costs (its check: against
        ``traced.iterations``).
    """

    table: object
    predicted: float
    spread: tuple
    samples: list
    traced: object
    fit: object
    replayed: float

    def to_dict(self):
        """JSON-safe summary: prediction, spread, the traced step, the fit."""
        measured = self.traced.iterations
        return {"predicted": self.predicted, "spread": list(self.spread),
                "samples": list(self.samples),
                "table": {"family": self.table.family, "devices": self.table.num_devices,
                          "stages": self.table.num_stages,
                          "microbatches": self.table.num_microbatches},
                "traced": {"family": self.traced.table.family,
                           "devices": self.traced.table.num_devices,
                           "stages": self.traced.table.num_stages,
                           "microbatches": self.traced.table.num_microbatches,
                           "iterations": list(measured), "files": list(self.traced.files)},
                "replayed": self.replayed, "fit": self.fit.to_dict()}


# ------------------------------------------------------------------ reading
def _rank_of(document, file, fallback):
    info = document.get("distributedInfo") if isinstance(document, dict) else None
    rank = info.get("rank") if isinstance(info, dict) else None
    if rank is None:
        return fallback
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise InvalidParameterError(f"{file}: distributedInfo.rank must be an integer >= 0, "
                                    f"not {json.dumps(rank)[:40]}")
    return rank


def _check_version(document, file):
    if not isinstance(document, dict) or "schemaVersion" not in document:
        return
    version = document["schemaVersion"]
    if version not in KNOWN_SCHEMA_VERSIONS:
        raise InvalidParameterError(
            f"{file}: unknown trace schemaVersion {json.dumps(version)[:40]} (this reader "
            f"knows {', '.join(map(str, KNOWN_SCHEMA_VERSIONS))}: PyTorch 2.x's Kineto)")


def _rank_events(document, file):
    """``(ops, sends, receives, timeline)`` of one rank's file (checked by kineto first):
    ops as ``(start, end, label)`` in start
    order; sends as ``{(direction, stage, microbatch): [end]}``; receives as
    ``{(direction, stage, microbatch): [(action start, arrival)]}``."""
    # add_file checked every event of this document already (kineto._events): read the
    # raw list without a second check, which is most of a large trace's reading time
    raw = document.get("traceEvents") if isinstance(document, dict) else document
    events = [(index, (event.get("pid", 0), event.get("tid", 0)), event["name"],
               event.get("cat", ""), float(event["ts"]), float(event["ts"]) + float(event["dur"]))
              for index, event in enumerate(raw) if event.get("ph") == "X"]
    gpu = any(category == "gpu_user_annotation" and name.startswith("PP:")
              for _, _, name, category, _, _ in events)
    wanted = "gpu_user_annotation" if gpu else "user_annotation"
    ops, sends, receive_actions, recv_events = [], defaultdict(list), [], defaultdict(list)
    for index, thread, name, category, start, end in events:
        if category == wanted and name.startswith("PP:"):
            cell = parse_pp_label(name[3:])
            if isinstance(cell, Op):
                ops.append((start, end, str(cell), thread))
            elif cell is None:
                raise InvalidParameterError(f"{file}: event {index}: {name[:60]!r} is not an "
                                            f"action of PyTorch's pipelining runtime")
            elif hasattr(cell, "parts"):
                ops.append((start, end, "(" + ";".join(map(str, cell.parts)) + ")", thread))
            elif cell.kind.startswith("SEND"):
                sends[(cell.kind[-1], cell.stage, cell.microbatch)].append(end)
            elif cell.kind.startswith("RECV"):
                receive_actions.append(((cell.kind[-1], cell.stage, cell.microbatch),
                                        thread, start, end))
        elif "recv" in name.lower() and not name.startswith("PP:"):
            recv_events[thread].append((start, end))
    receives = defaultdict(list)
    for key, thread, start, end in receive_actions:
        inside = [stop for begin, stop in recv_events[thread] if start <= begin <= end]
        if inside:
            receives[key].append((start, max(inside)))
    ops.sort()
    return ops, sends, receives, "gpu" if gpu else "cpu"


def _iterations_of(ops, file):
    """The rank's operations cut into iterations by each label's occurrence count."""
    seen = defaultdict(int)
    per_iteration = defaultdict(list)
    for start, end, label, _ in ops:
        per_iteration[seen[label]].append((start, end, label))
        seen[label] += 1
    counts = set(seen.values())
    if len(counts) > 1:
        raise InvalidParameterError(
            f"{file}: the operations do not repeat evenly ({min(counts)} to {max(counts)} "
            f"occurrences of one label): a trace cut inside an iteration, or of a run whose "
            f"schedule changed")
    return [per_iteration[i] for i in range(len(per_iteration))]


def read_step(path, *, max_bytes=kineto.DEFAULT_MAX_BYTES):
    """Read a traced step: the table that ran, its iteration times and its measurements.

    Parameters
    ----------
    path : str or path
        A trace file or a directory of them (one per rank, as the profiler writes).
    max_bytes : int
        The largest file read (decompressed).

    Returns
    -------
    TracedStep

    Raises
    ------
    InvalidParameterError
        A file that cannot be read, is cut short (the job still writing it: "not JSON"),
        comes from an unknown framework version, or whose ranks disagree on the schedule
        (two files of one rank, iterations in different orders, rows that make no valid
        table); each message names the file.
    """
    from tabsched.table import ScheduleTable
    files = kineto.trace_files(path)
    rows, iterations, sends, receives, timelines = {}, {}, defaultdict(list), {}, set()
    reading = kineto._Reading()          # the durations, from the same parse of each file
    for position, file in enumerate(files):
        document = kineto._load(file, max_bytes)
        _check_version(document, file)
        rank = _rank_of(document, file, position)
        reading.add_file(document, file)            # checks every event, or raises
        ops, rank_sends, rank_receives, timeline = _rank_events(document, file)
        del document
        if not ops:
            continue
        if rank in rows:
            raise InvalidParameterError(f"{file}: a second trace of rank {rank} (ranks "
                                        f"disagree on the schedule: one file per rank)")
        timelines.add(timeline)
        cut = _iterations_of(ops, file)
        order = [label for _, _, label in cut[0]]
        for number, iteration in enumerate(cut[1:], start=1):
            if [label for _, _, label in iteration] != order:
                raise InvalidParameterError(f"{file}: rank {rank} runs iteration {number} in "
                                            f"another order than iteration 0 (ranks disagree "
                                            f"on the schedule)")
        rows[rank] = order
        iterations[rank] = [(min(s for s, _, _ in it), max(e for _, e, _ in it)) for it in cut]
        for key, ends in rank_sends.items():
            sends[key].extend(ends)
        starts = defaultdict(list)
        for start, _, label, _ in ops:
            starts[label].append(start)
        receives[rank] = (rank_receives, starts)
    if not rows:
        raise InvalidParameterError(f"{os.fspath(path)}: no pipeline operations "
                                    f"(PP:<stage><F|I|B|W><microbatch> events)")
    counts = {rank: len(spans) for rank, spans in iterations.items()}
    if len(set(counts.values())) > 1:
        listed = ", ".join(f"rank {rank}: {count}" for rank, count in sorted(counts.items()))
        raise InvalidParameterError(f"{os.fspath(path)}: ranks disagree on the schedule: they "
                                    f"profiled different numbers of iterations ({listed})")
    ranks = sorted(rows)
    if ranks != list(range(len(ranks))):
        raise InvalidParameterError(f"{os.fspath(path)}: ranks {ranks} traced; a pipeline "
                                    f"needs every rank 0..{max(ranks)} (a file missing?)")
    try:
        table = ScheduleTable([rows[rank] for rank in ranks])
    except TabschedError as error:
        raise InvalidParameterError(f"{os.fspath(path)}: ranks disagree on the schedule: their "
                                    f"rows make no valid table: {str(error)[:200]}") from None
    count = next(iter(counts.values()))
    measured = [max(iterations[r][i][1] for r in ranks) - min(iterations[r][i][0] for r in ranks)
                for i in range(count)]
    transfers = []
    for rank_receives, starts in receives.values():
        for (direction, stage, micro), entries in rank_receives.items():
            # RECV_F on stage s takes what stage s - 1 sent; RECV_B what stage s + 1 sent
            producer = stage - 1 if direction == "F" else stage + 1
            posted = sorted(sends.get((direction, producer, micro), ()))
            consumers = sorted(starts.get(f"{stage}F{micro}", ()) if direction == "F" else
                               starts.get(f"{stage}B{micro}", []) + starts.get(f"{stage}I{micro}",
                                                                              []))
            for begin, arrival in entries:
                # the recv event ends when wait() returns: the arrival only if the consumer
                # was already blocked in it (it started before), else when it asked
                after = [start for start in consumers if start >= begin]
                before = [end for end in posted if end <= arrival + 1.0]
                if before and after and after[0] < arrival and begin < before[-1]:
                    transfers.append(max(arrival - max(before[-1], after[0]), 0.0)
                                     / _PER_SECOND)
    profile = kineto._finished(reading, files)
    return TracedStep(table=table, iterations=[value / _PER_SECOND for value in measured],
                      profile=profile, transfers=transfers, files=tuple(files),
                      timeline="gpu" if "gpu" in timelines else "cpu")


# ------------------------------------------------------------------ fitting
def fit_costs(step, *, stage_layers=None):
    """Per-stage, per-kind costs of a :class:`TracedStep`, with their spread.

    Parameters
    ----------
    step : TracedStep
    stage_layers : sequence of int, optional
        Layers each traced stage held (default: the traced table's, else one each:
        a uniform density).

    Returns
    -------
    Fit
    """
    table = step.table
    stages = table.num_stages
    if stage_layers is None:
        stage_layers = table.stage_layers if table.stage_layers is not None else [1] * stages
    stage_layers = tuple(int(value) for value in stage_layers)
    if len(stage_layers) != stages or min(stage_layers) < 1:
        raise InvalidParameterError(f"stage layers {list(stage_layers)}: give one count >= 1 "
                                    f"for each of the trace's {stages} stages")
    iterations = len(step.iterations)
    values = defaultdict(list)                       # (kind, stage) -> every measurement
    by_iteration = defaultdict(lambda: [[] for _ in range(iterations)])
    for label, measured in step.profile.measurements.items():
        kind, stage, _ = parse_pp_label(label)
        values[(kind, stage)].extend(measured)
        for number, value in enumerate(measured[:iterations]):
            by_iteration[(kind, stage)][number].append(value)
    kinds = sorted({kind for kind, _ in values}, key=KINDS.index)
    stage_costs, per_iteration, cv, counts = {}, {}, {}, {}
    unmatched = []
    for kind in kinds:
        missing = [stage for stage in range(stages) if (kind, stage) not in values]
        if missing:
            raise InvalidParameterError(f"{step.files[0]}: no {kind} measured on stage "
                                        f"{missing[0]}, which the table runs")
        means = np.array([np.mean(values[(kind, s)]) for s in range(stages)])
        stage_costs[kind] = means
        cv[kind] = np.array([np.std(values[(kind, s)]) / means[s] if means[s] > 0 else 0.0
                             for s in range(stages)])
        counts[kind] = np.array([len(values[(kind, s)]) for s in range(stages)])
        per_iteration[kind] = np.array(
            [[np.mean(by_iteration[(kind, s)][i]) if by_iteration[(kind, s)][i] else means[s]
              for s in range(stages)] for i in range(iterations)])
    if step.transfers:
        transfer = float(np.median(step.transfers))
        spread = (float(min(step.transfers)), float(max(step.transfers)))
    else:
        transfer, spread = 0.0, (0.0, 0.0)
        unmatched.append("point-to-point: no receive waited for data in the trace"
                         + (" (GPU timeline: stream waits are not kernels)"
                            if step.timeline == "gpu" else "")
                         + "; transfers cost 0 beyond the send's posting")
    unmatched.append("point-to-point: one message size in the trace, so latency and "
                     "bandwidth are one fitted time (Hockney's two terms cannot be split)")
    unmatched.append("embedding and output layer: inside the first and last stage's time, "
                     "spread over their layers")
    return Fit(stage_costs=stage_costs, per_iteration=per_iteration, cv=cv, counts=counts,
               transfer=transfer, transfer_spread=spread, stage_layers=stage_layers,
               unmatched=unmatched)


def _repartition(per_stage, layers, target_layers):
    """Costs of the target stages: the traced stages' uniform density per layer, integrated
    over the fraction of the model each target stage holds."""
    edges = np.concatenate([[0.0], np.cumsum(layers)]) / float(sum(layers))
    density = np.asarray(per_stage, dtype=np.float64) / np.diff(edges)
    target = np.concatenate([[0.0], np.cumsum(target_layers)]) / float(sum(target_layers))
    out = np.zeros(len(target_layers))
    for index in range(len(target_layers)):
        lo, hi = target[index], target[index + 1]
        overlap = np.clip(np.minimum(edges[1:], hi) - np.maximum(edges[:-1], lo), 0.0, None)
        out[index] = float(np.dot(overlap, density))
    return out


def _costs_for(fit, chosen, target_layers, unmatched):
    """StageCosts of the target's stages, the kinds it needs derived where the trace lacks them."""
    from tabsched.costs import StageCosts
    kinds = dict(chosen)
    if "B" not in kinds and "I" in kinds and "W" in kinds:
        kinds["B"] = kinds["I"] + kinds["W"]
        unmatched.append("B: not in the trace; B = I + W")
    if "B" in kinds and ("I" not in kinds or "W" not in kinds):
        kinds["I"], kinds["W"] = kinds["B"] / 2, kinds["B"] / 2
    if "F" not in kinds or "B" not in kinds:
        raise InvalidParameterError("the trace holds no forward or no backward operations")
    parts = {kind: _repartition(values, fit.stage_layers, target_layers)
             for kind, values in kinds.items()}
    return StageCosts(parts["F"], parts["B"], parts["I"], parts["W"], comm=fit.transfer)


def _even(layers, stages):
    return [layers // stages + (1 if stage < layers % stages else 0) for stage in range(stages)]


def whatif(trace, schedule, *, devices=None, microbatches=None, chunks=None, layers=None,
           stage_layers=None, max_bytes=kineto.DEFAULT_MAX_BYTES, **params):
    """Predict another schedule's iteration time from the costs fitted to one trace.

    Parameters
    ----------
    trace : str, path or TracedStep
        A trace file, a directory of them (one per rank), or a :func:`read_step` result.
    schedule : str
        The family to predict (``tabsched list``).
    devices, microbatches, chunks : int, optional
        Its pipeline depth, microbatch count and chunks per device; each defaults to the
        traced table's (chunks only when the family takes them).
    layers : int, optional
        Layers of the model (default: the traced stages' sum, else the least common
        multiple of the two stage counts -- a uniform density either way).
    stage_layers : sequence of int, optional
        Layers each traced stage held (default: an even split of ``layers``).
    max_bytes : int
    **params
        Other parameters of the family (``generate``'s).

    Returns
    -------
    WhatIf
        ``predicted`` with ``spread``, the fit and what it could not match.

    Raises
    ------
    InvalidParameterError, UnknownNameError
        A trace that cannot be read (see :func:`read_step`), a family unknown, or sizes
        the family refuses.
    """
    from tabsched.evaluate import evaluate
    from tabsched.schedules import generate
    step = trace if isinstance(trace, TracedStep) else read_step(trace, max_bytes=max_bytes)
    traced = step.table
    stages = traced.num_stages
    devices = traced.num_devices if devices is None else devices
    microbatches = traced.num_microbatches if microbatches is None else microbatches
    keywords = dict(params, devices=devices, microbatches=microbatches)
    if chunks is not None:
        keywords["chunks"] = chunks
    table = generate(schedule, **keywords)
    target_stages = table.num_stages
    if layers is None:
        if stage_layers is not None:
            layers = int(sum(stage_layers))
        elif traced.stage_layers is not None:
            layers = int(sum(traced.stage_layers))
        else:
            layers = math.lcm(stages, target_stages)
    if stage_layers is None:
        if layers < stages:
            raise InvalidParameterError(f"--layers {layers}: fewer layers than the trace's "
                                        f"{stages} stages")
        stage_layers = traced.stage_layers or _even(layers, stages)
    if layers < target_stages:
        raise InvalidParameterError(f"--layers {layers}: fewer layers than the {target_stages} "
                                    f"stages of {schedule}")
    fit = fit_costs(step, stage_layers=stage_layers)
    target_layers = table.stage_layers or _even(layers, target_stages)
    notes = list(fit.unmatched)
    kinds_needed = {KINDS[code] for code in np.unique(table.kind).tolist()}
    for kind in sorted(kinds_needed - set(fit.stage_costs), key=KINDS.index):
        if kind in "IW" and "B" in fit.stage_costs:
            notes.append(f"{kind}: not in the trace; I = W = B / 2 (StageCosts' default; Qi et "
                         f"al. 2023, Zero Bubble, Section 2: T_B ~= T_W)")
    samples = []
    for number in range(len(step.iterations)):
        chosen = {kind: values[number] for kind, values in fit.per_iteration.items()}
        costs = _costs_for(fit, chosen, target_layers, [])
        samples.append(float(evaluate(table, costs).makespan))
    _costs_for(fit, fit.stage_costs, target_layers, notes)   # the notes of the derivation
    self_costs = _costs_for(fit, fit.stage_costs, list(stage_layers), [])
    replayed = float(evaluate(traced, self_costs).makespan)
    fit.unmatched = list(dict.fromkeys(notes))
    return WhatIf(table=table, predicted=float(np.mean(samples)),
                  spread=(float(min(samples)), float(max(samples))), samples=samples,
                  traced=step, fit=fit, replayed=replayed)
