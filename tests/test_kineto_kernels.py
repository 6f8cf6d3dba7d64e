"""GPU time per range from a Kineto trace's kernels (tabsched.formats.kineto_kernels).

The traces here are written by :func:`gpu_trace` in the layout PyTorch's profiler writes
on a GPU (ranges as ``user_annotation`` on the CPU threads, launch calls as
``cuda_runtime`` with a correlation id, kernels as ``kernel`` events with a stream and the
same id), the layout of the public DeepSeek profile (deepseek-ai/profile-data, train.json,
which has no licence file, so it is not shipped): CI has no GPU to profile.
"""

import gzip
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tabsched import InvalidParameterError, evaluate, generate
from tabsched.costs import StageCosts
from tabsched.formats.kineto_kernels import (is_communication_kernel, kernel_profile,
                                             read_kernel_trace)

MAIN, AUTOGRAD = 1, 2          # the threads: the schedule's, autograd's device thread


class Trace:
    """Builds one rank's GPU trace: ranges, launches and kernels, times in microseconds."""

    def __init__(self):
        self.events = []
        self.correlation = 0

    def range(self, name, start, end, tid=MAIN):
        self.events.append({"ph": "X", "cat": "user_annotation", "name": name, "ts": start,
                            "dur": end - start, "pid": 10, "tid": tid})

    def kernel(self, name, launch, start, duration, stream=7, tid=MAIN, launched=True):
        self.correlation += 1
        if launched:
            self.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel",
                                "ts": launch, "dur": 2, "pid": 10, "tid": tid,
                                "args": {"correlation": self.correlation}})
        self.events.append({"ph": "X", "cat": "kernel", "name": name, "ts": start,
                            "dur": duration, "pid": 0, "tid": stream,
                            "args": {"stream": stream, "correlation": self.correlation}})

    def document(self):
        return {"traceEvents": list(self.events)}


def gpu_trace(table, rank, *, compute=100, nccl=30):
    """A rank's row of ``table`` as a GPU run: each operation one ``PP:`` range with two
    compute kernels (``compute`` us each) and, after a forward, an NCCL send kernel on a
    communication stream; backwards launched from autograd's thread, as PyTorch runs
    them. Returns the trace and ``{label: expected compute seconds}``."""
    trace, expected = Trace(), {}
    clock = 0.0
    for op in table.orders()[rank]:
        label = str(op)
        tid = AUTOGRAD if op.kind != "F" else MAIN
        trace.range(f"PP:{label}", clock, clock + 3 * compute)
        for part in range(2):
            trace.kernel(f"sm90_xmma_gemm_{part}", clock + 5 + part, clock + 10 + part * compute,
                         compute, tid=tid)
        if op.kind == "F":
            trace.kernel("ncclDevKernel_SendRecv(ncclDevComm*)", clock + 8,
                         clock + 10 + 2 * compute, nccl, stream=20)
        expected[label] = 2 * compute / 1e6
        clock += 3 * compute + 20
    return trace, expected


def test_each_operation_gets_the_kernels_it_launched():
    table = generate("1f1b", devices=2, microbatches=4)
    trace, expected = gpu_trace(table, 1)
    profile = kernel_profile(trace.document())
    measured = profile.measurements()
    assert set(measured) == set(expected)
    for label, seconds in expected.items():
        assert measured[label] == [pytest.approx(seconds)]
    forwards = [item for item in profile.ranges if "F" in item.label]
    assert all(item.communication == pytest.approx(30e-6) for item in forwards)
    assert profile.unmatched == 0
    streams = {stream.stream: stream for stream in profile.streams}
    assert streams[20].is_communication and not streams[7].is_communication
    assert streams[7].kernels == 2 * len(expected)


def test_the_measurements_replay_as_the_tables_durations(tmp_path, cli):
    table = generate("1f1b", devices=2, microbatches=4)
    traces = tmp_path / "traces"
    traces.mkdir()
    for rank in range(2):
        trace, _ = gpu_trace(table, rank, compute=100 + 50 * rank)
        (traces / f"rank{rank}.json").write_text(json.dumps(trace.document()))
    code, out, err = cli("convert", "1f1b", "-p", "2", "-m", "4", str(tmp_path / "t.csv"))
    assert code == 0, err
    code, out, err = cli("profile", str(traces), "-o", str(tmp_path / "m.csv"))
    assert code == 0, err
    assert "unmatched kernels 0" in out
    rows = (tmp_path / "m.csv").read_text().splitlines()
    assert rows[0] == "op,duration" and len(rows) == 1 + 2 * 4 * 2
    code, out, err = cli("eval", str(tmp_path / "t.csv"), "--replay", str(tmp_path / "m.csv"),
                         "--json")
    assert code == 0, err
    # the replay is the table at the measured durations: rank r's operations take two
    # kernels of 100 + 50 r us each, whatever their kind
    replayed = json.loads(out)["monte_carlo"]
    at_stage_costs = evaluate(table, StageCosts(forward=[200e-6, 300e-6],
                                                backward=[200e-6, 300e-6], comm=0.0)).makespan
    assert replayed["mean_makespan"] == pytest.approx(at_stage_costs)
    assert replayed["std_makespan"] == pytest.approx(0.0, abs=1e-12)


