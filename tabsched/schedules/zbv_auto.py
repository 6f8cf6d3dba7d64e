"""zbv-auto: Zero Bubble's cost-driven V schedule, with its memory setups.

ZB-V (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, Section 6)
puts two chunks on each device in a V: device ``d`` holds stage ``d`` (chunk
0) and stage ``2p-1-d`` (chunk 1), so a microbatch's forward and backward both
start and end on device 0. The paper searches the order for the measured
times "with a similar heuristic algorithm as in Section 3.1" (its Appendix D;
the authors' ``PipelineGraph.try_v_schedule`` in sail-sg/zero-bubble-pipeline-
parallelism, ``megatron/core/pipeline_parallel/zerobubble/scheduler/zbv.py``,
which their runtime uses for the ``zb`` memory setup). The steps, per device:

1. **Warm-up.** Every device runs the first forward of chunk 0; then, from the
   last device back, a device adds chunk-0 forwards (and so does every device
   before it) while its memory keeps room for ``2 + 2d`` more and while it
   would otherwise wait for its first chunk-1 forward's input; then it runs
   that chunk-1 forward. Later devices then catch up with earlier ones,
   alternating chunks, until each has as many forwards as the previous device
   and more chunk-1 forwards.
2. **Rounds** (``2m`` of them): each device runs one input-grad ``I`` --
   chunk 1's (the first of a microbatch's backward) unless chunk 0's is due and
   its gradient has arrived -- then one forward, chunk 1's when its input has
   arrived, else chunk 0's. Before each, ``W`` s (oldest first) fill the wait
   for the input: every one that ends before it arrives, and one more that
   overruns when the wait would make this device's cumulative idle time the
   largest (two settings, ``fill_backward`` and ``fill_forward``, decide
   whether this also happens before chunk-0 input-grads and before forwards).
   ``W`` s also run when memory is full.
3. The ``W`` s left over close each order. A run is repeated with the idle
   time each device reached as its allowance, while that lowers the largest.

One run is compiled (``tabsched._build.v_heuristic_run``: a plan builds zbv-auto
for each cost model it simulates, and the run was two thirds of that in Python);
its plain-Python twin, ``tabsched._reference.VPlanner``, is the test oracle, and
the property tests check both give the same orders and idle times to the bit.

The generator runs the four settings, simulates each order with tabsched
under the same costs, adds the three fixed V orders (ZB-V's handcrafted one,
V-Half and V-Min) as candidates, and keeps the best by ``objective`` (as in
:mod:`tabsched.schedules.zb_auto`) among those within the memory limit. The
memory setups set the limit:

* ``zb`` (default): ``2p`` chunk activations, 1F1B's peak (the authors'
  default for this scheduler);
* ``half`` / ``min``: V-Half's / V-Min's peak, ``2*((p+2)//2)`` /
  ``2*((p+4)//3)`` chunk activations (Qi et al., Pipeline Parallelism with
  Controllable Memory, NeurIPS 2024). The authors' runtime runs the fixed
  building-block order for these setups ("fixed schedule for now"); here the
  cost-driven orders compete with it, but at these limits they rarely complete
  (the heuristic reserves ``2 + 2d`` activations in its warm-up), so the
  result is usually the fixed order.

``memory_limit`` (chunk activations) or ``memory_budget`` (a device's whole
memory) override the setup's limit; the activation peak never exceeds it.
Orders a setting cannot complete within the limit (the authors' code asserts
there) are dropped; if no candidate fits, the generator says so.
"""

import numpy as np

from tabsched._build import INFEASIBLE, NO_CONVERGENCE, OUT_OF_MEMORY, v_heuristic_run
from tabsched.costs import CostModel
from tabsched.exceptions import InvalidParameterError, TabschedError
from tabsched.layout import from_order_arrays
from tabsched.lower import lower
from tabsched.schedules._common import DEVICES, MICROBATCHES
from tabsched.schedules._registry import Family, Parameter, register
from tabsched.schedules.zb_auto import (OBJECTIVES, _TOLERANCE, _span, budget_room,
                                        limit_count, probed_durations)
from tabsched.schedules.zbv import check_two_chunks
from tabsched.table import FORWARD, INPUT_GRAD, WEIGHT_GRAD, ScheduleTable

__all__ = ["SETUPS", "VProfile", "measure_v", "v_heuristic_orders", "build"]

NAME = "zbv-auto"
SETUPS = ("zb", "half", "min")
#: Most repetitions of a run with the previous run's idle times as allowance.
_MAX_REFINEMENTS = 32


class _Infeasible(Exception):
    """A setting cannot complete its order within the memory limit."""


