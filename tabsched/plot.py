"""Pictures of evaluated tables: Gantt charts and memory timelines.

matplotlib is imported when a picture is drawn, never by ``import tabsched``.
Figures are drawn on a plain ``Figure`` (no pyplot, no display needed) and
written as PNG or SVG by the file's suffix. In SVG output every device lane is a
group with id ``device-<d>`` (and every link lane ``link-<a>-<b>``), so a
picture can be checked or styled by id.
"""

import os
import re

import numpy as np

from tabsched.exceptions import InvalidParameterError
from tabsched.io import atomic_write, check_output_path

__all__ = ["gantt", "memory_plot", "save_figure", "check_picture_path", "KIND_COLORS"]

KIND_COLORS = {"F": "#4C72B0", "B": "#DD8452", "I": "#C44E52", "W": "#55A868",
               "overlap": "#8172B3", "optimizer": "#937860", "sync": "#DA8BC3"}
TRANSFER_COLORS = {False: "#8DA0CB", True: "#FC8D62"}
CRITICAL = "#000000"
IDLE = "#EEEEEE"
PICTURE_SUFFIXES = (".png", ".svg", ".pdf")
LABEL_LIMIT = 600


def _figure(width, height):
    from matplotlib.figure import Figure
    return Figure(figsize=(width, height), layout="constrained")


def check_picture_path(path):
    """Refuse, before drawing, a picture path with another suffix or in no folder."""
    suffix = os.path.splitext(os.fspath(path))[1].lower()
    if suffix not in PICTURE_SUFFIXES:
        raise InvalidParameterError(f"{path}: pictures are written as "
                                    f"{', '.join(PICTURE_SUFFIXES)}, not {suffix or 'no suffix'}")
    check_output_path(path)
    return suffix


def save_figure(figure, path):
    """Write ``figure`` to ``path`` (PNG, SVG or PDF by suffix), atomically.

    matplotlib writes a temporary file beside ``path``, which replaces it only
    once complete (:func:`tabsched.io.atomic_write`).
    """
    suffix = check_picture_path(path)
    atomic_write(path, write=lambda temporary: figure.savefig(temporary, dpi=150,
                                                              format=suffix[1:]))


def _critical_nodes(result):
    lowered = result._lowered
    mask = np.zeros(lowered.num_nodes, dtype=bool)
    mask[result.critical_nodes()] = True
    return mask


