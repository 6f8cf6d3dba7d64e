"""Sweeps: a grid of configurations into a tidy table, on local processes or Dask.

:func:`sweep` (``tabsched.sweeps``) is the public entry point; it returns a
:class:`SweepResult`, rows with ``to_dataframe()`` and ``to_csv()``.

A configuration is (family spec, devices, microbatches, model, the execution's
axes -- tensor degree, data degree, microbatch size, recompute --, system). One
*task* covers every system for one of the rest: the table is generated and
lowered once and all systems are evaluated as the samples of one kernel call
(:func:`tabsched.evaluate.evaluate_summaries`). Tasks are independent, so they
run serially, on ``jobs`` local processes, or on a Dask cluster; rows always come
back in task order, so the CSV is byte-identical whichever way it ran. A global
batch counts every data-parallel replica's samples (Megatron-LM's meaning).

Each row holds the configuration, ``status`` (``ok`` or ``skipped``, with the
``reason``), and one column per metric named after its level: ``formula_*``,
``table_*`` and ``simulation_*`` (seconds and bytes). The formula and table
levels run with the task's slot lengths (``slot_lengths``, default F=1 B=2 I=1
W=1), as :func:`tabsched.compare.compare` gives them; the simulation
with its parallelism (``parallel``, the non-default ModelCosts settings as JSON,
and a column per field of the execution it ran, :data:`EXECUTION_COLUMNS`), the
device's memory (``memory_capacity_bytes``, ``simulation_fits``,
``simulation_over_capacity_bytes``) and the throughput (``gpus``,
:data:`THROUGHPUT_COLUMNS`). A cost-driven family (``zb-auto``) gets one table
per system, built for that system's costs, and its table level from the table it
builds for the slot lengths.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
import numbers
import operator
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tabsched._untrusted import shown_value
from tabsched._memo import memo
from tabsched.compare import (describe_lengths, generate_spec, grad_sync_for,
                              model_costs_for, parse_spec, slot_lengths, table_level_with)
from tabsched.costs import UnitCosts
from tabsched.evaluate import evaluate_summaries
from tabsched.exceptions import InvalidParameterError, TabschedError
from tabsched.execution import FIELDS, RECOMPUTE_MODES, Execution
from tabsched.formulas import formula_for
from tabsched.schedules import get_family
from tabsched.costs.transformer import load_model
from tabsched.costs.system import load_system
from tabsched.files import read_text
from tabsched.parallel import run_parallel
from tabsched.table import cut, shown
from tabsched.throughput import iteration_work, throughput

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

__all__ = ["sweep", "SweepResult", "SweepTask", "grid_tasks", "run_task", "run_sweep", "COLUMNS",
           "SYSTEM_GRID", "rows_to_csv", "read_sweep_csv", "row_execution", "EXECUTION_COLUMNS"]

#: The tabular paper's 3x3 grid of systems: network (rows) x compute (columns).
SYSTEM_GRID = tuple(f"{network}_nw_{compute}_cp" for network in ("slow", "mid", "fast")
                    for compute in ("slow", "mid", "fast"))

#: The execution's fields as columns of their own (``global_batch`` and ``microbatch_size``
#: are among the configuration's columns already).
EXECUTION_COLUMNS = tuple(name for name in FIELDS
                          if name not in ("global_batch", "microbatch_size"))
#: Execution fields added after the columns' order was set: they go at the end.
_LATER_FIELDS = ("p2p", "post_validation", "reshard_after_forward", "prefetch")
#: Execution fields added after the steady-state period's column: they follow it.
_LAST_FIELDS = ("grad_bucket_size", "align_grad_reduce", "fp8", "cp_comm", "max_connections")

#: What a simulated iteration did against the device's memory and how fast it ran.
THROUGHPUT_COLUMNS = ("simulation_tokens_per_s", "simulation_tokens_per_s_per_gpu",
                      "simulation_model_tflops_per_gpu", "simulation_hardware_tflops_per_gpu",
                      "simulation_mfu", "simulation_hfu")

# New columns follow the older ones, whose positions stay as they were.
COLUMNS = (
    "spec", "family", "params", "devices", "microbatches", "model", "system", "global_batch",
    "microbatch_size", "status", "reason",
    "formula_bubble_ratio", "formula_exact", "formula_peak_activation",
    "table_bubble_ratio", "table_slots",
    "simulation_makespan_s", "simulation_bubble_ratio",
    "simulation_peak_activation_bytes", "simulation_min_peak_activation_bytes",
    "simulation_peak_memory_bytes", "simulation_min_peak_memory_bytes",
    "simulation_peak_memory_device", "slot_lengths", "parallel",
) + tuple(name for name in EXECUTION_COLUMNS
        if name not in _LATER_FIELDS + _LAST_FIELDS) + (
    "gpus", "memory_capacity_bytes", "simulation_fits", "simulation_over_capacity_bytes",
) + THROUGHPUT_COLUMNS + _LATER_FIELDS + (
    # the steady-state period of iterations run back to back (tabsched.steady); the
    # throughput columns stay per the makespan
    "simulation_steady_period_s",
) + _LAST_FIELDS

#: The grid's axes of the execution: each takes a list of values (one value: a list of one).
EXECUTION_AXES = ("tensor_parallel", "data_parallel", "microbatch_size", "recompute")


@dataclass(frozen=True)
class SweepTask:
    """Every system of one (spec, devices, microbatches, model, execution); picklable.

    ``microbatches`` is None, and ``reason`` says why, when a global batch does not
    split into the task's microbatch size on each replica.
    """

    spec: str
    devices: int
    microbatches: int | None
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
    microbatch_size: int | None = None
    reason: str | None = None

    @property
    def configurations(self):
        return len(self.systems)


def grid_tasks(specs, devices, microbatches=None, *, models=("paper-128l",),
               systems=SYSTEM_GRID, global_batch=None, microbatch_size=None, recompute=None,
               tensor_parallel=None, data_parallel=None, contention=None,
               grad_sync="replicas", lengths=None, parallel=None, execution=None):
    """The tasks of a full grid (specs x devices x microbatches x models x the execution's
    axes: tensor degree, data degree, microbatch size, recompute).

    ``global_batch`` counts the samples of an iteration over all data-parallel
    replicas (Megatron-LM's ``--global-batch-size``; default the execution's): with
    ``microbatches``, each replica's microbatch holds ``global_batch / (d * M)``
    samples; without them, each replica runs ``M = global_batch / (d * b)``
    microbatches of the ``microbatch_size`` ``b``. A configuration whose numbers are
    not whole is a skipped row, with the reason. ``tensor_parallel``,
    ``data_parallel``, ``microbatch_size`` and ``recompute`` take a value or a list of
    values (every combination is a configuration); ``lengths``: the table level's slot
    lengths ``(F, B, I, W)``; ``parallel``: ModelCosts' other parallelism keywords
    (``sequence_parallel=True``...) for every task; ``execution``: the
    :class:`~tabsched.execution.Execution` they change.
    """
    if execution is not None and not isinstance(execution, Execution):
        raise InvalidParameterError(f"execution must be an Execution, not "
                                    f"{type(execution).__name__}")
    base = Execution() if execution is None else execution
    devices = _integers("devices", devices)
    if microbatches is not None:
        microbatches = _integers("microbatches", microbatches)
    if global_batch is not None:
        (global_batch,) = _integers("global_batch", (global_batch,), one=True)
    lengths = slot_lengths(lengths)
    parallel = dict(parallel or {})
    axes = {}
    for name, values in (("tensor_parallel", tensor_parallel),
                         ("data_parallel", data_parallel)):
        if values is not None and parallel.get(name) is not None:
            raise InvalidParameterError(f"sweep: {name} is given twice (as a keyword and in "
                                        f"parallel)")
        axes[name] = _axis(name, parallel.pop(name, None) if values is None else values)
    axes["microbatch_size"] = _axis("microbatch_size", microbatch_size)
    axes["recompute"] = _axis("recompute", recompute)
    parallel = tuple(sorted(parallel.items()))
    specs = [parse_spec(spec).label for spec in specs]   # fail early on a bad spec
    batch = base.global_batch if global_batch is None else global_batch
    if microbatches is None:
        if batch is None or (microbatch_size is None and base.microbatch_size is None):
            raise InvalidParameterError(
                "sweep: give microbatches, or a global batch and a microbatch size (each "
                "replica then runs global batch / (data_parallel x microbatch size))")
    elif batch is not None and microbatch_size is not None:
        raise InvalidParameterError(
            f"sweep: give two of microbatches, microbatch_size and global_batch {batch}: "
            f"the third follows (global batch = data_parallel x microbatches x microbatch "
            f"size)")
    for name, values in (("models", models), ("systems", systems)):
        if not values:
            raise InvalidParameterError(f"sweep: {name} is empty")
    # a misspelt model or system is a mistake, not a configuration to skip
    for model in models:
        load_model(model)
    for system in systems:
        load_system(system)
    tasks = []
    for spec, p, m, model, t, d, size, mode in itertools.product(
            specs, devices, (None,) if microbatches is None else microbatches, models,
            *(axes[name] for name in EXECUTION_AXES)):
        reason = None
        if m is None:       # the global batch and the microbatch size give them
            size = size or base.microbatch_size
            m, reason = _microbatches(batch, d or base.data_parallel, size)
        task_parallel = parallel + tuple((name, value) for name, value in
                                         (("tensor_parallel", t), ("data_parallel", d))
                                         if value is not None)
        tasks.append(SweepTask(spec, int(p), None if m is None else int(m), str(model),
                               tuple(str(s) for s in systems), global_batch, mode,
                               contention, grad_sync, lengths,
                               tuple(sorted(task_parallel)), execution, size, reason))
    return tasks


def _listed(name, values):
    """``values`` as a tuple: one text or number stands for a list of one; anything else
    that is not a list (None, an object) is refused naming ``name``."""
    if isinstance(values, (str, numbers.Number)):
        return (values,)
    if isinstance(values, (bytes, dict)) or not hasattr(values, "__iter__"):
        raise InvalidParameterError(f"sweep: {name} must be a list, not {shown_value(values)}")
    return tuple(values)


def _integers(name, values, one=False):
    """``values`` (one or a list) as a tuple of integers >= 1, refusing the rest by name:
    4.5 microbatches are not 4 (a float or a text is never rounded or parsed here)."""
    values = _listed(name, values)
    if not values:
        raise InvalidParameterError(f"sweep: {name} is empty")
    for value in values:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise InvalidParameterError(f"sweep: {name} must be "
                                        f"{'an integer' if one else 'integers'} >= 1, not "
                                        f"{shown_value(value)}")
    return tuple(int(value) for value in values)


def _axis(name, values):
    """The values of one of the execution's axes: ``(None,)`` when not given."""
    if values is None:
        return (None,)
    values = _listed(name, values)
    if not values:
        raise InvalidParameterError(f"sweep: {name} is empty")
    for value in values:
        if name == "recompute":
            if value not in RECOMPUTE_MODES:
                raise InvalidParameterError(f"sweep: recompute {shown_value(value)} is not one "
                                            f"of {', '.join(RECOMPUTE_MODES)}")
        else:
            _integers(name, (value,))
    return values


