"""Preset files: TOML in ``tabsched/costs/presets/``, one preset per file, or a user's file.

A preset file holds the keys of one model or one system at its top level, plus
``kind = "model"`` or ``kind = "system"`` and an optional ``description``. A
user's file has the same keys (``kind`` may be left out). Every problem with a
file is one line that names the file and the key.
"""

import difflib
import functools
import os
from importlib import resources

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser as a package (tomllib's origin)
    import tomli as tomllib

from tabsched.exceptions import InvalidParameterError, UnknownNameError

KINDS = ("model", "system")


def _preset_dir():
    return resources.files("tabsched.costs").joinpath("presets")


@functools.lru_cache(maxsize=None)
def preset_index():
    """``{kind: {name: text}}`` of the presets shipped with tabsched, sorted by name."""
    index = {kind: {} for kind in KINDS}
    entries = sorted((entry for entry in _preset_dir().iterdir()
                      if entry.name.endswith(".toml")), key=lambda entry: entry.name)
    for entry in entries:
        text = entry.read_text(encoding="utf-8")
        kind = tomllib.loads(text).get("kind")
        if kind not in KINDS:  # pragma: no cover - guarded by tests/test_presets.py
            raise InvalidParameterError(f"preset {entry.name}: kind must be 'model' or "
                                        f"'system', not {kind!r}")
        index[kind][entry.name[:-len(".toml")]] = text
    return index


def is_file_reference(reference):
    """True if ``reference`` names a file rather than a preset."""
    reference = os.fspath(reference)
    return reference.lower().endswith(".toml") or os.sep in reference or os.path.exists(reference)


def load(reference, kind):
    """``(data, source)`` for a preset name or a TOML file of ``kind``.

    Raises
    ------
    UnknownNameError
        For a name that is neither a preset of ``kind`` nor a file; the message
        lists the valid names.
    InvalidParameterError
        For a file that is not valid TOML or holds another kind.
    OSError
        For a file that cannot be read.
    """
    reference = os.fspath(reference)
    presets = preset_index()[kind]
    if not is_file_reference(reference):
        if reference not in presets:
            close = difflib.get_close_matches(reference, list(presets), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise UnknownNameError(f"unknown {kind} preset {reference!r}{hint}; valid {kind}s: "
                                   f"{', '.join(presets)} (or a .toml file)")
        return tomllib.loads(presets[reference]), reference
    with open(reference, "rb") as stream:
        raw = stream.read()
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise InvalidParameterError(f"{reference}: not valid TOML: {error}") from None
    found = data.get("kind", kind)
    if found != kind:
        raise InvalidParameterError(f"{reference}: kind is {found!r}, but a {kind} was expected")
    return data, reference


def check_keys(data, required, optional, source):
    """Raise for the first missing or unknown key of ``data`` (sorted, so messages are stable)."""
    known = set(required) | set(optional) | {"kind", "description"}
    for key in sorted(data):
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise InvalidParameterError(f"{source}: unknown key {key!r}{hint}")
    for key in required:
        if key not in data:
            raise InvalidParameterError(f"{source}: missing key {key!r}")
