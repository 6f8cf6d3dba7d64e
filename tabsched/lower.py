"""Lowering: a ScheduleTable becomes a DAG of numpy arrays the kernel can run.

Nodes
    One *compute node* per non-empty cell (an overlapped cell is one node), numbered
    device by device in row order; then one *transfer node* per dependency whose
    producer and consumer run on different devices.
Edges (CSR, ``indptr`` / ``successors``)
    * row order: each cell -> the next cell of its device;
    * ``F(s, m)`` -> ``F(s+1, m)`` (activation);
    * ``F(s, m)`` -> ``B/I(s, m)``; ``B/I(s+1, m)`` -> ``B/I(s, m)`` (gradient);
      ``I(s, m)`` -> ``W(s, m)``;
    * a dependency across devices goes producer -> transfer -> consumer (with
      ``free_transfers``, in a plain lowering: producer -> consumer, see below);
    * ``p2p="blocking"``: a transfer also precedes the sender's next cell; the
      runtimes' modes add the edges of their calls (:mod:`tabsched.p2p`);
    * ``transfer_after``: extra edges into transfer nodes, for schedules that
      place their communication themselves (PyTorch's compute_comms CSV).
Tail (optional)
    ``grad_sync``: one node per chosen stage after the last ``B``/``W`` of that
    stage on every device that holds it (an all-reduce among replicas; it does
    not occupy a device's compute stream). ``optimizer``: one node per device
    after its last cell and the syncs of its stages, on its compute stream.
Sharding (optional)
    ``sharding``: ZeRO-2/3's UNSHARD, RESHARD and REDUCE_GRAD nodes and their
    edges, built by :mod:`tabsched.sharding`.
Free transfers (``free_transfers=True``)
    When every transfer lasts 0 (the cost model says so: ``CostModel.free_transfers``)
    and nothing but its producer comes before one (contention ``none``, ``p2p``
    ``free``, no ``transfer_after``, no tail, no sharding: the plain lowering), a
    transfer node only passes its producer's end on to its consumer. Such a
    lowering (``direct``) joins the two with a direct edge and has no transfer
    node: the same starts of every cell, to the bit, with half the nodes (1F1B).
    What is said about the transfers (which there are, their starts, the critical
    path through them) comes from :meth:`LoweredSchedule.with_transfers`, the same
    table lowered with them, made when asked for (:class:`tabsched.result.Result`).
Node kinds (:mod:`tabsched.nodes`)
    Node ids run kind by kind: cells, then transfers, then syncs, then optimizer
    steps, then the sharding nodes, each kind one range (``nodes(kind)``, ``node_kind``, ``node_device``;
    the kinds still to come have empty ranges).
Resources (``resources``, one row per node)
    ``none``: no column, transfers never wait for each other. ``link``: each
    directed device pair is one FIFO resource. ``nic``: additionally, transfers
    between nodes of ``devices_per_node`` devices hold the sending node's egress
    and the receiving node's ingress port.

Layout
    The first read of the layout checks the DAG and finds Kahn's order once
    (:func:`tabsched.engine.lay_out`), keeping the order and every node's
    predecessors as positions in it (every edge points backwards: ``topo_order``,
    ``topo_pred_indptr``, ``topo_predecessors``): each run is then one pull pass.
    A lowering's first runs of one sample do without it (the engine's push pass,
    the same starts), so one evaluated once or twice never makes it. A table whose
    row orders deadlock still lowers; ``run()`` raises (:mod:`tabsched.deadlock`).
Runs
    :func:`tabsched.engine.run` and :func:`~tabsched.engine.summarize` evaluate a
    lowering (``run()`` and ``run_summary()`` here call them); the engine picks the
    pass.

Everything here is vectorised over operations or compiled (``tabsched._build``:
the dependencies, the CSR); lowering a 500k-operation table takes no Python loop
per operation.
"""

from __future__ import annotations

import dataclasses
import functools
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tabsched import _build, compose, engine
from tabsched.deadlock import deadlock_error
from tabsched.edges import (dependencies, node_resources, optimizer_edges, stage_holders,
                            sync_nodes, transfer_after_edges)
from tabsched.exceptions import InvalidParameterError, TabschedError
from tabsched.execution import CONTENTION_MODES
from tabsched.nodes import (CELL, EXTRA_KINDS, KINDS, OPTIMIZER, REDUCE_GRAD, RESHARD, SYNC,
                            TRANSFER, UNSHARD)
from tabsched.p2p import p2p_edges, resolve_mode
from tabsched.sharding import check_sharding, shard_nodes
from tabsched.table import check_table, shown_repr

if TYPE_CHECKING:
    from tabsched.table import ScheduleTable

