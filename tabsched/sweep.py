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
``table_*`` and ``simulation_*`` (seconds and bytes).
"""

import csv
import functools
import io
import itertools
import json
from dataclasses import dataclass

from tabsched.compare import generate_spec, model_costs_for, parse_spec
from tabsched.evaluate import evaluate_summaries, table_level
from tabsched.exceptions import InvalidParameterError, TabschedError
from tabsched.costs.transformer import load_model
from tabsched.costs.system import load_system

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
    "simulation_peak_memory_device",
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

    @property
    def configurations(self):
        return len(self.systems)


def grid_tasks(specs, devices, microbatches, *, models=("paper-128l",), systems=SYSTEM_GRID,
               global_batch=None, recompute=None, contention=None, grad_sync="replicas"):
    """The tasks of a full grid (specs x devices x microbatches x models)."""
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
                      global_batch, recompute, contention, grad_sync)
            for spec, p, m, model in itertools.product(specs, devices, microbatches, models)]


def _base_row(task, system):
    row = dict.fromkeys(COLUMNS)
    row.update({"spec": task.spec, "family": parse_spec(task.spec).family, "params": "",
            "devices": task.devices, "microbatches": task.microbatches, "model": task.model,
            "system": system, "global_batch": task.global_batch, "microbatch_size": None,
            "status": "ok", "reason": ""})
    return row


# Presets are parsed once per process, and a cost model is built once per
# (model, system, microbatch size, options): a sweep meets the same ones in task
# after task. Cost models are not changed after they are built.
_load_model = functools.lru_cache(maxsize=None)(load_model)
_load_system = functools.lru_cache(maxsize=None)(load_system)


@functools.lru_cache(maxsize=1024)
def _model_costs(model, system, microbatches, global_batch, recompute, contention, grad_sync):
    return model_costs_for(_load_model(model), _load_system(system), microbatches,
                           global_batch=global_batch, recompute=recompute,
                           contention=contention, grad_sync=grad_sync)


def _warm(tasks):
    """Build every cost model ``tasks`` use, here, before worker processes fork."""
    for task in tasks:
        grad_sync = tuple(task.grad_sync) if isinstance(task.grad_sync, list) else task.grad_sync
        for system in task.systems:
            try:
                _model_costs(task.model, system, task.microbatches, task.global_batch,
                             task.recompute, task.contention, grad_sync)
            except TabschedError:
                pass        # the task reports it as a skipped row


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
            grad_sync = task.grad_sync
            if isinstance(grad_sync, list):
                grad_sync = tuple(grad_sync)
            costs.append(_model_costs(task.model, system, task.microbatches, task.global_batch,
                                      task.recompute, task.contention, grad_sync))
            live.append(row)
            row["microbatch_size"] = costs[-1].model.microbatch_size
        except TabschedError as error:
            skip(str(error), [row])
    if not costs:
        return rows
    try:
        table = generate_spec(spec, task.devices, task.microbatches, costs[0].model.layers)
        results = evaluate_summaries(table, costs, grad_sync=task.grad_sync)
    except TabschedError as error:
        return skip(str(error), live)
    level = table_level(table)
    params = json.dumps(table.params, sort_keys=True)
    for row, result in zip(live, results):
        formula = result.formula or {}
        peaks = formula.get("peak_activation")
        bounds = formula.get("peak_activation_bounds")
        activation = result.peak_activation
        total = result.peak_memory
        row.update({
            "params": params,
            "formula_bubble_ratio": formula.get("bubble_ratio"),
            "formula_exact": formula.get("exact"),
            "formula_peak_activation": (float(max(peaks)) if peaks else
                                        float(bounds[1]) if bounds else None),
            "table_bubble_ratio": level["bubble_ratio"], "table_slots": level["slots"],
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
        (``pip install -e '.[dask]'``).
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
        from concurrent.futures import ProcessPoolExecutor
        _warm(tasks)    # forked workers inherit the parsed presets and built cost models
        # small chunks: tasks differ a hundredfold in cost, and a worker left with a
        # long chunk at the end keeps the other idle (one round trip costs well under
        # a typical task)
        chunk = max(1, len(tasks) // (64 * jobs))
        # the largest tables first (operations grow with devices x microbatches), so
        # that no worker starts a long task when the others are nearly done
        largest_first = sorted(range(len(tasks)),
                               key=lambda index: -tasks[index].devices * tasks[index].microbatches)
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            done = pool.map(run_task, [tasks[index] for index in largest_first], chunksize=chunk)
            for count, (index, rows) in enumerate(zip(largest_first, done), 1):
                record(index, rows, count)
    return [row for rows in results for row in rows]


def _run_dask(tasks, dask, jobs, record):
    try:
        from distributed import Client, LocalCluster, as_completed
    except ImportError:
        raise InvalidParameterError("--dask needs dask.distributed: pip install -e '.[dask]'") \
            from None
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
_TEXT_COLUMNS = {"spec", "family", "params", "model", "system", "status", "reason"}


def read_sweep_csv(path):
    """Rows of a sweep CSV written by ``rows_to_csv``, with numbers parsed back."""
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [column for column in ("spec", "devices", "microbatches", "system",
                                         "simulation_makespan_s")
                   if column not in (reader.fieldnames or [])]
        if missing:
            raise InvalidParameterError(f"{path}: not a sweep CSV (no column "
                                        f"{missing[0]!r})")
        rows = []
        for line, raw in enumerate(reader, 2):
            row = {}
            for key, value in raw.items():
                if key in _TEXT_COLUMNS or value in ("", None):
                    row[key] = value if key in _TEXT_COLUMNS else None
                elif value in ("true", "false"):
                    row[key] = value == "true"
                else:
                    try:
                        row[key] = int(value) if key in _INTEGER_COLUMNS else float(value)
                    except ValueError:
                        raise InvalidParameterError(f"{path}: line {line}, column {key}: "
                                                    f"{value!r} is not a number") from None
            rows.append(row)
    return rows
