"""`tabsched costs`, the parallelism options and the table level's slot lengths on the CLI."""

import csv
import io
import json

import pytest


def test_costs_lists_every_kernel_with_its_bound(cli):
    code, out, err = cli("costs", "gpt3-175b", "dgx-a100", "-t", "8", "--sequence-parallel")
    assert code == 0 and err == ""
    assert out.startswith("gpt3-175b on dgx-a100: one layer, microbatch of 1 sample x 2048 "
                          "tokens, one of 8 tensor ranks; recompute selective, eager attention, "
                          "sequence parallel")
    lines = out.splitlines()
    qkv = next(line for line in lines if line.startswith("F      qkv "))
    assert "232 GFLOP" in qkv and "compute" in qkv
    softmax = next(line for line in lines if line.startswith("F      softmax "))
    assert "memory" in softmax
    assert any("beside qkv_wgrad" in line for line in lines if line.startswith("I "))
    assert lines[-1].startswith("operations: F ")


def test_costs_json_totals_are_the_operation_times(cli):
    code, out, _ = cli("costs", "paper-128l", "mid_nw_mid_cp", "--part", "output", "--json")
    data = json.loads(out)
    assert code == 0 and data["part"] == "output" and data["costs"]["tensor_parallel"] == 1
    names = [row["name"] for row in data["kernels"]]
    assert names[:3] == ["final_layernorm", "logits", "logits_to_fp32"]
    forward = sum(row["seconds"] for row in data["kernels"] if row["phase"] == "F")
    assert data["totals"]["F"] == pytest.approx(forward)
    row = data["kernels"][1]
    assert set(row) == {"phase", "name", "class", "flops", "bytes_read", "bytes_written",
                        "bound", "efficiency", "seconds", "beside"}


@pytest.mark.parametrize("argv,message", [
    (["-t", "5"], "Error: --tensor-parallel/-t 5 does not divide hidden 12288 of model "
                  "gpt3-175b"),
    (["-t", "12"], "Error: --tensor-parallel/-t 12 is larger than a node of system dgx-a100 "
                   "(8 devices) but does not fill whole nodes: a tensor group would straddle "
                   "nodes"),
    (["-d", "0"], "Error: --data-parallel/-d must be >= 1, not 0"),
    (["-t", "0"], "Error: --tensor-parallel/-t must be >= 1, not 0"),
    (["--sequence-parallel"], "Error: --sequence-parallel needs --tensor-parallel/-t > 1"),
])
def test_bad_parallelism_is_one_line(cli, argv, message):
    for command in (["costs", "gpt3-175b", "dgx-a100"],
                    ["eval", "1f1b", "-p", "4", "-m", "4", "--model", "gpt3-175b",
                     "--system", "dgx-a100"]):
        code, out, err = cli(*command, *argv)
        assert code == 1 and out == "" and err.startswith(message) and err.count("\n") == 1


def test_parallel_options_need_a_model(cli):
    code, _, err = cli("eval", "1f1b", "-p", "4", "-m", "4", "-d", "2")
    assert code == 1 and err == "Error: --data-parallel/-d needs --model and --system\n"
    code, _, err = cli("adapt", "1f1b", "-p", "4", "-m", "4", "--memory-budget", "9",
                       "--attention", "flash")
    assert code == 1 and err == "Error: --attention needs --model and --system\n"


def test_eval_json_echoes_the_parallelism(cli):
    code, out, _ = cli("eval", "1f1b", "-p", "4", "-m", "8", "--model", "gpt3-175b",
                       "--system", "dgx-a100", "-t", "8", "--sequence-parallel", "-d", "2",
                       "--attention", "flash", "--optimizer-sharding", "--json")
    data = json.loads(out)
    assert code == 0
    assert {key: data["costs"][key] for key in ("tensor_parallel", "sequence_parallel",
                                                 "data_parallel", "attention",
                                                 "optimizer_sharding")} == {
        "tensor_parallel": 8, "sequence_parallel": True, "data_parallel": 2,
        "attention": "flash", "optimizer_sharding": True}
    # -d 2: every device ends with the gradient all-reduce and the optimizer step
    assert any(step["label"].startswith("optimizer") for step in data["critical_path"])


