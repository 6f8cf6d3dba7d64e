"""What a predicted iteration is made of: its time cut into terms a reader can check.

A calibration against measured runs needs more than the error: it needs to know which
part of the prediction is wrong. :func:`iteration_terms` cuts one evaluated iteration
into terms that add up to its makespan, on the *pacing device* (the device busiest
with compute, whose operations set the pace of the pipeline's steady state):

``matrix``, ``vector``
    The device's matrix products and element-wise kernels (norms, softmax, dropout,
    activations, the loss' passes), forward and backward, each at its roofline
    (:mod:`tabsched.costs.system`), launches taken out.
``recompute``
    The forward kernels run again before a backward (``recompute="full"`` or
    ``"selective"``), all classes, launches taken out.
``launch``
    The device's kernel launches: ``launch_latency`` per kernel (the only host time
    tabsched models).
``tensor_comm``
    The tensor-parallel (and context/expert) collectives inside the layers that the
    device waits for: the forward's in full, the backward's beyond the kernel they
    run beside (:func:`tabsched.costs.model_work.hidden_cost`).
``pipeline_comm``
    What the pipeline's transfers add to the makespan: the makespan less the makespan
    of the same run with free transfers (every link between nodes at the system's
    largest bandwidth, zero latency, no scatter-gather, so no receivers' re-gather
    inside the node either); blocking or batched sends are felt here.
``optimizer``
    The end of the iteration on the pacing device: the gradient synchronisation
    (data-parallel reduction, tied embeddings) and the optimizer step.
``bubble``
    The rest: the time the pacing device waits for its neighbours with free
    transfers (warm-up, cool-down, and waiting on slower stages).
``host``
    Host work per iteration that tabsched does not model (data loading, logging): 0,
    listed so that a table of terms says so.

The terms of the pacing device's operations are read from the kernels of each part
(one layer, the embedding, the output) at the run's microbatch size, multiplied by the
stage's layer count, so ``matrix + vector + recompute + launch + tensor_comm`` is the
device's busy time up to the rounding of the sums (``other`` holds that remainder,
with any operation time no kernel accounts for).

>>> from tabsched import ModelCosts, evaluate, generate
>>> table = generate("1f1b", devices=2, microbatches=4)
>>> costs = ModelCosts("paper-128l", "dgx-a100", tensor_parallel=8, optimizer=True)
>>> terms = iteration_terms(table, costs)
>>> abs(sum(terms.values()) - evaluate(table, costs, formula=False).makespan) < 1e-9
True
"""

from __future__ import annotations

import numpy as np

from tabsched.costs.model_work import hidden_cost
from tabsched.costs.system import BANDWIDTH_RANGE

__all__ = ["TERMS", "iteration_terms", "part_terms"]

#: The terms, in the order a report shows them.
TERMS = ("matrix", "vector", "recompute", "launch", "tensor_comm", "pipeline_comm",
         "optimizer", "bubble", "host", "other")


def part_terms(costs, part, samples):
    """``{kind: {term: seconds}}`` of one ``part`` (``layer``, ``embedding``, ``output``)
    at ``samples`` per microbatch: the kernels' time by class, the recompute, the
    launches and the exposed collectives, per kind of operation (0 forward, 1 backward
    with its recompute, 2 input-gradient with its recompute, 3 weight-gradient)."""
    rows = costs.kernel_report(part, samples)
    launch = costs.system.launch_latency
    slowdown = costs.system.overlap_slowdown
    seconds_of = {}
    for row in rows:
        seconds_of.setdefault((row["phase"], row["name"]), row["seconds"])
    kinds = {0: "F", 1: "RIW", 2: "RI", 3: "W"}
    result = {}
    for kind, phases in kinds.items():
        terms = dict.fromkeys(("matrix", "vector", "recompute", "launch", "tensor_comm"), 0.0)
        for row in rows:
            if row["phase"] not in phases:
                continue
            seconds = row["seconds"]
            if row["class"] == "collective":
                partner = row["beside"]
                if partner is not None:
                    kernel = next((value for (phase, name), value in seconds_of.items()
                                   if name == partner and phase in phases), None)
                    if kernel is not None:
                        seconds = float(hidden_cost(seconds, kernel, slowdown))
                terms["tensor_comm"] += seconds
                continue
            terms["launch"] += launch
            own = seconds - launch
            if row["phase"] == "R":
                terms["recompute"] += own
            else:
                terms["matrix" if row["class"] == "matrix" else "vector"] += own
        result[kind] = terms
    return result


