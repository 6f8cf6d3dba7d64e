"""Measured GEMM efficiency by shape: a system's table over ``(m, n, k)``.

A matrix product ``C[m, n] = A[m, k] @ B[k, n]`` does ``2*m*n*k`` FLOPs. Its
efficiency, the part of the system's ``peak_flops`` it reaches, depends on its
shape and not on its FLOPs alone: at equal FLOPs, measured A100 products differ
by 1.3-1.6x with a small contraction dimension or few output tiles (LLMCompass,
Zhang et al. 2024, ``matmul_A100.csv``; see ``tests/data/a100-llmcompass.toml``).
A :class:`GemmTable` holds measured points ``(m, n, k, efficiency)`` and reads the
efficiency of any shape between them.

The table (TOML, the system's key ``gemm_efficiency``)
    ``source`` (required): where the points come from (a file and commit, a
    paper's table, "my sweep of 2026-12-01 on node 17"). ``points = [[m, n, k,
    efficiency], ...]``, or ``seconds = [[m, n, k, seconds], ...]``, which is
    turned into ``efficiency = 2*m*n*k / (seconds * peak_flops)`` against the
    system's peak. ``dtype`` (optional): a label of the element type the points
    were measured in. A system has one ``peak_flops`` and a model one element
    size today, so a system holds one table, for the dtype its peak describes;
    the label is kept and shown, not matched. ``reach`` (optional, octaves,
    default 1): see the scattered rule below. ``overhead`` (optional, with
    ``seconds`` only; seconds or a text such as ``"27us"``): a fixed time every
    measured call includes beside its kernel (the host's launch, Python and
    synchronize around a wall-clock timing), taken off each time before its
    efficiency is derived, since in training kernels are queued ahead of the GPU
    and the host's time per call hides; a time that is not longer than it is
    refused. ``scale`` (optional, in (0, 1], default 1) with ``scale_source``
    (required with it): a factor on every efficiency, for a table measured in
    conditions the system does not run in (a short burst on one idle GPU,
    where training holds every GPU of a node busy for hours at a lower clock);
    the points and times stay as their source gives them.
What is refused (only what cannot be physically true)
    An efficiency above 1 (a product faster than the peak: the message says by
    how much) or <= 0, a time <= 0 or not finite, a dimension that is not a
    positive integer, the same shape twice with different values, fewer than
    :data:`MIN_POINTS` points, more than :data:`MAX_POINTS` (on a grid) or
    :data:`MAX_SCATTERED_POINTS` (scattered). The efficiency is
    *not* required to grow with any dimension: wave quantization makes it dip
    where the output tiles fill one more wave than the SMs hold (NVIDIA, "Matrix
    Multiplication Background User's Guide", section 3.2).
Reading the table (coordinates ``log2 m, log2 n, log2 k``)
    *Rectilinear grid*, when the points are every combination of their distinct
    ``m``, ``n`` and ``k`` values (at least two of each): trilinear
    interpolation in the log2 coordinates between the 8 surrounding points. A
    shape is covered when each of its dimensions lies within the grid's range.
    *Scattered points* (anything else, e.g. LLMCompass' two one-dimensional
    series): Shepard's inverse-distance weighting with power 2 over every point,
    exact at a point. A shape is covered when its nearest point is within
    ``reach`` octaves (Euclidean distance in the log2 coordinates: 1 is a factor
    of 2 in one dimension). Both rules give a weighted mean of the points, so a
    value never leaves the range of the points it is made of.
    A shape that is not covered is priced as before the table existed: the
    system's ``compute_efficiency`` (a number or a curve over FLOPs), times
    ``half_efficiency_tokens``' and ``matrix_wave``'s factors. A covered shape
    takes the table's value alone: a measured point already holds its size and
    wave effects.
A kernel of several products
    A kernel lists its products (:attr:`tabsched.costs.kernels.Kernel.gemms`;
    attention's batched products once per batch with their batch count). It is
    priced by the table when the table covers every one of them, at
    ``flops / sum(flops_i / e_i)`` (the time of its products in turn; one product:
    its value as it is); else all
    of it as before. Kernels without products (FlashAttention's fused kernel,
    which is no GEMM) are always priced as before.

>>> table = GemmTable.from_value({"source": "example", "points": [
...     [1024, 1024, 1024, 0.5], [4096, 1024, 1024, 0.8]]}, peak_flops=1e15)
>>> table.grid, table.efficiency([1024, 2048, 8192], 1024, 1024).round(3)   # 8192: 1 octave
(False, array([0.5 , 0.65, 0.77]))
>>> table.efficiency(1024, 1024, 4096)   # 2 octaves from the nearest point: not covered
array(nan)
"""

