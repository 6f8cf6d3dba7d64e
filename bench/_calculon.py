"""Calculon's ``llm-optimal-execution``, timed: executions per second, for a ratio in one run.

Calculon (Isaev et al., SC'23, https://github.com/calculon-ai/calculon) prices one
execution of a model on a system by formula and searches every execution of ``N``
processors with ``calculon llm-optimal-execution MODEL N MAX_BATCH DATATYPE SYSTEM OUT``:
its ``run_command`` lists one task per (tensor, pipeline, data degree, interleaving,
recompute, optimizer sharding, tensor-parallel communication) and maps
``OptimalExecution.search`` over the tasks with ``multiprocessing.Pool``; each search loops
over the rest (all-gather redo, data- and tensor-parallel overlap, weight, activation and
optimizer offload, microbatch size, the network of each parallel dimension) and counts
every execution it tries, good (it fits) or bad (``Llm.Error``: a network too small or not
filled, memory over the capacity). For GPT-3 175B on 1,024 A100s at 1,536 samples that is
3,330 tasks and 11,698,528 executions (``-d``, its dry run, counts them): 15 to 23 hours of
one core at the rates measured here, too long to run beside a benchmark.

What is measured. This module runs Calculon's own ``OptimalExecution.run_command`` -- its
argument parser, its task list, its ``search`` unchanged -- in a child process, with one
thing replaced: the process pool. The stand-in runs the tasks in this one process, in a
seeded random order, each until it ends or ``slice_seconds`` pass (checked before each
execution starts, at ``Llm.__init__``, so a slice stops between executions), until
``seconds`` have passed. ``executions`` counts every execution Calculon started and finished
there, good and bad, exactly as its ``Total executions`` and ``Calculation rate`` lines count
(they are read back and must agree); ``seconds`` is the wall time of the map. The rate is
one core's: the command's default ``--cpus`` (physical cores) would multiply it by about
the core count. ``priced`` counts the executions that passed the network check and were
priced in full (``Llm.run``), about a third: the network check rejects the rest in tens of
microseconds each, against 13 to 20 ms for one priced in full (on this project's shared
2-core machine, as its load varies: time Calculon beside tabsched, in the same run).

Names: tabsched's presets map to the files Calculon ships, whose sizes agree field by field
(checked against tabsched's preset when tabsched imports):

- ``gpt3-175b`` -> ``models/gpt3-175B.json`` (96 blocks, hidden 12288, 96 heads of 128,
  FFN 49152, sequence 2048: Brown et al. 2020, Table 2.1); ``megatron-1t`` ->
  ``megatron-1T.json``, ``megatron-22b`` -> ``megatron-22B.json``, ``turing-530b`` ->
  ``turing-530B.json``. Calculon models no embedding or output layer.
- ``dgx-a100`` (or ``a100``) -> ``systems/a100_80g.json``: 312 TFLOP/s FP16, 80 GiB HBM at
  2,048 GB/s, 8 GPUs on a 300 GB/s network (NVLink) and 25 GB/s per GPU across nodes
  (InfiniBand HDR), as tabsched's ``dgx-a100`` (datasheets cited there); it also has a
  512 GiB, 32 GB/s second memory that Calculon may offload to and tabsched does not model.
  ``dgx-h100`` -> ``systems/h100_80g_nvl8.json`` (1,000 TFLOP/s, 3,072 GB/s, 450 GB/s in
  8, 50 GB/s across: close to tabsched's ``dgx-h100``, not equal). Datatype ``float16``: Calculon's A100
  file has tables for float16 only; bf16 has the same 2 bytes and the same A100 peak.

Calculon's ``MAX_BATCH_SIZE`` is a bound: each data degree ``d`` runs the largest multiple
of ``d`` under it, so ``d = 1024`` runs 1,024 samples where tabsched refuses 1,536.

    python bench/_calculon.py [--seconds 20] [--model gpt3-175b] [--system dgx-a100]

The checkout is ``$CALCULON_DIR`` or ``/tmp/calculon``, run with ``$CALCULON_PYTHON`` or
this interpreter; it needs ``numpy``, ``pandas`` and ``psutil``. Nothing of Calculon is
imported here but in the child. Not collected by pytest.
"""

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time

