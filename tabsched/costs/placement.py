"""Placement: the devices each parallel group spans, and the network tiers it crosses.

An execution (:class:`~tabsched.execution.Execution`) says how large each parallel
group is; the placement says where its members sit. Ranks are laid out in
Megatron-LM's order (``megatron/core/parallel_state.py``, ``order="tp-cp-ep-dp-pp"``):
tensor ranks first, then context, data, pipeline, so that the rank of a GPU is

    ``tensor + t * (context + cp * (data + d * pipeline))``

and consecutive ranks fill a node of ``n`` GPUs before the next node. A group is
the set of ranks that differ in one coordinate: its ``size`` members are
``stride`` ranks apart (tensor 1, context ``t``, data ``t * cp``, pipeline
``t * cp * d``). Expert groups are formed inside the data dimension, as
Megatron-Core forms them (``ep`` consecutive data ranks); the *replica* group of a
stage is the pipeline ranks of one table that hold it (Chimera's two pipelines).

Every group therefore sits in one of two ways: inside one node (tier ``"node"``:
NVLink or NVSwitch), or across ``size / per_node`` nodes with ``per_node`` of its
members on each (tier ``"network"``). :meth:`Execution.check` makes sure groups
tile nodes evenly; a tensor group larger than a node fills whole nodes
(``t = 16`` on 8-GPU nodes: ``per_node = 8`` on 2 nodes), and every group after
it in the order then has one member per node. A collective over a group is
priced from this span by :func:`tabsched.costs.collectives.group_time` (several
members per node share their node's NICs: NCCL's multi-rail ring); a pipeline
transfer between two table devices crosses the network when they sit on
different nodes, which is ``pipeline_ranks_per_node`` apart (one, on its own
node, once a pipeline rank's ``t * cp * d`` GPUs fill a node).

>>> from tabsched.costs.system import load_system
>>> from tabsched.execution import Execution
>>> placement = Placement(Execution(tensor_parallel=4, data_parallel=4), load_system("dgx-a100"))
>>> placement.group("tensor")
GroupSpan(name='tensor', size=4, stride=1, per_node=4, nodes=1)
>>> placement.group("data")
GroupSpan(name='data', size=4, stride=4, per_node=2, nodes=2)
>>> placement.group("data").tier, placement.pipeline_ranks_per_node
('network', 1)
>>> Placement(Execution(tensor_parallel=16), load_system("dgx-a100")).group("tensor")
GroupSpan(name='tensor', size=16, stride=1, per_node=8, nodes=2)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tabsched.exceptions import InvalidParameterError
from tabsched.execution import Execution

if TYPE_CHECKING:
    from tabsched.costs.system import System

__all__ = ["Placement", "GroupSpan", "GROUPS", "TIERS"]

#: The parallel groups a collective can run over.
GROUPS = ("tensor", "context", "expert", "data", "pipeline")
#: The network tiers: inside a node, between nodes.
TIERS = ("node", "network")


@dataclass(frozen=True)
class GroupSpan:
    """Where one parallel group sits: ``size`` members ``stride`` ranks apart, ``per_node``
    of them on each of ``nodes`` nodes."""

    name: str
    size: int
    stride: int
    per_node: int
    nodes: int

    @property
    def inside_node(self) -> bool:
        return self.nodes == 1

    @property
    def tier(self) -> str:
        """``"node"`` when every member shares one node, else ``"network"``."""
        return "node" if self.nodes == 1 else "network"


def _span(name, size, stride, node_size):
    """The span of a group of ``size`` members ``stride`` ranks apart, groups aligned to
    multiples of ``size * stride`` (as every group of Megatron-LM's order is)."""
    if size * stride <= node_size:
        return GroupSpan(name, size, stride, size, 1)
    per_node = max(1, node_size // stride)
    return GroupSpan(name, size, stride, per_node, -(-size // per_node))


@dataclass(frozen=True)
class Placement:
    """The groups of ``execution`` on the nodes of ``system``; see the module docstring.

    ``pipeline`` is the number of pipeline ranks (the table's devices), when known:
    only the pipeline group's span needs it. The node size is the execution's
    ``devices_per_node``, else the system's.
    """

    execution: Execution
    system: System
    pipeline: int | None = None
    #: The system as the table's devices see it: a node of ``pipeline_ranks_per_node``
    #: pipeline ranks (what transfers, replica syncs and overrides are indexed by).
    pipeline_view: object = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        per_node = self.pipeline_ranks_per_node
        view = (self.system if per_node == self.system.devices_per_node
                else self.system.replace(devices_per_node=per_node))
        object.__setattr__(self, "pipeline_view", view)

    @property
    def node_size(self) -> int:
        """GPUs per node."""
        return self.execution.node_size(self.system)

    def group(self, name) -> GroupSpan:
        """The span of group ``name`` (one of :data:`GROUPS`)."""
        run = self.execution
        t, cp, d = run.tensor_parallel, run.context_parallel, run.data_parallel
        if name == "tensor":
            return _span(name, t, 1, self.node_size)
        if name == "context":
            return _span(name, cp, t, self.node_size)
        if name == "expert":
            return _span(name, run.expert_parallel, t * cp, self.node_size)
        if name == "data":
            return _span(name, d, t * cp, self.node_size)
        if name == "pipeline":
            return _span(name, self.pipeline or 1, t * cp * d, self.node_size)
        raise InvalidParameterError(f"group {name!r} is not one of {', '.join(GROUPS)}")

    def gradient_group(self) -> GroupSpan:
        """The ranks that reduce one tensor rank's gradients: the data-parallel ranks with
        the context ranks among them, ``d * cp`` ranks ``t`` apart (Megatron-LM's data-
        parallel group "with context parallel"); the data group without context
        parallelism."""
        run = self.execution
        if run.context_parallel == 1:
            return self.group("data")
        return _span("data", run.data_parallel * run.context_parallel, run.tensor_parallel,
                     self.node_size)

    def expert_gradient_group(self) -> GroupSpan:
        """The ranks that reduce one GPU's routed-expert gradients: the ``d / e`` data
        ranks holding the same experts, ``t * e`` ranks apart (Megatron-Core's expert-data-
        parallel group); the gradient group without expert parallelism."""
        run = self.execution
        if run.expert_parallel == 1:
            return self.gradient_group()
        return _span("data", run.expert_gradient_replicas,
                     run.tensor_parallel * run.expert_parallel, self.node_size)

    @property
    def pipeline_ranks_per_node(self) -> int:
        """Pipeline ranks (table devices) per node: ``n / (t * cp * d)``, at least one."""
        return max(1, self.node_size // self.execution.ranks_per_stage)

    def link_matrices(self, num_devices):
        """``(bandwidth, latency)`` between the table's devices (see ``System.link_matrices``)."""
        return self.pipeline_view.link_matrices(num_devices)

    def all_reduce_time(self, nbytes, devices, links=None):
        """A ring all-reduce among some of the table's devices (a stage's replicas)."""
        return self.pipeline_view.all_reduce_time(nbytes, devices, links)

    def check_devices(self, num_devices):
        """Raise for a system override that names a device or node the run lacks."""
        self.pipeline_view.check_devices(num_devices)
        return self

    def describe(self) -> dict:
        """``{group: {size, per_node, nodes, tier}}`` of the groups larger than one."""
        spans = [self.group(name) for name in GROUPS if name != "pipeline"]
        if self.pipeline is not None:
            spans.append(self.group("pipeline"))
        return {span.name: {"size": span.size, "per_node": span.per_node, "nodes": span.nodes,
                            "tier": span.tier} for span in spans if span.size > 1}
