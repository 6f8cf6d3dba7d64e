"""ZeRO-2/3 and FSDP in the lowering (tabsched/sharding.py) and their prices and memory
(tabsched/costs/sharded.py)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tabsched import Execution, InvalidParameterError, ModelCosts, _reference, engine, evaluate
from tabsched import generate
from tabsched._testing import kernel_graphs, kernel_scratch, random_durations, random_table
from tabsched.costs.system import load_system
from tabsched.lower import lower
from tabsched.nodes import CELL, OPTIMIZER, REDUCE_GRAD, RESHARD, TRANSFER, UNSHARD
from tabsched.sharding import gathered_at_once
from tabsched.table import BACKWARD, WEIGHT_GRAD

SHARDING = st.tuples(st.sampled_from([2, 3]), st.booleans(), st.integers(0, 3))


def sharded_lowering(seed, sharding, optimizer, contention="none"):
    table = random_table(seed, replicate=0.0)
    return lower(table, sharding=sharding, optimizer=optimizer, contention=contention,
                 devices_per_node=2)


def ids(lowered, kind):
    return np.arange(lowered.nodes(kind).start, lowered.nodes(kind).stop)


def cells_of(lowered, device, stage, kinds):
    table = lowered.table
    mask = (table.device == device) & (table.stage == stage) & np.isin(table.kind, kinds)
    return lowered.cell_of_op[np.flatnonzero(mask)]


@given(seed=st.integers(0, 2**32 - 1), sharding=SHARDING, optimizer=st.booleans())
def test_the_nodes_follow_the_dependencies_and_each_stream_runs_one_at_a_time(
        seed, sharding, optimizer):
    lowered = sharded_lowering(seed, sharding, optimizer)
    durations = random_durations(lowered, seed, samples=1)[0]
    durations[lowered.nodes(RESHARD)] = 0.0           # a free takes no time
    start, end, _ = lowered.run(durations)
    start, end = start[0], end[0]
    shard, table = lowered.sharding, lowered.table
    zero = sharding[0]
    # every device's use of a stage lies inside a window, gathered before and freed after
    unshard, reshard = ids(lowered, UNSHARD), ids(lowered, RESHARD)
    assert len(unshard) == (0 if zero == 2 else len(reshard))
    for k, (u, r) in enumerate(zip(unshard, reshard)):
        first, last = int(shard.window_first[k]), int(shard.window_last[k])
        assert start[first] >= end[u] and start[r] >= end[last]
        assert lowered.cell_device[first] == shard.unshard_device[k]
    for cell in range(lowered.num_cells) if zero == 3 else ():
        op = int(np.searchsorted(lowered.cell_of_op, cell))
        device, stage = int(table.device[op]), int(table.stage[op])
        inside = (shard.unshard_device == device) & (shard.unshard_stage == stage) & \
            (shard.window_first <= cell) & (shard.window_last >= cell)
        assert inside.sum() >= 1
    # a device's all-gathers, and its reduce-scatters, one after another
    for kind, devices in ((UNSHARD, shard.unshard_device), (REDUCE_GRAD, shard.reduce_device)):
        nodes = ids(lowered, kind)
        for device in np.unique(devices):
            mine = nodes[devices == device]
            assert np.all(start[mine][1:] >= end[mine][:-1])
    # REDUCE_GRAD after the stage's last backward on its device, before the step
    for k, g in enumerate(ids(lowered, REDUCE_GRAD)):
        device, stage = int(shard.reduce_device[k]), int(shard.reduce_stage[k])
        assert start[g] >= end[cells_of(lowered, device, stage, [BACKWARD, WEIGHT_GRAD])].max()
        if optimizer:
            assert start[lowered.nodes(OPTIMIZER).start + device] >= end[g]
    pairs = {(int(d), int(s)) for d, s in zip(table.device, table.stage)
             if np.any((table.device == d) & (table.stage == s)
                       & np.isin(table.kind, [BACKWARD, WEIGHT_GRAD]))}
    assert len(ids(lowered, REDUCE_GRAD)) == len(pairs)
    # the sharding nodes hold no compute stream
    assert np.all(lowered.node_device[lowered.nodes(UNSHARD).start:] == engine.NO_DEVICE)


@given(seed=st.integers(0, 2**32 - 1), sharding=SHARDING, optimizer=st.booleans(),
       contention=st.sampled_from(["none", "link", "nic"]), samples=st.integers(1, 3))
def test_the_engine_equals_the_reference_on_sharded_lowerings(seed, sharding, optimizer,
                                                              contention, samples):
    lowered = sharded_lowering(seed, sharding, optimizer, contention)
    durations = random_durations(lowered, seed, samples=samples)
    durations[:, lowered.nodes(CELL)] += 0.25
    start, _ = engine.run(lowered, durations)
    graph, = kernel_graphs(lowered, (_reference,))
    expected = np.full(durations.shape, np.nan)
    binding = np.full(lowered.num_nodes, -7, np.int32)
    status = _reference.fifo_starts(graph, durations, expected, binding,
                                    kernel_scratch(_reference, graph))
    assert status == _reference.OK
    np.testing.assert_array_equal(start, expected)


def test_p1_fsdp_by_hand():
    """One device, GPipe's F0 F1 B0 B1, cells of 1, all-gathers of 0.5, reduce-scatter 0.25."""
    table = generate("gpipe", devices=1, microbatches=2)

    def makespan(sharding):
        lowered = lower(table, sharding=sharding)
        durations = np.ones(lowered.num_nodes)
        durations[lowered.nodes(UNSHARD)] = 0.5
        durations[lowered.nodes(RESHARD)] = 0.0
        durations[lowered.nodes(REDUCE_GRAD)] = 0.25
        start, end, _ = lowered.run(durations)
        return float(end[0].max()), lowered
    # resharded after forward: gather 0.5, F F (2), gather again 0.5 (freed at 2.5),
    # B B (2), reduce-scatter 0.25
    span, lowered = makespan((3, True, 1))
    assert lowered.count(UNSHARD) == 2 and span == 0.5 + 2 + 0.5 + 2 + 0.25
    # kept gathered: one gather, four cells, the reduce-scatter
    span, lowered = makespan((3, False, 1))
    assert lowered.count(UNSHARD) == 1 and span == 0.5 + 4 + 0.25
    # ZeRO-2: nothing gathered, the reduce-scatter exposed at the end
    span, lowered = makespan((2, False, 0))
    assert lowered.count(UNSHARD) == 0 and span == 4 + 0.25


