"""The ``megatron-recompute`` study: Korthikanti et al. 2022, Table 5, predicted.

Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
Transformer Models", MLSys 2023) measured one training iteration of four GPT
models on DGX A100 nodes (NVIDIA Selene) with Megatron-LM, once with full
activation recomputation and once with selective recomputation and sequence
parallelism (Table 5; configurations in Table 3). This study runs the same
eight configurations through tabsched -- the table of the pipeline schedule,
lowered and evaluated with :class:`~tabsched.costs.ModelCosts` on one
``dgx-a100`` description -- and compares the iteration times.

What is modelled, as Megatron-LM (2022) runs it: the layers' kernels with the
paper's fused kernels (:mod:`tabsched.costs.kernels`), eager attention (no
FlashAttention in those runs); tensor parallelism ``t = 8`` inside a node, its
forward collectives exposed and its data-gradient collectives beside the
weight gradients (Megatron-LM's asynchronous all-reduce / reduce-scatter);
sequence parallelism with selective recomputation; full recomputation as an
extra forward, collectives included, before each backward; the pipeline
(1F1B, or the interleaved schedule with 3 chunks) with its transfers of
``s*b*h/t`` per tensor rank (scatter-gather), posted and waited as
Megatron-LM 2022 did without ``--overlap-p2p-communication`` (``p2p =
"megatron-batched"``: each step's sends and receives one ``batch_isend_irecv``
waited before the next compute, :mod:`tabsched.p2p`), and without sequence
parallelism the receivers' all-gather of the scattered tensor; the loss on an
fp32 copy of the logits; the all-reduce of the tied embedding's gradient
between the first and the last stage; the gradient buffer's division by the
data-parallel size and the optimizer step. The report also checks one layer
of the 22B model against the paper's Table 4 and shows the matrix efficiency
each run implies. Data parallelism is 1 in all eight runs, so there is no gradient
all-reduce. Left out: data loading, logging and other host work, the memory
allocator, and interference between overlapped communication and compute.

>>> runs = table5_runs()
>>> [run.model for run in runs][:3]
['megatron-22b', 'megatron-22b', 'gpt3-175b']
>>> runs[2].command()
'tabsched eval interleaved-1f1b -p 8 -m 64 --chunks 3 --model gpt3-175b --system dgx-a100 -t 8 --microbatch-size 1 --recompute full --optimizer --p2p megatron-batched'
"""

import time
from dataclasses import dataclass, field

import numpy as np

from tabsched.calibration import TERMS, iteration_terms, part_terms
from tabsched.costs import ModelCosts, load_model, load_system
from tabsched.evaluate import evaluate
from tabsched.files import atomic_write, check_output_folder, staged_folder
from tabsched.schedules import generate
from tabsched.study_megatron_report import BEST_KNOWN, TARGET, markdown_report

__all__ = ["TABLE5", "TABLE4", "Table5Run", "table5_runs", "predict", "run_megatron_study",
           "MegatronStudy", "table4_layer_times", "implied_matrix_efficiency",
           "data_parallel_check"]

#: Korthikanti et al. 2022, Tables 3 and 5: (model, GPUs, t, p, interleaved chunks,
#: global batch, microbatch, measured seconds with full recomputation, with selective
#: recomputation and sequence parallelism).
TABLE5 = (
    ("megatron-22b", 8, 8, 1, 1, 4, 4, 1.42, 1.10),
    ("gpt3-175b", 64, 8, 8, 3, 64, 1, 18.13, 13.75),
    ("turing-530b", 280, 8, 35, 3, 280, 1, 49.05, 37.83),
    ("megatron-1t", 512, 8, 64, 1, 512, 1, 94.42, 71.49),
)

#: What Table 5 calls each mode, and the recomputation and sequence parallelism it ran.
MODES = {"full": ("full recompute", "full", False),
         "selective": ("selective + sequence parallel", "selective", True)}

