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

import numpy as np

from tabsched.exceptions import InvalidParameterError
from tabsched.schedules._common import DEVICES, MICROBATCHES, table_from_columns
from tabsched.schedules._registry import Family, Parameter, register
from tabsched.table import FORWARD, INPUT_GRAD, WEIGHT_GRAD

NAME = "zbv"
_F, _I, _W = FORWARD, INPUT_GRAD, WEIGHT_GRAD


def v_stages(devices, device):
    """``(chunk 0 stage, chunk 1 stage)`` of ``device`` in the V placement."""
    return device, 2 * devices - 1 - device


def device_order(devices, microbatches, device):
    """Device ``device``'s ops as ``(kind, chunk, microbatch)``, in order."""
    names = {_F: "F", _I: "I", _W: "W"}
    return [(names[kind], chunk, microbatch) for kind, chunk, microbatch in
            zip(*(column.tolist() for column in device_columns(devices, microbatches, device)))]


def device_columns(devices, microbatches, device):
    """``device_order`` as arrays ``(kind codes, chunks, microbatches)``.

    Each phase of the order is a block of rows of a few ops (a warm-up pair, a
    steady step of six); every counter of the authors' loop advances by one per
    row, so a phase's microbatches are ranges. The steady loop runs while chunk 1
    has fewer forwards than chunk 0 or chunk 0 fewer than ``n``: chunk 0 reaches
    ``n`` first, so it runs ``n - p`` times (chunk 1 starts it with ``p``).
    """
    p, r = devices, device
    total = max(2 * p - 1, microbatches)
    warm = 2 * (p - r) - 1              # chunk 0's first forwards
    steps = total - p                   # the steady loop's rounds
    rows = []                           # blocks of (kinds, chunks, microbatch starts)

    def block(count, kinds, chunks, starts, present=None):
        shape = (count, len(kinds))
        kind_codes, chunk_ids = np.empty(shape, dtype=np.int8), np.empty(shape, dtype=np.int8)
        kind_codes[:], chunk_ids[:] = kinds, chunks
        rows.append((kind_codes, chunk_ids, np.add.outer(np.arange(count), starts),
                     np.ones(shape, dtype=bool) if present is None else present))

    block(warm, [_F], [0], [0])
    block(r, [_F, _F], [1, 0], [0, warm])
    block(p - r, [_F, _I, _W], [1, 1, 1], [r, 0, 0])
    steady = np.ones((steps, 6), dtype=bool)
    steady[:, 0] = warm + r + np.arange(steps) < total     # chunk 0's forwards stop at n
    block(steps, [_F, _I, _W, _F, _I, _W], [0, 0, 0, 1, 1, 1],
          [warm + r, 0, 0, p, p - r, p - r], steady)
    block(r, [_I, _I], [0, 1], [steps, p - r + steps])
    block(p - r, [_I, _W], [0, 0], [steps + r, steps])
    block(r, [_W], [1], [p - r + steps])
    block(r, [_W], [0], [steps + p - r])
    kinds, chunks, mbs = (np.concatenate([part[column][part[3]] for part in rows])
                          for column in range(3))
    keep = mbs < microbatches
    return kinds[keep], chunks[keep], mbs[keep]


def check_two_chunks(family, chunks):
    """Raise unless ``chunks == 2`` (the V placement has exactly two chunks per device)."""
    if chunks != 2:
        raise InvalidParameterError(
            f"{family}: chunks must be 2, not {chunks} (the V placement puts stages r and "
            f"2p-1-r on device r)")


def validate(devices, microbatches, chunks=2):
    """Raise unless ``chunks == 2``; the table's stage count, ``2 * devices``."""
    check_two_chunks(NAME, chunks)
    return 2 * devices


def build(devices, microbatches, chunks=2):
    check_two_chunks(NAME, chunks)
    p, n = devices, microbatches
    columns = ([], [], [], [], [])
    for r in range(p):
        kinds, chunks_of, mbs = device_columns(p, n, r)
        stages = np.where(chunks_of == 0, *v_stages(p, r))
        values = (np.full(len(kinds), r), np.arange(len(kinds)), kinds, stages, mbs)
        for column, value in zip(columns, values):
            column.append(value)
    return table_from_columns(columns, p, num_stages=2 * p, num_microbatches=n, family=NAME,
                              params={"devices": p, "microbatches": n, "chunks": 2})


FAMILY = register(Family(
    name=NAME,
    summary="Zero Bubble V: two chunks per device in a V, split backward, handcrafted "
            "order (Qi et al. 2024; PyTorch ScheduleZBVZeroBubble)",
    build=build,
    check=validate,
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
