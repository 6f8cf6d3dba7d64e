"""File formats: what each holds, the suffixes that name it, and its reader and writer.

A format is one module of this package and one :class:`Format` entry in
:data:`FORMATS`, the registry; ``read_table(path)``, ``write_table(table, path)``
and the command line choose by it (by name, or by a path's suffix) instead of
naming formats one by one, so a new format is an entry here and its own file.

What the formats hold:

* **tables** (:class:`~tabsched.table.ScheduleTable`): ``csv`` (PyTorch's
  compute_only bytes: one row per device, the cells only), ``json`` (the rows and
  the metadata a CSV cannot hold, checked against one schema), ``grid`` (a text
  picture for the terminal, written only) and ``torch-comms`` (PyTorch's
  compute_comms: the SEND/RECV, FSDP and gradient-sync actions its runtime
  executes). The cells of every table file follow one grammar,
  :mod:`tabsched.cells`; the rules a row of any table file obeys are in
  :mod:`tabsched.formats.rows`.
* **profiles** (measured durations per operation): ``kineto``, PyTorch profiler
  traces of a pipeline run, read only.
* **results**: ``perfetto``, the Chrome / Perfetto trace of an evaluated
  iteration, written only.

A format module is imported the first time its reader or writer is asked for,
so that a command that reads no PyTorch file or trace does not pay for them.
Files are untrusted and outputs are precious: every reader raises a
``TabschedError`` with one line naming the file and the place, and every writer
writes through :func:`tabsched.files.atomic_write`.

>>> get_format("json").suffixes
('.json',)
>>> format_for("schedule.CSV").name
'csv'
>>> [f.name for f in formats("table")]
['csv', 'json', 'grid', 'torch-comms']
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tabsched.exceptions import InvalidParameterError, InvalidScheduleError, UnknownNameError

if TYPE_CHECKING:
    from tabsched.table import ScheduleTable

__all__ = ["Format", "FORMATS", "HOLDS", "get_format", "format_for", "find_format", "formats",
           "read_table", "write_table", "TABLE_SUFFIXES", "check_placement", "table_notes"]

#: What a format may hold.
HOLDS = ("table", "profile", "result")


@dataclass(frozen=True)
class Format:
    """One file format of the registry.

    Attributes
    ----------
    name : str
        What the command line calls it (``--format``, ``--to``).
    holds : {"table", "profile", "result"}
    summary : str
        One line: what the file is.
    module : str
        The module of this package that implements it (imported on first use).
    suffixes : tuple of str
        Lower-case suffixes a path of this format ends in; ``()`` for a format
        that is printed only. Where two formats of one kind share a suffix, a
        path names the one listed first in :data:`FORMATS`.
    read, write, loads, dumps : str or None
        The module's functions, by name: ``read(path, **options)``,
        ``write(value, path, **options)``, ``loads(text, source=...)`` and
        ``dumps(value, **options)`` (the file's whole text); None where the
        format has no such direction.
    options : tuple of str
        The keywords ``dumps`` takes (:meth:`dump` passes those of the given ones).
    cells_only : bool
        The file holds a table's cells and not its metadata (microbatch sizes,
        layers per stage, family): ``tabsched.formats.table_csv.csv_loss`` says
        what writing one loses, and its reader takes that metadata as keywords.
    pytorch : {"compute_only", "compute_comms"} or None
        The PyTorch schedule format these bytes are, read by
        :func:`tabsched.formats.pytorch_csv.read_pytorch`.
    """

    name: str
    holds: str
    summary: str
    module: str
    suffixes: tuple = ()
    read: str | None = None
    write: str | None = None
    loads: str | None = None
    dumps: str | None = None
    options: tuple = ()
    cells_only: bool = False
    pytorch: str | None = None

    def _function(self, role: str) -> Callable[..., Any]:
        attribute = getattr(self, role)
        if attribute is None:
            what = {"read": "reader", "write": "writer", "loads": "text reader",
                    "dumps": "text writer"}[role]
            raise InvalidParameterError(f"the {self.name} format has no {what} ({self.summary})")
        module = importlib.import_module(f"tabsched.formats.{self.module}")
        return getattr(module, attribute)

    def reader(self) -> Callable[..., Any]:
        """``read(path, **options)``."""
        return self._function("read")

    def writer(self) -> Callable[..., Any]:
        """``write(value, path, **options)``."""
        return self._function("write")

    def loader(self) -> Callable[..., Any]:
        """``loads(text, source=...)``."""
        return self._function("loads")

    def dumper(self) -> Callable[..., Any]:
        """``dumps(value, **options)``: the file's whole text."""
        return self._function("dumps")

    def dump(self, value: Any, **options: Any) -> str:
        """The text of ``value`` in this format, given those of ``options`` it takes.

        >>> from tabsched import generate
        >>> table = generate("1f1b", devices=2, microbatches=2)
        >>> print(get_format("grid").dump(table, width=80, drop_metadata=True), end="")
        1f1b devices=2 microbatches=2: 2 devices x 6 slots, 2 stages, 2 microbatches
        slot 0                 5
        d0   0F0 0F1 .   0B0 .   0B1
        d1   .   1F0 1B0 1F1 1B1 .
        """
        return self.dumper()(value, **{key: value for key, value in options.items()
                                       if key in self.options})

    def names(self, path: str | os.PathLike[str]) -> bool:
        """Whether ``path`` ends in one of this format's suffixes (case ignored).

        A one-part suffix is the path's extension, as ``os.path.splitext`` finds it
        (a file called ``.csv`` has none); a longer one (``.json.gz``) ends the path.
        """
        from tabsched.files import file_path
        text = file_path(path).lower()
        return any(text.endswith(suffix) if suffix.count(".") > 1
                   else os.path.splitext(text)[1] == suffix for suffix in self.suffixes)


