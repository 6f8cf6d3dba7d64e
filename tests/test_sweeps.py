import json
import re

import pytest

from tabsched import InvalidParameterError, TabschedError, evaluate, generate
from tabsched.compare import model_costs_for
from tabsched.sweeps import (COLUMNS, SYSTEM_GRID, grid_tasks, read_sweep_csv, rows_to_csv,
                            SweepResult, run_sweep, run_task)


@pytest.fixture(scope="module")
def small_grid():
    return grid_tasks(["gpipe", "1f1b", "chimera"], [3, 4], [4, 8],
                      systems=("mid_nw_mid_cp", "slow_nw_fast_cp"), global_batch=8)


@pytest.fixture
def eager(monkeypatch):
    """Other processes take work however little there is (one task calibrates, batches
    of one task's worth): the parallel paths run on a grid small enough for a test."""
    import tabsched.parallel as parallel
    monkeypatch.setattr(parallel, "START_SECONDS", dict.fromkeys(parallel.START_SECONDS, 0.0))
    monkeypatch.setattr(parallel, "CALIBRATION_SECONDS", 0.0)
    monkeypatch.setattr(parallel, "BATCH_SECONDS", 1e-9)


def test_rows_hold_every_level_with_exact_numbers(small_grid):
    rows = run_sweep(small_grid)
    assert len(rows) == 3 * 2 * 2 * 2
    row = next(r for r in rows if r["spec"] == "1f1b" and r["devices"] == 4
               and r["microbatches"] == 8 and r["system"] == "slow_nw_fast_cp")
    assert row["status"] == "ok" and row["microbatch_size"] == 1
    assert row["formula_bubble_ratio"] == pytest.approx(3 / 11)
    assert row["table_bubble_ratio"] == pytest.approx(3 / 11) and row["table_slots"] == 33
    costs = model_costs_for("paper-128l", "slow_nw_fast_cp", 8, global_batch=8)
    single = evaluate(generate("1f1b", devices=4, microbatches=8), costs)
    assert row["simulation_makespan_s"] == single.makespan
    assert row["simulation_peak_memory_bytes"] == max(d.peak_total_memory
                                                     for d in single.devices)
    assert json.loads(row["params"]) == {"devices": 4, "microbatches": 8}


def test_invalid_combinations_are_skipped_with_a_reason(small_grid):
    rows = run_sweep(small_grid)
    skipped = [r for r in rows if r["status"] == "skipped"]
    # chimera needs even devices; 128 layers do not split over 3 stages
    assert {r["devices"] for r in skipped} == {3}
    chimera = next(r for r in skipped if r["spec"] == "chimera")
    assert chimera["reason"].startswith("chimera: devices must be even")
    gpipe = next(r for r in skipped if r["spec"] == "gpipe")
    assert "do not split evenly over the table's 3 stages" in gpipe["reason"]
    assert gpipe["simulation_makespan_s"] is None


def test_a_sweep_result_writes_the_csv_of_its_rows_skipped_ones_included(small_grid):
    from tabsched.sweeps import SweepResult
    rows = run_sweep(small_grid)
    typed = SweepResult(rows)
    skipped = next(row for row in typed if row["status"] == "skipped")
    assert skipped["params"] is None and skipped["parallel"] == {}
    assert typed.to_csv() == rows_to_csv(rows)


def test_serial_processes_and_dask_give_identical_csv(small_grid, tmp_path, eager):
    serial = rows_to_csv(run_sweep(small_grid))
    assert rows_to_csv(run_sweep(small_grid, jobs=2)) == serial
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, processes=False, dashboard_address=None) \
            as cluster, distributed.Client(cluster) as client:
        assert rows_to_csv(run_sweep(small_grid, dask=client)) == serial
        assert rows_to_csv(run_sweep(small_grid, dask=cluster.scheduler_address)) == serial
    path = tmp_path / "s.csv"
    path.write_text(serial)
    back = read_sweep_csv(path)
    assert rows_to_csv(back) == serial


def test_progress_is_reported(small_grid):
    seen = []
    run_sweep(small_grid[:3], progress=lambda *args: seen.append(args))
    assert seen == [(1, 3, 2), (2, 3, 4), (3, 3, 6)]