def _microbatches(global_batch, data_parallel, microbatch_size):
    """``(M, None)``: the microbatches each replica runs, or ``(None, reason)``."""
    per_step = data_parallel * microbatch_size
    if global_batch % per_step:
        return None, (f"global batch {global_batch} does not split into microbatches of "
                      f"{microbatch_size} samples" +
                      (f" on each of {data_parallel} data-parallel replicas"
                       if data_parallel > 1 else ""))
    return global_batch // per_step, None


def _base_rows(task):
    """A row per system of ``task``, with what the task alone decides."""
    base = dict.fromkeys(COLUMNS)
    base.update({"spec": task.spec, "family": parse_spec(task.spec).family, "params": "",
                 "devices": task.devices, "microbatches": task.microbatches,
                 "model": task.model, "global_batch": task.global_batch,
                 "microbatch_size": task.microbatch_size,
                 "status": "ok" if task.reason is None else "skipped",
                 "reason": task.reason or "",
                 "slot_lengths": describe_lengths(task.lengths),
                 "parallel": json.dumps(_parallel_column(task), sort_keys=True)})
    return [{**base, "system": system,
             "memory_capacity_bytes": _load_system(system).memory_capacity}
            for system in task.systems]


def _asked_columns(task, rows):
    """A skipped row's execution columns and GPUs: what it asked for (an evaluated row's
    are its cost model's)."""
    for row in rows:
        if row["status"] == "ok":
            continue
        asked = _asked_execution(task, row["system"])
        if asked is not None:
            row.update(_execution_columns(asked))
            row["gpus"] = asked.ranks_per_stage * task.devices
        batch = task.global_batch or (task.execution and task.execution.global_batch)
        row["global_batch"] = batch or row["global_batch"]
    return rows


