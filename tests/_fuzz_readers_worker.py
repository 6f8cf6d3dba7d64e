"""The fuzzing half of tests/test_fuzz_readers.py, run in a subprocess (not collected).

It limits its own address space (``RLIMIT_AS``) to what it uses after its imports
plus :data:`HEADROOM`, then runs hypothesis over the CSV, JSON and replay readers
and over the CLI with those files as arguments. Every input must end in a
``TabschedError`` with a one-line message, or in a valid result; never another
exception (a ``MemoryError`` included: the limit turns an allocation of more than
a few hundred MB into one), and never more than :data:`SECONDS` for one input.
A failing example is printed and the exit status is 1.

Usage: ``python tests/_fuzz_readers_worker.py EXAMPLES``
"""

import io
import json
import os
import resource
import sys
import tempfile
import time
import traceback
from contextlib import redirect_stderr, redirect_stdout

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tabsched import TabschedError, evaluate, from_csv, from_json
from tabsched.adapt import Replay
from tabsched.cli import main
from tabsched.pytorch import from_pytorch_csv

#: Memory a reader may take beyond the worker's own after its imports.
HEADROOM = 400 * 2**20
#: Longest a reader may take on one input (the inputs are at most a few KB).
SECONDS = 5.0
LONGEST_MESSAGE = 2000


def limit_memory():
    with open("/proc/self/status") as status:
        size = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize"))
    resource.setrlimit(resource.RLIMIT_AS, (size + HEADROOM, size + HEADROOM))


# ------------------------------------------------------------------ strategies
IDS = st.one_of(st.integers(0, 6), st.integers(0, 2**31 + 5), st.integers(10**8, 10**40),
                st.just(2147483646), st.text("0123456789", min_size=1, max_size=12))
DIGITS = st.sampled_from(["0", "1", "\u0660", "\uff10", "\u0967", "7", "12"])
KIND = st.sampled_from(["F", "B", "I", "W", "BW", "X", "REDUCE_GRAD", "SEND_F", "RECV_B",
                        "UNSHARD", "RESHARD", ""])


@st.composite
def tokens(draw):
    """Cell texts: operations with small, huge or foreign-digit ids, actions and junk."""
    form = draw(st.integers(0, 9))
    if form <= 4:
        return f"{draw(IDS)}{draw(KIND)}{draw(IDS)}"
    if form == 5:
        return f"{draw(DIGITS)}{draw(KIND)}{draw(DIGITS)}"
    if form == 6:
        return f"({draw(tokens())};{draw(tokens())}){draw(st.sampled_from(['OVERLAP_F_B', '', 'X']))}"
    if form == 7:
        return f"{draw(IDS)}REDUCE_GRAD"
    if form == 8:
        return ""
    return draw(st.text(alphabet=st.characters(codec="utf-8"), max_size=8))


@st.composite
def csv_texts(draw):
    """CSV-like text: rows of tokens with quotes, line breaks and odd bytes mixed in."""
    rows = draw(st.lists(st.lists(tokens(), max_size=8), min_size=0, max_size=6))
    lines = []
    for row in rows:
        cells = []
        for cell in row:
            quote = draw(st.integers(0, 9))
            if quote == 0:
                cell = f'"{cell}'   # unclosed
            elif quote == 1:
                cell = f'"{cell}\n{cell}"'   # a quoted line break
            cells.append(cell)
        lines.append(",".join(cells))
    text = draw(st.sampled_from(["\r\n", "\n"])).join(lines)
    extra = draw(st.sampled_from(["", "\ufeff", "\x00", "\r\n", '"', "\n\n"]))
    return extra + text if draw(st.booleans()) else text + extra


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-10**20, 10**20) | st.floats(allow_nan=False)
    | st.text(max_size=6), lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=6), children, max_size=4), max_leaves=12)


@st.composite
def json_texts(draw):
    """Table documents with each key's value well-typed, mistyped or missing."""
    rows = draw(st.lists(st.lists(st.one_of(tokens(), st.none(), JSON_VALUES), max_size=6),
                         max_size=5))
    document = {"rows": rows if draw(st.integers(0, 5)) else draw(JSON_VALUES)}
    good = {"format": "tabsched.table", "version": 1, "family": draw(st.sampled_from(
        ["gpipe", "1f1b", "hanayo", "chimera", "interleaved-1f1b", "nothing"])),
            "params": {"devices": draw(IDS), "microbatches": draw(IDS)},
            "num_stages": draw(IDS), "microbatch_sizes": draw(st.lists(
                st.floats(0.1, 2.0), max_size=5)),
            "stage_layers": draw(st.lists(st.integers(0, 8), max_size=5)),
            "grad_sync": draw(st.lists(st.integers(0, 6), max_size=3))}
    for key, value in good.items():
        choice = draw(st.integers(0, 3))
        if choice == 1:
            document[key] = value
        elif choice == 2:
            document[key] = draw(JSON_VALUES)
    text = json.dumps(document)
    mangle = draw(st.integers(0, 6))
    if mangle == 0:
        text = text[:draw(st.integers(0, len(text)))]
    elif mangle == 1:
        text = text.replace("0.5", "NaN").replace("1.0", "Infinity")
    elif mangle == 2:
        text = "[" * draw(st.integers(30, 5000)) + text
    return text


