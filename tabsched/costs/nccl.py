"""Measured collective bus bandwidth: a system's tables by collective, tier, ranks and size.

nccl-tests (NVIDIA/nccl-tests, ``doc/PERFORMANCE.md``) reports for each message
size ``S`` (bytes: the all-reduce buffer, the all-gather output, the
reduce-scatter input) a time ``t`` and two bandwidths: ``algbw = S / t`` and the
*bus bandwidth* ``busbw = algbw * factor``, where ``factor`` makes the number
comparable with a link's rate whatever the rank count ``n``:

* all-reduce: ``2(n-1)/n`` (``S`` elements, ``2(n-1)`` operations each, ``n`` links);
* all-gather and reduce-scatter: ``(n-1)/n``.

The table (TOML: the system's array ``[[collective_bandwidth]]``, one entry per table)
    ``collective`` (``all_reduce``, ``all_gather``, ``reduce_scatter``: what
    :mod:`tabsched.costs.collectives` prices), ``tier`` (``node``: the group shares
    a node; ``network``: it crosses nodes; see
    :attr:`tabsched.costs.placement.GroupSpan.tier`), ``ranks`` (the group size it
    was measured at), on the ``network`` tier ``per_node`` (how many of the ranks
    shared each node: 16 ranks as 2 nodes of 8 drive every NIC of a node, 16 ranks
    one per node drive one; inside a node it is ``ranks``), ``source`` (required:
    where the numbers come from) and
    ``busbw = [[bytes, B/s], ...]``, sizes strictly increasing, at least
    :data:`MIN_POINTS` and at most :data:`MAX_POINTS`. Two entries may not share
    ``(collective, tier, ranks, per_node)``.
How a collective is priced
    A collective of ``nbytes`` over a group of ``n`` members on tier ``T`` is
    *covered* when the system has the table ``(collective, T, n, per_node)`` of
    the group's span (:class:`~tabsched.costs.placement.GroupSpan`) and
    ``busbw[0].bytes <= nbytes <= busbw[-1].bytes``. Then its time is
    ``nbytes * factor(n) / busbw(nbytes)``, the inverse of nccl-tests'
    definition: at a table point, the time nccl-tests measured. Between two
    points ``busbw`` is read in log-log space (``log busbw`` linear in ``log
    size``: a power law between neighbours), so a time is monotone between
    points whenever it is at them, and a bandwidth lies between its neighbours'.
    The measured bandwidth is what NCCL reached, protocol and latency included:
    the link's ``*_node_efficiency`` and latency are not applied to it. Every
    collective that is not covered (another collective, tier or group size, a
    size outside the table's range, a system without tables) is priced as
    before, a ring on the tier's link (:func:`tabsched.costs.collectives.ring_time`),
    to the bit; at a table's ends the two rules may disagree, and the price may
    jump there.
What is refused (only what cannot be physical)
    A bandwidth or size that is not finite and > 0, sizes that do not increase,
    an unknown collective or tier. A bandwidth above the link's datasheet rate
    is *not* refused: NCCL drives several NICs and NVLinks at once.

>>> table = CollectiveTables.from_value([{"collective": "all_reduce", "tier": "node",
...     "ranks": 8, "source": "example", "busbw": [[2**20, 20e9], [2**30, 200e9]]}])
>>> gbps = table.bus_bandwidth("all_reduce", "node", 8, [2**20, 2**25, 2**31]) / 1e9
>>> gbps.round(3).tolist()   # at a point; half way in log size: the geometric mean; outside
[20.0, 63.246, nan]
"""

from __future__ import annotations

import math

import numpy as np

from tabsched._untrusted import integer, number, shown_value, text
from tabsched.exceptions import InvalidParameterError

__all__ = ["CollectiveTables", "CollectiveTable", "bus_factor", "TABLE_COLLECTIVES",
           "MIN_POINTS", "MAX_POINTS", "MAX_TABLES", "MAX_RANKS", "SIZE_RANGE", "tables_toml",
           "NcclTestsRun", "read_nccl_tests", "MAX_OUTPUT_BYTES", "MAX_FILES", "PROGRAMS"]

