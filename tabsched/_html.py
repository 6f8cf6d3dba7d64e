"""HTML for notebooks: a table as a coloured grid, a result as a summary and a Gantt,
a plan as its ranked rows.

Jupyter shows an object's ``_repr_html_()``; ``ScheduleTable`` and ``Result``
return what these functions build. Everything is escaped; large tables are cut
to their first ``MAX_SLOTS`` slots with a note. The Gantt chart of a result is
drawn by :func:`tabsched.plot.gantt_svg` and passed in, so this module imports
nothing that imports a table (no cycle).
"""

import html

__all__ = ["table_html", "result_html", "plan_html", "compare_html", "sweep_html"]

MAX_SLOTS = 160
MAX_DEVICES = 64
# the Gantt chart's colours (tabsched.plot), without importing matplotlib
_KIND_COLORS = {"F": "#0072B2", "B": "#E69F00", "I": "#D55E00", "W": "#009E73",
                "overlap": "#CC79A7"}
_TEXT = {"F": "white", "B": "black", "I": "white", "W": "white", "overlap": "black"}
_CELL = ("padding:1px 3px;font:11px monospace;text-align:center;border:1px solid #fff;"
         "white-space:nowrap")


def _title(table):
    params = " ".join(f"{key}={value}" for key, value in table.params.items()
                      if key != "transforms")
    name = table.family or ("adapted table" if "transforms" in table.params else "table")
    return html.escape(f"{name} {params}".strip())


def table_html(table):
    """The table as an HTML grid: a row per device, a cell per slot, coloured by kind."""
    rows = table.rows
    slots = min(table.num_slots, MAX_SLOTS)
    parts = [f"<div><b>{_title(table)}</b>: {table.num_devices} devices x "
             f"{table.num_slots} slots, {table.num_stages} stages, "
             f"{table.num_microbatches} microbatches, {len(table)} ops",
             "<table style='border-collapse:collapse'>",
             "<tr><th></th>" + "".join(f"<th style='font:9px monospace'>{k}</th>"
                                       if k % 5 == 0 else "<th></th>"
                                       for k in range(slots)) + "</tr>"]
    for device, row in enumerate(rows[:MAX_DEVICES]):
        cells = []
        for cell in row[:slots]:
            if cell is None:
                cells.append(f"<td style='{_CELL};background:#eee'></td>")
                continue
            text = str(cell)
            kind = "overlap" if text.startswith("(") else text.lstrip("0123456789")[0]
            shown = text.replace(")OVERLAP_F_B", ")").replace(";", "+")
            cells.append(f"<td style='{_CELL};background:{_KIND_COLORS[kind]};"
                         f"color:{_TEXT[kind]}' title='{html.escape(text)}'>"
                         f"{html.escape(shown)}</td>")
        cells += [f"<td style='{_CELL}'></td>"] * (slots - len(row[:slots]))
        parts.append(f"<tr><th style='font:11px monospace;text-align:right'>d{device}</th>"
                     + "".join(cells) + "</tr>")
    parts.append("</table>")
    cut = []
    if table.num_slots > slots:
        cut.append(f"{table.num_slots - slots} more slots")
    if table.num_devices > MAX_DEVICES:
        cut.append(f"{table.num_devices - MAX_DEVICES} more devices")
    if cut:
        parts.append(f"<i>... {' and '.join(cut)} not shown (render_grid or to_csv show "
                     f"all)</i>")
    parts.append("</div>")
    return "\n".join(parts)


def _number(value):
    """Four significant digits, never in scientific notation."""
    from tabsched.costs.units import format_number
    return format_number(value, 4)


def result_html(result, gantt=""):
    """A result as an HTML summary (level, makespan, bubble, devices), then ``gantt``
    (an inline SVG or a note)."""
    unit, memory_unit = result.time_unit, result.memory_unit
    formula = result.formula or {}
    header = ["device", f"busy ({unit})", f"idle ({unit})", f"warm-up ({unit})",
              f"inside ({unit})", f"cool-down ({unit})", f"peak memory ({memory_unit})"]
    parts = [f"<div><b>{_title(result.table)}</b> - {html.escape(result.level)} level: "
             f"makespan <b>{_number(result.makespan)} {html.escape(unit)}</b>, bubble "
             f"<b>{result.bubble_ratio:.2%}</b>"
             + (f" (formula level: {formula['bubble_ratio']:.2%})"
                if formula.get("bubble_ratio") is not None else ""),
             "<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr>"]
    for d in result.devices[:MAX_DEVICES]:
        values = [d.busy, d.idle, d.warmup, d.inside, d.cooldown, d.peak_total_memory]
        parts.append(f"<tr><td>d{d.device}</td>"
                     + "".join(f"<td>{_number(v)}</td>" for v in values) + "</tr>")
    parts.append("</table>")
    if result.table.num_devices > MAX_DEVICES:
        parts.append(f"<i>... {result.table.num_devices - MAX_DEVICES} more devices</i>")
    parts.extend(f"<div><i>note: {html.escape(note)}</i></div>" for note in result.notes)
    parts.append(gantt)
    parts.append("</div>")
    return "\n".join(parts)


