"""``tabsched system import gemm`` and ``nccl-tests`` (cli/system.py, costs/system_import.py):
a GEMM sweep CSV, nccl-tests' output, into a system TOML; every bad input one line naming the
file and line, exit 1."""

import pathlib

import pytest

from tabsched._untrusted import tomllib

from tabsched import load_system
from tabsched.costs._presets import preset_index
from tabsched.costs.gemm import MAX_CSV_BYTES, MAX_POINTS
from tabsched.costs.nccl import MAX_OUTPUT_BYTES, CollectiveTables
from tabsched.costs.nccl import MAX_POINTS as NCCL_MAX_POINTS
from tabsched.costs.system_import import MAX_FILES, gemm_system_toml, nccl_system_toml

DATA = pathlib.Path(__file__).resolve().parent / "data"
PLAIN = DATA / "a100-plain.toml"
SWEEP = "m,n,k,seconds\n1024,1024,1024,2e-5\n2048,2048,2048,1e-4\n"


def write(tmp_path, text, name="sweep.csv"):
    path = tmp_path / name
    path.write_bytes(text.encode("utf-8") if isinstance(text, str) else text)
    return path


def test_import_adds_the_table_to_the_base_system(cli, tmp_path):
    out = tmp_path / "mine.toml"
    code, _, err = cli("system", "import", "gemm", str(write(tmp_path, SWEEP)), "--system",
                       str(PLAIN), "--source", "my node, 2026-12-01", "-o", str(out))
    assert code == 0 and f"wrote {out}" in err
    text = out.read_text()
    assert text.startswith(PLAIN.read_text().rstrip("\n"))
    system = load_system(out)
    assert system.gemm_efficiency.source == "my node, 2026-12-01"
    assert system.gemm_efficiency.points[0] == (1024, 1024, 1024,
                                                2 * 1024**3 / (2e-5 * 312e12))
    base = load_system(PLAIN)
    assert system.replace(gemm_efficiency=None, name=base.name) == base


def test_import_replaces_the_table_of_a_base_that_has_one(cli, tmp_path):
    out = tmp_path / "mine.toml"
    code, _, err = cli("system", "import", "gemm", str(write(tmp_path, SWEEP)), "--system",
                       "dgx-a100", "--source", "my node, 2026-12-01", "-o", str(out))
    assert code == 0 and f"wrote {out}" in err
    text = out.read_text()
    assert text.count("[gemm_efficiency]\n") == 1 and "It replaces the base system's table." in text
    base, system = load_system("dgx-a100"), load_system(out)
    assert system.gemm_efficiency.source == "my node, 2026-12-01"
    # everything else is the preset's, its comments included
    assert system.replace(gemm_efficiency=base.gemm_efficiency, name=base.name) == base
    assert text.startswith(preset_index()["system"]["dgx-a100"].split("[gemm_efficiency]")[0]
                           .rstrip("\n"))


def test_a_table_that_cannot_be_cut_out_is_refused(cli, tmp_path):
    base = tmp_path / "inline.toml"
    base.write_text(PLAIN.read_text() + 'gemm_efficiency = {source = "x", points = '
                    '[[1024, 1024, 1024, 0.5], [2048, 2048, 2048, 0.6]]}\n')
    code, _, err = cli("system", "import", "gemm", str(write(tmp_path, SWEEP)), "--system",
                       str(base), "--source", "s")
    assert code == 1 and err == (f"Error: {base}: its gemm_efficiency table cannot be replaced "
                                 f"in place (write it as a [gemm_efficiency] section, or remove "
                                 f"it from the base system first)\n")


def test_import_without_a_system_prints_the_table(cli, tmp_path):
    code, out, _ = cli("system", "import", "gemm", str(write(tmp_path, SWEEP)), "--source", "s")
    assert code == 0
    assert out == ('[gemm_efficiency]\nsource = "s"\nseconds = [\n  [1024, 1024, 1024, 2e-05],\n'
                   '  [2048, 2048, 2048, 0.0001],\n]\n')


