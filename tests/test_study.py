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
