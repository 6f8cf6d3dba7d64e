"""The profiler-trace reader: PyTorch's ``PP:`` events as durations, and every bad input refused.

These traces are written by hand, event by event, to pin the mapping down; the
execution tests (tests/test_torch_execution.py) read real ones.
"""

import gzip
import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tabsched import (InvalidParameterError, ScheduleTable, UnitCosts, generate, read_kineto)
from tabsched.adapt import Replay, monte_carlo
from tabsched.formats.kineto import profile_from_trace, trace_files, unmatched_labels


def span(name, ts, dur, *, tid=1, cat="user_annotation"):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 7, "tid": tid}


def trace(*events):
    return {"traceEvents": [{"ph": "M", "name": "process_name", "pid": 7, "tid": 0,
                             "args": {"name": "python"}}] + list(events)}


def write(path, document):
    path.write_text(json.dumps(document))
    return path


def seconds(values):
    return [pytest.approx(value * 1e-6) for value in values]


# ------------------------------------------------------------------ mapping
RUN = trace(
    # iteration 0: UNSHARD opens it, a SEND follows 0F0, REDUCE_GRAD closes it
    span("PP:0UNSHARD", 0, 1), span("PP:0F0", 1, 10), span("aten::linear", 2, 5),
    span("PP:0SEND_F0", 11, 1), span("PP:0F1", 12, 12), span("PP:0REDUCE_GRAD", 30, 1),
    # iteration 1: a RECV between two operations counts for the one before it
    span("PP:1RECV_B0", 99, 2), span("PP:0F0", 101, 14), span("PP:1RECV_B1", 115, 4),
    span("PP:0F1", 119, 10))


def test_operations_become_labels_and_other_actions_count_for_the_operation_before():
    profile = profile_from_trace(RUN)
    assert profile.measurements == {"0F0": seconds([11, 18]), "0F1": seconds([13, 10])}
    assert profile.skipped == {"UNSHARD": 1, "SEND_F": 1, "REDUCE_GRAD": 1, "RECV_B": 2}
    assert profile.attached == pytest.approx(6e-6)  # SEND_F0, REDUCE_GRAD, RECV_B1
    assert profile.unattached == pytest.approx(3e-6)  # UNSHARD, RECV_B0: iteration starts
    assert profile.origins == {"0F0": ("<trace>", 2), "0F1": ("<trace>", 5)}
    assert profile.timelines == {"<trace>": "cpu"} and profile.waited == 0


def test_operations_can_keep_their_own_time_only():
    profile = profile_from_trace(RUN, attach_actions=False)
    assert profile.measurements == {"0F0": seconds([10, 14]), "0F1": seconds([12, 10])}
    assert profile.attached == 0 and profile.unattached == 0


def test_the_wait_for_an_input_is_not_compute():
    # 1RECV_F0 posts a gloo recv that completes at 50; 1F0 starts at 10, blocks
    # until 50, then computes (nested ops 50..75) until 80.
    profile = profile_from_trace(trace(
        span("PP:1RECV_F0", 0, 5), span("gloo:recv", 2, 48),
        span("PP:1F0", 10, 70), span("aten::linear", 51, 20), span("aten::add", 72, 3)))
    assert profile.measurements == {"1F0": seconds([30])}
    assert profile.waited == pytest.approx(40e-6)
    assert profile.skipped == {"RECV_F": 1}


def test_an_input_that_arrived_before_the_operation_costs_no_wait():
    profile = profile_from_trace(trace(
        span("PP:1RECV_B0", 0, 5), span("gloo:recv", 2, 3), span("PP:1B0", 10, 30),
        span("aten::mm", 11, 25)))
    assert profile.measurements == {"1B0": seconds([30])} and profile.waited == 0


def test_an_input_that_arrived_while_the_operation_computed_costs_no_wait():
    profile = profile_from_trace(trace(
        span("PP:1RECV_F0", 0, 5), span("gloo:recv", 2, 28), span("PP:1F0", 10, 40),
        span("aten::linear", 11, 38)))
    assert profile.measurements == {"1F0": seconds([40])} and profile.waited == 0


