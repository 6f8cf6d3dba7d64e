"""Sweeps: a grid of configurations into a tidy table, on local processes or Dask.

A configuration is (family spec, devices, microbatches, model, system). One
*task* covers every system for one (spec, devices, microbatches, model): the
table is generated and lowered once and all systems are evaluated as the
samples of one kernel call (:func:`tabsched.evaluate.evaluate_many`). Tasks are
independent, so they run serially, on ``jobs`` local processes, or on a Dask
cluster; rows always come back in task order, so the CSV is byte-identical
whichever way it ran.

Each row holds the configuration, ``status`` (``ok`` or ``skipped``, with the
``reason``), and one column per metric named after its level: ``formula_*``,
``table_*`` and ``simulation_*`` (seconds and bytes). The table level runs with
the task's slot lengths (``slot_lengths``, default all 1); the simulation
with its parallelism (``parallel``, the non-default ModelCosts settings as JSON).
A cost-driven family (``zb-auto``) gets one table per system, built for that
system's costs, and its table level from the table it builds for the slot lengths.
"""

import csv
import io
import itertools
import json
import os
from dataclasses import dataclass

from tabsched._extras import require
from tabsched.compare import (describe_lengths, generate_spec, model_costs_for, parse_spec,
                              slot_lengths, table_level_with)
from tabsched.costs import UnitCosts
from tabsched.evaluate import evaluate_many
from tabsched.exceptions import InvalidParameterError, TabschedError
from tabsched.schedules import get_family
from tabsched.costs.transformer import load_model
from tabsched.costs.system import load_system
from tabsched.table import cut, shown

__all__ = ["SweepTask", "grid_tasks", "run_task", "run_sweep", "COLUMNS", "SYSTEM_GRID",
           "rows_to_csv", "read_sweep_csv"]

#: The tabular paper's 3x3 grid of systems: network (rows) x compute (columns).
SYSTEM_GRID = tuple(f"{network}_nw_{compute}_cp" for network in ("slow", "mid", "fast")
                    for compute in ("slow", "mid", "fast"))

COLUMNS = (
    "spec", "family", "params", "devices", "microbatches", "model", "system", "global_batch",
    "microbatch_size", "status", "reason",
    "formula_bubble_ratio", "formula_exact", "formula_peak_activation",
    "table_bubble_ratio", "table_slots",
    "simulation_makespan_s", "simulation_bubble_ratio",
    "simulation_peak_activation_bytes", "simulation_min_peak_activation_bytes",
    "simulation_peak_memory_bytes", "simulation_min_peak_memory_bytes",
    "simulation_peak_memory_device", "slot_lengths", "parallel",
)


@dataclass(frozen=True)
class SweepTask:
    """Every system of one (spec, devices, microbatches, model); picklable."""

    spec: str
    devices: int
    microbatches: int
    model: str
    systems: tuple
    global_batch: int = None
    recompute: str = None
    contention: str = None
    grad_sync: str = "replicas"
    lengths: tuple = None
    parallel: tuple = ()

    @property
    def configurations(self):
        return len(self.systems)


def grid_tasks(specs, devices, microbatches, *, models=("paper-128l",), systems=SYSTEM_GRID,
               global_batch=None, recompute=None, contention=None, grad_sync="replicas",
               lengths=None, parallel=None):
    """The tasks of a full grid (specs x devices x microbatches x models).

    ``lengths``: the table level's slot lengths ``(F, B, I, W)``; ``parallel``:
    ModelCosts' parallelism keywords (``tensor_parallel=8``...) for every task.
    """
    lengths = slot_lengths(lengths)
    parallel = tuple(sorted((parallel or {}).items()))
    specs = [parse_spec(spec).label for spec in specs]   # fail early on a bad spec
    for name, values in (("devices", devices), ("microbatches", microbatches),
                         ("models", models), ("systems", systems)):
        if not values:
            raise InvalidParameterError(f"sweep: {name} is empty")
    # a misspelt model or system is a mistake, not a configuration to skip
    for model in models:
        load_model(model)
    for system in systems:
        load_system(system)
    return [SweepTask(spec, int(p), int(m), str(model), tuple(str(s) for s in systems),
                      global_batch, recompute, contention, grad_sync, lengths, parallel)
            for spec, p, m, model in itertools.product(specs, devices, microbatches, models)]