#: Korthikanti et al. 2022, Table 4: one transformer layer of the 22B model (t = 8,
#: microbatch 4), measured: (recompute, sequence parallel, forward ms, backward ms). An
#: independent check of the per-layer times, beside the end-to-end iterations of Table 5.
TABLE4 = (("none", False, 7.7, 11.9), ("none", True, 7.2, 11.8), ("full", False, 7.7, 19.5),
          ("selective", False, 7.7, 13.2), ("selective", True, 7.2, 13.1))


@dataclass(frozen=True)
class Table5Run:
    """One measured configuration of Table 5 in one mode."""

    model: str
    gpus: int
    tensor_parallel: int
    pipeline: int
    chunks: int
    global_batch: int
    microbatch: int
    mode: str
    measured: float

    @property
    def microbatches(self):
        data_parallel = self.gpus // (self.tensor_parallel * self.pipeline)
        return self.global_batch // (self.microbatch * data_parallel)

    @property
    def family(self):
        return "interleaved-1f1b" if self.chunks > 1 else "1f1b"

    def table(self):
        params = {"chunks": self.chunks} if self.chunks > 1 else {}
        return generate(self.family, devices=self.pipeline, microbatches=self.microbatches,
                        **params)

    def costs(self, system="dgx-a100"):
        _, recompute, sequence_parallel = MODES[self.mode]
        return ModelCosts(self.model, system, microbatch_size=self.microbatch,
                          recompute=recompute, tensor_parallel=self.tensor_parallel,
                          sequence_parallel=sequence_parallel,
                          data_parallel=self.gpus // (self.tensor_parallel * self.pipeline),
                          optimizer=True, p2p="megatron-batched")

    def command(self, system="dgx-a100"):
        """The ``tabsched eval`` command line that evaluates this run."""
        _, recompute, sequence_parallel = MODES[self.mode]
        parts = [f"tabsched eval {self.family} -p {self.pipeline} -m {self.microbatches}"]
        if self.chunks > 1:
            parts.append(f"--chunks {self.chunks}")
        parts.append(f"--model {self.model} --system {system} -t {self.tensor_parallel} "
                     f"--microbatch-size {self.microbatch} --recompute {recompute}")
        if sequence_parallel:
            parts.append("--sequence-parallel")
        parts.append("--optimizer --p2p megatron-batched")
        return " ".join(parts)


def table5_runs():
    """The eight runs of Table 5, full recomputation first for each model."""
    return [Table5Run(model, gpus, t, p, chunks, batch, microbatch, mode,
                      full if mode == "full" else selective)
            for model, gpus, t, p, chunks, batch, microbatch, full, selective in TABLE5
            for mode in ("full", "selective")]


def predict(runs=None, system="dgx-a100"):
    """``[(run, Result)]``: tabsched's evaluation of each run on ``system``."""
    runs = table5_runs() if runs is None else runs
    system = load_system(system)
    return [(run, evaluate(run.table(), run.costs(system), formula=False)) for run in runs]


def errors(predictions):
    """Relative errors ``predicted / measured - 1`` of ``[(run, Result)]``."""
    return np.array([result.makespan / run.measured - 1.0 for run, result in predictions])


@dataclass
class MegatronStudy:
    """What ``run_megatron_study`` found; ``rows`` are dicts, one per run.

    ``claim``, ``verdict`` and ``evidence`` state the finding (the target met,
    or not, against the best-known model).
    """

    name: str
    rows: list
    claim: str
    verdict: str
    evidence: list
    seconds: float
    files: list
    mean_error: float | None = None
    max_error: float | None = None
    sensitivity: list = field(default_factory=list)
    layer_times: list = field(default_factory=list)
    implied_efficiency: list = field(default_factory=list)
    data_parallel: tuple = (0.0, 0.0)
    signed_error: float | None = None
    terms: list = field(default_factory=list)
    layer_terms: list = field(default_factory=list)
    outside_layers: tuple = ((0.0, 0.0), 0.0)
    imbalance: tuple = (0.0, 0, 0)

    @property
    def configurations(self):
        return len(self.rows)


