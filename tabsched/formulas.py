"""The formula level: closed-form bubble ratio and activation peak per family.

Each entry gives the numbers as the family's paper or README states them, the
conditions under which they are exact, and the source. Where no closed form is
published, the entry says so instead of inventing one.

A formula is a function ``(params, costs) -> dict`` registered under the family
name; :func:`formula_for` looks it up for a table and marks the numbers with
``"level": "formula"``.

>>> from tabsched.schedules import generate
>>> numbers = formula_for(generate("1f1b", devices=4, microbatches=8))
>>> round(numbers["bubble_ratio"], 4), numbers["peak_activation"]
(0.2727, [4, 3, 2, 1])
"""

from tabsched.costs import UnitCosts

__all__ = ["formula_for", "register_formula", "FORMULAS"]

FORMULAS = {}


def register_formula(family):
    """Decorator: register ``function(params, costs) -> dict`` for ``family``."""
    def decorate(function):
        FORMULAS[family] = function
        return function
    return decorate


def formula_for(table, costs=None):
    """Formula-level numbers for ``table``'s family, or ``None`` if it has no family.

    The dict holds ``level`` ("formula"), ``bubble_ratio`` (or ``None`` when
    unpublished), ``peak_activation`` (per device, in the unit the source uses,
    named in ``activation_unit``), ``source`` and ``exact_when``.
    """
    function = FORMULAS.get(table.family)
    if function is None:
        return None
    numbers = function(dict(table.params), costs if costs is not None else UnitCosts())
    return {"level": "formula", "family": table.family, **numbers}


def flush_bubble(devices, microbatches):
    """Bubble ratio of a synchronous flush pipeline: ``(p-1)/(M+p-1)``."""
    return (devices - 1) / (microbatches + devices - 1)


@register_formula("gpipe")
def _gpipe(params, costs):
    """GPipe (Huang et al. 2019): bubble (p-1)/(M+p-1); each device holds M activations."""
    p, m = params["devices"], params["microbatches"]
    return {"bubble_ratio": flush_bubble(p, m),
            "peak_activation": [m] * p,
            "activation_unit": "stage activations of one microbatch",
            "source": "Huang et al., GPipe, NeurIPS 2019",
            "exact_when": "equal stage times and no communication; any F:B ratio"}


@register_formula("1f1b")
def _one_f_one_b(params, costs):
    """1F1B (Narayanan et al. 2021; Fan et al. 2021): GPipe's bubble, min(p-d, M) activations."""
    p, m = params["devices"], params["microbatches"]
    return {"bubble_ratio": flush_bubble(p, m),
            "peak_activation": [min(p - d, m) for d in range(p)],
            "activation_unit": "stage activations of one microbatch",
            "source": "Narayanan et al., PipeDream-Flush (2021); Fan et al., DAPPLE (2021)",
            "exact_when": "equal stage times and no communication; any F:B ratio"}


# --------------------------------------------------- interleaved, looped BFS, zero bubble
# Peaks below are in tabsched's unit, one stage (= model chunk) activation of one
# microbatch, so they compare directly with a Result's device peaks; where the source
# counts whole-device activations (two chunks in the V schedules), ``published_peak``
# quotes it in the source's own unit.

def _uniform_times(costs):
    """``(F, I, W, comm)`` when every stage costs the same and comm is one number, else None."""
    if isinstance(costs, UnitCosts):
        forward, _, input_grad, weight_grad = (float(value) for value in costs.lengths)
        return forward, input_grad, weight_grad, 0.0
    values = []
    for name in ("forward", "input_grad", "weight_grad", "comm"):
        value = getattr(costs, name, None)
        if value is None:
            return None
        if hasattr(value, "ravel"):
            if name == "comm":
                return None  # a per-link matrix: no single hop cost
            items = [float(item) for item in value.ravel()]
        else:
            items = [float(value)]
        if not items or max(items) != min(items):
            return None
        values.append(items[0])
    return tuple(values)


@register_formula("interleaved-1f1b")
def _interleaved_one_f_one_b(params, costs):
    """Interleaved 1F1B (Narayanan et al., SC'21, Megatron-LM virtual pipeline).

    Bubble: the paper's bubble time is ``(p-1)/v`` of 1F1B's, i.e. a fraction
    ``(p-1)/(v*m)`` of the ideal time, so ``(p-1)/(v*N+p-1)`` of the makespan.
    Peak: device ``r`` runs ``min(v*N, 2(p-r-1) + (v-1)g)`` warm-up forwards
    (Megatron's ``get_pp_rank_microbatches``) and holds one more in the steady
    state, so ``min(v*N, 2(p-r-1) + (v-1)g + 1)`` chunk activations.
    """
    p, m, v = params["devices"], params["microbatches"], params["chunks"]
    g = params.get("group_size", p)
    return {"bubble_ratio": (p - 1) / (v * m + p - 1),
            "peak_activation": [min(v * m, 2 * (p - d - 1) + (v - 1) * g + 1)
                                for d in range(p)],
            "activation_unit": "stage activations of one microbatch",
            "source": "Narayanan et al., Efficient Large-Scale Language Model Training on GPU "
                      "Clusters Using Megatron-LM, SC'21 (bubble); Megatron-LM schedules.py "
                      "warm-up depth (peak)",
            "exact_when": "equal stage times and no communication; any F:B ratio and any "
                          "group_size Megatron accepts"}


