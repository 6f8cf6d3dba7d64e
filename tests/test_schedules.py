"""Generators and the registry: golden tables, the worked grids of SCHEDULES.md."""

import numpy as np
import pytest

from tabsched import (InvalidParameterError, UnitCosts, UnknownNameError, evaluate, generate,
                      read_table)
from tabsched._testing import parse_grid
from tabsched.io import to_csv
from tabsched.schedules import families, get_family
from tabsched.table import Op


@pytest.mark.parametrize("family,p,m", [("gpipe", 4, 8), ("gpipe", 3, 5), ("1f1b", 4, 8),
                                        ("1f1b", 4, 2), ("1f1b", 8, 16)])
def test_golden_layouts(golden, family, p, m):
    path = golden(f"{family}_p{p}_m{m}.csv")
    table = generate(family, devices=p, microbatches=m)
    assert to_csv(table, drop_metadata=True).encode() == path.read_bytes()
    stored = read_table(path)
    assert stored.orders() == table.orders()
    assert stored.rows == table.rows


def assert_matches_grid(table, grid, durations):
    """Every op of the grid starts where SCHEDULES.md draws it (stage = device here)."""
    result = evaluate(table, UnitCosts(f=durations["F"], b=durations["B"]))
    expected = parse_grid(grid, lambda device, letter, microbatch: Op(letter, device, microbatch),
                          durations)
    start = {(int(table.device[k]), table.op(k)): result.op_start[k] for k in range(len(table))}
    for device, row in expected.items():
        for op, slot in row:
            assert start[device, op] == slot, (device, op)
    return result


GPIPE_4_8 = """
d0: F0 F1 F2 F3 F4 F5 F6 F7 .  .  .  .  .  .  .  .  .  B0 B0 B1 B1 B2 B2 B3 B3 B4 B4 B5 B5 B6 B6 B7 B7
d3: .  .  .  F0 F1 F2 F3 F4 F5 F6 F7 B0 B0 B1 B1 B2 B2 B3 B3 B4 B4 B5 B5 B6 B6 B7 B7 .  .  .  .  .  .
"""

ONE_F_ONE_B_4_8 = """
d0: F0 F1 F2 F3 .  .  .  .  .  .  B0 B0 F4 B1 B1 F5 B2 B2 F6 B3 B3 F7 B4 B4 .  B5 B5 .  B6 B6 .  B7 B7
d1: .  F0 F1 F2 .  .  .  .  B0 B0 F3 B1 B1 F4 B2 B2 F5 B3 B3 F6 B4 B4 F7 B5 B5 .  B6 B6 .  B7 B7 .  .
d2: .  .  F0 F1 .  .  B0 B0 F2 B1 B1 F3 B2 B2 F4 B3 B3 F5 B4 B4 F6 B5 B5 F7 B6 B6 .  B7 B7 .  .  .  .
d3: .  .  .  F0 B0 B0 F1 B1 B1 F2 B2 B2 F3 B3 B3 F4 B4 B4 F5 B5 B5 F6 B6 B6 F7 B7 B7 .  .  .  .  .  .
"""


def test_gpipe_matches_schedules_md_grid():
    result = assert_matches_grid(generate("gpipe", devices=4, microbatches=8), GPIPE_4_8,
                                 {"F": 1, "B": 2})
    assert result.makespan == 33 and round(result.bubble_ratio, 3) == 0.273


def test_one_f_one_b_matches_schedules_md_grid():
    result = assert_matches_grid(generate("1f1b", devices=4, microbatches=8), ONE_F_ONE_B_4_8,
                                 {"F": 1, "B": 2})
    assert result.makespan == 33


def test_gpipe_backward_order_parameter():
    table = generate("gpipe", devices=2, microbatches=3, backward_order="descending")
    assert [str(op) for op in table.orders()[0]] == ["0F0", "0F1", "0F2", "0B2", "0B1", "0B0"]
    with pytest.raises(InvalidParameterError, match="backward_order must be one of ascending, "
                                                    "descending, not 'up'"):
        generate("gpipe", devices=2, microbatches=3, backward_order="up")


def test_one_f_one_b_caps_warmup_at_m():
    table = generate("1f1b", devices=4, microbatches=2)
    assert [str(op) for op in table.orders()[0]] == ["0F0", "0F1", "0B0", "0B1"]


def test_registry_names_and_aliases():
    assert {"gpipe", "1f1b"} <= {family.name for family in families()}
    assert get_family("DAPPLE") is get_family("1f1b")
    table = generate("1F1B", devices=2, microbatches=2)
    assert table.family == "1f1b" and table.params == {"devices": 2, "microbatches": 2}


@pytest.mark.parametrize("call,message", [
    (lambda: generate("lf1b", devices=2, microbatches=2),
     r"unknown schedule family 'lf1b' \(did you mean '1f1b'\?\); valid families: .*1f1b.*gpipe"),
    (lambda: generate("zzz"), r"unknown schedule family 'zzz'; valid families: "),
    (lambda: generate("1f1b", devices=2), r"1f1b needs microbatches"),
    (lambda: generate("1f1b", devices=2, microbatches=2, chunks=2),
     r"1f1b does not take chunks; its parameters are devices, microbatches"),
    (lambda: generate("1f1b", devices=0, microbatches=2), r"1f1b: devices must be >= 1, not 0"),
    (lambda: generate("1f1b", devices=2.5, microbatches=2),
     r"1f1b: devices must be an integer, not 2.5"),
    (lambda: generate("gpipe", devices="x", microbatches=2),
     r"gpipe: devices must be an integer, not 'x'"),
])
def test_generate_errors(call, message):
    with pytest.raises((UnknownNameError, InvalidParameterError), match=message):
        call()


