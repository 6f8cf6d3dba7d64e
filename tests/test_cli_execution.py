"""--execution FILE on every command that evaluates, flags over the file, and the echo."""

import json

import pytest

from tabsched import Execution, load_execution

MODEL = ("--model", "paper-128l", "--system", "dgx-h100")


@pytest.fixture
def run_file(tmp_path):
    def write(text, name="run.toml"):
        path = tmp_path / name
        path.write_text(text)
        return str(path)
    return write


def test_a_file_gives_what_its_flags_give_and_json_echoes_it(cli, run_file):
    path = run_file('tensor_parallel = 2\ndata_parallel = 4\nrecompute = "full"\n'
                    'zero_stage = 1\ncontention = "none"\nmicrobatch_size = 2\n')
    code, by_file, _ = cli("eval", "1f1b", "-p", "4", "-m", "8", *MODEL, "--execution", path,
                           "--json")
    assert code == 0
    code, by_flags, _ = cli("eval", "1f1b", "-p", "4", "-m", "8", *MODEL, "-t", "2", "-d", "4",
                            "--recompute", "full", "--optimizer-sharding", "--contention",
                            "none", "--microbatch-size", "2", "--json")
    assert code == 0 and json.loads(by_file) == json.loads(by_flags)
    echoed = json.loads(by_file)["execution"]
    assert echoed["tensor_parallel"] == 2 and echoed["zero_stage"] == 1
    assert echoed["devices_per_node"] == 8 and echoed["optimizer_step"] is True   # resolved


def test_the_echo_is_a_file_that_runs_the_same(cli, tmp_path):
    code, out, _ = cli("eval", "zbv", "-p", "4", "-m", "8", *MODEL, "-t", "4",
                       "--sequence-parallel", "--attention", "flash", "--json")
    first = json.loads(out)
    path = tmp_path / "echo.json"
    path.write_text(json.dumps(first["execution"]))
    code, again, _ = cli("eval", "zbv", "-p", "4", "-m", "8", *MODEL, "--execution", str(path),
                         "--json")
    assert code == 0 and json.loads(again) == first


def test_flags_override_the_file(cli, run_file):
    path = run_file("tensor_parallel = 8\ncontention = \"nic\"\n")
    code, out, _ = cli("eval", "1f1b", "-p", "4", "-m", "8", *MODEL, "--execution", path,
                       "-t", "2", "--contention", "link", "--json")
    echoed = json.loads(out)["execution"]
    assert code == 0 and (echoed["tensor_parallel"], echoed["contention"]) == (2, "link")


def test_a_global_batch_gives_the_microbatches(cli, run_file):
    path = run_file("data_parallel = 4\nmicrobatch_size = 2\nglobal_batch = 128\n")
    code, out, _ = cli("eval", "1f1b", "-p", "4", *MODEL, "--execution", path, "--json")
    assert code == 0 and json.loads(out)["num_microbatches"] == 16


@pytest.mark.parametrize("text, args, message", [
    ("tensor_paralel = 2\n", MODEL,
     "run.toml: unknown key 'tensor_paralel' (did you mean 'tensor_parallel'?)"),
    ("data_parallel = \"4\"\n", MODEL, "run.toml: data_parallel must be an integer >= 1, "
                                       "not '4'"),
    ("tensor_parallel = 3\n", MODEL, "run.toml: tensor_parallel 3 does not divide hidden 4096 "
                                     "of model paper-128l"),
    ("tensor_parallel = 16\ndevices_per_node = 6\n", MODEL,
     "run.toml: tensor_parallel 16 is larger than a node of system dgx-h100 (6 devices) but "
     "does not fill whole nodes: a tensor group would straddle nodes"),
    ("tensor_parallel = 2\ndata_parallel = 3\n", MODEL,
     "the 6 devices of a pipeline rank (tensor x context x data parallel) neither divide "
     "nor fill the 8-device nodes of system dgx-h100"),
    ("global_batch = 100\ndata_parallel = 8\nmicrobatch_size = 2\n", MODEL,
     "run.toml: global_batch 100 is not divisible by data_parallel 8 x microbatch_size 2 = 16 "
     "(each replica runs whole microbatches)"),
    ("zero_stage = 3\n", MODEL, "run.toml: zero_stage 3 with data_parallel 1 shards nothing"),
    ("zero_stage = 5\n", MODEL, "run.toml: zero_stage 5 is not a ZeRO stage"),
    ("zero_stage = 3\ndata_parallel = 2\nprefetch = -2\n", MODEL,
     "run.toml: prefetch must be an integer >= 0, not -2"),
    ("tensor_parallel = 2\n", (), "run.toml: tensor_parallel 2 needs --model and --system"),
    ("recompute = \"full\"\n", ("--comm", "1"), "run.toml: recompute 'full' needs --model and "
                                               "--system"),
    ("contention = \"nic\"\n", ("--comm", "1"), "run.toml: contention 'nic' needs --system"),
    ("tensor_parallel = [\n", MODEL, "run.toml: not valid TOML"),
])
def test_a_bad_file_is_one_line_naming_the_file_and_key(cli_error, run_file, text, args,
                                                        message):
    path = run_file(text)
    error = cli_error("eval", "1f1b", "-p", "4", "-m", "8", *args, "--execution", path)
    assert error.replace(path, "run.toml").startswith(message), error


def test_a_missing_file_and_a_bad_json_file_are_one_line(cli_error, run_file, tmp_path):
    assert "No such file or directory" in cli_error("eval", "1f1b", "-p", "2", "-m", "2",
                                                    "--execution", tmp_path / "none.toml")
    path = run_file("[1, 2]", "run.json")
    assert cli_error("eval", "1f1b", "-p", "2", "-m", "2", "--execution", path).endswith(
        "an execution is a table of keys, not [1, 2]")


