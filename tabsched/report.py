"""A self-contained HTML report: an interactive Gantt chart and the memory timelines.

:func:`html_report` turns a :class:`~tabsched.result.Result`, the rows of
:func:`tabsched.compare.compare`, a :class:`~tabsched.plan.PlanResult` or an
:class:`~tabsched.adapt.AdaptResult` into one HTML file that needs nothing else:
no server, no network, no script, font or style sheet from elsewhere. The page's
data is one JSON object in a ``<script type="application/json">`` tag (every
``<``, ``>`` and ``&`` written as a ``\\u`` escape, so no text in it can close the
tag); a script in the page, written here, draws from it.

The Gantt chart has one bar per compute cell (an overlapped cell's operations share
its bar), per optimizer step, per transfer (a lane per directed link, only when the
run has transfers) and per gradient sync. Hovering a bar shows its label, kind,
start, end and what it waited for: the node the engine found decided its start (the
binding the critical path follows) is either the previous node of its own lane (the
device or the link was busy: the wait is from when its inputs were ready) or a
dependency (the wait is the lane's idle time before it). Times are in ms or µs for
seconds, in slots at the table level. The wheel or the buttons zoom, a drag pans,
and the memory chart below follows the same time axis.

Past :data:`MAX_BARS` bars a chart is left out, with a note in the page; memory
timelines are cut to :data:`MAX_MEMORY_POINTS` points per device (each kept point the
peak of the time it stands for). The work is linear in the run's nodes and edges.
"""

import functools
import html
import json

import numpy as np

from tabsched.edges import dependencies
from tabsched.exceptions import InvalidParameterError, TabschedError
from tabsched.nodes import (CELL, KINDS, OPTIMIZER, REDUCE_GRAD, RESHARD, SYNC, TRANSFER,
                            UNSHARD)

__all__ = ["html_report", "MAX_BARS", "MAX_MEMORY_POINTS", "HTML_SUFFIXES"]

#: Most bars one Gantt chart draws; a larger run's chart is left out with a note.
MAX_BARS = 20_000
#: Most bars a page draws over all its charts (compare: one chart per family).
MAX_PAGE_BARS = 80_000
#: Most points of one device's memory timeline.
MAX_MEMORY_POINTS = 4_000
#: The suffixes an HTML report is written with.
HTML_SUFFIXES = (".html", ".htm")

_KIND_OF_CELL = {"F": "forward", "B": "backward", "I": "input-grad", "W": "weight-grad"}


# ----------------------------------------------------------------------- units
def _time_scale(unit, makespan):
    """``(factor, unit)`` to show times of ``unit``: seconds as s, ms or µs by size."""
    if unit != "s":
        return 1.0, unit
    if makespan >= 1.0:
        return 1.0, "s"
    if makespan >= 1e-3:
        return 1e3, "ms"
    return 1e6, "µs"


def _memory_scale(unit, peak):
    if unit != "bytes":
        return 1.0, unit
    for factor, name in ((1e-12, "TB"), (1e-9, "GB"), (1e-6, "MB"), (1e-3, "kB")):
        if peak * factor >= 1.0:
            return factor, name
    return 1.0, "B"


def _shown(value, factor, unit):
    """A time or an amount with its unit; seconds in the unit that suits each value."""
    if unit in ("s", "ms", "µs"):
        from tabsched.costs.units import format_quantity
        return format_quantity(float(value), "s")
    return f"{value * factor:.4g} {unit}"


def _finite(value):
    """``value`` as a float JSON can hold, or None (infinite, NaN or missing)."""
    if value is None:
        return None
    value = float(value)
    return value if np.isfinite(value) else None


# ------------------------------------------------------------------ one result
def _result_title(result):
    from tabsched.plot import table_title
    return table_title(result.table, limit=200)


