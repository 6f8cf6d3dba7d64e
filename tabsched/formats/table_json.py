"""Tables as JSON: the rows and the metadata a CSV cannot hold.

A document is one object: ``"format": "tabsched.table"``, ``"version": 1``,
``"rows"`` (one list of cell texts per device, read by the rules of
:mod:`tabsched.formats.rows`), and the metadata: ``"family"`` and ``"params"``,
``"num_stages"``, ``"microbatch_sizes"``, ``"stage_layers"`` and, for a table
that says which stages sync their gradients, ``"grad_sync"``.

Documents are untrusted: nesting is bounded before parsing, NaN, Infinity,
duplicate keys and absurd numbers are refused, and the document is checked
against one schema, key by key (:func:`_check_document`), then against its rows;
every error names the file and the key or the cell on one line.
"""

from __future__ import annotations

import json
import math
import os
import re

import numpy as np

from tabsched.cells import cut, shown, shown_repr
from tabsched.exceptions import InvalidScheduleError
from tabsched.files import atomic_write, read_text
from tabsched.formats.rows import apply_reduce_grad, parse_rows, refuse_unreadable, rows_to_table
from tabsched.table import SLICE_PARTITIONS, ScheduleTable, metadata_text_problem

__all__ = ["to_json", "from_json", "read_json", "write_json", "json_text", "JSON_FORMAT",
           "JSON_VERSION", "MAX_JSON_DEPTH"]

JSON_FORMAT = "tabsched.table"
JSON_VERSION = 1

#: The deepest nesting a table document needs is 3 (object, rows, row); anything
#: much deeper is not a table, and Python's parser would recurse on it.
MAX_JSON_DEPTH = 32
_JSON_KEYS = ("format", "version", "family", "params", "num_stages", "microbatch_sizes",
              "stage_layers", "rows", "grad_sync", "sequence_slices", "slice_partition")
_MAX_NAME = 200


def to_json(table: ScheduleTable, *, indent: int | None = None) -> str:
    """JSON text: the rows and the metadata CSV cannot hold.

    Refuses a table with a device that runs nothing, which no reader takes back.
    """
    refuse_unreadable(table, "JSON table")
    data = {
        "format": JSON_FORMAT,
        "version": JSON_VERSION,
        "family": table.family,
        "params": table.params,
        "num_stages": table.num_stages,
        "microbatch_sizes": list(table.microbatch_sizes),
        "stage_layers": list(table.stage_layers) if table.stage_layers is not None else None,
        "rows": [["" if cell is None else str(cell) for cell in row] for row in table.rows],
    }
    if table.grad_sync is not None:  # only tables that say which stages sync carry the key
        data["grad_sync"] = list(table.grad_sync)
    if table.sequence_slices is not None:   # only sliced tables carry the key
        data["sequence_slices"] = [list(pair) for pair in table.sequence_slices]
    if table.slice_partition != "even":     # only tables cut by FLOPs carry the key
        data["slice_partition"] = table.slice_partition
    return json.dumps(data, indent=indent)


def json_text(table: ScheduleTable) -> str:
    """The whole text of a table's JSON file: :func:`to_json` indented, and a final newline."""
    return to_json(table, indent=1) + "\n"


def _json_depth(text):
    """The deepest nesting of brackets in JSON text, strings skipped (no recursion).

    >>> _json_depth('{"rows": [["0F0", "[["]]}')
    3
    """
    outside = _JSON_STRING.sub("", text).encode("utf-8", "replace")
    codes = np.frombuffer(outside, dtype=np.uint8)
    steps = (np.isin(codes, _OPENING).astype(np.int64) - np.isin(codes, _CLOSING))
    return int(np.cumsum(steps).max(initial=0))


_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_OPENING = np.frombuffer(b"[{", dtype=np.uint8)
_CLOSING = np.frombuffer(b"]}", dtype=np.uint8)


