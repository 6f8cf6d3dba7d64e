"""Uneven stages for every family: stage_layers, stage_layers_ratio, layers."""

import pytest

from tabsched import InvalidParameterError, generate
from tabsched.schedules import families
from tabsched.schedules._layers import resolve_stage_layers

SMALL = {"gpipe": {}, "1f1b": {}, "chimera": {}, "bitpipe": {}, "dualpipe": {"microbatches": 8},
         "dualpipev": {"microbatches": 8}, "hanayo": {"waves": 2}}


def small_table(name, **extra):
    params = {"devices": 4, "microbatches": 4, **SMALL.get(name, {}), **extra}
    return generate(name, **params)


def test_asymmetric_chimera_halves_the_first_half_stages():
    table = generate("chimera", devices=8, microbatches=16, stage_layers_ratio="1:2",
                     layers=96)
    assert table.stage_layers == (8, 8, 8, 8, 16, 16, 16, 16)
    # 128 layers (the tabular paper's model) do not split exactly: largest remainders
    table = generate("chimera", devices=8, microbatches=16, stage_layers_ratio="1:2",
                     layers=128)
    assert table.stage_layers == (11, 11, 11, 11, 21, 21, 21, 21)
    assert sum(table.stage_layers) == 128


@pytest.mark.parametrize("name", sorted(SMALL))
def test_ratio_works_for_every_family(name):
    table = small_table(name, stage_layers_ratio=[1, 2], layers=6 * 16)
    half = table.num_stages // 2
    assert len(table.stage_layers) == table.num_stages and sum(table.stage_layers) == 96
    assert all(2 * table.stage_layers[s] == table.stage_layers[s + half] for s in range(half))


def test_every_registered_family_accepts_the_layer_split():
    for family in families():
        if family.name in SMALL:
            table = small_table(family.name, layers=64)
            assert sum(table.stage_layers) == 64 and len(table.stage_layers) == table.num_stages


def test_ratio_without_layers_keeps_relative_weights_and_layers_alone_split_evenly():
    # 16 stages in four groups of four consecutive stages
    assert small_table("hanayo", stage_layers_ratio="1:1:2:2").stage_layers == \
        (1,) * 8 + (2,) * 8
    assert small_table("1f1b", layers=10).stage_layers == (3, 3, 2, 2)
    assert small_table("1f1b", stage_layers="1,2,3,4", layers=10).stage_layers == (1, 2, 3, 4)


@pytest.mark.parametrize("kwargs,message", [
    (dict(stage_layers_ratio="1:2:3"),
     r"1f1b: stage_layers_ratio 1:2:3 has 3 groups, which do not divide the 4 stages evenly; "
     r"give 1, 2 or 4 weights"),
    (dict(stage_layers_ratio="1:x"),
     r"1f1b: stage_layers_ratio entries must be integers, not 'x' \(in 1:x\)"),
    (dict(stage_layers_ratio="1:0"), r"1f1b: stage_layers_ratio weights must be >= 1, not 1:0"),
    (dict(stage_layers_ratio="1::2"), r"1f1b: stage_layers_ratio must be weights such as 1:2, "
                                      r"not '1::2'"),
    (dict(stage_layers_ratio=[1.5, 2]),
     r"1f1b: stage_layers_ratio entries must be integers, not 1.5 \(in 1.5:2\)"),
    (dict(stage_layers_ratio=3), r"1f1b: stage_layers_ratio must be weights such as 1:2, not 3"),
    (dict(stage_layers=[1, 2], stage_layers_ratio="1:2"),
     r"1f1b: give stage_layers or stage_layers_ratio, not both"),
    (dict(stage_layers=[1, 2, 3]), r"1f1b: stage_layers has 3 entries but the table has 4 stages"),
    (dict(stage_layers=[1, 2, 3, -4]), r"1f1b: stage_layers must not be negative \(1,2,3,-4\)"),
    (dict(stage_layers=[1, 2, 3, 4], layers=12),
     r"1f1b: stage_layers add up to 10, not layers=12"),
    (dict(layers=3), r"1f1b: 3 layers cannot fill the table's 4 stages \(every stage needs at "
                     r"least one layer\); use at least 4 layers or fewer stages"),
    (dict(layers="many"), r"1f1b: layers must be an integer, not 'many'"),
    (dict(layers=4.5), r"1f1b: layers must be an integer, not 4.5"),
    (dict(stage_layers=7), r"1f1b: stage_layers must be one layer count per stage, not 7"),
])
def test_layer_split_errors(kwargs, message):
    with pytest.raises(InvalidParameterError, match=message):
        small_table("1f1b", **kwargs)


def test_resolve_returns_none_without_a_split():
    assert resolve_stage_layers("gpipe", 4) is None
