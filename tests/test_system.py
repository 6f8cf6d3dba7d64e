"""System: roofline, Hockney links by placement, overrides, all-reduce, presets, errors."""

import pathlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tabsched import InvalidParameterError, System, UnknownNameError, load_system, system_presets
from tabsched.costs.system import (BANDWIDTH_RANGE, EFFICIENCY_RANGE,
                                   HALF_EFFICIENCY_TOKENS_RANGE, LATENCY_RANGE,
                                   LAUNCH_LATENCY_RANGE, MATRIX_WAVE_RANGE, PEAK_FLOPS_RANGE)

DATA = pathlib.Path(__file__).resolve().parent / "data"

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


# ------------------------------------------------- efficiency tables, waves, links
def test_efficiency_tables_interpolate_in_log_work():
    system = two_nodes(compute_efficiency=[["1GFLOP", 0.4], ["100GFLOP", 0.8]],
                       memory_efficiency=[[1e6, 0.5], ["100MB", 0.9]])
    assert system.compute_efficiency == ((1e9, 0.4), (1e11, 0.8))
    np.testing.assert_allclose(system.compute_efficiency_at(1, [1e8, 1e10, 1e13]),
                               [0.4, 0.6, 0.8])
    np.testing.assert_allclose(system.memory_efficiency_at([1e5, 1e7, 1e9]), [0.5, 0.7, 0.9])
    # a matrix kernel of 10 GFLOP and 1 MB: compute-bound at 60% of 100 TFLOP/s
    assert system.kernel_times(True, 1e10, 1e6, 1) == pytest.approx(1e10 / 60e12)
    # a vector kernel of 10 MB at 70% of 1 TB/s, whatever its FLOPs
    assert system.kernel_times(False, 1e12, 1e7, 1) == pytest.approx(1e7 / 0.7e12)
    assert system.summary()["compute_efficiency"] == [[1e9, 0.4], [1e11, 0.8]]


def test_wave_quantization_loses_half_a_wave_on_average():
    system = two_nodes(matrix_wave=1000)
    np.testing.assert_allclose(system.wave_efficiency([250, 1000, 9500]),
                               [1 / 3, 2 / 3, 19 / 20])
    assert two_nodes().wave_efficiency([10]).tolist() == [1.0]
    slow, fast = system.kernel_times(True, [1e12, 1e12], 0, 1, outputs=[500, 1e9])
    assert slow == pytest.approx(1e12 / 100e12 * 2) and fast == pytest.approx(0.01, rel=1e-6)


def test_link_efficiency_applies_to_transfers_and_collectives():
    system = two_nodes(intra_node_efficiency=0.5, inter_node_efficiency=0.8)
    bandwidth, _ = system.link_matrices(4)
    assert bandwidth[0, 1] == 50e9 and bandwidth[1, 2] == 8e9
    assert system.tier_link("node") == (50e9, 1e-6)
    assert system.tier_link("network") == (8e9, 1e-5)
    with pytest.raises(InvalidParameterError, match="tier 'rack' is not one of node, network"):
        system.tier_link("rack")
    assert system.transfer_time(8e9, 1, 2) == pytest.approx(1e-5 + 1.0)


@pytest.mark.parametrize("changes,message", [
    (dict(compute_efficiency=[[1e9, 0.5], [1e10, 0.4]]),
     r"compute_efficiency\[1\]: efficiency 0\.4 falls below 0\.5 of the smaller kernel before "
     r"it \(the table must not fall as work grows\)"),
    (dict(compute_efficiency=[[1e10, 0.5], [1e9, 0.6]]),
     r"compute_efficiency\[1\]: work 1000000000\.0 does not grow"),
    (dict(memory_efficiency=[[1e6, 1.2]]),
     r"memory_efficiency\[0\] efficiency must be in \(0, 1\], not 1\.2"),
    (dict(memory_efficiency=[[1e6, 0.0]]),
     r"memory_efficiency\[0\] efficiency must be in \(0, 1\], not 0\.0"),
    (dict(compute_efficiency=[[1e9]]),
     r"compute_efficiency\[0\] must be a pair \[work, efficiency\], not \[1000000000\.0\]"),
    (dict(compute_efficiency=[]),
     r"compute_efficiency must be a number or a table of \[work, efficiency\] pairs"),
    (dict(compute_efficiency=[["1GB", 0.5]]),
     r"compute_efficiency\[0\] work: '1GB' is not an amount of compute"),
    (dict(intra_node_efficiency=0), r"intra_node_efficiency must be in \(0, 1\], not 0"),
    (dict(matrix_wave=-1), r"matrix_wave must be >= 0, not -1"),
])
def test_efficiency_errors_name_the_key_and_entry(changes, message):
    with pytest.raises(InvalidParameterError, match=message):
        two_nodes(**changes)


