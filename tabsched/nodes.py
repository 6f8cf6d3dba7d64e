"""Node kinds: what each node of a lowered table is.

A lowering (:func:`tabsched.lower.lower`) numbers its nodes kind by kind, in the
order of :data:`KINDS`, each kind's nodes one contiguous range of ids:

``CELL``
    A non-empty cell of the table (an overlapped cell is one node), on its
    device's compute stream; cells are numbered device by device in row order.
``TRANSFER``
    A dependency whose producer and consumer run on different devices: the
    activation or gradient on the link between them (no compute stream).
``SYNC``
    The gradient all-reduce of one stage among the devices that hold it, after
    their last backward of it (no compute stream).
``OPTIMIZER``
    One device's end-of-iteration step, on its compute stream, one per device in
    device order.
``UNSHARD``
    ZeRO-3 / FSDP: the all-gather of one stage's parameters over the
    data-parallel group, before a window of the device's operations that use
    them, on the device's all-gather stream (not its compute stream).
``RESHARD``
    The free of those gathered parameters after the window's last operation:
    a memory event of no duration (no stream).
``ALL_TO_ALL``, ``CONTEXT_EXCHANGE``
    Registered for the parallelisms to come (expert parallelism's token
    exchange, context parallelism's key/value exchange); no lowering makes
    them yet, so their ranges are empty.
``REDUCE_GRAD``
    ZeRO-2/3: the reduce-scatter of one stage's gradients over the
    data-parallel group after the device's last backward of it, on the
    device's reduce-scatter stream. The names are PyTorch pipelining's
    (``_ComputationType`` in torch/distributed/pipelining/schedules.py); the
    lowering of these three is :mod:`tabsched.sharding`.

A kind is registered by adding its member here, in the place its nodes take in
the numbering, with whether it runs on a device's compute stream; the lowering
then builds its range, cost models price it (``CostModel.node_prices``) and
:meth:`tabsched.lower.LoweredSchedule.describe_node` labels it. A module that
needs the nodes of one kind asks the lowering (``lowered.nodes(TRANSFER)``, a
slice of ids; ``lowered.node_kind``, one code per node) rather than computing
id ranges.

>>> [kind.label for kind in KINDS[:4]]
['cell', 'transfer', 'sync', 'optimizer']
>>> OPTIMIZER.on_device, SYNC.on_device, UNSHARD.on_device
(True, False, False)
"""

import enum

__all__ = ["NodeKind", "KINDS", "EXTRA_KINDS", "CELL", "TRANSFER", "SYNC", "OPTIMIZER",
           "UNSHARD", "RESHARD", "ALL_TO_ALL", "CONTEXT_EXCHANGE", "REDUCE_GRAD"]


class NodeKind(enum.IntEnum):
    """The kind of a node; its value is the code in ``LoweredSchedule.node_kind`` (int8)."""

    CELL = 0
    TRANSFER = 1
    SYNC = 2
    OPTIMIZER = 3
    UNSHARD = 4
    RESHARD = 5
    ALL_TO_ALL = 6
    CONTEXT_EXCHANGE = 7
    REDUCE_GRAD = 8

    @property
    def label(self):
        """The kind's name in messages and reports: ``"cell"``, ``"all-to-all"``..."""
        return self.name.lower().replace("_", "-")

    @property
    def on_device(self):
        """Whether a node of this kind runs on a device's compute stream."""
        return self in _ON_DEVICE


#: FSDP issues its all-gathers and reduce-scatters on their own CUDA streams
#: (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py, ``FSDPCommContext``:
#: ``all_gather_stream``, ``reduce_scatter_stream``), so UNSHARD and REDUCE_GRAD
#: overlap compute; a RESHARD only frees memory.
_ON_DEVICE = frozenset({NodeKind.CELL, NodeKind.OPTIMIZER})

#: Every kind, in the order their nodes are numbered.
KINDS = tuple(NodeKind)
#: The kinds a cost model prices per node (``CostModel.node_prices``): all but cells
#: (priced per operation) and transfers (priced per transfer).
EXTRA_KINDS = KINDS[2:]

CELL = NodeKind.CELL
TRANSFER = NodeKind.TRANSFER
SYNC = NodeKind.SYNC
OPTIMIZER = NodeKind.OPTIMIZER
UNSHARD = NodeKind.UNSHARD
RESHARD = NodeKind.RESHARD
ALL_TO_ALL = NodeKind.ALL_TO_ALL
CONTEXT_EXCHANGE = NodeKind.CONTEXT_EXCHANGE
REDUCE_GRAD = NodeKind.REDUCE_GRAD
