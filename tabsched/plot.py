"""Pictures of evaluated tables: Gantt charts and memory timelines (a sweep's are
:mod:`tabsched.plot_sweep`, re-exported here).

matplotlib is imported when a picture is drawn, never by ``import tabsched``; it
is the ``plot`` extra (``pip install 'tabsched[plot]'``), and a picture without it
is a one-line error naming the extra.
Figures are drawn on a plain ``Figure`` (no pyplot, no display needed) and
written as PNG, SVG or PDF by the file's suffix, with ``PRINT_RC``: TrueType fonts
in a PDF (no Type 3, which camera-ready checkers refuse) and text as ``<text>`` in
an SVG. Every drawing function also draws into a caller's axes (``ax=``), so that
a paper's figure can hold several panels. In SVG output every device lane is a
group with id ``device-<d>`` (and every link lane ``link-<a>-<b>``), so a
picture can be checked or styled by id.
"""

import numpy as np

from tabsched.exceptions import InvalidParameterError, MissingDependencyError
from tabsched.figures import (DPI, LINE_COLORS, PALETTE, PRINT_RC, _figure, _print_settings,
                              check_picture_path, fit_title, matplotlib_module, save_figure)
from tabsched.nodes import CELL, OPTIMIZER, SYNC, TRANSFER
from tabsched.plot_sweep import line_style, microbatch_ticks, sweep_plot

__all__ = ["gantt", "memory_plot", "sweep_plot", "gantt_svg", "save_figure", "check_picture_path",
           "fit_title", "line_style", "microbatch_ticks", "KIND_COLORS", "LINE_COLORS",
           "PALETTE", "PRINT_RC"]

KIND_COLORS = {"F": "#0072B2", "B": "#E69F00", "I": "#D55E00", "W": "#009E73",
               "overlap": "#CC79A7", "optimizer": "#999999", "sync": "#56B4E9"}
TRANSFER_COLORS = {False: "#56B4E9", True: "#F0E442"}
CRITICAL = "#000000"
IDLE = "#EEEEEE"
LABEL_LIMIT = 600
#: Bars narrower than this many pixels are drawn this wide, so that no operation or
#: transfer vanishes from a picture of a long iteration.
MIN_BAR_PIXELS = 1.5
#: Below this median operation width, in pixels at ``DPI``, a Gantt chart is drawn as
#: columns (``gantt(downsample=...)``): bars a few pixels wide are mostly their
#: white edges (a washed-out chart) and a critical path's outlines merge into a black bar.
MERGE_PIXELS = 3.0
#: The colour of a column where kinds alternate within it (too fine to draw one by one):
#: a mid grey, apart from idle (#EEEEEE), the optimizer (#999999) and black (the
#: critical path's), and from every kind's colour.
MIXED = "#777777"
#: Height of the critical-path stripe under a downsampled lane, in lanes (a bar is 0.8).
CRITICAL_STRIPE = 0.16
#: Operation labels: font size (points), padding each side (points), and the advance
#: widths in ems of the characters a label uses, in DejaVu Sans, matplotlib's default
#: font (its hmtx table: 1303, 690 and 1716 of 2048 units), to tell whether a label fits.
LABEL_FONTSIZE = 6
LABEL_PAD_POINTS = 1.0
CHAR_EMS = {"0": 1303 / 2048, ":": 690 / 2048, "+": 1716 / 2048}


#: Above this many operations a notebook shows no Gantt chart (drawing it takes seconds).
MAX_INLINE_OPS = 20_000


def gantt_svg(result):
    """The Gantt chart of ``result`` as inline SVG for a notebook, or a one-line note.

    The note says why there is no chart: matplotlib missing (with the command that
    installs it) or a table above ``MAX_INLINE_OPS`` operations. A long iteration,
    whose operations are narrower than ``MERGE_PIXELS``, is drawn downsampled
    (``gantt(downsample=True)``): runs of columns, the critical path as a stripe.
    """
    import html
    import io as _text
    if len(result.table) > MAX_INLINE_OPS:
        return (f"<i>Gantt chart left out: {len(result.table)} operations (draw it with "
                f"tabsched.plot.gantt)</i>")
    try:
        figure = gantt(result, width=10)
    except MissingDependencyError as error:
        return f"<i>{html.escape(str(error))}</i>"
    buffer = _text.StringIO()
    with _print_settings():
        figure.savefig(buffer, format="svg")
    text = buffer.getvalue()
    return text[text.find("<svg"):]