def _base_row(task, system):
    row = dict.fromkeys(COLUMNS)
    row.update({"spec": task.spec, "family": parse_spec(task.spec).family, "params": "",
            "devices": task.devices, "microbatches": task.microbatches, "model": task.model,
            "system": system, "global_batch": task.global_batch, "microbatch_size": None,
            "status": "ok", "reason": "", "slot_lengths": describe_lengths(task.lengths),
            "parallel": json.dumps(dict(task.parallel), sort_keys=True)})
    return row


def run_task(task):
    """Rows (dicts keyed by COLUMNS) for every system of ``task``."""
    rows = [_base_row(task, system) for system in task.systems]
    spec = parse_spec(task.spec)

    def skip(reason, which=None):
        for row in rows if which is None else which:
            row["status"], row["reason"] = "skipped", reason
        return rows

    costs, live = [], []
    for row, system in zip(rows, task.systems):
        try:
            system_costs = model_costs_for(task.model, system, task.microbatches,
                                           global_batch=task.global_batch,
                                           recompute=task.recompute, contention=task.contention,
                                           grad_sync=task.grad_sync, **dict(task.parallel))
            # an override of a device this run lacks skips this system's row, not all of them
            system_costs.placement.check_devices(task.devices)
            costs.append(system_costs)
            live.append(row)
            row["microbatch_size"] = costs[-1].model.microbatch_size
        except TabschedError as error:
            skip(str(error), [row])
    if not costs:
        return rows
    layers = costs[0].model.layers
    try:
        sync = "all" if costs[0].grad_sync == "all" else task.grad_sync   # overlapped DP
        if get_family(spec.family).cost_driven:
            # one table per system, built for its costs; the table level for the slot lengths
            tables = [generate_spec(spec, task.devices, task.microbatches, layers, system)
                      for system in costs]
            results = [evaluate_many(table, [system], grad_sync=sync)[0]
                       for table, system in zip(tables, costs)]
            level = table_level_with(generate_spec(spec, task.devices, task.microbatches,
                                                   layers, UnitCosts(*task.lengths)),
                                     task.lengths)
        else:
            table = generate_spec(spec, task.devices, task.microbatches, layers)
            results = evaluate_many(table, costs, grad_sync=sync)
            level = table_level_with(table, task.lengths)
    except TabschedError as error:
        return skip(str(error), live)
    for row, result in zip(live, results):
        params = json.dumps(result.table.params, sort_keys=True)
        formula = result.formula or {}
        peaks = formula.get("peak_activation")
        bounds = formula.get("peak_activation_bounds")
        activation = [d.peak_memory for d in result.devices]
        total = [d.peak_total_memory for d in result.devices]
        row.update({
            "params": params,
            "formula_bubble_ratio": formula.get("bubble_ratio"),
            "formula_exact": formula.get("exact"),
            "formula_peak_activation": (float(max(peaks)) if peaks else
                                        float(bounds[1]) if bounds else None),
            "table_bubble_ratio": level["bubble_ratio"],
            "table_slots": (int(level["slots"]) if float(level["slots"]).is_integer()
                            else level["slots"]),
            "simulation_makespan_s": result.makespan,
            "simulation_bubble_ratio": result.bubble_ratio,
            "simulation_peak_activation_bytes": max(activation),
            "simulation_min_peak_activation_bytes": min(activation),
            "simulation_peak_memory_bytes": max(total),
            "simulation_min_peak_memory_bytes": min(total),
            "simulation_peak_memory_device": int(max(range(len(total)), key=total.__getitem__)),
        })
    return rows


def run_sweep(tasks, *, jobs=1, dask=None, progress=None):
    """Run ``tasks`` and return their rows in task order.

    Parameters
    ----------
    tasks : list of SweepTask
    jobs : int
        Local worker processes (1: run here).
    dask : str or distributed.Client, optional
        A scheduler address (``tcp://host:8786``), ``"local"`` for a LocalCluster
        of ``jobs`` workers, or a Client; needs ``dask.distributed``
        (the ``dask`` extra: ``pip install 'tabsched[dask]'``).
    progress : callable, optional
        Called as ``progress(tasks_done, tasks_total, configurations_done)``.
    """
    tasks = list(tasks)
    if jobs < 1:
        raise InvalidParameterError(f"jobs must be >= 1, not {jobs}")
    results = [None] * len(tasks)
    done_configs = 0

    def record(index, rows, done):
        nonlocal done_configs
        results[index] = rows
        done_configs += len(rows)
        if progress is not None:
            progress(done, len(tasks), done_configs)

    if dask is not None:
        _run_dask(tasks, dask, jobs, record)
    elif jobs == 1 or len(tasks) <= 1:
        for index, task in enumerate(tasks):
            record(index, run_task(task), index + 1)
    else:
        from concurrent.futures import ProcessPoolExecutor, as_completed
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = {pool.submit(run_task, task): index for index, task in enumerate(tasks)}
            for done, future in enumerate(as_completed(futures), 1):
                record(futures[future], future.result(), done)
    return [row for rows in results for row in rows]


