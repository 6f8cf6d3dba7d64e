"""Cost-model benchmark: evaluate() end to end with ModelCosts against UnitCosts.

1F1B at S=64, M=4096 (524k ops, about 1M DAG nodes), paper-128l on
mid_nw_mid_cp. Prints, measured in this run, the end-to-end time of
``evaluate()`` and of cost assignment alone (``node_durations``) under each
cost model, and their ratios. The target (issue 3): ModelCosts end to end
within 1.5x of UnitCosts on the same DAG. Not collected by pytest.

    python bench/bench_costs.py [--devices 64] [--microbatches 4096] [--repeat 3]
"""

import argparse

from _timing import best_of

import tabsched
from tabsched.lower import lower




def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=64)
    parser.add_argument("--microbatches", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--model", default="paper-128l")
    parser.add_argument("--system", default="mid_nw_mid_cp")
    args = parser.parse_args()

    table = tabsched.generate("1f1b", devices=args.devices, microbatches=args.microbatches)
    unit = tabsched.UnitCosts()
    model = tabsched.ModelCosts(args.model, args.system)
    print(f"1F1B S={args.devices} M={args.microbatches}: {len(table)} ops; "
          f"ModelCosts({args.model}, {args.system}), the system's contention "
          f"{model.contention!r}")

    rows = []
    for contention in ("none", model.contention):
        lowered = lower(table, contention=contention,
                        devices_per_node=model.devices_per_node)
        unit_costs, _ = best_of(args.repeat, lambda: unit.node_durations(lowered))
        model_costs, _ = best_of(args.repeat, lambda: model.node_durations(lowered))
        unit_time, unit_result = best_of(args.repeat, lambda: tabsched.evaluate(
            table, unit, contention=contention, formula=False))
        model_time, model_result = best_of(args.repeat, lambda: tabsched.evaluate(
            table, model, contention=contention, formula=False))
        rows.append((contention, unit_costs, model_costs, unit_time, model_time,
                     unit_result.makespan, model_result.makespan))
        if contention == model.contention:
            break

    for contention, unit_costs, model_costs, unit_time, model_time, unit_span, span in rows:
        print(f"contention {contention}:")
        print(f"  cost assignment  UnitCosts {unit_costs * 1e3:8.1f} ms   ModelCosts "
              f"{model_costs * 1e3:8.1f} ms   ratio {model_costs / unit_costs:5.2f}x")
        print(f"  evaluate()       UnitCosts {unit_time * 1e3:8.1f} ms   ModelCosts "
              f"{model_time * 1e3:8.1f} ms   ratio {model_time / unit_time:5.2f}x "
              f"(target <= 1.5x)")
        print(f"  makespan         {unit_span:g} slots; {span:.4g} s")


if __name__ == "__main__":
    main()
