"""The formula level: closed-form bubble ratio and activation peak per family.

Each entry gives the numbers as the family's paper or README states them, the
conditions under which they are exact, and the source. Where no closed form is
published, the entry says so instead of inventing one.

A formula is a function ``(params, times) -> dict`` registered under the family
name, where ``times`` (see :func:`nominal_times`) holds the cost model's own
durations for a full microbatch (F, B, I, W averaged over stages, the mean
transfer time, the overlap factor, and whether stages and transfers are uniform),
so every cost model, profiled or model-based, is judged the same way.
:func:`formula_for` looks the function up for a table and marks the numbers with
``"level": "formula"``.

>>> from tabsched.schedules import generate
>>> numbers = formula_for(generate("1f1b", devices=4, microbatches=8))
>>> round(numbers["bubble_ratio"], 4), numbers["peak_activation"]
(0.2727, [4, 3, 2, 1])
"""

from collections.abc import Callable

import numpy as np

from tabsched._memo import memo
from tabsched.costs import UnitCosts
from tabsched.table import KINDS, ScheduleTable, check_table

__all__ = ["formula_for", "formula_level", "formula_levels", "formula_mismatch",
           "register_formula",
           "nominal_times", "FORMULAS"]

FORMULAS: dict[str, Callable] = {}
#: family -> function(params) -> the number of stages of the family's table.
FORMULA_STAGES: dict[str, Callable] = {}
#: Parameters that are counts wherever a family takes them.
_COUNT_PARAMETERS = ("devices", "microbatches", "chunks", "waves", "pipelines", "group_size")


def _devices(params):
    return params["devices"]


def register_formula(family, stages=_devices):
    """Decorator: register ``function(params, times) -> dict`` for ``family``.

    ``stages(params)`` is the number of stages of the family's table with those
    parameters (default: one per device); the formula level is given only for a
    table of that shape (see :func:`formula_mismatch`).
    """
    def decorate(function):
        FORMULAS[family] = function
        FORMULA_STAGES[family] = stages
        return function
    return decorate


def formula_mismatch(table):
    """Why ``table``'s family metadata does not describe the table, or None if it does.

    The closed forms take the family's parameters, not the table: they hold for
    a table only if its devices, stages and microbatches are those the
    parameters give. A table whose metadata was edited, or a file tagged with a
    family it does not follow, gets no formula level.

    >>> from tabsched.schedules import generate
    >>> formula_mismatch(generate("gpipe", devices=4, microbatches=8)) is None
    True
    >>> print(formula_mismatch(generate("gpipe", devices=1, microbatches=1).replace(
    ...     params={"devices": 4, "microbatches": 8})))
    the table is tagged gpipe devices=4 microbatches=8 (4 devices, 4 stages, 8 microbatches) but has 1 device, 1 stage, 1 microbatch
    """
    params = table.params
    label = " ".join([str(table.family)] + [f"{key}={value}" for key, value in params.items()])
    label = label if len(label) <= 100 else label[:100] + "..."
    for name in ("devices", "microbatches") + tuple(
            name for name in _COUNT_PARAMETERS if name in params):
        value = params.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            stated = "does not state" if value is None else "does not give a count for"
            return f"the table is tagged {label}, which {stated} {name}"
    try:
        stages = int(FORMULA_STAGES.get(table.family, _devices)(params))
    except KeyError as missing:
        return f"the table is tagged {label}, which does not state {missing.args[0]}"
    expected = (params["devices"], stages, params["microbatches"])
    actual = (table.num_devices, table.num_stages, table.num_microbatches)
    if expected == actual:
        return None

    def shape(devices, stages, microbatches):
        nouns = (("device", "devices"), ("stage", "stages"), ("microbatch", "microbatches"))
        return ", ".join(f"{count} {nouns[k][count != 1]}"
                         for k, count in enumerate((devices, stages, microbatches)))
    return f"the table is tagged {label} ({shape(*expected)}) but has {shape(*actual)}"


def formula_level(table, costs=None, lowered=None, transfer_times=None):
    """``(numbers, note)``: :func:`formula_for`'s numbers, and why they are omitted if so.

    ``note`` is None when the family has a formula that fits the table, or has
    none at all; otherwise it says that the formula level was omitted and why.
    """
    if FORMULAS.get(table.family) is None:
        return None, None
    mismatch = formula_mismatch(table)
    if mismatch is not None:
        return None, f"formula level omitted: {mismatch}"
    return formula_for(table, costs, lowered, transfer_times), None


