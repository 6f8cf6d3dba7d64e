"""V-Half and V-Min: V schedules with controllable memory (SCHEDULES.md §7).

Qi et al., "Pipeline Parallelism with Controllable Memory" (NeurIPS 2024,
arXiv 2405.15362) build a schedule from a *building block*: the slots of one
microbatch's four passes on every device. The reference implementation is
``zbv_greedy.py`` (sail-sg/zero-bubble-pipeline-parallelism,
``megatron/core/pipeline_parallel/zerobubble/scheduler/``); this module follows
its steps and tie-breaks, so that with unit times it reproduces the authors'
tables.

Placement and ops are ZB-V's: device ``r`` holds stage ``r`` (chunk 0) and
stage ``2p-1-r`` (chunk 1); the backward is split into ``I`` and ``W``.

1. **Building block.** Device ``i``'s slots of F(chunk 0), F(chunk 1),
   I(chunk 1), I(chunk 0) for one microbatch:

   * V-Min, ``k = 2 if p % 3 == 0 else 0``: ``i``, ``2p-1-i``, ``2p+k+i``,
     ``4p+k-1-i``;
   * V-Half, ``k = 3 if p % 2 == 0 else 0``: ``2i``, ``3p-2-i``,
     ``3p+k+2i-1``, ``6p+k-2-i``.
2. **Repeat** it every 6 slots (microbatch ``m`` adds ``6m``).
3. **Fill**: every idle slot takes a pending ``W`` (one per finished ``I``);
   the ``W`` s left over follow the device's last op.
4. **Reorder**: walk all ops in slot order (ties: device, kind, microbatch) and
   move each to the earliest free slot after its dependencies where the
   device's activation peak does not exceed the schedule's peak. The first
   pass (``W`` s as ops) moves the warm-up (everything before device 0's first
   ``I`` of chunk 0) and the cool-down (everything after the first forward of
   chunk 0 for the last microbatch); the second pass (``W`` s refilled into
   idle slots) moves the cool-down only. After each pass, **squeeze**: run
   every device's order with unit times as early as dependencies allow.
5. Fill again, this time with ``W`` s per chunk (chunk 1's first), and take
   each device's order from the slots.

Memory is counted as the reference counts it: +1 at a forward, -1 at a ``W``
(an ``I`` frees nothing), in chunk activations. The papers state the peak in
whole-device activations, two chunks: ``(p+2)//2`` for V-Half and ``(p+4)//3``
for V-Min.
"""

import itertools

import numpy as np

from tabsched._build import DEADLOCK, slot_peak, squeeze_slots
from tabsched.exceptions import InvalidParameterError, TabschedError
from tabsched.schedules._common import DEVICES, MICROBATCHES, OrderBuilder
from tabsched.schedules._registry import Family, Parameter, register
from tabsched.schedules.zbv import check_two_chunks

#: The kinds of the building block, in the reference's order, then the W kinds.
F0, F1, I1, I0, W_ANY = range(5)
W1, W0 = 4, 5
IDLE = 6

VARIANTS = ("v-half", "v-min")


def block_offsets(variant, devices):
    """Slots of (F chunk 0, F chunk 1, I chunk 1, I chunk 0) of microbatch 0, per device.

    >>> block_offsets("v-min", 4)
    [(0, 7, 8, 15), (1, 6, 9, 14), (2, 5, 10, 13), (3, 4, 11, 12)]
    """
    p = devices
    if variant == "v-min":
        k = 2 if p % 3 == 0 else 0
        return [(i, 2 * p - 1 - i, 2 * p + k + i, 4 * p + k - 1 - i) for i in range(p)]
    if variant == "v-half":
        k = 3 if p % 2 == 0 else 0
        return [(2 * i, 3 * p - 2 - i, 3 * p + k + 2 * i - 1, 6 * p + k - 2 - i)
                for i in range(p)]
    raise InvalidParameterError(f"variant must be one of {', '.join(VARIANTS)}, not {variant!r}")


