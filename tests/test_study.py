import re

import pytest

from tabsched import UnknownNameError
from tabsched.study import STUDIES, run_study

pytest.importorskip("matplotlib")


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    out = tmp_path_factory.mktemp("study")
    return run_study("tabular-paper", out), out


def test_study_writes_csv_figures_and_report(study):
    report, out = study
    setup = STUDIES["tabular-paper"]
    expected = (len(setup["specs"]) * len(setup["devices"]) * len(setup["microbatches"])
                * len(setup["systems"]))
    assert report.configurations == expected
    assert (out / "sweep.csv").read_text().count("\n") == expected + 1
    for name in ("iteration_time_S4.png", "iteration_time_S8.png", "peak_memory_S8.png"):
        assert (out / name).stat().st_size > 20_000
    text = (out / "report.md").read_text()
    assert text.count("### ") == 5
    assert "at a global batch of 256 samples over all data-parallel replicas (one here" in text
    # every row says whether its devices fit the system's memory, and how fast it ran: the
    # paper's 128-layer model holds more than an 80 GB device at every S and M of the study
    ok = [row for row in report.rows if row["status"] == "ok"]
    assert {row["simulation_fits"] for row in ok} == {False}
    assert re.search(r"Memory: 0 of \d+ evaluated configurations fit their system's device "
                     r"memory; the others go over it \(by up to \d+ GB: ", text)
    assert all(row["memory_capacity_bytes"] == 80e9 and row["simulation_mfu"] > 0 for row in ok)
    assert all((row["simulation_over_capacity_bytes"] > 0) != row["simulation_fits"]
               for row in ok)
    for finding in report.findings:
        assert finding.verdict in ("reproduced", "partly reproduced", "not reproduced")
        assert finding.claim in text and finding.evidence


def test_study_findings_carry_the_numbers(study):
    report, _ = study
    rankings, flush, chimera, hanayo, asymmetric = report.findings
    assert rankings.verdict == "reproduced"
    assert re.search(r"In \d+ of 108 configurations", rankings.evidence[0])
    assert "108/108" in flush.evidence[0] and "1F1B's largest activation peak" in flush.evidence[2]
    assert chimera.evidence[0] == "Formula at S=8, M=16: 15.8%."
    assert any("hanayo:waves=2 vs Chimera at S=M=8" in line for line in hanayo.evidence)
    assert any(line.startswith("Global peak memory not lower") for line in asymmetric.evidence)


def test_unknown_study():
    with pytest.raises(UnknownNameError, match="unknown study 'tabular'; valid studies: "
                                               "tabular-paper"):
        run_study("tabular", "/nonexistent")


def test_the_report_says_how_many_configurations_fit_the_devices_memory():
    from tabsched.study import _memory_note
    row = {"status": "ok", "spec": "1f1b", "devices": 8, "microbatches": 16,
           "simulation_fits": True, "simulation_over_capacity_bytes": 0.0}
    over = {**row, "spec": "gpipe", "simulation_fits": False,
            "simulation_over_capacity_bytes": 52.9e9}
    assert _memory_note([row, row]) == ("Memory: 2 of 2 evaluated configurations fit their "
                                        "system's device memory.")
    assert _memory_note([row, over, {"status": "skipped"}]) == (
        "Memory: 1 of 2 evaluated configurations fit their system's device memory; the "
        "others go over it (by up to 53 GB: gpipe S=8 M=16), which the findings below do not "
        "weigh (`simulation_fits` and `simulation_over_capacity_bytes` in `sweep.csv`).")
    assert _memory_note([{**row, "simulation_fits": None}]) == (
        "No system states its device memory, so no configuration is checked against it.")
