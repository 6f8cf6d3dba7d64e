"""Compare schedule families at the three levels, and rank them within each.

The point of tabsched is that rankings change between levels: the formula a
paper states, the idealized table (slots of a length per kind, no
communication) and the communication-aware simulation. :func:`compare` generates
each family's table at one size, measures it at every level, ranks the families
within each level and marks where the rankings disagree. At the simulation level
a family whose devices go over their memory (the system's ``memory_capacity``)
ranks after every family that fits, whatever its time: it cannot run as
simulated. A cost-driven family (``zb-auto``) is built twice: for the
simulation's costs at the simulation level, for unit costs at the table level.

A family is named by a *spec*: ``name`` or ``name:key=value,key=value`` with the
family's parameters, e.g. ``hanayo:waves=2`` or ``chimera:stage_layers_ratio=1:2``
(the asymmetric Chimera placement). A ratio without ``layers`` takes the model's.

>>> rows = compare(["gpipe", "1f1b", "chimera"], devices=4, microbatches=8,
...                costs=__import__("tabsched").UnitCosts())
>>> [(row.label, row.ranks["table"]) for row in rows]
[('gpipe', 2), ('1f1b', 2), ('chimera', 1)]
"""

import inspect
from dataclasses import dataclass, field

import numpy as np

from tabsched._memo import memo
from tabsched.costs import ModelCosts, UnitCosts
from tabsched.costs.base import DEFAULT_SLOT_LENGTHS
from tabsched.evaluate import evaluate, table_level
from tabsched.exceptions import InvalidParameterError, TabschedError
from tabsched.execution import Execution
from tabsched.formulas import formula_for
from tabsched.schedules import generate, get_family
from tabsched.table import shown_repr

__all__ = ["FamilySpec", "parse_spec", "compare", "Comparison", "Comparisons", "rank",
           "rank_fitting_first", "model_costs_for", "pipeline_microbatch_size", "slot_lengths",
           "table_level_with", "describe_lengths"]

#: Parameters compare and sweep set for every family (their short CLI flags).
SIZE_PARAMETERS = {"devices": "p", "microbatches": "m"}
DEFAULT_MODEL = "paper-128l"
DEFAULT_SYSTEM = "mid_nw_mid_cp"


@dataclass(frozen=True)
class FamilySpec:
    """A family and the parameters it is compared with; ``label`` names the row."""

    family: str
    params: tuple = ()
    label: str = ""

    def kwargs(self):
        return dict(self.params)


def _value(text):
    text = text.strip()
    try:
        return int(text)
    except ValueError:
        return text


def parse_spec(text):
    """A FamilySpec from ``name`` or ``name:key=value,key=value``.

    >>> parse_spec("hanayo:waves=2")
    FamilySpec(family='hanayo', params=(('waves', 2),), label='hanayo:waves=2')
    >>> parse_spec("chimera:waves")
    Traceback (most recent call last):
    ...
    tabsched.exceptions.InvalidParameterError: family spec 'chimera:waves': expected name:key=value,key=value, e.g. hanayo:waves=2
    """
    if isinstance(text, FamilySpec):
        return text
    shown_text = shown_repr(str(text), 60)
    name, _, rest = str(text).partition(":")
    family = get_family(name.strip()).name
    params = []
    for part in filter(None, (piece.strip() for piece in rest.split(","))):
        key, equals, value = part.partition("=")
        if not equals or not key.strip() or not value.strip():
            raise InvalidParameterError(f"family spec {shown_text}: expected name:key=value,"
                                        f"key=value, e.g. hanayo:waves=2")
        key = key.strip().replace("-", "_")
        if key in SIZE_PARAMETERS:
            raise InvalidParameterError(f"family spec {shown_text}: {key} is set for every "
                                        f"family at once (--{key}, -{SIZE_PARAMETERS[key]}); "
                                        f"drop it from the spec")
        if any(key == earlier for earlier, _ in params):
            raise InvalidParameterError(f"family spec {shown_text}: {key} is given twice")
        params.append((key, _value(value)))
    return FamilySpec(family, tuple(params), str(text).strip())