#: The registry, in the order a shared suffix and the command line's choices follow. A new
#: format is one entry here and its module in this package.
FORMATS = (
    Format("csv", "table", "PyTorch's compute_only CSV: one row per device, the cells only",
           "table_csv", (".csv",), read="read_csv", write="write_csv", loads="from_csv",
           dumps="to_csv", options=("drop_metadata",), cells_only=True, pytorch="compute_only"),
    Format("json", "table", "tabsched's table: the rows and their metadata, one schema",
           "table_json", (".json",), read="read_json", write="write_json", loads="from_json",
           dumps="json_text"),
    Format("grid", "table", "a text picture of the table that wraps to the terminal",
           "grid", dumps="grid_text", options=("width",)),
    Format("torch-comms", "table", "PyTorch's compute_comms CSV: the actions its runtime "
           "executes, SEND/RECV included", "pytorch_comms", (".csv",),
           dumps="to_compute_comms", options=("drop_metadata", "max_active_stages"),
           cells_only=True, pytorch="compute_comms"),
    Format("kineto", "profile", "PyTorch profiler traces of a pipeline run (its PP: events)",
           "kineto", (".json", ".json.gz"), read="read_kineto"),
    Format("perfetto", "result", "the Chrome / Perfetto trace of one evaluated iteration",
           "perfetto", (".json",), write="write_trace"),
)


def formats(holds: str | None = None) -> list[Format]:
    """The registered formats, in registry order; only those that hold ``holds`` if given."""
    return [entry for entry in FORMATS if holds is None or entry.holds == holds]


def get_format(name: str) -> Format:
    """The format called ``name``; the error lists the names.

    >>> get_format("xml")
    Traceback (most recent call last):
    ...
    tabsched.exceptions.UnknownNameError: unknown format 'xml'; formats: csv, json, grid, torch-comms, kineto, perfetto
    """
    for entry in FORMATS:
        if entry.name == name:
            return entry
    raise UnknownNameError(f"unknown format {name!r}; formats: "
                           f"{', '.join(entry.name for entry in FORMATS)}")


def find_format(path: str | os.PathLike[str], holds: str = "table",
                role: str = "read") -> Format | None:
    """The first format holding ``holds`` that ``path``'s suffix names and that has the
    function ``role`` (``"read"``, ``"write"``, ``"loads"`` or ``"dumps"``), or None."""
    for entry in FORMATS:
        if entry.holds == holds and getattr(entry, role) is not None and entry.names(path):
            return entry
    return None


def _suffixes(holds: str, role: str) -> tuple:
    return tuple(dict.fromkeys(suffix for entry in FORMATS if entry.holds == holds
                               and getattr(entry, role) is not None
                               for suffix in entry.suffixes))


#: The suffixes of the table files tabsched reads (``.csv``, ``.json``).
TABLE_SUFFIXES = _suffixes("table", "read")