def _free_transfers(costs):
    """``costs`` with every transfer between nodes as fast as a system may say (the
    pipeline's sends cost nothing measurable; the collectives inside a node are not
    touched)."""
    system = costs.system.replace(inter_node_bandwidth=BANDWIDTH_RANGE[1],
                                  inter_node_latency=0.0, inter_node_efficiency=1.0,
                                  link_overrides=(), node_overrides=())
    # the receivers' re-gather of a scattered transfer is part of the transfer's time
    # (ModelCosts.transfer_costs): unscattered and free, it goes too
    return type(costs)(costs.model, system, costs.execution.replace(scatter_gather=False))


def iteration_terms(table, costs, result=None):
    """``{term: seconds}`` of one iteration of ``table`` under ``costs`` (a ModelCosts),
    adding up to its makespan (module docstring); ``result`` is its evaluation, if
    already made."""
    from tabsched.evaluate import evaluate
    if result is None:
        result = evaluate(table, costs, formula=False)
    durations = costs.op_durations(table)
    busy = np.bincount(table.device, weights=durations, minlength=table.num_devices)
    device = int(np.argmax(busy))
    mine = table.device == device
    layers = np.asarray(costs.stage_layers(table))
    samples = np.asarray(costs.microbatch_samples(table), dtype=np.float64)
    terms = dict.fromkeys(TERMS, 0.0)
    cache = {}
    last_stage = table.num_stages - 1
    for stage, kind, microbatch in zip(table.stage[mine], table.kind[mine],
                                       table.microbatch[mine]):
        size = float(samples[microbatch])
        for part, count in (("layer", layers[stage]), ("embedding", stage == 0),
                            ("output", stage == last_stage)):
            if not count:
                continue
            key = (part, size)
            if key not in cache:
                cache[key] = part_terms(costs, part, size)
            for term, seconds in cache[key][int(kind)].items():
                terms[term] += float(count) * seconds
    accounted = sum(terms.values())
    terms["other"] = float(busy[device]) - accounted
    free = evaluate(table, _free_transfers(costs), formula=False).makespan
    terms["pipeline_comm"] = result.makespan - free
    terms["optimizer"] = _end_of_iteration(costs, table, device)
    terms["bubble"] = (result.makespan - terms["pipeline_comm"] - terms["optimizer"]
                       - float(busy[device]))
    return terms


def _end_of_iteration(costs, table, device):
    """Seconds of the pacing device's gradient synchronisation and optimizer step."""
    from tabsched.lower import OPTIMIZER, SYNC, lower
    lowered = lower(table, devices_per_node=costs.devices_per_node,
                    grad_sync=costs.grad_sync, optimizer=costs.optimizer_step)
    total = 0.0
    if lowered.count(OPTIMIZER):
        total += float(np.asarray(costs.node_prices(lowered, OPTIMIZER))[device])
    syncs = np.asarray(costs.node_prices(lowered, SYNC))
    for k, seconds in enumerate(syncs):
        if device in set(np.asarray(lowered.sync_devices(k)).tolist()):
            total += float(seconds)
    return total



#: What a report calls each term.
LABELS = {"matrix": "matrix products", "vector": "element-wise", "recompute": "recompute",
          "launch": "launches", "tensor_comm": "tensor comm (exposed)",
          "pipeline_comm": "pipeline comm (exposed)", "optimizer": "grad sync + optimizer",
          "bubble": "bubble", "host": "host", "other": "other"}


def terms_markdown(rows, unit="iteration (s)"):
    """A markdown table of ``rows``, ``[(label, makespan, {term: seconds})]``: seconds and
    the share of the iteration, the terms no row has left out."""
    shown = [term for term in TERMS if any(abs(terms[term]) > 5e-7 * span
                                           for _, span, terms in rows) or term == "host"]
    lines = [f"| run | {unit} | " + " | ".join(LABELS[term] for term in shown) + " |",
             "|---|---|" + "---|" * len(shown)]
    for label, span, terms in rows:
        cells = [f"{terms[term]:.3g} ({terms[term] / span:.0%})" if terms[term] else "0"
                 for term in shown]
        lines.append(f"| {label} | {span:.3g} | " + " | ".join(cells) + " |")
    return lines
