"""GPU time per operation from the CUDA kernels of a PyTorch profiler (Kineto) trace.

A trace of a GPU run (``torch.profiler`` with ``ProfilerActivity.CUDA``: a torchtitan or
Megatron-LM step, any framework's) holds, besides the CPU's events, one complete event per
kernel (``"cat": "kernel"``, also ``gpu_memcpy`` and ``gpu_memset``) with its stream
(``args.stream``) and a correlation id (``args.correlation``) that the CPU's launch call
(``cuda_runtime`` or ``cuda_driver``: ``cudaLaunchKernel``, ``cuLaunchKernel``, ...) carries
too. A CPU range's kernels are therefore the kernels whose launch call starts inside it.
This module gives each kernel the innermost ``user_annotation`` range
(``record_function``) around its launch, and measures every range by its kernels:

* **compute**: the summed durations of its kernels that are not communication;
* **communication**: those of its NCCL kernels (``nccl``: ``ncclDevKernel_*``,
  ``ncclKernel_*``) and of other collective libraries' kernels (DeepEP's ``::ep::``
  dispatch and combine, ``all_to_all``/``alltoall``/``allreduce``/``allgather`` and
  ``reduce_scatter`` in the name): these wait for peers, so their time is not the
  operation's work;
* **span**: from its first kernel's start to its last kernel's end (stream waits and
  host gaps included).

Where the launch is not inside a range of its own thread (PyTorch runs the backward of
CUDA tensors on the autograd engine's device thread, while the range that called
``backward()`` stays open on the main thread), the innermost range of the same process
that contains the launch is used. A kernel in no range is *unmatched*, and its time is
reported.

Labels
    A ``PP:`` range (PyTorch's pipelining runtime, which torchtitan uses: ``PP:3F12``,
    ``PP:(0F7;7B3)OVERLAP_F_B``) is named by its operation (``3F12``); any other range by
    its own name (``attn(F)``). :meth:`KernelProfile.measurements` gives ``{label:
    [compute seconds, ...]}``, one per occurrence, what :class:`tabsched.adapt.Replay`
    replays and what ``tabsched profile -o`` writes as ``op,duration`` rows
    (``Replay.from_csv``).

Streams
    Each stream's kernels, busy seconds and communication share: a stream whose kernel
    time is mostly communication is a communication stream, as NCCL's and DeepEP's are.

Ranges that enclose other ranges (``ProfilerStep#1``) keep only the kernels that no
inner range claims; a range with no kernel of its own is left out.

>>> trace = {"traceEvents": [
...     {"ph": "X", "cat": "user_annotation", "name": "PP:0F0", "ts": 0, "dur": 50,
...      "pid": 1, "tid": 1},
...     {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 5, "dur": 3,
...      "pid": 1, "tid": 1, "args": {"correlation": 7}},
...     {"ph": "X", "cat": "kernel", "name": "sm90_gemm", "ts": 10, "dur": 40, "pid": 0,
...      "tid": 7, "args": {"stream": 7, "correlation": 7}}]}
>>> kernel_profile(trace).measurements()
{'0F0': [4e-05]}
"""

import math
import re
from bisect import bisect_right
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from tabsched.cells import Op, Overlap, parse_pp_label
from tabsched.exceptions import InvalidParameterError
from tabsched.formats.kineto import DEFAULT_MAX_BYTES, _load, _short, trace_files

__all__ = ["KernelProfile", "RangeTime", "StreamTime", "kernel_profile", "read_kernel_trace",
           "is_communication_kernel"]

_KERNELS = ("kernel", "gpu_memcpy", "gpu_memset")
_LAUNCHES = ("cuda_runtime", "cuda_driver")
_RANGES = ("user_annotation",)
_PER_SECOND = 1e6       # the trace's ts and dur are microseconds
#: Kernel names of collective communication: NCCL's (``ncclDevKernel_AllReduce_...``,
#: ``ncclKernel_SendRecv_...``), DeepEP's expert-parallel dispatch and combine
#: (``deep_ep::``, ``::ep::internode::dispatch``), and the collective words of other
#: libraries' kernel names.
_COMMUNICATION = re.compile(r"nccl|deep_?ep|::ep::|all_?to_?all|all_?reduce|all_?gather|"
                            r"reduce_?scatter|sendrecv", re.IGNORECASE)


