"""Cost models: what each operation and transfer costs, and how memory is counted.

A cost model answers, vectorised over a table's operations:

* ``op_durations(table)`` -- the duration of every operation;
* ``transfer_costs(table, transfers)`` -- duration and bytes of every transfer;
* ``activation_sizes(table)`` -- the activation each operation's
  (stage, microbatch) holds from the start of its ``F`` to the end of its
  backward (``I`` releases ``input_grad_release`` of it, ``W`` the rest);
* ``persistent_memory(table)`` -- memory each device holds all the time.

and carries the execution options that belong to the system it models:
``contention``, ``devices_per_node``, ``blocking_sends``, and ``overlap``, the
factor applied to the summed parts of an overlapped cell (1.0: no overlap gain).
The iteration's tail, when lowered with one, costs ``tail_durations(table,
lowered)``: a gradient sync per synced stage and an optimizer step per device;
``grad_sync`` and ``optimizer_step`` say whether the model wants them by default.

``UnitCosts`` is the idealized-table level; ``StageCosts`` takes profiled
per-stage numbers; ``ModelCosts`` derives everything from a transformer
(:mod:`tabsched.models`) on a system (:mod:`tabsched.systems`), in seconds and
bytes.
"""

import numbers

import numpy as np

from tabsched.exceptions import InvalidParameterError
from tabsched.lower import CONTENTION_MODES
from tabsched.models import load_model
from tabsched.systems import load_system

__all__ = ["CostModel", "UnitCosts", "StageCosts", "ModelCosts"]


def _non_negative(name, value):
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise InvalidParameterError(f"{name} must be a number, not {value!r}") from None
    if not np.isfinite(value) or value < 0:
        raise InvalidParameterError(f"{name} must be finite and >= 0, not {value}")
    return value


def _fraction(name, value):
    value = _non_negative(name, value)
    if value > 1:
        raise InvalidParameterError(f"{name} must be between 0 and 1, not {value}")
    return value


def _per_stage(name, value):
    """A scalar or a 1-D array of non-negative numbers (checked against stages later)."""
    if isinstance(value, numbers.Number):
        return _non_negative(name, value)
    array = np.asarray(value, dtype=np.float64)
    if array.ndim != 1 or len(array) == 0:
        raise InvalidParameterError(f"{name} must be a number or a list with one per stage")
    bad = np.flatnonzero(~np.isfinite(array) | (array < 0))
    if len(bad):
        raise InvalidParameterError(f"{name}[{bad[0]}] must be finite and >= 0, "
                                    f"not {array[bad[0]]}")
    array.flags.writeable = False
    return array


def _stage_values(name, value, table):
    if isinstance(value, float):
        return np.full(table.num_stages, value)
    if len(value) != table.num_stages:
        raise InvalidParameterError(f"{name} has {len(value)} entries but the table has "
                                    f"{table.num_stages} stages")
    return value