def fill_weights(device_slots, split):
    """Append W slot lists to one device's four lists: each idle slot takes a pending W.

    ``split=False`` appends one list (a W per finished ``I``, either chunk);
    ``split=True`` two, chunk 1's W's (preferred when both are pending) and
    chunk 0's. W's still pending after the last op follow it, one per slot.
    """
    lists = [list(times) for times in device_slots[:4]]
    last = max(times[-1] for times in lists)
    kind_at = np.full(last + 1, -1)
    for kind, times in enumerate(lists):
        kind_at[times] = kind
    if np.count_nonzero(kind_at >= 0) != sum(len(times) for times in lists):
        raise TabschedError("internal error: two ops of a V schedule share a slot")
    weights = [[], []]
    pending = [0, 0]
    for slot in range(last + 1):
        kind = kind_at[slot]
        if kind == I1 or kind == I0:
            pending[kind - I1 if split else 0] += 1
        elif kind < 0:
            for chunk_list in (0, 1):
                if pending[chunk_list]:
                    weights[chunk_list].append(slot)
                    pending[chunk_list] -= 1
                    break
    slot = last
    for chunk_list in (0, 1):
        for _ in range(pending[chunk_list]):
            slot += 1
            weights[chunk_list].append(slot)
    return lists + (weights if split else [weights[0]])


def _kind_grid(device_slots):
    """Each slot's kind (``IDLE`` where none) of one device's slot lists, as int8."""
    last = max(times[-1] for times in device_slots if times)
    kind_at = np.full(last + 1, IDLE, dtype=np.int8)
    for kind, times in enumerate(device_slots):
        kind_at[times] = kind
    return kind_at


def peak_memory(device_slots):
    """Peak chunk activations of one device, counted as the reference counts them.

    +1 at each forward, -1 at each W. With only the four block lists, W's are
    implicit: each idle slot releases one if an ``I`` is waiting for its W (a
    queue, solved by Lindley's formula: ``tabsched._build.slot_peak``, compiled,
    since the reorder asks for it at every slot it tries).

    >>> peak_memory([[0, 6], [1, 7], [2, 8], [3, 9]])
    2
    """
    return slot_peak(_kind_grid(device_slots), len(device_slots) > 4)


def _dependencies(slots, device, kind, microbatch, num_devices):
    """Latest slot among the ops (device, kind, microbatch) must follow (-1 if none)."""
    latest = -1
    if kind in (F0, I1) and device > 0:
        latest = max(latest, slots[device - 1][kind][microbatch])
    if kind in (F1, I0) and device + 1 < num_devices:
        latest = max(latest, slots[device + 1][kind][microbatch])
    if F0 < kind < W_ANY:
        latest = max(latest, slots[device][kind - 1][microbatch])
    if kind == W_ANY:
        latest = max(latest, sorted(slots[device][I1] + slots[device][I0])[microbatch])
    if microbatch > 0:
        latest = max(latest, slots[device][kind][microbatch - 1])
    return latest


def _in_slot_order(slots):
    return sorted((time, device, kind, microbatch)
                  for device, lists in enumerate(slots)
                  for kind, times in enumerate(lists)
                  for microbatch, time in enumerate(times))


def _slot_order(slots):
    """Every op of one V schedule's slot lists as columns in slot order (by time, device,
    kind, microbatch: what ``_in_slot_order`` lists), with where each list starts in
    the lists laid one after the other: ``(time, device, kind, microbatch, order,
    list_first, num_kinds)``, ``order`` the stored positions in slot order."""
    num_kinds = max((len(lists) for lists in slots), default=0)
    sizes = np.array([[len(lists[k]) if k < len(lists) else 0 for k in range(num_kinds)]
                      for lists in slots], dtype=np.int64).reshape(-1)
    total = int(sizes.sum())
    list_first = np.zeros(len(sizes) + 1, dtype=np.int32)
    np.cumsum(sizes, out=list_first[1:])
    times = np.fromiter(itertools.chain.from_iterable(
        times for lists in slots for times in lists), dtype=np.int64, count=total)
    ids = np.repeat(np.arange(len(sizes)), sizes)
    device, kind = ids // max(num_kinds, 1), ids % max(num_kinds, 1)
    microbatch = np.arange(total) - list_first[ids]
    order = np.lexsort((microbatch, kind, device, times))
    return (times[order], device[order], kind[order], microbatch[order], order, list_first,
            num_kinds)


