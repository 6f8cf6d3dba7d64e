"""Core benchmark: lower and evaluate 1F1B at S=64, M=4096 (about 1M DAG nodes).

Prints lowering, kernel and end-to-end times, and the kernel's speed-up over
networkx's ``dag_longest_path_length`` and over ``tabsched._reference`` on the same
DAG, measured in this run; plus memory per operation. Not collected by pytest.

    python bench/bench_core.py [--devices 64] [--microbatches 4096] [--repeat 3]
"""

import argparse
import tracemalloc

import numpy as np

from _timing import best_of

import tabsched
from tabsched import _kernel, _reference
from tabsched._testing import kernel_graphs, kernel_scratch
from tabsched.lower import lower


def kernel_call(module, lowered, durations):
    """The event pass of ``module`` (the kernel or its twin) over ``lowered``."""
    graph, = kernel_graphs(lowered, (module,))
    start = np.empty((durations.shape[0], lowered.num_nodes))
    status = module.fifo_starts(graph, durations, start, np.empty(0, dtype=np.int32),
                                kernel_scratch(module, graph))
    assert status == _kernel.OK
    return float((start + durations).max())


def networkx_makespan(graph):
    import networkx as nx
    return nx.dag_longest_path_length(graph, weight="weight")


def networkx_graph(lowered, durations):
    """The same DAG for networkx: node durations moved onto out-edges, plus a sink."""
    import networkx as nx
    n = lowered.num_nodes
    sources = np.repeat(np.arange(n), np.diff(lowered.indptr))
    graph = nx.DiGraph()
    graph.add_weighted_edges_from(zip(sources.tolist(), lowered.successors.tolist(),
                                      durations[0, sources].tolist()))
    sink = n
    graph.add_weighted_edges_from((v, sink, float(durations[0, v])) for v in range(n))
    return graph


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=64)
    parser.add_argument("--microbatches", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-reference", action="store_true",
                        help="skip the slow pure-Python reference run")
    parser.add_argument("--skip-networkx", action="store_true")
    args = parser.parse_args()

    generate_time, table = best_of(1, lambda: tabsched.generate(
        "1f1b", devices=args.devices, microbatches=args.microbatches))
    ops = len(table)
    costs = tabsched.UnitCosts()
    lower(table)    # takes the lowering generate() offers: time lowering anew below
    lower_time, lowered = best_of(args.repeat, lambda: lower(table))
    durations = costs.node_durations(lowered)[None, :]

    def pull_pass():     # what run() does without resources: the layout's pull pass
        start, _, _ = lowered.run(durations, binding=False, end=False)
        return float((start + durations).max())
    kernel_time, makespan = best_of(args.repeat, pull_pass)
    assert makespan == kernel_call(_kernel, lowered, durations)   # the event kernel agrees
    end_to_end, result = best_of(args.repeat, lambda: tabsched.evaluate(table, costs))
    assert result.makespan == makespan

    link = lower(table, contention="link")
    link_time, link_makespan = best_of(args.repeat, lambda: kernel_call(_kernel, link, durations))

    tracemalloc.start()
    lowered_again = lower(table)
    lowered_again.run(costs.node_durations(lowered_again))
    _, peak_lower_run = tracemalloc.get_traced_memory()
    del lowered_again
    tracemalloc.reset_peak()
    tabsched.evaluate(table, costs)
    _, peak_evaluate = tracemalloc.get_traced_memory()
    tracemalloc.stop()

    print(f"1F1B S={args.devices} M={args.microbatches}: {ops} ops, {lowered.num_nodes} nodes "
          f"({len(lowered.transfers)} transfers), {lowered.num_edges} edges")
    print(f"generate (with unit layout)   {generate_time * 1e3:9.1f} ms")
    print(f"lower                         {lower_time * 1e3:9.1f} ms")
    print(f"kernel pull pass (none)       {kernel_time * 1e3:9.1f} ms")
    print(f"kernel event heap (link)      {link_time * 1e3:9.1f} ms")
    print(f"evaluate end to end           {end_to_end * 1e3:9.1f} ms  (makespan {makespan:g})")
    print(f"lowered DAG arrays            {lowered.nbytes / ops:9.1f} bytes/op")
    print(f"peak traced, lower + kernel   {peak_lower_run / ops:9.1f} bytes/op")
    print(f"peak traced, evaluate()       {peak_evaluate / ops:9.1f} bytes/op")

    if not args.skip_networkx:
        graph = networkx_graph(lowered, durations)
        nx_time, nx_makespan = best_of(1, lambda: networkx_makespan(graph))
        assert abs(nx_makespan - makespan) < 1e-6, (nx_makespan, makespan)
        print(f"networkx dag_longest_path     {nx_time * 1e3:9.1f} ms  -> kernel is "
              f"{nx_time / kernel_time:7.0f}x faster")
    if not args.skip_reference:
        ref_time, ref_makespan = best_of(1, lambda: kernel_call(_reference, lowered, durations))
        assert ref_makespan == makespan
        print(f"_reference.fifo_starts        {ref_time * 1e3:9.1f} ms  -> kernel is "
              f"{ref_time / kernel_time:7.0f}x faster")
        ref_link, ref_link_makespan = best_of(1, lambda: kernel_call(_reference, link, durations))
        assert ref_link_makespan == link_makespan
        print(f"_reference.fifo_starts (link){ref_link * 1e3:9.1f} ms  -> kernel is "
              f"{ref_link / link_time:7.0f}x faster")


if __name__ == "__main__":
    main()
