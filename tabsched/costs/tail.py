"""The iteration's tail as :class:`~tabsched.costs.ModelCosts` prices it: the gradient-sync
nodes (the reduction among a stage's holders and, overlapped, the replicas' bucketed
reduction: :mod:`tabsched.costs.buckets`), the tied embedding's all-reduce and each
device's optimizer step (the data-parallel reduction when it is not overlapped, the
gradient scaling and the update at the memory roofline, ZeRO-1's all-gather, the FP8
weight copies). ZeRO-2/3's nodes are :mod:`tabsched.costs.sharded`'s.
"""

import numpy as np

from tabsched.costs.buckets import default_bucket_parameters, exposed_reduction
from tabsched.nodes import OPTIMIZER
from tabsched.table import BACKWARD, WEIGHT_GRAD

__all__ = ["embedding_sync", "sync_prices", "step_prices", "last_backward_seconds",
           "FP8_WEIGHT_BYTES"]

#: Bytes per linear parameter of the FP8 weight copies Transformer Engine keeps: the FP8
#: weight and its FP8 transpose (Hopper's FP8 products take only the TN layout, so the data
#: gradient needs W^T in FP8 too).
FP8_WEIGHT_BYTES = 2.0


def embedding_sync(costs, table):
    """Seconds each device spends all-reducing the tied embedding's gradient (Megatron-LM)."""
    D, S = table.num_devices, table.num_stages
    sync = np.zeros(D)
    if not (costs.model.tied_embeddings or costs.model.mtp_layers) or S < 2:
        return sync
    holders = {stage: sorted({int(d) for d in table.device[table.stage == stage]})
               for stage in (0, S - 1)}
    pair = sorted({holders[0][0], holders[S - 1][0]})
    if len(pair) < 2:
        return sync
    nbytes = (costs.model.embedding_parameters / costs.execution.tensor_parallel
              * costs.model.grad_bytes)
    seconds = costs._all_reduce_time(float(nbytes), pair, D)
    sync[sorted(set(holders[0]) | set(holders[S - 1]))] = seconds
    return sync


def sync_prices(costs, lowered):
    """Seconds of each gradient-sync node of ``lowered``: the all-reduce among the table's
    devices holding its stage, then (overlapped data parallelism) what the replicas'
    bucketed reduction leaves after the stage's last backward
    (:func:`tabsched.costs.buckets.exposed_reduction`)."""
    table, run = lowered.table, costs.execution
    dense, experts = costs._stage_rank_parameters(table)
    params = dense + experts
    gradient_bytes = params * float(costs.model.grad_bytes)
    replicas = run.gradient_replicas > 1
    reduce = "reduce_scatter" if run.optimizer_sharding and replicas else "all_reduce"
    # ZeRO-2/3 reduce-scatter in their REDUCE_GRAD nodes instead
    bucketed = replicas and run.overlap_grad_reduce and run.zero_stage < 2
    if bucketed:
        backward = last_backward_seconds(costs, table)
        bucket = (default_bucket_parameters(run.gradient_replicas)
                  if run.grad_bucket_size is None else run.grad_bucket_size)
    sync = []
    for k, stage in enumerate(lowered.sync_stage):
        stage = int(stage)
        # a bucket holds the stage's dense and expert parameters in their proportions
        share = experts[stage] / params[stage] if params[stage] > 0 else 0.0

        def bucket_time(parameters, share=share):
            return float(costs._gradient_reduction(reduce, parameters * (1.0 - share),
                                                   parameters * share))
        devices = lowered.sync_devices(k)
        seconds = costs._all_reduce_time(float(gradient_bytes[stage]), devices,
                                        table.num_devices)
        if bucketed and len(devices) == 1 and (devices[0] == 0
                                                or not run.align_grad_reduce):
            # the buckets fill during the stage's last backward; the sync node, which
            # starts when it ends, holds what the queue leaves after it
            seconds += exposed_reduction(params[stage], bucket, backward[stage],
                                         bucket_time, costs.system.overlap_slowdown)
        elif bucketed:
            # aligned, a later pipeline rank launches its buckets after its last
            # backward (megatron/core/pipeline_parallel/schedules.py: grad sync is
            # enabled in the last backward "only in first pipeline stage. Other
            # pipeline stages do grad reduction during pipeline bubble"); a stage
            # several of the table's ranks hold (Chimera's) reduces among them first,
            # after all their backwards: either way the replicas' reduction is whole
            seconds += costs._gradient_reduction(reduce, dense[stage], experts[stage])
        sync.append(seconds)
    return np.array(sync, dtype=np.float64)