def test_p2_1f1b_zero3_by_hand():
    """1F1B on two devices, two microbatches: d0 runs F0 F1 B0 B1 (its forwards first: two
    windows), d1 F0 B0 F1 B1 (one window). Cells 1, transfers 0, gathers 0.5, reduces 0.25."""
    lowered = lower(generate("1f1b", devices=2, microbatches=2), sharding=(3, True, 1))
    durations = np.ones(lowered.num_nodes)
    durations[lowered.nodes(TRANSFER)] = 0.0
    durations[lowered.nodes(UNSHARD)] = 0.5
    durations[lowered.nodes(RESHARD)] = 0.0
    durations[lowered.nodes(REDUCE_GRAD)] = 0.25
    start, end, _ = lowered.run(durations)
    start, end = start[0], end[0]
    assert [lowered.describe_node(int(n)) for n in ids(lowered, UNSHARD)] == [
        "unshard stage 0 d0", "unshard stage 0 d0", "unshard stage 1 d1"]
    cell = {lowered.describe_cell(c)[0]: c for c in range(lowered.num_cells)}
    # d1: gathered at 0.5; 1F0 after 0F0 (0.5 + 1), 1B0, 1F1 (after 0F1 at 2.5, 1B0 at 3.5)
    expected = {"0F0": 0.5, "0F1": 1.5, "1F0": 1.5, "1B0": 2.5, "1F1": 3.5, "1B1": 4.5,
                # d0's backward window gathers after its forward window ends (2.5, done 3.0);
                # 0B0 waits for 1B0's gradient (3.5), 0B1 for 1B1's (5.5)
                "0B0": 3.5, "0B1": 5.5}
    assert {text: float(start[c]) for text, c in cell.items()} == expected
    unshard = ids(lowered, UNSHARD)
    assert [float(start[u]) for u in unshard] == [0.0, 2.5, 0.0]
    assert float(end.max()) == 6.5 + 0.25      # d0's reduce-scatter after 0B1