def slot_lengths(lengths=None):
    """``(F, B, I, W)`` slot lengths of the table level from a tuple, a dict or None
    (:data:`tabsched.costs.base.DEFAULT_SLOT_LENGTHS`: F=1 B=2 I=1 W=1, so I + W = B).

    >>> slot_lengths({"b": 2})
    (1.0, 2.0, 1.0, 1.0)
    """
    if lengths is None:
        return DEFAULT_SLOT_LENGTHS
    if isinstance(lengths, dict):
        unknown = sorted(set(lengths) - set("fbiw"))
        if unknown:
            raise InvalidParameterError(f"slot lengths: unknown kind {unknown[0]!r} (expected "
                                        f"f, b, i, w)")
        lengths = [lengths.get(kind) for kind in "fbiw"]
        lengths = [default if value is None else value
                   for value, default in zip(lengths, DEFAULT_SLOT_LENGTHS)]
    lengths = tuple(lengths)
    if len(lengths) != 4:
        raise InvalidParameterError(f"slot lengths must be four numbers (F, B, I, W), not "
                                    f"{lengths!r}")
    if all(type(value) in (float, int) for value in lengths):   # a sweep asks per task
        return _remembered_lengths(lengths)
    return _checked_lengths(lengths)


def _checked_lengths(lengths):
    """Four slot lengths checked as UnitCosts checks them, as floats."""
    return tuple(UnitCosts(*lengths).lengths.tolist())


_remembered_lengths = memo(limit=64)(_checked_lengths)


def describe_lengths(lengths):
    """``"F=1 B=2 I=1 W=1"``."""
    return " ".join(f"{kind}={value:g}" for kind, value in zip("FBIW", slot_lengths(lengths)))


def table_level_with(table, lengths=None):
    """The table level with slot lengths ``(F, B, I, W)``: idle time / all time, no communication.

    With every length 1 this is :func:`tabsched.evaluate.table_level` (idle
    cells / all cells of the layout, an overlapped cell one slot). Otherwise
    the table runs with those lengths and no communication (``UnitCosts``):
    the table as the papers draw it, e.g. with a backward twice as long as a
    forward. ``slots`` is then the length of the schedule in those units.

    >>> from tabsched.schedules import generate
    >>> chimera = generate("chimera", devices=8, microbatches=16)
    >>> round(table_level_with(chimera, (1, 1, 1, 1))["bubble_ratio"], 4), round(
    ...     table_level_with(chimera)["bubble_ratio"], 4)
    (0.1579, 0.2727)
    """
    lengths = slot_lengths(lengths)
    level = table_level(table)
    if lengths != (1.0, 1.0, 1.0, 1.0):
        result = evaluate(table, UnitCosts(*lengths), contention="none", formula=False)
        level = {"bubble_ratio": result.bubble_ratio, "slots": result.makespan,
                 "cells": level["cells"]}
    return level


def model_costs_for(model, system, microbatches, *, global_batch=None, microbatch_size=None,
                    recompute=None, contention=None, grad_sync="replicas", execution=None,
                    **parallel):
    """ModelCosts for one configuration; ``global_batch`` fixes the microbatch size.

    ``global_batch`` counts the samples of one iteration over all data-parallel
    replicas, as Megatron-LM's ``--global-batch-size`` and torchtitan's global batch
    do (default: the execution's): each of the ``d`` replicas runs ``microbatches``
    microbatches of ``global_batch / (d * microbatches)`` samples, which must be
    whole. It then holds the microbatch size fixed, so ``microbatch_size``, when
    given too, must be that. ``execution`` (an
    :class:`~tabsched.execution.Execution`) is the base the other keywords change;
    its own ``grad_sync``, when set, wins over the default. ``parallel``:
    ``tensor_parallel``, ``sequence_parallel``, ``data_parallel``, ``attention``,
    ``optimizer_sharding``, ``overlap_grad_reduce``, ``blocking_sends`` (see
    :class:`~tabsched.costs.ModelCosts`).

    >>> costs = model_costs_for("gpt3-175b", "dgx-a100", 16, global_batch=64,
    ...                         tensor_parallel=8, data_parallel=2)
    >>> costs.execution.microbatch_size, costs.execution.microbatches
    (2, 16)
    """
    base = Execution() if execution is None else execution
    if base.grad_sync is not None:
        grad_sync = None
    if global_batch is None:
        global_batch = base.global_batch
    if global_batch is not None:
        replicas = parallel.get("data_parallel") or base.data_parallel
        derived = pipeline_microbatch_size(global_batch, replicas, microbatches)
        if microbatch_size is not None and microbatch_size != derived:
            raise InvalidParameterError(
                f"microbatch size {microbatch_size} does not fit global batch "
                f"{global_batch}: {_replicas(replicas)}{microbatches} microbatches of "
                f"{derived} samples hold it")
        microbatch_size = derived
        if global_batch != base.global_batch:
            base = base.replace(global_batch=global_batch, microbatch_size=None)
    return ModelCosts(model, system, base, microbatch_size=microbatch_size,
                      recompute=recompute, contention=contention, grad_sync=grad_sync,
                      **parallel)