def test_each_operation_waits_for_its_own_latest_receive():
    # two iterations: the second 1F0 waits for the second RECV, not the first
    profile = profile_from_trace(trace(
        span("PP:1RECV_F0", 0, 5), span("gloo:recv", 1, 19), span("PP:1F0", 10, 30),
        span("PP:1RECV_F0", 100, 5), span("gloo:recv", 101, 39), span("PP:1F0", 110, 50)))
    assert profile.measurements == {"1F0": seconds([20, 20])}


def test_an_overlapped_step_is_split_by_stand_alone_times_and_its_inner_wait_removed():
    # (0F1;3B0): the forward runs 10..30, the backward waits for RECV_B of 3B0
    # until 50, then runs 50..75. Stand-alone 0F0 takes 10 and 3B1 takes 30:
    # the 45 of compute split 1:3.
    profile = profile_from_trace(trace(
        span("PP:0F0", 0, 10), span("PP:3RECV_B0", 5, 2), span("gloo:recv", 6, 44),
        span("PP:(0F1;3B0)OVERLAP_F_B", 10, 65), span("aten::linear", 12, 18),
        span("autograd::engine::evaluate_function: AddmmBackward0", 50, 25),
        span("PP:3B1", 80, 30)), attach_actions=False)
    assert profile.waited == pytest.approx(20e-6)
    assert profile.measurements["0F1"] == seconds([45 / 4])
    assert profile.measurements["3B0"] == seconds([45 * 3 / 4])
    assert profile.notes == []


def test_an_overlapped_step_without_stand_alone_kin_on_its_stage_weighs_by_its_kind():
    # 2F0 and 1I0 weigh 0F1 and 3I0 (no stand-alone F on stage 0 or I on stage 3)
    profile = profile_from_trace(trace(span("PP:2F0", 0, 10), span("PP:1I0", 10, 30),
                                       span("PP:(0F1;3I0)OVERLAP_F_B", 40, 40),
                                       span("PP:(0F2;3I1)OVERLAP_F_B", 80, 80)))
    assert profile.measurements["0F1"] == seconds([10])
    assert profile.measurements["3I0"] == seconds([30])
    assert profile.measurements["0F2"] == seconds([20])
    assert profile.measurements["3I1"] == seconds([60])


def test_an_overlapped_step_without_stand_alone_kin_is_split_evenly_with_a_note():
    profile = profile_from_trace(trace(span("PP:(0F1;3I0)OVERLAP_F_B", 0, 40)))
    assert profile.measurements == {"0F1": seconds([20]), "3I0": seconds([20])}
    assert profile.notes == ["1 overlapped steps split evenly between their parts (no "
                             "stand-alone operation of the same kind to weigh them by)"]


def test_a_gpu_trace_is_read_from_its_gpu_annotations():
    profile = profile_from_trace(trace(
        span("PP:0F0", 0, 100), span("PP:0F0", 40, 20, tid=9, cat="gpu_user_annotation")))
    assert profile.measurements == {"0F0": seconds([20])}
    assert profile.timelines == {"<trace>": "gpu"}


def test_a_bare_event_list_is_a_trace_too():
    assert profile_from_trace([span("PP:0B0", 0, 3)]).measurements == {"0B0": seconds([3])}


