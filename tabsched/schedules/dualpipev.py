"""DualPipeV: DualPipe cut in half, one V-shaped pipeline over p ranks (DeepSeek).

``deepseek-ai/DualPipe`` ``dualpipev.py``, also PyTorch's ``ScheduleDualPipeV``;
SCHEDULES.md §10. It is the "cut-in-half" DualPipe (Sea AI Lab): p ranks, 2p
stages, no replica. Rank r holds stage r (chunk 0) and stage 2p-1-r (chunk 1);
the turn from stage p-1 to p is local to rank p-1 and the loss is on rank 0.

The order is DualPipe's (see :mod:`tabsched.schedules.dualpipe`) with H = p,
h = r, C = N: phase 0 is chunk 0, phase 1 chunk 1, and the middle rank whose
first pair runs unoverlapped is the last one.
"""

from tabsched.exceptions import InvalidParameterError
from tabsched.schedules._common import DEVICES, MICROBATCHES, OrderBuilder
from tabsched.schedules._registry import Family, Parameter, register
from tabsched.schedules.dualpipe import PAIRS_HELP, add_rank, check_pairs, step_sequence


def validate(devices, microbatches, pairs="fused"):
    """Raise where :func:`build` would; the table's stage count, ``2 * devices``."""
    p, N = devices, microbatches
    check_pairs("dualpipev", pairs)
    if N < 2 * p:
        raise InvalidParameterError(
            f"dualpipev: microbatches must be at least 2 x devices = {2 * p} (the number of "
            f"stages), not {N}")
    return 2 * p


def build(devices, microbatches, pairs="fused"):
    validate(devices, microbatches, pairs)
    p, N = devices, microbatches
    fused = check_pairs("dualpipev", pairs)
    builder = OrderBuilder(p)
    for r in range(p):
        add_rank(builder, r, step_sequence(p, r, N), [r, 2 * p - 1 - r],
                 lambda phase, k: k, fused)
    params = {"devices": p, "microbatches": N}
    if not fused:
        params["pairs"] = pairs
    return builder.table(num_stages=2 * p, num_microbatches=N, family="dualpipev",
                         params=params)


FAMILY = register(Family(
    name="dualpipev",
    summary="DualPipe cut in half: V-shaped, 2 chunks per device, overlapped pairs (DeepSeek)",
    build=build,
    check=validate,
    parameters=(Parameter("devices", help=DEVICES),
                Parameter("microbatches", help=MICROBATCHES),
                Parameter("pairs", "fused", PAIRS_HELP)),
    constraints="microbatches >= 2 x devices (odd M allowed, as in PyTorch)",
    notes="rank r holds stages r and 2p-1-r; README: bubble (PP/2-1)(F&B+B-3W) with PP = 2p, "
          "PP+1 = 2p+1 chunk activations",
    chunks_per_device=2,
))
