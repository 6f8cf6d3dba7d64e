"""The plan's space: splits, layer splits, layouts, and what the sizes refuse."""

import itertools

import numpy as np
import pytest

from tabsched import UnitCosts, generate
from tabsched.costs import load_model, load_system
from tabsched.exceptions import InvalidParameterError
from tabsched.execution import Execution
from tabsched.plan.space import (Layout, Refusals, divisors, family_accepts, family_variants,
                                 layer_splits, layout_of, probe_microbatches, splits,
                                 stage_count)
from tabsched.schedules import families, get_family
from tabsched.table import BACKWARD, FORWARD, INPUT_GRAD


def test_divisors():
    assert divisors(1) == [1]
    assert divisors(36) == [1, 2, 3, 4, 6, 9, 12, 18, 36]
    assert divisors(97) == [1, 97]


@pytest.mark.parametrize("layers,stages,uneven", list(itertools.product(
    (5, 24, 30, 32, 96, 105), (1, 2, 3, 4, 7, 8, 16, 35), (0, 1, 3))))
def test_layer_splits_are_megatron_shaped(layers, stages, uneven):
    found = layer_splits(layers, stages, uneven)
    assert (None in found) == (stages <= layers and layers % stages == 0)
    for split in found:
        if split is None:
            continue
        middle = set(split[1:-1])
        assert len(split) == stages and sum(split) == layers and len(middle) == 1
        (m,) = middle
        assert all(max(1, m - uneven) <= edge <= m for edge in (split[0], split[-1]))
        assert split[0] < m or split[-1] < m
    assert len(set(found)) == len(found)
    if uneven == 0 or stages < 3:
        assert found in ([], [None])


def test_splits_refuse_with_reasons_and_keep_the_closest():
    model, system = load_model("gpt3-175b"), load_system("dgx-a100")
    valid, refusals = splits(model, system, 64, 64)
    assert all(split.tensor * split.pipeline * split.data == 64 for split in valid)
    assert {split.tensor for split in valid} == {1, 2, 4, 8}
    assert refusals.counts == {"tensor group larger than a node": 2,       # 16, 32
                               "tensor degree does not divide the model": 1}  # 64: heads 96
    _, only = splits(model, system, 64, 64, tensor=[16])
    assert only.closest_description == ("t=16: a tensor group larger than a 8-GPU node of "
                                        "dgx-a100 (--cross-node-tensor considers it)")
    across, refusals = splits(model, system, 64, 64, cross_node=True)
    assert {split.tensor for split in across} == {1, 2, 4, 8, 16, 32}
    assert set(across) > set(valid)
    assert refusals.counts == {"tensor degree does not divide the model": 1}
    _, refusals = splits(model, system, 96, 96, tensor=[12], cross_node=True)
    assert refusals.counts == {"tensor group straddles nodes": 1}
    valid, refusals = splits(model, system, 64, 64, tensor=[3, 5])
    assert valid == []
    assert refusals.counts == {"tensor degree does not divide the GPUs": 2}
    valid, refusals = splits(model, system, 7, 1536)
    assert refusals.counts["tensor degree does not divide the model"] == 1
    assert "global batch 1536 does not split over 7 replicas" in refusals.closest_description
    assert [str(split) for split in valid] == ["t=1 p=7 d=1"]


def test_refusals_keep_the_deepest_then_the_nearest():
    refusals = Refusals()
    refusals.record("a", 1, 5, "shallow")
    refusals.record("b", 2, 9, "deep, far")
    refusals.record("b", 2, 3, "deep, near")
    assert refusals.counts == {"a": 1, "b": 2} and refusals.total == 3
    assert refusals.closest_description == "deep, near"