def test_a_directory_holds_one_trace_per_rank(tmp_path):
    write(tmp_path / "rank0.pt.trace.json", trace(span("PP:0F0", 0, 4)))
    with gzip.open(tmp_path / "rank1.pt.trace.json.gz", "wt") as handle:
        json.dump(trace(span("PP:1F0", 0, 6)), handle)
    (tmp_path / "notes.txt").write_text("not a trace")
    assert [path.rsplit("/", 1)[1] for path in trace_files(tmp_path)] == [
        "rank0.pt.trace.json", "rank1.pt.trace.json.gz"]
    profile = read_kineto(tmp_path)
    assert profile.measurements == {"0F0": seconds([4]), "1F0": seconds([6])}
    assert profile.origins["1F0"][0].endswith("rank1.pt.trace.json.gz")


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize("content,message", [
    (b"\xff\xfe{}", r"byte 0 is not UTF-8 text; this is not a profiler trace"),
    (b'{"traceEvents": [', r"not JSON: Expecting value at line 1, column 18"),
    (b'{"traceEvents": [{"ph": "X", "ts": NaN}]}', r"NaN is not a number in a profiler trace"),
    (b"[" * 100000 + b"]" * 100000, r"not a profiler trace: JSON nested too deeply"),
    (b'"trace"', r"not a profiler trace: expected a JSON object with traceEvents"),
    (b'{"events": []}', r"not a profiler trace: no traceEvents list"),
    (b'{"traceEvents": [3]}', r"event 0: not an object"),
    (b'{"traceEvents": [{"ph": 1}]}', r"event 0: 'ph' must be a string, not 1"),
    (b'{"traceEvents": [{"ph": "X", "name": ["PP:0F0"]}]}',
     r"event 0: 'name' must be a string, not \[\"PP:0F0\"\]"),
    (b'{"traceEvents": [{"ph": "X", "name": "PP:0F0", "ts": "0", "dur": 1}]}',
     r"event 0 \(PP:0F0\): 'ts' must be a number, not \"0\""),
    (b'{"traceEvents": [{"ph": "X", "name": "PP:0F0", "ts": 0, "dur": true}]}',
     r"event 0 \(PP:0F0\): 'dur' must be a number, not true"),
    (b'{"traceEvents": [{"ph": "X", "name": "PP:0F0", "ts": 1e999, "dur": 1}]}',
     r"event 0 \(PP:0F0\): 'ts' must be finite, not inf"),
    (b'{"traceEvents": [{"ph": "X", "name": "PP:0F0", "ts": 0, "dur": -2}]}',
     r"event 0 \(PP:0F0\): 'dur' must be >= 0, not -2"),
    (b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 0, "dur": 1, "tid": [1]}]}',
     r"event 0 \(a\): 'tid' must be an integer or a string"),
    (b'{"traceEvents": [{"ph": "X", "name": "a", "cat": 5, "ts": 0, "dur": 1}]}',
     r"event 0 \(a\): 'cat' must be a string"),
    (b'{"traceEvents": [{"ph": "M", "name": "x"}, {"ph": "X", "cat": "user_annotation", '
     b'"name": "PP:0X0", "ts": 0, "dur": 1}]}',
     r"event 1: 'PP:0X0' is not an action of PyTorch's pipelining runtime \(expected "
     r"PP:<stage><F\|I\|B\|W><microbatch>"),
    ('{"traceEvents": [{"ph": "X", "cat": "user_annotation", "name": "PP:\u0660F\u0660", '
     '"ts": 0, "dur": 1}]}'.encode(), r"event 0: 'PP:\u0660F\u0660' is not an action"),
    (b'{"traceEvents": [{"ph": "X", "cat": "user_annotation", "name": "PP:0F12345678901", '
     b'"ts": 0, "dur": 1}]}', r"event 0: 'PP:0F12345678901' is not an action"),
    (b'{"traceEvents": [{"ph": "X", "cat": "user_annotation", "name": "PP:(0F0;1F0)OVERLAP_F_B",'
     b' "ts": 0, "dur": 1}]}', r"an overlapped step holds one forward and one backward"),
    (b'{"traceEvents": [{"ph": "X", "cat": "user_annotation", "name": "Forward 0", "ts": 0, '
     b'"dur": 1}]}', r"no pipeline operations \(PP:<stage><F\|I\|B\|W><microbatch> events\); "
                     r"profile a schedule that _PipelineScheduleRuntime runs"),
])
def test_bad_traces_are_one_line_errors_naming_the_file(tmp_path, content, message):
    path = tmp_path / "trace.json"
    path.write_bytes(content)
    with pytest.raises(InvalidParameterError, match=f"^{path}: .*{message}") as error:
        read_kineto(path)
    assert "\n" not in str(error.value)