def result_data(result, name=None, *, bar_budget=None):
    """The page data of one result: summary numbers, Gantt bars and memory lines."""
    factor, unit = _time_scale(result.time_unit, result.makespan)
    data = {"name": name or _result_title(result), "level": result.level,
            "unit": unit, "scale": factor, "seconds": result.time_unit == "s",
            "makespan": _finite(result.makespan),
            "summary": _summary_lines(result, factor, unit), "notes": list(result.notes)}
    data["gantt"] = _gantt(result, factor, unit,
                           MAX_BARS if bar_budget is None else min(MAX_BARS, bar_budget))
    data["memory"] = _memory(result)
    return data


def _summary_lines(result, factor, unit):
    lines = [f"{result.level} level: makespan {_shown(result.makespan, factor, unit)}, "
             f"bubble {result.bubble_ratio:.1%}",
             f"{result.table.num_devices} devices, {result.table.num_stages} stages, "
             f"{result.table.num_microbatches} microbatches, {len(result.table)} operations"]
    if result.throughput is not None:
        run = result.throughput
        lines.append(f"{run.tokens_per_s_per_gpu:.0f} tokens/s/GPU, MFU {run.mfu:.1%}")
    return lines


def _gantt(result, factor, unit, budget):
    """Bars ``[lane, start, end, kind, label, why, critical]`` and the lanes' names."""
    lowered, table = result._lowered, result.table
    start, durations = result._node_start, result._node_durations
    n = lowered.num_nodes
    kinds = lowered.node_kind
    lane = np.full(n, -1, dtype=np.int64)
    D = table.num_devices
    names = [f"device {d}" for d in range(D)]
    cells, optimizers = lowered.nodes(CELL), lowered.nodes(OPTIMIZER)
    lane[cells] = lowered.cell_device
    lane[optimizers] = lowered.node_device[optimizers]
    transfers = lowered.nodes(TRANSFER)
    if len(lowered.transfers) and np.any(durations[transfers] > 0):
        # (at the table level transfers take no time: no lanes for them)
        link = (lowered.transfers.src.astype(np.int64) * D + lowered.transfers.dst)
        links, where = np.unique(link, return_inverse=True)
        lane[transfers] = len(names) + where
        names += [f"link {int(k // D)}->{int(k % D)}" for k in links]
    sharding = lowered.sharding
    for kind in KINDS:
        if kind in (CELL, TRANSFER, OPTIMIZER, RESHARD) or not lowered.count(kind):
            continue     # a RESHARD frees memory and takes no time: no bar
        owner = None     # ZeRO's all-gathers and reduce-scatters: a lane per device
        if sharding is not None and kind == UNSHARD:
            owner = sharding.unshard_device
        elif sharding is not None and kind == REDUCE_GRAD:
            owner = sharding.reduce_device
        if owner is not None and len(owner) == lowered.count(kind):
            used, where = np.unique(np.asarray(owner, dtype=np.int64), return_inverse=True)
            lane[lowered.nodes(kind)] = len(names) + where
            names += [f"d{int(d)} {kind.label}" for d in used]
            continue
        lane[lowered.nodes(kind)] = len(names)
        names.append("grad sync" if kind == SYNC else kind.label)
    bars = np.flatnonzero(lane >= 0)
    note = None
    if len(bars) > budget and np.count_nonzero(lane[bars] < D) <= budget:
        # the devices' lanes fit: keep them, leave the transfers and the tail out
        note = (f"{np.count_nonzero(lane[bars] >= D)} bars of transfers, syncs and "
                f"all-gathers left out: the chart draws {budget} bars at most")
        lane[lane >= D] = -1
        names = names[:D]
        bars = np.flatnonzero(lane >= 0)
    if len(bars) > budget:
        return {"lanes": names, "bars": [], "left_out": int(len(bars)),
                "note": f"Gantt chart left out: {len(bars)} bars, more than {budget} "
                        f"(draw a span with `tabsched plot gantt --time-range`)"}
    end = start + durations
    result.critical_nodes()                 # finds the binding, once
    binding = np.asarray(result._binding, dtype=np.int64)
    on_path = np.zeros(n, dtype=bool)
    on_path[result.critical_nodes()] = True
    # the previous bar of each bar's lane, in start order
    order = bars[np.lexsort((bars, start[bars], lane[bars]))]
    previous = np.full(n, -1, dtype=np.int64)
    same = lane[order[1:]] == lane[order[:-1]]
    previous[order[1:][same]] = order[:-1][same]
    lane_free = np.where(previous >= 0, end[np.maximum(previous, 0)], 0.0)
    # when each node's inputs were ready: the latest end of a predecessor other than
    # the previous node of its lane
    sources = np.repeat(np.arange(n, dtype=np.int64), np.diff(lowered.indptr))
    targets = lowered.successors.astype(np.int64)
    inputs = sources != previous[targets]
    ready = np.zeros(n)
    np.maximum.at(ready, targets[inputs], end[sources[inputs]])
    # ... and the data the previous node of its lane made for it (a B after its own F)
    producer, consumer, _, crossing = dependencies(table)
    local = ~crossing
    made = lowered.cell_of_op[producer[local]].astype(np.int64) + cells.start
    used = lowered.cell_of_op[consumer[local]].astype(np.int64) + cells.start
    apart = made != used
    np.maximum.at(ready, used[apart], end[made[apart]])
    tiny = 1e-9 * max(abs(float(result.makespan)), 1e-300)
    bound = binding[bars]
    # a transfer of no time (the table level) stands for its producer
    some = np.maximum(bound, 0)
    hidden = (bound >= 0) & (lane[some] < 0) & (kinds[some] == TRANSFER) & \
        (durations[some] == 0)
    bound[hidden] = binding[bound[hidden]]
    labels = _labels(result, bars)
    kind_names = _bar_kinds(result, bars)
    rows = []
    for k, node in enumerate(bars.tolist()):
        rows.append([int(lane[node]), float(start[node]), float(end[node]), kind_names[k],
                     labels[node], _why(node, int(bound[k]), previous[node], lane, start,
                                        ready, lane_free, labels, lowered, names,
                                        factor, unit, tiny),
                     bool(on_path[node])])
    return {"lanes": names, "bars": rows, "devices": D, "note": note}