def formula_levels(table, cost_models, lowered=None, transfer_times=None):
    """``[formula_level(table, costs, lowered, times) for costs, times in ...]``, with the
    family's formula looked up and checked against the table once for them all.

    ``transfer_times``: one row of transfer durations per cost model (a 2-D array:
    their means and spreads are then taken for all rows at once), or None.
    """
    cost_models = list(cost_models)
    function = FORMULAS.get(table.family)
    if function is None:
        return [(None, None)] * len(cost_models)
    mismatch = formula_mismatch(table)
    if mismatch is not None:
        return [(None, f"formula level omitted: {mismatch}")] * len(cost_models)
    if transfer_times is None:
        return [(_formula_numbers(function, table, costs, lowered, None), None)
                for costs in cost_models]
    comm = _comm_times(np.asarray(transfer_times, dtype=float).reshape(len(cost_models), -1))
    params = table.params
    return [({"level": "formula", "family": table.family,
              **function(dict(params), _nominal(table, costs, *row, lazy=True))}, None)
             for costs, row in zip(cost_models, comm)]


def formula_for(table, costs=None, lowered=None, transfer_times=None):
    """Formula-level numbers for ``table``'s family, or ``None`` if there are none.

    The dict holds ``level`` ("formula"), ``bubble_ratio`` (or ``None`` when
    unpublished), ``peak_activation`` (per device, in the unit named in
    ``activation_unit``), ``source``, ``exact_when`` and, where it can be judged,
    ``exact``: whether ``costs`` meet ``exact_when``. ``lowered`` (the table's
    lowering, if at hand) saves lowering again to measure transfer times, and
    ``transfer_times`` (its transfers' durations under ``costs``) saves pricing them.
    ``None`` when the family has no formula, or when the table's metadata does
    not match the table (:func:`formula_mismatch` says how).
    """
    check_table(table)
    function = FORMULAS.get(table.family)
    if function is None or formula_mismatch(table) is not None:
        return None
    return _formula_numbers(function, table, costs, lowered, transfer_times)


def _formula_numbers(function, table, costs, lowered, transfer_times):
    times = nominal_times(table, costs if costs is not None else UnitCosts(), lowered,
                          transfer_times)
    return {"level": "formula", "family": table.family, **function(dict(table.params), times)}


def nominal_times(table, costs, lowered=None, transfer_times=None):
    """What ``costs`` say one full microbatch costs on ``table``.

    Returns a dict: ``F``, ``B``, ``I``, ``W`` (seconds or slots, averaged over the
    stages), ``comm`` (mean time of the table's transfers, 0 without any),
    ``overlap`` (the factor on fused cells), ``uniform_stages`` (every stage costs
    the same for every kind) and ``uniform_comm`` (every transfer costs the same).
    The durations come from the cost model itself, on a probe with one operation of
    every kind on every stage, so profiled and model-based costs are measured alike.

    >>> from tabsched import StageCosts
    >>> from tabsched.schedules import generate
    >>> times = nominal_times(generate("1f1b", devices=2, microbatches=2), StageCosts([1, 3]))
    >>> times["F"], times["B"], times["uniform_stages"]
    (2.0, 4.0, False)
    """
    if transfer_times is not None:
        comm_times = transfer_times
    else:
        if lowered is None:
            from tabsched.lower import lower
            lowered = lower(table)
        comm_times, _ = costs.transfer_costs(table, lowered.transfers)
    comm_times = np.asarray(comm_times, dtype=float)
    return _nominal(table, costs, *_comm_times(comm_times[None, :])[0])


def _comm_times(rows):
    """``[(mean, uniform)]`` of each row of transfer times: the mean (0 without
    transfers) and whether they are all equal (to 1e-12 of the largest)."""
    if rows.shape[1] == 0:
        return [(0.0, True)] * len(rows)
    means = rows.mean(axis=1).tolist()   # each row's own sum, as a 1-D mean takes it
    uniform = (np.ptp(rows, axis=1) <= 1e-12 * np.maximum(1.0, rows.max(axis=1))).tolist()
    return list(zip(means, uniform))


def _nominal(table, costs, comm, uniform_comm, lazy=False):
    """:func:`nominal_times` from the transfers' mean time and uniformity. ``lazy``: the
    overlap factor (a two-stream model of every stage's chains) only when a formula
    reads it, as few do."""
    stage_times = _probe_durations(table, costs)[1]
    times = _LazyOverlap(table, costs) if lazy else {}
    times.update({kind: stage_times[kind] for kind in KINDS})
    if not lazy:
        times["overlap"] = _overlap(table, costs)
    times.update(comm=comm, uniform_stages=stage_times["uniform_stages"],
                 uniform_comm=uniform_comm)
    return times


def _overlap(table, costs):
    """The factor on an overlapped F&B pair under ``costs``."""
    factor = getattr(costs, "pair_overlap_factor", None)
    return float(factor(table)) if factor is not None else float(getattr(costs, "overlap",
                                                                         1.0))