def test_family_variants():
    assert family_variants(get_family("looped-bfs"), 3) == [(("chunks", 1),), (("chunks", 2),),
                                                            (("chunks", 3),)]
    assert family_variants(get_family("hanayo"), 5) == [(("waves", 1),), (("waves", 2),)]
    assert family_variants(get_family("1f1b"), 4) == [()]
    assert family_variants(get_family("zb-auto"), 4) == [()]
    assert family_variants(get_family("chimera"), 4, (("variant", "doubling"),)) == [
        (("variant", "doubling"),)]
    with pytest.raises(InvalidParameterError, match="variant must be one of"):
        family_variants(get_family("chimera"), 4, (("variant", "sideways"),))


def _sizes(family, params, devices):
    probe = probe_microbatches(family.name, params, devices)
    return [m for m in range(1, 5 * devices + 1)
            if family_accepts(family.name, params, devices, m) is None][:6], probe


@pytest.mark.parametrize("family", [family for family in families() if not family.cost_driven],
                         ids=lambda family: family.name)
def test_layouts_place_and_share_microbatches_as_the_tables_do(family):
    """Every table the family builds places each stage where the probe says, and each
    device runs per microbatch the share of each stage's operations the probe says (the
    replicated families included: their replicas split every microbatch count alike)."""
    for devices in (2, 4, 6):
        for params in family_variants(family, 3):
            stages = stage_count(family.name, params, devices)
            if stages is None:
                continue
            layout = Layout(family.name, params, devices, stages)
            holds, work = layout_of(layout)
            sizes, probe = _sizes(family, params, devices)
            assert probe == min(sizes)
            for microbatches in sizes:
                table = generate(family.name, devices=devices, microbatches=microbatches,
                                 **dict(params))
                assert table.num_stages == stages
                counts = np.zeros((4, devices, stages))
                np.add.at(counts, (table.kind, table.device, table.stage), 1.0)
                assert np.array_equal(counts[FORWARD] > 0, holds)
                assert np.allclose(counts[FORWARD], work[FORWARD] * microbatches)
                assert np.allclose(counts[BACKWARD] + counts[INPUT_GRAD],
                                   (work[BACKWARD] + work[INPUT_GRAD]) * microbatches)


@pytest.mark.parametrize("family,sibling", [("zb-auto", "zb-h1"), ("zbv-auto", "zbv")])
def test_cost_driven_families_are_placed_as_their_siblings(family, sibling):
    costs = UnitCosts(f=1, b=2, i=1.2, w=0.8)
    for devices, microbatches in ((2, 4), (4, 8), (4, 3)):
        built = generate(family, devices=devices, microbatches=microbatches, costs=costs)
        fixed = generate(sibling, devices=devices, microbatches=microbatches)
        assert built.placement() == fixed.placement()
        assert set(built.kind.tolist()) <= set(fixed.kind.tolist())
        assert stage_count(family, (), devices) == fixed.num_stages


def test_family_accepts_says_why_not():
    assert family_accepts("1f1b", (), 4, 3) is None
    assert "microbatches must be >= devices" in family_accepts(
        "interleaved-1f1b", (("chunks", 2),), 4, 3)
    assert "at least 2 x devices" in family_accepts("dualpipev", (), 4, 7)


def test_a_configuration_describes_itself_and_orders_ties():
    from tabsched.plan.space import Configuration
    layout = Layout("interleaved-1f1b", (("chunks", 3),), 8, 24, None)
    run = Execution(tensor_parallel=8, sequence_parallel=True, data_parallel=2,
                    microbatch_size=1, global_batch=64, recompute="selective", zero_stage=1)
    configuration = Configuration(layout, 32, run)
    assert configuration.describe() == ("interleaved-1f1b:chunks=3 t=8 p=8 d=2 b=1 m=32 "
                                        "recompute=selective sp zero1")
    assert str(configuration.split) == "t=8 p=8 d=2"
    other = Configuration(layout, 32, run.replace(recompute="full"))
    assert configuration.sort_key() < other.sort_key()
    assert layout.generate_params(32) == {"chunks": 3, "devices": 8, "microbatches": 32}
