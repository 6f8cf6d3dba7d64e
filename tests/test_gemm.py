"""costs/gemm.py: measured GEMM efficiency by shape, the rules that read it, its errors,
and the cost model pricing the kernels a table covers (and only those) by it."""

import math
import pathlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tabsched import InvalidParameterError, ModelCosts, System, load_system
from tabsched.costs.gemm import (MAX_POINTS, MAX_SCATTERED_POINTS, GemmTable,
                                 kernel_efficiency, read_sweep, table_toml)
from tabsched.costs.ends import output_kernels
from tabsched.costs.kernels import MATRIX, KernelTable, layer_kernels
from tabsched.costs.transformer import TransformerModel, model_presets
from tabsched.execution import Execution

DATA = pathlib.Path(__file__).resolve().parent / "data"
#: dgx-a100's numbers without its measured tables: what the examples add a table to.
PLAIN = DATA / "a100-plain.toml"

#: PrincetonUniversity/LLMCompass ae/figure5/ab/real_hardware/matmul_A100.csv @
#: 2e015fd2ee750e6cad8d7152df52551e5b41ef20 (Zhang et al., "LLMCompass", ISCA 2024, Figure 5
#: a, b), as ../shared/data/gpu-measurements.toml [a100_80gb.gemm.llmcompass] holds it:
#: m, n, k, latency_ms, tflops (bf16 torch.matmul on one A100 80GB, median wall-clock).
LLMCOMPASS_A100 = [
    (64, 12288, 12288, 0.19, 101.7124), (128, 12288, 12288, 0.2003, 193.0114),
    (256, 12288, 12288, 0.3185, 242.709), (512, 12288, 12288, 0.6118, 252.7351),
    (1024, 12288, 12288, 1.199, 257.9115), (2048, 12288, 12288, 2.3586, 262.2263),
    (4096, 12288, 12288, 4.4576, 277.4929), (8192, 12288, 12288, 8.6216, 286.9431),
    (16384, 12288, 12288, 17.0307, 290.5223), (32768, 12288, 12288, 35.4407, 279.216),
    (8192, 64, 64, 0.0296, 2.27), (8192, 128, 128, 0.031, 8.6608),
    (8192, 256, 256, 0.0356, 30.1244), (8192, 512, 512, 0.0471, 91.2121),
    (8192, 1024, 1024, 0.0927, 185.238), (8192, 2048, 2048, 0.2818, 243.8497),
    (8192, 4096, 4096, 1.021, 269.2169), (8192, 8192, 8192, 3.9614, 277.5532),
    (8192, 16384, 16384, 15.0087, 293.0334), (8192, 32768, 32768, 61.1346, 287.7616)]
#: [a100_80gb.gemm.llmcompass.derived_efficiency]: tflops / 312 as the source file rounds it.
LLMCOMPASS_A100_EFFICIENCY = [0.326, 0.619, 0.778, 0.81, 0.827, 0.84, 0.889, 0.92, 0.931, 0.895,
                              0.007, 0.028, 0.097, 0.292, 0.594, 0.782, 0.863, 0.89, 0.939,
                              0.922]


def table(points, **keys):
    return GemmTable.from_value({"source": "test", "points": points, **keys}, 1e15)


def small_system(**changes):
    return System(**{**dict(peak_flops="100TFLOP/s", memory_bandwidth="1TB/s",
                            devices_per_node=8, intra_node_bandwidth="100GB/s",
                            intra_node_latency="1us", inter_node_bandwidth="10GB/s",
                            inter_node_latency="10us", compute_efficiency=0.7,
                            matrix_wave=1e5, launch_latency="1us"), **changes})


GRID_AXES = (512, 1024, 4096)


def grid_points(values):
    return [[m, n, k, values[i]] for i, (m, n, k) in enumerate(
        (m, n, k) for m in GRID_AXES for n in GRID_AXES for k in GRID_AXES)]