class _LazyOverlap(dict):
    """Nominal times whose ``overlap`` is computed when first read."""

    def __init__(self, table, costs):
        super().__init__()
        self._source = (table, costs)

    def __missing__(self, key):
        if key != "overlap":
            raise KeyError(key)
        value = self["overlap"] = _overlap(*self._source)
        return value


def _chunked_stages(params):
    """Multi-chunk families: ``chunks`` model chunks on every device."""
    return params["devices"] * params["chunks"]


def _two_per_device(params):
    """BitPipe and DualPipeV: two stages per device (BitPipe's two V pipelines share them)."""
    return 2 * params["devices"]


def _hanayo_stages(params):
    """Hanayo: ``2W`` chunks per device, W the waves (default 1)."""
    return 2 * params.get("waves", 1) * params["devices"]


def _probe_durations(table, costs):
    """``(durations, stage_times)``: the (kinds x stages) durations ``costs`` give one
    full microbatch, on a probe table with one operation of every kind on every stage,
    and what :func:`nominal_times` takes of them (each kind's mean over the stages,
    ``uniform_stages``); remembered per cost model and table shape (a sweep asks the
    same question for table after table)."""
    # a cost model prices an operation by its kind, stage, the stage's layers and the
    # microbatch size, not by the family or its parameters
    try:
        hash(costs)
    except TypeError:     # a cost model that holds unhashable values: measured each time
        return _probe(table, costs)
    return _remembered_probe(costs, table.num_stages, table.stage_layers)


def _probe(table, costs):
    S = table.num_stages
    per_stage = costs.microbatch_durations(table)
    if per_stage is None:
        per_stage = _measured_on_probe(table, costs)
    per_stage = np.array(per_stage, dtype=float).reshape(len(KINDS), S)
    per_stage.flags.writeable = False
    stage_times = {kind: float(per_stage[code].mean()) for code, kind in enumerate(KINDS)}
    stage_times["uniform_stages"] = bool(np.all(
        np.ptp(per_stage, axis=1) <= 1e-12 * np.abs(per_stage).max(initial=1.0)))
    return per_stage, stage_times


def _measured_on_probe(table, costs):
    S = table.num_stages
    kinds = np.repeat(np.arange(len(KINDS)), S)
    stages = np.tile(np.arange(S), len(KINDS))
    probe = ScheduleTable.from_arrays(
        np.zeros(len(kinds)), np.arange(len(kinds)), kinds, stages, np.zeros(len(kinds)),
        [len(kinds)], num_stages=S, microbatch_sizes=(1.0,), stage_layers=table.stage_layers,
        family=table.family, params=table.params, validate=False)
    return costs.op_durations(probe)


@memo(limit=512)
def _remembered_probe(costs, num_stages, stage_layers):
    """:func:`_probe` of tables with these stages, remembered per cost model (a frozen
    value) and stage split: a sweep asks the same question for table after table."""
    return _probe(_Shape(num_stages, stage_layers), costs)


class _Shape:
    """What a cost model reads of a table to price one microbatch: its stages and their
    layers (the family and its parameters change no price)."""

    family = None

    def __init__(self, num_stages, stage_layers):
        self.num_stages, self.stage_layers = num_stages, stage_layers

    @property
    def params(self):
        return {}


def _flush_exact(times):
    return times["uniform_stages"] and times["comm"] == 0


def flush_bubble(devices, microbatches):
    """Bubble ratio of a synchronous flush pipeline: ``(p-1)/(M+p-1)``."""
    return (devices - 1) / (microbatches + devices - 1)


@register_formula("gpipe")
def _gpipe(params, times):
    """GPipe (Huang et al. 2019): bubble (p-1)/(M+p-1); each device holds M activations."""
    p, m = params["devices"], params["microbatches"]
    return {"bubble_ratio": flush_bubble(p, m),
            "peak_activation": [m] * p,
            "activation_unit": "stage activations of one microbatch",
            "source": "Huang et al., GPipe, NeurIPS 2019",
            "exact_when": "equal stage times and no communication; any F:B ratio",
            "exact": _flush_exact(times)}


@register_formula("1f1b")
def _one_f_one_b(params, times):
    """1F1B (Narayanan et al. 2021; Fan et al. 2021): GPipe's bubble, min(p-d, M) activations."""
    p, m = params["devices"], params["microbatches"]
    return {"bubble_ratio": flush_bubble(p, m),
            "peak_activation": [min(p - d, m) for d in range(p)],
            "activation_unit": "stage activations of one microbatch",
            "source": "Narayanan et al., PipeDream-Flush (2021); Fan et al., DAPPLE (2021)",
            "exact_when": "equal stage times and no communication; any F:B ratio",
            "exact": _flush_exact(times)}


