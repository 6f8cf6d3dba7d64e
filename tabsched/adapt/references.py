"""adapt's references: every schedule a user could run instead, at the same shape.

:func:`tabsched.adapt.adapt` reports its gain not only against the table it
started from but against the best table the user could already run: every
registry family that can be built with the start's devices and microbatches
(and microbatch sizes), each multi-chunk family also at twice its default
chunks (and Hanayo at one more wave) where the model's layers split over the
stages, and every cost-driven family (``zb-auto``, ``zbv-auto``) built for the same costs
and memory budget. A reference whose stages live on two devices (Chimera,
BitPipe, DualPipe) pays the gradient sync of its replicas unless the cost
model says which stages sync. Which references fit the budget, and how fast
they are, the search measures on its own fresh samples; this module only
builds them.

A family that cannot take the shape (Chimera and BitPipe need even devices,
DualPipe at least twice as many microbatches as devices, a model whose layers
do not split over 2p stages...) is reported with the reason; an extra chunk or
wave variant that does not build is left out silently (it is not a family of
its own).

>>> from tabsched import UnitCosts, generate
>>> built, errors = reference_tables(generate("1f1b", devices=4, microbatches=8), UnitCosts(), 6)
>>> sorted(built)[:5]
['1f1b', 'bitpipe', 'chimera', 'dualpipe', 'dualpipev']
>>> built["zb-auto"].params["memory_limit"], "interleaved-1f1b:chunks=4" in built
(6, True)
"""

from tabsched.exceptions import TabschedError
from tabsched.schedules import families, fixed_table, generate

__all__ = ["reference_specs", "reference_tables", "ALL"]

#: ``references="all"``: every family of the registry.
ALL = "all"
#: Extra values tried for a family's size parameter beside its default:
#: chunks doubled (interleaved 1F1B at 2 and 4 chunks per device), one more wave.
_EXTRA_VALUES = {"chunks": lambda default: 2 * default, "waves": lambda default: default + 1}


def reference_specs(names=ALL):
    """``(label, family, params, essential)`` of the references to build.

    ``names`` is ``"all"`` or a sequence of family names (each built at its
    defaults only). ``essential`` is False for the extra chunk/wave variants,
    whose failures are not reported.

    >>> [spec[0] for spec in reference_specs(["1f1b", "zb-h1"])]
    ['1f1b', 'zb-h1']
    """
    if names != ALL:
        return [(str(name), str(name), {}, True) for name in names]
    specs = []
    for family in families():
        specs.append((family.name, family.name, {}, True))
        for parameter in family.parameters:
            extra = _EXTRA_VALUES.get(parameter.name)
            if extra is None or not isinstance(parameter.default, int):
                continue
            value = extra(parameter.default)
            specs.append((f"{family.name}:{parameter.name}={value}", family.name,
                          {parameter.name: value}, False))
    return specs


def reference_tables(table, costs, budget, names=ALL):
    """The references of ``table`` under ``costs`` and the memory ``budget``.

    Parameters
    ----------
    table : ScheduleTable
        The start: its devices, microbatches and microbatch sizes are kept,
        and its layer split for references with as many stages.
    costs : CostModel
        Passed to cost-driven families, which build their order for it.
    budget : float or None
        Per-device memory in the cost model's unit, passed to cost-driven
        families as their ``memory_budget``.
    names : "all" or sequence of str

    Returns
    -------
    (dict, dict)
        ``{label: ScheduleTable}`` of those that build, ``{label: reason}`` of the
        families that do not (extra variants left out).
    """
    from tabsched.schedules import get_family
    built, errors = {}, {}
    for label, name, params, essential in reference_specs(names):
        try:
            family = get_family(name)
            extra = dict(params)
            if family.cost_driven:
                extra["costs"] = costs
                if budget is not None:
                    extra["memory_budget"] = budget
            reference = _generate(family, table, extra)
            if table.microbatch_sizes != reference.microbatch_sizes:
                reference = reference.replace(microbatch_sizes=table.microbatch_sizes)
            reference = _with_replica_sync(reference, costs)
            _check_costs(reference, costs)
        except TabschedError as error:
            if essential:
                errors[label] = str(error)
            continue
        built[label] = reference
    return built, errors


def _generate(family, table, extra):
    """``family`` at the start's devices and microbatches, with its layer split where
    the reference has as many stages.

    A cost-driven family builds its order for the split, so it is built with the
    start's stage layers first (one build, not two: at 64 devices a ``zb-auto`` build
    takes seconds), and without them when it has another number of stages.
    """
    shape = dict(devices=table.num_devices, microbatches=table.num_microbatches, **extra)
    if table.stage_layers is not None and family.cost_driven:
        try:
            reference = generate(family.name, stage_layers=table.stage_layers, **shape)
        except TabschedError:
            reference = None     # another number of stages (or no build: said below)
        if reference is not None and reference.num_stages == table.num_stages:
            return reference
    # a fixed-pattern table depends on the sizes alone: remembered, so that zbv-auto's
    # fixed candidates (V-Half, V-Min: seconds of greedy reordering at 64 devices) and a
    # later adapt on the same shape reuse it
    reference = generate(family.name, **shape) if family.cost_driven else \
        fixed_table(family.name, **shape)
    if table.stage_layers is not None and reference.num_stages == table.num_stages:
        if family.cost_driven:
            # a build with the split failed though the stages agree: say why
            return generate(family.name, stage_layers=table.stage_layers, **shape)
        reference = reference.replace(stage_layers=table.stage_layers)
    return reference


def _with_replica_sync(reference, costs):
    """A table whose stages live on two devices (Chimera, DualPipe) pays their gradient sync.

    The replicas of a stage must agree before the optimizer step, so unless the
    cost model already says which stages sync, the reference syncs its
    replicated stages (as ``compare`` does with ``grad_sync="replicas"``).
    """
    if costs.grad_sync is not None or reference.grad_sync is not None:
        return reference
    replicated = tuple(stage for stage, devices in reference.placement().items()
                       if len(devices) > 1)
    return reference.replace(grad_sync=replicated) if replicated else reference


def _check_costs(reference, costs):
    """Raise the cost model's own error if it cannot price ``reference`` (a layer split)."""
    costs.op_durations(reference)
    costs.activation_sizes(reference)