def _parallel_column(task):
    """The ``parallel`` column: the options given, over the fields the execution sets."""
    given = dict(task.parallel)
    if task.execution is None:
        return given
    default = Execution().to_dict()
    own = {key: value for key, value in task.execution.to_dict().items()
           if value != default[key]}
    return {**own, **given}


#: ModelCosts keywords a sweep's ``parallel`` holds that are not fields by the same name.
_KEYWORD_FIELDS = {"optimizer_sharding": "zero_stage"}


def _asked_execution(task, system):
    """What ``task`` asks of ``system``, resolved against the model and the system (not
    checked: a row the cost model refuses still says what it asked), or None if the
    fields contradict each other."""
    changes = {_KEYWORD_FIELDS.get(key, key): int(value) if key == "optimizer_sharding"
               else value for key, value in task.parallel}
    for key, value in (("recompute", task.recompute), ("contention", task.contention),
                       ("global_batch", task.global_batch),
                       ("microbatch_size", task.microbatch_size)):
        if value is not None:
            changes[key] = value
    changes.setdefault("grad_sync", task.grad_sync if (task.execution is None or
                                                       task.execution.grad_sync is None)
                       else task.execution.grad_sync)
    base = task.execution or Execution()
    try:
        try:
            asked = base.replace(**changes)
        except TabschedError:       # a global batch the microbatches do not split
            asked = base.replace(**{**changes, "global_batch": None})
        resolved = asked.resolved(_load_model(task.model), _load_system(system))
        if task.microbatch_size is None and (task.global_batch or base.global_batch):
            # the global batch over the microbatches would have given it, but did not
            resolved = resolved.replace(microbatch_size=None)
        return resolved
    except TabschedError:
        return None


