"""Adapt benchmark: Monte Carlo throughput, and the adaptive search at S=8, M=32.

Monte Carlo: 1F1B with about 100k operations (S=32, M=1563: 100,032 operations,
about 197k DAG nodes with the transfers) on paper-128l and mid_nw_mid_cp,
noise CV 0.1 and a 3x slower link, 1000 samples in one ``monte_carlo`` call.
Prints the time, operation-samples per second, the peak memory it traced, and
the ratio against evaluating the same samples one by one from Python in the
same run: (a) one kernel call per sample (``LoweredSchedule.run``, what a loop
over ``evaluate`` does at its core), timed on ``--loop-samples`` samples; (b)
the plain-Python evaluator (``tabsched._reference``) on one sample. Both are
scaled to the full sample count.

The same two ways on 1F1B S=8, M=32 (about 1,700 nodes), where a call's fixed
cost is not small against a sample's.

Search: ``adapt`` on 1F1B S=8, M=32, paper-128l on slow_nw_mid_cp with full
recomputation, an 80 GB budget, a 3x slower link 3-4 and noise CV 0.1, 256
samples per candidate: time, rounds, candidates and the gains.

    python bench/bench_adapt.py [--samples 1000] [--contention link] [--skip-reference]
        [--search-devices 64 --search-microbatches 256]
"""

import argparse
import gc
import time
import tracemalloc

import numpy as np

import tabsched
from tabsched import _kernel, _reference
from tabsched._testing import kernel_graphs, kernel_scratch
from tabsched.adapt import Noise, SlowLink, VariationContext, adapt, monte_carlo
from tabsched.lower import lower


