"""Fuzzing the readers, and round trips through every format (issue 13).

The fuzzing runs in a subprocess (``tests/_fuzz_readers_worker.py``) that limits
its own address space, so that a reader sizing anything from a huge id fails
with ``MemoryError`` instead of taking the machine; its examples scale with the
hypothesis profile. The round trips check that every table tabsched makes,
written to each format that accepts it and read back, is the same table and
evaluates to the same result, and that each format refuses what it cannot hold.
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tabsched import (InvalidScheduleError, StageCosts, evaluate, from_csv, from_json,
                      generate, to_csv, to_json)
from tabsched._testing import random_table
from tabsched.adapt import SplitBackward, SplitMicrobatches
from tabsched.io import csv_loss
from tabsched.pytorch import (from_pytorch_csv, pytorch_refusal, to_compute_comms,
                              to_compute_only)
from tabsched.schedules import families, get_family

WORKER = pathlib.Path(__file__).resolve().parent / "_fuzz_readers_worker.py"
#: Examples per fuzzed property, by hypothesis profile (the worker runs nine: CSV, JSON,
#: replay, raw bytes and CLI files, and the system and model TOML readers; and every edge
#: value of every TOML key once).
EXAMPLES = {"dev": 25, "ci": 80, "thorough": 1000}


def test_fuzzed_files_end_in_one_line_errors_or_valid_tables():
    examples = EXAMPLES.get(os.environ.get("HYPOTHESIS_PROFILE", "dev"), 25)
    result = subprocess.run([sys.executable, str(WORKER), str(examples)], capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-6000:]


# ------------------------------------------------------------------ round trips
SMALL = {"dualpipe": {"devices": 4, "microbatches": 8}, "hanayo": {"devices": 4,
                                                                   "microbatches": 4}}


def small(family):
    built_for = {"costs": StageCosts(1.0, 2.0, comm=0.25)} if family.cost_driven else {}
    return generate(family.name, **SMALL.get(family.name, {"devices": 4, "microbatches": 8}),
                    **built_for)


def variants(table):
    """The table and what tabsched makes of it: metadata stripped, synced, layered, split."""
    bare = table.replace(family=None, params={})
    costs = StageCosts(1.0, 2.0, comm=0.25)
    yield "generated", table
    yield "cells only", bare
    yield "grad sync", bare.replace(grad_sync=list(range(table.num_stages)))
    family = get_family(table.family)
    built_for = {"costs": costs} if family.cost_driven else {}
    params = {key: value for key, value in table.params.items()   # not what a choice records
              if key in family.parameter_names()}
    yield "layers", generate(table.family, **params, **built_for, layers=8 * table.num_stages)
    yield "split", SplitMicrobatches("all", 2).apply(table, costs)
    yield "split backward", SplitBackward(None).apply(bare, costs)


FORMATS = {
    "json": (lambda table: to_json(table), lambda text: from_json(text)),
    "csv": (lambda table: to_csv(table), lambda text: from_csv(text)),
    "pytorch": (lambda table: to_compute_only(table),
                lambda text: from_pytorch_csv(text).table),
}


def unlabelled(table):
    """What a CSV keeps of ``table``: everything but the family label (``csv_omits``)."""
    return table.replace(family=None, params={})


def results(result):
    """The numbers of a result, without the labels and the formula level."""
    data = result.to_dict()
    for key in ("family", "params", "formula", "notes"):
        data.pop(key, None)
    return data


def holds(format_name, table):
    """Whether ``format_name`` can hold all of ``table``."""
    if len(set(table.device.tolist())) < table.num_devices:
        return False   # a device that runs nothing: no reader takes its row back
    if format_name == "json":
        return True
    if csv_loss(table):
        return False
    return format_name == "csv" or pytorch_refusal(table) is None


@pytest.mark.parametrize("family", families(), ids=lambda family: family.name)
def test_every_table_round_trips_through_each_format_that_holds_it(family):
    costs = StageCosts(1.0, 2.0, comm=0.25)
    for label, table in variants(small(family)):
        expected = evaluate(table, costs).to_dict()
        for format_name, (write, read) in FORMATS.items():
            if not holds(format_name, table):
                with pytest.raises(InvalidScheduleError, match=r"cannot (hold|express)"):
                    write(table)
                continue
            back = read(write(table))
            kept = table if format_name == "json" else unlabelled(table)
            assert back == kept, (label, format_name)
            assert evaluate(back, costs).to_dict() == (
                expected if format_name == "json" else evaluate(kept, costs).to_dict())
            assert results(evaluate(back, costs)) == results(evaluate(table, costs)), label
            assert write(back) == write(table)
        if holds("pytorch", table):   # compute_comms: the same orders, PyTorch's lowering
            comms = from_pytorch_csv(to_compute_comms(table)).table
            assert comms.orders() == table.orders()


@given(seed=st.integers(0, 2**32 - 1))
def test_random_tables_round_trip_or_are_refused(seed):
    table = random_table(seed)
    synced = table.replace(grad_sync=[0]) if seed % 3 == 0 else table
    for format_name, (write, read) in FORMATS.items():
        if not holds(format_name, synced):
            with pytest.raises(InvalidScheduleError):
                write(synced)
            continue
        back = read(write(synced))
        kept = synced if format_name == "json" else unlabelled(synced)
        assert back == kept and write(back) == write(synced)


def test_json_written_by_tabsched_parses_as_plain_json():
    table = generate("hanayo", devices=4, microbatches=4, waves=2, layers=32)
    data = json.loads(to_json(table))
    assert data["stage_layers"] == list(table.stage_layers)
    assert data["params"] == {"devices": 4, "microbatches": 4, "waves": 2}
