"""The HTML report (``tabsched.report``, ``--html``): one self-contained page, a bar per
node of the run, safe escaping, the refusals of its path, and a real browser."""

import json
import os
import re
import shutil

import pytest

from tabsched import StageCosts, evaluate, generate
from tabsched.exceptions import InvalidParameterError, OutputError
from tabsched import report
from tabsched.report import html_report

DATA = re.compile(r"<script type='application/json' id='tabsched-data'>(.*?)</script>", re.S)


def page_data(page):
    """The JSON the page carries."""
    return json.loads(DATA.search(page).group(1))


def simulated(devices=3, microbatches=4, family="1f1b", **costs):
    table = generate(family, devices=devices, microbatches=microbatches)
    return evaluate(table, StageCosts(1e-3, comm=3e-4, **costs), memory_budget=6)


def assert_self_contained(page):
    assert "http://" not in page and "https://" not in page
    assert not re.search(r"""(?:src|href)\s*=\s*["']?\s*(?:[a-z]+:)?//""", page, re.I)
    assert not re.search(r"<(?:link|img|iframe|object|embed)\b", page, re.I)
    assert not re.search(r"<script[^>]*\bsrc\s*=", page, re.I)
    assert "@import" not in page and "url(http" not in page
    page.encode("utf-8")            # valid UTF-8 (no lone surrogate left)


# ---------------------------------------------------------------------- the page
def test_a_result_is_one_self_contained_page():
    page = html_report(simulated())
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert_self_contained(page)
    assert page.count("<script") == 2       # the data, the script: both inline


def test_one_bar_per_cell_and_transfer_in_its_lane():
    result = simulated()
    lowered = result._lowered
    (chart,) = page_data(html_report(result))["charts"]
    gantt = chart["gantt"]
    devices = result.table.num_devices
    ops = [bar for bar in gantt["bars"] if bar[0] < devices]
    assert len(ops) == lowered.num_cells == len(result.table)
    assert sorted(bar[4] for bar in ops) == sorted(result.table.cell_text(k)
                                                   for k in range(len(result.table)))
    transfers = [bar for bar in gantt["bars"] if bar[0] >= devices]
    assert len(transfers) == len(lowered.transfers)
    assert gantt["lanes"][:devices] == [f"device {d}" for d in range(devices)]
    assert all(name.startswith("link ") for name in gantt["lanes"][devices:])
    # the bars' times are the run's (in seconds; shown as ms)
    first = next(bar for bar in ops if bar[4] == "0F0")
    assert first[1] == 0.0 and first[2] == pytest.approx(1e-3)
    assert chart["unit"] == "ms" and chart["seconds"] is True


def test_the_table_level_has_no_transfer_lanes_and_counts_slots():
    result = evaluate(generate("zb-h1", devices=2, microbatches=3))
    (chart,) = page_data(html_report(result))["charts"]
    assert chart["unit"] == "slots"
    assert chart["gantt"]["lanes"] == ["device 0", "device 1"]
    assert len(chart["gantt"]["bars"]) == len(result.table)
    why = {bar[4]: bar[5] for bar in chart["gantt"]["bars"]}
    # the zero-length transfer stands for its producer
    assert why["0I0"] == "waited 1 slots for 1I0 on device 1 (dependency)"


def test_each_bar_says_what_it_waited_for():
    (chart,) = page_data(html_report(simulated()))["charts"]
    why = {bar[4]: bar[5] for bar in chart["gantt"]["bars"]}
    assert why["0F0"] == "nothing to wait for: it starts the run"
    assert why["1F0"] == "waited 1.3 ms for 0F0 d0->d1 on link 0->1 (dependency)"
    assert why["0F1"] == "waited 1 ms for the device, busy with 0F0 (device busy)"
    # its own forward on the device it waited for is a dependency, not a busy device
    assert why["2B0"].startswith("started as 2F0 ended")
    assert why["0F0 d0->d1"] == "waited 1 ms for 0F0 on device 0 (dependency)"
    critical = {bar[4] for bar in chart["gantt"]["bars"] if bar[6]}
    assert critical == {step.label for step in simulated().critical_path}


def test_the_memory_lines_and_the_budget():
    result = simulated()
    (chart,) = page_data(html_report(result))["charts"]
    memory = chart["memory"]
    assert memory["limits"] == [{"name": "budget", "value": 6.0}]
    assert len(memory["lines"]) == result.table.num_devices
    peaks = [max(value for _, value in line["points"]) for line in memory["lines"]]
    assert peaks == [d.peak_total_memory for d in result.devices]


