"""DualPipe: bidirectional pipeline with overlapped forward+backward pairs (DeepSeek).

DeepSeek-AI, DeepSeek-V3 technical report (arXiv 2412.19437), and the code
``deepseek-ai/DualPipe`` (``dualpipe.py``; ``dualpipev.py`` shares the order).
SCHEDULES.md §10.

Placement: rank r holds stage r of replica A and stage PP-1-r of replica B; A's
microbatches (0 .. N/2-1) enter at rank 0, B's (N/2 .. N-1) at rank PP-1. The
two copies of a stage are replicas: ``evaluate(..., grad_sync="replicas")``
sums their gradients across the pair (r, PP-1-r).

Order of rank r (:func:`step_sequence`), with H = PP/2, h = min(r, PP-1-r),
C = N/2; phase 0 is the direction entering at this rank's end (A on ranks
< H, B on ranks >= H), phase 1 the other:

1. 2(H-h-1) x F0
2. (h+1) x [F0, F1]
3. (H-h-1) x [I1, W, F1]
4. (C-2H+h+1) x [<F0 B1>, <F1 B0>]; on the middle ranks (h = H-1) the first
   <F0 B1> runs as two separate steps
5. (H-h-1) x [B1, <F1 B0>]
6. (h+1) x [B1, B0], full backwards that switch to input-grad ``I`` at
   i = (h+1)//2 (before B1 when h is odd, after it when h is even)
7. (H-h-1) x [W, I0]
8. (h+1) x W

``B`` is a full backward (DeepSeek's plain backward chunk); ``I`` is the
input-grad part run with the zero-bubble store, whose ``W`` goes into one FIFO
shared by both phases; ``W`` runs the oldest pending one. ``<F B>`` is one
*overlapped* cell (PyTorch's ``OVERLAP_F_B``): its duration is the cost
model's: under ``ModelCosts`` the two-stream model (one operation's collectives beside
the other's compute, :mod:`tabsched.costs.streams`), under slot costs the ``overlap``
factor times the sum of its parts (default 1: no gain).
``pairs="serial"`` lays every pair out as F then B, which is what DeepSeek's
runtime does for modules without ``overlapped_forward_backward``.
"""

from tabsched.exceptions import InvalidParameterError
from tabsched.schedules._common import DEVICES, MICROBATCHES, OrderBuilder
from tabsched.schedules._registry import Family, Parameter, register

PAIRS = ("fused", "serial")
PAIRS_HELP = ("fused: each overlapped forward+backward pair is one cell (timed by the cost "
              "model: two streams under model costs, overlap x its parts under slots); "
              "serial: F then B")


def step_sequence(H, h, C):
    """One rank's steps as tuples: ``("F", phase)``, ``("B", phase)`` (full backward),
    ``("I", phase)``, ``("W",)`` or ``("FB", forward_phase, backward_phase)``.

    ``H`` half the pipeline depth (DualPipe: PP/2; DualPipeV: p), ``h`` the rank's
    distance from its end (DualPipe: min(r, PP-1-r); DualPipeV: r), ``C`` the
    microbatches per phase (DualPipe: N/2; DualPipeV: N).
    """
    steps = []
    middle = h == H - 1
    steps += [("F", 0)] * (2 * (H - h - 1))                         # 1
    steps += [("F", 0), ("F", 1)] * (h + 1)                         # 2
    steps += [("I", 1), ("W",), ("F", 1)] * (H - h - 1)             # 3
    for i in range(C - 2 * H + h + 1):                              # 4
        if i == 0 and middle:
            steps += [("F", 0), ("B", 1)]
        else:
            steps.append(("FB", 0, 1))
        steps.append(("FB", 1, 0))
    steps += [("B", 1), ("FB", 1, 0)] * (H - h - 1)                 # 5
    split = False
    for i in range(h + 1):                                          # 6
        if i == (h + 1) // 2 and h % 2 == 1:
            split = True
        steps.append(("I" if split else "B", 1))
        if i == (h + 1) // 2 and h % 2 == 0:
            split = True
        steps.append(("I" if split else "B", 0))
    steps += [("W",), ("I", 0)] * (H - h - 1)                       # 7
    steps += [("W",)] * (h + 1)                                     # 8
    return steps