@memo(limit=1024)
def _execution_columns(execution):
    """The execution's columns of a row: every field (a tuple of stages as ``0,3``)."""
    columns = {}
    for name in ("global_batch", "microbatch_size") + EXECUTION_COLUMNS:
        value = getattr(execution, name)
        columns[name] = ",".join(map(str, value)) if isinstance(value, tuple) else value
    return columns


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
                 parallel=(), execution=None, microbatch_size=None):
    """The cost model of one configuration, built once per process (presets parsed once)."""
    return model_costs_for(_load_model(model), _load_system(system), microbatches,
                           global_batch=global_batch, microbatch_size=microbatch_size,
                           recompute=recompute, contention=contention, grad_sync=grad_sync,
                           execution=execution, **dict(parallel))


def _task_costs(task, system):
    """The cost model of ``task`` on ``system`` (see :func:`_model_costs`)."""
    return _model_costs(task.model, system, task.microbatches, task.global_batch,
                        task.recompute, task.contention, _hashable(task.grad_sync),
                        tuple(task.parallel), task.execution, task.microbatch_size)


def _warm(tasks):
    """Build every cost model ``tasks`` use, here, before worker processes fork."""
    for task in tasks:
        if task.reason is not None:
            continue
        for system in task.systems:
            try:
                _task_costs(task, system)
            except TabschedError:
                pass        # the task reports it as a skipped row