def test_memory_in_gigabytes_under_a_model():
    from tabsched import ModelCosts
    from tabsched.costs import load_model, load_system
    costs = ModelCosts(load_model("llama3-8b"), load_system("dgx-h100"))
    result = evaluate(generate("1f1b", devices=4, microbatches=8, layers=32), costs,
                      memory_budget="80GB")
    (chart,) = page_data(html_report(result))["charts"]
    assert chart["memory"]["unit"] == "GB"
    assert {"name": "budget", "value": pytest.approx(80.0)} in chart["memory"]["limits"]


def test_text_cannot_close_the_script_tag(tmp_path):
    table = generate("1f1b", devices=2, microbatches=2)
    table.params["note"] = "</script><b>bold</b> & <!-- \ud800 \u2028"
    page = html_report(evaluate(table), tmp_path / "r.html")
    assert page.count("</script>") == 2 and "<b>bold" not in page
    assert_self_contained(page)
    (chart,) = page_data(page)["charts"]
    assert "</script><b>bold</b> & <!-- \ud800 \u2028" in chart["name"]
    assert (tmp_path / "r.html").read_text(encoding="utf-8") == page


def test_large_runs_leave_the_chart_out(monkeypatch):
    monkeypatch.setattr(report, "MAX_BARS", 10)
    monkeypatch.setattr(report, "MAX_MEMORY_POINTS", 3)
    (chart,) = page_data(html_report(simulated()))["charts"]
    assert chart["gantt"]["bars"] == [] and "more than 10" in chart["gantt"]["note"]
    assert all(len(line["points"]) <= 3 for line in chart["memory"]["lines"])
    assert "cut to 3 points" in chart["memory"]["note"]


def test_past_the_cap_the_devices_lanes_stay_and_the_transfers_go(monkeypatch):
    result = simulated()
    monkeypatch.setattr(report, "MAX_BARS", len(result.table))
    (chart,) = page_data(html_report(result))["charts"]
    gantt = chart["gantt"]
    assert len(gantt["bars"]) == len(result.table) and gantt["lanes"] == [
        "device 0", "device 1", "device 2"]
    assert gantt["note"].startswith(f"{len(result._lowered.transfers)} bars of transfers")
    why = {bar[4]: bar[5] for bar in gantt["bars"]}
    assert why["1F0"] == "waited 1.3 ms for 0F0 d0->d1 (dependency)"


def test_the_api_exports_it():
    import tabsched
    assert tabsched.html_report is html_report and "html_report" in tabsched.__all__


def test_compare_rows_get_a_table_and_a_chart_each():
    from tabsched.compare import compare
    rows = compare(["1f1b", "zb-h1", "chimera"], 4, 8)
    page = html_report(rows)
    assert_self_contained(page)
    charts = page_data(page)["charts"]
    assert [chart["name"] for chart in charts] == ["1f1b", "zb-h1", "chimera"]
    for chart, row in zip(charts, rows):
        assert len([bar for bar in chart["gantt"]["bars"] if bar[0] < 4]) == \
            row.result._lowered.num_cells
    assert page.count("<tr>") == 4 and "simulation rank" in page


def test_wrong_objects_and_paths_are_refused(tmp_path):
    with pytest.raises(InvalidParameterError, match="html_report takes a Result"):
        html_report(42)
    with pytest.raises(InvalidParameterError):
        html_report([])
    with pytest.raises(OutputError, match="does not exist"):
        html_report(simulated(), tmp_path / "missing" / "r.html")
    with pytest.raises(OutputError, match="must end in .html"):
        html_report(simulated(), tmp_path / "r.txt")
    with pytest.raises(OutputError, match="is a folder"):
        html_report(simulated(), tmp_path)
    with pytest.raises(OutputError, match="must be a file path"):
        html_report(simulated(), 3)
    assert not list(tmp_path.iterdir())


# ---------------------------------------------------------------------- the CLI
def test_eval_html(cli, tmp_path):
    path = tmp_path / "eval.html"
    code, out, err = cli("eval", "1f1b", "-p", "4", "-m", "8", "--comm", "0.1", "--html",
                         str(path))
    assert code == 0 and "makespan" in out and err == f"wrote the HTML report to {path}\n"
    page = path.read_text(encoding="utf-8")
    assert_self_contained(page)
    (chart,) = page_data(page)["charts"]
    assert len([bar for bar in chart["gantt"]["bars"] if bar[0] < 4]) == 64