def _load_json(text, source):
    """``json.loads`` for untrusted text: no NaN or Infinity, no duplicate keys, bounded."""
    def constant(name):
        raise InvalidScheduleError(f"{source}: {name} is not a number a table may hold")

    def number(text_value):
        value = float(text_value)
        if not math.isfinite(value):
            raise InvalidScheduleError(f"{source}: {shown(text_value)} is out of range")
        return value

    def integer(text_value):
        if len(text_value.lstrip("-")) > 18:
            raise InvalidScheduleError(f"{source}: the integer {cut(text_value, 24)} "
                                       f"is out of range")
        return int(text_value)

    def pairs(items):
        data = {}
        for key, value in items:
            if key in data:
                raise InvalidScheduleError(f"{source}: key {shown(key)} appears twice in one "
                                           f"object")
            data[key] = value
        return data

    if _json_depth(text) > MAX_JSON_DEPTH:
        raise InvalidScheduleError(f"{source}: not a table: nested more than "
                                   f"{MAX_JSON_DEPTH} levels deep")
    try:
        return json.loads(text, parse_constant=constant, parse_float=number,
                          parse_int=integer, object_pairs_hook=pairs)
    except json.JSONDecodeError as error:
        raise InvalidScheduleError(f"{source}: not valid JSON: {error.msg} at line "
                                   f"{error.lineno}, column {error.colno}") from None
    except RecursionError:
        raise InvalidScheduleError(f"{source}: not a table: nested too deeply") from None


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_document(data, source):
    """The JSON table document checked key by key (types and ranges; one schema).

    Returns the metadata keyword arguments it states. Consistency with the rows
    is checked once the rows are read (:func:`_check_against_rows`).
    """
    def fail(key, message):
        raise InvalidScheduleError(f'{source}: "{key}" {message}')

    if not isinstance(data, dict):
        raise InvalidScheduleError(f'{source}: expected a JSON object with "rows"')
    unknown = [key for key in data if key not in _JSON_KEYS]
    if unknown:
        raise InvalidScheduleError(f"{source}: unknown key {shown(unknown[0])}; valid keys: "
                                   f"{', '.join(sorted(_JSON_KEYS))}")
    if data.get("format", JSON_FORMAT) != JSON_FORMAT:
        fail("format", f"is {shown_repr(data['format'])}, expected {JSON_FORMAT!r}")
    version = data.get("version", JSON_VERSION)
    if not _is_int(version) or not 1 <= version <= JSON_VERSION:
        fail("version", f"is {shown_repr(version)}; this tabsched reads version "
                        f"{JSON_VERSION}")
    rows = data.get("rows")
    if not isinstance(rows, list) or not all(isinstance(row, list) for row in rows):
        fail("rows", "must be a list of lists of cells")
    metadata = {}
    family = data.get("family")
    if family is not None:
        if not isinstance(family, str) or not family.strip() or len(family) > _MAX_NAME:
            fail("family", f"must be a family name, not {shown_repr(family)}")
        metadata["family"] = family
    params = data.get("params")
    if params is not None:
        if not isinstance(params, dict):
            fail("params", f"must be an object of parameter values, not {shown_repr(params)}")
        def scalar(value):
            return (value is None or isinstance(value, bool) or _is_number(value)
                    or (isinstance(value, str) and len(value) <= _MAX_NAME))
        for name, value in params.items():
            listed = isinstance(value, list) and all(scalar(entry) for entry in value)
            if not (scalar(value) or listed) or len(name) > _MAX_NAME:
                fail("params", f"{shown(name)} must be a number, text, true/false, null or a "
                               f"list of them, not {shown_repr(value)}")
        metadata["params"] = params
    problem = metadata_text_problem(family, params)
    if problem:
        raise InvalidScheduleError(f'{source}: "{problem[0]}": {problem[1]}')
    num_stages = data.get("num_stages")
    if num_stages is not None:
        if not _is_int(num_stages) or num_stages < 1:
            fail("num_stages", f"must be an integer >= 1, not {shown_repr(num_stages)}")
        metadata["num_stages"] = num_stages
    sizes = data.get("microbatch_sizes")
    if sizes is not None:
        if not isinstance(sizes, list) or not sizes or not all(
                _is_number(size) and size > 0 for size in sizes):
            fail("microbatch_sizes", f"must be a list of positive numbers, not "
                                     f"{shown_repr(sizes)}")
        metadata["microbatch_sizes"] = sizes
    layers = data.get("stage_layers")
    if layers is not None:
        if not isinstance(layers, list) or not all(_is_int(count) and count >= 0
                                                   for count in layers):
            fail("stage_layers", f"must be a list of layer counts (integers >= 0), not "
                                 f"{shown_repr(layers)}")
        metadata["stage_layers"] = layers
    grad_sync = data.get("grad_sync")
    if grad_sync is not None:
        if not isinstance(grad_sync, list) or not all(_is_int(stage) and stage >= 0
                                                      for stage in grad_sync):
            fail("grad_sync", f"must be a list of stages (integers >= 0), not "
                              f"{shown_repr(grad_sync)}")
        metadata["grad_sync"] = grad_sync
    slices = data.get("sequence_slices")
    if slices is not None:
        if not isinstance(slices, list) or not all(
                isinstance(pair, list) and len(pair) == 2 and _is_int(pair[0]) and
                _is_int(pair[1]) and 0 <= pair[0] < pair[1] for pair in slices):
            fail("sequence_slices", f"must be a list of [slice, count] pairs (0 <= slice < "
                                    f"count), not {shown_repr(slices)}")
        metadata["sequence_slices"] = slices
    partition = data.get("slice_partition")
    if partition is not None:
        if partition not in SLICE_PARTITIONS:
            fail("slice_partition", f"must be one of {', '.join(SLICE_PARTITIONS)}, not "
                                    f"{shown_repr(partition)}")
        metadata["slice_partition"] = partition
    return rows, metadata


