"""How a model is run across devices beside the pipeline: tensor, sequence, data parallelism.

A pipeline stage of a table is one *device* of the table; with tensor
parallelism it is a group of ``t`` GPUs that split every layer between them
(Megatron-LM; Shoeybi et al. 2019, section 3; Narayanan et al. 2021, section
2.3), and with data parallelism the whole pipeline exists ``d`` times, each
replica on its own devices, with a gradient all-reduce among the replicas at
the end of the iteration. The table's devices are the pipeline ranks of one
replica; every cost tabsched reports for a device is one tensor rank's.

Tensor parallelism ``t``
    Attention is split by heads (each rank holds ``a/t`` heads, ``g/t`` key/value
    heads), the MLP by columns (its first matrix) and rows (its second); the
    embedding and the output layer by vocabulary. Two all-reduces of the
    ``s*b*h`` activation per layer in the forward and two in the input-grad,
    on the links inside a node, not overlapped with compute.
Sequence parallelism (Korthikanti et al. 2022, section 4.2.2)
    The all-reduces become reduce-scatter + all-gather pairs, and the norms and
    dropouts (and their activations) work on ``s/t`` of the sequence. Needs
    ``t > 1``.
Data parallelism ``d``
    A gradient all-reduce over the ``d`` replicas of each device: at the end
    of the device's last backward, before the optimizer step, or overlapped
    with the remaining backwards (``overlap_grad_reduce``). Optimizer-state
    sharding (ZeRO stage 1; Rajbhandari et al. 2020, section 5.1) keeps
    ``1/d`` of the optimizer state on each replica, turns the all-reduce into
    a reduce-scatter and adds an all-gather of the updated parameters.
Attention
    ``eager`` materialises the ``s x s`` score matrix (Megatron-LM without
    FlashAttention); ``flash`` fuses the attention core (Dao et al. 2022): no
    ``s*s`` memory traffic and no score activations; the FLOPs are counted as
    for ``eager``.
Placement (Megatron-LM's rank order: tensor ranks first, then data, then pipeline)
    A node of ``n`` devices holds ``n / (t*d)`` pipeline ranks (at least one),
    so a tensor group never leaves its node.

>>> Parallelism(tensor_parallel=8, sequence_parallel=True).describe()
{'tensor_parallel': 8, 'sequence_parallel': True, 'data_parallel': 1, 'attention': 'eager', 'optimizer_sharding': False, 'overlap_grad_reduce': False, 'scatter_gather': True}
"""

import dataclasses
from dataclasses import dataclass

import numpy as np

from tabsched.exceptions import InvalidParameterError

__all__ = ["Parallelism", "ATTENTION_IMPLEMENTATIONS"]

ATTENTION_IMPLEMENTATIONS = ("eager", "flash")


def _count(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InvalidParameterError(f"{name} must be an integer >= 1, not {value!r}")
    return int(value)


def _flag(name, value):
    if not isinstance(value, (bool, np.bool_)):
        raise InvalidParameterError(f"{name} must be true or false, not {value!r}")
    return bool(value)


@dataclass(frozen=True)
class Parallelism:
    """Tensor, sequence and data parallelism and the attention kernel; see the module docstring.

    Parameters
    ----------
    tensor_parallel : int
        Tensor ranks ``t`` per pipeline stage (default 1).
    sequence_parallel : bool
        Megatron-LM's sequence parallelism (needs ``t > 1``).
    data_parallel : int
        Replicas ``d`` of the pipeline (default 1).
    attention : {"eager", "flash"}
    optimizer_sharding : bool
        ZeRO-1: the optimizer state divided over the ``d`` replicas.
    overlap_grad_reduce : bool
        The data-parallel gradient all-reduce of each stage starts after that
        stage's last backward and runs beside the remaining backwards.
    scatter_gather : bool
        Pipeline transfers carry ``s*b*h/t`` per tensor rank (Megatron-LM's
        default scatter-gather; always so with sequence parallelism).
    """

    tensor_parallel: int = 1
    sequence_parallel: bool = False
    data_parallel: int = 1
    attention: str = "eager"
    optimizer_sharding: bool = False
    overlap_grad_reduce: bool = False
    scatter_gather: bool = True

    def __post_init__(self):
        def set_(key, value):
            object.__setattr__(self, key, value)
        set_("tensor_parallel", _count("tensor_parallel", self.tensor_parallel))
        set_("data_parallel", _count("data_parallel", self.data_parallel))
        for key in ("sequence_parallel", "optimizer_sharding", "overlap_grad_reduce",
                    "scatter_gather"):
            set_(key, _flag(key, getattr(self, key)))
        if self.attention not in ATTENTION_IMPLEMENTATIONS:
            raise InvalidParameterError(f"attention {self.attention!r} is not one of "
                                        f"{', '.join(ATTENTION_IMPLEMENTATIONS)}")
        if self.sequence_parallel and self.tensor_parallel == 1:
            raise InvalidParameterError("sequence_parallel needs tensor_parallel > 1 (it splits "
                                        "the sequence over the tensor ranks)")

    def replace(self, **changes):
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    @property
    def flash(self):
        return self.attention == "flash"

    @property
    def transfer_split(self):
        """Parts a pipeline transfer is cut into per tensor rank (``t`` or 1)."""
        split = self.sequence_parallel or self.scatter_gather
        return self.tensor_parallel if split else 1

    def check(self, model, system=None):
        """Raise for a model or system this parallelism cannot run (one line each)."""
        t = self.tensor_parallel
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
        if system is not None and t > system.devices_per_node:
            raise InvalidParameterError(
                f"tensor_parallel {t} is larger than a node of system {system.name} "
                f"({system.devices_per_node} devices): a tensor group must share a node")
        return self

    def devices_per_node(self, system):
        """Pipeline ranks (table devices) per node of ``system``."""
        group = self.tensor_parallel * self.data_parallel
        return max(1, system.devices_per_node // group)

    def data_parallel_inside_node(self, system):
        """True if the ``d`` replicas of a tensor rank share a node."""
        return self.tensor_parallel * self.data_parallel <= system.devices_per_node

    def describe(self):
        return {"tensor_parallel": self.tensor_parallel,
                "sequence_parallel": self.sequence_parallel,
                "data_parallel": self.data_parallel, "attention": self.attention,
                "optimizer_sharding": self.optimizer_sharding,
                "overlap_grad_reduce": self.overlap_grad_reduce,
                "scatter_gather": self.scatter_gather}