#: The collectives a table may hold: those :mod:`tabsched.costs.collectives` prices.
TABLE_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")
#: The tiers of :data:`tabsched.costs.placement.TIERS`.
TIERS = ("node", "network")
#: Fewest points in a table (one point is a constant bandwidth: a ring says it).
MIN_POINTS = 2
#: Most points in a table: nccl-tests with ``-i`` every MiB up to 4 GiB gives 4,096 rows.
MAX_POINTS = 4096
#: Most tables in a system: 3 collectives x 2 tiers x 10 group sizes, twice over.
MAX_TABLES = 64
#: Largest group measured: 2**20 ranks, past any cluster built.
MAX_RANKS = 2**20
#: A message from 1 B to 1 TiB (nccl-tests sizes are ``size_t``; no GPU holds 1 TiB).
SIZE_RANGE = (1.0, 2.0**40)
#: A bus bandwidth from 1 B/s to 1 PB/s (the system's bandwidth range).
BUSBW_RANGE = (1.0, 1e15)
KEYS = ("collective", "tier", "ranks", "per_node", "source", "busbw")
MAX_SOURCE = 500


def bus_factor(collective, ranks):
    """nccl-tests' bus-bandwidth factor: ``2(n-1)/n`` (all-reduce), ``(n-1)/n`` (others).

    >>> bus_factor("all_reduce", 8), bus_factor("all_gather", 4)
    (1.75, 0.75)
    """
    n = int(ranks)
    return (2.0 if collective == "all_reduce" else 1.0) * (n - 1) / n


class CollectiveTable:
    """One measured table: ``(collective, tier, ranks, per_node)``, sizes and bus
    bandwidths (``per_node`` is ``ranks`` on the node tier)."""

    __slots__ = ("collective", "tier", "ranks", "per_node", "source", "points", "_sizes",
                 "_logs", "_busbw")

    def __init__(self, collective, tier, ranks, per_node, source, points):
        set_ = object.__setattr__
        set_(self, "collective", collective)
        set_(self, "tier", tier)
        set_(self, "ranks", int(ranks))
        set_(self, "per_node", int(per_node))
        set_(self, "source", source)
        set_(self, "points", tuple((float(size), float(busbw)) for size, busbw in points))
        sizes = np.array([size for size, _ in self.points])
        busbw = np.array([value for _, value in self.points])
        for key, array in (("_sizes", sizes), ("_logs", np.log(sizes)), ("_busbw", busbw)):
            array.flags.writeable = False
            set_(self, key, array)

    def __setattr__(self, name, value):
        raise AttributeError(f"CollectiveTable is immutable: cannot set {name}")

    def __reduce__(self):
        """Pickled as its constructor's arguments (worker processes and Dask rebuild it)."""
        return (CollectiveTable, (self.collective, self.tier, self.ranks, self.per_node,
                                  self.source, self.points))

    def key(self):
        return (self.collective, self.tier, self.ranks, self.per_node)

    def _identity(self):
        return (*self.key(), self.source, self.points)

    def __eq__(self, other):
        if not isinstance(other, CollectiveTable):
            return NotImplemented
        return self._identity() == other._identity()

    def __hash__(self):
        return hash(self._identity())

    def __repr__(self):
        return (f"CollectiveTable({self.collective}, {self.tier}, {self.ranks} ranks "
                f"({self.per_node} per node), "
                f"{len(self.points)} points, source={self.source!r})")

    def bus_bandwidth(self, nbytes):
        """Bus bandwidth at ``nbytes`` (array): log-log between points, exact at them, NaN
        outside the table's range."""
        nbytes = np.asarray(nbytes, dtype=np.float64)
        sizes, logs = self._sizes, self._logs
        with np.errstate(divide="ignore", invalid="ignore"):
            x = np.log(nbytes)
            low = np.clip(np.searchsorted(sizes, nbytes, side="right") - 1, 0, len(sizes) - 2)
            fraction = (x - logs[low]) / (logs[low + 1] - logs[low])
            # b_low * (b_high / b_low) ** fraction: exact where both ends are equal
            between = self._busbw[low] * (self._busbw[low + 1] / self._busbw[low]) ** fraction
        at = np.searchsorted(sizes, nbytes, side="left").clip(0, len(sizes) - 1)
        value = np.where(sizes[at] == nbytes, self._busbw[at], between)
        covered = (nbytes >= sizes[0]) & (nbytes <= sizes[-1])
        return np.where(covered, value, np.nan)

    def to_value(self):
        value = {"collective": self.collective, "tier": self.tier, "ranks": self.ranks}
        if self.tier == "network":
            value["per_node"] = self.per_node
        return {**value, "source": self.source,
                "busbw": [list(point) for point in self.points]}


