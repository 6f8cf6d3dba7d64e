"""Megatron-LM launch arguments for a table, where Megatron-LM can run it.

Megatron-LM (``megatron/core/pipeline_parallel/schedules.py``) runs two pipeline
schedules, chosen by its arguments rather than by a table:

* ``forward_backward_pipelining_without_interleaving`` (1F1B): rank ``r`` of ``P`` runs
  ``min(P - r - 1, M)`` warm-up forwards, then alternates one forward and one backward,
  then the remaining backwards.
* ``forward_backward_pipelining_with_interleaving`` (``V`` virtual stages per rank, rank
  ``r`` holding model chunks ``r, r + P, ...``): microbatches go in groups of ``G``
  (``--microbatch-group-size-per-virtual-pipeline-stage``, default ``P``); forward ``k``
  runs chunk ``c`` of microbatch ``m`` from a table listing, group by group, every chunk
  of every microbatch of the group; backward ``k`` the same with the chunks reversed.
  Warm-up is ``2 * (P - r - 1) + (V - 1) * G`` forwards (at most all of them). Megatron
  requires ``P <= G <= M`` and the last group to hold 0 or at least ``P`` microbatches.

:func:`megatron_arguments` derives ``P``, ``V`` and the layer split from the table,
builds Megatron-LM's own order for every group size it accepts, and returns the
arguments when one of them is the table's order, operation for operation. Otherwise it
raises ``InvalidScheduleError`` saying why: split backwards (I/W) have no Megatron-LM
schedule, fused forward+backward cells only as Megatron-Core's combined 1F1B (interleaved,
``--overlap-moe-expert-parallel-comm``), a stage must live on exactly one rank in Megatron's placement, and
the first operation where the orders part is named.

Layers: an even split is ``--num-layers`` (and ``--num-layers-per-virtual-pipeline-stage``
with virtual stages); without virtual stages, a split whose middle stages are even and
whose first or last stage differs is ``--decoder-first-pipeline-num-layers`` /
``--decoder-last-pipeline-num-layers``; any other is ``--pipeline-model-parallel-layout``
(``E`` the embedding, ``t`` a decoder layer, ``t*4`` four of them, ``L`` the loss, ``,``
between parts of one stage and ``|`` between consecutive stages, e.g.
``E,t*4|t*4|t*8|t*8,L``; Megatron-LM documents it as experimental).

:func:`execution_arguments` gives the flags of an execution's other fields (tensor
parallelism, sequence parallelism, recomputation, the distributed optimizer,
FlashAttention, the overlapped gradient reduction); ``megatron_arguments(...,
execution=...)`` adds them.

:func:`megatron_flops` counts an iteration's FLOPs as Megatron-LM does for the
"throughput per GPU (TFLOP/s/GPU)" it logs, so that tabsched's time and a Megatron-LM
log compare on the same count.

>>> from tabsched.schedules import generate
>>> launch = megatron_arguments(generate("interleaved-1f1b", devices=4, microbatches=8,
...                                      chunks=2, layers=32))
>>> launch.command_line()
'--pipeline-model-parallel-size 4 --num-layers 32 --num-layers-per-virtual-pipeline-stage 4 --microbatch-group-size-per-virtual-pipeline-stage 4 --micro-batch-size 1 --global-batch-size 8'
"""

from dataclasses import dataclass, field

import numpy as np

from tabsched.exceptions import InvalidParameterError, InvalidScheduleError
from tabsched.table import BACKWARD, FORWARD, KINDS

__all__ = ["MegatronLaunch", "megatron_arguments", "megatron_orders", "megatron_cells",
           "execution_arguments", "megatron_flops"]


