"""Random valid tables and durations for property tests, and the command line's bad-input
contract for fuzzing it (not part of the API).

A random table is built the way a real one is: every (stage, microbatch) gets
its operations on one device (a stage may live on several devices, one per
microbatch, as Chimera's replicas do), and the row orders come from one random
topological order of all operations, so the table never deadlocks. Some
backwards are split into I + W, some cells overlap a forward with a backward,
some microbatches have other sizes.
"""

import numpy as np

from tabsched.layout import from_order
from tabsched.nodes import CELL
from tabsched.table import Op, Overlap


def random_table(seed, *, max_devices=4, max_stages=6, max_microbatches=5, split=0.3,
                 overlap=0.15, replicate=0.2, uneven=0.2):
    """A valid, deadlock-free random ScheduleTable determined by ``seed``."""
    rng = np.random.default_rng(seed)
    num_devices = int(rng.integers(1, max_devices + 1))
    num_stages = int(rng.integers(1, max_stages + 1))
    num_microbatches = int(rng.integers(1, max_microbatches + 1))
    home = rng.integers(0, num_devices, size=num_stages)
    replica = rng.integers(0, num_devices, size=num_stages)
    device_of = {}
    for s in range(num_stages):
        for m in range(num_microbatches):
            use_replica = rng.random() < replicate
            device_of[s, m] = int(replica[s] if use_replica else home[s])
    split_of = {(s, m): bool(rng.random() < split)
                for s in range(num_stages) for m in range(num_microbatches)}

    done = set()
    pending = set()
    for s in range(num_stages):
        for m in range(num_microbatches):
            pending.add(Op("F", s, m))
            if split_of[s, m]:
                pending.update({Op("I", s, m), Op("W", s, m)})
            else:
                pending.add(Op("B", s, m))

    def ready(op):
        s, m = op.stage, op.microbatch
        if op.kind == "F":
            return s == 0 or Op("F", s - 1, m) in done
        if op.kind == "W":
            return Op("I", s, m) in done
        if Op("F", s, m) not in done:
            return False
        if s == num_stages - 1:
            return True
        upstream = Op("I", s + 1, m) if split_of[s + 1, m] else Op("B", s + 1, m)
        return upstream in done

    orders = [[] for _ in range(num_devices)]
    while pending:
        candidates = sorted(op for op in pending if ready(op))
        op = candidates[int(rng.integers(len(candidates)))]
        device = device_of[op.stage, op.microbatch]
        cell = op
        if rng.random() < overlap and op.kind in "FBI":
            partners = [other for other in candidates if other != op
                        and device_of[other.stage, other.microbatch] == device
                        and ((op.kind == "F") != (other.kind == "F"))
                        and other.kind != "W"]
            if partners:
                other = partners[int(rng.integers(len(partners)))]
                cell = Overlap((op, other) if op.kind == "F" else (other, op))
        parts = cell.parts if isinstance(cell, Overlap) else (cell,)
        for part in parts:
            pending.discard(part)
            done.add(part)
        orders[device].append(cell)
    sizes = None
    if rng.random() < uneven:
        sizes = [float(rng.choice([0.5, 1.0, 2.0])) for _ in range(num_microbatches)]
    return from_order(orders, num_stages=num_stages,
                                    num_microbatches=None if sizes else num_microbatches,
                                    microbatch_sizes=sizes)


def random_durations(lowered, seed, *, samples=1, integer=False, transfers=True):
    """Random non-negative node durations, shape (samples, nodes)."""
    rng = np.random.default_rng(seed)
    shape = (samples, lowered.num_nodes)
    durations = (rng.integers(0, 4, size=shape).astype(float) if integer
                 else rng.exponential(1.0, size=shape))
    if not transfers:
        durations[:, lowered.nodes(CELL).stop:] = 0.0
    return durations


def parse_grid(text, op_of, durations):
    """Ops and start slots of a worked grid as SCHEDULES.md prints them.

    Each line is ``[label] dN: cell cell ...``; a cell is ``.`` (idle) or a
    letter and a microbatch (``F3``, ``b0``), and an op lasting ``k`` slots is
    printed ``k`` times. ``op_of(device, letter, microbatch)`` names the op;
    ``durations[op.kind]`` is its length in slots. Returns ``{device: [(op,
    start), ...]}`` in row order.
    """
    rows = {}
    for line in text.strip().splitlines():
        head, _, cells = line.partition(":")
        device = int(head.split()[-1].lstrip("dP"))
        tokens = cells.split()
        row = []
        slot = 0
        while slot < len(tokens):
            token = tokens[slot]
            if token == ".":
                slot += 1
                continue
            op = op_of(device, token[0], int(token[1:]))
            row.append((op, slot))
            slot += durations[op.kind]
        rows[device] = row
    return rows


def kernel_graphs(lowered, modules):
    """``lowered``'s Graph for each kernel module (``tabsched._kernel``, its twin
    ``tabsched._reference``), with every part the lowering has (no layout on a
    deadlock)."""
    graphs = []
    for module in modules:
        graph = module.Graph(lowered.num_nodes)
        statuses = [graph.add_edges(lowered.indptr, lowered.successors, lowered.resources,
                                    lowered.num_resources),
                    graph.add_devices(lowered.node_device, lowered.table.num_devices)]
        if lowered.topo_order is not None:
            statuses.append(graph.add_layout(lowered.topo_order, lowered.topo_pred_indptr,
                                             lowered.topo_predecessors))
        assert not any(statuses), statuses
        graphs.append(graph)
    return graphs


def kernel_scratch(module, graph, finish=0):
    """A ``module.Scratch`` for every pass over ``graph`` (``finish`` floats)."""
    n, resources = graph.num_nodes, graph.num_resources
    return module.Scratch(np.zeros(n, np.int32), np.zeros(n), np.zeros(n, np.int32),
                          np.zeros(resources), np.zeros(resources, np.int32), np.zeros(finish))


def invoke_cli(argv):
    """``(exit status, stdout + stderr)`` of the CLI's entry point on ``argv`` (each word
    made a string); any exception but the exit it ends with propagates (it would be a
    traceback): what the fuzzing tests run every mangled command line through."""
    import contextlib
    import io

    from tabsched.cli import main
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            main([str(word) for word in argv])
        except SystemExit as exit_:
            return exit_.code, out.getvalue()
    raise AssertionError("the entry point returned without exiting")


def one_error_line(text):
    """The CLI's contract for bad input: no traceback and exactly one ``Error: `` line,
    which is returned."""
    assert "Traceback" not in text, text
    lines = [line for line in text.splitlines() if line.startswith("Error: ")]
    assert len(lines) == 1, text
    return lines[0]