def _checked_arguments(specs, costs, global_batch, lengths, parallel, execution):
    """``specs`` as a list, after refusing, naming it, an argument of :func:`compare` of
    the wrong kind (each would raise a bare ``TypeError`` or ``AttributeError`` later)."""
    from tabsched.costs import CostModel
    if isinstance(specs, str):
        specs = [specs]
    elif not isinstance(specs, (list, tuple)):
        raise InvalidParameterError(f"specs must be a list of family specs (text), not "
                                    f"{shown_repr(specs)}")
    if costs is not None and not isinstance(costs, CostModel):
        raise InvalidParameterError(f"costs must be a cost model, not {type(costs).__name__}")
    if execution is not None and not isinstance(execution, Execution):
        raise InvalidParameterError(f"execution must be an Execution, not "
                                    f"{type(execution).__name__}")
    if global_batch is not None and (isinstance(global_batch, bool)
                                     or not isinstance(global_batch, (int, np.integer))):
        raise InvalidParameterError(f"global_batch must be an integer, not "
                                    f"{shown_repr(global_batch)}")
    if lengths is not None and not isinstance(lengths, (dict, list, tuple)):
        raise InvalidParameterError(f"lengths must be four slot lengths (F, B, I, W) or a "
                                    f"dict of them, not {shown_repr(lengths)}")
    if parallel is not None:
        if not isinstance(parallel, dict):
            raise InvalidParameterError(f"parallel must be a dict of ModelCosts keywords, not "
                                        f"{shown_repr(parallel)}")
        known = set(inspect.signature(ModelCosts).parameters) - {"model", "system",
                                                                 "execution"}
        unknown = sorted(str(name) for name in parallel if name not in known)
        if unknown:
            raise InvalidParameterError(f"parallel: {shown_repr(unknown[0])} is not a keyword "
                                        f"of ModelCosts")
    return specs


def pipeline_microbatch_size(global_batch, data_parallel, microbatches):
    """Samples per microbatch when ``data_parallel`` replicas run ``microbatches`` each to
    make ``global_batch`` (Megatron-LM's meaning); one line when they are not whole.

    >>> pipeline_microbatch_size(1536, 8, 192)
    1
    >>> pipeline_microbatch_size(100, 1, 16)
    Traceback (most recent call last):
    ...
    tabsched.exceptions.InvalidParameterError: global batch 100 does not split into 16 microbatches of whole samples
    """
    per_step = data_parallel * microbatches
    if global_batch < 1 or global_batch % per_step:
        raise InvalidParameterError(
            f"global batch {global_batch} does not split into {microbatches} microbatches "
            f"of whole samples" + (f" on each of {data_parallel} data-parallel replicas"
                                   if data_parallel > 1 else ""))
    return global_batch // per_step


def _replicas(data_parallel):
    return f"{data_parallel} data-parallel replicas x " if data_parallel > 1 else ""