class CollectiveTables:
    """A system's measured tables, by ``(collective, tier, ranks, per_node)``; see the module
    docstring.

    Immutable and hashable (a system holding it stays a memo key).
    """

    __slots__ = ("tables", "_by_key", "_hash")

    def __init__(self, tables):
        object.__setattr__(self, "tables", tuple(sorted(tables, key=CollectiveTable.key)))
        object.__setattr__(self, "_by_key", {table.key(): table for table in self.tables})
        object.__setattr__(self, "_hash", hash(self.tables))

    def __setattr__(self, name, value):
        raise AttributeError(f"CollectiveTables is immutable: cannot set {name}")

    def __reduce__(self):
        return (CollectiveTables, (self.tables,))

    def __eq__(self, other):
        if not isinstance(other, CollectiveTables):
            return NotImplemented
        return self.tables == other.tables

    def __hash__(self):
        return self._hash

    def __repr__(self):
        return f"CollectiveTables({len(self.tables)} tables)"

    def table(self, collective, tier, ranks, per_node=None):
        """The table of ``(collective, tier, ranks, per_node)`` (``per_node`` defaults to
        ``ranks``, a group inside a node), or None."""
        ranks = int(ranks)
        return self._by_key.get((collective, tier, ranks,
                                 ranks if per_node is None else int(per_node)))

    def bus_bandwidth(self, collective, tier, ranks, nbytes, per_node=None):
        """Bus bandwidth at ``nbytes``, NaN where no table covers it."""
        table = self.table(collective, tier, ranks, per_node)
        if table is None:
            return np.full(np.shape(nbytes), np.nan)
        return table.bus_bandwidth(nbytes)

    @classmethod
    def from_value(cls, value, name="collective_bandwidth"):
        """Tables from a TOML array of tables (or a :class:`CollectiveTables`); one line
        naming the key for anything wrong."""
        if isinstance(value, CollectiveTables):
            return value
        if isinstance(value, dict) or not isinstance(value, (list, tuple)):
            raise InvalidParameterError(f"{name} must be an array of tables "
                                        f"([[{name}]] entries with collective, tier, ranks, "
                                        f"source and busbw), not {shown_value(value)}")
        if not value:
            raise InvalidParameterError(f"{name} is empty; leave it out for no tables")
        if len(value) > MAX_TABLES:
            raise InvalidParameterError(f"{name} has {len(value)} tables; at most "
                                        f"{MAX_TABLES} are allowed")
        tables, seen = [], {}
        for index, entry in enumerate(value):
            table = _table(f"{name}[{index}]", entry)
            if table.key() in seen:
                raise InvalidParameterError(
                    f"{name}[{index}]: {table.collective} on tier {table.tier} at "
                    f"{table.ranks} ranks ({table.per_node} per node) is also "
                    f"{name}[{seen[table.key()]}] (give one table per collective, tier and "
                    f"group)")
            seen[table.key()] = index
            tables.append(table)
        return cls(tables)

    def to_value(self):
        return [table.to_value() for table in self.tables]


