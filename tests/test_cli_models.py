"""The CLI with --model/--system, --memory-budget/--strict, and `tabsched presets`."""

import json

import pytest

EVAL = ["eval", "1f1b", "--devices", "8", "--microbatches", "32"]
PAPER = ["--model", "paper-128l", "--system", "mid_nw_mid_cp"]


def test_eval_paper_model_in_seconds_and_bytes(cli):
    code, out, err = cli(*EVAL, *PAPER)
    assert code == 0 and err == ""
    assert "level         simulation (ModelCosts transformer=paper-128l " in out
    assert "contention link" in out
    assert "makespan      8.28 s" in out   # a roofline per kernel (issue 11); bias grads, two-pass norm backward (issue 22)
    # activations 73.1 GB and one layer's backward working memory 4.9 GB
    assert "peak memory   133 GB on d0 (54.9 GB persistent + 78 GB activations)" in out
    assert "peak activations" in out and "d7" in out


def test_eval_json_is_in_si_units(cli):
    code, out, _ = cli(*EVAL, *PAPER, "--json")
    data = json.loads(out)
    assert code == 0
    assert data["time_unit"] == "s" and data["memory_unit"] == "bytes"
    assert data["makespan"] == pytest.approx(8.277, abs=1e-3)
    assert data["devices"][0]["persistent_memory"] == pytest.approx(54.895e9, rel=1e-4)
    assert data["costs"]["transformer"] == "paper-128l"


def test_memory_budget_reports_and_strict_exits_3(cli):
    code, out, err = cli(*EVAL, *PAPER, "--memory-budget", "80GB")
    assert code == 0 and err == ""
    assert "memory budget 80 GB: 6 of 8 devices over (worst d0 by 52.9 GB at " in out
    code, out, err = cli(*EVAL, *PAPER, "--memory-budget", "80GB", "--strict")
    assert code == 3 and "makespan" in out
    assert err.startswith("Error: memory budget 80 GB exceeded on 6 of 8 devices: d0 by 52.9 GB")
    assert err.count("\n") == 1
    code, out, err = cli(*EVAL, *PAPER, "--recompute", "full", "--memory-budget", "capacity",
                         "--strict")
    assert code == 0 and "memory budget 80 GB: every device fits" in out


def test_model_options_reach_the_costs(cli, tmp_path):
    code, out, _ = cli(*EVAL, *PAPER, "--microbatch-size", "2", "--recompute", "full",
                       "--contention", "nic", "--grad-sync", "all", "--optimizer", "--json")
    data = json.loads(out)
    assert code == 0 and data["contention"] == "nic"
    assert data["costs"]["microbatch_size"] == 2 and data["costs"]["recompute"] == "full"
    assert any(step["label"].startswith("optimizer") for step in data["critical_path"])
    system = tmp_path / "two.toml"
    system.write_text('peak_flops = "1PFLOP/s"\nmemory_bandwidth = "3.35TB/s"\n'
                      'devices_per_node = 4\nintra_node_bandwidth = "450GB/s"\n'
                      'intra_node_latency = "2us"\ninter_node_bandwidth = "5GB/s"\n'
                      'inter_node_latency = "10us"\n')
    code, out, _ = cli(*EVAL, "--model", "paper-128l", "--system", str(system), "--json")
    data = json.loads(out)
    assert code == 0 and data["costs"]["system"] == str(system)
    links = {(link["src"], link["dst"]): link["busy"] for link in data["links"]}
    assert links[3, 4] > 50 * links[2, 3]          # the link between the two nodes is slow


def test_presets_lists_models_and_systems(cli):
    code, out, _ = cli("presets")
    assert code == 0
    for name in ("paper-128l", "gpt3-175b", "llama3-8b", "llama3-70b", "dgx-h100", "dgx-a100",
                 "gb200-nvl72", "slow_nw_slow_cp", "mid_nw_mid_cp", "fast_nw_fast_cp"):
        assert name in out
    assert "8.03B" in out and "450 GB/s, 2 us" in out and "1 PFLOP/s x 1" in out
    code, out, _ = cli("presets", "--json")
    data = json.loads(out)
    assert {m["name"] for m in data["models"]} >= {"paper-128l", "llama3-70b"}
    h100 = next(s for s in data["systems"] if s["name"] == "dgx-h100")
    assert h100["intra_node_bandwidth"] == 450e9 and h100["memory_capacity"] == 80e9
    code, out, _ = cli("presets", "--show", "dgx-h100")
    assert code == 0 and 'intra_node_bandwidth = "450GB/s"' in out


def test_a_shown_preset_is_a_valid_user_file(cli, tmp_path):
    _, text, _ = cli("presets", "--show", "paper-128l")
    path = tmp_path / "mine.toml"
    path.write_text(text.replace("layers = 128", "layers = 64"))
    code, out, _ = cli(*EVAL, "--model", str(path), "--system", "mid_nw_mid_cp", "--json")
    assert code == 0 and json.loads(out)["makespan"] < 4.5   # half of 128 layers' 8.06 s


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


MODEL_KEYS = 'layers = 128\nhidden = 4096\nheads = 32\nsequence = 4096\nvocab = 51200\n'
SYSTEM_KEYS = ('peak_flops = "1PFLOP/s"\nmemory_bandwidth = "3.35TB/s"\ndevices_per_node = 8\n'
               'intra_node_bandwidth = "50GB/s"\nintra_node_latency = "500ns"\n'
               'inter_node_bandwidth = "50GB/s"\ninter_node_latency = "500ns"\n')