@register_formula("looped-bfs")
def _looped_bfs(params, costs):
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


def _zero_bubble_handcrafted(params, costs, factor):
    p, m = params["devices"], params["microbatches"]
    peak = [min(m, factor * (p - 1) + 1)] * p
    times = _uniform_times(costs)
    if times is None:
        return {"bubble_ratio": None, "peak_activation": peak,
                "note": "the closed form needs one F, I, W time for every stage and one "
                        "communication time"}
    forward, input_grad, weight_grad, comm = times
    if factor == 1:
        bubble_time = (p - 1) * (forward + input_grad - weight_grad)
    else:
        bubble_time = (p - 1) * (forward + input_grad - 2 * weight_grad + 2 * comm)
    bubble_time = max(bubble_time, 0.0)
    work = m * (forward + input_grad + weight_grad)
    return {"bubble_ratio": bubble_time / (work + bubble_time) if work + bubble_time else 0.0,
            "bubble_time": bubble_time, "peak_activation": peak}


@register_formula("zb-h1")
def _zb_h1(params, costs):
    """ZB-H1 (Qi et al., Zero Bubble Pipeline Parallelism, ICLR 2024).

    Bubble time ``(p-1)(T_F + T_B - T_W)`` per device (``T_B`` is our ``I``),
    asserted in the authors' ``efficiency.py`` with no communication; the ratio
    is ``bubble / (bubble + N(T_F+T_B+T_W))``. Peak: counted from the authors'
    order (we did not check the paper's memory table): every device runs ``p``
    forwards before its first ``W``, so it holds ``min(N, p)``, 1F1B's maximum.
    """
    numbers = _zero_bubble_handcrafted(params, costs, 1)
    return {**numbers,
            "activation_unit": "stage activations of one microbatch",
            "source": "Qi et al., Zero Bubble Pipeline Parallelism, ICLR 2024; bubble "
                      "asserted in sail-sg/zero-bubble-pipeline-parallelism efficiency.py; "
                      "peak counted from that order",
            "exact_when": "M >= 2p, equal stage times, no communication and W <= F, W <= I "
                          "(all devices starting together); otherwise a lower bound"}


@register_formula("zb-h2")
def _zb_h2(params, costs):
    """ZB-H2 (Qi et al., Zero Bubble Pipeline Parallelism, ICLR 2024).

    Bubble time ``(p-1)(T_F + T_B - 2T_W + 2 comm)``, asserted in the authors'
    ``efficiency.py``, measured on each device from its own first forward: it
    assumes the next iteration starts before this one ends (optimizer
    post-validation). A table whose devices all start at 0 adds the start/end
    skew, so there the formula is a lower bound. Peak: counted from the
    authors' order (the paper's memory table not checked): ``min(N, 2p-1)`` on
    every device.
    """
    numbers = _zero_bubble_handcrafted(params, costs, 2)
    return {**numbers,
            "activation_unit": "stage activations of one microbatch",
            "source": "Qi et al., Zero Bubble Pipeline Parallelism, ICLR 2024; bubble "
                      "asserted in sail-sg/zero-bubble-pipeline-parallelism efficiency.py; "
                      "peak counted from that order",
            "exact_when": "per device from its own first op, M >= 2p, equal stage times and "
                          "W <= F, W <= I; the table (all devices start at 0) adds the p-1 "
                          "start/end skew"}


@register_formula("zbv")
def _zbv(params, costs):
    """ZB-V (Qi et al., Zero Bubble Pipeline Parallelism, ICLR 2024; the authors' README).

    Zero bubble when ``T_F = T_B = T_W``, apart from the ``p-1`` start/end skew
    of a table whose devices start together; no closed form otherwise (the
    authors use a greedy scheduler then). Activation memory as 1F1B: ``p``
    whole-device activations (two chunks each) on every device.
    """
    p, m = params["devices"], params["microbatches"]
    times = _uniform_times(costs)
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


@register_formula("v-half")
def _v_half(params, costs):
    """V-Half (Qi et al., NeurIPS 2024): peak ``(p+2)//2`` device activations; bubble ~ p/(2M)."""
    p, m = params["devices"], params["microbatches"]
    return _controllable_memory(params, (p + 2) // 2, p / (2 * m), "about p/(2M)")


@register_formula("v-min")
def _v_min(params, costs):
    """V-Min (Qi et al., NeurIPS 2024): peak ``(p+4)//3`` device activations; bubble ~ 2p/(3M)."""
    p, m = params["devices"], params["microbatches"]
    return _controllable_memory(params, (p + 4) // 3, 2 * p / (3 * m), "about 2p/(3M)")
