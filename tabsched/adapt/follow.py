"""Follow a running job: read each new step's trace, refit, re-plan, say when switching pays.

A training job writes one profiler trace per step or profiler window into a directory
(each **entry** of the directory is one step: a subdirectory of per-rank files, as
``examples/torch_pipeline.py`` and ``tensorboard_trace_handler`` per window write them, or
one trace file). :func:`follow` polls the directory (a sleep between polls, no file-system
events: no new dependency) and, for each new entry that reads completely:

1. reads the traced step (:func:`tabsched.whatif.read_step`) and checks that it ran the
   followed table;
2. updates the fitted costs -- per stage and kind, the mean over the last ``window``
   steps -- and their variation: a :class:`~tabsched.adapt.Replay` of the last
   ``window`` measurements of every operation (bounded: memory does not grow with the
   steps followed);
3. re-plans when the fit moved by more than ``retune`` since the last search: adapt's
   search (:func:`~tabsched.adapt.adapt`) from the followed table under the fitted
   variation, within the memory budget;
4. reports a **switch** when ``horizon * (current - adapted) - switch_cost`` exceeds
   ``threshold * horizon * current`` (mean iteration times under the fitted variation),
   once per new advice (not again while the same change keeps paying).

The switching cost
------------------
PyTorch's pipelining runtime drains the pipeline at the end of every ``step()`` (every
microbatch's backward runs before it returns, ``torch.distributed.pipelining``'s
schedules), so a table changed between steps loses no in-flight work, and adapt's
transforms keep every stage on its rank, so no weights move. What a switch costs is the
step in which the job loads the new table (``_load_csv``), rebuilds its schedule and, for
split microbatches, its data loader's batches: an assumption, not a measurement, charged
by default as **one iteration of the current table** (``switch_cost=None``). Give the
seconds you measured instead when you know them.

Bad input never stops the loop: an entry that does not read (a file the job is still
writing, a rank's file missing) is retried on the next poll and, if it fails again
unchanged (for ``settle`` seconds), skipped with one line naming it and what is
missing; an entry of another table, from an unknown framework version or whose ranks
disagree is skipped with its line; a directory that disappears is said once, and polling goes on until it is back,
``max_files`` entries were processed or ``timeout`` passed. The log (``log``) is JSON
lines, each written whole by one ``write`` on a file opened for appending and flushed,
so a stop (Ctrl-C, SIGTERM) between or during steps never leaves half a line.
"""

import json
import os
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field

import numpy as np

from tabsched.exceptions import InvalidParameterError, TabschedError

__all__ = ["follow", "FollowResult"]


@dataclass
class FollowResult:
    """What a :func:`follow` run did.

    Attributes
    ----------
    processed : list of str
        Entries read and planned from, in order.
    skipped : dict
        ``{entry: reason}`` of entries skipped.
    switches : list of dict
        The switch events (as logged).
    searches : int
    seconds : list of float
        Processing time per processed entry.
    stopped : str
        Why it stopped: ``"max-files"``, ``"timeout"`` or ``"interrupted"``.
    """

    processed: list = field(default_factory=list)
    skipped: dict = field(default_factory=dict)
    switches: list = field(default_factory=list)
    searches: int = 0
    seconds: list = field(default_factory=list)
    stopped: str = ""


class _Log:
    """JSON lines appended whole: one ``os.write`` of one line, on an ``O_APPEND`` file."""

    def __init__(self, path):
        self.fd = None if path is None else os.open(
            os.fspath(path), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, record):
        if self.fd is None:
            return
        data = (json.dumps(record, sort_keys=True) + "\n").encode()
        written = os.write(self.fd, data)
        if written != len(data):    # a full disk: say so rather than leave half a line
            raise InvalidParameterError(f"log: wrote {written} of {len(data)} bytes of a "
                                        f"line (disk full?)")
        os.fsync(self.fd)

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _orders(table):
    return [[str(op) for op in row if op is not None] for row in table.rows]


def _entries(directory):
    """The directory's traces (``.json``, ``.json.gz`` files) and folders, oldest first (by
    modification time, then name); hidden names are a writer's temporaries."""
    from tabsched.formats.kineto import TRACE_SUFFIXES
    names = os.listdir(directory)
    stamped = []
    for name in names:
        path = os.path.join(directory, name)
        if name.startswith(".") or not (name.endswith(TRACE_SUFFIXES) or os.path.isdir(path)):
            continue     # hidden (a writer's temporary) or not a trace
        try:
            stamped.append((os.stat(path).st_mtime, name, path))
        except OSError:
            continue   # removed between the listing and the stat
    return [path for _, _, path in sorted(stamped)]


