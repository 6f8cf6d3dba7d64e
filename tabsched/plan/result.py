"""What a plan found: :class:`PlanResult`, its ranked :class:`PlanRow` s and their exports.

A row is one simulated configuration that fits the memory budget: its execution (a
file ``tabsched eval --execution`` reads), the family and its parameters, the
table's size, the predicted iteration time (the makespan, by which rows rank) and the
steady-state period of iterations run back to back (:mod:`tabsched.steady`: the same
with the optimizer's global synchronization and equal steps, shorter where
post-validation lets iterations overlap), tokens/s and model FLOP/s per GPU, MFU
and HFU (:mod:`tabsched.throughput`: model FLOPs by Narayanan et al. 2021, eq. 3,
without recomputation; hardware FLOPs with it), the peak memory of each device
against the budget, the bubble ratio, the **exposed communication**, the
``tabsched eval`` command that reproduces the row, and the Megatron-LM arguments and
torchtitan settings where those frameworks run the schedule.

Exposed communication is ``1 - T_free / T``: ``T`` the iteration's predicted time,
``T_free`` the same table's, the same operations' compute, with every pipeline
transfer and every collective (tensor-parallel, data-parallel, the tied embedding's,
the receivers' gathers) priced as free. Free is a copy of the system whose every
link moves 1 PB/s (the largest bandwidth a system may state) with no latency and no
overrides: a gigabyte then takes a microsecond, under 1e-5 of these iterations. It
is the share of the iteration that waits on the network, whatever hides the rest.

Rows within ``tie_band`` of the best are **tied**: their ranking is within the
model's measured error (see :data:`tabsched.plan.search.TIE_BAND`), and the output
marks them instead of ranking them as if known.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field

from tabsched.costs.units import format_quantity

__all__ = ["PlanRow", "PlanResult", "Evaluated", "ROW_COLUMNS"]

#: The columns of a plan's CSV and DataFrame, in order.
ROW_COLUMNS = ("rank", "tied", "family", "params", "tensor_parallel", "pipeline_parallel",
               "data_parallel", "microbatch_size", "microbatches", "recompute",
               "sequence_parallel", "zero_stage", "stage_layers", "stages", "operations",
               "iteration_s", "lower_bound_s", "tokens_per_s_per_gpu", "model_tflops_per_gpu",
               "hardware_tflops_per_gpu", "mfu", "hfu", "peak_memory_bytes",
               "memory_budget_bytes", "bubble_ratio", "exposed_communication",
               "eval_command", "megatron", "torchtitan", "steady_period_s",
               "context_parallel", "sequence_slices", "slice_lead", "slice_partition")


@dataclass(frozen=True)
class Evaluated:
    """A simulated configuration: its bound, its outcome, whether it fits the budget."""

    configuration: object
    lower_bound: float
    memory_bound: float
    makespan: float | None
    peak_memory: float | None
    fits: bool
    error: str | None = None


@dataclass
class PlanRow:
    """One ranked configuration; see the module docstring for every number.

    ``megatron`` and ``torchtitan`` are the exports (dicts) where the framework runs
    the schedule, else None with the reason in ``megatron_refusal`` /
    ``torchtitan_refusal``.
    """

    rank: int
    tied: bool
    configuration: object
    iteration_s: float
    lower_bound_s: float
    throughput: object
    peak_memory: tuple
    memory_budget: float
    bubble_ratio: float
    exposed_communication: float
    communication_free_s: float
    operations: int
    eval_command: str
    megatron: dict | None = None
    megatron_refusal: str | None = None
    torchtitan: dict | None = None
    torchtitan_refusal: str | None = None
    #: The steady-state period of iterations run back to back (tabsched.steady); the
    #: rows rank by ``iteration_s``, the makespan, and the throughput is per it.
    steady_period_s: float | None = None

    @property
    def execution(self):
        """The :class:`~tabsched.Execution` of this row (parallel degrees, recompute, ZeRO ...)."""
        return self.configuration.execution

    @property
    def layout(self):
        """The pipeline layout of this row: family, depth, parameters and layer split."""
        return self.configuration.layout

    @property
    def family(self):
        """The schedule family's name."""
        return self.layout.family

    @property
    def params(self):
        """The family's parameters (a copy)."""
        return dict(self.layout.params)

    @property
    def peak_memory_max(self):
        """The peak memory of the fullest device (bytes)."""
        return max(self.peak_memory)

    def label(self):
        """The configuration in one line."""
        return self.configuration.describe()

    def to_dict(self):
        """The row as ``plan --json`` writes it: rank, configuration, times, throughput and
        memory."""
        run = self.execution
        flops = self.throughput
        return {"rank": self.rank, "tied": self.tied, "family": self.family,
                "params": self.params, "tensor_parallel": run.tensor_parallel,
                "pipeline_parallel": self.layout.devices, "data_parallel": run.data_parallel,
                "microbatch_size": run.microbatch_size,
                "microbatches": self.configuration.microbatches,
                "recompute": run.recompute, "sequence_parallel": run.sequence_parallel,
                "zero_stage": run.zero_stage, "context_parallel": run.context_parallel,
                "stage_layers": (list(self.layout.stage_layers)
                                 if self.layout.stage_layers is not None else None),
                "stages": self.layout.stages, "operations": self.operations,
                "sequence_slices": self.layout.slices, "slice_lead": self.layout.lead,
                "slice_partition": self.layout.partition,
                "iteration_s": self.iteration_s, "steady_period_s": self.steady_period_s,
                "lower_bound_s": self.lower_bound_s,
                "tokens_per_s_per_gpu": flops.tokens_per_s_per_gpu,
                "model_tflops_per_gpu": flops.model_flops_per_gpu / 1e12,
                "hardware_tflops_per_gpu": flops.hardware_flops_per_gpu / 1e12,
                "mfu": flops.mfu, "hfu": flops.hfu,
                "peak_memory_bytes": self.peak_memory_max,
                "peak_memory_per_device_bytes": list(self.peak_memory),
                "memory_budget_bytes": self.memory_budget,
                "bubble_ratio": self.bubble_ratio,
                "exposed_communication": self.exposed_communication,
                "communication_free_s": self.communication_free_s,
                "throughput": flops.to_dict(), "execution": run.to_dict(),
                "eval_command": self.eval_command,
                "megatron": self.megatron, "megatron_refusal": self.megatron_refusal,
                "torchtitan": self.torchtitan, "torchtitan_refusal": self.torchtitan_refusal}

    def row(self):
        """The row as the CSV and the DataFrame hold it (dicts as JSON text)."""
        data = self.to_dict()
        values = {column: data[column] for column in ROW_COLUMNS}
        values["params"] = json.dumps(values["params"], sort_keys=True)
        values["stage_layers"] = ("" if values["stage_layers"] is None else
                                  ",".join(map(str, values["stage_layers"])))
        values["megatron"] = "" if self.megatron is None else self.megatron["command_line"]
        values["torchtitan"] = ("" if self.torchtitan is None else
                                json.dumps(self.torchtitan["sections"], sort_keys=True))
        return values


