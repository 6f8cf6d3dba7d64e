"""The prices and bytes of sharded data parallelism (ZeRO stages 1-3, FSDP) for ModelCosts.

Per parameter a replica holds its weights (the model's ``dtype_bytes``, what the
kernels read), their gradients (``grad_bytes``) and the optimizer state (the rest
of ``bytes_per_param``: fp32 master weights and Adam's two moments in
mixed-precision training, Rajbhandari et al. 2020, section 3.1). ZeRO stage ``z``
over ``d`` replicas (section 5, Figure 1) keeps ``1/d`` of the optimizer state
(``z >= 1``), of the gradients (``z >= 2``) and of the weights (``z = 3``), so
that ZeRO-3 holds ``1/d`` of everything ZeRO-0 holds.

The nodes of :mod:`tabsched.sharding` are priced here, per tensor rank, over the
data-parallel group as the execution places it (``placement.group("data")``,
:func:`tabsched.costs.collectives.group_time`, measured bus bandwidth where the
system has a table):

* ``UNSHARD``: the all-gather of the stage's weights, ``P_s / t * dtype_bytes``
  bytes gathered (FSDP gathers the compute dtype, ``MixedPrecisionPolicy.
  param_dtype``);
* ``REDUCE_GRAD``: the reduce-scatter of its gradients, ``P_s / t * grad_bytes``;
* ``RESHARD``: 0 (it frees memory).

While a stage is gathered the device holds the other ``(1 - 1/d)`` of its
weights; from its first backward until its REDUCE_GRAD ends, the other
``(1 - 1/d)`` of its gradients (:func:`shard_sizes`).
"""

import numpy as np

from tabsched.costs.collectives import group_time
from tabsched.nodes import REDUCE_GRAD, RESHARD, UNSHARD

__all__ = ["persistent_bytes_per_parameter", "shard_sizes", "shard_prices"]


def _parts(model):
    """``(weights, gradients, optimizer state)`` bytes per parameter."""
    weights, gradients = float(model.dtype_bytes), float(model.grad_bytes)
    state = max(0.0, float(model.bytes_per_param) - weights - gradients)
    return float(model.bytes_per_param) - state - gradients, gradients, state


def persistent_bytes_per_parameter(model, execution, experts=False):
    """Bytes per parameter a tensor rank holds all the time under ``execution``'s ZeRO
    stage (``model.optimizer_state_bytes(d)`` at stage 1); ``experts``: of a routed
    expert, whose replicas are the expert-data-parallel group (``d * cp / e``)."""
    zero = execution.zero_stage
    d = execution.expert_gradient_replicas if experts else execution.gradient_replicas
    if zero <= 1:
        return model.optimizer_state_bytes(d if zero == 1 else 1)
    weights, gradients, state = _parts(model)
    return (weights / d if zero >= 3 else weights) + gradients / d + state / d


def shard_sizes(costs, table):
    """``(gathered, gradients)`` bytes per stage and tensor rank: what a device holds
    beyond its persistent memory while the stage is gathered (ZeRO-3), and while its
    full gradients wait for their reduce-scatter (ZeRO-2/3)."""
    run = costs.execution
    zero, d = run.zero_stage, run.data_parallel
    params = sum(costs._stage_rank_parameters(table))
    rest = 1.0 - 1.0 / d
    gathered = params * float(costs.model.dtype_bytes) * rest if zero >= 3 \
        else np.zeros(len(params))
    gradients = params * float(costs.model.grad_bytes) * rest if zero >= 2 \
        else np.zeros(len(params))
    return gathered, gradients


def shard_prices(costs, lowered, kind):
    """Seconds of each UNSHARD, RESHARD or REDUCE_GRAD node of ``lowered``."""
    count = lowered.count(kind)
    nodes = lowered.sharding
    if kind == RESHARD or not count or nodes is None:
        return np.zeros(count)
    params = sum(costs._stage_rank_parameters(lowered.table))
    group = costs.placement.group("data")
    if kind == UNSHARD:
        per_stage = group_time("all_gather", params * float(costs.model.dtype_bytes), group,
                               costs.system)
        stages = nodes.unshard_stage
    elif kind == REDUCE_GRAD:
        per_stage = group_time("reduce_scatter", params * float(costs.model.grad_bytes), group,
                               costs.system)
        stages = nodes.reduce_stage
    else:
        return np.zeros(count)
    per_stage = np.asarray(per_stage, dtype=np.float64) * np.ones(len(params))
    return np.where(params[stages] > 0, per_stage[stages], 0.0)
