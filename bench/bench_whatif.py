"""What-if from one trace against real runs: predict, run, compare (issue 26, item 3).

On this machine's CPU processes (gloo, ``examples/torch_pipeline.py``): trace 1F1B at
``-p`` devices and ``-m`` microbatches with the profiler, fit its costs
(:func:`tabsched.whatif.whatif`), predict other runs -- twice the microbatches, GPipe,
interleaved 1F1B (2 chunks), ZBV -- then run each of them for real, with the profiler on
as in the traced run (its overhead is in the fitted costs, so the targets carry it too),
and print per target the prediction (with its range over the traced iterations' costs),
the measured mean with its run-to-run spread (min - max over ``--iterations``), and the
error. The first row is the traced run itself: the replay of its step at the fitted
costs (target: within 5%); the others' target is 10%.

The ratios are in one process group, one job after the other; on a machine shared with
other work, a job that runs while the cores are busy elsewhere is slower than the trace
for reasons no fit can see, so the spread is printed beside every error. Prints a reason
and exits 0 without torch::

    python bench/bench_whatif.py                    # p=2, m=8, 5 iterations each
    python bench/bench_whatif.py -m 4 --iterations 3 --layers 4
"""

import argparse
import pathlib
import statistics
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "examples"))


def wall_times(results, name, ranks):
    """Per iteration: from the earliest start to the latest end over the ranks."""
    per_rank = [results[name, rank]["times"] for rank in range(ranks)]
    return [max(times[i][1] for times in per_rank) - min(times[i][0] for times in per_rank)
            for i in range(len(per_rank[0]))]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-p", "--devices", type=int, default=2)
    parser.add_argument("-m", "--microbatches", type=int, default=8)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--sequence", type=int, default=64)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--plain-targets", action="store_true",
                        help="run the targets with the profiler off (the traced run keeps it)")
    arguments = parser.parse_args(argv)
    try:
        import torch_pipeline as pipeline
    except ImportError as error:
        print(f"bench_whatif: skipped: needs torch ({error})")
        return 0
    from tabsched import generate
    from tabsched.pytorch import to_compute_only
    from tabsched.whatif import whatif

    p, m = arguments.devices, arguments.microbatches
    config = pipeline.ModelConfig(layers=arguments.layers, hidden=arguments.hidden,
                                  sequence=arguments.sequence, vocabulary=256)
    targets = {"traced 1f1b": ("1f1b", dict(microbatches=m)),
               f"1f1b m={2 * m}": ("1f1b", dict(microbatches=2 * m)),
               "gpipe": ("gpipe", dict(microbatches=m)),
               "interleaved-1f1b v=2": ("interleaved-1f1b", dict(microbatches=m, chunks=2)),
               "zbv": ("zbv", dict(microbatches=m))}
    with tempfile.TemporaryDirectory(prefix="tabsched-whatif-") as folder:
        out = pathlib.Path(folder)
        jobs = []
        for number, (label, (family, params)) in enumerate(targets.items()):
            table = generate(family, devices=p, **params)
            path = out / f"job{number}.csv"
            path.write_bytes(to_compute_only(table).encode())
            jobs.append(pipeline.job_for(table, path, f"job{number}", config=config, warmup=1,
                                         iterations=arguments.iterations,
                                         profile=number == 0 or not arguments.plain_targets))
        print(f"running {len(jobs)} schedules on {p} CPU processes ({m} microbatches of "
              f"{config.microbatch_size}x{config.sequence} tokens, {config.layers} layers, "
              f"hidden {config.hidden}), {arguments.iterations} profiled iterations each",
              file=sys.stderr)
        results = pipeline.run_jobs(jobs, out / "run", timeout=arguments.timeout)
        traces = out / "run" / "job0.traces"
        print(f"{'target':<22}{'predicted':>11}{'range':>19}{'measured':>11}{'spread':>19}"
              f"{'error':>9}")
        for number, (label, (family, params)) in enumerate(targets.items()):
            result = whatif(traces, family, layers=config.layers, **params)
            measured = wall_times(results, f"job{number}", p)
            mean = statistics.mean(measured)
            predicted = result.replayed if number == 0 else result.predicted
            low, high = result.spread
            print(f"{label:<22}{predicted * 1e3:>9.1f}ms{low * 1e3:>8.1f}-{high * 1e3:.1f}ms"
                  f"{mean * 1e3:>9.1f}ms{min(measured) * 1e3:>8.1f}-{max(measured) * 1e3:.1f}ms"
                  f"{predicted / mean - 1:>+9.1%}")
        print(f"(first row: the traced step replayed at its fitted costs; fitted p2p "
              f"{result.fit.transfer * 1e6:.0f} us; spread = min-max of the measured "
              f"iterations, range = the prediction at each traced iteration's costs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
