import json
import re

import numpy as np
import pytest
from hypothesis import given, strategies as st

from tabsched import InvalidParameterError, ScheduleTable, StageCosts, UnitCosts, evaluate, generate

pytest.importorskip("matplotlib")

from tabsched.layout import from_order  # noqa: E402
from tabsched.plot import gantt, memory_plot  # noqa: E402
from tabsched.formats.perfetto import chrome_trace, write_trace  # noqa: E402


@pytest.fixture
def result():
    return evaluate(generate("1f1b", devices=4, microbatches=8), StageCosts(1.0, comm=0.25))


def test_gantt_svg_has_one_lane_per_device_and_per_link(result, tmp_path):
    path = tmp_path / "g.svg"
    gantt(result, path)
    svg = path.read_text()
    devices = set(re.findall(r'id="device-(\d+)"', svg))
    assert devices == {"0", "1", "2", "3"}
    links = set(re.findall(r'id="link-(\d+-\d+)"', svg))
    assert links == {"0-1", "1-2", "2-3", "1-0", "2-1", "3-2"}
    assert "critical path" in svg


def test_gantt_png_is_written(result, tmp_path):
    path = tmp_path / "g.png"
    figure = gantt(result, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
    axis = figure.axes[0]
    assert axis.get_xlim()[1] >= result.makespan
    labels = [tick.get_text() for tick in axis.get_yticklabels()]
    assert labels[:4] == ["device 0", "device 1", "device 2", "device 3"]


def test_gantt_labels_stage_when_a_device_holds_several(tmp_path):
    table = from_order([["0F0", "1F0", "1B0", "0B0"]])
    figure = gantt(evaluate(table))
    texts = {text.get_text() for text in figure.axes[0].texts}
    assert {"0:0", "1:0"} <= texts


def test_gantt_draws_the_tail(tmp_path):
    table = ScheduleTable([["0F0", "0B0", None, None], [None, None, "0F1", "0B1"]])
    result = evaluate(table, UnitCosts(sync=1, optimizer=1), grad_sync="replicas",
                      optimizer=True)
    path = tmp_path / "tail.svg"
    gantt(result, path)
    svg = path.read_text()
    assert 'id="grad-sync"' in svg and 'id="optimizer-1"' in svg


def test_memory_plot_has_budget_line(result, tmp_path):
    path = tmp_path / "m.svg"
    figure = memory_plot(result, path, budget=3.5)
    svg = path.read_text()
    assert set(re.findall(r'id="memory-(\d+)"', svg)) == {"0", "1", "2", "3"}
    lines = figure.axes[0].get_lines()
    assert any(np.allclose(line.get_ydata(), 3.5) for line in lines)
    peak = max(line.get_ydata().max() for line in lines if line.get_gid() == "memory-0")
    assert peak == result.devices[0].peak_memory


def test_picture_suffix_is_checked(result, tmp_path):
    with pytest.raises(InvalidParameterError, match=r"pictures are written as .png, .svg, .pdf"):
        gantt(result, tmp_path / "g.gif")


def test_trace_has_one_event_per_op_and_transfer(result, tmp_path):
    path = tmp_path / "t.json"
    write_trace(result, path)
    trace = json.loads(path.read_text())
    events = [event for event in trace["traceEvents"] if event["ph"] == "X"]
    ops = [event for event in events if event["pid"] == 0]
    transfers = [event for event in events if event["pid"] == 1]
    assert len(ops) == len(result.table)
    assert len(transfers) == len(result._lowered.transfers)
    threads = {(event["pid"], event["args"]["name"]) for event in trace["traceEvents"]
               if event["ph"] == "M" and event["name"] == "thread_name"}
    assert {name for pid, name in threads if pid == 0} == {f"device {d}" for d in range(4)}
    assert len({name for pid, name in threads if pid == 1}) == 6
    first = next(event for event in ops if event["name"] == "1F0")
    assert first["ts"] == pytest.approx(1.25e6) and first["dur"] == pytest.approx(1e6)
    assert first["args"]["critical"] is True
    end = max(event["ts"] + event["dur"] for event in events)
    assert end == pytest.approx(result.makespan * 1e6)


def test_a_trace_in_slots_says_so_and_draws_a_slot_as_a_millisecond():
    trace = chrome_trace(evaluate(generate("gpipe", devices=2, microbatches=2)))
    ops = [event for event in trace["traceEvents"] if event["ph"] == "X"]
    assert max(event["ts"] + event["dur"] for event in ops) == 9 * 1000.0   # F=1, B=2
    other = trace["otherData"]
    assert other["time_unit"] == "slots" and other["makespan"] == 9
    assert other["trace_time_unit"] == "us" and other["trace_us_per_time_unit"] == 1000
    assert "one slot is drawn as 1 ms" in other["note"]
    assert trace["displayTimeUnit"] == "ms"


@given(seed=st.integers(0, 2**31))
def test_every_table_traces_with_a_memory_track_per_device(seed):
    """Random tables (replicas, overlapped cells, devices that hold no activation): a
    counter track per device, starting at 0; it failed on an empty memory timeline."""
    from tabsched._testing import random_table
    result = evaluate(random_table(seed), UnitCosts())
    trace = json.loads(json.dumps(chrome_trace(result)))
    counters = {event["name"] for event in trace["traceEvents"] if event["ph"] == "C"}
    assert len(counters) == result.table.num_devices
    for device, (times, _) in enumerate(result.memory_timeline()):
        first = next(event for event in trace["traceEvents"] if event["ph"] == "C"
                     and event["name"].startswith(f"device {device} memory"))
        assert first["ts"] == 0.0 and first["args"]["activations"] == 0.0


def test_a_trace_in_seconds_says_its_times_are_microseconds(result):
    trace = chrome_trace(result)
    other = trace["otherData"]
    assert other["time_unit"] == "s" and other["trace_us_per_time_unit"] == 1e6
    assert other["trace_time_unit"] == "us" and "microseconds" in other["note"]
    # no event claims its times are seconds
    assert not any("time_unit" in event.get("args", {}) for event in trace["traceEvents"])


def test_an_overlapped_pair_is_one_slice_naming_both_operations():
    from tabsched import ModelCosts
    for costs in (None, ModelCosts("paper-128l", "mid_nw_mid_cp")):
        result = evaluate(generate("dualpipev", devices=4, microbatches=8), costs)
        lowered = result._lowered
        trace = chrome_trace(result)
        ops = [event for event in trace["traceEvents"] if event["ph"] == "X"
               and event["pid"] == 0 and event["cat"] != "optimizer"]
        assert len(ops) == lowered.num_cells < len(result.table)     # a slice per cell
        pairs = [event for event in ops if event["cat"] == "overlap"]
        parts = np.bincount(lowered.cell_of_op)
        assert len(pairs) == int(np.sum(parts > 1)) > 0
        for event in pairs:
            assert event["name"] == " + ".join(event["args"]["ops"])
            assert sorted(event["args"]["kinds"]) == ["B", "F"]
        spans = {(event["tid"], event["ts"], event["dur"]) for event in ops}
        assert len(spans) == len(ops)                   # no two identical nested slices


def test_sweep_plot_needs_a_successful_configuration():
    from tabsched.plot import sweep_plot
    rows = [{"status": "skipped", "devices": 4, "microbatches": 8, "system": "x", "spec": "gpipe",
             "simulation_makespan_s": None}]
    with pytest.raises(InvalidParameterError, match="no successful configuration with "
                                                    "devices=None to plot"):
        sweep_plot(rows)


# ---------------------------------------------------------------- pictures for a paper
def sweep_rows(models=("paper-128l",), systems=("mid_nw_mid_cp", "slow_nw_mid_cp")):
    from tabsched.sweeps import grid_tasks, run_sweep
    return run_sweep(grid_tasks(["gpipe", "1f1b"], [4], [4, 8, 16], models=models,
                                systems=systems, global_batch=16))


def test_sweep_lines_differ_in_marker_and_style_so_coinciding_lines_show():
    from tabsched.plot import PALETTE, sweep_plot
    figure = sweep_plot(sweep_rows(), metric="table_bubble_ratio")
    lines = [line for line in figure.axes[0].get_lines() if line.get_gid()]
    assert len(lines) == 2
    gpipe, one_f_one_b = lines
    assert np.allclose(gpipe.get_ydata(), one_f_one_b.get_ydata())      # they coincide
    assert gpipe.get_marker() != one_f_one_b.get_marker()
    assert gpipe.get_linestyle() != one_f_one_b.get_linestyle()
    assert gpipe.get_markersize() > one_f_one_b.get_markersize()         # nested markers
    assert one_f_one_b.get_zorder() > gpipe.get_zorder()
    assert {line.get_color() for line in lines} <= set(PALETTE)


def test_a_system_independent_metric_gets_one_panel_and_the_title_names_it():
    from tabsched.plot import sweep_plot
    rows = sweep_rows()
    figure = sweep_plot(rows, metric="table_bubble_ratio")
    visible = [ax for ax in figure.axes if ax.get_visible()]
    assert len(visible) == 1 and "every system" in visible[0].get_title()
    assert figure._suptitle.get_text() == ("paper-128l, 4 devices: bubble ratio (table level) "
                                           "vs microbatches")
    figure = sweep_plot(rows)                                # the simulation differs by system
    assert len([ax for ax in figure.axes if ax.get_visible()]) == 2
    assert "iteration time (simulation)" in figure._suptitle.get_text()


def test_two_models_are_two_lines_not_one_zigzag():
    from tabsched.plot import sweep_plot
    figure = sweep_plot(sweep_rows(models=("paper-128l", "gpt3-175b"),
                                   systems=("mid_nw_mid_cp",)))
    lines = [line for line in figure.axes[0].get_lines() if line.get_gid()]
    assert sorted(line.get_label() for line in lines) == [
        "1f1b (gpt3-175b)", "1f1b (paper-128l)", "gpipe (gpt3-175b)", "gpipe (paper-128l)"]
    for line in lines:
        assert list(line.get_xdata()) == [4, 8, 16]                     # one point per M
    assert figure._suptitle.get_text().startswith("paper-128l, gpt3-175b, 4 devices")


def test_what_a_system_decides_draws_no_lines_and_an_execution_axis_does():
    """The node size and contention an execution takes from its system vary from panel to
    panel only: no line of their own. A swept tensor degree is a line each."""
    from tabsched.plot import sweep_plot
    rows = sweep_rows(systems=("dgx-h100", "gb200-nvl72"))
    assert len({row["devices_per_node"] for row in rows}) == 2
    figure = sweep_plot(rows)
    labels = {line.get_label() for ax in figure.axes for line in ax.get_lines()
              if line.get_gid()}
    assert labels == {"gpipe", "1f1b"}
    from tabsched.sweeps import sweep
    rows = sweep(["1f1b"], [4], [4, 8], systems=["mid_nw_mid_cp"], tensor_parallel=[1, 2])
    labels = [line.get_label() for line in sweep_plot(rows).axes[0].get_lines()
              if line.get_gid()]
    assert labels == ["1f1b (tensor_parallel 1)", "1f1b (tensor_parallel 2)"]


def test_memory_metrics_show_the_capacity_and_axes_can_be_log():
    from tabsched.plot import sweep_plot
    rows = sweep_rows()
    figure = sweep_plot(rows, metric="simulation_peak_memory_bytes", logy=True, logx=False)
    ax = figure.axes[0]
    capacity = [line for line in ax.get_lines() if (line.get_gid() or "").startswith("capacity")]
    assert len(capacity) == 1 and np.allclose(capacity[0].get_ydata(), 80.0)   # 80 GB, in GB
    assert ax.get_yscale() == "log" and ax.get_xscale() == "linear"
    figure = sweep_plot(rows, metric="simulation_peak_memory_bytes", capacity=False)
    assert not [line for line in figure.axes[0].get_lines()
                if (line.get_gid() or "").startswith("capacity")]


def test_gantt_draws_sub_pixel_transfers_at_a_minimum_width(tmp_path):
    from tabsched import ModelCosts
    from tabsched.plot import DPI, MIN_BAR_PIXELS
    result = evaluate(generate("1f1b", devices=8, microbatches=32),
                      ModelCosts("paper-128l", "mid_nw_mid_cp"))
    path = tmp_path / "g.svg"
    figure = gantt(result, path, width=12)
    link = next(collection for collection in figure.axes[0].collections
                if collection.get_gid() == "link-0-1")
    widths = [path.get_extents().width for path in link.get_paths()]
    assert len(widths) == 32                                 # every transfer is drawn
    minimum = MIN_BAR_PIXELS * result.makespan / (0.75 * 12 * DPI)
    assert min(widths) >= minimum * 0.999
    assert result._node_durations[result._lowered.num_cells] < minimum   # it was narrower


def test_gantt_zooms_on_a_time_range_and_labels_what_is_in_view():
    result = evaluate(generate("1f1b", devices=4, microbatches=64), UnitCosts(f=1, b=2))
    figure = gantt(result, time_range=(10, 20))
    ax = figure.axes[0]
    assert ax.get_xlim() == (10, 20)
    assert "[10, 20]" in ax.get_title()
    assert 0 < len(ax.texts) < 4 * 12                      # only the cells in view
    with pytest.raises(InvalidParameterError, match=r"time_range \(5, 2\) must have"):
        gantt(result, time_range=(5, 2))


def test_an_adapted_table_has_a_short_title():
    from tabsched.adapt import SplitBackward, Warmup
    from tabsched.plot import table_title
    table = generate("1f1b", devices=4, microbatches=8)
    costs = UnitCosts(f=1, b=2)
    for transform in [SplitBackward(), Warmup([0, 1], 1), Warmup([0], 1)]:
        table = transform.apply(table, costs)
    assert table_title(table) == "1f1b devices=4 microbatches=8, adapted (3 transforms)"
    figure = gantt(evaluate(table, costs))
    assert figure.axes[0].get_title().startswith("1f1b devices=4 microbatches=8, adapted (3 "
                                                 "transforms) - table")


def test_gantt_legend_explains_the_labels():
    figure = gantt(evaluate(from_order([["0F0", "1F0", "1B0", "0B0"]])))
    legend = [text.get_text() for text in figure.axes[0].get_legend().get_texts()]
    assert any(text.startswith("bar label: microbatch\n(stage:microbatch") for text in legend)


def test_cli_plot_options(cli, tmp_path):
    from tabsched.sweeps import rows_to_csv
    csv_path = tmp_path / "s.csv"
    csv_path.write_text(rows_to_csv(sweep_rows()))
    code, _, err = cli("plot", "sweep", str(csv_path), "-o", str(tmp_path / "s.png"),
                       "--metric", "simulation_peak_memory_bytes", "--log-y", "--no-capacity")
    assert code == 0, err
    code, _, err = cli("plot", "gantt", "1f1b", "-p", "4", "-m", "8", "--model", "paper-128l",
                       "--system", "mid_nw_mid_cp", "-o", str(tmp_path / "g.png"),
                       "--time-range", "100ms:300ms")
    assert code == 0, err
    code, _, err = cli("plot", "gantt", "1f1b", "-p", "4", "-m", "8", "-o",
                       str(tmp_path / "g.png"), "--time-range", "5")
    assert code == 1 and "--time-range '5': expected START:END" in err
    code, _, err = cli("plot", "gantt", "1f1b", "-p", "2", "-m", "4", "-o",
                       str(tmp_path / "d.svg"), "--downsample")
    assert code == 0, err
    assert 'id="critical-0"' in (tmp_path / "d.svg").read_text()     # the stripe, not outlines


def test_trace_has_memory_counters_and_flow_arrows(result):
    trace = chrome_trace(result)
    events = trace["traceEvents"]
    counters = [event for event in events if event["ph"] == "C"]
    for device in range(4):
        mine = [event["args"]["activations"] for event in counters
                if event["name"].startswith(f"device {device} memory")]
        assert max(mine) == pytest.approx(result.devices[device].peak_memory)
        assert mine[0] == 0.0
    starts = [event for event in events if event["ph"] == "s"]
    finishes = {event["id"]: event for event in events if event["ph"] == "f"}
    assert len(starts) == len(finishes) == 2 * len(result._lowered.transfers)
    slices = [event for event in events if event["ph"] == "X"]
    for flow in starts + list(finishes.values()):
        # every end of an arrow lies inside a slice of its track (what "bp": "e" binds to)
        assert any(s["pid"] == flow["pid"] and s["tid"] == flow["tid"]
                   and s["ts"] <= flow["ts"] <= s["ts"] + s["dur"] for s in slices)
    arrow = next(event for event in starts if event["pid"] == 0 and event["name"] == "0F0")
    assert finishes[arrow["id"]]["pid"] == 1                            # into the link track


# ---------------------------------------------------------------- figures a paper can print
def _pdf_fonts(data):
    """The font subtypes a PDF declares (``/Subtype /Type3`` and so on)."""
    return set(re.findall(rb"/Subtype\s*/(\w+)", data))


def test_pdfs_embed_truetype_not_type3_and_svg_text_stays_text(result, tmp_path):
    import matplotlib
    from tabsched.plot import sweep_plot
    before = matplotlib.rcParams["pdf.fonttype"]
    pictures = [lambda path: gantt(result, path), lambda path: memory_plot(result, path),
                lambda path: sweep_plot(synthetic_rows(3), path, metric="table_bubble_ratio")]
    for index, draw in enumerate(pictures):
        pdf = tmp_path / f"p{index}.pdf"
        draw(pdf)
        fonts = _pdf_fonts(pdf.read_bytes())
        assert b"Type3" not in fonts
        assert b"TrueType" in fonts or {b"Type0", b"CIDFontType2"} <= fonts
        svg = tmp_path / f"p{index}.svg"
        draw(svg)
        assert "<text" in svg.read_text()
    assert matplotlib.rcParams["pdf.fonttype"] == before          # the caller's settings stay


def test_gantt_and_memory_plot_draw_into_the_panels_of_one_figure(result, tmp_path):
    from matplotlib.figure import Figure
    figure = Figure(figsize=(10, 6))
    top, bottom = figure.subplots(2, 1)
    assert gantt(result, ax=top) is top
    assert memory_plot(result, ax=bottom) is bottom
    assert len(figure.axes) == 2
    assert {c.get_gid() for c in top.collections} >= {"device-0", "device-3"}
    assert {line.get_gid() for line in bottom.get_lines()} >= {"memory-0", "memory-3"}
    path = tmp_path / "both.png"
    gantt(result, path, ax=top)                               # path with ax: its figure
    assert path.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(InvalidParameterError, match="width sizes a new figure"):
        gantt(result, ax=top, width=5)
    for draw in (gantt, memory_plot):
        with pytest.raises(InvalidParameterError, match="^ax must be matplotlib axes .*, not "
                                                        "list$"):
            draw(result, ax=[top, bottom])


def test_a_label_is_drawn_only_where_it_fits_inside_its_bar():
    table = from_order([["0F0", "0F1", "0B0", "0B1"]])
    figure = gantt(evaluate(table, UnitCosts(f=10, b=0.02)), labels=True)
    texts = [text for text in figure.axes[0].texts]
    assert sorted(text.get_text() for text in texts) == ["0", "1"]   # the two wide Fs
    assert all(text.get_position()[0] < 20 for text in texts)       # no B label


def test_a_table_level_gantt_has_no_empty_link_lanes():
    result = evaluate(generate("1f1b", devices=4, microbatches=8))
    assert result.level == "table" and len(result._lowered.transfers) > 0
    ax = gantt(result).axes[0]
    assert [tick.get_text() for tick in ax.get_yticklabels()] == [
        f"device {d}" for d in range(4)]
    assert not any((c.get_gid() or "").startswith("link") for c in ax.collections)


def test_a_long_gantt_in_a_notebook_is_downsampled_and_not_black():
    from tabsched.plot import CRITICAL_STRIPE, MIXED, gantt_svg
    result = evaluate(generate("1f1b", devices=8, microbatches=188))
    assert len(result.table) > 3000
    svg = gantt_svg(result)
    groups = re.findall(r'<g id="(?:device|critical)-\d+">(.*?)</g>', svg, flags=re.S)
    assert sum(group.count("<path") for group in groups) < 3000 / 5
    assert svg.count("<path") + svg.count("<rect") < 3000 / 5       # the whole picture
    ax = gantt(result, width=10).axes[0]
    lanes = {c.get_gid(): c for c in ax.collections}
    busy = [p.get_extents() for d in range(8) for p in lanes[f"device-{d}"].get_paths()]
    stripes = [p.get_extents() for d in range(8) if f"critical-{d}" in lanes
               for p in lanes[f"critical-{d}"].get_paths()]
    assert stripes and all(box.height <= CRITICAL_STRIPE + 1e-9 for box in stripes)
    black = sum(box.width * box.height for box in stripes)
    assert black < 0.1 * sum(box.width * box.height for box in busy)
    assert MIXED in {matplotlib_hex(color) for d in range(8)
                     for color in lanes[f"device-{d}"].get_facecolors()}


def matplotlib_hex(rgba):
    from matplotlib.colors import to_hex
    return to_hex(rgba).upper()


def test_a_long_title_is_wrapped_inside_the_figure_not_cut_at_its_start(result):
    from tabsched.plot import fit_title
    long = "zero bubble chimera " * 12 + "END"
    figure = gantt(result, title=long, width=8)
    title = figure.axes[0].title
    figure.canvas.draw()
    box, frame = title.get_window_extent(), figure.bbox
    assert frame.x0 <= box.x0 and box.x1 <= frame.x1
    assert title.get_text().startswith("zero bubble chimera") and title.get_text().endswith(
        "\u2026")
    assert title.get_text().count("\n") == 1
    short = gantt(result, title="short").axes[0].title
    assert fit_title(short).get_text() == "short"


def synthetic_rows(lines, microbatches=(1, 2, 4, 8), systems=("a",), metric="table_bubble_ratio"):
    """Sweep rows without running a sweep: ``lines`` families, one value per point."""
    return [{"status": "ok", "devices": 4, "microbatches": m, "system": system,
             "spec": f"family{k}", "model": "tiny", metric: 1.0 / (m + k)}
            for k in range(lines) for m in microbatches for system in systems]


def sweep_lines(figure_or_axes):
    axes = (figure_or_axes.axes if hasattr(figure_or_axes, "get_axes")   # a figure
            else [figure_or_axes])
    return [line for ax in axes for line in ax.get_lines() if line.get_gid()]


def test_twelve_sweep_lines_have_twelve_colours_and_twenty_unique_styles():
    from matplotlib.colors import to_hex
    from tabsched.plot import sweep_plot
    lines = sweep_lines(sweep_plot(synthetic_rows(12), metric="table_bubble_ratio"))
    assert len(lines) == 12 and len({to_hex(line.get_color()) for line in lines}) == 12
    lines = sweep_lines(sweep_plot(synthetic_rows(20), metric="table_bubble_ratio"))
    styles = {(to_hex(line.get_color()), line.get_marker(), line.get_linestyle())
              for line in lines}
    assert len(lines) == 20 and len(styles) == 20


def test_line_styles_stay_unique_long_after_the_colours_repeat():
    from tabsched.plot import line_style
    assert len({line_style(k) for k in range(384)}) == 384
    assert len({line_style(k)[0] for k in range(12)}) == 12


@pytest.mark.parametrize("microbatches", [(4, 8, 16), (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64,
                                                        96, 128)])
def test_sweep_ticks_are_at_the_microbatch_counts_swept(microbatches):
    from tabsched.plot import sweep_plot
    for logx in (True, False):
        figure = sweep_plot(synthetic_rows(2, microbatches), metric="table_bubble_ratio",
                            logx=logx)
        ax = figure.axes[0]
        ticks = list(ax.get_xticks())
        assert set(ticks) <= set(microbatches) and len(ticks) >= min(len(microbatches), 5)
        assert ticks[0] == microbatches[0] and ticks[-1] == microbatches[-1]
        assert [t.get_text() for t in ax.get_xticklabels()] == [f"{t:g}" for t in ticks]
        assert not ax.xaxis.get_minor_locator()()                # no unlabelled log ticks


def test_sweep_plot_draws_into_the_callers_axes_and_checks_their_number(tmp_path):
    from matplotlib.figure import Figure
    from tabsched.plot import sweep_plot
    one = synthetic_rows(2)
    figure = Figure()
    ax = figure.add_subplot()
    assert sweep_plot(one, ax=ax, metric="table_bubble_ratio") is ax
    assert len(sweep_lines(ax)) == 2 and ax.get_legend() is not None
    metric = "simulation_makespan_s"
    two = synthetic_rows(2, systems=("a", "b"), metric=metric)
    two[0][metric] = 5.0                                       # the systems differ: 2 panels
    figure = Figure()
    panels = figure.subplots(1, 2)
    assert sweep_plot(two, tmp_path / "s.svg", ax=panels, metric=metric, title="mine") is panels
    assert [len(sweep_lines(panel)) for panel in panels] == [2, 2]
    assert figure._suptitle.get_text() == "mine" and (tmp_path / "s.svg").exists()
    with pytest.raises(InvalidParameterError, match=r"^ax: the sweep draws 2 panels \(a, b\), "
                                                    r"so it needs 2 axes, not 1$"):
        sweep_plot(two, ax=panels[0], metric=metric)
    with pytest.raises(InvalidParameterError, match="ax must be matplotlib axes"):
        sweep_plot(one, ax="left", metric="table_bubble_ratio")


def test_a_long_sweep_title_fits_its_figure():
    from tabsched.plot import sweep_plot
    figure = sweep_plot(synthetic_rows(2), metric="table_bubble_ratio",
                        title="chimera devices=4 " * 20)
    figure.canvas.draw()
    box = figure._suptitle.get_window_extent()
    assert figure.bbox.x0 <= box.x0 and box.x1 <= figure.bbox.x1
    assert figure._suptitle.get_text().startswith("chimera devices=4")


def test_a_critical_outline_is_thinner_than_its_bar():
    result = evaluate(generate("1f1b", devices=4, microbatches=64), UnitCosts(f=1, b=2))
    ax = gantt(result, width=8, downsample=False).axes[0]
    lane = next(c for c in ax.collections if c.get_gid() == "device-3")
    # the axes are taken as 0.75 of the figure's width (gantt's estimate before layout)
    widths_points = [p.get_extents().width * 0.75 * 8 * 72 / result.makespan
                     for p in lane.get_paths()]
    outlines = lane.get_linewidths()
    assert len(outlines) == len(widths_points)
    assert all(lw <= w / 4 + 1e-6 for lw, w in zip(outlines, widths_points))
    assert 0 < min(outlines) and max(outlines) < 1.6            # thin bars: thinner outlines


@given(st.sets(st.integers(1, 4096), min_size=1, max_size=60), st.booleans(),
       st.integers(2, 10))
def test_microbatch_ticks_are_spread_data_values_from_first_to_last(values, log, most):
    from tabsched.plot import microbatch_ticks
    ticks = microbatch_ticks(values, log=log, most=most)
    assert set(ticks) <= values and ticks == sorted(set(ticks))
    assert ticks[0] == min(values) and ticks[-1] == max(values)
    assert len(ticks) <= most + 1
    if len(values) <= most:
        assert ticks == sorted(values)
    else:
        position = np.log2(ticks) if log else np.asarray(ticks, dtype=float)
        span = (np.log2(max(values)) - np.log2(min(values))) if log else max(values) - min(values)
        assert np.all(np.diff(position) >= span / (most - 1) / 2 * (1 - 1e-9))
