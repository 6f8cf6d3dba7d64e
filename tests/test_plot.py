import json
import re

import numpy as np
import pytest

from tabsched import InvalidParameterError, ScheduleTable, StageCosts, UnitCosts, evaluate, generate

pytest.importorskip("matplotlib")

from tabsched.layout import from_order  # noqa: E402
from tabsched.plot import gantt, memory_plot  # noqa: E402
from tabsched.trace import chrome_trace, write_trace  # noqa: E402


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


def test_trace_in_slots_maps_a_slot_to_a_microsecond():
    trace = chrome_trace(evaluate(generate("gpipe", devices=2, microbatches=2)))
    ops = [event for event in trace["traceEvents"] if event["ph"] == "X"]
    assert max(event["ts"] + event["dur"] for event in ops) == 6.0
    assert trace["otherData"]["time_unit"] == "slots"


def test_sweep_plot_needs_a_successful_configuration():
    from tabsched.plot import sweep_plot
    rows = [{"status": "skipped", "devices": 4, "microbatches": 8, "system": "x", "spec": "gpipe",
             "simulation_makespan_s": None}]
    with pytest.raises(InvalidParameterError, match="no successful configuration with "
                                                    "devices=None to plot"):
        sweep_plot(rows)