@dataclass
class PlanResult:
    """The ranked configurations of a plan, what it counted, and why the winner wins.

    ``rows``: the ``top`` best that fit (ties marked); ``evaluated``: every simulated
    configuration (:class:`Evaluated`); ``counts``: a
    :class:`~tabsched.plan.search.PlanCounts`; ``explanation``: lines saying why the
    winner beats the next best; ``seconds``: the plan's own time.
    """

    model: str
    system: str
    gpus: int
    global_batch: int
    memory_budget: float
    tie_band: float
    rows: list
    evaluated: list
    counts: object
    explanation: list = field(default_factory=list)
    seconds: float = 0.0
    pruning: tuple = ()
    notes: list = field(default_factory=list)
    #: The sequence slice counts searched beside whole sequences (``sequence_slices=``).
    sequence_slices: tuple = ()
    #: The columns of :meth:`to_csv` and :meth:`to_dataframe`.
    columns = ROW_COLUMNS

    @property
    def best(self):
        """The first row of the ranking (fastest that fits), or ``None`` when nothing fits."""
        return self.rows[0] if self.rows else None

    @property
    def tied(self):
        """The rows tied with the best (the best included)."""
        return [row for row in self.rows if row.tied]

    def explain(self):
        """Why the winner beats the next best, one line each."""
        return list(self.explanation)

    def summary_lines(self):
        """What the plan considered, refused, pruned and simulated, one line each."""
        counts = self.counts
        context = any(row.execution.context_parallel > 1 for row in self.rows)
        lines = [f"{counts.configurations:,} configurations over {counts.splits} splits "
                 f"t x {'cp x ' if context else ''}p x d = {self.gpus}: "
                 f"{sum(counts.refused.values()):,} refused by the sizes, "
                 f"{counts.pruned_memory:,} pruned by the memory bound, "
                 f"{counts.pruned_time:,} by the time bound, {counts.simulated:,} simulated "
                 f"({counts.tables:,} tables; {counts.over_budget:,} over the budget, "
                 f"{counts.fit:,} fit) in {self.seconds:.2f} s"]
        for title, reasons in (("refused", counts.refused),
                               ("splits refused", counts.split_refusals),
                               ("could not build", counts.failed)):
            if reasons:
                lines.append(f"{title}: " + "; ".join(
                    f"{count:,} {reason}" for reason, count in
                    sorted(reasons.items(), key=lambda item: -item[1])))
        return lines

    def to_dict(self):
        """The search's inputs, counts, rows, explanation and notes, JSON-ready (``plan --json``)."""
        return {"model": self.model, "system": self.system, "gpus": self.gpus,
                "global_batch": self.global_batch, "memory_budget_bytes": self.memory_budget,
                "tie_band": self.tie_band, "pruning": list(self.pruning),
                "seconds": self.seconds, "counts": self.counts.to_dict(),
                "sequence_slices": list(self.sequence_slices),
                "rows": [row.to_dict() for row in self.rows],
                "explanation": list(self.explanation), "notes": list(self.notes)}

    def to_csv(self):
        """The rows as CSV text (header first; the execution's columns, the numbers, the
        commands)."""
        buffer = io.StringIO(newline="")
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(ROW_COLUMNS)
        for row in self.rows:
            values = row.row()
            writer.writerow(["" if values[column] is None else
                             repr(values[column]) if isinstance(values[column], float) else
                             str(values[column]).lower() if isinstance(values[column], bool)
                             else values[column] for column in ROW_COLUMNS])
        return buffer.getvalue()

    def to_dataframe(self):
        """A pandas DataFrame, a row per ranked configuration
        (:func:`tabsched.frames.plan_frame`)."""
        from tabsched.frames import plan_frame
        return plan_frame(self)

    def __repr__(self):
        best = self.best
        head = (f"PlanResult({self.model} on {self.gpus} x {self.system}, global batch "
                f"{self.global_batch}: ")
        if best is None:
            return head + "nothing fits)"
        tied = len(self.tied)
        return (head + f"best {best.label()} {format_quantity(best.iteration_s, 's')}, "
                       f"MFU {best.throughput.mfu:.1%}"
                + (f", {tied} tied within {self.tie_band:.1%}" if tied > 1 else "")
                + f"; {self.counts.simulated} of {self.counts.configurations} simulated)")

    def _repr_html_(self):
        from tabsched._html import plan_html
        return plan_html(self)