def _sensitivity(system):
    """Mean, max and mean signed error when the least certain inputs of the system change."""
    base = load_system(system)
    variants = [("as shipped", base)]
    gemm = base.gemm_efficiency
    if gemm is not None and gemm.scale != 1.0:
        variants.append((f"GEMM table as measured, a burst (no sustained factor {gemm.scale:.3f})",
                         base.replace(gemm_efficiency=_rescaled(gemm, 1.0))))
    if gemm is not None:
        variants.append(("no GEMM table: one flat efficiency "
                         f"{_flat(base.compute_efficiency)} for every product",
                         base.replace(gemm_efficiency=None)))
    if base.overlap_slowdown:
        variants.append(("free overlap (no slowdown beside a collective)",
                         base.replace(overlap_slowdown=0.0)))
    if base.collective_bandwidth is not None:
        variants.append(("no NCCL tables: the ring at intra_node_efficiency "
                         f"{base.intra_node_efficiency:.3g}",
                         base.replace(collective_bandwidth=None)))
    if base.matrix_wave and gemm is None:
        variants.append(("without wave quantization", base.replace(matrix_wave=0.0)))
    rows = []
    for label, variant in variants:
        found = np.asarray(errors(predict(system=variant)))
        rows.append((label, float(np.abs(found).mean()), float(np.abs(found).max()),
                     float(found.mean())))
    return rows


def _flat(value):
    return f"{value:.3f}" if not isinstance(value, tuple) else "curve"


def _rescaled(gemm, scale):
    """``gemm`` with its sustained factor ``scale`` (1: as measured)."""
    value = gemm.to_value()
    value.pop("scale", None)
    value.pop("scale_source", None)
    if scale != 1.0:
        value.update(scale=scale, scale_source=gemm.scale_source or "a variant")
    return value


def table4_layer_times(system="dgx-a100"):
    """Korthikanti et al.'s Table 4 against tabsched: one layer of the 22B model.

    Returns ``[(recompute, sequence_parallel, measured F, predicted F,
    measured B, predicted B)]`` in seconds (``B`` includes the recompute).
    """
    system = load_system(system)
    rows = []
    for recompute, sequence_parallel, forward, backward in TABLE4:
        costs = ModelCosts("megatron-22b", system, microbatch_size=4, recompute=recompute,
                           tensor_parallel=8, sequence_parallel=sequence_parallel)
        times = costs.part_times(np.array([4.0]))["layer"][:, 0]
        rows.append((recompute, sequence_parallel, forward * 1e-3, float(times[0]),
                     backward * 1e-3, float(times[1])))
    return rows


def table4_terms(system="dgx-a100"):
    """What makes up tabsched's Table 4 layer: ``[(label, seconds, {term: seconds})]`` for
    the forward and the backward (with its recompute) of each configuration."""
    system = load_system(system)
    rows = []
    for recompute, sequence_parallel, _, _ in TABLE4:
        costs = ModelCosts("megatron-22b", system, microbatch_size=4, recompute=recompute,
                           tensor_parallel=8, sequence_parallel=sequence_parallel)
        terms = part_terms(costs, "layer", 4.0)
        label = f"{recompute}{' + SP' if sequence_parallel else ''}"
        for kind, name in ((0, "forward"), (1, "backward")):
            found = dict.fromkeys(TERMS, 0.0)
            found.update(terms[kind])
            rows.append((f"{label}, {name}", sum(found.values()), found))
    return rows


