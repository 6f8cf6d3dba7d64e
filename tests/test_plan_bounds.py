"""The plan's bounds: never above what the simulation finds, on random configurations."""

import itertools

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from tabsched import Execution, ModelCosts, UnitCosts, evaluate, evaluate_summaries, generate
from tabsched.costs import load_system
from tabsched.costs.transformer import TransformerModel
from tabsched.exceptions import InvalidParameterError
from tabsched.formulas import FORMULAS
from tabsched.plan.bounds import (_UNIT_TIMES, FORMULA_PEAKS, WARMUP_FORWARDS, LayoutArrays,
                                  RunGroups, bound_costs, formula_counts, memory_bounds,
                                  step_seconds, time_bounds)
from tabsched.plan.space import (Layout, family_accepts, family_variants, layer_splits,
                                 stage_count)
from tabsched.schedules import families, get_family

SYSTEM = load_system("dgx-a100")
MODEL = TransformerModel(layers=24, hidden=1024, heads=16, sequence=1024, vocab=32000,
                         ffn=4096, name="small")
FAMILIES = [family.name for family in families()]


def _bounds(layout, run, microbatches):
    """``(time bound, memory bound per device bound's max, persistent)`` of a configuration."""
    groups = RunGroups([bound_costs(MODEL, SYSTEM, run)], [microbatches])
    costs = ModelCosts(MODEL, SYSTEM, run)
    arrays = LayoutArrays.of(layout, groups.cost_models[0])
    time = time_bounds(arrays, groups, step=step_seconds(layout, costs))[0]
    kind, count, warmup = formula_counts(layout.family, layout.params, layout.devices,
                                         microbatches)
    counts = (kind, None if kind is None else np.array([count]),
              None if warmup is None else np.array([warmup]))
    shards = run.data_parallel if run.zero_stage else 1
    persistent = (arrays.device_parameters() / run.tensor_parallel
                  * MODEL.optimizer_state_bytes(shards))
    memory = memory_bounds(arrays, groups, counts, persistent[None, :])[0, 0]
    return time, memory, persistent


@given(family=st.sampled_from(FAMILIES), devices=st.sampled_from([1, 2, 3, 4, 6, 8]),
       tensor=st.sampled_from([1, 2, 4, 16]), microbatches=st.sampled_from([1, 2, 3, 4, 6, 8, 12,
                                                                        16, 24]),
       size=st.sampled_from([1, 2]), recompute=st.sampled_from(["none", "selective", "full"]),
       parallel=st.booleans(), data=st.sampled_from([1, 2]), zero=st.booleans(),
       choice=st.integers(0, 20), split_choice=st.integers(0, 20))
def test_bounds_never_exceed_the_simulation(family, devices, tensor, microbatches, size,
                                            recompute, parallel, data, zero, choice,
                                            split_choice):
    """On random configurations of every family (uneven layer splits, ZeRO-1, split and
    fused backwards, replicated stages), the time bound is at most the simulated makespan
    and the memory bound at most the fullest device's simulated peak; the persistent
    bytes the bound adds are the cost model's."""
    variants = family_variants(get_family(family), 3)
    params = variants[choice % len(variants)]
    stages = stage_count(family, params, devices)
    assume(stages is not None)
    options = layer_splits(MODEL.layers, stages, 3)
    assume(options)
    assume(family_accepts(family, params, devices, microbatches) is None)
    layout = Layout(family, params, devices, stages, options[split_choice % len(options)])
    run = Execution(tensor_parallel=tensor, sequence_parallel=parallel and tensor > 1,
                    data_parallel=data, microbatch_size=size, recompute=recompute,
                    zero_stage=1 if zero and data > 1 else 0, optimizer_step=True)
    costs = ModelCosts(MODEL, SYSTEM, run)
    try:
        if get_family(family).cost_driven:
            table = generate(family, costs=costs, memory_budget=80e9,
                             **layout.generate_params(microbatches))
        else:
            table = generate(family, **layout.generate_params(microbatches))
    except InvalidParameterError:
        assume(False)
    summary = evaluate_summaries(table, [costs], formula=False)[0]
    time, memory, persistent = _bounds(layout, run, microbatches)
    assert time <= summary.makespan * (1 + 1e-9)
    assert memory <= max(summary.peak_memory) * (1 + 1e-9)
    assert np.allclose(persistent, costs.persistent_memory(table))