def format_for(path: str | os.PathLike[str], holds: str = "table",
               role: str = "read") -> Format:
    """:func:`find_format`, or an ``InvalidScheduleError`` naming the file and the suffixes.

    >>> format_for("plan.txt", role="write")
    Traceback (most recent call last):
    ...
    tabsched.exceptions.InvalidScheduleError: plan.txt: unknown table format '.txt'; expected one of .csv, .json
    """
    found = find_format(path, holds, role)
    if found is None:
        suffix = os.path.splitext(os.fspath(path))[1].lower()
        raise InvalidScheduleError(f"{path}: unknown {holds} format {suffix or '(no suffix)'!r}; "
                                   f"expected one of {', '.join(_suffixes(holds, role))}")
    return found


def read_table(path: str | os.PathLike[str], **options: Any) -> ScheduleTable:
    """Read a table file, in the format its suffix names: ``.csv`` (PyTorch's compute_only)
    or ``.json``.

    ``options`` are the metadata a file of cells only cannot hold (``num_microbatches``,
    ``microbatch_sizes``, ...: :class:`~tabsched.table.ScheduleTable`'s keywords); a file
    that holds its metadata ignores them.
    """
    chosen = format_for(path)
    table = chosen.reader()(path, **options) if chosen.cells_only else chosen.reader()(path)
    check_placement(table, path)
    return table


def check_placement(table, where):
    """Refuse a table read from ``where`` that runs a stage on two or more devices unless it
    is tagged with a family that does (Chimera, BitPipe, DualPipe: their replicas, each
    microbatch on one): torch.distributed.pipelining places each stage on one rank, and
    an untagged table that does so is more often a typo than a replica.

    >>> from tabsched import ScheduleTable
    >>> table = ScheduleTable([["0F0", "0B0", None, None], [None, None, "0F1", "0B1"]])
    >>> check_placement(table, "t.json")
    Traceback (most recent call last):
    ...
    tabsched.exceptions.InvalidScheduleError: t.json: stage 0 runs on devices 0 and 1; only a table of a replica family (bitpipe, chimera, dualpipe) places a stage on two devices, as torch.distributed.pipelining does not: give each stage one device, or tag the table with its family (a .json holds it; read_table(path, family=...) gives it to a .csv)
    """
    import numpy as np

    from tabsched.exceptions import InvalidScheduleError, UnknownNameError
    from tabsched.schedules import get_family
    from tabsched.schedules._registry import families
    if not len(table):
        return
    pairs = np.unique(np.stack([table.stage, table.device]), axis=1)
    stages, counts = np.unique(pairs[0], return_counts=True)
    shared = stages[counts > 1]
    if not len(shared):
        return
    family = None
    if table.family:
        try:
            family = get_family(table.family)
        except UnknownNameError:
            family = None
    if family is not None and family.replicas:
        return
    stage = int(shared[0])
    devices = pairs[1][pairs[0] == stage].tolist()
    names = ", ".join(item.name for item in families() if item.replicas)
    raise InvalidScheduleError(
        f"{os.fspath(where)}: stage {stage} runs on devices "
        f"{', '.join(map(str, devices[:-1]))} and {devices[-1]}; only a table of a replica "
        f"family ({names}) places a stage on two devices, as torch.distributed.pipelining "
        f"does not: give each stage one device, or tag the table with its family (a .json "
        f"holds it; read_table(path, family=...) gives it to a .csv)")


def table_notes(table):
    """What a reader of a table's result should know about the table itself: a family tag
    tabsched does not know (the table is evaluated as the cells it holds)."""
    from tabsched.exceptions import UnknownNameError
    from tabsched.schedules import get_family
    if not table.family:
        return []
    try:
        get_family(table.family)
    except UnknownNameError:
        return [f"the table says family {table.family[:100]!r}, which tabsched does not know: "
                f"it is evaluated as the cells it holds, and family-level checks (formulas, "
                f"Megatron-LM arguments) do not apply"]
    return []


def write_table(table: ScheduleTable, path: str | os.PathLike[str], *,
                drop_metadata: bool = False) -> None:
    """Write ``table`` in the format the suffix of ``path`` names (``.csv`` or ``.json``),
    atomically.

    A ``.csv`` refuses a table whose metadata it cannot hold unless
    ``drop_metadata`` (see :func:`tabsched.formats.table_csv.csv_loss`); ``.json``
    keeps everything.
    """
    chosen = format_for(path, role="write")
    if chosen.cells_only:
        return chosen.writer()(table, path, drop_metadata=drop_metadata)
    return chosen.writer()(table, path)
