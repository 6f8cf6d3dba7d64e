"""Tensor, sequence and data parallelism in ModelCosts: placement, transfers, tail, memory."""

import numpy as np
import pytest

from tabsched import InvalidParameterError, ModelCosts, System, TransformerModel, evaluate, generate
from tabsched.costs.collectives import ring_time
from tabsched.execution import Parallelism
from tabsched.lower import lower
from tabsched.nodes import OPTIMIZER, SYNC


def model(**changes):
    """h=256, 8 heads, s=64, V=1000, 8 layers, fp16."""
    fields = dict(layers=8, hidden=256, heads=8, sequence=64, vocab=1000, dtype="fp16")
    return TransformerModel(**{**fields, **changes})


def system(**changes):
    """8 devices per node: 100 GB/s and 1 us inside, 10 GB/s and 10 us between nodes."""
    fields = dict(peak_flops=1e14, memory_bandwidth=1e12, devices_per_node=8,
                  intra_node_bandwidth=100e9, intra_node_latency=1e-6,
                  inter_node_bandwidth=10e9, inter_node_latency=1e-5, launch_latency=1e-6)
    return System(**{**fields, **changes})


@pytest.mark.parametrize("changes,message", [
    (dict(tensor_parallel=3), r"tensor_parallel 3 does not divide hidden 256 of model custom"),
    (dict(tensor_parallel=16), r"tensor_parallel 16 does not divide heads 8"),
    (dict(tensor_parallel=0), r"tensor_parallel must be an integer >= 1, not 0"),
    (dict(data_parallel=0), r"data_parallel must be an integer >= 1, not 0"),
    (dict(sequence_parallel=True), r"sequence_parallel needs tensor_parallel > 1"),
    (dict(attention="xformers"), r"attention 'xformers' is not one of eager, flash"),
    (dict(optimizer_sharding="yes"), r"optimizer_sharding must be true or false, not 'yes'"),
])
def test_parallelism_errors(changes, message):
    with pytest.raises(InvalidParameterError, match=message):
        ModelCosts(model(), system(), **changes)


def test_tensor_parallel_must_divide_hidden_and_ffn_and_fit_a_node():
    with pytest.raises(InvalidParameterError, match=r"tensor_parallel 4 does not divide ffn 1002"):
        ModelCosts(model(ffn=1002), system(), tensor_parallel=4)
    with pytest.raises(InvalidParameterError, match=r"tensor_parallel 4 does not divide kv_heads "
                                                    r"2"):
        Parallelism(tensor_parallel=4).check(model(kv_heads=2))
    with pytest.raises(InvalidParameterError, match=r"tensor_parallel 8 is larger than a node of "
                                                    r"system custom \(3 devices\) but does not "
                                                    r"fill whole nodes"):
        ModelCosts(model(), system(devices_per_node=3), tensor_parallel=8)
    across = ModelCosts(model(), system(devices_per_node=4), tensor_parallel=8)
    assert across.placement.group("tensor").tier == "network"


