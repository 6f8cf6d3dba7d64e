"""What a transformer on a system computes per table shape, remembered.

:class:`~tabsched.costs.model_costs.ModelCosts` prices a table from a few answers
that depend on the table only through its shape (its stage count, its layer split,
its microbatch sizes) and on the cost model only through frozen values (the model,
the system, the placement of its execution): the kernel tables of a model run with
an execution, one layer's (and the embedding's, the output's) seconds per kind of
operation for some microbatch sizes, the layers and parameters of each stage, the
samples of each microbatch, the link matrices of the table's devices and the rings
among them. Each is a memo (:mod:`tabsched._memo`), so that a sweep, which asks the
same questions table after table, answers each once; and each is a pure function of
its arguments, so no answer can outlive a change. The per-kernel report that
``tabsched costs`` prints is here too: it times the same kernels the same way.
"""

import numpy as np

from tabsched._memo import memo
from tabsched.costs.collectives import group_time
from tabsched.costs.kernels import KernelTable
from tabsched.exceptions import InvalidParameterError
from tabsched.table import BACKWARD, FORWARD, INPUT_GRAD, WEIGHT_GRAD

__all__ = ["PARTS", "dense_counts", "stage_rank_parameters", "KIND_PHASES", "kernel_tables", "all_kernels", "link_matrices", "ring_all_reduce",
           "table_shape", "stage_layers", "microbatch_samples", "check_int64",
           "stage_parameters", "kernel_seconds", "part_times", "priced_part", "present",
           "end_stages", "kernel_report", "gemm_coefficients", "part_kernel_seconds"]

INT64_MAX = 2**63 - 1
PARTS = ("layer", "embedding", "output", "dense_layer")
#: The kernel lists each kind of operation runs (R: the recompute forward).
KIND_PHASES = {FORWARD: "F", BACKWARD: "RIW", INPUT_GRAD: "RI", WEIGHT_GRAD: "W"}


@memo(limit=64)
def kernel_tables(model, parallel):
    """``{part: {phase: KernelTable}}`` of ``model`` run with ``parallel``: what the
    system does not change, built once for the cost models of one model on many
    systems (the tables are not changed once built)."""
    return {part: {phase: KernelTable(kernels) for phase, kernels in
                   model.kernels(part, parallel).items()}
            for part in PARTS}


@memo(limit=64)
def all_kernels(model, parallel):
    """Every kernel of ``kernel_tables(model, parallel)`` in one table, and how
    ``part_times`` sums them: per part, ``(kind, rows, hides)`` for each kind of
    operation, ``rows`` its kernels in that table (phase by phase) and ``hides`` the
    ``(kernel, partner)`` positions among them of each collective that hides behind
    a kernel of the same operation, in order. A system times every kernel in one
    pass (each kernel's time is its own, whatever the others)."""
    tables = kernel_tables(model, parallel)
    kernels, where = [], {}
    for part in PARTS:
        for phase, table in tables[part].items():
            where[part, phase] = np.arange(len(kernels), len(kernels) + len(table))
            kernels.extend(table.kernels)
    plan = {}
    for part in PARTS:
        plan[part] = []
        for kind, phases in KIND_PHASES.items():
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


@memo(limit=4096)
def link_matrices(pipeline_view, num_devices):
    """``pipeline_view.link_matrices(num_devices)``: asked again by every cost model on a
    system (one per microbatch size in a sweep); equal systems are one answer."""
    return pipeline_view.link_matrices(num_devices)


@memo(limit=4096)
def ring_all_reduce(pipeline_view, nbytes, devices, num_devices):
    """A ring all-reduce of ``nbytes`` among ``devices`` (sorted) of a run of
    ``num_devices``: a sweep syncs the same stages among the same devices table after
    table, and the link matrices of the run serve every ring in it."""
    return pipeline_view.all_reduce_time(nbytes, devices,
                                         link_matrices(pipeline_view, num_devices))