@dataclass(frozen=True)
class MegatronLaunch:
    """Megatron-LM arguments that run a table, and what they mean.

    ``arguments`` is a list of ``(flag, value)``; ``schedule`` names the Megatron-LM
    function that runs it; ``notes`` say what the user must add (tensor and data
    parallelism, the model's own arguments).
    """

    arguments: tuple
    schedule: str
    notes: tuple = field(default=())

    def command_line(self):
        """The arguments as one line for a launch script (a flag without a value alone)."""
        return " ".join(flag if value is None else f"{flag} {value}"
                        for flag, value in self.arguments)

    def to_dict(self):
        return {"arguments": {flag: value for flag, value in self.arguments},
                "command_line": self.command_line(), "schedule": self.schedule,
                "notes": list(self.notes)}


def megatron_orders(devices, microbatches, chunks=1, group_size=None, combined=False):
    """Megatron-LM's per-rank order: ``orders[r]`` lists ``(kind, stage, microbatch)``.

    ``kind`` is ``"F"`` or ``"B"``; stage ``c * devices + r`` is chunk ``c`` of rank ``r``.
    ``combined``: Megatron-Core's combined 1F1B (``--overlap-moe-expert-parallel-comm``,
    interleaved only), whose warm-up runs one forward more; each steady forward and the
    backward after it then run as one step (:func:`megatron_cells`).

    >>> [f"{s}{k}{m}" for k, s, m in megatron_orders(2, 3)[0]]
    ['0F0', '0F1', '0B0', '0F2', '0B1', '0B2']
    """
    return [[op for cell in cells for op in cell]
            for cells in megatron_cells(devices, microbatches, chunks, group_size, combined)]


def megatron_cells(devices, microbatches, chunks=1, group_size=None, combined=False):
    """Megatron-LM's per-rank steps: ``cells[r]`` lists tuples of the operations one step
    runs, one each, or a steady step's forward and backward together with ``combined``
    (``get_pp_rank_microbatches`` adds the warm-up forward: "This is needed to ensure the
    forward and backward computations are independent in all 1f1b steps").

    >>> [len(step) for step in megatron_cells(2, 4, 2, combined=True)[1]][:6]
    [1, 1, 1, 2, 2, 2]
    """
    P, M, V = devices, microbatches, chunks
    G = P if group_size is None else group_size
    if V == 1:
        table = [(m, 0) for m in range(M)]
    else:
        table = []
        for first in range(0, M, G):
            last = M if first + G >= M else first + G
            table.extend((m, c) for c in range(V) for m in range(first, last))
    total = len(table)
    orders = []
    for rank in range(P):
        warmup = P - rank - 1 if V == 1 else 2 * (P - rank - 1) + (V - 1) * G
        warmup = min(warmup + (1 if combined and V > 1 else 0), total)
        forwards = [("F", c * P + rank, m) for m, c in table]
        backwards = [("B", (V - 1 - c) * P + rank, m) for m, c in table]
        order = [(op,) for op in forwards[:warmup]]
        for k in range(total - warmup):
            pair = (forwards[warmup + k], backwards[k])
            order += [pair] if combined and V > 1 else [(op,) for op in pair]
        order.extend((op,) for op in backwards[total - warmup:])
        orders.append(order)
    return orders


def _table_orders(table):
    """The table's per-device order as ``(kind, stage, microbatch)`` tuples."""
    return [[op for cell in cells for op in cell] for cells in _table_cells(table)]


def _table_cells(table):
    """The table's per-device cells, each a tuple of ``(kind, stage, microbatch)`` in
    the order :func:`megatron_cells` gives a combined step (forward first)."""
    cells = [[] for _ in range(table.num_devices)]
    starts = table.cell_starts().tolist() if len(table) else []
    for device, kind, stage, microbatch, start in zip(
            table.device.tolist(), table.kind.tolist(), table.stage.tolist(),
            table.microbatch.tolist(), starts):
        op = (KINDS[kind], stage, microbatch)
        if start:
            cells[device].append([op])
        else:
            cells[device][-1].append(op)
    return [[tuple(sorted(cell, key=lambda op: op[0] != "F")) for cell in device]
            for device in cells]