def _critical_nodes(result):
    lowered = result._lowered
    mask = np.zeros(lowered.num_nodes, dtype=bool)
    mask[result.critical_nodes()] = True
    return mask


def _text_color(fill):
    """Black or white, whichever reads better on ``fill`` (relative luminance, WCAG 2)."""
    red, green, blue = (int(fill[k:k + 2], 16) / 255 for k in (1, 3, 5))
    channel = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4
               for c in (red, green, blue)]
    luminance = 0.2126 * channel[0] + 0.7152 * channel[1] + 0.0722 * channel[2]
    return "black" if luminance > 0.35 else "white"


def table_title(table, limit=60):
    """A short name for ``table``: its family and parameters, or what it was adapted from.

    >>> from tabsched.schedules import generate
    >>> table_title(generate("1f1b", devices=4, microbatches=8))
    '1f1b devices=4 microbatches=8'
    """
    params = dict(table.params)
    if "transforms" in params:
        steps = len(params["transforms"])
        origin = params.get("adapted_from") or "table"
        text = f"{origin}, adapted ({steps} transform{'s' if steps != 1 else ''})"
    else:
        text = " ".join([table.family or "table"]
                        + [f"{key}={value}" for key, value in params.items()])
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _widened(durations, minimum):
    """Durations with every positive one at least ``minimum`` (for drawing only)."""
    durations = np.asarray(durations, dtype=float)
    return np.where(durations > 0, np.maximum(durations, minimum), durations)


def _time_range(time_range, makespan):
    """``(start, end)`` of the picture's time axis, checked."""
    if time_range is None:
        return 0.0, makespan if makespan > 0 else 1.0
    try:
        begin, end = (float(value) for value in time_range)
    except (TypeError, ValueError):
        raise InvalidParameterError(f"time_range must be two numbers (start, end), not "
                                    f"{time_range!r}") from None
    if not (np.isfinite(begin) and np.isfinite(end) and 0 <= begin < end):
        raise InvalidParameterError(f"time_range ({begin:g}, {end:g}) must have "
                                    f"0 <= start < end")
    return begin, end


def _check_axes(ax):
    """Refuse an ``ax`` that is not matplotlib axes, in one line."""
    if ax is not None and not isinstance(ax, matplotlib_module("matplotlib.axes").Axes):
        raise InvalidParameterError(f"ax must be matplotlib axes (e.g. from "
                                    f"figure.subplots()), not {type(ax).__name__}")


def _check_width(width, ax):
    _check_axes(ax)
    if width is not None and ax is not None:
        raise InvalidParameterError("width sizes a new figure: leave it out when drawing "
                                    "into ax (the axes' figure has its own size)")


def _axes_inches(ax, figure):
    """Width and height of ``ax`` in inches, before the layout runs (its position now)."""
    box = ax.get_position()
    return box.width * figure.get_figwidth(), box.height * figure.get_figheight()


def _label_fits(text, bar_inches, lane_inches):
    """Whether ``text`` at ``LABEL_FONTSIZE`` fits inside a bar this wide and tall."""
    ems = sum(CHAR_EMS.get(character, CHAR_EMS["0"]) for character in text)
    wide = (ems * LABEL_FONTSIZE + 2 * LABEL_PAD_POINTS) / 72
    tall = 1.2 * LABEL_FONTSIZE / 72              # a line is 1.2 ems high (matplotlib's)
    return wide <= bar_inches and tall <= lane_inches


def _busy_until(begins, ends, edges):
    """The time the intervals ``[begins, ends)`` fill before each of ``edges`` (sorted):
    the sum of ``max(0, x - begin) - max(0, x - end)``, exact even where they overlap."""
    def ramp(points):
        points = np.sort(np.asarray(points, dtype=float))
        prefix = np.concatenate([[0.0], np.cumsum(points)])
        below = np.searchsorted(points, edges, side="right")
        return below * edges - prefix[below]
    return ramp(begins) - ramp(ends)


