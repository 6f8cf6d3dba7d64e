"""Uneven stages: which transformer layers each stage holds, for every family.

A table's ``stage_layers`` metadata gives the layer count of every stage in
model order. :func:`generate` accepts it three ways:

* ``stage_layers``: one count per stage, as given;
* ``stage_layers_ratio``: relative weights, one per *group* of consecutive
  stages. ``"1:2"`` on 8 stages gives stages 0-3 weight 1 and stages 4-7
  weight 2 -- the asymmetric Chimera placement of the tabular paper, whose
  first-half stages hold half the layers of its second-half stages;
* ``layers``: the model's total layer count. With a ratio the total is split
  in proportion (largest remainders go to the earliest stages, so the counts
  add up exactly); alone it is split as evenly as possible; with explicit
  ``stage_layers`` it must be their sum.

A ratio without ``layers`` keeps the weights themselves as relative layer
counts (``1:2`` on 4 stages gives ``(1, 1, 2, 2)``).

>>> resolve_stage_layers("chimera", 8, ratio="1:2", layers=96)
(8, 8, 8, 8, 16, 16, 16, 16)
>>> resolve_stage_layers("chimera", 8, ratio="1:2", layers=128)
(11, 11, 11, 11, 21, 21, 21, 21)
>>> resolve_stage_layers("chimera", 4, ratio=[1, 2])
(1, 1, 2, 2)
>>> resolve_stage_layers("1f1b", 3, ratio="1:2")
Traceback (most recent call last):
...
tabsched.exceptions.InvalidParameterError: 1f1b: stage_layers_ratio 1:2 has 2 groups, which do not divide the 3 stages evenly; give 1 or 3 weights
"""

from tabsched.exceptions import InvalidParameterError

__all__ = ["resolve_stage_layers", "parse_ratio", "parse_layer_list"]


def _divisors(number):
    return [k for k in range(1, number + 1) if number % k == 0]


def _or_list(numbers):
    """``"1, 2, 4 or 8"``."""
    texts = [str(number) for number in numbers]
    return texts[0] if len(texts) == 1 else ", ".join(texts[:-1]) + " or " + texts[-1]


def _integers(family, name, values, text):
    numbers = []
    for value in values:
        if isinstance(value, bool):
            raise InvalidParameterError(f"{family}: {name} entries must be integers, "
                                        f"not {value!r} (in {text})")
        try:
            number = int(str(value).strip()) if isinstance(value, str) else int(value)
        except (TypeError, ValueError):
            raise InvalidParameterError(f"{family}: {name} entries must be integers, "
                                        f"not {value!r} (in {text})") from None
        if not isinstance(value, str) and number != value:
            raise InvalidParameterError(f"{family}: {name} entries must be integers, "
                                        f"not {value!r} (in {text})")
        numbers.append(number)
    return numbers


def _number_list(family, name, value, separator, what):
    """The integers of ``"1:2"``/``"4,4"`` text or of a sequence (``:`` and ``,`` both split)."""
    if isinstance(value, str):
        text = value
        parts = value.replace(":" if separator == "," else ",", separator).split(separator)
    else:
        try:
            parts = list(value)
        except TypeError:
            raise InvalidParameterError(f"{family}: {name} must be {what}, not {value!r}") \
                from None
        text = separator.join(str(part) for part in parts)
    if not parts or any(str(part).strip() == "" for part in parts):
        raise InvalidParameterError(f"{family}: {name} must be {what}, not {text!r}")
    return _integers(family, name, parts, text), text


def parse_ratio(family, ratio):
    """Weights of ``"1:2"``, ``"1,2"`` or ``[1, 2]``: positive integers."""
    weights, text = _number_list(family, "stage_layers_ratio", ratio, ":",
                                 "weights such as 1:2")
    if any(weight < 1 for weight in weights):
        raise InvalidParameterError(f"{family}: stage_layers_ratio weights must be >= 1, "
                                    f"not {text}")
    return weights


def parse_layer_list(family, stage_layers):
    """Counts of ``"4,4,8,8"`` or a sequence: integers >= 0."""
    counts, text = _number_list(family, "stage_layers", stage_layers, ",",
                                "one layer count per stage")
    if any(count < 0 for count in counts):
        raise InvalidParameterError(f"{family}: stage_layers must not be negative ({text})")
    return counts


def _apportion(total, weights):
    """Split ``total`` in proportion to ``weights`` (largest remainder, ties to the front)."""
    whole = sum(weights)
    counts = [total * weight // whole for weight in weights]
    remainders = [total * weight % whole for weight in weights]
    missing = total - sum(counts)
    for index in sorted(range(len(weights)), key=lambda k: (-remainders[k], k))[:missing]:
        counts[index] += 1
    return counts


def resolve_stage_layers(family, num_stages, *, stage_layers=None, ratio=None, layers=None,
                         scalable=None):
    """Layer count per stage from the three forms above, or ``None`` if none is given.

    ``scalable`` is ``(name, value)`` of the parameter the stage count is
    proportional to (``waves``, ``chunks``), for a hint when layers run short.

    Raises
    ------
    InvalidParameterError
        Naming the family and what would be valid.
    """
    if stage_layers is None and ratio is None and layers is None:
        return None
    if stage_layers is not None and ratio is not None:
        raise InvalidParameterError(f"{family}: give stage_layers or stage_layers_ratio, "
                                    f"not both")
    if layers is not None:
        if isinstance(layers, bool) or not isinstance(layers, int):
            try:
                as_int = int(layers)
            except (TypeError, ValueError, OverflowError):   # OverflowError: int(inf)
                raise InvalidParameterError(f"{family}: layers must be an integer, "
                                            f"not {layers!r}") from None
            if as_int != layers:
                raise InvalidParameterError(f"{family}: layers must be an integer, "
                                            f"not {layers!r}")
            layers = as_int
        if layers < num_stages:
            fewer = "or fewer stages"
            if scalable is not None:
                name, value = scalable
                most = layers // (num_stages // value)
                if most >= 1:
                    fewer = f"or {name} <= {most}"
            raise InvalidParameterError(
                f"{family}: {layers} layers cannot fill the table's {num_stages} stages "
                f"(every stage needs at least one layer); use at least {num_stages} layers "
                f"{fewer}")
    if stage_layers is not None:
        counts = parse_layer_list(family, stage_layers)
        if len(counts) != num_stages:
            raise InvalidParameterError(f"{family}: stage_layers has {len(counts)} entries "
                                        f"but the table has {num_stages} stages")
        if layers is not None and sum(counts) != layers:
            raise InvalidParameterError(f"{family}: stage_layers add up to {sum(counts)}, "
                                        f"not layers={layers}")
        return tuple(counts)
    weights = parse_ratio(family, ratio) if ratio is not None else [1]
    groups = len(weights)
    if num_stages % groups:
        valid = _or_list(_divisors(num_stages))
        text = ":".join(str(weight) for weight in weights)
        raise InvalidParameterError(
            f"{family}: stage_layers_ratio {text} has {groups} groups, which do not divide "
            f"the {num_stages} stages evenly; give {valid} weights")
    per_stage = [weight for weight in weights for _ in range(num_stages // groups)]
    if layers is None:
        return tuple(per_stage)
    return tuple(_apportion(layers, per_stage))
