"""Measured vs predicted: run schedules in PyTorch on CPU, replay their profiles in tabsched.

For each schedule family, on ``--devices`` CPU processes (gloo):

1. tabsched generates the table and writes PyTorch's compute_only CSV;
2. PyTorch's pipelining runtime runs it (``examples/torch_pipeline.py``):
   ``--timed`` iterations with the profiler off, then ``--profiled`` iterations
   with it on, each after ``--warmup`` iterations; each rank writes a profiler
   trace;
3. tabsched reads the traces (``Replay.from_kineto``, what ``tabsched eval
   --replay DIR`` does) and evaluates the same table with the measured
   durations, one Monte Carlo sample per profiled iteration, and transfers
   costing the one-way time of an activation that a ping-pong measured;
4. the script prints, per schedule, the predicted and the measured iteration
   time, and the ranking of the schedules by each.

Measured times are wall times from a barrier to the last rank's end of
``step()``. "profiled" compares each profiled iteration with the prediction
from its own durations (the model's error alone); "profiler off" is the
median of the timed iterations (what a user sees; the profiler's overhead
makes the replayed durations longer than these). Run it with torch installed::

    python examples/measure_vs_predict.py                  # 2 processes, 16 microbatches
    python examples/measure_vs_predict.py --families 1f1b zbv --microbatches 32

The fidelity report (``docs/fidelity.md``) shows a run and discusses it.
"""

import argparse
import pathlib
import statistics
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch_pipeline as pipeline  # noqa: E402  (needs torch)

from tabsched import StageCosts, generate  # noqa: E402
from tabsched.adapt import Replay, monte_carlo  # noqa: E402
from tabsched.pytorch import to_compute_only  # noqa: E402