def _columns(begins, durations, colors, critical, edges, busy_at=0.5):
    """Bars that draw intervals too thin to draw one by one: one per run of columns.

    A column (between two ``edges``) is busy when intervals fill at least ``busy_at`` of
    it (any of it when 0: a link's short transfers stay visible);
    a busy column takes the colour that fills at least three quarters of its busy time,
    else ``MIXED``; a run of columns of one colour is one bar. Returns ``(bars, colours,
    marked)``: the bars as ``(start, width)``, their colours, and the runs of columns that
    any ``critical`` interval touches (for a thin stripe, not a fill).
    """
    begins = np.asarray(begins, dtype=float)
    ends = begins + np.asarray(durations, dtype=float)
    colors = np.asarray(colors, dtype=object)
    palette = list(dict.fromkeys(colors.tolist()))
    filled = np.array([np.diff(_busy_until(begins[colors == color], ends[colors == color],
                                           edges)) for color in palette])
    width = np.diff(edges)
    busy = filled.sum(axis=0)
    idle = busy <= 0 if busy_at <= 0 else busy < busy_at * width
    choice = np.where(idle, -1,
                      np.where(filled.max(axis=0) >= 0.75 * busy, filled.argmax(axis=0),
                               len(palette)))
    names = palette + [MIXED]
    bars, fills = [], []
    for value, first, last in _runs(choice):
        if value >= 0:
            bars.append((float(edges[first]), float(edges[last] - edges[first])))
            fills.append(names[value])
    marked = []
    critical = np.asarray(critical, dtype=bool)
    if critical.any():
        touched = np.diff(_busy_until(begins[critical], ends[critical], edges)) > 0
        marked = [(float(edges[first]), float(edges[last] - edges[first]))
                  for value, first, last in _runs(touched.astype(int)) if value]
    return bars, fills, marked


def _runs(values):
    """``(value, first, end)`` of every run of equal values (``end`` one past the run)."""
    values = np.asarray(values)
    if len(values) == 0:
        return []
    cuts = np.flatnonzero(values[1:] != values[:-1]) + 1
    firsts = np.concatenate([[0], cuts])
    lasts = np.concatenate([cuts, [len(values)]])
    return [(int(values[f]), int(f), int(l)) for f, l in zip(firsts, lasts)]


