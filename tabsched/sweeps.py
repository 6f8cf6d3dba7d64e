"""Sweeps: a grid of configurations into a tidy table, on local processes or Dask.

:func:`sweep` (``tabsched.sweeps``) is the public entry point; it returns a
:class:`SweepResult`, rows with ``to_dataframe()`` and ``to_csv()``.

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

from __future__ import annotations

import csv
import io
import itertools
import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tabsched._extras import require
from tabsched._memo import memo
from tabsched.compare import (describe_lengths, generate_spec, grad_sync_for,
                              model_costs_for, parse_spec, slot_lengths, table_level_with)
from tabsched.costs import UnitCosts
from tabsched.evaluate import evaluate_summaries
from tabsched.exceptions import InvalidParameterError, TabschedError
from tabsched.execution import Execution
from tabsched.schedules import get_family
from tabsched.costs.transformer import load_model
from tabsched.costs.system import load_system
from tabsched.files import read_text
from tabsched.table import cut, shown

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

__all__ = ["sweep", "SweepResult", "SweepTask", "grid_tasks", "run_task", "run_sweep", "COLUMNS",
           "SYSTEM_GRID", "rows_to_csv", "read_sweep_csv", "run_parallel"]

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
    global_batch: int | None = None
    recompute: str | None = None
    contention: str | None = None
    grad_sync: str = "replicas"
    lengths: tuple | None = None
    parallel: tuple = ()
    #: The execution every configuration starts from (the options above change it).
    execution: Execution | None = None

    @property
    def configurations(self):
        return len(self.systems)


def grid_tasks(specs, devices, microbatches, *, models=("paper-128l",), systems=SYSTEM_GRID,
               global_batch=None, recompute=None, contention=None, grad_sync="replicas",
               lengths=None, parallel=None, execution=None):
    """The tasks of a full grid (specs x devices x microbatches x models).

    ``lengths``: the table level's slot lengths ``(F, B, I, W)``; ``parallel``:
    ModelCosts' parallelism keywords (``tensor_parallel=8``...) for every task;
    ``execution``: the :class:`~tabsched.execution.Execution` they change. Its
    ``global_batch`` counts samples over all data-parallel replicas (Megatron-LM's
    meaning): a microbatch then holds ``global_batch / (data_parallel * M)``; it
    cannot be combined with ``global_batch``, which counts one pipeline's samples.
    """
    if execution is not None and not isinstance(execution, Execution):
        raise InvalidParameterError(f"execution must be an Execution, not "
                                    f"{type(execution).__name__}")
    if execution is not None and execution.global_batch is not None and \
            global_batch is not None:
        raise InvalidParameterError(
            f"give global_batch {global_batch} (samples per pipeline) or the execution's "
            f"global_batch {execution.global_batch} (samples over every replica), not both")
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
                      global_batch, recompute, contention, grad_sync, lengths, parallel,
                      execution)
            for spec, p, m, model in itertools.product(specs, devices, microbatches, models)]


def _base_rows(task):
    """A row per system of ``task``, with what the task alone decides."""
    base = dict.fromkeys(COLUMNS)
    base.update({"spec": task.spec, "family": parse_spec(task.spec).family, "params": "",
                 "devices": task.devices, "microbatches": task.microbatches,
                 "model": task.model, "global_batch": task.global_batch,
                 "microbatch_size": None, "status": "ok", "reason": "",
                 "slot_lengths": describe_lengths(task.lengths),
                 "parallel": json.dumps(_parallel_column(task), sort_keys=True)})
    return [{**base, "system": system} for system in task.systems]


def _parallel_column(task):
    """The ``parallel`` column: the options given, over the fields the execution sets."""
    given = dict(task.parallel)
    if task.execution is None:
        return given
    default = Execution().to_dict()
    own = {key: value for key, value in task.execution.to_dict().items()
           if value != default[key]}
    return {**own, **given}


# Presets are parsed once per process, and a cost model is built once per
# (model, system, microbatch size, options): a sweep meets the same ones in task
# after task. Cost models are frozen once built.
@memo(limit=256)
def _load_model(reference):
    return load_model(reference)


@memo(limit=256)
def _load_system(reference):
    return load_system(reference)


def _hashable(grad_sync):
    return tuple(grad_sync) if isinstance(grad_sync, list) else grad_sync


@memo(limit=1024)
def _model_costs(model, system, microbatches, global_batch, recompute, contention, grad_sync,
                 parallel=(), execution=None):
    """The cost model of one configuration, built once per process (presets parsed once)."""
    if execution is not None and execution.global_batch is not None:
        global_batch = _pipeline_batch(execution, dict(parallel))
        execution = execution.replace(global_batch=None, microbatch_size=None)
    return model_costs_for(_load_model(model), _load_system(system), microbatches,
                           global_batch=global_batch, recompute=recompute,
                           contention=contention, grad_sync=grad_sync, execution=execution,
                           **dict(parallel))


def _pipeline_batch(execution, parallel):
    """Samples of one pipeline replica per iteration: the execution's global batch over
    its data-parallel degree (the options' ``data_parallel`` if given)."""
    replicas = parallel.get("data_parallel") or execution.data_parallel
    if execution.global_batch % replicas:
        raise InvalidParameterError(f"the execution's global_batch {execution.global_batch} "
                                    f"does not split over {replicas} data-parallel replicas")
    return execution.global_batch // replicas


def _warm(tasks):
    """Build every cost model ``tasks`` use, here, before worker processes fork."""
    for task in tasks:
        for system in task.systems:
            try:
                _model_costs(task.model, system, task.microbatches, task.global_batch,
                             task.recompute, task.contention, _hashable(task.grad_sync),
                             tuple(task.parallel), task.execution)
            except TabschedError:
                pass        # the task reports it as a skipped row


def run_task(task):
    """Rows (dicts keyed by COLUMNS) for every system of ``task``."""
    rows = _base_rows(task)
    spec = parse_spec(task.spec)

    def skip(reason, which=None):
        for row in rows if which is None else which:
            row["status"], row["reason"] = "skipped", reason
        return rows

    costs, live = [], []
    for row, system in zip(rows, task.systems):
        try:
            system_costs = _model_costs(task.model, system, task.microbatches,
                                        task.global_batch, task.recompute, task.contention,
                                        _hashable(task.grad_sync), tuple(task.parallel),
                                        task.execution)
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
        sync = grad_sync_for(costs[0], task.grad_sync)   # overlapped DP: every stage
        if get_family(spec.family).cost_driven:
            # one table per system, built for its costs; the table level for the slot lengths
            tables = [generate_spec(spec, task.devices, task.microbatches, layers, system)
                      for system in costs]
            results = [evaluate_summaries(table, [system], grad_sync=sync)[0]
                       for table, system in zip(tables, costs)]
            level = table_level_with(generate_spec(spec, task.devices, task.microbatches,
                                                   layers, UnitCosts(*task.lengths)),
                                     task.lengths)
        else:
            table = generate_spec(spec, task.devices, task.microbatches, layers)
            tables = [table] * len(costs)
            results = evaluate_summaries(table, costs, grad_sync=sync)
            level = table_level_with(table, task.lengths)
    except TabschedError as error:
        return skip(str(error), live)
    described = {}      # the params of each table, written once for all its rows
    for row, table, result in zip(live, tables, results):
        params = described.get(id(table))
        if params is None:
            params = described[id(table)] = json.dumps(table.params, sort_keys=True)
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
        Local processes working: this one and ``jobs - 1`` forked from it (1: run
        here). Where processes cannot fork, ``jobs`` worker processes.
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
        _warm(tasks)    # forked workers inherit the parsed presets and built cost models
        # the largest tables first (operations grow with devices x microbatches), so
        # that no worker starts a long task when the others are nearly done
        largest_first = sorted(range(len(tasks)),
                               key=lambda index: -tasks[index].devices * tasks[index].microbatches)
        import multiprocessing     # (~9 ms to import: only for local processes)
        if "fork" in multiprocessing.get_all_start_methods():
            _run_forked(tasks, largest_first, jobs, record)
            return [row for rows in results for row in rows]
        from concurrent.futures import ProcessPoolExecutor
        # small chunks: tasks differ a hundredfold in cost, and a worker left with a
        # long chunk at the end keeps the other idle (one round trip costs well under
        # a typical task)
        chunk = max(1, len(tasks) // (64 * jobs))
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            done = pool.map(run_task, [tasks[index] for index in largest_first], chunksize=chunk)
            for count, (index, rows) in enumerate(zip(largest_first, done), 1):
                record(index, rows, count)
    return [row for rows in results for row in rows]


def run_parallel(function, tasks, *, jobs=1, dask=None, record):
    """``record(index, function(tasks[index]), done)`` for every task, run the way a sweep
    runs its tasks: here, on ``jobs`` local processes (this one and ``jobs - 1`` forked
    from it, each taking the next task from a shared counter, in the order given) or on
    Dask (``dask`` as in :func:`run_sweep`). ``function`` and the tasks must be picklable
    for Dask; forked processes inherit this one's memos. Used by ``tabsched.plan``.
    """
    tasks = list(tasks)
    if jobs < 1:
        raise InvalidParameterError(f"jobs must be >= 1, not {jobs}")
    if dask is not None:
        _run_dask(tasks, dask, jobs, record, run=function)
    elif jobs == 1 or len(tasks) <= 1:
        for index, task in enumerate(tasks):
            record(index, function(task), index + 1)
    else:
        _run_forked(tasks, list(range(len(tasks))), jobs, record, run=function)


def _run_forked(tasks, order, jobs, record, run=None):
    """Run ``tasks`` in ``order`` here and on ``jobs - 1`` processes forked from here.

    Every process takes the next task from one shared counter, so the long tasks
    (first in ``order``) spread and no process idles while another has several
    left. This process works too: it holds the presets and cost models the forked
    ones inherit, and it spares a worker's start and the round trips of a pool
    (whose workers wait between tasks for the next to be handed over). The forked
    processes send each task's rows as they finish; they are recorded between this
    process's own tasks. A forked process that fails raises here.
    """
    import multiprocessing
    import pickle
    import queue
    run = run_task if run is None else run
    context = multiprocessing.get_context("fork")
    counter = context.Value("l", 0)
    finished = context.Queue()

    def take():
        with counter.get_lock():
            position = counter.value
            counter.value = position + 1
        return order[position] if position < len(order) else None

    def work(worker):   # in a forked process; its last message says it ended, and how
        try:
            while (index := take()) is not None:
                finished.put((index, run(tasks[index])))
        except BaseException as error:  # noqa: BLE001 - raised again in the parent
            try:
                pickle.dumps(error)
            except Exception:   # noqa: BLE001 - an error that cannot travel as it is
                error = RuntimeError(f"{type(error).__name__}: {error}")
            finished.put((None, (worker, error)))
        else:
            finished.put((None, (worker, None)))

    done = 0
    children = [context.Process(target=work, args=(worker,), daemon=True)
                for worker in range(jobs - 1)]
    ended = set()

    def receive(timeout):
        nonlocal done
        try:
            index, rows = finished.get(timeout=timeout)
        except queue.Empty:
            return False
        if index is None:
            worker, error = rows
            ended.add(worker)
            if error is not None:
                raise error
        else:
            done += 1
            record(index, rows, done)
        return True

    try:
        for child in children:
            child.start()
        while (index := take()) is not None:
            rows = run(tasks[index])
            done += 1
            record(index, rows, done)
            while receive(0):       # what the others finished meanwhile
                pass
        while len(ended) < len(children):
            gone = [worker for worker, child in enumerate(children)
                    if child.exitcode is not None and worker not in ended]
            # a process that exited has sent all it will: if its last message is not
            # in transit either, it died in the middle of a task
            if not receive(0.1) and gone and not receive(0.1):
                raise TabschedError(f"a sweep worker process died (exit status "
                                    f"{children[gone[0]].exitcode}); run with -j 1 to "
                                    f"see why")
    finally:
        for child in children:
            if child.is_alive():
                child.terminate()
            child.join()


def _run_dask(tasks, dask, jobs, record, run=None):
    run = run_task if run is None else run
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
        futures = client.map(run, tasks, pure=False)
        index_of = {future.key: index for index, future in enumerate(futures)}
        for done, future in enumerate(as_completed(futures), 1):
            record(index_of[future.key], future.result(), done)
    finally:
        for resource in owned:
            resource.close()


def _cell(value):
    kind = type(value)      # the common exact types first: a sweep writes many cells
    if kind is float:
        return repr(value)
    if kind is str:
        return value
    if kind is int:
        return str(value)
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else str(value)


class SweepResult(list):
    """The rows of a sweep, one dict per configuration, with ``to_dataframe()``.

    A row holds the configuration (``spec``, ``family``, ``params`` as a dict,
    ``devices``, ``microbatches``, ``model``, ``system``, ``global_batch``,
    ``microbatch_size``, ``slot_lengths``, ``parallel`` as a dict), ``status``
    (``ok`` or ``skipped``) with its ``reason``, and the metrics named after
    their level (:data:`COLUMNS`): seconds and bytes. :meth:`to_csv` gives the
    CSV ``tabsched sweep`` writes.
    """

    def __init__(self, rows=()):
        super().__init__(_typed_row(row) for row in rows)

    @property
    def ok(self):
        """The rows that were evaluated."""
        return [row for row in self if row["status"] == "ok"]

    def to_csv(self):
        return rows_to_csv(self)

    def to_dataframe(self):
        """A pandas DataFrame of the rows (:func:`tabsched.frames.sweep_frame`)."""
        from tabsched.frames import sweep_frame
        return sweep_frame(self)


def _typed_row(row):
    """The dict columns parsed; a skipped row's empty ``params`` (no table was built)
    becomes None, which the CSV writes back as the empty cell it was."""
    row = dict(row)
    for column, empty in (("params", None), ("parallel", {})):
        if isinstance(row.get(column), str):
            row[column] = json.loads(row[column]) if row[column] else empty
    return row


def sweep(families: Sequence[str], devices: Sequence[int], microbatches: Sequence[int], *,
          models: Sequence[str] = ("paper-128l",), systems: Sequence[str] = SYSTEM_GRID,
          global_batch: int | None = None, recompute: str | None = None,
          contention: str | None = None, lengths: object = None, parallel: dict | None = None,
          execution: Execution | None = None, jobs: int = 1, dask: object = None,
          progress: Callable[[int, int, int], None] | None = None) -> SweepResult:
    """Evaluate a grid of configurations: every family x devices x microbatches x model x system.

    The Python face of ``tabsched sweep``: the same rows, evaluated the same way
    (a table is generated and lowered once per family, devices, microbatches and
    model; its systems run as samples of one kernel call), serially, on ``jobs``
    processes or on Dask. Invalid combinations come back as rows with
    ``status="skipped"`` and a ``reason``.

    Parameters
    ----------
    families : list of str
        Family specs (``"gpipe"``, ``"hanayo:waves=2"``).
    devices, microbatches : list of int
    models, systems : list of str
        Presets or TOML files (default ``paper-128l`` on the tabular paper's 3x3 grid).
    global_batch : int, optional
        Samples per iteration: a microbatch holds ``global_batch / M``.
    recompute, contention : str, optional
    lengths : (F, B, I, W) or dict, optional
        Slot lengths of the table level.
    parallel : dict, optional
        ``tensor_parallel``, ``data_parallel``... for every configuration.
    execution : Execution, optional
        The execution every configuration starts from (see :func:`grid_tasks`).
    jobs : int
    dask : str or distributed.Client, optional
    progress : callable, optional
        ``progress(tables_done, tables_total, configurations_done)``.

    Returns
    -------
    SweepResult

    Examples
    --------
    >>> rows = sweep(["gpipe", "1f1b"], [4], [8, 16], systems=["mid_nw_mid_cp"])
    >>> [(row["spec"], row["microbatches"], round(row["table_bubble_ratio"], 3)) for row in rows]
    [('gpipe', 8, 0.273), ('gpipe', 16, 0.158), ('1f1b', 8, 0.273), ('1f1b', 16, 0.158)]
    >>> rows[0]["params"]
    {'devices': 4, 'microbatches': 8}
    """
    tasks = grid_tasks(families, devices, microbatches, models=tuple(models),
                       systems=tuple(systems), global_batch=global_batch, recompute=recompute,
                       contention=contention, lengths=lengths, parallel=parallel,
                       execution=execution)
    return SweepResult(run_sweep(tasks, jobs=jobs, dask=dask, progress=progress))


def rows_to_csv(rows):
    """CSV text (header + one line per row); floats keep every digit."""
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(COLUMNS)
    dicts = [k for k, column in enumerate(COLUMNS) if column in ("params", "parallel")]
    for row in rows:
        values = [row.get(column) for column in COLUMNS]
        for k in dicts:
            values[k] = _as_text(COLUMNS[k], values[k])
        writer.writerow([_cell(value) for value in values])
    return buffer.getvalue()


def _as_text(column, value):
    """A typed row's dict columns back in the CSV's JSON form."""
    if column in ("params", "parallel") and isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    return value


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
    text = read_text(source, expected="not a sweep CSV", error=InvalidParameterError, nul=True)
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
