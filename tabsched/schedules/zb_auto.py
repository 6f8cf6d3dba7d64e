"""zb-auto: Zero Bubble's automatic scheduler, a family built from the costs.

Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024), Section 3.1, build
the order of a split-backward pipeline (stage ``r`` on device ``r``, as in
1F1B and ZB-H1) from the measured times of ``F``, ``I`` (the paper's ``B``)
and ``W``, the transfer time and a memory limit per device. The heuristic:

1. **Warm-up.** Every stage runs the first microbatch's forward; then, from
   the last stage back, each stage adds forwards while its memory allows and
   while it would otherwise wait for its first input gradient. A binary
   setting decides whether the last of them may overrun that gradient's
   arrival (``delay_first_backward``) or must leave the gap idle. Stage ``r``
   keeps at least one forward more than stage ``r+1`` until forwards run out.
2. **Steady state.** For each further microbatch: one ``F`` on every stage,
   then one ``I`` from the last stage back. Before each, ``W`` s fill the wait
   for the dependency: every ``W`` that fits whole, and one more that overruns
   if the remaining gap would make this stage's cumulative idle time the
   largest of all stages (with ``greedy_weights``: also when it would not).
   ``W`` s also run when the next ``F`` would exceed the memory limit. Stage 0,
   once out of forwards, runs its pending ``W`` s before each ``I`` (nobody
   waits for its input gradient).
3. **Skipping.** With ``skip_forward``, a stage two or more forwards ahead of
   the next one skips its ``F`` when it would not be idle for it.
4. The ``W`` s left over close every stage's order.

The paper grid-searches the binary settings; the generator builds all eight
orders, simulates each with tabsched under the same costs (transfers,
contention and all) and keeps the best by ``objective``:

* ``"makespan"`` (default): the iteration time when every device starts
  together, tabsched's own measure (ties: the smaller span);
* ``"span"``: the longest time from a device's first operation to its last,
  the paper's *cost* (Section 5.3), which is the iteration time when
  iterations overlap (the paper's optimizer post-validation, Section 4)
  (ties: the smaller makespan).

Ties left go to the first setting in the grid's order. The two measures can
pick different orders: a parallelogram-shaped order (ZB-2p) has the smallest
span, but every device starting at 0 gives it the same makespan as a looser
one. The authors then polish the order with an integer program (their
Appendix G); that step is not done here.

The times come from the cost model itself, measured on a one-microbatch probe
table with the final layer split, so unit, profiled (``StageCosts``) and
model-based (``ModelCosts``) costs are treated alike: per-stage ``F``, ``I``,
``W``, the activation each forward holds (``I`` frees ``input_grad_release``
of it, ``W`` the rest) and the time of each transfer between neighbouring
stages. Memory is counted as tabsched counts it, so the table's simulated
activation peak never exceeds the limit.

The algorithm follows the description in the paper and the authors' heuristic
(``manual_order`` in sail-sg/zero-bubble-pipeline-parallelism,
``megatron/core/pipeline_parallel/zerobubble/scheduler/zb.py``); the code is
tabsched's own. Differences: per-link transfer times and per-stage memory
limits instead of one number each, and a stage never runs a forward whose
input the previous stage has not produced (the authors' warm-up could ask for
one when stages have different memory limits).

One setting's run is compiled (``tabsched._build.zb_heuristic_run``: at 64
devices and 256 microbatches the plain-Python planner takes 1.2 s for the eight
settings, the compiled one 5 ms); its plain-Python twin,
``tabsched._reference.ZBPlanner``, is the test oracle, and the property test
in ``tests/test_build.py`` holds both to the same orders and span, to the bit.
"""

import itertools
from dataclasses import dataclass

import numpy as np

from tabsched._build import OUT_OF_MEMORY, PLACEMENT_ERROR, zb_heuristic_run
from tabsched.costs import CostModel
from tabsched.exceptions import InvalidParameterError, TabschedError
from tabsched.layout import from_order_arrays
from tabsched.lower import lower
from tabsched.schedules._common import DEVICES, MICROBATCHES, OrderBuilder
from tabsched.schedules._registry import Family, Parameter, register
from tabsched.table import FORWARD, INPUT_GRAD, WEIGHT_GRAD, shown_repr

__all__ = ["StageProfile", "Settings", "SETTINGS", "OBJECTIVES", "heuristic_arrays",
           "heuristic_orders", "measure", "build"]

NAME = "zb-auto"
#: Relative slack on memory comparisons (sizes in bytes reach 1e10).
_TOLERANCE = 1e-9