def _first_difference(mine, theirs):
    """``(device, position, table op, Megatron op)`` where two orders first part."""
    for device, (a, b) in enumerate(zip(mine, theirs)):
        for position in range(max(len(a), len(b))):
            left = a[position] if position < len(a) else None
            right = b[position] if position < len(b) else None
            if left != right:
                return device, position, left, right
    return None


def _text(cell):
    if cell is None:
        return "nothing"
    return "+".join(f"{op[1]}{op[0]}{op[2]}" for op in cell)


def _refusal(reason):
    return InvalidScheduleError(f"Megatron-LM cannot run this table: {reason}")


def _check_structure(table):
    """``(P, V)`` if the table has a shape Megatron-LM schedules, else raise."""
    kinds = set(table.kind.tolist())
    if kinds - {FORWARD, BACKWARD}:
        raise _refusal("it splits backwards into input-grad (I) and weight-grad (W) "
                       "operations; Megatron-LM's schedules run each backward whole (B)")
    fused = bool(len(table)) and not np.all(table.cell_starts())
    sizes = table.microbatch_sizes
    if any(size != sizes[0] for size in sizes):
        raise _refusal("its microbatches differ in size; Megatron-LM's --micro-batch-size "
                       "is one number")
    P, S = table.num_devices, table.num_stages
    placement = table.placement()
    for stage in range(S):
        devices = placement.get(stage, ())
        if len(devices) != 1:
            raise _refusal(f"stage {stage} runs on devices {', '.join(map(str, devices))}; "
                           f"Megatron-LM places each stage on one rank")
    if S % P:
        raise _refusal(f"its {S} stages do not split into the same number of virtual "
                       f"stages on each of its {P} devices")
    for stage in range(S):
        (device,) = placement[stage]
        if device != stage % P:
            raise _refusal(f"stage {stage} is on device {device}, but Megatron-LM puts "
                           f"model chunk {stage} on rank {stage % P} (stage mod "
                           f"{P}, the looped placement; V-shaped placements such as "
                           f"ZB-V's are not among its schedules)")
    if fused and S == P:
        raise _refusal("it fuses a forward and a backward into one cell; Megatron-LM "
                       "runs fused pairs only as its combined 1F1B, which needs virtual "
                       "stages (interleaved-1f1b pairs=fused)")
    return P, S // P, fused


