"""Hanayo: wave-like pipeline, W "V"s of stages over P devices (Liu et al., SC'23).

Liu, Cheng, Zhou, You, "Hanayo: Harnessing Wave-like Pipeline Parallelism for
Enhanced Large Model Training Efficiency", SC'23 (arXiv 2308.15762). The
authors' code is not public; the order below is the third-party
reimplementation ``topal-team/elf`` (``generate_hanayo_schedule``), which
reproduces the paper's Figs. 3(d), 3(e), 6(a), 6(b) op for op. SCHEDULES.md §11.

Placement: S = 2PW stages snake down the devices and back up, W times, so
device r holds stages r, 2P-1-r, 2P+r, 4P-1-r, ... (chunk c = 0..2W-1 in stage
order; even chunks are down legs, odd chunks up legs). Every turn stays on one
device. No weight replication. W = 1 is the plain V of ZB-V and DualPipeV.

Order of device r, with two queues -- pending down-forwards (chunk 0 for
microbatches 0..M-1, then chunk 2, ...) and pending up-backwards (chunk 2W-1
for 0..M-1, then chunk 2W-3, ...):

1. warm-up: the first min(P-r, M) pending down-forwards;
2. for w = 0..W-1, for m = 0..M-1: F(chunk 2w+1, m), then the next pending
   down-forward if any remain, else the next pending up-backward;
3. for w = 0..W-1, for m = 0..M-1: B(chunk 2W-2-2w, m), then the next
   pending up-backward if any remain.

The paper uses M = P only (every figure, Eq. 1 and its memory table). The
order is valid for any M (tables validate and never deadlock), but beyond
M = P the last device runs every forward before its first backward, so it
holds all 2W*M chunk activations: memory grows with M, like GPipe.
"""

from tabsched.schedules._common import DEVICES, MICROBATCHES, OrderBuilder
from tabsched.schedules._registry import Family, Parameter, register


def stage_of(P, r, chunk):
    """Stage of device r's chunk ``chunk`` in the snake placement."""
    return chunk * P + r if chunk % 2 == 0 else (chunk + 1) * P - 1 - r


def validate(devices, microbatches, waves=1):
    """Every size is valid: the table's stage count, ``2 * devices * waves``."""
    return 2 * devices * waves


def build(devices, microbatches, waves=1):
    P, M, W = devices, microbatches, waves
    builder = OrderBuilder(P)
    for r in range(P):
        down = [(2 * (k // M), k % M) for k in range(W * M)]
        up = [(2 * W - 1 - 2 * (k // M), k % M) for k in range(W * M)]
        next_down = next_up = 0

        def add(kind, chunk, microbatch):
            builder.add(r, kind, stage_of(P, r, chunk), microbatch)

        for _ in range(min(P - r, M)):                             # 1. warm-up
            add("F", *down[next_down])
            next_down += 1
        for w in range(W):                                         # 2. forward phase
            for m in range(M):
                add("F", 2 * w + 1, m)
                if next_down < len(down):
                    add("F", *down[next_down])
                    next_down += 1
                else:
                    add("B", *up[next_up])
                    next_up += 1
        for w in range(W):                                         # 3. backward phase
            for m in range(M):
                add("B", 2 * W - 2 - 2 * w, m)
                if next_up < len(up):
                    add("B", *up[next_up])
                    next_up += 1
    return builder.table(num_stages=2 * P * W, num_microbatches=M, family="hanayo",
                         params={"devices": P, "microbatches": M, "waves": W})


FAMILY = register(Family(
    name="hanayo",
    summary="wave-like pipeline: W V-shaped waves of 2P stages each (Liu et al., SC'23)",
    build=build,
    check=validate,
    parameters=(Parameter("devices", help=DEVICES),
                Parameter("microbatches", help=MICROBATCHES),
                Parameter("waves", 1, "waves W: the model is cut into 2 x devices x W stages")),
    constraints="any devices, microbatches and waves >= 1; 2 x devices x waves stages must "
                "fit the model's layers when a layer count is given",
    notes="the paper (Eq. 1, Fig. 2 memory) covers M = P only; for M > P the last device "
          "holds all 2W x M chunk activations (memory grows with M, GPipe-like); Eq. 1 "
          "and the table disagree even without communication",
))
