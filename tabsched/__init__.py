"""tabsched: pipeline-parallel schedules as tables, evaluated at three levels.

A schedule is a table: one row per device, one column per time slot, each cell
an operation ``(kind, stage, microbatch)`` -- forward ``F``, full backward
``B``, input-grad ``I`` or weight-grad ``W`` of one microbatch on one model
chunk -- or idle. tabsched generates the tables of the known families, reads
and writes them (PyTorch's CSV, JSON), and evaluates them:

* the **formula** level: the closed forms the papers state (``formulas``);
* the **table** level: unit slot lengths, no communication (``UnitCosts``);
* the **simulation** level: real compute times and per-link transfers
  (``StageCosts``, or ``ModelCosts``: a transformer on a system, kernel by
  kernel, run as an ``Execution`` -- tensor, sequence and data parallelism,
  microbatch size, recompute, ZeRO, contention, the iteration's tail -- in
  seconds and bytes, from the presets in ``tabsched presets`` or your own TOML).

:func:`plan` searches the executions of a model on N GPUs (split, schedule family,
microbatch size, recompute, ZeRO) for the fastest that fits, pruned by proven bounds.

:mod:`tabsched.adapt` measures the run-time bubbles that varying durations
cause (Monte Carlo) and searches granularity transforms of a table for the
fastest one within a per-device memory budget.

The data flows one way: table -> :func:`lower` -> Cython kernel -> :class:`Result`.

>>> import tabsched
>>> table = tabsched.generate("1f1b", devices=4, microbatches=8)
>>> result = tabsched.evaluate(table, tabsched.UnitCosts(f=1, b=2))
>>> result.makespan, round(result.bubble_ratio, 3)
(33.0, 0.273)
"""

from typing import TYPE_CHECKING

try:
    # the engine imports the compiled kernel (built by the package build)
    from tabsched import engine  # noqa: F401
except ImportError as _error:  # pragma: no cover - exercised by hand on a raw checkout
    raise ImportError(
        "tabsched's Cython kernel (tabsched._kernel) is not built. From the source "
        "checkout run:  pip install -e .   (or: python setup.py build_ext --inplace). "
        f"Import error: {_error}") from None

from tabsched.costs import (CostModel, ModelCosts, Parallelism, StageCosts, System,
                            TransformerModel, UnitCosts, format_quantity, load_model, load_system,
                            model_presets, parse_quantity, system_presets)
from tabsched.evaluate import (DeviceStats, LinkStats, MemoryViolation, PathStep, Result,
                               Summary, evaluate, evaluate_summaries)
from tabsched.exceptions import (DeadlockError, InvalidParameterError, InvalidScheduleError,
                                 MemoryBudgetError, MissingDependencyError, OutputError,
                                 TabschedError, UnknownNameError)
from tabsched.execution import Execution, load_execution
from tabsched.formulas import formula_for
from tabsched.files import atomic_write
from tabsched.formats import read_table, write_table
from tabsched.formats.grid import render_grid
from tabsched.formats.table_csv import csv_loss, from_csv, to_csv
from tabsched.formats.table_json import from_json, to_json
from tabsched.lower import LoweredSchedule, lower
from tabsched.plan import PlanResult, PlanRow, plan
from tabsched.schedules import families, generate
from tabsched.table import Op, Overlap, ScheduleTable

# Imported when first used (module __getattr__ below), so that a command that needs
# none of them (``tabsched sweep``) does not pay for them at start-up. The names
# whose module shares them (``evaluate``, ``lower``, ``plan``) are imported above: importing the
# module would otherwise bind the package attribute to the module, not the function.
_LAZY = {
    "KinetoProfile": "tabsched.formats.kineto", "read_kineto": "tabsched.formats.kineto",
    "TorchSchedule": "tabsched.formats.pytorch_csv",
    "from_pytorch_csv": "tabsched.formats.pytorch_csv",
    "read_pytorch": "tabsched.formats.pytorch_csv",
    "write_pytorch": "tabsched.formats.pytorch_csv",
    "SweepResult": "tabsched.sweeps", "sweep": "tabsched.sweeps",
    "html_report": "tabsched.report",
}
if TYPE_CHECKING:  # what the lazy names are, for readers and type checkers
    from tabsched import adapt
    from tabsched.formats.kineto import KinetoProfile, read_kineto
    from tabsched.formats.pytorch_csv import (TorchSchedule, from_pytorch_csv, read_pytorch,
                                              write_pytorch)
    from tabsched.report import html_report
    from tabsched.sweeps import SweepResult, sweep


def __getattr__(name):
    """The lazy public names, ``adapt`` (run-time variation, transforms, search) and
    ``__version__``, imported on first use and then kept as ordinary attributes."""
    import importlib
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    elif name == "adapt":
        value = importlib.import_module("tabsched.adapt")
    elif name == "__version__":
        # one source for the version: the installed package's metadata (pyproject.toml)
        from importlib import metadata
        try:
            value = metadata.version("tabsched")
        except metadata.PackageNotFoundError:  # built in place, never installed
            value = "unknown"
    else:
        raise AttributeError(f"module 'tabsched' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__) | {"__version__"})


__all__ = [
    "ScheduleTable", "Op", "Overlap",
    "generate", "families",
    "read_table", "write_table", "from_csv", "to_csv", "from_json", "to_json", "render_grid",
    "csv_loss", "atomic_write",
    "CostModel", "UnitCosts", "StageCosts", "ModelCosts",
    "TransformerModel", "load_model", "model_presets", "System", "load_system",
    "system_presets", "Execution", "load_execution", "Parallelism", "parse_quantity",
    "format_quantity",
    "lower", "LoweredSchedule",
    "read_pytorch", "from_pytorch_csv", "write_pytorch", "TorchSchedule",
    "read_kineto", "KinetoProfile",
    "evaluate", "Result", "DeviceStats", "PathStep", "LinkStats", "MemoryViolation",
    "evaluate_summaries", "Summary", "formula_for",
    "sweep", "SweepResult", "plan", "PlanResult", "PlanRow",
    "adapt", "html_report",
    "TabschedError", "InvalidScheduleError", "DeadlockError", "MemoryBudgetError",
    "UnknownNameError", "InvalidParameterError", "MissingDependencyError", "OutputError",
]