from __future__ import annotations

import math
import os

import numpy as np

from tabsched._untrusted import integer, number, shown_value, text
from tabsched.exceptions import InvalidParameterError

__all__ = ["GemmTable", "MIN_POINTS", "MAX_POINTS", "MAX_SCATTERED_POINTS", "MAX_DIMENSION", "SECONDS_RANGE",
           "REACH_RANGE", "kernel_efficiency", "read_sweep", "table_toml", "MAX_CSV_BYTES"]

#: Fewest points: one point is a constant, which ``compute_efficiency`` already says.
MIN_POINTS = 2
#: Most points: a grid of 21 values per dimension is 9,261 (its lookup does not grow with
#: the points: about 0.1 ms for a layer's kernels at four sizes).
MAX_POINTS = 10_000
#: Most scattered points: their rule weighs every point for every shape, about 2.7 ms for a
#: layer's kernels at four microbatch sizes with 2,048 points (measured on one core).
MAX_SCATTERED_POINTS = 2048
#: Largest dimension: 2**31 - 1, cuBLAS' int32 sizes.
MAX_DIMENSION = 2**31 - 1
#: A measured time from 1 ps to 1 day.
SECONDS_RANGE = (1e-12, 86400.0)
#: The scattered rule's reach in octaves (0 < reach <= 64).
REACH_RANGE = (0.0, 64.0)
#: The keys of the TOML table.
KEYS = ("source", "points", "seconds", "dtype", "reach", "overhead", "scale", "scale_source")
MAX_SOURCE = 500