# --------------------------------------------------- interleaved, looped BFS, zero bubble
# Peaks below are in tabsched's unit, one stage (= model chunk) activation of one
# microbatch, so they compare directly with a Result's device peaks; where the source
# counts whole-device activations (two chunks in the V schedules), ``published_peak``
# quotes it in the source's own unit.

def _uniform_times(times):
    """``(F, I, W, comm)`` when every stage costs the same and so does every transfer."""
    if not (times["uniform_stages"] and times["uniform_comm"]):
        return None
    return times["F"], times["I"], times["W"], times["comm"]


@register_formula("interleaved-1f1b", stages=_chunked_stages)
def _interleaved_one_f_one_b(params, times):
    """Interleaved 1F1B (Narayanan et al., SC'21, Megatron-LM virtual pipeline).

    Bubble: the paper's bubble time is ``(p-1)/v`` of 1F1B's, i.e. a fraction
    ``(p-1)/(v*m)`` of the ideal time, so ``(p-1)/(v*N+p-1)`` of the makespan.
    Peak: device ``r`` runs ``min(v*N, 2(p-r-1) + (v-1)g)`` warm-up forwards
    (Megatron's ``get_pp_rank_microbatches``) and holds one more in the steady
    state, so ``min(v*N, 2(p-r-1) + (v-1)g + 1)`` chunk activations; the combined 1F1B
    (``pairs="fused"``) one warm-up forward more, and so one activation more (the bubble
    is the same: a pair takes what its two operations take under slot costs).
    """
    p, m, v = params["devices"], params["microbatches"], params["chunks"]
    g = params.get("group_size", p)
    extra = 1 if params.get("pairs") == "fused" else 0
    return {"bubble_ratio": (p - 1) / (v * m + p - 1),
            "peak_activation": [min(v * m, 2 * (p - d - 1) + (v - 1) * g + 1 + extra)
                                for d in range(p)],
            "activation_unit": "stage activations of one microbatch",
            "source": "Narayanan et al., Efficient Large-Scale Language Model Training on GPU "
                      "Clusters Using Megatron-LM, SC'21 (bubble); Megatron-LM schedules.py "
                      "warm-up depth (peak)",
            "exact_when": "equal stage times and no communication; any F:B ratio and any "
                          "group_size Megatron accepts"}


@register_formula("looped-bfs", stages=_chunked_stages)
def _looped_bfs(params, times):
    """Breadth-first PP (Lamy-Poirier 2022; PyTorch ``ScheduleLoopedBFS``).

    No closed-form bubble was available to us from the paper, so none is given.
    Every forward of a device precedes its first backward, so each device holds
    all ``v*N`` of its chunk activations, as GPipe does.
    """
    p, m, v = params["devices"], params["microbatches"], params["chunks"]
    return {"bubble_ratio": None,
            "peak_activation": [v * m] * p,
            "activation_unit": "stage activations of one microbatch",
            "source": "Lamy-Poirier, Breadth-First Pipeline Parallelism, 2022 (text not "
                      "seen); order from PyTorch's ScheduleLoopedBFS",
            "exact_when": "peak: always (all forwards before the first backward)",
            "note": "no published closed-form bubble; with equal stage times and no "
                    "communication the table gives (p-1)/(v*M+p-1) when M >= p and more "
                    "when M < p (stalls at each loop boundary)"}


def _zero_bubble_handcrafted(params, times, factor):
    """Bubble of ZB-H1 (factor 1) or ZB-H2 (factor 2) at the stage-mean F, I, W times.

    With unequal stages or transfers the closed form is evaluated at the means
    and ``exact`` is False.
    """
    p, m = params["devices"], params["microbatches"]
    peak = [min(m, factor * (p - 1) + 1)] * p
    forward, input_grad, weight_grad, comm = (times["F"], times["I"], times["W"],
                                              times["comm"])
    if factor == 1:
        bubble_time = (p - 1) * (forward + input_grad - weight_grad)
    else:
        bubble_time = (p - 1) * (forward + input_grad - 2 * weight_grad + 2 * comm)
    bubble_time = max(bubble_time, 0.0)
    work = m * (forward + input_grad + weight_grad)
    exact = (factor == 1 and _uniform_times(times) is not None and comm == 0 and m >= 2 * p
             and weight_grad <= min(forward, input_grad))
    numbers = {"bubble_ratio": bubble_time / (work + bubble_time) if work + bubble_time else 0.0,
               "bubble_time": bubble_time, "peak_activation": peak,
               "exact": exact if factor == 1 else False}
    if _uniform_times(times) is None:
        numbers["note"] = ("stages or transfers differ in cost: the closed form is evaluated "
                           "at their means")
    return numbers


