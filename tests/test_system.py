"""System: roofline, Hockney links by placement, overrides, all-reduce, presets, errors."""

import numpy as np
import pytest

from tabsched import InvalidParameterError, System, UnknownNameError, load_system, system_presets

GRID = [f"{network}_nw_{compute}_cp" for network in ("slow", "mid", "fast")
        for compute in ("slow", "mid", "fast")]


def two_nodes(**changes):
    """Two devices per node: 100 GB/s and 1 us inside, 10 GB/s and 10 us between."""
    fields = dict(peak_flops="100TFLOP/s", memory_bandwidth="1TB/s", devices_per_node=2,
                  intra_node_bandwidth="100GB/s", intra_node_latency="1us",
                  inter_node_bandwidth="10GB/s", inter_node_latency="10us")
    return System(**{**fields, **changes})


def test_hockney_on_a_known_link():
    system = load_system("mid_nw_mid_cp")
    nbytes = 2 * 1 * 4096 * 4096           # d * b * s * h of paper-128l: 32 MiB
    assert system.transfer_time(nbytes, 3, 4) == pytest.approx(500e-9 + nbytes / 50e9, rel=1e-15)
    assert system.transfer_time(nbytes, 3, 4) == pytest.approx(0.00067158864, rel=1e-12)


def test_links_follow_placement():
    bandwidth, latency = two_nodes().link_matrices(4)
    assert bandwidth[0, 1] == bandwidth[3, 2] == 100e9
    assert bandwidth[1, 2] == bandwidth[0, 3] == 10e9
    assert latency[0, 1] == 1e-6 and latency[2, 1] == 1e-5
    assert two_nodes().transfer_time(1e9, 1, 2) == pytest.approx(1e-5 + 0.1)


def test_link_override_touches_exactly_that_link_both_ways():
    system = two_nodes(link_overrides=[{"devices": [1, 2], "bandwidth": "1GB/s"}])
    bandwidth, latency = system.link_matrices(4)
    base, _ = two_nodes().link_matrices(4)
    changed = bandwidth != base
    assert set(zip(*np.nonzero(changed))) == {(1, 2), (2, 1)}
    assert bandwidth[1, 2] == 1e9 and latency[1, 2] == 1e-5   # latency kept


def test_node_override_slows_every_link_of_the_node_and_link_overrides_win():
    system = two_nodes(node_overrides=[{"node": 1, "bandwidth": "1GB/s", "latency": "1ms"}],
                       link_overrides=[{"devices": [0, 3], "bandwidth": "20GB/s"}])
    bandwidth, latency = system.link_matrices(6)
    assert bandwidth[2, 3] == bandwidth[3, 2] == 1e9          # inside the slow node
    assert bandwidth[1, 2] == bandwidth[4, 3] == 1e9          # into and out of it
    assert latency[1, 2] == 1e-3
    assert bandwidth[0, 1] == 100e9 and bandwidth[1, 4] == 10e9   # elsewhere untouched
    assert bandwidth[0, 3] == 20e9 and latency[0, 3] == 1e-3      # the link override wins
    assert system.link_matrices(2)[0][0, 1] == 100e9          # overrides beyond the table


def test_two_slow_nodes_take_the_slower():
    system = two_nodes(node_overrides=[{"node": 0, "bandwidth": 5e9}, {"node": 1, "bandwidth": 2e9}])
    bandwidth, _ = system.link_matrices(4)
    assert bandwidth[0, 1] == 5e9 and bandwidth[1, 2] == 2e9 and bandwidth[2, 3] == 2e9


def test_ring_all_reduce_by_hand():
    system = two_nodes()
    nbytes = 4e9
    # devices 0..3: the ring 0->1->2->3->0 crosses nodes, so each step is inter-node
    step = 1e-5 + (nbytes / 4) / 10e9
    assert system.all_reduce_time(nbytes, [3, 1, 0, 2]) == pytest.approx(2 * 3 * step)
    assert system.all_reduce_time(nbytes, [0, 1]) == pytest.approx(2 * (1e-6 + 2e9 / 100e9))
    assert system.all_reduce_time(nbytes, [2]) == 0.0


def test_roofline_compute_time():
    system = two_nodes(compute_efficiency=0.5, memory_efficiency=0.8, launch_latency="10us")
    # compute-bound: 1e12 FLOP at 50 TFLOP/s; memory-bound: 1.6e9 B at 800 GB/s
    times = system.compute_time([1e12, 1e9], [1e6, 1.6e9], [4096, 4096])
    np.testing.assert_allclose(times, [0.02 + 1e-5, 0.002 + 1e-5])


def test_efficiency_curve_makes_half_the_tokens_cost_more_than_half():
    flat = two_nodes(compute_efficiency=0.5)
    curved = two_nodes(compute_efficiency=0.5, half_efficiency_tokens=1024)
    assert flat.compute_efficiency_at(10).tolist() == 0.5
    e_full, e_half = curved.compute_efficiency_at([4096, 2048])
    assert e_full == pytest.approx(0.5 * 4096 / 5120) and e_half == pytest.approx(0.5 * 2048 / 3072)
    full, half = curved.compute_time([1e12, 0.5e12], [0, 0], [4096, 2048])
    assert half / full == pytest.approx(0.5 * e_full / e_half)
    assert half > full / 2