def test_a_long_name_is_cut_in_the_message(tmp_path):
    path = write(tmp_path / "trace.json", trace(span("PP:" + "9" * 5000, 0, 1)))
    with pytest.raises(InvalidParameterError, match=r"'PP:9{57}\.\.\.' is not an action") as error:
        read_kineto(path)
    assert len(str(error.value)) < 500


def test_sizes_are_bounded_before_reading(tmp_path):
    path = write(tmp_path / "trace.json", trace(span("PP:0F0", 0, 1)))
    with pytest.raises(InvalidParameterError, match=r"trace.json: larger than 100 bytes "
                                                    r"\(max_bytes\)"):
        read_kineto(path, max_bytes=100)
    packed = tmp_path / "trace.json.gz"
    packed.write_bytes(gzip.compress(b" " * 10_000))  # 10 kB of spaces, 50 bytes packed
    with pytest.raises(InvalidParameterError, match=r"trace.json.gz: larger than 1000 bytes"):
        read_kineto(packed, max_bytes=1000)
    with pytest.raises(InvalidParameterError, match=r"max_bytes must be a positive integer, "
                                                    r"not 0"):
        read_kineto(path, max_bytes=0)


def test_unreadable_paths(tmp_path):
    with pytest.raises(InvalidParameterError, match=r"missing.json: cannot read: No such file"):
        read_kineto(tmp_path / "missing.json")
    (tmp_path / "broken.json.gz").write_bytes(b"not gzip")
    with pytest.raises(InvalidParameterError, match=r"broken.json.gz: cannot read: Not a "
                                                    r"gzipped file"):
        read_kineto(tmp_path / "broken.json.gz")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InvalidParameterError, match=r"empty: no trace files \(\*.json, "
                                                    r"\*.json.gz\) in this directory"):
        read_kineto(empty)


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=4), inner, max_size=4), max_leaves=12)
NAMES = st.sampled_from(["PP:0F0", "PP:1B0", "PP:(0F1;1B0)OVERLAP_F_B", "PP:1RECV_B0",
                         "PP:0SEND_F0", "PP:0UNSHARD", "PP:9X9", "gloo:recv", "aten::mm", ""])
EVENTS = st.fixed_dictionaries(
    {"ph": st.sampled_from(["X", "M", "i"]) | JSON},
    optional={"name": NAMES | JSON, "cat": st.sampled_from(["user_annotation",
                                                            "gpu_user_annotation"]) | JSON,
              "ts": st.integers(0, 100) | st.floats() | JSON,
              "dur": st.integers(0, 100) | st.floats() | JSON,
              "tid": st.integers(0, 2) | JSON, "pid": st.just(1) | JSON})


@given(st.one_of(JSON, st.lists(EVENTS, max_size=12).map(lambda events: {"traceEvents": events})))
def test_any_document_gives_a_profile_or_the_readers_error(document):
    try:
        profile = profile_from_trace(document)
    except InvalidParameterError as error:
        assert "\n" not in str(error)
        return
    assert all(all(np.isfinite(value) and value >= 0 for value in values)
               for values in profile.measurements.values())


# ------------------------------------------------------------------ replay
def test_replay_from_a_trace_gives_the_measured_makespan(tmp_path):
    path = write(tmp_path / "trace.json", trace(
        span("PP:0F0", 0, 10), span("PP:0B0", 10, 20), span("PP:0F0", 100, 30),
        span("PP:0B0", 130, 40)))
    table = ScheduleTable([["0F0", "0B0"]])
    replay = Replay.from_kineto(path, table=table)
    runs = monte_carlo(table, UnitCosts(), replay, samples=2)
    assert runs.makespans.tolist() == pytest.approx([30e-6, 70e-6])
    assert runs.nominal_makespan == pytest.approx(50e-6)
    assert replay.describe() == {"model": "replay", "labels": 2, "measurements": 4,
                                 "source": str(path)}