def squeeze(slots):
    """Run every device's ops in slot order, unit times, as early as dependencies allow.

    The loop over the slot order is compiled (``tabsched._build.squeeze_slots``, its
    twin ``tabsched._reference.squeeze_slots``): at 64 devices and 256 microbatches a
    V schedule's two reorders squeeze about 160,000 ops each.
    """
    _, device, kind, microbatch, _, list_first, num_kinds = _slot_order(slots)
    total = len(device)
    if total == 0:
        return [[[] for _ in lists] for lists in slots]
    start = np.empty(total, dtype=np.int32)
    missing = np.empty(1, dtype=np.int32)
    status = squeeze_slots(device.astype(np.int32), kind.astype(np.int32),
                           microbatch.astype(np.int32), list_first, num_kinds, start,
                           missing)
    if status == -1 - DEADLOCK and missing[0] >= 0:
        at = int(missing[0])
        lists = int(np.searchsorted(list_first, at, side="right")) - 1
        need = (lists // num_kinds, lists % num_kinds, at - int(list_first[lists]))
        raise TabschedError(f"internal error: V schedule op {need} runs after an op that "
                            f"needs it")
    if status != total:
        raise TabschedError(f"internal error: V schedule squeeze stopped (status {status})")
    starts = start.tolist()
    first = list_first.tolist()
    return [[starts[first[d * num_kinds + k]:first[d * num_kinds + k + 1]]
             for k in range(len(lists))] for d, lists in enumerate(slots)]


def reorder(slots, with_weights):
    """One greedy pass of the reference's reorder step, then a squeeze.

    ``with_weights``: W's are ops that can move (first pass) and the warm-up
    moves too; otherwise W's fill idle slots and only the cool-down moves.
    Returns five slot lists per device (W's not split by chunk).

    In slot order the ops are a warm-up (up to device 0's first ``I0``), a steady
    state (up to the first forward of the last microbatch on chunk 0) and a
    cool-down: the ops of the steady state (and of the warm-up when it does not
    move) only hold their slots, so they are marked held at once, and the loop
    visits the ops that move, a fifth of them at 64 devices.
    """
    slots = [fill_weights(lists, split=False) if with_weights else [list(t) for t in lists]
             for lists in slots]
    num_devices = len(slots)
    microbatches = len(slots[0][F0])
    # each device's slot kinds, kept as ops move (a move only goes earlier, inside the
    # grid; idle slots after the last op hold nothing, so the peak is the lists' own)
    grids = [_kind_grid(lists) for lists in slots]
    explicit = len(slots[0]) > 4
    budget = max(slot_peak(grid, explicit) for grid in grids)
    occupied = [set() for _ in slots]
    time, device, kind, microbatch, _, _, _ = _slot_order(slots)
    total = len(time)
    # the steady state: from device 0's first I0 to the first F0 of the last microbatch
    # after it (both included); warm-up before, cool-down after
    steady = np.flatnonzero((kind == I0) & (device == 0))
    steady = int(steady[0]) if len(steady) else total
    last = np.flatnonzero((kind[steady:] == F0) & (microbatch[steady:] == microbatches - 1))
    cooldown = steady + int(last[0]) + 1 if len(last) else total
    held = np.zeros(total, dtype=bool)
    held[steady:cooldown] = True
    if not with_weights:
        held[:steady] = True
    # the held ops in slot order before the first op that moves, then after the
    # warm-up's moves (the steady state), each device's slots marked at once
    moving = np.flatnonzero(~held)
    warmup_moves = moving[moving < steady]
    cooldown_moves = moving[moving >= cooldown]
    columns = [column.tolist() for column in (time, device, kind, microbatch)]

    def hold(first, stop):
        part = slice(first, stop)
        for d, times in _by_device(device[part], time[part], num_devices):
            occupied[d].update(times)

    def move(i):
        time_, device_, kind_, microbatch_ = (column[i] for column in columns)
        earliest = _dependencies(slots, device_, kind_, microbatch_, num_devices) + 1
        if earliest > time_:
            raise TabschedError(f"internal error: V schedule op "
                                f"{(device_, kind_, microbatch_)} at slot {time_} depends on "
                                f"a later op")
        lists, grid = slots[device_], grids[device_]
        for slot in range(earliest, time_):
            if slot not in occupied[device_]:
                grid[lists[kind_][microbatch_]] = IDLE
                grid[slot] = kind_
                lists[kind_][microbatch_] = slot
                if slot_peak(grid, explicit) <= budget:
                    break
        else:
            grid[lists[kind_][microbatch_]] = IDLE
            grid[time_] = kind_
            lists[kind_][microbatch_] = time_
        occupied[device_].add(lists[kind_][microbatch_])

    if not with_weights:
        hold(0, steady)
    for i in warmup_moves.tolist():
        move(i)
    hold(steady, cooldown)
    for i in cooldown_moves.tolist():
        move(i)
    if not with_weights:
        slots = [fill_weights(lists, split=False) for lists in slots]
    return squeeze(slots)


def _by_device(device, values, num_devices):
    """``(d, list of values on device d)`` for each device with some."""
    order = np.argsort(device, kind="stable")
    bounds = np.searchsorted(device[order], np.arange(num_devices + 1))
    values = values[order].tolist()
    return [(d, values[bounds[d]:bounds[d + 1]]) for d in range(num_devices)
            if bounds[d + 1] > bounds[d]]


def v_schedule_slots(variant, devices, microbatches):
    """Slot lists per device: F0, F1, I1, I0, W chunk 1, W chunk 0 (one entry per microbatch)."""
    blocks = block_offsets(variant, devices)
    slots = [[list(range(offset, offset + 6 * microbatches, 6)) for offset in offsets]
             for offsets in blocks]
    first = [lists[:4] for lists in reorder(slots, with_weights=True)]
    second = [lists[:4] for lists in reorder(first, with_weights=False)]
    return [fill_weights(lists, split=True) for lists in second]


_OP_OF_KIND = (("F", 0), ("F", 1), ("I", 1), ("I", 0), ("W", 1), ("W", 0))


def _validator(variant):
    def validate(devices, microbatches, chunks=2):
        """Raise unless ``chunks == 2``; the table's stage count, ``2 * devices``."""
        check_two_chunks(variant, chunks)
        return 2 * devices
    return validate


def _builder(variant):
    def build(devices, microbatches, chunks=2):
        check_two_chunks(variant, chunks)
        p, n = devices, microbatches
        builder = OrderBuilder(p)
        for device, lists in enumerate(v_schedule_slots(variant, p, n)):
            stages = (device, 2 * p - 1 - device)
            ops = sorted((time, kind, microbatch) for kind, times in enumerate(lists)
                         for microbatch, time in enumerate(times))
            for _, kind, microbatch in ops:
                op_kind, chunk = _OP_OF_KIND[kind]
                builder.add(device, op_kind, stages[chunk], microbatch)
        return builder.table(num_stages=2 * p, num_microbatches=n, family=variant,
                             params={"devices": p, "microbatches": n, "chunks": 2})

    build.__name__ = f"build_{variant.replace('-', '_')}"
    build.__doc__ = f"Generate {variant} for ``devices`` x ``microbatches`` (chunks must be 2)."
    return build


_PARAMETERS = (Parameter("devices", help=DEVICES),
               Parameter("microbatches", help=MICROBATCHES),
               Parameter("chunks", 2, "model chunks per device: V schedules need exactly 2"))

V_HALF = register(Family(
    name="v-half",
    summary="V-Half: V-shape building block with half of 1F1B's activation memory "
            "(Qi et al., NeurIPS 2024)",
    build=_builder("v-half"),
    check=_validator("v-half"),
    parameters=_PARAMETERS,
    constraints="chunks = 2 (stages r and 2p-1-r on device r); any devices >= 1, "
                "microbatches >= 1",
    notes="peak (p+2)//2 device activations = 2*((p+2)//2) chunk activations, about half of "
          "1f1b; bubble about half of 1f1b's when F = I = W; greedy reorder ported from the "
          "authors' zbv_greedy.py",
    aliases=("vhalf",),
))

V_MIN = register(Family(
    name="v-min",
    summary="V-Min: V-shape building block with a third of 1F1B's activation memory "
            "(Qi et al., NeurIPS 2024)",
    build=_builder("v-min"),
    check=_validator("v-min"),
    parameters=_PARAMETERS,
    constraints="chunks = 2 (stages r and 2p-1-r on device r); any devices >= 1, "
                "microbatches >= 1",
    notes="peak (p+4)//3 device activations = 2*((p+4)//3) chunk activations, about a third "
          "of 1f1b; bubble about 2/3 of 1f1b's when F = I = W, worse when they differ; greedy "
          "reorder ported from the authors' zbv_greedy.py",
    aliases=("vmin",),
))
