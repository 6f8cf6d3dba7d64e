"""Execution: how a model runs across devices, as one frozen value.

An evaluation stands on four descriptions, kept apart as Calculon keeps them
(Isaev et al., SC'23): the **model** (what a layer computes,
:mod:`tabsched.costs.transformer`), the **system** (what the hardware does,
:mod:`tabsched.costs.system`), the **execution** (how the model runs across the
devices: this module) and the **schedule** (the table: which pipeline rank runs
which operation when). An :class:`Execution` holds everything of the third:

Parallel degrees beside the pipeline
    ``tensor_parallel`` *t* splits every layer over *t* GPUs (Megatron-LM;
    Shoeybi et al. 2019, section 3); ``sequence_parallel`` turns its
    all-reduces into reduce-scatter + all-gather pairs and splits the norms and
    dropouts over the sequence (Korthikanti et al. 2022, section 4.2.2; needs
    *t* > 1); ``context_parallel`` *cp* splits the sequence over *cp* GPUs
    (Megatron-LM's context parallelism, with causal load balancing: each rank
    holds two of ``2 cp`` chunks), whose attention exchanges keys and values as
    ``cp_comm`` says: ``p2p`` (ring attention, each step's key-value block passed
    to the next rank beside the previous block's attention; the default) or
    ``allgather`` (Llama 3's: the keys and values all-gathered before the
    attention, their gradients reduce-scattered after) or ``a2a`` (DeepSpeed-Ulysses,
    Jacobs et al. 2023: all-to-alls turn the sequence split into a head split for the
    attention and back; the heads and key-value heads must split over ``t * cp``);
    the gradients are reduced
    over the data-parallel and context-parallel ranks together (*d x cp*);
    ``expert_parallel`` *e* is the degree of expert parallelism of a mixture-of-experts
    model (its groups are formed inside the data-parallel ranks, as Megatron-Core forms
    them; the routed experts are split over it: :mod:`tabsched.costs.experts`);
    ``data_parallel`` *d* is
    the number of replicas of the pipeline, whose gradients are reduced over the
    data-parallel group.
The batch
    ``microbatch_size`` *b*: samples per microbatch (``None``: the model's);
    ``global_batch``: samples per iteration over all *d* replicas, as
    Megatron-LM's ``--global-batch-size`` and torchtitan's global batch count
    them, so that a pipeline runs ``global_batch / (d * b)`` microbatches
    (:attr:`Execution.microbatches`).
Memory
    ``recompute``: ``none``, ``selective`` (the attention core) or ``full``
    (``None``: the model's); ``zero_stage``: what is sharded over the
    data-parallel group of ``d`` replicas (Rajbhandari et al. 2020, "ZeRO",
    section 5): 0 nothing (DDP); 1 the optimizer state (Megatron-LM's
    distributed optimizer); 2 also the gradients, reduce-scattered after a
    stage's last backward; 3 also the parameters, all-gathered before a stage
    is used and freed after (PyTorch FSDP ``FULL_SHARD``, FSDP2
    ``fully_shard``, torchtitan's ``data_parallel_shard_degree = d``). Stages 2
    and 3 lower to ``UNSHARD``/``RESHARD``/``REDUCE_GRAD`` nodes
    (:mod:`tabsched.sharding`) and need ``d > 1``. With stage 3,
    ``reshard_after_forward`` (FSDP2's ``fully_shard`` argument, default true;
    false is FSDP1's ``SHARD_GRAD_OP``) frees a stage's parameters after its
    forwards and gathers them again before its backwards, and ``prefetch`` is
    how many operations ahead of its use a stage's all-gather may be issued
    (default 1: FSDP's one-module prefetch, ``BackwardPrefetch.BACKWARD_PRE``
    and FSDP2's implicit backward prefetch); both are ``None`` (the default)
    below stage 3.
Kernels and sends
    ``fp8``: the layers' linear products in FP8 as Transformer Engine runs them
    (:mod:`tabsched.costs.kernels`): ``None`` (the model's dtype), ``delayed``
    (per-tensor scales from an amax history, TE's default), ``tensorwise`` (per-tensor
    scales from the current amax: one more read of each cast tensor) or ``blockwise``
    (DeepSeek-V3's 1x128 and 128x128 tiles, scaled in the cast itself); the system must
    state an FP8 rate (``fp8_peak_flops``);
    ``attention``: ``eager`` (the ``s x s`` scores in memory) or ``flash``
    (Dao et al. 2022); ``scatter_gather``: pipeline transfers carry ``1/t``
    of the activation per tensor rank (Megatron-LM's
    ``--scatter-gather-tensors-in-pipeline``, on by default);
    ``p2p``: how the runtime posts and waits on pipeline sends and receives
    (:mod:`tabsched.p2p`: ``free``, ``blocking``, ``megatron-batched``,
    ``megatron-overlap``, ``pytorch``; ``None``: ``blocking`` with
    ``blocking_sends``, else ``free``); ``blocking_sends``: a transfer keeps its
    sender's compute stream busy until it ends (``None``: the system's), the older
    spelling of ``p2p = "blocking"``.
The network
    ``contention``: ``none`` (transfers never wait for each other), ``link``
    (each directed device pair is a FIFO) or ``nic`` (transfers between nodes
    also share each node's ports) (``None``: the system's, else ``none``);
    ``devices_per_node``: GPUs per node (``None``: the system's).
The iteration's tail
    ``overlap_grad_reduce``: the data-parallel gradient reduction of each stage
    runs in buckets of ``grad_bucket_size`` parameters (``None``: Megatron-Core's
    ``max(4e7, 1e6 * d)``), each launched as the stage's last backward fills it,
    beside that backward and the device's remaining ones; what is left after the
    backward is the queue's tail (:mod:`tabsched.costs.buckets`);
    ``align_grad_reduce`` (Megatron-Core's default, true): only the first pipeline rank's
    stages overlap their buckets with the backward, the other ranks launch theirs at once
    after their last backward, in the pipeline's bubble (false: every stage's buckets
    overlap, PyTorch DDP's and ``--no-align-grad-reduce``); ``grad_sync``: stages whose
    gradients are all-reduced among the pipeline ranks that hold them, ``None`` (the
    table's own, PyTorch's ``REDUCE_GRAD``, else none, or every stage when the
    data-parallel reduction overlaps), ``"replicas"`` (stages held by two or more ranks,
    Chimera's), ``"all"`` or a tuple of stages; ``optimizer_step``: an optimizer step per
    device ends the iteration (``None``: when the data-parallel reduction needs
    it, that is ``d > 1`` without ``overlap_grad_reduce``).
Iterations back to back
    ``post_validation``: Zero Bubble's optimizer post-validation (Qi et al. 2024,
    section 4): the optimizer step does not wait for the global gradient norm
    (Megatron-LM's default ``--clip-grad 1.0`` all-reduces it over every pipeline
    rank before the step), so one iteration's cool-down may overlap the next one's
    warm-up. It changes the steady-state period (:mod:`tabsched.steady`), not the
    single iteration's makespan.
The GPU's queues
    ``max_connections``: ``CUDA_DEVICE_MAX_CONNECTIONS``, the hardware work queues a GPU's
    streams share (``None``: CUDA's default, 8); at 1 (Megatron-LM sets it for its
    tensor-parallel overlap) kernels start in the order they were launched, so an
    overlapped cell's communication and compute streams hold each other back
    (:mod:`tabsched.costs.streams`).

A field left ``None`` is "what the model or the system says"; a cost model
resolves them (:meth:`Execution.resolved`), and the resolved execution is what a
result echoes. Executions compare and hash by value, so they can be searched
over, kept in sets and used as cache keys.

Files are TOML (``.toml``) or JSON (``.json``) with the fields as top-level keys;
any key left out keeps its default. A file is untrusted: its size and nesting
are bounded before parsing, and an unknown key, a wrong type or a degree that
does not fit is one line naming the file and the key.

>>> run = Execution(tensor_parallel=8, sequence_parallel=True, data_parallel=4,
...                 microbatch_size=1, global_batch=512)
>>> run.microbatches
128
>>> run.replace(data_parallel=8).microbatches
64
>>> print(run.to_toml().splitlines()[0])
tensor_parallel = 8
>>> Execution.from_dict({"tensor_parallel": 8, "sequence_parallel": True}) == Execution(
...     tensor_parallel=8, sequence_parallel=True)
True
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass

import numpy as np

from tabsched import _untrusted
from tabsched.exceptions import InvalidParameterError

__all__ = ["Execution", "load_execution", "Parallelism", "CONTENTION_MODES", "FP8_RECIPES",
           "CP_COMM_TYPES",
           "ATTENTION_IMPLEMENTATIONS", "RECOMPUTE_MODES", "GRAD_SYNC_MODES", "ZERO_STAGES"]

#: How transfers share the network (see the module docstring).
CONTENTION_MODES = ("none", "link", "nic")
#: How a runtime posts and waits on pipeline transfers (:mod:`tabsched.p2p`).
P2P_MODES = ("free", "blocking", "megatron-batched", "megatron-overlap", "pytorch")
#: FP8 scaling recipes (Transformer Engine's ``DelayedScaling`` and ``Float8CurrentScaling``,
#: and DeepSeek-V3's fine-grained tiles, Megatron-LM's ``--fp8-recipe blockwise``).
FP8_RECIPES = ("delayed", "tensorwise", "blockwise")
#: How context-parallel ranks exchange keys and values (Megatron-LM's ``--cp-comm-type``:
#: ``p2p`` is ring attention, ``allgather`` Llama 3's, ``a2a`` DeepSpeed-Ulysses').
CP_COMM_TYPES = ("p2p", "allgather", "a2a")
#: The attention kernels (``eager``: Megatron-LM without FlashAttention).
ATTENTION_IMPLEMENTATIONS = ("eager", "flash")
#: Activation recomputation (Korthikanti et al. 2022, section 5).
RECOMPUTE_MODES = ("none", "selective", "full")
#: The named choices of ``grad_sync`` (besides None and a tuple of stages).
GRAD_SYNC_MODES = ("replicas", "all")
#: ZeRO stages tabsched prices (Rajbhandari et al. 2020, section 5): 0 (replicated state),
#: 1 (optimizer state sharded), 2 (and gradients), 3 (and parameters: FSDP's FULL_SHARD).
ZERO_STAGES = (0, 1, 2, 3)
#: FSDP2's ``fully_shard(reshard_after_forward=True)`` default
#: (torch/distributed/fsdp/_fully_shard/_fully_shard.py).
DEFAULT_RESHARD_AFTER_FORWARD = True
#: One stage's all-gather issued one operation ahead: FSDP1's default
#: ``BackwardPrefetch.BACKWARD_PRE`` and FSDP2's implicit prefetch of the next module
#: in backward (torch/distributed/fsdp/_fully_shard/_fsdp_state.py) prefetch one ahead.
DEFAULT_PREFETCH = 1
#: CUDA_DEVICE_MAX_CONNECTIONS takes 1 to 32 hardware work queues (CUDA's default 8;
#: CUDA C++ Programming Guide, "CUDA Environment Variables").
MAX_CONNECTIONS = 32
#: Deepest prefetch: a row has at most 2**16 stages' worth of look-ahead that matters.
MAX_PREFETCH = 2**16
#: The largest gradient bucket, in parameters (a 2**50-parameter stage is past any model).
MAX_BUCKET = 2**50
#: Largest parallel degree: the largest published training runs use about 2**15 GPUs in
#: all (Llama 3 405B: 16,384 H100s); 2**20 is 64x that, and every product of degrees
#: stays an exact int64.
MAX_DEGREE = 2**20
#: Largest microbatch size and global batch: 2**24 samples (16.7M; GPT-3 175B used 1,536
#: sequences per iteration, Brown et al. 2020, Table 2.1; Megatron-LM's 1T run 3,072, Narayanan
#: et al. 2021, Table 1), as the model's own bound.
MAX_SAMPLES = 2**24
#: Most stages a ``grad_sync`` list names: a table's stages are bounded by its own
#: operations, and no pipeline has more than 2**16.
MAX_SYNC_STAGES = 2**16
#: GPUs in one node (one fast-link domain): the system's own bound,
#: ``costs.system.MAX_DEVICES_PER_NODE`` (an NVL72 rack has 72, NVL576 576).
MAX_NODE = 65536

#: The fields that take a degree (an integer >= 1).
_DEGREES = ("tensor_parallel", "context_parallel", "expert_parallel", "data_parallel")
#: The fields that take true or false.
_FLAGS = ("sequence_parallel", "scatter_gather", "overlap_grad_reduce", "align_grad_reduce",
          "post_validation")


def _degree(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InvalidParameterError(f"{name} must be an integer >= 1, not "
                                    f"{_untrusted.shown_value(value)}")
    if value > MAX_DEGREE:
        raise InvalidParameterError(f"{name} must be an integer from 1 to {MAX_DEGREE}, not "
                                    f"{_untrusted.shown_value(value)}")
    return int(value)


def _flag(name, value):
    if not isinstance(value, (bool, np.bool_)):
        raise InvalidParameterError(f"{name} must be true or false, not "
                                    f"{_untrusted.shown_value(value)}")
    return bool(value)


def _choice(name, value, choices):
    if not isinstance(value, str) or value not in choices:
        shown = repr(value) if isinstance(value, str) and len(value) < 40 else \
            _untrusted.shown_value(value)
        raise InvalidParameterError(f"{name} {shown} is not one of {', '.join(choices)}")
    return value


def _grad_sync(value):
    """``None``, ``"replicas"``, ``"all"`` or a sorted tuple of distinct stages."""
    if value is None or value is False:
        return None
    if value is True:
        return "all"
    if isinstance(value, str):
        return _choice("grad_sync", value, GRAD_SYNC_MODES)
    try:
        stages = list(value)
    except TypeError:
        raise InvalidParameterError(f"grad_sync must be None, 'replicas', 'all' or a list of "
                                    f"stages, not {_untrusted.shown_value(value)}") from None
    if len(stages) > MAX_SYNC_STAGES:
        raise InvalidParameterError(f"grad_sync names {len(stages)} stages; at most "
                                    f"{MAX_SYNC_STAGES}")
    for k, stage in enumerate(stages):
        _untrusted.integer(f"grad_sync[{k}]", stage, 0, MAX_SYNC_STAGES - 1)
    return tuple(sorted({int(stage) for stage in stages}))


@dataclass(frozen=True)
class Execution:
    """How a model runs across devices; see the module docstring for every field.

    Parameters
    ----------
    tensor_parallel, context_parallel, expert_parallel, data_parallel : int
        Parallel degrees beside the pipeline (default 1).
    sequence_parallel : bool
    microbatch_size : int, optional
        Samples per microbatch; None: the model's.
    global_batch : int, optional
        Samples per iteration over all data-parallel replicas.
    recompute : {"none", "selective", "full"}, optional
    zero_stage : {0, 1, 2, 3}
    reshard_after_forward : bool, optional
        ZeRO-3 only (None: true, FSDP2's default).
    prefetch : int, optional
        ZeRO-3 only: operations ahead a stage's all-gather may start (None: 1).
    attention : {"eager", "flash"}
    fp8 : {"delayed", "tensorwise", "blockwise"}, optional
        The linear products in FP8 with this scaling recipe (None: the model's dtype).
    cp_comm : {"p2p", "allgather", "a2a"}, optional
        How context-parallel ranks exchange keys and values (None: ``p2p`` with
        ``context_parallel > 1``).
    scatter_gather : bool
    contention : {"none", "link", "nic"}, optional
    devices_per_node : int, optional
        GPUs per node; None: the system's.
    blocking_sends : bool, optional
        Deprecated: ``p2p="blocking"``.
    p2p : {"free", "blocking", "megatron-batched", "megatron-overlap", "pytorch"}, optional
    overlap_grad_reduce : bool
    grad_bucket_size : int, optional
        Parameters per gradient bucket of the overlapped reduction (None: Megatron-Core's).
    align_grad_reduce : bool
    grad_sync : None, "replicas", "all" or tuple of int
    optimizer_step : bool, optional
    post_validation : bool
    max_connections : int, optional
        ``CUDA_DEVICE_MAX_CONNECTIONS``: the hardware queues a GPU's streams share (None:
        CUDA's 8); 1 starts kernels in launch order, which an overlapped cell's two streams
        feel (:mod:`tabsched.costs.streams`).

    Notes
    -----
    Assigning to a field raises (the dataclass is frozen): use :meth:`replace`.
    """

    tensor_parallel: int = 1
    sequence_parallel: bool = False
    context_parallel: int = 1
    expert_parallel: int = 1
    data_parallel: int = 1
    microbatch_size: int | None = None
    global_batch: int | None = None
    recompute: str | None = None
    zero_stage: int = 0
    attention: str = "eager"
    scatter_gather: bool = True
    contention: str | None = None
    devices_per_node: int | None = None
    blocking_sends: bool | None = None
    p2p: str | None = None
    overlap_grad_reduce: bool = False
    grad_bucket_size: int | None = None
    align_grad_reduce: bool = True
    grad_sync: str | tuple | None = None
    optimizer_step: bool | None = None
    post_validation: bool = False
    reshard_after_forward: bool | None = None
    prefetch: int | None = None
    fp8: str | None = None
    cp_comm: str | None = None
    max_connections: int | None = None

    def __post_init__(self):
        def set_(key, value):
            object.__setattr__(self, key, value)
        for key in _DEGREES:
            set_(key, _degree(key, getattr(self, key)))
        for key in _FLAGS:
            set_(key, _flag(key, getattr(self, key)))
        for key in ("blocking_sends", "optimizer_step"):
            if getattr(self, key) is not None:
                set_(key, _flag(key, getattr(self, key)))
        if self.microbatch_size is not None:
            set_("microbatch_size", _untrusted.integer("microbatch_size", self.microbatch_size,
                                                       1, MAX_SAMPLES))
        if self.global_batch is not None:
            set_("global_batch", _untrusted.integer("global_batch", self.global_batch, 1,
                                                    MAX_SAMPLES))
        if self.recompute is not None:
            _choice("recompute", self.recompute, RECOMPUTE_MODES)
        if isinstance(self.zero_stage, bool) or not isinstance(self.zero_stage,
                                                               (int, np.integer)):
            raise InvalidParameterError(f"zero_stage must be 0, 1, 2 or 3, not "
                                        f"{_untrusted.shown_value(self.zero_stage)}")
        if self.zero_stage not in ZERO_STAGES:
            raise InvalidParameterError(
                f"zero_stage {_untrusted.shown_value(self.zero_stage)} is not a ZeRO stage: 0 "
                f"(replicated), 1 (optimizer state sharded), 2 (and gradients) or 3 (and "
                f"parameters, FSDP)")
        set_("zero_stage", int(self.zero_stage))
        if self.zero_stage >= 2 and self.data_parallel == 1:
            raise InvalidParameterError(
                f"zero_stage {self.zero_stage} with data_parallel 1 shards nothing: ZeRO "
                f"divides the state over the data-parallel replicas (use data_parallel > 1, "
                f"or zero_stage 0)")
        if self.reshard_after_forward is not None:
            set_("reshard_after_forward", _flag("reshard_after_forward",
                                                self.reshard_after_forward))
        if self.grad_bucket_size is not None:
            set_("grad_bucket_size", _untrusted.integer("grad_bucket_size",
                                                        self.grad_bucket_size, 1, MAX_BUCKET))
        if self.prefetch is not None:
            set_("prefetch", _untrusted.integer("prefetch", self.prefetch, 0, MAX_PREFETCH))
        if self.max_connections is not None:
            set_("max_connections", _untrusted.integer("max_connections", self.max_connections,
                                                       1, MAX_CONNECTIONS))
        _choice("attention", self.attention, ATTENTION_IMPLEMENTATIONS)
        if self.fp8 is not None:
            _choice("fp8", self.fp8, FP8_RECIPES)
        if self.cp_comm is not None:
            _choice("cp_comm", self.cp_comm, CP_COMM_TYPES)
        if self.context_parallel > 1 and self.zero_stage >= 2:
            raise InvalidParameterError(
                f"zero_stage {self.zero_stage} with context_parallel {self.context_parallel} "
                f"is not priced yet (FSDP would shard over the data and context ranks "
                f"together); use zero_stage 0 or 1")
        if self.contention is not None:
            _choice("contention", self.contention, CONTENTION_MODES)
        if self.devices_per_node is not None:
            set_("devices_per_node", _untrusted.integer("devices_per_node",
                                                        self.devices_per_node, 1, MAX_NODE))
        if self.p2p is not None:
            _choice("p2p", self.p2p, P2P_MODES)
            if self.blocking_sends and self.p2p != "blocking":
                raise InvalidParameterError(
                    f"p2p {self.p2p!r} contradicts blocking_sends = true (the older spelling "
                    f"of p2p = 'blocking'); give one of them")
        set_("grad_sync", _grad_sync(self.grad_sync))
        if self.sequence_parallel and self.tensor_parallel == 1:
            raise InvalidParameterError("sequence_parallel needs tensor_parallel > 1 (it splits "
                                        "the sequence over the tensor ranks)")
        self._check_batch(self.microbatch_size)

    def _check_batch(self, microbatch_size):
        """The global batch must be whole microbatches on every replica."""
        if self.global_batch is None or microbatch_size is None:
            return
        per_step = self.data_parallel * microbatch_size
        if self.global_batch % per_step:
            raise InvalidParameterError(
                f"global_batch {self.global_batch} is not divisible by data_parallel "
                f"{self.data_parallel} x microbatch_size {microbatch_size} = {per_step} "
                f"(each replica runs whole microbatches)")

    # ------------------------------------------------------------------ values
    def replace(self, **changes) -> Execution:
        """A copy with some fields changed (validated again).

        >>> Execution().replace(tensor_parallel=2).tensor_parallel
        2
        """
        unknown = sorted(set(changes) - set(FIELDS))
        if unknown:
            raise InvalidParameterError(f"Execution has no field {unknown[0]!r}"
                                        f"{_untrusted.suggestion(unknown[0], FIELDS)}")
        return dataclasses.replace(self, **changes)

    @property
    def microbatches(self) -> int | None:
        """Microbatches per pipeline and iteration, ``global_batch / (d * b)``, or None."""
        if self.global_batch is None or self.microbatch_size is None:
            return None
        return self.global_batch // (self.data_parallel * self.microbatch_size)

    @property
    def flash(self) -> bool:
        """Whether attention runs as one fused FlashAttention kernel (``attention == "flash"``)."""
        return self.attention == "flash"

    @property
    def p2p_mode(self) -> str:
        """The pipeline sends' mode: ``p2p``, else ``blocking`` with ``blocking_sends``,
        else ``free``."""
        if self.p2p is not None:
            return self.p2p
        return "blocking" if self.blocking_sends else "free"

    @property
    def optimizer_sharding(self) -> bool:
        """ZeRO stage 1 or more: the optimizer state divided over the data-parallel group."""
        return self.zero_stage >= 1

    @property
    def transfer_split(self) -> int:
        """Parts a pipeline transfer is cut into per tensor rank (``t`` or 1)."""
        split = self.sequence_parallel or self.scatter_gather
        return self.tensor_parallel if split else 1

    @property
    def ranks_per_stage(self) -> int:
        """GPUs of one pipeline rank over all its groups: ``t * cp * d``."""
        return self.tensor_parallel * self.context_parallel * self.data_parallel

    @property
    def needs_optimizer_step(self) -> bool:
        """Whether the iteration ends with an optimizer step per device: as asked, or
        (``optimizer_step`` None) when the data-parallel reduction runs in it."""
        if self.optimizer_step is not None:
            return self.optimizer_step
        return self.gradient_replicas > 1 and (not self.overlap_grad_reduce
                                               or self.zero_stage >= 2)

    @property
    def gradient_replicas(self) -> int:
        """Ranks that hold the same weights and reduce their gradients together: the data
        and the context ranks, ``d * cp`` (Megatron-LM's data-parallel group "with context
        parallel"; ZeRO-1 shards the optimizer state over it too)."""
        return self.data_parallel * self.context_parallel

    @property
    def expert_gradient_replicas(self) -> int:
        """Ranks that hold the same routed experts and reduce their gradients together:
        the expert-data-parallel group, ``d * cp / e`` (Megatron-Core's
        ``expert_data_parallel_group``)."""
        return max(1, self.gradient_replicas // self.expert_parallel)

    @property
    def context_exchange(self) -> str | None:
        """``cp_comm``, or ``p2p`` with context parallelism; None without it."""
        if self.context_parallel == 1:
            return None
        return self.cp_comm if self.cp_comm is not None else "p2p"

    @property
    def shards_parameters(self) -> bool:
        """ZeRO stage 3 (FSDP): each stage's parameters gathered before use, freed after."""
        return self.zero_stage >= 3

    @property
    def sharding(self):
        """The lowering's sharding options ``(zero_stage, reshard_after_forward,
        prefetch)`` for ZeRO stage 2 or 3 (:mod:`tabsched.sharding`), else None."""
        if self.zero_stage < 2:
            return None
        if self.zero_stage == 2:
            return (2, False, 0)
        reshard = DEFAULT_RESHARD_AFTER_FORWARD if self.reshard_after_forward is None \
            else self.reshard_after_forward
        prefetch = DEFAULT_PREFETCH if self.prefetch is None else self.prefetch
        return (3, reshard, prefetch)

    @property
    def default_grad_sync(self):
        """The stages synced when the table says nothing: ``grad_sync``, or every stage
        when the data-parallel reduction overlaps the backwards (it runs in the sync nodes)."""
        if self.gradient_replicas > 1 and self.overlap_grad_reduce:
            return "all"
        return self.grad_sync

    def resolved(self, model=None, system=None) -> Execution:
        """This execution with its None fields filled from ``model`` and ``system``.

        The microbatch size and recompute come from the model, contention, the node
        size and blocking sends from the system (without one: ``none``, unset,
        false), the p2p mode from them (:attr:`p2p_mode`), the optimizer step from
        :attr:`needs_optimizer_step`.
        """
        changes = {}
        if model is not None:
            if self.microbatch_size is None:
                changes["microbatch_size"] = model.microbatch_size
            if self.recompute is None:
                changes["recompute"] = model.recompute
        if self.contention is None:
            changes["contention"] = system.contention if system is not None else "none"
        if self.devices_per_node is None and system is not None:
            changes["devices_per_node"] = system.devices_per_node
        if self.blocking_sends is None and self.p2p is None:
            changes["blocking_sends"] = system.blocking_sends if system is not None else False
        elif self.blocking_sends is None:
            changes["blocking_sends"] = self.p2p == "blocking"
        if self.p2p is None:
            changes["p2p"] = "blocking" if changes.get("blocking_sends", self.blocking_sends) \
                else "free"
        if self.optimizer_step is None:
            changes["optimizer_step"] = self.needs_optimizer_step
        return dataclasses.replace(self, **changes) if changes else self

    def check(self, model, system=None) -> Execution:
        """Raise for a model or system this execution cannot run (one line each).

        Every degree must divide what it splits: the tensor degree the hidden size,
        the heads, the key/value heads and the MLP width; with sequence parallelism
        the tensor degree, and the context degree, the sequence. The global batch
        must be whole microbatches on every replica. On a system, the GPUs of one
        pipeline rank (``t * cp * d``), and those of its tensor and context groups
        (``t * cp``), must fill nodes or share one evenly (Megatron-LM places ranks
        tensor first, then context, data, pipeline), and so must a tensor group (one
        across nodes is priced on the network: :mod:`tabsched.costs.collectives`).
        """
        t, cp = self.tensor_parallel, self.context_parallel
        if t > 1:
            for what, size in (("hidden", model.hidden), ("heads", model.heads),
                               ("kv_heads", model.kv_heads), ("ffn", model.ffn)):
                if size % t:
                    raise InvalidParameterError(
                        f"tensor_parallel {t} does not divide {what} {size} of model "
                        f"{model.name}")
        if self.sequence_parallel and model.sequence % t:
            raise InvalidParameterError(f"sequence_parallel: tensor_parallel {t} does not "
                                        f"divide sequence {model.sequence} of model "
                                        f"{model.name}")
        if cp > 1 and model.sequence % (2 * cp):
            raise InvalidParameterError(
                f"context_parallel {cp}: sequence {model.sequence} of model {model.name} "
                f"is not a multiple of 2 x {cp} (causal load balancing gives each rank two "
                f"of 2 x cp equal chunks)")
        if cp > 1 and self.attention != "flash":
            raise InvalidParameterError(
                f"context_parallel {cp} needs attention 'flash': the attention over the "
                f"exchanged key-value blocks runs fused (Megatron-LM's context parallelism "
                f"uses Transformer Engine's fused attention)")
        if cp > 1 and self.context_exchange == "a2a":
            for what, size in (("heads", model.heads), ("kv_heads", model.kv_heads)):
                if size % (t * cp):
                    raise InvalidParameterError(
                        f"cp_comm 'a2a': tensor_parallel x context_parallel {t * cp} does "
                        f"not divide {what} {size} of model {model.name} (Ulysses splits "
                        f"the attention's heads over the context ranks)")
        if cp > 1 and self.sequence_parallel and (model.sequence // cp) % t:
            raise InvalidParameterError(
                f"sequence_parallel: tensor_parallel {t} does not divide the "
                f"{model.sequence // cp} tokens of a context rank")
        self._check_experts(model)
        self._check_batch(self.microbatch_size if self.microbatch_size is not None
                          else model.microbatch_size)
        if system is not None and self.fp8 is not None and \
                getattr(system, "fp8_peak_flops", None) is None:
            raise InvalidParameterError(
                f"fp8 {self.fp8!r}: system {system.name} states no FP8 rate "
                f"(fp8_peak_flops); A100 and older tensor cores have none")
        if system is not None:
            node = self.node_size(system)
            if t > node and t % node:
                raise InvalidParameterError(
                    f"tensor_parallel {t} is larger than a node of system {system.name} "
                    f"({node} devices) but does not fill whole nodes: a tensor group "
                    f"would straddle nodes")
            if t <= node and node % t:
                raise InvalidParameterError(
                    f"tensor_parallel {t} does not divide the {node} devices of a node of "
                    f"system {system.name}: tensor groups would straddle nodes")
            for what, ranks in (("tensor x context parallel", t * cp),
                                ("a pipeline rank (tensor x context x data parallel)",
                                 self.ranks_per_stage)):
                if node % ranks and ranks % node:
                    raise InvalidParameterError(
                        f"the {ranks} devices of {what} neither divide nor fill the "
                        f"{node}-device nodes of system {system.name}")
        return self

    def _check_experts(self, model):
        """Expert parallelism needs experts it divides and a data-parallel degree it
        divides (its groups are formed inside the data dimension); experts under tensor
        parallelism need sequence parallelism (as Megatron-Core requires)."""
        e, t = self.expert_parallel, self.tensor_parallel
        experts = getattr(model, "experts", 0)
        if e > 1 and not experts:
            raise InvalidParameterError(f"expert_parallel {e}: model {model.name} has no "
                                        f"experts (a dense model)")
        if not experts:
            return
        if experts % e:
            raise InvalidParameterError(f"expert_parallel {e} does not divide the {experts} "
                                        f"experts of model {model.name}")
        if self.data_parallel % e:
            raise InvalidParameterError(
                f"expert_parallel {e} does not divide data_parallel {self.data_parallel}: "
                f"expert groups are formed inside the data-parallel ranks")
        if t > 1 and model.expert_ffn % t:
            raise InvalidParameterError(f"tensor_parallel {t} does not divide expert_ffn "
                                        f"{model.expert_ffn} of model {model.name}")
        if t > 1 and not self.sequence_parallel:
            raise InvalidParameterError(
                f"tensor_parallel {t} with experts needs sequence_parallel (Megatron-Core "
                f"refuses a mixture of experts under tensor parallelism without it)")
        if e > 1 and self.context_parallel > 1:
            raise InvalidParameterError(
                f"expert_parallel {e} with context_parallel {self.context_parallel} is not "
                f"priced yet (the expert-data group would span context ranks)")
        if e > 1 and self.zero_stage >= 2:
            raise InvalidParameterError(
                f"expert_parallel {e} with zero_stage {self.zero_stage} is not priced yet "
                f"(its per-stage gathers would mix two groups); use zero_stage 0 or 1")

    def node_size(self, system) -> int:
        """GPUs per node: this execution's ``devices_per_node``, else the system's."""
        return self.devices_per_node if self.devices_per_node is not None \
            else system.devices_per_node

    # ------------------------------------------------------------------- files
    def to_dict(self) -> dict:
        """Every field, in order, as JSON holds it (a tuple of stages as a list).

        >>> Execution(data_parallel=2).to_dict()["data_parallel"]
        2
        """
        data = {}
        for key in FIELDS:
            value = getattr(self, key)
            data[key] = list(value) if isinstance(value, tuple) else value
        return data

    def to_json(self) -> str:
        """The fields as one JSON object (the format :func:`load_execution` reads)."""
        return json.dumps(self.to_dict(), indent=1) + "\n"

    def to_toml(self) -> str:
        """The fields that are set, as TOML (a field left None is left out: its default).

        >>> print(Execution(tensor_parallel=2, contention="link").to_toml(), end="")
        tensor_parallel = 2
        sequence_parallel = false
        context_parallel = 1
        expert_parallel = 1
        data_parallel = 1
        zero_stage = 0
        attention = "eager"
        scatter_gather = true
        contention = "link"
        overlap_grad_reduce = false
        align_grad_reduce = true
        post_validation = false
        """
        lines = []
        for key, value in self.to_dict().items():
            if value is None:
                continue
            lines.append(f"{key} = {_toml_value(value)}")
        return "\n".join(lines) + "\n"

    def write(self, path) -> None:
        """Write this execution to ``path`` (TOML, or JSON for a ``.json`` path), atomically."""
        from tabsched.files import atomic_write
        text = self.to_json() if os.fspath(path).lower().endswith(".json") else self.to_toml()
        atomic_write(path, text.encode("utf-8"))

    @classmethod
    def from_dict(cls, data, source="execution") -> Execution:
        """An execution from a mapping of its fields; every problem names ``source`` and the key.

        >>> Execution.from_dict({"tensor_paralel": 2}, "run.toml")
        Traceback (most recent call last):
        ...
        tabsched.exceptions.InvalidParameterError: run.toml: unknown key 'tensor_paralel' (did you mean 'tensor_parallel'?)
        """
        if not isinstance(data, dict):
            raise InvalidParameterError(f"{source}: an execution is a table of keys, not "
                                        f"{_untrusted.shown_value(data)}")
        for key in sorted(data, key=str):
            if key not in FIELDS:
                raise InvalidParameterError(f"{source}: unknown key "
                                            f"{_untrusted.shown_value(key)}"
                                            f"{_untrusted.suggestion(key, FIELDS)}")
        try:
            return cls(**data)
        except InvalidParameterError as error:
            raise InvalidParameterError(f"{source}: {error}") from None


FIELDS = tuple(field.name for field in dataclasses.fields(Execution))


def _toml_value(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    return str(value)


def load_execution(reference) -> Execution:
    """The execution in a TOML or JSON file (``.json``: JSON, anything else: TOML).

    The file is untrusted: at most ``MAX_FILE_BYTES`` are read and its nesting is
    bounded before parsing; every problem is one line naming the file and the key.
    An :class:`Execution` is returned as it is.
    """
    if isinstance(reference, Execution):
        return reference
    from tabsched.files import file_path
    path = file_path(reference, "execution")
    with open(path, "rb") as stream:
        raw = stream.read(_untrusted.MAX_FILE_BYTES + 1)
    if path.lower().endswith(".json"):
        data = _parse_json(raw, path)
    else:
        data = _untrusted.parse(raw, path, "execution")
    return Execution.from_dict(data, path)


def _parse_json(raw, source):
    if len(raw) > _untrusted.MAX_FILE_BYTES:
        raise InvalidParameterError(f"{source}: larger than "
                                    f"{_untrusted.MAX_FILE_BYTES // 2**20} MiB; an execution "
                                    f"file holds a few hundred bytes of keys")
    problem = _untrusted.nesting_problem(raw.decode("utf-8", "replace"))
    if problem:
        raise InvalidParameterError(f"{source}: not an execution file: {problem}")
    try:
        return json.loads(raw.decode("utf-8-sig"))
    except UnicodeDecodeError as error:
        raise InvalidParameterError(f"{source}: byte {error.start} is not UTF-8 text; not an "
                                    f"execution file") from None
    except (ValueError, RecursionError) as error:
        raise InvalidParameterError(f"{source}: not valid JSON: "
                                    f"{_untrusted._one_line(str(error), 160)}") from None


def Parallelism(*, tensor_parallel=1, sequence_parallel=False, data_parallel=1,
                attention="eager", optimizer_sharding=False, overlap_grad_reduce=False,
                scatter_gather=True) -> Execution:
    """The parallelism keywords tabsched took before :class:`Execution`, as an execution.

    ``optimizer_sharding=True`` is ``zero_stage=1``; the other keywords are fields
    of the same name. Kept so that code written against ``Parallelism`` runs on.

    >>> Parallelism(tensor_parallel=8, optimizer_sharding=True).zero_stage
    1
    """
    return Execution(tensor_parallel=tensor_parallel, sequence_parallel=sequence_parallel,
                     data_parallel=data_parallel, attention=attention,
                     zero_stage=1 if _flag("optimizer_sharding", optimizer_sharding) else 0,
                     overlap_grad_reduce=overlap_grad_reduce, scatter_gather=scatter_gather)
