"""Fuzzing of the surfaces that came with the execution, the planner and the imports.

Each test mangles one input the way a user or a broken tool would (a GEMM sweep
CSV, ``plan``'s options, the context-parallel settings) and asserts the one
contract bad input has: it runs, or it ends in one line of tabsched's own error
(exit 1 from the CLI) naming the place; never a traceback. Bounded: small models
and GPU counts, so that an example takes milliseconds (the execution files, the
nccl-tests reader and the MoE fields are fuzzed beside their own tests).
"""

import math
import pathlib

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from tabsched import InvalidParameterError, ModelCosts
from tabsched._testing import invoke_cli, one_error_line
from tabsched.costs.transformer import TransformerModel

DATA = pathlib.Path(__file__).resolve().parent / "data"
GEMM_LINES = (DATA / "a100-llmcompass-gemm.csv").read_text().splitlines()
#: Tokens a mangled cell or option may hold: numbers out of range or not numbers,
#: separators, empty, and anything hypothesis makes.
TOKENS = st.one_of(st.sampled_from(["0", "-1", "nan", "inf", "-inf", "1e400", "", " ", ",",
                                    "\"", "2.5", "0x10", "99999999999999999999", "bf16",
                                    "fp8", "m", "seconds", "1e-30", "\u00e9", "\ud800"]),
                   st.text(max_size=8))


# ------------------------------------------------------------------ GEMM sweep CSVs
def _mangled(folder, edits):
    """The measured GEMM sweep with each ``(line, cell, token)`` edit made, written to
    ``folder``."""
    lines = list(GEMM_LINES)
    for line, cell, token in edits:
        cells = lines[line].split(",")
        cells[cell % len(cells)] = token
        lines[line] = ",".join(cells)
    path = folder / "sweep.csv"
    path.write_bytes(("\n".join(lines) + "\n").encode("utf-8", "surrogatepass"))
    return path


@given(st.lists(st.tuples(st.integers(0, len(GEMM_LINES) - 1), st.integers(0, 5), TOKENS),
                min_size=1, max_size=5))
def test_a_mangled_gemm_sweep_reads_or_is_one_line_error(tmp_path_factory, edits):
    from tabsched.costs.gemm import read_sweep
    path = _mangled(tmp_path_factory.mktemp("gemm"), edits)
    try:
        rows, _ = read_sweep(path, peak_flops=312e12)
    except InvalidParameterError as error:
        assert "\n" not in str(error) and str(error).startswith(f"{path}: ")
        return
    assert rows
    for m, n, k, seconds in rows:
        assert min(m, n, k) >= 1 and 0 < seconds < math.inf
        assert 2 * m * n * k / seconds <= 312e12 * (1 + 1e-9)     # never above the peak


@given(st.lists(st.tuples(st.integers(0, len(GEMM_LINES) - 1), st.integers(0, 5), TOKENS),
                min_size=1, max_size=3))
def test_system_import_gemm_on_a_mangled_sweep_exits_cleanly(tmp_path_factory, edits):
    folder = tmp_path_factory.mktemp("import")
    path = _mangled(folder, edits)
    out = folder / "system.toml"
    code, output = invoke_cli(["system", "import", "gemm", path, "--source", "fuzzed",
                            "--system", "dgx-a100", "-o", out])
    if code == 0:
        assert out.exists()
        return
    assert code == 1, output
    assert not out.exists()
    one_error_line(output)


