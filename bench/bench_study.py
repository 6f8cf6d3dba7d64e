"""Study benchmark: the tabular paper's whole grid, serially and on 2 processes.

Prints configurations per second for each way of running, measured in one run,
and checks the two give the same CSV. Not collected by pytest.

    python bench/bench_study.py [--jobs 2] [--repeat 3]
"""

import argparse

from _timing import best_of

from tabsched.study import STUDIES
from tabsched.sweeps import grid_tasks, rows_to_csv, run_sweep




def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    setup = STUDIES["tabular-paper"]
    tasks = grid_tasks(setup["specs"], setup["devices"], setup["microbatches"],
                       models=(setup["model"],), systems=setup["systems"],
                       global_batch=setup["global_batch"])
    configurations = sum(task.configurations for task in tasks)
    serial, rows = best_of(args.repeat, lambda: run_sweep(tasks))
    parallel, rows_parallel = best_of(args.repeat, lambda: run_sweep(tasks, jobs=args.jobs))
    assert rows_to_csv(rows) == rows_to_csv(rows_parallel)
    print(f"tabular-paper study: {len(tasks)} tables, {configurations} configurations")
    print(f"serial            {serial:7.2f} s  {configurations / serial:8.0f} configurations/s")
    print(f"{args.jobs} processes       {parallel:7.2f} s  "
          f"{configurations / parallel:8.0f} configurations/s  ({serial / parallel:.2f}x)")


if __name__ == "__main__":
    main()
