"""Collective operations on a ring: all-reduce, reduce-scatter, all-gather.

One place for the cost of the collectives tabsched models, used alike by
tensor parallelism (the all-reduces, or reduce-scatters and all-gathers, inside
a layer), data parallelism (the gradient all-reduce at the end of an
iteration, the parameter all-gather after a sharded optimizer step) and the
gradient sync of replicated stages (Chimera's replicas). A collective runs over
one parallel group: :func:`group_time` prices it from where the group sits
(:class:`~tabsched.costs.placement.GroupSpan`: inside a node, or across nodes
with ``per_node`` members on each).

``n`` ranks hold ``nbytes`` each (all-reduce; the full buffer for
reduce-scatter and all-gather). The ring algorithm (Patarasuk and Yuan 2009,
"Bandwidth optimal all-reduce algorithms for clusters of workstations";
Thakur, Rabenseifner and Gropp 2005, "Optimization of collective communication
operations in MPICH", section 4) cuts the buffer into ``n`` chunks and passes
one chunk per step to the next rank on the ring, every link busy at once:

* reduce-scatter: ``n-1`` steps, ``(n-1)/n * nbytes / bandwidth + (n-1) * latency``;
* all-gather: the same;
* all-reduce = reduce-scatter + all-gather:
  ``2(n-1)/n * nbytes / bandwidth + 2(n-1) * latency``.

A step lasts as long as the slowest link of the ring needs, so ``bandwidth``
and ``latency`` are the slowest link's (Hockney's model per step). One rank
needs no communication: 0 s. NCCL's "bus bandwidth" is defined so that it
equals the link bandwidth in these formulas (nccl-tests, ``doc/PERFORMANCE.md``).

Groups across nodes: NCCL's multi-rail ring
-------------------------------------------
NCCL runs a collective over several *channels*, each a ring through every
rank; across nodes each channel leaves a node through one NIC, and the graph
search gives the channels different NICs (``src/graph/search.cc``; since
NCCL 2.12 PXN lets a GPU reach another GPU's NIC over NVLink), so its
tuning model takes the bus bandwidth as ``channels x per-channel speed``, the
NICs' sum (``src/graph/tuning.cc``, ``ncclTopoTuneModel``). Write ``k`` for
the group's members per node, ``N = n / k`` for its nodes, ``B`` for one
port's bandwidth (``inter_node_bandwidth x inter_node_efficiency``) and ``r``
for the ports per device (``nics_per_node / devices_per_node``, 1 by
default). In an SPMD step every group of the dimension runs the same
collective at once: the ``devices_per_node / k`` groups on a node share its
ports evenly, so one group crosses each node boundary on ``k * r`` ports and
the ring's bandwidth term is

    ``steps/n * nbytes * max(1 / (k r B), (k-1)/k / B_nvlink)``.

The second term is NVLink's share: of a member's ring traffic the part
``(k-1)/k`` goes to a member on its own node. The latency term is NCCL's own
(``tuning.cc``): the ring's steps that cross nodes, ``2(N-1)`` for an
all-reduce and ``N-1`` for the other two, at the network's latency, the rest at
NVLink's. With one member per node (``k = 1``) this is the ring on one port
per member, as before; with four 200 Gb/s HDR ports on an 8-GPU node (``k = 8``,
``r = 1/2``) it is a bus bandwidth of ``4 x 25 x 0.96 = 96`` GB/s, the
91-96 GB/s nccl-tests#119 and nccl-tests#100 measure on such nodes
(``../shared/data/gpu-measurements.md``, section 5).

What NCCL's default does not do, and tabsched therefore prices as the ring:

* A hierarchical all-reduce (reduce-scatter inside the node, an all-reduce of
  ``nbytes / k`` per rail across nodes, all-gather inside the node) would cross
  each node boundary with ``2(N-1)/N * nbytes`` instead of the ring's
  ``2(n-1)/n * nbytes`` (half at ``N = 2``). NCCL runs that shape only as CollNet
  (switches with SHARP) or NVLS-tree (NVLink SHARP), neither on a DGX A100;
  Megatron-LM's and PyTorch's process groups call NCCL's ordinary collectives.
* NCCL's tree (all-reduce only) is chosen by its tuner where its logarithmic
  latency, ``2((k-1) L_nvlink + log2(N) L_net)``, wins; its bandwidth term,
  ``2 nbytes / busbw`` with busbw capped at 80-110 GB/s (``tuning.cc``,
  ``maxTreeBw``), is never below the ring's. For the messages of training (tens
  of MB and more) the ring is NCCL's pick on the nodes tabsched models; for
  small messages on many nodes tabsched overstates the latency.

>>> round(ring_time("all_reduce", 8e9, 4, 10e9, 1e-5), 9)   # 2*3/4 * 8 GB / 10 GB/s + 6 * 10 us
1.20006
>>> round(ring_time("all_gather", 8e9, 4, 10e9, 1e-5), 9)
0.60003
>>> ring_time("all_reduce", 8e9, 1, 10e9, 1e-5)
0.0
"""