@pytest.mark.parametrize("argv,message", [
    (["--model", "paper-12l", "--system", "mid_nw_mid_cp"],
     "unknown model preset 'paper-12l' (did you mean 'paper-128l'?); valid models: deepseek-v3-14l, "),
    (["--model", "paper-128l", "--system", "h100"],
     "unknown system preset 'h100'"),
    (["--model", "MODEL:" + MODEL_KEYS.replace("hidden = 4096\n", ""), "--system",
      "mid_nw_mid_cp"], "model.toml: missing key 'hidden'"),
    (["--model", "MODEL:" + MODEL_KEYS + "recomptue = 'full'\n", "--system", "mid_nw_mid_cp"],
     "model.toml: unknown key 'recomptue' (did you mean 'recompute'?)"),
    (["--model", "paper-128l", "--system",
      "SYSTEM:" + SYSTEM_KEYS.replace('"50GB/s"\nintra', '"-50GB/s"\nintra')],
     "system.toml: intra_node_bandwidth must be > 0, not '-50GB/s'"),
    (["--model", "paper-128l", "--system", "SYSTEM:" + SYSTEM_KEYS + "contention = 'bus'\n"],
     "system.toml: contention 'bus' is not one of none, link, nic"),
    (["--model", "MODEL:" + MODEL_KEYS.replace("128", "100"), "--system", "mid_nw_mid_cp"],
     "has 100 layers, which do not split evenly over the table's 8 stages"),
    (PAPER + ["--microbatch-size", str(2**24)],   # the largest sane microbatch_size
     "microbatch_size 16777216 makes the activations of one iteration"),
    (PAPER + ["--memory-budget", "80XB"], "memory_budget: '80XB' is not a size"),
    (PAPER + ["--memory-budget", "-80GB"], "memory_budget must be > 0, not '-80GB'"),
    (PAPER + ["--strict"], "--strict needs --memory-budget"),
    (PAPER + ["--grad-sync", "some"], "--grad-sync 'some' is not 'replicas', 'all' or a "),
    (PAPER + ["--f", "2"], "--model and --system replace --f; give one or the other"),
    (["--model", "paper-128l"], "--model needs --system (see `tabsched presets`)"),
    (["--system", "mid_nw_mid_cp"], "--system needs --model"),
    (["--recompute", "full"], "--recompute needs --model and --system"),
    (["--memory-budget", "capacity"], "--memory-budget capacity needs a --system"),
    (["--contention", "nic"], "--contention nic needs --system (it says which devices"),
])
def test_bad_model_input_is_one_line_and_exit_1(cli, tmp_path, argv, message):
    argv = [write(tmp_path, "model.toml", value[6:]) if value.startswith("MODEL:")
            else write(tmp_path, "system.toml", value[7:]) if value.startswith("SYSTEM:")
            else value for value in argv]
    code, out, err = cli(*EVAL, *argv)
    assert code == 1, out
    assert err.count("\n") == 1 and err.startswith("Error: ")
    assert message in err


def test_unknown_preset_to_show(cli):
    code, _, err = cli("presets", "--show", "dgx-b200")
    assert code == 1 and err.count("\n") == 1
    assert "unknown preset 'dgx-b200'; valid presets: deepseek-v3-14l, " in err


def test_eval_says_when_a_device_goes_over_the_systems_memory(cli):
    """Without --memory-budget, model costs on a system that states its memory_capacity
    check every device against it (133 GB on an 80 GB device used to pass without a word)."""
    code, out, err = cli(*EVAL, *PAPER)
    assert code == 0 and err == ""
    assert ("device memory 80 GB (mid_nw_mid_cp): 6 of 8 devices over (worst d0 by 52.9 GB "
            "at ") in out
    code, out, _ = cli(*EVAL, *PAPER, "--recompute", "full")
    assert "device memory 80 GB (mid_nw_mid_cp): every device fits" in out
    code, out, _ = cli(*EVAL, *PAPER, "--memory-budget", "200GB")    # the budget rules
    assert "memory budget 200 GB: every device fits" in out and "device memory" not in out
    code, out, _ = cli(*EVAL, *PAPER, "--json")
    data = json.loads(out)
    assert data["memory_capacity"] == 80e9 and data["fits"] is False
    assert [v["device"] for v in data["capacity_violations"]] == [0, 1, 2, 3, 4, 5]
    code, out, _ = cli(*EVAL)
    assert "device memory" not in out and "throughput" not in out


def test_eval_prints_and_writes_the_throughput(cli):
    code, out, _ = cli(*EVAL, "--model", "gpt3-175b", "--system", "dgx-a100", "-t", "8")
    line = next(line for line in out.splitlines() if line.startswith("throughput"))
    assert line == ("throughput    8.48 k tokens/s, 133 per GPU (64 GPUs); per GPU 143 TFLOP/s "
                    "model, 144 TFLOP/s hardware; MFU 45.7%, HFU 46.1%")
    code, out, _ = cli(*EVAL, "--model", "gpt3-175b", "--system", "dgx-a100", "-t", "8",
                       "--json")
    data = json.loads(out)
    speed = data["throughput"]
    assert speed["gpus"] == 64 and speed["tokens"] == 32 * 2048
    assert speed["tokens_per_s"] == pytest.approx(32 * 2048 / data["makespan"])
    assert speed["mfu"] == pytest.approx(speed["model_tflops_per_gpu"] * 1e12 / 312e12)
    code, out, _ = cli(*EVAL, "--json")
    assert "throughput" not in json.loads(out)
