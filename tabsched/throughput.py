"""Throughput of an iteration: tokens per second, FLOP/s per GPU, MFU.

The work of one training iteration is counted in **model FLOPs**: the matrix
products of the forward pass and of both halves of the backward (input-grad and
weight-grad) of every layer, the embedding and the output layer, for every
sample of the global batch. They are summed from the model's own kernel lists
(:mod:`tabsched.costs.kernels`), so they hold for any model tabsched describes;
for a GPT layer they are exactly Narayanan et al. 2021 ("Efficient Large-Scale
Language Model Training on GPU Clusters Using Megatron-LM", SC'21), equation (3)
without recomputation::

    72 B s l h^2 (1 + s / 6h + V / 12 l h)

(``B`` samples, ``s`` sequence, ``l`` layers, ``h`` hidden, ``V`` vocabulary;
the paper prints the form with full recomputation, ``96 B s l h^2 (1 + s / 6h +
V / 16 l h)``, which the **hardware FLOPs** below equal under full recompute).

* **Hardware FLOPs** add what recomputation runs again: the recompute forward's
  matrix products (the attention core under ``selective``, the whole layer under
  ``full``; Korthikanti et al. 2022).
* **MFU**, model FLOPs utilization (Chowdhery et al. 2022, "PaLM", Appendix B):
  model FLOPs per second per GPU over the GPU's peak matrix throughput (the
  system's ``peak_flops``). **HFU** is the same with hardware FLOPs.
* **Tokens per second**: ``global batch x sequence / iteration time``, over all
  GPUs and per GPU.

A GPU count is the whole run's: ``tensor x context x data`` GPUs for each of the
table's pipeline ranks.

>>> from tabsched import ModelCosts, evaluate, generate
>>> costs = ModelCosts("gpt3-175b", "dgx-a100", tensor_parallel=8)
>>> table = generate("1f1b", devices=8, microbatches=16)
>>> run = throughput(costs, table, evaluate(table, costs).makespan)
>>> run.gpus, run.samples, round(run.model_flops / 16 / 2.2045551734e15, 6)
(64, 16.0, 1.0)
>>> 0 < run.mfu < run.hfu < 1
True
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tabsched._memo import memo
from tabsched.costs.kernels import KernelTable
from tabsched.exceptions import InvalidParameterError

__all__ = ["Throughput", "throughput", "iteration_work", "sample_flops", "counts_flops"]

#: The kernel lists of one sample's work: model FLOPs (F, I, W) and what recomputation adds.
_MODEL_PHASES = ("F", "I", "W")
_RECOMPUTE_PHASE = "R"


@memo(limit=256)
def sample_flops(model):
    """``(model, hardware)`` matrix FLOPs of one sample through every layer, the embedding
    and the output layer, forward and backward (``model`` fixes the recompute mode)."""
    totals = {True: 0.0, False: 0.0}
    if model.experts:   # a mixture of experts' model FLOPs: balanced, nothing padded
        model = model.replace(routing_imbalance=1.0, capacity_factor=None)
    dense = model.dense_layers
    for part, count in (("layer", model.layers - dense), ("dense_layer", dense),
                        ("embedding", 1), ("output", 1)):
        for phase, kernels in model.kernels(part).items():
            if not kernels:
                continue
            table = KernelTable(kernels)
            flops = float(table.work(np.ones(1))["flops"][table.matrix].sum()) * count
            if phase in _MODEL_PHASES:
                totals[False] += flops
            totals[True] += flops if phase in _MODEL_PHASES + (_RECOMPUTE_PHASE,) else 0.0
    return totals[False], totals[True]


@dataclass(frozen=True)
class Throughput:
    """How much one iteration did and how fast; see the module docstring.

    ``iteration_s`` is the makespan, ``samples`` and ``tokens`` the global batch,
    ``gpus`` every GPU of the run, ``model_flops`` and ``hardware_flops`` the
    iteration's work, ``peak_flops`` one GPU's peak.
    """

    iteration_s: float
    samples: float
    tokens: float
    gpus: int
    model_flops: float
    hardware_flops: float
    peak_flops: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.iteration_s if self.iteration_s > 0 else 0.0

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.tokens_per_s / self.gpus

    @property
    def model_flops_per_gpu(self) -> float:
        """Model FLOP/s per GPU."""
        return self.model_flops / self.iteration_s / self.gpus if self.iteration_s > 0 else 0.0

    @property
    def hardware_flops_per_gpu(self) -> float:
        """Hardware FLOP/s per GPU (recomputation included)."""
        return (self.hardware_flops / self.iteration_s / self.gpus if self.iteration_s > 0
                else 0.0)

    @property
    def mfu(self) -> float:
        """Model FLOPs utilization: model FLOP/s per GPU over the peak."""
        return self.model_flops_per_gpu / self.peak_flops

    @property
    def hfu(self) -> float:
        """Hardware FLOPs utilization: hardware FLOP/s per GPU over the peak."""
        return self.hardware_flops_per_gpu / self.peak_flops

    def to_dict(self) -> dict:
        return {"iteration_s": self.iteration_s, "samples": self.samples,
                "tokens": self.tokens, "gpus": self.gpus, "model_flops": self.model_flops,
                "hardware_flops": self.hardware_flops, "tokens_per_s": self.tokens_per_s,
                "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
                "model_tflops_per_gpu": self.model_flops_per_gpu / 1e12,
                "hardware_tflops_per_gpu": self.hardware_flops_per_gpu / 1e12,
                "mfu": self.mfu, "hfu": self.hfu}


def counts_flops(costs) -> bool:
    """Whether ``costs`` price a model on a system, whose FLOPs :func:`throughput` counts
    (slot-length costs do no FLOPs)."""
    return (getattr(costs, "model", None) is not None
            and getattr(costs, "system", None) is not None and hasattr(costs, "execution"))


def iteration_work(costs, table) -> tuple:
    """``(samples, tokens, gpus, model FLOPs, hardware FLOPs)`` of one iteration of
    ``table`` under ``costs`` (a ModelCosts): what :func:`throughput` divides by the time.

    The global batch is the table's samples on each of the execution's
    ``data_parallel`` replicas (a sequence cut into slices counted once).
    """
    if not counts_flops(costs):
        raise InvalidParameterError("throughput needs model costs (a model on a system): "
                                    "slot-length costs do no FLOPs")
    model, run = costs.model, costs.execution
    per_microbatch = np.asarray(costs.microbatch_samples(table), dtype=np.float64)
    if table.sequence_slices is not None:   # a sequence's k slices hold its samples once
        per_microbatch = per_microbatch / np.array(
            [count for _, count in table.sequence_slices], dtype=np.float64)
    samples = float(np.sum(per_microbatch)) * run.data_parallel
    model_flops, hardware_flops = sample_flops(model)
    return (samples, samples * model.sequence, int(run.ranks_per_stage * table.num_devices),
            model_flops * samples, hardware_flops * samples)


def throughput(costs, table, iteration_s, *, work=None) -> Throughput:
    """The throughput of ``table`` run under ``costs`` (a ModelCosts) in ``iteration_s``.

    The global batch is the table's samples on each of the execution's
    ``data_parallel`` replicas. ``work``: :func:`iteration_work` of the same table
    under costs of the same model and execution, when at hand (a sweep's cost models
    of one model on several systems share it); the peak is ``costs``' system's.
    """
    samples, tokens, gpus, model_flops, hardware_flops = (
        iteration_work(costs, table) if work is None else work)
    return Throughput(iteration_s=float(iteration_s), samples=samples, tokens=tokens,
                      gpus=gpus, model_flops=model_flops, hardware_flops=hardware_flops,
                      peak_flops=float(costs.system.peak_flops))
