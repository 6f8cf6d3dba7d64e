"""The megatron-recompute study: Korthikanti et al. 2022, Table 5, measured vs predicted."""

import json
import shlex

import numpy as np
import pytest

from tabsched.study_megatron import (BEST_KNOWN, TABLE4, TABLE5, TARGET,
                                     implied_matrix_efficiency, predict, run_megatron_study,
                                     table5_runs)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    return run_megatron_study(tmp_path_factory.mktemp("megatron"))


def test_the_eight_runs_of_table5():
    runs = table5_runs()
    assert len(runs) == 8 and len(TABLE5) == 4
    assert [(run.model, run.mode, run.measured) for run in runs[:2]] == [
        ("megatron-22b", "full", 1.42), ("megatron-22b", "selective", 1.10)]
    gpt3 = runs[2]
    assert (gpt3.family, gpt3.pipeline, gpt3.microbatches, gpt3.chunks) == \
        ("interleaved-1f1b", 8, 64, 3)
    assert runs[6].family == "1f1b" and runs[6].microbatches == 512
    costs = runs[3].costs()
    assert costs.describe()["sequence_parallel"] and costs.model.recompute == "selective"
    assert costs.optimizer_step and costs.p2p == "megatron-batched"


def test_table5_errors_are_what_tabsched_reaches(study):
    """Asserted at the errors reached on the dgx-a100 rebuilt from measurements, the sends
    as Megatron-LM 2022 posted them (megatron-batched), the backward with the biases'
    gradients and the norms' two passes: mean 3.88%, max 7.51%, mean signed -1.26% (before
    those kernels: 4.26%, 8.14%, -2.16%; the first description, one flat matrix
    efficiency: 3.41%, 7.31%, +1.98%). The signed target (within +-1.5%) is met; the mean
    (<= 3%) and max (<= 5%) are not, nor is the best-known model's mean (3.65%); its max
    (8.87%) is. The report says where the rest comes from: the 22B layer's backward
    (Table 4) and the 1T's last stage."""
    assert study.mean_error <= 0.0390 and study.max_error <= 0.0755
    assert abs(study.signed_error) <= TARGET["signed"]
    assert study.max_error < BEST_KNOWN["max"]
    assert not (study.mean_error <= TARGET["mean"] and study.max_error <= TARGET["max"])
    assert study.verdict == "not reproduced"
    for row in study.rows:
        assert abs(row["error"]) < 0.076, row["model"]
    # full recomputation costs more than selective + sequence parallelism, as measured
    by_model = {}
    for row in study.rows:
        by_model.setdefault(row["model"], {})[row["mode"]] = row["predicted_s"]
    for model, _, _, _, _, _, _, full, selective in TABLE5:
        assert by_model[model]["full"] / by_model[model]["selective"] == pytest.approx(
            full / selective, rel=0.06)


def test_one_layer_of_the_22b_model_is_korthikanti_table4(study):
    """Table 4 (measured, one layer, five configurations) is independent of Table 5: each
    forward within 5%, each backward within 8% (fast: the report's finding), forward +
    backward within 7%, full recomputation's extra forward and the sequence-parallel
    forward's saving in the measured direction."""
    assert [(recompute, sp) for recompute, sp, *_ in study.layer_times] == \
        [(recompute, sp) for recompute, sp, _, _ in TABLE4]
    for recompute, sp, forward, predicted_f, backward, predicted_b in study.layer_times:
        assert predicted_f == pytest.approx(forward, rel=0.05), (recompute, sp)
        assert backward * 0.92 < predicted_b < backward, (recompute, sp)
        assert predicted_f + predicted_b == pytest.approx(forward + backward, rel=0.07)
    times = {(recompute, sp): (f, b) for recompute, sp, _, f, _, b in study.layer_times}
    assert times[("none", True)][0] < times[("none", False)][0]          # SP: 7.2 < 7.7 ms
    assert times[("full", False)][1] - times[("none", False)][1] == pytest.approx(
        19.5e-3 - 11.9e-3, rel=0.06)                                    # the recompute, 7.6 ms


