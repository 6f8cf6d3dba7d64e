"""costs/nccl.py and collectives.group_time: measured collective bus bandwidth by collective,
tier, ranks and size; the collectives a table covers priced at it, every other one as the
ring, to the bit; the table's errors."""

import math
import pathlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tabsched import InvalidParameterError, ModelCosts, load_system
from tabsched.costs.collectives import group_time, ring_time
from tabsched.costs.nccl import MAX_POINTS, MAX_TABLES, CollectiveTables, bus_factor
from tabsched.costs.placement import GroupSpan
from tabsched.costs.transformer import TransformerModel
from tabsched.execution import Execution

DATA = pathlib.Path(__file__).resolve().parent / "data"
#: dgx-a100's numbers without its measured tables: what the examples add a table to.
PLAIN = DATA / "a100-plain.toml"
EXAMPLE = DATA / "a100-vtrain-nccl.toml"

#: VIA-Research/vTrain trace/a100/AR_GPU8_1M_1024M_LUT @
#: f8dda8473a48b373b1d25f51f52d685bff5150c5 (Bang et al., "vTrain", MICRO 2024), as
#: ../shared/data/gpu-measurements.toml [dgx_a100.nccl.intra_node.vtrain_all_reduce] n8 holds
#: it: size_bytes, oop_time_ns, oop_busbw_gbps of an 8-GPU A100 all-reduce (float, sum).
VTRAIN_N8 = [(1048576, 92790, 19.78), (8388608, 134300, 109.3), (16777216, 232400, 126.33),
             (23068672, 303100, 133.18), (24117248, 306800, 137.55),
             (25165824, 265300, 166.01), (100663296, 828500, 212.63),
             (1073741824, 8193000, 229.35)]
#: Rows of that table the example keeps (every MiB to 128 MiB, then a subset to 1 GiB).
VTRAIN_N8_ROWS = 140

GPT = TransformerModel(layers=2, hidden=1024, heads=16, sequence=2048, vocab=32000)
TENSOR8 = GroupSpan("tensor", 8, 1, 8, 1)


def tables(*entries):
    return CollectiveTables.from_value([dict(collective="all_reduce", tier="node", ranks=8,
                                             source="test", **entry) for entry in entries])


def with_tables(base, value):
    return base.replace(collective_bandwidth=value)


# ------------------------------------------------------------------ the example system
def test_the_example_pins_the_vtrain_measurements():
    system = load_system(EXAMPLE)
    table = system.collective_bandwidth.table("all_reduce", "node", 8)
    assert len(system.collective_bandwidth.tables) == 1 and len(table.points) == VTRAIN_N8_ROWS
    assert "AR_GPU8_1M_1024M_LUT" in table.source
    assert "[dgx_a100.nccl.intra_node.vtrain_all_reduce]" in table.source
    points = dict(table.points)
    for size, time_ns, gbps in VTRAIN_N8:
        assert points[size] == float(f"{gbps!r}e9")   # the printed GB/s, as B/s
        # and the bus bandwidth is nccl-tests' of the measured time, to its rounding
        assert points[size] == pytest.approx(size / (time_ns * 1e-9) * 1.75, rel=5e-4)
    assert system.replace(collective_bandwidth=None, name=str(PLAIN)) == load_system(PLAIN)


def test_a_collective_at_a_table_point_takes_exactly_its_bus_bandwidth():
    system = load_system(EXAMPLE)
    for size, _, gbps in VTRAIN_N8:
        assert group_time("all_reduce", size, TENSOR8, system) == size * 1.75 / float(f"{gbps}e9")
    sizes = np.array([size for size, _, _ in VTRAIN_N8], dtype=np.float64)
    busbw = np.array([float(f"{gbps}e9") for _, _, gbps in VTRAIN_N8])
    assert np.array_equal(group_time("all_reduce", sizes, TENSOR8, system), sizes * 1.75 / busbw)


def test_outside_the_table_the_ring_prices_to_the_bit():
    plain, measured = load_system(PLAIN), load_system(EXAMPLE)
    sizes = np.array([1.0, 2**20 - 1, 2**30 + 1, 2**34])   # below and above the table
    cases = [("all_reduce", TENSOR8, sizes), ("all_gather", TENSOR8, 2.0**24),
             ("reduce_scatter", TENSOR8, 2.0**24),
             ("all_reduce", GroupSpan("tensor", 4, 1, 4, 1), 2.0**24),   # other ranks
             ("all_reduce", GroupSpan("data", 16, 8, 1, 16), 2.0**24),   # other tier
             ("all_reduce", GroupSpan("tensor", 1, 1, 1, 1), 2.0**24)]   # one rank: 0
    for collective, group, nbytes in cases:
        old = group_time(collective, nbytes, group, plain)
        new = group_time(collective, nbytes, group, measured)
        assert type(old) is type(new) and np.array_equal(old, new)
    bandwidth, latency = plain.tier_link("node")
    assert group_time("all_reduce", 1.0, TENSOR8, measured) == ring_time(
        "all_reduce", 1.0, 8, bandwidth, latency)