def test_grid_and_csv_shape():
    tasks = grid_tasks(["gpipe"], [2], [2])
    assert tasks[0].systems == SYSTEM_GRID and len(SYSTEM_GRID) == 9
    text = rows_to_csv(run_task(tasks[0]))
    assert text.splitlines()[0].split(",") == list(COLUMNS)
    assert len(text.splitlines()) == 10
    with pytest.raises(InvalidParameterError, match="sweep: devices is empty"):
        grid_tasks(["gpipe"], [], [2])
    with pytest.raises(InvalidParameterError, match="jobs must be >= 1"):
        run_sweep(tasks, jobs=0)


def test_bad_sweep_csv(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(InvalidParameterError, match="not a sweep CSV"):
        read_sweep_csv(path)


def test_summaries_are_the_results_numbers_to_the_bit():
    from tabsched import ModelCosts, StageCosts, generate
    from tabsched.evaluate import evaluate_many, evaluate_summaries
    for family in ("1f1b", "chimera", "zbv"):
        table = generate(family, devices=4, microbatches=8)
        costs = [ModelCosts("paper-128l", system, grad_sync="replicas")
                 for system in ("slow_nw_mid_cp", "fast_nw_fast_cp")]
        costs.append(StageCosts(1.0, comm=0.5, contention="link", input_grad_release=0.5))
        results = evaluate_many(table, costs, grad_sync="replicas")
        summaries = evaluate_summaries(table, costs, grad_sync="replicas")
        for result, summary in zip(results, summaries):
            assert summary.makespan == result.makespan
            assert summary.bubble_ratio == result.bubble_ratio
            assert summary.peak_activation == [d.peak_memory for d in result.devices]
            assert summary.peak_memory == [d.peak_total_memory for d in result.devices]
            assert summary.formula == result.formula


def test_summaries_refuse_what_evaluate_many_refuses():
    from tabsched import generate
    from tabsched.evaluate import evaluate_summaries
    with pytest.raises(InvalidParameterError, match=r"table must be a ScheduleTable"):
        evaluate_summaries("1f1b", [])
    with pytest.raises(InvalidParameterError, match=r"cost_models must hold cost models"):
        evaluate_summaries(generate("1f1b", devices=2, microbatches=2), ["paper-128l"])


def test_summaries_share_memory_sizes_only_between_equal_memory_keys():
    """Cost models on several systems share a table's memory sizes; other models,
    parallelisms or microbatch sizes in the same call keep their own."""
    from tabsched import ModelCosts, generate
    from tabsched.evaluate import evaluate_summaries
    table = generate("zb-h1", devices=4, microbatches=8)
    costs = [ModelCosts("paper-128l", "slow_nw_mid_cp"),
             ModelCosts("paper-128l", "fast_nw_fast_cp", tensor_parallel=2),
             ModelCosts("paper-128l", "mid_nw_mid_cp"),
             ModelCosts("llama3-8b", "mid_nw_mid_cp"),
             ModelCosts("paper-128l", "fast_nw_slow_cp", microbatch_size=2),
             ModelCosts("paper-128l", "dgx-h100", data_parallel=2, optimizer_sharding=True)]
    summaries = evaluate_summaries(table, costs)
    for model_costs, summary in zip(costs, summaries):
        result = evaluate(table, model_costs)
        assert summary.makespan == result.makespan
        assert summary.peak_activation == [d.peak_memory for d in result.devices]
        assert summary.peak_memory == [d.peak_total_memory for d in result.devices]
    assert len({c.memory_key() for c in costs}) == 5


def test_csv_cells_keep_their_forms():
    """The writer's fast paths for exact types give what the general rule gives."""
    from tabsched.sweeps import _cell

    class Name(str):
        pass

    class Count(int):
        pass

    for value, text in [(None, ""), (True, "true"), (False, "false"), (3, "3"),
                        (Count(4), "4"), (0.1, "0.1"), (1e-300, "1e-300"), (2.0, "2.0"),
                        ("ok", "ok"), (Name("zbv"), "zbv"), (float("inf"), "inf")]:
        assert _cell(value) == text
    row = dict.fromkeys(COLUMNS)
    row.update(params={"devices": 2}, parallel={}, formula_exact=False, devices=2)
    line = rows_to_csv([row]).splitlines()[1].split(",")
    assert line[COLUMNS.index("formula_exact")] == "false"
    assert line[COLUMNS.index("devices")] == "2" and line[COLUMNS.index("parallel")] == "{}"


def test_forked_workers_share_the_tasks_and_report_each_once(small_grid, eager):
    serial = rows_to_csv(run_sweep(small_grid))
    seen = []
    rows = run_sweep(small_grid, jobs=3, progress=lambda *args: seen.append(args))
    assert rows_to_csv(rows) == serial
    assert [done for done, _, _ in seen] == list(range(1, len(small_grid) + 1))
    assert seen[-1] == (len(small_grid), len(small_grid), len(rows))


def _failing_in_workers(failure):
    """run_task that fails the way ``failure`` says in a forked process only."""
    import os
    import tabsched.sweeps as sweeps
    parent, run_task_here = os.getpid(), sweeps.run_task

    def run(task):
        if os.getpid() != parent:
            if failure == "raise":
                raise ValueError(f"a bug at {task.spec}")
            os._exit(3)
        # the parent runs its tasks slowly, so that the workers take some
        import time
        time.sleep(0.05)
        return run_task_here(task)
    return run


def test_a_worker_that_fails_fails_the_sweep(small_grid, monkeypatch, eager):
    import multiprocessing
    import tabsched.sweeps as sweeps
    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("no fork here: the process pool runs the tasks")
    monkeypatch.setattr(sweeps, "run_task", _failing_in_workers("raise"))
    with pytest.raises(ValueError, match="a bug at"):
        run_sweep(small_grid, jobs=2)
    monkeypatch.setattr(sweeps, "run_task", _failing_in_workers("exit"))
    with pytest.raises(TabschedError, match=r"a worker process died \(exit status 3\)"):
        run_sweep(small_grid, jobs=2)


@pytest.mark.parametrize("pool", ["threads", "processes"])
def test_any_executor_gives_the_serial_csv_in_batches(small_grid, eager, monkeypatch, pool):
    from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
    import tabsched.parallel as parallel
    serial = rows_to_csv(run_sweep(small_grid))
    sizes = []
    batched = parallel._batches

    def watched(*args):
        batches = batched(*args)
        sizes.append(sorted(len(batch) for batch in batches))
        return batches

    monkeypatch.setattr(parallel, "_batches", watched)
    Pool = ThreadPoolExecutor if pool == "threads" else ProcessPoolExecutor
    with Pool(max_workers=2) as executor:
        seen = []
        rows = run_sweep(small_grid, executor=executor,
                         progress=lambda *args: seen.append(args))
    assert rows_to_csv(rows) == serial
    assert [done for done, _, _ in seen] == list(range(1, len(small_grid) + 1))
    # one task ran here to price the work; the others went out, every one once
    assert sum(sizes[0]) == len(small_grid) - 1


def test_a_grid_too_small_to_gain_runs_here(small_grid, monkeypatch):
    """No process is started for work that takes less than starting it costs."""
    import tabsched.parallel as parallel

    def refuse(*args, **kwargs):
        raise AssertionError("a worker was started for a small grid")

    for name in ("run_forked", "run_dask", "_run_on_client", "run_executor"):
        monkeypatch.setattr(parallel, name, refuse)
    serial = rows_to_csv(run_sweep(small_grid))
    assert rows_to_csv(run_sweep(small_grid, jobs=2)) == serial
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(2) as executor:
        assert rows_to_csv(run_sweep(small_grid, executor=executor)) == serial
    if pytest.importorskip("distributed"):
        assert rows_to_csv(run_sweep(small_grid, dask="local")) == serial


def test_batches_hold_each_task_once_in_order_and_enough_work():
    from tabsched.parallel import BATCH_SECONDS, _batches
    tasks = list(range(40))
    order = list(reversed(tasks))
    batches = _batches(tasks, order, lambda task: task + 1, 0.01, 2)
    assert [index for batch in batches for index in batch] == order
    assert all(sum(0.01 * (index + 1) for index in batch) >= BATCH_SECONDS
               for batch in batches[:-1])
    assert _batches(tasks, order, None, None, 2) == [[index] for index in order]


@pytest.mark.parametrize("options, message", [
    ({"jobs": 2.5}, "jobs must be a whole number >= 1, not 2.5"),
    ({"jobs": True}, "jobs must be a whole number >= 1, not True"),
    ({"executor": object()}, "executor: a concurrent.futures.Executor"),
    ({"executor": object(), "dask": "local"}, "give dask or executor, not both"),
])
def test_bad_parallel_settings_are_refused(small_grid, options, message):
    with pytest.raises(InvalidParameterError, match=re.escape(message)):
        run_sweep(small_grid, **options)


# ------------------------------------------------- the execution's axes and columns
def test_the_execution_axes_take_lists_and_every_combination_is_a_row():
    from tabsched.sweeps import sweep
    rows = sweep(["1f1b"], [8], [16], models=["gpt3-175b"], systems=["dgx-a100"],
                 tensor_parallel=[4, 8], data_parallel=(1, 2), microbatch_size=[1, 2],
                 recompute=["none", "full"])
    assert len(rows) == 16 and all(row["status"] == "ok" for row in rows)
    assert [(r["tensor_parallel"], r["data_parallel"], r["microbatch_size"], r["recompute"])
            for r in rows[:3]] == [(4, 1, 1, "none"), (4, 1, 1, "full"), (4, 1, 2, "none")]
    row = next(r for r in rows if (r["tensor_parallel"], r["data_parallel"],
                                   r["microbatch_size"], r["recompute"]) == (8, 2, 2, "full"))
    costs = model_costs_for("gpt3-175b", "dgx-a100", 16, microbatch_size=2, recompute="full",
                            tensor_parallel=8, data_parallel=2)
    single = evaluate(generate("1f1b", devices=8, microbatches=16), costs,
                      grad_sync="replicas")
    assert row["simulation_makespan_s"] == single.makespan
    assert row["gpus"] == 8 * 8 * 2 == single.throughput.gpus
    assert row["simulation_mfu"] == single.throughput.mfu
    assert row["simulation_tokens_per_s"] == single.throughput.tokens_per_s
    assert row["simulation_model_tflops_per_gpu"] == single.throughput.model_flops_per_gpu / 1e12
    assert row["parallel"] == {"data_parallel": 2, "tensor_parallel": 8}
    assert row["contention"] == "link" and row["optimizer_step"] is True


def test_every_execution_field_is_a_column_and_reads_back(tmp_path):
    from tabsched.execution import FIELDS
    from tabsched.sweeps import SweepResult, row_execution, sweep
    rows = sweep(["1f1b", "chimera"], [3, 4], [8], models=["gpt3-175b"],
                 systems=["dgx-a100", "dgx-h100"], tensor_parallel=8,
                 recompute=["selective", "full"], parallel={"sequence_parallel": True})
    assert set(FIELDS) <= set(COLUMNS)
    path = tmp_path / "s.csv"
    path.write_text(rows.to_csv())
    back = SweepResult(read_sweep_csv(path))
    assert back.to_csv() == rows.to_csv()
    for live, read in zip(rows, back):
        assert row_execution(live) == row_execution(read)
        assert all(live[name] == read[name] for name in FIELDS)
    ok = next(r for r in rows if r["status"] == "ok" and r["recompute"] == "full")
    costs = model_costs_for("gpt3-175b", ok["system"], 8, recompute="full", tensor_parallel=8,
                            sequence_parallel=True)
    assert row_execution(ok) == costs.execution
    # a skipped row says what it asked for: merged CSVs can be told apart row by row
    skipped = [r for r in rows if r["status"] == "skipped"]
    assert {r["recompute"] for r in skipped} == {"selective", "full"}
    assert all(r["tensor_parallel"] == 8 and r["sequence_parallel"] is True for r in skipped)
    assert skipped[0]["gpus"] == 8 * skipped[0]["devices"]


def test_a_row_of_an_older_csv_keeps_the_default_execution(tmp_path):
    from tabsched.execution import Execution
    from tabsched.sweeps import row_execution
    path = tmp_path / "old.csv"
    path.write_text("spec,devices,microbatches,system,simulation_makespan_s,microbatch_size\n"
                    "1f1b,4,8,mid_nw_mid_cp,1.5,2\n")
    rows = read_sweep_csv(path)
    assert row_execution(rows[0]) == Execution(microbatch_size=2)
    assert rows_to_csv(rows).splitlines()[1].startswith("1f1b,,,4,8,,mid_nw_mid_cp,,2,")
    assert row_execution({"grad_sync": "0,3"}).grad_sync == (0, 3)
    with pytest.raises(InvalidParameterError, match=r"^sweep row: grad_sync 'x' is not "
                                                    r"'replicas', 'all' or stages such as 0,3$"):
        row_execution({"grad_sync": "x"})
    with pytest.raises(InvalidParameterError, match=r"^sweep row: tensor_parallel must be an "
                                                    r"integer >= 1, not 0"):
        row_execution({"tensor_parallel": 0})


def test_the_global_batch_counts_every_replica_and_may_give_the_microbatches():
    from tabsched.sweeps import sweep
    rows = sweep(["1f1b"], [8], [16, 24], models=["gpt3-175b"], systems=["dgx-a100"],
                 global_batch=64, tensor_parallel=8, data_parallel=[1, 2])
    assert [(r["data_parallel"], r["microbatches"], r["microbatch_size"], r["status"])
            for r in rows] == [(1, 16, 4, "ok"), (2, 16, 2, "ok"), (1, 24, None, "skipped"),
                               (2, 24, None, "skipped")]
    assert rows[3]["reason"] == ("global batch 64 does not split into 24 microbatches of whole "
                                 "samples on each of 2 data-parallel replicas")
    assert rows[0]["global_batch"] == rows[1]["global_batch"] == 64
    assert rows[1]["simulation_tokens_per_s"] * rows[1]["simulation_makespan_s"] == \
        pytest.approx(64 * 2048)
    derived = sweep(["1f1b"], [8], models=["gpt3-175b"], systems=["dgx-a100"],
                    global_batch=48, microbatch_size=[1, 2, 4], tensor_parallel=8,
                    data_parallel=[1, 8])
    assert [(r["data_parallel"], r["microbatch_size"], r["microbatches"], r["status"])
            for r in derived] == [(1, 1, 48, "ok"), (1, 2, 24, "ok"), (1, 4, 12, "ok"),
                                  (8, 1, 6, "ok"), (8, 2, 3, "ok"), (8, 4, None, "skipped")]
    assert derived[-1]["reason"] == ("global batch 48 does not split into microbatches of 4 "
                                     "samples on each of 8 data-parallel replicas")
    assert derived[-1]["global_batch"] == 48 and derived[-1]["tensor_parallel"] == 8


def test_an_executions_global_batch_is_the_same_global_batch():
    from tabsched.execution import Execution
    from tabsched.sweeps import sweep
    file = Execution(data_parallel=2, global_batch=64, microbatch_size=1)
    by_file = sweep(["1f1b"], [8], [16, 32], models=["gpt3-175b"], systems=["dgx-a100"],
                    tensor_parallel=8, execution=file)
    by_flag = sweep(["1f1b"], [8], [16, 32], models=["gpt3-175b"], systems=["dgx-a100"],
                    tensor_parallel=8, data_parallel=2, global_batch=64)
    assert [r["microbatch_size"] for r in by_file] == [2, 1]
    assert [r["simulation_makespan_s"] for r in by_file] == \
        [r["simulation_makespan_s"] for r in by_flag]
    override = sweep(["1f1b"], [8], [16], models=["gpt3-175b"], systems=["dgx-a100"],
                     tensor_parallel=8, execution=file, global_batch=128)
    assert override[0]["microbatch_size"] == 4 and override[0]["global_batch"] == 128
    derived = sweep(["1f1b"], [8], models=["gpt3-175b"], systems=["dgx-a100"],
                    tensor_parallel=8, execution=file)
    assert derived[0]["microbatches"] == 32


def test_a_configuration_over_the_devices_memory_says_by_how_much():
    from tabsched.sweeps import sweep
    rows = sweep(["gpipe", "1f1b"], [8], [64], models=["gpt3-175b"], systems=["dgx-a100"],
                 tensor_parallel=8)
    gpipe, one = rows
    assert gpipe["memory_capacity_bytes"] == one["memory_capacity_bytes"] == 80e9
    assert gpipe["simulation_fits"] is False and one["simulation_fits"] is True
    assert gpipe["simulation_over_capacity_bytes"] == gpipe["simulation_peak_memory_bytes"] - 80e9
    assert one["simulation_over_capacity_bytes"] == 0.0


@pytest.mark.parametrize("keywords,message", [
    ({"tensor_parallel": [4], "parallel": {"tensor_parallel": 8}},
     r"sweep: tensor_parallel is given twice \(as a keyword and in parallel\)"),
    ({"microbatches": []}, r"sweep: microbatches is empty"),
    ({"microbatches": None},
     r"sweep: give microbatches, or a global batch and a microbatch size \(each replica then "
     r"runs global batch / \(data_parallel x microbatch size\)\)"),
    ({"global_batch": 64, "microbatch_size": 2},
     r"sweep: give two of microbatches, microbatch_size and global_batch 64: the third "
     r"follows \(global batch = data_parallel x microbatches x microbatch size\)"),
    ({"data_parallel": []}, r"sweep: data_parallel is empty"),
    ({"recompute": ["none", "fulll"]},
     r"sweep: recompute 'fulll' is not one of none, selective, full"),
    ({"microbatch_size": [1, 0]}, r"sweep: microbatch_size must be integers >= 1, not 0"),
    ({"tensor_parallel": ["8"]}, r"sweep: tensor_parallel must be integers >= 1, not '8'"),
])
def test_bad_axes_are_one_line(keywords, message):
    keywords = {"microbatches": [8], **keywords}
    with pytest.raises(InvalidParameterError, match=f"^{message}$"):
        grid_tasks(["1f1b"], [4], keywords.pop("microbatches"), systems=("mid_nw_mid_cp",),
                   **keywords)


def test_a_system_that_states_no_memory_leaves_the_memory_columns_empty(tmp_path):
    from tabsched.costs._presets import preset_index
    from tabsched.sweeps import sweep
    text = preset_index()["system"]["mid_nw_mid_cp"]
    path = tmp_path / "no-memory.toml"
    path.write_text("\n".join(line for line in text.splitlines()
                              if not line.startswith("memory_capacity")) + "\n")
    rows = sweep(["1f1b"], [4], [8], systems=[str(path)])
    assert rows[0]["status"] == "ok" and rows[0]["memory_capacity_bytes"] is None
    assert rows[0]["simulation_fits"] is None and rows[0]["simulation_over_capacity_bytes"] is None
    assert rows[0]["simulation_mfu"] > 0


@pytest.mark.parametrize("arguments, message", [
    (([2], [4.5]), "sweep: microbatches must be integers >= 1, not 4.5"),
    (([2], 4.5), "sweep: microbatches must be integers >= 1, not 4.5"),
    ((["2"], [4]), "sweep: devices must be integers >= 1, not '2'"),
    (([2.0], [4]), "sweep: devices must be integers >= 1, not 2.0"),
    (([2], [True]), "sweep: microbatches must be integers >= 1, not True"),
    (([], [4]), "sweep: devices is empty"),
])
def test_sweep_refuses_what_is_not_a_whole_count(arguments, message):
    """4.5 microbatches used to run 4: a count that is not an integer is refused by name."""
    from tabsched.sweeps import sweep
    with pytest.raises(InvalidParameterError, match=re.escape(message)):
        sweep(["1f1b"], *arguments, systems=["dgx-a100"])


def test_sweep_refuses_a_global_batch_or_microbatch_size_that_is_not_whole():
    from tabsched.sweeps import sweep
    with pytest.raises(InvalidParameterError, match=re.escape(
            "sweep: global_batch must be an integer >= 1, not 8.0")):
        sweep(["1f1b"], [2], [4], global_batch=8.0, systems=["dgx-a100"])
    with pytest.raises(InvalidParameterError, match=re.escape(
            "sweep: microbatch_size must be integers >= 1, not 2.5")):
        sweep(["1f1b"], [2], models=["gpt3-175b"], systems=["dgx-a100"], global_batch=8,
              microbatch_size=2.5)
    # one integer for a list is that list
    assert len(sweep(["1f1b"], 2, 4, systems=["dgx-a100"])) == 1


def test_the_columns_of_earlier_releases_keep_their_positions():
    """Merged CSVs line up: the columns a sweep CSV had before this round's execution fields
    (p2p, post_validation, reshard_after_forward, prefetch) and the steady period keep
    their places, and the new ones come after them."""
    from tabsched.sweeps import COLUMNS
    earlier = COLUMNS[:COLUMNS.index("simulation_hfu") + 1]
    assert "optimizer_step" in earlier and earlier.index("blocking_sends") + 1 == \
        earlier.index("overlap_grad_reduce")
    assert not {"p2p", "post_validation", "reshard_after_forward", "prefetch"} & set(earlier)


def test_a_sweep_reprs_in_one_line_and_shows_a_table_in_a_notebook(small_grid):
    rows = SweepResult(run_sweep(small_grid))   # what tabsched.sweep returns
    text = repr(rows)
    assert "\n" not in text and len(text) < 400, text[:400]
    assert text.startswith(f"<SweepResult {len(rows)} rows ({len(rows.ok)} ok, ")
    assert "fastest " in text and text.endswith("s>")
    page = rows._repr_html_()
    assert page.count("<tr>") == len(rows) + 1 and "<th>iteration</th>" in page
    from tabsched._html import MAX_SWEEP_ROWS
    many = SweepResult(list(rows) * (MAX_SWEEP_ROWS // len(rows) + 2))
    assert many._repr_html_().count("<tr>") == MAX_SWEEP_ROWS + 1
    assert "more rows" in many._repr_html_()
    assert repr(SweepResult()) == "<SweepResult: no rows>"