def test_a_toml_table_of_efficiencies(tmp_path):
    path = tmp_path / "gpu.toml"
    path.write_text('peak_flops = "1PFLOP/s"\nmemory_bandwidth = "3TB/s"\ndevices_per_node = 4\n'
                    'intra_node_bandwidth = "100GB/s"\nintra_node_latency = "1us"\n'
                    'inter_node_bandwidth = "10GB/s"\ninter_node_latency = "5us"\n'
                    'compute_efficiency = [["1GFLOP", 0.5], ["1TFLOP", 0.7], ["10TFLOP", 0.6]]\n')
    with pytest.raises(InvalidParameterError, match=r"gpu\.toml: compute_efficiency\[2\]: "
                                                    r"efficiency 0\.6 falls below 0\.7"):
        load_system(str(path))


def test_dgx_a100_states_its_measured_numbers():
    a100 = load_system("dgx-a100")
    assert a100.peak_flops == 312e12 and a100.memory_bandwidth == pytest.approx(2.039e12)
    assert a100.compute_efficiency == pytest.approx(267.9 / 312 * 698.6 / 823.9, abs=5e-4)
    assert a100.memory_efficiency == pytest.approx(1737 / 2039, abs=5e-4)   # RRZE SCALE
    assert a100.launch_latency == pytest.approx(65536 / 25e9, rel=0.01)    # RRZE small kernels
    assert a100.overlap_slowdown == 0.189                                  # Lee et al. 2025
    assert a100.intra_node_efficiency == pytest.approx(200 / 300, abs=1e-3)
    assert a100.matrix_wave == 108 * 256 * 128
    assert (a100.devices_per_node, a100.intra_node_bandwidth, a100.inter_node_bandwidth) == \
        (8, 300e9, 25e9)
    grid = load_system("mid_nw_mid_cp")       # the paper grid stays flat
    assert (grid.compute_efficiency, grid.memory_efficiency, grid.matrix_wave) == (1.0, 1.0, 0.0)
    assert (grid.gemm_efficiency, grid.collective_bandwidth, grid.overlap_slowdown) == \
        (None, None, 0.0)


def test_dgx_a100_tables_are_their_sources_values():
    """The preset's GEMM table is LLMCompass' times as measured (the same rows as the
    example's import of the CSV), read with the 27 us host overhead off and the sustained
    factor on; its all-reduce table is vTrain's 8-GPU rows (the same as the nccl-tests
    import of them), and the reduce-scatter and all-gather tables repeat those rows."""
    a100 = load_system("dgx-a100")
    example = load_system(DATA / "a100-llmcompass.toml").gemm_efficiency
    gemm = a100.gemm_efficiency
    assert gemm.seconds == example.seconds and "LLMCompass" in gemm.source
    assert (gemm.overhead, gemm.scale, gemm.reach) == (27e-6, pytest.approx(698.6 / 823.9,
                                                                            abs=5e-4), 2.0)
    for (m, n, k, seconds), (_, _, _, efficiency) in zip(gemm.seconds, gemm.points):
        assert efficiency == 2.0 * m * n * k / ((seconds - 27e-6) * 312e12)
    assert gemm.efficiency(8192, 8192, 8192) == pytest.approx(
        2.0 * 8192**3 / ((3.9614e-3 - 27e-6) * 312e12) * gemm.scale)
    measured = load_system(DATA / "a100-vtrain-nccl.toml").collective_bandwidth
    rows = measured.table("all_reduce", "node", 8).points
    tables = a100.collective_bandwidth
    assert len(tables.tables) == 3
    for collective in ("all_reduce", "reduce_scatter", "all_gather"):
        table = tables.table(collective, "node", 8)
        assert table.points == rows and "AR_GPU8_1M_1024M_LUT" in table.source
    assert a100.replace(gemm_efficiency=None, collective_bandwidth=None,
                        description="", name="") == \
        load_system(DATA / "a100-plain.toml").replace(description="", name="")