def plan_html(result):
    """A plan as an HTML summary: what it counted, then its ranked rows (ties marked)."""
    header = ["rank", "configuration", "iteration (s)", "tokens/s/GPU", "MFU",
              "peak memory (GB)", "bubble", "exposed comm."]
    parts = [f"<div><b>plan</b>: {html.escape(result.model)} on {result.gpus} x "
             f"{html.escape(result.system)}, global batch {result.global_batch}, budget "
             f"{result.memory_budget / 1e9:.4g} GB"]
    parts.extend(f"<div><i>{html.escape(line)}</i></div>" for line in result.summary_lines())
    parts.append("<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header)
                 + "</tr>")
    for row in result.rows:
        rank = f"{row.rank}{' ~' if row.tied else ''}"
        values = [rank, row.label(), _number(row.iteration_s),
                  _number(row.throughput.tokens_per_s_per_gpu), f"{row.throughput.mfu:.1%}",
                  _number(row.peak_memory_max / 1e9), f"{row.bubble_ratio:.1%}",
                  f"{row.exposed_communication:.1%}"]
        parts.append("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in values)
                     + "</tr>")
    parts.append("</table>")
    if any(row.tied for row in result.rows):
        parts.append(f"<div><i>~ tied: within {result.tie_band:.1%} of the best, the "
                     f"model's measured error</i></div>")
    parts.append("</div>")
    return "\n".join(parts)


def _time(value, unit):
    from tabsched.costs.units import format_quantity
    return format_quantity(value, "s") if unit == "s" else f"{_number(value)} {unit}"


def _rows_table(header, rows):
    parts = ["<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr>"]
    parts.extend("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row) + "</tr>"
                 for row in rows)
    parts.append("</table>")
    return parts


def compare_html(rows):
    """A comparison (:class:`tabsched.compare.Comparisons`): what ran, then one row per
    family with its number and rank at each level (``*``: the ranks disagree)."""
    lengths = getattr(rows, "lengths", None) or {}
    where = (f" on {html.escape(str(rows.model))} / {html.escape(str(rows.system))}"
             if getattr(rows, "model", None) else "")
    size = (f", {rows.devices} devices, {rows.microbatches} microbatches"
            if getattr(rows, "devices", None) is not None else "")
    slots = " ".join(f"{kind}={_number(value)}" for kind, value in lengths.items())
    parts = [f"<div><b>compare</b>{where}{size}",
             f"<div><i>formula and table levels at slot lengths {html.escape(slots)}; "
             f"simulation at the model's costs</i></div>"]
    body = []
    for row in rows:
        if row.error:
            body.append([row.label, "skipped: " + row.error] + [""] * 6)
            continue
        f, t, sim = row.formula or {}, row.table or {}, row.simulation or {}
        body.append([
            row.label,
            "-" if f.get("bubble_ratio") is None else f"{f['bubble_ratio']:.1%}",
            str(row.ranks.get("formula") or "-"),
            f"{t['bubble_ratio']:.1%} over {_number(t['slots'])} slots" if t else "-",
            str(row.ranks.get("table") or "-"),
            _time(sim["makespan"], sim["time_unit"]) if sim else "-",
            str(row.ranks.get("simulation") or "-"),
            "*" if row.disagrees else ""])
    parts += _rows_table(["family", "formula bubble", "rank", "table bubble", "rank",
                          "simulated iteration", "rank", ""], body)
    parts.append("</div>")
    return "\n".join(parts)


#: Rows a notebook shows of a sweep; ``to_dataframe()`` has them all.
MAX_SWEEP_ROWS = 50


def sweep_html(rows):
    """A sweep (:class:`tabsched.sweeps.SweepResult`): its first ``MAX_SWEEP_ROWS`` rows
    with the configuration and the simulated figures, units in the header."""
    header = ["family", "devices", "microbatches", "model", "system", "status",
              "iteration", "idle", "peak memory", "fits", "MFU"]
    body = []
    from tabsched.costs.units import format_quantity
    for row in rows[:MAX_SWEEP_ROWS]:
        ok = row.get("status") == "ok"

        def shown(key, render):
            value = row.get(key)
            return render(value) if ok and value is not None else "-"
        body.append([row.get("spec"), row.get("devices"), row.get("microbatches"),
                     row.get("model"), row.get("system"),
                     row.get("status") if ok else f"skipped: {row.get('reason')}",
                     shown("simulation_makespan_s", lambda v: format_quantity(v, "s")),
                     shown("simulation_bubble_ratio", lambda v: f"{v:.1%}"),
                     shown("simulation_peak_memory_bytes", lambda v: format_quantity(v, "B")),
                     shown("simulation_fits", lambda v: "yes" if v else "NO"),
                     shown("simulation_mfu", lambda v: f"{v:.1%}")])
    parts = [f"<div><b>sweep</b>: {len(rows)} configurations"]
    parts += _rows_table(header, body)
    if len(rows) > MAX_SWEEP_ROWS:
        parts.append(f"<i>... {len(rows) - MAX_SWEEP_ROWS} more rows (to_dataframe() or "
                     f"to_csv() hold all)</i>")
    parts.append("</div>")
    return "\n".join(parts)