def add_rank(builder, rank, steps, stage_of, microbatch_of, fused):
    """Append one rank's steps; ``stage_of[phase]`` and ``microbatch_of(phase, k)`` map a
    phase and its k-th forward (or backward) to the operation's stage and microbatch."""
    forwards, backwards = [0, 0], [0, 0]
    pending = []   # W FIFO: (stage, microbatch) of every I not yet followed by its W

    def forward(phase):
        op = ("F", stage_of[phase], microbatch_of(phase, forwards[phase]))
        forwards[phase] += 1
        return op

    def backward(phase, kind):
        op = (kind, stage_of[phase], microbatch_of(phase, backwards[phase]))
        backwards[phase] += 1
        if kind == "I":
            pending.append(op[1:])
        return op

    for step in steps:
        if step[0] == "F":
            builder.add(rank, *forward(step[1]))
        elif step[0] in ("B", "I"):
            builder.add(rank, *backward(step[1], step[0]))
        elif step[0] == "W":
            builder.add(rank, "W", *pending.pop(0))
        else:
            parts = (forward(step[1]), backward(step[2], "B"))
            if fused:
                builder.add_overlap(rank, parts)
            else:
                for part in parts:
                    builder.add(rank, *part)
    if pending:  # pragma: no cover - the step counts balance (tests check every size)
        raise AssertionError(f"rank {rank}: {len(pending)} weight-grads left")


def check_pairs(family, pairs):
    if pairs not in PAIRS:
        raise InvalidParameterError(f"{family}: pairs must be one of {', '.join(PAIRS)}, "
                                    f"not {pairs!r}")
    return pairs == "fused"


def validate(devices, microbatches, pairs="fused"):
    """Raise where :func:`build` would; the table's stage count (``devices``, each stage
    held by two ranks)."""
    PP, N = devices, microbatches
    check_pairs("dualpipe", pairs)
    if PP % 2:
        raise InvalidParameterError(
            f"dualpipe: devices must be even (rank r pairs with rank PP-1-r), not {PP}; "
            f"try {PP - 1 if PP > 1 else 2} or {PP + 1}")
    if N % 2 or N < 2 * PP:
        smallest = 2 * PP
        near = max(smallest, N + N % 2)
        raise InvalidParameterError(
            f"dualpipe: microbatches must be even and at least 2 x devices = {smallest} "
            f"(half go each way), e.g. {near}; not {N}")
    return PP


def build(devices, microbatches, pairs="fused"):
    validate(devices, microbatches, pairs)
    PP, N = devices, microbatches
    fused = check_pairs("dualpipe", pairs)
    H, C = PP // 2, N // 2
    builder = OrderBuilder(PP)
    for r in range(PP):
        second_half = r >= H
        # phase p runs direction p ^ second_half: 0 = A (stage r), 1 = B (stage PP-1-r)
        stage_of = [PP - 1 - r if second_half else r, r if second_half else PP - 1 - r]
        offset = [C if second_half else 0, 0 if second_half else C]
        add_rank(builder, r, step_sequence(H, min(r, PP - 1 - r), C), stage_of,
                 lambda phase, k, offset=offset: offset[phase] + k, fused)
    params = {"devices": PP, "microbatches": N}
    if not fused:
        params["pairs"] = pairs
    return builder.table(num_stages=PP, num_microbatches=N, family="dualpipe", params=params)


FAMILY = register(Family(
    name="dualpipe",
    summary="bidirectional, overlapped forward+backward pairs, split backward (DeepSeek-V3)",
    build=build,
    replicas=True,
    check=validate,
    parameters=(Parameter("devices", help=DEVICES + "; even"),
                Parameter("microbatches", help=MICROBATCHES + "; even, half per direction"),
                Parameter("pairs", "fused", PAIRS_HELP)),
    constraints="devices even; microbatches even and >= 2 x devices",
    notes="rank r holds stage r (replica A) and PP-1-r (replica B): grad_sync='replicas'; "
          "README: bubble (PP/2-1)(F&B+B-3W), PP+1 activations, 2x parameters",
    chunks_per_device=2,
))