def _table(where, entry):
    if isinstance(entry, CollectiveTable):
        return entry
    if not isinstance(entry, dict):
        raise InvalidParameterError(f"{where} must be a table with collective, tier, ranks, "
                                    f"source and busbw, not {shown_value(entry)}")
    unknown = sorted(str(key) for key in entry if key not in KEYS)
    if unknown:
        raise InvalidParameterError(f"{where}: unknown key {shown_value(unknown[0])} "
                                    f"(expected {', '.join(KEYS)})")
    for key in KEYS:
        if key not in entry and key != "per_node":
            hint = " (say where the numbers come from)" if key == "source" else ""
            raise InvalidParameterError(f"{where}: missing key {key!r}{hint}")
    collective = entry["collective"]
    if not isinstance(collective, str) or collective not in TABLE_COLLECTIVES:
        raise InvalidParameterError(f"{where}.collective {shown_value(collective)} is not one "
                                    f"of {', '.join(TABLE_COLLECTIVES)}")
    tier = entry["tier"]
    if not isinstance(tier, str) or tier not in TIERS:
        raise InvalidParameterError(f"{where}.tier {shown_value(tier)} is not one of "
                                    f"{', '.join(TIERS)} (inside a node, between nodes)")
    ranks = integer(f"{where}.ranks", entry["ranks"], 2, MAX_RANKS)
    if tier == "node":
        if "per_node" in entry and entry["per_node"] != ranks:
            raise InvalidParameterError(f"{where}.per_node: inside a node every rank shares "
                                        f"it (per_node is ranks, {ranks}), not "
                                        f"{shown_value(entry['per_node'])}")
        per_node = ranks
    else:
        if "per_node" not in entry:
            raise InvalidParameterError(f"{where}: missing key 'per_node' (how many of the "
                                        f"{ranks} ranks share each node)")
        per_node = integer(f"{where}.per_node", entry["per_node"], 1, ranks)
        if ranks % per_node or per_node == ranks:
            raise InvalidParameterError(f"{where}.per_node {per_node} does not spread "
                                        f"{ranks} ranks evenly over two or more nodes")
    source = text(f"{where}.source", entry["source"], MAX_SOURCE)
    if not source.strip():
        raise InvalidParameterError(f"{where}.source is empty (say where the numbers come "
                                    f"from)")
    rows = entry["busbw"]
    if not isinstance(rows, (list, tuple)):
        raise InvalidParameterError(f"{where}.busbw must be an array of [bytes, B/s] rows, "
                                    f"not {shown_value(rows)}")
    if len(rows) > MAX_POINTS:
        raise InvalidParameterError(f"{where}.busbw has {len(rows)} rows; at most "
                                    f"{MAX_POINTS} are allowed")
    if len(rows) < MIN_POINTS:
        raise InvalidParameterError(f"{where}.busbw has {len(rows)} row"
                                    f"{'' if len(rows) == 1 else 's'}; a table needs at least "
                                    f"{MIN_POINTS} (one bandwidth for every size is a link)")
    points = []
    for index, row in enumerate(rows):
        at = f"{where}.busbw[{index}]"
        if not isinstance(row, (list, tuple)) or len(row) != 2:
            raise InvalidParameterError(f"{at} must be a row [bytes, B/s], not "
                                        f"{shown_value(row)}")
        size = number(f"{at} bytes", row[0], *SIZE_RANGE, positive=True)
        busbw = number(f"{at} busbw", row[1], *BUSBW_RANGE, positive=True)
        if points and size <= points[-1][0]:
            raise InvalidParameterError(f"{at}: size {size:g} B does not grow from the row "
                                        f"before ({points[-1][0]:g} B); list the sizes in "
                                        f"increasing order, each once")
        points.append((size, busbw))
    return CollectiveTable(collective, tier, ranks, per_node, source, points)


