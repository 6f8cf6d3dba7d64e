"""ModelCosts: a transformer on a system, in seconds and bytes.

The transformer (:mod:`tabsched.costs.transformer`) gives each operation's
kernels (:mod:`tabsched.costs.kernels`) and activation bytes; the system
(:mod:`tabsched.costs.system`) times each kernel by its own roofline and prices
every transfer on its link (Hockney) and every collective on its ring
(:mod:`tabsched.costs.collectives`); the parallelism
(:mod:`tabsched.costs.parallel`) says how many tensor ranks share a stage and
how many replicas of the pipeline sync their gradients.
"""

import functools

import numpy as np

from tabsched.costs.base import CostModel, _non_negative
from tabsched.costs.kernels import KernelTable
from tabsched.costs.parallel import Parallelism
from tabsched.costs.system import load_system
from tabsched.costs.transformer import load_model
from tabsched.exceptions import InvalidParameterError
from tabsched.lower import CONTENTION_MODES
from tabsched.compose import Prices
from tabsched.nodes import OPTIMIZER, SYNC
from tabsched.table import BACKWARD, FORWARD, INPUT_GRAD, WEIGHT_GRAD

__all__ = ["ModelCosts"]

_INT64_MAX = 2**63 - 1
_PARTS = ("layer", "embedding", "output")
#: The kernel lists each kind of operation runs (R: the recompute forward).
_KIND_PHASES = {FORWARD: "F", BACKWARD: "RIW", INPUT_GRAD: "RI", WEIGHT_GRAD: "W"}


@functools.lru_cache(maxsize=64)
def _kernel_tables(model, parallel):
    """``{part: {phase: KernelTable}}`` of ``model`` run with ``parallel``: what the
    system does not change, built once for the cost models of one model on many
    systems (the tables are not changed once built)."""
    return {part: {phase: KernelTable(kernels) for phase, kernels in
                   model.kernels(part, parallel).items()}
            for part in _PARTS}


@functools.lru_cache(maxsize=64)
def _all_kernels(model, parallel):
    """Every kernel of ``_kernel_tables(model, parallel)`` in one table, and how
    ``part_times`` sums them: per part, ``(kind, rows, hides)`` for each kind of
    operation, ``rows`` its kernels in that table (phase by phase) and ``hides`` the
    ``(kernel, partner)`` positions among them of each collective that hides behind
    a kernel of the same operation, in order. A system times every kernel in one
    pass (each kernel's time is its own, whatever the others)."""
    tables = _kernel_tables(model, parallel)
    kernels, where = [], {}
    for part in _PARTS:
        for phase, table in tables[part].items():
            where[part, phase] = np.arange(len(kernels), len(kernels) + len(table))
            kernels.extend(table.kernels)
    plan = {}
    for part in _PARTS:
        plan[part] = []
        for kind, phases in _KIND_PHASES.items():
            present = [phase for phase in phases if len(tables[part].get(phase, ()))]
            if not present:
                continue
            names = [name for phase in present for name in tables[part][phase].names]
            hide = [hidden for phase in present for hidden in tables[part][phase].hides_behind]
            position = {name: index for index, name in enumerate(names)}
            hides = [(index, position[partner]) for index, partner in enumerate(hide)
                     if partner is not None and partner in position]
            plan[part].append((kind, np.concatenate([where[part, phase] for phase in present]),
                               hides))
    return KernelTable(kernels), plan


def _remember(cache, key, compute, limit):
    """``compute()``, kept in ``cache`` under ``key``; a cache that holds ``limit``
    answers starts over."""
    found = cache.get(key)
    if found is None:
        if len(cache) >= limit:
            cache.clear()
        found = cache[key] = compute()
    return found


_SYSTEM_ANSWERS: dict[tuple, object] = {}


def _by_system(key, compute):
    """``compute()``, remembered under ``key``: a question of a system alone (its link
    matrices, a ring's time), asked again by every cost model on that system (one per
    microbatch size in a sweep). Equal systems are one key; at most 4096 answers."""
    return _remember(_SYSTEM_ANSWERS, key, compute, 4096)