#: tabsched model preset -> Calculon's model file (sizes in the module docstring).
CALCULON_MODELS = {
    "gpt3-175b": "models/gpt3-175B.json",
    "megatron-1t": "models/megatron-1T.json",
    "megatron-22b": "models/megatron-22B.json",
    "turing-530b": "models/turing-530B.json",
}

#: tabsched system preset -> Calculon's system file and the datatype it has tables for.
CALCULON_SYSTEMS = {
    "dgx-a100": ("systems/a100_80g.json", "float16"),
    "a100": ("systems/a100_80g.json", "float16"),
    "dgx-h100": ("systems/h100_80g_nvl8.json", "float16"),
}

#: Seconds the child may take beyond ``seconds``: start-up (numpy, pandas: about 1 s) and
#: the execution running when the time is up (13 to 20 ms on this project's machine).
START_UP_ALLOWANCE = 120.0

_MAP_MODULE = "calculon/llm/optimal_execution.py"


class CalculonError(RuntimeError):
    """A Calculon checkout is there but could not be timed; the message is one line."""


def calculon_checkout():
    """The Calculon checkout to time (``$CALCULON_DIR``, else ``/tmp/calculon``), or None."""
    checkout = os.environ.get("CALCULON_DIR") or "/tmp/calculon"
    return checkout if os.path.isfile(os.path.join(checkout, _MAP_MODULE)) else None


def calculon_rate(model="gpt3-175b", system="dgx-a100", gpus=1024, global_batch=1536,
                  seconds=20.0, *, slice_seconds=1.0, seed=0):
    """Executions per second of Calculon's ``llm-optimal-execution``, on one core.

    Parameters
    ----------
    model, system : str
        tabsched preset names, mapped by ``CALCULON_MODELS`` and ``CALCULON_SYSTEMS``.
    gpus, global_batch : int
        Calculon's ``NUM_PROCS`` and ``MAX_BATCH_SIZE``.
    seconds : float
        How long to run the search (the child stops between executions after it).
    slice_seconds : float
        The most time one of the search's tasks gets before the next, so that the time
        spreads over ``seconds / slice_seconds`` tasks drawn at random.
    seed : int
        The order of the tasks.

    Returns
    -------
    dict or None
        ``executions``, ``seconds``, ``rate`` (executions/s) and ``what`` (a sentence),
        plus ``priced``, ``good``, ``tasks_run``, ``tasks_complete``, ``tasks``, ``commit``,
        ``calculon_said_rate`` (its own log line) and ``load`` (the 1-minute load average
        after the run); None when no Calculon checkout is found.
    """
    if model not in CALCULON_MODELS:
        raise ValueError(f"calculon_rate: model {model!r} has no Calculon file "
                         f"(known: {', '.join(CALCULON_MODELS)})")
    if system not in CALCULON_SYSTEMS:
        raise ValueError(f"calculon_rate: system {system!r} has no Calculon file "
                         f"(known: {', '.join(CALCULON_SYSTEMS)})")
    if not (seconds > 0 and slice_seconds > 0):
        raise ValueError(f"calculon_rate: seconds {seconds} and slice_seconds "
                         f"{slice_seconds} must be positive")
    checkout = calculon_checkout()
    if checkout is None:
        return None
    system_file, datatype = CALCULON_SYSTEMS[system]
    _check_same_model(model, os.path.join(checkout, CALCULON_MODELS[model]))
    spec = {"checkout": os.path.abspath(checkout), "model": CALCULON_MODELS[model],
            "system": system_file, "datatype": datatype, "gpus": int(gpus),
            "global_batch": int(global_batch), "seconds": float(seconds),
            "slice_seconds": float(slice_seconds), "seed": int(seed)}
    python = os.environ.get("CALCULON_PYTHON") or sys.executable
    limit = seconds + START_UP_ALLOWANCE
    try:
        child = subprocess.run([python, os.path.abspath(__file__), "--inside-calculon",
                                json.dumps(spec)], cwd=checkout, capture_output=True,
                               text=True, timeout=limit, check=False)
    except subprocess.TimeoutExpired:
        raise CalculonError(f"calculon_rate: Calculon at {checkout} ran past {limit:.0f} s "
                            f"under {python}; stopped") from None
    except OSError as error:
        raise CalculonError(f"calculon_rate: cannot start {python}: {error}") from None
    lines = child.stdout.strip().splitlines()
    if child.returncode != 0 or not lines:
        last = (child.stderr.strip().splitlines() or ["no output"])[-1]
        raise CalculonError(f"calculon_rate: Calculon at {checkout} failed under {python} "
                            f"(exit {child.returncode}): {last}")
    measured = json.loads(lines[-1])
    measured["commit"] = _commit(checkout)
    measured["load"] = os.getloadavg()[0]
    measured["rate"] = measured["executions"] / measured["seconds"]
    measured["what"] = (
        f"Calculon {measured['commit'][:12]} llm-optimal-execution {spec['model']} "
        f"{gpus} {global_batch} {datatype} {system_file}: OptimalExecution.search unchanged "
        f"on one core, {measured['tasks_run']} of its {measured['tasks']} tasks drawn at "
        f"random (seed {seed}), at most {slice_seconds:g} s each; every execution it tried "
        f"counted, good and bad ({measured['priced']} priced in full, {measured['good']} fit)")
    return measured


