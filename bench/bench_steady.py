"""Steady-state period benchmark: ``Result.steady_period`` against one ``evaluate()``.

1F1B at S=64, M=512 (about 65k operations), StageCosts F=1, B=2, comm 0.1, under
contention ``none`` and ``link``. Prints, measured in this run, the time of
``evaluate()`` and of the steady period on top of it, with the global synchronization
(the makespan, taken without unrolling when the steps are equal) and with
post-validation (two unrolled iterations), and their ratios. The target (issue 22
item 4): the period within about 3x one evaluation. Not collected by pytest.

    python bench/bench_steady.py [--devices 64] [--microbatches 512] [--repeat 5]
"""

import argparse

from _timing import best_of

import tabsched


def measure(table, contention, post_validation, repeat):
    """``(evaluate seconds, period seconds)``: the period timed on fresh results (a
    result keeps its period once found)."""
    costs = tabsched.StageCosts(1.0, 2.0, comm=0.1, execution=tabsched.Execution(
        post_validation=post_validation))
    evaluate_s, _ = best_of(repeat, lambda: tabsched.evaluate(table, costs,
                                                              contention=contention))
    results = [tabsched.evaluate(table, costs, contention=contention) for _ in range(repeat)]
    period_s, _ = best_of(repeat, lambda: results.pop().steady_period)
    return evaluate_s, period_s


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=64)
    parser.add_argument("--microbatches", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    table = tabsched.generate("1f1b", devices=args.devices, microbatches=args.microbatches)
    print(f"1F1B S={args.devices} M={args.microbatches}: {len(table)} ops")
    for contention in ("none", "link"):
        for post_validation in (False, True):
            evaluate_s, period_s = measure(table, contention, post_validation, args.repeat)
            how = "post-validation" if post_validation else "synchronized"
            print(f"{contention:5} {how:16} evaluate {evaluate_s * 1e3:8.1f} ms   period "
                  f"{period_s * 1e3:8.1f} ms   ({period_s / evaluate_s:.2f}x)")


if __name__ == "__main__":
    main()