def implied_matrix_efficiency(system="dgx-a100", runs=None):
    """The factor on the matrix products' efficiency at which each run's prediction equals
    its measurement.

    A diagnostic, not an input: the iteration time is close to ``A + B / e`` in the
    matrix efficiency ``e``, so two evaluations give ``A`` and ``B``. ``e`` is the GEMM
    table's sustained factor (``scale``) when the system has a table, else the flat
    ``compute_efficiency``. Returns ``[(run, e)]``; ``e`` is None where it cannot be read
    (an efficiency curve, or a run the products do not move).
    """
    system = load_system(system)
    runs = table5_runs() if runs is None else runs
    if system.gemm_efficiency is not None:
        base = system.gemm_efficiency.scale
        other_value = min(1.0, base * 1.1)
        other = system.replace(gemm_efficiency=_rescaled(system.gemm_efficiency, other_value))
    else:
        base = system.compute_efficiency
        if isinstance(base, tuple):
            return [(run, None) for run in runs]
        other_value = min(1.0, base * 1.1)
        other = system.replace(compute_efficiency=other_value)
    if other_value == base:
        return [(run, None) for run in runs]
    found = []
    for run in runs:
        at_base = evaluate(run.table(), run.costs(system), formula=False).makespan
        at_other = evaluate(run.table(), run.costs(other), formula=False).makespan
        slope = (at_base - at_other) / (1.0 / base - 1.0 / other_value)
        constant = at_base - slope / base
        found.append((run, slope / (run.measured - constant)
                      if run.measured > constant and slope > 0 else None))
    return found


#: Korthikanti et al. 2022, section 6.3: the 530B run (selective + sequence parallel) with
#: 8-way data parallelism (2240 GPUs, 8x the batch) takes 39.15 s instead of 37.83 s; the
#: gradient all-reduce is not overlapped with the backward.
DATA_PARALLEL_530B = {"data_parallel": 8, "measured": 39.15}


def data_parallel_check(system="dgx-a100"):
    """``(measured, predicted)`` seconds the 530B iteration gains with 8-way data parallelism.

    Not part of Table 5 (its runs have d = 1): a check of the data-parallel
    gradient all-reduce against the one data-parallel time the paper gives.
    """
    system = load_system(system)
    run = next(run for run in table5_runs()
               if run.model == "turing-530b" and run.mode == "selective")
    single = evaluate(run.table(), run.costs(system), formula=False).makespan
    costs = run.costs(system)
    replicas = ModelCosts(costs.model, system, tensor_parallel=run.tensor_parallel,
                          sequence_parallel=True,
                          data_parallel=DATA_PARALLEL_530B["data_parallel"], optimizer=True,
                          p2p="megatron-batched")
    several = evaluate(run.table(), replicas, formula=False).makespan
    return DATA_PARALLEL_530B["measured"] - run.measured, several - single


def _outside_the_layers(study):
    """The 22B selective run's time outside its layers, measured (via Table 4) and predicted.

    Returns ``((measured, predicted), layer error)``: the iteration less 48 layers at
    Table 4's (or tabsched's) selective + sequence-parallel layer time.
    """
    row = next(row for row in study.rows
               if row["model"] == "megatron-22b" and row["mode"] == "selective")
    _, _, forward, predicted_f, backward, predicted_b = next(
        layer for layer in study.layer_times if layer[0] == "selective" and layer[1])
    layers = load_model("megatron-22b").layers
    measured = row["measured_s"] - layers * (forward + backward)
    predicted = row["predicted_s"] - layers * (predicted_f + predicted_b)
    return (measured, predicted), (predicted_f + predicted_b) / (forward + backward) - 1.0