def gantt(result, path=None, *, ax=None, transfers=True, critical=True, labels=None,
          title=None, width=None, time_range=None, downsample=None):
    """A Gantt chart of an evaluated table.

    One lane per device (device 0 on top): operations coloured by kind (an
    overlapped cell in its own colour) and labelled with the microbatch, or
    ``stage:microbatch`` on devices that hold several stages, where the label fits
    inside its bar; idle time shows as the grey lane behind them. Below, one thin
    lane per directed link that carries a transfer of some duration, and a lane
    for gradient syncs if the iteration has them (a table-level result, whose
    transfers take no time, has device lanes only). The critical path is outlined
    in black.

    Parameters
    ----------
    result : Result
    path : str or Path, optional
        Write the figure there (``.png``, ``.svg`` or ``.pdf``); with ``ax``, the
        figure that holds ``ax``.
    ax : matplotlib.axes.Axes, optional
        Draw into these axes (a panel of the caller's figure) instead of a new figure.
    transfers, critical : bool
        Draw the link lanes; outline the critical path.
    labels : bool, optional
        Label operations; default only when at most 600 are in view. A label that
        does not fit inside its bar is left out either way.
    title : str, optional
        Default: the table's family and parameters (an adapted table: what it was
        adapted from and how many transforms), the level, makespan and bubble.
        A title wider than the figure is wrapped, and shortened at its end.
    width : float, optional
        Figure width in inches (default grows with the number of cells); not with ``ax``.
    time_range : (float, float), optional
        Zoom on this span of time, in the result's time unit.
    downsample : bool, optional
        Draw each lane as columns two typical operations wide (a pixel at least),
        each the colour of the kind that fills it (``MIXED`` where kinds alternate
        within it), a run of like columns as one bar, and the critical path as a thin
        stripe under the lane rather than an outline. Default: when the median
        operation is narrower than ``MERGE_PIXELS``.

    Bars narrower than ``MIN_BAR_PIXELS`` at the figure's resolution are drawn
    that wide, so no transfer or operation of a long iteration vanishes.

    Returns
    -------
    matplotlib.figure.Figure, or ``ax`` when given
    """
    Patch = matplotlib_module("matplotlib.patches").Patch
    _check_width(width, ax)

    table = result.table
    lowered = result._lowered
    start = result._node_start
    durations = result._node_durations
    on_path = _critical_nodes(result) if critical else np.zeros(lowered.num_nodes, bool)
    D = table.num_devices
    links = []
    if transfers and len(lowered.transfers):
        # a link lane only where a transfer takes time: a table-level result's take none
        timed = durations[lowered.nodes(TRANSFER)] > 0
        links = sorted(set(zip(lowered.transfers.src[timed].tolist(),
                               lowered.transfers.dst[timed].tolist())))
    sync_nodes = np.array(lowered.node_ids(SYNC), dtype=int)
    has_sync = bool(np.any(durations[sync_nodes] > 0)) if len(sync_nodes) else False
    lanes = D + (len(links) + has_sync) * 0.5
    makespan = result.makespan
    begin, end = _time_range(time_range, makespan)
    cell_nodes = lowered.nodes(CELL)
    in_view = (start[cell_nodes] < end) & (start[cell_nodes] + durations[cell_nodes] > begin)
    given = ax is not None
    if given:
        figure = ax.figure
        axes_wide, axes_tall = _axes_inches(ax, figure)
    else:
        if width is None:
            width = float(np.clip(int(in_view.sum()) / max(D, 1) * 0.25, 8, 24))
        figure = _figure(width, 1.0 + 0.45 * lanes)
        ax = figure.add_subplot()
        # the axis takes about three quarters of the figure's width, 0.45 inch a lane
        axes_wide, axes_tall = 0.75 * width, 0.45 * (lanes + 1.1)
    inches_per_time = axes_wide / (end - begin)
    lane_inches = 0.8 * axes_tall / (lanes + 1.1)    # a bar is 0.8 of a lane
    # one pixel in time units
    minimum = MIN_BAR_PIXELS / (inches_per_time * DPI)
    drawn = _widened(durations, minimum)
    seen = durations[cell_nodes][in_view]
    typical = float(np.median(seen)) if len(seen) else 0.0
    if downsample is None:
        downsample = 0 < typical * inches_per_time * DPI < MERGE_PIXELS
    # columns two typical operations wide (a pixel at least), so that kinds alternating
    # op by op read as one "mixed" run rather than as stripes of single operations
    step = max(1 / (inches_per_time * DPI), 2 * typical)
    edges = np.linspace(begin, end, max(int((end - begin) / step), 1) + 1)
    # a link's transfers are short and sparse: pixel columns, so idle links look idle
    pixels = np.linspace(begin, end, max(int(axes_wide * DPI), 1) + 1)

    fresh = table.cell_starts()
    parts = np.bincount(lowered.cell_of_op, minlength=lowered.num_cells)
    first_op = np.flatnonzero(fresh)
    stages_on = {d: len(set(table.stage[table.device == d].tolist())) for d in range(D)}
    if labels is None:
        labels = int(in_view.sum()) <= LABEL_LIMIT and not downsample
    mixed = marked_any = False
    labelled = 0
    for d in range(D):
        group = ax.broken_barh([(0.0, makespan)], (d - 0.4, 0.8), facecolors=IDLE,
                               edgecolor="none")
        group.set_gid(f"idle-{d}")
    for d in range(D):
        cells = np.flatnonzero(lowered.cell_device == d)
        if len(cells) == 0:
            continue
        colors = [KIND_COLORS["overlap"] if parts[c] > 1
                  else KIND_COLORS[table.kind_letter(int(first_op[c]))] for c in cells]
        if downsample:
            segments, fills, marked = _columns(start[cells], durations[cells], colors,
                                               on_path[cells], edges)
            mixed = mixed or MIXED in fills
            bars = ax.broken_barh(segments, (d - 0.4, 0.8), facecolors=fills,
                                  edgecolors="none")
            if marked:
                marked_any = True
                ax.broken_barh(marked, (d + 0.4 - CRITICAL_STRIPE, CRITICAL_STRIPE),
                               facecolors=CRITICAL, edgecolors="none").set_gid(
                                   f"critical-{d}")
        else:
            segments = list(zip(start[cells].tolist(), drawn[cells].tolist()))
            edge_colors = [CRITICAL if on_path[c] else "white" for c in cells]
            # an outline at most a quarter of its bar's width (points), so that a
            # critical bar keeps its fill colour however thin it is
            bar_points = drawn[cells] * inches_per_time * 72
            line_widths = np.where(on_path[cells], np.minimum(1.6, bar_points / 4),
                                   np.minimum(0.3, bar_points / 8)).tolist()
            bars = ax.broken_barh(segments, (d - 0.4, 0.8), facecolors=colors,
                                  edgecolors=edge_colors, linewidths=line_widths)
        bars.set_gid(f"device-{d}")
        if labels:
            for c, color in zip(cells, colors):
                if not in_view[c]:
                    continue
                op = int(first_op[c])
                text = (f"{int(table.stage[op])}:{int(table.microbatch[op])}"
                        if stages_on[d] > 1 else str(int(table.microbatch[op])))
                if parts[c] > 1:
                    text += "+"
                shown = min(start[c] + durations[c], end) - max(start[c], begin)
                if not _label_fits(text, shown * inches_per_time, lane_inches):
                    continue
                ax.text(start[c] + durations[c] / 2, d, text, ha="center", va="center",
                        fontsize=LABEL_FONTSIZE, color=_text_color(color), clip_on=True)
                labelled += 1
    for node in lowered.node_ids(OPTIMIZER):
        d = int(lowered.node_device[node])
        bars = ax.broken_barh([(start[node], drawn[node])], (d - 0.4, 0.8),
                              facecolors=KIND_COLORS["optimizer"],
                              edgecolors=CRITICAL if on_path[node] else "white")
        bars.set_gid(f"optimizer-{d}")

    def thin_lane(nodes, colors, y, gid):
        nonlocal marked_any
        if downsample:
            segments, fills, marked = _columns(start[nodes], drawn[nodes], colors,
                                               on_path[nodes], pixels, busy_at=0)
            bars = ax.broken_barh(segments, (y - 0.18, 0.36), facecolors=fills,
                                  edgecolors="none")
            if marked:
                marked_any = True
                ax.broken_barh(marked, (y + 0.18 - CRITICAL_STRIPE / 2, CRITICAL_STRIPE / 2),
                               facecolors=CRITICAL, edgecolors="none").set_gid(
                                   f"critical-{gid}")
        else:
            bars = ax.broken_barh(
                list(zip(start[nodes].tolist(), drawn[nodes].tolist())), (y - 0.18, 0.36),
                facecolors=colors, edgecolors=[CRITICAL if on_path[n] else "none"
                                               for n in nodes], linewidths=0.8)
        bars.set_gid(gid)

    ticks = list(range(D))
    names = [f"device {d}" for d in range(D)]
    y = D - 0.25
    if links:
        src, dst = lowered.transfers.src, lowered.transfers.dst
        for a, b in links:
            y += 0.5
            mine = np.flatnonzero((src == a) & (dst == b))
            thin_lane(lowered.nodes(TRANSFER).start + mine,
                      [TRANSFER_COLORS[bool(g)] for g in lowered.transfers.gradient[mine]],
                      y, f"link-{a}-{b}")
            ticks.append(y)
            names.append(f"link {a}->{b}")
    if has_sync:
        y += 0.5
        thin_lane(sync_nodes, [KIND_COLORS["sync"]] * len(sync_nodes), y, "grad-sync")
        ticks.append(y)
        names.append("grad sync")

    ax.set_yticks(ticks, names, fontsize=7 if len(ticks) > 16 else 9)
    # 0.2 of a lane above the first bar, and below the last (a device's: 0.4 below its tick)
    ax.set_ylim(y + 0.5 if (links or has_sync) else D - 0.4, -0.6)
    if time_range is None:
        ax.set_xlim(0, makespan * 1.005 if makespan > 0 else 1)
    else:
        ax.set_xlim(begin, end)
    ax.set_xlabel(f"time ({result.time_unit})")
    kinds_present = sorted(set(table.kind_letter(int(op)) for op in first_op[parts == 1]),
                           key="FBIW".index)
    handles = [Patch(color=KIND_COLORS[k], label=k) for k in kinds_present]
    if np.any(parts > 1):
        handles.append(Patch(color=KIND_COLORS["overlap"], label="F+B overlap"))
    if mixed:
        handles.append(Patch(color=MIXED, label="mixed (kinds alternate\nfaster than drawn)"))
    if links:
        handles += [Patch(color=TRANSFER_COLORS[False], label="activation"),
                    Patch(color=TRANSFER_COLORS[True], label="gradient")]
    handles.append(Patch(color=IDLE, label="idle"))
    if critical and downsample and marked_any:
        handles.append(Patch(color=CRITICAL, label="critical path\n(stripe under a lane)"))
    elif critical and not downsample:
        handles.append(Patch(facecolor="white", edgecolor=CRITICAL, label="critical path"))
    if labelled:
        several = any(count > 1 for count in stages_on.values())
        handles.append(Patch(facecolor="none", edgecolor="none",
                             label="bar label: microbatch" + (
                                 "\n(stage:microbatch where a\ndevice holds several stages)"
                                 if several else "") + (
                                 "\n+: fused F and B" if np.any(parts > 1) else "")))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8,
              frameon=False)
    zoom = f" [{begin:.4g}, {end:.4g}]" if time_range is not None else ""
    ax.set_title(title or f"{table_title(table)} - {result.level}: makespan "
                          f"{result.makespan:.4g} {result.time_unit}, bubble "
                          f"{result.bubble_ratio:.1%}{zoom}", fontsize=10)
    fit_title(ax.title)
    if path is not None:
        save_figure(figure, path)
    return ax if given else figure


