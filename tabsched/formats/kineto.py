"""PyTorch profiler (Kineto) traces of a pipeline run, read as measured durations.

``torch.profiler`` writes a Chrome trace (``export_chrome_trace``, or one
``<worker>.pt.trace.json[.gz]`` per rank with ``tensorboard_trace_handler``).
When ``torch.distributed.pipelining``'s ``_PipelineScheduleRuntime`` (every
multi-stage schedule, and any schedule loaded with ``_load_csv``) runs an
action, it wraps it in ``record_function("PP:" + str(action))``, so the trace
holds one complete event (``"ph": "X"``) per action and iteration. This module
turns those events into the ``{label: [seconds, ...]}`` a
:class:`tabsched.adapt.Replay` replays. It never imports torch.

Mapping from profiler events to table operations
------------------------------------------------
``PP:3F12``, ``PP:3I12``, ``PP:3W12``, ``PP:3B12``
    Operation ``3F12`` (and so on): one measurement per occurrence, in seconds
    (the trace's ``ts``/``dur`` are microseconds).
``PP:(0F7;7B3)OVERLAP_F_B``
    Both parts. PyTorch's runtime without a registered overlap function runs
    them one after the other, and the trace has one event for both, so the
    event's time is split between the parts in proportion to the mean time of
    stand-alone operations of the same stage and kind in the traces (of the
    same kind on any stage when the stage has none; evenly when the kind has
    none). The cell's total, which is what a table with this cell
    evaluates, is exact; evaluate it with the cost model's ``overlap`` at 1.
``PP:1SEND_F3``, ``PP:2RECV_B0``, ``PP:0UNSHARD``, ``PP:0RESHARD``, ``PP:0REDUCE_GRAD``
    Not operations of a table (counted in :attr:`KinetoProfile.skipped`), but
    on a CPU trace the rank can do nothing else while it posts a send or a
    receive (with gloo a few hundred microseconds), so their time counts as
    time of the operation the rank ran before them: the producer, for the SEND
    that follows it. Between two iterations, REDUCE_GRAD, RESHARD and SEND
    count for the operation before (they close its iteration) and UNSHARD and
    RECV for none (they open the next while the rank waits for its first
    input). ``attach_actions=False`` leaves operations their own time only. A
    RECV event also tells when its data arrived (below).
``PP:`` followed by anything else
    An error naming the file and the event.
Other events
    Ignored, except as described below.

Waiting is not computing
------------------------
On CPU, an operation whose input comes from another rank blocks inside its own
``PP:`` event until the input is there (gloo's ``wait()`` is inside the
action). The measured duration of such an operation is its event's duration
minus that wait. The receive that the matching ``PP:<s>RECV_F<m>`` (for a
forward) or ``PP:<s>RECV_B<m>`` (for an input-grad or full backward) posted is
the ``gloo:recv`` event (any event whose name contains ``recv``) that starts
inside the RECV event on the same thread; it ends when ``wait()`` returns, so
the operation waited from the end of its last nested event before that moment
(or its own start) until that moment. The latest RECV event of that label that
starts before the operation is the one it waited for.

On a GPU, the trace also holds ``gpu_user_annotation`` events, the span of the
kernels each ``PP:`` range launched; a file that has them is read from those
(the GPU's time; stream waits are not kernels), and nothing is subtracted.

Limits
------
A file is read only if it is at most ``max_bytes`` long (decompressed, for
``.gz``); every complete event is checked (``name`` a string, ``ts`` and
``dur`` finite numbers, ``dur >= 0``, ``pid``/``tid`` integers or strings),
and a bad one is an error naming the file and the event's index.

Examples
--------
>>> trace = {"traceEvents": [
...     {"ph": "X", "cat": "user_annotation", "name": "PP:0F0", "ts": 0, "dur": 30, "tid": 1},
...     {"ph": "X", "cat": "user_annotation", "name": "PP:0SEND_F0", "ts": 31, "dur": 2,
...      "tid": 1},
...     {"ph": "X", "cat": "user_annotation", "name": "PP:0F1", "ts": 40, "dur": 25, "tid": 1}]}
>>> profile = profile_from_trace(trace)
>>> profile.measurements                   # 0F0 includes the SEND after it
{'0F0': [3.2e-05], '0F1': [2.5e-05]}
>>> profile.skipped
{'SEND_F': 1}
"""