@pytest.mark.parametrize("family", sorted(FORMULA_PEAKS))
def test_formula_counts_are_at_most_the_table_level_peaks(family):
    """Where the bound uses the formula level's count, it is at most the table level's
    peak (an I frees nothing there) on each device ("device") or on the fullest one."""
    for devices, microbatches, params in itertools.product(
            range(1, 9), range(1, 33), family_variants(get_family(family), 3)):
        if family_accepts(family, params, devices, microbatches) is not None:
            continue
        kind, counts, _ = formula_counts(family, params, devices, microbatches)
        if kind is None:
            continue
        table = generate(family, devices=devices, microbatches=microbatches, **dict(params))
        peaks = [d.peak_memory for d in evaluate(table, UnitCosts(), formula=False).devices]
        if kind == "device":
            assert all(c <= q + 1e-9 for c, q in zip(counts, peaks)), (devices, microbatches)
        else:
            assert counts[0] <= max(peaks) + 1e-9, (devices, microbatches)


def test_the_formula_counts_the_bounds_leave_out_would_not_hold():
    """Why two families' counts are conditional: ZB-V's stated peak fails below
    M = 2p - 1, Hanayo's range with two waves."""
    def peaks(family, **params):
        table = generate(family, **params)
        return [d.peak_memory for d in evaluate(table, UnitCosts(), formula=False).devices]
    zbv = FORMULAS["zbv"]({"devices": 2, "microbatches": 2}, _UNIT_TIMES)["peak_activation"]
    assert zbv[0] > peaks("zbv", devices=2, microbatches=2)[0]
    assert formula_counts("zbv", (("chunks", 2),), 2, 2)[0] is None
    hanayo = FORMULAS["hanayo"]({"devices": 2, "microbatches": 2, "waves": 2}, _UNIT_TIMES)
    assert hanayo["peak_activation_bounds"][0] > min(peaks("hanayo", devices=2, microbatches=2,
                                                           waves=2))
    assert formula_counts("hanayo", (("waves", 2),), 2, 2)[0] is None


@pytest.mark.parametrize("family", sorted(WARMUP_FORWARDS))
def test_warmup_forwards_are_what_the_orders_run(family):
    """The forwards each device runs before its first backward, as the bound states them,
    are the table's, exactly."""
    for devices, microbatches, params in itertools.product(
            range(1, 9), range(1, 25), family_variants(get_family(family), 4)):
        if family_accepts(family, params, devices, microbatches) is not None:
            continue
        table = generate(family, devices=devices, microbatches=microbatches, **dict(params))
        ran = []
        for row in table.orders():
            kinds = [op.kind for op in row]
            ran.append(next((k for k, kind in enumerate(kinds) if kind != "F"), len(kinds)))
        expected = formula_counts(family, params, devices, microbatches)[2]
        assert list(expected) == ran, (devices, microbatches, params)


def test_the_time_bound_is_the_flush_pipeline_without_communication():
    """1F1B with equal stages, no embedding or output cost and a free network: the bound
    is the flush pipeline's makespan, (M + p - 1)(F + B), to the last digit's order."""
    from tabsched.plan.rows import free_network
    model = MODEL.replace(vocab=16)
    system = free_network(SYSTEM)
    run = Execution(microbatch_size=1, optimizer_step=False)
    layout = Layout("1f1b", (), 4, 4)
    groups = RunGroups([bound_costs(model, system, run)], [8])
    bound = time_bounds(LayoutArrays.of(layout, groups.cost_models[0]), groups)[0]
    makespan = evaluate(generate("1f1b", devices=4, microbatches=8),
                        ModelCosts(model, system, run)).makespan
    assert bound <= makespan and bound == pytest.approx(makespan, rel=0.02)


def test_the_bounds_cost_model_prices_operations_alike_at_every_data_degree():
    """bound_costs drops the data degree: the layers' collectives run over the tensor
    group, which sits on the same links at any data degree."""
    for tensor, data in ((1, 4), (2, 4), (8, 1), (8, 16), (4, 64), (16, 1), (16, 4)):
        run = Execution(tensor_parallel=tensor, data_parallel=data, microbatch_size=2,
                        recompute="selective")
        own = ModelCosts(MODEL, SYSTEM, run).part_times(np.array([2.0]))
        shared = bound_costs(MODEL, SYSTEM, run).part_times(np.array([2.0]))
        for part in own:
            assert np.array_equal(own[part], shared[part])
