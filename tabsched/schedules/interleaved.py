"""Interleaved 1F1B: Megatron-LM's virtual pipeline (SCHEDULES.md §3).

Each of the ``p`` devices holds ``v`` model chunks in the looping placement:
chunk ``c`` of device ``r`` is stage ``c*p + r``, so the model runs down the
devices ``v`` times.

Megatron-LM (``megatron/core/pipeline_parallel/schedules.py``,
``get_schedule_table`` and ``get_pp_rank_microbatches``) orders device ``r``'s
``v*N`` forwards by a table of (microbatch, chunk) pairs: the microbatches are
taken in groups of ``g`` (``microbatch_group_size_per_vp_stage``, our
``group_size``, default ``p``), the last group being whatever remains once a
full group would reach ``N``; inside a group every chunk runs every microbatch
of the group, chunk by chunk. The ``j``-th backward runs the ``j``-th entry of
the same table with the chunk mirrored (``v-1-c``). The device runs
``w = min(v*N, 2*(p-r-1) + (v-1)*g)`` forwards, then ``v*N - w`` pairs
(forward ``w+j``, backward ``j``), then the last ``w`` backwards.

Megatron accepts ``p <= g <= N`` and a last group that is empty or holds at
least ``p`` microbatches (``N % g == 0`` or ``N % g >= p``); so do we.

``pairs="fused"`` is Megatron-Core's combined 1F1B (``--overlap-moe-expert-parallel-comm``
with ``--delay-wgrad-compute``; ``combined_1f1b_schedule_for_interleaved_pipelining`` in
``megatron/core/pipeline_parallel/combined_1f1b.py``): the warm-up runs one forward more
(``get_pp_rank_microbatches``: "we schedule one extra micro-batch forward step before the
1f1b stages. This is needed to ensure the forward and backward computations are
independent in all 1f1b steps"), and each steady step's forward and backward run as one
overlapped cell, layer by layer, the all-to-alls of one hidden behind the other's compute
(timed by :mod:`tabsched.costs.streams`, as DualPipe's pairs are).
PyTorch's ``ScheduleInterleaved1F1B`` groups differently (rounds of
``max(1, N // p)``, requiring ``N`` to be a multiple of the round count);
where it accepts a size, its order is this module's with
``group_size = N // max(1, N // p)``.
"""

import numpy as np

from tabsched.exceptions import InvalidParameterError
from tabsched.schedules._common import DEVICES, MICROBATCHES, table_from_columns
from tabsched.schedules._registry import Family, Parameter, register
from tabsched.table import BACKWARD, FORWARD

NAME = "interleaved-1f1b"


def schedule_table(microbatches, chunks, group_size):
    """Megatron's (microbatch, chunk) table as two arrays of length ``chunks*microbatches``.

    >>> microbatch, chunk = schedule_table(5, 2, 3)
    >>> microbatch.tolist(), chunk.tolist()
    ([0, 1, 2, 0, 1, 2, 3, 4, 3, 4], [0, 0, 0, 1, 1, 1, 0, 0, 1, 1])
    """
    microbatch_parts, chunk_parts = [], []
    first = 0
    while first < microbatches:
        last = microbatches if first + group_size >= microbatches else first + group_size
        group = np.arange(first, last)
        microbatch_parts.append(np.tile(group, chunks))
        chunk_parts.append(np.repeat(np.arange(chunks), len(group)))
        first = last
    return np.concatenate(microbatch_parts), np.concatenate(chunk_parts)


def warmup_forwards(devices, microbatches, chunks, group_size, device):
    """Megatron's warm-up depth on ``device``: ``min(v*N, 2*(p-r-1) + (v-1)*g)``."""
    return min(chunks * microbatches, 2 * (devices - device - 1) + (chunks - 1) * group_size)


