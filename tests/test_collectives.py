"""Collectives by group placement: NCCL's multi-rail ring across nodes, the ring inside one."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tabsched.costs.collectives import COLLECTIVES, group_time, ring_steps, ring_time
from tabsched.costs.placement import GroupSpan
from tabsched.costs.system import System, load_system
from tabsched.exceptions import InvalidParameterError


def hdr_node(nics, **changes):
    """An 8-GPU A100 node: NVLink 300 GB/s at 0.667, HDR ports of 25 GB/s at 0.96."""
    fields = dict(peak_flops=312e12, memory_bandwidth=2.039e12, devices_per_node=8,
                  intra_node_bandwidth=300e9, intra_node_latency=2e-6,
                  intra_node_efficiency=0.667, inter_node_bandwidth=25e9,
                  inter_node_latency=5e-6, inter_node_efficiency=0.96, nics_per_node=nics)
    return System(**{**fields, **changes})


def bus_bandwidth(collective, nbytes, group, system):
    """nccl-tests' bus bandwidth of the priced time (``doc/PERFORMANCE.md``)."""
    factor = ring_steps(collective, group.size) / group.size
    return nbytes * factor / group_time(collective, nbytes, group, system)


def test_four_hdr_ports_per_node_give_the_measured_bus_bandwidth():
    """nccl-tests#119 (3 nodes x 8 A100, 4 HDR ports each): peak all-reduce busbw ~96 GB/s;
    nccl-tests#100 (2 HGX A100 nodes, 4 HDR each): ~91 GB/s at 1-8 GiB
    (../shared/data/gpu-measurements.md, section 5)."""
    system = hdr_node(4)
    for nodes in (2, 3):
        group = GroupSpan("data", 8 * nodes, 1, 8, nodes)
        for size in (2**30, 2**33):
            assert 91e9 <= bus_bandwidth("all_reduce", size, group, system) <= 96e9


def test_one_member_per_node_keeps_one_port_per_member():
    """DGX A100, t = 8 filling a node: each data group has one GPU per node, and the
    eight groups of a node each run on their own HDR port, as before."""
    a100 = load_system("dgx-a100")
    for collective in COLLECTIVES:
        for size in (1, 4, 64):
            group = GroupSpan("data", size, 8, 1, size)
            assert group_time(collective, 1e8, group, a100) == ring_time(
                collective, 1e8, size, 25e9 * 0.96, 5e-6)
    # eight GPUs sharing four ports: each group has half a port
    group = GroupSpan("data", 4, 8, 1, 4)
    assert group_time("all_reduce", 1e9, group, hdr_node(4)) == ring_time(
        "all_reduce", 1e9, 4, 25e9 * 0.96 * 0.5, 5e-6)


def test_a_ring_across_nodes_by_hand():
    """16 ranks, 8 per node on 2 DGX A100 nodes, all-reduce of 1 GB: 30 steps, 2 of them
    between nodes (NCCL's tuning.cc); the group's 8 ports carry 30/16 GB at 8 x 24 GB/s,
    NVLink 7/8 of it at 200.1 GB/s, so the ports bind."""
    group = GroupSpan("tensor", 16, 1, 8, 2)
    expected = 2 * 5e-6 + 28 * 2e-6 + 30 / 16 * 1e9 / (8 * 25e9 * 0.96)
    assert group_time("all_reduce", 1e9, group, load_system("dgx-a100")) == pytest.approx(
        expected, rel=1e-12)
    # reduce-scatter: 15 steps, 1 between nodes
    expected = 5e-6 + 14 * 2e-6 + 15 / 16 * 1e9 / (8 * 25e9 * 0.96)
    assert group_time("reduce_scatter", 1e9, group, load_system("dgx-a100")) == \
        pytest.approx(expected, rel=1e-12)
    # with ports faster than NVLink's share, NVLink binds: 7/8 of the traffic at 200.1 GB/s
    fast = hdr_node(8, inter_node_bandwidth=400e9)
    expected = 2 * 5e-6 + 28 * 2e-6 + 30 / 16 * 7 / 8 * 1e9 / (300e9 * 0.667)
    assert group_time("all_reduce", 1e9, group, fast) == pytest.approx(expected, rel=1e-12)


