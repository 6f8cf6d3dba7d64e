"""ModelCosts: a transformer on a system, in seconds and bytes.

The transformer (:mod:`tabsched.costs.transformer`) gives each operation's
FLOPs, bytes moved and activation bytes; the system
(:mod:`tabsched.costs.system`) turns them into seconds with its roofline and
prices every transfer on its link (Hockney).
"""

import numpy as np

from tabsched.costs.base import CostModel, _non_negative
from tabsched.costs.system import load_system
from tabsched.costs.transformer import load_model
from tabsched.exceptions import InvalidParameterError
from tabsched.lower import CONTENTION_MODES

__all__ = ["ModelCosts"]

_INT64_MAX = 2**63 - 1


class ModelCosts(CostModel):
    """A transformer on a system: roofline compute, Hockney transfers, memory in bytes.

    Durations are seconds and memory is bytes. Each operation costs the
    system's roofline (:meth:`tabsched.costs.system.System.compute_time`) of its
    FLOPs and bytes moved (:mod:`tabsched.costs.transformer`): the layers of its stage, plus
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