# ------------------------------------------------------------------ plan's options
_PLAN_OPTIONS = {
    "-n": st.one_of(st.integers(-2, 20).map(str), TOKENS),
    "--global-batch": st.one_of(st.integers(-2, 64).map(str), TOKENS),
    "-t": st.one_of(st.sampled_from(["1", "2,4", "3", "0", "1,1", "8,16"]), TOKENS),
    "-p": st.one_of(st.sampled_from(["1", "2", "4,8", "0", "-1", "3"]), TOKENS),
    "--microbatch-size": st.one_of(st.sampled_from(["1", "1,2", "0", "64"]), TOKENS),
    "--recompute": st.one_of(st.sampled_from(["none", "full", "selective,full", "nope"]),
                             TOKENS),
    "--max-chunks": st.one_of(st.sampled_from(["1", "2", "0", "-3"]), TOKENS),
    "--zero": st.one_of(st.sampled_from(["0", "1,3", "4", "2,2"]), TOKENS),
    "--uneven": st.one_of(st.sampled_from(["0", "1", "-1", "1000"]), TOKENS),
    "--tie-band": st.one_of(st.sampled_from(["0", "0.02", "-1", "nan", "inf", "2"]), TOKENS),
    "--memory-budget": st.one_of(st.sampled_from(["80GB", "1KB", "0", "-5GB", "capacity",
                                                  "1e400GB"]), TOKENS),
    "--families": st.one_of(st.sampled_from(["1f1b", "zbv,1f1b", "interleaved-1f1b:chunks=2",
                                             "nofamily", "gpipe:x=1", ","]), TOKENS),
    "--context-parallel": st.one_of(st.sampled_from(["1", "2", "1,2", "0", "3"]), TOKENS),
    "--expert-parallel": st.one_of(st.sampled_from(["1", "2", "0"]), TOKENS),
    "--top": st.one_of(st.sampled_from(["1", "0", "-1", "3"]), TOKENS),
}


@given(st.dictionaries(st.sampled_from(sorted(_PLAN_OPTIONS)), st.just(None), max_size=4)
       .flatmap(lambda keys: st.fixed_dictionaries({key: _PLAN_OPTIONS[key] for key in keys})),
       st.sampled_from(["paper-128l", "llama3-8b", "nomodel"]),
       st.sampled_from(["dgx-a100", "mid_nw_mid_cp", "nosystem"]))
def test_plan_with_hostile_options_runs_or_isone_error_line(options, model, system):
    argv = ["plan", model, system, "-q", "--families", "1f1b,zbv", "-n", "8",
            "--global-batch", "16", "--max-chunks", "2"]
    for option, value in options.items():
        argv += [option, value]
    code, output = invoke_cli(argv)
    assert code in (0, 1, 2, 3), output     # 2: click's usage error; 3: nothing fits, said so
    if code in (1, 3):
        one_error_line(output)


# ------------------------------------------------------------------ context parallelism
SMALL = dict(layers=4, hidden=512, heads=8, sequence=1024, vocab=1000)
_CP_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-2, 64), st.floats(),
                       st.sampled_from(["p2p", "allgather", "a2a", "ring", ""]),
                       st.text(max_size=4))


@given(st.fixed_dictionaries({}, optional={
    "context_parallel": _CP_VALUES, "cp_comm": _CP_VALUES, "tensor_parallel": _CP_VALUES,
    "sequence_parallel": _CP_VALUES, "data_parallel": _CP_VALUES}),
    st.sampled_from(["eager", "flash"]))
def test_hostile_context_parallel_settings_are_one_line_or_price(settings, attention):
    try:
        costs = ModelCosts(TransformerModel(**SMALL), "dgx-h100", attention=attention,
                           **settings)
        times = costs.part_times([1.0])
    except InvalidParameterError as error:
        assert "\n" not in str(error)
        return
    assert all(np.isfinite(part).all() and (part >= 0).all() for part in times.values())


@given(st.lists(st.tuples(st.sampled_from(["--context-parallel", "--cp-comm", "-t", "-d",
                                           "--sequence-parallel"]), TOKENS), max_size=3))
def test_eval_with_hostile_context_parallel_options_runs_or_isone_error_line(options):
    argv = ["eval", "1f1b", "-p", "2", "-m", "4", "--model", "llama3-8b", "--system",
            "dgx-h100", "--context-parallel", "2"]
    for option, value in options:
        argv += [option] if option == "--sequence-parallel" else [option, value]
    code, output = invoke_cli(argv)
    assert code in (0, 1, 2), output
    if code == 1:
        one_error_line(output)
