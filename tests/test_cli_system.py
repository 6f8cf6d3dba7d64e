"""``tabsched system import gemm`` (cli/system.py, costs/system_import.py): a GEMM sweep CSV
into a system TOML; every bad input one line naming the file and line, exit 1."""

import pathlib

import pytest

from tabsched import load_system
from tabsched.costs._presets import preset_index
from tabsched.costs.gemm import MAX_CSV_BYTES, MAX_POINTS
from tabsched.costs.system_import import gemm_system_toml

DATA = pathlib.Path(__file__).resolve().parent / "data"
SWEEP = "m,n,k,seconds\n1024,1024,1024,2e-5\n2048,2048,2048,1e-4\n"


def write(tmp_path, text, name="sweep.csv"):
    path = tmp_path / name
    path.write_bytes(text.encode("utf-8") if isinstance(text, str) else text)
    return path


def test_import_adds_the_table_to_the_base_system(cli, tmp_path):
    out = tmp_path / "mine.toml"
    code, _, err = cli("system", "import", "gemm", str(write(tmp_path, SWEEP)), "--system",
                       "dgx-a100", "--source", "my node, 2026-12-01", "-o", str(out))
    assert code == 0 and f"wrote {out}" in err
    text = out.read_text()
    assert text.startswith(preset_index()["system"]["dgx-a100"].rstrip("\n"))
    system = load_system(out)
    assert system.gemm_efficiency.source == "my node, 2026-12-01"
    assert system.gemm_efficiency.points[0] == (1024, 1024, 1024,
                                                2 * 1024**3 / (2e-5 * 312e12))
    base = load_system("dgx-a100")
    assert system.replace(gemm_efficiency=None, name=base.name) == base


def test_import_without_a_system_prints_the_table(cli, tmp_path):
    code, out, _ = cli("system", "import", "gemm", str(write(tmp_path, SWEEP)), "--source", "s")
    assert code == 0
    assert out == ('[gemm_efficiency]\nsource = "s"\nseconds = [\n  [1024, 1024, 1024, 2e-05],\n'
                   '  [2048, 2048, 2048, 0.0001],\n]\n')


def test_the_example_system_is_what_the_import_writes():
    source = load_system(DATA / "a100-llmcompass.toml").gemm_efficiency.source
    assert gemm_system_toml(DATA / "a100-llmcompass-gemm.csv", source, "dgx-a100") == \
        (DATA / "a100-llmcompass.toml").read_text()


def test_a_dtype_column_is_kept_and_chosen(cli, tmp_path):
    sweep = write(tmp_path, "dtype,m,n,k,seconds,tflops\nbf16,1024,1024,1024,2e-5,107\n"
                            "bf16,2048,2048,2048,1e-4,171\nfp32,1024,1024,1024,2e-4,10\n")
    code, _, err = cli("system", "import", "gemm", str(sweep), "--source", "s")
    assert code == 1 and err == (f"Error: {sweep}: line 4: dtype 'fp32', but line 2 has "
                                 f"'bf16': a system has one peak_flops, so a table holds one "
                                 f"dtype (choose one with --dtype)\n")
    code, out, _ = cli("system", "import", "gemm", str(sweep), "--source", "s", "--dtype", "bf16")
    assert code == 0 and 'dtype = "bf16"' in out and "2e-05" in out and "0.0002" not in out
    code, _, err = cli("system", "import", "gemm", str(sweep), "--source", "s", "--dtype", "fp8")
    assert code == 1 and "no row has dtype 'fp8' (found 'bf16', 'fp32')" in err


def test_a_failed_import_leaves_the_output_as_it_was(cli, tmp_path):
    out = tmp_path / "mine.toml"
    out.write_text("old\n")
    bad = write(tmp_path, "m,n,k,seconds\n1024,1024,1024,0\n2048,2048,2048,1e-4\n")
    code, _, err = cli("system", "import", "gemm", str(bad), "--system", "dgx-a100",
                       "--source", "s", "-o", str(out))
    assert code == 1 and out.read_text() == "old\n"
    assert set(tmp_path.iterdir()) == {out, bad}   # no temporary file left behind
    code, _, err = cli("system", "import", "gemm", str(write(tmp_path, SWEEP)), "--source", "s",
                       "-o", str(tmp_path / "mine.txt"))
    assert code == 1 and "the system file must end in .toml, not .txt" in err