def is_communication_kernel(name):
    """Whether a kernel's name is that of a collective or point-to-point transfer.

    >>> is_communication_kernel("ncclDevKernel_AllGather_RING_LL(ncclDevComm*, ...)")
    True
    >>> is_communication_kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n")
    False
    """
    return bool(_COMMUNICATION.search(name))


@dataclass(frozen=True)
class RangeTime:
    """One occurrence of a range, measured by the kernels it launched (seconds)."""

    label: str
    compute: float
    communication: float
    span: float
    kernels: int
    source: str

    def to_dict(self):
        """The occurrence as JSON-ready fields."""
        return {"label": self.label, "compute_s": self.compute,
                "communication_s": self.communication, "span_s": self.span,
                "kernels": self.kernels, "source": self.source}


@dataclass(frozen=True)
class StreamTime:
    """One stream of one file: its kernels, their summed time and the communication part."""

    source: str
    stream: object
    kernels: int
    busy: float
    communication: float

    @property
    def is_communication(self):
        """Whether most of the stream's kernel time is communication kernels."""
        return self.communication > 0.5 * self.busy

    def to_dict(self):
        """The stream as JSON-ready fields."""
        return {"source": self.source, "stream": self.stream, "kernels": self.kernels,
                "busy_s": self.busy, "communication_s": self.communication,
                "communication_stream": self.is_communication}


@dataclass
class KernelProfile:
    """Per-range GPU times of one or more traces (see the module docstring).

    Attributes
    ----------
    ranges : list of RangeTime
        Every occurrence, in the order its first kernel ran, file by file.
    streams : list of StreamTime
    unmatched : int
        Kernels launched outside every range (or whose launch the trace lacks).
    unmatched_seconds : float
    window : float
        Seconds from the first kernel to the last, summed over the files.
    files : tuple of str
    notes : list of str
    """

    ranges: list
    streams: list
    unmatched: int = 0
    unmatched_seconds: float = 0.0
    window: float = 0.0
    files: tuple = ()
    notes: list = field(default_factory=list)

    def measurements(self, what="compute"):
        """``{label: [seconds, ...]}`` of ``what`` (``compute``, ``communication`` or
        ``span``), one per occurrence."""
        if what not in ("compute", "communication", "span"):
            raise InvalidParameterError(f"what must be compute, communication or span, "
                                        f"not {_short(what)!r}")
        found = defaultdict(list)
        for occurrence in self.ranges:
            found[occurrence.label].append(getattr(occurrence, what))
        return dict(found)

    def summary(self):
        """Per label: occurrences, mean and standard deviation of compute, mean
        communication and span (seconds), in the order the labels first ran."""
        rows = {}
        for occurrence in self.ranges:
            rows.setdefault(occurrence.label, []).append(occurrence)
        out = []
        for label, occurrences in rows.items():
            compute = np.array([item.compute for item in occurrences])
            out.append({"label": label, "count": len(occurrences),
                        "compute_s": float(compute.mean()),
                        "compute_std_s": float(compute.std(ddof=1)) if len(compute) > 1
                        else 0.0,
                        "communication_s": float(np.mean([item.communication
                                                          for item in occurrences])),
                        "span_s": float(np.mean([item.span for item in occurrences])),
                        "kernels": int(sum(item.kernels for item in occurrences))})
        return out

    def to_dict(self):
        """The profile as ``tabsched profile --json`` writes it."""
        return {"files": list(self.files), "window_s": self.window,
                "labels": self.summary(),
                "streams": [stream.to_dict() for stream in self.streams],
                "unmatched_kernels": self.unmatched,
                "unmatched_s": self.unmatched_seconds, "notes": list(self.notes)}


