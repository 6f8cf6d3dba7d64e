"""ModelCosts: a transformer on a system, in seconds and bytes.

The transformer (:mod:`tabsched.costs.transformer`) gives each operation's
kernels (:mod:`tabsched.costs.kernels`) and activation bytes; the system
(:mod:`tabsched.costs.system`) times each kernel by its own roofline and prices
every transfer on its link (Hockney) and every collective on its ring
(:mod:`tabsched.costs.collectives`); the execution
(:class:`~tabsched.execution.Execution`) says how many tensor ranks share a stage
and how many replicas of the pipeline reduce their gradients, and its placement
(:mod:`tabsched.costs.placement`) which links each parallel group crosses.

A cost model is frozen: assigning to it raises. What it computes per table shape
is remembered by :mod:`tabsched._memo`, keyed by the frozen model, system and
execution it was built from, so no answer can outlive a change.
"""

import numpy as np

from tabsched._memo import memo
from tabsched.compose import Prices
from tabsched.costs.base import CostModel, _non_negative
from tabsched.costs.collectives import group_time
from tabsched.costs.latent import latent_parameter_parts
from tabsched.costs.model_work import (PARTS, check_int64, dense_counts, end_stages,
                                       kernel_report, stage_rank_parameters,
                                       kernel_tables, link_matrices, microbatch_samples,
                                       part_times, present, priced_part, ring_all_reduce,
                                       stage_layers, stage_parameters, table_shape)
from tabsched.costs.placement import Placement
from tabsched.costs.sharded import persistent_bytes_per_parameter, shard_prices, shard_sizes
from tabsched.costs.streams import cell_factors, pair_factor
from tabsched.costs.system import load_system
from tabsched.costs.tail import FP8_WEIGHT_BYTES, step_prices, sync_prices
from tabsched.costs.transformer import load_model
from tabsched.exceptions import InvalidParameterError
from tabsched.execution import Execution
from tabsched.nodes import OPTIMIZER, REDUCE_GRAD, RESHARD, SYNC, UNSHARD
from tabsched.table import BACKWARD, INPUT_GRAD

__all__ = ["ModelCosts"]


