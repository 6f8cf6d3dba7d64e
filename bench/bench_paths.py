"""Critical-path benchmark: the path at 10^5 and 10^6 operations, against evaluate.

``Result.critical_path`` walks back from the node that ends last and builds one step per
node on the path. It was quadratic (each step's label scanned the table for its cell and
read every transfer's ends): 1F1B at S=64, M=4096 took 19.8 s. This prints, for GPipe on
one device (a path through every operation) and 1F1B at S=64, the time of ``evaluate``,
of the path's steps and of ``critical_counts`` (what ``tabsched eval`` prints), at two
sizes ten times apart, and the growth of the path's time per step from one to the other
(1.0: linear). Not collected by pytest.

    python bench/bench_paths.py [--repeat 3]
"""

import argparse

from _timing import best_of

import tabsched


def measure(family, devices, microbatches, repeat):
    table = tabsched.generate(family, devices=devices, microbatches=microbatches)
    evaluate_s, result = best_of(repeat, lambda: tabsched.evaluate(table))
    result.critical_nodes()     # the binding rerun, once, as evaluate leaves it to later
    path_s, path = best_of(repeat, lambda: result.critical_path)
    counts_s, _ = best_of(repeat, result.critical_counts)
    return len(table), evaluate_s, path_s, counts_s, len(path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    for family, devices, sizes in (("gpipe", 1, (50_000, 500_000)),
                                   ("1f1b", 64, (512, 5_120))):
        per_step = []
        for microbatches in sizes:
            ops, evaluate_s, path_s, counts_s, steps = measure(family, devices, microbatches,
                                                              args.repeat)
            per_step.append(path_s / steps)
            print(f"{family:<5} S={devices:<3} M={microbatches:<7} {ops:>9,} ops: evaluate "
                  f"{evaluate_s * 1e3:8.1f} ms; critical path {steps:>9,} steps "
                  f"{path_s * 1e3:8.1f} ms ({path_s / steps * 1e9:5.0f} ns/step, "
                  f"{path_s / evaluate_s:4.2f}x evaluate); counts {counts_s * 1e3:6.1f} ms")
        print(f"{family:<5} path time per step, 10x the operations: x{per_step[1] / per_step[0]:.2f}"
              f" (1.0 is linear)")


if __name__ == "__main__":
    main()