def last_backward_seconds(costs, table):
    """Seconds of each stage's last ``B`` or ``W`` (in row order on each of its
    devices; the longest of them), the backward that fills its gradient buckets."""
    kind = table.kind
    rows = np.flatnonzero((kind == BACKWARD) | (kind == WEIGHT_GRAD))
    S, D = table.num_stages, table.num_devices
    last = np.full(S * D, -1, dtype=np.int64)
    np.maximum.at(last, table.stage[rows].astype(np.int64) * D + table.device[rows], rows)
    seconds = np.zeros(S)
    held = np.flatnonzero(last >= 0)
    if len(held):
        durations = costs.op_durations(table)
        np.maximum.at(seconds, held // D, durations[last[held]])
    return seconds


def step_prices(costs, lowered):
    """Seconds of each device's end-of-iteration step (see
    :meth:`tabsched.costs.ModelCosts.node_prices`)."""
    if not lowered.count(OPTIMIZER):
        return np.zeros(0)
    table = lowered.table
    replicas = costs.execution.gradient_replicas > 1
    sharded = costs.execution.optimizer_sharding and replicas
    reduce = "reduce_scatter" if sharded else "all_reduce"
    dense, experts = (costs._device_parameters(table, part)
                      for part in costs._stage_rank_parameters(table))
    device_params = dense + experts
    step = embedding_sync(costs, table)
    zero = costs.execution.zero_stage
    if replicas and not costs.execution.overlap_grad_reduce and zero < 2:
        step = step + costs._gradient_reduction(reduce, dense, experts)
    shards = costs.execution.gradient_replicas if sharded else 1
    expert_shards = costs.execution.expert_gradient_replicas if sharded else 1
    state_bytes = costs.model.optimizer_step_bytes * (dense / shards + experts / expert_shards)
    # Megatron-LM's data-parallel step divides the whole gradient buffer by d before
    # its all-reduce, at d = 1 too (megatron/model/distributed.py, allreduce_gradients:
    # ``buffer_.data /= mpu.get_data_parallel_world_size()``): read and write g bytes;
    # ZeRO-2/3 keep 1/d of the gradients after their REDUCE_GRAD, and scale that
    scale_bytes = 2.0 * costs.model.grad_bytes * device_params / (shards if zero >= 2
                                                                  else 1)
    # with fp8, the updated weights' FP8 copies: read each linear weight, write it and
    # its transpose in FP8 (TE casts them in the next iteration's first microbatch)
    cast_bytes = (float(costs.model.dtype_bytes) + FP8_WEIGHT_BYTES) * \
        costs._device_fp8_weights(table)
    none, one = np.zeros(len(state_bytes)), np.ones(len(state_bytes))
    step = (step + costs.system.compute_time(none, scale_bytes, one)
            + costs.system.compute_time(none, state_bytes, one))
    if costs.execution.fp8 is not None:
        step = step + costs.system.compute_time(none, cast_bytes, one)
    if sharded and zero < 3:     # ZeRO-3 gathers in the next iteration's UNSHARDs
        weights = float(costs.model.dtype_bytes)
        step = step + costs._gradient_reduction("all_gather", dense, experts, weights)
    return np.where(device_params > 0, step, 0.0)
