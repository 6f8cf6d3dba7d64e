"""Preset files: TOML in ``tabsched/costs/presets/``, one preset per file, or a user's file.

A preset file holds the keys of one model or one system at its top level, plus
``kind = "model"`` or ``kind = "system"`` and an optional ``description``. A
user's file has the same keys (``kind`` may be left out). Every problem with a
file is one line that names the file and the key.

A user's file is untrusted: :mod:`tabsched._untrusted` reads it (size and nesting
bounded before parsing) and holds the one-line checks every value of a model or a
system passes; they are imported here, where the descriptions have always found them.
"""

import difflib
import os
from importlib import resources
from types import MappingProxyType

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser as a package (tomllib's origin)
    import tomli as tomllib  # type: ignore[no-redef,import-not-found]

from tabsched._memo import memo
from tabsched._untrusted import (  # noqa: F401  (the checks the descriptions use)
    MAX_FILE_BYTES, check_keys, integer, nesting_problem, number, parse, shown_value,
    suggestion, text)
from tabsched.exceptions import InvalidParameterError, UnknownNameError

KINDS = ("model", "system")


def _preset_dir():
    return resources.files("tabsched.costs").joinpath("presets")


@memo(limit=1)
def preset_index():
    """``{kind: {name: text}}`` of the presets shipped with tabsched, sorted by name (read
    once, read-only)."""
    index = {kind: {} for kind in KINDS}
    entries = sorted((entry for entry in _preset_dir().iterdir()
                      if entry.name.endswith(".toml")), key=lambda entry: entry.name)
    for entry in entries:
        text = entry.read_text(encoding="utf-8")
        kind = tomllib.loads(text).get("kind")
        if kind not in KINDS:  # pragma: no cover - guarded by tests/test_presets.py
            raise InvalidParameterError(f"preset {entry.name}: kind must be 'model' or "
                                        f"'system', not {shown_value(kind)}")
        index[kind][entry.name[:-len(".toml")]] = text
    return MappingProxyType({kind: MappingProxyType(names) for kind, names in index.items()})


def is_file_reference(reference):
    """True if ``reference`` names a file rather than a preset: it ends in ``.toml``, holds
    a path separator, or is an existing regular file that no preset is called (a folder
    or file named ``dgx-a100`` in the working directory does not hide the preset:
    ``./dgx-a100`` reads the file)."""
    reference = os.fspath(reference)
    if reference.lower().endswith(".toml") or os.sep in reference:
        return True
    if any(reference in names for names in preset_index().values()):
        return False
    return os.path.isfile(reference)


def load(reference, kind):
    """``(data, source)`` for a preset name or a TOML file of ``kind``.

    Raises
    ------
    UnknownNameError
        For a name that is neither a preset of ``kind`` nor a file; the message
        lists the valid names.
    InvalidParameterError
        For a file that is too large, not UTF-8, not valid TOML, nested too
        deeply, or of another kind.
        Also for a reference that is neither a name nor a path.
    OSError
        For a file that cannot be read.
    """
    from tabsched.files import file_path
    reference = file_path(reference, kind, expected=f"a {kind} preset's name or a TOML file's "
                                                    f"path")
    presets = preset_index()[kind]
    if not is_file_reference(reference):
        if reference not in presets:
            close = difflib.get_close_matches(reference[:100], list(presets), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise UnknownNameError(f"unknown {kind} preset {shown_value(reference)}{hint}; "
                                   f"valid {kind}s: {', '.join(presets)} (or a .toml file)")
        return tomllib.loads(presets[reference]), reference
    with open(reference, "rb") as stream:
        raw = stream.read(MAX_FILE_BYTES + 1)
    data = parse(raw, reference, kind)
    found = data.get("kind", kind)
    if found != kind:
        raise InvalidParameterError(f"{reference}: kind is {shown_value(found)}, but a {kind} "
                                    f"was expected")
    return data, reference



def build(cls, reference, kind, required, optional):
    """An instance of ``cls`` from the preset or TOML file ``reference`` of ``kind``.

    The keys are checked against ``required`` and ``optional``; the name defaults
    to the preset's name or the file's path, and an error from ``cls`` is prefixed
    with that source, so every message names the file or preset it came from.
    """
    data, source = load(reference, kind)
    check_keys(data, required, optional, source)
    fields = {key: value for key, value in data.items() if key != "kind"}
    fields.setdefault("name", source)
    try:
        return cls(**fields)
    except InvalidParameterError as error:
        raise InvalidParameterError(f"{source}: {error}") from None