def test_compare_takes_slot_lengths_and_shows_them(cli):
    code, out, _ = cli("compare", "gpipe", "chimera", "-p", "8", "-m", "16", "--b", "2")
    assert code == 0
    assert "table (idle share, slot lengths F=1 B=2 I=1 W=1, no communication)" in out
    chimera = next(line for line in out.splitlines() if line.startswith("chimera"))
    assert "27.3%" in chimera                            # the paper's table shows about 26%
    code, out, _ = cli("compare", "chimera", "-p", "8", "-m", "16", "--json")
    data = json.loads(out)[0]
    assert data["table"]["bubble_ratio"] == pytest.approx(0.2727, abs=1e-4)   # B = 2 default
    assert data["table_lengths"] == {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0}
    code, out, _ = cli("compare", "chimera", "-p", "8", "-m", "16", "--b", "1", "--json")
    data = json.loads(out)[0]
    assert data["table"]["bubble_ratio"] == pytest.approx(6 / 38)      # the grid as drawn
    assert data["table_lengths"] == {"F": 1.0, "B": 1.0, "I": 1.0, "W": 1.0}


def test_compare_and_sweep_take_the_parallelism(cli, tmp_path):
    code, out, _ = cli("compare", "gpipe", "1f1b", "-p", "4", "-m", "8", "--model", "gpt3-175b",
                       "--system", "dgx-a100", "-t", "8", "--global-batch", "8")
    assert code == 0 and "tensor_parallel=8" in out.splitlines()[0]
    code, _, err = cli("compare", "gpipe", "-p", "4", "-m", "8", "--model", "gpt3-175b",
                       "--system", "dgx-a100", "-t", "7")
    assert code == 1 and err.startswith("Error: --tensor-parallel/-t 7 does not divide")
    path = tmp_path / "sweep.csv"
    code, _, _ = cli("sweep", "1f1b", "-p", "4", "-m", "8", "--models", "gpt3-175b",
                     "--systems", "dgx-a100", "-t", "8", "--b", "2", "-o", str(path))
    rows = list(csv.DictReader(io.StringIO(path.read_text())))
    assert code == 0 and rows[0]["status"] == "ok"
    assert rows[0]["slot_lengths"] == "F=1 B=2 I=1 W=1"
    assert json.loads(rows[0]["parallel"]) == {"tensor_parallel": 8}


def test_study_slot_lengths_and_their_errors(cli, tmp_path):
    code, _, err = cli("study", "megatron-recompute", "--b", "2", "-o", str(tmp_path))
    assert code == 1 and err.startswith("Error: --f/--b/--i/--w set the table level of "
                                        "tabular-paper")
    code, _, err = cli("compare", "gpipe", "-p", "4", "-m", "8", "--b", "-1")
    assert code == 1 and err == "Error: b must be finite and >= 0, not -1.0\n"


def test_a_tensor_group_across_nodes_runs_on_the_network(cli, tmp_path):
    """t = 16 on 8-GPU DGX A100 nodes: its collectives cross nodes, so a slower network
    makes the iteration slower, and a faster one never slower."""
    from tabsched.costs._presets import preset_index
    text = preset_index()["system"]["dgx-a100"]
    makespans = []
    for port in ("12.5GB/s", "25GB/s", "100GB/s"):
        path = tmp_path / f"a100-{port.replace('/', '')}.toml"
        path.write_text(text.replace('inter_node_bandwidth = "25GB/s"',
                                     f'inter_node_bandwidth = "{port}"'))
        code, out, err = cli("eval", "1f1b", "-p", "2", "-m", "4", "--model", "gpt3-175b",
                             "--system", str(path), "-t", "16", "--json")
        assert code == 0, err
        data = json.loads(out)
        assert data["execution"]["tensor_parallel"] == 16
        makespans.append(data["makespan"])
    assert makespans[0] > makespans[1] > makespans[2]


def test_a_bad_nic_count_in_a_system_file_is_one_line(cli, tmp_path):
    from tabsched.costs._presets import preset_index
    path = tmp_path / "cluster.toml"
    path.write_text(preset_index()["system"]["dgx-a100"].replace("nics_per_node = 8",
                                                                 "nics_per_node = 0"))
    code, out, err = cli("eval", "1f1b", "-p", "2", "-m", "4", "--model", "gpt3-175b",
                         "--system", str(path), "-t", "16")
    assert code == 1 and out == ""
    assert err == f"Error: {path}: nics_per_node must be a positive integer, not 0\n"
