"""Zero Bubble's handcrafted schedules ZB-H1 and ZB-H2 (SCHEDULES.md §5).

The backward is split into ``I`` (input gradient; the paper's ``B``) and ``W``
(weight gradient), each one op; stage ``r`` on device ``r`` as in 1F1B.
The order is Qi et al.'s ``get_hand_schedule`` (sail-sg/zero-bubble-pipeline-
parallelism, ``megatron/core/pipeline_parallel/efficiency.py``) with
``c = 1`` (H1) or ``c = 2`` (H2). On device ``r``:

* ``w = c*(p-r-1)`` warm-up forwards;
* for ``i = 0..N-1``: ``F(w+i)`` if ``w+i < N``, then ``I(i)``, then the next
  ``W`` in microbatch order if ``i >= c*r``;
* the ``W`` s still pending.

The authors' code asserts ``N >= 2p``. We accept every ``N >= 1`` and cap the
warm-up at ``N``, as Megatron does for 1F1B: the order stays deadlock-free
(warm-ups do not grow down the pipeline) and keeps each device's activation
peak at ``min(N, c*(p-1)+1)``. The published bubbles, however, are only
guaranteed for ``N >= 2p`` (see ``tabsched.formulas``).
"""

import numpy as np

from tabsched.schedules._common import DEVICES, MICROBATCHES, table_from_columns
from tabsched.schedules._registry import Family, Parameter, register
from tabsched.table import FORWARD, INPUT_GRAD, WEIGHT_GRAD

WARMUP_FACTOR = {"zb-h1": 1, "zb-h2": 2}


def device_order(devices, microbatches, device, factor):
    """Device ``device``'s ops as ``(kind, microbatch)`` pairs, in order."""
    kinds, mbs = device_columns(devices, microbatches, device, factor)
    names = {FORWARD: "F", INPUT_GRAD: "I", WEIGHT_GRAD: "W"}
    return [(names[kind], microbatch) for kind, microbatch in zip(kinds.tolist(), mbs.tolist())]


def device_columns(devices, microbatches, device, factor):
    """``device_order`` as arrays ``(kind codes, microbatches)``: step ``i`` of the
    loop is a row of three ops (F, I, W), of which the absent ones are masked out."""
    p, n, r, c = devices, microbatches, device, factor
    warmup = min(c * (p - r - 1), n)
    step = np.arange(n)
    kinds = np.empty((n, 3), dtype=np.int8)
    kinds[:] = (FORWARD, INPUT_GRAD, WEIGHT_GRAD)
    mbs = np.stack([warmup + step, step, step - c * r], axis=1)
    present = np.stack([warmup + step < n, np.ones(n, dtype=bool), step >= c * r], axis=1)
    weights = max(0, n - c * r)      # the W's the loop runs; the rest follow it
    kinds = np.concatenate([np.full(warmup, FORWARD, dtype=np.int8), kinds[present],
                            np.full(n - weights, WEIGHT_GRAD, dtype=np.int8)])
    mbs = np.concatenate([np.arange(warmup), mbs[present], np.arange(weights, n)])
    return kinds, mbs


def _builder(name):
    factor = WARMUP_FACTOR[name]

    def build(devices, microbatches):
        p, n = devices, microbatches
        columns = ([], [], [], [], [])
        for r in range(p):
            kinds, mbs = device_columns(p, n, r, factor)
            values = (np.full(len(kinds), r), np.arange(len(kinds)), kinds,
                      np.full(len(kinds), r), mbs)
            for column, value in zip(columns, values):
                column.append(value)
        return table_from_columns(columns, p, num_stages=p, num_microbatches=n, family=name,
                                  params={"devices": p, "microbatches": n})

    build.__name__ = f"build_{name.replace('-', '_')}"
    build.__doc__ = f"Generate {name.upper()} for ``devices`` x ``microbatches``."
    return build


def validate(devices, microbatches):
    """Every size is valid: the table's stage count (one stage per device)."""
    return devices


build_h1 = _builder("zb-h1")
build_h2 = _builder("zb-h2")

_PARAMETERS = (Parameter("devices", help=DEVICES), Parameter("microbatches", help=MICROBATCHES))
_CONSTRAINTS = ("any devices >= 1, microbatches >= 1 (the authors' code asserts microbatches "
                ">= 2*devices; below that the warm-up is capped at M and the published bubble "
                "is not guaranteed)")

H1 = register(Family(
    name="zb-h1",
    summary="Zero Bubble H1: 1F1B with split backward, W's deferred to fill the "
            "cool-down (Qi et al., ICLR 2024)",
    build=build_h1,
    check=validate,
    parameters=_PARAMETERS,
    constraints=_CONSTRAINTS,
    notes="every device peaks at min(M, p) activations (1F1B's maximum); bubble "
          "(p-1)(F+I-W) when W <= F and W <= I",
    aliases=("zbh1",),
))

H2 = register(Family(
    name="zb-h2",
    summary="Zero Bubble H2: 1F1B with split backward and a warm-up twice as deep "
            "(Qi et al., ICLR 2024)",
    build=build_h2,
    check=validate,
    parameters=_PARAMETERS,
    constraints=_CONSTRAINTS,
    notes="every device peaks at min(M, 2p-1) activations; its zero bubble needs the next "
          "iteration to start before this one ends (optimizer post-validation): a table "
          "whose devices all start at 0 keeps the p-1 start/end skew",
    aliases=("zbh2",),
))