# ------------------------------------------------- untrusted values (issue 13)
def test_overrides_are_checked_against_the_run():
    system = two_nodes(link_overrides=[{"devices": [1, 6], "bandwidth": "1GB/s"}],
                       node_overrides=[{"node": 2, "latency": "1ms"}])
    assert system.check_devices(7) is system          # devices 0..6 on nodes 0..3
    with pytest.raises(InvalidParameterError, match=r"^system custom: link_overrides\[0\]\.devices "
                                                    r"names device 6, but the run has 6 devices "
                                                    r"\(0\.\.5\)$"):
        system.check_devices(6)
    with pytest.raises(InvalidParameterError, match=r"^system custom: node_overrides\[0\]\.node "
                                                    r"names node 2, but the run's 4 devices fill "
                                                    r"2 nodes of 2 \(0\.\.1\)$"):
        system.replace(link_overrides=()).check_devices(4)
    # link_matrices stays a view of the first devices (transfer_time asks for two)
    assert system.transfer_time(1e9, 0, 1) == pytest.approx(1e-6 + 1e9 / 100e9)


@given(bandwidth=st.floats(*BANDWIDTH_RANGE), latency=st.floats(*LATENCY_RANGE),
       peak=st.floats(*PEAK_FLOPS_RANGE), efficiency=st.floats(*EFFICIENCY_RANGE),
       launch=st.floats(*LAUNCH_LATENCY_RANGE),
       wave=st.just(0.0) | st.floats(1.0, MATRIX_WAVE_RANGE[1]),
       half=st.floats(*HALF_EFFICIENCY_TOKENS_RANGE))
def test_every_time_is_finite_inside_the_sane_ranges(bandwidth, latency, peak, efficiency,
                                                     launch, wave, half):
    """The ranges leave room: a 1e40-FLOP, 1e40-byte kernel of one token on the slowest
    system the ranges allow takes under 1e60 s, 250 orders of magnitude below overflow."""
    system = System(peak, bandwidth, 1, bandwidth, latency, bandwidth, latency,
                    compute_efficiency=efficiency, memory_efficiency=efficiency,
                    inter_node_efficiency=efficiency, launch_latency=launch, matrix_wave=wave,
                    half_efficiency_tokens=half)
    worst = system.kernel_times(True, 1e40, 1e40, 1, outputs=1) + system.launch_latency
    assert np.isfinite(worst) and worst < 1e60
    assert np.isfinite(system.transfer_time(1e30, 0, 1))


@pytest.mark.parametrize("changes,message", [
    (dict(peak_flops=1e5), r"peak_flops must be between 1 MFLOP/s and 1 EFLOP/s, not 100000\.0 "
                           r"\(a bare number is in FLOP/s\)"),
    (dict(memory_bandwidth=np.float64(1e-300)), r"memory_bandwidth must be between 1 kB/s and "
                                                r"1 PB/s, not 1e-300"),
    (dict(inter_node_latency=10**400), r"inter_node_latency must be between 0 s and 3600 s, not "
                                       r"<an integer of 401 digits>"),
    (dict(devices_per_node=np.int64(0)), r"devices_per_node must be a positive integer, not 0"),
    (dict(intra_node_efficiency=5e-7), r"intra_node_efficiency must be at least 1e-06"),
    (dict(compute_efficiency=[[1, 0.5], [10**31, 0.6]]),
     r"compute_efficiency\[1\] work must be between 1 FLOP and 1e\+30 FLOP"),
    (dict(name=["a"]), r"name must be text, not \['a'\]"),
    (dict(matrix_wave=2.2e-313), r"matrix_wave must be 0 \(no wave quantization\) or at least 1 "
                                 r"output element, not 2\.2e-313"),
    (dict(description="x" * 501), r"description is 501 characters long; at most 500"),
])
def test_values_outside_the_sane_ranges_name_the_key(changes, message):
    with pytest.raises(InvalidParameterError, match=message):
        two_nodes(**changes)