def test_a_network_table_covers_only_groups_spread_as_it_was_measured():
    system = with_tables(load_system(PLAIN), [entry(tier="network", ranks=16, per_node=8)])
    two_nodes = GroupSpan("data", 16, 1, 8, 2)     # 8 members on each of 2 nodes: every NIC
    one_each = GroupSpan("data", 16, 8, 1, 16)     # 1 member on each of 16 nodes: one NIC
    assert group_time("all_reduce", 2.0**20, two_nodes, system) == 2.0**20 * 1.875 / 20e9
    assert group_time("all_reduce", 2.0**20, one_each, system) == group_time(
        "all_reduce", 2.0**20, one_each, load_system(PLAIN))


def test_a_mixed_array_takes_each_rule_where_it_holds():
    plain, measured = load_system(PLAIN), load_system(EXAMPLE)
    sizes = np.array([2.0**10, 2.0**20, 2.0**36])
    old = group_time("all_reduce", sizes, TENSOR8, plain)
    new = group_time("all_reduce", sizes, TENSOR8, measured)
    assert new[0] == old[0] and new[2] == old[2] and new[1] == 2**20 * 1.75 / 19.78e9


def test_between_points_the_bandwidth_is_a_power_law_of_the_size():
    table = tables({"busbw": [[2**20, 20e9], [2**22, 80e9]]})
    between = table.bus_bandwidth("all_reduce", "node", 8, [2**21, 2**20 * 2**0.5])
    assert between == pytest.approx([40e9, 20e9 * 2**0.5], rel=1e-14)
    assert np.isnan(table.bus_bandwidth("all_gather", "node", 8, 2**21))


def test_the_bus_factors_are_nccl_tests():
    # NVIDIA/nccl-tests doc/PERFORMANCE.md: busbw = algbw * 2(n-1)/n for all-reduce,
    # * (n-1)/n for all-gather and reduce-scatter
    assert bus_factor("all_reduce", 8) == 1.75 and bus_factor("all_reduce", 2) == 1.0
    assert bus_factor("all_gather", 8) == bus_factor("reduce_scatter", 8) == 0.875
    system = with_tables(load_system(PLAIN), [
        {"collective": name, "tier": "node", "ranks": 4, "source": "t",
         "busbw": [[2**20, 100e9], [2**30, 100e9]]} for name in ("all_gather", "reduce_scatter")])
    group = GroupSpan("tensor", 4, 1, 4, 1)
    for name in ("all_gather", "reduce_scatter"):
        assert group_time(name, 2.0**24, group, system) == 2.0**24 * 0.75 / 100e9


@given(st.lists(st.tuples(st.floats(0.05, 3.0), st.floats(0.0, 1.0)), min_size=2,
                max_size=8),
       st.lists(st.floats(0.0, 1.0), min_size=2, max_size=20))
def test_time_is_monotone_in_size_when_the_measured_times_are(steps, where):
    # sizes growing by 2**step; the time at each point grows by a part of the size's growth,
    # so the table's bus bandwidth may rise but never faster than the size (algbw = S/t)
    size, time, rows = 2.0**20, 1e-4, []
    for step, part in steps:
        rows.append([size, size * 1.75 / time])
        size, time = size * 2**step, time * 2**(step * part)
    system = with_tables(load_system(PLAIN), tables({"busbw": rows}))
    low, high = math.log2(rows[0][0]), math.log2(rows[-1][0])
    sizes = np.sort(2.0 ** (low + np.array(where) * (high - low)))
    sizes = np.clip(sizes, rows[0][0], rows[-1][0])
    times = group_time("all_reduce", sizes, TENSOR8, system)
    assert np.all(np.diff(times) >= -1e-12 * times[1:])


@given(st.lists(st.floats(0.05, 3.0), min_size=2, max_size=8),
       st.lists(st.floats(0.0, 2.0), min_size=2, max_size=8),
       st.lists(st.floats(0.0, 1.0), min_size=2, max_size=20))
