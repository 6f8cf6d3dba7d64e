"""Fuzzing of the trace readers that came with issue 26: ``whatif``, ``eval --replay`` and
``profile``.

Each example starts from a valid trace (a pipeline run's ``PP:`` ranges as
:func:`tabsched.whatif.synthetic_trace` writes them, or a GPU run's ranges, launches and
kernels as PyTorch's profiler lays them out) and breaks it the way a crashed job, a
half-copied file or a different tool would: a field of one event replaced by a hostile
value or removed, events duplicated or dropped, the file cut short, stray bytes in it, a
gzip stream corrupted. The contract is the one for every input: the command runs, or it
ends with exit 1 and one ``Error:`` line; never a traceback. The API raises tabsched's own
errors. Bounded: two ranks, a handful of operations, so that an example takes milliseconds.
"""

import gzip
import json

from hypothesis import given
from hypothesis import strategies as st

from tabsched import StageCosts, generate
from tabsched._testing import invoke_cli, one_error_line
from tabsched.exceptions import TabschedError
from tabsched.whatif import read_step, synthetic_trace

#: Values a mangled field may take: wrong types, out-of-range numbers, odd strings.
HOSTILE = st.one_of(
    st.sampled_from([None, -1, 0, -1e300, 1e300, float("nan"), float("inf"), True, "",
                     "PP:", "PP:9F9", "PP:0F", "PP:0X0", "PP:-1F0", "PP:0F99999999999999999",
                     "\ud800", "recv", "kernel", [], {}, [1, 2], {"stream": "x"},
                     {"correlation": None}, 2 ** 70, 10 ** 400, -10 ** 400]),
    st.integers(), st.floats(allow_nan=True), st.text(max_size=6))
FIELDS = ["name", "ts", "dur", "ph", "cat", "tid", "pid", "args"]

#: One edit of a document's events: ``(kind, event index, field, value)``.
EDITS = st.tuples(st.sampled_from(["set", "drop_field", "duplicate", "drop_event"]),
                  st.integers(0, 10 ** 6), st.sampled_from(FIELDS), HOSTILE)


def _edited(document, edits):
    """``document`` with each edit made to its ``traceEvents`` (a deep copy)."""
    document = json.loads(json.dumps(document))
    events = document["traceEvents"]
    for kind, index, key, value in edits:
        if not events:
            break
        event = events[index % len(events)]
        if kind == "set":
            event[key] = value
        elif kind == "drop_field":
            event.pop(key, None)
        elif kind == "duplicate":
            events.insert(index % len(events), json.loads(json.dumps(event)))
        else:
            events.pop(index % len(events))
    return document


def _encoded(document):
    """The document as bytes, whatever it holds (lone surrogates, NaN): what a broken
    writer could leave on disk."""
    return json.dumps(document).encode("utf-8", "surrogatepass")


def _damaged(data, cut, noise, position):
    """``data`` cut to ``cut`` of its length (``None``: whole) with ``noise`` inserted at
    ``position``."""
    if cut is not None:
        data = data[:int(len(data) * cut)]
    if noise:
        at = position % (len(data) + 1)
        data = data[:at] + noise + data[at:]
    return data


#: Half the examples keep the bytes whole, so that the edits reach the readers' checks
#: past the JSON parser.
DAMAGE = st.one_of(st.just((None, b"", 0)),
                   st.tuples(st.one_of(st.none(), st.floats(0.0, 1.0)), st.binary(max_size=6),
                             st.integers(0, 10 ** 6)))


def _runs_or_one_line(argv):
    """The exit status of the CLI on ``argv``: 0, or 1 with one short ``Error:`` line."""
    code, text = invoke_cli(argv)
    assert "Traceback" not in text, text
    assert code in (0, 1), (code, text)
    if code == 1:
        assert len(one_error_line(text)) < 400, text
    return code


# ------------------------------------------------------------------ pipeline traces
_TABLE = generate("1f1b", devices=2, microbatches=2)


def _pipeline_documents(folder):
    """The two ranks' documents of a valid CPU pipeline trace."""
    synthetic_trace(_TABLE, StageCosts([1e-3, 1.2e-3], comm=1e-4), folder, iterations=2)
    return [json.loads((folder / f"rank{rank}.json").read_text()) for rank in range(2)]


@given(rank=st.integers(0, 1), edits=st.lists(EDITS, max_size=4), damage=DAMAGE,
       compressed=st.booleans())
def test_a_broken_pipeline_trace_is_read_or_one_line(tmp_path_factory, rank, edits, damage,
                                                     compressed):
    folder = tmp_path_factory.mktemp("trace")
    documents = _pipeline_documents(folder / "good")
    run = folder / "run"
    run.mkdir()
    for number, document in enumerate(documents):
        data = _encoded(_edited(document, edits) if number == rank else document)
        if number == rank:
            if compressed:
                data = gzip.compress(data)
            data = _damaged(data, *damage)
        (run / f"rank{number}.json{'.gz' if compressed and number == rank else ''}"
         ).write_bytes(data)
    try:
        read_step(run)
    except TabschedError:
        pass
    _runs_or_one_line(["whatif", run, "-s", "gpipe", "-m", "3"])
    _runs_or_one_line(["eval", "1f1b", "-p", "2", "-m", "2", "--replay", run, "--samples",
                       "2"])


# ------------------------------------------------------------------ GPU kernel traces
def _gpu_document():
    """One rank's GPU trace of ``_TABLE``'s first row: a ``PP:`` range per operation with
    its launch and kernel (correlated), and an NCCL kernel on a second stream."""
    events, clock, correlation = [], 0.0, 0
    for op in _TABLE.orders()[0]:
        events.append({"ph": "X", "cat": "user_annotation", "name": f"PP:{op}", "ts": clock,
                       "dur": 300, "pid": 10, "tid": 1})
        for name, stream in (("sm90_xmma_gemm", 7), ("ncclDevKernel_SendRecv", 20)):
            correlation += 1
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel",
                           "ts": clock + 5, "dur": 2, "pid": 10, "tid": 1,
                           "args": {"correlation": correlation}})
            events.append({"ph": "X", "cat": "kernel", "name": name, "ts": clock + 10,
                           "dur": 100, "pid": 0, "tid": stream,
                           "args": {"stream": stream, "correlation": correlation}})
        clock += 320
    return {"schemaVersion": 1, "traceEvents": events}


_GPU = _gpu_document()


@given(edits=st.lists(EDITS, max_size=4), damage=DAMAGE, compressed=st.booleans())
def test_a_broken_kernel_trace_is_profiled_or_one_line(tmp_path_factory, edits, damage,
                                                       compressed):
    folder = tmp_path_factory.mktemp("kernels")
    data = _encoded(_edited(_GPU, edits))
    if compressed:
        data = gzip.compress(data)
    path = folder / ("train.json.gz" if compressed else "train.json")
    path.write_bytes(_damaged(data, *damage))
    _runs_or_one_line(["profile", path])
    _runs_or_one_line(["profile", path, "--measure", "communication", "--json"])


def test_the_unbroken_traces_run(tmp_path):
    """The fuzzing starts from inputs that work: both documents are read as they are."""
    documents = _pipeline_documents(tmp_path / "good")
    assert len(documents) == 2 and read_step(tmp_path / "good").table.num_microbatches == 2
    assert _runs_or_one_line(["whatif", tmp_path / "good", "-s", "gpipe", "-m", "3"]) == 0
    path = tmp_path / "train.json"
    path.write_text(json.dumps(_GPU))
    assert _runs_or_one_line(["profile", path]) == 0