# ------------------------------------------------------------------ the example system
def test_the_a100_example_pins_the_llmcompass_measurements():
    system = load_system(DATA / "a100-llmcompass.toml")
    gemm = system.gemm_efficiency
    assert "LLMCompass" in gemm.source and gemm.dtype == "bf16" and not gemm.grid
    assert system.peak_flops == 312e12   # the source's efficiencies are of 312 TFLOP/s
    rows, dtype = read_sweep(DATA / "a100-llmcompass-gemm.csv")
    assert dtype == "bf16"
    assert rows == [(m, n, k, float(f"{ms}e-3")) for m, n, k, ms, _ in LLMCOMPASS_A100]
    by_shape = {point[:3]: point[3] for point in gemm.points}
    for (m, n, k, ms, tflops), rounded in zip(LLMCOMPASS_A100, LLMCOMPASS_A100_EFFICIENCY):
        efficiency = by_shape[m, n, k]
        assert efficiency == 2.0 * m * n * k / (float(f"{ms}e-3") * 312e12)
        # the source's own TFLOP/s, from the unrounded time: within its 3-5 digit rounding
        assert efficiency == pytest.approx(tflops / 312, rel=3e-3)
        assert efficiency == pytest.approx(rounded, abs=0.0015)
    # the table in the example is what `tabsched system import gemm` writes from the CSV
    text = (DATA / "a100-llmcompass.toml").read_text()
    assert table_toml(rows, gemm.source, "bf16") in text


def test_the_example_prices_a_175b_shape_from_its_neighbours():
    """2048 x 12288 x 12288 is a point: exact; 2048 x 4608 x 12288 (GPT-3 175B's QKV at TP
    8) is 1.4 octaves from it, beyond the default reach: the fallback."""
    gemm = load_system(DATA / "a100-llmcompass.toml").gemm_efficiency
    assert gemm.efficiency(2048, 12288, 12288) == 2 * 2048 * 12288**2 / (2.3586e-3 * 312e12)
    assert np.isnan(gemm.efficiency(2048, 4608, 12288))
    wider = GemmTable.from_value({**gemm.to_value(), "reach": 2}, 312e12)
    assert 0.78 < wider.efficiency(2048, 4608, 12288) < 0.93


# ------------------------------------------------------------------ the two rules
def test_a_full_product_of_values_is_a_grid_and_exact_at_its_points():
    values = np.linspace(0.3, 0.9, 27)
    grid = table(grid_points(values))
    assert grid.grid
    m, n, k = np.array([point[:3] for point in grid.points]).T
    assert grid.efficiency(m, n, k).tolist() == [point[3] for point in grid.points]
    assert np.isnan(grid.efficiency([256, 8192, 1024], [1024, 1024, 1024],
                                    [1024, 1024, 8192])).all()


def test_grid_is_trilinear_in_log2():
    points = [[m, n, k, 0.2 + 0.1 * (m == 4096) + 0.2 * (n == 4096) + 0.4 * (k == 4096)]
              for m in (1024, 4096) for n in (1024, 4096) for k in (1024, 4096)]
    grid = table(points)
    # 2048 is half way in log2 between 1024 and 4096: a plane's value at the middle
    assert grid.efficiency(2048, 2048, 2048) == pytest.approx(0.2 + 0.05 + 0.1 + 0.2)
    assert grid.efficiency(2048, 1024, 1024) == pytest.approx(0.25)


def test_missing_corner_makes_points_scattered():
    points = grid_points(np.full(27, 0.5))[:-1]
    assert not table(points).grid


@given(st.lists(st.floats(0.05, 1.0), min_size=27, max_size=27),
       st.lists(st.floats(math.log2(512), math.log2(4096)), min_size=3, max_size=3))