@dataclass(frozen=True)
class StageProfile:
    """What the heuristic knows about one pipeline: per stage (= device) numbers.

    ``forward``, ``input_grad``, ``weight_grad``: durations of one microbatch's
    ``F``, ``I``, ``W`` per stage. ``send_forward[s]``: time of the activation
    transfer from stage ``s`` to ``s+1``; ``send_backward[s]``: of the gradient
    from ``s+1`` to ``s``. ``activation``: memory one forward holds per stage;
    ``release``: the part of it ``I`` frees (``W`` frees the rest).
    ``room``: activation memory each device may hold.
    """

    forward: np.ndarray
    input_grad: np.ndarray
    weight_grad: np.ndarray
    send_forward: np.ndarray
    send_backward: np.ndarray
    activation: np.ndarray
    release: float
    room: np.ndarray

    @property
    def num_stages(self):
        return len(self.forward)

    @property
    def microbatch_limit(self):
        """Microbatch activations the tightest device may hold."""
        return float(np.min(self.room / self.activation))


_KIND_NAMES = {FORWARD: "forward (F)", INPUT_GRAD: "input-grad (I)",
               WEIGHT_GRAD: "weight-grad (W)"}


def probed_durations(costs, probe, name):
    """Durations ``costs`` give the probe's operations, refused unless positive and finite
    (a one-line error naming the family, the operation and the stage)."""
    durations = np.asarray(costs.op_durations(probe), dtype=np.float64)
    bad = np.flatnonzero(~(durations > 0) | ~np.isfinite(durations))
    if len(bad):
        k = int(bad[0])
        raise InvalidParameterError(
            f"{name}: costs must be positive and finite, but the "
            f"{_KIND_NAMES[int(probe.kind[k])]} of stage {int(probe.stage[k])} takes "
            f"{durations[k]:g}")
    return durations


def working_memory(costs, probe):
    """The largest working memory an operation of the probe takes, per device: under a
    byte budget it comes on top of what is held (a recomputed layer's activations while
    its backward runs), so the room for activations leaves space for it."""
    working = np.zeros(probe.num_devices)
    np.maximum.at(working, probe.device, np.asarray(costs.transient_sizes(probe),
                                                    dtype=np.float64))
    return working


def budget_room(name, costs, probe, memory_budget, need, stages):
    """Room for activations on each device of ``probe`` under ``memory_budget`` (a
    device's whole memory): the budget less persistent and working memory.

    Refused, with a one-line error naming the family (``name``) and the first device,
    where the room is below ``need[d]``, the activation of one microbatch on that
    device's ``stages`` ("its stage" or "its stages").
    """
    budget = _budget_value(name, memory_budget, costs)
    persistent = np.asarray(costs.persistent_memory(probe), dtype=np.float64)
    working = working_memory(costs, probe)
    room = budget - persistent - working
    short = np.flatnonzero(room < need * (1 - _TOLERANCE))
    if len(short):
        d = int(short[0])
        if persistent[d] >= budget:
            raise InvalidParameterError(
                f"{name}: memory_budget {memory_budget} is below the persistent memory of "
                f"device {d} ({_amount(persistent[d], costs)} of weights, gradients and "
                f"optimizer state)")
        raise InvalidParameterError(
            f"{name}: memory_budget {memory_budget} leaves device {d} "
            f"{_amount(max(room[d], 0.0), costs)} for activations"
            + (f" (after {_amount(working[d], costs)} of working memory)"
               if working[d] > 0 else "")
            + f", below one microbatch's activation of {stages} "
              f"({_amount(need[d], costs)})")
    return room


def probe_table(devices, stage_layers=None):
    """One microbatch through ``devices`` stages, one per device: F, I, W each."""
    p = devices
    device = np.repeat(np.arange(p), 3)
    position = np.tile(np.arange(3), p)
    kind = np.tile([FORWARD, INPUT_GRAD, WEIGHT_GRAD], p)
    return from_order_arrays(device, position, kind, device, np.zeros(3 * p, dtype=np.int32),
                             num_devices=p, num_stages=p, num_microbatches=1,
                             stage_layers=stage_layers)


def _as_number(family, name, value):
    """``value`` as a finite float; a one-line error naming ``family`` and ``name``."""
    if isinstance(value, bool):
        raise InvalidParameterError(f"{family}: {name} must be a number, not "
                                    f"{shown_repr(value)}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise InvalidParameterError(f"{family}: {name} must be a number, not "
                                    f"{shown_repr(value)}") from None
    if not np.isfinite(number):
        raise InvalidParameterError(f"{family}: {name} must be finite, not {shown_repr(value)}")
    return number