def _run_dask(tasks, dask, jobs, record):
    distributed = require("distributed", "dask", "--dask")
    Client, LocalCluster, as_completed = (distributed.Client, distributed.LocalCluster,
                                          distributed.as_completed)
    owned = []
    if isinstance(dask, Client):
        client = dask
    elif dask == "local":
        cluster = LocalCluster(n_workers=jobs, threads_per_worker=1, dashboard_address=None)
        client = Client(cluster)
        owned = [client, cluster]
    else:
        try:
            client = Client(dask, timeout="10s")
        except (OSError, TimeoutError) as error:
            raise InvalidParameterError(f"--dask {dask}: cannot reach the scheduler "
                                        f"({error})") from None
        owned = [client]
    try:
        futures = client.map(run_task, tasks, pure=False)
        index_of = {future.key: index for index, future in enumerate(futures)}
        for done, future in enumerate(as_completed(futures), 1):
            record(index_of[future.key], future.result(), done)
    finally:
        for resource in owned:
            resource.close()


def _cell(value):
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else str(value)


def rows_to_csv(rows):
    """CSV text (header + one line per row); floats keep every digit."""
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(COLUMNS)
    for row in rows:
        writer.writerow([_cell(row.get(column)) for column in COLUMNS])
    return buffer.getvalue()


_INTEGER_COLUMNS = {"devices", "microbatches", "global_batch", "microbatch_size", "table_slots",
                    "simulation_peak_memory_device"}
_TEXT_COLUMNS = {"spec", "family", "params", "model", "system", "status", "reason",
                 "slot_lengths", "parallel"}


def read_sweep_csv(path):
    """Rows of a sweep CSV written by ``rows_to_csv``, with numbers parsed back.

    The file is untrusted: it must be UTF-8 CSV with the sweep's columns, a
    value per column on every row; every error names the file, line and column.
    """
    source = os.fspath(path)
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except OSError as error:
        raise InvalidParameterError(f"{source}: cannot read: {error.strerror or error}") \
            from None
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise InvalidParameterError(f"{source}: byte {error.start} is not UTF-8 text; not a "
                                    f"sweep CSV") from None
    if "\x00" in text:
        raise InvalidParameterError(f"{source}: the file contains a NUL byte; not a sweep CSV")
    reader = csv.DictReader(io.StringIO(text, newline=""), strict=True)
    rows = []
    try:
        fields = reader.fieldnames or []
        missing = [column for column in ("spec", "devices", "microbatches", "system",
                                         "simulation_makespan_s") if column not in fields]
        if missing:
            raise InvalidParameterError(f"{source}: not a sweep CSV (no column "
                                        f"{missing[0]!r})")
        for raw_row in reader:
            line = reader.line_num
            if None in raw_row:
                raise InvalidParameterError(f"{source}: line {line}: more values than the "
                                            f"{len(fields)} columns")
            row = {}
            for key, value in raw_row.items():
                if key in _TEXT_COLUMNS or value in ("", None):
                    row[key] = value if key in _TEXT_COLUMNS else None
                elif value in ("true", "false"):
                    row[key] = value == "true"
                else:
                    try:
                        row[key] = float(value)
                        if key in _INTEGER_COLUMNS and row[key].is_integer():
                            row[key] = int(row[key])
                    except ValueError:
                        raise InvalidParameterError(
                            f"{source}: line {line}, column {cut(key)}: {shown(value)} is "
                            f"not a number") from None
            rows.append(row)
    except csv.Error as error:
        raise InvalidParameterError(f"{source}: line {reader.line_num}: not valid CSV: "
                                    f"{cut(error, 80)}") from None
    return rows