def _number(value, where, key):
    try:        # an integer past the doubles (JSON allows any digits) is not finite either
        finite = math.isfinite(value)
    except (TypeError, OverflowError):
        finite = False
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not finite:
        raise InvalidParameterError(f"{where}: {key!r} must be a finite number, not "
                                    f"{_short(value)}")
    return float(value)


def _identity(value, where, key):
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise InvalidParameterError(f"{where}: {key!r} must be an integer or a string, not "
                                    f"{_short(value)}")
    return value


def _label(name, where):
    """The label of a range: a ``PP:`` action's operation, else the range's own name."""
    if not name.startswith("PP:"):
        return name
    cell = parse_pp_label(name[3:])
    if isinstance(cell, (Op, Overlap)):
        return str(cell)
    if cell is None:
        raise InvalidParameterError(f"{where}: {_short(name)!r} is not an action of PyTorch's "
                                    f"pipelining runtime")
    return str(cell)      # SEND_F, RECV_B, UNSHARD ...: measured under their own names


def _read_events(document, source):
    """``(ranges, launches, kernels)`` of one trace: ranges ``(pid, tid, start, end,
    name, index)``, launches ``{correlation: (pid, tid, ts)}``, kernels ``(start, end,
    stream, correlation, name)``."""
    if isinstance(document, dict):
        events = document.get("traceEvents")
    else:
        events = document
    if not isinstance(events, list):
        raise InvalidParameterError(f"{source}: not a profiler trace: no traceEvents list")
    ranges, launches, kernels = [], {}, []
    for index, event in enumerate(events):
        if not isinstance(event, dict) or event.get("ph") != "X":
            continue
        category = event.get("cat")
        if category not in _KERNELS and category not in _LAUNCHES and category not in _RANGES:
            continue
        where = f"{source}: event {index}"
        name = event.get("name")
        if not isinstance(name, str):
            raise InvalidParameterError(f"{where}: 'name' must be a string")
        start = _number(event.get("ts"), where, "ts")
        duration = _number(event.get("dur"), where, "dur")
        if duration < 0:
            raise InvalidParameterError(f"{where} ({_short(name)}): 'dur' must be >= 0")
        pid = _identity(event.get("pid", 0), where, "pid")
        tid = _identity(event.get("tid", 0), where, "tid")
        args = event.get("args") or {}
        if not isinstance(args, dict):
            raise InvalidParameterError(f"{where} ({_short(name)}): 'args' must be an object")
        if category in _RANGES:
            ranges.append((pid, tid, start, start + duration, _label(name, where), index))
            continue
        correlation = args.get("correlation")
        if correlation is not None:
            correlation = _identity(correlation, where, "args.correlation")
        if category in _LAUNCHES:
            if correlation is not None:
                launches[correlation] = (pid, tid, start)
            continue
        stream = _identity(args.get("stream", tid), where, "args.stream")
        kernels.append((start, start + duration, stream, correlation, name))
    return ranges, launches, kernels


class _Innermost:
    """The innermost range containing a moment, per thread, by a sweep over sorted
    ranges: ``ranges`` nest properly on one thread (a ``record_function`` stack)."""

    def __init__(self, ranges):
        ranges = sorted(ranges, key=lambda item: (item[0], -item[1]))
        self.starts = [item[0] for item in ranges]
        self.ranges = ranges
        # for each range, the index of the range that encloses it (-1: none)
        self.parent = []
        stack = []
        for position, (start, end, _) in enumerate(ranges):
            while stack and ranges[stack[-1]][1] <= start:
                stack.pop()
            self.parent.append(stack[-1] if stack else -1)
            stack.append(position)

    def at(self, moment):
        """The key of the innermost range with ``start <= moment < end``, or None."""
        position = bisect_right(self.starts, moment) - 1
        while position >= 0:
            start, end, key = self.ranges[position]
            if moment < end:
                return key
            position = self.parent[position]
        return None


