"""Cost-model benchmark: evaluate() end to end with ModelCosts against UnitCosts.

1F1B at S=64, M=4096 (524k ops, about 1M DAG nodes), paper-128l on
mid_nw_mid_cp. Prints, measured in this run, the end-to-end time of
``evaluate()`` and of cost assignment alone (``node_durations``) under each
cost model, and their ratios. The target (issue 3): ModelCosts end to end
within 1.5x of UnitCosts on the same DAG. Then the measured tables (issue 22):
``evaluate()`` of megatron-1t (128 layers) at t = 8 on ``dgx-a100`` (its GEMM table over shape and
its NCCL tables) against the same system without them, every memo cleared before
each run so that the tables' lookups are timed; target <= 1.5x. Then (issue 23) the
price of one layer's kernels, cold: a DeepSeek-V3 MoE layer (latent attention, 256
experts with the expert all-to-alls at EP 8) against a dense llama3-70b layer on
``dgx-h100``, both with its GEMM and NCCL tables; target <= 3x. Not collected by
pytest.

    python bench/bench_costs.py [--devices 64] [--microbatches 4096] [--repeat 3]
"""

import argparse

from _timing import best_of

import tabsched
from tabsched import _memo
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
    measured_tables(table, args.repeat)
    layer_pricing(args.repeat)


def layer_pricing(repeat, rounds=20):
    """One layer's kernels built and timed from cold memos: MoE + MLA against dense."""
    runs = {"llama3-70b (dense, GQA)": dict(model="llama3-70b"),
            "deepseek-v3 (MLA, 256 experts, EP 8)": dict(model="deepseek-v3",
                                                         expert_parallel=8, data_parallel=8)}
    system = tabsched.load_system("dgx-h100")     # read once: the layer is what is timed
    times = {}
    for label, run in runs.items():
        keywords = dict(run)
        model = tabsched.load_model(keywords.pop("model"))

        def price():
            for _ in range(rounds):
                _memo.clear()
                costs = tabsched.ModelCosts(model, system, attention="flash", **keywords)
                costs.part_times([1.0])
            return costs
        times[label] = best_of(repeat, price)[0] / rounds
    dense, moe = times.values()
    print("one layer priced from cold memos (ModelCosts built, every part's kernels timed):")
    for label, seconds in times.items():
        print(f"  {label:38s} {seconds * 1e3:8.2f} ms")
    print(f"  ratio {moe / dense:5.2f}x (target <= 3x)")


def measured_tables(table, repeat):
    """evaluate() on dgx-a100 with and without its measured tables, cold memos."""
    rich = tabsched.load_system("dgx-a100")
    plain = rich.replace(gemm_efficiency=None, collective_bandwidth=None)
    times = {}
    for label, system in (("without tables", plain), ("with tables", rich)):
        costs = tabsched.ModelCosts("megatron-1t", system, tensor_parallel=8,
                                    sequence_parallel=True)

        def run():
            _memo.clear()
            return tabsched.evaluate(table, costs, formula=False)
        times[label] = best_of(repeat, run)
    (plain_time, plain_result), (rich_time, rich_result) = times.values()
    print("measured tables (megatron-1t, t = 8, dgx-a100, memos cleared before each run):")
    print(f"  evaluate()       without {plain_time * 1e3:8.1f} ms   with {rich_time * 1e3:8.1f} ms"
          f"   ratio {rich_time / plain_time:5.2f}x (target <= 1.5x)")
    print(f"  makespan         {plain_result.makespan:.4g} s without, "
          f"{rich_result.makespan:.4g} s with")


if __name__ == "__main__":
    main()