__all__ = ["lower", "LoweredSchedule", "CONTENTION_MODES"]

INDEX = np.int32
#: The fields of a lowering's layout, made together when one is first read.
LAYOUT_FIELDS = ("topo_order", "topo_pred_indptr", "topo_predecessors", "unfinished")
#: Most nodes or edges a lowered table may have: ids are int32.
MAX_IDS = int(np.iinfo(INDEX).max) - 1


@dataclass(eq=False)
class Transfers:
    """The transfer nodes of a lowered table, one entry each.

    ``producer`` and ``consumer`` are operation indices in the table's arrays;
    ``gradient`` is False for an activation sent forward, True for a gradient
    sent backward. ``src``, ``dst``, ``stage`` and ``microbatch`` (the
    producer's) are derived on access rather than stored.
    """

    table: object
    producer: np.ndarray
    consumer: np.ndarray
    gradient: np.ndarray

    def __len__(self):
        return len(self.producer)

    @property
    def src(self):
        return self.table.device[self.producer]

    @property
    def dst(self):
        return self.table.device[self.consumer]

    @property
    def stage(self):
        return self.table.stage[self.producer]

    @property
    def microbatch(self):
        return self.table.microbatch[self.producer]


@dataclass(eq=False)
class LoweredSchedule:
    """A table lowered to a DAG; evaluate it with :meth:`run`.

    Attributes
    ----------
    table : ScheduleTable
    kind_bounds : int32 array, shape (len(KINDS) + 1,)
        The nodes of kind ``k`` (:mod:`tabsched.nodes`) are ids ``kind_bounds[k] ..
        kind_bounds[k+1] - 1``; ask :meth:`nodes`, :meth:`count`, :attr:`node_kind`.
    cell_of_op : int32 array
        The compute node of each operation of the table.
    cell_device : int32 array
        The device of each compute node.
    indptr, successors : int32 arrays
        The DAG in CSR form.
    resources : int32 array, shape (nodes, R)
    num_resources : int
    transfers : Transfers
    contention : str
    sync_stage : int32 array
        The stage of each gradient-sync node, in the order of ``nodes(SYNC)``.
    sharding : ShardNodes, optional
        The stage and device of each UNSHARD, RESHARD and REDUCE_GRAD node
        (:class:`tabsched.sharding.ShardNodes`); None without sharding.
    """

    table: object
    kind_bounds: np.ndarray
    cell_of_op: np.ndarray
    cell_device: np.ndarray
    indptr: np.ndarray
    successors: np.ndarray
    resources: np.ndarray
    num_resources: int
    transfers: Transfers
    contention: str
    sync_stage: np.ndarray | None = None
    sharding: object = None
    #: True when ``transfer_after`` added edges into transfer nodes: a transfer may
    #: then become ready after its producer ends.
    extra_transfer_edges: bool = False
    #: True when the dependencies across devices are direct edges between cells (free
    #: transfers, not nodes: ``transfers`` is empty; see the module docstring);
    #: :meth:`with_transfers` gives the lowering with their nodes.
    direct: bool = False
    #: Kahn's order of the nodes: ``topo_order[i]`` is the node at position ``i``
    #: (read-only int32); None when the row orders deadlock.
    topo_order: np.ndarray | None = None
    #: The positions of each position's predecessors, ascending (CSR, read-only):
    #: every edge points backwards; None on a deadlock.
    topo_pred_indptr: np.ndarray | None = None
    topo_predecessors: np.ndarray | None = None
    #: On a deadlock, the indegrees Kahn's order left (> 0: never ran).
    unfinished: np.ndarray | None = None
    #: The engine's compiled view of this lowering (a ``_kernel.Graph``, each part
    #: checked once), made by :mod:`tabsched.engine` on the first run.
    _graph: object = dataclasses.field(default=None, init=False, repr=False)

    def __post_init__(self):
        # the bounds as Python ints: nodes() and count() are asked often, per run
        self.kind_bounds.flags.writeable = False
        self._bounds = tuple(self.kind_bounds.tolist())
        if self.topo_order is None and self.unfinished is None:
            # Not laid out yet: the layout (Kahn's order and the predecessor lists) is
            # made when first read (__getattr__), once per lowering. A lowering run
            # once or twice never needs it (the engine's push pass).
            for name in LAYOUT_FIELDS:
                del self.__dict__[name]

    def __getattr__(self, name):
        # only for attributes not found: the layout's fields before they are made
        if name in LAYOUT_FIELDS and "indptr" in self.__dict__:
            self._lay_out()
            return self.__dict__[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _lay_out(self):
        """Validate the DAG and lay it out in Kahn's order (:func:`engine.lay_out`)."""
        layout, unfinished = engine.lay_out(self.indptr, self.successors)
        order, pred_indptr, predecessors = (None, None, None) if layout is None else layout
        self.__dict__.update(topo_order=order, topo_pred_indptr=pred_indptr,
                             topo_predecessors=predecessors, unfinished=unfinished)

    @property
    def laid_out(self):
        """Whether the layout (``topo_order`` and the rest, or ``unfinished``) is made:
        reading any of them makes it."""
        return "unfinished" in self.__dict__

    def copied(self, **changes):
        """``dataclasses.replace(self, **changes)`` without making the layout: the copy
        takes it when it is made, and is laid out on first use when it is not; it
        takes the order of the engine's push pass too, when its edges are these."""
        kept = {name: self.__dict__.get(name) for name in LAYOUT_FIELDS}
        copy = dataclasses.replace(self, **{**kept, **changes})
        order = self.__dict__.get(engine.KAHN_ORDER)     # the push pass's, same edges
        if order is not None and "indptr" not in changes and "successors" not in changes:
            copy.__dict__[engine.KAHN_ORDER] = order
        return copy

    def __getstate__(self):
        """Pickled without the engine's compiled view and the cached rewrite (made
        again on first use)."""
        state = dict(self.__dict__)
        state["_graph"] = None
        state.pop("_chains", None)
        return state

    def link_chains(self):
        """This lowering under contention ``link`` as a DAG without resources, or None.

        Under contention ``link`` each directed link serves its transfers first
        come, first served. They are ready when their producers end, and the
        producers of one link all run on its sending device, one after the
        other: when every cell lasts longer than zero, the serving order is the
        sending row's order (transfers of one cell by node id, as the event
        heap breaks ties), whatever the durations. The FIFO is then the same as
        an edge from each transfer to the next on its link, which this adds
        (after the node's other successors), so the pull pass gives the event
        heap's starts to the bit. Returns None when there is nothing to chain
        or the chains are not exact whatever the durations: not under ``link``,
        or with ``transfer_after`` edges (a transfer may then wait for more
        than its producer). Made once per lowering while someone holds it (the
        lowering keeps a weak reference: a lowering kept in a result does not keep its
        rewrite, and Monte Carlo holds it for its passes).
        """
        kept = self.__dict__.get("_chains")
        if kept is False:                       # nothing to chain: known
            return None
        chained = None if kept is None else kept()
        if chained is None:
            chained = self._link_chains()
            self.__dict__["_chains"] = False if chained is None else weakref.ref(chained)
        return chained

    def _link_chains(self):
        if (self.contention != "link" or len(self.transfers) == 0
                or self.extra_transfer_edges or self.topo_order is None):
            return None
        n = self.num_nodes
        transfer = self.nodes(TRANSFER)
        first_transfer = transfer.start
        D = self.table.num_devices
        # (cell, transfer) pairs in cell order, a cell's transfers by ascending id
        sends = self.successors[:self.indptr[self.nodes(CELL).stop]]
        sent = sends[(sends >= first_transfer) & (sends < transfer.stop)]
        link = self.transfers.src[sent - first_transfer].astype(np.int64) * D \
            + self.transfers.dst[sent - first_transfer]
        by_link = np.argsort(link.astype(np.uint16) if D * D <= 2**16 else link, kind="stable")
        chain = sent[by_link]
        same = link[by_link][1:] == link[by_link][:-1]
        before, after = chain[:-1][same], chain[1:][same]
        del sends, sent, link, by_link, chain, same
        # the chain edges go last in each list; a transfer has one of each at most
        successor_of = np.full(n, engine.NO_NODE, dtype=INDEX)
        successor_of[before] = after
        indptr = np.empty(n + 1, dtype=INDEX)
        successors = np.empty(len(self.successors) + len(before), dtype=INDEX)
        _check_status(_build.append_one(self.indptr, self.successors, successor_of, indptr,
                                        successors))
        # Kahn's order stays topological: a transfer is queued when its producer is
        # taken, and producers of one link leave in row order. So the pull pass keeps
        # it, a chained transfer getting the previous one on its link as its last
        # predecessor: the producer binds on ties, as in the event heap.
        position = np.empty(n, dtype=INDEX)
        position[self.topo_order] = np.arange(n, dtype=INDEX)
        predecessor_at = np.full(n, engine.NO_NODE, dtype=INDEX)
        predecessor_at[position[after]] = position[before]
        pred_indptr = np.empty(n + 1, dtype=INDEX)
        predecessors = np.empty(len(self.topo_predecessors) + len(before), dtype=INDEX)
        _check_status(_build.append_one(self.topo_pred_indptr, self.topo_predecessors,
                                        predecessor_at, pred_indptr, predecessors))
        pred_indptr.flags.writeable = predecessors.flags.writeable = False
        return dataclasses.replace(self, indptr=indptr, successors=successors,
                                   resources=np.empty((n, 0), dtype=INDEX), num_resources=0,
                                   topo_pred_indptr=pred_indptr, topo_predecessors=predecessors)

    def with_transfers(self):
        """This lowering with a node per transfer: ``self`` unless it is :attr:`direct`,
        else the same table lowered without ``free_transfers`` (a new lowering each
        call; its cells are these, the same ids)."""
        if not self.direct:
            return self
        return lower(self.table, contention=self.contention)

    def transfer_starts(self, start, durations, full):
        """Every node's start over ``full`` (:meth:`with_transfers`) from one sample's
        ``start`` and ``durations`` over this :attr:`direct` lowering: the cells' as
        here, each transfer's its producer's end (``start + duration``, as a run of
        ``full`` adds them: a transfer's one predecessor is its producer)."""
        node_start = np.empty(full.num_nodes)
        cells = self.nodes(CELL)
        node_start[cells] = start[cells]
        sender = full.cell_of_op[full.transfers.producer]
        node_start[full.nodes(TRANSFER)] = start[sender] + durations[sender]
        return node_start

    def check_acyclic(self):
        """Raise the DeadlockError of a table whose row orders contradict its dependencies."""
        if self.unfinished is not None:
            raise self.deadlock_error(self.unfinished)

    def deadlock_error(self, remaining):
        """The :class:`DeadlockError` naming one cycle among the nodes ``remaining``
        marks (> 0) as never run (:func:`tabsched.deadlock.deadlock_error`); for a
        :attr:`direct` lowering, the one its lowering with transfer nodes gives (the
        same cycle, named by those nodes)."""
        if self.direct:
            full = self.with_transfers()
            return full.deadlock_error(full.unfinished)
        return deadlock_error(self, remaining)

    @property
    def num_nodes(self):
        """Nodes of the lowered graph: operations, transfers and the other node kinds."""
        return len(self.indptr) - 1

    # ------------------------------------------------------------ node kinds
    def nodes(self, kind):
        """The ids of the nodes of ``kind`` (a :class:`~tabsched.nodes.NodeKind`): a slice,
        since a lowering numbers its nodes kind by kind (:mod:`tabsched.nodes`)."""
        return slice(self._bounds[kind], self._bounds[kind + 1])

    def node_ids(self, kind):
        """The ids of the nodes of ``kind`` as a ``range``, to iterate over."""
        return range(self._bounds[kind], self._bounds[kind + 1])

    def count(self, kind):
        """How many nodes of ``kind`` the lowering has."""
        return self._bounds[kind + 1] - self._bounds[kind]

    @functools.cached_property
    def extra_kinds(self):
        """The extra kinds (:data:`~tabsched.nodes.EXTRA_KINDS`) this lowering has nodes
        of, in numbering order."""
        return tuple(kind for kind in EXTRA_KINDS if self.count(kind))

    @property
    def num_cells(self):
        """How many compute cells (``count(CELL)``)."""
        return self.count(CELL)

    @property
    def extra_nodes(self):
        """The ids of the nodes that are neither cells nor transfers (the iteration's
        tail today: gradient syncs, optimizer steps), a slice."""
        return slice(self._bounds[EXTRA_KINDS[0]], self.num_nodes)

    @functools.cached_property
    def node_kind(self):
        """The kind of every node (int8 codes of :class:`~tabsched.nodes.NodeKind`,
        read-only), derived from :attr:`kind_bounds` on first use."""
        kinds = np.repeat(np.arange(len(KINDS), dtype=np.int8), np.diff(self.kind_bounds))
        kinds.flags.writeable = False
        return kinds

    @functools.cached_property
    def node_device(self):
        """The device whose compute stream runs each node (int32, read-only):
        ``NO_DEVICE_ID`` (-1) for transfers and gradient syncs; an optimizer step runs
        on its device."""
        devices = np.full(self.num_nodes, engine.NO_DEVICE, dtype=INDEX)
        devices[self.nodes(CELL)] = self.cell_device
        devices[self.nodes(OPTIMIZER)] = np.arange(self.count(OPTIMIZER), dtype=INDEX)
        devices.flags.writeable = False
        return devices

    @functools.cached_property
    def cell_first_op(self):
        """Cell ``c`` holds operations ``cell_first_op[c] .. cell_first_op[c+1] - 1``
        (int32, cells + 1 offsets, read-only)."""
        ops, cells = len(self.cell_of_op), self.num_cells
        if cells == ops:                    # a cell per operation
            first = np.arange(ops + 1, dtype=INDEX)
        else:
            first = np.empty(cells + 1, dtype=INDEX)
            opens = np.ones(ops, dtype=bool)
            np.not_equal(self.cell_of_op[1:], self.cell_of_op[:-1], out=opens[1:])
            first[:-1] = np.flatnonzero(opens)
            first[-1] = ops
        first.flags.writeable = False
        return first

    @functools.cached_property
    def overlapped_cells(self):
        """The cells that hold more than one operation (int64 ids, read-only)."""
        if self.num_cells == len(self.cell_of_op):
            cells = np.empty(0, dtype=np.int64)
        else:
            cells = np.flatnonzero(np.diff(self.cell_first_op) > 1)
        cells.flags.writeable = False
        return cells

    # ------------------------------------------------------------- durations
    def compose(self, op_durations, transfer_durations, extra=None, overlap=1.0):
        """The duration of every node from prices (:func:`tabsched.compose.node_durations`:
        cells from their operations, transfers, the extra kinds by kind)."""
        return compose.node_durations(self, op_durations, transfer_durations, extra, overlap)

    def compose_stacked(self, prices):
        """Node durations of every row of a :class:`tabsched.compose.Prices`, shape
        (rows, nodes) (:func:`tabsched.compose.stacked_node_durations`)."""
        return compose.stacked_node_durations(self, prices)

    def kind_of(self, node):
        """The :class:`~tabsched.nodes.NodeKind` of node ``node``."""
        if not 0 <= node < self.num_nodes:
            raise InvalidParameterError(f"node {node} is not a node of this lowering "
                                        f"(0..{self.num_nodes - 1})")
        return KINDS[int(np.searchsorted(self.kind_bounds, node, side="right")) - 1]

    def sync_devices(self, index):
        """Devices holding the stage of the ``index``-th sync node."""
        holders = self.__dict__.get("_holders")
        if holders is None:     # every stage's, found once per lowering
            holders = self.__dict__["_holders"] = stage_holders(self.table)
        return tuple(holders[int(self.sync_stage[index])])

    @property
    def num_edges(self):
        """Dependency edges of the lowered graph."""
        return len(self.successors)

    @property
    def nbytes(self):
        """Bytes held by the DAG's arrays (not the table; the layout's once made)."""
        arrays = [self.kind_bounds, self.cell_of_op, self.cell_device, self.indptr,
                  self.successors,
                  self.resources, self.transfers.producer, self.transfers.consumer,
                  self.transfers.gradient] + [self.__dict__.get(name)
                                              for name in LAYOUT_FIELDS[:3]]
        return sum(array.nbytes for array in arrays if array is not None)

    def run(self, durations, *, binding=True, end=True, method="auto"):
        """Start and end of every node for each row (sample) of ``durations``
        (:func:`tabsched.engine.run`, which picks the pass).

        Parameters
        ----------
        durations : array, shape (nodes,) or (samples, nodes)
        binding : bool
            Also return, for sample 0, the node that decided each node's start
            (for the critical path).
        end : bool
            Also return the ends (``start + durations``, exactly); else ``None``.
        method : {"auto", "pull", "chained", "events"}

        Returns
        -------
        start, end : float64 arrays, shape (samples, nodes)
        binding : int32 array (nodes,) or None

        Raises
        ------
        DeadlockError
            If the row orders contradict the dependencies; the message names the
            operations on one cycle with their devices and slots.
        """
        start, bound = engine.run(self, durations, binding=binding, method=method)
        # the durations passed the engine's checks: finite, one column per node
        ends = start + np.asarray(durations, dtype=np.float64).reshape(start.shape) if end \
            else None
        return start, ends, bound

    def run_summary(self, durations, *, method="auto"):
        """Makespan per sample and, per device, busy time, first start and last end
        (:func:`tabsched.engine.summarize`): what Monte Carlo needs, without a
        (samples x nodes) output."""
        return engine.summarize(self, durations, method=method)

    # ----------------------------------------------------------------- labels
    def describe_cell(self, cell):
        """``(text, device, slot)`` of compute node ``cell``."""
        op = int(np.searchsorted(self.cell_of_op, INDEX(cell)))
        table = self.table
        return table.cell_text(op), int(table.device[op]), int(table.slot[op])

    def describe_node(self, node):
        """A short label: the cell's text, ``"3F1 d0->d1"`` for a transfer,
        ``"grad sync stage 3"`` or ``"optimizer d2"`` for the tail."""
        kind = self.kind_of(node)
        index = node - self.nodes(kind).start      # its place among the nodes of its kind
        if kind == CELL:
            return self.describe_cell(node)[0]
        if kind == TRANSFER:    # one transfer's ends, not every transfer's (src, dst)
            t, device = self.transfers, self.table.device
            producer, consumer = int(t.producer[index]), int(t.consumer[index])
            return (f"{self.table.op(producer)} d{int(device[producer])}"
                    f"->d{int(device[consumer])}")
        if kind == SYNC:
            return f"grad sync stage {int(self.sync_stage[index])}"
        if kind == OPTIMIZER:
            return f"optimizer d{index}"
        if kind in (UNSHARD, RESHARD, REDUCE_GRAD) and self.sharding is not None:
            return self.sharding.describe(kind, index)
        return f"{kind.label} {index}"


# The layout's fields have no class-level default (dataclass leaves None there): a
# lowering not laid out has no such attribute, so reading one reaches __getattr__.
for _name in LAYOUT_FIELDS:
    delattr(LoweredSchedule, _name)
del _name


def _check_status(status):
    """Raise for a status of ``_build`` other than OK (the lowering validated the arrays)."""
    if status != _build.OK:
        raise TabschedError(f"internal error: a construction step returned status {status} "
                            f"for a lowered table (please report this)")


def lower(table: ScheduleTable, *, contention: str = "none",
          devices_per_node: int | None = None, blocking_sends: bool = False,
          grad_sync: object = None, optimizer: bool = False,
          transfer_after: tuple | None = None, p2p: str | None = None,
          sharding: tuple | None = None, shard_windows: tuple | None = None,
          free_transfers: bool = False) -> LoweredSchedule:
    """Lower ``table`` to a :class:`LoweredSchedule`.

    Parameters
    ----------
    table : ScheduleTable
        A valid table (tables validate when built).
    contention : {"none", "link", "nic"}
    devices_per_node : int, optional
        Needed for ``"nic"``: devices ``k*n .. k*n+n-1`` form node ``k``.
    blocking_sends : bool
        The older spelling of ``p2p="blocking"``.
    grad_sync : None, "replicas", "all" or iterable of int
        Stages that get a gradient-sync node: none; those held by two or more
        devices (Chimera's replicas); every stage (data parallelism); or a list.
    optimizer : bool
        Add an optimizer step per device at the end of the iteration.
    transfer_after : pair of int arrays ``(producer, after)``, optional
        Extra edges into transfer nodes. The transfer that carries operation
        ``producer[k]``'s output to another device starts only after
        ``after[k]`` ends: an operation (its cell) when ``after[k] >= 0``, else
        the transfer that carries operation ``-1 - after[k]``'s output. Without
        it, lowering is unchanged.
    p2p : {"free", "blocking", "megatron-batched", "megatron-overlap", "pytorch"}
        How the runtime posts and waits on transfers (:mod:`tabsched.p2p`); None:
        ``blocking`` with ``blocking_sends``, else ``free``.
    sharding : ``(zero_stage, reshard_after_forward, prefetch)``, optional
        ZeRO-2 or 3: add the UNSHARD, RESHARD and REDUCE_GRAD nodes of
        :mod:`tabsched.sharding` (an execution's ``sharding``).
    shard_windows : ``(stage, issue, first, last)`` int arrays, optional
        ZeRO-3's windows as a file gives them (operation indices; ``issue`` the
        operation after which the all-gather starts, ``-1``: at once), instead of
        those :mod:`tabsched.sharding` finds.
    free_transfers : bool
        Every transfer lasts 0 under the costs this lowering is for: a plain lowering
        (contention ``none``, ``p2p`` ``free``, none of the options above adding a
        node or an edge) then joins a dependency across devices with a direct edge
        (:attr:`LoweredSchedule.direct`); otherwise it is ignored.
    """
    check_table(table)
    p2p = resolve_mode(p2p, blocking_sends)
    blocking_sends = p2p == "blocking"
    sharding = check_sharding(sharding)
    if not isinstance(contention, str) or contention not in CONTENTION_MODES:
        raise InvalidParameterError(
            f"contention {shown_repr(contention)} is not one of {', '.join(CONTENTION_MODES)}")
    if not isinstance(optimizer, (bool, np.bool_)):
        raise InvalidParameterError(f"optimizer must be True or False, not "
                                    f"{shown_repr(optimizer)}")
    if contention == "nic" and (devices_per_node is None or devices_per_node < 1):
        raise InvalidParameterError("contention 'nic' needs devices_per_node >= 1")
    plain = p2p == "free" and not optimizer and transfer_after is None and sharding is None
    if plain:
        offered = _take_offered(table, grad_sync)
        if offered is not None:
            if contention == "none":
                return offered
            # the same DAG: only the transfers' resources are added
            resources, num_resources = node_resources(contention, offered.num_nodes,
                                                      offered.nodes(TRANSFER),
                                                      offered.transfers, table.num_devices,
                                                      devices_per_node)
            contended = offered.copied(resources=resources, num_resources=num_resources,
                                       contention=contention)
            engine.carry_layout(offered, contended)
            return contended

    D = table.num_devices
    device = table.device

    fresh = table.cell_starts()
    num_cells = int(np.count_nonzero(fresh))
    if num_cells == len(table):     # a cell per operation (no overlapped cell)
        cell_of_op = np.arange(num_cells, dtype=INDEX)
        cell_device = device.astype(INDEX)
    else:
        cell_of_op = np.cumsum(fresh, dtype=INDEX)
        cell_of_op -= 1
        cell_device = device[fresh].astype(INDEX)

    if (free_transfers and plain and contention == "none"
            and not len(sync_nodes(table, grad_sync, cell_of_op, num_cells)[0])):
        # free transfers: no transfer node, each dependency an edge between cells
        direct = _lower_direct(table, cell_of_op, cell_device)
        if direct is not None:
            return direct

    # Dependencies between operations (producer, consumer), group by group:
    # activation, own forward, input gradient, weight grad after I (_build).
    producers, consumers, gradient, crossing = dependencies(table)
    tr_producer = producers[crossing]
    tr_consumer = consumers[crossing]
    tr_gradient = gradient[crossing]
    transfers = Transfers(table=table, producer=tr_producer, consumer=tr_consumer,
                          gradient=tr_gradient)
    num_transfers = len(tr_producer)
    num_nodes = num_cells + num_transfers

    # Edge groups (sources, targets), each node's successors listed group by group:
    # its next cell, its dependencies (a crossing one through its transfer node),
    # then whatever the options add (``extra_groups``).
    extra_groups = []
    transfer_node = np.arange(num_cells, num_nodes, dtype=INDEX)
    if blocking_sends and num_transfers:
        sender_cell = cell_of_op[tr_producer]
        has_next = np.zeros(num_transfers, dtype=bool)
        inside = sender_cell + 1 < num_cells
        has_next[inside] = cell_device[sender_cell[inside] + 1] == device[tr_producer[inside]]
        extra_groups.append((transfer_node[has_next], sender_cell[has_next] + 1))
    scheduled = p2p_edges(table, p2p, cell_of_op, cell_device, tr_producer, tr_consumer,
                          num_cells)
    extra_groups.extend(scheduled)
    if transfer_after is not None:
        extra_groups.extend(transfer_after_edges(transfer_after, tr_producer, cell_of_op,
                                                 num_cells))

    first_sync = num_nodes
    sync_stage, sync_groups = sync_nodes(table, grad_sync, cell_of_op, first_sync)
    extra_groups.extend(sync_groups)
    num_nodes += len(sync_stage)
    first_optimizer = num_nodes
    if optimizer:
        num_nodes += D
        extra_groups.extend(optimizer_edges(table, cell_device, sync_stage, first_sync,
                                            first_optimizer))
    first_shard = num_nodes
    shard, shard_counts = None, (0, 0, 0)
    if sharding is not None:
        shard, shard_counts, shard_groups = shard_nodes(
            table, sharding, cell_of_op, cell_device, first_shard,
            first_optimizer if optimizer else None, shard_windows)
        extra_groups.extend(shard_groups)
        num_nodes += sum(shard_counts)

    # a row edge wherever two neighbouring cells share a device
    row_edges = num_cells - 1 - int(np.count_nonzero(np.diff(cell_device))) if num_cells else 0
    num_edges = (row_edges + len(producers) + num_transfers
                 + sum(len(sources) for sources, _ in extra_groups))
    if max(num_nodes, num_edges) > MAX_IDS:
        raise InvalidParameterError(
            f"the lowered table has {num_nodes} nodes and {num_edges} edges; the kernel's "
            f"int32 ids hold at most {MAX_IDS}")
    indptr = np.empty(num_nodes + 1, dtype=INDEX)
    successors = np.empty(num_edges, dtype=INDEX)
    if not extra_groups:
        # the plain lowering: the three groups written as CSR at once (_build.plain_csr,
        # the same lists as the edge lists' CSR below)
        _check_status(_build.plain_csr(cell_device, cell_of_op, producers, consumers,
                                       crossing.view(np.int8), indptr, successors))
        del producers, consumers, gradient, crossing
    else:
        same_row = np.flatnonzero(cell_device[1:] == cell_device[:-1]).astype(INDEX)
        dependency_targets = cell_of_op[consumers]
        dependency_targets[crossing] = transfer_node[:num_transfers]
        edge_groups = [(same_row, same_row + 1), (cell_of_op[producers], dependency_targets),
                       (transfer_node[:num_transfers], cell_of_op[tr_consumer])]
        del producers, consumers, gradient, crossing, dependency_targets
        edge_groups.extend(extra_groups)
        del extra_groups
        edge_sources = np.concatenate([group for group, _ in edge_groups]).astype(
            INDEX, copy=False)
        edge_targets = np.concatenate([group for _, group in edge_groups]).astype(
            INDEX, copy=False)
        del edge_groups
        _check_status(_build.csr(edge_sources, edge_targets, indptr, successors))
        del edge_sources, edge_targets

    # each kind's range, in the order of nodes.KINDS (the kinds still to come: empty)
    kind_bounds = np.full(len(KINDS) + 1, num_nodes, dtype=INDEX)
    kind_bounds[:OPTIMIZER + 1] = [0, num_cells, first_sync, first_optimizer]
    unshards, reshards, _ = shard_counts
    kind_bounds[UNSHARD] = first_shard
    kind_bounds[RESHARD:REDUCE_GRAD + 1] = first_shard + unshards
    kind_bounds[RESHARD + 1:REDUCE_GRAD + 1] = first_shard + unshards + reshards
    resources, num_resources = node_resources(contention, num_nodes,
                                              slice(num_cells, first_sync), transfers, D,
                                              devices_per_node)
    return LoweredSchedule(table=table, kind_bounds=kind_bounds, cell_of_op=cell_of_op,
                           cell_device=cell_device, indptr=indptr, successors=successors,
                           resources=resources, num_resources=num_resources,
                           transfers=transfers, contention=contention,
                           sync_stage=sync_stage, sharding=shard,
                           extra_transfer_edges=transfer_after is not None or bool(scheduled))


def _lower_direct(table, cell_of_op, cell_device):
    """The plain lowering of ``table`` with a direct edge for each dependency (free
    transfers: :attr:`LoweredSchedule.direct`), written by ``_build.direct_csr`` from
    the table's columns; None when its ids might not fit int32 (``lower``'s general
    path then says so)."""
    num_ops, num_cells = len(table), len(cell_device)
    S, M = table.num_stages, table.num_microbatches
    row_edges = num_cells - 1 - int(np.count_nonzero(np.diff(cell_device))) if num_cells \
        else 0
    capacity = row_edges + 2 * num_ops      # an operation feeds at most two others
    if max(capacity, S * M) > MAX_IDS:
        return None
    indptr = np.empty(num_cells + 1, dtype=INDEX)
    successors = np.empty(capacity, dtype=INDEX)
    count = _build.direct_csr(table.kind, table.stage, table.microbatch, cell_of_op,
                              cell_device, S, M, *(np.empty(S * M, dtype=INDEX)
                                                   for _ in range(3)), indptr, successors)
    if count < 0:
        raise TabschedError("internal error: lowering met a dependency the table lacks "
                            "(tables validate when built; please report this)")
    kind_bounds = np.full(len(KINDS) + 1, num_cells, dtype=INDEX)
    kind_bounds[CELL] = 0
    nothing = np.empty(0, dtype=INDEX)
    return LoweredSchedule(table=table, kind_bounds=kind_bounds, cell_of_op=cell_of_op,
                           cell_device=cell_device, indptr=indptr,
                           successors=successors[:count],
                           resources=np.empty((num_cells, 0), dtype=INDEX), num_resources=0,
                           transfers=Transfers(table=table, producer=nothing,
                                               consumer=nothing,
                                               gradient=np.empty(0, dtype=bool)),
                           contention="none", sync_stage=np.empty(0, dtype=INDEX),
                           direct=True)


def offer_lowering(table, lowered):
    """Let the next ``lower(table)`` whose DAG is the plain one (no sync node, no
    optimizer step, no extra edges; any contention) take ``lowered``, a plain
    lowering of a table with the same row orders (``generate()`` then ``evaluate()``
    lowers once). It travels on the table, without a reference back to any table
    (no cycle), and is taken once."""
    transfers = dataclasses.replace(lowered.transfers, table=None)
    table._lowering = lowered.copied(table=None, transfers=transfers)
    engine.carry_layout(lowered, table._lowering)     # its layout, checked once


def _take_offered(table, grad_sync):
    """The lowering offered for ``table``, if ``grad_sync`` adds no sync node to it."""
    offered = table._lowering
    if offered is None:
        return None
    if grad_sync is not None and grad_sync is not False and len(
            sync_nodes(table, grad_sync, offered.cell_of_op, offered.num_nodes)[0]):
        return None
    table._lowering = None
    transfers = dataclasses.replace(offered.transfers, table=table)
    taken = offered.copied(table=table, transfers=transfers)
    engine.carry_layout(offered, taken)
    return taken