def test_an_enclosing_range_keeps_only_the_kernels_no_inner_range_claims():
    trace = Trace()
    trace.range("ProfilerStep#1", 0, 1000)
    trace.range("attn(F)", 10, 400)
    trace.kernel("flash_fwd", 20, 30, 300)
    trace.kernel("optimizer_step", 500, 600, 50)       # in the step, in no inner range
    trace.kernel("late", 2000, 2100, 10)               # in no range at all
    trace.kernel("lost", 0, 0, 10, launched=False)     # its launch is not in the trace
    profile = kernel_profile(trace.document())
    assert profile.measurements() == {"attn(F)": [pytest.approx(300e-6)],
                                      "ProfilerStep#1": [pytest.approx(50e-6)]}
    assert profile.unmatched == 2 and profile.unmatched_seconds == pytest.approx(20e-6)


def test_communication_kernels_are_recognised_by_name():
    for name in ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "ncclKernel_SendRecv",
                 "void dpsk::ep::internode::dispatch<false, 8, true, 8>(int4*)",
                 "deep_ep::intranode::combine", "cross_device_reduce_1stage"):
        assert is_communication_kernel(name) == ("cross_device" not in name), name
    for name in ("sm90_xmma_gemm_bf16bf16", "flash::compute_attn_ws", "layer_norm::ln_fwd",
                 "void at::native::reduce_kernel<512, 1>"):
        assert not is_communication_kernel(name), name


@st.composite
def nested_ranges(draw):
    """Properly nested ranges on one thread, and launch moments, in integer microseconds."""
    ranges = []

    def build(start, end, depth):
        cursor = start
        while cursor < end - 2 and depth < 4 and draw(st.booleans()):
            a = draw(st.integers(cursor, end - 2))
            b = draw(st.integers(a + 1, end))
            ranges.append((a, b))
            build(a, b, depth + 1)
            cursor = b
    build(0, 1000, 0)
    moments = draw(st.lists(st.integers(0, 1000), min_size=1, max_size=20))
    return ranges, moments


@settings(deadline=None)
@given(nested_ranges())
def test_each_kernel_goes_to_the_innermost_range_around_its_launch(case):
    """The sweep's answer equals the brute-force one: of the ranges that contain the
    launch, the one that starts last (the shortest among equal starts)."""
    ranges, moments = case
    trace = Trace()
    for number, (start, end) in enumerate(ranges):
        trace.range(f"r{number}", start, end)
    for moment in moments:
        trace.kernel("k", moment, 5000 + moment, 1)
    if not ranges:
        with pytest.raises(InvalidParameterError):
            kernel_profile(trace.document())
        return
    expected = {}
    for moment in moments:
        inside = [(start, -end, number) for number, (start, end) in enumerate(ranges)
                  if start <= moment < end]
        if inside:
            owner = f"r{max(inside)[2]}"
            expected[owner] = expected.get(owner, 0) + 1
    if not expected:
        with pytest.raises(InvalidParameterError):
            kernel_profile(trace.document())
        return
    profile = kernel_profile(trace.document())
    assert {label: len(values) and sum(item.kernels for item in profile.ranges
                                       if item.label == label)
            for label, values in profile.measurements().items()} == expected
    assert profile.unmatched == len(moments) - sum(expected.values())


def test_gzipped_files_and_directories(tmp_path):
    table = generate("gpipe", devices=2, microbatches=2)
    trace, expected = gpu_trace(table, 0)
    path = tmp_path / "rank0.json.gz"
    with gzip.open(path, "wt") as handle:
        json.dump(trace.document(), handle)
    assert set(read_kernel_trace(str(tmp_path)).measurements()) == set(expected)


@pytest.mark.parametrize("document,message", [
    ({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": "soon", "dur": 1}]},
     "'ts' must be a finite number"),
    ({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 0, "dur": -1}]},
     "'dur' must be >= 0"),
    ({"traceEvents": [{"ph": "X", "cat": "kernel", "name": 5, "ts": 0, "dur": 1}]},
     "'name' must be a string"),
    ({"traceEvents": [{"ph": "X", "cat": "user_annotation", "name": "PP:nonsense",
                       "ts": 0, "dur": 1}]}, "not an action of PyTorch's pipelining"),
    ({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0,
                       "dur": 1}]}, "no GPU kernels"),
    ({"events": []}, "no traceEvents list"),
])
def test_bad_traces_are_refused_by_file_and_event(document, message):
    with pytest.raises(InvalidParameterError, match=message):
        kernel_profile(document, sources=["t.json"])


def test_the_cli_refuses_in_one_line(tmp_path, cli):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    code, out, err = cli("profile", str(bad))
    assert code == 1 and err.startswith("Error: ") and err.count("\n") == 1
    assert "not JSON" in err
    trace, _ = gpu_trace(generate("gpipe", devices=2, microbatches=2), 0)
    good = tmp_path / "good.json"
    good.write_text(json.dumps(trace.document()))
    code, _, err = cli("profile", str(good), "-o", str(good))
    assert code == 1 and "Error: " in err
    assert json.loads(good.read_text())["traceEvents"]      # the input is intact
    code, out, err = cli("profile", str(good), "--json")
    assert code == 0 and json.loads(out)["unmatched_kernels"] == 0