def _labels(result, bars):
    """Each bar's text, by node id (other nodes: described when asked)."""
    lowered, table = result._lowered, result.table
    labels = {}
    cells = lowered.nodes(CELL)
    first = lowered.cell_first_op
    transfers = lowered.nodes(TRANSFER)
    device = table.device
    for node in bars.tolist():
        if cells.start <= node < cells.stop:
            labels[node] = table.cell_text(int(first[node - cells.start]))
        elif transfers.start <= node < transfers.stop:
            k = node - transfers.start
            producer = int(lowered.transfers.producer[k])
            consumer = int(lowered.transfers.consumer[k])
            labels[node] = (f"{table.op(producer)} d{int(device[producer])}"
                            f"->d{int(device[consumer])}")
        else:
            labels[node] = lowered.describe_node(node)
    return labels


def _bar_kinds(result, bars):
    lowered, table = result._lowered, result.table
    cells, transfers = lowered.nodes(CELL), lowered.nodes(TRANSFER)
    first = lowered.cell_first_op
    kinds = []
    for node in bars.tolist():
        if cells.start <= node < cells.stop:
            c = node - cells.start
            if first[c + 1] - first[c] > 1:
                kinds.append("overlap")
            else:
                kinds.append(table.kind_letter(int(first[c])))
        elif transfers.start <= node < transfers.stop:
            gradient = bool(lowered.transfers.gradient[node - transfers.start])
            kinds.append("gradient" if gradient else "activation")
        else:
            kinds.append(lowered.kind_of(node).label)
    return kinds