def test_the_bandwidth_is_monotone_in_size_when_the_table_is(steps, rises, where):
    size, busbw, rows = 2.0**20, 10e9, []
    for step, rise in zip(steps, rises):
        rows.append([size, busbw])
        size, busbw = size * 2**step, busbw * (1 + rise)
    table = tables({"busbw": rows})
    sizes = np.sort(rows[0][0] * (rows[-1][0] / rows[0][0]) ** np.array(where))
    sizes = np.clip(sizes, rows[0][0], rows[-1][0])
    read = table.bus_bandwidth("all_reduce", "node", 8, sizes)
    assert np.all(np.diff(read) >= -1e-12 * read[1:])
    assert np.all((read >= rows[0][1] * (1 - 1e-12)) & (read <= rows[-1][1] * (1 + 1e-12)))


def test_a_rising_bandwidth_may_make_a_larger_message_faster_as_measured():
    # vTrain's 23 and 24 MiB rows: 137.55 -> 166.01 GB/s, 306.8 -> 265.3 us. The table says
    # so and tabsched keeps it: monotone time needs monotone times, not bandwidths.
    system = load_system(EXAMPLE)
    assert (group_time("all_reduce", 24 * 2.0**20, TENSOR8, system)
            < group_time("all_reduce", 23 * 2.0**20, TENSOR8, system))


# ------------------------------------------------------------------ through the cost model
def test_only_the_covered_collectives_change_in_the_kernel_report():
    plain, measured = load_system(PLAIN), load_system(EXAMPLE)
    run = Execution(tensor_parallel=8)
    old = ModelCosts(GPT, plain, run).kernel_report()
    new = ModelCosts(GPT, measured, run).kernel_report()
    changed = {a["name"] for a, b in zip(old, new) if a["seconds"] != b["seconds"]}
    assert changed == {"all_reduce"}
    message = 2048 * 1024 * 2   # s * b * h bytes of bf16 at one sample: 4 MiB, a table point
    row = next(row for row in new if row["name"] == "all_reduce")
    assert row["seconds"] == message * 1.75 / 76.62e9
    assert (ModelCosts(GPT, plain, Execution()).kernel_report()
            == ModelCosts(GPT, measured, Execution()).kernel_report())


def test_a_table_changes_the_makespan_through_the_memoised_path():
    import tabsched
    run = tabsched.generate("1f1b", devices=2, microbatches=4)
    times = [tabsched.evaluate(run, ModelCosts(GPT, system, Execution(tensor_parallel=8)))
             .makespan for system in (load_system(PLAIN), load_system(EXAMPLE))]
    assert times[0] != times[1]
    untouched = [tabsched.evaluate(run, ModelCosts(GPT, system, Execution())).makespan
                 for system in (load_system(PLAIN), load_system(EXAMPLE))]
    assert untouched[0] == untouched[1]


def test_a_system_with_tables_is_hashable_and_equal_to_itself_rebuilt():
    first, second = load_system(EXAMPLE), load_system(EXAMPLE)
    assert first == second and hash(first) == hash(second)
    table = first.collective_bandwidth.tables[0]
    with pytest.raises(AttributeError, match="immutable"):
        table.source = "changed"
    with pytest.raises(ValueError, match="read-only"):
        table._busbw[0] = 1.0
    summary = first.summary()["collective_bandwidth"]
    assert summary[0]["busbw"][0] == [1048576.0, 19.78e9]
    assert with_tables(first, summary) == first
    assert load_system(PLAIN).summary()["collective_bandwidth"] is None


# ------------------------------------------------------------------ what is refused
GOOD = [[2**20, 20e9], [2**30, 200e9]]


def entry(**changes):
    return {"collective": "all_reduce", "tier": "node", "ranks": 8, "source": "s",
            "busbw": GOOD, **changes}


