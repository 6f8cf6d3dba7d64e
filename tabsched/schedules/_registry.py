"""The registry of schedule families: ``generate(name, **params)``.

A family is one module in ``tabsched/schedules/`` that calls :func:`register`
with a :class:`Family`; the package imports such a module when its family is
first asked for (:func:`get_family`, :func:`generate`) and all of them when the
families are listed (:func:`families`), so adding a family means adding one file.

Two kinds of family exist. A *fixed pattern* (1F1B, ZB-H1, ...) builds its
table from the sizes alone. A *cost-driven* family (``Family.cost_driven``,
e.g. ``zb-auto``) builds its order from what the operations and transfers
cost: it takes a required ``costs`` parameter (a cost model), so the same
sizes give different tables under different costs. For such a family
:func:`generate` resolves the layer split before building, and passes it to
the generator as ``stage_layers``, because a model's costs depend on it.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tabsched._memo import memo
from tabsched.cells import shown_repr
from tabsched.exceptions import InvalidParameterError, UnknownNameError
from tabsched.schedules._layers import resolve_stage_layers

if TYPE_CHECKING:
    from tabsched.table import ScheduleTable

__all__ = ["Family", "Parameter", "register", "generate", "check_parameters", "fixed_table",
           "families", "get_family", "set_loader"]

_FAMILIES: dict[str, Family] = {}
#: ``load(name)``, set by the package: import the module that registers ``name``
#: (as far as the name tells), or every family module when ``name`` is None.
_loader: list[Callable[[str | None], None]] = []


def set_loader(load):
    """Let the registry import family modules on demand with ``load(name)``."""
    _loader[:] = [load]


def _load(name=None):
    for load in _loader:
        load(name)


@dataclass(frozen=True)
class Parameter:
    """One parameter of a generator: name, default (``None``: required), help.

    ``optional=True`` with ``default=None`` marks a parameter whose default the
    generator derives from the others (e.g. a group size that defaults to the
    number of devices); it is passed as ``None`` when not given.
    """

    name: str
    default: object = None
    help: str = ""
    optional: bool = False

    @property
    def required(self):
        return self.default is None and not self.optional


@dataclass(frozen=True)
class Family:
    """A schedule family.

    ``build(**params)`` returns a valid ScheduleTable whose metadata names the
    family and its parameters; it raises ``InvalidParameterError`` saying what
    would be valid. ``constraints`` states, in one line, which sizes are valid;
    ``notes`` what a user should know (memory, regimes, sources).
    ``chunks_per_device`` is the number of model chunks a device holds when no
    ``chunks`` or ``waves`` parameter says it (Chimera's two replicas count as
    two); it bounds the size of a table before one is built.
    ``cost_driven`` marks a generator whose order depends on the costs: it
    takes the cost model as its ``costs`` parameter and the stage split as
    ``stage_layers`` (see the module docstring).
    ``replicas`` marks a family that runs a stage on two or more devices (Chimera,
    BitPipe and DualPipe keep two copies of the model, each microbatch on one): a table
    read from a file may do so only when tagged with such a family, as
    torch.distributed.pipelining places each stage on one rank.
    ``check(**params)`` raises the ``InvalidParameterError`` that ``build`` would
    raise for the same parameters, without building anything, and returns the
    number of stages the table would have; ``None`` when only building tells
    (:func:`check_parameters` then builds). It lets a search (``tabsched plan``)
    decide from the sizes alone which tables exist.
    """

    name: str
    summary: str
    build: object
    parameters: tuple
    constraints: str = ""
    notes: str = ""
    aliases: tuple = field(default=())
    chunks_per_device: int = 1
    cost_driven: bool = False
    check: object = None
    replicas: bool = False

    def parameter_names(self):
        return [parameter.name for parameter in self.parameters]


def register(family):
    """Add ``family`` to the registry (names are case-insensitive)."""
    for name in (family.name,) + tuple(family.aliases):
        key = name.lower()
        if key in _FAMILIES and _FAMILIES[key] is not family:
            raise ValueError(f"schedule family {name!r} is registered twice")
        _FAMILIES[key] = family
    return family


def families() -> list[Family]:
    """Registered families, sorted by name (aliases left out)."""
    _load()
    unique = {id(family): family for family in _FAMILIES.values()}
    return sorted(unique.values(), key=lambda family: family.name)


def get_family(name):
    """The family called ``name``; the error lists valid names and a close match."""
    key = str(name).lower()
    family = _FAMILIES.get(key)
    if family is None:
        _load(key)          # the module the name points at, if any
        family = _FAMILIES.get(key)
        if family is None:
            _load()         # else every module
            family = _FAMILIES.get(key)
    if family is None:
        names = [family.name for family in families()]
        close = difflib.get_close_matches(str(name).lower(), list(_FAMILIES), n=1)
        hint = f" (did you mean {_FAMILIES[close[0]].name!r}?)" if close else ""
        raise UnknownNameError(f"unknown schedule family {name!r}{hint}; valid families: "
                               f"{', '.join(names)}")
    return family


def _integer(family, name, value, minimum=1):
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            as_int = int(value)
        except (TypeError, ValueError, OverflowError):   # OverflowError: int(inf)
            raise InvalidParameterError(f"{family}: {name} must be an integer, "
                                        f"not {shown_repr(value)}") from None
        if as_int != value:
            raise InvalidParameterError(f"{family}: {name} must be an integer, "
                                        f"not {shown_repr(value)}")
        value = as_int
    if value < minimum:
        raise InvalidParameterError(f"{family}: {name} must be >= {minimum}, not {value}")
    return value


INTEGER_PARAMETERS = {"devices": 1, "microbatches": 1, "chunks": 1, "waves": 1,
                      "group_size": 1, "pipelines": 1}


def generate(name: str, **params: Any) -> ScheduleTable:
    """Generate the table of family ``name``.

    Parameters not given take the family's defaults; ``None`` values count as
    not given. Every family also accepts the layer split of its stages, stored
    in the table's metadata (see ``tabsched.schedules._layers``):
    ``stage_layers`` (one layer count per stage), ``stage_layers_ratio``
    (weights per group of consecutive stages, e.g. ``"1:2"``) and ``layers``
    (the model's total layer count).

    >>> table = generate("1f1b", devices=4, microbatches=8)
    >>> table.family, table.params
    ('1f1b', {'devices': 4, 'microbatches': 8})
    >>> generate("lf1b", devices=4, microbatches=8)
    Traceback (most recent call last):
    ...
    tabsched.exceptions.UnknownNameError: unknown schedule family 'lf1b' (did you mean '1f1b'?); valid families: ...
    """
    family, values, layout = _resolved(name, params)
    stage_layers, stage_layers_ratio, layers, scalable = layout
    if family.cost_driven:
        stages = values["devices"] * (values.get("chunks") or family.chunks_per_device)
        values["stage_layers"] = resolve_stage_layers(
            family.name, stages, stage_layers=stage_layers, ratio=stage_layers_ratio,
            layers=layers, scalable=scalable)
    table = family.build(**values)
    split = resolve_stage_layers(family.name, table.num_stages, stage_layers=stage_layers,
                                 ratio=stage_layers_ratio, layers=layers, scalable=scalable)
    if split is not None:
        table = table.replace(stage_layers=split)
    return table


@memo(limit=128)
def _remembered(name, params):
    return generate(name, **dict(params))


def fixed_table(name: str, **params: Any) -> ScheduleTable:
    """:func:`generate` for a fixed-pattern family, remembered for the last few sizes: its
    table depends on the sizes alone, and a search (``tabsched plan``, ``zbv-auto``'s fixed
    candidates) asks for the same one again. Parameters must be hashable; a cost-driven
    family is refused (its table depends on the costs).

    >>> from tabsched.schedules import fixed_table
    >>> fixed_table("1f1b", devices=4, microbatches=8) is fixed_table("1f1b", devices=4,
    ...                                                               microbatches=8)
    True
    """
    family = get_family(name)
    if family.cost_driven:
        raise InvalidParameterError(f"{family.name} is built from costs: generate it, its "
                                    f"table is not the same for every cost model")
    return _remembered(family.name, tuple(sorted(params.items())))


def check_parameters(name: str, **params: Any) -> int:
    """Raise where :func:`generate` would raise for these parameters, without building
    the table when the family can tell (``Family.check``); return its stage count.

    The same resolution as :func:`generate`: defaults, integer parameters, the size
    bound and the layer split (``stage_layers``, ``stage_layers_ratio``, ``layers``)
    against the table's stages. A family without a ``check`` (the cost-driven ones,
    whose validity depends on the costs) is built.

    >>> from tabsched.schedules import check_parameters
    >>> check_parameters("interleaved-1f1b", devices=4, microbatches=8, chunks=2)
    8
    >>> check_parameters("interleaved-1f1b", devices=4, microbatches=2, chunks=2)
    Traceback (most recent call last):
    ...
    tabsched.exceptions.InvalidParameterError: interleaved-1f1b: microbatches must be >= devices (2 < 4), since group_size must lie in [devices, microbatches]
    >>> check_parameters("1f1b", devices=4, microbatches=8, layers=3)
    Traceback (most recent call last):
    ...
    tabsched.exceptions.InvalidParameterError: 1f1b: 3 layers cannot fill the table's 4 stages (every stage needs at least one layer); use at least 4 layers or fewer stages
    """
    family, values, layout = _resolved(name, params)
    if family.check is None:
        return generate(name, **params).num_stages
    stage_layers, stage_layers_ratio, layers, scalable = layout
    stages = int(family.check(**values))
    resolve_stage_layers(family.name, stages, stage_layers=stage_layers,
                         ratio=stage_layers_ratio, layers=layers, scalable=scalable)
    return stages


def _resolved(name, params):
    """``(family, values, (stage_layers, ratio, layers, scalable))``: the family, the
    generator's parameters (defaults filled, integers checked, the size bounded) and
    the layer split as given."""
    family = get_family(name)
    params = {key: value for key, value in params.items() if value is not None}
    stage_layers = params.pop("stage_layers", None)
    stage_layers_ratio = params.pop("stage_layers_ratio", None)
    layers = params.pop("layers", None)
    known = family.parameter_names()
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise InvalidParameterError(
            f"{family.name} does not take {', '.join(unknown)}; its parameters are "
            f"{', '.join(known)}")
    values = {}
    for parameter in family.parameters:
        if parameter.name in params:
            value = params[parameter.name]
        elif parameter.required:
            raise InvalidParameterError(f"{family.name} needs {parameter.name} "
                                        f"({parameter.help})")
        else:
            value = parameter.default
        if parameter.name in INTEGER_PARAMETERS and value is not None:
            value = _integer(family.name, parameter.name, value,
                             INTEGER_PARAMETERS[parameter.name])
        values[parameter.name] = value
    _check_size(family, values)
    scalable = next(((name, values[name]) for name in ("waves", "chunks") if name in values),
                    None)
    return family, values, (stage_layers, stage_layers_ratio, layers, scalable)


#: Largest table generate() builds: int32 node and edge ids (edges are about 3.5
#: per operation) and about 100 bytes per operation to evaluate it.
MAX_OPS = 2 ** 28


def _magnitude(count):
    """``count`` as ``1.2e+31``, also past a float's range (``10^400``).

    >>> _magnitude(12 * 10**30), _magnitude(10**400)
    ('1.2e+31', '10^400')
    """
    if count < 10**300:
        return f"{count:.2g}"
    return f"10^{int(count.bit_length() * 0.30103)}"


def _check_size(family, values):
    """Refuse, before building it, a table too large to lower or to hold in memory."""
    chunks = values.get("chunks") or (2 * values["waves"] if values.get("waves") else None)
    per_device = chunks or family.chunks_per_device
    estimate = values["devices"] * values["microbatches"] * per_device * 3
    if estimate > MAX_OPS:
        sizes = ", ".join(f"{name}={values[name]}" for name in ("devices", "microbatches",
                                                                "chunks", "waves")
                          if values.get(name) is not None)
        raise InvalidParameterError(
            f"{family.name} at {sizes} would have up to {_magnitude(estimate)} operations; "
            f"tabsched builds tables of up to {MAX_OPS:.2g} (int32 ids, about 100 bytes per "
            f"operation to evaluate)")


def describe_parameters(family):
    """``name=default`` text of a family's parameters, for listings.

    An optional parameter whose default the generator derives shows as ``[name]``.
    """
    parts = []
    for parameter in family.parameters:
        if parameter.required:
            parts.append(parameter.name)
        elif parameter.default is None:
            parts.append(f"[{parameter.name}]")
        else:
            parts.append(f"{parameter.name}={parameter.default}")
    return ", ".join(parts)