def test_grid_presets_scale_around_one_dgx_h100():
    systems = system_presets()
    assert set(systems) >= set(GRID) | {"dgx-h100", "dgx-a100", "gb200-nvl72"}
    mid = systems["mid_nw_mid_cp"]
    assert (mid.peak_flops, mid.memory_bandwidth, mid.intra_node_bandwidth,
            mid.inter_node_latency) == (1e15, 3.35e12, 50e9, 5e-7)
    scale = {"slow": 0.1, "mid": 1.0, "fast": 10.0}
    for name in GRID:
        network, _, compute, _ = name.split("_")
        system = systems[name]
        assert system.peak_flops == pytest.approx(1e15 * scale[compute])
        assert system.memory_bandwidth == pytest.approx(3.35e12 * scale[compute])
        assert system.launch_latency == pytest.approx(mid.launch_latency / scale[compute])
        for where in ("intra_node", "inter_node"):
            assert getattr(system, f"{where}_bandwidth") == pytest.approx(50e9 * scale[network])
            assert getattr(system, f"{where}_latency") == pytest.approx(5e-7 / scale[network])
    h100 = systems["dgx-h100"]
    assert (h100.devices_per_node, h100.intra_node_bandwidth, h100.inter_node_bandwidth,
            h100.memory_capacity) == (8, 450e9, 50e9, 80e9)
    assert systems["gb200-nvl72"].devices_per_node == 72


@pytest.mark.parametrize("changes,message", [
    (dict(intra_node_bandwidth="-5GB/s"), r"intra_node_bandwidth must be > 0, not '-5GB/s'"),
    (dict(inter_node_bandwidth=0), r"inter_node_bandwidth must be > 0, not 0"),
    (dict(inter_node_latency="-1us"), r"inter_node_latency must be >= 0, not '-1us'"),
    (dict(peak_flops="1PB/s"), r"peak_flops: '1PB/s' is not a compute rate"),
    (dict(compute_efficiency=1.5), r"compute_efficiency must be in \(0, 1\], not 1\.5"),
    (dict(devices_per_node=0), r"devices_per_node must be a positive integer, not 0"),
    (dict(contention="bus"), r"contention 'bus' is not one of none, link, nic"),
    (dict(link_overrides=[{"devices": [1, 1], "bandwidth": 1e9}]),
     r"link_overrides\[0\]\.devices must be two different devices, not \[1, 1\]"),
    (dict(link_overrides=[{"devices": [0, 1]}]),
     r"link_overrides\[0\]: give a bandwidth, a latency or both"),
    (dict(link_overrides=[{"devices": [0, 1], "bandwith": 1e9}]),
     r"link_overrides\[0\]: unknown key 'bandwith'"),
    (dict(node_overrides=[{"node": -1, "bandwidth": 1e9}]),
     r"node_overrides\[0\]\.node must be an integer >= 0, not -1"),
    (dict(node_overrides=[{"node": 0, "bandwidth": "0GB/s"}]),
     r"node_overrides\[0\]\.bandwidth must be > 0"),
])
def test_system_errors(changes, message):
    with pytest.raises(InvalidParameterError, match=message):
        two_nodes(**changes)


def test_user_toml_and_its_errors(tmp_path):
    text = ('peak_flops = "1PFLOP/s"\nmemory_bandwidth = "3TB/s"\ndevices_per_node = 4\n'
        'intra_node_bandwidth = "100GB/s"\nintra_node_latency = "1us"\n'
        'inter_node_bandwidth = "10GB/s"\ninter_node_latency = "5us"\n'
        '[[link_overrides]]\ndevices = [1, 2]\nbandwidth = "1GB/s"\n')
    path = tmp_path / "cluster.toml"
    path.write_text(text)
    system = load_system(str(path))
    assert system.link_overrides[0].devices == (1, 2)
    assert system.transfer_time(1e9, 2, 1) == pytest.approx(1e-6 + 1.0)
    path.write_text(text.replace('"10GB/s"', '"-10GB/s"'))
    with pytest.raises(InvalidParameterError,
                       match=r"cluster\.toml: inter_node_bandwidth must be > 0, not '-10GB/s'"):
        load_system(str(path))
    path.write_text(text.replace("intra_node_latency", "intra_node_latncy"))
    with pytest.raises(InvalidParameterError, match=r"cluster\.toml: unknown key "
                                                    r"'intra_node_latncy' \(did you mean "
                                                    r"'intra_node_latency'\?\)"):
        load_system(str(path))
    path.write_text(text.replace('memory_bandwidth = "3TB/s"\n', ""))
    with pytest.raises(InvalidParameterError, match=r"cluster\.toml: missing key "
                                                    r"'memory_bandwidth'"):
        load_system(str(path))


def test_unknown_system_lists_the_valid_names():
    with pytest.raises(UnknownNameError, match=r"unknown system preset 'mid_nw_mid' \(did you "
                                               r"mean 'mid_nw_mid_cp'\?\); valid systems: "
                                               r"dgx-a100, dgx-h100, fast_nw_fast_cp, "):
        load_system("mid_nw_mid")
