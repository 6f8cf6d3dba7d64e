"""The megatron-recompute study's report: ``report.md`` of :mod:`tabsched.study_megatron`.

Kept apart from the study itself (the runs, the predictions, the diagnostics) because
it is prose: the measured and predicted times, the audit of the model against what
Megatron-LM ran, the terms each prediction is made of, and where the remaining error
comes from, each sentence built from the study's numbers.
"""

import numpy as np

from tabsched.calibration import terms_markdown

__all__ = ["markdown_report", "BEST_KNOWN", "TARGET", "PREVIOUS_ERRORS", "MEASURED_ERRORS"]

#: The published reference: Calculon (Isaev et al. 2023) on the same eight runs.
BEST_KNOWN = {"model": "Calculon (Isaev et al. 2023)", "mean": 0.0365, "max": 0.0887}

#: The target for tabsched (issue 22): mean |error| <= 3%, max <= 5%, and no systematic
#: sign (mean signed error within +-1.5%).
TARGET = {"mean": 0.03, "max": 0.05, "signed": 0.015}

#: The errors of the previous dgx-a100 description (one flat matrix efficiency 0.728 for
#: every product, 0.667 of NVLink for every collective, BabelStream's 0.846 of the memory,
#: 1 us per launch, free overlap), per (model, mode), the sends as now (megatron-batched):
#: the report shows what the description rebuilt from measurements changed.
PREVIOUS_ERRORS = {("megatron-22b", "full"): -0.0108, ("megatron-22b", "selective"): -0.0364,
                   ("gpt3-175b", "full"): 0.0181, ("gpt3-175b", "selective"): -0.0101,
                   ("turing-530b", "full"): 0.0475, ("turing-530b", "selective"): 0.0126,
                   ("megatron-1t", "full"): 0.0731, ("megatron-1t", "selective"): 0.0646}

#: The errors of the description rebuilt from measurements, before the backward got the
#: kernels Megatron-LM runs and the model lacked: the biases' gradients (a reduction over
#: the tokens each) and the norms' two-pass backward with the residual's gradient added.
MEASURED_ERRORS = {("megatron-22b", "full"): -0.0581, ("megatron-22b", "selective"): -0.0814,
                   ("gpt3-175b", "full"): -0.0406, ("gpt3-175b", "selective"): -0.0586,
                   ("turing-530b", "full"): 0.0090, ("turing-530b", "selective"): -0.0179,
                   ("megatron-1t", "full"): 0.0386, ("megatron-1t", "selective"): 0.0364}


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
        "bias-GeLU, fused bias-dropout-add, LayerNorm, dropouts; in the backward also the "
        "biases' gradients and LayerNorm's two passes with the residual's gradient added), "
        "each timed by its own roofline plus a launch latency; eager attention (the runs "
        "predate FlashAttention). "
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
        "rank on InfiniBand, each step's sends and receives one `batch_isend_irecv` that the "
        "next compute waits for, as Megatron-LM runs without `--overlap-p2p-communication` "
        "(`--p2p megatron-batched`); without sequence parallelism the receiving tensor ranks then "
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
        "| bias gradients | `grad_output.sum(dim=0)` for the QKV product's bias "
        "(`LinearWithGradAccumulationAndAsyncCommunication.backward`); autograd's reduction "
        "of the broadcast biases of the fused bias-GeLU and bias-dropout-add: four reductions "
        "over the tokens per layer | were missing | corrected (`bias`, true for the GPT "
        "presets) |",
        "| norm backward | `fused_kernels/layer_norm_cuda_kernel.cu`: "
        "`cuComputePartGradGammaBeta` and then `cuComputeGradInput`, each reading the "
        "gradient and the input; autograd then adds the residual's gradient | one pass, the "
        "residual's add fused | corrected (two passes and the add) |",
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
        "| model | mode | flat description | measured description | with the backward's "
        "missing kernels (now) |",
        "|---|---|---|---|---|",
    ]
    for row in study.rows:
        befores = [table.get((row["model"], row["mode"]))
                   for table in (PREVIOUS_ERRORS, MEASURED_ERRORS)]
        lines.append(f"| {row['model']} | {row['mode']} | "
                     + " | ".join("-" if before is None else f"{before:+.2%}"
                                  for before in befores)
                     + f" | {row['error']:+.2%} |")
    lines += [
        "",
        "'Flat' is the first `dgx-a100` (one flat matrix efficiency, one NVLink "
        "efficiency, free overlap: mean |error| 3.41%, max 7.31%, mean signed +1.98%); "
        "'measured' is the description rebuilt from the measurements above (mean 4.26%, max "
        "8.14%, signed -2.16%). No number in it was chosen by looking at these iteration "
        "times. The shape-dependent products move the large models down (their products are "
        "3-4x larger and measure faster), which removed the size trend of the errors but left "
        "them too fast, and the per-layer check showed the backward as where. 'Now' adds the "
        "backward's kernels that Megatron-LM runs and the model lacked (the audit's last two "
        "rows): the biases' gradients and the norms' second pass and residual add, all "
        "element-wise traffic, which the small models feel most.",
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
        "## What each prediction is made of",
        "",
        "Each run's predicted iteration, cut into terms on its pacing device (the device "
        "busiest with compute; `tabsched.calibration.iteration_terms`): its matrix products "
        "and element-wise kernels (forward and backward), the recomputation, the kernel "
        "launches, the tensor-parallel collectives it waits for, what the pipeline's transfers "
        "add (the makespan less that of the same run with free transfers), the gradient "
        "synchronisation and optimizer step, and the bubble. Host work per iteration is not "
        "modelled, and is listed at 0 so that the table says so.",
        "",
        *terms_markdown(study.terms),
        "",
        "And one layer of Table 4 (22B, t = 8, microbatch 4), forward and backward:",
        "",
        *terms_markdown(study.layer_terms, "time (s)"),
        "",
        "## Where the remaining error comes from",
        "",
    ]
    errors_by_model = {model: [modes[mode]["error"] for mode in ("full", "selective")]
                       for model, modes in by_model.items()}
    small = errors_by_model.get("megatron-22b", [0.0, 0.0])
    large = errors_by_model.get("megatron-1t", [0.0, 0.0])
    rest, layer_error = study.outside_layers
    imbalance, one_t_microbatches, one_t_pipeline = study.imbalance
    imbalance_share = (imbalance * (one_t_microbatches - 1)
                       / (one_t_microbatches + one_t_pipeline - 1))
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