import gzip
import json
import math
import os
import re
import zlib
from bisect import bisect_left, bisect_right
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from tabsched.cells import KINDS, Action, Op, Overlap, is_overlap_pair, parse_pp_label
from tabsched.exceptions import InvalidParameterError
from tabsched.files import file_path
from tabsched.formats import get_format

__all__ = ["KinetoProfile", "read_kineto", "profile_from_trace", "trace_files",
           "unmatched_labels", "describe_unmatched", "DEFAULT_MAX_BYTES", "TRACE_SUFFIXES"]

#: Largest trace file read (decompressed), in bytes. A CPU trace of 8 pipeline
#: steps of a small model is about 16 MB; parsed, a trace takes about five times
#: its size in memory.
DEFAULT_MAX_BYTES = 256 * 2**20
TRACE_SUFFIXES = get_format("kineto").suffixes

_PREFIX = "PP:"
_RECV_EVENT = re.compile(r"recv", re.IGNORECASE)
_CLOSING = ("REDUCE_GRAD", "RESHARD", "SEND_F", "SEND_B")  # count at an iteration's end
_PER_SECOND = 1e6  # the trace's ts and dur are microseconds
_SHOWN = 5  # unmatched labels listed in an error


@dataclass
class KinetoProfile:
    """Durations of a pipeline run's operations, read from profiler traces.

    Attributes
    ----------
    measurements : dict
        ``{label: [seconds, ...]}`` in the order the traces list them (one per
        iteration profiled); a label is an operation, ``3F12``.
    origins : dict
        ``{label: (file, event index)}`` of each label's first event, for messages.
    files : tuple of str
    timelines : dict
        ``{file: "cpu" or "gpu"}``: which events each file was read from.
    skipped : dict
        ``{action: count}`` of ``PP:`` events that are not operations (SEND_F, UNSHARD, ...).
    waited : float
        Seconds of waiting for inputs taken out of the operations' events.
    attached, unattached : float
        Seconds of those other actions counted in operations, and not counted.
    notes : list of str
    """

    measurements: dict
    origins: dict
    files: tuple = ()
    timelines: dict = field(default_factory=dict)
    skipped: dict = field(default_factory=dict)
    waited: float = 0.0
    attached: float = 0.0
    unattached: float = 0.0
    notes: list = field(default_factory=list)


def trace_files(path):
    """The trace files ``path`` names: itself, or the ``.json``/``.json.gz`` files in a directory.

    A directory is what ``tensorboard_trace_handler`` writes: one file per rank.
    """
    source = file_path(path)
    if os.path.isdir(source):
        try:
            names = sorted(os.listdir(source))
        except OSError as error:
            raise InvalidParameterError(f"{source}: cannot list: {error.strerror}") from None
        files = [os.path.join(source, name) for name in names
                 if name.endswith(TRACE_SUFFIXES) and os.path.isfile(os.path.join(source, name))]
        if not files:
            raise InvalidParameterError(f"{source}: no trace files (*.json, *.json.gz) in this "
                                        f"directory")
        return files
    return [source]


#: The most a gzipped trace may expand, as a multiple of its compressed size (or
#: :data:`_GZIP_FLOOR`, whichever is more): profiler traces compress about 10-30x (a
#: synthetic trace of identical steps, bench/bench_paths.py's, 30x), a gzip bomb of
#: repeated bytes about 1000x. A trace that expands further is refused before it is
#: read whole; decompress it yourself and ``max_bytes`` alone bounds it.
GZIP_RATIO = 100
_GZIP_FLOOR = 16 * 2**20