def run_task(task):
    """Rows (dicts keyed by COLUMNS) for every system of ``task``."""
    rows = _base_rows(task)
    if task.reason is not None:
        return _asked_columns(task, rows)
    spec = parse_spec(task.spec)

    def skip(reason, which=None):
        for row in rows if which is None else which:
            row["status"], row["reason"] = "skipped", reason
        return _asked_columns(task, rows)

    costs, live = [], []
    for row, system in zip(rows, task.systems):
        try:
            system_costs = _task_costs(task, system)
            # an override of a device this run lacks skips this system's row, not all of them
            system_costs.placement.check_devices(task.devices)
            costs.append(system_costs)
            live.append(row)
            row.update(_execution_columns(system_costs.execution))
        except TabschedError as error:
            skip(str(error), [row])
    if not costs:
        return _asked_columns(task, rows)
    layers = costs[0].model.layers
    try:
        sync = grad_sync_for(costs[0], task.grad_sync)   # overlapped DP: every stage
        unit = UnitCosts(*task.lengths)
        if get_family(spec.family).cost_driven:
            # one table per system, built for its costs; the table level for the slot lengths
            tables = [generate_spec(spec, task.devices, task.microbatches, layers, system)
                      for system in costs]
            results = [evaluate_summaries(table, [system], grad_sync=sync, steady=True,
                                          formula=False)[0]
                       for table, system in zip(tables, costs)]
            unit_table = generate_spec(spec, task.devices, task.microbatches, layers, unit)
        else:
            unit_table = table = generate_spec(spec, task.devices, task.microbatches, layers)
            tables = [table] * len(costs)
            results = evaluate_summaries(table, costs, grad_sync=sync, steady=True,
                                         formula=False)
        level = table_level_with(unit_table, task.lengths)
        # the formula level beside the table level, at its slot lengths, as compare gives it
        formula = formula_for(unit_table, unit) or {}
    except TabschedError as error:
        return skip(str(error), live)
    described = {}      # the params of each table, written once for all its rows
    works = {}          # and its work, once per model and execution shape
    for row, table, result, system_costs in zip(live, tables, results, costs):
        params = described.get(id(table))
        if params is None:
            params = described[id(table)] = json.dumps(table.params, sort_keys=True)
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
            "simulation_steady_period_s": result.steady_period,
            "simulation_bubble_ratio": result.bubble_ratio,
            "simulation_peak_activation_bytes": max(activation),
            "simulation_min_peak_activation_bytes": min(activation),
            "simulation_peak_memory_bytes": max(total),
            "simulation_min_peak_memory_bytes": min(total),
            "simulation_peak_memory_device": int(max(range(len(total)), key=total.__getitem__)),
            "simulation_fits": result.fits if result.memory_capacity is not None else None,
            "simulation_over_capacity_bytes": result.over_capacity,
        })
        run = system_costs.execution
        key = (id(table), system_costs.model, run.data_parallel, run.ranks_per_stage)
        work = works.get(key)
        if work is None:
            work = works[key] = iteration_work(system_costs, table)
        run = throughput(system_costs, table, result.makespan, work=work)
        row.update({"gpus": run.gpus, "simulation_tokens_per_s": run.tokens_per_s,
                    "simulation_tokens_per_s_per_gpu": run.tokens_per_s_per_gpu,
                    "simulation_model_tflops_per_gpu": run.model_flops_per_gpu / 1e12,
                    "simulation_hardware_tflops_per_gpu": run.hardware_flops_per_gpu / 1e12,
                    "simulation_mfu": run.mfu, "simulation_hfu": run.hfu})
    return _asked_columns(task, rows) if len(live) < len(rows) else rows