@pytest.mark.parametrize("devices", [[0, 1], [3, 0, 5], [2, 9, 4, 7], [6]])
def test_all_reduce_time_on_given_link_matrices_is_the_same(devices):
    """Matrices of any size beyond the devices give the time of the system's own."""
    system = load_system("mid_nw_mid_cp").replace(
        devices_per_node=4, link_overrides=[{"devices": [2, 4], "bandwidth": "1GB/s"}])
    alone = system.all_reduce_time(3e9, devices)
    for size in (max(devices) + 1, 16):
        assert system.all_reduce_time(3e9, devices, system.link_matrices(size)) == alone


def test_a_system_with_measured_tables_survives_pickling():
    """Worker processes (-j) and Dask receive the system pickled: its GEMM and NCCL tables
    must arrive equal, with equal hashes and the same prices."""
    import pickle
    a100 = load_system("dgx-a100")
    again = pickle.loads(pickle.dumps(a100))
    assert again == a100 and hash(again) == hash(a100)
    assert again.gemm_efficiency.efficiency(2048, 12288, 12288) == \
        a100.gemm_efficiency.efficiency(2048, 12288, 12288)
    table = again.collective_bandwidth.table("all_reduce", "node", 8)
    assert table.bus_bandwidth(3e7) == a100.collective_bandwidth.table(
        "all_reduce", "node", 8).bus_bandwidth(3e7)


# ------------------------------------------------- a kernel beside a collective (issue 22)
@given(collective=st.floats(0, 10), kernel=st.floats(0, 10), slowdown=st.floats(0, 10),
       more=st.floats(0, 1))
def test_the_overlap_costs_at_least_the_free_overlap_and_never_more_than_in_turn(
        collective, kernel, slowdown, more):
    from tabsched.costs.model_work import hidden_cost
    cost = float(hidden_cost(collective, kernel, slowdown))
    free = max(collective - kernel, 0.0)
    assert free <= cost <= collective + 1e-12   # never worse than running them in turn
    assert float(hidden_cost(collective, kernel, 0.0)) == free
    # a larger slowdown, a longer collective: never cheaper
    assert float(hidden_cost(collective, kernel, slowdown + more)) >= cost - 1e-12
    assert float(hidden_cost(collective + more, kernel, slowdown)) >= cost - 1e-12


def test_the_overlap_slowdown_lengthens_the_backward_only():
    from tabsched import ModelCosts
    a100 = load_system("dgx-a100")
    times = {}
    for slowdown in (0.0, a100.overlap_slowdown):
        costs = ModelCosts("megatron-22b", a100.replace(overlap_slowdown=slowdown),
                           microbatch_size=4, tensor_parallel=8)
        times[slowdown] = costs.part_times(np.array([4.0]))["layer"][:, 0]
    free, slowed = times[0.0], times[a100.overlap_slowdown]
    assert slowed[0] == free[0]            # the forward's collectives are exposed anyway
    assert slowed[1] > free[1]             # the backward's hide beside the weight gradients


@pytest.mark.parametrize("value, message", [
    (-0.1, "overlap_slowdown must be >= 0"), (11, "overlap_slowdown"), ("x", "overlap_slowdown"),
])
def test_a_bad_overlap_slowdown_names_the_key(value, message):
    with pytest.raises(InvalidParameterError, match=message):
        load_system("dgx-a100").replace(overlap_slowdown=value)