def _load(path, max_bytes):
    """The parsed JSON of one trace file, its size checked before it is read whole (a
    gzipped one's expansion too, :data:`GZIP_RATIO`)."""
    limit = max_bytes
    try:
        if path.endswith(".gz"):
            limit = min(max_bytes, max(GZIP_RATIO * os.path.getsize(path), _GZIP_FLOOR))
            with gzip.open(path, "rb") as handle:
                raw = handle.read(limit + 1)
        else:
            if os.path.getsize(path) > max_bytes:
                raise InvalidParameterError(f"{path}: larger than {max_bytes} bytes (max_bytes)")
            with open(path, "rb") as handle:
                raw = handle.read(max_bytes + 1)
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as error:
        reason = getattr(error, "strerror", None) or str(error) or type(error).__name__
        raise InvalidParameterError(f"{path}: cannot read: {reason}") from None
    if limit < len(raw) and limit < max_bytes:
        raise InvalidParameterError(
            f"{path}: expands more than {GZIP_RATIO}x its compressed size (profiler traces "
            f"compress 10-30x): refused before it is read whole; if it is a trace, "
            f"decompress it and read the .json")
    if len(raw) > max_bytes:
        raise InvalidParameterError(f"{path}: larger than {max_bytes} bytes (max_bytes)")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise InvalidParameterError(f"{path}: byte {error.start} is not UTF-8 text; this is "
                                    f"not a profiler trace") from None
    del raw
    try:
        return json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as error:
        raise InvalidParameterError(f"{path}: not JSON: {error.msg} at line {error.lineno}, "
                                    f"column {error.colno}") from None
    except RecursionError:
        raise InvalidParameterError(f"{path}: not a profiler trace: JSON nested too "
                                    f"deeply") from None
    except ValueError as error:  # NaN, Infinity (parse_constant) or an absurd number
        raise InvalidParameterError(f"{path}: {error}") from None


def _no_constant(name):
    raise ValueError(f"{name} is not a number in a profiler trace")


def _short(text, limit=60):
    text = str(text)
    return text if len(text) <= limit else text[:limit] + "..."


def _number(event, key, where):
    value = event.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidParameterError(f"{where}: {key!r} must be a number, not "
                                    f"{_short(json.dumps(value))}")
    try:
        value = float(value)
    except OverflowError:       # an integer no double holds
        value = math.inf
    if not math.isfinite(value):
        raise InvalidParameterError(f"{where}: {key!r} must be finite, not {value}")
    return value


def _events(document, source):
    """Checked complete events: ``(index, thread, name, cat, ts, end)`` in file order."""
    if isinstance(document, dict):
        events = document.get("traceEvents")
        if not isinstance(events, list):
            raise InvalidParameterError(f"{source}: not a profiler trace: no traceEvents list")
    elif isinstance(document, list):
        events = document
    else:
        raise InvalidParameterError(f"{source}: not a profiler trace: expected a JSON object "
                                    f"with traceEvents")
    checked = []
    append, isfinite = checked.append, math.isfinite
    numbers, identities = (int, float), (int, str)
    for index, event in enumerate(events):
        # the common event checked inline, its messages built only for the one that fails
        # (:func:`_checked_event` says what is wrong): a trace has 10^5-10^6 events
        if type(event) is dict:
            phase = event.get("ph")
            if phase != "X" and type(phase) is str:
                continue
            name, category = event.get("name"), event.get("cat", "")
            start, duration = event.get("ts"), event.get("dur")
            pid, tid = event.get("pid", 0), event.get("tid", 0)
            if (phase == "X" and type(name) is str and type(category) is str
                    and type(start) in numbers and type(duration) in numbers
                    and type(pid) in identities and type(tid) in identities):
                try:
                    start, duration = float(start), float(duration)
                except OverflowError:       # an integer past the doubles: said below
                    pass
                else:
                    if duration >= 0 and isfinite(start) and isfinite(duration):
                        append((index, (pid, tid), name, category, start, start + duration))
                        continue
        found = _checked_event(event, index, source)
        if found is not None:
            append(found)
    return checked


