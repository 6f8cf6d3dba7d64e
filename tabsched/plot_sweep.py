"""Pictures of a sweep: a line per configuration over the microbatch count, a panel per
system (:func:`sweep_plot`), with the line styles (:func:`line_style`) and the ticks
(:func:`microbatch_ticks`) it draws them with. The figures, fonts, palette and saving
are :mod:`tabsched.figures`'; ``tabsched.plot`` re-exports these names.
"""

import re

import numpy as np

from tabsched.exceptions import InvalidParameterError
from tabsched.figures import (CAPACITY, LINE_COLORS, LINESTYLES, MARKERS, _figure, fit_title,
                              matplotlib_module, save_figure)

__all__ = ["sweep_plot", "line_style", "microbatch_ticks", "metric_label"]


def line_style(k):
    """``(colour, marker, line style)`` of line ``k``: unique for ``k`` below 384.

    The first twelve lines differ in colour; markers and line styles cycle with them
    too, so lines that coincide stay apart. Beyond twelve the colours repeat, and each
    round of twelve shifts the marker by one (every eighth round, the line style), so
    the triple is unique for all 12 x 8 x 4 = 384 combinations.

    >>> line_style(0), line_style(12)
    (('#0072B2', 'o', '-'), ('#0072B2', 'P', '-'))
    """
    rounds = k // len(LINE_COLORS)
    color = LINE_COLORS[k % len(LINE_COLORS)]
    marker = MARKERS[(k + rounds) % len(MARKERS)]
    linestyle = LINESTYLES[(k + rounds // len(MARKERS)) % len(LINESTYLES)]
    return color, marker, linestyle


def microbatch_ticks(values, log=True, most=8):
    """Where to put the ticks of a microbatch axis: at data values only.

    Every value when there are at most ``most``; else a subset, evenly spread on the
    axis (on a log axis, in log space), always with the first and the last value.

    >>> microbatch_ticks([4, 8, 16])
    [4, 8, 16]
    >>> microbatch_ticks(range(1, 65), most=4)
    [1, 4, 16, 64]
    """
    values = sorted(set(values))
    if len(values) <= most:
        return values
    position = np.log2(values) if log else np.asarray(values, dtype=float)
    gap = (position[-1] - position[0]) / (most - 1) * (1 - 1e-9)
    chosen = [0]
    for index in range(1, len(values)):
        if position[index] - position[chosen[-1]] >= gap:
            chosen.append(index)
    if chosen[-1] != len(values) - 1:
        if position[-1] - position[chosen[-1]] < gap / 2 and len(chosen) > 1:
            chosen[-1] = len(values) - 1           # too close to the last: move it there
        else:
            chosen.append(len(values) - 1)
    return [values[index] for index in chosen]


#: Sweep columns that place a point on a line (x axis, panel) or describe it, rather than
#: tell lines apart.
_NOT_A_LINE = {"family", "params", "devices", "microbatches", "system", "microbatch_size",
               "status", "reason", "gpus"}
_LEVELS = {"formula": "formula level", "table": "table level", "simulation": "simulation"}


def metric_label(metric):
    """``"iteration time (simulation)"`` for ``simulation_makespan_s``, and so on.

    >>> metric_label("simulation_makespan_s"), metric_label("table_bubble_ratio")
    ('iteration time (simulation)', 'bubble ratio (table level)')
    """
    level, _, rest = metric.partition("_")
    if level not in _LEVELS:
        return metric.replace("_", " ")
    rest = re.sub(r"_(s|bytes)$", "", rest)
    name = {"makespan": "iteration time", "slots": "schedule length (slots)"}.get(
        rest, rest.replace("_", " "))
    return f"{name} ({_LEVELS[level]})"


def _system_independent(metric, ok, line_of):
    """Whether ``metric`` is the same on every system for each line and microbatch count."""
    if metric.startswith(("formula_", "table_")):
        return True
    values = {}
    for row in ok:
        values.setdefault((line_of(row), row["microbatches"]), set()).add(row[metric])
    return len({row["system"] for row in ok}) > 1 and all(len(v) == 1 for v in values.values())


def _capacity(system):
    """The memory capacity of a system preset or file, or None."""
    from tabsched.costs.system import load_system
    from tabsched.exceptions import TabschedError
    try:
        return load_system(system).memory_capacity
    except (TabschedError, OSError):
        return None


def sweep_plot(rows, path=None, *, ax=None, devices=None, metric="simulation_makespan_s",
               title=None, logx=True, logy=False, capacity=None):
    """A metric against microbatches: a line per configuration, a panel per system.

    ``rows`` are sweep rows (:mod:`tabsched.sweeps`); skipped configurations are
    left out. Systems named like the tabular paper's grid are laid out as the
    grid (network slow..fast down, compute slow..fast across); others in order.
    When the metric does not depend on the system (the formula and table levels,
    or equal values everywhere) one panel shows it.

    A line is one family spec and, when they vary on a system, one model and every
    other configuration column (global batch, recomputation, the tensor degree...),
    so a sweep over two models draws two lines per family rather than one zig-zag. Lines differ in
    colour (12 categorical colours, colour-blind-safe first), marker and line style,
    so lines that coincide stay visible; beyond 12 lines every (colour, marker, line
    style) is still unique (:func:`line_style`). Microbatch ticks are at data values
    (:func:`microbatch_ticks`).

    Parameters
    ----------
    rows : list of dict
    path : str or Path, optional
        Write the figure there; with ``ax``, the figure that holds the axes.
    ax : matplotlib.axes.Axes or sequence of them, optional
        Draw into the caller's axes: one per panel (one axes for a one-panel sweep),
        in the panels' order (by row, then column, of the grid described above). The
        legend goes in the last of them; ``title``, if given, is the figure's suptitle.
    devices : int, optional
        Plot this pipeline depth; default the only one in ``rows`` (required if several).
    metric : str
        A numeric sweep column (default the simulated iteration time).
    logx, logy : bool
        Logarithmic axes (microbatches on base 2 by default).
    capacity : bool, optional
        Draw each system's memory capacity on memory metrics (default: when the
        metric is a memory in bytes and the system states its capacity).

    Returns
    -------
    matplotlib.figure.Figure, or ``ax`` when given
    """
    ok = [row for row in rows if row.get("status") == "ok" and row.get(metric) is not None]
    depths = sorted({row["devices"] for row in ok})
    if devices is None:
        if len(depths) > 1:
            raise InvalidParameterError(f"the sweep has devices {', '.join(map(str, depths))}: "
                                        f"choose one to plot (--devices)")
        devices = depths[0] if depths else None
    ok = [row for row in ok if row["devices"] == devices]
    if not ok:
        raise InvalidParameterError(f"no successful configuration with devices={devices} "
                                    f"to plot")
    columns = [column for column in ok[0] if column not in _NOT_A_LINE
               and not column.startswith(tuple(f"{level}_" for level in _LEVELS))
               # the execution's own columns say what "parallel" says (older CSVs lack them)
               and not (column == "parallel" and "tensor_parallel" in ok[0])]
    by_system = {}
    for row in ok:
        by_system.setdefault(row["system"], []).append(row)
    # a column that varies only from system to system (the contention or the node size
    # an execution takes from its system, the system's memory) draws no lines of its own
    varying = [column for column in columns if column != "spec"
               and any(len({str(row.get(column)) for row in group}) > 1
                       for group in by_system.values())]

    def line_of(row):
        return (row["spec"],) + tuple(str(row.get(column)) for column in varying)

    def line_label(key):
        extra = ", ".join(f"{value}" if column == "model" else f"{column} {value}"
                          for column, value in zip(varying, key[1:]))
        return f"{key[0]} ({extra})" if extra else key[0]

    single = _system_independent(metric, ok, line_of)
    systems = ["all systems"] if single else list(dict.fromkeys(row["system"] for row in ok))
    grid = {systems[0]: (0, 0)} if single else _grid_layout(systems)
    nrows = max(r for r, _ in grid.values()) + 1
    ncols = max(c for _, c in grid.values()) + 1
    given = ax is not None
    if given:
        panels = _given_axes(ax, grid)
        figure = panels[0].figure
        axes = {position: panel for position, panel in zip(sorted(grid.values()), panels)}
    else:
        figure = _figure(max(3.4 * ncols + 2.6, 8.0), 2.6 * nrows + 0.8)
        grid_axes = figure.subplots(nrows, ncols, squeeze=False, sharex=True)
        axes = {(r, c): grid_axes[r][c] for r in range(nrows) for c in range(ncols)}
    lines = list(dict.fromkeys(line_of(row) for row in ok))
    ticks = microbatch_ticks([row["microbatches"] for row in ok], log=logx)
    scale, unit = ((1.0, "s") if metric.endswith("_s") else
                   (1e-9, "GB") if metric.endswith("_bytes") else (1.0, ""))
    memory = metric.endswith("_bytes") and "memory" in metric
    if capacity is None:
        capacity = memory
    for system, (r, c) in grid.items():
        panel = axes[r, c]
        for index, key in enumerate(lines):
            points = sorted({row["microbatches"]: row[metric] for row in ok
                             if (single or row["system"] == system)
                             and line_of(row) == key}.items())
            if points:
                xs, ys = zip(*points)
                color, marker, linestyle = line_style(index)
                line, = panel.plot(xs, [y * scale for y in ys], color=color, marker=marker,
                                   linestyle=linestyle,
                                   # later lines on top with smaller markers: where lines
                                   # coincide, every marker still shows
                                   markersize=max(3.0, 8.0 - 0.6 * index),
                                   markerfacecolor="none" if index % 2 else color,
                                   linewidth=1.3, zorder=3 + index,
                                   label=line_label(key))
                line.set_gid(f"sweep-{system}-{index}")
        if capacity:
            limits = {_capacity(name) for name in ({row["system"] for row in ok}
                                                   if single else {system})}
            limit = limits.pop() if len(limits) == 1 else None  # one panel: one capacity
            if limit is not None:
                panel.axhline(limit * scale, color=CAPACITY, linestyle="--", linewidth=1.0,
                           label=f"capacity {limit * scale:.4g} {unit}").set_gid(
                               f"capacity-{system}")
        if logx:
            panel.set_xscale("log", base=2)
        if logy:
            panel.set_yscale("log")
        # ticks at the microbatch counts swept (set after the scale, which resets them)
        panel.set_xticks(ticks, [f"{tick:g}" for tick in ticks])
        panel.xaxis.set_minor_locator(matplotlib_module("matplotlib.ticker").NullLocator())
        panel.set_title(system if not single else
                        "every system (this level does not depend on it)", fontsize=9)
        panel.tick_params(labelsize=7)
        if c == 0 or given:
            panel.set_ylabel(f"{metric_label(metric)}" + (f" ({unit})" if unit else ""),
                             fontsize=8)
        if r == nrows - 1 or given:
            panel.set_xlabel("microbatches M", fontsize=8)
    for position, panel in axes.items():
        if position not in grid.values():
            panel.set_visible(False)
    handles, labels = [], []
    for r, c in grid.values():
        for handle, label in zip(*axes[r, c].get_legend_handles_labels()):
            if label not in labels and not label.startswith("capacity "):
                handles.append(handle)
                labels.append(label)
    if capacity and any((line.get_gid() or "").startswith("capacity")
                        for panel in axes.values() for line in panel.get_lines()):
        handles.append(matplotlib_module("matplotlib.lines").Line2D(
            [], [], color=CAPACITY, linestyle="--", label="memory capacity"))
        labels.append("memory capacity")
    for position in grid.values():
        fit_title(axes[position].title)
    if given:
        axes[max(grid.values())].legend(handles, labels, fontsize=7, frameon=False)
        if title:
            fit_title(figure.suptitle(title, fontsize=10))
    else:
        figure.legend(handles, labels, loc="outside right center", fontsize=8,
                      frameon=False)
        models = list(dict.fromkeys(str(row.get("model")) for row in ok))
        fit_title(figure.suptitle(title or f"{', '.join(models)}, {devices} devices: "
                                           f"{metric_label(metric)} vs microbatches",
                                  fontsize=10))
    if path is not None:
        save_figure(figure, path)
    return ax if given else figure


def _given_axes(ax, grid):
    """The caller's axes for ``sweep_plot``'s panels, one per panel, or a one-line error."""
    Axes = matplotlib_module("matplotlib.axes").Axes
    panels = [ax] if isinstance(ax, Axes) else list(np.ravel(np.asarray(ax, dtype=object)))
    wanted = len(grid)
    names = ", ".join(grid)
    if not all(isinstance(panel, Axes) for panel in panels):
        raise InvalidParameterError("ax must be matplotlib axes, or a sequence of them "
                                    f"(one per panel: {names})")
    if len(panels) != wanted:
        raise InvalidParameterError(
            f"ax: the sweep draws {wanted} panel{'s' if wanted != 1 else ''} ({names}), "
            f"so it needs {wanted} axes, not {len(panels)}")
    return panels


def _grid_layout(systems):
    """Panel (row, column) of each system: the nw x cp grid when the names say so."""
    speeds = {"slow": 0, "mid": 1, "fast": 2}
    pattern = re.compile(r"(slow|mid|fast)_nw_(slow|mid|fast)_cp")
    matches = [pattern.fullmatch(system) for system in systems]
    if all(matches):  # the paper's layout, keeping only the rows and columns present
        rows = sorted({speeds[m.group(1)] for m in matches})
        columns = sorted({speeds[m.group(2)] for m in matches})
        return {system: (rows.index(speeds[m.group(1)]), columns.index(speeds[m.group(2)]))
                for system, m in zip(systems, matches)}
    columns = int(np.ceil(np.sqrt(len(systems))))
    return {system: divmod(index, columns) for index, system in enumerate(systems)}