def _layer_arguments(table, V, num_layers):
    """Flags that give Megatron-LM the table's layers per stage."""
    S = table.num_stages
    layers = table.stage_layers
    if layers is None:
        if num_layers is None:
            return [], ["give --num-layers for your model (the table does not say how many "
                        "layers it holds; an even split over its stages is assumed)"]
        if num_layers % S:
            raise InvalidParameterError(f"num_layers {num_layers} do not split evenly over "
                                        f"the table's {S} stages")
        layers = [num_layers // S] * S
    elif num_layers is not None and sum(layers) != num_layers:
        raise InvalidParameterError(f"num_layers {num_layers} differs from the table's "
                                    f"stage_layers, which sum to {sum(layers)}")
    total = int(sum(layers))
    arguments = [("--num-layers", total)]
    if len(set(layers)) == 1:
        if V > 1:
            arguments.append(("--num-layers-per-virtual-pipeline-stage", int(layers[0])))
        return arguments, []
    middle = set(layers[1:-1])
    if V == 1 and S >= 3 and len(middle) == 1:
        (even,) = middle
        if layers[0] != even:
            arguments.append(("--decoder-first-pipeline-num-layers", int(layers[0])))
        if layers[-1] != even:
            arguments.append(("--decoder-last-pipeline-num-layers", int(layers[-1])))
        return arguments, []
    parts = [("t" if count == 1 else f"t*{count}") if count else "" for count in layers]
    parts[0] = ",".join(part for part in ("E", parts[0]) if part)
    parts[-1] = ",".join(part for part in (parts[-1], "L") if part)
    arguments.append(("--pipeline-model-parallel-layout", "'" + "|".join(parts) + "'"))
    return arguments, ["--pipeline-model-parallel-layout is experimental in Megatron-LM"]


def execution_arguments(execution):
    """Megatron-LM's flags for an execution's tensor and sequence parallelism,
    recomputation (selective: the attention core; full: every layer, one at a time),
    distributed optimizer (ZeRO-1), FlashAttention and overlapped gradient reduction;
    ``(flag, value)`` pairs, ``None`` for a flag that takes no value.

    >>> from tabsched.execution import Execution
    >>> execution_arguments(Execution(tensor_parallel=8, sequence_parallel=True,
    ...                               recompute="selective", zero_stage=1))
    (('--tensor-model-parallel-size', 8), ('--sequence-parallel', None), ('--recompute-granularity', 'selective'), ('--use-distributed-optimizer', None))
    """
    arguments = [("--tensor-model-parallel-size", int(execution.tensor_parallel))]
    if execution.context_parallel > 1:
        arguments += [("--context-parallel-size", int(execution.context_parallel)),
                      ("--cp-comm-type", execution.context_exchange)]
    if execution.expert_parallel > 1:
        # the experts split over the tensor ranks too: expert tensor parallelism = t
        arguments += [("--expert-model-parallel-size", int(execution.expert_parallel)),
                      ("--moe-token-dispatcher-type", "alltoall")]
    if execution.sequence_parallel:
        arguments.append(("--sequence-parallel", None))
    if execution.recompute == "selective":
        arguments.append(("--recompute-granularity", "selective"))
    elif execution.recompute == "full":
        arguments += [("--recompute-granularity", "full"), ("--recompute-method", "uniform"),
                      ("--recompute-num-layers", 1)]
    if execution.zero_stage >= 1:
        arguments.append(("--use-distributed-optimizer", None))
    if execution.zero_stage >= 2:
        # Megatron-FSDP (Megatron-core's user guide, "Megatron FSDP"; --use-custom-fsdp in
        # earlier releases): --data-parallel-sharding-strategy optim_grads (ZeRO-2) or
        # optim_grads_params (ZeRO-3), which needs --no-gradient-accumulation-fusion
        arguments += [("--use-megatron-fsdp", None),
                      ("--data-parallel-sharding-strategy",
                       "optim_grads_params" if execution.zero_stage == 3 else "optim_grads"),
                      ("--no-gradient-accumulation-fusion", None)]
    if execution.attention == "flash":
        arguments.append(("--use-flash-attn", None))
    if execution.fp8 is not None:
        # Transformer Engine's hybrid format (E4M3 forward, E5M2 gradients) and the recipe
        arguments += [("--fp8-format", "hybrid"), ("--fp8-recipe", execution.fp8)]
    if execution.overlap_grad_reduce:
        arguments.append(("--overlap-grad-reduce", None))
        if execution.grad_bucket_size is not None:
            arguments.append(("--ddp-bucket-size", execution.grad_bucket_size))
        if not execution.align_grad_reduce:
            arguments.append(("--no-align-grad-reduce", None))
    return tuple(arguments)


def megatron_arguments(table, *, micro_batch_size=1, data_parallel=1, num_layers=None,
                       execution=None):
    """The Megatron-LM arguments that run ``table``, or ``InvalidScheduleError`` why not.

    Parameters
    ----------
    table : ScheduleTable
    micro_batch_size : int
        Samples per microbatch (``--micro-batch-size``); the global batch is
        ``microbatches * micro_batch_size * data_parallel``.
    data_parallel : int
        Pipelines in data parallel (only the global batch depends on it).
    num_layers : int, optional
        The model's layers, when the table has no ``stage_layers``.
    execution : Execution, optional
        Add the flags of its other fields (:func:`execution_arguments`).

    Returns
    -------
    MegatronLaunch
    """
    for name, value in (("micro_batch_size", micro_batch_size),
                        ("data_parallel", data_parallel)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise InvalidParameterError(f"{name} must be a positive integer, not {value!r}")
    P, V, fused = _check_structure(table)
    M = table.num_microbatches
    mine = _table_cells(table)
    if V == 1:
        candidates = [None]
        schedule = "forward_backward_pipelining_without_interleaving (1F1B)"
    else:
        if M < P:
            raise _refusal(f"with virtual stages Megatron-LM needs at least as many "
                           f"microbatches as ranks ({M} < {P})")
        candidates = [G for G in range(P, M + 1) if M % G == 0 or M % G >= P]
        schedule = ("combined_1f1b_schedule_for_interleaved_pipelining (combined 1F1B)"
                    if fused else
                    "forward_backward_pipelining_with_interleaving (interleaved 1F1B)")
    first_difference = None
    for group_size in candidates:
        difference = _first_difference(mine, megatron_cells(P, M, V, group_size, fused))
        if difference is None:
            arguments = [("--pipeline-model-parallel-size", P)]
            layer_arguments, notes = _layer_arguments(table, V, num_layers)
            arguments += layer_arguments
            if V > 1 and not any(flag.endswith("layout") for flag, _ in arguments) \
                    and not any(flag == "--num-layers-per-virtual-pipeline-stage"
                                for flag, _ in arguments):
                arguments.append(("--num-virtual-stages-per-pipeline-rank", V))
            if group_size is not None:
                arguments.append(("--microbatch-group-size-per-virtual-pipeline-stage",
                                  group_size))
            arguments += [("--micro-batch-size", int(micro_batch_size)),
                          ("--global-batch-size", int(M * micro_batch_size * data_parallel))]
            if fused:
                # the pairs' all-to-alls hidden layer by layer, the weight gradients held
                # back to fill them (Megatron-Core requires both together, expert
                # parallelism and CUDA_DEVICE_MAX_CONNECTIONS > 1 to overlap at all)
                arguments += [("--overlap-moe-expert-parallel-comm", None),
                              ("--delay-wgrad-compute", None)]
                notes = notes + ["set CUDA_DEVICE_MAX_CONNECTIONS above 1 (with 1 the pairs' "
                                 "all-to-alls queue behind their compute); Megatron-Core "
                                 "refuses full recomputation with this overlap outside "
                                 "NVIDIA/Megatron-LM#6311's branch"]
            if execution is None:
                notes = notes + ["add your model's arguments, --tensor-model-parallel-size "
                                 "and the data-parallel world size; Megatron-LM infers the "
                                 "number of microbatches from the global batch"]
            else:
                arguments += list(execution_arguments(execution))
                gpus = P * execution.tensor_parallel * data_parallel
                notes = notes + [f"add your model's arguments and launch on {gpus} GPUs "
                                 f"(the data-parallel size, {data_parallel}, is the world "
                                 f"size over tensor x pipeline); Megatron-LM infers the "
                                 f"number of microbatches from the global batch"]
            return MegatronLaunch(tuple(arguments), schedule, tuple(notes))
        if first_difference is None:
            first_difference = (group_size, difference)
    group_size, (device, position, table_op, megatron_op) = first_difference
    shape = f"{P} ranks" + (f" x {V} virtual stages, microbatch group size {group_size}"
                            if V > 1 else "")
    raise _refusal(f"its order is not Megatron-LM's {schedule.split(' (')[1][:-1]} "
                   f"({shape}, {M} microbatches): device {device}, position {position} runs "
                   f"{_text(table_op)} where Megatron-LM runs {_text(megatron_op)}")


def megatron_flops(model, global_batch, *, tensor_parallel=1, vocab_divisible_by=128):
    """FLOPs of one iteration as Megatron-LM counts them for its logged TFLOP/s/GPU.

    Megatron-LM's ``num_floating_point_operations`` (``megatron/training/training.py``,
    the BSHD case, every sample ``sequence`` tokens long) counts each GEMM three times
    (forward, data and weight gradient) at two FLOPs per multiply-add, so ``6 x`` the
    multiply-adds per token of:

    * attention projections, per layer: ``h (q + 2 kv) + q h`` with ``q`` the query
      width, ``kv`` the key and value width of grouped-query attention; multi-head latent
      attention: ``r_q (h + n (d_nope + d_rope) + 1) + r_kv (h + n (d_nope + d_v) + 1)
      + h d_rope + n d_v h`` (``h n (d_nope + d_rope)`` without a query low rank);
    * core attention, per layer and token, ``s q`` over the causal half (``QK^T`` and
      ``PV``: ``s (n (d_nope + d_rope) + n d_v) / 2`` for MLA);
    * the MLP ``h f k'`` (``k' = 3`` gated, else 2) of each dense layer, and of each MoE
      layer ``h f_e k' (top_k + shared)``;
    * multi-token prediction, per module, a layer (MoE where the model's last layer is)
      plus ``3 h + 2 h^2`` (its norms and projection) and one more logit head;
    * the logits ``h V`` per head, ``V`` padded to a multiple of ``vocab_divisible_by x
      tensor_parallel`` (``--make-vocab-size-divisible-by``, default 128).

    Only what runs differs from tabsched's own ``model_flops`` count: attention over the
    causal half of ``s x s`` (tabsched's counts the whole square, as its kernels price
    it), no norms, no router. Divide by the iteration's seconds and the GPUs for Megatron-
    LM's TFLOP/s/GPU.

    >>> from tabsched.costs.transformer import load_model
    >>> f"{megatron_flops(load_model('deepseek-v3-14l'), 256):.4e}"
    '3.5664e+16'
    """
    from tabsched.costs.transformer import load_model

    model = load_model(model)
    for name, value in (("global_batch", global_batch), ("tensor_parallel", tensor_parallel),
                        ("vocab_divisible_by", vocab_divisible_by)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise InvalidParameterError(f"{name} must be a positive integer, not {value!r}")
    h, n, s, L = model.hidden, model.heads, model.sequence, model.layers
    mtp = int(getattr(model, "mtp_layers", 0) or 0)
    layers = L + mtp
    if getattr(model, "kv_lora_rank", None):
        nope, rope = model.qk_nope_head_dim, model.qk_rope_head_dim
        v = model.v_head_dim
        q_lora = getattr(model, "q_lora_rank", None)
        q_term = (q_lora * (h + n * (nope + rope) + 1) if q_lora
                  else h * n * (nope + rope))
        projections = (q_term + model.kv_lora_rank * (h + n * (nope + v) + 1)
                       + h * rope + n * v * h)
        core = (n * (nope + rope) + n * v) / 2
    else:
        width = getattr(model, "head_dim", None) or h // n
        q, kv = width * n, width * model.kv_heads
        projections = h * (q + 2 * kv) + q * h
        core = q
    gate = 3 if model.gated_ffn else 2
    experts = int(getattr(model, "experts", 0) or 0)
    dense = min(int(getattr(model, "dense_layers", 0) or 0), L) if experts else L
    moe = L - dense
    if mtp:
        if experts and moe > 0:
            moe += mtp
        else:
            dense += mtp
    mlp = h * gate * model.ffn * dense
    if experts:
        mlp += h * gate * model.expert_ffn * (model.top_k + model.shared_experts) * moe
    step = vocab_divisible_by * tensor_parallel
    vocab = -(-model.vocab // step) * step
    per_token = 6 * (mlp + projections * layers + mtp * (3 * h + 2 * h * h)
                     + h * vocab * (mtp + 1))
    return float(global_batch * s * (per_token + 6 * s * core * layers))