FAMILIES = ("gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "zb-h1", "zbv", "dualpipev")
CHUNKED = {"interleaved-1f1b": 2, "looped-bfs": 2}


def parse_arguments(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="+", default=list(FAMILIES))
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--microbatches", type=int, default=16)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--sequence", type=int, default=64)
    parser.add_argument("--microbatch-size", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--timed", type=int, default=5)
    parser.add_argument("--profiled", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=1800.0,
                        help="seconds before every rank is killed")
    parser.add_argument("--out", help="directory for tables, traces and results "
                                      "(default: a temporary one)")
    return parser.parse_args(argv)


def wall_times(results, job):
    """Per iteration: from the earliest start to the latest end over the ranks."""
    per_rank = [results[job["name"], rank]["times"] for rank in range(job["ranks"])]
    return [max(times[i][1] for times in per_rank) - min(times[i][0] for times in per_rank)
            for i in range(len(per_rank[0]))]


def ranking(values):
    """Names from fastest to slowest."""
    return [name for name, _ in sorted(values.items(), key=lambda item: item[1])]


def discordant_pairs(first, second):
    """Pairs the two orders put the other way round."""
    position = {name: index for index, name in enumerate(second)}
    return [(a, b) for i, a in enumerate(first) for b in first[i + 1:]
            if position[a] > position[b]]


def main(argv=None):
    """Run with ``--out DIR`` to keep the tables, traces and results; without it they go
    to a temporary folder that is removed at the end (a run leaves hundreds of MB of
    profiler traces)."""
    arguments = parse_arguments(argv)
    if arguments.out:
        out = pathlib.Path(arguments.out)
        out.mkdir(parents=True, exist_ok=True)
        return run(arguments, out)
    with tempfile.TemporaryDirectory(prefix="tabsched-measure-") as folder:
        return run(arguments, pathlib.Path(folder))


def run(arguments, out):
    """Measure every schedule in ``out``, predict it, print the comparison."""
    config = pipeline.ModelConfig(layers=arguments.layers, hidden=arguments.hidden,
                                  sequence=arguments.sequence, vocabulary=256,
                                  microbatch_size=arguments.microbatch_size)
    tables, jobs = {}, [pipeline.pingpong_job("pingpong", config=config)]
    for family in arguments.families:
        table = generate(family, devices=arguments.devices, microbatches=arguments.microbatches,
                         **({"chunks": CHUNKED[family]} if family in CHUNKED else {}))
        tables[family] = table
        path = out / f"{family}.csv"
        path.write_bytes(to_compute_only(table).encode())
        jobs.append(pipeline.job_for(table, path, f"{family}.timed", config=config,
                                     warmup=arguments.warmup, iterations=arguments.timed))
        jobs.append(pipeline.job_for(table, path, f"{family}.profiled", config=config,
                                     warmup=arguments.warmup, iterations=arguments.profiled,
                                     profile=True))
    print(f"running {len(tables)} schedules on {arguments.devices} CPU processes "
          f"({arguments.microbatches} microbatches of {config.microbatch_size}x{config.sequence} "
          f"tokens, {config.layers} layers, hidden {config.hidden}); results in "
          f"{out if arguments.out else 'a temporary folder, removed at the end (--out keeps it)'}",
          file=sys.stderr)
    results = pipeline.run_jobs(jobs, out / "run", timeout=arguments.timeout)
    transfer = pipeline.one_way_time(results, jobs[0])
    costs = StageCosts(1.0, comm=transfer)  # replay sets every operation; comm is measured

    rows = {}
    for family, table in tables.items():
        traces = out / "run" / f"{family}.profiled.traces"
        replay = Replay.from_kineto(traces, table=table)
        runs = monte_carlo(table, costs, replay, samples=arguments.profiled)
        compute_only = monte_carlo(table, costs, Replay.from_kineto(
            traces, table=table, attach_actions=False), samples=arguments.profiled)
        profiled = wall_times(results, next(job for job in jobs
                                            if job["name"] == f"{family}.profiled"))
        timed = wall_times(results, next(job for job in jobs if job["name"] == f"{family}.timed"))
        predicted = runs.makespans.tolist()
        errors = [p / m - 1 for p, m in zip(predicted, profiled)]
        rows[family] = {"predicted": statistics.mean(predicted),
                        "compute only": float(compute_only.makespans.mean()),
                        "measured": statistics.mean(profiled),
                        "error": statistics.mean(errors),
                        "spread": (max(profiled) - min(profiled)) / statistics.mean(profiled),
                        "timed": statistics.median(timed),
                        "actions": replay.profile.attached / arguments.profiled}

    print(f"one activation transfer (ping-pong): {transfer * 1e6:.0f} us")
    print("per schedule: predicted and measured mean of the profiled iterations, the mean "
          "error of each\niteration's prediction, the measured spread (max - min) / mean, the "
          "prediction from\ncompute alone (no SEND/RECV time), the median iteration with the "
          "profiler off")
    print(f"{'schedule':<18}{'predicted':>11}{'measured':>11}{'error':>9}{'spread':>9}"
          f"{'compute only':>14}{'profiler off':>14}")
    for family, row in rows.items():
        print(f"{family:<18}{row['predicted'] * 1e3:>9.1f}ms{row['measured'] * 1e3:>9.1f}ms"
              f"{row['error']:>+9.1%}{row['spread']:>9.1%}{row['compute only'] * 1e3:>12.1f}ms"
              f"{row['timed'] * 1e3:>12.1f}ms")
    by_prediction = ranking({family: row["predicted"] for family, row in rows.items()})
    by_measurement = ranking({family: row["measured"] for family, row in rows.items()})
    by_timed = ranking({family: row["timed"] for family, row in rows.items()})
    print("ranking, predicted:            " + " < ".join(by_prediction))
    print("ranking, measured (profiled):  " + " < ".join(by_measurement))
    print("ranking, measured (no profiler): " + " < ".join(by_timed))
    swapped = discordant_pairs(by_prediction, by_measurement)
    if not swapped:
        print("the rankings agree")
    for a, b in swapped:
        gap = abs(rows[a]["measured"] - rows[b]["measured"]) / min(rows[a]["measured"],
                                                                    rows[b]["measured"])
        noise = max(rows[a]["spread"], rows[b]["spread"])
        verdict = ("within the run-to-run spread" if gap <= noise
                   else "larger than the run-to-run spread")
        print(f"disagree: {a} vs {b}: predicted {rows[a]['predicted'] * 1e3:.1f} vs "
              f"{rows[b]['predicted'] * 1e3:.1f} ms, measured {rows[a]['measured'] * 1e3:.1f} vs "
              f"{rows[b]['measured'] * 1e3:.1f} ms (a {gap:.1%} gap, {verdict} of {noise:.1%})")


if __name__ == "__main__":
    main()
