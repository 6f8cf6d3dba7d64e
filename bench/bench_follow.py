"""``adapt --follow`` keeps up with one trace per second without growing memory (issue 26).

A writer thread drops ``--files`` step traces (one folder of per-rank files each, as
``examples/torch_pipeline.py`` writes them) into a directory every ``--interval`` seconds
(default 0.5: twice the target rate of one per second); :func:`tabsched.adapt.follow.follow`
reads them in this process. The step traces come from :func:`tabsched.whatif.synthetic_trace`
(a simulated 1F1B run whose stage 1 drifts slower, so the fit moves and the search runs
again), padded with ``--pad`` nested ``aten::`` events per operation so that a file is the
size of a real CPU trace (the runner's 1F1B p=2 m=8 step: about 3.5 MB for 4 iterations).

Printed: per-file processing time (mean, p95, max) and its ratio to the interval (below 1:
it keeps up), the searches, and the resident memory (``/proc/self/statm``) after the first
quarter of the files and at the end: the growth must stay near zero, since the fit and the
replay keep a bounded window. Needs no torch::

    python bench/bench_follow.py                        # 40 files, one every 0.5 s
    python bench/bench_follow.py --files 100 --interval 1
"""

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))


def rss_bytes():
    """Resident memory of this process now (Linux), bytes."""
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def padded(folder, pad):
    """Add ``pad`` nested events per operation to each rank file of ``folder``."""
    for path in pathlib.Path(folder).glob("rank*.json"):
        document = json.loads(path.read_text())
        extra = []
        for event in document["traceEvents"]:
            if event["name"].startswith("PP:") and event["dur"] > 0 and "RECV" not in \
                    event["name"]:
                step = event["dur"] / (pad + 1)
                extra.extend({"ph": "X", "cat": "cpu_op", "name": "aten::mm",
                              "ts": event["ts"] + k * step, "dur": step * 0.9,
                              "pid": event["pid"], "tid": event["tid"]} for k in range(pad))
        document["traceEvents"].extend(extra)
        path.write_text(json.dumps(document))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=40)
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--pad", type=int, default=60,
                        help="nested events per operation (real traces: tens to hundreds)")
    parser.add_argument("-m", "--microbatches", type=int, default=8)
    arguments = parser.parse_args(argv)
    from tabsched import StageCosts, generate
    from tabsched.adapt.follow import follow
    from tabsched.whatif import synthetic_trace

    table = generate("1f1b", devices=2, microbatches=arguments.microbatches)
    with tempfile.TemporaryDirectory(prefix="tabsched-follow-") as folder:
        root = pathlib.Path(folder)
        source, job = root / "source", root / "job"
        job.mkdir()
        kinds = 6     # distinct drift levels, written once and copied: the writer stays cheap
        for level in range(kinds):
            synthetic_trace(table, StageCosts([1e-3, 1e-3 * (1 + 0.3 * level)], comm=1e-4),
                            source / f"level{level}", iterations=4)
            padded(source / f"level{level}", arguments.pad)
        size = sum(path.stat().st_size for path in (source / "level0").iterdir())
        memory = {}

        def feed():
            import shutil
            for number in range(arguments.files):
                level = min(number * kinds // arguments.files, kinds - 1)
                shutil.copytree(source / f"level{level}", job / f".step{number:04d}")
                os.rename(job / f".step{number:04d}", job / f"step{number:04d}")
                time.sleep(arguments.interval)
        writer = threading.Thread(target=feed, daemon=True)

        def report(line):
            count = report.count = getattr(report, "count", 0) + (" iteration " in line)
            if count == max(arguments.files // 4, 1) and "quarter" not in memory:
                memory["quarter"] = rss_bytes()
        memory["start"] = rss_bytes()
        writer.start()
        began = time.perf_counter()
        result = follow(job, table, poll=min(arguments.interval / 5, 0.2),
                        max_files=arguments.files, timeout=arguments.files *
                        arguments.interval * 4 + 60, report=report, samples=32)
        elapsed = time.perf_counter() - began
        memory["end"] = rss_bytes()
        writer.join()
    seconds = sorted(result.seconds)
    mean = statistics.mean(seconds)
    p95 = seconds[min(len(seconds) - 1, int(0.95 * len(seconds)))]
    print(f"{len(result.processed)} step traces of {size / 2**20:.1f} MB (2 ranks), one every "
          f"{arguments.interval:g} s; {result.searches} searches; {len(result.skipped)} skipped; "
          f"{elapsed:.1f} s in all")
    print(f"per file: mean {mean * 1e3:.0f} ms, p95 {p95 * 1e3:.0f} ms, max "
          f"{seconds[-1] * 1e3:.0f} ms; mean / interval {mean / arguments.interval:.2f}, "
          f"p95 / interval {p95 / arguments.interval:.2f} (below 1: keeps up)")
    quarter = memory.get("quarter", memory["start"])
    print(f"resident memory: {memory['start'] / 2**20:.0f} MB at the start, "
          f"{quarter / 2**20:.0f} MB after a quarter of the files, {memory['end'] / 2**20:.0f} MB "
          f"at the end: growth over the last three quarters "
          f"{(memory['end'] - quarter) / 2**20:+.1f} MB ({memory['end'] / quarter - 1:+.1%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
