"""What PyTorch's pipelining can run, and how it places stages on ranks.

``torch.distributed.pipelining`` runs one stage on exactly one rank, splits a
batch into microbatches of equal size, and gives every rank at least one stage:
:func:`pytorch_refusal` says why a table breaks one of these, so that writers of
PyTorch's files refuse it. Its stage -> rank maps have two named styles
(``generate_stage_to_rank_mapping``): ``loop`` (stage ``s`` on rank ``s mod D``)
and ``v`` (down the ranks and back up); :func:`stage_map` names a table's.
"""

import numpy as np

from tabsched.exceptions import InvalidParameterError, InvalidScheduleError

__all__ = ["pytorch_refusal", "check_expressible", "torch_stage_to_device", "stage_map",
           "describe_stage_map", "STAGE_MAPS"]

STAGE_MAPS = ("loop", "v")


def pytorch_refusal(table):
    """Why PyTorch cannot run ``table`` as one schedule, or None if it can.

    >>> from tabsched import ScheduleTable
    >>> print(pytorch_refusal(ScheduleTable([["0F0", "0B0"], ["0F1", "0B1"]])))
    PyTorch cannot express this table: stage 0 runs on devices 0 and 1 (replicas, as in Chimera); torch.distributed.pipelining places each stage on exactly one rank
    """
    for stage, devices in sorted(table.placement().items()):
        if len(devices) > 1:
            return (f"PyTorch cannot express this table: stage {stage} runs on devices "
                    f"{', '.join(map(str, devices[:-1]))} and {devices[-1]} (replicas, as in "
                    f"Chimera); torch.distributed.pipelining places each stage on exactly one "
                    f"rank")
    sizes = table.microbatch_sizes
    unequal = next((k for k, size in enumerate(sizes) if size != sizes[0]), None)
    if unequal is not None:
        return (f"PyTorch cannot express this table: microbatch {unequal} has size "
                f"{sizes[unequal]:g} but microbatch 0 has {sizes[0]:g}; PyTorch splits a batch "
                f"into microbatches of equal size")
    idle = np.flatnonzero(np.bincount(table.device, minlength=table.num_devices) == 0)
    if len(idle):
        return (f"PyTorch cannot express this table: device {int(idle[0])} runs nothing; "
                f"every PyTorch rank holds at least one stage")
    return None


def check_expressible(table):
    refusal = pytorch_refusal(table)
    if refusal is not None:
        raise InvalidScheduleError(refusal)


def torch_stage_to_device(num_devices, num_stages, style):
    """PyTorch's stage -> rank map of a style (``generate_stage_to_rank_mapping``).

    ``loop``: stage ``s`` on device ``s mod D``. ``v``: down the devices and back
    up, keeping the device at each turn (stages ``D-1`` and ``D`` share the last
    device); needs ``S`` to be a multiple of ``D``.

    >>> torch_stage_to_device(4, 8, "loop")
    [0, 1, 2, 3, 0, 1, 2, 3]
    >>> torch_stage_to_device(4, 8, "v")
    [0, 1, 2, 3, 3, 2, 1, 0]
    """
    if style not in STAGE_MAPS:
        raise InvalidParameterError(f"stage map {style!r} is not one of {', '.join(STAGE_MAPS)}")
    if style == "loop":
        return [stage % num_devices for stage in range(num_stages)]
    if num_stages % num_devices:
        raise InvalidParameterError(f"a v stage map needs the stages ({num_stages}) to be a "
                                    f"multiple of the devices ({num_devices})")
    return [stage % num_devices if (stage // num_devices) % 2 == 0
            else num_devices - 1 - stage % num_devices for stage in range(num_stages)]


def stage_map(table):
    """PyTorch's name for the table's stage -> device map: ``"loop"``, ``"v"`` or None.

    A table with one stage per device is ``"loop"`` (the two styles agree there).
    None if a stage runs on several devices or the map is neither style.

    >>> from tabsched import ScheduleTable
    >>> stage_map(ScheduleTable([["0F0", "3F0", "3B0", "0B0"], ["1F0", "2F0", "2B0", "1B0"]]))
    'v'
    """
    placement = table.placement()
    if any(len(devices) != 1 for devices in placement.values()):
        return None
    actual = [placement[stage][0] for stage in range(table.num_stages)]
    for style in STAGE_MAPS:
        if style == "v" and table.num_stages % table.num_devices:
            continue
        if actual == torch_stage_to_device(table.num_devices, table.num_stages, style):
            return style
    return None


def describe_stage_map(table):
    """One line for ``tabsched show``: the map's PyTorch name and what it means."""
    style = stage_map(table)
    D, S = table.num_devices, table.num_stages
    if style == "loop":
        return (f"loop (stage s on device s mod {D})" if S > D
                else "loop (stage s on device s)")
    if style == "v":
        return f"v (stages 0..{D - 1} down the devices, {D}..{2 * D - 1} back up, and so on)"
    refusal = pytorch_refusal(table)
    if refusal is not None and "runs on devices" in refusal:
        return "none: " + refusal.split(": ", 1)[1]
    placement = table.placement()
    pairs = ", ".join(f"{stage}->{devices[0]}" for stage, devices in sorted(placement.items()))
    return f"custom, neither PyTorch's loop nor v (stage->device {pairs})"
