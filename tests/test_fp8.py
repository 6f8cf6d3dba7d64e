"""FP8 linear products as Transformer Engine runs them (Execution.fp8; issue 23, item 5)."""

import numpy as np
import pytest
from click.testing import CliRunner

from tabsched import ModelCosts
from tabsched.cli import cli
from tabsched.costs import load_model, load_system
from tabsched.costs.kernels import FP8_PRODUCTS, layer_kernels
from tabsched.exceptions import InvalidParameterError
from tabsched.execution import Execution

MODEL = "llama3-8b"


@pytest.fixture(scope="module")
def h100():
    return load_system("dgx-h100")


def _kernels(fp8, sequence_parallel=False, t=2):
    run = Execution(tensor_parallel=t, sequence_parallel=sequence_parallel, fp8=fp8)
    return layer_kernels(load_model(MODEL), run)


def test_the_recipe_is_checked_and_kept():
    for bad in ("mxfp8", "", True, 8):
        with pytest.raises(InvalidParameterError, match="fp8"):
            Execution(fp8=bad)
    run = Execution(fp8="blockwise")
    assert 'fp8 = "blockwise"' in run.to_toml()
    assert Execution.from_dict(run.to_dict()) == run


def test_a_system_without_an_fp8_rate_refuses_it():
    with pytest.raises(InvalidParameterError, match=r"fp8 'delayed': system dgx-a100 states "
                                                    r"no FP8 rate \(fp8_peak_flops\)"):
        ModelCosts(MODEL, "dgx-a100", Execution(fp8="delayed"))
    result = CliRunner().invoke(cli, ["eval", "1f1b", "-p", "2", "-m", "4", "--model", MODEL,
                                      "--system", "dgx-a100", "--fp8", "delayed"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.strip().splitlines() == [
        "Error: --fp8 'delayed': system dgx-a100 states no FP8 rate (fp8_peak_flops); A100 "
        "and older tensor cores have none"]


def test_fp8_keys_need_the_rate(h100):
    with pytest.raises(InvalidParameterError, match="fp8_compute_efficiency needs "
                                                    "fp8_peak_flops"):
        h100.replace(fp8_peak_flops=None, fp8_gemm_efficiency=None,
                     fp8_compute_efficiency=0.5)
    with pytest.raises(InvalidParameterError, match="fp8_peak_flops"):
        h100.replace(fp8_peak_flops=-1.0)


def test_linear_products_read_one_byte_operands_and_keep_their_flops():
    plain, fp8 = (_kernels(None), _kernels("delayed"))
    for phase in ("F", "I", "W"):
        before = {kernel.name: kernel for kernel in plain[phase]}
        for kernel in fp8[phase]:
            if kernel.name in FP8_PRODUCTS:
                old = before[kernel.name]
                assert kernel.fp8 and kernel.flops == old.flops and kernel.gemms == old.gemms
                assert kernel.written == old.written      # outputs in the model's dtype
                if phase == "W":        # the accumulated fp32/bf16 gradient stays
                    assert kernel.read == (old.read[0], old.read[1] / 2)
                else:
                    assert kernel.read == (old.read[0] / 2, old.read[1] / 2)
            else:
                assert not kernel.fp8
    # the attention core stays in bf16
    assert not any(kernel.fp8 for kernel in fp8["F"] if kernel.name.startswith(
        ("scores", "attention")))


@pytest.mark.parametrize("recipe,sequence_parallel,casts,amax", [
    # TE fuses the casts of the norms' and the activations' outputs
    ("delayed", False, {"out_proj", "mlp_down_dgrad", "out_proj_dgrad", "qkv_dgrad"}, False),
    ("blockwise", False, {"out_proj", "mlp_down_dgrad", "out_proj_dgrad", "qkv_dgrad"}, False),
    # with sequence parallelism the gathered norm outputs are cast after the gather
    ("delayed", True, {"qkv", "out_proj", "mlp_up", "mlp_down_dgrad", "out_proj_dgrad",
                       "qkv_dgrad"}, False),
    # current scaling: an amax pass before every cast, none fused
    ("tensorwise", False, {"qkv", "out_proj", "mlp_up", "mlp_down", "mlp_down_dgrad",
                           "mlp_up_dgrad", "out_proj_dgrad", "qkv_dgrad"}, True),
])
def test_the_casts_each_recipe_runs(recipe, sequence_parallel, casts, amax):
    kernels = _kernels(recipe, sequence_parallel)
    names = [kernel.name for phase in ("F", "I") for kernel in kernels[phase]]
    assert {name[:-len("_cast")] for name in names if name.endswith("_cast")} == casts
    assert {name[:-len("_amax")] for name in names if name.endswith("_amax")} == (
        casts if amax else set())
    for phase in ("F", "I"):
        for k, kernel in enumerate(kernels[phase]):
            if kernel.name.endswith("_cast"):
                product = kernels[phase][k + 1]
                assert product.name == kernel.name[:-len("_cast")]
                elements = product.read[1]           # one byte each, once cast
                assert kernel.read == (0.0, 2 * elements) and kernel.written == (0.0,
                                                                                 2 * elements)


def test_products_run_at_the_fp8_rate(h100):
    assert h100.fp8_peak_flops == pytest.approx(1979e12)
    bf16 = ModelCosts(MODEL, h100, Execution(tensor_parallel=2))
    fp8 = ModelCosts(MODEL, h100, Execution(tensor_parallel=2, fp8="delayed"))
    plain = {row["name"]: row for row in bf16.kernel_report()}
    products = [row for row in fp8.kernel_report() if row["name"] in FP8_PRODUCTS]
    assert len(products) == 12
    for row in products:
        # at most the FP8 rate, and faster than the same product in bf16
        assert row["flops"] / (row["seconds"] - h100.launch_latency) <= \
            h100.fp8_peak_flops * (1 + 1e-9)
        assert row["seconds"] < plain[row["name"]]["seconds"]
        # no FP8 table: compute_efficiency of the FP8 peak, as BF16 products outside
        # the BF16 table (every llama3-8b product has a dimension past its 4096)
        if row["bound"] == "compute":
            assert row["efficiency"] == pytest.approx(plain[row["name"]]["efficiency"])
    layer_bf16 = bf16.part_times((1.0,))["layer"][:, 0]
    layer_fp8 = fp8.part_times((1.0,))["layer"][:, 0]
    assert np.all(layer_fp8 <= layer_bf16) and np.all(layer_fp8 > 0.5 * layer_bf16)


def test_activations_keep_the_linear_inputs_in_fp8():
    model = load_model(MODEL)
    for sequence_parallel in (False, True):
        plain = Execution(tensor_parallel=2, sequence_parallel=sequence_parallel)
        fp8 = plain.replace(fp8="delayed")
        saved = (model.layer_activation(1, "selective", parallel=plain)
                 - model.layer_activation(1, "selective", parallel=fp8))
        # norm outputs (whole, split by SP), attention output and activation output (split)
        whole = 2 * model.hidden * model.sequence / (2 if sequence_parallel else 1)
        split = (model.hidden + model.ffn) * model.sequence / 2
        assert saved == pytest.approx(whole + split)
        assert model.layer_activation(1, "full", parallel=fp8) == \
            model.layer_activation(1, "full", parallel=plain)


def test_the_weights_fp8_copies_are_held_and_made_each_iteration(h100):
    from tabsched import generate
    table = generate("1f1b", devices=2, microbatches=4)
    run = Execution(tensor_parallel=2, optimizer_step=True)
    plain, fp8 = (ModelCosts(MODEL, h100, run), ModelCosts(MODEL, h100, run.replace(
        fp8="delayed")))
    model = load_model(MODEL)
    linear = model.layers / 2 * model.layer_parameters / 2     # per device and tensor rank
    assert fp8.persistent_memory(table) - plain.persistent_memory(table) == \
        pytest.approx([2 * linear] * 2)
    from tabsched.lower import lower
    from tabsched.nodes import OPTIMIZER
    lowered = lower(table, optimizer=True)
    extra = (np.asarray(fp8.node_prices(lowered, OPTIMIZER))
             - np.asarray(plain.node_prices(lowered, OPTIMIZER)))
    cast = (2 + 2) * linear / (h100.memory_bandwidth * h100.memory_efficiency_at(
        np.array([4 * linear])))
    assert extra == pytest.approx([cast[0] + h100.launch_latency] * 2, rel=1e-6)


def test_megatron_and_torchtitan_say_how_to_run_it():
    from tabsched.megatron import execution_arguments
    arguments = dict(execution_arguments(Execution(fp8="tensorwise")))
    assert arguments["--fp8-format"] == "hybrid" and arguments["--fp8-recipe"] == "tensorwise"


def test_the_cli_prices_it_and_sweeps_keep_it(tmp_path):
    runner = CliRunner()
    base = ["eval", "1f1b", "-p", "2", "-m", "4", "--model", MODEL, "--system", "dgx-h100",
            "--json"]
    import json
    plain = json.loads(runner.invoke(cli, base).output)
    fp8 = json.loads(runner.invoke(cli, base + ["--fp8", "delayed"]).output)
    assert fp8["costs"]["fp8"] == "delayed"
    assert fp8["makespan"] < plain["makespan"]


def test_an_fp8_sweep_is_imported_against_the_fp8_peak(tmp_path):
    sweep = tmp_path / "fp8.csv"
    sweep.write_text("m,n,k,seconds\n1024,1024,1024,3e-6\n4096,4096,4096,1e-4\n"
                     "8192,8192,8192,7e-4\n")
    out = tmp_path / "h100-fp8.toml"
    runner = CliRunner()
    result = runner.invoke(cli, ["system", "import", "gemm", str(sweep), "--source", "a sweep",
                                 "--system", "dgx-h100", "--fp8", "-o", str(out)])
    assert result.exit_code == 0, result.output
    system = load_system(str(out))
    assert system.fp8_gemm_efficiency is not None and system.gemm_efficiency is not None
    costs = ModelCosts(MODEL, system, Execution(fp8="delayed"))
    plain = ModelCosts(MODEL, "dgx-h100", Execution(fp8="delayed"))
    # 8192^3 in 0.7 ms is 1.57 PFLOP/s, 0.794 of the FP8 peak: above the 0.679 fallback
    assert costs.part_times((1.0,))["layer"][0, 0] < plain.part_times((1.0,))["layer"][0, 0]
    for argv, words in (
            (["--system", "dgx-a100", "--fp8"], "--fp8: system dgx-a100 states no "
                                                "fp8_peak_flops"),
            (["--system", "dgx-h100"], "the system's peak_flops")):
        fast = tmp_path / "fast.csv"
        fast.write_text("m,n,k,seconds\n8192,8192,8192,5e-4\n1024,1024,1024,1e-5\n")
        result = runner.invoke(cli, ["system", "import", "gemm", str(fast), "--source", "x",
                                     *argv])
        assert result.exit_code == 1 and words in result.output, result.output
        assert "Traceback" not in result.output


def test_a_sweep_row_gives_the_recipe_back(tmp_path):
    from tabsched.sweeps import read_sweep_csv, row_execution, rows_to_csv, sweep
    rows = sweep(["1f1b"], [2], [4], models=[MODEL], systems=["dgx-h100"],
                 execution=Execution(fp8="blockwise"))
    assert rows[0]["status"] == "ok" and rows[0]["fp8"] == "blockwise"
    path = tmp_path / "sweep.csv"
    path.write_text(rows_to_csv(rows))
    assert row_execution(read_sweep_csv(str(path))[0]).fp8 == "blockwise"
    # on a system without the rate the row is skipped, saying why
    skipped = sweep(["1f1b"], [2], [4], models=[MODEL], systems=["dgx-a100"],
                    execution=Execution(fp8="blockwise"))
    assert skipped[0]["status"] == "skipped" and "FP8 rate" in skipped[0]["reason"]