def limit_count(family, memory_limit, held):
    """``memory_limit`` as a count of activations, at least one (``held``: what a device
    holds, "microbatch" for one stage a device, "chunk" for the V placement's two)."""
    count = _as_number(family, "memory_limit", memory_limit)
    if count < 1:
        raise InvalidParameterError(
            f"{family}: memory_limit {count:g} is below one microbatch's activation (the "
            f"limit counts a device's {held} activations; at least 1)")
    return count


def _budget_value(family, value, costs):
    """``memory_budget`` in the cost model's memory unit ("80GB" for bytes)."""
    if isinstance(value, str) and costs.memory_unit == "bytes":
        from tabsched.costs.units import parse_quantity
        return parse_quantity(value, "B", name=f"{family}: memory_budget")
    return _as_number(family, "memory_budget", value)


def measure(costs, devices, stage_layers=None, memory_limit=None, memory_budget=None):
    """The :class:`StageProfile` of ``costs`` on ``devices`` stages, one per device.

    ``memory_limit`` counts microbatch activations of a device's own stage;
    ``memory_budget`` is a device's whole memory (persistent + activations) in
    the cost model's memory unit. Both given: the tighter one holds on each
    device. Neither: ``devices`` activations (1F1B's peak, the paper's ZB-1p).

    Raises
    ------
    InvalidParameterError
        If an operation does not take a positive time, or a device has room for
        less than one microbatch's activation.
    """
    probe = probe_table(devices, stage_layers)
    durations = probed_durations(costs, probe, NAME)
    per_kind = {kind: durations[probe.kind == kind][np.argsort(probe.stage[probe.kind == kind])]
                for kind in _KIND_NAMES}
    lowered = lower(probe)
    transfers = lowered.transfers
    times, _ = costs.transfer_costs(probe, transfers)
    times = np.asarray(times, dtype=np.float64)
    send_forward = np.zeros(max(devices - 1, 0))
    send_backward = np.zeros(max(devices - 1, 0))
    kinds = probe.kind[transfers.producer]
    stages = probe.stage[transfers.producer]
    forward = kinds == FORWARD
    send_forward[stages[forward]] = times[forward]
    send_backward[stages[~forward] - 1] = times[~forward]
    activation = np.asarray(costs.activation_sizes(probe), dtype=np.float64)[probe.kind == FORWARD]
    room = np.full(devices, np.inf)
    if memory_limit is not None:
        room = np.minimum(room, limit_count(NAME, memory_limit, "microbatch") * activation)
    if memory_budget is not None:
        room = np.minimum(room, budget_room(NAME, costs, probe, memory_budget, activation,
                                            "its stage"))
    if memory_limit is None and memory_budget is None:
        room = devices * activation
    return StageProfile(forward=per_kind[FORWARD], input_grad=per_kind[INPUT_GRAD],
                        weight_grad=per_kind[WEIGHT_GRAD], send_forward=send_forward,
                        send_backward=send_backward, activation=activation,
                        release=float(costs.input_grad_release), room=room)


def _amount(value, costs):
    if costs.memory_unit == "bytes":
        from tabsched.costs.units import format_quantity
        return format_quantity(value, "B")
    return f"{value:.6g} {costs.memory_unit}"


@dataclass(frozen=True)
class Settings:
    """The heuristic's binary settings, which the paper grid-searches.

    ``delay_first_backward``: the last warm-up forward may overrun the arrival
    of the first input gradient (else the gap stays idle). ``skip_forward``: a
    stage two or more forwards ahead of the next one may skip its forward.
    ``greedy_weights``: a ``W`` also fills a gap shorter than itself when the
    gap would not make this stage's idle time the largest.
    """

    delay_first_backward: bool
    skip_forward: bool
    greedy_weights: bool

    def describe(self):
        return ",".join(name for name, on in (("delay-first-I", self.delay_first_backward),
                                              ("skip-F", self.skip_forward),
                                              ("greedy-W", self.greedy_weights)) if on) \
            or "plain"


SETTINGS = tuple(Settings(*flags) for flags in itertools.product((False, True), repeat=3))