def test_grid_value_lies_within_its_eight_neighbours(values, where):
    grid = table(grid_points(values))
    m, n, k = (2.0 ** x for x in where)
    value = float(grid.efficiency(m, n, k))
    cube = np.array(values).reshape(3, 3, 3)
    index = [min(int(np.searchsorted(np.log2(GRID_AXES), x, side="right")) - 1, 1)
             for x in where]
    corners = cube[index[0]:index[0] + 2, index[1]:index[1] + 2, index[2]:index[2] + 2]
    assert corners.min() - 1e-12 <= value <= corners.max() + 1e-12


@given(st.lists(st.tuples(st.integers(6, 14), st.integers(6, 14), st.integers(6, 14),
                          st.floats(0.05, 1.0)), min_size=2, max_size=12,
                unique_by=lambda point: point[:3]),
       st.tuples(st.floats(6, 14), st.floats(6, 14), st.floats(6, 14)))
def test_scattered_value_lies_within_the_points_and_is_exact_at_them(points, where):
    gemm = table([[2**m, 2**n, 2**k, e] for m, n, k, e in points], reach=64)
    values = [e for *_, e in points]
    value = float(gemm.efficiency(*(2.0 ** x for x in where)))
    assert min(values) - 1e-12 <= value <= max(values) + 1e-12
    for m, n, k, e in points:
        assert float(gemm.efficiency(2**m, 2**n, 2**k)) == e


@given(st.floats(0.05, 1.0), st.integers(9, 11), st.integers(9, 11), st.integers(9, 11))
def test_equal_efficiencies_give_times_that_grow_with_every_dimension(e, m, n, k):
    system = small_system(gemm_efficiency={"source": "flat", "points": grid_points([e] * 27)})
    shapes = [(2**m, 2**n, 2**k), (2**m + 64, 2**n, 2**k), (2**m, 2**n + 64, 2**k),
              (2**m, 2**n, 2**k + 64)]
    flops = np.array([2.0 * a * b * c for a, b, c in shapes])
    measured = system.gemm_efficiency.efficiency(*np.array(shapes).T.astype(float))
    assert np.allclose(measured, e, rtol=1e-12, atol=0)
    seconds = system.kernel_times(True, flops, 0.0, 1.0, None, measured)
    assert (seconds[1:] > seconds[0]).all()


def test_the_table_may_dip_as_waves_do():
    """Efficiency is not monotone in any dimension (wave quantization): accepted."""
    dipping = table([[1024, 1024, 1024, 0.8], [1152, 1024, 1024, 0.6],
                     [2048, 1024, 1024, 0.85]])
    assert dipping.efficiency(1152, 1024, 1024) == 0.6


def test_a_kernel_of_several_products_takes_the_time_of_each():
    gemm = table([[1024, 1024, 1024, 0.5], [1024, 1024, 4096, 0.8]], reach=2)
    # (kernels=1, slots=2, m n k batch, sizes=1): one 1024^3 product and one 1024x1024x4096
    shapes = np.array([[[[1024], [1024], [1024], [1]], [[1024], [1024], [4096], [1]]]],
                      dtype=float)
    flops = 2 * 1024**3 * np.array([1, 4])
    expected = flops.sum() / (flops[0] / 0.5 + flops[1] / 0.8)
    assert kernel_efficiency(gemm, shapes)[0, 0] == pytest.approx(expected, rel=1e-15)
    shapes[0, 1, 2, 0] = 2**30   # one product outside: the whole kernel falls back
    assert np.isnan(kernel_efficiency(gemm, shapes)[0, 0])


# ------------------------------------------------------------------ kernels' shapes
@pytest.mark.parametrize("execution", [Execution(), Execution(tensor_parallel=4),
                                       Execution(tensor_parallel=2, sequence_parallel=True),
                                       Execution(tensor_parallel=2, attention="flash")])