def _imbalance(system):
    """How much more F + B the last stage of the 1T selective run costs than a middle one."""
    run = next(run for run in table5_runs()
               if run.model == "megatron-1t" and run.mode == "selective")
    table, costs = run.table(), run.costs(load_system(system))
    durations = costs.op_durations(table)
    work = [sum(durations[(table.stage == stage) & (table.kind == kind)][0] for kind in (0, 1))
            for stage in (table.num_stages // 2, table.num_stages - 1)]
    return work[1] / work[0] - 1.0


def run_megatron_study(out_dir, *, system="dgx-a100", progress=None):
    """Predict Table 5 on ``system`` and write ``table5.csv`` and ``report.md`` into ``out_dir``."""
    check_output_folder(out_dir)   # before the work, not after it
    began = time.perf_counter()
    predictions = predict(system=system)
    if progress is not None:
        progress(1, 2, len(predictions))
    sensitivity = _sensitivity(system)
    layer_times = table4_layer_times(system)
    implied = [(run.model, run.mode, value) for run, value in implied_matrix_efficiency(system)]
    data_parallel = data_parallel_check(system)
    terms = [(f"{run.model} {run.mode}", result.makespan,
              iteration_terms(run.table(), run.costs(system), result))
             for run, result in predictions]
    layer_terms = table4_terms(system)
    if progress is not None:
        progress(2, 2, len(predictions))
    seconds = time.perf_counter() - began
    found = errors(predictions)
    rows = []
    for (run, result), error in zip(predictions, found):
        costs = result.costs
        rows.append({"model": run.model, "gpus": run.gpus, "t": run.tensor_parallel,
                     "p": run.pipeline, "chunks": run.chunks,
                     "global_batch": run.global_batch, "microbatch": run.microbatch,
                     "mode": run.mode, "measured_s": run.measured,
                     "predicted_s": result.makespan, "error": float(error),
                     "bubble_ratio": result.bubble_ratio,
                     "recompute": costs["recompute"],
                     "sequence_parallel": bool(costs.get("sequence_parallel", False)),
                     "command": run.command(load_system(system).name),
                     "peak_memory_bytes": max(d.peak_total_memory for d in result.devices),
                     "memory_capacity_bytes": result.memory_capacity, "fits": result.fits,
                     "model_tflops_per_gpu": result.throughput.model_flops_per_gpu / 1e12,
                     "mfu": result.throughput.mfu, "hfu": result.throughput.hfu})
    mean, largest = float(np.abs(found).mean()), float(np.abs(found).max())
    signed = float(np.mean(found))
    met = (mean <= TARGET["mean"] and largest <= TARGET["max"]
           and abs(signed) <= TARGET["signed"])
    beats = mean < BEST_KNOWN["mean"] and largest < BEST_KNOWN["max"]
    verdict = "reproduced" if met else "partly reproduced" if beats else "not reproduced"
    claim = (f"Table 5 of Korthikanti et al. 2022 within mean |error| <= "
             f"{TARGET['mean']:.0%}, max <= {TARGET['max']:.0%} and mean signed error within "
             f"+-{TARGET['signed']:.1%} on one {system}")
    evidence = [f"mean |error| {mean:.2%}, max {largest:.2%}, mean signed {signed:+.2%} over "
                f"{len(rows)} runs "
                f"({BEST_KNOWN['model']}: {BEST_KNOWN['mean']:.2%} and {BEST_KNOWN['max']:.2%})"]
    study = MegatronStudy("megatron-recompute", rows, claim, verdict, evidence, seconds, [],
                          mean, largest, sensitivity, layer_times, implied, data_parallel,
                          signed, terms, layer_terms)
    study.outside_layers = _outside_the_layers(study)
    run_1t = next(run for run in table5_runs() if run.model == "megatron-1t")
    study.imbalance = (_imbalance(system), run_1t.microbatches, run_1t.pipeline)
    with staged_folder(out_dir) as stage:   # both files, or neither
        study.files = [stage.final("table5.csv"), stage.final("report.md")]
        atomic_write(stage.path("table5.csv"), _csv(rows), newline="")
        atomic_write(stage.path("report.md"), markdown_report(study, system))
    return study


# New columns follow the older ones, whose positions stay as they were.
_CSV_COLUMNS = ("model", "gpus", "t", "p", "chunks", "global_batch", "microbatch", "mode",
                "measured_s", "predicted_s", "error", "bubble_ratio", "command",
                "peak_memory_bytes", "memory_capacity_bytes", "fits", "model_tflops_per_gpu",
                "mfu", "hfu")


def _csv(rows):
    lines = [",".join(_CSV_COLUMNS)]
    for row in rows:
        lines.append(",".join(_cell(row[key]) for key in _CSV_COLUMNS))
    return "\n".join(lines) + "\n"


def _cell(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    return repr(value) if isinstance(value, float) else str(value)
