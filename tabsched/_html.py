"""HTML for notebooks: a table as a coloured grid, a result as a summary and a Gantt,
a plan as its ranked rows.

Jupyter shows an object's ``_repr_html_()``; ``ScheduleTable`` and ``Result``
return what these functions build. Everything is escaped; large tables are cut
to their first ``MAX_SLOTS`` slots with a note. The Gantt chart of a result is
drawn by :func:`tabsched.plot.gantt_svg` and passed in, so this module imports
nothing that imports a table (no cycle).
"""

import html

__all__ = ["table_html", "result_html", "plan_html"]

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
    return f"{value:.4g}"


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