small = dict(model="paper-128l", system="mid_nw_mid_cp")
FAMILIES = st.sampled_from([("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2), ("zbv", 2)])


def family_table(family, chunks, devices, microbatches):
    params = dict(devices=devices, microbatches=microbatches)
    if family == "interleaved-1f1b":
        params["chunks"] = chunks
    return generate(family, **params)


@settings(max_examples=12)
@given(family=FAMILIES, devices=st.sampled_from([2, 4]), microbatches=st.sampled_from([4, 8]),
       data=st.sampled_from([2, 4, 8]), zero=st.sampled_from([2, 3]), reshard=st.booleans())
def test_memory_never_negative_and_persistent_state_divided_by_d(family, devices, microbatches,
                                                                 data, zero, reshard):
    name, chunks = family
    table = family_table(name, chunks, devices, microbatches)
    replicated = ModelCosts(**small, execution=Execution(data_parallel=data))
    sharded = ModelCosts(**small, execution=Execution(data_parallel=data, zero_stage=zero,
                                                      reshard_after_forward=reshard
                                                      if zero == 3 else None))
    plain = np.asarray(replicated.persistent_memory(table))
    held = np.asarray(sharded.persistent_memory(table))
    model = replicated.model
    if zero == 3:     # weights, gradients and optimizer state: all 1/d (ZeRO, Figure 1)
        np.testing.assert_allclose(held, plain / data, rtol=1e-12)
    else:             # weights whole, the rest 1/d
        weights = plain * model.dtype_bytes / model.bytes_per_param
        np.testing.assert_allclose(held, weights + (plain - weights) / data, rtol=1e-12)
    result = evaluate(table, sharded, formula=False)
    for device, (times, values) in enumerate(result.memory_timeline()):
        assert len(values) == 0 or values.min() >= -1e-6 * max(1.0, float(np.abs(values).max()))
        assert abs(float(values[-1])) <= 1e-6 * float(np.abs(values).max())  # all freed
    # at its peak no device holds more than ZeRO-1 would (what ZeRO-2/3 add is freed
    # state that ZeRO-1 holds all the time)
    zero1 = evaluate(table, ModelCosts(**small, execution=Execution(data_parallel=data,
                                                                    zero_stage=1)),
                     formula=False)
    for mine, theirs in zip(result.devices, zero1.devices):
        assert mine.peak_total_memory <= theirs.peak_total_memory * (1 + 1e-12)


@settings(max_examples=10)
@given(family=FAMILIES, zero=st.sampled_from([2, 3]), prefetch=st.integers(0, 2),
       slower=st.floats(1.0, 8.0))
def test_the_makespan_grows_as_the_data_parallel_bandwidth_falls(family, zero, prefetch,
                                                                  slower):
    name, chunks = family
    table = family_table(name, chunks, 4, 8)
    system = load_system("mid_nw_mid_cp")
    run = Execution(data_parallel=4, zero_stage=zero, contention="none",
                    prefetch=prefetch if zero == 3 else None)
    fast = ModelCosts("paper-128l", system, run)
    slow_system = system.replace(intra_node_bandwidth=system.intra_node_bandwidth / slower)
    slow = ModelCosts("paper-128l", slow_system, run)
    assert fast.placement.group("data").tier == "node"
    fast_result, slow_result = evaluate(table, fast), evaluate(table, slow)
    assert slow_result.makespan >= fast_result.makespan
    shard = fast_result._lowered
    for kind in (UNSHARD, REDUCE_GRAD):
        nodes = shard.nodes(kind)
        assert np.all(slow_result._node_durations[nodes] >= fast_result._node_durations[nodes])


@pytest.mark.parametrize("zero", [2, 3])
def test_zero_prices_the_data_group_collectives(zero):
    table = generate("1f1b", devices=4, microbatches=8)
    costs = ModelCosts(**small, execution=Execution(data_parallel=8, zero_stage=zero))
    result = evaluate(table, costs)
    lowered = result._lowered
    from tabsched.costs.collectives import group_time
    params = costs.stage_parameters(table) / costs.execution.tensor_parallel
    group = costs.placement.group("data")
    reduce = result._node_durations[lowered.nodes(REDUCE_GRAD)]
    expected = group_time("reduce_scatter", params * costs.model.grad_bytes, group,
                          costs.system)
    np.testing.assert_allclose(reduce, np.asarray(expected)[lowered.sharding.reduce_stage])
    gather = result._node_durations[lowered.nodes(UNSHARD)]
    if zero == 3:
        expected = group_time("all_gather", params * costs.model.dtype_bytes, group,
                              costs.system)
        np.testing.assert_allclose(gather, np.asarray(expected)[lowered.sharding.unshard_stage])
    else:
        assert len(gather) == 0


def test_interleaved_zero3_is_evaluated_with_a_note_and_replicas_are_refused():
    interleaved = generate("interleaved-1f1b", devices=4, microbatches=8, chunks=2)
    costs = ModelCosts(**small, execution=Execution(data_parallel=2, zero_stage=3))
    result = evaluate(interleaved, costs)
    assert gathered_at_once(result._lowered).max() == 2
    assert any("holds up to 2 stages' parameters gathered at once" in note
               for note in result.notes)
    one_chunk = evaluate(generate("1f1b", devices=4, microbatches=8), costs)
    assert not any("gathered at once" in note for note in one_chunk.notes)
    with pytest.raises(InvalidParameterError, match=r"zero_stage 3: stage 0 runs on devices "
                                                    r"0, 3 \(replicas inside the pipeline\)"):
        evaluate(generate("chimera", devices=4, microbatches=8), costs)


def test_zero_below_2_lowers_as_before():
    table = generate("1f1b", devices=4, microbatches=8)
    for zero in (0, 1):
        costs = ModelCosts(**small, execution=Execution(data_parallel=4, zero_stage=zero))
        assert costs.sharding is None
        lowered = evaluate(table, costs)._lowered
        assert lowered.sharding is None and lowered.count(UNSHARD) == 0


def test_bad_sharding_options_are_one_line():
    table = generate("1f1b", devices=2, microbatches=2)
    with pytest.raises(InvalidParameterError, match=r"sharding: prefetch must be an integer"):
        lower(table, sharding=(3, True, -1))
    with pytest.raises(InvalidParameterError, match=r"zero_stage 1 lowers no sharding node"):
        lower(table, sharding=(1, True, 0))


def test_cli_zero(cli, cli_error):
    import json
    code, out, _ = cli("eval", "1f1b", "-p", "4", "-m", "8", "--model", "paper-128l",
                       "--system", "mid_nw_mid_cp", "-d", "4", "--zero", "3", "--prefetch",
                       "2", "--json")
    assert code == 0
    echoed = json.loads(out)["execution"]
    assert (echoed["zero_stage"], echoed["prefetch"]) == (3, 2)
    base = ("eval", "1f1b", "-p", "4", "-m", "8", "--model", "paper-128l", "--system",
            "mid_nw_mid_cp")
    assert cli_error(*base, "-d", "4", "--zero", "3", "--prefetch", "-1") == \
        "--prefetch must be an integer >= 0, not -1"
    assert cli_error(*base, "--zero", "3").startswith(
        "--zero 3 with data_parallel 1 shards nothing")
    assert cli_error(*base, "-d", "2", "--zero", "2", "--prefetch", "1") == (
        "--prefetch applies to --zero 3 only (FSDP's parameter all-gathers), not to ZeRO "
        "stage 2")
    assert cli_error(*base, "-d", "2", "--zero", "2", "--optimizer-sharding") == \
        "--optimizer-sharding is --zero 1; it contradicts --zero 2"
    assert "replicas inside the pipeline" in cli_error(
        "eval", "chimera", "-p", "4", "-m", "8", "--model", "paper-128l", "--system",
        "mid_nw_mid_cp", "-d", "2", "--zero", "3")


# ------------------------------------------------------- PyTorch's compute_comms files
@pytest.mark.parametrize("family,devices,microbatches", [("1f1b", 2, 4), ("1f1b", 4, 8),
                                                         ("gpipe", 4, 4)])
def test_compute_comms_round_trip_prices_the_files_windows(family, devices, microbatches):
    from tabsched.formats.pytorch_comms import to_compute_comms
    from tabsched.formats.pytorch_csv import from_pytorch_csv
    table = generate(family, devices=devices, microbatches=microbatches)
    text = to_compute_comms(table, drop_metadata=True)
    schedule = from_pytorch_csv(text)
    run = Execution(data_parallel=4, zero_stage=3, reshard_after_forward=False)
    costs = ModelCosts(**small, execution=run)
    from_file = schedule.evaluate(costs)
    lowered = from_file._lowered
    # one UNSHARD node per UNSHARD cell, on its device, for its stage
    cells = sorted((device, int(token[:-len("UNSHARD")]))
                   for device, row in enumerate(text.splitlines())
                   for token in row.split(",") if token.endswith("UNSHARD"))
    assert sorted(zip(lowered.sharding.unshard_device.tolist(),
                      lowered.sharding.unshard_stage.tolist())) == cells
    # one stage per device held from its first use to its last: the file's windows are
    # tabsched's own, so the iteration is the same to the bit
    own = evaluate(schedule.table, costs, transfer_after=schedule.transfer_after)
    assert from_file.makespan == own.makespan
    # without sharded parameters the windows cost nothing: as if they were not there
    zero1 = ModelCosts(**small, execution=Execution(data_parallel=4, zero_stage=1))
    assert schedule.evaluate(zero1).makespan == evaluate(
        schedule.table, zero1, transfer_after=schedule.transfer_after).makespan


def test_the_files_windows_place_the_all_gathers():
    """A file that gathers stage 0 twice (freed after the forwards) pays two all-gathers,
    the second issued after 0F1, where the file puts it."""
    from tabsched.formats.pytorch_csv import from_pytorch_csv
    schedule = from_pytorch_csv("0UNSHARD,0F0,0F1,0RESHARD,0UNSHARD,0B0,0B1,0RESHARD\r\n")
    stage, issue, first, last = (column.tolist() for column in schedule.shard_windows)
    assert (stage, issue, first, last) == ([0, 0], [-1, 1], [0, 2], [1, 3])
    costs = ModelCosts(**small, execution=Execution(data_parallel=2, zero_stage=3))
    result = schedule.evaluate(costs)
    lowered, start, durations = result._lowered, result._node_start, result._node_durations
    unshard = ids(lowered, UNSHARD)
    assert len(unshard) == 2
    assert start[unshard[1]] == start[1] + durations[1]          # after 0F1 ends
    assert start[2] == start[unshard[1]] + durations[unshard[1]]  # 0B0 waits for it


@pytest.mark.parametrize("text,message", [
    ("0F0,0UNSHARD,0B0,0RESHARD\r\n",
     r"<csv>: device 0, slot 0: 0F0 runs while stage 0's parameters are not gathered"),
    ("0UNSHARD,0F0,0UNSHARD,0B0\r\n", r"<csv>: device 0, slot 2: 0UNSHARD: stage 0 is "
                                      r"gathered already \(UNSHARD at slot 0"),
    ("0F0,0B0,0RESHARD\r\n", r"<csv>: device 0, slot 2: 0RESHARD: stage 0 is not gathered"),
])
def test_bad_fsdp_cells_are_one_line_naming_the_cell(text, message):
    from tabsched import InvalidScheduleError
    from tabsched.formats.pytorch_csv import from_pytorch_csv
    with pytest.raises(InvalidScheduleError, match=message):
        from_pytorch_csv(text)


@pytest.mark.parametrize("zero,reshard", [(2, None), (3, True), (3, False)])
def test_exports_name_the_sharding(zero, reshard):
    from tabsched.megatron import execution_arguments
    from tabsched.torchtitan import torchtitan_settings
    run = Execution(data_parallel=4, zero_stage=zero, reshard_after_forward=reshard,
                    microbatch_size=1, global_batch=32)
    flags = dict(execution_arguments(run))
    assert "--use-megatron-fsdp" in flags and "--use-distributed-optimizer" in flags
    assert flags["--data-parallel-sharding-strategy"] == (
        "optim_grads_params" if zero == 3 else "optim_grads")
    settings_ = torchtitan_settings(generate("1f1b", devices=4, microbatches=8), run, 2048)
    parallelism = settings_.sections["parallelism"]
    if zero == 3:
        assert parallelism["data_parallel_shard_degree"] == 4
        assert parallelism["data_parallel_replicate_degree"] == 1
        assert parallelism["fsdp_reshard_after_forward"] == ("always" if reshard else "never")
    else:
        assert parallelism["data_parallel_shard_degree"] == 1
        assert any("ZeRO-2 has no torchtitan setting" in note for note in settings_.notes)


def test_compare_and_sweep_take_zero(cli):
    base = ("-p", "4", "-m", "8", "--model", "paper-128l", "--system", "mid_nw_mid_cp", "-d",
            "4", "--zero", "3")
    code, out, err = cli("compare", "chimera", "1f1b", "gpipe", *base)
    assert code == 0 and "skipped chimera: zero_stage 3: stage 0 runs on devices" in out + err
    code, out, _ = cli("sweep", "1f1b", *base)
    assert code == 0 and out.count("\n") == 2
    assert ModelCosts("paper-128l", "mid_nw_mid_cp", data_parallel=2, zero_stage=3,
                      prefetch=2).execution.sharding == (3, True, 2)


def test_monte_carlo_runs_the_files_windows():
    from tabsched.adapt import monte_carlo
    from tabsched.formats.pytorch_csv import from_pytorch_csv
    schedule = from_pytorch_csv("0UNSHARD,0F0,0F1,0RESHARD,0UNSHARD,0B0,0B1,0RESHARD\r\n")
    costs = ModelCosts(**small, execution=Execution(data_parallel=2, zero_stage=3))
    runs = monte_carlo(schedule.table, costs, samples=3, transfer_after=schedule.transfer_after,
                       shard_windows=schedule.shard_windows)
    assert runs.nominal_makespan == schedule.evaluate(costs).makespan
    own = monte_carlo(schedule.table, costs, samples=3)
    assert own.nominal_makespan == evaluate(schedule.table, costs).makespan


@given(seed=st.integers(0, 2**32 - 1), reshard=st.booleans(), prefetch=st.integers(0, 3))
def test_a_deeper_prefetch_never_slows_the_iteration(seed, reshard, prefetch):
    """Without contention the iteration is a longest path; prefetching one operation more
    only moves each all-gather's issue edge earlier in its row."""
    table = random_table(seed, replicate=0.0)
    spans = []
    for depth in (prefetch, prefetch + 1):
        lowered = lower(table, sharding=(3, reshard, depth), optimizer=True)
        durations = random_durations(lowered, seed, samples=1)[0]
        durations[lowered.nodes(RESHARD)] = 0.0
        spans.append(float(lowered.run(durations)[1][0].max()))
        assert lowered.count(UNSHARD) == lower(table, sharding=(3, reshard, 0)).count(UNSHARD)
    assert spans[1] <= spans[0]