@register_formula("zb-h1")
def _zb_h1(params, times):
    """ZB-H1 (Qi et al., Zero Bubble Pipeline Parallelism, ICLR 2024).

    Bubble time ``(p-1)(T_F + T_B - T_W)`` per device (``T_B`` is our ``I``),
    asserted in the authors' ``efficiency.py`` with no communication; the ratio
    is ``bubble / (bubble + N(T_F+T_B+T_W))``. Peak: counted from the authors'
    order (we did not check the paper's memory table): every device runs ``p``
    forwards before its first ``W``, so it holds ``min(N, p)``, 1F1B's maximum.
    """
    numbers = _zero_bubble_handcrafted(params, times, 1)
    return {**numbers,
            "activation_unit": "stage activations of one microbatch",
            "source": "Qi et al., Zero Bubble Pipeline Parallelism, ICLR 2024; bubble "
                      "asserted in sail-sg/zero-bubble-pipeline-parallelism efficiency.py; "
                      "peak counted from that order",
            "exact_when": "M >= 2p, equal stage times, no communication and W <= F, W <= I "
                          "(all devices starting together); otherwise a lower bound"}


@register_formula("zb-h2")
def _zb_h2(params, times):
    """ZB-H2 (Qi et al., Zero Bubble Pipeline Parallelism, ICLR 2024).

    Bubble time ``(p-1)(T_F + T_B - 2T_W + 2 comm)``, asserted in the authors'
    ``efficiency.py``, measured on each device from its own first forward: it
    assumes the next iteration starts before this one ends (optimizer
    post-validation). A table whose devices all start at 0 adds the start/end
    skew, so there the formula is a lower bound. Peak: counted from the
    authors' order (the paper's memory table not checked): ``min(N, 2p-1)`` on
    every device.
    """
    numbers = _zero_bubble_handcrafted(params, times, 2)
    return {**numbers,
            "activation_unit": "stage activations of one microbatch",
            "source": "Qi et al., Zero Bubble Pipeline Parallelism, ICLR 2024; bubble "
                      "asserted in sail-sg/zero-bubble-pipeline-parallelism efficiency.py; "
                      "peak counted from that order",
            "exact_when": "per device from its own first op, M >= 2p, equal stage times and "
                          "W <= F, W <= I; the table (all devices start at 0) adds the p-1 "
                          "start/end skew"}


@register_formula("zbv", stages=_chunked_stages)
def _zbv(params, times):
    """ZB-V (Qi et al., Zero Bubble Pipeline Parallelism, ICLR 2024; the authors' README).

    Zero bubble when ``T_F = T_B = T_W``, apart from the ``p-1`` start/end skew
    of a table whose devices start together; no closed form otherwise (the
    authors use a greedy scheduler then). Activation memory as 1F1B: ``p``
    whole-device activations (two chunks each) on every device.
    """
    p, m = params["devices"], params["microbatches"]
    times = _uniform_times(times)
    equal = times is not None and times[0] == times[1] == times[2] and times[3] == 0
    numbers = {"bubble_ratio": 0.0 if equal else None,
               "peak_activation": [min(2 * p, 2 * m)] * p,
               "published_peak": f"{p} device activations (1F1B's maximum)",
               "activation_unit": "stage activations of one microbatch",
               "source": "Qi et al., Zero Bubble Pipeline Parallelism, ICLR 2024; "
                         "sail-sg/zero-bubble-pipeline-parallelism README",
               "exact_when": "bubble: F = I = W, no communication, M >= 2p-1, per device from "
                             "its own first op (the table adds (p-1)/(6M+p-1) of skew); "
                             "peak: every device once M >= 2p-1, an upper bound below"}
    if not equal:
        numbers["note"] = "no closed-form bubble unless F = I = W without communication"
    return numbers


