"""Placement: where each parallel group sits, and the tier its collectives cross."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tabsched import InvalidParameterError, ModelCosts
from tabsched.costs.collectives import group_time, ring_time
from tabsched.costs.placement import GROUPS, Placement
from tabsched.costs.system import load_system
from tabsched.execution import Execution


def ranks_of(run, node_size, pipeline):
    """Every group's member ranks, enumerated from Megatron-LM's rank formula."""
    t, cp, d = run.tensor_parallel, run.context_parallel, run.data_parallel

    def rank(tensor, context, data, stage):
        return tensor + t * (context + cp * (data + d * stage))
    return {
        "tensor": [rank(i, 0, 0, 0) for i in range(t)],
        "context": [rank(0, i, 0, 0) for i in range(cp)],
        "data": [rank(0, 0, i, 0) for i in range(d)],
        "pipeline": [rank(0, 0, 0, i) for i in range(pipeline)],
    }


@given(st.sampled_from([1, 2, 4, 8, 16, 32]), st.sampled_from([1, 2, 4]), st.integers(1, 32),
       st.integers(1, 16), st.sampled_from([4, 8, 16, 72]))
def test_every_span_counts_the_nodes_its_ranks_fall_on(t, cp, d, pipeline, node_size):
    run = Execution(tensor_parallel=t, context_parallel=cp, data_parallel=d,
                    devices_per_node=node_size)
    system = load_system("dgx-a100")
    try:
        run.check(type("M", (), dict(hidden=1024, heads=32, kv_heads=32, ffn=4096, sequence=1024,
                                     microbatch_size=1, name="m"))(), system)
    except InvalidParameterError:
        return      # groups that straddle nodes unevenly are refused; nothing to place
    placement = Placement(run, system, pipeline)
    for name, members in ranks_of(run, node_size, pipeline).items():
        span = placement.group(name)
        nodes = {rank // node_size for rank in members}
        assert span.size == len(members)
        assert span.nodes == len(nodes), name
        assert span.per_node == max(sum(rank // node_size == node for rank in members)
                                    for node in nodes), name
        assert span.tier == ("node" if len(nodes) == 1 else "network")


def test_a_collective_costs_the_ring_on_the_tier_it_crosses():
    system = load_system("dgx-a100").replace(collective_bandwidth=None)   # no measured table
    placement = Placement(Execution(tensor_parallel=8, data_parallel=4), system)
    tensor, data = placement.group("tensor"), placement.group("data")
    assert (tensor.tier, data.tier, data.nodes, data.per_node) == ("node", "network", 4, 1)
    assert group_time("all_reduce", 1e9, tensor, system) == ring_time(
        "all_reduce", 1e9, 8, *system.tier_link("node"))
    assert group_time("all_reduce", 1e9, data, system) == ring_time(
        "all_reduce", 1e9, 4, *system.tier_link("network"))
    assert placement.pipeline_ranks_per_node == 1
    assert Placement(Execution(tensor_parallel=2), system).pipeline_ranks_per_node == 4
    with pytest.raises(InvalidParameterError, match="group 'rack' is not one of"):
        placement.group("rack")
    assert set(placement.describe()) == {"tensor", "data"}
    assert set(GROUPS) == {"tensor", "context", "expert", "data", "pipeline"}


def test_the_execution_node_size_overrides_the_systems():
    system = load_system("dgx-a100")
    placement = Placement(Execution(tensor_parallel=4, data_parallel=2, devices_per_node=4),
                          system)
    assert placement.node_size == 4 and placement.group("data").tier == "network"
    costs = ModelCosts("gpt3-175b", system, Execution(tensor_parallel=4, data_parallel=2,
                                                      devices_per_node=4))
    assert costs.devices_per_node == 1
    assert costs.placement.pipeline_view.devices_per_node == 1


def test_every_collective_kernel_names_its_group():
    from tabsched.costs.kernels import COLLECTIVE
    costs = ModelCosts("gpt3-175b", "dgx-a100", tensor_parallel=8, sequence_parallel=True)
    groups = {kernel.group for part in costs._tables.values() for table in part.values()
              for kernel in table.kernels if kernel.cls == COLLECTIVE}
    assert groups == {"tensor"}
    plain = {kernel.group for part in costs._tables.values() for table in part.values()
             for kernel in table.kernels if kernel.cls != COLLECTIVE}
    assert plain == {None}