def _profile_arrays(profile):
    """The arrays ``zb_heuristic_run`` takes, from ``profile``."""
    duration = np.ascontiguousarray([profile.forward, profile.input_grad,
                                     profile.weight_grad], dtype=np.float64)
    return (duration,
            *(np.ascontiguousarray(values, dtype=np.float64) for values in (
                profile.send_forward, profile.send_backward, profile.activation)),
            float(profile.release), np.ascontiguousarray(profile.room, dtype=np.float64))


def heuristic_arrays(profile, microbatches, settings, *, run=None):
    """One setting's orders as arrays, and the heuristic's estimated span:
    ``(kind, microbatch, length, span)``, stage ``s``'s order from ``s * 3 * microbatches``
    (table kind codes; ``length[s]`` of them), as ``tabsched._build.zb_heuristic_run``
    writes them.

    ``run``: the heuristic (default the compiled ``zb_heuristic_run``; the tests pass
    its plain-Python twin, ``tabsched._reference.zb_heuristic_run``).
    """
    run = zb_heuristic_run if run is None else run
    p, per_stage = profile.num_stages, 3 * microbatches
    kind = np.zeros(p * per_stage, dtype=np.int8)
    microbatch = np.zeros(p * per_stage, dtype=np.int32)
    length = np.zeros(p, dtype=np.int32)
    span = np.zeros(1)
    status = run(*_profile_arrays(profile), _TOLERANCE, microbatches,
                 settings.delay_first_backward, settings.skip_forward,
                 settings.greedy_weights, kind, microbatch, length, span)
    if status == OUT_OF_MEMORY:
        raise TabschedError(f"{NAME}: out of memory for the heuristic's scratch at "
                            f"devices={p}, microbatches={microbatches}")
    if status != 0:
        raise TabschedError(f"internal error: {NAME} heuristic status {status} (an "
                            f"operation placed with none left, before its input or past "
                            f"the memory)" if status == PLACEMENT_ERROR else
                            f"internal error: {NAME} heuristic status {status}")
    return kind, microbatch, length, float(span[0])


_KIND_LETTERS = {FORWARD: "F", INPUT_GRAD: "I", WEIGHT_GRAD: "W"}


def heuristic_orders(profile, microbatches, settings, *, run=None):
    """Per-stage orders of ``(kind, microbatch)`` and the heuristic's estimated span
    (:func:`heuristic_arrays` as lists, for reading and the tests).

    >>> profile = StageProfile(*(np.ones(2) for _ in range(3)), np.zeros(1), np.zeros(1),
    ...                        np.ones(2), 0.0, np.full(2, 2.0))
    >>> orders, span = heuristic_orders(profile, 3, SETTINGS[0])
    >>> ["".join(f"{kind}{mb}" for kind, mb in order) for order in orders]
    ['F0F1I0W0F2I1W1I2W2', 'F0I0F1I1W0F2I2W1W2']
    """
    kind, microbatch, length, span = heuristic_arrays(profile, microbatches, settings,
                                                      run=run)
    per_stage = 3 * microbatches
    orders = [[(_KIND_LETTERS[int(kind[at])], int(microbatch[at]))
               for at in range(stage * per_stage, stage * per_stage + int(count))]
              for stage, count in enumerate(length)]
    return orders, span


def _table(orders, devices, microbatches, stage_layers, params):
    """The table of per-stage ``(kind, microbatch)`` orders (:func:`heuristic_orders`)."""
    builder = OrderBuilder(devices)
    for device, order in enumerate(orders):
        for kind, microbatch in order:
            builder.add(device, kind, device, microbatch)
    return builder.table(num_stages=devices, num_microbatches=microbatches,
                         stage_layers=stage_layers, family=NAME, params=params)


def _array_table(arrays, devices, microbatches, stage_layers, params):
    """The table of :func:`heuristic_arrays`' orders, laid out as :func:`_table` lays
    the same orders out (its columns built at once: at 64 devices a setting's orders
    hold about 50,000 operations)."""
    kind, microbatch, length = arrays[:3]
    length = length.astype(np.int64)
    device = np.repeat(np.arange(devices, dtype=np.int64), length)
    position = np.arange(len(device), dtype=np.int64) - np.repeat(
        np.cumsum(length) - length, length)
    taken = device * 3 * microbatches + position
    return from_order_arrays(device, position, kind[taken].astype(np.int64), device,
                             microbatch[taken].astype(np.int64), num_devices=devices,
                             num_stages=devices, num_microbatches=microbatches,
                             stage_layers=stage_layers, family=NAME, params=params)


def _span(result):
    """Longest time from a device's first op to its last (the ZB paper's cost)."""
    return max(result.makespan - d.warmup - d.cooldown for d in result.devices)