def _check_same_model(model, calculon_file):
    """Refuse a mapping whose sizes differ from tabsched's preset (skipped without tabsched)."""
    try:
        with open(calculon_file, encoding="utf-8") as handle:
            theirs = json.load(handle)
    except (OSError, ValueError) as error:
        raise CalculonError(f"calculon_rate: cannot read {calculon_file}: "
                            f"{type(error).__name__}") from None
    try:
        from tabsched import load_model
    except ImportError:
        return
    ours = load_model(model)
    pairs = {"num_blocks": ours.layers, "hidden": ours.hidden, "attn_heads": ours.heads,
             "attn_size": ours.hidden // ours.heads, "feedforward": ours.ffn,
             "seq_size": ours.sequence}
    for key, value in pairs.items():
        if theirs.get(key) != value:
            raise CalculonError(f"calculon_rate: {calculon_file} has {key} "
                                f"{theirs.get(key)!r}, tabsched's {model} {value}")


def _commit(checkout):
    """The checkout's commit, or "unknown" outside git."""
    try:
        found = subprocess.run(["git", "-C", checkout, "rev-parse", "HEAD"],
                               capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return found.stdout.strip() if found.returncode == 0 else "unknown"


# ---- the child: runs under Calculon's Python, in its checkout ----------------------------

class _SliceOver(Exception):
    """Raised at the start of an execution once its task's time is up (not an Llm.Error,
    so Calculon's search lets it through)."""


def _inside_calculon(spec):
    """Run ``llm-optimal-execution`` with the sampling pool; print the counts as JSON."""
    import argparse as calculon_argparse
    import logging
    import random
    import tempfile
    import types

    sys.path.insert(0, spec["checkout"])
    from calculon.llm import Llm
    from calculon.llm import optimal_execution

    counts = {"executions": 0, "priced": 0, "good": 0}
    slice_end = [math.inf]
    original_init, original_run = Llm.__init__, Llm.run
    original_stats = Llm.get_stats_json

    def counted_init(self, app, log):
        if time.perf_counter() >= slice_end[0]:
            raise _SliceOver()
        counts["executions"] += 1
        original_init(self, app, log)

    def counted_run(self, system):
        counts["priced"] += 1
        return original_run(self, system)

    def counted_stats(self, include_layers):
        counts["good"] += 1
        return original_stats(self, include_layers)

    Llm.__init__, Llm.run, Llm.get_stats_json = counted_init, counted_run, counted_stats
    progress = {"tasks": 0, "tasks_run": 0, "tasks_complete": 0, "seconds": 0.0}

    class SamplingPool:
        """Stands in for ``multiprocessing.Pool``: the searches in this process, drawn at
        random, each at most ``slice_seconds``, ``seconds`` in all."""

        def __init__(self, processes=None):
            self.processes = processes

        def __enter__(self):
            return self

        def __exit__(self, *exc_info):
            return False

        def starmap(self, search, tasks):
            order = list(tasks)
            progress["tasks"] = len(order)
            random.Random(spec["seed"]).shuffle(order)
            began = time.perf_counter()
            end = began + spec["seconds"]
            searches = []
            for task in order:
                now = time.perf_counter()
                if now >= end:
                    break
                slice_end[0] = min(now + spec["slice_seconds"], end)
                before = dict(counts)
                progress["tasks_run"] += 1
                try:
                    searches.append(search(*task))
                    progress["tasks_complete"] += 1
                except _SliceOver:
                    tried = counts["executions"] - before["executions"]
                    good = counts["good"] - before["good"]
                    # (best, executions, good, bad, tp, pp), as search returns them
                    searches.append(([], tried, good, tried - good, task[8], task[9]))
            progress["seconds"] = time.perf_counter() - began
            slice_end[0] = math.inf
            return searches

    optimal_execution.mp = types.SimpleNamespace(Pool=SamplingPool)
    command = optimal_execution.OptimalExecution
    parser = calculon_argparse.ArgumentParser()
    command.create_parser(parser.add_subparsers())
    with tempfile.TemporaryDirectory() as scratch:
        args = parser.parse_args([
            command.NAME, spec["model"], str(spec["gpus"]), str(spec["global_batch"]),
            spec["datatype"], spec["system"], os.path.join(scratch, "optimal.json"),
            "--cpus", "1", "--noneok"])
        logger = logging.getLogger("calculon-rate")
        logger.propagate = False
        logger.setLevel(logging.INFO)
        lines = []
        handler = logging.Handler()
        handler.emit = lambda record: lines.append(record.getMessage())
        logger.addHandler(handler)
        status = args.func(logger, args)
    said = dict(re.findall(r"^(Total executions|Good executions|Calculation rate): ([\d.]+)",
                           "\n".join(lines), re.MULTILINE))
    if status != 0 or int(said.get("Total executions", -1)) != counts["executions"]:
        raise SystemExit(f"llm-optimal-execution returned {status} and said {said}, "
                         f"where {counts['executions']} executions were counted")
    print(json.dumps({**counts, **progress,
                      "calculon_said_rate": float(said["Calculation rate"])}))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt3-175b", choices=sorted(CALCULON_MODELS))
    parser.add_argument("--system", default="dgx-a100", choices=sorted(CALCULON_SYSTEMS))
    parser.add_argument("--gpus", type=int, default=1024)
    parser.add_argument("--global-batch", type=int, default=1536)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--slice-seconds", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--inside-calculon", metavar="SPEC", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside_calculon:
        _inside_calculon(json.loads(args.inside_calculon))
        return
    try:
        measured = calculon_rate(args.model, args.system, args.gpus, args.global_batch,
                                 args.seconds, slice_seconds=args.slice_seconds,
                                 seed=args.seed)
    except (ValueError, CalculonError) as error:
        sys.exit(f"Error: {error}")
    if measured is None:
        print("Calculon: skipped (no checkout at $CALCULON_DIR or /tmp/calculon)")
        return
    print(f"Calculon: {measured['executions']:,} executions in {measured['seconds']:.2f} s, "
          f"{measured['rate']:,.1f} executions/s (load average {measured['load']:.2f})")
    print(f"  {measured['what']}")


if __name__ == "__main__":
    main()