import numpy as np

from tabsched.costs.nccl import bus_factor
from tabsched.exceptions import InvalidParameterError

__all__ = ["COLLECTIVES", "ring_steps", "ring_time", "group_time"]

#: Per collective: (steps per rank beyond the first, as a multiple of ``n-1``).
#: An all-to-all of ``nbytes`` per rank sends ``(n-1)/n`` of it, one ``nbytes/n`` block to
#: each peer: ``n-1`` steps of a block (NCCL's pairwise exchange; its bus factor is
#: ``(n-1)/n`` as an all-gather's).
COLLECTIVES = {"all_reduce": 2, "reduce_scatter": 1, "all_gather": 1, "all_to_all": 1}


def ring_steps(collective, ranks):
    """Steps of ``collective`` on a ring of ``ranks``: ``2(n-1)`` or ``n-1``."""
    if collective not in COLLECTIVES:
        raise InvalidParameterError(f"collective {collective!r} is not one of "
                                    f"{', '.join(COLLECTIVES)}")
    return COLLECTIVES[collective] * max(int(ranks) - 1, 0)


def ring_time(collective, nbytes, ranks, bandwidth, latency):
    """Seconds of ``collective`` of ``nbytes`` among ``ranks`` on a ring (see module docstring).

    ``nbytes`` may be an array (one collective per entry); ``bandwidth`` and
    ``latency`` are the slowest link's.
    """
    steps = ring_steps(collective, ranks)
    if steps == 0:
        return np.zeros(np.shape(nbytes)) if np.ndim(nbytes) else 0.0
    chunk = np.asarray(nbytes, dtype=np.float64) / int(ranks)
    time = steps * (latency + chunk / bandwidth)
    return time if np.ndim(time) else float(time)