def test_a_node_holds_fewer_pipeline_ranks_with_tensor_and_data_parallelism():
    assert ModelCosts(model(), system()).devices_per_node == 8
    assert ModelCosts(model(), system(), tensor_parallel=4).devices_per_node == 2
    assert ModelCosts(model(), system(), tensor_parallel=4, data_parallel=2).devices_per_node == 1
    table = generate("1f1b", devices=4, microbatches=4)
    costs = ModelCosts(model(), system(), tensor_parallel=4)
    transfers = lower(table).transfers
    seconds, nbytes = costs.transfer_costs(table, transfers)
    # scatter-gather: s*b*h*d / t per tensor rank; devices 0-1 and 2-3 share a node
    assert np.all(nbytes == 64 * 256 * 2 / 4)
    crossing = (transfers.src // 2) != (transfers.dst // 2)
    # the receivers all-gather the whole tensor over their 4 tensor ranks (ring, NVLink):
    # 3 steps of 1 us + (s*b*h*d / 4) / 100 GB/s
    gather = 3 * (1e-6 + 64 * 256 * 2 / 4 / 100e9)
    np.testing.assert_allclose(seconds, gather + np.where(crossing, 1e-5 + nbytes / 10e9,
                                                          1e-6 + nbytes / 100e9))
    latency, volume = costs.transfer_parts(table, transfers)
    np.testing.assert_allclose(latency, gather + np.where(crossing, 1e-5, 1e-6))
    np.testing.assert_allclose(latency + volume, seconds)
    whole = ModelCosts(model(), system(), tensor_parallel=4, scatter_gather=False)
    seconds, nbytes = whole.transfer_costs(table, transfers)
    assert np.all(nbytes == 64 * 256 * 2)                 # no scatter, no gather
    np.testing.assert_allclose(seconds, np.where(crossing, 1e-5 + nbytes / 10e9,
                                                 1e-6 + nbytes / 100e9))
    split = ModelCosts(model(), system(), tensor_parallel=4, sequence_parallel=True)
    seconds, nbytes = split.transfer_costs(table, transfers)
    assert np.all(nbytes == 64 * 256 * 2 / 4)             # already split: no gather
    np.testing.assert_allclose(seconds, np.where(crossing, 1e-5 + nbytes / 10e9,
                                                 1e-6 + nbytes / 100e9))
    assert split.receive_gather_seconds([1.0, 2.0]).tolist() == [0.0, 0.0]


def test_tensor_parallel_collectives_cost_a_ring_inside_the_node():
    costs = ModelCosts(model(), system(), tensor_parallel=4)
    rows = costs.kernel_report("layer", 1)
    reduce = [row for row in rows if row["name"] == "all_reduce" and row["phase"] == "F"]
    assert len(reduce) == 2
    expected = ring_time("all_reduce", 64 * 256 * 2, 4, 100e9, 1e-6)
    assert reduce[0]["seconds"] == pytest.approx(expected)
    assert reduce[0]["bound"] == "network"
    # the FLOPs of one rank are a quarter of the whole layer's
    serial = ModelCosts(model(), system())
    assert costs.op_work(generate("gpipe", devices=1, microbatches=1))[0][0] == pytest.approx(
        serial.op_work(generate("gpipe", devices=1, microbatches=1))[0][0] / 4)


def test_sequence_parallel_shrinks_activations_and_keeps_collective_volume():
    plain = ModelCosts(model(recompute="selective"), system(), tensor_parallel=4)
    sp = ModelCosts(model(recompute="selective"), system(), tensor_parallel=4,
                    sequence_parallel=True)
    table = generate("1f1b", devices=2, microbatches=2)
    assert sp.activation_sizes(table)[0] < plain.activation_sizes(table)[0]
    layer = 64 * 256                                        # s*b*h
    assert sp.model.layer_activation(1, parallel=sp.parallel) == 34 * layer / 4
    times = {name: sum(row["seconds"] for row in costs.kernel_report("layer", 1)
                       if row["class"] == "collective" and row["phase"] == "F")
             for name, costs in (("plain", plain), ("sp", sp))}
    # an all-reduce is a reduce-scatter and an all-gather: the same ring time
    assert times["sp"] == pytest.approx(times["plain"])


def test_data_parallel_all_reduce_ends_the_iteration():
    table = generate("1f1b", devices=2, microbatches=4)
    serial = ModelCosts(model(), system())
    replicas = ModelCosts(model(), system(), tensor_parallel=2, data_parallel=4)
    assert replicas.optimizer_step and not serial.optimizer_step
    result = evaluate(table, replicas)
    lowered = result._lowered
    step = replicas.node_prices(lowered, OPTIMIZER)
    params = replicas._device_parameters(table)
    grads = params * 2.0                                    # fp16 gradients
    # t*d = 8 = a node: the replicas of a tensor rank share it, the pipeline ranks do not
    expected_reduce = ring_time("all_reduce", grads, 4, 100e9, 1e-6)
    update = (4 + 54) * params / 1e12 + 2e-6            # gradients / d, then the step
    embedding = 2 * (1e-5 + 1000 * 256 / 2 * 2 / 2 / 10e9)    # tied: first and last stage
    np.testing.assert_allclose(step, expected_reduce + update + embedding)
    across = ModelCosts(model(), system(), tensor_parallel=8, data_parallel=4)
    step = across.node_prices(evaluate(table, across)._lowered, OPTIMIZER)
    params = across._device_parameters(table)
    reduce = ring_time("all_reduce", params * 2.0, 4, 10e9, 1e-5)
    embedding = 2 * (1e-5 + 1000 * 256 / 8 * 2 / 2 / 10e9)     # one pipeline rank per node
    np.testing.assert_allclose(step, reduce + (4 + 54) * params / 1e12 + 2e-6 + embedding)


def test_overlapped_data_parallel_all_reduce_runs_beside_the_backwards():
    table = generate("1f1b", devices=2, microbatches=4)
    costs = ModelCosts(model(), system(), tensor_parallel=8, data_parallel=4,
                       overlap_grad_reduce=True)
    assert costs.grad_sync == "all" and not costs.optimizer_step
    result = evaluate(table, costs)
    sync, step = (costs.node_prices(result._lowered, kind) for kind in (SYNC, OPTIMIZER))
    assert len(step) == 0 and len(sync) == 2
    stage_grads = costs.stage_parameters(table) / 8 * 2.0
    np.testing.assert_allclose(sync, ring_time("all_reduce", stage_grads, 4, 10e9, 1e-5))
    blocking = evaluate(table, ModelCosts(model(), system(), tensor_parallel=8,
                                          data_parallel=4))
    assert result.makespan < blocking.makespan


def test_optimizer_sharding_divides_the_state_and_gathers_the_parameters():
    table = generate("1f1b", devices=2, microbatches=4)
    plain = ModelCosts(model(), system(), tensor_parallel=8, data_parallel=4)
    zero = ModelCosts(model(), system(), tensor_parallel=8, data_parallel=4,
                      optimizer_sharding=True)
    params = plain._device_parameters(table)
    np.testing.assert_allclose(plain.persistent_memory(table), params * 16)
    np.testing.assert_allclose(zero.persistent_memory(table), params * (2 + 2 + 12 / 4))
    step = zero.node_prices(evaluate(table, zero)._lowered, OPTIMIZER)
    embedding = 2 * (1e-5 + 1000 * 256 / 8 * 2 / 2 / 10e9)
    expected = (ring_time("reduce_scatter", params * 2.0, 4, 10e9, 1e-5)
                + ring_time("all_gather", params * 2.0, 4, 10e9, 1e-5)
                + 4 * params / 1e12 + 54 * params / 4 / 1e12 + 2e-6 + embedding)
    np.testing.assert_allclose(step, expected)


def test_untied_embeddings_or_one_device_need_no_embedding_sync():
    from tabsched.costs.tail import embedding_sync
    table = generate("1f1b", devices=2, microbatches=2)
    untied = ModelCosts(model(tied_embeddings=False), system(), optimizer=True)
    assert embedding_sync(untied, table).tolist() == [0.0, 0.0]
    one = generate("1f1b", devices=1, microbatches=2)
    assert embedding_sync(ModelCosts(model(), system(), optimizer=True), one).tolist() == [0.0]


def test_flash_attention_keeps_the_flops_and_drops_the_score_traffic():
    """At 64 tokens (one tile) the causal mask skips nothing: the forward's FLOPs are the
    eager kernels'; the backward adds the scores FlashAttention recomputes, ``2 s^2 h``
    per layer."""
    eager = ModelCosts(model(), system())
    flash = ModelCosts(model(), system(), attention="flash")
    table = generate("gpipe", devices=1, microbatches=1)
    (eager_flops, eager_bytes), (flash_flops, flash_bytes) = (eager.op_work(table),
                                                              flash.op_work(table))
    recomputed = 2 * 64 * 64 * 256 * 8
    np.testing.assert_allclose(eager_flops + [0, recomputed], flash_flops)
    assert np.all(flash_bytes < eager_bytes)
    assert flash.activation_sizes(table)[0] < eager.activation_sizes(table)[0]


def test_the_json_echoes_the_parallelism():
    costs = ModelCosts(model(), system(), tensor_parallel=4, sequence_parallel=True,
                       data_parallel=2, attention="flash", optimizer_sharding=True)
    info = costs.describe()
    assert (info["tensor_parallel"], info["sequence_parallel"], info["data_parallel"],
            info["attention"], info["optimizer_sharding"]) == (4, True, 2, "flash", True)
    result = evaluate(generate("1f1b", devices=2, microbatches=2), costs)
    assert result.to_dict()["costs"]["tensor_parallel"] == 4


def test_full_recompute_memory_budget_counts_the_working_set():
    """--recompute full with a memory budget: one layer's activations again while its
    backward runs, and its activation-gradient buffer (the issue's 3-7 GB)."""
    table = generate("1f1b", devices=8, microbatches=32)
    costs = ModelCosts("paper-128l", "dgx-h100", recompute="full")
    result = evaluate(table, costs)
    working = costs.model.layer_transient(1)
    assert 3e9 < working < 7e9
    stored = max(values.max() for _, values in result.memory_timeline())
    assert result.peak_memory == pytest.approx(stored)
    # device 0's peak: its eight stage activations and the working set of a backward
    per_microbatch = costs.activation_sizes(table)[0]
    assert result.devices[0].peak_memory == pytest.approx(8 * per_microbatch + working)


def test_compare_keeps_an_overlapped_data_parallel_all_reduce():
    from tabsched.compare import compare
    common = dict(model="gpt3-175b", system="dgx-a100")
    overlapped = dict(tensor_parallel=8, data_parallel=4, overlap_grad_reduce=True)
    serial, replicas, blocking = (
        compare(["1f1b"], 4, 8, **common, parallel=parallel)[0].simulation["makespan"]
        for parallel in ({"tensor_parallel": 8}, overlapped,
                         {"tensor_parallel": 8, "data_parallel": 4}))
    # a stage's gradients (5.5 G parameters per tensor rank, fp16) all-reduced over 4
    # replicas on InfiniBand: 2*3/4 * 11 GB / 24 GB/s = 0.69 s, in 40M-parameter buckets
    # from the first tenth of the last backward (0.24 s) on: about 0.69 - 0.24 after it
    assert serial + 0.4 < replicas < blocking
    assert replicas < serial + 0.69