def test_the_example_system_is_what_the_import_writes():
    source = load_system(DATA / "a100-llmcompass.toml").gemm_efficiency.source
    assert gemm_system_toml(DATA / "a100-llmcompass-gemm.csv", source, str(PLAIN)) == \
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
    code, again, _ = cli("system", "import", "gemm", sweep, "--source", "t", "--system",
                         str(with_table))   # a second import replaces the first's table
    assert code == 0 and again.count("[gemm_efficiency]\n") == 1
    assert tomllib.loads(again)["gemm_efficiency"]["source"] == "t"
    code, _, err = cli("system", "import", "gemm", sweep, "--source", " ")
    assert code == 1 and "gemm_efficiency.source is empty" in err
    code, _, err = cli("system", "import", "gemm", sweep)
    assert code == 2 and "Missing option '--source'" in err
    code, _, err = cli("system", "import", "gemm", str(tmp_path / "none.csv"), "--source", "s")
    assert code == 1 and "none.csv: cannot read: No such file or directory" in err


def test_the_import_group_lists_its_kinds(cli):
    code, out, _ = cli("system", "import", "--help")
    assert code == 0 and "gemm" in out


# ------------------------------------------------------------------ nccl-tests
NCCL = DATA / "nccl-all-reduce-a100.txt"
NCCL_LINES = NCCL.read_text().splitlines()
#: The fixture's lines up to and including the table's header (its units line).
NCCL_HEAD = NCCL_LINES[:next(i for i, line in enumerate(NCCL_LINES) if "(elements)" in line) + 1]
HEAD_LINES = len(NCCL_HEAD)


def nccl_row(size, time_us, busbw, wrong="0", columns=None):
    """One table row as nccl-tests prints it (all-reduce of floats on 8 ranks)."""
    algbw = float(busbw) / 1.75 if busbw not in ("nan", "abc") else 0.0
    cells = [f"{size:>12}", f"{int(size) // 4 if str(size).isdigit() else 0:>12}", "   float",
             "   sum", "    -1", f"{time_us:>7}", f"{algbw:6.2f}", f"{busbw:>6}", f"{wrong:>6}",
             f"{time_us:>7}", f"{algbw:6.2f}", f"{busbw:>6}", "     0"]
    return "  ".join(cells[:columns])


def nccl_file(tmp_path, rows, head=None, name="all_reduce_perf.txt"):
    text = "\n".join((NCCL_HEAD if head is None else head) + rows) + "\n"
    return write(tmp_path, text, name)


GOOD_ROWS = [nccl_row(1048576, "92.79", "19.78"), nccl_row(2097152, "93.25", "39.36")]


def test_nccl_import_adds_the_tables_to_the_base_system(cli, tmp_path):
    out = tmp_path / "mine.toml"
    code, _, err = cli("system", "import", "nccl-tests", str(NCCL), "--system", str(PLAIN),
                       "--source", "my node", "-o", str(out))
    assert code == 0 and f"wrote {out}" in err
    assert out.read_text().startswith(PLAIN.read_text().rstrip("\n"))
    system = load_system(out)
    table = system.collective_bandwidth.table("all_reduce", "node", 8)
    assert table.source == "my node" and table.points[0] == (1048576.0, 19.78e9)
    assert system.replace(collective_bandwidth=None, name=str(PLAIN)) == load_system(PLAIN)


def test_nccl_import_replaces_only_the_base_tables_it_measures(cli, tmp_path):
    out = tmp_path / "mine.toml"
    code, _, _ = cli("system", "import", "nccl-tests", str(NCCL), "--system", "dgx-a100",
                     "--source", "my node", "-o", str(out))
    assert code == 0
    text = out.read_text()
    assert "They replace 1 of the base system's tables" in text
    base, system = load_system("dgx-a100"), load_system(out)
    assert system.collective_bandwidth.table("all_reduce", "node", 8).source == "my node"
    for collective in ("reduce_scatter", "all_gather"):   # the preset's, as they were
        assert (system.collective_bandwidth.table(collective, "node", 8)
                == base.collective_bandwidth.table(collective, "node", 8))
    assert len(system.collective_bandwidth.tables) == len(base.collective_bandwidth.tables)


def test_nccl_import_without_a_system_prints_the_tables(cli, tmp_path):
    code, out, _ = cli("system", "import", "nccl-tests", str(nccl_file(tmp_path, GOOD_ROWS)))
    assert code == 0 and out == (
        '[[collective_bandwidth]]\ncollective = "all_reduce"\ntier = "node"\nranks = 8\n'
        'source = "nccl-tests output all_reduce_perf.txt (nccl-tests 2.13.9)"\n'
        'busbw = [   # [bytes, bus bandwidth in B/s]\n  [1048576, 19780000000.0],\n'
        '  [2097152, 39360000000.0],\n]\n')