class GemmTable:
    """Measured efficiencies of matrix products over their shape (module docstring).

    Build it with :meth:`from_value` (checks every value); it is immutable and
    hashable, so the memos that price a system on it stay pure.

    Attributes
    ----------
    points : tuple of (m, n, k, efficiency)
        Sorted by shape, duplicates merged.
    source, dtype : str
    reach : float
    grid : bool
        True when the points form a rectilinear grid (trilinear rule).
    seconds : tuple of (m, n, k, seconds) or None
        The times the points were derived from (a ``seconds`` table), and
        ``peak_flops`` the peak they were divided by: a system with another peak
        derives its efficiencies from the times again.
    """

    __slots__ = ("points", "source", "dtype", "reach", "grid", "seconds", "peak_flops", "_hash",
                 "_axes", "_values", "_coordinates", "overhead", "scale", "scale_source")

    def __init__(self, points, source, dtype="", reach=1.0, seconds=None, peak_flops=None,
                 overhead=0.0, scale=1.0, scale_source=""):
        object.__setattr__(self, "overhead", float(overhead))
        object.__setattr__(self, "scale", float(scale))
        object.__setattr__(self, "scale_source", scale_source)
        object.__setattr__(self, "points", tuple(points))
        object.__setattr__(self, "seconds", None if seconds is None else tuple(seconds))
        object.__setattr__(self, "peak_flops", peak_flops)
        object.__setattr__(self, "source", source)
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "reach", float(reach))
        shapes = np.array([point[:3] for point in self.points], dtype=np.float64)
        values = np.array([point[3] for point in self.points], dtype=np.float64) * self.scale
        logs = np.log2(shapes)
        axes = [np.unique(logs[:, axis]) for axis in range(3)]
        grid = (all(len(axis) >= 2 for axis in axes)
                and len(self.points) == len(axes[0]) * len(axes[1]) * len(axes[2]))
        object.__setattr__(self, "grid", grid)
        if not grid and len(self.points) > MAX_SCATTERED_POINTS:
            raise InvalidParameterError(
                f"{len(self.points)} points are scattered (not every "
                f"combination of their m, n and k values), and a scattered table may hold "
                f"at most {MAX_SCATTERED_POINTS} (a grid {MAX_POINTS}): complete the grid or "
                f"thin the points")
        if grid:   # points sorted by (m, n, k): the values reshape into the grid
            cube = values.reshape(len(axes[0]), len(axes[1]), len(axes[2]))
            object.__setattr__(self, "_axes", tuple(axes))
            object.__setattr__(self, "_values", cube)
        else:
            object.__setattr__(self, "_axes", None)
            object.__setattr__(self, "_values", values)
        object.__setattr__(self, "_coordinates", logs)
        for array in (values, self._values, logs, *axes):   # the grid's cube is a view
            array.flags.writeable = False
        object.__setattr__(self, "_hash", hash((self.points, source, dtype, self.reach,
                                                self.seconds, peak_flops, self.overhead,
                                                self.scale, scale_source)))

    def __setattr__(self, name, value):
        raise AttributeError(f"GemmTable is immutable: cannot set {name}")

    def __reduce__(self):
        """Pickled as its constructor's arguments (worker processes and Dask rebuild it;
        its hash is computed again there, where string hashes differ)."""
        return (GemmTable, (self.points, self.source, self.dtype, self.reach, self.seconds,
                            self.peak_flops, self.overhead, self.scale, self.scale_source))

    def __hash__(self):
        return self._hash   # computed once: a sweep's memos hash the system at every call

    def __eq__(self, other):
        if not isinstance(other, GemmTable):
            return NotImplemented
        return (self._hash == other._hash and self.points == other.points
                and (self.source, self.dtype, self.reach, self.seconds, self.peak_flops,
                     self.overhead, self.scale, self.scale_source)
                == (other.source, other.dtype, other.reach, other.seconds, other.peak_flops,
                    other.overhead, other.scale, other.scale_source))

    def __repr__(self):
        return (f"GemmTable({len(self.points)} points, {'grid' if self.grid else 'scattered'}"
                f", source={self.source!r})")

    # ------------------------------------------------------------ reading
    @classmethod
    def from_value(cls, value, peak_flops, name="gemm_efficiency"):
        """A table from a TOML table (a dict) or a :class:`GemmTable`; one line naming the key
        for anything wrong. ``peak_flops`` turns ``seconds`` into efficiency (a table of
        times made for another peak is derived again for this one)."""
        if isinstance(value, GemmTable):
            if value.seconds is None or value.peak_flops == peak_flops:
                return value
            value = value.to_value()
        if not isinstance(value, dict):
            raise InvalidParameterError(f"{name} must be a table with source and points (or "
                                        f"seconds), not {shown_value(value)}")
        unknown = sorted(str(key) for key in value if key not in KEYS)
        if unknown:
            raise InvalidParameterError(f"{name}: unknown key {shown_value(unknown[0])} "
                                        f"(expected {', '.join(KEYS)})")
        if "source" not in value:
            raise InvalidParameterError(f"{name}: missing key 'source' (say where the points "
                                        f"come from)")
        source = text(f"{name}.source", value["source"], MAX_SOURCE)
        if not source.strip():
            raise InvalidParameterError(f"{name}.source is empty (say where the points come "
                                        f"from)")
        dtype = text(f"{name}.dtype", value.get("dtype", ""), 32)
        reach = number(f"{name}.reach", value.get("reach", 1.0), *REACH_RANGE, positive=True)
        scale = number(f"{name}.scale", value.get("scale", 1.0), 0.0, 1.0, positive=True)
        scale_source = text(f"{name}.scale_source", value.get("scale_source", ""), MAX_SOURCE)
        if "scale" in value and not scale_source.strip():
            raise InvalidParameterError(f"{name}: scale needs scale_source (say why the "
                                        f"measured efficiencies are scaled, and from where)")
        if "scale_source" in value and "scale" not in value:
            raise InvalidParameterError(f"{name}: scale_source without scale")
        given = [key for key in ("points", "seconds") if key in value]
        if len(given) != 1:
            raise InvalidParameterError(f"{name}: give exactly one of points ([m, n, k, "
                                        f"efficiency] rows) and seconds ([m, n, k, seconds] "
                                        f"rows), not {' and '.join(given) or 'neither'}")
        key = given[0]
        overhead = 0.0
        if "overhead" in value:
            if key != "seconds":
                raise InvalidParameterError(f"{name}.overhead goes with seconds rows (a time "
                                            f"taken off each measured time), not with points")
            overhead = number(f"{name}.overhead", value["overhead"], 0.0, SECONDS_RANGE[1],
                              unit="s")
        rows = value[key]
        if not isinstance(rows, (list, tuple)):
            raise InvalidParameterError(f"{name}.{key} must be an array of [m, n, k, "
                                        f"{_last(key)}] rows, not {shown_value(rows)}")
        if len(rows) > MAX_POINTS:
            raise InvalidParameterError(f"{name}.{key} has {len(rows)} rows; at most "
                                        f"{MAX_POINTS} are allowed")
        checked = [_point(f"{name}.{key}[{index}]", row, key, peak_flops, overhead)
                   for index, row in enumerate(rows)]
        merged = _merged([point[:4] for point in checked], f"{name}.{key}")
        seconds = None
        if key == "seconds":
            times = {point[:3]: point[4] for point in checked}
            seconds = [(m, n, k, times[m, n, k]) for m, n, k, _ in merged]
        try:
            return cls(merged, source, dtype, reach, seconds,
                       peak_flops if key == "seconds" else None, overhead, scale, scale_source)
        except InvalidParameterError as error:
            raise InvalidParameterError(f"{name}.{key}: {error}") from None

    def to_value(self):
        """The TOML table that :meth:`from_value` reads back (``seconds`` rows for a table
        of times, else ``points``)."""
        value = {"source": self.source}
        if self.dtype:
            value["dtype"] = self.dtype
        if self.reach != 1.0:
            value["reach"] = self.reach
        if self.overhead:
            value["overhead"] = self.overhead
        if self.scale != 1.0:
            value["scale"] = self.scale
            value["scale_source"] = self.scale_source
        if self.seconds is not None:
            value["seconds"] = [list(row) for row in self.seconds]
        else:
            value["points"] = [list(point) for point in self.points]
        return value

    # ------------------------------------------------------------ lookup
    def efficiency(self, m, n, k):
        """Efficiency of products of shape ``(m, n, k)`` (arrays that broadcast); NaN where
        the table does not cover the shape (module docstring)."""
        m, n, k = np.broadcast_arrays(*(np.asarray(dim, dtype=np.float64) for dim in (m, n, k)))
        shape = m.shape
        with np.errstate(divide="ignore", invalid="ignore"):
            query = np.log2(np.stack([m.ravel(), n.ravel(), k.ravel()], axis=1))
        values = self._grid(query) if self.grid else self._scattered(query)
        return values.reshape(shape)

    def _grid(self, query):
        """Trilinear in log2 on the grid; NaN outside its box."""
        covered = np.ones(len(query), dtype=bool)
        index, fraction = [], []
        for axis, coordinates in enumerate(self._axes):
            x = query[:, axis]
            covered &= (x >= coordinates[0]) & (x <= coordinates[-1])
            low = np.clip(np.searchsorted(coordinates, x, side="right") - 1, 0,
                          len(coordinates) - 2)
            span = coordinates[low + 1] - coordinates[low]
            with np.errstate(invalid="ignore"):
                fraction.append(np.clip((x - coordinates[low]) / span, 0.0, 1.0))
            index.append(low)
        result = np.zeros(len(query))
        for corner in range(8):
            weight = np.ones(len(query))
            at = []
            for axis in range(3):
                upper = (corner >> axis) & 1
                weight = weight * (fraction[axis] if upper else 1.0 - fraction[axis])
                at.append(index[axis] + upper)
            result = result + weight * self._values[at[0], at[1], at[2]]
        return np.where(covered, result, np.nan)

    def _scattered(self, query):
        """Shepard's inverse-distance weighting (power 2) in log2; NaN beyond ``reach``."""
        difference = query[:, None, :] - self._coordinates[None, :, :]
        squared = np.einsum("qpd,qpd->qp", difference, difference)
        nearest = np.argmin(squared, axis=1) if len(query) else np.zeros(0, dtype=np.intp)
        closest = squared[np.arange(len(query)), nearest]
        with np.errstate(divide="ignore", invalid="ignore"):
            weights = 1.0 / squared
            mean = (weights @ self._values) / weights.sum(axis=1)
        result = np.where(closest == 0.0, self._values[nearest], mean)
        return np.where(closest <= self.reach * self.reach, result, np.nan)