def setup_limit(setup, devices):
    """Chunk activations a device may hold under ``setup``."""
    p = devices
    return {"zb": 2 * p, "half": 2 * ((p + 2) // 2), "min": 2 * ((p + 4) // 3)}[setup]


class VProfile:
    """Per model stage (``2p`` of them): durations, activations, input delays.

    ``delay[kind][s]``: time of the transfer that brings the input of ``kind``
    (``"F"`` or ``"I"``) on stage ``s`` (0 when producer and consumer share a
    device). ``room[d]``: activation memory device ``d`` may hold.
    """

    def __init__(self, durations, delay, activation, release, room):
        self.duration = durations
        self.delay = delay
        self.activation = activation
        self.release = release
        self.room = room
        self.num_devices = len(room)


def probe_table(devices, stage_layers=None):
    """One microbatch through the V: F, I, W of every stage, in dependency order."""
    p = devices
    rows = {d: [] for d in range(p)}
    for stage in range(2 * p):
        rows[min(stage, 2 * p - 1 - stage)].append((FORWARD, stage))
    for stage in range(2 * p - 1, -1, -1):
        device = min(stage, 2 * p - 1 - stage)
        rows[device].extend([(INPUT_GRAD, stage), (WEIGHT_GRAD, stage)])
    device, position, kind, stage = [], [], [], []
    for d, ops in rows.items():
        for k, (op_kind, op_stage) in enumerate(ops):
            device.append(d)
            position.append(k)
            kind.append(op_kind)
            stage.append(op_stage)
    return from_order_arrays(device, position, kind, stage, np.zeros(len(kind), dtype=np.int32),
                             num_devices=p, num_stages=2 * p, num_microbatches=1,
                             stage_layers=stage_layers)


def measure_v(costs, devices, stage_layers=None, limit=None, memory_budget=None):
    """The :class:`VProfile` of ``costs`` on the V placement of ``devices`` devices.

    ``limit``: chunk activations per device (each device's room is ``limit/2``
    times the activations of its two stages); ``memory_budget``: a device's
    whole memory in the cost model's unit. The tighter holds.
    """
    p, S = devices, 2 * devices
    probe = probe_table(devices, stage_layers)
    durations = probed_durations(costs, probe, NAME)
    per_kind = {}
    for code, letter in ((FORWARD, "F"), (INPUT_GRAD, "I"), (WEIGHT_GRAD, "W")):
        values = np.zeros(S)
        mask = probe.kind == code
        values[probe.stage[mask]] = durations[mask]
        per_kind[letter] = values
    transfers = lower(probe).transfers
    times, _ = costs.transfer_costs(probe, transfers)
    delay = {"F": np.zeros(S), "I": np.zeros(S)}
    consumer_kind = probe.kind[transfers.consumer]
    consumer_stage = probe.stage[transfers.consumer]
    for k in range(len(transfers)):
        letter = "F" if consumer_kind[k] == FORWARD else "I"
        delay[letter][consumer_stage[k]] = float(times[k])
    activation = np.zeros(S)
    forwards = probe.kind == FORWARD
    activation[probe.stage[forwards]] = np.asarray(costs.activation_sizes(probe),
                                                   dtype=np.float64)[forwards]
    pair = np.array([activation[d] + activation[S - 1 - d] for d in range(p)])
    room = np.full(p, np.inf) if limit is None else limit / 2 * pair
    if memory_budget is not None:
        need = np.maximum(activation[:p], activation[::-1][:p])
        room = np.minimum(room, budget_room(NAME, costs, probe, memory_budget, need,
                                            "its stages"))
    return VProfile(per_kind, delay, activation, float(costs.input_grad_release), room)


def _profile_arrays(profile):
    """The profile as the compiled heuristic reads it: durations (F, I, W) and delays
    (F, I) per stage, activations, the release and each device's limit (its room with
    the tolerance)."""
    duration = np.ascontiguousarray([profile.duration[kind] for kind in "FIW"],
                                    dtype=np.float64)
    delay = np.ascontiguousarray([profile.delay[kind] for kind in "FI"], dtype=np.float64)
    activation = np.ascontiguousarray(profile.activation, dtype=np.float64)
    limit = np.array([room + _TOLERANCE * max(1.0, abs(room)) for room in profile.room],
                     dtype=np.float64)
    return duration, delay, activation, float(profile.release), limit


def v_heuristic_orders(profile, microbatches, fill_forward, fill_backward, *, run=None):
    """The orders of one setting, or None if it fails: ``(kind, stage, microbatch,
    length)``, device ``d``'s order from ``d * 6 * microbatches`` (kinds 0 F, 1 I, 2 W;
    ``length[d]`` of them), as ``tabsched._build.v_heuristic_run`` writes them.

    The run is repeated with the previous run's idle times as allowances while
    that lowers the largest (at most ``_MAX_REFINEMENTS`` times). ``run``: the one
    run (default the compiled ``v_heuristic_run``; the tests pass its plain-Python
    twin, ``tabsched._reference.v_heuristic_run``).
    """
    run = v_heuristic_run if run is None else run
    duration, delay, activation, release, limit = _profile_arrays(profile)
    p, per_device = profile.num_devices, 6 * microbatches
    best, best_largest, allowance = None, None, None
    for _ in range(_MAX_REFINEMENTS):
        idle = np.zeros(p)
        orders = (np.zeros(p * per_device, dtype=np.int8),
                  np.zeros(p * per_device, dtype=np.int32),
                  np.zeros(p * per_device, dtype=np.int32), np.zeros(p, dtype=np.int32))
        status = run(duration, delay, activation, release, limit, allowance, microbatches,
                     fill_forward, fill_backward, idle, *orders)
        if status == INFEASIBLE:
            break
        if status == NO_CONVERGENCE:
            raise TabschedError(f"internal error: {NAME} warm-up does not converge")
        if status == OUT_OF_MEMORY:
            raise TabschedError(f"{NAME}: out of memory for the heuristic's scratch at "
                                f"devices={p}, microbatches={microbatches}")
        if status != 0:
            raise TabschedError(f"internal error: {NAME} heuristic status {status}")
        largest = float(idle.max())
        if best is not None and largest >= best_largest:
            break
        best, best_largest, allowance = orders, largest, idle
    return best


#: The table's kind codes of the heuristic's kinds 0 (F), 1 (I), 2 (W).
_V_KIND_CODES = np.array([FORWARD, INPUT_GRAD, WEIGHT_GRAD], dtype=np.int64)


def _table(orders, devices, microbatches, stage_layers, params):
    """The table of the heuristic's orders (``v_heuristic_orders``), as ``OrderBuilder``
    lays it out (its columns built at once: a candidate holds hundreds of thousands of
    operations)."""
    kind, stage, microbatch, length = orders
    per_device = 6 * microbatches
    length = length.astype(np.int64)
    device = np.repeat(np.arange(devices, dtype=np.int64), length)
    position = np.arange(len(device), dtype=np.int64) - np.repeat(
        np.cumsum(length) - length, length)
    taken = device * per_device + position
    return from_order_arrays(device, position, _V_KIND_CODES[kind[taken]],
                             stage[taken].astype(np.int64),
                             microbatch[taken].astype(np.int64),
                             num_devices=devices, num_stages=2 * devices,
                             num_microbatches=microbatches, stage_layers=stage_layers,
                             family=NAME, params=params)


FIXED_ORDERS = ("zbv", "v-half", "v-min")


def _fixed_table(name, devices, microbatches):
    """A fixed V family's table: it depends on the sizes alone, so it is remembered
    (V-Half's and V-Min's greedy reorder takes tens of milliseconds, and a plan builds
    zbv-auto for many cost models); a candidate is it with zbv-auto's metadata."""
    from tabsched.schedules._registry import fixed_table
    return fixed_table(name, devices=devices, microbatches=microbatches)


def build(devices, microbatches, costs, chunks=2, setup="zb", memory_limit=None,
          memory_budget=None, objective="makespan", stage_layers=None):
    """The zbv-auto table for ``costs``: the best order of the V heuristic, simulated.

    Parameters
    ----------
    devices, microbatches : int
    costs : CostModel
    chunks : int
        Must be 2 (the V placement).
    setup : {"zb", "half", "min"}
        The memory setup: its limit (module docstring).
    memory_limit : float, optional
        Chunk activations a device may hold; overrides the setup's.
    memory_budget : float or str, optional
        A device's whole memory in the cost model's unit.
    objective : {"makespan", "span"}

    >>> from tabsched import UnitCosts, evaluate, generate
    >>> table = build(4, 8, UnitCosts())
    >>> table.params["memory_limit"], evaluate(table).makespan <= evaluate(
    ...     generate("zbv", devices=4, microbatches=8)).makespan
    (8, True)
    """
    check_two_chunks(NAME, chunks)
    if not isinstance(costs, CostModel):
        raise InvalidParameterError(f"{NAME}: costs must be a cost model (UnitCosts, "
                                    f"StageCosts or ModelCosts), not {type(costs).__name__}")
    if setup not in SETUPS:
        raise InvalidParameterError(f"{NAME}: setup must be one of {', '.join(SETUPS)}, "
                                    f"not {setup!r}")
    if objective not in OBJECTIVES:
        raise InvalidParameterError(f"{NAME}: objective must be one of "
                                    f"{', '.join(OBJECTIVES)}, not {objective!r}")
    limit = setup_limit(setup, devices)
    if memory_limit is not None:
        limit = limit_count(NAME, memory_limit, "chunk")
    from tabsched.evaluate import evaluate
    profile = measure_v(costs, devices, stage_layers, limit, memory_budget)
    params = {"devices": devices, "microbatches": microbatches, "chunks": 2, "setup": setup,
              "memory_limit": int(limit) if limit == int(limit) else round(limit, 6)}
    if memory_budget is not None:
        params["memory_budget"] = memory_budget
    if objective != "makespan":
        params["objective"] = objective
    candidates, seen = [], set()
    for fill_backward in (True, False):
        for fill_forward in (True, False):
            orders = v_heuristic_orders(profile, microbatches, fill_forward, fill_backward)
            # settings often give the same order: simulated once, under the first's name
            # (a later one with the same score would not replace it)
            key = None if orders is None else b"".join(array.tobytes() for array in orders)
            if orders is not None and key not in seen:
                seen.add(key)
                described = ",".join(name for name, on in (("fill-I", fill_backward),
                                                           ("fill-F", fill_forward)) if on)
                candidates.append((described or "plain", orders))
    candidates.extend((name, _fixed_table(name, devices, microbatches))
                      for name in FIXED_ORDERS)
    best = None
    for described, orders in candidates:
        if isinstance(orders, ScheduleTable):     # a fixed order, laid out already
            table = orders.replace(stage_layers=stage_layers, family=NAME,
                                   params={**params, "heuristic": described})
        else:
            table = _table(orders, devices, microbatches, stage_layers,
                           {**params, "heuristic": described})
        result = evaluate(table, costs, formula=False)
        # the rooms count activations (a limit in activations; a budget less the persistent
        # memory and the largest working memory): compare the activations held
        held = [max(0.0, float(values.max())) if len(values) else 0.0
                for _, values in result.memory_timeline(working=False)]
        if any(peak > room * (1 + _TOLERANCE) for peak, room in zip(held, profile.room)):
            continue
        score = (result.makespan, _span(result))
        if objective == "span":
            score = score[::-1]
        if best is None or score < best[0]:
            best = (score, table)
    if best is None:
        p = devices
        raise InvalidParameterError(
            f"{NAME}: no order fits the memory limit of {params['memory_limit']} chunk "
            f"activations at devices={p}, microbatches={microbatches} (the heuristic and "
            f"ZB-V need about {2 * p}, V-Half {setup_limit('half', p)}, V-Min "
            f"{setup_limit('min', p)})")
    return best[1]


FAMILY = register(Family(
    name=NAME,
    summary="Zero Bubble's cost-driven V schedule: two chunks per device in a V, the order "
            "searched for the given costs within a memory setup (Qi et al., ICLR 2024, "
            "Sec. 6)",
    build=build,
    parameters=(Parameter("devices", help=DEVICES),
                Parameter("microbatches", help=MICROBATCHES),
                Parameter("costs", help="the cost model the order is built for (UnitCosts, "
                                        "StageCosts or ModelCosts)"),
                Parameter("chunks", 2, "model chunks per device: the V needs exactly 2"),
                Parameter("setup", "zb",
                          help="memory setup: zb (2p chunk activations, 1F1B's peak), half "
                               "(V-Half's peak) or min (V-Min's peak)"),
                Parameter("memory_limit", optional=True,
                          help="chunk activations a device may hold; overrides the setup's"),
                Parameter("memory_budget", optional=True,
                          help="a device's whole memory in the cost model's unit (e.g. 80GB "
                               "from --memory-budget): persistent memory plus activations"),
                Parameter("objective", "makespan",
                          help="what the simulated orders are ranked by: makespan or span "
                               "(first to last op per device, the paper's cost)")),
    constraints="chunks = 2 (stages d and 2p-1-d on device d); any devices >= 1, "
                "microbatches >= 1; positive F, I, W times",
    notes="built from costs. Four heuristic orders and the fixed V orders (ZB-V, V-Half, "
          "V-Min) are simulated and the fastest within the limit kept; the activation peak "
          "never exceeds the setup's limit (2p, 2*((p+2)//2) or 2*((p+4)//3) chunk "
          "activations). At the half and min limits the heuristic rarely completes, so the "
          "result is usually V-Half's or V-Min's order, as in the authors' runtime",
    aliases=("zbvauto",),
    cost_driven=True,
))
