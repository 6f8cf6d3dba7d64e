"""pandas DataFrames of tabsched's results, for notebooks.

pandas is optional (the ``notebook`` extra: ``pip install 'tabsched[notebook]'``);
importing tabsched never imports it. Every result type has a ``to_dataframe()``
that calls one function here:

============================  =======================================================
``Result``                    a row per device (``ops=True``: a row per operation)
``MonteCarloResult``          a row per device (``samples=True``: a row per sample)
``AdaptResult``               a row per table: baseline, adapted and the references
``compare(...)`` rows         a row per family, a column per level's number and rank
sweep rows                    a row per configuration, the CSV's columns with types
``PlanResult``                a row per ranked configuration (``plan(...)``)
============================  =======================================================

Times are in the result's ``time_unit`` and memory in its ``memory_unit``; both
are in ``DataFrame.attrs`` as well as in the docstrings, so plots can label axes.
"""

import json

from tabsched._extras import require

__all__ = ["result_frame", "monte_carlo_frame", "adapt_frame", "compare_frame", "sweep_frame",
           "plan_frame"]


def _pandas():
    return require("pandas", "notebook", "to_dataframe()")


def _frame(rows, columns, **attrs):
    frame = _pandas().DataFrame(rows, columns=columns)
    frame.attrs.update({key: value for key, value in attrs.items() if value is not None})
    return frame


def result_frame(result, *, ops=False):
    """A :class:`~tabsched.evaluate.Result` as a DataFrame.

    Per device: ``device, busy, idle, warmup, inside, cooldown, peak_memory,
    persistent_memory, peak_total_memory``. With ``ops=True``, per operation in the
    table's order: ``device, slot, op, kind, stage, microbatch, start, end, duration,
    critical`` (on the critical path). The attributes carry the totals (``makespan``,
    ``steady_period``, ``bubble_ratio``...).
    """
    attrs = {"level": result.level, "time_unit": result.time_unit,
             "memory_unit": result.memory_unit, "makespan": result.makespan,
             "steady_period": result.steady_period,
             "bubble_ratio": result.bubble_ratio, "family": result.table.family}
    if not ops:
        columns = ["device", "busy", "idle", "warmup", "inside", "cooldown", "peak_memory",
                   "persistent_memory", "peak_total_memory"]
        rows = [[d.device, d.busy, d.idle, d.warmup, d.inside, d.cooldown, d.peak_memory,
                 d.persistent_memory, d.peak_total_memory] for d in result.devices]
        return _frame(rows, columns, **attrs)
    table = result.table
    critical = set(_critical_ops(result))
    start, end = result.op_start, result.op_end
    columns = ["device", "slot", "op", "kind", "stage", "microbatch", "start", "end",
               "duration", "critical"]
    rows = [[int(table.device[k]), int(table.slot[k]), str(table.op(k)),
             table.kind_letter(k), int(table.stage[k]), int(table.microbatch[k]),
             float(start[k]), float(end[k]), float(end[k] - start[k]), k in critical]
            for k in range(len(table))]
    return _frame(rows, columns, **attrs)


def _critical_ops(result):
    """Indices of the table's operations on the critical path."""
    table = result.table
    wanted = {(step.label, step.device) for step in result.critical_path if step.kind == "op"}
    return [k for k in range(len(table))
            if (table.cell_text(k), int(table.device[k])) in wanted
            or (str(table.op(k)), int(table.device[k])) in wanted]


def monte_carlo_frame(runs, *, samples=False):
    """A :class:`~tabsched.adapt.MonteCarloResult` as a DataFrame.

    Per device: ``device, mean_busy, mean_idle, nominal_idle, runtime_bubble,
    mean_finish``. With ``samples=True``, per sample: ``sample, makespan``.
    """
    attrs = {"time_unit": runs.time_unit, "samples": runs.samples, "seed": runs.seed,
             "mean": runs.mean, "p95": runs.p95, "runtime_bubble": runs.runtime_bubble,
             "nominal_makespan": runs.nominal_makespan}
    if samples:
        return _frame([[k, float(value)] for k, value in enumerate(runs.makespans)],
                      ["sample", "makespan"], **attrs)
    columns = ["device", "mean_busy", "mean_idle", "nominal_idle", "runtime_bubble",
               "mean_finish"]
    rows = [[d.device, d.mean_busy, d.mean_idle, d.nominal_idle, d.runtime_bubble,
             d.mean_finish] for d in runs.devices]
    return _frame(rows, columns, **attrs)


