"""Microbenchmark output into system descriptions: ``tabsched system import``.

A user measures their own cluster in an afternoon and hands tabsched the output;
each kind of output becomes a table of a system TOML, the system it describes
being a base system (a preset or a file) with the table added. One function per
kind, each with its own reader:

``gemm``
    A GEMM sweep CSV (:func:`tabsched.costs.gemm.read_sweep`: columns ``m, n, k,
    seconds``, optionally ``dtype``) becomes the ``[gemm_efficiency]`` table,
    the times kept as measured (``seconds`` rows) so that the file says what was
    measured; the efficiency is derived against the system's ``peak_flops`` when
    it is loaded (:mod:`tabsched.costs.gemm`).
``nccl-tests``
    nccl-tests' text output (:func:`tabsched.costs.nccl.read_nccl_tests`: one
    run of ``all_reduce_perf``, ``all_gather_perf`` or ``reduce_scatter_perf``
    per file) becomes ``[[collective_bandwidth]]`` tables, one per collective,
    tier, rank count and ranks per host; files of the same one are merged by size
    (a size in two files must have one bandwidth). The tier is ``node`` when every
    rank runs on one host, else ``network``, with the ranks per host as
    ``per_node`` (the hosts must hold equally many).

The result is checked by loading it as a system before it is returned, so a
written file always loads.
"""

import math
import os
import re
import tomllib
from collections import Counter

from tabsched._untrusted import shown_value
from tabsched.costs import _presets
from tabsched.costs.gemm import GemmTable, read_sweep, table_toml
from tabsched.costs.nccl import (MAX_FILES, MIN_POINTS, CollectiveTable, read_nccl_tests,
                                 tables_toml)
from tabsched.costs.system import _OPTIONAL, _REQUIRED, System, load_system
from tabsched.exceptions import InvalidParameterError

__all__ = ["gemm_system_toml", "nccl_system_toml", "IMPORT_KINDS"]

#: What ``tabsched system import`` reads (one entry, one function, per kind).
IMPORT_KINDS = ("gemm", "nccl-tests")


def _base_text(reference, key="gemm_efficiency", replaced=None):
    """The TOML text of the base system ``reference`` (a preset name or a file), and what
    of it the import replaces.

    The base's own ``key`` table (``gemm_efficiency``), or its ``collective_bandwidth``
    entries for which ``replaced(entry)`` is true (the same collective, tier, ranks and
    ranks per node as an imported one), are cut out of the text: the import's table takes
    their place, and the rest of the file (its comments included) stays as it is.
    Returns ``(text, cut)``, ``cut`` the number of tables cut. A cut is made on the text's
    table headers and checked by parsing: where the text cannot be cut so that exactly
    those tables go (a table written inline, say), the import is refused, naming the key.
    """
    reference = os.fspath(reference)
    data, source = _presets.load(reference, "system")   # refuses what is not a system
    presets = _presets.preset_index()["system"]
    if not _presets.is_file_reference(reference):
        text = presets[reference]
    else:
        with open(reference, "rb") as stream:   # load() has read it: it is UTF-8 and bounded
            text = stream.read(_presets.MAX_FILE_BYTES).decode("utf-8-sig")
    if key not in data:
        return text, 0
    if replaced is None:
        drop = [True]
        kept = {name: value for name, value in data.items() if name != key}
    else:
        entries = data[key] if isinstance(data[key], list) else []
        drop = [bool(replaced(entry)) for entry in entries]
        kept = dict(data)
        kept[key] = [entry for entry, cut in zip(entries, drop) if not cut]
        if not kept[key]:
            del kept[key]
    if not any(drop):
        return text, 0
    cut_text = _cut_tables(text, key, drop)
    try:
        again = None if cut_text is None else tomllib.loads(cut_text)
    except tomllib.TOMLDecodeError:
        again = None
    if again != kept:
        raise InvalidParameterError(f"{source}: its {key} table cannot be replaced in place "
                                    f"(write it as a [{key}] section, or remove it from the "
                                    f"base system first)")
    return cut_text, sum(drop)