def _last(key):
    return "efficiency" if key == "points" else "seconds"


def _point(where, row, key, peak_flops, overhead=0.0):
    """One checked ``(m, n, k, efficiency, seconds)`` from a ``points`` or ``seconds`` row
    (``seconds`` None for a ``points`` row)."""
    if not isinstance(row, (list, tuple)) or len(row) != 4:
        raise InvalidParameterError(f"{where} must be a row [m, n, k, {_last(key)}], not "
                                    f"{shown_value(row)}")
    m, n, k = (integer(f"{where} {label}", dim, 1, MAX_DIMENSION)
               for label, dim in zip("mnk", row[:3]))
    flops = 2.0 * m * n * k
    seconds = None
    if key == "seconds":
        seconds = number(f"{where} seconds", row[3], *SECONDS_RANGE, positive=True)
        if seconds <= overhead:
            raise InvalidParameterError(
                f"{where}: {m}x{n}x{k} took {seconds:g} s, not more than the table's overhead "
                f"{overhead:g} s: the overhead must be less than every measured time")
        efficiency = flops / ((seconds - overhead) * peak_flops)
        if efficiency > 1.0:
            raise InvalidParameterError(
                f"{where}: {m}x{n}x{k} in {seconds:g} s is {flops / seconds:.4g} FLOP/s, "
                f"{efficiency:.3g}x the system's peak_flops {peak_flops:.4g}: a GEMM cannot "
                f"beat the peak (check the time's unit, or the peak)")
    else:
        efficiency = number(f"{where} efficiency", row[3], -math.inf, math.inf)
        if efficiency > 1.0:
            raise InvalidParameterError(
                f"{where}: efficiency {efficiency:g} is {efficiency:.3g}x the peak: a GEMM "
                f"cannot beat the peak (efficiency must be in (0, 1])")
        if efficiency <= 0.0:
            raise InvalidParameterError(f"{where}: efficiency must be in (0, 1], not "
                                        f"{shown_value(row[3])}")
    return (m, n, k, efficiency, seconds)