def _checked_event(event, index, source):
    """One event checked with a message naming what is wrong: the complete event's
    ``(index, thread, name, cat, ts, end)``, None for another phase."""
    where = f"{source}: event {index}"
    if not isinstance(event, dict):
        raise InvalidParameterError(f"{where}: not an object")
    phase = event.get("ph")
    if not isinstance(phase, str):
        raise InvalidParameterError(f"{where}: 'ph' must be a string, not "
                                    f"{_short(json.dumps(phase))}")
    if phase != "X":
        return None
    name = event.get("name")
    if not isinstance(name, str):
        raise InvalidParameterError(f"{where}: 'name' must be a string, not "
                                    f"{_short(json.dumps(name))}")
    category = event.get("cat", "")
    if not isinstance(category, str):
        raise InvalidParameterError(f"{where} ({_short(name)}): 'cat' must be a string")
    start = _number(event, "ts", f"{where} ({_short(name)})")
    duration = _number(event, "dur", f"{where} ({_short(name)})")
    if duration < 0:
        raise InvalidParameterError(f"{where} ({_short(name)}): 'dur' must be >= 0, "
                                    f"not {duration:g}")
    thread = []
    for key in ("pid", "tid"):
        value = event.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise InvalidParameterError(f"{where} ({_short(name)}): {key!r} must be an "
                                        f"integer or a string")
        thread.append(value)
    return (index, tuple(thread), name, category, start, start + duration)


def _parse_label(text, where):
    """``("op", [(kind, stage, microbatch)])`` or ``("skip", action)`` or ``("recv", key)``.

    The label is read by :func:`tabsched.cells.parse_pp_label`, PyTorch's current tokens
    exactly as its runtime writes them.
    """
    cell = parse_pp_label(text)
    if isinstance(cell, Op):
        return "op", [tuple(cell)]
    if isinstance(cell, Overlap):
        if not is_overlap_pair(part.kind for part in cell.parts):
            raise InvalidParameterError(f"{where}: {_short(_PREFIX + text)}: an overlapped "
                                        f"step holds one forward and one backward (F with B "
                                        f"or I)")
        return "op", [tuple(part) for part in cell.parts]
    if isinstance(cell, Action):
        if cell.kind.startswith("RECV"):
            return "recv", (cell.kind[-1], cell.stage, cell.microbatch)
        return "skip", cell.kind
    raise InvalidParameterError(
        f"{where}: {_short(_PREFIX + text)!r} is not an action of PyTorch's pipelining runtime "
        f"(expected PP:<stage><F|I|B|W><microbatch>, PP:(<op>;<op>)OVERLAP_F_B, "
        f"PP:<stage><SEND_F|RECV_F|SEND_B|RECV_B><microbatch> or "
        f"PP:<stage><UNSHARD|RESHARD|REDUCE_GRAD>)")


def _label(part):
    return str(Op(*part))


@dataclass
class _Occurrence:
    """One operation's event: its parts, its seconds so far, where and when it started."""

    parts: tuple
    seconds: float
    thread: tuple
    start: float
    iteration: int = 0


#: Events per block of :class:`_LatestEnd`: a query reads at most two partial blocks.
_BLOCK = 64