class CostModel:
    """Base class of the cost models; see the module docstring."""

    #: "table" for the idealized level, "simulation" when times are modelled.
    level = "simulation"
    #: "activations" (one stage's activation for one full microbatch) or "bytes".
    memory_unit = "activations"
    #: unit of every time a result reports.
    time_unit = "slots"
    contention = "none"
    devices_per_node = None
    blocking_sends = False
    input_grad_release = 0.0
    overlap = 1.0
    grad_sync = None
    optimizer_step = False

    def op_durations(self, table):
        raise NotImplementedError

    def tail_durations(self, table, lowered):
        """``(sync, optimizer)``: durations of the sync nodes and of each device's step."""
        return (np.zeros(lowered.num_syncs),
                np.zeros(table.num_devices if lowered.optimizer else 0))

    def transfer_costs(self, table, transfers):
        """``(durations, nbytes)`` arrays, one entry per transfer."""
        empty = np.zeros(len(transfers))
        return empty, empty.copy()

    def transfer_parts(self, table, transfers):
        """``(latency, volume)`` per transfer: ``latency + volume`` is its duration.

        ``volume`` is the part that scales with the bytes and the link's
        bandwidth (``bytes / bandwidth``), ``latency`` the part that does not. A
        cost model that states no bandwidth counts its whole transfer time as
        volume: a link that is k times slower takes k times as long.
        """
        durations, _ = self.transfer_costs(table, transfers)
        durations = np.asarray(durations, dtype=np.float64)
        return np.zeros(len(durations)), durations

    def activation_sizes(self, table):
        """Activation memory of each operation's (stage, microbatch)."""
        return np.asarray(table.microbatch_sizes, dtype=np.float64)[table.microbatch]

    def persistent_memory(self, table):
        return np.zeros(table.num_devices)

    def node_durations(self, lowered, op_durations=None):
        """Durations of every node of a lowered table (compute cells, then transfers)."""
        table = lowered.table
        if op_durations is None:
            op_durations = self.op_durations(table)
        cells = np.bincount(lowered.cell_of_op, weights=op_durations,
                            minlength=lowered.num_cells)
        if self.overlap != 1.0:
            parts = np.bincount(lowered.cell_of_op, minlength=lowered.num_cells)
            cells[parts > 1] *= self.overlap
        transfer_durations, _ = self.transfer_costs(table, lowered.transfers)
        sync, optimizer = self.tail_durations(table, lowered)
        return np.concatenate([cells, np.asarray(transfer_durations, dtype=np.float64),
                               np.asarray(sync, dtype=np.float64),
                               np.asarray(optimizer, dtype=np.float64)])

    def describe(self):
        """Parameters for reports and JSON."""
        return {"model": type(self).__name__}


class UnitCosts(CostModel):
    """The idealized-table level: a fixed length per kind, no communication.

    Parameters
    ----------
    f, b, i, w : float
        Slot length of a forward, full backward, input-grad and weight-grad of a
        full microbatch (DESIGN.md default: all 1). A microbatch of relative size
        ``x`` takes ``x`` times as long.
    input_grad_release : float
        Part of an activation freed when ``I`` ends; ``W`` frees the rest.
        Default 0: the whole activation lives until ``W``, as the zero-bubble
        papers count memory.
    overlap : float
        Factor on the summed length of an overlapped cell's parts.
    sync, optimizer : float
        Length of a gradient sync and of an optimizer step, when the evaluation
        has a tail (default 0).

    >>> UnitCosts(b=2).describe()
    {'model': 'UnitCosts', 'F': 1.0, 'B': 2.0, 'I': 1.0, 'W': 1.0}
    """

    level = "table"

    def __init__(self, f=1.0, b=1.0, i=1.0, w=1.0, *, input_grad_release=0.0, overlap=1.0,
                 sync=0.0, optimizer=0.0):
        self.lengths = np.array([_non_negative("f", f), _non_negative("b", b),
                                 _non_negative("i", i), _non_negative("w", w)])
        self.input_grad_release = _fraction("input_grad_release", input_grad_release)
        self.overlap = _non_negative("overlap", overlap)
        self.sync = _non_negative("sync", sync)
        self.optimizer = _non_negative("optimizer", optimizer)

    def tail_durations(self, table, lowered):
        return (np.full(lowered.num_syncs, self.sync),
                np.full(table.num_devices if lowered.optimizer else 0, self.optimizer))

    def op_durations(self, table):
        sizes = np.asarray(table.microbatch_sizes, dtype=np.float64)
        return self.lengths[table.kind] * sizes[table.microbatch]

    def describe(self):
        info = {"model": "UnitCosts", **dict(zip("FBIW", self.lengths.tolist()))}
        if self.overlap != 1.0:
            info["overlap"] = self.overlap
        if self.input_grad_release:
            info["input_grad_release"] = self.input_grad_release
        return info