def _merged(points, where):
    """Points sorted by shape; a shape given twice must have one value."""
    if len(points) < MIN_POINTS:
        raise InvalidParameterError(f"{where} has {len(points)} point"
                                    f"{'' if len(points) == 1 else 's'}; a table needs at "
                                    f"least {MIN_POINTS} (one efficiency for every shape is "
                                    f"compute_efficiency)")
    seen = {}
    for index, (m, n, k, efficiency) in enumerate(points):
        shape = (m, n, k)
        if shape in seen and seen[shape][1] != efficiency:
            raise InvalidParameterError(
                f"{where}[{index}]: shape {m}x{n}x{k} is also row {seen[shape][0]}, with "
                f"efficiency {seen[shape][1]:.6g} against {efficiency:.6g} here (give one "
                f"value per shape, e.g. the median of the runs)")
        seen.setdefault(shape, (index, efficiency))
    merged = sorted((shape + (value,) for shape, (_, value) in seen.items()))
    if len(merged) < MIN_POINTS:
        raise InvalidParameterError(f"{where} has {len(merged)} distinct shape; a table "
                                    f"needs at least {MIN_POINTS}")
    return merged


def kernel_efficiency(table, shapes):
    """Each kernel's table efficiency from its products' shapes, NaN where not covered.

    ``shapes``: an array ``(kernels, slots, 4, sizes)`` of ``m, n, k, batch`` per
    product slot (batch 0: an empty slot; a kernel's products fill its first
    slots), as :meth:`tabsched.costs.kernels.KernelTable.gemm_shapes` gives it. A
    kernel is covered when it has a product and the table covers every one; its
    efficiency is then ``sum(flops_i) / sum(flops_i / e_i)``, and with one product
    that product's value as it is. Only the products are looked up.
    """
    m, n, k, batch = shapes[:, :, 0], shapes[:, :, 1], shapes[:, :, 2], shapes[:, :, 3]
    used = batch > 0
    efficiency = np.full(used.shape, np.nan)
    if used.any():
        efficiency[used] = table.efficiency(m[used], n[used], k[used])
    if shapes.shape[1] == 1:
        return efficiency[:, 0]
    flops = np.where(used, 2.0 * m * n * k * batch, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        # an uncovered product is NaN, and so is the sum it is in
        combined = flops.sum(axis=1) / np.where(used, flops / efficiency, 0.0).sum(axis=1)
    return np.where(used[:, 1:].any(axis=1), combined, efficiency[:, 0])


# ---------------------------------------------------------------- a user's GEMM sweep
#: Bytes of a sweep CSV read at most: 10,000 rows of ``m,n,k,seconds,dtype`` take ~0.5 MB.
MAX_CSV_BYTES = 2**21
#: The columns a sweep CSV must have (its header names them, in any order; others are
#: ignored) and the one it may have.
CSV_COLUMNS = ("m", "n", "k", "seconds")
CSV_DTYPE = "dtype"


def read_sweep(path, *, peak_flops=None, dtype=None, peak_name="peak_flops"):
    """``(rows, dtype)`` of a GEMM sweep CSV: ``[(m, n, k, seconds), ...]`` in file order.

    The file needs a header naming ``m``, ``n``, ``k`` and ``seconds`` (any order,
    any case; other columns are ignored) and may have a ``dtype`` column. A system
    has one ``peak_flops``, so one table holds one dtype: with several in the file,
    ``dtype`` picks one. With ``peak_flops``, a row faster than the peak is refused.
    Every problem is one line naming the file and its line.
    """
    import csv
    import io

    path = os.fspath(path)
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_CSV_BYTES + 1)
    except OSError as problem:
        raise InvalidParameterError(f"{path}: cannot read: {problem.strerror or problem}") \
            from None
    if len(raw) > MAX_CSV_BYTES:
        raise InvalidParameterError(f"{path}: larger than {MAX_CSV_BYTES} bytes; a GEMM sweep "
                                    f"of at most {MAX_POINTS} rows is expected")
    try:
        text_ = raw.decode("utf-8-sig")
    except UnicodeDecodeError as problem:
        raise InvalidParameterError(f"{path}: byte {problem.start} is not UTF-8 text; a CSV "
                                    f"with columns m,n,k,seconds is expected") from None
    if "\x00" in text_:
        line = text_[:text_.index("\x00")].count("\n") + 1
        raise InvalidParameterError(f"{path}: line {line} contains a NUL byte; a CSV is "
                                    f"expected")
    reader = csv.reader(io.StringIO(text_, newline=""), strict=True)
    try:
        header = next(reader, None)
        if header is None:
            raise InvalidParameterError(f"{path}: empty file; expected a header m,n,k,seconds "
                                        f"and one row per measured GEMM")
        names = [cell.strip().lower() for cell in header]
        missing = [column for column in CSV_COLUMNS if column not in names]
        if missing:
            raise InvalidParameterError(f"{path}: line 1: the header has no column "
                                        f"{', '.join(missing)} (expected m,n,k,seconds, "
                                        f"optionally dtype; found {shown_value(','.join(header))})")
        where = {column: names.index(column) for column in (*CSV_COLUMNS, CSV_DTYPE)
                 if column in names}
        rows, labels, seen = [], {}, {}
        for cells in reader:
            line = reader.line_num
            if not any(cell.strip() for cell in cells):
                continue
            if len(rows) >= MAX_POINTS:
                raise InvalidParameterError(f"{path}: line {line}: more than {MAX_POINTS} rows")
            row = _sweep_row(path, line, cells, where)
            labels.setdefault(row[4], line)
            if dtype is None or row[4] == dtype:
                rows.append((line, *row[:4]))
    except csv.Error as problem:
        raise InvalidParameterError(f"{path}: line {reader.line_num}: not CSV: {problem}") \
            from None
    if dtype is None and len(labels) > 1:
        first, second = list(labels)[:2]
        raise InvalidParameterError(
            f"{path}: line {labels[second]}: dtype {shown_value(second)}, but line "
            f"{labels[first]} has {shown_value(first)}: a system has one peak_flops, so a table "
            f"holds one dtype (choose one with --dtype)")
    if dtype is not None and dtype not in labels:
        raise InvalidParameterError(f"{path}: no row has dtype {shown_value(dtype)} (found "
                                    f"{', '.join(map(repr, labels)) or 'none'})")
    if not rows:
        raise InvalidParameterError(f"{path}: no rows after the header; a table needs at "
                                    f"least {MIN_POINTS} measured GEMMs")
    result = []
    for line, m, n, k, seconds in rows:
        shape = (m, n, k)
        if shape in seen and seen[shape][1] != seconds:
            raise InvalidParameterError(
                f"{path}: line {line}: shape {m}x{n}x{k} is also on line {seen[shape][0]}, "
                f"with {seen[shape][1]:g} s against {seconds:g} s here (give one time per "
                f"shape, e.g. the median of the runs)")
        if shape in seen:
            continue
        seen[shape] = (line, seconds)
        if peak_flops is not None:
            achieved = 2.0 * m * n * k / seconds
            if achieved > peak_flops:
                raise InvalidParameterError(
                    f"{path}: line {line}: {m}x{n}x{k} in {seconds:g} s is {achieved:.4g} "
                    f"FLOP/s, {achieved / peak_flops:.3g}x the system's {peak_name} "
                    f"{peak_flops:.4g}: a GEMM cannot beat the peak (check the time's unit, "
                    f"or the system)")
        result.append((m, n, k, seconds))
    if len(result) < MIN_POINTS:
        raise InvalidParameterError(f"{path}: {len(result)} distinct shape; a table needs at "
                                    f"least {MIN_POINTS}")
    label = dtype if dtype is not None else next(iter(labels))
    return result, label