@pytest.mark.parametrize("command", [
    ("compare", "1f1b", "zbv", "-p", "4", "-m", "8", "--system", "dgx-h100", "--json"),
    ("adapt", "1f1b", "-p", "4", "-m", "8", *MODEL, "--memory-budget", "80GB", "--samples",
     "8", "--max-rounds", "1", "--json"),
    ("costs", "paper-128l", "dgx-h100", "--json"),
])
def test_every_evaluating_command_takes_the_file_and_echoes_it(cli, run_file, command):
    path = run_file("tensor_parallel = 4\nrecompute = \"full\"\n")
    code, out, err = cli(*command, "--execution", path)
    assert code == 0, err
    data = json.loads(out)
    for echoed in (data if isinstance(data, list) else [data]):
        assert echoed["execution"]["tensor_parallel"] == 4
        assert echoed["execution"]["recompute"] == "full"


def test_sweep_starts_every_configuration_from_the_file(cli, run_file, tmp_path):
    path = run_file("tensor_parallel = 2\ndata_parallel = 2\nglobal_batch = 64\n")
    out = tmp_path / "sweep.csv"
    code, _, err = cli("sweep", "1f1b", "-p", "4", "-m", "8,16", "--system", "dgx-h100",
                       "--execution", path, "-o", out)
    assert code == 0, err
    import csv
    rows = list(csv.DictReader(out.open()))
    assert [int(row["microbatch_size"]) for row in rows] == [4, 2]   # 64 / (2 replicas x M)
    assert json.loads(rows[0]["parallel"]) == {"tensor_parallel": 2, "data_parallel": 2,
                                               "global_batch": 64}


def test_the_execution_command_checks_fills_and_writes(cli, cli_error, tmp_path):
    out = tmp_path / "run.toml"
    code, _, err = cli("execution", "--model", "gpt3-175b", "--system", "dgx-a100", "-t", "8",
                       "-d", "4", "--global-batch", "512", "--microbatch-size", "1", "-o", out)
    assert code == 0 and "wrote" in err
    text = out.read_text()
    assert text.startswith("# gpt3-175b on dgx-a100: groups tensor 8 (inside a node), data 4 "
                           "(across 4 nodes, 1 per node); 1 pipeline rank per node\n")
    assert load_execution(out) == Execution(
        tensor_parallel=8, data_parallel=4, global_batch=512, microbatch_size=1,
        recompute="selective", contention="link", devices_per_node=8, blocking_sends=False, p2p="free",
        optimizer_step=True)
    code, printed, _ = cli("execution", "-t", "2", "--json")
    assert code == 0 and json.loads(printed)["tensor_parallel"] == 2
    assert cli_error("execution", "--model", "gpt3-175b", "--system", "dgx-a100", "-t", "5") \
        == "--tensor-parallel/-t 5 does not divide hidden 12288 of model gpt3-175b"


@pytest.mark.parametrize("flags,message", [
    (["--overlap-grad-reduce"], "--overlap-grad-reduce needs --data-parallel/-d > 1: with one "
                                "replica the overlapped data-parallel reduction changes nothing"),
    (["--optimizer-sharding"], "--optimizer-sharding needs --data-parallel/-d > 1"),
    (["--zero", "1"], "--zero 1 needs --data-parallel/-d > 1"),
    (["-d", "1", "--overlap-grad-reduce"], "--overlap-grad-reduce needs"),
])
def test_data_parallel_settings_without_replicas_are_refused(cli, flags, message):
    code, out, err = cli("eval", "1f1b", "-p", "2", "-m", "4", *MODEL, *flags)
    assert code == 1 and out == "" and message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    # with replicas they run
    setting = [flag for flag in flags if flag not in ("-d", "1")] if flags[0] == "-d" \
        else flags
    assert cli("eval", "1f1b", "-p", "2", "-m", "4", *MODEL, *setting, "-d", "2")[0] == 0


def test_a_file_with_a_replica_setting_and_one_replica_is_named(cli, run_file):
    path = run_file("overlap_grad_reduce = true\n")
    code, _, err = cli("eval", "1f1b", "-p", "2", "-m", "4", *MODEL, "--execution", path)
    assert code == 1 and err.strip() == (f"Error: {path}: overlap_grad_reduce needs "
                                         f"--data-parallel/-d > 1: with one replica the "
                                         f"overlapped data-parallel reduction changes nothing")
    assert cli("eval", "1f1b", "-p", "2", "-m", "4", *MODEL, "--execution", path,
               "-d", "2")[0] == 0
    # the execution command writes bases for a later -d: it keeps the setting
    code, out, _ = cli("execution", "--overlap-grad-reduce")
    assert code == 0 and "overlap_grad_reduce = true" in out


@pytest.mark.parametrize("text,message", [
    ("grad_bucket_size = 1000000\ndata_parallel = 2\n",
     "grad_bucket_size applies to the overlapped reduction only"),
    ('cp_comm = "allgather"\n', "cp_comm applies to --context-parallel > 1 only"),
])
def test_a_file_setting_that_does_nothing_is_named(cli, run_file, text, message):
    path = run_file(text)
    code, _, err = cli("eval", "1f1b", "-p", "2", "-m", "4", *MODEL, "--execution", path)
    assert code == 1 and err.startswith(f"Error: {path}: {message}")
    assert len(err.strip().splitlines()) == 1