#: A sweep task's fixed work in operations' worth: its presets, cost models, table and
#: rows cost about 3.9 ms whatever its size, against about 0.6 us per operation and
#: system (a least-squares fit over the 288 tasks of the 2,592-configuration grid of
#: ``bench/bench_limits.py``, on this project's machine). Only ratios matter: it sets
#: where the work is cut into batches and whether it runs serially.
TASK_OPERATIONS = 6500


def task_weight(task):
    """A task's work in operations' worth (see :data:`TASK_OPERATIONS`)."""
    return TASK_OPERATIONS + task.devices * (task.microbatches or 0) * len(task.systems)


def run_sweep(tasks, *, jobs=1, dask=None, executor=None, progress=None):
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
    executor : concurrent.futures.Executor, optional
        Any executor (a process pool, loky's, mpi4py's ...) instead of Dask.
    progress : callable, optional
        Called as ``progress(tasks_done, tasks_total, configurations_done)``.

    With ``jobs > 1``, Dask or an executor, the smallest tasks run here first to
    price the work; a grid too small to gain from other processes runs here to the
    end, and the rest goes out in batches (:func:`tabsched.parallel.run_parallel`).
    """
    tasks = list(tasks)
    results = [None] * len(tasks)
    done_configs = 0

    def record(index, rows, done):
        nonlocal done_configs
        results[index] = rows
        done_configs += len(rows)
        if progress is not None:
            progress(done, len(tasks), done_configs)

    # the largest tables first (operations grow with devices x microbatches), so that
    # no worker starts a long task when the others are nearly done; forked workers
    # inherit the parsed presets and built cost models
    largest_first = sorted(range(len(tasks)),
                           key=lambda index: -tasks[index].devices
                           * (tasks[index].microbatches or 0))
    run_parallel(run_task, tasks, jobs=jobs, dask=dask, executor=executor, record=record,
                 order=largest_first, warm=lambda: _warm(tasks), weight=task_weight)
    return [row for rows in results for row in rows]


def _cell(value):
    """A value as its CSV cell: empty for None, ``true``/``false``, else its text (a float
    with every digit). :func:`rows_to_csv` writes the same, letting the csv writer turn
    all but the booleans into text."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class SweepResult(list):
    """The rows of a sweep, one dict per configuration, with ``to_dataframe()``.

    A row holds the configuration (``spec``, ``family``, ``params`` as a dict,
    ``devices``, ``microbatches``, ``model``, ``system``, ``global_batch``,
    ``microbatch_size``, ``slot_lengths``, ``parallel`` as a dict, every other field
    of the execution, ``gpus``, ``memory_capacity_bytes``), ``status`` (``ok`` or
    ``skipped``) with its ``reason``, and the metrics named after their level
    (:data:`COLUMNS`): seconds and bytes, whether the devices fit their memory and
    the throughput. :meth:`to_csv` gives the CSV ``tabsched sweep`` writes;
    :func:`row_execution` a row's execution.
    """

    def __init__(self, rows=()):
        super().__init__(_typed_row(row) for row in rows)

    def __repr__(self):
        """One line: how many rows, over what, and the fastest configuration."""
        from tabsched.costs.units import format_quantity
        ok = self.ok

        def values(key):
            seen = []
            for row in self:
                if row.get(key) not in seen:
                    seen.append(row.get(key))
            text = ", ".join(str(value) for value in seen[:4])
            return text + (f" (+{len(seen) - 4})" if len(seen) > 4 else "")
        timed = [row for row in ok if row.get("simulation_makespan_s") is not None]
        best = min(timed, key=lambda row: row["simulation_makespan_s"], default=None)
        fastest = "" if best is None else (
            f"; fastest {best['spec']} p={best['devices']} m={best['microbatches']} on "
            f"{best['system']}: {format_quantity(best['simulation_makespan_s'], 's')}")
        if not self:
            return "<SweepResult: no rows>"
        return (f"<SweepResult {len(self)} rows ({len(ok)} ok, {len(self) - len(ok)} "
                f"skipped): {values('spec')}; devices {values('devices')}; microbatches "
                f"{values('microbatches')}; {values('model')} on {values('system')}{fastest}>")

    def _repr_html_(self):
        from tabsched._html import sweep_html
        return sweep_html(self)

    @property
    def ok(self):
        """The rows that were evaluated."""
        return [row for row in self if row["status"] == "ok"]

    def to_csv(self):
        """The rows as CSV text (the columns of ``tabsched sweep -o``)."""
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