def test_every_matrix_kernel_lists_products_that_make_its_flops(execution):
    for model in model_presets().values():
        for build in (layer_kernels, output_kernels):
            for kernels in build(model, execution).values():
                if not kernels:
                    continue
                table_ = KernelTable(kernels)
                flops = table_.work([1, 3])["flops"]
                shapes = table_.gemm_shapes([1, 3])
                total = (2 * shapes[:, :, 0] * shapes[:, :, 1] * shapes[:, :, 2]
                         * shapes[:, :, 3]).sum(axis=1)
                for index, kernel in enumerate(kernels):
                    if kernel.cls == MATRIX and "flash_attention" not in kernel.name:
                        assert kernel.gemms, kernel.name
                        assert total[index] == pytest.approx(flops[index], rel=1e-12)
                    elif kernel.cls != MATRIX or "flash" in kernel.name:
                        assert not kernel.gemms, kernel.name


def test_shapes_are_per_gpu_after_tensor_parallelism():
    gpt = TransformerModel(layers=2, hidden=1024, heads=16, sequence=2048, vocab=32000)
    kernels = {kernel.name: kernel for kernel in
               layer_kernels(gpt, Execution(tensor_parallel=4))["F"]}
    table_ = KernelTable([kernels["qkv"], kernels["out_proj"], kernels["scores"]])
    shapes = table_.gemm_shapes([2])[:, 0, :, 0]
    assert shapes.tolist() == [[4096, 768, 1024, 1],        # m = s*b, n = 3h/t, k = h
                               [4096, 1024, 256, 1],        # row-parallel: k = h/t
                               [2048, 2048, 64, 8]]         # b * a/t heads of s x s x h/a


# ------------------------------------------------------------------ pricing
def qkv_point_system(e=0.5):
    """A table with GPT's QKV shape at one sample (m 2048, n 3*1024/4, k 1024) as a point,
    reaching no other kernel's shape (the nearest, mlp_up's 2048 x 1024 x 1024, is 0.415
    octaves away)."""
    return small_system(gemm_efficiency={"source": "test", "reach": 0.1, "points": [
        [2048, 768, 1024, e], [2048, 768, 4096, 0.9]]})


GPT = TransformerModel(layers=2, hidden=1024, heads=16, sequence=2048, vocab=32000)


def test_a_kernel_at_a_table_point_is_priced_at_exactly_its_efficiency():
    system = qkv_point_system(0.5)
    costs = ModelCosts(GPT, system, Execution(tensor_parallel=4))
    row = next(row for row in costs.kernel_report() if row["name"] == "qkv")
    assert row["efficiency"] == 0.5
    compute = row["flops"] / (system.peak_flops * 0.5)
    memory = (row["bytes_read"] + row["bytes_written"]) / system.memory_bandwidth
    assert row["bound"] == "compute" and compute > memory
    assert row["seconds"] == compute + system.launch_latency


def test_outside_the_table_the_old_pricing_holds_to_the_bit():
    plain = small_system()
    far = small_system(gemm_efficiency={"source": "test", "points": [
        [2**30, 2**30, 2**30, 0.5], [2**31 - 1, 2**30, 2**30, 0.6]]})
    for execution in (Execution(), Execution(tensor_parallel=4)):
        old = ModelCosts(GPT, plain, execution).part_times((1.0, 2.0))
        new = ModelCosts(GPT, far, execution).part_times((1.0, 2.0))
        for part in old:
            assert np.array_equal(old[part], new[part])
        assert ([row["seconds"] for row in ModelCosts(GPT, plain, execution).kernel_report()]
                == [row["seconds"] for row in ModelCosts(GPT, far, execution).kernel_report()])


def test_only_the_covered_kernels_change():
    plain = ModelCosts(GPT, small_system(), Execution(tensor_parallel=4)).kernel_report()
    table_ = ModelCosts(GPT, qkv_point_system(), Execution(tensor_parallel=4)).kernel_report()
    changed = {a["name"] for a, b in zip(plain, table_) if a["seconds"] != b["seconds"]}
    assert changed == {"qkv"}


def test_a_table_changes_the_makespan_through_the_memoised_path():
    import tabsched
    run = tabsched.generate("1f1b", devices=2, microbatches=4)
    times = [tabsched.evaluate(run, ModelCosts(GPT, system, Execution(tensor_parallel=4)))
             .makespan for system in (small_system(), qkv_point_system(0.2))]
    assert times[1] > times[0]   # the QKV product at 0.2 instead of 0.7 x waves


