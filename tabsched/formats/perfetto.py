"""Chrome trace / Perfetto export of an evaluated table.

One simulated iteration becomes a JSON trace that ``ui.perfetto.dev`` and
``chrome://tracing`` open like a real profile: a process "devices" with one
track per device (every operation a complete event, the optimizer step too),
a process "links" with one track per directed link that carries traffic (every
transfer an event), and, when the iteration has a tail, a "collectives" track
for the gradient syncs. ``ts`` and ``dur`` are in microseconds, as the format
wants: a result in seconds is converted; a result in slots (the table level, no
seconds at all) draws one slot as 1 ms, so that slots read as whole milliseconds
in the viewer. ``otherData`` says which: ``time_unit`` is the result's unit
(``"s"`` or ``"slots"``), ``trace_time_unit`` is ``"us"`` and
``trace_us_per_time_unit`` the scale (1e6 or 1000), with a one-line ``note``.

An overlapped forward-backward pair (DualPipe's two-microbatch cell) is one
slice named after both operations (``"0F7 + 7B3"``, category ``overlap``) with
both in ``args.ops``: the cost model runs the two together for the whole
interval, so two nested slices of equal length, or halves, would both say
something the model does not.

As in a ``torch.profiler`` trace, memory is a counter track per device
(``device <d> memory``: activations, and persistent + activations when the
cost model has persistent memory; ``"ph": "C"`` events at every change), and
each transfer is joined to its producer and its consumer by flow arrows
(``"ph": "s"``/``"f"`` with ``"bp": "e"``, category ``transfer``), so clicking
an operation shows where its output went.

>>> from tabsched import evaluate, generate
>>> trace = chrome_trace(evaluate(generate("1f1b", devices=2, microbatches=2)))
>>> sorted({event["ph"] for event in trace["traceEvents"]})
['C', 'M', 'X', 'f', 's']
"""

import json

import numpy as np

from tabsched.files import atomic_write
from tabsched.nodes import OPTIMIZER, SYNC, TRANSFER

__all__ = ["chrome_trace", "write_trace"]

DEVICES_PID = 0
LINKS_PID = 1
COLLECTIVES_PID = 2
KIND_NAMES = {"F": "forward", "B": "backward", "I": "input-grad", "W": "weight-grad"}
#: Trace microseconds per unit of a result's time: seconds are converted; a slot, which
#: is no length of time, is drawn as 1 ms (1000 us), a length the viewers show well.
US_PER_TIME_UNIT = {"s": 1e6, "slots": 1e3}


def _microseconds(result):
    """Factor from the result's time unit to the trace's microseconds."""
    return US_PER_TIME_UNIT.get(result.time_unit, 1.0)


def _time_metadata(result):
    """What the trace's times mean: ``otherData`` entries."""
    scale = _microseconds(result)
    if result.time_unit == "s":
        note = "ts and dur are microseconds of simulated time"
    elif result.time_unit == "slots":
        note = ("times are schedule slots, not seconds: one slot is drawn as 1 ms "
                "(ts and dur are slots x 1000)")
    else:
        note = f"ts and dur are {result.time_unit}"
    return {"time_unit": result.time_unit, "trace_time_unit": "us",
            "trace_us_per_time_unit": scale, "note": note}


