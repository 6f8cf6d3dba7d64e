"""Seq1F1B's direction in tabsched: sliced 1F1B against 1F1B on one long-sequence setting.

Seq1F1B (Sun et al. 2024, arXiv 2406.03488, abstract and section 4): against Megatron-LM's
1F1B, 1.14x the training throughput with half the memory footprint, on long sequences
(32K-128K tokens) without recomputation. This script prices both in one process, on
llama3-8b at a 32K context (examples/llama3-8b-32k.toml: no recomputation) on dgx-h100,
p=8 stages, t=4 with sequence parallelism, FlashAttention, 16 microbatches, and prints
each table's iteration time, its ratio to 1F1B's, its peak memory and its peak
activations (the peak less the weights, gradients and optimizer state), and theirs over
1F1B's. Every slice count and lead is priced with equal slices and with Seq1F1B's
computation-wise partition (section 3.3: equal FLOPs per slice, earlier slices longer;
``partition=compute``).

    python bench/seq1f1b.py [--model FILE] [--devices P] [--tensor T] [--microbatches M]
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tabsched import evaluate  # noqa: E402
from tabsched.adapt import SplitSequence  # noqa: E402
from tabsched.costs import ModelCosts  # noqa: E402
from tabsched.execution import Execution  # noqa: E402
from tabsched.schedules import generate  # noqa: E402

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=os.path.join(HERE, "examples", "llama3-8b-32k.toml"))
    parser.add_argument("--system", default="dgx-h100")
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--tensor", type=int, default=4)
    parser.add_argument("--microbatches", type=int, default=16)
    args = parser.parse_args(argv)
    costs = ModelCosts(args.model, args.system, Execution(
        tensor_parallel=args.tensor, sequence_parallel=args.tensor > 1, attention="flash"))
    table = generate("1f1b", devices=args.devices, microbatches=args.microbatches)
    persistent = float(np.max(costs.persistent_memory(table)))
    base = evaluate(table, costs)
    rows = [("1f1b", base)]
    for k in (2, 4, 8):
        for lead in ("seq1f1b", "kept"):
            for partition in ("even", "compute"):
                transform = SplitSequence(k, lead, partition)
                rows.append((transform.describe(),
                             evaluate(transform.apply(table, costs), costs)))
    print(f"{costs.model.name} (sequence {costs.model.sequence}) on {costs.system.name}, "
          f"p={args.devices}, t={args.tensor}, {args.microbatches} microbatches; capacity "
          f"{costs.memory_capacity / 2**30:.1f} GiB")
    print(f"{'table':48} {'iteration':>10} {'speed-up':>9} {'peak':>10} {'activations':>12} "
          f"{'x 1f1b':>7}")
    base_activation = base.peak_memory - persistent
    for name, result in rows:
        activation = result.peak_memory - persistent
        print(f"{name:48} {result.makespan:9.3f}s {base.makespan / result.makespan:8.2f}x "
              f"{result.peak_memory / 2**30:7.1f}GiB {activation / 2**30:9.1f}GiB "
              f"{activation / base_activation:7.2f}")
    print("Seq1F1B (paper, Megatron-LM 1F1B baseline): 1.14x throughput, about 0.5x memory")


if __name__ == "__main__":
    main()