def sweep(families: Sequence[str], devices: Sequence[int],
          microbatches: Sequence[int] | None = None, *,
          models: Sequence[str] = ("paper-128l",), systems: Sequence[str] = SYSTEM_GRID,
          global_batch: int | None = None, microbatch_size: object = None,
          recompute: object = None, tensor_parallel: object = None,
          data_parallel: object = None, contention: str | None = None,
          lengths: object = None, parallel: dict | None = None,
          execution: Execution | None = None, jobs: int = 1, dask: object = None,
          executor: object = None,
          progress: Callable[[int, int, int], None] | None = None) -> SweepResult:
    """Evaluate a grid of configurations: every family x devices x microbatches x model x
    execution (tensor degree, data degree, microbatch size, recompute) x system.

    The Python face of ``tabsched sweep``: the same rows, evaluated the same way
    (a table is generated and lowered once per family, devices, microbatches,
    model and execution; its systems run as samples of one kernel call), serially,
    on ``jobs`` processes, on Dask or on any ``concurrent.futures`` executor (grids too
    small to gain run here). Invalid combinations come back as rows with
    ``status="skipped"`` and a ``reason``.

    Parameters
    ----------
    families : list of str
        Family specs (``"gpipe"``, ``"hanayo:waves=2"``).
    devices : list of int
    microbatches : list of int, optional
        Microbatches per replica; default ``global_batch / (d x microbatch_size)``.
    models, systems : list of str
        Presets or TOML files (default ``paper-128l`` on the tabular paper's 3x3 grid).
    global_batch : int, optional
        Samples per iteration over all data-parallel replicas (Megatron-LM's
        ``--global-batch-size``): a microbatch holds ``global_batch / (d x M)``.
    microbatch_size, tensor_parallel, data_parallel : int or list of int, optional
    recompute : str or list of str, optional
        The execution's axes: every combination of their values is a configuration.
    contention : str, optional
    lengths : (F, B, I, W) or dict, optional
        Slot lengths of the table level.
    parallel : dict, optional
        ``sequence_parallel``, ``attention``... for every configuration.
    execution : Execution, optional
        The execution every configuration starts from (see :func:`grid_tasks`).
    jobs : int
    dask : str or distributed.Client, optional
    executor : concurrent.futures.Executor, optional
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
    >>> rows = sweep(["1f1b"], [8], models=["gpt3-175b"], systems=["dgx-a100"],
    ...              global_batch=64, microbatch_size=1, tensor_parallel=8,
    ...              data_parallel=[1, 2], recompute=["selective", "full"])
    >>> [(row["data_parallel"], row["microbatches"], row["recompute"], row["simulation_fits"])
    ...  for row in rows]
    [(1, 64, 'selective', True), (1, 64, 'full', True), (2, 32, 'selective', True), (2, 32, 'full', True)]
    """
    tasks = grid_tasks(_listed("families", families), devices, microbatches,
                       models=_listed("models", models), systems=_listed("systems", systems),
                       global_batch=global_batch,
                       microbatch_size=microbatch_size, recompute=recompute,
                       tensor_parallel=tensor_parallel, data_parallel=data_parallel,
                       contention=contention, lengths=lengths, parallel=parallel,
                       execution=execution)
    return SweepResult(run_sweep(tasks, jobs=jobs, dask=dask, executor=executor,
                                 progress=progress))