def _sweep_row(path, line, cells, where):
    """``(m, n, k, seconds, dtype)`` of one CSV line, or one line naming it."""
    def cell(column):
        index = where[column]
        if index >= len(cells):
            raise InvalidParameterError(f"{path}: line {line}: has {len(cells)} cells, no "
                                        f"{column} (column {index + 1})")
        return cells[index].strip()
    dims = []
    for column in ("m", "n", "k"):
        value = cell(column)
        if not (value.isascii() and value.isdigit()) or len(value) > 10:
            raise InvalidParameterError(f"{path}: line {line}: {column} "
                                        f"{shown_value(value)} is not a positive integer")
        dims.append(integer(f"{path}: line {line}: {column}", int(value), 1, MAX_DIMENSION))
    value = cell("seconds")
    try:
        seconds = float(value) if len(value) <= 64 else math.nan
    except ValueError:
        raise InvalidParameterError(f"{path}: line {line}: seconds {shown_value(value)} is "
                                    f"not a number") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise InvalidParameterError(f"{path}: line {line}: seconds must be a finite time > 0, "
                                    f"not {shown_value(value)}")
    seconds = number(f"{path}: line {line}: seconds", seconds, *SECONDS_RANGE, positive=True)
    label = cell(CSV_DTYPE) if CSV_DTYPE in where else ""
    label = text(f"{path}: line {line}: dtype", label, 32)
    return (*dims, seconds, label)


def table_toml(rows, source, dtype="", key="gemm_efficiency"):
    """The ``[gemm_efficiency]`` (or ``[key]``) TOML table of sweep ``rows`` ``(m, n, k,
    seconds)``: the times as measured (``seconds``), turned into efficiency when a system
    loads them."""
    import json
    lines = [f"[{key}]", f"source = {json.dumps(source, ensure_ascii=False)}"]
    if dtype:
        lines.append(f"dtype = {json.dumps(dtype, ensure_ascii=False)}")
    lines.append("seconds = [")
    lines += [f"  [{m}, {n}, {k}, {seconds!r}]," for m, n, k, seconds in rows]
    lines.append("]")
    return "\n".join(lines) + "\n"
