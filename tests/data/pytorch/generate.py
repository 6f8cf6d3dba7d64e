"""Regenerate the PyTorch-written schedules in this directory.

Run with a Python that has torch installed (these were made with torch
2.13.0+cpu), from anywhere:

    python tests/data/pytorch/generate.py

Each file is what PyTorch's own schedule class builds, taken through
``torch.distributed.pipelining._schedule_visualizer.get_schedule_ops`` and
written as ``_dump_csv`` writes it (``csv.writer`` over the actions, ``None``
as an empty cell). ``*_comms.csv`` files hold the compute_comms form
(``with_comms=True``: the runtime's lowering with UNSHARD/RESHARD, REDUCE_GRAD
and SEND/RECV, ``defer_pp_recv=False``).
"""

import csv
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent

# file stem: (schedule class name, ranks, microbatches, stages per rank, with comms)
SCHEDULES = {
    "interleaved_1f1b_pp2_m4": ("Interleaved1F1B", 2, 4, 2, False),
    "interleaved_1f1b_pp4_m8": ("Interleaved1F1B", 4, 8, 2, False),
    "interleaved_zb_pp4_m8": ("InterleavedZeroBubble", 4, 8, 2, False),
    "zbv_pp4_m8": ("ZBVZeroBubble", 4, 8, 2, False),
    "dualpipev_pp4_m8": ("DualPipeV", 4, 8, 2, False),
    "interleaved_1f1b_pp4_m8_comms": ("Interleaved1F1B", 4, 8, 2, True),
    "interleaved_zb_pp4_m8_comms": ("InterleavedZeroBubble", 4, 8, 2, True),
    "zbv_pp4_m8_comms": ("ZBVZeroBubble", 4, 8, 2, True),
    "dualpipev_pp4_m8_comms": ("DualPipeV", 4, 8, 2, True),
    "gpipe_pp4_m4": ("GPipe", 4, 4, None, False),
    # PyTorch 2.13's Schedule1F1B table: its last rank skips microbatch 0 and
    # runs microbatch 4 (= M); tabsched must refuse it.
    "schedule_1f1b_pp4_m4": ("1F1B", 4, 4, None, False),
}


def main():
    import torch  # here, so that pytest's doctest collection can import this file without torch
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

    for stem, (name, ranks, microbatches, per_rank, with_comms) in SCHEDULES.items():
        rows = get_schedule_ops(name, ranks, microbatches, per_rank, with_comms=with_comms)
        path = HERE / f"{stem}.csv"
        with open(path, "w", newline="") as handle:
            writer = csv.writer(handle)
            for row in rows:
                writer.writerow(row)
        print(f"wrote {path.name} ({name}, {ranks} ranks, {microbatches} microbatches)")
    print(f"torch {torch.__version__}", file=sys.stderr)


if __name__ == "__main__":
    main()