def rows_to_csv(rows):
    """CSV text (header + one line per row); floats keep every digit."""
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(COLUMNS)
    dicts = [k for k, column in enumerate(COLUMNS) if column in ("params", "parallel")]
    pick = operator.itemgetter(*COLUMNS)
    for row in rows:
        try:
            values = list(pick(row))
        except KeyError:        # a row read from an older CSV lacks the newer columns
            values = [row.get(column) for column in COLUMNS]
        for k in dicts:
            values[k] = _as_text(COLUMNS[k], values[k])
        # the csv writer writes None as an empty cell and every other value as its text,
        # as _cell does; only the booleans are spelt as JSON spells them
        writer.writerow(["true" if value is True else "false" if value is False else value
                         for value in values])
    return buffer.getvalue()


def _as_text(column, value):
    """A typed row's dict columns back in the CSV's JSON form."""
    if column in ("params", "parallel") and isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    return value


_INTEGER_COLUMNS = {"devices", "microbatches", "global_batch", "microbatch_size", "table_slots",
                    "simulation_peak_memory_device", "tensor_parallel", "context_parallel",
                    "expert_parallel", "data_parallel", "zero_stage", "devices_per_node",
                    "gpus", "prefetch", "grad_bucket_size", "max_connections"}
_TEXT_COLUMNS = {"spec", "family", "params", "model", "system", "status", "reason",
                 "slot_lengths", "parallel", "recompute", "attention", "contention",
                 "grad_sync", "p2p", "fp8", "cp_comm"}
#: Text columns whose empty value is None (an execution field left unset).
_UNSET_WHEN_EMPTY = {"fp8", "cp_comm"}


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
                    row[key] = value if key in _TEXT_COLUMNS and not (
                        key in _UNSET_WHEN_EMPTY and value == "") else None
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
                    # a sweep writes finite numbers, and every time, size, ratio, count
                    # and rate it writes is >= 0: anything else is not what a sweep
                    # wrote (a plot would draw it without a word)
                    if not math.isfinite(row[key]) or row[key] < 0:
                        raise InvalidParameterError(
                            f"{source}: line {line}, column {cut(key)}: {shown(value)} is "
                            f"not a finite number >= 0, as a sweep writes it")
            rows.append(row)
    except csv.Error as error:
        raise InvalidParameterError(f"{source}: line {reader.line_num}: not valid CSV: "
                                    f"{cut(error, 80)}") from None
    return rows


def row_execution(row):
    """The :class:`~tabsched.execution.Execution` a sweep row ran (or asked for), from
    its columns: a row of :func:`sweep`, or one :func:`read_sweep_csv` read back (a
    column a CSV written before the execution had columns lacks keeps the default).

    >>> rows = sweep(["1f1b"], [4], [8], systems=["mid_nw_mid_cp"], tensor_parallel=2)
    >>> row_execution(rows[0]).tensor_parallel, row_execution(rows[0]).contention
    (2, 'link')
    """
    fields = {}
    for name in ("global_batch", "microbatch_size") + EXECUTION_COLUMNS:
        value = row.get(name)
        if value is None or value == "":
            continue
        if name == "grad_sync" and value not in ("replicas", "all"):
            try:
                value = tuple(int(stage) for stage in str(value).split(","))
            except ValueError:
                raise InvalidParameterError(f"sweep row: grad_sync {shown_value(value)} is not "
                                            f"'replicas', 'all' or stages such as 0,3") from None
        fields[name] = value
    return Execution.from_dict(fields, "sweep row")