@register_formula("zb-auto")
def _zb_auto(params, times):
    """zb-auto (Qi et al., Zero Bubble Pipeline Parallelism, ICLR 2024, Sec. 3; App. B).

    The automatic scheduler has no closed-form bubble. Appendix B bounds the
    idle time of the first stage before its first ``I`` (the paper's ``B``):
    the first microbatch needs ``p(T_F + T_B) + 2(p-1) T_comm`` from that
    stage's first forward to the end of its input-grad, and the stage can only
    run forwards meanwhile, at most ``k`` of them within the memory limit
    (``k M_B <= M_limit``), so it idles at least

        beta = (p-1)(T_B + 2 T_comm) + (p-k) T_F          (Formula 2)

    With equal stages every device works ``m(T_F+T_B+T_W)``, so both the
    paper's bubble rate (from the longest per-device span) and the table's
    (every device starting at 0) are at least ``beta / (beta + m(T_F+T_B+T_W))``.
    ``k = min(m, floor(memory_limit))``; with a ``memory_budget`` the first
    device's room is not in the table's parameters, so ``k = m`` (a weaker bound
    that still holds). With unequal stages or transfers the bound is evaluated
    at the means and is not guaranteed.
    """
    p, m = params["devices"], params["microbatches"]
    limit = params.get("memory_limit", p)
    k = m if "memory_budget" in params else min(m, int(np.floor(limit + 1e-9)))
    forward, input_grad, weight_grad, comm = (times["F"], times["I"], times["W"],
                                              times["comm"])
    beta = max(0.0, (p - 1) * (input_grad + 2 * comm) + (p - k) * forward) if p > 1 else 0.0
    work = m * (forward + input_grad + weight_grad)
    holds = times["uniform_stages"] and times["uniform_comm"]
    return {"bubble_ratio": None,
            "bubble_ratio_lower_bound": beta / (beta + work) if beta + work > 0 else 0.0,
            "bubble_time_lower_bound": beta,
            "lower_bound_holds": holds,
            "peak_activation": None,
            # under a budget devices differ in room: only the microbatch count bounds them
            "peak_activation_bounds": (1, m if "memory_budget" in params else min(m, limit)),
            "activation_unit": "microbatch activations of the device's stage",
            "source": "Qi et al., Zero Bubble Pipeline Parallelism, ICLR 2024: Section 3.1 "
                      "(the heuristic) and Appendix B, Formula 2 (the bound)",
            "exact_when": None, "exact": False,
            "note": f"no closed form: the order is searched for the costs. Lower bound "
                    f"(Appendix B) from the first stage's wait for its first input-grad with "
                    f"k = {k} warm-up forwards"
                    + ("" if holds else "; stages or transfers differ in cost, so the bound "
                                        "is evaluated at their means and not guaranteed")}


@register_formula("zbv-auto", stages=_chunked_stages)
def _zbv_auto(params, times):
    """zbv-auto (Qi et al., Zero Bubble Pipeline Parallelism, ICLR 2024, Sec. 6; App. D).

    The cost-driven V schedule has no closed form. Appendix B's bound is for the
    1F1B placement (the first device waits for the gradient to come back from
    the last one); in the V the first device also runs the last stage, so no
    published bound applies. The peak is at most the memory limit (chunk
    activations) and at most every chunk's ``2m``.
    """
    m = params["microbatches"]
    limit = params.get("memory_limit", 2 * params["devices"])
    return {"bubble_ratio": None, "peak_activation": None,
            "peak_activation_bounds": (1, 2 * m if "memory_budget" in params
                                       else min(2 * m, limit)),
            "activation_unit": "chunk (stage) activations of one microbatch",
            "source": "Qi et al., Zero Bubble Pipeline Parallelism, ICLR 2024: Section 6 and "
                      "Appendix D (the V heuristic); the authors' zbv.py",
            "exact_when": None, "exact": False,
            "note": "no closed form: the order is searched for the costs; Appendix B's lower "
                    "bound is for the 1F1B placement and does not apply to the V"}


def _controllable_memory(params, device_peak, approximate, name):
    p, m = params["devices"], params["microbatches"]
    return {"bubble_ratio": None,
            "approximate_bubble_ratio": approximate,
            "peak_activation": [min(2 * device_peak, 2 * m)] * p,
            "published_peak": f"{device_peak} device activations (two chunks each)",
            "activation_unit": "stage activations of one microbatch",
            "source": "Qi et al., Pipeline Parallelism with Controllable Memory, NeurIPS 2024 "
                      "(arXiv 2405.15362); the authors' HF space",
            "exact_when": "peak: the largest device peak with unit times (single devices may "
                          "hold less)",
            "note": f"no closed-form bubble is published; the authors give {name} for "
                    f"F = B = W, a large-M approximation (1F1B: about p/M)"}


