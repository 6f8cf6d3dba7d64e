"""The fuzzing half of tests/test_fuzz_readers.py, run in a subprocess (not collected).

It limits its own address space (``RLIMIT_AS``) to what it uses after its imports
plus :data:`HEADROOM`, then runs hypothesis over the CSV, JSON and replay readers,
the system and model TOML readers (a file that reads must evaluate to a finite
result), and over the CLI with those files as arguments. Every input must end in a
``TabschedError`` with a one-line message, or in a valid result; never another
exception (a ``MemoryError`` included: the limit turns an allocation of more than
a few hundred MB into one), and never more than :data:`SECONDS` for one input.
A failing example is printed and the exit status is 1.

Usage: ``python tests/_fuzz_readers_worker.py EXAMPLES [PROPERTY,...]`` (default: every
property; e.g. ``system_toml,model_toml`` to run those alone)
"""

import io
import json
import os
import re
import resource
import sys
import tempfile
import time
import traceback
from contextlib import redirect_stderr, redirect_stdout

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tabsched import (ModelCosts, TabschedError, TransformerModel, evaluate, from_csv,
                      from_json, generate, load_model, load_system)
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


# ------------------------------------------------------------------ TOML
#: A valid system and a valid model, key by key (TOML text of each value).
GOOD_SYSTEM = {"peak_flops": '"1PFLOP/s"', "memory_bandwidth": '"3TB/s"', "devices_per_node": "2",
               "intra_node_bandwidth": '"100GB/s"', "intra_node_latency": '"1us"',
               "inter_node_bandwidth": "10e9", "inter_node_latency": "5e-6"}
GOOD_MODEL = {"layers": "4", "hidden": "64", "heads": "4", "sequence": "16", "vocab": "100"}
#: Values near the valid ones, per key, beside the random ones: edges of the ranges, units.
PLAUSIBLE = {
    "peak_flops": ["1e6", '"1EFLOP/s"', '"989 TFLOPS"', "1e18", '"1e19FLOP/s"'],
    "memory_bandwidth": ['"1kB/s"', "999.0", '"1PB/s"', '"2PB/s"', '"400Gb/s"'],
    "devices_per_node": ["1", "8", "72", "65536", "65537", "0"],
    "intra_node_bandwidth": ['"1 kB/s"', "1e15", '"450GB/s"'],
    "inter_node_bandwidth": ["1e3", "1e-300", '"25 GB/s"'],
    "intra_node_latency": ["0", '"1h"', "3600.5", '"500ns"'],
    "inter_node_latency": ["0.0", '"2 minutes"', "-1e-9"],
    "compute_efficiency": ["0.5", "1e-6", "1e-7", '[["1GFLOP", 0.4], ["100GFLOP", 0.8]]',
                           "[[1, 1e-6], [1e30, 1.0]]", "[[1e31, 0.5]]", "[[2, 0.5], [1, 0.6]]"],
    "memory_efficiency": ["0.8", '[["1MB", 0.5], ["1GB", 0.9]]', "[[0.5, 0.5]]"],
    "half_efficiency_tokens": ["0", "1024", "1e9", "1.1e9"],
    "matrix_wave": ["0", "4325376", "1e9", "2e9", "5e-324", "0.5"],
    "intra_node_efficiency": ["1", "0.667", "1e-6"],
    "inter_node_efficiency": ["0.96", "1.0000001"],
    "launch_latency": ['"1us"', '"1s"', '"1.5s"'],
    "memory_capacity": ['"80GB"', '"1kB"', '"1PB"', "1e16"],
    "contention": ['"none"', '"link"', '"nic"', '"bus"'],
    "blocking_sends": ["true", "false"],
    "link_overrides": ["[{devices = [0, 1], bandwidth = 1e9}]", "[{devices = [2, 3]}]",
                       '[{devices = [0, 7], latency = "1ms"}]', "[]"],
    "node_overrides": ['[{node = 1, bandwidth = "1GB/s"}]', "[{node = 9, latency = 0}]"],
    "name": ['"gpu"', '""', '"x\\ty"'],
    "description": ['"a system"', '"' + "d" * 600 + '"'],
    "kind": ['"system"', '"model"', '"other"'],
    "layers": ["1", "2", "100000", "100001"],
    "hidden": ["64", "1048576", "1048577"],
    "heads": ["1", "8", "3"],
    "sequence": ["1", "134217728", "4096"],
    "vocab": ["1", "16777216", "16777217"],
    "kv_heads": ["1", "2", "3"],
    "ffn": ["1", "256", "16777216"],
    "gated_ffn": ["true", "false"],
    "dropout": ["true", "false"],
    "norm": ['"rmsnorm"', '"layernorm"'],
    "tied_embeddings": ["true", "false"],
    "dtype": ['"fp8"', '"fp32"', "4", "3"],
    "microbatch_size": ["1", "16777216", "1024"],
    "recompute": ['"none"', '"selective"', '"full"'],
    "grad_bytes": ["4", "2", "8"],
    "optimizer_bytes": ["0", "12", "256", "256.5"],
    "bytes_per_param": ["0", "1024", "16.5"],
}
SYSTEM_KEYS = list(GOOD_SYSTEM) + [
    "compute_efficiency", "memory_efficiency", "half_efficiency_tokens", "matrix_wave",
    "intra_node_efficiency", "inter_node_efficiency", "launch_latency", "memory_capacity",
    "contention", "blocking_sends", "link_overrides", "node_overrides", "name", "description",
    "kind"]