def test_operations_the_table_does_not_hold_are_an_error_unless_partial(tmp_path):
    path = write(tmp_path / "trace.json", trace(*[span(f"PP:0F{m}", 10 * m, 5)
                                                  for m in range(8)]))
    table = ScheduleTable([["0F0", "0B0"]])
    with pytest.raises(InvalidParameterError,
                       match=r"trace.json: 7 profiled operations are not in the table: 0F1 "
                             r"\(trace.json, event 2\), 0F2 \(trace.json, event 3\), 0F3 .*, "
                             r"0F5 \(trace.json, event 6\) and 2 more; --replay-partial "
                             r"\(partial=True\) ignores them"):
        Replay.from_kineto(path, table=table)
    replay = Replay.from_kineto(path, table=table, partial=True)
    assert list(replay.measurements) == ["0F0"]
    assert replay.describe()["notes"] == [
        "ignored 7 profiled operations not in the table (--replay-partial): 0F1 (trace.json, "
        "event 2), 0F2 (trace.json, event 3), 0F3 (trace.json, event 4), 0F4 (trace.json, "
        "event 5), 0F5 (trace.json, event 6) and 2 more"]
    other = write(tmp_path / "other.json", trace(span("PP:5F3", 0, 5)))
    with pytest.raises(InvalidParameterError, match=r"other.json: no profiled operation is in "
                                                    r"the table"):
        Replay.from_kineto(other, table=table, partial=True)
    assert unmatched_labels(replay.profile, table)[0] == ("0F1", (str(path), 2))


# ------------------------------------------------------------------ CLI
def test_eval_replays_a_trace(cli, tmp_path):
    table = generate("1f1b", devices=2, microbatches=2)
    events, clock = [], 0
    for iteration in range(2):
        for stage, microbatch, kind in [(0, 0, "F"), (1, 0, "F"), (1, 0, "B"), (0, 1, "F"),
                                        (1, 1, "F"), (1, 1, "B"), (0, 0, "B"), (0, 1, "B")]:
            events.append(span(f"PP:{stage}{kind}{microbatch}", clock, 10 + iteration,
                               tid=stage))
            clock += 20
    path = write(tmp_path / "run.json", trace(*events))
    (tmp_path / "table.csv").write_text("\r\n".join(
        ",".join("" if cell is None else str(cell) for cell in row) for row in table.rows))
    code, out, err = cli("eval", str(tmp_path / "table.csv"), "--replay", str(path),
                         "--samples", "2", "--json")
    assert code == 0, err
    runs = json.loads(out)["monte_carlo"]
    assert runs["variation"] == [{"model": "replay", "labels": 8, "measurements": 16,
                                  "source": str(path)}]
    # with these orders 6 operations are on the critical path
    assert np.isclose(runs["max_makespan"], 6 * 11e-6)
    code, out, err = cli("eval", "1f1b", "-p", "2", "-m", "1", "--replay", str(path))
    assert code == 1 and err.count("\n") == 1
    assert err.startswith(f"Error: {path}: 4 profiled operations are not in the table: ")
    code, out, err = cli("eval", "1f1b", "-p", "2", "-m", "1", "--replay", str(path),
                         "--replay-partial")
    assert code == 0, err
    assert "note          ignored 4 profiled operations not in the table (--replay-partial)" in out
    code, out, err = cli("eval", "1f1b", "-p", "2", "-m", "1", "--replay-partial")
    assert (code, err) == (1, "Error: --replay-partial needs --replay FILE\n")


@given(events=st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 500)), max_size=400),
       queries=st.lists(st.tuples(st.integers(-10, 1010), st.integers(0, 600), st.booleans()),
                        min_size=1, max_size=30))
def test_latest_end_is_the_largest_end_of_the_events_in_the_range(events, queries):
    """The block maxima answer what a scan of every event answers (the replay asks it once
    per receive and per operation: a scan made long actions quadratic)."""
    from tabsched.formats.kineto import _LatestEnd
    events = sorted(events)
    starts = [float(start) for start, _ in events]
    ends = [float(start + length) for start, length in events]
    index = _LatestEnd(starts, ends)
    for begin, width, closed in queries:
        end = begin + width
        inside = [e for s, e in zip(starts, ends) if begin <= s and (s <= end if closed
                                                                       else s < end)]
        assert index.latest(begin, end, closed=closed) == (max(inside) if inside else None)


