"""torchtitan settings: where its (PyTorch's) schedules run a table, and what they leave out."""

import pytest

from tabsched import InvalidScheduleError, generate
from tabsched.execution import Execution
from tabsched.torchtitan import SCHEDULES, torchtitan_settings

RUN = Execution(tensor_parallel=4, sequence_parallel=True, data_parallel=2, microbatch_size=2,
                global_batch=64, recompute="full")


@pytest.mark.parametrize("family,params", [("gpipe", {}), ("1f1b", {}), ("looped-bfs", {}),
                                           ("zbv", {}), ("dualpipev", {}),
                                           ("interleaved-1f1b", {"chunks": 2})])
def test_pytorchs_schedules_are_exported(family, params):
    table = generate(family, devices=4, microbatches=16, **params)
    settings = torchtitan_settings(table, RUN, 4096)
    parallelism = settings.sections["parallelism"]
    assert parallelism == {"data_parallel_replicate_degree": 2, "data_parallel_shard_degree": 1,
                           "tensor_parallel_degree": 4, "pipeline_parallel_degree": 4,
                           "pipeline_parallel_schedule": SCHEDULES[family],
                           "pipeline_parallel_microbatch_size": 2, "context_parallel_degree": 1}
    assert settings.sections["training"] == {"global_batch_size": 64, "local_batch_size": 32,
                                             "seq_len": 4096}
    assert settings.sections["activation_checkpoint"] == {"mode": "full"}
    toml = settings.to_toml()
    assert "[parallelism]" in toml and f'pipeline_parallel_schedule = "{SCHEDULES[family]}"' \
        in toml
    assert ("Megatron-LM" in " ".join(settings.notes)) == (family == "interleaved-1f1b")


@pytest.mark.parametrize("family,params,message", [
    ("zb-h1", {}, "zb-h1 is none of them"), ("chimera", {}, "chimera is none of them"),
    ("dualpipev", {"pairs": "serial"}, "PyTorch's DualPipeV fuses"),
])
def test_other_tables_are_refused_with_the_reason(family, params, message):
    table = generate(family, devices=4, microbatches=8, **params)
    with pytest.raises(InvalidScheduleError, match=message):
        torchtitan_settings(table, RUN, 2048)


def test_what_torchtitan_cannot_say_is_noted():
    table = generate("1f1b", devices=4, microbatches=8, stage_layers=(7, 9, 9, 7))
    run = Execution(tensor_parallel=2, data_parallel=2, microbatch_size=1, global_batch=16,
                    recompute="selective", zero_stage=1)
    notes = " ".join(torchtitan_settings(table, run, 2048).notes)
    for words in ("pipeline_parallel_split_points", "sequence parallelism", "ZeRO-1",
                  "selective checkpointing"):
        assert words in notes
    even = generate("1f1b", devices=4, microbatches=8, stage_layers=(8, 8, 8, 8))
    parallelism = torchtitan_settings(even, run, 2048).sections["parallelism"]
    assert parallelism["pipeline_parallel_layers_per_stage"] == 8


@pytest.mark.parametrize("family,stem", [("gpipe", "gpipe_pp4_m4"), ("zbv", "zbv_pp4_m8"),
                                         ("dualpipev", "dualpipev_pp4_m8")])
def test_the_exported_families_are_the_tables_pytorch_writes(family, stem):
    """The schedules exported under PyTorch's names are PyTorch's own orders: the files
    PyTorch 2.13's classes wrote (tests/data/pytorch) hold the same operations per rank."""
    import pathlib
    from tabsched.pytorch import read_pytorch
    path = pathlib.Path(__file__).parent / "data" / "pytorch" / f"{stem}.csv"
    theirs = read_pytorch(path).table
    mine = generate(family, devices=theirs.num_devices, microbatches=theirs.num_microbatches)
    assert theirs.orders() == mine.orders()