def memory_plot(result, path=None, *, ax=None, budget=None, total=None, title=None):
    """Memory over time, one line per device, with the budget as a dashed line.

    Parameters
    ----------
    result : Result
    path : str or Path, optional
        Write the figure there; with ``ax``, the figure that holds ``ax``.
    ax : matplotlib.axes.Axes, optional
        Draw into these axes (a panel of the caller's figure) instead of a new figure.
    budget : float, optional
        Memory budget per device in the result's memory unit (default: the
        result's own ``memory_budget`` if it has one).
    total : bool, optional
        Add each device's persistent memory to its activations (default when the
        result has any persistent memory).
    title : str, optional
        Wrapped, and shortened at its end, if wider than the figure.

    Returns
    -------
    matplotlib.figure.Figure, or ``ax`` when given
    """
    table = result.table
    D = table.num_devices
    persistent = np.array([d.persistent_memory for d in result.devices])
    if total is None:
        total = bool(np.any(persistent > 0))
    if budget is None:
        budget = getattr(result, "memory_budget", None)
    scale, unit = 1.0, result.memory_unit
    if result.memory_unit == "bytes":
        scale, unit = 1e-9, "GB"
    _check_axes(ax)
    given = ax is not None
    if given:
        figure = ax.figure
    else:
        figure = _figure(9, 1.5 + 0.25 * min(D, 16) + 2.5)
        ax = figure.add_subplot()
    cmap = _colormap(D)
    for d, (times, values) in enumerate(result.memory_timeline()):
        # several changes at one instant (a B ends as the next F starts) draw as one step
        last_at_time = np.append(times[1:] != times[:-1], True) if len(times) else times
        times, values = times[last_at_time], values[last_at_time]
        base = persistent[d] if total else 0.0
        xs = np.concatenate([[0.0], times, [result.makespan]])
        ys = np.concatenate([[0.0], values, [values[-1] if len(values) else 0.0]]) + base
        line, = ax.step(xs, ys * scale, where="post", color=cmap(d), linewidth=1.2,
                        label=f"device {d}")
        line.set_gid(f"memory-{d}")
    if budget is not None:
        ax.axhline(budget * scale, color="#C00000", linestyle="--", linewidth=1.2,
                   label=f"budget {budget * scale:.4g} {unit}")
    ax.set_xlim(0, result.makespan if result.makespan > 0 else 1)
    ax.set_ylim(bottom=0)
    ax.set_xlabel(f"time ({result.time_unit})")
    what = "memory (persistent + activations)" if total else "activation memory"
    ax.set_ylabel(f"{what} ({unit})")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False,
              ncol=1 if D <= 16 else 2)
    ax.set_title(title or f"{table_title(table)} - memory per device", fontsize=10)
    fit_title(ax.title)
    if path is not None:
        save_figure(figure, path)
    return ax if given else figure


def _colormap(count):
    """Colour of device ``k`` of ``count``: the line colours, or, for more devices than
    those, a map in device order that is safe for colour-vision deficiency (cividis)."""
    if count <= len(LINE_COLORS):
        return lambda k: LINE_COLORS[k]
    cmap = matplotlib_module().colormaps["cividis"]  # designed for colour-vision deficiency
    return lambda k: cmap(k / max(count - 1, 1))