@given(seed=st.integers(0, 2**32 - 1), count=st.sampled_from([1, 63, 64, 65, 1000, 5000]))
def test_latest_end_over_many_blocks(seed, count):
    """Every width of range over thousands of events (the sparse table's every row)."""
    from tabsched.formats.kineto import _LatestEnd
    rng = np.random.default_rng(seed)
    starts = np.sort(rng.integers(0, 10 * count, count)).astype(float)
    ends = starts + rng.integers(0, 50, count)
    index = _LatestEnd(starts.tolist(), ends)
    for _ in range(20):
        begin, end = np.sort(rng.integers(-5, 10 * count + 5, 2)).astype(float)
        closed = bool(rng.integers(2))
        mask = (starts >= begin) & ((starts <= end) if closed else (starts < end))
        assert index.latest(begin, end, closed=closed) == (
            float(ends[mask].max()) if mask.any() else None)


def long_actions(count):
    """RECV and operation actions that span much of the trace (as asynchronous receives
    can): each receive's window holds many recv events and each operation much work."""
    events = []
    for i in range(count):
        t = 100 * i
        events += [span(f"PP:1RECV_F{i}", t, 100 * count), span("gloo:recv", t + 2, 48),
                   span(f"PP:1F{i}", t + 10, 70 * count), span("aten::linear", t + 51, 20)]
    return trace(*events)


def test_long_actions_are_matched_as_a_scan_of_every_event_matches_them(monkeypatch):
    """The replay with the block index gives what scanning every event gives (the way it
    was matched before, quadratic in long actions: bench/bench_paths.py times both)."""
    from tabsched.formats import kineto
    fast = profile_from_trace(long_actions(300))

    def scan(index, begin, end, *, closed):
        inside = [e for s, e in zip(index.starts, index.ends.tolist())
                  if begin <= s and (s <= end if closed else s < end)]
        return max(inside) if inside else None
    monkeypatch.setattr(kineto._LatestEnd, "latest", scan)
    slow = profile_from_trace(long_actions(300))
    assert fast.measurements == slow.measurements and fast.waited == slow.waited > 0


@pytest.mark.parametrize("where", [10, 15, 30, 60])
def test_a_corrupt_gzip_trace_is_one_line(tmp_path, where):
    data = bytearray(gzip.compress(json.dumps(trace(*[span(f"PP:0F{i}", 10 * i, 5)
                                                      for i in range(200)])).encode()))
    data[where:where + 8] = b"\x00\xff" * 4
    path = tmp_path / "run.json.gz"
    path.write_bytes(bytes(data))
    with pytest.raises(InvalidParameterError, match=r"run\.json\.gz: cannot read: "):
        read_kineto(path)


def test_a_gzip_bomb_is_refused_before_it_is_read_whole(tmp_path, monkeypatch):
    from tabsched.formats import kineto
    monkeypatch.setattr(kineto, "_GZIP_FLOOR", 1 << 20)     # the bomb need not be large
    path = tmp_path / "bomb.json.gz"
    path.write_bytes(gzip.compress(b"[" + b"0.0," * (2 << 20) + b"0]"))
    assert path.stat().st_size * kineto.GZIP_RATIO < 8 << 20
    with pytest.raises(InvalidParameterError, match=r"bomb\.json\.gz: expands more than "
                                                    r"100x its compressed size"):
        read_kineto(path)
    # the same bytes uncompressed are bounded by max_bytes alone (and are no trace)
    plain = tmp_path / "bomb.json"
    plain.write_bytes(gzip.decompress(path.read_bytes()))
    with pytest.raises(InvalidParameterError, match="larger than 1000 bytes"):
        read_kineto(plain, max_bytes=1000)