MODEL_KEYS = list(GOOD_MODEL) + [
    "kv_heads", "ffn", "gated_ffn", "dropout", "norm", "tied_embeddings", "dtype",
    "microbatch_size", "recompute", "grad_bytes", "optimizer_bytes", "bytes_per_param", "name",
    "description", "kind"]
INLINE_KEYS = ["devices", "node", "bandwidth", "latency", "bandwith", "a", '"x.y"']
QUANTITY_TEXTS = st.sampled_from([
    "450GB/s", "1PFLOP/s", "2us", "80GB", "1e-300 B/s", "1e400GB/s", "-5GB/s", "0", "fast",
    "1.5 TiB", "400Gb/s", "64MB", "1GFLOP", "nan", "inf", "1 EB/s", "5 hours", "\u0661GB/s",
    "link", "nic", "bf16", "full", "rmsnorm", "system", "model"])


def toml_string(text):
    """``text`` as a TOML basic string (JSON's escapes are TOML's)."""
    return json.dumps(text, ensure_ascii=False)


@st.composite
def toml_values(draw, depth=0):
    """TOML text of one value: numbers small, huge and odd, text, dates, arrays, tables."""
    form = draw(st.integers(0, 10 if depth < 3 else 6))
    if form == 0:
        return str(draw(st.one_of(st.integers(-3, 70000), st.integers(-10**40, 10**40))))
    if form == 1:
        return draw(st.sampled_from(["inf", "-inf", "nan", "1e-300", "1e300", "0.0", "-0.0",
                                     "1e-7", "0.5", "1.5", "2.0", "1e9", "4294967296",
                                     "5e-324", "1.7976931348623157e308"]))
    if form == 2:
        return repr(draw(st.floats(allow_nan=False, allow_infinity=False)))
    if form == 3:
        return draw(st.sampled_from(["true", "false"]))
    if form == 4:
        return toml_string(draw(st.one_of(QUANTITY_TEXTS, st.text(max_size=8))))
    if form == 5:
        return draw(st.sampled_from(["1979-05-27", "07:32:00", "1979-05-27T07:32:00Z",
                                     "0x" + "f" * 40, "0b101", "0o777"]))
    if form == 6:
        return "9" * draw(st.sampled_from([20, 300, 4000, 4400]))
    if form in (7, 8):
        items = draw(st.lists(toml_values(depth + 1), max_size=4))
        return "[" + ", ".join(items) + "]"
    pairs = draw(st.dictionaries(st.sampled_from(INLINE_KEYS), toml_values(depth + 1),
                                 max_size=3))
    return "{" + ", ".join(f"{key} = {value}" for key, value in pairs.items()) + "}"


def key_values(key):
    """A value for ``key``: mostly a plausible one (edges of its range), else anything."""
    plausible = PLAUSIBLE.get(key)
    if not plausible:
        return toml_values()
    return st.one_of(st.sampled_from(plausible), st.sampled_from(plausible), toml_values())