def test_the_nccl_example_system_is_what_the_import_writes():
    source = load_system(DATA / "a100-vtrain-nccl.toml").collective_bandwidth.tables[0].source
    assert nccl_system_toml([NCCL], source, str(PLAIN)) == \
        (DATA / "a100-vtrain-nccl.toml").read_text()


def test_files_of_one_collective_merge_and_others_are_tables_of_their_own(cli, tmp_path):
    first = nccl_file(tmp_path, GOOD_ROWS, name="a.txt")
    second = nccl_file(tmp_path, [GOOD_ROWS[1], nccl_row(4194304, "95.80", "76.62")],
                       name="b.txt")
    gather_head = [line.replace("all_reduce_perf", "all_gather_perf") for line in NCCL_HEAD]
    gather = nccl_file(tmp_path, [row.replace(" sum", "none") for row in GOOD_ROWS],
                       head=gather_head, name="c.txt")
    code, out, _ = cli("system", "import", "nccl-tests", str(first), str(second), str(gather),
                       "--source", "s")
    assert code == 0
    tables = CollectiveTables.from_value(tomllib.loads(out)["collective_bandwidth"])
    assert [len(table.points) for table in tables.tables] == [2, 3]
    assert [table.collective for table in tables.tables] == ["all_gather", "all_reduce"]


def test_the_collective_comes_from_the_file_its_name_or_the_flag(cli, tmp_path):
    head = [line for line in NCCL_HEAD if "Collective test" not in line]
    named = nccl_file(tmp_path, GOOD_ROWS, head=head, name="reduce_scatter_perf-8.log")
    code, out, _ = cli("system", "import", "nccl-tests", str(named))
    assert code == 0 and 'collective = "reduce_scatter"' in out
    unnamed = nccl_file(tmp_path, GOOD_ROWS, head=head, name="run.log")
    code, out, _ = cli("system", "import", "nccl-tests", str(unnamed), "--collective",
                       "all_gather")
    assert code == 0 and 'collective = "all_gather"' in out


def on_two_hosts(head, moved=(4, 5, 6, 7)):
    return [line.replace("dgxa100", " node02") if any(f"Rank  {rank} " in line
                                                      for rank in moved) else line
            for line in head]


def test_a_second_host_makes_the_tier_network_with_its_ranks_per_node(cli, tmp_path):
    path = nccl_file(tmp_path, GOOD_ROWS, head=on_two_hosts(NCCL_HEAD))
    code, out, _ = cli("system", "import", "nccl-tests", str(path))
    assert code == 0 and 'tier = "network"\nranks = 8\nper_node = 4\n' in out
    table = CollectiveTables.from_value(tomllib.loads(out)["collective_bandwidth"]).tables[0]
    assert table.key() == ("all_reduce", "network", 8, 4)


def test_ranks_spread_unevenly_over_hosts_are_refused(cli_error, tmp_path):
    path = nccl_file(tmp_path, GOOD_ROWS, head=on_two_hosts(NCCL_HEAD, moved=(7,)))
    assert "its ranks are spread unevenly over the hosts ('dgxa100' 7, 'node02' 1); tabsched " \
        "places groups evenly over nodes" in cli_error("system", "import", "nccl-tests", path)


def test_an_old_table_without_root_and_unchecked_rows_read(cli, tmp_path):
    head = [line.replace("    root", "").replace("(elements)        ", "(elements)")
            for line in NCCL_HEAD]
    rows = [" ".join(row.split()[:4] + row.split()[5:]) for row in GOOD_ROWS]
    rows = [row.rsplit(" ", 1)[0] + " N/A" for row in rows]
    code, out, err = cli("system", "import", "nccl-tests", str(nccl_file(tmp_path, rows,
                                                                          head=head)))
    assert code == 0, err
    assert "[2097152, 39360000000.0]" in out


def test_a_bandwidth_below_the_print_resolution_comes_from_the_time(cli, tmp_path):
    rows = [nccl_row(8, "10.00", "0.00"), GOOD_ROWS[0]]
    code, out, _ = cli("system", "import", "nccl-tests", str(nccl_file(tmp_path, rows)))
    assert code == 0 and f"[8, {8 * 1.75 / 1e-5!r}]" in out


def test_a_failed_nccl_import_leaves_the_output_as_it_was(cli, tmp_path):
    out = tmp_path / "mine.toml"
    out.write_text("old\n")
    bad = nccl_file(tmp_path, [GOOD_ROWS[0], nccl_row(2097152, "0.00", "39.36")])
    code, _, _ = cli("system", "import", "nccl-tests", str(bad), "--system", "dgx-a100",
                     "-o", str(out))
    assert code == 1 and out.read_text() == "old\n"
    assert set(tmp_path.iterdir()) == {out, bad}


