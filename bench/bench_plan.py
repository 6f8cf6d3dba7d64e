"""Plan benchmark: GPT-3 175B on 1,024 A100s, the whole space, pruned and exhaustive.

Runs ``tabsched.plan`` on the issue's question (``gpt3-175b`` on 1,024 GPUs of
``dgx-a100``, global batch 1,536, every split, family, chunk count, microbatch size,
layer split, recompute, sequence parallelism and ZeRO-1), then the exhaustive search of
the same space beside it (every configuration the sizes allow, simulated), and prints
what each considered, refused, pruned and simulated, their times, the ratio of
simulations and checks that both find the same best configuration (and the same top
rows). With Calculon's harness (``bench/_calculon.py``, ``CALCULON_DIR``) it also prints
Calculon's ``llm-optimal-execution`` rate on the same model and system and tabsched's
against it. Not collected by pytest.

Calculon counts every execution it tries, about two thirds of them rejected by its network
check in tens of microseconds; tabsched refuses about two fifths of its configurations by
their sizes as cheaply. Both ratios are printed: past those cheap checks (tabsched's
configurations decided by a bound or a simulation against Calculon's executions priced in
full) and everything against everything.

    python bench/bench_plan.py [--jobs 2] [--no-exhaustive] [--calculon-seconds 20]
"""

import argparse
import time

from tabsched.plan import plan

QUESTION = {"model": "gpt3-175b", "system": "dgx-a100", "gpus": 1024, "global_batch": 1536}


def _counts(label, result):
    counts = result.counts
    refused = sum(counts.refused.values())
    decided = counts.configurations - refused
    print(f"{label:<11} {result.seconds:8.2f} s  considered {counts.configurations:,}, refused "
          f"by the sizes {refused:,}, pruned by memory {counts.pruned_memory:,}, by time "
          f"{counts.pruned_time:,}, simulated {counts.simulated:,} ({counts.tables:,} tables, "
          f"{counts.fit:,} fit)")
    return decided


def _calculon(seconds):
    """Calculon's measured dict (``bench/_calculon.py``), or ``(None, why not)``."""
    try:
        from _calculon import calculon_rate
    except ImportError:
        return None, "bench/_calculon.py is not here"
    measured = calculon_rate(QUESTION["model"], QUESTION["system"], QUESTION["gpus"],
                             QUESTION["global_batch"], seconds)
    if measured is None:
        return None, "Calculon not found (set CALCULON_DIR to a checkout of it)"
    return measured, None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1,
                        help="processes for the exhaustive search (the plan runs serially)")
    parser.add_argument("--no-exhaustive", action="store_true")
    parser.add_argument("--calculon-seconds", type=float, default=20.0)
    args = parser.parse_args()
    began = time.perf_counter()
    pruned = plan(**QUESTION)
    wall = time.perf_counter() - began
    print(f"{QUESTION['model']} on {QUESTION['gpus']} x {QUESTION['system']}, global batch "
          f"{QUESTION['global_batch']}: {pruned.counts.splits} splits t x p x d")
    decided = _counts("plan", pruned)
    print(f"            {wall:8.2f} s  the whole call (its report included), serial; "
          f"{decided / pruned.seconds:,.0f} configurations decided per second")
    best = pruned.best
    print(f"best        {best.label()}: {best.iteration_s:.4f} s, MFU "
          f"{best.throughput.mfu:.1%}, {len(pruned.tied)} tied within {pruned.tie_band:.1%}")
    if not args.no_exhaustive:
        exhaustive = plan(**QUESTION, prune=False, jobs=args.jobs)
        _counts(f"exhaustive{' -j' + str(args.jobs) if args.jobs > 1 else ''}", exhaustive)
        same = [(row.iteration_s, row.configuration) for row in exhaustive.rows] == [
            (row.iteration_s, row.configuration) for row in pruned.rows]
        print(f"same best configuration: {exhaustive.best.configuration == best.configuration};"
              f" same top {len(pruned.rows)}: {same}")
        print(f"simulations: {exhaustive.counts.simulated / pruned.counts.simulated:.1f}x fewer "
              f"(target >= 20x); time: {exhaustive.seconds / pruned.seconds:.1f}x less; "
              f"exhaustive {exhaustive.counts.simulated / exhaustive.seconds:,.0f} "
              f"simulations per second")
    measured, why = _calculon(args.calculon_seconds)
    if measured is None:
        print(f"Calculon: skipped ({why})")
        return
    rate = measured["executions"] / measured["seconds"]
    priced = measured["priced"] / measured["seconds"]
    print(f"Calculon: {rate:,.1f} executions per second, {priced:,.1f} priced in full "
          f"({measured['what']}; load average {measured['load']:.2f})")
    considered = pruned.counts.configurations / pruned.seconds
    print(f"tabsched plan against Calculon, one core each, in this run:")
    print(f"  past the cheap checks (tabsched: decided by a bound or a simulation, after the "
          f"sizes; Calculon: priced in full, after its network check): "
          f"{decided / pruned.seconds:,.0f} against {priced:,.1f} per second, "
          f"{decided / pruned.seconds / priced:,.0f}x (target >= 100x)")
    print(f"  everything (tabsched: every configuration considered; Calculon: every execution "
          f"tried): {considered:,.0f} against {rate:,.1f} per second, "
          f"{considered / rate:,.0f}x")
    if not args.no_exhaustive:
        print(f"  exhaustive, every configuration simulated in full: "
              f"{exhaustive.counts.simulated / exhaustive.seconds:,.0f} per second, "
              f"{exhaustive.counts.simulated / exhaustive.seconds / priced:,.1f}x Calculon's "
              f"priced")


if __name__ == "__main__":
    main()
