"""Parallel sweeps: serial against ``-j 2``, a process pool and Dask, in one process.

The grids are ``bench_limits``'s: six families (gpipe, 1f1b, interleaved-1f1b,
zb-h1, zbv, chimera) on the tabular paper's 3x3 systems, from one table each (54
configurations) to ``-p 2,...,64 -m 8,...,1024`` (288 tasks, 2,592
configurations: the issue's grid). For each grid, in this process:

* **serial**: ``run_sweep(tasks)``;
* **-j 2**: ``run_sweep(tasks, jobs=2)``: this process and one forked from it;
* **pool**: ``run_sweep(tasks, executor=pool)`` on a ``ProcessPoolExecutor`` of 2
  processes, started once for all grids;
* **dask**: ``run_sweep(tasks, dask=client)`` on a ``LocalCluster`` of 2
  single-threaded worker processes, started once for all grids (what a user with a
  cluster does; starting it costs about 2-3 s here, which ``--dask local`` pays on
  every command: the CLI runs a grid that cannot gain serially).

Each time is the best of ``--repeat`` runs (the first run of a pool or a cluster
also counts: its workers import tabsched then); memos stay warm between runs, in
this process as in the workers. The ratio is serial's time over the other's: the
targets (issue 24) are -j 2 >= 1.6x and Dask >= 1.4x on the 2,592 grid, and never
below 1.0x (to the noise) on the small ones. A 2-core machine with anything else
running cannot show them. Not collected by pytest.

    python bench/bench_parallel.py [--repeat 3] [--skip dask,pool]
"""

import argparse
import os

from _timing import best_of

from tabsched.sweeps import grid_tasks, run_sweep

FAMILIES = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zbv", "chimera")
GRIDS = {
    "one table": ([4], [8], 8),
    "small": ([4, 8], [8, 16], 16),
    "bench_limits": ([4, 8, 16], [8, 16, 32, 64, 128, 256], 256),
    "issue": ([2, 4, 8, 16, 32, 64], [8, 16, 32, 64, 128, 256, 512, 1024], 1024),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip", default="", help="comma-separated: pool, dask")
    arguments = parser.parse_args()
    skip = set(filter(None, arguments.skip.split(",")))
    print(f"{os.cpu_count()} CPUs; best of {arguments.repeat}")
    pool = client = cluster = None
    if "pool" not in skip:
        from concurrent.futures import ProcessPoolExecutor
        pool = ProcessPoolExecutor(max_workers=2)
    if "dask" not in skip:
        try:
            from distributed import Client, LocalCluster
        except ImportError:
            print("dask: distributed is not installed (pip install 'tabsched[dask]')")
        else:
            cluster = LocalCluster(n_workers=2, threads_per_worker=1,
                                   dashboard_address=None)
            client = Client(cluster)
    try:
        for name, (devices, microbatches, batch) in GRIDS.items():
            tasks = grid_tasks(FAMILIES, devices, microbatches, global_batch=batch)
            serial, rows = best_of(arguments.repeat, lambda: run_sweep(tasks))
            line = f"{name:>12}: {len(rows):5d} configurations, serial {serial:6.3f} s"
            runs = {"-j 2": lambda: run_sweep(tasks, jobs=2)}
            if pool is not None:
                runs["pool"] = lambda: run_sweep(tasks, executor=pool)
            if client is not None:
                runs["dask"] = lambda: run_sweep(tasks, dask=client)
            for label, run in runs.items():
                seconds, parallel_rows = best_of(arguments.repeat, run)
                assert parallel_rows == rows, f"{label} changed the rows of {name}"
                line += f"; {label} {seconds:6.3f} s = {serial / seconds:4.2f}x"
            print(line, flush=True)
    finally:
        if pool is not None:
            pool.shutdown()
        if client is not None:
            client.close()
            cluster.close()


if __name__ == "__main__":
    main()