def test_a_system_with_a_table_is_hashable_and_equal_to_itself_rebuilt():
    first, second = qkv_point_system(), qkv_point_system()
    assert first == second and hash(first) == hash(second)
    assert first != qkv_point_system(0.4)
    assert first.replace(name="x").gemm_efficiency is first.gemm_efficiency
    with pytest.raises(AttributeError, match="immutable"):
        first.gemm_efficiency.source = "changed"
    grid = table(grid_points(np.full(27, 0.5)))
    with pytest.raises(ValueError, match="read-only"):
        grid._values[0, 0, 0] = 0.9   # what the lookups read cannot be changed either
    summary = first.summary()["gemm_efficiency"]
    assert summary["source"] == "test" and summary["points"][0] == [2048, 768, 1024, 0.5]
    assert small_system().summary()["gemm_efficiency"] is None


def test_seconds_become_efficiency_against_the_peak():
    system = small_system(gemm_efficiency={"source": "s", "seconds": [
        [1024, 1024, 1024, 2 * 1024**3 / 50e12], [2048, 2048, 2048, 1.0]]})
    assert system.gemm_efficiency.points[0][3] == pytest.approx(0.5, rel=1e-15)


def test_a_table_of_times_follows_the_peak_of_its_system():
    system = small_system(gemm_efficiency={"source": "s", "seconds": [
        [1024, 1024, 1024, 2 * 1024**3 / 50e12], [2048, 2048, 2048, 1.0]]})
    faster = system.replace(peak_flops="200TFLOP/s")
    assert faster.gemm_efficiency.points[0][3] == pytest.approx(0.25, rel=1e-15)
    assert faster.gemm_efficiency.seconds == system.gemm_efficiency.seconds
    assert faster.summary()["gemm_efficiency"]["seconds"][1] == [2048, 2048, 2048, 1.0]
    with pytest.raises(InvalidParameterError, match=r"seconds\[0\]: 1024x1024x1024 .* 2x the "
                                                    r"system's peak_flops 2.5e\+13"):
        system.replace(peak_flops="25TFLOP/s")
    # a table of efficiencies is what it says, whatever the peak
    points = qkv_point_system()
    assert points.replace(peak_flops="200TFLOP/s").gemm_efficiency is points.gemm_efficiency