def _present(keys, space):
    """``np.unique(keys, return_inverse=True)`` for ``keys`` in ``0 .. space-1``: by a
    table of the space when it is small beside the keys, else by np.unique's sort."""
    if space > 4 * len(keys) + 4096:
        unique, inverse = np.unique(keys, return_inverse=True)
        return unique, inverse.ravel()
    seen = np.zeros(space, dtype=bool)
    seen[keys] = True
    unique = np.flatnonzero(seen)
    position = np.empty(space, dtype=np.intp)
    position[unique] = np.arange(len(unique))
    return unique, position[keys]


def _end_stages(stages):
    """``(first, last)``: 1.0 on the first (embedding) and the last (output) stage."""
    first, last = np.zeros(stages), np.zeros(stages)
    if stages:
        first[0] = last[-1] = 1.0
    return first, last


class ModelCosts(CostModel):
    """A transformer on a system: per-kernel rooflines, Hockney transfers, memory in bytes.

    Durations are seconds and memory is bytes, for one tensor rank of each
    device (a device of the table is a pipeline rank: ``t`` GPUs with tensor
    parallelism). An operation costs the sum over its kernels (the layers of
    its stage, plus the embedding on stage 0 and the output layer and loss on
    the last stage) of each kernel's roofline plus the launch latency, and of
    the tensor-parallel collectives on the links inside a node (not overlapped
    with compute). A transfer moves ``d*b*s*h`` bytes (the activation forward,
    its gradient backward), ``/t`` per tensor rank with scatter-gather or
    sequence parallelism, over the link between its two devices (with
    scatter-gather alone, plus the receivers' all-gather of the whole tensor
    inside their node). A stage's
    activation is held from the start of its ``F`` to the end of its
    backward; ``I`` frees ``input_grad_release`` of it; a backward holds one
    layer's working memory while it runs (``transient_sizes``). Each device
    holds its stages' parameters times the persistent bytes per parameter.

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
        The tail's gradient sync of replicated stages (a ring all-reduce of the
        stage's gradients among the devices of the table holding it); default
        none, or every stage when the data-parallel all-reduce overlaps the
        backwards.
    optimizer : bool
        Add the end-of-iteration step per device to the tail: the optimizer
        update (the model's ``optimizer_step_bytes`` per parameter of its
        shard, at the memory roofline, after the division of the whole gradient
        buffer by the data-parallel size that Megatron-LM runs even at d = 1),
        after the data-parallel gradient all-reduce (when not overlapped), the
        all-gather of the updated parameters (with optimizer sharding) and the
        all-reduce of the tied embedding's gradients between the first and the
        last stage. With ``data_parallel > 1`` the step is always there.
    tensor_parallel, sequence_parallel, data_parallel, attention, optimizer_sharding, \
overlap_grad_reduce, scatter_gather
        See :class:`~tabsched.costs.parallel.Parallelism`; or give ``parallel``.
    parallel : Parallelism, optional

    Examples
    --------
    >>> from tabsched.schedules import generate
    >>> costs = ModelCosts("paper-128l", "mid_nw_mid_cp")
    >>> table = generate("1f1b", devices=8, microbatches=32)
    >>> str(table.op(0)), int(costs.stage_layers(table)[0])
    ('0F0', 16)
    >>> f = float(costs.op_durations(table)[0])  # 16 layers of kernels, each its own roofline
    >>> round(f * 1e3, 3)
    64.503
    >>> tp = ModelCosts("gpt3-175b", "dgx-a100", tensor_parallel=8, sequence_parallel=True)
    >>> tp.describe()["tensor_parallel"], tp.devices_per_node
    (8, 1)
    """

    level = "simulation"
    memory_unit = "bytes"
    time_unit = "s"

    def __init__(self, model, system, *, microbatch_size=None, recompute=None, overlap=1.0,
                 contention=None, blocking_sends=None, grad_sync=None, optimizer=False,
                 tensor_parallel=None, sequence_parallel=None, data_parallel=None,
                 attention=None, optimizer_sharding=None, overlap_grad_reduce=None,
                 scatter_gather=None, parallel=None):
        model = load_model(model)
        changes = {key: value for key, value in (("microbatch_size", microbatch_size),
                                                 ("recompute", recompute)) if value is not None}
        self.model = model.replace(**changes) if changes else model
        self.system = load_system(system)
        given = {key: value for key, value in (
            ("tensor_parallel", tensor_parallel), ("sequence_parallel", sequence_parallel),
            ("data_parallel", data_parallel), ("attention", attention),
            ("optimizer_sharding", optimizer_sharding),
            ("overlap_grad_reduce", overlap_grad_reduce), ("scatter_gather", scatter_gather))
            if value is not None}
        base = Parallelism() if parallel is None else parallel
        if not isinstance(base, Parallelism):
            raise InvalidParameterError(f"parallel must be a Parallelism, not "
                                        f"{type(base).__name__}")
        self.parallel = (base.replace(**given) if given else base).check(self.model, self.system)
        per_node = self.parallel.devices_per_node(self.system)
        self.placement = (self.system if per_node == self.system.devices_per_node
                          else self.system.replace(devices_per_node=per_node))
        self.overlap = _non_negative("overlap", overlap)
        contention = self.system.contention if contention is None else contention
        if contention not in CONTENTION_MODES:
            raise InvalidParameterError(f"contention {contention!r} is not one of "
                                        f"{', '.join(CONTENTION_MODES)}")
        self.contention = contention
        self.devices_per_node = per_node
        self.blocking_sends = (self.system.blocking_sends if blocking_sends is None
                               else bool(blocking_sends))
        replicas = self.parallel.data_parallel > 1
        self.grad_sync = "all" if replicas and self.parallel.overlap_grad_reduce else grad_sync
        self.optimizer = bool(optimizer)
        self.optimizer_step = self.optimizer or (replicas and not self.parallel.overlap_grad_reduce)
        self.input_grad_release = self.model.input_grad_release_for(self.parallel)
        self._tables = _kernel_tables(self.model, self.parallel)

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
        return self._samples(table.microbatch_sizes)

    def _samples(self, microbatch_sizes):
        sizes = np.asarray(microbatch_sizes, dtype=np.float64)
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

    def _remembered(self, store, key, compute):
        """``compute()``, remembered under ``key``: the per-shape work of a cost model
        depends on the table only through its stage count, layer split and microbatch
        sizes, and a sweep asks the same question for table after table. The arrays
        are read-only; a store holds at most 256 shapes."""
        return _remember(self.__dict__.setdefault(store, {}), key, compute, 256)

    def _shape(self, table):
        """Layers per stage, first/last-stage masks, unique samples and each microbatch's index."""
        key = (table.num_stages, table.stage_layers, table.microbatch_sizes)
        return self._remembered("_shapes", key, lambda: self._compute_shape(table))

    def _compute_shape(self, table):
        layers = self.stage_layers(table)
        samples = self.microbatch_samples(table)
        unique, inverse = np.unique(samples, return_inverse=True)
        self._check_int64(layers, unique, samples)
        first, last = _end_stages(len(layers))
        for array in (layers, first, last, unique, inverse):
            array.flags.writeable = False
        return layers, first, last, unique, inverse

    def _check_int64(self, layers, unique, samples):
        """Activation bytes (exact, in Python ints) must fit int64, per stage and in total."""
        if not len(layers) or not len(unique):
            return
        model = self.model
        per_layer = model.layer_activation(1)
        per_sample = [int(n) * per_layer for n in layers.tolist()]
        per_sample[0] += model.embedding_activation(1)
        per_sample[-1] += model.output_activation(1)
        largest = max(per_sample) * int(unique.max())
        total = sum(per_sample) * int(samples.sum())
        if max(largest, total) > _INT64_MAX:
            raise InvalidParameterError(
                f"microbatch_size {model.microbatch_size} makes the activations of one "
                f"iteration {float(total):.3g} bytes, which overflows int64 "
                f"({float(_INT64_MAX):.3g}); use a smaller microbatch_size")

    def _per_stage(self, per_part, layers, first, last):
        """``(kinds, stages, sizes)`` from ``{part: (kinds, sizes)}`` arrays."""
        return (layers[None, :, None] * per_part["layer"][:, None, :]
                + first[None, :, None] * per_part["embedding"][:, None, :]
                + last[None, :, None] * per_part["output"][:, None, :])

    def _stage_work(self, table):
        """FLOPs and bytes per (kind, stage, unique size), and the size index."""
        layers, first, last, unique, inverse = self._shape(table)
        model = self.model
        parts = {"layer": model.layer_work(unique, self.parallel),
                 "embedding": model.embedding_work(unique, self.parallel),
                 "output": model.output_work(unique, self.parallel)}
        work = [self._per_stage({part: parts[part][k] for part in _PARTS}, layers, first, last)
                for k in (0, 1)]
        return work[0], work[1], inverse

    # --------------------------------------------------------------- kernel times
    def _kernel_seconds(self, kernels, samples):
        """``(seconds, work, matrix efficiency, memory efficiency)`` per kernel and size."""
        samples = np.asarray(samples, dtype=np.float64)
        work = kernels.work(samples)
        system = self.system
        nbytes = work["read"] + work["written"]
        tokens = samples[None, :] * self.model.sequence
        seconds = (system.kernel_times(kernels.matrix[:, None], work["flops"], nbytes, tokens,
                                       work["outputs"]) + system.launch_latency)
        bandwidth, latency = system.group_link(True)
        t = self.parallel.tensor_parallel
        for index in np.flatnonzero(kernels.collective):
            seconds[index] = system.ring_time(kernels.kinds[index], work["message"][index], t,
                                              bandwidth, latency)
        return seconds, work

    def part_times(self, samples):
        """``{part: (kinds x sizes)}`` seconds of one layer, the embedding, the output.

        A collective that hides behind a kernel of the same operation (see
        :class:`~tabsched.costs.kernels.Kernel`) costs only what it runs
        longer than that kernel: its data-gradient all-reduce hides behind the
        weight gradient in a full backward ``B``, not in a split ``I``.
        """
        key = tuple(np.asarray(samples, dtype=np.float64).ravel().tolist())
        return self._remembered("_part_times", key, lambda: self._compute_part_times(samples))

    def _compute_part_times(self, samples):
        result = {}
        everything, plan = _all_kernels(self.model, self.parallel)
        every_seconds = self._kernel_seconds(everything, samples)[0]
        for part in _PARTS:
            times = np.zeros((4, len(samples)))
            for kind, rows, hides in plan[part]:
                cost = every_seconds[rows]
                for index, partner in hides:
                    cost[index] = np.maximum(cost[index] - cost[partner], 0.0)
                times[kind] = cost.sum(axis=0)
            times.flags.writeable = False
            result[part] = times
        return result

    # --------------------------------------------------------------- cost model
    def op_work(self, table):
        """``(flops, nbytes)`` of every operation of ``table`` (float arrays, per tensor rank)."""
        flops, nbytes, inverse = self._stage_work(table)
        index = (table.kind, table.stage, inverse[table.microbatch])
        return flops[index], nbytes[index]

    def op_durations(self, table):
        """Seconds of every operation: the sum of its kernels' rooflines and collectives."""
        layers, first, last, unique, inverse = self._shape(table)
        durations = self._per_stage(self.part_times(unique), layers, first, last)
        return durations[table.kind, table.stage, inverse[table.microbatch]]

    def microbatch_durations(self, table):
        """``(kinds x stages)`` seconds of one full microbatch on ``table``'s stages: what
        ``op_durations`` gives a table of one full-size microbatch with those stages."""
        layers = self.stage_layers(table)
        samples = self.__dict__.get("_full_samples")
        if samples is None:     # the cost model's own microbatch, as a table holds it
            samples = self.__dict__["_full_samples"] = self._samples((1.0,))
        self._check_int64(layers, samples, samples)
        first, last = _end_stages(len(layers))
        return self._per_stage(self.part_times(samples), layers, first, last)[:, :, 0]

    def transfer_costs(self, table, transfers):
        """``(seconds, bytes)`` per transfer: ``latency + bytes / bandwidth`` on its link.

        With scatter-gather and no sequence parallelism, each tensor rank sends
        ``1/t`` of the tensor and the receiving ranks all-gather it inside their
        node before it is used (:meth:`receive_gather_seconds`): that gather is
        part of the transfer's time.
        """
        self.placement.check_devices(table.num_devices)   # overrides name devices it has
        if len(transfers) == 0:
            return np.zeros(0), np.zeros(0)
        latency, volume, nbytes = self._transfer_parts(table, transfers)
        return latency + volume, nbytes

    def transfer_parts(self, table, transfers):
        """``(latency, bytes / bandwidth)`` per transfer, on its link (Hockney).

        The receivers' all-gather of a scattered tensor counts as latency: it
        runs on the links inside a node, whatever the link between the stages.
        """
        if len(transfers) == 0:
            return np.zeros(0), np.zeros(0)
        latency, volume, _ = self._transfer_parts(table, transfers)
        return latency, volume

    def _transfer_parts(self, table, transfers):
        _, _, _, unique, inverse = self._shape(table)
        per_microbatch = self.model.transfer_bytes(unique, self.parallel)[inverse]
        gather = self.receive_gather_seconds(unique)[inverse]
        nbytes = per_microbatch[transfers.microbatch]
        bandwidth, latency = self._link_matrices(table.num_devices)
        src, dst = transfers.src, transfers.dst
        return (latency[src, dst] + gather[transfers.microbatch], nbytes / bandwidth[src, dst],
                nbytes)

    def _link_matrices(self, num_devices):
        """``placement.link_matrices(num_devices)``, remembered (read-only arrays)."""
        def compute():
            matrices = self.placement.link_matrices(num_devices)
            for matrix in matrices:
                matrix.flags.writeable = False
            return matrices
        return _by_system(("links", self.placement, num_devices), compute)

    @classmethod
    def stacked_prices(cls, lowered, cost_models):
        """The prices of each cost model for ``lowered``, one row each, to the bit.

        Cost models with one :meth:`memory_key` (the same transformer and
        parallelism, e.g. one model on several systems) share the table's shape,
        its gather indices and the bytes of its transfers; what each system
        changes (its per-stage times, its links) is stacked and gathered once for
        all of them, with the same arithmetic per element as ``op_durations`` and
        ``transfer_costs``. The lowering composes them (``stacked_node_durations``).
        """
        cost_models = list(cost_models)
        if any(type(costs) is not ModelCosts for costs in cost_models):   # a subclass's own
            return super().stacked_prices(lowered, cost_models)
        groups = {}
        for row, costs in enumerate(cost_models):
            groups.setdefault(costs.memory_key(), []).append(row)
        if len(groups) == 1:
            return cls._shared_prices(lowered, cost_models)
        shared = [(rows, cls._shared_prices(lowered, [cost_models[row] for row in rows]))
                  for rows in groups.values()]
        n = len(cost_models)
        first = shared[0][1]
        op, transfer, overlap = (np.empty((n,) + part.shape[1:])
                                 for part in (first.op, first.transfer, first.overlap))
        extra = {kind: np.empty((n, part.shape[1])) for kind, part in first.extra.items()}
        for rows, prices in shared:
            op[rows], transfer[rows], overlap[rows] = prices.op, prices.transfer, prices.overlap
            for kind, part in prices.extra.items():
                extra[kind][rows] = part
        return Prices(op=op, transfer=transfer, extra=extra, overlap=overlap)

    @staticmethod
    def _shared_prices(lowered, cost_models):
        """``stacked_prices`` of cost models with one memory key."""
        table, transfers = lowered.table, lowered.transfers
        first_costs = cost_models[0]
        layers, first, last, unique, inverse = first_costs._shape(table)
        times = [costs.part_times(unique) for costs in cost_models]
        # _per_stage of each, with the cost models as a leading axis
        per_part = {part: np.stack([one[part] for one in times])[:, :, None, :]
                    for part in _PARTS}
        per_stage = (layers[None, None, :, None] * per_part["layer"]
                     + first[None, None, :, None] * per_part["embedding"]
                     + last[None, None, :, None] * per_part["output"])
        index = ((table.kind.astype(np.intp) * table.num_stages + table.stage) * len(unique)
                 + inverse[table.microbatch])
        n = len(cost_models)
        op = np.empty((n, len(table)))
        flat = per_stage.reshape(n, -1)
        for row in range(n):
            np.take(flat[row], index, out=op[row], mode="clip")
        D = table.num_devices
        for costs in cost_models:
            costs.placement.check_devices(D)
        transfer = np.empty((n, len(transfers)))
        if len(transfers):
            # a transfer's time depends on its link and its microbatch's size only: each
            # pair of them present is priced once, then gathered
            U = len(unique)
            pairs, which = _present((transfers.src.astype(np.intp) * D + transfers.dst) * U
                                    + inverse[transfers.microbatch], D * D * U)
            link, size = pairs // U, pairs % U
            nbytes = first_costs.model.transfer_bytes(unique, first_costs.parallel)
            links = [costs._link_matrices(D) for costs in cost_models]
            bandwidth = np.stack([matrices[0].ravel() for matrices in links])[:, link]
            latency = np.stack([matrices[1].ravel() for matrices in links])[:, link]
            gather = np.stack([costs.receive_gather_seconds(unique)
                               for costs in cost_models])[:, size]
            per_pair = (latency + gather) + nbytes[size] / bandwidth
            for row in range(n):
                np.take(per_pair[row], which, mode="clip", out=transfer[row])
        extra = {kind: np.array([np.asarray(costs.node_prices(lowered, kind), dtype=np.float64)
                                 for costs in cost_models])
                 for kind in lowered.extra_kinds}
        overlap = np.array([costs.overlap for costs in cost_models], dtype=np.float64)
        return Prices(op=op, transfer=transfer, extra=extra, overlap=overlap)

    def memory_key(self):
        """The transformer and the parallelism: all that memory sizes depend on."""
        return (type(self), self.model, self.parallel)

    def receive_gather_seconds(self, samples):
        """Seconds the receiving tensor ranks spend re-assembling a scattered transfer.

        Megatron-LM's scatter-gather (``--scatter-gather-tensors-in-pipeline``,
        on by default; off with sequence parallelism, whose tensors are already
        split) sends ``1/t`` of the ``d*b*s*h`` activation or gradient from each
        tensor rank; after the receive, ``gather_split_1d_tensor`` all-gathers the
        whole tensor over the tensor group (megatron/p2p_communication.py,
        ``_communicate``, 2021-2022): a ring all-gather on the links inside the
        node. 0 without tensor parallelism or with sequence parallelism.
        """
        samples = np.asarray(samples, dtype=np.float64)
        parallel = self.parallel
        t = parallel.tensor_parallel
        if t == 1 or parallel.sequence_parallel or not parallel.scatter_gather:
            return np.zeros(samples.shape)
        whole = self.model.transfer_bytes(samples, parallel.replace(scatter_gather=False))
        bandwidth, latency = self.system.group_link(True)
        return np.asarray(self.system.ring_time("all_gather", whole, t, bandwidth, latency),
                          dtype=np.float64) * np.ones(samples.shape)

    def activation_sizes(self, table):
        """Bytes each operation's (stage, microbatch) holds from its F to its backward."""
        layers, first, last, unique, inverse = self._shape(table)
        model, parallel = self.model, self.parallel
        per_stage = (layers[:, None] * np.asarray(model.layer_activation(
                        unique, parallel=parallel), dtype=np.float64)[None, :]
                     + first[:, None] * model.embedding_activation(unique, parallel)[None, :]
                     + last[:, None] * model.output_activation(unique, parallel)[None, :])
        return per_stage[table.stage, inverse[table.microbatch]]

    def transient_sizes(self, table):
        """Bytes each operation holds only while it runs: one layer's backward working memory."""
        layers, _, _, unique, inverse = self._shape(table)
        per_size = self.model.layer_transient(unique, self.parallel)
        backward = (table.kind == BACKWARD) | (table.kind == INPUT_GRAD)
        has_layers = layers[table.stage] > 0
        return np.where(backward & has_layers, per_size[inverse[table.microbatch]], 0.0)

    def stage_parameters(self, table):
        """Parameters of each stage (int64 array; all tensor ranks together)."""
        return self._stage_parameters(table).copy()

    def _stage_parameters(self, table):
        """``stage_parameters``, remembered per stage count and layer split (read-only)."""
        def compute():
            layers = self.stage_layers(table).tolist()
            S = len(layers)
            # stages alike (same layers, neither or both ends) hold alike: each kind once
            kinds = [(layers[s], s == 0, s == S - 1) for s in range(S)]
            each = {kind: self.model.stage_parameters(*kind) for kind in set(kinds)}
            params = np.array([each[kind] for kind in kinds], dtype=np.int64)
            params.flags.writeable = False
            return params
        return self._remembered("_stage_params", (table.num_stages, table.stage_layers),
                                compute)

    def _device_parameters(self, table):
        """Parameters of each device's stages, per tensor rank (float array)."""
        D, S = table.num_devices, table.num_stages
        params = self._stage_parameters(table) / self.parallel.tensor_parallel
        key = table.stage.astype(np.int64) * D + table.device
        pairs = np.flatnonzero(np.bincount(key, minlength=S * D))
        return np.bincount(pairs % D, weights=params[pairs // D], minlength=D)

    def persistent_memory(self, table):
        """Bytes each device (tensor rank) holds all the time: weights, gradients, optimizer state."""
        shards = self.parallel.data_parallel if self.parallel.optimizer_sharding else 1
        return self._device_parameters(table) * self.model.optimizer_state_bytes(shards)

    def _all_reduce_time(self, nbytes, devices, num_devices):
        """``placement.all_reduce_time(nbytes, devices)`` among some of ``num_devices``,
        remembered: a sweep syncs the same stages among the same devices table after
        table (and the link matrices of the run serve every ring in it)."""
        devices = tuple(sorted(int(device) for device in devices))
        return _by_system(("all_reduce", self.placement, nbytes, devices),
                          lambda: self.placement.all_reduce_time(
                              nbytes, devices, self._link_matrices(num_devices)))

    def _data_parallel_time(self, collective, nbytes):
        """A ring collective over the ``d`` replicas of a tensor rank."""
        d = self.parallel.data_parallel
        bandwidth, latency = self.system.group_link(
            self.parallel.data_parallel_inside_node(self.system))
        return self.system.ring_time(collective, nbytes, d, bandwidth, latency)

    def _embedding_sync(self, table):
        """Seconds each device spends all-reducing the tied embedding's gradient (Megatron-LM)."""
        D, S = table.num_devices, table.num_stages
        sync = np.zeros(D)
        if not self.model.tied_embeddings or S < 2:
            return sync
        holders = {stage: sorted({int(d) for d in table.device[table.stage == stage]})
                   for stage in (0, S - 1)}
        pair = sorted({holders[0][0], holders[S - 1][0]})
        if len(pair) < 2:
            return sync
        nbytes = (self.model.embedding_parameters / self.parallel.tensor_parallel
                  * self.model.grad_bytes)
        seconds = self._all_reduce_time(float(nbytes), pair, D)
        sync[sorted(set(holders[0]) | set(holders[S - 1]))] = seconds
        return sync

    def node_prices(self, lowered, kind):
        """Seconds of the gradient syncs of synced stages, or of each device's
        end-of-iteration step (``kind`` SYNC or OPTIMIZER; other kinds cost 0).

        A sync node all-reduces its stage's gradients among the table's
        devices holding it, then (overlapped data parallelism) over the
        replicas. The step of a device: the data-parallel all-reduce of its
        gradients (reduce-scatter with optimizer sharding) when not
        overlapped, the tied-embedding all-reduce, the optimizer update at the
        memory roofline (after the gradient buffer's division by ``d``: one
        read and one write of the gradients) and, with optimizer sharding, the
        all-gather of the updated parameters.
        """
        if kind == SYNC:
            return self._sync_prices(lowered)
        if kind == OPTIMIZER:
            return self._step_prices(lowered)
        return np.zeros(lowered.count(kind))

    def _sync_prices(self, lowered):
        table = lowered.table
        params = self._stage_parameters(table) / self.parallel.tensor_parallel
        gradient_bytes = params * float(self.model.grad_bytes)
        replicas = self.parallel.data_parallel > 1
        reduce = ("reduce_scatter" if self.parallel.optimizer_sharding and replicas
                  else "all_reduce")
        sync = []
        for k, stage in enumerate(lowered.sync_stage):
            seconds = self._all_reduce_time(float(gradient_bytes[int(stage)]),
                                            lowered.sync_devices(k), table.num_devices)
            if replicas and self.parallel.overlap_grad_reduce:
                seconds += self._data_parallel_time(reduce, gradient_bytes[int(stage)])
            sync.append(seconds)
        return np.array(sync, dtype=np.float64)

    def _step_prices(self, lowered):
        if not lowered.count(OPTIMIZER):
            return np.zeros(0)
        table = lowered.table
        replicas = self.parallel.data_parallel > 1
        sharded = self.parallel.optimizer_sharding and replicas
        reduce = "reduce_scatter" if sharded else "all_reduce"
        device_params = self._device_parameters(table)
        step = self._embedding_sync(table)
        if replicas and not self.parallel.overlap_grad_reduce:
            step = step + self._data_parallel_time(reduce, device_params * self.model.grad_bytes)
        shards = self.parallel.data_parallel if sharded else 1
        state_bytes = self.model.optimizer_step_bytes * device_params / shards
        # Megatron-LM's data-parallel step divides the whole gradient buffer by d before
        # its all-reduce, at d = 1 too (megatron/model/distributed.py, allreduce_gradients:
        # ``buffer_.data /= mpu.get_data_parallel_world_size()``): read and write g bytes
        scale_bytes = 2.0 * self.model.grad_bytes * device_params
        none, one = np.zeros(len(state_bytes)), np.ones(len(state_bytes))
        step = (step + self.system.compute_time(none, scale_bytes, one)
                + self.system.compute_time(none, state_bytes, one))
        if sharded:
            step = step + self._data_parallel_time("all_gather",
                                                   device_params * self.model.dtype_bytes)
        return np.where(device_params > 0, step, 0.0)

    # ------------------------------------------------------------------ report
    def kernel_report(self, part="layer", samples=None):
        """Every kernel of one layer (or the embedding, or the output) with its cost.

        Returns a list of dicts, in the order the kinds run them (``F``, the
        recompute forward ``R``, ``I``, ``W``): ``phase``, ``name``, ``class``,
        ``flops``, ``bytes_read``, ``bytes_written`` (a collective's message in
        ``bytes_read``), ``bound`` (``compute``, ``memory``, ``network``),
        ``efficiency`` (of the binding resource; for a matrix kernel the table's
        value times its wave quantization), ``seconds`` (its own, before any
        hiding), ``beside`` (the kernel a collective runs beside, or None).
        """
        if part not in _PARTS:
            raise InvalidParameterError(f"part {part!r} is not one of {', '.join(_PARTS)}")
        samples = float(self.model.microbatch_size if samples is None else samples)
        system = self.system
        rows = []
        for phase in ("F", "R", "I", "W"):
            kernels = self._tables[part][phase]
            if not len(kernels):
                continue
            seconds, work = self._kernel_seconds(kernels, np.array([samples]))
            tokens = samples * self.model.sequence
            for index, kernel in enumerate(kernels.kernels):
                flops = float(work["flops"][index, 0])
                read, written = float(work["read"][index, 0]), float(work["written"][index, 0])
                if kernel.cls == "collective":
                    bound, efficiency = "network", system.intra_node_efficiency
                    read, written = float(work["message"][index, 0]), 0.0
                else:
                    e_c = float(system.compute_efficiency_at(tokens, flops)
                                * system.wave_efficiency(work["outputs"][index, 0]))
                    e_m = float(system.memory_efficiency_at(read + written))
                    compute = flops / (system.peak_flops * e_c) if kernel.cls == "matrix" else 0.0
                    memory = (read + written) / (system.memory_bandwidth * e_m)
                    bound, efficiency = (("compute", e_c) if compute >= memory
                                         else ("memory", e_m))
                rows.append({"phase": phase, "name": kernel.name, "class": kernel.cls,
                             "flops": flops, "bytes_read": read, "bytes_written": written,
                             "bound": bound, "efficiency": efficiency,
                             "seconds": float(seconds[index, 0]),
                             "beside": kernel.hides_behind})
        return rows

    def __repr__(self):
        """The model and the system with their key numbers, and the run's settings.

        >>> ModelCosts("paper-128l", "mid_nw_mid_cp")  # doctest: +ELLIPSIS
        ModelCosts(paper-128l: 128 layers, hidden 4096, ... on mid_nw_mid_cp: 1 PFLOP/s, ...)
        """
        from tabsched.costs.units import format_quantity
        model, system = self.model, self.system
        settings = ", ".join(f"{key}={value}" for key, value in self.describe().items()
                             if key not in ("model", "transformer", "system"))
        return (f"ModelCosts({model.name}: {model.layers} layers, hidden {model.hidden}, "
                f"{model.parameters / 1e9:.3g}B parameters on {system.name}: "
                f"{format_quantity(system.peak_flops, 'FLOP/s')}, "
                f"{format_quantity(system.memory_bandwidth, 'B/s')} memory, "
                f"{format_quantity(system.intra_node_bandwidth, 'B/s')} / "
                f"{format_quantity(system.inter_node_bandwidth, 'B/s')} links inside / "
                f"between nodes; {settings})")

    def describe(self):
        """Names and settings for reports and JSON (the numbers live in the presets)."""
        info = {"model": "ModelCosts", "transformer": self.model.name,
                "system": self.system.name, "microbatch_size": self.model.microbatch_size,
                "recompute": self.model.recompute}
        defaults = Parallelism().describe()
        info.update({key: value for key, value in self.parallel.describe().items()
                     if key in ("tensor_parallel", "data_parallel", "attention")
                     or value != defaults[key]})
        if self.optimizer:
            info["optimizer"] = True
        if self.overlap != 1.0:
            info["overlap"] = self.overlap
        return info