_HEADER = re.compile(r"^\s*(\[\[?)\s*([A-Za-z0-9_.\-\"' ]+?)\s*\]\]?\s*(#.*)?$")


def _cut_tables(text, key, drop):
    """``text`` without the ``[key]`` section (``drop == [True]``) or the ``[[key]]``
    entries whose ``drop`` is true, each with the comment lines just above its header;
    None where the headers do not match ``drop``."""
    lines = text.splitlines(keepends=True)
    heads = [(index, match.group(2).strip()) for index, line in enumerate(lines)
             if (match := _HEADER.match(line))]
    spans, count = [], 0
    for position, (index, name) in enumerate(heads):
        if name != key and not name.startswith(key + "."):
            continue
        if name != key:
            return None   # a sub-table of the key: not cut by header alone
        if count >= len(drop):
            return None
        end = heads[position + 1][0] if position + 1 < len(heads) else len(lines)
        if drop[count]:
            start = index
            while start > 0 and lines[start - 1].lstrip().startswith("#"):
                start -= 1
            spans.append((start, end))
        count += 1
    if count != len(drop):
        return None
    keep = [line for number, line in enumerate(lines)
            if not any(start <= number < end for start, end in spans)]
    return "".join(keep)


def gemm_system_toml(csv_path, source, system=None, dtype=None, fp8=False):
    """The TOML of ``system`` with the GEMM sweep ``csv_path`` added as its table.

    Without ``system``: the ``[gemm_efficiency]`` table alone (no peak is known,
    so a time faster than a peak is found only when a system loads it). ``fp8``: the
    sweep is of FP8 products, the ``[fp8_gemm_efficiency]`` table, held to the system's
    ``fp8_peak_flops``.

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
    key = "fp8_gemm_efficiency" if fp8 else "gemm_efficiency"
    if system is None:
        rows, label = read_sweep(csv_path, dtype=dtype)
        try:   # the table's own checks (its source); no peak is known to hold the times to
            GemmTable.from_value({"source": source, "dtype": label,
                                  "seconds": [list(row) for row in rows]}, math.inf, key)
        except InvalidParameterError as error:
            raise InvalidParameterError(f"{os.fspath(csv_path)}: {error}") from None
        return table_toml(rows, source, label, key)
    base = load_system(system)
    peak_key = "fp8_peak_flops" if fp8 else "peak_flops"
    peak = getattr(base, peak_key)
    if peak is None:
        raise InvalidParameterError(f"--fp8: system {base.name} states no fp8_peak_flops "
                                    f"to hold an FP8 sweep to (add it to the system first)")
    rows, label = read_sweep(csv_path, peak_flops=peak, dtype=dtype, peak_name=peak_key)
    text, cut = _base_text(system, key)
    replaced = " It replaces the base system's table." if cut else ""
    toml = (text.rstrip("\n") + "\n\n"
            f"# Added by tabsched system import gemm from {os.path.basename(csv_path)}: the "
            f"efficiency of each\n# shape is 2*m*n*k / (seconds * {peak_key}).{replaced}\n"
            + table_toml(rows, source, label, key))
    _check_loads(toml, system, os.fspath(csv_path))
    return toml


def _check_loads(toml, system, where):
    """Raise, naming ``where``, unless ``toml`` loads as a system."""
    data = _presets.parse(toml.encode("utf-8"), where, "system")
    _presets.check_keys(data, _REQUIRED, _OPTIONAL, where)
    fields = {key: value for key, value in data.items() if key != "kind"}
    fields.setdefault("name", os.fspath(system))
    try:
        System(**fields)
    except InvalidParameterError as error:
        raise InvalidParameterError(f"{where}: {error}") from None


def _entry_key(entry):
    """``(collective, tier, ranks, per_node)`` of a base system's table as its TOML gives
    it (``per_node`` is ``ranks`` on the node tier), or None for an entry that is not one."""
    if not isinstance(entry, dict):
        return None
    ranks = entry.get("ranks")
    tier = entry.get("tier")
    per_node = entry.get("per_node", ranks if tier == "node" else None)
    return (entry.get("collective"), tier, ranks, per_node)


def nccl_tables(paths, source=None, tier=None, collective=None):
    """``CollectiveTable`` s of nccl-tests outputs ``paths`` (see the module docstring).

    ``tier`` states the tier (it must agree with the hosts the ranks run on);
    ``source`` is every table's source, by default the files' names and nccl-tests
    version.
    """
    paths = [os.fspath(path) for path in paths]
    if not paths:
        raise InvalidParameterError("no nccl-tests output given")
    if len(paths) > MAX_FILES:
        raise InvalidParameterError(f"{len(paths)} files; at most {MAX_FILES} are read at once")
    merged, labels = {}, {}
    for path in paths:
        run = read_nccl_tests(path, collective=collective)
        hosts = len(set(run.hosts))
        found = "node" if hosts == 1 else "network"
        if tier is not None and tier != found:
            raise InvalidParameterError(
                f"{path}: its {run.ranks} ranks run on {hosts} host{'s' if hosts != 1 else ''}, "
                f"so the tier is {found}, not {tier} (--tier)")
        per_host = Counter(run.hosts)
        first, *others = per_host.items()
        uneven = next((other for other in others if other[1] != first[1]), None)
        if uneven is not None:
            raise InvalidParameterError(
                f"{path}: its ranks are spread unevenly over the hosts ({shown_value(first[0])} "
                f"{first[1]}, {shown_value(uneven[0])} {uneven[1]}); tabsched places groups "
                f"evenly over nodes")
        key = (run.collective, found, run.ranks, run.ranks // hosts)
        points = merged.setdefault(key, {})
        for line, size, busbw in run.rows:
            if size in points and points[size][0] != busbw:
                other = points[size]
                raise InvalidParameterError(
                    f"{path}: line {line}: size {size:g} B is also in {other[1]} line "
                    f"{other[2]}, with {other[0] / 1e9:g} GB/s against {busbw / 1e9:g} GB/s "
                    f"here (one bandwidth per size: give one of the runs)")
            points.setdefault(size, (busbw, path, line))
        labels.setdefault(key, []).append(
            os.path.basename(path) + (f" (nccl-tests {run.version})" if run.version else ""))
    tables = []
    for key, points in merged.items():
        if len(points) < MIN_POINTS:
            raise InvalidParameterError(f"{paths[0]}: {key[0]} at {key[2]} ranks has "
                                        f"{len(points)} size; a table needs at least "
                                        f"{MIN_POINTS}")
        said = source or "nccl-tests output " + ", ".join(labels[key])
        tables.append(CollectiveTable(*key, said, sorted((size, value[0]) for size, value
                                                         in points.items())))
    return tables


def nccl_system_toml(paths, source=None, system=None, tier=None, collective=None):
    """The TOML of ``system`` with the nccl-tests outputs ``paths`` added as its
    ``[[collective_bandwidth]]`` tables; without ``system``, the tables alone."""
    from tabsched.costs.nccl import CollectiveTables
    tables = nccl_tables(paths, source, tier, collective)
    where = os.fspath(list(paths)[0])
    try:   # each table's own checks, with the file named
        CollectiveTables.from_value([table.to_value() for table in tables])
    except InvalidParameterError as error:
        raise InvalidParameterError(f"{where}: {error}") from None
    if system is None:
        return tables_toml(tables)
    load_system(system)
    keys = {table.key() for table in tables}
    text, cut = _base_text(system, "collective_bandwidth",
                           lambda entry: _entry_key(entry) in keys)
    names = ", ".join(os.path.basename(os.fspath(path)) for path in paths)
    replaced = (f"\n# They replace {cut} of the base system's tables (the same collective, tier "
                f"and ranks)." if cut else "")
    toml = (text.rstrip("\n") + "\n\n"
            f"# Added by tabsched system import nccl-tests from {names}: the out-of-place "
            f"bus bandwidth\n# of each size (nccl-tests' busbw; time = bytes * factor / "
            f"busbw).{replaced}\n" + tables_toml(tables))
    _check_loads(toml, system, where)
    return toml