HEADER_LINE = HEAD_LINES + 1


@pytest.mark.parametrize("rows, message", [
    ([nccl_row(2097152, "0.00", "39.36")], f"line {HEADER_LINE}: time 0.00 us must be > 0"),
    ([nccl_row(2097152, "-1.00", "39.36")], f"line {HEADER_LINE}: time -1.00 us must be > 0"),
    ([nccl_row(2097152, "nan", "39.36")], f"line {HEADER_LINE}: time 'nan' is not a finite "
                                          f"number"),
    ([nccl_row(2097152, "inf", "39.36")], f"line {HEADER_LINE}: time 'inf' is not a finite"),
    ([nccl_row(2097152, "93.25", "-39.36")], f"line {HEADER_LINE}: busbw -39.36 GB/s must be "
                                             f">= 0"),
    ([nccl_row(2097152, "93.25", "abc")], f"line {HEADER_LINE}: busbw 'abc' is not a finite"),
    ([nccl_row(2097152, "93.25", "39.36", wrong="3")],
     f"line {HEADER_LINE}: #wrong is 3 (out-of-place): the collective gave wrong results, so "
     f"the measurement is invalid"),
    ([nccl_row(2097152, "93.25", "39.36", columns=9)], f"line {HEADER_LINE}: 9 columns where "
                                                       f"the header has 13"),
    ([nccl_row("2e6", "93.25", "39.36")], f"line {HEADER_LINE}: size '2e6' is not a whole "
                                          f"number of bytes"),
    ([nccl_row(0, "93.25", "39.36"), GOOD_ROWS[0]], f"line {HEADER_LINE}: size must be > 0"),
    (GOOD_ROWS[::-1], f"line {HEADER_LINE + 1}: size 1.04858e+06 B is smaller than the row "
                      f"before (2.09715e+06 B): sizes must increase"),
    ([GOOD_ROWS[0], nccl_row(1048576, "93.00", "19.70")],
     f"line {HEADER_LINE + 1}: size 1.04858e+06 B is also on line {HEADER_LINE} with 19.78 "
     f"GB/s against 19.7 GB/s here"),
    ([GOOD_ROWS[0]], "all_reduce at 8 ranks has 1 size; a table needs at least 2"),
    ([], "no rows after the table's header"),
    (["a stray line"] + GOOD_ROWS, f"line {HEADER_LINE}: 3 columns where the header has 13"),
])
def test_bad_nccl_tables_are_one_line_naming_the_file_and_line(cli_error, tmp_path, rows,
                                                               message):
    path = nccl_file(tmp_path, rows)
    error = cli_error("system", "import", "nccl-tests", path)
    assert error.startswith(f"{path}: ") and message in error, error


def test_an_in_place_wrong_count_is_refused_too(cli_error, tmp_path):
    row = nccl_row(2097152, "93.25", "39.36")
    row = row[:row.rindex("0")] + "1"
    error = cli_error("system", "import", "nccl-tests", nccl_file(tmp_path, [GOOD_ROWS[0], row]))
    assert f"line {HEADER_LINE + 1}: #wrong is 1 (in-place)" in error


def drop(predicate):
    return [line for line in NCCL_HEAD if not predicate(line)]


@pytest.mark.parametrize("head, message", [
    (drop(lambda line: "nThread" in line), "no '# nThread ... nGpus ...' line: not "
                                           "nccl-tests' standard text output"),
    (drop(lambda line: "(elements)" in line or "#wrong" in line or "out-of-place" in line),
     f"line {HEAD_LINES - 2}: '1048576"),
    (drop(lambda line: "Rank" in line), "no '#  Rank N ... device' lines: the number of ranks "
                                        "is unknown"),
    (drop(lambda line: "Rank  7" in line or "Rank  6" in line or "Rank  5" in line
          or "Rank  4" in line or "Rank  3" in line or "Rank  2" in line or "Rank  1" in line),
     "one rank: a collective on one GPU moves nothing"),
    ([line.replace("Rank  3", "Rank  9") for line in NCCL_HEAD], "the Rank lines name ranks"),
    ([line.replace("Rank  3 ", "Rank x ") for line in NCCL_HEAD], "a Rank line without a rank "
                                                                 "number"),
    ([line.replace("busbw", "bw") for line in NCCL_HEAD], "is not nccl-tests' ('size count "
                                                          "type redop root time algbw busbw"),
    ([line.replace("all_reduce_perf", "broadcast_perf") for line in NCCL_HEAD],
     "program 'broadcast_perf' is not one of all_reduce_perf"),
    ([line.replace("all_reduce_perf", "alltoall_perf") for line in NCCL_HEAD],
     "all_to_all is measured, but tabsched prices no all_to_all"),
])
def test_bad_nccl_headers_are_one_line(cli_error, tmp_path, head, message):
    path = nccl_file(tmp_path, GOOD_ROWS, head=head)
    error = cli_error("system", "import", "nccl-tests", path)
    assert error.startswith(f"{path}: ") and message in error, error


