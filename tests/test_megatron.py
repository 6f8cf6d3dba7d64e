"""Megatron-LM launch arguments: exported where Megatron-LM's own order is the table's."""

import json

import pytest
from hypothesis import given, strategies as st

from tabsched import InvalidParameterError, InvalidScheduleError, generate
from tabsched.megatron import megatron_arguments, megatron_orders


def flags(launch):
    return dict(launch.arguments)


def test_megatron_1f1b_order_by_hand():
    # rank 0 of 3, 4 microbatches: 2 warm-up forwards, then F/B pairs, then the rest
    order = [f"{s}{k}{m}" for k, s, m in megatron_orders(3, 4)[0]]
    assert order == ["0F0", "0F1", "0F2", "0B0", "0F3", "0B1", "0B2", "0B3"]
    assert [f"{s}{k}{m}" for k, s, m in megatron_orders(3, 4)[2]] == [
        "2F0", "2B0", "2F1", "2B1", "2F2", "2B2", "2F3", "2B3"]


def test_megatron_interleaved_order_by_hand():
    # P=2, V=2, M=5, G=3: the chunk table of schedules.py's own example
    # (microbatch 0 1 2 0 1 2 3 4 3 4, chunk 0 0 0 1 1 1 0 0 1 1)
    order = megatron_orders(2, 5, chunks=2, group_size=3)[1]
    forwards = [(s, m) for k, s, m in order if k == "F"]
    assert forwards == [(1, 0), (1, 1), (1, 2), (3, 0), (3, 1), (3, 2), (1, 3), (1, 4),
                        (3, 3), (3, 4)]
    backwards = [(s, m) for k, s, m in order if k == "B"]
    assert backwards[:3] == [(3, 0), (3, 1), (3, 2)]           # chunks reversed
    warmup = next(k for k, op in enumerate(order) if op[0] == "B") - 1
    assert warmup == 2 * (2 - 1 - 1) + (2 - 1) * 3                  # 3 forwards, then 1F1B


@given(devices=st.integers(1, 8), microbatches=st.integers(1, 24))
def test_every_1f1b_table_is_megatron_1f1b(devices, microbatches):
    launch = megatron_arguments(generate("1f1b", devices=devices, microbatches=microbatches))
    assert flags(launch)["--pipeline-model-parallel-size"] == devices
    assert flags(launch)["--global-batch-size"] == microbatches
    assert "without_interleaving" in launch.schedule


@pytest.mark.parametrize("devices, microbatches, chunks", [(2, 4, 2), (4, 8, 2), (4, 12, 3),
                                                           (3, 9, 2)])
def test_interleaved_tables_export_with_layers(devices, microbatches, chunks):
    layers = devices * chunks * 2
    table = generate("interleaved-1f1b", devices=devices, microbatches=microbatches,
                     chunks=chunks, layers=layers)
    launch = megatron_arguments(table, micro_batch_size=2, data_parallel=4)
    assert flags(launch) == {
        "--pipeline-model-parallel-size": devices, "--num-layers": layers,
        "--num-layers-per-virtual-pipeline-stage": 2,
        "--microbatch-group-size-per-virtual-pipeline-stage": devices,
        "--micro-batch-size": 2, "--global-batch-size": microbatches * 2 * 4}


def test_a_larger_group_size_is_found():
    table = generate("interleaved-1f1b", devices=4, microbatches=12, chunks=2, group_size=6)
    launch = megatron_arguments(table)
    assert flags(launch)["--microbatch-group-size-per-virtual-pipeline-stage"] == 6
    assert flags(launch)["--num-virtual-stages-per-pipeline-rank"] == 2
    assert any("--num-layers" in note for note in launch.notes)


def test_uneven_layers_become_a_layout():
    table = generate("interleaved-1f1b", devices=2, microbatches=4, chunks=2,
                     stage_layers="1,3,3,5")
    launch = megatron_arguments(table)
    assert flags(launch)["--pipeline-model-parallel-layout"] == "'E,t|t*3|t*3|t*5,L'"
    assert flags(launch)["--num-layers"] == 12
    assert "--num-layers-per-virtual-pipeline-stage" not in flags(launch)