#: XLA's sm_90 tables as the project's measurement notes hold them (m, n, k, FLOP/s) and
#: (collective, MiB, g1x8 B/s, g2x4 B/s, g4x2 B/s): corners and middles of each.
XLA_SM90_GEMM = [(256, 256, 256, 6721641025641), (256, 512, 4096, 93077481276005),
                 (4096, 4096, 1024, 685221329929802), (4096, 4096, 4096, 780193877565849)]
XLA_SM90_COLLECTIVES = [("all_reduce", 1, 20189772027, 24129602356, 50027480916),
                        ("all_reduce", 2048, 229968237690, 201566254276, 250289469463),
                        ("all_gather", 64, 314227150134, 342671895424, 416680309954),
                        ("reduce_scatter", 512, 358832552668, 360350874178, 365819545593)]


def test_dgx_h100_tables_are_their_sources_values():
    h100 = load_system("dgx-h100")
    gemm = h100.gemm_efficiency
    assert gemm.grid and len(gemm.points) == 125 and "default_matmul_perf_table" in gemm.source
    assert gemm.scale == pytest.approx(698.6 / 823.9, abs=5e-4) and gemm.overhead == 0.0
    by_shape = {point[:3]: point[3] for point in gemm.points}
    for m, n, k, flops in XLA_SM90_GEMM:
        assert by_shape[m, n, k] == pytest.approx(flops / 989e12, rel=1e-15)
        assert gemm.efficiency(m, n, k) == pytest.approx(flops / 989e12 * gemm.scale, rel=1e-12)
    assert np.isnan(gemm.efficiency(8192, 4096, 4096))     # outside the grid: the flat value
    tables = h100.collective_bandwidth
    assert len(tables.tables) == 9
    for collective, mib, *groups in XLA_SM90_COLLECTIVES:
        for ranks, algbw in zip((8, 4, 2), groups):
            factor = (2 if collective == "all_reduce" else 1) * (ranks - 1) / ranks
            table = tables.table(collective, "node", ranks)
            assert dict(table.points)[mib * 2.0**20] == pytest.approx(algbw * factor, rel=1e-5)
    assert (h100.memory_efficiency, h100.launch_latency, h100.overlap_slowdown) == \
        (pytest.approx(1704 / 2000, abs=5e-4), pytest.approx(65536 / 27e9, rel=0.02), 0.189)


def test_a_system_based_on_a_preset(tmp_path):
    """hgx-h800 is dgx-h100 with its own NVLink and without the H100's NCCL tables; a user's
    file may derive the same way, and every mistake in it is one line naming the file."""
    h800, h100 = load_system("hgx-h800"), load_system("dgx-h100")
    assert h800.intra_node_bandwidth == 200e9 and h800.intra_node_efficiency == 0.8
    assert h800.collective_bandwidth is None and h100.collective_bandwidth is not None
    assert h800.gemm_efficiency == h100.gemm_efficiency and h800.peak_flops == h100.peak_flops
    path = tmp_path / "four-nics.toml"
    path.write_text('based_on = "dgx-h100"\nnics_per_node = 4\n')
    mine = load_system(str(path))
    assert mine.nics_per_node == 4 and mine.name == str(path)
    for text, message in (('based_on = "dgx-b300"\n', "based_on 'dgx-b300' is not a system "
                                                      "preset"),
                          ('based_on = "hgx-h800"\n', "based_on 'hgx-h800' is itself derived"),
                          ('based_on = "dgx-h100"\nwithout = ["peak_flops"]\n',
                           "without must list some of gemm_efficiency"),
                          ('based_on = "dgx-h100"\nnics = 4\n', "nics"),
                          ('based_on = "dgx-h100"\nnics_per_node = 0\n', "nics_per_node")):
        path.write_text(text)
        with pytest.raises(InvalidParameterError, match=message) as error:
            load_system(str(path))
        assert str(path) in str(error.value) and "\n" not in str(error.value)