def test_the_implied_matrix_efficiency_rises_with_model_size(study):
    """The diagnostic behind the report's explanation: the factor on the measured GEMM
    table's efficiencies that would make each run exact still grows with the model."""
    implied = {}
    for model, _, value in study.implied_efficiency:
        implied.setdefault(model, []).append(value)
    means = [np.mean(implied[model]) for model, *_ in TABLE5]
    assert all(0.5 < value < 1.0 for values in implied.values() for value in values)
    assert means == sorted(means) and means[-1] - means[0] > 0.05
    ((run, value),) = implied_matrix_efficiency(runs=table5_runs()[6:7])
    assert value == pytest.approx(implied["megatron-1t"][0])


def test_the_data_parallel_all_reduce_is_checked_against_section_6_3(study):
    """530B at d = 8: 1.32 s more, measured; tabsched's ring all-reduce adds less (0.30 s),
    a gap the report states (it does not touch the eight d = 1 runs)."""
    measured, predicted = study.data_parallel
    assert measured == pytest.approx(39.15 - 37.83)
    assert 0.1 < predicted < measured
    assert "section 6.3: the 530B run with d = 8" in open(study.files[1]).read()


def test_the_study_writes_its_table_and_report(study):
    table, report = study.files
    lines = open(table).read().splitlines()
    assert lines[0].startswith("model,gpus,t,p,chunks,global_batch,microbatch,mode,measured_s")
    assert lines[0].endswith(",command,peak_memory_bytes,memory_capacity_bytes,fits,"
                             "model_tflops_per_gpu,mfu,hfu")
    assert len(lines) == 9
    # every run of Table 5 fit its 80 GB A100s; each row says so, with its MFU
    assert all(row["fits"] and row["peak_memory_bytes"] <= 80e9 for row in study.rows)
    assert all(line.split(",")[-4] == "true" for line in lines[1:])
    assert all(0.2 < row["mfu"] < row["hfu"] < 0.7 for row in study.rows)
    text = open(report).read()
    assert "| gpt3-175b | 64 | 8 | 8 | 3 | 64 | 1 | 18.13 |" in text
    assert f"Mean |error| {study.mean_error:.2%}, max {study.max_error:.2%}" in text
    assert "## Where the remaining error comes from" in text
    assert "no GEMM table: one flat efficiency 0.728" in text     # the sensitivity table
    for section in ("## Audit of the model", "## Corrections in this revision",
                    "## Per-layer check: Table 4", "implied factor on the products"):
        assert section in text
    assert "| megatron-1t | full | +7.31% |" in text         # the previous description
    # what each prediction is made of: a row per run, its terms adding up to its time
    assert "## What each prediction is made of" in text
    assert len(study.terms) == 8 and len(study.layer_terms) == 10
    for (label, span, terms), row in zip(study.terms, study.rows):
        assert label == f"{row['model']} {row['mode']}" and span == row["predicted_s"]
        assert sum(terms.values()) == pytest.approx(span, rel=1e-12)
        assert f"| {label} | {span:.3g} |" in text


def test_the_cli_runs_the_study_and_each_row(cli, tmp_path, study):
    code, out, err = cli("study", "megatron-recompute", "-o", str(tmp_path))
    assert code == 0 and out.startswith("1. not reproduced: Table 5 of Korthikanti")
    assert (tmp_path / "report.md").exists() and (tmp_path / "table5.csv").exists()
    row = study.rows[1]                                    # megatron-22b, selective
    argv = shlex.split(row["command"])[1:] + ["--json"]
    code, out, _ = cli(*argv)
    assert code == 0
    assert json.loads(out)["makespan"] == pytest.approx(row["predicted_s"], rel=1e-12)


@pytest.mark.parametrize("option", [["--global-batch", "512"], ["-j", "2"], ["--dask", "local"]])
def test_options_the_measured_runs_cannot_take_are_refused(cli, tmp_path, option):
    code, out, err = cli("study", "megatron-recompute", "-o", str(tmp_path / "s"), *option)
    shown = "-j/--jobs" if option[0] == "-j" else option[0]
    assert code == 1 and out == "" and err == (
        f"Error: {shown} does not apply to megatron-recompute: its eight runs are measured "
        f"iterations at the paper's own global batch, evaluated serially in seconds\n")
    assert not (tmp_path / "s").exists()


def test_predict_takes_another_system():
    run = table5_runs()[:1]
    ((_, on_h100),) = predict(run, "dgx-h100")
    ((_, on_a100),) = predict(run)
    assert on_h100.makespan < on_a100.makespan