def check(devices, microbatches, chunks, group_size):
    """Raise ``InvalidParameterError`` unless Megatron accepts the combination."""
    p, n, v, g = devices, microbatches, chunks, group_size
    if v < 2:
        raise InvalidParameterError(
            f"{NAME}: chunks must be >= 2, not {v} (one chunk per device is the 1f1b family)")
    if n < p:
        raise InvalidParameterError(
            f"{NAME}: microbatches must be >= devices ({n} < {p}), since group_size must "
            f"lie in [devices, microbatches]")
    if not p <= g <= n:
        raise InvalidParameterError(
            f"{NAME}: group_size must lie in [devices, microbatches] = [{p}, {n}], not {g}")
    remainder = n % g
    if 0 < remainder < p:
        valid = [size for size in range(p, n + 1) if n % size == 0 or n % size >= p]
        raise InvalidParameterError(
            f"{NAME}: the last microbatch group would hold {remainder} microbatches "
            f"(microbatches % group_size = {n} % {g}), fewer than devices={p}; it must be 0 "
            f"or >= devices (valid group_size for {n} microbatches: "
            f"{', '.join(map(str, valid))})")


#: How a steady step's forward and backward run: one after the other, or as one
#: overlapped cell (Megatron-Core's combined 1F1B).
PAIRS = ("serial", "fused")


def _fused(pairs):
    if pairs not in PAIRS:
        raise InvalidParameterError(f"{NAME}: pairs must be one of {', '.join(PAIRS)}, "
                                    f"not {pairs!r}")
    return pairs == "fused"


def validate(devices, microbatches, chunks=2, group_size=None, pairs="serial"):
    """Raise where :func:`build` would (Megatron's checks); the table's stage count."""
    check(devices, microbatches, chunks, devices if group_size is None else group_size)
    _fused(pairs)
    return devices * chunks


def build(devices, microbatches, chunks=2, group_size=None, pairs="serial"):
    p, n, v = devices, microbatches, chunks
    g = p if group_size is None else group_size
    check(p, n, v, g)
    fused = _fused(pairs)
    table_mb, table_chunk = schedule_table(n, v, g)
    total = v * n
    columns = ([], [], [], [], [])
    for r in range(p):
        w = warmup_forwards(p, n, v, g, r)
        if fused:
            w = min(total, w + 1)       # combined 1F1B: one more warm-up forward
        steady = total - w
        # Position of forward j and backward j in the device's order (a fused pair shares
        # one position: one cell)
        step = 1 if fused else 2
        forward_at = np.concatenate([np.arange(w), w + step * np.arange(steady)])
        backward_at = np.concatenate([w + step * np.arange(steady) + (step - 1),
                                      w + step * steady + np.arange(w)])
        values = (np.full(2 * total, r),
                  np.concatenate([forward_at, backward_at]),
                  np.repeat([FORWARD, BACKWARD], total),
                  np.concatenate([table_chunk * p + r, (v - 1 - table_chunk) * p + r]),
                  np.concatenate([table_mb, table_mb]))
        for column, value in zip(columns, values):
            column.append(value)
    return table_from_columns(columns, p, num_stages=v * p, num_microbatches=n, family=NAME,
                              params={"devices": p, "microbatches": n, "chunks": v,
                                      "group_size": g, **({"pairs": pairs} if fused else {})})


FAMILY = register(Family(
    name=NAME,
    summary="Megatron-LM's interleaved 1F1B (virtual pipeline), microbatch groups of "
            "group_size per chunk (Narayanan et al. 2021)",
    build=build,
    check=validate,
    parameters=(Parameter("devices", help=DEVICES),
                Parameter("microbatches", help=MICROBATCHES),
                Parameter("chunks", 2, "model chunks per device (Megatron's virtual "
                                       "pipeline size v); chunk c of device r is stage c*p+r"),
                Parameter("group_size", None,
                          "microbatches per chunk before switching chunk (Megatron's "
                          "microbatch_group_size_per_vp_stage); default: devices",
                          optional=True),
                Parameter("pairs", "serial",
                          "serial: a steady step runs its forward, then its backward; fused: "
                          "Megatron-Core's combined 1F1B (--overlap-moe-expert-parallel-comm): "
                          "one more warm-up forward, then each forward+backward pair is one "
                          "overlapped cell, timed on two streams")),
    constraints="chunks >= 2; devices <= group_size <= microbatches; microbatches % "
                "group_size is 0 or >= devices (Megatron's checks)",
    notes="device r holds up to 2(p-r-1)+(v-1)g+1 chunk activations (11,9,7,5 at p=4, v=2, "
          "g=4); v times the P2P messages of 1f1b; the order is Megatron's, not PyTorch's "
          "ScheduleInterleaved1F1B",
    aliases=("interleaved", "virtual-pipeline"),
))