class ModelCosts(CostModel):
    """A transformer on a system: per-kernel rooflines, Hockney transfers, memory in bytes.

    Durations are seconds and memory is bytes, for one tensor rank of each
    device (a device of the table is a pipeline rank: ``t`` GPUs with tensor
    parallelism). An operation costs the sum over its kernels (the layers of
    its stage, plus the embedding on stage 0 and the output layer and loss on
    the last stage) of each kernel's roofline plus the launch latency, and of
    the tensor-parallel collectives over the tensor group where it sits (inside
    a node, or across whole nodes: :mod:`tabsched.costs.collectives`; not
    overlapped with compute). A transfer moves ``d*b*s*h`` bytes (the activation forward,
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
    execution : Execution or str, optional
        How the model runs across devices (:class:`~tabsched.execution.Execution`,
        or a TOML/JSON file of one); default ``Execution()``. The keywords
        below are conveniences that change one field each (``optimizer``:
        ``optimizer_step``, ``optimizer_sharding``: ``zero_stage=1``); the
        resolved execution is :attr:`execution`.
    microbatch_size : int, optional
        Samples in a full microbatch; default the model's. A table's microbatch
        of relative size ``x`` holds ``x * microbatch_size`` samples, which must
        be a whole number.
    recompute : {"none", "selective", "full"}, optional
        Default the model's.
    overlap : float, optional
        Factor on the summed durations of an overlapped cell's parts, a what-if constant.
        None (the default): each overlapped cell is timed by the two-stream model, its
        operations' compute beside their collectives (:mod:`tabsched.costs.streams`).
    contention : {"none", "link", "nic"}, optional
        Default the system's.
    blocking_sends : bool, optional
        Default the system's; the older spelling of ``p2p="blocking"``.
    p2p : {"free", "blocking", "megatron-batched", "megatron-overlap", "pytorch"}, optional
        How pipeline sends are posted and waited (:mod:`tabsched.p2p`).
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
overlap_grad_reduce, scatter_gather, zero_stage, reshard_after_forward, prefetch, \
grad_bucket_size, align_grad_reduce, fp8, context_parallel, cp_comm, expert_parallel, \
max_connections
        Fields of :class:`~tabsched.execution.Execution`.
    parallel : Execution, optional
        The name ``execution`` had before executions held the whole run.

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
    >>> tp.execution.contention, tp.placement.group("tensor").tier
    ('link', 'node')
    """

    level = "simulation"
    memory_unit = "bytes"
    time_unit = "s"

    def __init__(self, model, system, execution=None, *, microbatch_size=None, recompute=None,
                 overlap=None, contention=None, blocking_sends=None, grad_sync=None,
                 optimizer=None, tensor_parallel=None, sequence_parallel=None,
                 data_parallel=None, attention=None, optimizer_sharding=None,
                 overlap_grad_reduce=None, scatter_gather=None, parallel=None, p2p=None,
                 zero_stage=None, reshard_after_forward=None, prefetch=None,
                 grad_bucket_size=None, align_grad_reduce=None, fp8=None,
                 context_parallel=None, cp_comm=None, expert_parallel=None,
                 max_connections=None):
        asked = _asked_execution(execution, parallel, {
            "microbatch_size": microbatch_size, "recompute": recompute,
            "contention": contention, "blocking_sends": blocking_sends, "p2p": p2p,
            "grad_sync": grad_sync, "optimizer_step": True if optimizer else None,
            "tensor_parallel": tensor_parallel, "sequence_parallel": sequence_parallel,
            "data_parallel": data_parallel, "attention": attention,
            "optimizer_sharding": optimizer_sharding,
            "overlap_grad_reduce": overlap_grad_reduce, "scatter_gather": scatter_gather,
            "zero_stage": zero_stage, "reshard_after_forward": reshard_after_forward,
            "prefetch": prefetch, "grad_bucket_size": grad_bucket_size,
            "align_grad_reduce": align_grad_reduce, "fp8": fp8,
            "context_parallel": context_parallel, "cp_comm": cp_comm,
            "expert_parallel": expert_parallel, "max_connections": max_connections})
        self._given_model = model = load_model(model)
        changes = {key: value for key, value in (("microbatch_size", asked.microbatch_size),
                                                 ("recompute", asked.recompute))
                   if value is not None}
        self.model = model.replace(**changes) if changes else model
        self.system = load_system(system)
        #: What was asked (None fields left to the model and the system).
        self.asked = asked
        #: The execution this cost model prices, every field resolved.
        self.execution = asked.resolved(self.model, self.system).check(self.model, self.system)
        #: Where each parallel group sits on the system's nodes.
        self.placement = Placement(self.execution, self.system)
        #: The constant factor on overlapped cells, if one was given (else the two-stream
        #: model; ``overlap`` then reads 1.0 for the table-level heuristics that want one)
        self.overlap_factor = None if overlap is None else _non_negative("overlap", overlap)
        self.overlap = 1.0 if overlap is None else self.overlap_factor
        self.input_grad_release = self.model.input_grad_release_for(self.execution)
        self._priced = priced_part(self.execution)
        self._tables = kernel_tables(self.model, self._priced)

    def with_execution(self, execution):
        """This model on this system, run as ``execution`` (its None fields the model's and
        the system's own); ``self`` when that is the execution priced already."""
        execution = Execution() if execution is None else execution
        if not isinstance(execution, Execution):
            raise InvalidParameterError(f"execution must be an Execution, not "
                                        f"{type(execution).__name__}")
        if execution in (self.asked, self.execution):
            return self
        return type(self)(self._given_model, self.system, execution,
                          overlap=self.overlap_factor)

    def _value(self):
        return (type(self), self._given_model, self.model, self.system, self.execution,
                self.overlap_factor)

    @property
    def parallel(self):
        """The execution (the name it had when it held only the parallelism)."""
        return self.execution

    @property
    def memory_capacity(self):
        """One GPU's memory in bytes, the system's ``memory_capacity`` (None if it states
        none): what a device of the table may hold, since every byte a result reports is
        one tensor rank's."""
        return self.system.memory_capacity

    @property
    def devices_per_node(self):
        """Pipeline ranks (table devices) per node: what the lowering's ``nic`` ports count."""
        return self.placement.pipeline_ranks_per_node

    # ----------------------------------------------------------- the table's shape
    def stage_layers(self, table):
        """Layers of each stage: ``table.stage_layers``, or an even split."""
        return stage_layers(self.model, table.num_stages, table.stage_layers)

    def microbatch_samples(self, table):
        """Samples in each microbatch of ``table`` (float array of whole numbers)."""
        return microbatch_samples(self.model, table.microbatch_sizes)

    def _shape(self, table):
        """Layers per stage, first/last-stage masks, unique samples and each microbatch's index.

        With a global batch in the execution, the table's microbatches must hold one
        pipeline's share of it: ``global_batch / data_parallel`` samples.
        """
        shape = table_shape(self.model, table.num_stages, table.stage_layers,
                             table.microbatch_sizes)
        run = self.execution
        if run.global_batch is not None:
            held = float((shape[3][shape[4]] / _slice_counts(table)).sum())
            share = run.global_batch // run.data_parallel
            if held != share:
                raise InvalidParameterError(
                    f"the table's {table.num_microbatches} microbatches hold {held:g} samples "
                    f"per pipeline, but the execution's global_batch {run.global_batch} over "
                    f"data_parallel {run.data_parallel} asks for {share}")
        return shape

    # ---------------------------------------------------------- sequence slices
    def slice_view(self, index, count, partition="even"):
        """This cost model pricing slice ``index`` of sequences cut into ``count`` by
        ``partition``: the same system and execution with the model's view of a slice
        (:meth:`TransformerModel.sliced`: with ``even``, ``s/k`` tokens whose attention
        meets ``(i+1) s/k`` keys; with ``compute``, the bounds of
        :func:`~tabsched.costs.transformer.slice_bounds`). ``self`` for slice 0 of 1."""
        if count == 1:
            return self
        return _slice_view(self, int(index), int(count), partition)

    def _per_slice(self, table, answer, microbatch):
        """``answer(costs)`` (an array, or a tuple of arrays, one entry per element of
        ``microbatch``) for a table of sequence slices: each entry as the view of its
        microbatch's slice prices it (:meth:`slice_view`, cut by the table's
        ``slice_partition``); ``answer(self)`` for a table of whole sequences."""
        if table.sequence_slices is None:
            return answer(self)
        spec = np.asarray(table.sequence_slices, dtype=np.int64)[np.asarray(microbatch)]
        pairs, which = np.unique(spec, axis=0, return_inverse=True) if len(spec) else \
            (np.zeros((0, 2), dtype=np.int64), np.zeros(0, dtype=np.intp))
        which = which.ravel()
        result = None
        for row, (index, count) in enumerate(pairs.tolist()):
            got = answer(self.slice_view(index, count, table.slice_partition))
            parts = got if isinstance(got, tuple) else (got,)
            if result is None:
                result = tuple(np.array(part, dtype=np.float64) for part in parts)
            mask = which == row
            for into, part in zip(result, parts):
                into[mask] = np.asarray(part)[mask]
        if result is None:
            return answer(self)
        return result if isinstance(got, tuple) else result[0]

    def _per_stage(self, per_part, layers, first, last):
        """``(kinds, stages, sizes)`` from ``{part: (kinds, sizes)}`` arrays."""
        return _stage_sum(self.model, {part: per_part[part][:, None, :] for part in PARTS},
                          layers[None, :, None], first[None, :, None], last[None, :, None])

    def _stage_work(self, table):
        """FLOPs and bytes per (kind, stage, unique size), and the size index."""
        layers, first, last, unique, inverse = self._shape(table)
        model = self.model
        parts = {part: model._work(part, unique, self.execution) for part in PARTS}
        work = [self._per_stage({part: parts[part][k] for part in PARTS}, layers, first, last)
                for k in (0, 1)]
        return work[0], work[1], inverse

    # --------------------------------------------------------------- kernel times
    def part_times(self, samples):
        """``{part: (kinds x sizes)}`` seconds of one layer, the embedding, the output.

        A collective that hides behind a kernel of the same operation (see
        :class:`~tabsched.costs.kernels.Kernel`) costs only what it runs
        longer than that kernel: its data-gradient all-reduce hides behind the
        weight gradient in a full backward ``B``, not in a split ``I``.
        """
        key = tuple(np.asarray(samples, dtype=np.float64).ravel().tolist())
        return part_times(self.model, self.system, self.placement, key)

    # --------------------------------------------------------------- cost model
    def op_work(self, table):
        """``(flops, nbytes)`` of every operation of ``table`` (float arrays, per tensor rank;
        a sequence slice's as its view counts them, :meth:`slice_view`)."""
        return self._per_slice(table, lambda costs: costs._op_work(table), table.microbatch)

    def _op_work(self, table):
        flops, nbytes, inverse = self._stage_work(table)
        index = (table.kind, table.stage, inverse[table.microbatch])
        return flops[index], nbytes[index]

    def op_durations(self, table):
        """Seconds of every operation: the sum of its kernels' rooflines and collectives
        (a sequence slice's kernels those of its view, :meth:`slice_view`)."""
        return self._per_slice(table, lambda costs: costs._op_durations(table),
                               table.microbatch)

    def _op_durations(self, table):
        layers, first, last, unique, inverse = self._shape(table)
        durations = self._per_stage(self.part_times(unique), layers, first, last)
        return durations[table.kind, table.stage, inverse[table.microbatch]]

    def microbatch_durations(self, table):
        """``(kinds x stages)`` seconds of one full microbatch on ``table``'s stages: what
        ``op_durations`` gives a table of one full-size microbatch with those stages."""
        layers = self.stage_layers(table)
        samples = microbatch_samples(self.model, (1.0,))   # the cost model's own microbatch
        check_int64(self.model, layers, samples, samples)
        first, last = end_stages(len(layers))
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
        # a slice sends its s/k tokens' activation (or gradient)
        return self._per_slice(table, lambda costs: costs._whole_transfer_parts(
            table, transfers), transfers.microbatch)

    def _whole_transfer_parts(self, table, transfers):
        _, _, _, unique, inverse = self._shape(table)
        per_microbatch = self.model.transfer_bytes(unique, self.execution)[inverse]
        gather = self.receive_gather_seconds(unique)[inverse]
        nbytes = per_microbatch[transfers.microbatch]
        bandwidth, latency = self._link_matrices(table.num_devices)
        src, dst = transfers.src, transfers.dst
        return (latency[src, dst] + gather[transfers.microbatch], nbytes / bandwidth[src, dst],
                nbytes)

    def _link_matrices(self, num_devices):
        """``placement.link_matrices(num_devices)``, remembered (read-only arrays)."""
        return link_matrices(self.placement.pipeline_view, num_devices)

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
        if any(type(costs) is not ModelCosts for costs in cost_models) or \
                lowered.table.sequence_slices is not None:   # a subclass's own; slices' views
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
                    for part in PARTS}
        per_stage = _stage_sum(first_costs.model, per_part, layers[None, None, :, None],
                               first[None, None, :, None], last[None, None, :, None])
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
            pairs, which = present((transfers.src.astype(np.intp) * D + transfers.dst) * U
                                    + inverse[transfers.microbatch], D * D * U)
            link, size = pairs // U, pairs % U
            nbytes = first_costs.model.transfer_bytes(unique, first_costs.execution)
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
        overlap = np.array([costs.overlap_factors(lowered) for costs in cost_models],
                           dtype=np.float64)
        return Prices(op=op, transfer=transfer, extra=extra, overlap=overlap)

    def overlap_factors(self, lowered):
        """The factor on each overlapped cell: the two-stream model's time of the cell
        over its operations' sum (:func:`tabsched.costs.streams.cell_factors`), or the
        constant ``overlap`` when one was given."""
        if self.overlap_factor is not None:
            return super().overlap_factors(lowered)
        return cell_factors(self, lowered)

    def pair_overlap_factor(self, table):
        """The two-stream model's factor on a full microbatch's forward beside its
        backward, over ``table``'s stages (:func:`tabsched.costs.streams.pair_factor`), or
        the constant ``overlap`` when one was given."""
        if self.overlap_factor is not None:
            return super().pair_overlap_factor(table)
        return pair_factor(self, table)

    def memory_key(self):
        """The transformer and the priced part of the execution: all that memory sizes
        depend on."""
        return (type(self), self.model, self._priced)

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
        run = self.execution
        if run.tensor_parallel == 1 or run.sequence_parallel or not run.scatter_gather:
            return np.zeros(samples.shape)
        whole = self.model.transfer_bytes(samples, run.replace(scatter_gather=False))
        return np.asarray(group_time("all_gather", whole, self.placement.group("tensor"),
                                     self.system), dtype=np.float64) * np.ones(samples.shape)

    def activation_sizes(self, table):
        """Bytes each operation's (stage, microbatch) holds from its F to its backward.

        A sequence slice holds its view's (:meth:`slice_view`): the per-token activations
        of its tokens (``s/k``, ``1/k`` of the microbatch's, cut evenly; ``b_{i+1} - b_i``
        by the ``compute`` partition) and, without FlashAttention, its scores over its
        ``b_{i+1}`` keys. Its keys and values are part of what it holds
        until its own backward, which runs after every later slice's (the table's
        order, Seq1F1B): so the key-value cache that later slices attend to is held
        until their backwards are done, and counted once.
        """
        return self._per_slice(table, lambda costs: costs._activation_sizes(table),
                               table.microbatch)

    def _activation_sizes(self, table):
        layers, first, last, unique, inverse = self._shape(table)
        model, parallel = self.model, self.execution
        per_part = {"layer": model.layer_activation(unique, parallel=parallel),
                    "dense_layer": model.layer_activation(unique, parallel=parallel,
                                                          dense=True),
                    "embedding": model.embedding_activation(unique, parallel),
                    "output": model.output_activation(unique, parallel)}
        per_stage = _stage_sum(model, {part: np.asarray(value, dtype=np.float64)[None, :]
                                       for part, value in per_part.items()},
                               layers[:, None], first[:, None], last[:, None])
        return per_stage[table.stage, inverse[table.microbatch]]

    def transient_sizes(self, table):
        """Bytes each operation holds only while it runs: one layer's backward working memory
        (a sequence slice's at its view's shape)."""
        return self._per_slice(table, lambda costs: costs._transient_sizes(table),
                               table.microbatch)

    def _transient_sizes(self, table):
        layers, _, _, unique, inverse = self._shape(table)
        per_size = self.model.layer_transient(unique, self.execution)
        backward = (table.kind == BACKWARD) | (table.kind == INPUT_GRAD)
        has_layers = layers[table.stage] > 0
        return np.where(backward & has_layers, per_size[inverse[table.microbatch]], 0.0)

    def stage_parameters(self, table):
        """Parameters of each stage (int64 array; all tensor ranks together)."""
        return self._stage_parameters(table).copy()

    def _stage_parameters(self, table):
        """``stage_parameters``, remembered per stage count and layer split (read-only)."""
        return stage_parameters(self.model, table.num_stages, table.stage_layers)

    def _stage_rank_parameters(self, table):
        """``(dense, experts)`` parameters of each stage one GPU holds (read-only):
        :func:`tabsched.costs.model_work.stage_rank_parameters`."""
        run = self.execution
        return stage_rank_parameters(self.model, table.num_stages, table.stage_layers,
                                     run.tensor_parallel, run.expert_parallel)

    def _device_parameters(self, table, per_stage=None):
        """Parameters of each device's stages, per GPU (float array): of ``per_stage``
        (parameters by stage, per GPU), else every parameter (the routed experts over the
        expert group too)."""
        D, S = table.num_devices, table.num_stages
        if per_stage is None:
            per_stage = sum(self._stage_rank_parameters(table))
        key = table.stage.astype(np.int64) * D + table.device
        pairs = np.flatnonzero(np.bincount(key, minlength=S * D))
        return np.bincount(pairs % D, weights=per_stage[pairs // D], minlength=D)

    def _device_fp8_weights(self, table):
        """Parameters of each device's linear products that FP8 copies (per GPU; zeros
        without ``fp8``): the layers' attention and dense-MLP matrices, not the experts,
        the embedding or the output layer."""
        if self.execution.fp8 is None:
            return np.zeros(table.num_devices)
        layers = self.stage_layers(table).astype(np.float64)
        dense = dense_counts(self.model, layers)
        model, t = self.model, self.execution.tensor_parallel
        split, replicated = latent_parameter_parts(model)
        attention = split / t + replicated
        mlp = (3 if model.gated_ffn else 2) * model.hidden * model.ffn / t
        layer = attention + (0.0 if model.experts else mlp)
        return self._device_parameters(table, (layers - dense) * layer
                                       + dense * (attention + mlp))

    def persistent_memory(self, table):
        """Bytes each device (GPU) holds all the time: weights, gradients, optimizer
        state, divided over the replicas as the ZeRO stage says (:func:`tabsched.costs.
        sharded.persistent_bytes_per_parameter`; the routed experts' over the expert-data-
        parallel group, ``d * cp / e``); with ``fp8``, TE's FP8 copy of each linear
        weight and its transpose, kept from the first microbatch on (2 bytes a parameter)."""
        dense, experts = self._stage_rank_parameters(table)
        run = self.execution
        return (self._device_parameters(table, dense)
                * persistent_bytes_per_parameter(self.model, run)
                + self._device_parameters(table, experts)
                * persistent_bytes_per_parameter(self.model, run, experts=True)
                + FP8_WEIGHT_BYTES * self._device_fp8_weights(table))

    def shard_sizes(self, table):
        """ZeRO-2/3's bytes per stage beyond the persistent memory
        (:func:`tabsched.costs.sharded.shard_sizes`)."""
        return shard_sizes(self, table)

    def _all_reduce_time(self, nbytes, devices, num_devices):
        """``placement.all_reduce_time(nbytes, devices)`` among some of ``num_devices``,
        remembered (see :func:`_ring_all_reduce`)."""
        devices = tuple(sorted(int(device) for device in devices))
        return ring_all_reduce(self.placement.pipeline_view, nbytes, devices, num_devices)

    def _data_parallel_time(self, collective, nbytes):
        """A ring collective over the ranks that reduce a tensor rank's gradients: the
        data-parallel group, with the context ranks in it (``d * cp``)."""
        return group_time(collective, nbytes, self.placement.gradient_group(), self.system)

    def _gradient_reduction(self, collective, dense, experts, element=None):
        """``collective`` of ``dense`` parameters' gradients over the gradient group and
        of ``experts`` (routed-expert parameters) over the expert-data-parallel group
        (``element`` bytes each, default the gradients')."""
        element = float(self.model.grad_bytes if element is None else element)
        seconds = self._data_parallel_time(collective, np.asarray(dense) * element)
        if not self.model.experts:
            return seconds
        return seconds + group_time(collective, np.asarray(experts) * element,
                                    self.placement.expert_gradient_group(), self.system)

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
        all-gather of the updated parameters. With ZeRO-2/3 the data-parallel
        reduction is the REDUCE_GRAD nodes' (so neither the sync nor the step
        holds it), and ZeRO-3 gathers the updated parameters in the next
        iteration's UNSHARDs; UNSHARD, RESHARD and REDUCE_GRAD are
        :func:`tabsched.costs.sharded.shard_prices`.
        """
        if kind == SYNC:
            return sync_prices(self, lowered)
        if kind == OPTIMIZER:
            return step_prices(self, lowered)
        if kind in (UNSHARD, RESHARD, REDUCE_GRAD):
            return shard_prices(self, lowered, kind)
        return np.zeros(lowered.count(kind))


    # ------------------------------------------------------------------ report
    def kernel_report(self, part="layer", samples=None):
        """Every kernel of one layer (or the embedding, or the output) with its cost
        (see :func:`tabsched.costs.model_work.kernel_report`)."""
        return kernel_report(self, part, samples)

    def __repr__(self):
        """The model and the system with their key numbers, and the run's settings.

        >>> ModelCosts("paper-128l", "mid_nw_mid_cp")  # doctest: +ELLIPSIS
        ModelCosts(paper-128l: 128 layers, hidden 4096, ... on mid_nw_mid_cp: 1 PFLOP/s, ...)
        """
        from tabsched.costs.units import format_count, format_quantity
        model, system = self.model, self.system
        settings = ", ".join(f"{key}={value}" for key, value in self.describe().items()
                             if key not in ("model", "transformer", "system"))
        return (f"ModelCosts({model.name}: {model.layers} layers, hidden {model.hidden}, "
                f"{format_count(model.parameters)} parameters on {system.name}: "
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
        defaults = _parallel_settings(Execution())
        info.update({key: value for key, value in _parallel_settings(self.execution).items()
                     if key in ("tensor_parallel", "data_parallel", "attention")
                     or value != defaults[key]})
        if self.overlap_factor is not None and self.overlap_factor != 1.0:
            info["overlap"] = self.overlap_factor
        return info


def _slice_counts(table):
    """Each microbatch's slice count (1 for whole sequences): a slice holds its sequence's
    samples, so a sequence's samples are counted once over its slices."""
    if table.sequence_slices is None:
        return np.ones(table.num_microbatches)
    return np.array([count for _, count in table.sequence_slices], dtype=np.float64)


@memo(limit=256)
def _slice_view(costs, index, count, partition="even"):
    """:meth:`ModelCosts.slice_view`, remembered per cost model and slice."""
    if costs.execution.context_parallel > 1:
        raise InvalidParameterError(
            f"sequence slices: context_parallel {costs.execution.context_parallel} cuts the "
            f"sequence already; slicing it too is not priced (use context_parallel 1)")
    return type(costs)(costs.model.sliced(index, count, partition), costs.system, costs.asked,
                       overlap=costs.overlap_factor)


def _stage_sum(model, per_part, layers, first, last):
    """A stage's total of ``per_part`` (arrays broadcast against ``layers``, ``first``,
    ``last``): its MoE (or plain) layers, its dense layers, the embedding on the first
    stage, the output layer on the last."""
    total = first * per_part["embedding"] + last * per_part["output"]
    if not model.dense_layers:
        return total + layers * per_part["layer"]
    dense = dense_counts(model, np.ravel(layers)).reshape(np.shape(layers))
    return total + (layers - dense) * per_part["layer"] + dense * per_part["dense_layer"]


def _parallel_settings(execution):
    """The parallelism a cost model's description names (as it has since before
    executions: ``optimizer_sharding`` for ZeRO-1; ``zero_stage`` beside it)."""
    return {"tensor_parallel": execution.tensor_parallel,
            "sequence_parallel": execution.sequence_parallel,
            "data_parallel": execution.data_parallel, "attention": execution.attention,
            "optimizer_sharding": execution.optimizer_sharding,
            "zero_stage": execution.zero_stage,
            "context_parallel": execution.context_parallel, "cp_comm": execution.cp_comm,
            "expert_parallel": execution.expert_parallel,
            "max_connections": execution.max_connections,
            "overlap_grad_reduce": execution.overlap_grad_reduce,
            "grad_bucket_size": execution.grad_bucket_size,
            "fp8": execution.fp8,
            "align_grad_reduce": execution.align_grad_reduce,
            "scatter_gather": execution.scatter_gather}


#: ModelCosts keywords that are not fields of an execution by the same name.
_KEYWORD_FIELDS = {"optimizer_sharding": "zero_stage"}


def _asked_execution(execution, parallel, keywords):
    """The execution a ModelCosts is asked for: ``execution`` (or the older ``parallel``)
    with the keywords that were given (not None) as field changes."""
    if execution is not None and parallel is not None:
        raise InvalidParameterError("give execution or parallel, not both (parallel is the "
                                    "older name of execution)")
    base = parallel if execution is None else execution
    if base is None:
        base = Execution()
    elif isinstance(base, (str, bytes)) or hasattr(base, "__fspath__"):
        from tabsched.execution import load_execution
        base = load_execution(base)
    elif not isinstance(base, Execution):
        raise InvalidParameterError(f"execution must be an Execution, not "
                                    f"{type(base).__name__}")
    changes = {}
    for key, value in keywords.items():
        if value is None:
            continue
        if key == "optimizer_sharding":
            if not isinstance(value, (bool, np.bool_)):
                raise InvalidParameterError(f"optimizer_sharding must be true or false, not "
                                            f"{value!r}")
            value = 1 if value else 0
        changes[_KEYWORD_FIELDS.get(key, key)] = value
    return base.replace(**changes) if changes else base