@st.composite
def toml_texts(draw, good, keys):
    """A system or model document: optional keys added, a few keys retyped or dropped, an
    override section or an unknown key now and then, and sometimes the text mangled.

    About half the documents read as valid, so the evaluation of what reads is
    exercised as well as the errors.
    """
    document = dict(good)
    if draw(st.integers(0, 2)) == 1:   # one key of a valid document at an edge of its range
        key = draw(st.sampled_from([key for key in keys if key in PLAUSIBLE]))
        document[key] = draw(st.sampled_from(PLAUSIBLE[key]))
        return "\n".join(f"{key} = {value}" for key, value in document.items()) + "\n"
    optional = [key for key in keys if key not in good]
    for key in draw(st.lists(st.sampled_from(optional), max_size=4, unique=True)):
        document[key] = draw(key_values(key))
    for _ in range(draw(st.integers(0, 2))):
        key = draw(st.sampled_from(keys))
        if draw(st.integers(0, 3)) == 2:   # not an end: hypothesis favours those
            document.pop(key, None)
        else:
            document[key] = draw(key_values(key))
    if draw(st.integers(0, 9)) == 5:
        document[draw(st.sampled_from(["peak_flop", "layer", "bandwith", "x"]))] = "1"
    lines = [f"{key} = {value}" for key, value in document.items()]
    sections = [key for key in ("link_overrides", "node_overrides") if key in keys]
    for section in draw(st.lists(st.sampled_from(sections), max_size=2)) if sections else ():
        if section not in document:   # an array of tables, unless the key is taken
            index = "devices" if section == "link_overrides" else "node"
            fields = {index: draw(st.sampled_from(["[0, 1]", "[1, 3]", "[0, 9]", "[2, 2]", "1",
                                                   "0", "5"]))}
            fields.update(draw(st.dictionaries(st.sampled_from(INLINE_KEYS),
                                               st.one_of(st.sampled_from(
                                                   ['"1GB/s"', "1e-300", '"1ms"', "0"]),
                                                   toml_values(1)), max_size=2)))
            lines.append(f"[[{section}]]")
            lines.extend(f"{key} = {value}" for key, value in fields.items())
    text = "\n".join(lines) + "\n"
    mangle = draw(st.integers(0, 29)) - 10   # 0..5 mangle, the rest (ends included) not
    if mangle == 0:
        text = text[:draw(st.integers(0, len(text)))]
    elif mangle == 1:
        depth = draw(st.integers(10, 3000))
        text += "deep = " + "[" * depth + "]" * depth + "\n"
    elif mangle == 2:
        text += "a" + ".a" * draw(st.integers(10, 3000)) + " = 1\n"
    elif mangle == 3:
        text = "\ufeff" + text
    elif mangle == 4:
        position = draw(st.integers(0, len(text)))
        text = text[:position] + draw(st.text(max_size=4)) + text[position:]
    elif mangle == 5:   # a multi-line string that ends in a quote of its own
        text += "description = '''" + draw(st.text(max_size=6)) + "''''\n"
    return text


#: What may still go wrong with a file that reads: the run has fewer devices than an
#: override names, or the activations of a huge model overflow int64. Anything else means
#: the checks let a value through that the cost model cannot use (e.g. nan durations).
AFTER_LOADING = re.compile(r"names (device|node) \d+, but the run|which overflows int64")


def evaluates(table, costs):
    """``evaluate``: a finite result, or one of the errors :data:`AFTER_LOADING` allows."""
    try:
        result = evaluate(table, costs)
    except TabschedError as error:
        assert AFTER_LOADING.search(str(error)), f"a file that reads does not evaluate: {error}"
        raise
    assert np.isfinite(result.makespan) and np.isfinite(result.bubble_ratio)
    return result


def system_reader(path):
    """A system file: a valid system that evaluates to a finite result, or a one-line error."""
    system = load_system(path)
    evaluates(generate("1f1b", devices=4, microbatches=4),
              ModelCosts(TransformerModel(4, 64, 4, 16, 100), system))
    return system


def model_reader(path):
    """A model file: a valid model that evaluates to a finite result, or a one-line error."""
    model = load_model(path)
    evaluates(generate("gpipe", devices=2 if model.layers % 2 == 0 else 1, microbatches=2),
              ModelCosts(model, "mid_nw_mid_cp"))
    return model


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


def main_worker(examples, only=None):
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

    @fuzz
    @given(toml_texts(GOOD_SYSTEM, SYSTEM_KEYS))
    def system_toml(text):
        check(system_reader, write("s.toml", text))

    @fuzz
    @given(toml_texts(GOOD_MODEL, MODEL_KEYS))
    def model_toml(text):
        check(model_reader, write("m.toml", text))

    @fuzz
    @given(st.one_of(st.binary(max_size=300), toml_texts(GOOD_SYSTEM, SYSTEM_KEYS + MODEL_KEYS)),
           st.sampled_from(["system", "model"]))
    def cli_toml_files(content, kind):
        path = write(f"{kind}.toml", content)
        check(system_reader if kind == "system" else model_reader, path)
        check(run_cli, ["eval", "1f1b", "-p", "4", "-m", "4", "--model",
                        path if kind == "model" else "paper-128l", "--system",
                        path if kind == "system" else "mid_nw_mid_cp"])

    def toml_edges():
        """Every edge value of every key, in an otherwise valid system or model."""
        for good, reader in ((GOOD_SYSTEM, system_reader), (GOOD_MODEL, model_reader)):
            keys = SYSTEM_KEYS if good is GOOD_SYSTEM else MODEL_KEYS
            for key in keys:
                for value in PLAUSIBLE.get(key, ()):
                    document = {**good, key: value}
                    check(reader, write("edge.toml", "\n".join(
                        f"{name} = {text}" for name, text in document.items())))

    failed = 0
    for test in (csv_text, json_text, raw_bytes, replay_text, cli_files, cli_json_files,
                 system_toml, model_toml, cli_toml_files, toml_edges):
        if only and test.__name__ not in only:
            continue
        try:
            test()
        except Exception:   # noqa: BLE001 -- report every property, then fail
            failed += 1
            print(f"--- {test.__name__} failed", file=sys.stderr)
            traceback.print_exc()
    return failed


if __name__ == "__main__":
    limit_memory()
    sys.exit(1 if main_worker(int(sys.argv[1]), sys.argv[2].split(",") if len(sys.argv) > 2
                              else None) else 0)