@pytest.mark.parametrize("family, params, reason", [
    ("zb-h1", {}, r"it splits backwards into input-grad \(I\) and weight-grad \(W\)"),
    ("zbv", {}, r"it splits backwards"),
    ("chimera", {}, r"stage 0 runs on devices 0, 3; Megatron-LM places each stage on one "
                    r"rank"),
    ("gpipe", {}, r"its order is not Megatron-LM's 1F1B \(4 ranks, 8 microbatches\): "
                  r"device 0, position 4 runs 0F4 where Megatron-LM runs 0B0"),
    ("looped-bfs", {"chunks": 2}, r"its order is not Megatron-LM's interleaved 1F1B \(4 ranks "
                                  r"x 2 virtual stages, microbatch group size 4, 8 "
                                  r"microbatches\)"),
])
def test_tables_megatron_cannot_run_are_refused_with_the_reason(family, params, reason):
    table = generate(family, devices=4, microbatches=8, **params)
    with pytest.raises(InvalidScheduleError, match="^Megatron-LM cannot run this table: "
                                                   + reason):
        megatron_arguments(table)


def test_v_shaped_placement_is_refused():
    from tabsched import ScheduleTable
    table = ScheduleTable([["0F0", None, None, "0B0"], [None, "1F0", "1B0", None]]).replace(
        stage_layers=None)
    assert megatron_arguments(table).arguments  # the looped placement exports
    flipped = ScheduleTable([[None, "1F0", "1B0", None], ["0F0", None, None, "0B0"]])
    with pytest.raises(InvalidScheduleError, match="stage 0 is on device 1, but Megatron-LM "
                                                   "puts model chunk 0 on rank 0"):
        megatron_arguments(flipped)


def test_fused_cells_and_uneven_microbatches_are_refused():
    with pytest.raises(InvalidScheduleError, match="splits backwards|fuses a forward"):
        megatron_arguments(generate("dualpipev", devices=4, microbatches=8))
    table = generate("1f1b", devices=2, microbatches=2).replace(microbatch_sizes=(1.0, 0.5))
    with pytest.raises(InvalidScheduleError, match="microbatches differ in size"):
        megatron_arguments(table)


def test_interleaving_needs_as_many_microbatches_as_ranks():
    table = generate("looped-bfs", devices=4, microbatches=2, chunks=2)
    with pytest.raises(InvalidScheduleError, match=r"at least as many microbatches as ranks "
                                                   r"\(2 < 4\)"):
        megatron_arguments(table)


def test_bad_arguments():
    table = generate("1f1b", devices=2, microbatches=2)
    with pytest.raises(InvalidParameterError, match="micro_batch_size must be a positive"):
        megatron_arguments(table, micro_batch_size=0)
    with pytest.raises(InvalidParameterError, match="num_layers 3 do not split evenly"):
        megatron_arguments(table, num_layers=3)
    with pytest.raises(InvalidParameterError, match="differs from the table's stage_layers"):
        megatron_arguments(generate("1f1b", devices=2, microbatches=2, layers=8),
                           num_layers=6)


def test_cli_prints_arguments_and_json(cli):
    code, out, err = cli("megatron", "interleaved-1f1b", "-p", "4", "-m", "8", "-v", "2",
                         "--layers", "32", "--microbatch-size", "2")
    assert code == 0
    assert out.splitlines()[0] == "--pipeline-model-parallel-size 4 \\"
    assert "--num-layers-per-virtual-pipeline-stage 4 \\" in out
    assert out.rstrip().endswith("--global-batch-size 16")
    assert "interleaved 1F1B" in err
    code, out, _ = cli("megatron", "1f1b", "-p", "2", "-m", "4", "--json")
    data = json.loads(out)
    assert code == 0 and data["arguments"]["--pipeline-model-parallel-size"] == 2
    assert data["command_line"].startswith("--pipeline-model-parallel-size 2")


def test_cli_prints_a_flag_without_value_alone(cli):
    code, out, err = cli("megatron", "interleaved-1f1b", "-p", "4", "-m", "8", "-v", "2",
                         "--param", "pairs=fused")
    assert code == 0 and "None" not in out, out
    assert out.rstrip().endswith("--overlap-moe-expert-parallel-comm \\\n--delay-wgrad-compute")
    assert "combined 1F1B" in err