def adapt_frame(found):
    """An :class:`~tabsched.adapt.AdaptResult` as a DataFrame: a row per table.

    ``role`` is ``baseline``, ``adapted`` or ``reference``; ``gain`` is
    ``1 - adapted / row`` of the search's objective (empty on the adapted row).
    """
    columns = ["table", "role", "mean", "p50", "p95", "max", "nominal", "runtime_bubble",
               "peak_memory", "fits", "gain", "transforms"]
    reports = [("baseline", found.baseline), ("adapted", found.adapted)]
    reports += [("reference", report) for report in found.references.values()
                if report is not None]
    rows = [[report.name, role, report.mean, report.p50, report.p95, report.max,
             report.nominal, report.runtime_bubble, max(report.peak_memory),
             bool(report.feasible), None if report is found.adapted else found.gain(report),
             len(report.transforms)] for role, report in reports]
    return _frame(rows, columns, time_unit=found.time_unit, memory_unit=found.memory_unit,
                  objective=found.objective, budget=found.budget)


def compare_frame(rows):
    """Rows of :func:`tabsched.compare.compare` as a DataFrame: a row per family.

    Columns: ``label, family, formula_bubble_ratio, formula_rank, table_bubble_ratio,
    table_slots, table_rank, simulation_makespan, simulation_bubble_ratio,
    simulation_peak_memory, simulation_rank, disagrees, error``, then how the fullest
    device stands against its memory (``simulation_fits``,
    ``simulation_over_capacity``) and the throughput (``simulation_tokens_per_s``,
    ``simulation_tokens_per_s_per_gpu``, ``simulation_model_tflops_per_gpu``,
    ``simulation_mfu``, ``simulation_hfu``; empty under slot lengths).
    """
    speeds = ("tokens_per_s", "tokens_per_s_per_gpu", "model_tflops_per_gpu", "mfu", "hfu")
    columns = ["label", "family", "formula_bubble_ratio", "formula_rank",
               "table_bubble_ratio", "table_slots", "table_rank", "simulation_makespan",
               "simulation_bubble_ratio", "simulation_peak_memory", "simulation_rank",
               "disagrees", "error", "simulation_fits", "simulation_over_capacity"] + [
                   f"simulation_{name}" for name in speeds]
    records = []
    units = {}
    for row in rows:
        formula, table, simulation = row.formula or {}, row.table or {}, row.simulation or {}
        if simulation:
            units = {"time_unit": simulation.get("time_unit"),
                     "memory_unit": simulation.get("memory_unit")}
        peaks = simulation.get("peak_memory")
        run = simulation.get("throughput") or {}
        records.append([
            row.label, row.family, formula.get("bubble_ratio"), row.ranks.get("formula"),
            table.get("bubble_ratio"), table.get("slots"), row.ranks.get("table"),
            simulation.get("makespan"), simulation.get("bubble_ratio"),
            max(peaks) if peaks else None, row.ranks.get("simulation"),
            bool(row.disagrees) if not row.error else None, row.error,
            simulation.get("fits"), simulation.get("over_capacity")]
            + [run.get(name) for name in speeds])
    return _frame(records, columns, **units)


def sweep_frame(rows):
    """Sweep rows as a DataFrame: the CSV's columns, ``params`` as a dict, numbers typed."""
    if not rows:
        return _pandas().DataFrame()
    columns = list(rows[0])
    records = []
    for row in rows:
        record = dict(row)
        if isinstance(record.get("params"), str):     # empty for a skipped row
            record["params"] = json.loads(record["params"]) if record["params"] else None
        records.append([record.get(column) for column in columns])
    return _frame(records, columns, time_unit="s", memory_unit="bytes")


def plan_frame(result):
    """A :class:`~tabsched.plan.PlanResult` as a DataFrame: a row per ranked
    configuration, the plan CSV's columns (``params`` as a dict, numbers typed), times
    in seconds and memory in bytes."""
    columns = list(result.columns)
    records = []
    for row in result.rows:
        values = row.row()
        values["params"] = row.params
        records.append([values[column] for column in columns])
    return _frame(records, columns, time_unit="s", memory_unit="bytes",
                  model=result.model, system=result.system, gpus=result.gpus,
                  global_batch=result.global_batch, memory_budget=result.memory_budget,
                  tie_band=result.tie_band)
