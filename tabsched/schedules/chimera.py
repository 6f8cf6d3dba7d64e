"""Chimera: two (or 2f) pipelines in opposite directions on one set of workers.

Li & Hoefler, "Chimera: Efficiently Training Large-Scale Neural Networks with
Bidirectional Pipelines", SC'21; code ``Shigangli/Chimera``. SCHEDULES.md §8.

Placement (the code's config maps): the *down* pipeline runs stage s on worker
s, the *up* pipeline runs stage s on worker D-1-s, so worker r holds two
replicas, down-stage r and up-stage D-1-r. Stage numbers are model stages: a
stage lives on two workers, one per direction, and a (stage, microbatch) on
one. ``evaluate(..., grad_sync="replicas")`` adds the all-reduce between the
two replicas of every stage.

Microbatches: a unit of D microbatches (2D with forward doubling) sends its
first half down and its second half up; each pipeline runs its microbatches in
FIFO order.

Per-worker order for two pipelines (``ChimeraBk`` ``main_with_runtime.py``):
with H = D/2, a = H-r for r < H else r-H+1, b = H-a, "home" the direction
entering at the worker's end of the pipeline (down for r < H):

    P1  a x F(home)
    P2  b x [F(other), F(home)]
    P3  a x [F(other), B(other)]
    P4  b x [B(home), B(other)]
    P5  a x B(home)

``variant="direct"`` (``main_with_runtime_direct.py``) chains units of D
microbatches: every unit after the first opens P1 with a x [B(home) of the
previous unit, F(home)], absorbing the previous P5; only the last unit ends
with P5. ``variant="doubling"`` (``main_with_runtime_forward_doubling.py``)
takes units of 2D microbatches, doubles every forward of P1-P3 (two
consecutive forwards of one direction), repeats P4 b+H times, and opens later
units with a x [B(home), F(home), F(home)].

More than two pipelines (``pipelines`` = 2f, ``chimera_pipeline_rank.py``):
f down and f up pipelines, each with D/(2f) microbatches per unit; pipeline k
is rotated by k*D/f workers (down: stage s on worker (s + k*D/f) mod D; up:
stage s on worker (k*D/f + D-1-s) mod D). The code builds the order on a slot
grid where every microbatch enters its pipeline every second slot and takes
one slot per stage forward and backward (F = B); the next unit enters when the
first microbatch of the previous one has left, 2D slots later. Each worker runs
its operations in grid order. For two pipelines this grid gives exactly the
order of the phases above (tests check it).
"""

import numpy as np

from tabsched.exceptions import InvalidParameterError
from tabsched.schedules._common import DEVICES, MICROBATCHES, OrderBuilder, table_from_columns
from tabsched.schedules._registry import Family, Parameter, register
from tabsched.table import BACKWARD, FORWARD

VARIANTS = ("direct", "doubling")
DOWN, UP = 0, 1