def gantt(result, path=None, *, transfers=True, critical=True, labels=None, title=None,
          width=None):
    """A Gantt chart of an evaluated table.

    One lane per device (device 0 on top): operations coloured by kind (an
    overlapped cell in its own colour) and labelled with the microbatch, or
    ``stage:microbatch`` on devices that hold several stages; idle time shows as
    the grey lane behind them. Below, one thin lane per directed link with its
    transfers, and a lane for gradient syncs if the iteration has them. The
    critical path is outlined in black.

    Parameters
    ----------
    result : Result
    path : str or Path, optional
        Write the figure there (``.png``, ``.svg`` or ``.pdf``).
    transfers, critical : bool
        Draw the link lanes; outline the critical path.
    labels : bool, optional
        Label operations; default only when there are at most 600.
    title : str, optional
    width : float, optional
        Figure width in inches (default grows with the number of cells).

    Returns
    -------
    matplotlib.figure.Figure
    """
    from matplotlib.patches import Patch

    table = result.table
    lowered = result._lowered
    start = result._node_start
    durations = result._node_durations
    on_path = _critical_nodes(result) if critical else np.zeros(lowered.num_nodes, bool)
    D = table.num_devices
    links = []
    if transfers and len(lowered.transfers):
        links = sorted(set(zip(lowered.transfers.src.tolist(), lowered.transfers.dst.tolist())))
    has_sync = lowered.num_syncs > 0
    lanes = D + (len(links) + has_sync) * 0.5
    if width is None:
        width = float(np.clip(lowered.num_cells / max(D, 1) * 0.25, 8, 24))
    figure = _figure(width, 1.0 + 0.45 * lanes)
    ax = figure.add_subplot()
    makespan = result.makespan

    fresh = table.cell_starts()
    parts = np.bincount(lowered.cell_of_op, minlength=lowered.num_cells)
    first_op = np.flatnonzero(fresh)
    stages_on = {d: len(set(table.stage[table.device == d].tolist())) for d in range(D)}
    if labels is None:
        labels = lowered.num_cells <= LABEL_LIMIT
    for d in range(D):
        group = ax.broken_barh([(0.0, makespan)], (d - 0.4, 0.8), facecolors=IDLE,
                               edgecolor="none")
        group.set_gid(f"idle-{d}")
    for d in range(D):
        cells = np.flatnonzero(lowered.cell_device == d)
        if len(cells) == 0:
            continue
        segments = list(zip(start[cells].tolist(), durations[cells].tolist()))
        colors = [KIND_COLORS["overlap"] if parts[c] > 1
                  else KIND_COLORS[table.kind_letter(int(first_op[c]))] for c in cells]
        edges = [CRITICAL if on_path[c] else "white" for c in cells]
        widths = [1.6 if on_path[c] else 0.3 for c in cells]
        bars = ax.broken_barh(segments, (d - 0.4, 0.8), facecolors=colors, edgecolors=edges,
                              linewidths=widths)
        bars.set_gid(f"device-{d}")
        if labels:
            for c in cells:
                op = int(first_op[c])
                text = (f"{int(table.stage[op])}:{int(table.microbatch[op])}"
                        if stages_on[d] > 1 else str(int(table.microbatch[op])))
                if parts[c] > 1:
                    text += "+"
                ax.text(start[c] + durations[c] / 2, d, text, ha="center", va="center",
                        fontsize=6, color="white", clip_on=True)
    if lowered.optimizer:
        for d in range(D):
            node = lowered.first_optimizer + d
            bars = ax.broken_barh([(start[node], durations[node])], (d - 0.4, 0.8),
                                  facecolors=KIND_COLORS["optimizer"],
                                  edgecolors=CRITICAL if on_path[node] else "white")
            bars.set_gid(f"optimizer-{d}")

    ticks = list(range(D))
    names = [f"device {d}" for d in range(D)]
    y = D - 0.25
    if links:
        src, dst = lowered.transfers.src, lowered.transfers.dst
        for a, b in links:
            y += 0.5
            mine = np.flatnonzero((src == a) & (dst == b))
            nodes = lowered.num_cells + mine
            bars = ax.broken_barh(
                list(zip(start[nodes].tolist(), durations[nodes].tolist())), (y - 0.18, 0.36),
                facecolors=[TRANSFER_COLORS[bool(g)] for g in lowered.transfers.gradient[mine]],
                edgecolors=[CRITICAL if on_path[n] else "none" for n in nodes],
                linewidths=0.8)
            bars.set_gid(f"link-{a}-{b}")
            ticks.append(y)
            names.append(f"link {a}->{b}")
    if has_sync:
        y += 0.5
        nodes = lowered.first_sync + np.arange(lowered.num_syncs)
        bars = ax.broken_barh(list(zip(start[nodes].tolist(), durations[nodes].tolist())),
                              (y - 0.18, 0.36), facecolors=KIND_COLORS["sync"],
                              edgecolors=[CRITICAL if on_path[n] else "none" for n in nodes])
        bars.set_gid("grad-sync")
        ticks.append(y)
        names.append("grad sync")

    ax.set_yticks(ticks, names, fontsize=7 if len(ticks) > 16 else 9)
    ax.set_ylim(y + 0.5, -0.6)
    ax.set_xlim(0, makespan * 1.005 if makespan > 0 else 1)
    ax.set_xlabel(f"time ({result.time_unit})")
    kinds_present = sorted(set(table.kind_letter(int(op)) for op in first_op[parts == 1]),
                           key="FBIW".index)
    handles = [Patch(color=KIND_COLORS[k], label=k) for k in kinds_present]
    if np.any(parts > 1):
        handles.append(Patch(color=KIND_COLORS["overlap"], label="F+B overlap"))
    if links:
        handles += [Patch(color=TRANSFER_COLORS[False], label="activation"),
                    Patch(color=TRANSFER_COLORS[True], label="gradient")]
    handles.append(Patch(color=IDLE, label="idle"))
    if critical:
        handles.append(Patch(facecolor="white", edgecolor=CRITICAL, label="critical path"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8,
              frameon=False)
    family = table.family or "table"
    params = " ".join(f"{k}={v}" for k, v in table.params.items())
    ax.set_title(title or f"{family} {params} - {result.level}: makespan "
                          f"{result.makespan:.4g} {result.time_unit}, bubble "
                          f"{result.bubble_ratio:.1%}", fontsize=10)
    if path is not None:
        save_figure(figure, path)
    return figure


def memory_plot(result, path=None, *, budget=None, total=None, title=None):
    """Memory over time, one line per device, with the budget as a dashed line.

    Parameters
    ----------
    result : Result
    path : str or Path, optional
    budget : float, optional
        Memory budget per device in the result's memory unit (default: the
        result's own ``memory_budget`` if it has one).
    total : bool, optional
        Add each device's persistent memory to its activations (default when the
        result has any persistent memory).

    Returns
    -------
    matplotlib.figure.Figure
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
    family = table.family or "table"
    params = " ".join(f"{k}={v}" for k, v in table.params.items())
    ax.set_title(title or f"{family} {params} - memory per device", fontsize=10)
    if path is not None:
        save_figure(figure, path)
    return figure


def _colormap(count):
    from matplotlib import colormaps
    cmap = colormaps["tab10" if count <= 10 else "tab20" if count <= 20 else "viridis"]
    if count > 20:
        return lambda d: cmap(d / max(count - 1, 1))
    return cmap


def sweep_plot(rows, path=None, *, devices=None, metric="simulation_makespan_s", title=None):
    """Iteration time against microbatches: a line per family, a panel per system.

    ``rows`` are sweep rows (:mod:`tabsched.sweep`); skipped configurations are
    left out. Systems named like the tabular paper's grid are laid out as the
    grid (network slow..fast down, compute slow..fast across); others in order.

    Parameters
    ----------
    rows : list of dict
    path : str or Path, optional
    devices : int, optional
        Plot this pipeline depth; default the only one in ``rows`` (required if several).
    metric : str
        A numeric sweep column (default the simulated iteration time).

    Returns
    -------
    matplotlib.figure.Figure
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
    systems = list(dict.fromkeys(row["system"] for row in ok))
    grid = _grid_layout(systems)
    nrows = max(r for r, _ in grid.values()) + 1
    ncols = max(c for _, c in grid.values()) + 1
    figure = _figure(3.4 * ncols + 1.6, 2.6 * nrows + 0.6)
    axes = figure.subplots(nrows, ncols, squeeze=False, sharex=True)
    specs = list(dict.fromkeys(row["spec"] for row in ok))
    cmap = _colormap(len(specs))
    scale, unit = ((1.0, "s") if metric.endswith("_s") else
                   (1e-9, "GB") if metric.endswith("_bytes") else (1.0, ""))
    for system, (r, c) in grid.items():
        ax = axes[r][c]
        for index, spec in enumerate(specs):
            points = sorted((row["microbatches"], row[metric]) for row in ok
                            if row["system"] == system and row["spec"] == spec)
            if points:
                xs, ys = zip(*points)
                line, = ax.plot(xs, [y * scale for y in ys], marker="o", markersize=3,
                                color=cmap(index), label=spec, linewidth=1.2)
                line.set_gid(f"sweep-{system}-{spec}")
        ax.set_xscale("log", base=2)
        ax.set_title(system, fontsize=9)
        ax.tick_params(labelsize=7)
        if c == 0:
            name = re.sub(r"^simulation_|_(s|bytes)$", "", metric).replace("_", " ")
            ax.set_ylabel(f"{name} ({unit})" if unit else name, fontsize=8)
        if r == nrows - 1:
            ax.set_xlabel("microbatches M", fontsize=8)
    for r in range(nrows):
        for c in range(ncols):
            if (r, c) not in grid.values():
                axes[r][c].set_visible(False)
    handles, labels = axes[0][0].get_legend_handles_labels()
    for r, c in grid.values():
        more_handles, more_labels = axes[r][c].get_legend_handles_labels()
        for handle, label in zip(more_handles, more_labels):
            if label not in labels:
                handles.append(handle)
                labels.append(label)
    figure.legend(handles, labels, loc="outside right upper", fontsize=8, frameon=False)
    model = ok[0].get("model")
    figure.suptitle(title or f"{model}, {devices} devices: iteration time vs microbatches",
                    fontsize=10)
    if path is not None:
        save_figure(figure, path)
    return figure


def _grid_layout(systems):
    """Panel (row, column) of each system: the nw x cp grid when the names say so."""
    speeds = {"slow": 0, "mid": 1, "fast": 2}
    pattern = re.compile(r"(slow|mid|fast)_nw_(slow|mid|fast)_cp")
    matches = [pattern.fullmatch(system) for system in systems]
    if all(matches):
        return {system: (speeds[m.group(1)], speeds[m.group(2)])
                for system, m in zip(systems, matches)}
    columns = int(np.ceil(np.sqrt(len(systems))))
    return {system: divmod(index, columns) for index, system in enumerate(systems)}