class StageCosts(CostModel):
    """Profiled per-stage durations and a communication cost.

    Parameters
    ----------
    forward : float or sequence
        Forward time of a full microbatch, one number for all stages or one per stage.
    backward : float or sequence, optional
        Full backward time; default twice the forward.
    input_grad, weight_grad : float or sequence, optional
        Split backward times; default half the backward each (input_grad), and the
        backward minus input_grad (weight_grad).
    comm : float or array (devices x devices)
        Time of one transfer, for every link or per directed link ``comm[src, dst]``.
    activation : float or sequence
        Activation memory per stage for a full microbatch (default 1).
    input_grad_release, overlap, sync, optimizer : float
        As in ``UnitCosts``.
    contention : {"none", "link", "nic"}
    devices_per_node : int, optional
        For ``nic`` contention.
    time_unit : str
        Label of the unit the numbers are in (default "s").

    Durations scale linearly with a microbatch's relative size.

    >>> costs = StageCosts([1.0, 2.0], comm=0.5)
    >>> costs.describe()["B"]
    [2.0, 4.0]
    """

    def __init__(self, forward, backward=None, input_grad=None, weight_grad=None, *,
                 comm=0.0, activation=1.0, input_grad_release=0.0, overlap=1.0,
                 contention="none", devices_per_node=None, blocking_sends=False,
                 sync=0.0, optimizer=0.0, time_unit="s"):
        self.forward = _per_stage("forward", forward)
        self.backward = (_per_stage("backward", backward) if backward is not None
                         else self.forward * 2)
        self.input_grad = (_per_stage("input_grad", input_grad) if input_grad is not None
                           else self.backward / 2)
        self.weight_grad = (_per_stage("weight_grad", weight_grad) if weight_grad is not None
                            else np.maximum(np.subtract(self.backward, self.input_grad), 0.0))
        if isinstance(comm, numbers.Number):
            self.comm = _non_negative("comm", comm)
        else:
            matrix = np.asarray(comm, dtype=np.float64)
            if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
                raise InvalidParameterError("comm must be a number or a square matrix "
                                            "(devices x devices)")
            bad = np.argwhere(~np.isfinite(matrix) | (matrix < 0))
            if len(bad):
                src, dst = bad[0]
                raise InvalidParameterError(f"comm[{src}][{dst}] must be finite and >= 0, "
                                            f"not {matrix[src, dst]}")
            self.comm = matrix
        self.activation = _per_stage("activation", activation)
        self.input_grad_release = _fraction("input_grad_release", input_grad_release)
        self.overlap = _non_negative("overlap", overlap)
        if contention not in CONTENTION_MODES:
            raise InvalidParameterError(f"contention {contention!r} is not one of "
                                        f"{', '.join(CONTENTION_MODES)}")
        self.contention = contention
        self.devices_per_node = devices_per_node
        self.blocking_sends = bool(blocking_sends)
        self.sync = _non_negative("sync", sync)
        self.optimizer = _non_negative("optimizer", optimizer)
        self.time_unit = time_unit

    tail_durations = UnitCosts.tail_durations

    def op_durations(self, table):
        per_kind = np.stack([_stage_values(name, getattr(self, name), table)
                             for name in ("forward", "backward", "input_grad", "weight_grad")])
        sizes = np.asarray(table.microbatch_sizes, dtype=np.float64)
        return per_kind[table.kind, table.stage] * sizes[table.microbatch]

    def transfer_costs(self, table, transfers):
        if isinstance(self.comm, float):
            durations = np.full(len(transfers), self.comm)
        else:
            if self.comm.shape[0] != table.num_devices:
                raise InvalidParameterError(
                    f"comm is a {self.comm.shape[0]}x{self.comm.shape[0]} matrix but the "
                    f"table has {table.num_devices} devices")
            durations = self.comm[transfers.src, transfers.dst]
        return durations, np.zeros(len(transfers))

    def activation_sizes(self, table):
        per_stage = _stage_values("activation", self.activation, table)
        sizes = np.asarray(table.microbatch_sizes, dtype=np.float64)
        return per_stage[table.stage] * sizes[table.microbatch]

    def describe(self):
        def plain(value):
            return value.tolist() if isinstance(value, np.ndarray) else value
        return {"model": "StageCosts", "F": plain(self.forward), "B": plain(self.backward),
                "I": plain(self.input_grad), "W": plain(self.weight_grad),
                "comm": plain(self.comm), "contention": self.contention}