@dataclass
class Comparison:
    """One family's numbers at every level (``None`` where a level has none).

    ``formula``: bubble_ratio, peak_activation (per device), exact.
    ``table``: bubble_ratio (idle / all, with the slot lengths), slots, cells.
    ``lengths``: the table level's slot lengths ``{"F", "B", "I", "W"}``.
    ``simulation``: makespan, bubble_ratio (the idle ratio), peak_activation and
    peak_memory (persistent + activations) per device, time_unit, memory_unit,
    memory_capacity (the device's memory, None where the costs know none), fits
    and over_capacity (how far the fullest device goes over it, 0 when it fits),
    throughput (:meth:`tabsched.throughput.Throughput.to_dict`, None under slot
    lengths).
    ``ranks``: 1 = best within each level (ties share a rank); at the simulation
    level every family that fits the device's memory ranks before every one that
    does not (:func:`rank_fitting_first`).
    ``error``: why the family was skipped at this size.
    """

    label: str
    family: str
    params: dict
    formula: dict | None = None
    table: dict | None = None
    simulation: dict | None = None
    ranks: dict = field(default_factory=dict)
    error: str | None = None
    lengths: dict | None = None
    #: The simulation level's execution (every field resolved), as JSON holds it.
    execution: dict | None = None
    #: The model and system the simulation level ran (their names).
    model: str | None = None
    system: str | None = None
    #: The simulation level's :class:`~tabsched.result.Result` (for the HTML report's
    #: Gantt chart; not in ``to_dict``), None for a skipped family.
    result: object = field(default=None, repr=False, compare=False)

    def __repr__(self):
        """One line: the family and its number at each level."""
        if self.error:
            return f"<Comparison {self.label}: skipped ({self.error})>"
        parts = []
        if self.formula and self.formula.get("bubble_ratio") is not None:
            parts.append(f"formula bubble {self.formula['bubble_ratio']:.1%}")
        if self.table:
            parts.append(f"table bubble {self.table['bubble_ratio']:.1%} over "
                         f"{_plain(self.table['slots'])} slots")
        if self.simulation:
            time = _time(self.simulation["makespan"], self.simulation["time_unit"])
            parts.append(f"simulation {time} on {self.model} / {self.system}")
        return f"<Comparison {self.label}: {', '.join(parts)}>"

    @property
    def disagrees(self):
        """True when this family's rank differs between two levels that rank it."""
        values = [value for value in self.ranks.values() if value is not None]
        return len(set(values)) > 1

    def to_dict(self):
        data = {"family": self.family, "label": self.label, "params": self.params,
                "formula": self.formula, "table": self.table, "simulation": self.simulation,
                "ranks": self.ranks, "disagrees": self.disagrees,
                "table_lengths": self.lengths}
        if self.error:
            data["error"] = self.error
        if self.execution is not None:
            data["execution"] = self.execution
        if self.model is not None:
            data["model"], data["system"] = self.model, self.system
        return data


def _plain(value):
    from tabsched.costs.units import format_number
    return format_number(value)


def _time(value, unit):
    from tabsched.costs.units import format_number, format_quantity
    return format_quantity(value, "s") if unit == "s" else f"{format_number(value)} {unit}"


def rank(values):
    """Competition ranks (1 = smallest; ``None`` stays unranked; ties share a rank).

    >>> rank([0.3, None, 0.1, 0.3])
    [2, None, 1, 2]
    """
    present = sorted(value for value in values if value is not None)
    return [None if value is None else 1 + sum(1 for other in present
                                               if other < value - 1e-12 * max(1.0, abs(value)))
            for value in values]


def generate_spec(spec, devices, microbatches, model_layers=None, costs=None):
    """The table of ``spec`` at this size (a ratio without ``layers`` takes the model's).

    A cost-driven family (``zb-auto``) is built for ``costs``; other families
    ignore them.
    """
    params = spec.kwargs()
    if "stage_layers_ratio" in params and "layers" not in params and model_layers:
        params["layers"] = model_layers
    if get_family(spec.family).cost_driven:
        params["costs"] = costs
    return generate(spec.family, devices=devices, microbatches=microbatches, **params)


