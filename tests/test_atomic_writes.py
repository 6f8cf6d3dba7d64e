"""Every file tabsched writes is written whole or not at all (issue 13).

A write interrupted part-way -- here by ``RLIMIT_FSIZE`` in a subprocess, with
SIGXFSZ ignored so that ``write`` fails with EFBIG as on a full disk -- must
leave the previous file as it was and no partial or temporary file behind, and
report one line naming the file. Output paths that cannot work are refused
before the work, not after it.
"""

import os
import subprocess
import sys
import textwrap

import pytest

from tabsched import OutputError, atomic_write, generate, write_table
from tabsched.pytorch import write_pytorch

#: Bytes a limited subprocess may write to one file; every output below is larger.
LIMIT = 256
PREVIOUS = "the previous content, which must survive\n"

LIMITED = textwrap.dedent(f"""
    import resource, signal, sys
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # write() then fails with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, ({LIMIT}, {LIMIT}))
    sys.dont_write_bytecode = True
""")


def run_limited(code, cwd):
    """Run ``code`` in a Python whose files may not grow past LIMIT bytes."""
    environment = dict(os.environ, MPLBACKEND="Agg", PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run([sys.executable, "-c", LIMITED + textwrap.dedent(code)], cwd=cwd,
                          capture_output=True, text=True, timeout=120, env=environment)


def run_cli_limited(argv, cwd):
    return run_limited(f"from tabsched.cli import main; main({list(map(str, argv))!r})", cwd)


def assert_left_intact(folder, target, result):
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("Error: ") and "File too large" in lines[-1], result.stderr
    assert "Traceback" not in result.stderr
    assert target.read_text() == PREVIOUS
    assert sorted(os.listdir(folder)) == [target.name]   # no partial or temporary file


CLI_WRITERS = [
    ("convert-json", lambda out: ["convert", "1f1b", "-p", "4", "-m", "8", out], "t.json"),
    ("convert-csv", lambda out: ["convert", "1f1b", "-p", "4", "-m", "8", out,
                                 "--drop-metadata"], "t.csv"),
    ("convert-comms", lambda out: ["convert", "1f1b", "-p", "4", "-m", "8", out, "--to",
                                   "torch-comms", "--drop-metadata"], "t.csv"),
    ("sweep", lambda out: ["sweep", "gpipe", "-p", "2", "-m", "2", "--systems",
                           "mid_nw_mid_cp", "-o", out], "sweep.csv"),
    ("trace", lambda out: ["trace", "1f1b", "-p", "2", "-m", "4", "-o", out], "trace.json"),
    ("plot", lambda out: ["plot", "gantt", "1f1b", "-p", "2", "-m", "2", "-o", out], "g.svg"),
    ("adapt", lambda out: ["adapt", "1f1b", "-p", "2", "-m", "4", "--memory-budget", "8",
                           "--max-rounds", "1", "--samples", "4", "--out", out], "a.json"),
]


@pytest.mark.parametrize("name,argv,filename", CLI_WRITERS, ids=[case[0] for case in CLI_WRITERS])
def test_an_interrupted_cli_write_leaves_the_previous_file(tmp_path, name, argv, filename):
    if name == "plot":
        pytest.importorskip("matplotlib")
    folder = tmp_path / "out"
    folder.mkdir()
    target = folder / filename
    target.write_text(PREVIOUS)
    result = run_cli_limited(argv(target), tmp_path)
    assert_left_intact(folder, target, result)
    assert str(target) in result.stderr


def test_an_interrupted_study_leaves_the_previous_files(tmp_path):
    pytest.importorskip("matplotlib")
    folder = tmp_path / "study"
    folder.mkdir()
    target = folder / "sweep.csv"
    target.write_text(PREVIOUS)
    code = """
        import tabsched.study as study
        study.STUDIES["tiny"] = dict(study.STUDIES["tabular-paper"], specs=("gpipe",),
                                     devices=(2,), microbatches=(2,), systems=("mid_nw_mid_cp",))
        from tabsched.cli import main
        main(["study", "tiny", "-o", "study"])
    """
    assert_left_intact(folder, target, run_limited(code, tmp_path))


@pytest.mark.parametrize("writer", ["write_table_csv", "write_table_json", "write_pytorch",
                                    "write_pytorch_comms"])
def test_an_interrupted_api_write_leaves_the_previous_file(tmp_path, writer):
    folder = tmp_path / "out"
    folder.mkdir()
    target = folder / ("t.json" if writer.endswith("json") else "t.csv")
    target.write_text(PREVIOUS)
    call = {"write_table_csv": "write_table(table, path, drop_metadata=True)",
            "write_table_json": "write_table(table, path)",
            "write_pytorch": "write_pytorch(table, path, drop_metadata=True)",
            "write_pytorch_comms": "write_pytorch(table, path, format='compute_comms', "
                                   "drop_metadata=True)"}[writer]
    code = f"""
        from tabsched import OutputError, generate, write_table, write_pytorch
        table = generate("1f1b", devices=4, microbatches=8)
        path = {str(target)!r}
        try:
            {call}
        except OutputError as error:
            print("Error:", error, file=sys.stderr)
            sys.exit(1)
    """
    result = run_limited(code, tmp_path)
    assert_left_intact(folder, target, result)
    assert f"Error: {target}: cannot write: File too large; the previous file, if any, is " \
           f"unchanged" == result.stderr.strip()


def test_a_write_that_raises_removes_its_temporary_file(tmp_path):
    target = tmp_path / "t.txt"
    target.write_text(PREVIOUS)

    def broken(path):
        with open(path, "w") as handle:
            handle.write("half")
        raise OSError(28, "No space left on device")
    with pytest.raises(OutputError, match=r"t\.txt: cannot write: No space left on device"):
        atomic_write(target, write=broken)
    with pytest.raises(KeyboardInterrupt):
        atomic_write(target, write=lambda path: (_ for _ in ()).throw(KeyboardInterrupt()))
    assert target.read_text() == PREVIOUS and os.listdir(tmp_path) == ["t.txt"]
    atomic_write(target, "new\n")
    assert target.read_text() == "new\n"


def test_a_new_file_gets_the_usual_permissions_and_a_replaced_one_keeps_its_own(tmp_path):
    umask = os.umask(0o022)
    try:
        fresh = tmp_path / "fresh.json"
        write_table(generate("gpipe", devices=2, microbatches=2), fresh)
        assert fresh.stat().st_mode & 0o777 == 0o644
        kept = tmp_path / "kept.csv"
        kept.write_text(PREVIOUS)
        kept.chmod(0o600)
        write_pytorch(generate("gpipe", devices=2, microbatches=2), kept, drop_metadata=True)
        assert kept.stat().st_mode & 0o777 == 0o600
    finally:
        os.umask(umask)


# ------------------------------------------------------ paths checked before the work
def refuse_work(monkeypatch, module, name):
    """Make ``module.name`` fail the test if the command gets that far."""
    def too_late(*args, **kwargs):
        raise AssertionError(f"{name} ran before the output path was checked")
    monkeypatch.setattr(module, name, too_late)


def test_output_paths_are_checked_before_the_work(cli, tmp_path, monkeypatch):
    import tabsched.adapt
    import tabsched.cli.build
    import tabsched.study
    import tabsched.sweeps
    refuse_work(monkeypatch, tabsched.sweeps, "run_sweep")
    refuse_work(monkeypatch, tabsched.study, "run_sweep")
    refuse_work(monkeypatch, tabsched.adapt, "adapt")
    refuse_work(monkeypatch, tabsched.cli.build, "load_with_torch")
    existing = tmp_path / "existing"
    existing.write_text(PREVIOUS)
    missing = tmp_path / "no" / "such" / "folder"
    cases = [
        (["study", "tabular-paper", "-o", existing],
         f"{existing}: exists and is not a folder; give a folder for the output"),
        (["study", "tabular-paper", "-o", existing / "sub"],
         f"{existing / 'sub'}: cannot make this folder: {existing} is a file"),
        (["sweep", "gpipe", "-p", "2", "-m", "2", "-o", missing / "s.csv"],
         f"{missing / 's.csv'}: the folder {missing} does not exist"),
        (["sweep", "gpipe", "-p", "2", "-m", "2", "-o", tmp_path],
         f"{tmp_path}: is a folder; give the output file's name"),
        (["adapt", "1f1b", "-p", "2", "-m", "4", "--memory-budget", "8", "--out",
          tmp_path / "x.csv"], f"--out {tmp_path / 'x.csv'}: write the adapted table as .json"),
        (["adapt", "1f1b", "-p", "2", "-m", "4", "--memory-budget", "8", "--out",
          missing / "x.json"], f"{missing / 'x.json'}: the folder {missing} does not exist"),
        (["trace", "1f1b", "-p", "2", "-m", "4", "-o", missing / "t.json"],
         f"{missing / 't.json'}: the folder {missing} does not exist"),
        (["plot", "gantt", "1f1b", "-p", "2", "-m", "4", "-o", tmp_path / "g.txt"],
         f"{tmp_path / 'g.txt'}: pictures are written as .png, .svg, .pdf, not .txt"),
        (["plot", "memory", "1f1b", "-p", "2", "-m", "4", "-o", missing / "m.png"],
         f"{missing / 'm.png'}: the folder {missing} does not exist"),
        (["convert", "1f1b", "-p", "2", "-m", "4", missing / "c.json"],
         f"{missing / 'c.json'}: the folder {missing} does not exist"),
    ]
    for argv, message in cases:
        code, _, err = cli(*map(str, argv))
        assert (code, err) == (1, f"Error: {message}\n") or (
            code == 1 and err.startswith(f"Error: {message}") and err.count("\n") == 1), err
    assert existing.read_text() == PREVIOUS


# ------------------------------------------------- outputs that would replace the wrong file
@pytest.fixture
def table_file(tmp_path):
    path = tmp_path / "t.json"
    write_table(generate("1f1b", devices=2, microbatches=2), path)
    return path


@pytest.mark.parametrize("argv", [
    ["trace", "{t}", "-o", "{t}"],
    ["convert", "{t}", "{t}"],
])
def test_an_output_that_is_the_commands_input_is_refused(cli, table_file, argv):
    before = table_file.read_bytes()
    code, _, err = cli(*[part.format(t=table_file) for part in argv])
    assert code == 1 and "is also this command's input" in err
    assert table_file.read_bytes() == before


def test_an_execution_file_is_not_written_over_by_the_execution_it_describes(cli, tmp_path):
    path = tmp_path / "run.toml"
    code, _, _ = cli("execution", "-t", "2", "-o", str(path))
    assert code == 0
    before = path.read_bytes()
    code, _, err = cli("execution", "--execution", str(path), "-t", "4", "-o", str(path))
    assert code == 1 and "is also this command's input" in err
    assert path.read_bytes() == before


def test_an_output_that_names_the_input_through_a_link_or_another_name(cli, table_file):
    other_name = table_file.parent / "." / table_file.name
    code, _, err = cli("trace", str(table_file), "-o", str(other_name))
    assert code == 1 and "is also this command's input" in err
    hard = table_file.parent / "hard.json"
    os.link(table_file, hard)
    code, _, err = cli("trace", str(hard), "-o", str(table_file))
    assert code == 1 and "is also this command's input" in err


def test_a_symbolic_link_or_a_fifo_is_never_replaced_by_a_plain_file(cli, table_file, tmp_path):
    link = tmp_path / "link.json"
    link.symlink_to(table_file)
    code, _, err = cli("trace", str(table_file), "-o", str(link))
    assert code == 1 and "is a symbolic link; writing would replace the link" in err
    assert link.is_symlink()
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    code, _, err = cli("convert", str(table_file), str(fifo))
    assert code == 1 and "exists and is not a regular file (a FIFO or a device)" in err
    assert not fifo.is_file() and fifo.exists()


def test_system_import_does_not_write_over_its_csv_or_base(cli, tmp_path):
    csv = tmp_path / "gemm.csv"
    csv.write_text("m,n,k,seconds\n2048,12288,12288,2.3586e-3\n8192,8192,8192,3.9614e-3\n")
    base = tmp_path / "base.toml"
    code, text, _ = cli("system", "import", "gemm", str(csv), "--system", "dgx-a100",
                        "--source", "two points")
    assert code == 0
    base.write_text(text)
    code, _, err = cli("system", "import", "gemm", str(csv), "--system", str(base),
                       "--source", "two points", "-o", str(base))
    assert code == 1 and "is also this command's input" in err