def group_time(collective, nbytes, group, system):
    """Seconds of ``collective`` of ``nbytes`` over a parallel group.

    ``group`` is a :class:`~tabsched.costs.placement.GroupSpan`. Inside a node
    it is a ring on the system's intra-node link; across nodes NCCL's
    multi-rail ring (module docstring): one member per node runs on its share of
    a port, several members per node on their node's ports and NVLink,
    whichever is slower. Where the system has a measured table of this
    collective on this tier at this group size and members per node that covers
    ``nbytes`` (:mod:`tabsched.costs.nccl`), the time is nccl-tests' bus
    bandwidth inverted, ``nbytes * factor / busbw``; every other entry is the
    ring's, to the bit.

    >>> from tabsched.costs.placement import GroupSpan
    >>> from tabsched.costs.system import load_system
    >>> a100 = load_system("dgx-a100")
    >>> one = GroupSpan("data", 2, 8, 1, 2)     # one member per node: one 24 GB/s port
    >>> round(group_time("all_reduce", 1e9, one, a100) * 1e3, 3)   # 5 us + 1 GB / 24 GB/s
    41.677
    >>> eight = GroupSpan("data", 16, 1, 8, 2)  # eight per node: eight ports, 192 GB/s
    >>> round(group_time("all_reduce", 1e9, eight, a100) * 1e3, 3)  # 2*5 + 28*2 us + 30/16 GB / 192 GB/s
    9.832
    """
    ring = _placed_ring(collective, nbytes, group, system)
    tables = system.collective_bandwidth
    table = (None if tables is None or group.size < 2
             else tables.table(collective, group.tier, group.size, group.per_node))
    if table is None:
        return ring
    busbw = table.bus_bandwidth(nbytes)
    if np.isnan(busbw).all():
        return ring
    nbytes = np.asarray(nbytes, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        measured = nbytes * bus_factor(collective, group.size) / busbw
    time = np.where(np.isnan(busbw), ring, measured)
    return time if np.ndim(time) else float(time)


def _placed_ring(collective, nbytes, group, system):
    """The ring of ``group`` where it sits (module docstring), without measured tables."""
    if group.tier == "node":
        return ring_time(collective, nbytes, group.size, *system.tier_link("node"))
    port, network_latency = system.tier_link("network")
    members = group.per_node
    if collective == "all_to_all":
        return _placed_all_to_all(nbytes, group, system)
    ports = members * system.nics_per_device            # the group's ports on each node
    if members == 1:
        return ring_time(collective, nbytes, group.size, port * ports, network_latency)
    steps = ring_steps(collective, group.size)
    if steps == 0:
        return np.zeros(np.shape(nbytes)) if np.ndim(nbytes) else 0.0
    nvlink, nvlink_latency = system.tier_link("node")
    crossing = ring_steps(collective, group.nodes)       # NCCL's nInterSteps
    latency = crossing * network_latency + (steps - crossing) * nvlink_latency
    seconds_per_byte = steps / group.size * max(1.0 / (port * ports),
                                                (members - 1) / members / nvlink)
    time = latency + np.asarray(nbytes, dtype=np.float64) * seconds_per_byte
    return time if np.ndim(time) else float(time)


def _placed_all_to_all(nbytes, group, system):
    """An all-to-all of ``nbytes`` per member over a group that spans nodes.

    NCCL has no ring for it: ``ncclAllToAll`` (and PyTorch's ``all_to_all_single``,
    which Megatron-Core's all-to-all token dispatcher calls) post one send and one
    receive of an ``nbytes / n`` block per peer in one group call, all in flight at
    once. A member's ``n - k`` blocks for peers on other nodes leave through its own
    share of the node's ports (``r`` ports of ``B``; every member of every group of the
    dimension sends at once, so no member borrows another's NIC), its ``k - 1`` blocks
    for peers on its node go over NVLink beside them; the slower of the two sets the time:

        ``max((n-k)/n * nbytes / (r B), (k-1)/n * nbytes / B_nvlink)``

    plus one network latency per other node and one NVLink latency per node-local peer.
    Unlike a ring, whose traffic crosses a node boundary on all ``k r`` ports of the
    group at once, an all-to-all across two nodes sends half of every member's bytes
    over the network: the reason expert parallelism past a node is expensive (DeepSeek-
    V3, section 3.2.2, limits each token to 4 nodes for it; DeepEP's README measures
    43-58 GB/s per H800 GPU over 400 Gb/s InfiniBand against 150-160 GB/s over NVLink).
    Inside one node this equals the ring's ``(n-1)/n * nbytes / B_nvlink``.
    """
    port, network_latency = system.tier_link("network")
    nvlink, nvlink_latency = system.tier_link("node")
    n, k = group.size, group.per_node
    share = np.asarray(nbytes, dtype=np.float64) / n
    off_node = share * (n - k) / (port * system.nics_per_device)
    on_node = share * (k - 1) / nvlink
    time = ((group.nodes - 1) * network_latency + (k - 1) * nvlink_latency
            + np.maximum(off_node, on_node))
    return time if np.ndim(time) else float(time)