def test_eval_html_with_json_keeps_stdout_json(cli, tmp_path):
    code, out, _ = cli("eval", "zb-h1", "-p", "2", "-m", "4", "--json", "--html",
                       str(tmp_path / "r.htm"))
    assert code == 0 and json.loads(out)["level"] == "table"
    assert (tmp_path / "r.htm").exists()


def test_eval_html_with_monte_carlo(cli, tmp_path):
    path = tmp_path / "mc.html"
    code, out, _ = cli("eval", "1f1b", "-p", "4", "-m", "8", "--cv", "0.1", "--samples", "50",
                       "--html", str(path))
    assert code == 0
    page = path.read_text(encoding="utf-8")
    assert "Run-time variation (Monte Carlo)" in page and "<td>50</td>" in page
    mean = next(line for line in out.splitlines() if line.startswith("monte carlo"))
    value = float(mean.split("mean ")[1].split(" slots")[0])
    assert f"<td>{value:.4g} slots</td>" in page            # the same mean, in slots


def test_compare_html(cli, tmp_path):
    path = tmp_path / "compare.html"
    code, out, _ = cli("compare", "1f1b", "zb-h1", "-p", "4", "-m", "8", "--html", str(path))
    assert code == 0 and "rankings" in out
    charts = page_data(path.read_text(encoding="utf-8"))["charts"]
    assert [chart["name"] for chart in charts] == ["1f1b", "zb-h1"]


def test_plan_html(cli, tmp_path):
    path = tmp_path / "plan.html"
    code, out, _ = cli("plan", "llama3-8b", "dgx-h100", "--gpus", "8", "--global-batch", "16",
                       "-t", "4", "--microbatch-size", "1", "--families", "1f1b", "--top",
                       "3", "-q", "--html", str(path))
    assert code == 0
    page = path.read_text(encoding="utf-8")
    assert_self_contained(page)
    assert "Executions ranked" in page and "tie band" in page
    assert page.count("<tr class='tied'>") >= 1
    (chart,) = page_data(page)["charts"]
    assert chart["name"].startswith("rank 1: 1f1b")
    assert out.splitlines()[2].split()[0].startswith("1")


def test_the_plan_page_draws_the_best_as_the_plan_measured_it():
    from tabsched import plan
    found = plan("llama3-8b", "dgx-h100", 8, 16, tensor_parallel=[4], microbatch_sizes=[1],
                 families=["1f1b"], top=2)
    best = report._plan_best(found)
    assert best.makespan == pytest.approx(found.best.iteration_s, rel=1e-9)
    page = html_report(found, best=best)
    assert page.count("<tr class='tied'>") == sum(row.tied for row in found.rows)
    found.model = "no-such-model"
    assert "no Gantt chart of the best: cannot evaluate it again" in html_report(found)


def test_adapt_html(cli, tmp_path):
    path = tmp_path / "adapt.html"
    code, out, _ = cli("adapt", "1f1b", "-p", "4", "-m", "8", "--memory-budget", "6",
                       "--samples", "16", "-q", "--html", str(path))
    assert code == 0 and "decision" in out
    page = path.read_text(encoding="utf-8")
    assert "Transforms applied" in page
    charts = page_data(page)["charts"]
    assert [chart["heading"] for chart in charts] == [
        "before: the start (nominal durations)", "after: the adapted table (nominal durations)"]


@pytest.mark.parametrize("command", [
    ("eval", "1f1b", "-p", "2", "-m", "2"),
    ("compare", "1f1b", "-p", "2", "-m", "2"),
    ("plan", "llama3-8b", "dgx-h100", "--gpus", "8", "--global-batch", "16"),
    ("adapt", "1f1b", "-p", "2", "-m", "2", "--memory-budget", "6"),
])
def test_bad_html_paths_are_refused_before_the_work(cli_error, tmp_path, command):
    folder = tmp_path / "folder"
    folder.mkdir()
    fifo = tmp_path / "fifo.html"
    os.mkfifo(fifo)
    link = tmp_path / "link.html"
    link.symlink_to(tmp_path / "elsewhere.html")
    cases = {tmp_path / "missing" / "r.html": "does not exist",
             folder: "is a folder", tmp_path / "r.csv": "must end in .html",
             fifo: "not a regular file", link: "symbolic link"}
    for path, reason in cases.items():
        message = cli_error(*command, "--html", path)
        assert message.startswith(f"--html {path}: ") and reason in message, message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo.html", "folder", "link.html"]