def timed(function):
    gc.collect()
    began = time.perf_counter()
    value = function()
    return time.perf_counter() - began, value


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=32)
    parser.add_argument("--microbatches", type=int, default=1563)
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--loop-samples", type=int, default=20)
    parser.add_argument("--contention", choices=["none", "link"], default="link")
    parser.add_argument("--skip-reference", action="store_true")
    parser.add_argument("--skip-search", action="store_true")
    parser.add_argument("--search-devices", type=int, default=8,
                        help="the search's pipeline depth (issue 24's case: 64)")
    parser.add_argument("--search-microbatches", type=int, default=32,
                        help="the search's microbatches (issue 24's case: 256)")
    args = parser.parse_args()

    table = tabsched.generate("1f1b", devices=args.devices, microbatches=args.microbatches)
    costs = tabsched.ModelCosts("paper-128l", "mid_nw_mid_cp", recompute="full",
                                contention=args.contention)
    variation = Noise(0.1) + SlowLink((args.devices // 2 - 1, args.devices // 2), 3.0)
    ops = len(table)
    lowered = lower(table, contention=args.contention)
    print(f"Monte Carlo: 1F1B S={args.devices} M={args.microbatches}: {ops} operations, "
          f"{lowered.num_nodes} nodes, contention {args.contention}, {args.samples} samples")

    tracemalloc.start()
    seconds, runs = timed(lambda: monte_carlo(table, costs, variation, samples=args.samples,
                                              seed=0))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rate = ops * args.samples / seconds
    print(f"  one call                  {seconds:8.2f} s   {rate / 1e6:8.1f} M op-samples/s   "
          f"{runs.chunks} chunks, peak traced {peak / 2**20:.0f} MiB "
          f"(a full duration matrix would be "
          f"{args.samples * lowered.num_nodes * 8 / 2**30:.2f} GiB)")
    print(f"  mean {runs.mean:.4f} s, p95 {runs.p95:.4f} s, run-time bubble "
          f"{runs.runtime_bubble * 1e3:.1f} ms")

    context = VariationContext(lowered, costs, seed=0)
    loop = min(args.loop_samples, args.samples)

    def one_by_one():
        makespans = []
        for sample in range(loop):
            durations = context.sample_durations(variation, [sample])
            _, end, _ = lowered.run(durations, binding=False)
            makespans.append(float(end.max()))
        return makespans

    loop_seconds, makespans = timed(one_by_one)
    assert makespans == runs.makespans[:loop].tolist()
    per_sample = loop_seconds / loop
    print(f"  one kernel call a sample  {per_sample * 1e3:8.1f} ms a sample -> "
          f"{per_sample * args.samples:7.1f} s for {args.samples}: the batched call is "
          f"{per_sample * args.samples / seconds:5.1f}x faster")
    if not args.skip_reference:
        durations = context.sample_durations(variation, [0])
        n = lowered.num_nodes

        def reference():
            makespan = np.empty(1)
            graph, = kernel_graphs(lowered, (_reference,))
            status = _reference.fifo_summary(
                graph, durations, makespan, np.empty((1, table.num_devices)),
                np.empty((1, table.num_devices)), np.empty((1, table.num_devices)),
                kernel_scratch(_reference, graph, n))
            assert status == _kernel.OK
            return float(makespan[0])

        ref_seconds, makespan = timed(reference)
        assert makespan == runs.makespans[0]
        print(f"  plain Python, a sample    {ref_seconds:8.2f} s -> "
              f"{ref_seconds * args.samples / 3600:7.2f} h for {args.samples}: the batched "
              f"call is {ref_seconds * args.samples / seconds:7.0f}x faster")

    small = tabsched.generate("1f1b", devices=8, microbatches=32)
    small_lowered = lower(small, contention=args.contention)
    small_variation = Noise(0.1) + SlowLink((3, 4), 3.0)
    seconds, small_runs = timed(lambda: monte_carlo(small, costs, small_variation,
                                                    samples=args.samples, seed=0))
    small_context = VariationContext(small_lowered, costs, seed=0)

    def small_one_by_one():
        return [float(small_lowered.run(small_context.sample_durations(small_variation,
                                                                       [sample]),
                                        binding=False)[1].max())
                for sample in range(args.samples)]

    loop_seconds, makespans = timed(small_one_by_one)
    assert makespans == small_runs.makespans.tolist()
    print(f"Monte Carlo: 1F1B S=8 M=32: {len(small)} operations, {small_lowered.num_nodes} "
          f"nodes, {args.samples} samples")
    print(f"  one call {seconds * 1e3:7.1f} ms ({len(small) * args.samples / seconds / 1e6:.1f} "
          f"M op-samples/s); one kernel call a sample {loop_seconds * 1e3:7.1f} ms: the "
          f"batched call is {loop_seconds / seconds:5.1f}x faster")

    if args.skip_search:
        return
    start = tabsched.generate("1f1b", devices=args.search_devices,
                              microbatches=args.search_microbatches)
    search_costs = tabsched.ModelCosts("paper-128l", "slow_nw_mid_cp", recompute="full")
    search_variation = SlowLink((3, 4), 3.0) + Noise(0.1)
    seconds, found = timed(lambda: adapt(start, search_costs, search_variation, "80GB",
                                         samples=256, seed=0))
    evaluated = sum(candidate.evaluated for candidate in found.log)
    print(f"Search: 1F1B S={args.search_devices} M={args.search_microbatches}, paper-128l on "
          "slow_nw_mid_cp, recompute full, 80 GB, "
          "link 3-4 3x slower, noise CV 0.1, 256 samples per candidate")
    print(f"  {seconds:.1f} s: {found.rounds} rounds, {len(found.log)} candidates "
          f"({evaluated} evaluated), feasible {found.feasible}")
    print(f"  decision: {' -> '.join(found.transforms)}")
    rows = [("baseline 1F1B", found.baseline), ("adapted", found.adapted),
            ("ZB-H1", found.references["zb-h1"])]
    for name, report in rows:
        print(f"  {name:<14} mean {report.mean:.4f} s  p95 {report.p95:.4f} s  peak "
              f"{max(report.peak_memory) / 1e9:5.1f} GB  fits {report.feasible}")
    print(f"  gain (mean, fresh samples): {found.gain(found.baseline):.2%} over 1F1B, "
          f"{found.gain(found.references['zb-h1']):.2%} over ZB-H1; least headroom "
          f"{min(found.headroom) / 1e9:.2f} GB")
    best = found.best_reference
    print(f"  best fitting reference of {len(found.references)}: {best} "
          f"({found.gain(found.references[best]):+.2%}); started from "
          f"{found.started_from or 'the start'}; returned reference "
          f"{found.returned_reference or 'none'}")


if __name__ == "__main__":
    main()
