"""Notebook use: DataFrames of every result, short reprs, HTML for tables and results."""

import re

import numpy as np
import pytest

import tabsched
from tabsched import ModelCosts, StageCosts, UnitCosts, evaluate, generate
from tabsched.adapt import Noise, adapt, monte_carlo
from tabsched.compare import compare

pd = pytest.importorskip("pandas", reason="to_dataframe() needs pandas (the notebook extra)")


@pytest.fixture(scope="module")
def result():
    return evaluate(generate("1f1b", devices=4, microbatches=8),
                    ModelCosts("paper-128l", "mid_nw_mid_cp"))


def test_result_frames_per_device_and_per_op(result):
    devices = result.to_dataframe()
    assert list(devices["device"]) == [0, 1, 2, 3]
    assert devices["busy"].tolist() == [d.busy for d in result.devices]
    assert devices.attrs["time_unit"] == "s" and devices.attrs["memory_unit"] == "bytes"
    ops = result.to_dataframe(ops=True)
    assert len(ops) == len(result.table) and ops["op"].iloc[0] == "0F0"
    assert np.allclose(ops["end"] - ops["start"], ops["duration"])
    assert ops["end"].max() == pytest.approx(result.makespan)
    on_path = ops[ops["critical"]]
    assert len(on_path) == sum(1 for step in result.critical_path if step.kind == "op")


def test_monte_carlo_and_adapt_frames():
    table = generate("1f1b", devices=4, microbatches=8)
    runs = monte_carlo(table, UnitCosts(f=1, b=2), Noise(0.1), samples=200)
    assert list(runs.to_dataframe()["device"]) == [0, 1, 2, 3]
    samples = runs.to_dataframe(samples=True)
    assert len(samples) == 200 and samples["makespan"].mean() == pytest.approx(runs.mean)
    found = adapt(table, UnitCosts(f=1, b=2), Noise(0.05), 12, samples=16, max_rounds=2,
                  references=("1f1b", "zb-h1"))
    frame = found.to_dataframe()
    assert list(frame["role"][:2]) == ["baseline", "adapted"]
    assert set(frame["role"][2:]) <= {"reference"}
    assert pd.isna(frame["gain"][1]) and frame.attrs["objective"] == "mean"


def test_compare_and_sweep_frames():
    rows = compare(["gpipe", "1f1b", "zbv"], 4, 8)
    frame = rows.to_dataframe()
    assert list(frame["label"]) == ["gpipe", "1f1b", "zbv"]
    assert frame["simulation_makespan"].notna().all() and frame.attrs["time_unit"] == "s"
    assert list(frame["simulation_fits"]) == [row.simulation["fits"] for row in rows]
    assert list(frame["simulation_mfu"]) == [row.simulation["throughput"]["mfu"] for row in rows]
    assert frame["simulation_over_capacity"].notna().all()
    swept = tabsched.sweep(["gpipe", "1f1b"], [4], [8, 16], systems=["mid_nw_mid_cp"])
    assert isinstance(swept, tabsched.SweepResult) and len(swept) == 4
    assert swept[0]["params"] == {"devices": 4, "microbatches": 8}   # a dict, not JSON text
    frame = swept.to_dataframe()
    assert frame.shape[0] == 4 and frame["params"][0] == {"devices": 4, "microbatches": 8}
    import os
    import tempfile

    from tabsched.sweeps import read_sweep_csv
    with tempfile.TemporaryDirectory() as folder:       # the CSV is the CLI's own
        path = os.path.join(folder, "s.csv")
        with open(path, "w", newline="") as handle:
            handle.write(swept.to_csv())
        back = read_sweep_csv(path)
    assert [row["simulation_makespan_s"] for row in back] == \
        [row["simulation_makespan_s"] for row in swept]


def test_reprs_are_short_and_say_the_key_numbers(result):
    assert repr(UnitCosts(f=1, b=2)) == "UnitCosts(F=1, B=2, I=1, W=1)"
    assert repr(StageCosts([1, 2, 3, 4, 5, 6], comm=0.1)).startswith(
        "StageCosts(F=[1, 2, 3, 4, ... 6 in all]")
    model = repr(ModelCosts("paper-128l", "mid_nw_mid_cp", recompute="full"))
    assert model.startswith("ModelCosts(paper-128l: 128 layers, hidden 4096") and \
        "1 PFLOP/s" in model and "recompute=full" in model
    assert re.fullmatch(r"<Result simulation: 1f1b devices=4 microbatches=8, makespan [\d.]+ s, "
                        r"bubble [\d.]+%, peak memory [\d.]+ GB on d\d>", repr(result))
    runs = monte_carlo(result.table, UnitCosts(), Noise(0.1), samples=1000)
    text = repr(runs)
    assert text.startswith("<MonteCarloResult 1000 samples (seed 0): mean ") and len(text) < 200


def test_html_of_a_table_and_a_result(result):
    html = result.table._repr_html_()
    assert html.count("<tr>") == 1 + 4 and "0F0" in html and "background:#0072B2" in html
    big = generate("1f1b", devices=2, microbatches=200)._repr_html_()
    assert "more slots not shown" in big
    page = result._repr_html_()
    assert "makespan <b>" in page and "<svg" in page and "d3</td>" in page