def tables_toml(tables):
    """``[[collective_bandwidth]]`` TOML entries of ``tables`` (``CollectiveTable`` s)."""
    import json
    lines = []
    for table in tables:
        lines += ["[[collective_bandwidth]]", f'collective = "{table.collective}"',
                  f'tier = "{table.tier}"', f"ranks = {table.ranks}",
                  *([f"per_node = {table.per_node}"] if table.tier == "network" else []),
                  f"source = {json.dumps(table.source, ensure_ascii=False)}",
                  "busbw = [   # [bytes, bus bandwidth in B/s]"]
        lines += [f"  [{_plain(size)}, {busbw!r}]," for size, busbw in table.points]
        lines += ["]", ""]
    return "\n".join(lines)


def _plain(size):
    """A size in bytes as TOML: an integer when it is one."""
    return str(int(size)) if float(size).is_integer() else repr(size)


# ---------------------------------------------------------------- nccl-tests output
#: Bytes of one nccl-tests output read at most: a sweep every MiB to 4 GiB is ~600 kB.
MAX_OUTPUT_BYTES = 2**21
#: Files one import reads at most.
MAX_FILES = 64
#: nccl-tests' programs and the collective each measures (``alltoall_perf`` is read so that
#: it can be named, then refused: tabsched prices no all-to-all yet).
PROGRAMS = {"all_reduce_perf": "all_reduce", "all_gather_perf": "all_gather",
            "reduce_scatter_perf": "reduce_scatter", "alltoall_perf": "all_to_all"}
#: The table's columns as nccl-tests' header names them (``src/util.cu``; versions before
#: 2.10 have no ``root``; ``cputime`` with ``-C 1``).
_COLUMNS = ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong",
            "time", "algbw", "busbw", "#wrong")


class NcclTestsRun:
    """What one nccl-tests output holds: its collective, ranks, hosts and rows.

    ``rows``: ``(line, bytes, busbw in B/s)`` of the out-of-place columns, in file order.
    """

    __slots__ = ("path", "collective", "ranks", "hosts", "version", "rows")

    def __init__(self, path, collective, ranks, hosts, version, rows):
        self.path, self.collective, self.ranks = path, collective, ranks
        self.hosts, self.version, self.rows = hosts, version, rows


