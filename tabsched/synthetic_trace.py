"""The trace PyTorch's pipelining runtime would write for a simulated run: no torch needed.

:func:`synthetic_trace` evaluates a table at known costs and writes, per device, the
``PP:`` operation, ``SEND`` and ``RECV`` events and the ``gloo:recv`` event that ends when
the data arrives, as a CPU profiler trace of ``examples/torch_pipeline.py`` holds them
(:mod:`tabsched.formats.kineto` documents the events). What :func:`tabsched.whatif.fit_costs`
recovers from it is the costs it was made with: the tests and ``bench/bench_follow.py``
use it where a real run would need torch.
"""

import json
import os

import numpy as np

from tabsched.cells import KINDS
from tabsched.files import atomic_write

__all__ = ["synthetic_trace"]

_PER_SECOND = 1e6          # a trace's ts and dur are microseconds


def synthetic_trace(table, costs, folder, *, iterations=1, gap=0.0):
    """Write the trace PyTorch's runtime would write for ``table`` run at ``costs``: one
    ``rank<r>.json`` per device with its ``PP:`` operation, SEND and RECV events.

    Each iteration is ``costs``' simulated one (starts and ends from
    :func:`tabsched.evaluate`), shifted by the previous iterations plus ``gap`` seconds; a
    receive's ``gloo:recv`` event ends when its transfer arrives. For tests and benchmarks
    that need a trace without torch: what :func:`fit_costs` recovers from it is ``costs``.
    Files are written atomically.

    Parameters
    ----------
    table : ScheduleTable
    costs : CostModel
        In seconds.
    folder : str or path
        Created if missing.
    iterations : int
    gap : float
        Seconds between iterations.
    """
    from tabsched.evaluate import evaluate
    result = evaluate(table, costs)
    starts, ends = np.asarray(result.op_start), np.asarray(result.op_end)
    labels = [f"{s}{KINDS[k]}{m}" for s, k, m in zip(table.stage.tolist(), table.kind.tolist(),
                                                     table.microbatch.tolist())]
    owner = {}
    for index, (stage, kind, micro) in enumerate(zip(table.stage.tolist(), table.kind.tolist(),
                                                     table.microbatch.tolist())):
        owner[(stage, KINDS[kind], micro)] = index
    os.makedirs(folder, exist_ok=True)
    period = float(result.makespan) + gap
    devices = table.device.tolist()
    transfer = getattr(costs, "comm", 0.0)
    transfer = float(transfer) if np.ndim(transfer) == 0 else 0.0
    for device in range(table.num_devices):
        events = []
        for number in range(iterations):
            shift = number * period
            free = shift * _PER_SECOND          # when the rank's previous operation ended
            row = np.flatnonzero(table.device == device)
            for index in row[np.argsort(starts[row], kind="stable")].tolist():
                stage, kind = table.stage[index], KINDS[table.kind[index]]
                micro = table.microbatch[index]
                start, end = (starts[index] + shift) * _PER_SECOND, (ends[index] + shift) * \
                    _PER_SECOND
                source = None
                if kind == "F" and stage > 0:
                    source = owner.get((stage - 1, "F", micro))
                    direction = "F"
                elif kind in "BI" and stage < table.num_stages - 1:
                    source = owner.get((stage + 1, "B", micro), owner.get((stage + 1, "I", micro)))
                    direction = "B"
                if source is not None and devices[source] != device:
                    # as PyTorch's runtime: RECV posted, the operation begins and blocks in
                    # wait() until the data is there (the recv event's end)
                    arrival = (ends[source] + shift + transfer) * _PER_SECOND
                    begin = min(free, start)
                    events.append({"ph": "X", "cat": "user_annotation",
                                   "name": f"PP:{stage}RECV_{direction}{micro}", "ts": begin,
                                   "dur": 0.0, "pid": device, "tid": device})
                    events.append({"ph": "X", "cat": "cpu_op", "name": "gloo:recv",
                                   "ts": begin, "dur": max(arrival, begin) - begin,
                                   "pid": device, "tid": device})
                    start = begin
                free = end
                events.append({"ph": "X", "cat": "user_annotation", "name": f"PP:{labels[index]}",
                               "ts": start, "dur": end - start, "pid": device, "tid": device})
                sent = {"F": stage < table.num_stages - 1, "B": stage > 0, "I": stage > 0}
                if sent.get(kind):
                    events.append({"ph": "X", "cat": "user_annotation",
                                   "name": f"PP:{stage}SEND_{'F' if kind == 'F' else 'B'}{micro}",
                                   "ts": end, "dur": 0.0, "pid": device, "tid": device})
        document = {"schemaVersion": 1, "distributedInfo": {"rank": device},
                    "traceEvents": events}
        atomic_write(os.path.join(os.fspath(folder), f"rank{device}.json"),
                     json.dumps(document))