@register_formula("v-half", stages=_chunked_stages)
def _v_half(params, times):
    """V-Half (Qi et al., NeurIPS 2024): peak ``(p+2)//2`` device activations; bubble ~ p/(2M)."""
    p, m = params["devices"], params["microbatches"]
    return _controllable_memory(params, (p + 2) // 2, p / (2 * m), "about p/(2M)")


@register_formula("v-min", stages=_chunked_stages)
def _v_min(params, times):
    """V-Min (Qi et al., NeurIPS 2024): peak ``(p+4)//3`` device activations; bubble ~ 2p/(3M)."""
    p, m = params["devices"], params["microbatches"]
    return _controllable_memory(params, (p + 4) // 3, 2 * p / (3 * m), "about 2p/(3M)")


# ---------------------------------------------------------------- bidirectional
# Chimera, BitPipe, DualPipe, DualPipeV and Hanayo (issue 4). Besides the keys
# above, these entries may carry ``exact`` (whether the given costs meet
# ``exact_when``), ``peak_activation_bounds`` (low, high) where the source
# states a range instead of per-device values, ``bubble_time`` where it states
# an idle time, and ``note``.

def _close(a, b):
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


@register_formula("chimera")
def _chimera(params, times):
    """Chimera (Li & Hoefler, SC'21): bubble (D-2)/(2N+D-2); [D/2+1, D] activations.

    The paper counts D-2 bubbles (D/2-1 in the forward and D/2-1 in the backward
    half) against 2(D-1) for GPipe and 1F1B, with equal forward and backward
    slots; the activation memory of a worker lies in [(D/2+1) Ma, D Ma], Ma the
    activations of one microbatch on one stage replica. Forward doubling doubles
    activation memory (which is why the paper pairs it with recomputation).

    Exact when F = B (basic unit, direct concatenation and forward doubling);
    forward doubling also when B = 2F, since two forwards then fill one
    backward's slot. With B = 2F the table of direct concatenation is worse
    (27.3% instead of 15.8% at D=8, N=16). SCHEDULES.md §8. For 2f > 2
    pipelines no formula is given here: the paper's generalisation was not
    checked against its text.
    """
    D, N = params["devices"], params["microbatches"]
    variant, pipelines = params.get("variant", "direct"), params.get("pipelines", 2)
    unit = "stage activations of one microbatch (Ma per stage replica)"
    source = "Li & Hoefler, Chimera, SC'21; code Shigangli/Chimera (SCHEDULES.md §8)"
    if pipelines != 2:
        f = pipelines // 2
        return {"bubble_ratio": None, "peak_activation": None,
                "activation_unit": unit, "source": source, "exact_when": None,
                "exact": None,
                "note": f"no closed form checked for {pipelines} pipelines (the paper's "
                        f"generalisation was not verified against its text); at F = B the "
                        f"table gives (D/f-2)/(2N+D/f-2) with f = {f}, and activations "
                        f"within [D/2+1, D]"}
    doubling = variant == "doubling"
    equal = _close(times["F"], times["B"])
    exact = times["uniform_stages"] and times["comm"] == 0 and (
        equal or (doubling and _close(2 * times["F"], times["B"])))
    low, high = D // 2 + 1, D
    return {"bubble_ratio": (D - 2) / (2 * N + D - 2),
            "peak_activation": None,
            "peak_activation_bounds": (2 * low, 2 * high) if doubling else (low, high),
            "activation_unit": unit, "source": source,
            "exact_when": ("F = B or B = 2F, no communication" if doubling
                           else "F = B, no communication"),
            "exact": exact,
            "note": ("forward doubling: the paper says it doubles activation memory; "
                     "the bounds are twice the basic [D/2+1, D]") if doubling else
                    "per worker, over its two stage replicas"}


@register_formula("bitpipe", stages=_two_per_device)
def _bitpipe(params, times):
    """BitPipe (Wu et al., arXiv 2410.19367): no closed form published that we could check.

    SCHEDULES.md §9 records what the authors' order gives in the table --
    (D-2)/(4N+D-2) at F = B -- but that is a table-level observation, not the
    paper's formula, so the formula level reports none.
    """
    return {"bubble_ratio": None, "peak_activation": None,
            "activation_unit": "stage activations of one microbatch",
            "source": "Wu et al., BitPipe, arXiv 2410.19367; code wuhouming/BitPipe "
                      "(SCHEDULES.md §9)",
            "exact_when": None, "exact": None,
            "note": "no closed-form bubble or activation peak published that we could "
                    "verify; use the table level"}


def _dualpipe_numbers(half_depth, work_units, devices, peak, params, times, source):
    fused_pair = times["overlap"] * (times["F"] + times["B"])
    bubble_time = (half_depth - 1) * (fused_pair + times["B"] - 3 * times["W"])
    work = work_units * (times["F"] + times["B"])
    fused = params.get("pairs", "fused") == "fused"
    exact = (fused and times["uniform_stages"] and times["comm"] == 0 and times["overlap"] == 1.0
             and _close(times["F"], times["I"]) and _close(times["I"], times["W"])
             and _close(times["B"], times["I"] + times["W"]))
    total = bubble_time + work
    return {"bubble_ratio": bubble_time / total if total > 0 else 0.0,
            "bubble_time": bubble_time,
            "peak_activation": [peak] * devices,
            "activation_unit": "chunk (stage) activations of one microbatch",
            "source": source,
            "exact_when": "pairs fused into one cell with overlap = 1 (F&B = F+B), "
                          "F = I = W with B = I + W, no communication",
            "exact": exact,
            "note": "bubble_time is the README's idle time per device, F&B = overlap x "
                    "(F+B) (under model costs, the two-stream model's factor on a forward "
                    "beside a backward); the ratio takes it against the device's work "
                    f"({work_units} x (F+B)). The README counts a pair as one block: "
                    "serial pairs idle less"}


@register_formula("dualpipe")
def _dualpipe(params, times):
    """DualPipe (DeepSeek-V3 report; README of deepseek-ai/DualPipe).

    Bubble (PP/2-1)(F&B+B-3W), activations PP+1 per device, 2x parameters. F is
    a forward chunk, B a full backward chunk, W a weight-grad chunk, F&B an
    overlapped pair. The README's bubble is an idle time per device; the ratio
    takes it against the device's work N(F+B). Exact (every device idles that
    long) when pairs are fused cells with F&B = F+B and F = I = W; with a
    smaller F&B it is the middle ranks' idle time as long as F&B >= B.
    """
    PP, N = params["devices"], params["microbatches"]
    return _dualpipe_numbers(PP // 2, N, PP, PP + 1, params, times,
                             "DeepSeek-AI, DualPipe README (deepseek-ai/DualPipe); "
                             "SCHEDULES.md §10")


@register_formula("dualpipev", stages=_two_per_device)
def _dualpipev(params, times):
    """DualPipeV (README of deepseek-ai/DualPipe; PyTorch ``ScheduleDualPipeV``).

    The README's row for DualPipeV on PP/2 devices: bubble (PP/2-1)(F&B+B-3W),
    PP+1 activations, 2x parameters (two stages per device, not a copy). With p
    devices PP = 2p: bubble (p-1)(F&B+B-3W), 2p+1 chunk activations, against a
    device's work 2N(F+B). Exact under the same conditions as DualPipe.
    """
    p, N = params["devices"], params["microbatches"]
    return _dualpipe_numbers(p, 2 * N, p, 2 * p + 1, params, times,
                             "DeepSeek-AI, DualPipe README, DualPipeV row "
                             "(deepseek-ai/DualPipe); SCHEDULES.md §10")


@register_formula("hanayo", stages=_hanayo_stages)
def _hanayo(params, times):
    """Hanayo (Liu et al., SC'23), Eq. 1 and the memory table of Fig. 2, for M = P.

    With per-device times T_F = 2W F, T_B = 2W B of one microbatch and T_C of one
    transfer::

        ((1/W) T_B + (1 + 2W + 2/P + (P-2)/3) T_C)
        / ((P/(P-1)) T_F + (1/(2W) + P/(P-1)) T_B + ((P-2)/2 + 4W) T_C)

    which at T_B = 2T_F, T_C = 0 is (2P-2)/(3PW+P-1). Activations per device lie
    in [((2W-1)(P+1)/(2W)) Ma, P Ma], Ma one device's share (2W chunks) of a
    microbatch's activations. Never exact for the paper's own order: without
    communication its table idles (P-1) max(T_F, T_B)/W per device, a ratio of
    ((P-1)T_B/W) / ((P-1)T_B/W + P(T_F+T_B)) when T_B >= T_F (33.3% vs 40.0% at
    P=4, W=1), and for W >= 2 reaches a lower minimum memory. The paper states nothing for M != P:
    there the entry reports no numbers, only what changes.
    """
    P, M, W = params["devices"], params["microbatches"], params.get("waves", 1)
    unit = "chunk (stage) activations of one microbatch"
    source = "Liu et al., Hanayo, SC'23 (arXiv 2308.15762), Eq. 1 and Fig. 2 (SCHEDULES.md §11)"
    if M != P or P < 2:
        why = ("Eq. 1 needs P >= 2" if P < 2 else
               f"the paper covers M = P = {P} only (Eq. 1 has no M); with M = {M} the last "
               f"device runs every forward before its first backward and holds all "
               f"2W x M = {2 * W * M} chunk activations, so memory grows with M")
        return {"bubble_ratio": None, "peak_activation": None, "activation_unit": unit,
                "source": source, "exact_when": None, "exact": None, "note": why}
    t_f, t_b, t_c = 2 * W * times["F"], 2 * W * times["B"], times["comm"]
    numerator = t_b / W + (1 + 2 * W + 2 / P + (P - 2) / 3) * t_c
    denominator = ((P / (P - 1)) * t_f + (1 / (2 * W) + P / (P - 1)) * t_b
                   + ((P - 2) / 2 + 4 * W) * t_c)
    idle = (P - 1) * max(t_f, t_b) / W
    table_level = idle / (idle + P * (t_f + t_b)) if t_f + t_b > 0 else 0.0
    return {"bubble_ratio": numerator / denominator if denominator > 0 else 0.0,
            "peak_activation": None,
            "peak_activation_bounds": ((2 * W - 1) * (P + 1), 2 * W * P),
            "activation_unit": unit, "source": source,
            "exact_when": None, "exact": False,
            "note": f"Eq. 1 and the paper's own order disagree even without communication: "
                    f"its table gives {table_level:.2%} here; the bounds are "
                    f"[(2W-1)(P+1)/(2W), P] Ma in chunk activations"}