def _why(node, bound, previous, lane, start, ready, lane_free, labels, lowered, lane_names,
         factor, unit, tiny):
    """What ``node`` waited for, in words with the wait in ``unit``."""
    if bound < 0:
        return "nothing to wait for: it starts the run"
    label = labels.get(int(bound)) or lowered.describe_node(int(bound))
    where = lane_names[lane[bound]] if lane[bound] >= 0 else None
    resource = "link" if lane_names[lane[node]].startswith("link") else "device"
    if bound == previous or (lane[bound] == lane[node] and lane[node] >= 0):
        wait = start[node] - ready[node]
        if wait > tiny:
            return (f"waited {_shown(wait, factor, unit)} for the {resource}, busy with "
                    f"{label} ({resource} busy)")
        return f"started as {label} ended, its inputs ready then too ({resource} busy)"
    wait = start[node] - lane_free[node]
    on = f" on {where}" if where else ""
    if wait <= tiny:
        return (f"started as {label}{on} ended, the {resource} free already "
                f"(dependency, no idle time)")
    return f"waited {_shown(wait, factor, unit)} for {label}{on} (dependency)"


def _memory(result):
    """Each device's memory (persistent + activations) over time, with the limits."""
    try:
        timelines = result.memory_timeline()
    except (AttributeError, TypeError, TabschedError):
        return None
    persistent = [d.persistent_memory for d in result.devices]
    peak = max([d.peak_total_memory for d in result.devices] +
               [v for v in (result.memory_budget, result.memory_capacity) if v is not None]
               + [0.0])
    factor, unit = _memory_scale(result.memory_unit, peak)
    lines, cut = [], False
    for d, (times, values) in enumerate(timelines):
        times = np.asarray(times, dtype=np.float64)
        values = np.asarray(values, dtype=np.float64) + persistent[d]
        if len(times):
            last = np.append(times[1:] != times[:-1], True)
            times, values = times[last], values[last]
        if len(times) > MAX_MEMORY_POINTS:
            cut = True
            edges = np.linspace(0, len(times), MAX_MEMORY_POINTS + 1).astype(np.int64)
            edges = np.unique(edges[:-1])
            values = np.maximum.reduceat(values, edges)
            times = times[edges]
        points = np.column_stack([times, values * factor]).tolist() if len(times) else []
        lines.append({"device": d, "persistent": persistent[d] * factor, "points": points})
    limits = []
    if result.memory_budget is not None and _finite(result.memory_budget) is not None:
        limits.append({"name": "budget", "value": result.memory_budget * factor})
    if result.memory_capacity is not None and _finite(result.memory_capacity) is not None:
        limits.append({"name": "device memory", "value": result.memory_capacity * factor})
    return {"unit": unit, "lines": lines, "limits": limits,
            "note": (f"memory lines cut to {MAX_MEMORY_POINTS} points per device, each the "
                     f"peak of its span") if cut else None}


# ------------------------------------------------------------------ the page
def _escape(text):
    return html.escape(str(text), quote=True)