@pytest.mark.parametrize("text, message", [
    ("", "empty file; expected a header m,n,k,seconds"),
    ("m,n,seconds\n1,2,3\n", "line 1: the header has no column k (expected m,n,k,seconds, "
                             "optionally dtype; found 'm,n,seconds')"),
    ("1024,1024,1024,2e-5\n2048,2048,2048,1e-4\n", "line 1: the header has no column m, n, k, "
                                                   "seconds"),
    ("m,n,k,seconds\n", "no rows after the header; a table needs at least 2 measured GEMMs"),
    ("m,n,k,seconds\n\n\n", "no rows after the header"),
    ("m,n,k,seconds\n1024,1024,1024,2e-5\n", "1 distinct shape; a table needs at least 2"),
    (SWEEP + "4096,abc,4096,1e-3\n", "line 4: n 'abc' is not a positive integer"),
    (SWEEP + "4096,4096,-4,1e-3\n", "line 4: k '-4' is not a positive integer"),
    (SWEEP + "4096,4096,0,1e-3\n", "line 4: k must be a positive integer, not 0"),
    (SWEEP + "4096,4096,4096,1.0.0\n", "line 4: seconds '1.0.0' is not a number"),
    (SWEEP + "4096,4096,4096\n", "line 4: has 3 cells, no seconds (column 4)"),
    (SWEEP + "4096,4096,4096,0\n", "line 4: seconds must be a finite time > 0, not '0'"),
    (SWEEP + "4096,4096,4096,-1e-3\n", "line 4: seconds must be a finite time > 0, not '-1e-3'"),
    (SWEEP + "4096,4096,4096,inf\n", "line 4: seconds must be a finite time > 0, not 'inf'"),
    (SWEEP + "4096,4096,4096,nan\n", "line 4: seconds must be a finite time > 0, not 'nan'"),
    (SWEEP + "4096,4096,4096,1e-13\n", "line 4: seconds must be between"),
    (SWEEP + "1024,1024,1024,3e-5\n", "line 4: shape 1024x1024x1024 is also on line 2, with "
                                      "2e-05 s against 3e-05 s here"),
    ('m,n,k,seconds\n"1024,1024\n', "not CSV"),
    (b"m,n,k,seconds\n\xff\n", "byte 14 is not UTF-8 text"),
    ("m,n,k,seconds\n1,1,1,1\x00\n", "line 2 contains a NUL byte"),
])
def test_bad_sweeps_are_one_line_naming_the_file_and_line(cli, tmp_path, text, message):
    sweep = write(tmp_path, text)
    code, out, err = cli("system", "import", "gemm", str(sweep), "--source", "s")
    assert code == 1 and out == "" and err.startswith(f"Error: {sweep}: ")
    assert message in err and err.count("\n") == 1, err


def test_a_gemm_faster_than_the_peak_names_its_line_and_by_how_much(cli, tmp_path):
    sweep = write(tmp_path, SWEEP + "8192,8192,8192,1e-3\n")
    code, _, err = cli("system", "import", "gemm", str(sweep), "--source", "s", "--system",
                       "dgx-a100")
    assert code == 1 and err == (f"Error: {sweep}: line 4: 8192x8192x8192 in 0.001 s is "
                                 f"1.1e+15 FLOP/s, 3.52x the system's peak_flops 3.12e+14: a "
                                 f"GEMM cannot beat the peak (check the time's unit, or the "
                                 f"system)\n")


def test_sizes_are_bounded(cli, tmp_path):
    rows = "".join(f"{m},1,1,1\n" for m in range(1, MAX_POINTS + 2))
    code, _, err = cli("system", "import", "gemm", str(write(tmp_path, "m,n,k,seconds\n" + rows)),
                       "--source", "s")
    assert code == 1 and f"line {MAX_POINTS + 2}: more than {MAX_POINTS} rows" in err
    code, _, err = cli("system", "import", "gemm",
                       str(write(tmp_path, "m,n,k,seconds\n" + " " * MAX_CSV_BYTES)),
                       "--source", "s")
    assert code == 1 and f"larger than {MAX_CSV_BYTES} bytes" in err


def test_bad_bases_and_sources(cli, tmp_path):
    sweep = str(write(tmp_path, SWEEP))
    code, _, err = cli("system", "import", "gemm", sweep, "--source", "s", "--system", "dgx-a10")
    assert code == 1 and "unknown system preset 'dgx-a10' (did you mean 'dgx-a100'?)" in err
    with_table = tmp_path / "with.toml"
    cli("system", "import", "gemm", sweep, "--source", "s", "--system", "dgx-a100", "-o",
        str(with_table))
    code, _, err = cli("system", "import", "gemm", sweep, "--source", "s", "--system",
                       str(with_table))
    assert code == 1 and err == (f"Error: {with_table}: already has a gemm_efficiency table; "
                                 f"remove it from the base system first (a system holds one)\n")
    code, _, err = cli("system", "import", "gemm", sweep, "--source", " ")
    assert code == 1 and "gemm_efficiency.source is empty" in err
    code, _, err = cli("system", "import", "gemm", sweep)
    assert code == 2 and "Missing option '--source'" in err
    code, _, err = cli("system", "import", "gemm", str(tmp_path / "none.csv"), "--source", "s")
    assert code == 1 and "none.csv: cannot read: No such file or directory" in err


def test_the_import_group_lists_its_kinds(cli):
    code, out, _ = cli("system", "import", "--help")
    assert code == 0 and "gemm" in out
