"""torchtitan settings for a table run as an execution, where torchtitan runs the schedule.

torchtitan (``pytorch/torchtitan``) configures a run with a TOML job file; the names
below are its ``JobConfig`` fields (``torchtitan/config/job_config.py``, commit
``000204a4``): ``[parallelism]`` ``data_parallel_replicate_degree`` (DDP),
``data_parallel_shard_degree`` (FSDP), ``tensor_parallel_degree``,
``pipeline_parallel_degree``, ``pipeline_parallel_schedule``,
``pipeline_parallel_microbatch_size``, ``pipeline_parallel_layers_per_stage``,
``context_parallel_degree``; ``[training]`` ``global_batch_size``,
``local_batch_size``, ``seq_len``; ``[activation_checkpoint]`` ``mode``.

Its pipeline schedules are PyTorch's (``torch.distributed.pipelining``,
``get_schedule_class``); a table is exported when its family is one of them:
``gpipe`` (``GPipe``), ``1f1b`` (``1F1B``), ``looped-bfs`` (``LoopedBFS``), ``zbv``
(``ZBVZeroBubble``), ``dualpipev`` with fused pairs (``DualPipeV``), and
``interleaved-1f1b`` as ``Interleaved1F1B``, whose order is PyTorch's, not Megatron-LM's
(the table's), a note says so. Everything else is refused with the reason.

>>> from tabsched.execution import Execution
>>> from tabsched.schedules import generate
>>> settings = torchtitan_settings(generate("1f1b", devices=4, microbatches=8),
...                                Execution(tensor_parallel=2, sequence_parallel=True,
...                                          data_parallel=2, microbatch_size=1,
...                                          global_batch=16, recompute="full"), 2048)
>>> settings.sections["parallelism"]["pipeline_parallel_schedule"]
'1F1B'
>>> print(settings.to_toml().splitlines()[0])
[parallelism]
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from tabsched.exceptions import InvalidScheduleError

__all__ = ["TorchtitanSettings", "torchtitan_settings", "SCHEDULES"]

#: tabsched family -> PyTorch's schedule name, as torchtitan's
#: ``pipeline_parallel_schedule`` takes it.
SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "looped-bfs": "LoopedBFS",
             "zbv": "ZBVZeroBubble", "dualpipev": "DualPipeV",
             "interleaved-1f1b": "Interleaved1F1B"}


@dataclass(frozen=True)
class TorchtitanSettings:
    """torchtitan job-file sections (``{section: {key: value}}``) and what they leave out."""

    sections: dict
    notes: tuple = field(default=())

    def to_toml(self):
        """The sections as the TOML a torchtitan job file holds."""
        lines = []
        for section, values in self.sections.items():
            lines.append(f"[{section}]")
            lines.extend(f"{key} = {json.dumps(value)}" for key, value in values.items())
            lines.append("")
        return "\n".join(lines)

    def to_dict(self):
        return {"sections": {name: dict(values) for name, values in self.sections.items()},
                "notes": list(self.notes), "toml": self.to_toml()}


def torchtitan_settings(table, execution, sequence_length):
    """The torchtitan settings that run ``table`` as ``execution``, or
    ``InvalidScheduleError`` saying why torchtitan cannot.

    ``execution`` must give the microbatch size and the global batch (over all
    replicas); ``sequence_length`` is the model's.
    """
    family = table.family
    schedule = SCHEDULES.get(family)
    if schedule is None:
        named = family or "a table without a family"
        raise InvalidScheduleError(
            f"torchtitan cannot run this table: its pipeline schedules are PyTorch's "
            f"({', '.join(sorted(set(SCHEDULES.values())))}), and {named} is none of them")
    if family == "dualpipev" and table.params.get("pairs", "fused") != "fused":
        raise InvalidScheduleError("torchtitan cannot run this table: PyTorch's DualPipeV "
                                   "fuses its forward and backward pairs")
    run = execution
    notes = []
    layers = table.stage_layers
    parallelism = {"data_parallel_replicate_degree": int(run.data_parallel),
                   "data_parallel_shard_degree": 1,
                   "tensor_parallel_degree": int(run.tensor_parallel),
                   "pipeline_parallel_degree": int(table.num_devices),
                   "pipeline_parallel_schedule": schedule,
                   "pipeline_parallel_microbatch_size": int(run.microbatch_size),
                   "context_parallel_degree": int(run.context_parallel)}
    if layers is None or len(set(layers)) == 1:
        if layers is not None:
            parallelism["pipeline_parallel_layers_per_stage"] = int(layers[0])
    else:
        notes.append(f"uneven stages ({', '.join(map(str, layers))} layers): give "
                     f"pipeline_parallel_split_points for them")
    if family == "interleaved-1f1b":
        notes.append("PyTorch's Interleaved1F1B orders the chunks its own way, not as "
                     "Megatron-LM does (the table's order)")
    if run.tensor_parallel > 1 and not run.sequence_parallel:
        notes.append("torchtitan's tensor parallelism splits the norms over the sequence "
                     "(sequence parallelism), which this execution does not")
    if run.zero_stage == 3:
        # FSDP2 over the data-parallel group: torchtitan's JobConfig [parallelism]
        # data_parallel_shard_degree and fsdp_reshard_after_forward ("always"/"never")
        parallelism["data_parallel_replicate_degree"] = 1
        parallelism["data_parallel_shard_degree"] = int(run.data_parallel)
        reshard = run.sharding[1]
        parallelism["fsdp_reshard_after_forward"] = "always" if reshard else "never"
        if run.sharding[2] != 1:
            notes.append(f"FSDP2 prefetches one module ahead; prefetch {run.sharding[2]} has "
                         f"no torchtitan setting")
    elif run.zero_stage >= 1:
        notes.append(f"ZeRO-{run.zero_stage} has no torchtitan setting: "
                     f"data_parallel_shard_degree (FSDP) shards parameters and gradients too")
    if run.context_parallel > 1:
        notes.append(f"context parallelism: PyTorch's ring attention rotates the keys and "
                     f"values by all-gather or all-to-all (context_parallel_rotate_method), "
                     f"not Megatron-LM's {run.context_exchange} exchange that tabsched prices")
    if run.fp8 == "tensorwise":
        notes.append("FP8: torchtitan's float8 converter (torchao's Float8Linear) with its "
                     "tensorwise recipe; its casts are not Transformer Engine's fused ones")
    elif run.fp8 is not None:
        notes.append(f"FP8 with {run.fp8} scaling has no torchtitan setting (torchao's "
                     f"float8 recipes scale from the current amax: tensorwise or rowwise)")
    if run.recompute == "selective":
        notes.append("torchtitan's selective checkpointing (selective_ac_option) is not "
                     "Korthikanti et al.'s attention-core recomputation that tabsched prices")
    global_batch = run.global_batch
    sections = {"parallelism": parallelism,
                "training": {"global_batch_size": int(global_batch),
                             "local_batch_size": int(global_batch // run.data_parallel),
                             "seq_len": int(sequence_length)},
                "activation_checkpoint": {"mode": run.recompute}}
    return TorchtitanSettings(sections, tuple(notes))