def test_a_failed_write_is_one_line_and_leaves_the_old_file(cli_error, tmp_path, monkeypatch):
    import tabsched.files
    path = tmp_path / "r.html"
    path.write_text("before", encoding="utf-8")

    def full(*_):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(tabsched.files.os, "replace", full)
    message = cli_error("eval", "1f1b", "-p", "2", "-m", "2", "--html", path)
    assert message.startswith(f"--html {path}: cannot write: No space left on device")
    assert path.read_text(encoding="utf-8") == "before"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into any folder")
def test_a_folder_without_write_permission_is_refused(cli_error, tmp_path):
    folder = tmp_path / "locked"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        message = cli_error("eval", "1f1b", "-p", "2", "-m", "2", "--html",
                            folder / "r.html")
    finally:
        folder.chmod(0o700)
    assert message.startswith("--html ") and "permission denied" in message


def test_an_input_or_another_output_is_refused(cli_error, tmp_path):
    from tabsched.io import write_table
    table = tmp_path / "t.json"
    write_table(generate("1f1b", devices=2, microbatches=2), table)
    same = tmp_path / "t.html"
    os.link(table, same)          # the same file by another name
    message = cli_error("eval", table, "--html", same)
    assert message.startswith(f"--html {same}: is also this command's input")
    message = cli_error("plan", "llama3-8b", "dgx-h100", "--gpus", "8", "--global-batch", "16",
                        "--out", tmp_path / "p.html", "--html", tmp_path / "p.html")
    assert "is also the --out file" in message
    message = cli_error("eval", "1f1b", "-p", "2", "-m", "2", "--level", "formula", "--html",
                        tmp_path / "f.html")
    assert "--level formula has no times per operation" in message


# ---------------------------------------------------------------------- a browser
def _browser():
    """Chromium from the system's packages, driven by Playwright, or a skip."""
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason="the playwright package is not installed")
    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    if executable is None:
        pytest.skip("no chromium binary on PATH")
    return sync_api, executable


def test_the_page_in_a_real_browser(tmp_path):
    sync_api, executable = _browser()
    result = simulated(devices=4, microbatches=8)
    path = tmp_path / "r.html"
    html_report(result, path)
    errors = []
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable,
                                             args=["--no-sandbox"], timeout=10_000)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.set_default_timeout(5_000)
            page.on("console", lambda message: errors.append(message.text)
                    if message.type == "error" else None)
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(path.as_uri())
            assert page.locator("svg.gantt rect.op").count() == len(result.table)
            assert page.locator("svg.gantt rect.bar").count() == \
                len(result.table) + len(result._lowered.transfers)
            bar = page.locator("svg.gantt rect.op").nth(5)
            index = int(bar.get_attribute("data-i"))
            label = page_data(path.read_text(encoding="utf-8"))["charts"][0]["gantt"][
                "bars"][index][4]
            bar.hover()
            tip = page.locator("#tip")
            assert tip.is_visible() and label in tip.inner_text()
            assert " ms" in tip.inner_text() and "waited" in tip.inner_text()
            width = float(bar.get_attribute("width"))
            page.click("button.zoom-in")
            assert float(bar.get_attribute("width")) == pytest.approx(2 * width, rel=0.01)
            page.click("button.reset")
            assert float(bar.get_attribute("width")) == pytest.approx(width, rel=0.01)
            shown = page.locator("span.view").first.inner_text()
            box = page.locator("svg.gantt").bounding_box()
            page.mouse.move(box["x"] + 400, box["y"] + 40)
            page.mouse.down()
            page.mouse.move(box["x"] + 300, box["y"] + 40, steps=3)
            page.mouse.up()
            assert page.locator("span.view").first.inner_text() != shown      # panned
            page.mouse.wheel(0, -200)
            assert float(bar.get_attribute("width")) > width                   # zoomed
            assert page.locator("svg.memory path.mem").count() == result.table.num_devices
        finally:
            browser.close()
    assert errors == []
