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
``s*b*h/t`` per tensor rank (scatter-gather), blocking as Megatron-LM's
``batch_isend_irecv`` + ``synchronize`` block, and without sequence
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
'tabsched eval interleaved-1f1b -p 8 -m 64 --chunks 3 --model gpt3-175b --system dgx-a100 -t 8 --microbatch-size 1 --recompute full --optimizer --blocking-sends'
"""

import os
import time
from dataclasses import dataclass, field

import numpy as np

from tabsched.costs import ModelCosts, load_model, load_system
from tabsched.evaluate import evaluate
from tabsched.files import atomic_write, check_output_folder, make_output_folder
from tabsched.schedules import generate

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

#: The published reference: Calculon (Isaev et al. 2023) on the same eight runs.
BEST_KNOWN = {"model": "Calculon (Isaev et al. 2023)", "mean": 0.0365, "max": 0.0887}

#: The target for tabsched (issue 22): mean |error| <= 3%, max <= 5%, and no systematic
#: sign (mean signed error within +-1.5%).
TARGET = {"mean": 0.03, "max": 0.05, "signed": 0.015}

#: Korthikanti et al. 2022, Table 4: one transformer layer of the 22B model (t = 8,
#: microbatch 4), measured: (recompute, sequence parallel, forward ms, backward ms). An
#: independent check of the per-layer times, beside the end-to-end iterations of Table 5.
TABLE4 = (("none", False, 7.7, 11.9), ("none", True, 7.2, 11.8), ("full", False, 7.7, 19.5),
          ("selective", False, 7.7, 13.2), ("selective", True, 7.2, 13.1))

#: The errors of the previous dgx-a100 description (one flat matrix efficiency 0.728 for
#: every product, 0.667 of NVLink for every collective, BabelStream's 0.846 of the memory,
#: 1 us per launch, free overlap), per (model, mode): the report shows what the description
#: rebuilt from measurements changed.
PREVIOUS_ERRORS = {("megatron-22b", "full"): -0.0108, ("megatron-22b", "selective"): -0.0364,
                   ("gpt3-175b", "full"): 0.0209, ("gpt3-175b", "selective"): -0.0083,
                   ("turing-530b", "full"): 0.0554, ("turing-530b", "selective"): 0.0178,
                   ("megatron-1t", "full"): 0.0731, ("megatron-1t", "selective"): 0.0646}


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
                          optimizer=True, blocking_sends=True)

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
        parts.append("--optimizer --blocking-sends")
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
                          blocking_sends=True)
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
                          signed)
    make_output_folder(out_dir)
    table_path = os.path.join(out_dir, "table5.csv")
    atomic_write(table_path, _csv(rows), newline="")
    report_path = os.path.join(out_dir, "report.md")
    study.files = [table_path, report_path]
    atomic_write(report_path, markdown_report(study, system))
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


def markdown_report(study, system):
    """The study's report: measured vs predicted, the errors, what is modelled, why they remain."""
    by_model = {}
    for row in study.rows:
        by_model.setdefault(row["model"], {})[row["mode"]] = row
    lines = [
        "# Study: megatron-recompute",
        "",
        f"Korthikanti et al. 2022, Table 5: one training iteration of four GPT models with "
        f"Megatron-LM on DGX A100 nodes, measured, against tabsched's prediction on one "
        f"`{system}` description (the same for all eight runs). Times in seconds; error = "
        f"predicted / measured - 1.",
        "",
        "| model | devices | t | p | interleaved chunks | global batch | microbatch | "
        "full recompute (s) | predicted | error | selective + sequence parallel (s) | "
        "predicted | error |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for model, modes in by_model.items():
        full, selective = modes["full"], modes["selective"]
        lines.append(
            f"| {model} | {full['gpus']} | {full['t']} | {full['p']} | {full['chunks']} | "
            f"{full['global_batch']} | {full['microbatch']} | {full['measured_s']:.2f} | "
            f"{full['predicted_s']:.2f} | {full['error']:+.2%} | {selective['measured_s']:.2f} | "
            f"{selective['predicted_s']:.2f} | {selective['error']:+.2%} |")
    lines += [
        "",
        f"**Mean |error| {study.mean_error:.2%}, max {study.max_error:.2%}, mean signed "
        f"{study.signed_error:+.2%}.** The target is mean <= {TARGET['mean']:.0%}, max <= "
        f"{TARGET['max']:.0%} and a mean signed error within +-{TARGET['signed']:.1%}; the "
        f"best-known "
        f"analytical model, {BEST_KNOWN['model']}, reaches {BEST_KNOWN['mean']:.2%} and "
        f"{BEST_KNOWN['max']:.2%} on this table. "
        + ("The target is met." if study.verdict == "reproduced" else
           "The target is not met: see below where the error comes from."),
        "",
        "Each row's `tabsched eval` command line is in `table5.csv` (column `command`), e.g.",
        "",
        f"    {study.rows[2]['command']}",
        "",
        "## What tabsched models",
        "",
        "- Every layer as Megatron-LM's kernels (matrix products, fused softmax, fused "
        "bias-GeLU, fused bias-dropout-add, LayerNorm, dropouts), each timed by its own "
        "roofline plus a launch latency; eager attention (the runs predate FlashAttention). "
        "The system's numbers are measurements (`tabsched presets --show dgx-a100` cites "
        "each): every matrix product at the efficiency of its own shape (m, n, k per tensor "
        "rank), read from LLMCompass' A100 matmul times with the host's 27 us per call taken "
        "off and the sustained factor 0.848 on; element-wise kernels at RRZE's STREAM SCALE "
        "bandwidth (0.852 of peak); 2.6 us per launch (RRZE's back-to-back launches); every "
        "8-GPU all-reduce at the bus bandwidth vTrain's nccl-tests rows give for its size "
        "(reduce-scatter and all-gather as the halves of NCCL's ring).",
        "- A product beside a collective runs 18.9% slower while the collective runs (Lee et "
        "al. 2025, measured on A100 and H100: NCCL's kernels take SMs and memory bandwidth "
        "from it).",
        "- Tensor parallelism t = 8 on NVLink: the forward's all-reduces (reduce-scatters and "
        "all-gathers with sequence parallelism) exposed; the backward's all-reduce "
        "(reduce-scatter) after each column-parallel product beside its weight gradient, and "
        "the re-gathered input beside the data gradient, as Megatron-LM launches them "
        "asynchronously (`LinearWithGradAccumulationAndAsyncCommunication`).",
        "- Full recomputation: a whole forward, collectives included, before each backward. "
        "Selective: the attention core's forward again.",
        "- The pipeline: 1F1B, or the interleaved schedule with 3 chunks, as tabsched's tables "
        "(the interleaved schedule's extra transfers included); transfers of s*b*h/t per tensor "
        "rank on InfiniBand, blocking the sender as Megatron-LM's `batch_isend_irecv` + "
        "`synchronize` do; without sequence parallelism the receiving tensor ranks then "
        "all-gather the whole tensor on NVLink (`gather_split_1d_tensor`).",
        "- The output layer and the loss as Megatron-LM computes it: the logits GEMM, an fp32 "
        "copy of the logits and one pass over them per step of the vocabulary-parallel cross "
        "entropy (max, shift, exp, sum, normalize; backward: scale, cast), three small "
        "all-reduces.",
        "- The end of the iteration: the tied embedding's gradient all-reduce between the first "
        "and the last stage; the gradient buffer divided by the data-parallel size (Megatron-LM "
        "does it at d = 1 too); the optimizer step (54 bytes per parameter, the traffic of "
        "Megatron-LM's mixed-precision Adam step) at the memory roofline. d = 1: no "
        "data-parallel all-reduce.",
        "",
        "Left out: data loading, logging and other host work per iteration; the memory "
        "allocator; a GEMM library's choice of a different kernel for the transposed "
        "layouts of the backward (the measured table is of forward products).",
        "",
        "## Audit of the model against Megatron-LM and A100 measurements",
        "",
        "| mechanism | what Megatron-LM (2022) and the measurements say | tabsched | verdict |",
        "|---|---|---|---|",
        "| layer shapes | Table 3 and section 6: h, a, L as in the presets, s = 2048, "
        "v = 51200, FFN 4h (appendix A) | the presets | right |",
        "| per-layer time | Table 4 (22B, one layer, five configurations), below | within a few "
        "% of each | right for the 22B layer |",
        "| loss | `vocab_parallel_cross_entropy(output.float())`: fp32 copy, five passes, "
        "backward scale and cast | was one pass reading fp16, writing fp32 | corrected |",
        "| pipeline transfers | scatter-gather: 1/t per rank, then `gather_split_1d_tensor` "
        "on the receiver (not with sequence parallelism) | the gather was missing | corrected |",
        "| gradient buffer | `allreduce_gradients` divides it by d, also at d = 1 | missing | "
        "corrected |",
        "| tied embeddings at p = 1 | one copy (`word_embeddings_weight()`) | counted twice "
        "in the optimizer step | corrected |",
        "| interleaving, 1F1B, layer split | interleaved with 3 chunks for 175B and 530B; an "
        "even split of layers, so the last stage also holds the output layer | as run | right |",
        "| tensor-parallel collectives | exposed in the forward and the recompute, overlapped "
        "with the weight gradient in the backward (section 6.2) | as run | right |",
        "| NVLink bus bandwidth | vTrain's nccl-tests rows, 8 A100 over NVSwitch: 198.5 GB/s "
        "on average over the 40-112 MiB of these runs' messages | the measured table, by size "
        "| measured (was 0.667 x 300 GB/s for every size) |",
        "| matrix efficiency | LLMCompass' A100 matmul times over shape: 0.78 of peak at 69 "
        "GFLOP to 0.94 at 4.4 TFLOP (a burst on one GPU, host time included); the 0.848 "
        "'all 8 GPUs busy' factor is measured on H200, not A100 | the table, host time off, "
        "times 0.848 | measured but for the sustained factor (was 0.728 flat) |",
        "| memory efficiency | RRZE gpu-stream SCALE, A100 80GB: 1,737 of 2,039 GB/s | 0.852 "
        "for every vector kernel | measured (was BabelStream's 0.846, a source not re-read) |",
        "| launch | RRZE gpu-small-kernels: 2.6 us per back-to-back launch in a stream | 2.6 us "
        "| measured (was 1 us, a V100 blog figure) |",
        "| overlap | a computation beside a collective is 18.9% slower on average (Lee et al. "
        "2025, A100/H100) | the backward's products beside the tensor-parallel collectives "
        "| measured (was free) |",
        f"| data-parallel all-reduce (not in Table 5: d = 1) | section 6.3: the 530B run "
        f"with d = 8 takes {study.data_parallel[0]:.2f} s longer, not overlapped | a ring "
        f"all-reduce of fp16 gradients on one 200 Gb/s port per GPU: "
        f"{study.data_parallel[1]:.2f} s longer | too fast by "
        f"{study.data_parallel[0] - study.data_parallel[1]:.1f} s; not used by the "
        f"eight runs |",
        "",
        "## Corrections in this revision",
        "",
        "Errors before and after the corrections above (same `" + system + "`):",
        "",
        "| model | mode | before | after |",
        "|---|---|---|---|",
    ]
    for row in study.rows:
        before = PREVIOUS_ERRORS.get((row["model"], row["mode"]))
        lines.append(f"| {row['model']} | {row['mode']} | "
                     + ("-" if before is None else f"{before:+.2%}")
                     + f" | {row['error']:+.2%} |")
    lines += [
        "",
        "'Before' is the previous `dgx-a100` (one flat matrix efficiency, one NVLink "
        "efficiency, free overlap: mean |error| 3.59%, max 7.31%, mean signed +2.20%); 'after' "
        "is the description rebuilt from the measurements above. No number in it was chosen "
        "by looking at these iteration times. The shape-dependent products move the large "
        "models down (their products are 3-4x larger and measure faster), which removes the "
        "size trend of the errors; what remains has one sign, too fast, and the per-layer "
        "check below shows where.",
        "",
        "## Per-layer check: Table 4",
        "",
        "Korthikanti et al. also measured one layer of the 22B model (t = 8, microbatch 4) "
        "alone. tabsched's layer, as in the runs above:",
        "",
        "| recompute | sequence parallel | forward (ms) | tabsched | backward (ms) | tabsched |",
        "|---|---|---|---|---|---|",
    ]
    for recompute, sp, forward, predicted_f, backward, predicted_b in study.layer_times:
        lines.append(f"| {recompute} | {'yes' if sp else 'no'} | {forward * 1e3:.1f} | "
                     f"{predicted_f * 1e3:.2f} ({predicted_f / forward - 1:+.1%}) | "
                     f"{backward * 1e3:.1f} | {predicted_b * 1e3:.2f} "
                     f"({predicted_b / backward - 1:+.1%}) |")
    worst = max(abs((f + b) / (mf + mb) - 1.0) for _, _, mf, f, mb, b in study.layer_times)
    forward_error = np.mean([f / mf - 1.0 for _, _, mf, f, _, _ in study.layer_times])
    backward_error = np.mean([b / mb - 1.0 for _, _, _, _, mb, b in study.layer_times])
    lines += [
        "",
        f"The forward is right within a few percent (mean {forward_error:+.1%}); the backward "
        f"is fast by {-backward_error:.1%} on average, and forward + backward within "
        f"{worst:.1%}. The backward's products are priced at the efficiency of their shapes "
        f"in a table measured on forward products (`torch.matmul` of row-major operands); the "
        f"backward multiplies transposed operands (the data gradient `dY W^T`, the weight "
        f"gradient `X^T dY` with the tokens as the contraction dimension), which cuBLAS runs "
        f"with other kernels, and no public A100 measurement of those layouts was found. "
        f"The backward's gap is most of what remains in Table 5 below.",
        "",
        "## Where the remaining error comes from",
        "",
    ]
    errors_by_model = {model: [modes[mode]["error"] for mode in ("full", "selective")]
                       for model, modes in by_model.items()}
    small = errors_by_model.get("megatron-22b", [0.0, 0.0])
    large = errors_by_model.get("megatron-1t", [0.0, 0.0])
    rest, layer_error = _outside_the_layers(study)
    imbalance = _imbalance(system)
    one_t = next(run for run in table5_runs() if run.model == "megatron-1t")
    imbalance_share = (imbalance * (one_t.microbatches - 1)
                       / (one_t.microbatches + one_t.pipeline - 1))
    lines += [
        f"The error is a trend with model size, not scatter: the 22B runs come out "
        f"{small[0]:+.1%} / {small[1]:+.1%}, the 1T runs {large[0]:+.1%} / {large[1]:+.1%}.",
        "",
        f"- **The 22B runs** (p = 1, one microbatch of 4, a 1.1 s iteration): the layer is "
        f"{layer_error:+.1%} off Table 4 (the selective + sequence parallel layer). The "
        f"measured iteration less 48 layers at Table 4's time leaves {rest[0]:.3f} s; "
        f"tabsched's embedding, output layer, loss and end-of-iteration step take "
        f"{rest[1]:.3f} s; the difference is the host work of an iteration (data loading and "
        f"its broadcast to the tensor ranks, the loss averaging, timers), which a 1.1 s "
        f"iteration feels and a 70 s one does not.",
        f"- **The 1T runs** have a last stage that holds two layers and the output layer: "
        f"{imbalance:.1%} more work per microbatch than a middle stage, which sets the pace "
        f"of every microbatch in 1F1B's steady state and so adds about {imbalance_share:.1%} "
        f"to the iteration (Megatron-LM splits the layers evenly, so the real run has that "
        f"imbalance too).",
        "- **The sustained factor** is the one input not measured on an A100. The factor on "
        "the measured products' efficiency at which each run's prediction equals its "
        "measurement is",
        "",
        "| model | mode | implied factor on the products' efficiency |",
        "|---|---|---|",
    ]
    lines += [f"| {model} | {mode} | " + ("-" if value is None else f"{value:.3f}") + " |"
              for model, mode, value in study.implied_efficiency]
    implied = [value for _, _, value in study.implied_efficiency if value is not None]
    lines += [
        "",
        (f"The implied factor still rises with the model, from {implied[0]:.3f} to "
         f"{implied[-1]:.3f}: with each product priced by its measured shape, the smaller "
         f"models' layers (the 22B's products are 77-309 GFLOP per rank, the 1T's 336-1342) "
         f"still come out faster than measured, as the per-layer check finds for the 22B's "
         f"backward." if len(implied) >= 2 else
         "The implied factor could not be read for these runs."),
        "",
        "The least certain inputs, changed (the same eight runs):",
        "",
        "| dgx-a100 variant | mean abs error | max abs error | mean signed error |",
        "|---|---|---|---|",
    ]
    lines += [f"| {label} | {mean:.2%} | {largest:.2%} | {signed:+.2%} |"
              for label, mean, largest, signed in study.sensitivity]
    lines += [
        "",
        "How the system description came about: every number is a datasheet's or a "
        "microbenchmark's, each cited in the preset, and the variants above show what each "
        "of the measured tables and effects does to the eight runs. No constant was fitted "
        "to this table.",
        "",
        "## Files",
        "",
        "- `table5.csv`: one row per run (measured, predicted, error, bubble ratio, command)",
        "- `report.md`",
        "",
    ]
    return "\n".join(lines)
