"""Bucketed gradient reduction overlapping the backward (tabsched.costs.buckets), as the
sync nodes of an overlapped data-parallel reduction price it."""

import math

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from tabsched import ModelCosts, evaluate, generate
from tabsched.cli import cli
from tabsched.costs.buckets import bucket_layout, default_bucket_parameters, exposed_reduction
from tabsched.exceptions import InvalidParameterError
from tabsched.execution import Execution
from tabsched.lower import lower
from tabsched.nodes import SYNC


def queue_oracle(parameters, bucket, backward, collective_time, slowdown):
    """The queue bucket by bucket: bucket j ready when the backward has produced its
    last gradient, started when ready and the previous one is done."""
    done, total, j, start = 0.0, 0.0, 0, 0.0
    while start < parameters:
        size = min(bucket, parameters - start)
        ready = backward * (start + size) / parameters
        seconds = collective_time(size)
        done = max(done, ready) + seconds
        total += seconds
        start += size
        j += 1
    tail = done - backward
    return tail + (total - tail) * slowdown / (1 + slowdown)


def affine(latency, per_parameter):
    return lambda parameters: latency + per_parameter * parameters


@given(st.integers(1, 10**6), st.integers(1, 10**6), st.floats(0, 10.0),
       st.floats(0, 1e-3), st.floats(1e-12, 1e-6), st.sampled_from([0.0, 0.189, 1.0]))
def test_closed_form_is_the_queue(parameters, bucket, backward, latency, per_parameter,
                                  slowdown):
    if parameters / bucket > 5000:      # the oracle walks the buckets
        bucket = math.ceil(parameters / 5000)
    time = affine(latency, per_parameter)
    got = exposed_reduction(float(parameters), bucket, backward, time, slowdown)
    want = queue_oracle(float(parameters), bucket, backward, time, slowdown)
    # the oracle's done - backward loses about backward * 2**-52 to rounding
    assert got == pytest.approx(want, rel=1e-9, abs=1e-14 * max(1.0, backward))


@given(st.integers(1, 10**7), st.integers(1, 10**7), st.floats(0, 10.0),
       st.floats(0, 1e-3), st.floats(1e-12, 1e-6), st.sampled_from([0.0, 0.189]))
def test_between_the_last_bucket_and_the_whole_reduction(parameters, bucket, backward,
                                                         latency, per_parameter, slowdown):
    time = affine(latency, per_parameter)
    n, last = bucket_layout(parameters, bucket)
    total = (n - 1) * time(bucket) + time(last)
    got = exposed_reduction(float(parameters), bucket, backward, time, slowdown)
    assert time(last) * (1 - 1e-9) <= got <= total * (1 + 1e-9)


@given(st.integers(1, 10**7), st.integers(1, 10**7), st.floats(0, 5.0), st.floats(0, 5.0),
       st.floats(0, 1e-3), st.floats(1e-12, 1e-6))
def test_a_longer_backward_hides_more(parameters, bucket, shorter, longer, latency,
                                      per_parameter):
    shorter, longer = sorted((shorter, longer))
    time = affine(latency, per_parameter)
    assert (exposed_reduction(float(parameters), bucket, longer, time)
            <= exposed_reduction(float(parameters), bucket, shorter, time) * (1 + 1e-12))


def test_one_bucket_is_the_whole_collective_and_no_parameters_nothing():
    time = affine(1e-5, 1e-9)
    assert exposed_reduction(1e6, 10**7, 3.0, time, 0.189) == time(1e6)
    assert exposed_reduction(0.0, 10, 3.0, time) == 0.0


def test_a_trillion_buckets_cost_no_more_time_to_price():
    # O(1) in the number of buckets: 10**12 buckets of one parameter
    seconds = exposed_reduction(1e12, 1, 1.0, affine(1e-6, 0.0))
    assert seconds == pytest.approx(1e12 * 1e-6 - (1.0 - 1e-12), rel=1e-9)


def test_megatron_default_bucket():
    # megatron/core/distributed/distributed_data_parallel_config.py: max(4e7, 1e6 * dp)
    assert default_bucket_parameters(1) == 40_000_000
    assert default_bucket_parameters(40) == 40_000_000
    assert default_bucket_parameters(64) == 64_000_000


# ------------------------------------------------------------------ in the cost model
def _sync_seconds(execution, model="llama3-8b", system="dgx-a100", p=1, m=4):
    costs = ModelCosts(model, system, execution)
    table = generate("1f1b", devices=p, microbatches=m)
    lowered = lower(table, grad_sync=costs.execution.default_grad_sync)
    return costs, table, np.asarray(costs.node_prices(lowered, SYNC))


def test_p1_exposes_only_the_tail():
    run = Execution(data_parallel=8, overlap_grad_reduce=True)
    costs, table, default = _sync_seconds(run)
    whole = costs._data_parallel_time("all_reduce", costs._stage_parameters(table)[0]
                                      * costs.model.grad_bytes)
    one = _sync_seconds(run.replace(grad_bucket_size=10**14))[2]
    assert one[0] == pytest.approx(whole, rel=1e-12)      # one bucket: as before bucketing
    assert default[0] < 0.5 * whole                        # 40M-parameter buckets: the tail
    last = bucket_layout(costs._stage_parameters(table)[0], 40_000_000)[1]
    assert default[0] >= costs._data_parallel_time("all_reduce", last * costs.model.grad_bytes)


