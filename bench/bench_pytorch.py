"""PyTorch's files: read a compute_comms CSV and simulate it, PyTorch against tabsched.

PyTorch writes each schedule here itself: its schedule class builds the compute
order, ``_PipelineScheduleRuntime._prepare_schedule_with_comms`` lowers it
(UNSHARD/RESHARD, REDUCE_GRAD, SEND/RECV) and ``_dump_csv(format="compute_comms")``
writes it, for p = 8, 16 and 32 ranks, 2 stages per rank and 4p microbatches by
default. Then, in this one process, the same job both ways on the same file:

* **PyTorch**: ``_PipelineScheduleRuntime._load_csv(path, format="compute_comms")``
  (``csv.reader`` and ``_Action.from_str`` per cell, the stage map checked), then
  ``_simulate_comms_compute`` on the loaded actions, the dry run that finds
  deadlocks and steps every rank in unit steps. The simulator does not take
  UNSHARD, RESHARD or REDUCE_GRAD ("Unsupported action type"), so they are
  dropped from the lists it gets (inside the timed part).
* **tabsched**: ``tabsched.read_pytorch(path).evaluate(UnitCosts(1, 1, 1, 1))``: the
  file read and checked cell by cell against its rules (every SEND with its RECV, orders that
  cannot deadlock, FSDP windows, REDUCE_GRAD), then evaluated with unit costs
  (``UnitCosts``: every operation one unit, communication free): the makespan,
  idle time per device and the rest of a Result.

Each time is the best of ``--repeat`` runs; the ratio is PyTorch's time over
tabsched's. Without torch the benchmark says so and exits. Not collected by pytest.

    python bench/bench_pytorch.py [--repeat 5] [--microbatches-per-rank 4] [--ranks 8 16 32]
"""

import argparse
import csv
import gc
import os
import tempfile

from _timing import best_of

import tabsched

SCHEDULES = ("Interleaved1F1B", "ZBVZeroBubble")
GRID = tabsched.UnitCosts(1, 1, 1, 1)


def runtime_for(schedules, ranks, microbatches, stages_per_rank):
    """A ``_PipelineScheduleRuntime`` with stand-in stages (as PyTorch's visualizer builds)."""
    from unittest import mock

    from torch.distributed.pipelining.stage import PipelineStage
    stage = mock.create_autospec(PipelineStage, instance=True)
    stage.group_rank, stage.group_size, stage.submod = 0, ranks, None
    stage.num_stages = ranks * stages_per_rank
    stages = [stage] * stages_per_rank
    return stages, schedules._PipelineScheduleRuntime(stages, microbatches)


def write_file(schedules, name, ranks, microbatches, stages_per_rank, path):
    """PyTorch's compute_comms CSV of schedule class ``name``, written by ``_dump_csv``."""
    stages, runtime = runtime_for(schedules, ranks, microbatches, stages_per_rank)
    schedule = schedules.get_schedule_class(name)(stages, microbatches)
    runtime._prepare_schedule_with_comms(schedule.pipeline_order)
    runtime._dump_csv(path, format="compute_comms")
    with open(path, newline="") as handle:
        return sum(len(row) for row in csv.reader(handle))


def pytorch_job(schedules, runtime, path):
    """PyTorch's load and simulation of the file; the simulated steps of rank 0."""
    runtime._load_csv(path, format="compute_comms")
    unsupported = {schedules.UNSHARD, schedules.RESHARD, schedules.REDUCE_GRAD}
    actions = {rank: [action for action in row if action.computation_type not in unsupported]
               for rank, row in runtime.pipeline_order_with_comms.items()}
    simulated = schedules._simulate_comms_compute(
        actions, lambda stage: runtime.stage_index_to_group_rank[stage], runtime._num_stages)
    return len(simulated[0])


def tabsched_job(path):
    # every action one unit, as PyTorch's simulator steps them (tabsched's default slot
    # lengths make a full backward 2)
    return tabsched.read_pytorch(path).evaluate(GRID).makespan


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--microbatches-per-rank", type=int, default=4)
    parser.add_argument("--stages-per-rank", type=int, default=2)
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 16, 32])
    args = parser.parse_args()
    try:
        import torch
        from torch.distributed.pipelining import schedules
    except ImportError:
        print("bench_pytorch: torch is not installed; nothing to compare")
        return
    # best_of collects garbage before each run; a collection walks every object torch's
    # import made (about half a million) and leaves the caches cold for whatever runs
    # next: 0.7 ms more on a 4 ms job. Frozen, they are not walked, for either side.
    gc.collect()
    gc.freeze()
    print(f"torch {torch.__version__}, tabsched {tabsched.__version__}; best of {args.repeat}; "
          f"ratio = PyTorch / tabsched")
    with tempfile.TemporaryDirectory() as folder:
        for name in SCHEDULES:
            for ranks in args.ranks:
                microbatches = args.microbatches_per_rank * ranks
                path = os.path.join(folder, f"{name}_{ranks}.csv")
                cells = write_file(schedules, name, ranks, microbatches, args.stages_per_rank,
                                   path)
                _, runtime = runtime_for(schedules, ranks, microbatches, args.stages_per_rank)
                torch_s, steps = best_of(args.repeat,
                                         lambda: pytorch_job(schedules, runtime, path))
                ours_s, makespan = best_of(args.repeat, lambda: tabsched_job(path))
                print(f"{name:<16} p={ranks:<3} M={microbatches:<4} {cells:>7,} cells "
                      f"{os.path.getsize(path) / 1e3:6.0f} kB: PyTorch {torch_s * 1e3:8.1f} ms "
                      f"({steps} steps), tabsched {ours_s * 1e3:7.1f} ms (makespan "
                      f"{makespan:g}): {torch_s / ours_s:5.1f}x")


if __name__ == "__main__":
    main()