class Comparisons(list):
    """What :func:`compare` returns: a list of :class:`Comparison`, one per family, that
    also turns into a pandas DataFrame (:func:`tabsched.frames.compare_frame`).

    ``model``, ``system``, ``devices``, ``microbatches`` and ``lengths`` (the table
    level's slot lengths) say what was compared; the repr is one line and a notebook
    shows the ranked table (``_repr_html_``).
    """

    def __init__(self, rows=(), *, model=None, system=None, devices=None, microbatches=None,
                 lengths=None):
        super().__init__(rows)
        self.model, self.system = model, system
        self.devices, self.microbatches, self.lengths = devices, microbatches, lengths

    def _best(self):
        ranked = [row for row in self if not row.error and row.ranks.get("simulation") == 1]
        return ranked[0] if ranked else None

    def __repr__(self):
        size = ("" if self.devices is None else
                f", {self.devices} devices, {self.microbatches} microbatches")
        where = f" on {self.model} / {self.system}" if self.model else ""
        best = self._best()
        shown = (f"; fastest simulated {best.label} "
                 f"{_time(best.simulation['makespan'], best.simulation['time_unit'])}"
                 if best is not None else "")
        skipped = sum(1 for row in self if row.error)
        agree = "" if len([r for r in self if not r.error]) < 2 else (
            "; rankings disagree" if any(row.disagrees for row in self) else
            "; rankings agree")
        return (f"<Comparisons of {len(self)} families{where}{size}{shown}{agree}"
                + (f"; {skipped} skipped" if skipped else "") + ">")

    def _repr_html_(self):
        from tabsched._html import compare_html
        return compare_html(self)

    def to_dataframe(self):
        from tabsched.frames import compare_frame
        return compare_frame(self)

    def to_dicts(self):
        return [row.to_dict() for row in self]


def compare(specs, devices, microbatches, *, model=DEFAULT_MODEL, system=DEFAULT_SYSTEM,
            costs=None, global_batch=None, recompute=None, contention=None,
            grad_sync="replicas", lengths=None, parallel=None, execution=None):
    """Every family of ``specs`` at the three levels, ranked within each level.

    Parameters
    ----------
    specs : sequence of str or FamilySpec
    devices, microbatches : int
    model, system : str or objects
        The simulation level's transformer and system (ignored with ``costs``).
    costs : CostModel, optional
        Use these costs for the simulation level instead of a model on a system.
    global_batch : int, optional
        Fix the samples per iteration over all data-parallel replicas (Megatron-LM's
        ``--global-batch-size``): a microbatch holds ``global_batch / (d x M)``.
    grad_sync : default "replicas"
        Replicated stages (Chimera, BitPipe, DualPipe) pay their gradient sync.
    lengths : (F, B, I, W) or dict, optional
        Slot lengths of the table level (default F=1 B=2 I=1 W=1: I + W = B).
    parallel : dict, optional
        Tensor, sequence and data parallelism of the simulation level (see
        :func:`model_costs_for`).
    execution : Execution, optional
        How the model runs at the simulation level; the keywords above change it.

    Returns
    -------
    Comparisons
        A list of :class:`Comparison`, in the order of ``specs``, with
        ``to_dataframe()``.
    """
    specs = _checked_arguments(specs, costs, global_batch, lengths, parallel, execution)
    specs = [parse_spec(spec) for spec in specs]
    if not specs:
        raise InvalidParameterError("compare needs at least one family")
    lengths = slot_lengths(lengths)
    if costs is None:
        costs = model_costs_for(model, system, microbatches, global_batch=global_batch,
                                recompute=recompute, contention=contention,
                                grad_sync=grad_sync, execution=execution, **(parallel or {}))
        layers = costs.model.layers
    else:
        layers = getattr(getattr(costs, "model", None), "layers", None)
    model_name = getattr(getattr(costs, "model", None), "name", None) or type(costs).__name__
    system_name = getattr(getattr(costs, "system", None), "name", None)
    rows = []
    for spec in specs:
        row = Comparison(spec.label, spec.family, spec.kwargs(),
                         lengths=dict(zip("FBIW", lengths)),
                         execution=costs.execution.to_dict(), model=model_name,
                         system=system_name)
        try:
            table = generate_spec(spec, devices, microbatches, layers, costs)
            # a cost-driven family's table level is its table for the slot lengths
            unit_table = generate_spec(spec, devices, microbatches, layers,
                                       UnitCosts(*lengths)) \
                if get_family(spec.family).cost_driven else table
            result = evaluate(table, costs, grad_sync=grad_sync_for(costs, grad_sync))
        except TabschedError as error:
            row.error = str(error)
            rows.append(row)
            continue
        row.params = dict(table.params)
        row.result = result
        # the formula level beside the table level, at the same slot lengths (as `eval`
        # gives it for that table); the simulation's own costs would give another number
        formula = formula_for(unit_table, UnitCosts(*lengths)) or {}
        row.formula = {"bubble_ratio": formula.get("bubble_ratio"),
                       "peak_activation": formula.get("peak_activation"),
                       "activation_unit": formula.get("activation_unit"),
                       "exact": formula.get("exact")}
        row.table = table_level_with(unit_table, lengths)
        peak = max((d.peak_total_memory for d in result.devices), default=0.0)
        capacity = result.memory_capacity
        row.simulation = {
            "makespan": result.makespan, "bubble_ratio": result.bubble_ratio,
            "peak_activation": [d.peak_memory for d in result.devices],
            "peak_memory": [d.peak_total_memory for d in result.devices],
            "time_unit": result.time_unit, "memory_unit": result.memory_unit,
            "level": result.level, "memory_capacity": capacity, "fits": result.fits,
            "over_capacity": None if capacity is None else max(0.0, peak - capacity),
            "throughput": (None if result.throughput is None
                           else result.throughput.to_dict())}
        rows.append(row)
    levels = {"formula": [r.formula and r.formula["bubble_ratio"] for r in rows],
              "table": [r.table and r.table["bubble_ratio"] for r in rows]}
    for level, values in levels.items():
        for row, position in zip(rows, rank(values)):
            row.ranks[level] = position
    simulated = rank_fitting_first([r.simulation and r.simulation["makespan"] for r in rows],
                                   [bool(r.simulation and r.simulation["fits"]) for r in rows])
    for row, position in zip(rows, simulated):
        row.ranks["simulation"] = position
    return Comparisons(rows, model=model_name, system=system_name, devices=devices,
                       microbatches=microbatches, lengths=dict(zip("FBIW", lengths)))


