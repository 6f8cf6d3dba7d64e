"""Replay: measured durations as a variation model.

Data model
    A :class:`Replay` holds ``{label: durations}``: a label names an operation
    (``3F12``) or a transfer as the critical path names it (``3F12 d3->d4``),
    with the durations it was measured to take (seconds, from a file). Sample
    ``s`` of a label measured ``k`` times replays measurement ``s mod k``; its
    expectation is their mean. What nobody measured scales by ratios fitted from what was:
    an operation by its device's measured to modelled time, a transfer's volume
    part by its link's.

Sources
    ``op,duration`` CSV rows (:meth:`Replay.from_csv`), PyTorch profiler
    (Kineto) traces of a pipeline run (:meth:`Replay.from_kineto`, read by
    :mod:`tabsched.formats.kineto`), or a dict. Files are untrusted: every
    error is one line naming the file and the line or the labels.
"""

import csv
import io as _io
import os

import numpy as np

from tabsched.adapt.variation import Variation
from tabsched.exceptions import InvalidParameterError, TabschedError
from tabsched.formats.kineto import (DEFAULT_MAX_BYTES, describe_unmatched, read_kineto,
                                     unmatched_labels)
from tabsched.table import KINDS, cut, shown, shown_repr

__all__ = ["Replay"]


def _devices(devices):
    """``device 3`` or ``devices 1, 2 and 3`` (the first eight)."""
    listed = [str(device) for device in devices[:8]]
    if len(listed) == 1:
        return f"device {listed[0]}"
    if len(devices) > 8:
        return f"devices {', '.join(listed)} and {len(devices) - 8} more"
    return f"devices {', '.join(listed[:-1])} and {listed[-1]}"

#: Longest replay label: an operation with a transfer's devices is under 80 characters.
_MAX_LABEL = 200