def _profile_file(document, source):
    ranges, launches, kernels = _read_events(document, source)
    by_thread, by_process = defaultdict(list), defaultdict(list)
    for pid, tid, start, end, label, index in ranges:
        by_thread[(pid, tid)].append((start, end, index))
        by_process[pid].append((start, end, index))
    threads = {key: _Innermost(items) for key, items in by_thread.items()}
    processes = {key: _Innermost(items) for key, items in by_process.items()}
    label_of = {index: label for _, _, _, _, label, index in ranges}
    claimed = defaultdict(list)      # range index -> its kernels
    unmatched, unmatched_seconds = 0, 0.0
    streams = defaultdict(lambda: [0, 0.0, 0.0])
    for kernel in kernels:
        start, end, stream, correlation, name = kernel
        communication = is_communication_kernel(name)
        totals = streams[stream]
        totals[0] += 1
        totals[1] += end - start
        totals[2] += (end - start) if communication else 0.0
        launch = launches.get(correlation) if correlation is not None else None
        owner = None
        if launch is not None:
            pid, tid, moment = launch
            finder = threads.get((pid, tid))
            owner = finder.at(moment) if finder is not None else None
            if owner is None and pid in processes:
                owner = processes[pid].at(moment)
        if owner is None:
            unmatched += 1
            unmatched_seconds += (end - start) / _PER_SECOND
            continue
        claimed[owner].append((start, end, communication))
    occurrences = []
    for index, items in claimed.items():
        compute = sum(end - start for start, end, comm in items if not comm)
        communication = sum(end - start for start, end, comm in items if comm)
        first = min(start for start, _, _ in items)
        last = max(end for _, end, _ in items)
        occurrences.append((first, RangeTime(label_of[index], compute / _PER_SECOND,
                                             communication / _PER_SECOND,
                                             (last - first) / _PER_SECOND, len(items),
                                             source)))
    occurrences.sort(key=lambda item: item[0])
    window = 0.0
    if kernels:
        window = (max(end for _, end, *_ in kernels)
                  - min(start for start, *_ in kernels)) / _PER_SECOND
    stream_times = [StreamTime(source, stream, count, busy / _PER_SECOND, comm / _PER_SECOND)
                    for stream, (count, busy, comm) in streams.items()]
    return ([occurrence for _, occurrence in occurrences], stream_times, unmatched,
            unmatched_seconds, window, bool(kernels), bool(launches))


def kernel_profile(*documents, sources=None):
    """A :class:`KernelProfile` of parsed trace documents (the JSON of each file)."""
    sources = list(sources) if sources is not None else [
        f"<trace {number}>" for number in range(len(documents))]
    profile = KernelProfile([], [], files=tuple(sources))
    for document, source in zip(documents, sources):
        (ranges, streams, unmatched, unmatched_seconds, window, has_kernels,
         has_launches) = _profile_file(document, source)
        if not has_kernels:
            profile.notes.append(f"{source}: no GPU kernels (a CPU-only trace, or the "
                                 f"profiler ran without ProfilerActivity.CUDA)")
        elif not has_launches:
            profile.notes.append(f"{source}: kernels without launch calls (cuda_runtime "
                                 f"events): no kernel can be given to a range")
        profile.ranges += ranges
        profile.streams += streams
        profile.unmatched += unmatched
        profile.unmatched_seconds += unmatched_seconds
        profile.window += window
    if not profile.ranges:
        why = "; ".join(profile.notes) if profile.notes else (
            f"{', '.join(sources)}: no range (record_function) launched a GPU kernel")
        raise InvalidParameterError(f"{why}: nothing to measure (a CPU trace's PP: ranges "
                                    f"are read by `tabsched eval --replay`)")
    return profile


def read_kernel_trace(*paths, max_bytes=DEFAULT_MAX_BYTES):
    """:func:`kernel_profile` of trace files (``.json`` or ``.json.gz``) or directories of
    them (one file per rank), each read only if at most ``max_bytes`` long."""
    files = [name for path in paths for name in trace_files(path)]
    if not files:
        raise InvalidParameterError("no trace file given")
    documents = [_load(name, max_bytes) for name in files]
    return kernel_profile(*documents, sources=files)