def _check(devices, microbatches, variant, pipelines):
    D, N = devices, microbatches
    if variant not in VARIANTS:
        raise InvalidParameterError(f"chimera: variant must be one of {', '.join(VARIANTS)}, "
                                    f"not {variant!r}")
    if D % 2:
        raise InvalidParameterError(
            f"chimera: devices must be even (the down and up pipelines split every "
            f"worker's microbatches), not {D}; try {D - 1 if D > 1 else 2} or {D + 1}")
    half = D // 2
    if pipelines % 2 or half % (pipelines // 2):
        valid = [2 * f for f in range(1, half + 1) if half % f == 0]
        raise InvalidParameterError(
            f"chimera: pipelines must be 2f with f dividing devices/2 = {half} "
            f"(f down and f up pipelines), i.e. one of {', '.join(map(str, valid))}; "
            f"not {pipelines}")
    if variant == "doubling" and pipelines != 2:
        raise InvalidParameterError(
            f"chimera: forward doubling is defined for two pipelines only; use "
            f"variant='direct' with pipelines={pipelines}, or pipelines=2")
    unit = D if variant == "direct" else 2 * D
    if N % unit:
        lower = max(unit, N - N % unit)
        what = "devices" if variant == "direct" else "2 x devices"
        raise InvalidParameterError(
            f"chimera: variant {variant!r} runs units of {what} = {unit} microbatches, so "
            f"microbatches must be a multiple of {unit} (e.g. {lower} or {lower + unit}), "
            f"not {N}")


def _microbatch(direction, k, unit):
    """Global id of the k-th microbatch of ``direction`` (units split half down, half up)."""
    half = unit // 2
    return (k // half) * unit + direction * half + k % half


def phase_orders(devices, microbatches, variant="direct"):
    """Per worker, ``(kind, direction, microbatch)`` in the order of the phase rule."""
    names = {FORWARD: "F", BACKWARD: "B"}
    return [[(names[kind], direction, microbatch) for kind, direction, microbatch in
             zip(*(column.tolist() for column in phase_columns(devices, microbatches,
                                                               variant, r)))]
            for r in range(devices)]


def phase_columns(devices, microbatches, variant, worker):
    """Worker ``worker``'s ``phase_orders`` as arrays ``(kind codes, directions,
    microbatches)``.

    The phases give the sequence of (kind, direction) pairs; the k-th op of a pair
    runs that direction's k-th microbatch (:func:`_microbatch`), numbered here
    by a running count per pair.
    """
    D, N, r = devices, microbatches, worker
    H = D // 2
    unit = D if variant == "direct" else 2 * D
    units = N // unit
    repeat = 1 if variant == "direct" else 2
    extra_p4 = 0 if variant == "direct" else H
    a = H - r if r < H else r - H + 1
    b = H - a
    home = DOWN if r < H else UP
    other = 1 - home
    # (kind, direction) as one code: kind * 2 + direction
    f_home, f_other = [FORWARD * 2 + home] * repeat, [FORWARD * 2 + other] * repeat
    b_home, b_other = BACKWARD * 2 + home, BACKWARD * 2 + other
    rest = (b * (f_other + f_home) + a * (f_other + [b_other])
            + (b + extra_p4) * [b_home, b_other])          # P2, P3, P4
    first = a * f_home + rest                               # P1 of the first unit
    later = a * ([b_home] + f_home) + rest                  # P1 absorbing the last P5
    codes = np.array((first + later * (units - 1) if units else []) + a * [b_home],
                     dtype=np.int64)
    count = np.empty(len(codes), dtype=np.int64)            # k: the pair's running count
    for code in range(4):
        where = np.flatnonzero(codes == code)
        count[where] = np.arange(len(where))
    direction = codes % 2
    half = unit // 2
    microbatch = (count // half) * unit + direction * half + count % half
    return (codes // 2).astype(np.int8), direction, microbatch


def grid_orders(devices, microbatches, pipelines):
    """Per worker, ``(kind, direction, microbatch, stage)`` in the code's slot-grid order.

    Every microbatch of pipeline k (direction d) in unit u enters at slot
    2D*u + 2j (j-th of the pipeline's D/(2f) microbatches), runs F of stage s
    at slot t0+s and B of stage s at slot t0+2D-1-s.
    """
    D, N, f = devices, microbatches, pipelines // 2
    per_pipeline = D // (2 * f)
    shift = D // f
    cells = [[] for _ in range(D)]
    for u in range(N // D):
        for direction in (DOWN, UP):
            for k in range(f):
                for j in range(per_pipeline):
                    microbatch = u * D + direction * (D // 2) + k * per_pipeline + j
                    start = 2 * D * u + 2 * j
                    for s in range(D):
                        worker = ((s + k * shift) % D if direction == DOWN
                                  else (k * shift + D - 1 - s) % D)
                        cells[worker].append((start + s, "F", direction, microbatch, s))
                        cells[worker].append((start + 2 * D - 1 - s, "B", direction,
                                              microbatch, s))
    orders = []
    for worker_cells in cells:
        worker_cells.sort()
        slots = [cell[0] for cell in worker_cells]
        if len(set(slots)) != len(slots):  # pragma: no cover - excluded by the rotation
            raise AssertionError("chimera grid: two operations share a slot")
        orders.append([cell[1:] for cell in worker_cells])
    return orders


def validate(devices, microbatches, variant="direct", pipelines=2):
    """Raise where :func:`build` would; the table's stage count (one stage per worker,
    each held twice)."""
    _check(devices, microbatches, variant, pipelines)
    return devices


def build(devices, microbatches, variant="direct", pipelines=2):
    D, N = devices, microbatches
    _check(D, N, variant, pipelines)
    params = {"devices": D, "microbatches": N, "variant": variant}
    if pipelines != 2:
        params["pipelines"] = pipelines
    metadata = dict(num_stages=D, num_microbatches=N, family="chimera", params=params)
    if pipelines != 2:
        builder = OrderBuilder(D)
        for r, order in enumerate(grid_orders(D, N, pipelines)):
            for kind, _, microbatch, stage in order:
                builder.add(r, kind, stage, microbatch)
        return builder.table(**metadata)
    columns = ([], [], [], [], [])
    for r in range(D):
        kinds, directions, mbs = phase_columns(D, N, variant, r)
        values = (np.full(len(kinds), r), np.arange(len(kinds)), kinds,
                  np.where(directions == DOWN, r, D - 1 - r), mbs)
        for column, value in zip(columns, values):
            column.append(value)
    return table_from_columns(columns, D, **metadata)


FAMILY = register(Family(
    name="chimera",
    summary="bidirectional pipelines, two replicas per worker (Li & Hoefler, SC'21)",
    build=build,
    replicas=True,
    check=validate,
    parameters=(Parameter("devices", help=DEVICES + "; even"),
                Parameter("microbatches", help=MICROBATCHES),
                Parameter("variant", "direct",
                          "how units of microbatches chain when M > D: direct "
                          "(concatenation) or doubling (forward doubling)"),
                Parameter("pipelines", 2,
                          "total pipelines 2f (f down, f up); f divides devices/2")),
    constraints="devices even; microbatches a multiple of devices (direct) or of 2 x devices "
                "(doubling); pipelines = 2f with f dividing devices/2 (doubling: 2 only)",
    notes="stage s runs on workers s (down) and D-1-s (up): sync replica gradients with "
          "grad_sync='replicas'; activations per worker within [D/2+1, D] stage "
          "activations (doubling about twice that)",
    chunks_per_device=2,
))
