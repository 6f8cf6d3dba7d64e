"""ModelCosts: roofline durations, Hockney transfers, bytes of memory, the tail, errors."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tabsched import (InvalidParameterError, ModelCosts, ScheduleTable, System,
                      TransformerModel, evaluate, generate)
from tabsched._testing import random_table
from tabsched.lower import lower
from tabsched.nodes import OPTIMIZER, SYNC
from tabsched.table import FORWARD

GRID = [f"{network}_nw_{compute}_cp" for network in ("slow", "mid", "fast")
        for compute in ("slow", "mid", "fast")]


def small_model(**changes):
    """h=64, a=4, s=16, V=100, bf16, 4 layers, 2 samples per microbatch (T = 32 tokens)."""
    fields = dict(layers=4, hidden=64, heads=4, sequence=16, vocab=100, microbatch_size=2)
    return TransformerModel(**{**fields, **changes})


def small_system(**changes):
    """1 TFLOP/s, 100 GB/s memory, 1 us launch; 2 devices per node."""
    fields = dict(peak_flops=1e12, memory_bandwidth=1e11, launch_latency=1e-6,
                  devices_per_node=2, intra_node_bandwidth=1e9, intra_node_latency=1e-6,
                  inter_node_bandwidth=1e8, inter_node_latency=1e-5)
    return System(**{**fields, **changes})


# Hand numbers for one layer of small_model at b=2 (see tests/test_transformer.py and
# tests/test_kernels.py):
LAYER_F_FLOPS = 3_276_800          # 24*T*h^2 + 4*T*s*h
LAYER_F_BYTES = 284_672            # weights 98,304 + 93,184 per sample, every kernel's r+w
LAYER_ACTIVATION = 79_872          # s*b*h*(34 + 5*a*s/h)
HEAD_FLOPS = 2 * 32 * 64 * 100
HEAD_ACTIVATION = 4 * 16 * 2 * 64 * (1 + 100 / 64)  # norm and output inputs, fp32 logits
LAYER_PARAMETERS = 49_152
# one layer's backward working memory: the residual stream's gradient in and out
# (2*d*T*h) and the MLP's intermediate gradients (d*T*2f > score gradients 2*d*a*s*s*b)
LAYER_TRANSIENT = 2 * 2 * 32 * 64 + 2 * 32 * 2 * 256


def kernel_seconds(costs, part, phases, samples):
    """A loop over kernels: the roofline of each (flat efficiencies), plus the launch."""
    system, total = costs.system, 0.0
    lists = costs.model.kernels(part, costs.parallel)
    for phase in phases:
        for kernel in lists[phase]:
            if kernel.cls == "collective":
                continue        # t = 1: a collective of one rank costs nothing
            flops, read, written, _ = kernel.at(samples)
            compute = flops / system.peak_flops if kernel.cls == "matrix" else 0.0
            total += max(compute, (read + written) / system.memory_bandwidth)
            total += system.launch_latency
    return total


PHASES = {0: "F", 1: "RIW", 2: "RI", 3: "W"}


def test_forward_durations_by_hand():
    table = generate("1f1b", devices=2, microbatches=2)
    costs = ModelCosts(small_model(), small_system())
    flops, nbytes = costs.op_work(table)
    durations = costs.op_durations(table)
    first = table.op(0)
    assert str(first) == "0F0"
    assert flops[0] == 2 * LAYER_F_FLOPS
    embedding = 2 * 32 * 64 / 1 + 2 * 32 * 64 + (2 * 2 * 32 * 64 + 32 * 64)   # lookup, dropout
    assert nbytes[0] == 2 * LAYER_F_BYTES + embedding
    expected = 2 * kernel_seconds(costs, "layer", "F", 2) + kernel_seconds(costs, "embedding",
                                                                           "F", 2)
    assert durations[0] == pytest.approx(expected, rel=1e-12)
    # the per-kernel roofline is slower than one roofline over the whole operation
    assert durations[0] > max(flops[0] / 1e12, nbytes[0] / 1e11) + 1e-6
    last = int(np.flatnonzero((table.stage == 1) & (table.kind == FORWARD))[0])
    assert flops[last] == 2 * LAYER_F_FLOPS + HEAD_FLOPS


def test_vectorised_work_matches_a_loop_over_operations():
    model = small_model(recompute="selective")
    table = random_table(7, max_stages=4, max_microbatches=6, uneven=1.0)
    table = table.replace(stage_layers=None)
    costs = ModelCosts(model.replace(layers=12), small_system())
    flops, nbytes = costs.op_work(table)
    durations = costs.op_durations(table)
    layers = 12 // table.num_stages
    for k in range(len(table)):
        kind, stage = int(table.kind[k]), int(table.stage[k])
        samples = table.microbatch_sizes[int(table.microbatch[k])] * 2
        parts = [(layers, "layer", costs.model.layer_work(samples))]
        if stage == 0:
            parts.append((1, "embedding", costs.model.embedding_work(samples)))
        if stage == table.num_stages - 1:
            parts.append((1, "output", costs.model.output_work(samples)))
        expected_flops = sum(n * work[0][kind, 0] for n, _, work in parts)
        expected_bytes = sum(n * work[1][kind, 0] for n, _, work in parts)
        assert flops[k] == pytest.approx(expected_flops)
        assert nbytes[k] == pytest.approx(expected_bytes)
        expected = sum(n * kernel_seconds(costs, part, PHASES[kind], samples)
                       for n, part, _ in parts)
        assert durations[k] == pytest.approx(expected)


def test_half_a_microbatch_costs_what_the_roofline_says():
    table = ScheduleTable([["0F0", "0F1", "0B0", "0B1"]], microbatch_sizes=[1.0, 0.5])
    for system in (small_system(memory_bandwidth=1e8),              # memory-bound
                   small_system(half_efficiency_tokens=32)):        # small products slower
        costs = ModelCosts(small_model(), system)
        flops, nbytes = costs.op_work(table)
        durations = costs.op_durations(table)
        full, half = durations[0], durations[1]
        assert flops[1] == flops[0] / 2
        assert half > full / 2
    costs = ModelCosts(small_model(), small_system(memory_bandwidth=1e8))
    expected = (4 * kernel_seconds(costs, "layer", "F", 1)
                + kernel_seconds(costs, "embedding", "F", 1) + kernel_seconds(costs, "output",
                                                                             "F", 1))
    assert costs.op_durations(table)[1] == pytest.approx(expected)


def test_split_backward_costs_the_same_kernels_and_pays_what_b_hides():
    whole = ScheduleTable([["0F0", "0B0"]])
    split = ScheduleTable([["0F0", "0I0", "0W0"]])
    costs = ModelCosts(small_model(), small_system())
    flops_whole, _ = costs.op_work(whole)
    flops_split, _ = costs.op_work(split)
    assert flops_whole[1] == flops_split[1] + flops_split[2]
    # one kernel list either way: a launch per kernel, the same sum
    assert costs.op_durations(split)[1:].sum() == pytest.approx(costs.op_durations(whole)[1])
    # with tensor parallelism, B runs the data-gradient all-reduce beside the weight
    # gradient (Megatron-LM's asynchronous all-reduce); a split I cannot
    tp = ModelCosts(small_model(hidden=4096, heads=32, sequence=512), "dgx-a100",
                    tensor_parallel=8)
    split_time = tp.op_durations(split)[1:].sum()
    whole_time = tp.op_durations(whole)[1]
    hidden = 0.0
    for part, count in (("layer", 4), ("output", 1)):     # one stage: 4 layers and the head
        rows = tp.kernel_report(part, 2)
        seconds = {(row["phase"], row["name"]): row["seconds"] for row in rows}
        for row in rows:
            if row["beside"] and row["phase"] == "I":
                partner = seconds.get(("W", row["beside"]), 0.0)
                hidden += count * min(row["seconds"], partner)
    assert hidden > 0
    assert split_time - whole_time == pytest.approx(hidden, rel=1e-9)


def test_transfers_are_hockney_on_the_link_their_placement_gives():
    table = generate("1f1b", devices=4, microbatches=3).replace(microbatch_sizes=[1.0, 0.5, 1.0])
    costs = ModelCosts(small_model(), small_system())
    transfers = lower(table).transfers
    durations, nbytes = costs.transfer_costs(table, transfers)
    samples = np.array([2.0, 1.0, 2.0])[transfers.microbatch]
    np.testing.assert_array_equal(nbytes, 2 * samples * 16 * 64)       # d * b * s * h
    crossing = transfers.src // 2 != transfers.dst // 2
    expected = np.where(crossing, 1e-5 + nbytes / 1e8, 1e-6 + nbytes / 1e9)
    np.testing.assert_allclose(durations, expected, rtol=1e-15)
    assert crossing.any() and (~crossing).any()


def test_a_slow_link_slows_exactly_the_transfers_on_that_link():
    table = generate("1f1b", devices=4, microbatches=8)
    base = ModelCosts(small_model(), small_system())
    slow = ModelCosts(small_model(), small_system(
        link_overrides=[{"devices": [1, 2], "bandwidth": "10MB/s", "latency": "50us"}]))
    transfers = lower(table).transfers
    before, nbytes = base.transfer_costs(table, transfers)
    after, _ = slow.transfer_costs(table, transfers)
    on_link = ((transfers.src == 1) & (transfers.dst == 2)) | ((transfers.src == 2)
                                                              & (transfers.dst == 1))
    assert np.all(after[on_link] == pytest.approx(5e-5 + nbytes[on_link] / 1e7))
    np.testing.assert_array_equal(after[~on_link], before[~on_link])
    fast_result, slow_result = evaluate(table, base), evaluate(table, slow)
    assert slow_result.makespan > fast_result.makespan
    busy = {(link.src, link.dst): link.busy for link in slow_result.links}
    base_busy = {(link.src, link.dst): link.busy for link in fast_result.links}
    assert busy[1, 2] == pytest.approx(8 * (5e-5 + 2 * 2 * 16 * 64 / 1e7))
    assert {key: value for key, value in busy.items() if key not in ((1, 2), (2, 1))} == \
        {key: value for key, value in base_busy.items() if key not in ((1, 2), (2, 1))}


def test_memory_in_bytes():
    table = generate("1f1b", devices=2, microbatches=2)
    costs = ModelCosts(small_model(bytes_per_param=10), small_system())
    result = evaluate(table, costs)
    first_stage = 2 * LAYER_ACTIVATION + 32 * 64             # + embedding dropout mask
    last_stage = 2 * LAYER_ACTIVATION + HEAD_ACTIVATION
    assert result.memory_unit == "bytes" and result.time_unit == "s"
    # the peak: both microbatches' activations while the first backward runs
    assert result.devices[0].peak_memory == 2 * first_stage + LAYER_TRANSIENT
    assert result.devices[1].peak_memory == last_stage + LAYER_TRANSIENT
    assert result.devices[0].persistent_memory == (2 * LAYER_PARAMETERS + 6400) * 10
    assert result.devices[1].persistent_memory == (2 * LAYER_PARAMETERS + 6400) * 10
    assert costs.memory_unit == "bytes" and costs.level == "simulation"


def test_input_grad_releases_what_weight_grad_does_not_need():
    table = ScheduleTable([["0F0", "0I0", "0W0"]])
    costs = ModelCosts(small_model(), small_system())
    times, values = evaluate(table, costs).memory_timeline(0)
    held = 4 * LAYER_ACTIVATION + 32 * 64 + HEAD_ACTIVATION
    release = 1 - 32 / 39
    assert costs.input_grad_release == pytest.approx(release)
    # F takes the activation; I its working memory while it runs, then frees its part
    np.testing.assert_allclose(values, [held, held + LAYER_TRANSIENT, held * (1 - release),
                                        0.0], atol=1e-6)


def chimera_like():
    """Stage 0 and 1 each on both devices (microbatch 1 runs the other way round)."""
    return ScheduleTable([["0F0", "1F1", "1B1", "0B0"], ["0F1", "1F0", "1B0", "0B1"]])


def test_replicated_stages_hold_their_parameters_on_every_device_and_sync():
    table = chimera_like()
    system = small_system()
    costs = ModelCosts(small_model(), system, grad_sync="replicas", optimizer=True)
    stage = (2 * LAYER_PARAMETERS + 6400)
    assert costs.persistent_memory(table).tolist() == [2 * stage * 16.0] * 2
    result = evaluate(table, costs)
    lowered = result._lowered
    assert lowered.sync_stage.tolist() == [0, 1]
    sync, optimizer = (costs.node_prices(lowered, kind) for kind in (SYNC, OPTIMIZER))
    expected_sync = 2 * 1 * (1e-6 + (stage * 2 / 2) / 1e9)    # ring of 2, intra-node
    np.testing.assert_allclose(sync, [expected_sync] * 2)
    # the optimizer step: the gradient buffer divided by d (read and write 2 bytes), then
    # 54 bytes per parameter, each at the memory roofline plus a launch
    np.testing.assert_allclose(optimizer, [(4 + 54) * 2 * stage / 1e11 + 2e-6] * 2)
    plain = evaluate(table, ModelCosts(small_model(), system))
    assert result.makespan == pytest.approx(plain.makespan + expected_sync + optimizer[0])


def test_stage_layers_come_from_the_table():
    table = generate("1f1b", devices=2, microbatches=1).replace(stage_layers=(1, 3))
    costs = ModelCosts(small_model(), small_system())
    flops, _ = costs.op_work(table)
    forward = {int(table.stage[k]): flops[k] for k in range(len(table)) if table.kind[k] == 0}
    assert forward[0] == LAYER_F_FLOPS
    assert forward[1] == 3 * LAYER_F_FLOPS + HEAD_FLOPS


@pytest.mark.parametrize("make,message", [
    (lambda: (generate("1f1b", devices=3, microbatches=2), {}),
     r"model custom has 4 layers, which do not split evenly over the table's 3 stages "
     r"\(give the table stage_layers\)"),
    (lambda: (generate("1f1b", devices=2, microbatches=2).replace(stage_layers=(1, 1)), {}),
     r"the table's stage_layers sum to 2 but model custom has 4 layers"),
    (lambda: (generate("1f1b", devices=2, microbatches=2).replace(microbatch_sizes=(1, .25)), {}),
     r"microbatch 1 has relative size 0\.25: 0\.5 samples of a 2-sample microbatch, but "
     r"samples must be whole"),
    (lambda: (generate("1f1b", devices=2, microbatches=2),
              {"microbatch_size": 2**24, "sequence": 2**20}),   # both within sane ranges
     r"microbatch_size 16777216 makes the activations of one iteration .* bytes, "
     r"which overflows int64"),
])
def test_shape_errors_name_the_value(make, message):
    table, changes = make()
    costs = ModelCosts(small_model(**changes), small_system())
    with pytest.raises(InvalidParameterError, match=message):
        evaluate(table, costs)


def test_constructor_errors():
    with pytest.raises(InvalidParameterError, match=r"contention 'bus' is not one of"):
        ModelCosts(small_model(), small_system(), contention="bus")
    with pytest.raises(InvalidParameterError, match=r"recompute 'some' is not one of"):
        ModelCosts(small_model(), small_system(), recompute="some")
    with pytest.raises(InvalidParameterError, match=r"overlap must be finite and >= 0"):
        ModelCosts(small_model(), small_system(), overlap=-1)


seeds = st.integers(0, 2**32 - 1)


@given(seed=seeds)
def test_contention_none_link_nic_are_ordered(seed):
    """nic only adds port constraints to link's static per-link FIFO order, which only
    adds constraints to none: each mode's times solve the previous mode's constraints."""
    table = random_table(seed, max_devices=5)
    costs = ModelCosts(small_model(layers=60), small_system(launch_latency=0))
    makespans = [evaluate(table, costs, contention=mode, formula=False).makespan
                 for mode in ("none", "link", "nic")]
    assert makespans[0] <= makespans[1] * (1 + 1e-12)
    assert makespans[1] <= makespans[2] * (1 + 1e-12)


# The grid systems where a stage-to-stage transfer is under 1% of a stage's F+B for
# paper-128l at P=8 (0.7% on mid_nw_mid_cp) and where it is not (7%, 7% and 70%).
COMMUNICATION_LIGHT = ["slow_nw_slow_cp", "mid_nw_slow_cp", "mid_nw_mid_cp", "fast_nw_slow_cp",
                       "fast_nw_mid_cp", "fast_nw_fast_cp"]
COMMUNICATION_HEAVY = ["slow_nw_mid_cp", "mid_nw_fast_cp", "slow_nw_fast_cp"]


@pytest.mark.parametrize("system", GRID)
def test_gpipe_and_1f1b_on_paper_128l(system):
    """The paper's finding: GPipe and 1F1B take the same time and 1F1B needs less activation
    memory. tabsched reproduces the time only where transfers are cheap next to compute:
    1F1B alternates F and B in its steady state, so each device waits for the gradient of
    the microbatch it just sent forward -- a round trip of transfers on a dependency loop
    that GPipe's fill-then-drain order does not have. Where a transfer is several percent
    of a stage's F+B, 1F1B is that much slower (asserted, so a change in the execution
    model shows here)."""
    costs = ModelCosts("paper-128l", system)
    gpipe = evaluate(generate("gpipe", devices=8, microbatches=32), costs, formula=False)
    one = evaluate(generate("1f1b", devices=8, microbatches=32), costs, formula=False)
    assert one.peak_memory < gpipe.peak_memory
    assert [d.peak_memory for d in one.devices] < [d.peak_memory for d in gpipe.devices]
    if system in COMMUNICATION_LIGHT:
        assert one.makespan == pytest.approx(gpipe.makespan, rel=0.01)
    else:
        assert one.makespan > gpipe.makespan * 1.01


STACK_CASES = [
    # family, devices, microbatches, ModelCosts keywords, lowering keywords
    ("1f1b", 4, 8, {}, {}),
    ("chimera", 4, 8, {"grad_sync": "replicas", "optimizer": True}, {"grad_sync": "replicas",
                                                                     "optimizer": True}),
    ("zbv", 4, 8, {"tensor_parallel": 2, "contention": "link"}, {"contention": "link"}),
    ("dualpipe", 4, 8, {"overlap": 0.75, "tensor_parallel": 2, "sequence_parallel": True},
     {}),
    ("interleaved-1f1b", 4, 8, {"data_parallel": 2, "optimizer_sharding": True},
     {"optimizer": True}),
]


@pytest.mark.parametrize("family, devices, microbatches, options, lowering", STACK_CASES)
def test_stacked_node_durations_are_each_models_own_to_the_bit(family, devices, microbatches,
                                                               options, lowering):
    """One model on several systems (a shared memory key), and other models beside it
    in the same stack: every row is that cost model's ``node_durations``."""
    from tabsched.lower import lower
    table = generate(family, devices=devices, microbatches=microbatches)
    if family == "1f1b":        # microbatches of two sizes: transfers priced per size
        table = table.replace(microbatch_sizes=[0.5, 1.0] * (microbatches // 2))
    costs = [ModelCosts("paper-128l", system, microbatch_size=2, **options)
             for system in ("slow_nw_slow_cp", "mid_nw_fast_cp", "fast_nw_mid_cp", "dgx-h100")]
    costs.insert(2, ModelCosts("llama3-8b", "mid_nw_mid_cp", microbatch_size=2, **options))
    lowered = lower(table, **lowering)
    stacked = ModelCosts.stacked_node_durations(lowered, costs)
    assert stacked.shape == (len(costs), lowered.num_nodes)
    for row, model_costs in zip(stacked, costs):
        assert np.array_equal(row, model_costs.node_durations(lowered))
    assert costs[0].memory_key() == costs[1].memory_key() != costs[2].memory_key()


def test_stacked_node_durations_leave_a_subclass_its_own():
    from tabsched.lower import lower

    class Doubled(ModelCosts):
        def op_durations(self, table):
            return 2 * super().op_durations(table)

    table = generate("1f1b", devices=4, microbatches=8)
    lowered = lower(table)
    costs = [Doubled("paper-128l", "mid_nw_mid_cp"), Doubled("paper-128l", "slow_nw_mid_cp")]
    stacked = ModelCosts.stacked_node_durations(lowered, costs)
    for row, model_costs in zip(stacked, costs):
        assert np.array_equal(row, model_costs.node_durations(lowered))


def test_remembered_link_matrices_parameters_and_syncs_match_their_sources():
    costs = ModelCosts("paper-128l", "mid_nw_mid_cp",
                       tensor_parallel=2)   # two pipeline ranks per node
    for devices in (2, 6, 2):
        for mine, fresh in zip(costs._link_matrices(devices),
                               costs.placement.link_matrices(devices)):
            assert np.array_equal(mine, fresh) and not mine.flags.writeable
    table = generate("chimera", devices=4, microbatches=8)
    params = costs.stage_parameters(table)
    params[0] = -1                      # the caller's copy, not the remembered array
    assert costs.stage_parameters(table)[0] > 0
    for devices in (4, 6, 8):          # the run's matrices serve every ring in it
        assert costs._all_reduce_time(4e9, [3, 0], devices) == \
            costs.placement.all_reduce_time(4e9, [0, 3])
    assert costs._all_reduce_time(4e9, (0, 3), 4) == costs._all_reduce_time(4e9, [3, 0], 4)
    from tabsched import _memo
    for size in range(5000):            # the answers are forgotten beyond 4096
        costs._all_reduce_time(float(size), [0, 1], 2)
    assert 0 < _memo.sizes()["tabsched.costs.model_work.ring_all_reduce"] <= 4096
    # answers belong to the system: another microbatch size shares them, another
    # system (equal but for one slow link) has its own
    other_size = ModelCosts("paper-128l", "mid_nw_mid_cp", tensor_parallel=2,
                            microbatch_size=4)
    assert other_size._all_reduce_time(4e9, [0, 3], 4) == costs._all_reduce_time(4e9, [0, 3], 4)
    slow = ModelCosts("paper-128l", costs.system.replace(
        link_overrides=[{"devices": [0, 3], "bandwidth": "1GB/s"}]), tensor_parallel=2)
    assert slow._all_reduce_time(4e9, [0, 3], 4) == slow.placement.all_reduce_time(4e9, [0, 3])
    assert slow._all_reduce_time(4e9, [0, 3], 4) > costs._all_reduce_time(4e9, [0, 3], 4)
    assert np.array_equal(slow._link_matrices(4)[0], slow.placement.link_matrices(4)[0])


def test_kernel_tables_are_shared_by_one_model_on_several_systems():
    """The kernel lists are the model's and the parallelism's, not the system's: cost
    models on several systems share them, other parallelisms get their own, and the
    durations are those of tables built afresh."""
    from tabsched.costs.model_work import kernel_tables as _kernel_tables
    table = generate("1f1b", devices=4, microbatches=8)
    first = ModelCosts("paper-128l", "mid_nw_mid_cp")
    second = ModelCosts("paper-128l", "fast_nw_slow_cp")
    other = ModelCosts("paper-128l", "mid_nw_mid_cp", tensor_parallel=2)
    assert first._tables is second._tables and other._tables is not first._tables
    durations = [c.op_durations(table) for c in (first, second, other)]
    _kernel_tables.cache_clear()
    fresh = [ModelCosts("paper-128l", s, **o).op_durations(table) for s, o in (
        ("mid_nw_mid_cp", {}), ("fast_nw_slow_cp", {}), ("mid_nw_mid_cp", {"tensor_parallel": 2}))]
    assert all(np.array_equal(a, b) for a, b in zip(durations, fresh))
    assert _kernel_tables.cache_info().maxsize is not None


@pytest.mark.parametrize("system, options", [
    ("mid_nw_mid_cp", {}), ("dgx-h100", {"tensor_parallel": 4, "recompute": "full"}),
    ("gb200-nvl72", {"tensor_parallel": 2, "sequence_parallel": True,
                     "recompute": "selective"}),
])
def test_all_kernels_timed_at_once_are_each_phase_timed_alone(system, options):
    """part_times times every kernel of the model in one pass and sums them by a plan
    made once per model; each phase's kernels timed on their own table and summed
    kind by kind (hidden collectives costing what they run beyond their partner)
    give the same seconds, to the bit. A hidden collective adds
    ``max(C - P, C s / (1 + s))`` beside its partner (``System.overlap_slowdown``)."""
    from tabsched.costs.model_work import KIND_PHASES as _KIND_PHASES
    from tabsched.costs.model_work import kernel_seconds as _kernel_seconds
    costs = ModelCosts("gpt3-175b", system, **options)
    samples = np.array([1.0, 3.0])
    together = costs.part_times(samples)
    for part, phases in costs._tables.items():
        seconds = {phase: _kernel_seconds(costs.model, costs.system, costs.placement,
                                          kernels, samples)[0]
                   for phase, kernels in phases.items() if len(kernels)}
        expected = np.zeros((4, len(samples)))
        for kind, kind_phases in _KIND_PHASES.items():
            present = [phase for phase in kind_phases if phase in seconds]
            if not present:
                continue
            names = [name for phase in present for name in phases[phase].names]
            hide = [hidden for phase in present for hidden in phases[phase].hides_behind]
            cost = np.concatenate([seconds[phase] for phase in present])
            where = {name: index for index, name in enumerate(names)}
            for index, partner in enumerate(hide):
                if partner is not None and partner in where:
                    slowed = costs.system.overlap_slowdown   # the system docstring's rule
                    cost[index] = np.maximum(cost[index] - cost[where[partner]],
                                             cost[index] * (slowed / (1.0 + slowed)))
            expected[kind] = cost.sum(axis=0)
        assert np.array_equal(together[part], expected), part


@pytest.mark.parametrize("count, space", [(0, 5), (1, 1), (50, 7), (1000, 300),
                                          (20, 100_000), (5000, 4_000_000)])
def test_present_keys_are_np_uniques_answer(count, space):
    """Both ways (a table of the key space, or a sort when the space is large)."""
    from tabsched.costs.model_work import present as _present
    keys = np.random.default_rng(count).integers(0, space, count)
    unique, inverse = _present(keys, space)
    expected, expected_inverse = np.unique(keys, return_inverse=True)
    assert np.array_equal(unique, expected) and np.array_equal(inverse, expected_inverse)


def test_cost_models_are_frozen_so_no_remembered_answer_goes_stale():
    """The stale-cache case of issue 20: a cost model evaluated on one system and then
    given another kept the first system's compute times. Assigning now raises."""
    import dataclasses
    from tabsched import StageCosts, UnitCosts, evaluate
    table = generate("1f1b", devices=8, microbatches=32)
    slow = ModelCosts("paper-128l", "slow_nw_slow_cp")
    first = evaluate(table, slow).makespan
    for costs, field in ((slow, "system"), (slow, "parallel"), (UnitCosts(), "lengths"),
                         (StageCosts(1.0), "comm")):
        with pytest.raises(dataclasses.FrozenInstanceError, match=f"field '{field}'"):
            setattr(costs, field, None)
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot delete field 'model'"):
        del slow.model
    fast = ModelCosts("paper-128l", "fast_nw_fast_cp")
    assert evaluate(table, fast).makespan < first
    assert evaluate(table, slow).makespan == first
    # another execution is another cost model, priced afresh
    wide = slow.with_execution(slow.execution.replace(contention="none"))
    assert wide is not slow and wide.contention == "none" and slow.contention == "link"
    assert slow.with_execution(slow.execution) is slow


def test_a_subclass_is_frozen_once_its_own_constructor_is_done():
    from tabsched import UnitCosts

    class Scaled(UnitCosts):
        def __init__(self, factor):
            super().__init__()
            self.factor = factor        # still building: allowed

    costs = Scaled(2.0)
    assert costs.factor == 2.0
    with pytest.raises(AttributeError, match="Scaled is frozen"):
        costs.factor = 3.0
