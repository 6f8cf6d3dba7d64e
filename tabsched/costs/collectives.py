"""Collective operations on a ring: all-reduce, reduce-scatter, all-gather.

One place for the cost of the collectives tabsched models, used alike by
tensor parallelism (the all-reduces, or reduce-scatters and all-gathers, inside
a layer), data parallelism (the gradient all-reduce at the end of an
iteration, the parameter all-gather after a sharded optimizer step) and the
gradient sync of replicated stages (Chimera's replicas). A collective runs over
one parallel group: :func:`group_time` prices it from where the group sits
(:class:`~tabsched.costs.placement.GroupSpan`: inside a node, or across nodes)
on the system's link of that tier.

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
COLLECTIVES = {"all_reduce": 2, "reduce_scatter": 1, "all_gather": 1}


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
    """Seconds of ``collective`` of ``nbytes`` over a parallel group, as a ring.

    ``group`` is a :class:`~tabsched.costs.placement.GroupSpan`; the ring's
    slowest link is the system's link of the tier the group crosses
    (:meth:`~tabsched.costs.system.System.tier_link`): inside a node when every
    member shares one, else between nodes, each member on its own network port.
    Where the system has a measured table of this collective on this tier at
    this group size and members per node that covers ``nbytes``
    (:mod:`tabsched.costs.nccl`), the time is nccl-tests' bus bandwidth
    inverted, ``nbytes * factor / busbw``; every other entry is the ring's, to
    the bit.

    >>> from tabsched.costs.placement import GroupSpan
    >>> from tabsched.costs.system import load_system
    >>> inside = GroupSpan("tensor", 8, 1, 8, 1)
    >>> group_time("all_reduce", 8e9, inside, load_system("dgx-a100")) > 0
    True
    """
    bandwidth, latency = system.tier_link(group.tier)
    ring = ring_time(collective, nbytes, group.size, bandwidth, latency)
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