class _LatestEnd:
    """The latest end among events whose start lies in a range of times.

    ``starts`` (sorted) and ``ends`` are one thread's events of one sort (the receives,
    or the other work nested in an action). A query finds its events' positions by
    bisection and their largest end from the maxima of blocks of :data:`_BLOCK` events
    (a sparse table over the blocks, ``log2`` rows of a few entries per block) plus at
    most two partial blocks: a replay asks once per receive and per operation, so each
    costs about ``_BLOCK`` steps, not the events of a long action (it was quadratic).
    """

    def __init__(self, starts, ends):
        self.starts = starts
        count = len(ends)
        padded = np.full(-(-count // _BLOCK) * _BLOCK, -np.inf)
        padded[:count] = ends
        self.ends = padded
        rows = [padded.reshape(-1, _BLOCK).max(axis=1) if count else padded]
        blocks, width = len(rows[0]), 1
        while 2 * width <= blocks:      # row k: the maxima of 2**k blocks from each one
            last = rows[-1]
            rows.append(np.maximum(last[:-width], last[width:]))
            width *= 2
        self.rows = rows

    def latest(self, begin, end, *, closed):
        """The largest end of the events starting in ``[begin, end]`` (``closed``) or
        ``[begin, end)``, or None if none does."""
        lo = bisect_left(self.starts, begin)
        hi = (bisect_right if closed else bisect_left)(self.starts, end)
        if lo >= hi:
            return None
        first, last = -(-lo // _BLOCK), hi // _BLOCK     # the whole blocks inside
        if first >= last:
            return float(self.ends[lo:hi].max())
        level = (last - first).bit_length() - 1
        row = self.rows[level]
        best = max(row[first], row[last - (1 << level)])
        if lo < first * _BLOCK:
            best = max(best, self.ends[lo:first * _BLOCK].max())
        if last * _BLOCK < hi:
            best = max(best, self.ends[last * _BLOCK:hi].max())
        return float(best)


def _thread_index(thread_events):
    """``(receives, work)`` of one thread's events sorted by start: the ``recv`` events,
    and the others that are not ``PP:`` actions (the work nested in an operation)."""
    receives, work = ([], []), ([], [])
    for _, _, name, _, start, end in thread_events:
        if name.startswith(_PREFIX):
            continue
        into = receives if _RECV_EVENT.search(name) else work
        into[0].append(start)
        into[1].append(end)
    return _LatestEnd(*receives), _LatestEnd(*work)


class _Reading:
    """Measurements gathered over files; overlapped steps are split at the end."""

    def __init__(self, attach_actions=True):
        self.attach_actions = attach_actions
        self.single = defaultdict(list)
        self.overlapped = []  # (parts, seconds)
        self.origins = {}
        self.skipped = defaultdict(int)
        self.waited = 0.0
        self.attached = 0.0
        self.unattached = 0.0
        self.timelines = {}
        self.notes = []

    def add_file(self, document, source):
        events = _events(document, source)
        gpu = any(category == "gpu_user_annotation" and name.startswith(_PREFIX)
                  for _, _, name, category, _, _ in events)
        wanted = "gpu_user_annotation" if gpu else "user_annotation"
        self.timelines[source] = "gpu" if gpu else "cpu"
        by_thread = defaultdict(list)  # every complete event, per thread, for nesting
        actions = []
        for event in events:
            index, thread, name, category, start, end = event
            by_thread[thread].append(event)
            if category == wanted and name.startswith(_PREFIX):
                kind, value = _parse_label(name[len(_PREFIX):], f"{source}: event {index}")
                actions.append((kind, value, event))
        for thread_events in by_thread.values():
            thread_events.sort(key=lambda event: event[4])
        index = {thread: _thread_index(thread_events)
                 for thread, thread_events in by_thread.items()}
        arrivals = defaultdict(list)  # (thread, direction, stage, microbatch) -> [(start, end)]
        if not gpu:
            self._arrivals(actions, index, arrivals)
        recv_posted = any(kind == "recv" for kind, _, _ in actions)
        if recv_posted and not gpu and not arrivals:
            self.notes.append(f"{source}: no recv events inside the RECV actions; waits for "
                              f"inputs stay in the measured durations")
        occurrences, others = [], []
        for kind, value, event in actions:
            if kind == "op":
                occurrences.append(self._measure(value, event, source, index, arrivals))
                continue
            action = value if kind == "skip" else "RECV_" + value[0]
            self.skipped[action] += 1
            others.append((action, event))
        if not gpu and self.attach_actions:
            self._attach(occurrences, others)
        for occurrence in occurrences:
            parts, seconds = occurrence.parts, occurrence.seconds
            if len(parts) == 1:
                self.single[_label(parts[0])].append(seconds)
            else:
                self.overlapped.append((parts, seconds))

    def _attach(self, occurrences, others):
        """Add each other action's time to the operation the rank ran before it.

        Within an iteration, that is when the rank spent it. Between two
        iterations (the operations before and after are from different ones),
        REDUCE_GRAD, RESHARD and SEND close the earlier iteration and count; an
        UNSHARD or RECV opens the next one while the rank waits for its first
        input, and does not.
        """
        by_thread = defaultdict(list)
        for occurrence in occurrences:
            by_thread[occurrence.thread].append(occurrence)
        begins = {}
        for thread, listed in by_thread.items():
            listed.sort(key=lambda occurrence: occurrence.start)
            seen = defaultdict(int)
            for occurrence in listed:
                occurrence.iteration = seen[occurrence.parts]
                seen[occurrence.parts] += 1
            begins[thread] = [occurrence.start for occurrence in listed]
        for action, event in others:
            _, thread, _, _, start, end = event
            seconds = (end - start) / _PER_SECOND
            listed = by_thread.get(thread, ())
            position = bisect_right(begins.get(thread, ()), start)
            before = listed[position - 1] if position > 0 else None
            after = listed[position] if position < len(listed) else None
            same_iteration = (before is not None and after is not None
                              and before.iteration == after.iteration)
            if before is not None and (same_iteration or action in _CLOSING):
                before.seconds += seconds
                self.attached += seconds
            else:
                self.unattached += seconds

    @staticmethod
    def _arrivals(actions, index, arrivals):
        """When each RECV's data was there: the end of the recv events it posted (those
        of its thread that start while it runs)."""
        for kind, value, event in actions:
            if kind != "recv":
                continue
            _, thread, _, _, start, end = event
            arrived = index[thread][0].latest(start, end, closed=True)
            if arrived is not None:
                arrivals[(thread,) + value].append((start, arrived))
        for entries in arrivals.values():
            entries.sort()

    def _measure(self, parts, event, source, index, arrivals):
        position, thread, name, _, start, end = event
        waited = 0.0
        for kind, stage, microbatch in parts:
            received = arrivals.get((thread, "F" if kind == "F" else "B", stage, microbatch))
            if not received or kind == "W":
                continue
            at = bisect_right(received, (start, math.inf)) - 1
            if at < 0:
                continue
            arrived = received[at][1]
            if not start < arrived < end:
                continue
            # the wait began where the last work nested before the arrival ended (the
            # latest end among the work that started in the operation before it); none
            # if nested work was running when the input arrived
            latest = index[thread][1].latest(start, arrived, closed=False)
            began = start if latest is None else max(start, min(latest, arrived))
            waited += arrived - began
        self.waited += waited / _PER_SECOND
        for part in parts:
            self.origins.setdefault(_label(part), (source, position))
        return _Occurrence(tuple(parts), max(end - start - waited, 0.0) / _PER_SECOND,
                           thread, start)

    def profile(self, files):
        measurements = {label: list(values) for label, values in self.single.items()}
        if self.overlapped:
            totals, counts = defaultdict(float), defaultdict(int)
            for label, values in self.single.items():
                kind, stage, _ = parse_pp_label(label)
                for key in ((kind, stage), (kind, None)):
                    totals[key] += sum(values)
                    counts[key] += len(values)

            def typical(kind, stage):
                for key in ((kind, stage), (kind, None)):
                    if counts[key] and totals[key] > 0:
                        return totals[key] / counts[key]
                return None

            split_evenly = 0
            for parts, seconds in self.overlapped:
                weights = [typical(kind, stage) for kind, stage, _ in parts]
                if None in weights:
                    weights = [1.0] * len(parts)
                    split_evenly += 1
                for part, weight in zip(parts, weights):
                    measurements.setdefault(_label(part), []).append(
                        seconds * weight / sum(weights))
            if split_evenly:
                self.notes.append(f"{split_evenly} overlapped steps split evenly between "
                                  f"their parts (no stand-alone operation of the same kind "
                                  f"to weigh them by)")
        return KinetoProfile(measurements=measurements, origins=dict(self.origins),
                             files=tuple(files), timelines=dict(self.timelines),
                             skipped=dict(self.skipped), waited=self.waited,
                             attached=self.attached, unattached=self.unattached,
                             notes=list(self.notes))


def profile_from_trace(document, *, source="<trace>", attach_actions=True):
    """A :class:`KinetoProfile` from one parsed trace (a dict with ``traceEvents``);
    ``attach_actions`` as in :func:`read_kineto`."""
    reading = _Reading(attach_actions)
    reading.add_file(document, source)
    return _finished(reading, [source])


def _finished(reading, files):
    profile = reading.profile(files)
    if not profile.measurements:
        raise InvalidParameterError(
            f"{', '.join(files[:3])}{', ...' if len(files) > 3 else ''}: no pipeline operations "
            f"(PP:<stage><F|I|B|W><microbatch> events); profile a schedule that "
            f"_PipelineScheduleRuntime runs (a multi-stage schedule or one loaded with "
            f"_load_csv), with the profiler's CPU activity on")
    return profile


def read_kineto(path, *, max_bytes=DEFAULT_MAX_BYTES, attach_actions=True):
    """Read the profiler traces of a pipeline run: one file, or a directory of them (one per rank).

    Parameters
    ----------
    path : str or path
        A ``.json`` or ``.json.gz`` trace, or a directory of such files.
    max_bytes : int
        The largest file read (decompressed).
    attach_actions : bool
        Count the rank's time in SEND, RECV, UNSHARD, RESHARD and REDUCE_GRAD
        actions as time of the operation it ran before them (CPU traces; see
        the module docstring). False: operations hold their own compute only.

    Returns
    -------
    KinetoProfile

    Raises
    ------
    InvalidParameterError
        For a file that cannot be read or is not a trace, a bad event (naming
        the file and the event), or traces without pipeline operations.
    """
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        raise InvalidParameterError(f"max_bytes must be a positive integer, not {max_bytes!r}")
    files = trace_files(path)
    reading = _Reading(attach_actions)
    for file in files:
        reading.add_file(_load(file, max_bytes), file)
    return _finished(reading, files)


def unmatched_labels(profile, table):
    """Labels of ``profile`` that name no operation of ``table``, each with its origin.

    >>> from tabsched import ScheduleTable
    >>> trace = {"traceEvents": [{"ph": "X", "cat": "user_annotation", "name": "PP:5F0",
    ...                           "ts": 0, "dur": 1}]}
    >>> unmatched_labels(profile_from_trace(trace), ScheduleTable([["0F0", "0B0"]]))
    [('5F0', ('<trace>', 0))]
    """
    present = {f"{stage}{KINDS[kind]}{microbatch}" for stage, kind, microbatch
               in zip(table.stage.tolist(), table.kind.tolist(), table.microbatch.tolist())}
    return [(label, profile.origins.get(label)) for label in profile.measurements
            if label not in present]


def describe_unmatched(unmatched, shown=_SHOWN):
    """``5F0 (trace.json, event 12), ...``: the first few unmatched labels and where they are."""
    texts = []
    for label, origin in unmatched[:shown]:
        texts.append(label if origin is None
                     else f"{label} ({os.path.basename(origin[0])}, event {origin[1]})")
    more = len(unmatched) - shown
    return ", ".join(texts) + (f" and {more} more" if more > 0 else "")