@pytest.mark.parametrize("value, message", [
    ({"source": "s"}, r"collective_bandwidth must be an array of tables"),
    ([], r"collective_bandwidth is empty"),
    ([entry(links=2)], r"collective_bandwidth\[0\]: unknown key 'links'"),
    ([{k: v for k, v in entry().items() if k != "source"}],
     r"collective_bandwidth\[0\]: missing key 'source' \(say where"),
    ([entry(source=" ")], r"collective_bandwidth\[0\].source is empty"),
    ([entry(collective="broadcast")], r"collective_bandwidth\[0\].collective 'broadcast' is "
                                      r"not one of all_reduce, all_gather, reduce_scatter"),
    ([entry(tier="rack")], r"collective_bandwidth\[0\].tier 'rack' is not one of node, network"),
    ([entry(ranks=1)], r"collective_bandwidth\[0\].ranks must be an integer >= 2, not 1"),
    ([entry(busbw=GOOD[:1])], r"collective_bandwidth\[0\].busbw has 1 row; a table needs at "
                              r"least 2"),
    ([entry(busbw=[[2**20, 0.0], GOOD[1]])], r"busbw\[0\] busbw must be > 0"),
    ([entry(busbw=[[2**20, -1.0], GOOD[1]])], r"busbw\[0\] busbw must be > 0"),
    ([entry(busbw=[[2**20, math.inf], GOOD[1]])], r"busbw\[0\] busbw must be between"),
    ([entry(busbw=[[2**20, math.nan], GOOD[1]])], r"busbw\[0\] busbw must be a number"),
    ([entry(busbw=[[0, 1e9], GOOD[1]])], r"busbw\[0\] bytes must be > 0"),
    ([entry(busbw=[GOOD[1], GOOD[0]])], r"busbw\[1\]: size 1.04858e\+06 B does not grow from "
                                        r"the row before \(1.07374e\+09 B\)"),
    ([entry(busbw=[GOOD[0], GOOD[0]])], r"busbw\[1\]: size 1.04858e\+06 B does not grow"),
    ([entry(busbw=[[1, 2, 3], GOOD[1]])], r"busbw\[0\] must be a row \[bytes, B/s\]"),
    ([entry(), entry()], r"collective_bandwidth\[1\]: all_reduce on tier node at 8 ranks \(8 "
                         r"per node\) is also collective_bandwidth\[0\]"),
    ([entry(tier="network", ranks=16)], r"collective_bandwidth\[0\]: missing key 'per_node' "
                                        r"\(how many of the 16 ranks share each node\)"),
    ([entry(tier="network", ranks=16, per_node=16)], r"per_node 16 does not spread 16 ranks "
                                                     r"evenly over two or more nodes"),
    ([entry(tier="network", ranks=16, per_node=3)], r"per_node 3 does not spread 16 ranks"),
    ([entry(per_node=4)], r"collective_bandwidth\[0\].per_node: inside a node every rank "
                          r"shares it \(per_node is ranks, 8\), not 4"),
])
def test_bad_tables_are_one_line_naming_the_key(value, message):
    with pytest.raises(InvalidParameterError, match=message) as error:
        with_tables(load_system(PLAIN), value)
    assert "\n" not in str(error.value)


def test_the_tables_and_points_are_bounded():
    with pytest.raises(InvalidParameterError, match=f"has {MAX_TABLES + 1} tables; at most "
                                                    f"{MAX_TABLES}"):
        CollectiveTables.from_value([entry()] * (MAX_TABLES + 1))
    with pytest.raises(InvalidParameterError, match=f"has {MAX_POINTS + 1} rows; at most "
                                                    f"{MAX_POINTS}"):
        CollectiveTables.from_value([entry(busbw=[GOOD[0]] * (MAX_POINTS + 1))])


def test_a_system_file_with_tables_loads(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('peak_flops = "100TFLOP/s"\nmemory_bandwidth = "1TB/s"\n'
                    'devices_per_node = 8\nintra_node_bandwidth = "100GB/s"\n'
                    'intra_node_latency = "1us"\ninter_node_bandwidth = "10GB/s"\n'
                    'inter_node_latency = "10us"\n\n[[collective_bandwidth]]\n'
                    'collective = "reduce_scatter"\ntier = "network"\nranks = 16\nper_node = 8\n'
                    'source = "my cluster"\nbusbw = [[1048576, 5e9], [1073741824, 40e9]]\n')
    system = load_system(path)
    assert system.collective_bandwidth.table("reduce_scatter", "network", 16, 8).source == \
        "my cluster"


# ------------------------------------------------------------------ the nccl-tests reader
FIXTURE_LINES = (DATA / "nccl-all-reduce-a100.txt").read_text().splitlines()
TOKENS = st.one_of(st.sampled_from(["0", "-1", "nan", "inf", "1e400", "N/A", "#", "", "x",
                                    "99999999999999999999", "0.00", "Rank", "size", "on"]),
                   st.text(max_size=12))


@given(st.lists(st.tuples(st.integers(0, len(FIXTURE_LINES) - 1), st.integers(0, 30), TOKENS),
                min_size=1, max_size=6))
def test_a_mangled_output_reads_or_is_one_line_error(tmp_path_factory, edits):
    from tabsched.costs.nccl import read_nccl_tests
    lines = list(FIXTURE_LINES)
    for line, word, token in edits:
        words = lines[line].split(" ")
        words[word % len(words)] = token
        lines[line] = " ".join(words)
    path = tmp_path_factory.mktemp("mangled") / "all_reduce_perf.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8", errors="surrogatepass")
    try:
        run = read_nccl_tests(path)
    except InvalidParameterError as error:
        assert "\n" not in str(error) and str(error).startswith(f"{path}: ")
        return
    sizes = [size for _, size, _ in run.rows]
    assert run.ranks >= 2 and sizes == sorted(sizes)
    assert all(0 < busbw < math.inf for _, _, busbw in run.rows)