class Replay(Variation):
    """Measured durations: each labelled operation or transfer replays its measurements.

    Sample ``s`` of an operation measured ``k`` times takes measurement
    ``s mod k``; its expected duration is the mean of the measurements. An
    operation nobody measured (for instance in a table that a transform
    changed) takes the cost model's duration times its device's ratio of
    measured to modelled time; a transfer nobody measured has the volume part
    of its duration scaled by its link's ratio, likewise.

    A label that names nothing in the table the measurements are for (a typo,
    or a profile of another schedule) would change nothing without a word, so
    the first table the model is validated against -- the one measured -- must
    have every label, unless ``partial`` is set; the labels left over are then
    listed in :meth:`describe`. Tables derived later (a search's candidates) may
    leave labels unmatched.

    Parameters
    ----------
    measurements : dict
        ``{label: durations}``; a label is an operation (``3F12``) or a transfer
        as the critical path names it (``3F12 d3->d4``).
    source : str, optional
        Where the measurements came from, for reports.
    partial : bool
        Accept labels that match nothing in the measured table.

    >>> Replay({"0F0": [1.0, 3.0]}).describe()
    {'model': 'replay', 'labels': 1, 'measurements': 2}
    """

    phase = 0
    #: Unmatched labels an error or a report lists at most.
    LISTED = 5

    def __init__(self, measurements, *, source=None, partial=False):
        self.measurements = {}
        for label, values in dict(measurements).items():
            try:
                values = np.atleast_1d(np.asarray(values, dtype=np.float64))
            except (TypeError, ValueError):
                raise InvalidParameterError(f"replay {cut(label)}: durations must be "
                                            f"numbers, not {shown_repr(values)}") from None
            if values.ndim != 1 or not len(values):
                raise InvalidParameterError(f"replay {cut(label)}: give one or more "
                                            f"durations")
            if not np.all(np.isfinite(values)) or np.any(values < 0):
                raise InvalidParameterError(f"replay {cut(label)}: durations must be "
                                            f"finite and >= 0, not "
                                            f"{shown_repr(values.tolist())}")
            self.measurements[str(label).strip()] = values
        self.source = source
        self.partial = bool(partial)
        self.unmatched = None   # set by the first check against a table
        self.modelled_devices = []   # likewise: the devices that measured nothing

    @classmethod
    def from_csv(cls, path, *, partial=False):
        """Read ``op,duration`` rows (an optional header, durations in seconds or with a unit).

        The file is untrusted: it must be UTF-8 (a byte-order mark is dropped),
        with two fields a row; every error names the file and the line.
        """
        from tabsched.costs.units import parse_quantity

        from tabsched.files import read_text
        source = os.fspath(path)
        text = read_text(source, expected="expected op,duration rows",
                         error=InvalidParameterError, nul=True)
        measurements = {}
        reader = csv.reader(_io.StringIO(text, newline=""), strict=True)
        first = True
        try:
            for row in reader:
                line = reader.line_num
                if not row or all(not cell.strip() for cell in row):
                    continue
                if len(row) != 2:
                    raise InvalidParameterError(f"{source}: line {line}: expected op,duration, "
                                                f"not {len(row)} field{'s' if len(row) != 1 else ''}")
                label, value = row[0].strip(), row[1].strip()
                if "\n" in label or "\r" in label or "\n" in value or "\r" in value:
                    raise InvalidParameterError(f"{source}: line {line}: a field spans several "
                                                f"lines (a quoted line break, or a quote never "
                                                f"closed)")
                if first and label.lower() == "op" and value.lower() == "duration":
                    first = False
                    continue
                first = False
                if not label or len(label) > _MAX_LABEL:
                    raise InvalidParameterError(f"{source}: line {line}: {shown(label)} is not "
                                                f"an operation or transfer label")
                try:
                    duration = parse_quantity(value, "s", name="duration")
                except TabschedError as error:
                    raise InvalidParameterError(f"{source}: line {line}: "
                                                f"{cut(error, 120)}") from None
                if not np.isfinite(duration) or duration < 0:
                    raise InvalidParameterError(f"{source}: line {line}: duration must be >= 0, "
                                                f"not {shown_repr(value)}")
                measurements.setdefault(label, []).append(duration)
        except csv.Error as error:
            raise InvalidParameterError(f"{source}: line {reader.line_num}: not valid CSV: "
                                        f"{cut(error, 80)}") from None
        if not measurements:
            raise InvalidParameterError(f"{source}: no op,duration rows")
        return cls(measurements, source=source, partial=partial)

    def labels_in(self, table):
        """The labels that name nothing in ``table`` (operations, and transfers when
        a label has a transfer's form), in file order."""
        ops = np.char.add(np.char.add(table.stage.astype(str), np.array(KINDS)[table.kind]),
                          table.microbatch.astype(str))
        known = set(ops.tolist())
        unknown = [label for label in self.measurements if label not in known]
        if any(" " in label for label in unknown):
            from tabsched.lower import lower
            transfers = lower(table).transfers
            known.update(f"{ops[producer]} d{src}->d{dst}" for producer, src, dst in zip(
                transfers.producer.tolist(), transfers.src.tolist(), transfers.dst.tolist()))
            unknown = [label for label in unknown if label not in known]
        return unknown

    def check(self, table):
        """Match the labels against ``table``: an error for unmatched ones unless ``partial``.

        Returns the unmatched labels (also kept in ``unmatched`` for reports).

        >>> from tabsched import generate
        >>> Replay({"0F0": [1.0], "9F9": [2.0]}).check(generate("gpipe", devices=1,
        ...                                                      microbatches=1))
        Traceback (most recent call last):
        ...
        tabsched.exceptions.InvalidParameterError: replay: 1 of 2 labels match no operation or transfer of the table: 9F9; correct them, or accept them with --replay-partial (partial=True)
        """
        unmatched = self.labels_in(table)
        self.unmatched = unmatched
        self.modelled_devices = self.devices_unmeasured(table)
        if unmatched and not self.partial:
            listed = ", ".join(cut(label) for label in unmatched[:self.LISTED])
            more = f" and {len(unmatched) - self.LISTED} more" if len(unmatched) > self.LISTED \
                else ""
            raise InvalidParameterError(
                f"{self.source or 'replay'}: {len(unmatched)} of {len(self.measurements)} labels "
                f"match no operation or transfer of the table: {listed}{more}; correct them, or "
                f"accept them with --replay-partial (partial=True)")
        if self.modelled_devices and not self.partial:
            raise InvalidParameterError(
                f"{self.source or 'replay'}: measures no operation on "
                f"{_devices(self.modelled_devices)}, which would keep "
                f"{'its' if len(self.modelled_devices) == 1 else 'their'} modelled times "
                f"beside the measured ones of the others; replay every device, or accept it "
                f"with --replay-partial (partial=True)")
        return unmatched

    def devices_unmeasured(self, table):
        """The devices of ``table`` none of whose operations is measured, when others are
        (a profile of some ranks only): their operations keep the cost model's durations,
        as no measured-to-modelled ratio of theirs exists. Empty when every device, or
        none (a replay of transfers only), is measured."""
        ops = np.char.add(np.char.add(table.stage.astype(str), np.array(KINDS)[table.kind]),
                          table.microbatch.astype(str))
        measured = np.isin(ops, np.array(list(self.measurements), dtype=str))
        if not measured.any():
            return []
        seen = np.bincount(table.device[measured], minlength=table.num_devices)
        return np.flatnonzero(seen == 0).tolist()

    def validate(self, table):
        if self.unmatched is None:   # the first table met is the one measured
            self.check(table)

    @classmethod
    def from_kineto(cls, path, *, table=None, partial=False, max_bytes=DEFAULT_MAX_BYTES,
                    attach_actions=True):
        """Durations from PyTorch profiler (Kineto) traces of a pipeline run.

        ``path`` is a ``.json``/``.json.gz`` trace or a directory of them (one
        per rank); :mod:`tabsched.formats.kineto` documents how its ``PP:`` events map
        to operations. Each profiled iteration is one measurement, so sample
        ``s`` replays iteration ``s mod k`` of ``k``.

        Parameters
        ----------
        path : str or path
        table : ScheduleTable, optional
            The table the replay is for: a profiled operation it does not hold
            is an error that lists the first few (a trace of another table, or
            of other microbatch counts), unless ``partial``.
        partial : bool
            Ignore such operations, with a note in :meth:`describe`
            (``--replay-partial``).
        max_bytes : int
            The largest trace file read.
        attach_actions : bool
            Count the time a rank spends posting sends and receives (and other
            non-compute actions) in the operation before them; see
            :func:`tabsched.formats.kineto.read_kineto`.
        """
        profile = read_kineto(path, max_bytes=max_bytes, attach_actions=attach_actions)
        source = os.fspath(path)
        measurements, notes = profile.measurements, list(profile.notes)
        if table is not None:
            unmatched = unmatched_labels(profile, table)
            if unmatched and not partial:
                raise InvalidParameterError(
                    f"{source}: {len(unmatched)} profiled operations are not in the table: "
                    f"{describe_unmatched(unmatched)}; --replay-partial (partial=True) "
                    f"ignores them")
            if unmatched:
                dropped = {label for label, _ in unmatched}
                measurements = {label: values for label, values in measurements.items()
                                if label not in dropped}
                notes.append(f"ignored {len(unmatched)} profiled operations not in the table "
                             f"(--replay-partial): {describe_unmatched(unmatched)}")
            if not measurements:
                raise InvalidParameterError(f"{source}: no profiled operation is in the table")
        replay = cls(measurements, source=source, partial=partial)
        replay.notes = notes
        replay.profile = profile
        return replay

    @property
    def random(self):
        return any(len(values) > 1 for values in self.measurements.values())

    def _plan(self, context):
        """Matched columns with their measurements, and the fallback ratios."""
        ops, sends = context.op_labels
        plan = []
        for labels, nominal in ((ops, context.op_durations),
                                (sends, context.latency + context.volume)):
            index = np.array([i for i, label in enumerate(labels) if label in self.measurements],
                             dtype=np.int64)
            values = [self.measurements[labels[i]] for i in index.tolist()]
            counts = np.array([len(v) for v in values], dtype=np.int64)
            table = np.zeros((len(values), int(counts.max()) if len(values) else 0))
            for row, v in enumerate(values):
                table[row, :len(v)] = v
            means = np.array([float(v.mean()) for v in values])
            plan.append((index, counts, table, means, nominal))
        table = context.table
        (op_index, _, _, op_means, op_nominal), (send_index, _, _, send_means, _) = plan
        measured = np.bincount(table.device[op_index], weights=op_means,
                               minlength=table.num_devices)
        modelled = np.bincount(table.device[op_index], weights=op_nominal[op_index],
                               minlength=table.num_devices)
        device_ratio = np.divide(measured, modelled, out=np.ones(table.num_devices),
                                 where=modelled > 0)
        transfers = context.lowered.transfers
        D = table.num_devices
        link = transfers.src.astype(np.int64) * D + transfers.dst
        excess = np.bincount(link[send_index], weights=send_means - context.latency[send_index],
                             minlength=D * D)
        volume = np.bincount(link[send_index], weights=context.volume[send_index],
                             minlength=D * D)
        link_ratio = np.divide(excess, volume, out=np.ones(D * D), where=volume > 0)
        return plan, np.maximum(device_ratio, 0.0), np.maximum(link_ratio, 0.0)[link]

    def _fill(self, context, draw, pick):
        (ops, sends), device_ratio, link_ratio = self._plan(context)
        unmeasured = np.ones(context.num_ops, dtype=bool)
        unmeasured[ops[0]] = False
        draw.op[:, unmeasured] *= device_ratio[context.table.device[unmeasured]]
        draw.op[:, ops[0]] = pick(draw.samples, *ops[1:4])
        unsent = np.ones(context.num_transfers, dtype=bool)
        unsent[sends[0]] = False
        draw.volume[:, unsent] *= link_ratio[unsent]
        draw.latency[:, sends[0]] = pick(draw.samples, *sends[1:4])
        draw.volume[:, sends[0]] = 0.0

    def time_unit(self, context):
        """Seconds: what was measured. On costs in another unit (slots) every duration
        must become seconds: an unmeasured operation does, by its device's ratio of
        measured to modelled time, so every device that works needs a measurement, and
        every transfer that costs time needs one (a slot of latency has no ratio)."""
        if context.costs.time_unit == "s":
            return "s"
        (ops, sends), _, _ = self._plan(context)
        device = context.table.device
        working = np.unique(device[context.op_durations > 0])
        unconverted = sorted(set(working.tolist()) - set(device[ops[0]].tolist()))
        where = self.source or "the replay"
        if unconverted:
            raise InvalidParameterError(
                f"{where}: measured seconds against durations in {context.costs.time_unit}: "
                f"{_devices(unconverted)} {'has' if len(unconverted) == 1 else 'have'} no "
                f"measured operation to convert {context.costs.time_unit} to seconds; replay every device, or evaluate "
                f"with --model and --system (seconds)")
        unsent = np.ones(context.num_transfers, dtype=bool)
        unsent[sends[0]] = False
        if np.any((context.latency + context.volume)[unsent] > 0):
            raise InvalidParameterError(
                f"{where}: measured seconds against transfers in {context.costs.time_unit}: "
                f"{int(np.count_nonzero(unsent & ((context.latency + context.volume) > 0)))} "
                f"transfers are not measured; measure them, drop --comm, or evaluate with "
                f"--model and --system (seconds)")
        return "s"

    def apply(self, context, draw):
        def pick(samples, counts, table, means):
            column = samples[:, None] % np.maximum(counts, 1)[None, :]
            return table[np.arange(len(counts))[None, :], column]
        self._fill(context, draw, pick)

    def expect(self, context, draw):
        self._fill(context, draw, lambda samples, counts, table, means: means[None, :])

    def describe(self):
        info = {"model": "replay", "labels": len(self.measurements),
                "measurements": int(sum(len(v) for v in self.measurements.values()))}
        if self.source:
            info["source"] = self.source
        if self.modelled_devices:
            info["modelled_devices"] = list(self.modelled_devices)
            info.setdefault("notes", []).append(
                f"{_devices(self.modelled_devices)} measured nothing and "
                f"keep{'s' if len(self.modelled_devices) == 1 else ''} modelled times "
                f"(partial replay)")
        if self.unmatched:
            info["unmatched"] = len(self.unmatched)
            info["unmatched_labels"] = self.unmatched[:self.LISTED]
            info["note"] = (f"{len(self.unmatched)} of {len(self.measurements)} labels match "
                            f"nothing in the table and were left out (partial replay)")
        if getattr(self, "notes", None):
            info["notes"] = list(self.notes) + info.get("notes", [])
        return info