@memo(limit=4096)
def table_shape(model, num_stages, split, microbatch_sizes):
    """Layers per stage, first/last-stage masks, unique samples and each microbatch's
    index: the per-shape work of a cost model depends on a table only through its stage
    count, layer split and microbatch sizes, and a sweep asks it table after table."""
    layers = stage_layers(model, num_stages, split)
    samples = microbatch_samples(model, microbatch_sizes)
    unique, inverse = np.unique(samples, return_inverse=True)
    check_int64(model, layers, unique, samples)
    first, last = end_stages(len(layers))
    return layers, first, last, unique, inverse.ravel()


def stage_layers(model, num_stages, split):
    """Layers of each stage: ``split`` (a table's ``stage_layers``), or an even split of
    the model's."""
    S, layers = num_stages, model.layers
    if split is None:
        if S and layers % S:
            raise InvalidParameterError(
                f"model {model.name} has {layers} layers, which do not split evenly "
                f"over the table's {S} stages (give the table stage_layers)")
        return np.full(S, layers // S if S else 0, dtype=np.int64)
    per_stage = np.asarray(split, dtype=np.int64)
    if int(per_stage.sum()) != layers:
        raise InvalidParameterError(
            f"the table's stage_layers sum to {int(per_stage.sum())} but model "
            f"{model.name} has {layers} layers")
    return per_stage


def dense_counts(model, layers):
    """How many of each stage's ``layers`` are a mixture-of-experts model's first
    ``dense_layers`` (float array; zeros for a dense model, whose layers are alike)."""
    layers = np.asarray(layers, dtype=np.float64)
    if not model.dense_layers:
        return np.zeros(len(layers))
    ends = np.cumsum(layers)
    return np.clip(np.minimum(ends, model.dense_layers) - (ends - layers), 0.0, None)


def microbatch_samples(model, microbatch_sizes):
    """Samples of each microbatch of relative size ``microbatch_sizes`` (whole numbers)."""
    sizes = np.asarray(microbatch_sizes, dtype=np.float64)
    samples = sizes * model.microbatch_size
    whole = np.round(samples)
    bad = np.flatnonzero((np.abs(samples - whole) > 1e-9 * np.maximum(samples, 1.0))
                         | (whole < 1))
    if len(bad):
        m = int(bad[0])
        raise InvalidParameterError(
            f"microbatch {m} has relative size {sizes[m]:g}: {samples[m]:g} samples of a "
            f"{model.microbatch_size}-sample microbatch, but samples must be whole "
            f"(raise microbatch_size)")
    return whole


def check_int64(model, layers, unique, samples):
    """Activation bytes (exact, in Python ints) must fit int64, per stage and in total."""
    if not len(layers) or not len(unique):
        return
    per_layer = max(model.layer_activation(1), model.layer_activation(1, dense=True))
    per_sample = [int(n) * per_layer for n in layers.tolist()]
    per_sample[0] += model.embedding_activation(1)
    per_sample[-1] += model.output_activation(1)
    largest = max(per_sample) * int(unique.max())
    total = sum(per_sample) * int(samples.sum())
    if max(largest, total) > INT64_MAX:
        raise InvalidParameterError(
            f"microbatch_size {model.microbatch_size} makes the activations of one "
            f"iteration {float(total):.3g} bytes, which overflows int64 "
            f"({float(INT64_MAX):.3g}); use a smaller microbatch_size")


@memo(limit=1024)
def stage_parameters(model, num_stages, split):
    """Parameters of each stage (int64, all tensor ranks together): stages alike (same
    layers, neither or both ends) hold alike, so each kind of stage is counted once."""
    return np.array([sum(parts) for parts in _stage_parts(model, num_stages, split)],
                    dtype=np.int64)


@memo(limit=1024)
def stage_rank_parameters(model, num_stages, split, tensor, expert):
    """``(dense, experts)`` parameters of each stage that one GPU holds (float arrays):
    the parameters split over the ``tensor`` ranks and those each holds whole, then the
    routed experts, split over the tensor ranks and the ``expert`` group too
    (:meth:`TransformerModel.stage_parameter_parts`)."""
    parts = np.array(_stage_parts(model, num_stages, split), dtype=np.float64).reshape(-1, 3)
    return parts[:, 0] / tensor + parts[:, 1], parts[:, 2] / (tensor * expert)


def _stage_parts(model, num_stages, split):
    layers = stage_layers(model, num_stages, split).tolist()
    dense = dense_counts(model, layers).astype(np.int64).tolist()
    S = len(layers)
    kinds = [(layers[s], s == 0, s == S - 1, dense[s]) for s in range(S)]
    each = {kind: model.stage_parameter_parts(*kind) for kind in set(kinds)}
    return [each[kind] for kind in kinds]


@memo(limit=64)
def gemm_coefficients(model, parallel):
    """The products' shapes of ``all_kernels(model, parallel)``
    (:meth:`KernelTable.gemm_coefficients`): what a system with a GEMM table reads, the
    same for every such system."""
    return all_kernels(model, parallel)[0].gemm_coefficients()


def kernel_seconds(model, system, placement, kernels, samples, coefficients=None):
    """``(seconds, work)`` per kernel and size: each kernel's roofline plus the launch
    latency, each collective a ring over its group as the placement puts it; a matrix
    kernel at the system's GEMM table's efficiency where the table covers its products
    (``coefficients``: the kernels' :meth:`KernelTable.gemm_coefficients`, if known)."""
    samples = np.asarray(samples, dtype=np.float64)
    work = kernels.work(samples)
    nbytes = work["read"] + work["written"]
    tokens = samples[None, :] * model.sequence
    measured = (None if system.gemm_efficiency is None else
                system.gemm_efficiency_of(kernels.gemm_shapes(samples, coefficients)))
    seconds = (system.kernel_times(kernels.matrix[:, None], work["flops"], nbytes, tokens,
                                   work["outputs"], measured) + system.launch_latency)
    rows = np.flatnonzero(kernels.fp8)
    if len(rows):
        # FP8 products at the FP8 rate, FP8 table and FP8 fallback efficiency (a system
        # without an FP8 rate is refused by Execution.check before any kernel is priced)
        fp8 = system.fp8_view()
        shapes = kernels.gemm_shapes(samples, coefficients)[rows]
        measured = None if fp8.gemm_efficiency is None else fp8.gemm_efficiency_of(shapes)
        seconds[rows] = (fp8.kernel_times(True, work["flops"][rows], nbytes[rows], tokens,
                                          work["outputs"][rows], measured)
                         + system.launch_latency)
    for index in np.flatnonzero(kernels.collective):
        seconds[index] = group_time(kernels.kinds[index], work["message"][index],
                                    placement.group(kernels.groups[index]), system)
    return seconds, work


def hidden_cost(collective, kernel, slowdown):
    """What a collective of ``collective`` seconds adds beside a kernel of ``kernel``
    seconds that it slows ``1 + slowdown`` times while it runs (``System.overlap_slowdown``):
    the pair lasts ``max(C, P + C * s / (1 + s))``, so it adds
    ``max(C - P, C * s / (1 + s))``; ``s = 0`` is the free overlap ``max(C - P, 0)``.

    >>> [float(hidden_cost(c, p, s)) for c, p, s in ((1.0, 3.0, 0.25), (1.0, 3.0, 0.0), (3.0, 1.0, 0.25))]
    [0.2, 0.0, 2.0]
    """
    if slowdown == 0:
        return np.maximum(collective - kernel, 0.0)
    return np.maximum(collective - kernel, collective * (slowdown / (1.0 + slowdown)))


@memo(limit=4096)
def part_kernel_seconds(model, system, placement, samples):
    """``{part: {kind: (seconds, communication)}}``: each kernel's seconds (kernels x
    sizes, in the order the kind runs them; a collective hidden behind a kernel of its
    operation costs what it runs longer) and whether it is a collective, for microbatches
    of ``samples`` (a tuple): what :func:`part_times` sums and the two-stream model of an
    overlapped cell cuts into segments (:mod:`tabsched.costs.streams`)."""
    priced = priced_part(placement.execution)
    everything, plan = all_kernels(model, priced)
    coefficients = (None if system.gemm_efficiency is None
                    else gemm_coefficients(model, priced))
    every_seconds = kernel_seconds(model, system, placement, everything,
                                    np.asarray(samples, dtype=np.float64), coefficients)[0]
    result = {}
    for part in PARTS:
        result[part] = {}
        for kind, rows, hides in plan[part]:
            cost = every_seconds[rows]
            for index, partner in hides:
                cost[index] = hidden_cost(cost[index], cost[partner], system.overlap_slowdown)
            result[part][kind] = (cost, everything.collective[rows])
    return result


@memo(limit=4096)
def part_times(model, system, placement, samples):
    """``{part: (kinds x sizes)}`` seconds of one layer, the embedding, the output, for
    microbatches of ``samples`` (a tuple); see :meth:`ModelCosts.part_times`."""
    result = {}
    for part, kinds in part_kernel_seconds(model, system, placement, samples).items():
        times = np.zeros((4, len(samples)))
        for kind, (cost, _) in kinds.items():
            times[kind] = cost.sum(axis=0)
        result[part] = times
    return result


def priced_part(execution):
    """The part of an execution that kernels, activations and parameters depend on (the
    network, the tail and the batch left out): cost models that differ only there, one
    model on several systems, share kernel tables and memory sizes."""
    return execution.replace(contention=None, devices_per_node=None, blocking_sends=None, p2p=None,
                             grad_sync=None, grad_bucket_size=None, align_grad_reduce=True,
                             max_connections=None,
                             optimizer_step=None,
                             global_batch=None,
                             overlap_grad_reduce=False)


def present(keys, space):
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


def end_stages(stages):
    """``(first, last)``: 1.0 on the first (embedding) and the last (output) stage."""
    first, last = np.zeros(stages), np.zeros(stages)
    if stages:
        first[0] = last[-1] = 1.0
    return first, last


def kernel_report(costs, part="layer", samples=None):
    """Every kernel of one layer (or the embedding, or the output) of ``costs`` (a
    ModelCosts) with its cost.

    Returns a list of dicts, in the order the kinds run them (``F``, the
    recompute forward ``R``, ``I``, ``W``): ``phase``, ``name``, ``class``,
    ``flops``, ``bytes_read``, ``bytes_written`` (a collective's message in
    ``bytes_read``), ``bound`` (``compute``, ``memory``, ``network``),
    ``efficiency`` (of the binding resource; for a matrix kernel the
    ``compute_efficiency`` value times its wave quantization, or the GEMM table's
    value where the system's table covers the kernel), ``seconds`` (its own, before any
    hiding), ``beside`` (the kernel a collective runs beside, or None).
    """
    if part not in PARTS:
        raise InvalidParameterError(f"part {part!r} is not one of {', '.join(PARTS)}")
    samples = float(costs.model.microbatch_size if samples is None else samples)
    system = costs.system
    rows = []
    for phase in ("F", "R", "I", "W"):
        kernels = costs._tables[part][phase]
        if not len(kernels):
            continue
        seconds, work = kernel_seconds(costs.model, system, costs.placement, kernels,
                                        np.array([samples]))
        tokens = samples * costs.model.sequence
        measured = (None if system.gemm_efficiency is None else
                    system.gemm_efficiency_of(kernels.gemm_shapes(np.array([samples]))))
        for index, kernel in enumerate(kernels.kernels):
            flops = float(work["flops"][index, 0])
            read, written = float(work["read"][index, 0]), float(work["written"][index, 0])
            if kernel.cls == "collective":
                tier = costs.placement.group(kernel.group).tier
                bound, efficiency = "network", (system.intra_node_efficiency if
                                                tier == "node" else
                                                system.inter_node_efficiency)
                read, written = float(work["message"][index, 0]), 0.0
            else:
                e_c = float(system.compute_efficiency_at(tokens, flops)
                            * system.wave_efficiency(work["outputs"][index, 0]))
                if measured is not None and not np.isnan(measured[index, 0]):
                    e_c = float(measured[index, 0])
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