def test_stage_layers_for_every_family():
    table = generate("1f1b", devices=2, microbatches=2, stage_layers=[3, 5])
    assert table.stage_layers == (3, 5)


def test_every_family_declares_what_it_needs():
    for family in families():
        assert family.summary and family.constraints
        names = family.parameter_names()
        assert names[:2] == ["devices", "microbatches"]


def test_tables_too_large_to_lower_are_refused_before_building():
    with pytest.raises(InvalidParameterError, match=r"1f1b at devices=50000, microbatches=50000 "
                                                    r"would have up to 7.5e\+09 operations"):
        generate("1f1b", devices=50000, microbatches=50000)
    with pytest.raises(InvalidParameterError, match=r"hanayo at devices=1000, "
                                                    r"microbatches=1000, waves=100"):
        generate("hanayo", devices=1000, microbatches=1000, waves=100)


def test_a_family_module_is_imported_when_its_family_is_asked_for():
    """Generating a family imports its module only; every name and alias resolves from
    a fresh start; the index of irregular names points at the modules that register
    them; listing imports them all."""
    import subprocess
    import sys
    from tabsched.schedules import _MODULE_OF, families
    names = sorted({name for family in families() for name in (family.name, *family.aliases)})
    code = (
        "import sys\n"
        "from tabsched.schedules import generate, get_family, families\n"
        "generate('1f1b', devices=2, microbatches=2)\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('tabsched.schedules.')\n"
        "                and not m.rpartition('.')[2].startswith('_'))\n"
        "assert loaded == ['tabsched.schedules.one_f_one_b'], loaded\n"
        f"for name in {names!r}:\n"
        "    assert get_family(name.upper()).name\n"
        f"assert len(families()) == {len(families())}\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    for name, module in _MODULE_OF.items():
        assert get_family(name).build.__module__ == f"tabsched.schedules.{module}", name


def _variants(family):
    names = family.parameter_names()
    if "group_size" in names:
        return [{"chunks": c, "group_size": g} for c in (1, 2, 3) for g in (None, 2, 3, 5)]
    if "chunks" in names:
        return [{"chunks": c} for c in (1, 2, 3)]
    if "waves" in names:
        return [{"waves": w} for w in (1, 2)]
    if "variant" in names:
        return [{"variant": v, "pipelines": q} for v in ("direct", "doubling", "x")
                for q in (2, 4)]
    if "pairs" in names:
        return [{}, {"pairs": "serial"}, {"pairs": "x"}]
    if "backward_order" in names:
        return [{}, {"backward_order": "descending"}, {"backward_order": "x"}]
    return [{}]


@pytest.mark.parametrize("family", [family for family in families() if not family.cost_driven],
                         ids=lambda family: family.name)
def test_check_parameters_refuses_what_generate_refuses_without_building(family, monkeypatch):
    """A family's check says, for every size, what building it says: the stage count, or
    the same one-line error (layers included), and it never builds the table."""
    from tabsched.schedules import check_parameters
    assert family.check is not None
    outcomes = []
    for p in range(1, 7):
        for m in (1, 2, 3, 4, 5, 6, 8, 12):
            for extra in _variants(family):
                for layers in (None, 5, 24):
                    params = dict(devices=p, microbatches=m, layers=layers, **extra)
                    try:
                        built = generate(family.name, **params).num_stages
                    except InvalidParameterError as error:
                        built = str(error)
                    outcomes.append((params, built))
    def never(*args, **kwargs):
        raise AssertionError("check_parameters built a table")
    monkeypatch.setattr("tabsched.schedules._common.from_order_arrays", never)
    for params, built in outcomes:
        try:
            checked = check_parameters(family.name, **params)
        except InvalidParameterError as error:
            checked = str(error)
        assert checked == built, params


def test_check_parameters_builds_a_cost_driven_family():
    from tabsched.schedules import check_parameters
    costs = UnitCosts(f=1, b=2, i=1, w=1)
    assert get_family("zb-auto").check is None
    assert check_parameters("zb-auto", devices=4, microbatches=8, costs=costs) == 4
    with pytest.raises(InvalidParameterError, match="zb-auto needs costs"):
        check_parameters("zb-auto", devices=4, microbatches=8)


def test_one_f_one_b_columns_are_every_devices_order():
    """The 1F1B generator builds all devices' orders at once (numpy over the grid);
    each device's is device_order's, and the table is the one the per-device orders
    lay out."""
    from tabsched.layout import from_order
    from tabsched.schedules.one_f_one_b import device_order, order_columns
    from tabsched.table import KINDS
    for p in range(1, 9):
        for n in range(1, 14):
            device, position, kind, stage, microbatch = order_columns(p, n)
            orders = []
            for r in range(p):
                kinds, mbs = device_order(min(p - r - 1, n), n)
                mine = device == r
                assert np.array_equal(kind[mine], kinds) and np.array_equal(microbatch[mine], mbs)
                assert np.array_equal(position[mine], np.arange(2 * n))
                assert np.all(stage[mine] == r)
                orders.append([f"{r}{KINDS[k]}{m}" for k, m in zip(kinds, mbs)])
            table = generate("1f1b", devices=p, microbatches=n)
            assert table == from_order(orders, num_stages=p, num_microbatches=n,
                                       family="1f1b", params={"devices": p, "microbatches": n})
