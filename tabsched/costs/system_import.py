"""Microbenchmark output into system descriptions: ``tabsched system import``.

A user measures their own cluster in an afternoon and hands tabsched the output;
each kind of output becomes a table of a system TOML, the system it describes
being a base system (a preset or a file) with the table added. One function per
kind (``gemm`` now; ``nccl-tests`` is the next, with its own reader):

``gemm``
    A GEMM sweep CSV (:func:`tabsched.costs.gemm.read_sweep`: columns ``m, n, k,
    seconds``, optionally ``dtype``) becomes the ``[gemm_efficiency]`` table,
    the times kept as measured (``seconds`` rows) so that the file says what was
    measured; the efficiency is derived against the system's ``peak_flops`` when
    it is loaded (:mod:`tabsched.costs.gemm`).

The result is checked by loading it as a system before it is returned, so a
written file always loads.
"""

import math
import os

from tabsched.costs import _presets
from tabsched.costs.gemm import GemmTable, read_sweep, table_toml
from tabsched.costs.system import _OPTIONAL, _REQUIRED, System, load_system
from tabsched.exceptions import InvalidParameterError

__all__ = ["gemm_system_toml", "IMPORT_KINDS"]

#: What ``tabsched system import`` reads (one entry, one function, per kind).
IMPORT_KINDS = ("gemm",)


def _base_text(reference):
    """The TOML text of the base system ``reference`` (a preset name or a file)."""
    reference = os.fspath(reference)
    data, source = _presets.load(reference, "system")   # refuses what is not a system
    if "gemm_efficiency" in data:
        raise InvalidParameterError(f"{source}: already has a gemm_efficiency table; remove it "
                                    f"from the base system first (a system holds one)")
    presets = _presets.preset_index()["system"]
    if not _presets.is_file_reference(reference):
        return presets[reference]
    with open(reference, "rb") as stream:   # load() has read it: it is UTF-8 and bounded
        return stream.read(_presets.MAX_FILE_BYTES).decode("utf-8-sig")


def gemm_system_toml(csv_path, source, system=None, dtype=None):
    """The TOML of ``system`` with the GEMM sweep ``csv_path`` added as its table.

    Without ``system``: the ``[gemm_efficiency]`` table alone (no peak is known,
    so a time faster than a peak is found only when a system loads it).

    >>> import pathlib, tempfile
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "sweep.csv").write_text("m,n,k,seconds\\n1024,1024,1024,1e-5\\n"
    ...                                       "2048,2048,2048,5e-5\\n")
    >>> print(gemm_system_toml(folder / "sweep.csv", "my sweep"), end="")
    [gemm_efficiency]
    source = "my sweep"
    seconds = [
      [1024, 1024, 1024, 1e-05],
      [2048, 2048, 2048, 5e-05],
    ]
    """
    if system is None:
        rows, label = read_sweep(csv_path, dtype=dtype)
        try:   # the table's own checks (its source); no peak is known to hold the times to
            GemmTable.from_value({"source": source, "dtype": label,
                                  "seconds": [list(row) for row in rows]}, math.inf)
        except InvalidParameterError as error:
            raise InvalidParameterError(f"{os.fspath(csv_path)}: {error}") from None
        return table_toml(rows, source, label)
    base = load_system(system)
    rows, label = read_sweep(csv_path, peak_flops=base.peak_flops, dtype=dtype)
    text = _base_text(system)
    toml = (text.rstrip("\n") + "\n\n"
            f"# Added by tabsched system import gemm from {os.path.basename(csv_path)}: the "
            f"efficiency of each\n# shape is 2*m*n*k / (seconds * peak_flops).\n"
            + table_toml(rows, source, label))
    data = _presets.parse(toml.encode("utf-8"), os.fspath(csv_path), "system")
    _presets.check_keys(data, _REQUIRED, _OPTIONAL, os.fspath(csv_path))
    fields = {key: value for key, value in data.items() if key != "kind"}
    fields.setdefault("name", os.fspath(system))
    try:
        System(**fields)
    except InvalidParameterError as error:
        raise InvalidParameterError(f"{os.fspath(csv_path)}: {error}") from None
    return toml