_INT64_MAX = 2**63 - 1


class ModelCosts(CostModel):
    """A transformer on a system: roofline compute, Hockney transfers, memory in bytes.

    Durations are seconds and memory is bytes. Each operation costs the
    system's roofline (:meth:`tabsched.systems.System.compute_time`) of its
    FLOPs and bytes moved (:mod:`tabsched.models`): the layers of its stage, plus
    the embedding on stage 0 and the output layer and loss on the last stage,
    for its microbatch's samples. A transfer moves ``d*b*s*h`` bytes (the
    activation forward, its gradient backward) over the link between its two
    devices. A stage's activation is held from the start of its ``F`` to the end
    of its backward; ``I`` frees ``input_grad_release`` of it. Each device holds
    the parameters of its stages times ``bytes_per_param`` all the time.

    Parameters
    ----------
    model : TransformerModel or str
        A model, a preset name (``"paper-128l"``) or a TOML file.
    system : System or str
        A system, a preset name (``"mid_nw_mid_cp"``) or a TOML file.
    microbatch_size : int, optional
        Samples in a full microbatch; default the model's. A table's microbatch
        of relative size ``x`` holds ``x * microbatch_size`` samples, which must
        be a whole number.
    recompute : {"none", "selective", "full"}, optional
        Default the model's.
    overlap : float
        Factor on the summed durations of an overlapped cell's parts.
    contention : {"none", "link", "nic"}, optional
        Default the system's.
    blocking_sends : bool, optional
        Default the system's.
    grad_sync : None, "replicas", "all" or list of stages
        The tail's gradient sync (a ring all-reduce of the stage's gradients,
        in the model's dtype, among the devices of the table holding it);
        default none. A stage on one device syncs in 0 s: data-parallel
        replicas outside the table are not modelled.
    optimizer : bool
        Add an optimizer step per device to the tail: reading and writing every
        persistent byte once, ``2 * bytes_per_param`` per parameter, at the
        memory roofline, plus the launch latency.

    Examples
    --------
    >>> from tabsched.schedules import generate
    >>> costs = ModelCosts("paper-128l", "mid_nw_mid_cp")
    >>> table = generate("1f1b", devices=8, microbatches=32)
    >>> str(table.op(0)), int(costs.stage_layers(table)[0])
    ('0F0', 16)
    >>> f = float(costs.op_durations(table)[0])  # 16 * (24Th^2 + 4Tsh) / 1 PFLOP/s + 5 us
    >>> round(f * 1e3, 3)
    30.791
    """

    level = "simulation"
    memory_unit = "bytes"
    time_unit = "s"

    def __init__(self, model, system, *, microbatch_size=None, recompute=None, overlap=1.0,
                 contention=None, blocking_sends=None, grad_sync=None, optimizer=False):
        model = load_model(model)
        changes = {key: value for key, value in (("microbatch_size", microbatch_size),
                                                 ("recompute", recompute)) if value is not None}
        self.model = model.replace(**changes) if changes else model
        self.system = load_system(system)
        self.overlap = _non_negative("overlap", overlap)
        contention = self.system.contention if contention is None else contention
        if contention not in CONTENTION_MODES:
            raise InvalidParameterError(f"contention {contention!r} is not one of "
                                        f"{', '.join(CONTENTION_MODES)}")
        self.contention = contention
        self.devices_per_node = self.system.devices_per_node
        self.blocking_sends = (self.system.blocking_sends if blocking_sends is None
                               else bool(blocking_sends))
        self.grad_sync = grad_sync
        self.optimizer_step = bool(optimizer)
        self.input_grad_release = self.model.input_grad_release

    # ----------------------------------------------------------- the table's shape
    def stage_layers(self, table):
        """Layers of each stage: ``table.stage_layers``, or an even split."""
        S, layers = table.num_stages, self.model.layers
        if table.stage_layers is None:
            if S and layers % S:
                raise InvalidParameterError(
                    f"model {self.model.name} has {layers} layers, which do not split evenly "
                    f"over the table's {S} stages (give the table stage_layers)")
            return np.full(S, layers // S if S else 0, dtype=np.int64)
        per_stage = np.asarray(table.stage_layers, dtype=np.int64)
        if int(per_stage.sum()) != layers:
            raise InvalidParameterError(
                f"the table's stage_layers sum to {int(per_stage.sum())} but model "
                f"{self.model.name} has {layers} layers")
        return per_stage

    def microbatch_samples(self, table):
        """Samples in each microbatch of ``table`` (float array of whole numbers)."""
        sizes = np.asarray(table.microbatch_sizes, dtype=np.float64)
        samples = sizes * self.model.microbatch_size
        whole = np.round(samples)
        bad = np.flatnonzero((np.abs(samples - whole) > 1e-9 * np.maximum(samples, 1.0))
                             | (whole < 1))
        if len(bad):
            m = int(bad[0])
            raise InvalidParameterError(
                f"microbatch {m} has relative size {sizes[m]:g}: {samples[m]:g} samples of a "
                f"{self.model.microbatch_size}-sample microbatch, but samples must be whole "
                f"(raise microbatch_size)")
        return whole

    def _shape(self, table):
        """Layers per stage, first/last-stage masks, unique samples and each microbatch's index."""
        layers = self.stage_layers(table)
        samples = self.microbatch_samples(table)
        unique, inverse = np.unique(samples, return_inverse=True)
        self._check_int64(layers, unique, samples)
        first = np.zeros(len(layers))
        last = np.zeros(len(layers))
        if len(layers):
            first[0] = 1.0
            last[-1] = 1.0
        return layers, first, last, unique, inverse

    def _check_int64(self, layers, unique, samples):
        """Activation bytes (exact, in Python ints) must fit int64, per stage and in total."""
        if not len(layers) or not len(unique):
            return
        model = self.model
        per_sample = [int(n) * model.layer_activation(1) for n in layers.tolist()]
        per_sample[0] += model.embedding_activation(1)
        per_sample[-1] += model.output_activation(1)
        largest = max(per_sample) * int(unique.max())
        total = sum(per_sample) * int(samples.sum())
        if max(largest, total) > _INT64_MAX:
            raise InvalidParameterError(
                f"microbatch_size {model.microbatch_size} makes the activations of one "
                f"iteration {float(total):.3g} bytes, which overflows int64 "
                f"({float(_INT64_MAX):.3g}); use a smaller microbatch_size")

    def _stage_work(self, table):
        """FLOPs, bytes and tokens per (kind, stage, unique size), and the size index."""
        layers, first, last, unique, inverse = self._shape(table)
        model = self.model
        per_layer = model.layer_work(unique)
        embedding = model.embedding_work(unique)
        output = model.output_work(unique)
        work = [layers[None, :, None] * per_layer[k][:, None, :]
                + first[None, :, None] * embedding[k][:, None, :]
                + last[None, :, None] * output[k][:, None, :] for k in (0, 1)]
        tokens = unique * model.sequence
        return work[0], work[1], tokens, inverse

    # --------------------------------------------------------------- cost model
    def op_work(self, table):
        """``(flops, nbytes)`` of every operation of ``table`` (float arrays)."""
        flops, nbytes, _, inverse = self._stage_work(table)
        index = (table.kind, table.stage, inverse[table.microbatch])
        return flops[index], nbytes[index]

    def op_durations(self, table):
        """Roofline seconds of every operation (see ``System.compute_time``)."""
        flops, nbytes, tokens, inverse = self._stage_work(table)
        durations = self.system.compute_time(flops, nbytes, tokens[None, None, :])
        return durations[table.kind, table.stage, inverse[table.microbatch]]

    def transfer_costs(self, table, transfers):
        """``(seconds, bytes)`` per transfer: ``latency + d*b*s*h / bandwidth`` on its link."""
        if len(transfers) == 0:
            return np.zeros(0), np.zeros(0)
        _, _, _, unique, inverse = self._shape(table)
        per_microbatch = self.model.transfer_bytes(unique)[inverse]
        nbytes = per_microbatch[transfers.microbatch]
        bandwidth, latency = self.system.link_matrices(table.num_devices)
        src, dst = transfers.src, transfers.dst
        return latency[src, dst] + nbytes / bandwidth[src, dst], nbytes

    def transfer_parts(self, table, transfers):
        """``(latency, bytes / bandwidth)`` per transfer, on its link (Hockney)."""
        if len(transfers) == 0:
            return np.zeros(0), np.zeros(0)
        _, nbytes = self.transfer_costs(table, transfers)
        bandwidth, latency = self.system.link_matrices(table.num_devices)
        src, dst = transfers.src, transfers.dst
        return latency[src, dst], nbytes / bandwidth[src, dst]

    def activation_sizes(self, table):
        """Bytes each operation's (stage, microbatch) holds from its F to its backward."""
        layers, first, last, unique, inverse = self._shape(table)
        model = self.model
        per_stage = (layers[:, None] * model.layer_activation(unique)[None, :]
                     + first[:, None] * model.embedding_activation(unique)[None, :]
                     + last[:, None] * model.output_activation(unique)[None, :])
        return per_stage[table.stage, inverse[table.microbatch]]

    def stage_parameters(self, table):
        """Parameters of each stage (int64 array)."""
        layers = self.stage_layers(table)
        S = len(layers)
        return np.array([self.model.stage_parameters(int(layers[s]), s == 0, s == S - 1)
                         for s in range(S)], dtype=np.int64)

    def persistent_memory(self, table):
        """Bytes each device holds all the time: its stages' parameters x bytes_per_param."""
        D = table.num_devices
        per_stage = self.stage_parameters(table) * self.model.bytes_per_param
        pairs = np.unique(table.stage.astype(np.int64) * D + table.device)
        return np.bincount(pairs % D, weights=per_stage[pairs // D], minlength=D)

    def tail_durations(self, table, lowered):
        """Ring all-reduce of each synced stage's gradients; each device's optimizer step."""
        params = self.stage_parameters(table)
        gradient_bytes = params * float(self.model.dtype_bytes)
        sync = np.array([self.system.all_reduce_time(gradient_bytes[int(stage)],
                                                     lowered.sync_devices(k))
                         for k, stage in enumerate(lowered.sync_stage)], dtype=np.float64)
        if not lowered.optimizer:
            return sync, np.zeros(0)
        D = table.num_devices
        pairs = np.unique(table.stage.astype(np.int64) * D + table.device)
        device_params = np.bincount(pairs % D, weights=params[pairs // D], minlength=D)
        state_bytes = 2.0 * self.model.bytes_per_param * device_params
        step = self.system.compute_time(np.zeros(D), state_bytes, np.ones(D))
        return sync, np.where(device_params > 0, step, 0.0)

    def describe(self):
        """Names and settings for reports and JSON (the numbers live in the presets)."""
        info = {"model": "ModelCosts", "transformer": self.model.name,
                "system": self.system.name, "microbatch_size": self.model.microbatch_size,
                "recompute": self.model.recompute}
        if self.overlap != 1.0:
            info["overlap"] = self.overlap
        return info