def test_bad_nccl_files_and_flags(cli_error, cli, tmp_path):
    head = [line for line in NCCL_HEAD if "Collective test" not in line]
    unnamed = nccl_file(tmp_path, GOOD_ROWS, head=head, name="run.log")
    assert "which collective it measures is not in the file or its name; give --collective" \
        in cli_error("system", "import", "nccl-tests", unnamed)
    path = nccl_file(tmp_path, GOOD_ROWS)
    assert "the file measures all_reduce, not all_gather (drop --collective" in cli_error(
        "system", "import", "nccl-tests", path, "--collective", "all_gather")
    assert "its 8 ranks run on 1 host, so the tier is node, not network (--tier)" in cli_error(
        "system", "import", "nccl-tests", path, "--tier", "network")
    assert "cannot read: No such file or directory" in cli_error(
        "system", "import", "nccl-tests", tmp_path / "none.txt")
    assert "byte 0 is not UTF-8 text" in cli_error(
        "system", "import", "nccl-tests", write(tmp_path, b"\xff\n", "x.txt"))
    assert "line 2: contains a NUL byte" in cli_error(
        "system", "import", "nccl-tests", write(tmp_path, "#\n\x00\n", "y.txt"))
    big = write(tmp_path, "#" * (MAX_OUTPUT_BYTES + 1), "big.txt")
    assert f"larger than {MAX_OUTPUT_BYTES} bytes" in cli_error("system", "import",
                                                                 "nccl-tests", big)
    many = nccl_file(tmp_path, NCCL_LINES[HEAD_LINES:HEAD_LINES + 1] * (NCCL_MAX_POINTS + 1),
                     name="many.txt")
    assert f"more than {NCCL_MAX_POINTS} rows" in cli_error("system", "import", "nccl-tests",
                                                            many)
    assert f"at most {MAX_FILES} are read at once" in cli_error(
        "system", "import", "nccl-tests", *[path] * (MAX_FILES + 1))
    with_tables = tmp_path / "with.toml"
    cli("system", "import", "nccl-tests", str(path), "--system", "dgx-a100", "-o",
        str(with_tables))
    code, again, _ = cli("system", "import", "nccl-tests", str(path), "--source", "t",
                         "--system", str(with_tables))   # replaces the table it measures again
    assert code == 0 and [entry["source"] for entry in tomllib.loads(again)[
        "collective_bandwidth"] if entry["collective"] == "all_reduce"] == ["t"]
    assert "the system file must end in .toml, not .txt" in cli_error(
        "system", "import", "nccl-tests", path, "-o", tmp_path / "out.txt")
    other = nccl_file(tmp_path, [nccl_row(1048576, "92.00", "19.95"), GOOD_ROWS[1]],
                      name="other.txt")
    error = cli_error("system", "import", "nccl-tests", path, other)
    assert (f"{other}: line {HEADER_LINE}: size 1.04858e+06 B is also in {path} line "
            f"{HEADER_LINE}, with 19.78 GB/s against 19.95 GB/s here") in error


def test_a_debug_line_of_nccl_is_skipped(cli, tmp_path):
    rows = [GOOD_ROWS[0], "dgxa100:4242:4242 [0] NCCL INFO comm 0x55 rank 0 nranks 8",
            GOOD_ROWS[1]]
    code, out, _ = cli("system", "import", "nccl-tests", str(nccl_file(tmp_path, rows)))
    assert code == 0 and "[2097152, 39360000000.0]" in out


def test_the_import_group_lists_nccl_tests(cli):
    code, out, _ = cli("system", "import", "--help")
    assert code == 0 and "nccl-tests" in out