def _signature(path):
    """Size and modification time of an entry (a directory: of each file in it)."""
    try:
        if os.path.isdir(path):
            return tuple(sorted((name, os.stat(os.path.join(path, name)).st_size,
                                 os.stat(os.path.join(path, name)).st_mtime_ns)
                                for name in os.listdir(path)))
        stat = os.stat(path)
        return (stat.st_size, stat.st_mtime_ns)
    except OSError:
        return None


def follow(directory, table, *, memory_budget=None, threshold=0.02, horizon=100,
           switch_cost=None, poll=1.0, max_files=None, timeout=None, window=8, retune=0.05,
           samples=32, seed=0, max_rounds=6, settle=2.0, log=None, report=None,
           sleep=time.sleep):
    """Follow the traces a job writes into ``directory``; re-plan and report switches.

    Parameters
    ----------
    directory : str or path
    table : ScheduleTable
        The table the job runs (every trace must be of it).
    memory_budget : float, optional
        Per device, in the units of the fitted costs' memory (one stage's activation for
        a full microbatch); default the followed table's own peak.
    threshold : float
        The least saving reported, as a fraction of the current table's time over the
        horizon.
    horizon : int
        Steps the saving is counted over.
    switch_cost : float, optional
        Seconds a switch costs; default one iteration of the current table (see the module
        docstring for why, and that it is an assumption).
    poll : float
        Seconds between polls.
    max_files, timeout : optional
        Stop after this many entries processed, or seconds.
    window : int
        Steps the fit and the replay keep.
    retune : float
        Search again when a fitted stage cost moved by more than this (relative).
    samples, seed, max_rounds :
        Of each search.
    settle : float
        Seconds an entry that does not read must stay unchanged (size and modification
        time) before it is skipped: a writer that stalls for less (a busy machine) is
        waited for, one that stopped is not.
    log : str or path, optional
        JSON lines: one per switch and per skipped entry.
    report : callable, optional
        Called with each line to show (a processed entry, a switch, a skip).
    sleep : callable

    Returns
    -------
    FollowResult

    Raises
    ------
    InvalidParameterError
        For bad parameters (never for a bad trace: that is a line, and the next entry).
    """
    from tabsched.adapt.replay import Replay
    from tabsched.adapt.search import adapt
    from tabsched.evaluate import evaluate
    from tabsched.whatif import _costs_for, fit_costs, read_step

    for name, value, least in (("horizon", horizon, 1), ("window", window, 1),
                               ("samples", samples, 1), ("max_rounds", max_rounds, 1)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
            raise InvalidParameterError(f"{name} must be an integer >= {least}, not {value!r}")
    for name, value in (("threshold", threshold), ("poll", poll), ("retune", retune),
                        ("settle", settle)):
        if not isinstance(value, (int, float)) or not np.isfinite(value) or value < 0:
            raise InvalidParameterError(f"{name} must be a number >= 0, not {value!r}")
    if switch_cost is not None and (not np.isfinite(switch_cost) or switch_cost < 0):
        raise InvalidParameterError(f"switch cost must be >= 0 seconds, not {switch_cost!r}")
    say = report or (lambda line: None)
    expected = _orders(table)
    result = FollowResult()
    seen, pending = set(), {}   # pending: entry -> (signature, since) of a failed read
    stage_means = defaultdict(lambda: deque(maxlen=window))     # (kind, stage) -> per step
    labels = defaultdict(lambda: deque(maxlen=window))          # label -> measurements
    transfers = deque(maxlen=window * 64)
    decision, fitted_at, gone, reported = None, None, False, ()
    started = time.monotonic()
    output = _Log(log)

    def skip(entry, reason):
        seen.add(entry)
        pending.pop(entry, None)
        result.skipped[entry] = reason
        say(f"skipped {entry}: {reason}")
        output.write({"event": "skip", "entry": entry, "reason": reason})

    try:
        while True:
            if max_files is not None and len(result.processed) >= max_files:
                result.stopped = "max-files"
                break
            if timeout is not None and time.monotonic() - started >= timeout:
                result.stopped = "timeout"
                break
            try:
                entries = _entries(directory)
                if gone:
                    say(f"{directory}: back")
                    gone = False
            except OSError as error:
                if not gone:
                    say(f"{directory}: cannot list ({error.strerror or error}); waiting for "
                        f"it to come back")
                    output.write({"event": "skip", "entry": os.fspath(directory),
                                  "reason": f"cannot list: {error.strerror or error}"})
                gone = True
                entries = []
            fresh = [entry for entry in entries if entry not in seen]
            done = len(result.processed) + len(result.skipped)
            for entry in fresh:
                if max_files is not None and len(result.processed) >= max_files:
                    break
                began = time.perf_counter()
                try:
                    step = read_step(entry)
                except TabschedError as error:
                    signature, now = _signature(entry), time.monotonic()
                    if entry in pending and pending[entry][0] == signature:
                        if now - pending[entry][1] >= settle:
                            skip(entry, str(error))      # failed again, unchanged: give up
                    else:
                        pending[entry] = (signature, now)   # the job may still be writing it
                    continue
                pending.pop(entry, None)
                if _orders(step.table) != expected:
                    skip(entry, f"the trace runs another table ({step.table.num_devices} "
                                f"ranks, {step.table.num_stages} stages, "
                                f"{step.table.num_microbatches} microbatches) than the one "
                                f"followed ({table.num_devices}, {table.num_stages}, "
                                f"{table.num_microbatches}) or in another order")
                    continue
                seen.add(entry)
                fit = fit_costs(step, stage_layers=table.stage_layers)
                for kind, values in fit.stage_costs.items():
                    for stage, value in enumerate(values.tolist()):
                        stage_means[(kind, stage)].append(value)
                for label, values in step.profile.measurements.items():
                    labels[label].extend(values)
                transfers.extend(step.transfers)
                kinds = sorted({kind for kind, _ in stage_means})
                means = {kind: np.array([np.mean(stage_means[(kind, s)])
                                         for s in range(table.num_stages)]) for kind in kinds}
                fit.stage_costs = means
                fit.transfer = float(np.median(transfers)) if transfers else 0.0
                costs = _costs_for(fit, means, list(fit.stage_layers), [])
                replay = Replay({label: list(values) for label, values in labels.items()},
                                source=entry, partial=True)
                moved = fitted_at is None or any(
                    np.any(np.abs(means[kind] / fitted_at[kind] - 1.0) > retune)
                    for kind in kinds)
                if moved:
                    budget = memory_budget
                    if budget is None:
                        budget = float(np.max(evaluate(table, costs).peak_memory))
                    found = adapt(table, costs, replay, budget, samples=samples, seed=seed,
                                  max_rounds=max_rounds, references=(),
                                  start_from_reference=False)
                    result.searches += 1
                    fitted_at = means
                    decision = found
                current = float(decision.baseline.mean)
                adapted = float(decision.adapted.mean)
                cost = current if switch_cost is None else float(switch_cost)
                net = horizon * (current - adapted) - cost
                seconds = time.perf_counter() - began
                result.processed.append(entry)
                result.seconds.append(seconds)
                say(f"{os.path.basename(entry)}: iteration {np.mean(step.iterations) * 1e3:.1f} "
                    f"ms measured, {current * 1e3:.1f} ms fitted; best table "
                    f"{adapted * 1e3:.1f} ms ({' -> '.join(decision.transforms) or 'no change'})"
                    f"; net over {horizon} steps {net * 1e3:+.1f} ms "
                    f"({'searched' if moved else 'fit unchanged'}, {seconds:.2f} s)")
                pays = bool(decision.transforms) and decision.feasible and \
                    net > threshold * horizon * current
                if not pays:
                    reported = ()
                if pays and tuple(decision.transforms) != reported:   # new advice only
                    reported = tuple(decision.transforms)
                    record = {"event": "switch", "entry": entry,
                              "step": len(result.processed),
                              "transforms": list(decision.transforms),
                              "current": current, "adapted": adapted, "horizon": horizon,
                              "switch_cost": cost, "net_saving": net,
                              "saving_fraction": net / (horizon * current),
                              "threshold": threshold,
                              "fitted": {kind: values.tolist() for kind, values in means.items()},
                              "transfer": fit.transfer}
                    result.switches.append(record)
                    output.write(record)
                    say(f"SWITCH after {os.path.basename(entry)}: "
                        f"{' -> '.join(decision.transforms)} saves {net * 1e3:.1f} ms over "
                        f"{horizon} steps ({net / (horizon * current):.1%}, switch cost "
                        f"{cost * 1e3:.1f} ms charged)")
            if len(result.processed) + len(result.skipped) == done:
                sleep(poll)     # nothing new, or only entries still being written: wait
    except KeyboardInterrupt:
        result.stopped = "interrupted"
    finally:
        output.close()
    return result