def test_cli_refusal_is_one_line(cli):
    code, out, err = cli("megatron", "zb-h1", "-p", "4", "-m", "8")
    assert code == 1 and out == "" and err.count("\n") == 1
    assert err.startswith("Error: Megatron-LM cannot run this table: it splits backwards")


def test_execution_arguments_give_megatron_its_flags():
    from tabsched.execution import Execution
    from tabsched.megatron import execution_arguments
    assert execution_arguments(Execution()) == (("--tensor-model-parallel-size", 1),)
    flags = dict(execution_arguments(Execution(
        tensor_parallel=4, recompute="full", zero_stage=1, data_parallel=2, attention="flash",
        overlap_grad_reduce=True)))
    assert flags == {"--tensor-model-parallel-size": 4, "--recompute-granularity": "full",
                     "--recompute-method": "uniform", "--recompute-num-layers": 1,
                     "--use-distributed-optimizer": None, "--use-flash-attn": None,
                     "--overlap-grad-reduce": None}


def test_a_launch_with_an_execution_adds_its_flags_and_prints_bare_flags_bare():
    from tabsched.execution import Execution
    table = generate("1f1b", devices=4, microbatches=8)
    launch = megatron_arguments(table, micro_batch_size=2, data_parallel=4, num_layers=32,
                                execution=Execution(tensor_parallel=8, sequence_parallel=True,
                                                    data_parallel=4, recompute="selective"))
    assert launch.command_line() == (
        "--pipeline-model-parallel-size 4 --num-layers 32 --micro-batch-size 2 "
        "--global-batch-size 64 --tensor-model-parallel-size 8 --sequence-parallel "
        "--recompute-granularity selective")
    assert "launch on 128 GPUs" in launch.notes[-1]


@pytest.mark.parametrize("layers,flags", [
    ((7, 9, 9, 7), {"--decoder-first-pipeline-num-layers": 7,
                    "--decoder-last-pipeline-num-layers": 7}),
    ((9, 9, 9, 5), {"--decoder-last-pipeline-num-layers": 5}),
    ((6, 9, 9, 9), {"--decoder-first-pipeline-num-layers": 6}),
])
def test_lighter_first_and_last_stages_are_megatrons_own_flags(layers, flags):
    table = generate("1f1b", devices=4, microbatches=8, stage_layers=layers)
    arguments = dict(megatron_arguments(table).arguments)
    assert arguments["--num-layers"] == sum(layers)
    assert {flag: value for flag, value in arguments.items() if "decoder" in flag} == flags
    assert "--pipeline-model-parallel-layout" not in arguments


def test_an_uneven_middle_is_still_a_layout():
    table = generate("1f1b", devices=4, microbatches=8, stage_layers=(8, 8, 9, 7))
    assert "--pipeline-model-parallel-layout" in dict(megatron_arguments(table).arguments)


def test_megatron_flops_is_narayanan_et_al_closed_form_for_gpt():
    """A GPT (multi-head attention, a 4h MLP, no experts) gives Narayanan et al. 2021's
    count, eq. (3), taken at three GEMM passes instead of their four (they count full
    recomputation): ``72 B s L h^2 (1 + s/(12 h) + V/(12 L h))``, V padded to 128 x t."""
    from tabsched.costs.transformer import TransformerModel
    from tabsched.megatron import megatron_flops

    model = TransformerModel(layers=24, hidden=2048, heads=16, sequence=2048, vocab=50257,
                             ffn=8192)
    B, s, L, h = 64, 2048, 24, 2048
    for t in (1, 2, 8):
        V = -(-50257 // (128 * t)) * 128 * t
        closed = 72 * B * s * L * h * h * (1 + s / (12 * h) + V / (12 * L * h))
        assert megatron_flops(model, B, tensor_parallel=t) == pytest.approx(closed, rel=1e-12)
    with pytest.raises(InvalidParameterError, match="global_batch must be a positive integer"):
        megatron_flops(model, 0)