def chrome_trace(result):
    """The trace of ``result`` as a dict in the Trace Event Format.

    Every operation and every transfer is one ``"X"`` (complete) event, but an
    overlapped cell is one event for its parts (``args.ops`` lists them). Events
    on the critical path carry ``args.critical = true``.
    """
    scale = _microseconds(result)
    table = result.table
    lowered = result._lowered
    start = result._node_start
    durations = result._node_durations
    critical = np.zeros(lowered.num_nodes, dtype=bool)
    critical[result.critical_nodes()] = True

    events = [_meta(DEVICES_PID, None, "process_name", "devices"),
              _meta(DEVICES_PID, None, "process_sort_index", DEVICES_PID)]
    for device in range(table.num_devices):
        events.append(_meta(DEVICES_PID, device, "thread_name", f"device {device}"))
        events.append(_meta(DEVICES_PID, device, "thread_sort_index", device))

    cells = {}
    for k in range(len(table)):
        cells.setdefault(int(lowered.cell_of_op[k]), []).append(k)
    for cell, ops in cells.items():
        kinds = [table.kind_letter(k) for k in ops]
        timing = {"pid": DEVICES_PID, "tid": int(table.device[ops[0]]),
                  "ts": float(start[cell]) * scale, "dur": float(durations[cell]) * scale}
        if len(ops) == 1:
            k, kind = ops[0], kinds[0]
            events.append({
                "name": str(table.op(k)), "cat": KIND_NAMES[kind], "ph": "X", **timing,
                "args": {"stage": int(table.stage[k]), "microbatch": int(table.microbatch[k]),
                         "kind": kind, "critical": bool(critical[cell])}})
            continue
        # one slice for the overlapped pair: the model runs both for all of the interval
        names = [str(table.op(k)) for k in ops]
        events.append({
            "name": " + ".join(names), "cat": "overlap", "ph": "X", **timing,
            "args": {"ops": names, "stages": [int(table.stage[k]) for k in ops],
                     "microbatches": [int(table.microbatch[k]) for k in ops],
                     "kinds": kinds, "critical": bool(critical[cell])}})

    transfers = lowered.transfers
    if len(transfers):
        src, dst = transfers.src, transfers.dst
        links = sorted(set(zip(src.tolist(), dst.tolist())))
        track = {link: index for index, link in enumerate(links)}
        events.append(_meta(LINKS_PID, None, "process_name", "links"))
        events.append(_meta(LINKS_PID, None, "process_sort_index", LINKS_PID))
        for link, index in track.items():
            events.append(_meta(LINKS_PID, index, "thread_name", f"link {link[0]}->{link[1]}"))
            events.append(_meta(LINKS_PID, index, "thread_sort_index", index))
        _, nbytes = result._cost_model.transfer_costs(table, transfers)
        for k, node in enumerate(lowered.node_ids(TRANSFER)):
            events.append({
                "name": lowered.describe_node(node),
                "cat": "gradient" if transfers.gradient[k] else "activation", "ph": "X",
                "pid": LINKS_PID, "tid": track[int(src[k]), int(dst[k])],
                "ts": float(start[node]) * scale, "dur": float(durations[node]) * scale,
                "args": {"bytes": float(nbytes[k]), "critical": bool(critical[node])}})

    if lowered.count(SYNC):
        events.append(_meta(COLLECTIVES_PID, None, "process_name", "collectives"))
        events.append(_meta(COLLECTIVES_PID, 0, "thread_name", "gradient sync"))
        for k, node in enumerate(lowered.node_ids(SYNC)):
            events.append({
                "name": lowered.describe_node(node), "cat": "grad-sync", "ph": "X",
                "pid": COLLECTIVES_PID, "tid": 0,
                "ts": float(start[node]) * scale, "dur": float(durations[node]) * scale,
                "args": {"devices": list(lowered.sync_devices(k)),
                         "critical": bool(critical[node])}})
    events.extend(_memory_counters(result, scale))
    if len(transfers):
        events.extend(_transfer_flows(result, scale, track))
    for node in lowered.node_ids(OPTIMIZER):
        device = int(lowered.node_device[node])
        events.append({
            "name": "optimizer step", "cat": "optimizer", "ph": "X",
            "pid": DEVICES_PID, "tid": device,
            "ts": float(start[node]) * scale, "dur": float(durations[node]) * scale,
            "args": {"critical": bool(critical[node])}})

    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"generator": "tabsched", "family": table.family,
                          "params": table.params, "level": result.level,
                          "makespan": result.makespan, **_time_metadata(result)}}


def _memory_counters(result, scale):
    """One counter track per device: memory after every change (last value per instant)."""
    bytes_ = result.memory_unit == "bytes"
    events = []
    for device, (times, values) in enumerate(result.memory_timeline()):
        persistent = result.devices[device].persistent_memory
        # a device that holds no activation (no operation, or none that keeps one) has an
        # empty timeline: its track is the 0 it starts at
        last_at_time = (np.append(times[1:] != times[:-1], True) if len(times)
                        else np.zeros(0, dtype=bool))
        times = np.concatenate([[0.0], times[last_at_time]])
        values = np.concatenate([[0.0], values[last_at_time]])
        for time, value in zip(times.tolist(), values.tolist()):
            args = {"activations": value}
            if persistent:
                args["total"] = value + persistent
            events.append({"name": f"device {device} memory"
                                   + (" (bytes)" if bytes_ else f" ({result.memory_unit})"),
                           "ph": "C", "pid": DEVICES_PID, "ts": time * scale, "args": args})
    return events


def _transfer_flows(result, scale, track):
    """Flow arrows producer -> transfer and transfer -> consumer, two per transfer."""
    lowered = result._lowered
    table = result.table
    start = result._node_start
    transfers = lowered.transfers
    events = []
    src, dst = transfers.src.tolist(), transfers.dst.tolist()
    producer_cells = lowered.cell_of_op[transfers.producer].tolist()
    consumer_cells = lowered.cell_of_op[transfers.consumer].tolist()
    for k, node in enumerate(lowered.node_ids(TRANSFER)):
        link = track[src[k], dst[k]]
        name = str(table.op(int(transfers.producer[k])))
        ends = [((DEVICES_PID, src[k], start[producer_cells[k]]),
                 (LINKS_PID, link, start[node])),
                ((LINKS_PID, link, start[node]),
                 (DEVICES_PID, dst[k], start[consumer_cells[k]]))]
        for half, ((pid_a, tid_a, ts_a), (pid_b, tid_b, ts_b)) in enumerate(ends):
            flow = 2 * k + half
            events.append({"name": name, "cat": "transfer", "ph": "s", "id": flow,
                           "pid": pid_a, "tid": tid_a, "ts": float(ts_a) * scale})
            events.append({"name": name, "cat": "transfer", "ph": "f", "bp": "e", "id": flow,
                           "pid": pid_b, "tid": tid_b, "ts": float(ts_b) * scale})
    return events


def _meta(pid, tid, name, value):
    event = {"name": name, "ph": "M", "pid": pid,
             "args": {"sort_index" if name.endswith("sort_index") else "name": value}}
    if tid is not None:
        event["tid"] = tid
    return event


def write_trace(result, path):
    """Write ``chrome_trace(result)`` to ``path`` as JSON (atomically)."""
    atomic_write(path, json.dumps(chrome_trace(result)))