def rank_fitting_first(values, fits):
    """Competition ranks of ``values`` (1 = smallest), every one that fits before every
    one that does not: a schedule whose devices go over their memory cannot run, so it
    is no better than one that can, however fast it would be. Those that do not fit
    still rank among themselves, after the others (``None`` stays unranked).

    >>> rank_fitting_first([3.0, 1.0, 2.0, None], [True, False, True, True])
    [2, 3, 1, None]
    """
    fitting = rank([value if fit else None for value, fit in zip(values, fits)])
    over = rank([None if fit else value for value, fit in zip(values, fits)])
    ahead = sum(1 for value, fit in zip(values, fits) if fit and value is not None)
    return [first if fit else (None if second is None else ahead + second)
            for first, second, fit in zip(fitting, over, fits)]


def grad_sync_for(costs, grad_sync):
    """The sync a comparison asks for: every stage when the costs overlap a data-parallel
    all-reduce with the backwards (it lives in the sync nodes), else ``grad_sync``."""
    if not isinstance(costs, ModelCosts):
        return None
    if costs.grad_sync == "all":
        return "all"
    own = costs.execution.grad_sync
    return grad_sync if own is None else own


def disagreements(rows):
    """Pairs of levels whose orders of the families differ, with the two orders."""
    found = []
    names = ("formula", "table", "simulation")
    for a_index, a in enumerate(names):
        for b in names[a_index + 1:]:
            both = [row for row in rows if row.ranks.get(a) and row.ranks.get(b)]
            for first_index, first in enumerate(both):
                for second in both[first_index + 1:]:
                    order_a = np.sign(first.ranks[a] - second.ranks[a])
                    order_b = np.sign(first.ranks[b] - second.ranks[b])
                    if order_a * order_b < 0:
                        found.append((a, b, first.label, second.label))
    return found
