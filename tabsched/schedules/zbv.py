"""ZB-V: Zero Bubble's handcrafted V schedule (SCHEDULES.md §6).

Two chunks per device in a V: chunk 0 of device ``r`` is stage ``r`` and chunk 1
is stage ``2p-1-r``, so the hand-over from stage ``p-1`` to ``p`` stays on
device ``p-1`` and the loss is computed on device 0. The backward is split into
``I`` (input gradient) and ``W`` (weight gradient).

The order is the authors' ``get_zb_v_schedule`` (sail-sg/zero-bubble-pipeline-
parallelism, ``megatron/core/pipeline_parallel/handcrafted_zb_v``), which
PyTorch's ``ScheduleZBVZeroBubble`` copies. With ``n = max(2p-1, N)`` and
counters per chunk, device ``r`` runs:

* warm-up: ``2(p-r)-1`` forwards of chunk 0; ``r`` pairs (F chunk 1, F chunk 0);
  ``p-r`` triples (F, I, W of chunk 1);
* steady, while chunk 1 has fewer forwards than chunk 0 or chunk 0 fewer than
  ``n``: F chunk 0 (while fewer than ``n``), I and W of chunk 0, F, I and W of
  chunk 1;
* cool-down: ``r`` pairs (I chunk 0, I chunk 1); ``p-r`` pairs (I chunk 0, the
  oldest pending W of chunk 0); the pending W's of chunk 1, then of chunk 0;

and every op whose microbatch is ``>= N`` is dropped (the code turns it into an
idle slot; here the layout comes from execution).
"""

from tabsched.exceptions import InvalidParameterError
from tabsched.schedules._common import DEVICES, MICROBATCHES, OrderBuilder
from tabsched.schedules._registry import Family, Parameter, register

NAME = "zbv"


def v_stages(devices, device):
    """``(chunk 0 stage, chunk 1 stage)`` of ``device`` in the V placement."""
    return device, 2 * devices - 1 - device


def device_order(devices, microbatches, device):
    """Device ``device``'s ops as ``(kind, chunk, microbatch)``, in order."""
    p, r = devices, device
    total = max(2 * p - 1, microbatches)
    order = []
    count = {("F", 0): 0, ("F", 1): 0, ("I", 0): 0, ("I", 1): 0, ("W", 0): 0, ("W", 1): 0}

    def run(kind, chunk):
        order.append((kind, chunk, count[kind, chunk]))
        count[kind, chunk] += 1

    for _ in range(2 * (p - r) - 1):
        run("F", 0)
    for _ in range(r):
        run("F", 1)
        run("F", 0)
    for _ in range(p - r):
        run("F", 1)
        run("I", 1)
        run("W", 1)
    while count["F", 1] < count["F", 0] or count["F", 0] < total:
        if count["F", 0] < total:
            run("F", 0)
        run("I", 0)
        run("W", 0)
        run("F", 1)
        run("I", 1)
        run("W", 1)
    for _ in range(r):
        run("I", 0)
        run("I", 1)
    for _ in range(p - r):
        run("I", 0)
        run("W", 0)
    while count["W", 1] < count["I", 1]:
        run("W", 1)
    while count["W", 0] < count["I", 0]:
        run("W", 0)
    return [op for op in order if op[2] < microbatches]


def check_two_chunks(family, chunks):
    """Raise unless ``chunks == 2`` (the V placement has exactly two chunks per device)."""
    if chunks != 2:
        raise InvalidParameterError(
            f"{family}: chunks must be 2, not {chunks} (the V placement puts stages r and "
            f"2p-1-r on device r)")


def build(devices, microbatches, chunks=2):
    check_two_chunks(NAME, chunks)
    p, n = devices, microbatches
    builder = OrderBuilder(p)
    for r in range(p):
        stages = v_stages(p, r)
        for kind, chunk, microbatch in device_order(p, n, r):
            builder.add(r, kind, stages[chunk], microbatch)
    return builder.table(num_stages=2 * p, num_microbatches=n, family=NAME,
                         params={"devices": p, "microbatches": n, "chunks": 2})


FAMILY = register(Family(
    name=NAME,
    summary="Zero Bubble V: two chunks per device in a V, split backward, handcrafted "
            "order (Qi et al. 2024; PyTorch ScheduleZBVZeroBubble)",
    build=build,
    parameters=(Parameter("devices", help=DEVICES),
                Parameter("microbatches", help=MICROBATCHES),
                Parameter("chunks", 2, "model chunks per device: ZB-V needs exactly 2")),
    constraints="chunks = 2 (stages r and 2p-1-r on device r); any devices >= 1, "
                "microbatches >= 1",
    notes="every device peaks at 2p chunk activations (p whole-device activations, 1F1B's "
          "maximum) once M >= 2p-1; zero bubble apart from the p-1 start/end skew when "
          "F = I = W; 2x the P2P volume of 1f1b",
    aliases=("zb-v",),
))