def _json_for_script(data):
    """JSON that cannot end its ``<script>`` tag: ``<``, ``>``, ``&`` escaped, ASCII."""
    text = json.dumps(data, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _table(header, rows, marks=None):
    parts = ["<table class='rows'><tr>" + "".join(f"<th>{_escape(h)}</th>" for h in header)
             + "</tr>"]
    for k, row in enumerate(rows):
        mark = f" class='{marks[k]}'" if marks and marks[k] else ""
        parts.append(f"<tr{mark}>" + "".join(f"<td>{_escape(v)}</td>" for v in row) + "</tr>")
    parts.append("</table>")
    return "\n".join(parts)


def _page(title, body, charts):
    data = {"charts": charts}
    style, script = _assets()
    document = (_HEAD.replace("@TITLE@", _escape(title)).replace("@STYLE@", style)
                + f"<h1>{_escape(title)}</h1>\n" + body
                + "\n<div id='charts'></div>\n<div id='tip' class='tip' hidden></div>\n"
                + "<script type='application/json' id='tabsched-data'>"
                + _json_for_script(data) + "</script>\n<script>" + script + "</script>\n"
                + "</body>\n</html>\n")
    # a lone surrogate (text that came from bytes no encoding holds) is written as its
    # escape, so the page is always valid UTF-8
    return document.encode("utf-8", "backslashreplace").decode("utf-8")


def _result_page(result, runs=None):
    chart = result_data(result)
    chart["heading"] = "Gantt chart and memory"
    body = _notes_html(result.notes)
    if runs is not None:
        body += _monte_carlo_html(runs, result.makespan)
    return _page(f"tabsched: {chart['name']}", body, [chart])


def _monte_carlo_html(runs, makespan):
    """The Monte Carlo figures beside the chart (which shows the nominal run)."""
    factor, unit = _time_scale(runs.time_unit, makespan)
    header = ["samples", "seed", "mean makespan", "p50", "p95", "max", "run-time bubble"]
    row = [runs.samples, runs.seed] + [_shown(value, factor, unit) for value in (
        runs.mean, runs.p50, runs.p95, runs.max, runs.runtime_bubble)]
    return ("<h2>Run-time variation (Monte Carlo)</h2>" + _table(header, [row])
            + "<p class='note'>the Gantt chart below is the run at mean durations</p>")


def _notes_html(notes):
    return "".join(f"<p class='note'>note: {_escape(note)}</p>" for note in notes)


def _compare_page(rows):
    header = ["family", "formula bubble", "formula rank", "table bubble", "slots",
              "table rank", "iteration", "idle", "peak memory", "fits", "simulation rank"]
    body, charts, spent, left = [], [], 0, []
    for row in rows:
        if row.error:
            body.append([row.label, "skipped: " + row.error] + [""] * (len(header) - 2))
            continue
        f, t, sim = row.formula or {}, row.table or {}, row.simulation or {}
        factor, unit = _time_scale(sim.get("time_unit"), sim.get("makespan") or 0.0)
        mfactor, munit = _memory_scale(sim.get("memory_unit"),
                                       max(sim.get("peak_memory") or [0.0]))
        body.append([row.label,
                     "-" if f.get("bubble_ratio") is None else f"{f['bubble_ratio']:.1%}",
                     row.ranks.get("formula") or "-",
                     f"{t['bubble_ratio']:.1%}" if t else "-",
                     f"{t['slots']:g} slots" if t else "-",
                     row.ranks.get("table") or "-",
                     _shown(sim["makespan"], factor, unit), f"{sim['bubble_ratio']:.1%}",
                     _shown(max(sim["peak_memory"] or [0.0]), mfactor, munit),
                     "yes" if sim.get("fits") else "no",
                     row.ranks.get("simulation") or "-"])
        result = getattr(row, "result", None)
        if result is None:
            continue
        if spent >= MAX_PAGE_BARS:
            left.append(row.label)
            continue
        chart = result_data(result, row.label, bar_budget=MAX_PAGE_BARS - spent)
        spent += len(chart["gantt"]["bars"])
        chart["heading"] = f"{row.label} ({result.level})"
        charts.append(chart)
    parts = ["<h2>Families compared</h2>",
             "<p>Ranks: 1 is the best within each level (the simulation ranks every family "
             "that fits the device's memory first).</p>", _table(header, body)]
    if left:
        parts.append(f"<p class='note'>Gantt charts left out (the page holds "
                     f"{MAX_PAGE_BARS} bars at most): {_escape(', '.join(left))}</p>")
    return _page("tabsched compare", "\n".join(parts), charts)


def _plan_page(plan, best_result):
    from tabsched.costs.units import format_quantity
    header = ["rank", "configuration", "iteration", "tokens/s/GPU", "MFU", "peak memory",
              "bubble", "exposed comm."]
    body, marks = [], []
    for row in plan.rows:
        body.append([f"{row.rank}{' ~' if row.tied else ''}", row.label(),
                     format_quantity(row.iteration_s, "s"),
                     f"{row.throughput.tokens_per_s_per_gpu:.0f}", f"{row.throughput.mfu:.1%}",
                     format_quantity(row.peak_memory_max, "B"), f"{row.bubble_ratio:.1%}",
                     f"{row.exposed_communication:.1%}"])
        marks.append("tied" if row.tied else "")
    parts = [f"<p>{_escape(plan.model)} on {plan.gpus} x {_escape(plan.system)}, global "
             f"batch {plan.global_batch}, memory budget "
             f"{_escape(format_quantity(plan.memory_budget, 'B'))}</p>",
             "<h2>Executions ranked</h2>", _table(header, body, marks)]
    tied = sum(1 for row in plan.rows if row.tied)
    parts.append(f"<p class='note'>~ tie band: {tied} row{'s' if tied != 1 else ''} within "
                 f"{plan.tie_band:.1%} of the best iteration (the model's measured error), "
                 f"shaded: the model cannot rank them.</p>")
    parts.extend(f"<p class='note'>{_escape(line)}</p>" for line in plan.summary_lines())
    charts = []
    if isinstance(best_result, str):
        parts.append(f"<p class='note'>no Gantt chart of the best: {_escape(best_result)}</p>")
    elif best_result is not None:
        chart = result_data(best_result, f"rank 1: {plan.best.label()}")
        chart["heading"] = f"The best execution: {plan.best.label()}"
        charts.append(chart)
    return _page("tabsched plan", "\n".join(parts), charts)


def _plan_best(plan):
    """The best row's evaluated result, or why there is none (text)."""
    from tabsched.costs.system import load_system
    from tabsched.costs.transformer import load_model
    from tabsched.evaluate import evaluate
    from tabsched.plan.rows import table_for
    from tabsched.plan.search import run_costs
    if not plan.rows:
        return "the plan has no rows"
    try:
        model, system = load_model(plan.model), load_system(plan.system)
        best = plan.best
        costs = run_costs(model, system, best.execution)
        table = table_for(best.configuration, costs, plan.memory_budget)
        return evaluate(table, costs, memory_budget=plan.memory_budget)
    except TabschedError as error:
        return f"cannot evaluate it again ({error})"


def _adapt_page(found, costs):
    from tabsched.costs.base import UnitCosts
    from tabsched.evaluate import evaluate
    factor, unit = _time_scale(found.time_unit, found.baseline.mean)
    reports = [("start", found.baseline), ("adapted", found.adapted)]
    reports += [(f"reference {name}", report) for name, report in found.references.items()
                if report is not None]
    header = ["table", "mean makespan", "p95 makespan", "nominal", "fits", "transforms"]
    body = [[name, _shown(r.mean, factor, unit), _shown(r.p95, factor, unit),
             _shown(r.nominal, factor, unit), "yes" if r.feasible else "no",
             len(r.transforms)] for name, r in reports]
    gain = found.gain(found.baseline)
    parts = [f"<p>objective: {_escape(found.objective)} makespan over {found.samples} "
             f"samples" + (f"; gain over the start {gain:+.1%}" if gain is not None else "")
             + ("" if found.feasible else "; <b>no table fits the memory budget</b>")
             + "</p>", _table(header, body), "<h2>Transforms applied</h2>"]
    if found.transforms:
        parts.append("<ol>" + "".join(f"<li>{_escape(t)}</li>" for t in found.transforms)
                     + "</ol>")
    else:
        parts.append("<p>none: the start was kept</p>")
    if found.started_from:
        parts.append(f"<p class='note'>the search started from the reference "
                     f"{_escape(found.started_from)}</p>")
    if found.returned_reference:
        parts.append(f"<p class='note'>returned the reference "
                     f"{_escape(found.returned_reference)}: the search did not beat it</p>")
    if costs is None:
        costs = UnitCosts()
        parts.append("<p class='note'>no costs given: the Gantt charts are at the table "
                     "level (unit slots)</p>")
    charts = []
    for name, table in (("before: the start", found.baseline.table),
                        ("after: the adapted table", found.table)):
        try:
            result = evaluate(table, costs, memory_budget=found.budget)
        except TabschedError as error:
            parts.append(f"<p class='note'>{_escape(name)}: cannot evaluate ({_escape(error)})"
                         f"</p>")
            continue
        chart = result_data(result, name)
        chart["heading"] = f"{name} (nominal durations)"
        charts.append(chart)
    return _page("tabsched adapt", "\n".join(parts), charts)


def html_report(obj, path=None, *, costs=None, best=None, monte_carlo=None):
    """The HTML report of ``obj`` as one self-contained page; written to ``path`` if given.

    Parameters
    ----------
    obj : Result, compare rows, PlanResult or AdaptResult
        A result (its Gantt chart and memory); what :func:`tabsched.compare.compare`
        returns (the table of the families, a chart per family evaluated); a plan (its
        ranked rows with the tie band, and the best evaluated again from its model and
        system names, or ``best``); an adapt result (the start and the adapted table,
        evaluated under ``costs``, and the transforms).
    path : str or path-like, optional
        Where to write the page (``.html`` or ``.htm``), atomically
        (:func:`tabsched.files.atomic_write`); checked before any work.
    costs : CostModel, optional
        The costs an adapt result's tables are drawn under (default unit slots).
    best : Result, optional
        A plan's best configuration, evaluated (default: evaluated here).
    monte_carlo : optional
        A result's Monte Carlo runs (:func:`tabsched.adapt.monte_carlo`'s summary, as
        ``tabsched eval --cv`` makes): their figures head the page.

    Returns
    -------
    str
        The page.

    Raises
    ------
    InvalidParameterError
        ``obj`` is none of these.
    OutputError
        ``path`` cannot be written.
    """
    import os

    from tabsched.exceptions import OutputError
    from tabsched.files import atomic_write, check_output_path, file_path
    if path is not None:
        path = file_path(path, "path", error=OutputError)
        if os.path.isdir(path) and not os.path.islink(path):
            raise OutputError(f"{path}: is a folder; give the HTML report's file name")
        check_output_path(path, suffixes=HTML_SUFFIXES, what="HTML report")
    page = _build(obj, costs, best, monte_carlo)
    if path is not None:
        atomic_write(path, page)
    return page


def _build(obj, costs, best, monte_carlo):
    from tabsched.adapt.search import AdaptResult
    from tabsched.compare import Comparison
    from tabsched.plan.result import PlanResult
    from tabsched.result import Result
    if isinstance(obj, Result):
        if obj._lowered is None:
            raise InvalidParameterError("html_report: this result keeps no run (a result of "
                                        "tabsched.evaluate has one)")
        return _result_page(obj, monte_carlo)
    if isinstance(obj, PlanResult):
        return _plan_page(obj, best if best is not None else _plan_best(obj))
    if isinstance(obj, AdaptResult):
        return _adapt_page(obj, costs)
    if isinstance(obj, (list, tuple)) and obj and all(isinstance(row, Comparison)
                                                      for row in obj):
        return _compare_page(obj)
    from tabsched.cells import shown_repr
    raise InvalidParameterError(f"html_report takes a Result, the rows of compare, a "
                                f"PlanResult or an AdaptResult, not {shown_repr(obj)}")


_HEAD = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>@TITLE@</title>
<style>@STYLE@</style>
</head>
<body>
"""

@functools.lru_cache(maxsize=1)
def _assets():
    """The page's style and script, read once from ``tabsched/_report`` (package data: a
    page carries them inline, so it needs no server or network)."""
    from importlib.resources import files
    folder = files("tabsched") / "_report"
    return ((folder / "page.css").read_text(encoding="utf-8"),
            (folder / "page.js").read_text(encoding="utf-8"))