def test_makespan_falls_from_one_bucket_to_megatrons():
    table = generate("1f1b", devices=1, microbatches=4)
    run = Execution(data_parallel=8, overlap_grad_reduce=True)
    spans = [evaluate(table, ModelCosts("llama3-8b", "dgx-a100", run.replace(
        grad_bucket_size=size))).makespan for size in (10**14, None)]
    assert spans[1] < spans[0]


def test_distributed_optimizer_reduce_scatters_each_bucket():
    run = Execution(data_parallel=8, overlap_grad_reduce=True)
    ddp = _sync_seconds(run.replace(grad_bucket_size=10**14))
    zero1 = _sync_seconds(run.replace(zero_stage=1, grad_bucket_size=10**14))
    costs, table = ddp[0], ddp[1]
    nbytes = costs._stage_parameters(table)[0] * costs.model.grad_bytes
    assert zero1[2][0] == pytest.approx(costs._data_parallel_time("reduce_scatter", nbytes))


def test_grad_bucket_size_is_validated_and_kept():
    for bad in (0, -1, 2.5, True, "40M", 2**51):
        with pytest.raises(InvalidParameterError, match="grad_bucket_size"):
            Execution(grad_bucket_size=bad)
    run = Execution(data_parallel=2, overlap_grad_reduce=True, grad_bucket_size=6553600)
    assert "grad_bucket_size = 6553600" in run.to_toml()
    assert Execution.from_dict(run.to_dict()) == run


def test_cli_refuses_a_bucket_without_the_overlap_and_a_bad_size():
    runner = CliRunner()
    base = ["eval", "1f1b", "-p", "2", "-m", "4", "--model", "llama3-8b", "--system",
            "dgx-a100", "-d", "2"]
    for extra, words in ((["--grad-bucket-size", "5"], "applies to the overlapped"),
                         (["--no-align-grad-reduce"], "--no-align-grad-reduce applies"),
                         (["--overlap-grad-reduce", "--grad-bucket-size", "0"],
                          "--grad-bucket-size must be a positive integer")):
        result = runner.invoke(cli, base + extra)
        assert result.exit_code == 1, result.output
        assert words in result.output and "Traceback" not in result.output
        assert len(result.output.strip().splitlines()) == 1
    result = runner.invoke(cli, base + ["--overlap-grad-reduce", "--grad-bucket-size",
                                         "6553600", "--json"])
    assert result.exit_code == 0, result.output
    assert '"grad_bucket_size": 6553600' in result.output


def test_aligned_later_ranks_reduce_whole_after_their_backward():
    run = Execution(tensor_parallel=8, data_parallel=4, overlap_grad_reduce=True)
    costs, table, aligned = _sync_seconds(run, "gpt3-175b", p=4, m=8)
    free = _sync_seconds(run.replace(align_grad_reduce=False), "gpt3-175b", p=4, m=8)[2]
    whole = [costs._data_parallel_time("all_reduce", parameters * costs.model.grad_bytes)
             for parameters in costs._stage_parameters(table) / 8]
    # the first pipeline rank overlaps its buckets with its last backward either way
    assert aligned[0] == free[0] < whole[0]
    # the others launch theirs after it (Megatron-Core's default) or as they fill (DDP)
    assert aligned[1:] == pytest.approx(whole[1:], rel=1e-12)
    assert all(free[1:] < aligned[1:])


def test_megatron_and_eval_lines_carry_the_bucket_options():
    from tabsched.megatron import execution_arguments
    run = Execution(data_parallel=2, overlap_grad_reduce=True, grad_bucket_size=1000,
                    align_grad_reduce=False)
    arguments = dict(execution_arguments(run))
    assert arguments["--ddp-bucket-size"] == 1000 and "--no-align-grad-reduce" in arguments


def test_a_sweep_csv_gives_the_bucket_fields_and_prefetch_back(tmp_path):
    # prefetch came back as 2.0 and was refused before it was read as an integer column
    from tabsched.sweeps import read_sweep_csv, row_execution, rows_to_csv, sweep
    run = Execution(data_parallel=2, overlap_grad_reduce=True, grad_bucket_size=1_000_000,
                    align_grad_reduce=False, zero_stage=3, prefetch=2)
    rows = sweep(["1f1b"], [2], [4], models=["llama3-8b"], systems=["dgx-a100"],
                 execution=run)
    path = tmp_path / "sweep.csv"
    path.write_text(rows_to_csv(rows))
    back = row_execution(read_sweep_csv(str(path))[0])
    assert back == row_execution(rows[0])
    assert (back.prefetch, back.grad_bucket_size, back.align_grad_reduce) == (2, 1_000_000, False)