OBJECTIVES = ("makespan", "span")


def build(devices, microbatches, costs, memory_limit=None, memory_budget=None,
          objective="makespan", stage_layers=None):
    """The zb-auto table for ``costs``: the best of the heuristic's settings, simulated.

    Parameters
    ----------
    devices, microbatches : int
    costs : CostModel
        What F, I, W and the transfers cost; the table is judged under it.
    memory_limit : float, optional
        Microbatch activations a device may hold (the paper's M_limit / M_B):
        ``devices`` is ZB-1p, ``2 * devices`` ZB-2p. Default ``devices`` unless
        ``memory_budget`` is given.
    memory_budget : float or str, optional
        A device's whole memory in the cost model's unit (``"80GB"`` under
        ModelCosts): persistent memory plus activations must fit it.
    objective : {"makespan", "span"}
        What the simulated orders are ranked by (see the module docstring).
    stage_layers : tuple, optional
        The layer split (``generate`` passes it).

    The table's ``params`` hold the sizes, ``memory_limit`` (the microbatch
    activations the tightest device may hold), ``memory_budget`` if given, and
    ``heuristic``: the settings of the order kept.

    >>> from tabsched import UnitCosts, evaluate, generate
    >>> table = build(4, 8, UnitCosts())
    >>> table.params["memory_limit"], evaluate(table).makespan
    (4, 27.0)
    >>> evaluate(generate("zb-h1", devices=4, microbatches=8)).makespan
    27.0
    """
    if not isinstance(costs, CostModel):
        raise InvalidParameterError(f"{NAME}: costs must be a cost model (UnitCosts, "
                                    f"StageCosts or ModelCosts), not {type(costs).__name__}")
    if objective not in OBJECTIVES:
        raise InvalidParameterError(f"{NAME}: objective must be one of "
                                    f"{', '.join(OBJECTIVES)}, not {objective!r}")
    from tabsched.evaluate import evaluate
    profile = measure(costs, devices, stage_layers, memory_limit, memory_budget)
    limit = profile.microbatch_limit
    params = {"devices": devices, "microbatches": microbatches,
              "memory_limit": int(limit) if limit == int(limit) else round(limit, 6)}
    if memory_budget is not None:
        params["memory_budget"] = memory_budget
    if objective != "makespan":
        params["objective"] = objective
    best = None
    for settings in SETTINGS:
        table = _array_table(heuristic_arrays(profile, microbatches, settings), devices,
                             microbatches, stage_layers,
                             {**params, "heuristic": settings.describe()})
        result = evaluate(table, costs, formula=False)
        score = (result.makespan, _span(result))
        if objective == "span":
            score = score[::-1]
        if best is None or score < best[0]:
            best = (score, table)
    return best[1]


def _doc_parameters():
    return (Parameter("devices", help=DEVICES),
            Parameter("microbatches", help=MICROBATCHES),
            Parameter("costs", help="the cost model the order is built for (UnitCosts, "
                                    "StageCosts or ModelCosts): per-stage F, I, W, the "
                                    "transfer times and the activation memory"),
            Parameter("memory_limit", optional=True,
                      help="microbatch activations a device may hold (the paper's "
                           "M_limit/M_B): devices is ZB-1p, 2*devices ZB-2p; default "
                           "devices unless memory_budget is given"),
            Parameter("memory_budget", optional=True,
                      help="a device's whole memory in the cost model's unit (e.g. 80GB "
                           "under --model/--system, from --memory-budget): persistent "
                           "memory plus activations must fit"),
            Parameter("objective", "makespan",
                      help="what the simulated orders are ranked by: makespan (every device "
                           "starts at 0) or span (first to last op per device, the paper's "
                           "cost when iterations overlap)"))


FAMILY = register(Family(
    name=NAME,
    summary="Zero Bubble's automatic scheduler: split backward, warm-up and W placement "
            "searched for the given costs and memory limit (Qi et al., ICLR 2024, Sec. 3.1)",
    build=build,
    parameters=_doc_parameters(),
    constraints="any devices >= 1, microbatches >= 1; positive F, I, W times; room for at "
                "least one microbatch's activation on every device",
    notes="built from costs: the same sizes give different orders under different costs. "
          "memory_limit=p is the paper's ZB-1p, 2p its ZB-2p; the activation peak never "
          "exceeds the limit. The eight settings of the paper's grid are simulated and the "
          "fastest kept; the authors' ILP refinement is not run",
    aliases=("zbauto",),
    cost_driven=True,
))
