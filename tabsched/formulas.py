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