def test_a_system_file_with_a_table_loads(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('peak_flops = "100TFLOP/s"\nmemory_bandwidth = "1TB/s"\n'
                    'devices_per_node = 8\nintra_node_bandwidth = "100GB/s"\n'
                    'intra_node_latency = "1us"\ninter_node_bandwidth = "10GB/s"\n'
                    'inter_node_latency = "10us"\n[gemm_efficiency]\nsource = "mine"\n'
                    'points = [[1024, 1024, 1024, 0.5], [2048, 2048, 2048, 0.7]]\n')
    assert load_system(path).gemm_efficiency.points[1] == (2048, 2048, 2048, 0.7)
    path.write_text(path.read_text().replace("0.7]", "1.7]"))
    with pytest.raises(InvalidParameterError,
                       match=r"mine.toml: gemm_efficiency.points\[1\]: efficiency 1.7 is 1.7x"):
        load_system(path)


# ------------------------------------------------------------------ errors
GOOD = [[1024, 1024, 1024, 0.5], [2048, 2048, 2048, 0.7]]


@pytest.mark.parametrize("value, message", [
    ([1, 2], r"gemm_efficiency must be a table with source and points"),
    ({"points": GOOD}, r"gemm_efficiency: missing key 'source'"),
    ({"source": " ", "points": GOOD}, r"gemm_efficiency.source is empty"),
    ({"source": 3, "points": GOOD}, r"gemm_efficiency.source must be text"),
    ({"source": "s", "points": GOOD, "colour": 1}, r"unknown key 'colour'"),
    ({"source": "s"}, r"give exactly one of points .* not neither"),
    ({"source": "s", "points": GOOD, "seconds": GOOD}, r"not points and seconds"),
    ({"source": "s", "points": 3}, r"gemm_efficiency.points must be an array"),
    ({"source": "s", "points": GOOD[:1]}, r"^gemm_efficiency.points has 1 point; a table "
                                           r"needs at least 2"),
    ({"source": "s", "points": []}, r"has 0 points; a table needs at least 2"),
    ({"source": "s", "points": [GOOD[0], GOOD[0]]}, r"has 1 distinct shape"),
    ({"source": "s", "points": [[1, 2, 3]] + GOOD}, r"points\[0\] must be a row \[m, n, k, "
                                                    r"efficiency\]"),
    ({"source": "s", "points": [[0, 2, 3, 0.5]] + GOOD}, r"points\[0\] m must be a positive"),
    ({"source": "s", "points": [[1.5, 2, 3, 0.5]] + GOOD}, r"points\[0\] m must be a positive"),
    ({"source": "s", "points": [[2, 2**31, 3, 0.5]] + GOOD}, r"points\[0\] n must be an "
                                                             r"integer from 1 to 2147483647"),
    ({"source": "s", "points": [[1, 2, 3, 1.25]] + GOOD}, r"points\[0\]: efficiency 1.25 is "
                                                          r"1.25x the peak"),
    ({"source": "s", "points": [[1, 2, 3, 0]] + GOOD}, r"points\[0\]: efficiency must be in "
                                                       r"\(0, 1\], not 0"),
    ({"source": "s", "points": [[1, 2, 3, math.nan]] + GOOD}, r"points\[0\] efficiency must be "
                                                              r"a number, not nan"),
    ({"source": "s", "points": [[1, 2, 3, "fast"]] + GOOD}, r"points\[0\] efficiency must be "
                                                            r"a number"),
    ({"source": "s", "points": GOOD + [[1024, 1024, 1024, 0.6]]},
     r"points\[2\]: shape 1024x1024x1024 is also row 0, with efficiency 0.5 against 0.6"),
    ({"source": "s", "seconds": [[1, 2, 3, 0.0]] + GOOD}, r"seconds\[0\] seconds must be > 0"),
    ({"source": "s", "seconds": [[1, 2, 3, math.inf]] + GOOD},
     r"seconds\[0\] seconds must be between"),
    ({"source": "s", "seconds": [[1024, 1024, 1024, 1e-6], [2048, 2048, 2048, 1.0]]},
     r"seconds\[0\]: 1024x1024x1024 in 1e-06 s is 2.147e\+15 FLOP/s, 21.5x the system's "
     r"peak_flops 1e\+14: a GEMM cannot beat the peak"),
    ({"source": "s", "points": GOOD, "reach": 0}, r"gemm_efficiency.reach must be > 0"),
    ({"source": "s", "points": GOOD, "dtype": 16}, r"gemm_efficiency.dtype must be text"),
])
def test_bad_tables_are_one_line_naming_the_key(value, message):
    with pytest.raises(InvalidParameterError, match=message) as error:
        small_system(gemm_efficiency=value)
    assert "\n" not in str(error.value)


def test_the_points_are_bounded_before_they_are_read():
    rows = [[1, 1, 1, 0.5]] * (MAX_POINTS + 1)
    with pytest.raises(InvalidParameterError, match=f"has {MAX_POINTS + 1} rows; at most "
                                                    f"{MAX_POINTS}"):
        small_system(gemm_efficiency={"source": "s", "points": rows})


def test_scattered_tables_are_bounded_tighter_than_grids():
    grid = [[m, n, k, 0.5] for m in range(1, 23) for n in range(1, 23) for k in range(1, 21)]
    assert len(grid) <= MAX_POINTS and small_system(
        gemm_efficiency={"source": "s", "points": grid}).gemm_efficiency.grid
    with pytest.raises(InvalidParameterError, match=f"gemm_efficiency.points: {len(grid) - 1} points are scattered .* "
                                                    f"at most {MAX_SCATTERED_POINTS} "
                                                    f"\\(a grid {MAX_POINTS}\\)"):
        small_system(gemm_efficiency={"source": "s", "points": grid[1:]})


def test_agreeing_duplicates_are_one_point():
    assert len(table(GOOD + [GOOD[0]]).points) == 2


def test_the_memoised_prices_agree_with_the_kernel_report():
    """part_times reads the products' shapes from a memo, the report builds them: the same
    seconds either way."""
    from tabsched.table import FORWARD
    costs = ModelCosts(GPT, qkv_point_system(0.3), Execution(tensor_parallel=4))
    forward = sum(row["seconds"] for row in costs.kernel_report() if row["phase"] == "F")
    assert costs.part_times((1.0,))["layer"][FORWARD][0] == pytest.approx(forward, rel=1e-14)


# ------------------------------------------------- host overhead and the sustained factor
def test_the_overhead_comes_off_every_time_and_the_scale_multiplies_every_efficiency():
    times = [[1024, 1024, 1024, 3e-5], [4096, 4096, 4096, 6e-4]]
    plain = GemmTable.from_value({"source": "s", "seconds": times}, 312e12)
    kernel = GemmTable.from_value({"source": "s", "seconds": times, "overhead": "10us"}, 312e12)
    scaled = GemmTable.from_value({"source": "s", "seconds": times, "overhead": 1e-5,
                                   "scale": 0.5, "scale_source": "half", "reach": 2}, 312e12)
    for (m, n, k, seconds), (_, _, _, e) in zip(times, kernel.points):
        assert e == 2.0 * m * n * k / ((seconds - 1e-5) * 312e12)
    assert kernel.seconds == plain.seconds           # the times stay as measured
    assert np.all(kernel.efficiency([1024, 4096], [1024, 4096], [1024, 4096])
                  > plain.efficiency([1024, 4096], [1024, 4096], [1024, 4096]))
    assert np.array_equal(scaled.efficiency([1024, 4096], [1024, 4096], [1024, 4096]),
                          0.5 * kernel.efficiency([1024, 4096], [1024, 4096], [1024, 4096]))
    assert 0 < scaled.efficiency(2048, 2048, 2048) < 0.5
    again = GemmTable.from_value(scaled.to_value(), 312e12)
    assert again == scaled and hash(again) == hash(scaled)
    assert scaled != kernel and kernel != plain


@pytest.mark.parametrize("extra, message", [
    ({"overhead": "30us"}, r"gemm_efficiency\.seconds\[0\]: 1024x1024x1024 took 3e-05 s, not "
                           r"more than the table's overhead 3e-05 s"),
    ({"overhead": -1}, r"gemm_efficiency\.overhead"),
    ({"scale": 0.9}, r"gemm_efficiency: scale needs scale_source"),
    ({"scale": 1.5, "scale_source": "x"}, r"gemm_efficiency\.scale"),
    ({"scale": 0, "scale_source": "x"}, r"gemm_efficiency\.scale must be > 0"),
    ({"scale_source": "x"}, r"gemm_efficiency: scale_source without scale"),
])
def test_bad_overheads_and_scales_are_one_line_naming_the_key(extra, message):
    value = {"source": "s", "seconds": [[1024, 1024, 1024, 3e-5], [4096, 4096, 4096, 6e-4]]}
    with pytest.raises(InvalidParameterError, match=message):
        GemmTable.from_value({**value, **extra}, 312e12)


def test_an_overhead_goes_with_times_only():
    with pytest.raises(InvalidParameterError, match="overhead goes with seconds rows"):
        GemmTable.from_value({"source": "s", "overhead": 1e-6, "points": [
            [1024, 1024, 1024, 0.5], [2048, 2048, 2048, 0.6]]}, 312e12)