@st.composite
def replay_texts(draw):
    rows = draw(st.lists(st.tuples(tokens(), st.one_of(
        st.sampled_from(["1ms", "2", "-1", "nan", "inf", "1e400", "3us", "x", ""]),
        st.text(max_size=6))), max_size=6))
    lines = [f"{label},{value}" for label, value in rows]
    if draw(st.booleans()):
        lines.insert(0, "op,duration")
    text = "\n".join(lines)
    return draw(st.sampled_from(["", "\ufeff"])) + text


# ------------------------------------------------------------------ the property
def check(function, *args):
    """Call ``function``: a value or a one-line TabschedError, within SECONDS."""
    began = time.perf_counter()
    try:
        value = function(*args)
    except TabschedError as error:
        message = str(error)
        assert "\n" not in message and len(message) < LONGEST_MESSAGE, repr(message[:300])
        value = None
    elapsed = time.perf_counter() - began
    assert elapsed < SECONDS, f"{function.__name__} took {elapsed:.1f} s"
    return value


def read_and_evaluate(reader, text):
    table = reader(text)
    result = evaluate(table)   # a table that reads is valid: it evaluates or deadlocks
    assert np.isfinite(result.makespan)
    return table


def csv_reader(text):
    return read_and_evaluate(lambda t: from_csv(t, source="f.csv"), text)


def pytorch_reader(text):
    return read_and_evaluate(lambda t: from_pytorch_csv(t, source="f.csv").table, text)


def json_reader(text):
    return read_and_evaluate(lambda t: from_json(t, source="f.json"), text)


def replay_reader(path):
    return Replay.from_csv(path)


def run_cli(argv):
    """The CLI on a file: exit 0, or exit 1 with exactly one ``Error:`` line."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            main(argv)
        except SystemExit as exit_info:
            code = exit_info.code
        else:
            code = 0
    lines = err.getvalue().splitlines()
    errors = [line for line in lines if line.startswith("Error: ")]
    assert code in (0, 1), (code, err.getvalue()[:500])
    if code == 1:
        assert len(errors) == 1 and lines[-1] == errors[0], err.getvalue()[:500]
        assert len(errors[0]) < LONGEST_MESSAGE
    assert "Traceback" not in err.getvalue()
    return code


def main_worker(examples):
    folder = tempfile.mkdtemp(prefix="tabsched-fuzz-")
    fuzz = settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))

    def write(name, content):
        path = os.path.join(folder, name)
        with open(path, "wb") as handle:
            handle.write(content if isinstance(content, bytes) else
                         content.encode("utf-8", "surrogatepass"))
        return path

    @fuzz
    @given(csv_texts())
    def csv_text(text):
        check(csv_reader, text)
        check(pytorch_reader, text)

    @fuzz
    @given(json_texts())
    def json_text(text):
        check(json_reader, text)

    @fuzz
    @given(st.binary(max_size=300))
    def raw_bytes(data):
        for name in ("f.csv", "f.json"):
            path = write(name, data)
            check(run_cli, ["eval", path])
        check(replay_reader, write("r.csv", data))

    @fuzz
    @given(replay_texts())
    def replay_text(text):
        path = write("r.csv", text)
        check(replay_reader, path)
        check(run_cli, ["eval", "gpipe", "-p", "2", "-m", "2", "--comm", "1", "--replay", path,
                        "--samples", "2"])

    @fuzz
    @given(csv_texts(), st.sampled_from(["eval", "show", "convert"]))
    def cli_files(text, command):
        path = write("t.csv", text)
        argv = [command, path] + ([os.path.join(folder, "out.json")] if command == "convert"
                                  else [])
        check(run_cli, argv)

    @fuzz
    @given(json_texts(), st.sampled_from(["eval", "show", "adapt"]))
    def cli_json_files(text, command):
        path = write("t.json", text)
        argv = [command, path] + (["--memory-budget", "64", "--max-rounds", "1", "--samples",
                                   "2"] if command == "adapt" else [])
        check(run_cli, argv)

    failed = 0
    for test in (csv_text, json_text, raw_bytes, replay_text, cli_files, cli_json_files):
        try:
            test()
        except Exception:   # noqa: BLE001 -- report every property, then fail
            failed += 1
            print(f"--- {test.__name__} failed", file=sys.stderr)
            traceback.print_exc()
    return failed


if __name__ == "__main__":
    limit_memory()
    sys.exit(1 if main_worker(int(sys.argv[1])) else 0)