@st.composite
def placed(draw):
    """A system and a group across at least two of its nodes."""
    node = draw(st.sampled_from([2, 4, 8, 16]))
    nics = draw(st.sampled_from([None, 1, 2, 4, 8, 16, 32]))
    system = hdr_node(nics, devices_per_node=node,
                      intra_node_bandwidth=draw(st.sampled_from([50e9, 300e9, 900e9])),
                      inter_node_bandwidth=draw(st.sampled_from([12.5e9, 25e9, 50e9, 400e9])),
                      intra_node_latency=draw(st.sampled_from([0.0, 1e-6, 3e-6])),
                      inter_node_latency=draw(st.sampled_from([0.0, 5e-6, 2e-5])))
    per_node = draw(st.sampled_from([k for k in (1, 2, 4, 8, 16) if k <= node]))
    nodes = draw(st.integers(2, 64))
    group = GroupSpan("data", per_node * nodes, node // per_node, per_node, nodes)
    return system, group


RINGS = sorted(set(COLLECTIVES) - {"all_to_all"})


@given(placed(), st.sampled_from(RINGS),
       st.lists(st.floats(0, 1e11), min_size=2, max_size=6))
def test_a_collective_across_nodes_keeps_its_bounds(placement, collective, sizes):
    """Time grows with bytes; the bandwidth part is never below today's one port per
    member divided by the node's ports, nor the whole time below NVLink's share of the
    traffic (module docstring)."""
    system, group = placement
    sizes = np.sort(np.array(sizes))
    times = group_time(collective, sizes, group, system)
    assert np.all(np.diff(times) >= 0)
    port, latency = system.tier_link("network")
    one_port = (ring_time(collective, sizes, group.size, port, latency)
                - ring_time(collective, 0.0, group.size, port, latency))
    nics = system.nics_per_node or system.devices_per_node
    floor = group_time(collective, 0.0, group, system)
    assert np.all(times - floor >= one_port / nics - 1e-12 * times)   # rounding of times
    nvlink, _ = system.tier_link("node")
    share = ring_steps(collective, group.size) / group.size * (group.per_node - 1) \
        / group.per_node
    assert np.all(times >= sizes * share / nvlink * (1 - 1e-12))
    # the array and the scalar forms agree
    assert group_time(collective, float(sizes[-1]), group, system) == pytest.approx(times[-1])


@given(placed(), st.sampled_from(RINGS))
def test_the_latency_counts_the_steps_that_cross_nodes(placement, collective):
    """An empty message costs NCCL's ring latency (tuning.cc): the steps between nodes at
    the network's latency, the others at NVLink's."""
    system, group = placement
    crossing = ring_steps(collective, group.nodes)
    within = ring_steps(collective, group.size) - crossing
    assert group_time(collective, 0.0, group, system) == pytest.approx(
        crossing * system.inter_node_latency + within * system.intra_node_latency, abs=1e-15)


@given(st.sampled_from(sorted(COLLECTIVES)), st.sampled_from([2, 4, 8]),
       st.sampled_from([None, 2, 8]), st.floats(1, 1e10))
def test_inside_a_node_the_ring_is_unchanged(collective, size, nics, nbytes):
    system = hdr_node(nics)
    group = GroupSpan("tensor", size, 1, size, 1)
    assert group_time(collective, nbytes, group, system) == ring_time(
        collective, nbytes, size, *system.tier_link("node"))


def test_a_measured_table_keeps_precedence_across_nodes():
    """A [[collective_bandwidth]] table of this collective, tier, ranks and members per node
    prices what it covers, the multi-rail ring the rest."""
    table = {"collective": "all_reduce", "tier": "network", "ranks": 16, "per_node": 8,
             "source": "test", "busbw": [[2**20, 10e9], [2**30, 50e9]]}
    system = hdr_node(8, collective_bandwidth=[table])
    group = GroupSpan("data", 16, 1, 8, 2)
    assert group_time("all_reduce", 2**30, group, system) == pytest.approx(
        2**30 * 30 / 16 / 50e9)
    assert group_time("all_gather", 2**30, group, system) == group_time(
        "all_gather", 2**30, group, hdr_node(8))
    other = GroupSpan("data", 32, 1, 8, 4)
    assert group_time("all_reduce", 2**30, other, system) == group_time(
        "all_reduce", 2**30, other, hdr_node(8))


@pytest.mark.parametrize("value, message", [
    (0, r"nics_per_node must be a positive integer, not 0"),
    (2.5, r"nics_per_node must be a positive integer, not 2\.5"),
    ("8", r"nics_per_node must be a positive integer, not '8'"),
])
def test_a_bad_nic_count_is_refused(value, message):
    with pytest.raises(InvalidParameterError, match=message):
        hdr_node(value)


def test_the_dgx_presets_have_a_port_per_gpu():
    """DGX A100 and DGX H100 datasheets: 8 compute-fabric ports (HDR 200 Gb/s, NDR 400 Gb/s)."""
    for name, port in (("dgx-a100", 25e9), ("dgx-h100", 50e9)):
        system = load_system(name)
        assert (system.nics_per_node, system.inter_node_bandwidth) == (8, port)
        assert system.summary()["nics_per_node"] == 8


@given(placed(), st.lists(st.floats(0, 1e11), min_size=2, max_size=6))
def test_an_all_to_all_across_nodes_sends_each_members_off_node_blocks_on_its_own_ports(
        placement, sizes):
    """NCCL's all-to-all is one block per peer, all in flight: a member's ``n - k``
    blocks for other nodes leave on its own ``r`` ports, its ``k - 1`` node-local ones on
    NVLink, the slower sets the time; one latency per other node and per local peer;
    more bytes never take less time."""
    system, group = placement
    n, k = group.size, group.per_node
    sizes = np.sort(np.array(sizes))
    times = group_time("all_to_all", sizes, group, system)
    assert np.all(np.diff(times) >= 0)
    port, network_latency = system.tier_link("network")
    nvlink, nvlink_latency = system.tier_link("node")
    latency = (group.nodes - 1) * network_latency + (k - 1) * nvlink_latency
    assert group_time("all_to_all", 0.0, group, system) == pytest.approx(latency, abs=1e-15)
    off = sizes * (n - k) / n / (port * system.nics_per_device)
    local = sizes * (k - 1) / n / nvlink
    assert times == pytest.approx(latency + np.maximum(off, local), rel=1e-12, abs=1e-15)
    # the network part is the members' own ports: more ports per GPU, never slower
    wider = system.replace(nics_per_node=round(2 * system.devices_per_node
                                               * system.nics_per_device))
    assert np.all(group_time("all_to_all", sizes, group, wider) <= times * (1 + 1e-12))


def test_an_all_to_all_inside_a_node_is_the_ring_formula():
    system = load_system("dgx-h100")
    inside = GroupSpan("expert", 8, 1, 8, 1)
    port, latency = system.tier_link("node")
    assert group_time("all_to_all", 1e8, inside, system) == pytest.approx(
        ring_time("all_to_all", 1e8, 8, port, latency), rel=1e-12)
    across = GroupSpan("expert", 16, 1, 8, 2)
    # half of every member's bytes leave the node, on its own port
    network, _ = system.tier_link("network")
    assert group_time("all_to_all", 1e8, across, system) > 0.5 * 1e8 / (
        network * system.nics_per_device)
