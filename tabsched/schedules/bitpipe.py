"""BitPipe: two V-shaped pipelines in opposite directions (Wu et al., arXiv 2410.19367).

Code ``wuhouming/BitPipe`` (the bidirectional interleaved schedule with direct
concatenation, ``get_microbatch_idx`` / ``get_bkmicrobatch_idx``); SCHEDULES.md §9.

Placement: each replica has 2P stages in a V. Device d holds four chunks,
c0 = down stage d, c1 = up stage P-1-d, c2 = down stage 2P-1-d, c3 = up stage
P+d; both turns (down P-1 -> P on device P-1, up P-1 -> P on device 0) are
local. Stage numbers are model stages, each on two devices (one per replica):
``evaluate(..., grad_sync="replicas")`` adds the all-reduce of the pair d,
P-1-d ("bd" groups in the code).

Microbatches come in units of P: unit k sends k*P + [0, P/2) down and
k*P + [P/2, P) up. Each chunk takes its direction's microbatches in order.

Order of device r, with u = P/2, h = r // u, n0 = u-r if r < u else r-u+1:

* forward chunk sequence per unit: n0 x c[h], (u-n0) x [c[1-h], c[h]],
  n0 x [c[1-h], c[3-h]], (u-n0) x [c[2+h], c[3-h]], n0 x c[2+h];
* backward chunk sequence per unit: n0 x c[2+h], (u-n0) x [c[3-h], c[2+h]],
  n0 x [c[3-h], c[1-h]], (u-n0) x [c[h], c[1-h]], n0 x c[h];
* interleaving, with warm-up w = P+u+(r if r < u else P-1-r) and q = 2P-w:
  w forwards; for each further unit q x [F, B], (w-q+1) x B, (q-1) x [F, B],
  (w-q+1) x F; finally q x [F, B] and the remaining backwards.

Backwards are full (``B``); the code has no split backward.
"""

from tabsched.exceptions import InvalidParameterError
from tabsched.schedules._common import DEVICES, MICROBATCHES, OrderBuilder
from tabsched.schedules._registry import Family, Parameter, register

DOWN, UP = 0, 1


def chunk_map(P, d):
    """``(stage, direction)`` of device d's chunks c0..c3."""
    return [(d, DOWN), (P - 1 - d, UP), (2 * P - 1 - d, DOWN), (P + d, UP)]


def chunk_sequences(P, r):
    """One unit's forward and backward chunk sequences on device r."""
    u = P // 2
    h = r // u
    n0 = u - r if r < u else r - u + 1
    forward = ([h] * n0 + [1 - h, h] * (u - n0) + [1 - h, 3 - h] * n0
               + [2 + h, 3 - h] * (u - n0) + [2 + h] * n0)
    backward = ([2 + h] * n0 + [3 - h, 2 + h] * (u - n0) + [3 - h, 1 - h] * n0
                + [h, 1 - h] * (u - n0) + [h] * n0)
    return forward, backward


def interleaving(P, r, units):
    """The device's sequence of ``"F"`` / ``"B"`` steps."""
    u = P // 2
    warmup = P + u + (r if r < u else P - 1 - r)
    q = 2 * P - warmup
    steps = ["F"] * warmup
    for _ in range(units - 1):
        steps += ["F", "B"] * q + ["B"] * (warmup - q + 1)
        steps += ["F", "B"] * (q - 1) + ["F"] * (warmup - q + 1)
    steps += ["F", "B"] * q
    steps += ["B"] * (2 * P * units - steps.count("B"))
    return steps


def validate(devices, microbatches):
    """Raise where :func:`build` would; the table's stage count, ``2 * devices``."""
    P, N = devices, microbatches
    if P % 2:
        raise InvalidParameterError(
            f"bitpipe: devices must be even (each unit sends P/2 microbatches each way), "
            f"not {P}; try {P - 1 if P > 1 else 2} or {P + 1}")
    if N % P:
        lower = max(P, N - N % P)
        raise InvalidParameterError(
            f"bitpipe: microbatches must be a multiple of devices = {P} (units of P/2 per "
            f"direction), e.g. {lower} or {lower + P}; not {N}")
    return 2 * P


def build(devices, microbatches):
    validate(devices, microbatches)
    P, N = devices, microbatches
    u, units = P // 2, N // P
    builder = OrderBuilder(P)
    for r in range(P):
        chunks = chunk_map(P, r)
        forward_chunks, backward_chunks = chunk_sequences(P, r)
        sequences = {"F": forward_chunks * units, "B": backward_chunks * units}
        position = {"F": 0, "B": 0}
        taken = {("F", c): 0 for c in range(4)} | {("B", c): 0 for c in range(4)}
        for kind in interleaving(P, r, units):
            chunk = sequences[kind][position[kind]]
            position[kind] += 1
            k = taken[kind, chunk]
            taken[kind, chunk] = k + 1
            stage, direction = chunks[chunk]
            builder.add(r, kind, stage, (k // u) * P + direction * u + k % u)
    return builder.table(num_stages=2 * P, num_microbatches=N, family="bitpipe",
                         params={"devices": P, "microbatches": N})


FAMILY = register(Family(
    name="bitpipe",
    summary="bidirectional interleaved V-shaped pipelines, 4 chunks per device (BitPipe, 2024)",
    build=build,
    replicas=True,
    check=validate,
    parameters=(Parameter("devices", help=DEVICES + "; even"),
                Parameter("microbatches", help=MICROBATCHES + "; a multiple of devices")),
    constraints="devices even; microbatches a multiple of devices; 4 chunks per device (fixed)",
    notes="2P stages per replica, each on two devices: grad_sync='replicas'; the code needs an "
          "even layer count per stage; no closed-form bubble published",
    chunks_per_device=4,
))