def read_nccl_tests(path, *, collective=None):
    """An :class:`NcclTestsRun` from nccl-tests' standard text output (``*_perf`` stdout).

    The collective is the one the file names (``# Collective test starting:``), else
    the program in the file's name (``all_reduce_perf...``), else ``collective``,
    which must agree with the file when both say one. The ranks are the file's
    ``#  Rank N ... device`` lines, the hosts the names they run ``on``. Each row
    keeps the out-of-place size and bus bandwidth; a bus bandwidth printed as
    ``0.00`` (below the print's resolution of 0.01 GB/s) is taken from the row's
    time instead, ``bytes * factor / time``. Every problem is one line naming the
    file and line.
    """
    import os

    path = os.fspath(path)
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_OUTPUT_BYTES + 1)
    except OSError as problem:
        raise InvalidParameterError(f"{path}: cannot read: {problem.strerror or problem}") \
            from None
    if len(raw) > MAX_OUTPUT_BYTES:
        raise InvalidParameterError(f"{path}: larger than {MAX_OUTPUT_BYTES} bytes; one "
                                    f"nccl-tests run of at most {MAX_POINTS} sizes is expected")
    try:
        content = raw.decode("utf-8")
    except UnicodeDecodeError as problem:
        raise InvalidParameterError(f"{path}: byte {problem.start} is not UTF-8 text; "
                                    f"nccl-tests' text output is expected") from None
    lines = content.splitlines()
    program = version = header = None
    ranks, hosts, seen_threads = [], [], False
    rows = []
    for number_, line in enumerate(lines, start=1):
        where = f"{path}: line {number_}"
        if "\x00" in line:
            raise InvalidParameterError(f"{where}: contains a NUL byte; text is expected")
        words = line.split()
        if not words:
            continue
        if words[0].startswith("#"):
            body = line.lstrip("#").split()
            if body[:3] == ["Collective", "test", "starting:"] and len(body) == 4:
                program = body[3]
            elif body[:2] == ["nccl-tests", "version"] and len(body) >= 3:
                version = body[2]
            elif body[:1] == ["nThread"] and "nGpus" in body:
                seen_threads = True
            elif body[:1] == ["Rank"] and "device" in body and "on" in body:
                ranks.append(_rank(where, body))
                hosts.append(body[body.index("on") + 1] if body.index("on") + 1 < len(body)
                             else "")
            elif body[:1] == ["size"]:
                header = _header(where, body)
            continue
        if " NCCL INFO " in line or " NCCL WARN " in line:   # NCCL_DEBUG output
            continue
        if header is None:
            raise InvalidParameterError(
                f"{where}: {shown_value(line.strip())} comes before the table's header "
                f"('# size count type redop root time algbw busbw #wrong ...'): not "
                f"nccl-tests output")
        if len(rows) >= MAX_POINTS:
            raise InvalidParameterError(f"{where}: more than {MAX_POINTS} rows")
        rows.append((number_, *_row(where, words, header)))
    if not seen_threads or header is None:
        missing = "'# nThread ... nGpus ...' line" if not seen_threads else \
            "table header ('# size count type redop root time algbw busbw #wrong ...')"
        raise InvalidParameterError(f"{path}: no {missing}: not nccl-tests' standard text "
                                    f"output (all_reduce_perf, all_gather_perf, "
                                    f"reduce_scatter_perf)")
    if not ranks:
        raise InvalidParameterError(f"{path}: no '#  Rank N ... device' lines: the number of "
                                    f"ranks is unknown")
    if sorted(ranks) != list(range(len(ranks))):
        raise InvalidParameterError(f"{path}: the Rank lines name ranks "
                                    f"{shown_value(sorted(ranks))}, not 0..{len(ranks) - 1} "
                                    f"once each")
    if len(ranks) < 2:
        raise InvalidParameterError(f"{path}: one rank: a collective on one GPU moves nothing "
                                    f"(run nccl-tests with -g or several processes)")
    name = _collective(path, program, collective)
    if not rows:
        raise InvalidParameterError(f"{path}: no rows after the table's header")
    factor = bus_factor(name, len(ranks))
    table, seen = [], {}
    for line, size, seconds, busbw in rows:
        if busbw == 0.0:
            busbw = size * factor / seconds
        if not BUSBW_RANGE[0] <= busbw <= BUSBW_RANGE[1]:
            raise InvalidParameterError(f"{path}: line {line}: bus bandwidth {busbw:g} B/s is "
                                        f"outside 1 B/s .. 1 PB/s")
        if size in seen:
            if seen[size][1] != busbw:
                raise InvalidParameterError(
                    f"{path}: line {line}: size {size:g} B is also on line {seen[size][0]} "
                    f"with {seen[size][1] / 1e9:g} GB/s against {busbw / 1e9:g} GB/s here "
                    f"(one run per size)")
            continue
        if table and size < table[-1][1]:
            raise InvalidParameterError(f"{path}: line {line}: size {size:g} B is smaller "
                                        f"than the row before ({table[-1][1]:g} B): sizes "
                                        f"must increase")
        seen[size] = (line, busbw)
        table.append((line, size, busbw))
    return NcclTestsRun(path, name, len(ranks), tuple(hosts), version, table)


def _rank(where, body):
    try:
        return int(body[1])
    except (IndexError, ValueError):
        raise InvalidParameterError(f"{where}: a Rank line without a rank number") from None