def _check_against_rows(table, metadata, source):
    """Metadata lengths and ranges against the table the rows make."""
    S, M = table.num_stages, table.num_microbatches
    if metadata.get("num_stages", S) != S:
        raise InvalidScheduleError(f'{source}: "num_stages" is {metadata["num_stages"]}, but '
                                   f'the rows hold stages 0..{S - 1}')
    sizes = metadata.get("microbatch_sizes")
    if sizes is not None and len(sizes) != M:
        raise InvalidScheduleError(f'{source}: "microbatch_sizes" has {len(sizes)} entries, '
                                   f'but the rows hold microbatches 0..{M - 1}')
    layers = metadata.get("stage_layers")
    if layers is not None and len(layers) != S:
        raise InvalidScheduleError(f'{source}: "stage_layers" has {len(layers)} entries, but '
                                   f'the rows hold stages 0..{S - 1}')
    grad_sync = metadata.get("grad_sync")
    if grad_sync is not None:
        outside = [stage for stage in grad_sync if stage >= S]
        if outside:
            raise InvalidScheduleError(f'{source}: "grad_sync" names stage {outside[0]}, but '
                                       f'the rows hold stages 0..{S - 1}')
        if table.grad_sync is not None and tuple(sorted(set(grad_sync))) != table.grad_sync:
            raise InvalidScheduleError(f'{source}: "grad_sync" is {sorted(set(grad_sync))[:8]}, '
                                       f'but the rows\' REDUCE_GRAD cells name stages '
                                       f'{list(table.grad_sync)[:8]}')


def from_json(text: str, *, source: str = "<json>") -> ScheduleTable:
    """Parse the JSON form of a table.

    The document is checked against one schema (each key's type and range, its
    lengths against the rows) and its rows are read by the same rules as a CSV
    file's (:func:`parse_rows`); every error names the key or the cell.
    """
    if not isinstance(text, str):
        raise InvalidScheduleError(f"{source}: the JSON must be text (str), not "
                                   f"{shown_repr(text)}")
    data = _load_json(text, source)
    raw_rows, metadata = _check_document(data, source)
    texts = []
    for device, row in enumerate(raw_rows):
        for slot, token in enumerate(row):
            if token is not None and not isinstance(token, str):
                raise InvalidScheduleError(f"{source}: device {device}, slot {slot}: "
                                           f"{shown_repr(token)} is not a cell string")
        texts.append([token or "" for token in row])
    rows, actions, _ = parse_rows(texts, source, row_name="row")
    table = apply_reduce_grad(rows_to_table(rows, source=source), actions, source)
    _check_against_rows(table, metadata, source)
    if metadata:
        try:
            table = table.replace(**metadata)
        except InvalidScheduleError as error:
            raise InvalidScheduleError(f"{source}: {error}") from None
    return table


def read_json(path):
    """Read a table written by :func:`write_json` (or by hand, to the same schema)."""
    return from_json(read_text(path), source=os.fspath(path))


def write_json(table, path):
    """Write ``table`` as JSON with its metadata (atomically)."""
    atomic_write(path, json_text(table))