def _header(where, body):
    """The positions of the columns tabsched reads, from the header's names."""
    names = [word.lower() for word in body]
    names = ["time" if word == "cputime" else "#wrong" if word == "error" else word
             for word in names]
    if names == list(_COLUMNS):
        return {"size": 0, "time": 5, "busbw": 7, "wrong": (8, 12), "columns": 13}
    if names == [word for word in _COLUMNS if word != "root"]:
        return {"size": 0, "time": 4, "busbw": 6, "wrong": (7, 11), "columns": 12}
    raise InvalidParameterError(f"{where}: table header {shown_value(' '.join(body))} is not "
                                f"nccl-tests' ('size count type redop root time algbw busbw "
                                f"#wrong time algbw busbw #wrong'; per-iteration and "
                                f"timestamp columns are not read)")


def _row(where, words, header):
    """``(bytes, seconds, busbw B/s)`` of one table row (out-of-place)."""
    if len(words) != header["columns"]:
        raise InvalidParameterError(f"{where}: {len(words)} columns where the header has "
                                    f"{header['columns']}: not a row of the table")
    size = words[header["size"]]
    if not (size.isascii() and size.isdigit()) or len(size) > 14:
        raise InvalidParameterError(f"{where}: size {shown_value(size)} is not a whole "
                                    f"number of bytes")
    size = number(f"{where}: size", float(int(size)), *SIZE_RANGE, positive=True)
    time = _value(where, "time", words[header["time"]])
    if time <= 0:
        raise InvalidParameterError(f"{where}: time {words[header['time']]} us must be > 0")
    busbw = _value(where, "busbw", words[header["busbw"]])
    if busbw < 0:
        raise InvalidParameterError(f"{where}: busbw {words[header['busbw']]} GB/s must be "
                                    f">= 0")
    for column in header["wrong"]:
        wrong = words[column]
        if wrong == "N/A":
            continue
        count = _value(where, "#wrong", wrong)
        if count != 0:
            place = "out-of-place" if column == header["wrong"][0] else "in-place"
            raise InvalidParameterError(f"{where}: #wrong is {wrong} ({place}): the "
                                        f"collective gave wrong results, so the measurement "
                                        f"is invalid")
    # us to s and GB/s to B/s by the text, so that 129.74 GB/s is 129740000000.0, not
    # 129.74 * 1e9 = 129740000000.00002
    return size, _scaled(words[header["time"]], time, 6), _scaled(words[header["busbw"]],
                                                                   busbw, -9)


def _scaled(word, value, places):
    """``value`` (read from ``word``) divided by ``10**places``, from the text when it has
    no exponent."""
    if "e" in word.lower():
        return value / 10.0**places
    return float(f"{word}e{-places}")


def _value(where, column, word):
    try:
        value = float(word) if len(word) <= 32 else math.nan
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise InvalidParameterError(f"{where}: {column} {shown_value(word)} is not a finite "
                                    f"number")
    return value


def _collective(path, program, flag):
    """The collective of a run: the file's program, else its name, else the flag."""
    import os

    said = None
    if program is not None:
        if program not in PROGRAMS:
            raise InvalidParameterError(f"{path}: program {shown_value(program)} is not one "
                                        f"of {', '.join(PROGRAMS)}")
        said = PROGRAMS[program]
    else:
        base = os.path.basename(path)
        found = [name for prefix, name in PROGRAMS.items() if prefix[:-5] in base]
        said = found[0] if len(found) == 1 else None
    if flag is not None and said is not None and flag != said:
        raise InvalidParameterError(f"{path}: the file measures {said}, not {flag} (drop "
                                    f"--collective or give the matching file)")
    name = said or flag
    if name is None:
        raise InvalidParameterError(f"{path}: which collective it measures is not in the "
                                    f"file or its name; give --collective")
    if name not in TABLE_COLLECTIVES:
        raise InvalidParameterError(f"{path}: {name} is measured, but tabsched prices no "
                                    f"{name} (only {', '.join(TABLE_COLLECTIVES)})")
    return name
