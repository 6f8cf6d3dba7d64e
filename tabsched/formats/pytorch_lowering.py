"""Writing PyTorch's compute_comms CSV: a table lowered as PyTorch's runtime lowers it.

:func:`to_compute_comms` re-derives the three passes of
``_PipelineScheduleRuntime._prepare_schedule_with_comms`` (PyTorch 2.13,
``defer_pp_recv=False``): FSDP ``UNSHARD``/``RESHARD`` around the stages a rank
computes next, ``REDUCE_GRAD`` after a stage's last backward, then ``SEND``/``RECV``
placed by stepping the ranks in lock-step; the bytes equal PyTorch's
``_dump_csv(format="compute_comms")``. Reading such a file is
:mod:`tabsched.formats.pytorch_comms`.
"""

from collections import defaultdict

from tabsched.cells import REDUCE_GRAD, Action, Overlap
from tabsched.exceptions import DeadlockError
from tabsched.formats.pytorch_ranks import check_expressible
from tabsched.formats.table_csv import refuse_loss, write_rows

__all__ = ["to_compute_comms"]


def _write_rows(rows):
    return write_rows([["" if cell is None else str(cell) for cell in row] for row in rows])


def to_compute_comms(table, *, max_active_stages=3, drop_metadata=False):
    """The compute_comms CSV text PyTorch's runtime would build from ``table``.

    The three passes of ``_PipelineScheduleRuntime._prepare_schedule_with_comms``
    (PyTorch 2.13, ``defer_pp_recv=False``), re-derived: FSDP ``UNSHARD``/``RESHARD``
    around the next ``max_active_stages`` stages a rank computes, ``REDUCE_GRAD``
    after a stage's last ``B`` or ``W``, then ``SEND``/``RECV`` placed by stepping
    the ranks in lock-step.

    Raises
    ------
    InvalidScheduleError
        If PyTorch cannot express the table (see :func:`pytorch_refusal`), or the
        file cannot hold its metadata and ``drop_metadata`` is not set.
    DeadlockError
        If no rank can take its next step (the row orders cannot run).

    >>> from tabsched.schedules import generate
    >>> to_compute_comms(generate("gpipe", devices=2, microbatches=1),
    ...                  drop_metadata=True).splitlines()
    ['0UNSHARD,0F0,0SEND_F0,0RECV_B0,0B0,0REDUCE_GRAD,0RESHARD', '1UNSHARD,1RECV_F0,1F0,1B0,1SEND_B0,1REDUCE_GRAD,1RESHARD']
    """
    check_expressible(table)
    refuse_loss(table, "PyTorch CSV", drop_metadata)
    orders = [[cell for cell in row if cell is not None] for row in table.rows]
    lowered = [_add_reduce_grad(_add_unshard_reshard(order, max_active_stages),
                                table.num_microbatches) for order in orders]
    stage_device = {stage: devices[0] for stage, devices in table.placement().items()}
    return _write_rows(_add_send_recv(lowered, stage_device, table.num_stages, table))


def _parts(action):
    return action.parts if isinstance(action, Overlap) else (action,)


def _add_unshard_reshard(order, max_active_stages):
    """FSDP fetch/free around compute, as PyTorch's ``_add_unshard_reshard``.

    Before each action, the stages of the next actions are gathered until
    ``max_active_stages`` distinct ones are found (whole actions at a time);
    active stages not among them are resharded, missing ones unsharded. The
    active set is a Python ``set`` handled in PyTorch's order of operations,
    so eviction iterates in the same order.
    """
    # upcoming[i]: distinct stages from action i on, in order of first appearance,
    # each with the index of the action that brings it (built backwards: O(actions x stages)).
    upcoming = [None] * len(order)
    firsts = []
    for index in range(len(order) - 1, -1, -1):
        stages = list(dict.fromkeys(part.stage for part in _parts(order[index])))
        firsts = [(stage, index) for stage in stages] + [entry for entry in firsts
                                                         if entry[0] not in stages]
        upcoming[index] = firsts
    active, actions = set(), []
    for index, action in enumerate(order):
        wanted = []
        for position, (stage, owner) in enumerate(upcoming[index]):
            wanted.append(stage)
            following = upcoming[index][position + 1] if position + 1 < len(
                upcoming[index]) else None
            if len(wanted) >= max_active_stages and (following is None or following[1] != owner):
                break
        evict = [stage for stage in active if stage not in wanted]
        fetch = [stage for stage in wanted if stage not in active]
        for stage in evict:
            active.remove(stage)
            actions.append(Action("RESHARD", stage))
        for stage in fetch:
            active.add(stage)
            actions.append(Action("UNSHARD", stage))
        actions.append(action)
    for stage in list(active):
        active.remove(stage)
        actions.append(Action("RESHARD", stage))
    return actions


def _add_reduce_grad(actions, num_microbatches):
    """A ``REDUCE_GRAD`` after the action that completes a stage's ``B``/``W`` count."""
    counted = defaultdict(int)
    result = []
    for action in actions:
        result.append(action)
        if isinstance(action, Action):
            continue
        for part in _parts(action):
            if part.kind in ("B", "W"):
                counted[part.stage] += 1
                if counted[part.stage] == num_microbatches:
                    result.append(Action(REDUCE_GRAD, part.stage))
    return result


def _add_send_recv(orders, stage_device, num_stages, table):
    """SEND/RECV placement by PyTorch's ``_add_send_recv`` (lock-step over the ranks).

    In each round every rank, in rank order, takes its next action if its
    inputs are there (a RECV or the producing action in its own history); each
    compute action whose output goes to another rank is followed by its SEND,
    and the matching RECV is appended to the receiver's list at once.
    """
    pending = [list(order) for order in orders]
    heads = [0] * len(pending)
    result = [[] for _ in pending]
    history = [set() for _ in pending]

    def crosses(part):
        if part.kind == "F":
            return part.stage != num_stages - 1 and \
                stage_device[part.stage + 1] != stage_device[part.stage]
        if part.kind in ("I", "B"):
            return part.stage != 0 and stage_device[part.stage - 1] != stage_device[part.stage]
        return False

    def ready(part, seen):
        stage, microbatch = part.stage, part.microbatch
        if part.kind == "F" and stage != 0:
            return ("RECV_F", stage, microbatch) in seen or ("F", stage - 1, microbatch) in seen
        if part.kind in ("I", "B") and stage != num_stages - 1:
            return (("RECV_B", stage, microbatch) in seen or ("I", stage + 1, microbatch) in seen
                    or ("B", stage + 1, microbatch) in seen)
        return True

    while any(head < len(order) for head, order in zip(heads, pending)):
        progress = False
        for rank, order in enumerate(pending):
            if heads[rank] >= len(order):
                continue
            action = order[heads[rank]]
            parts = (action,) if isinstance(action, Action) else _parts(action)
            if not all(isinstance(part, Action) or ready(part, history[rank])
                       for part in parts):
                continue
            result[rank].append(action)
            for part in parts:
                history[rank].add(tuple(part))
                if isinstance(part, Action) or not crosses(part):
                    continue
                forward = part.kind == "F"
                send = Action("SEND_F" if forward else "SEND_B", part.stage, part.microbatch)
                peer_stage = part.stage + 1 if forward else part.stage - 1
                recv = Action("RECV_F" if forward else "RECV_B", peer_stage, part.microbatch)
                result[rank].append(send)
                history[rank].add(tuple(send))
                peer = stage_device[peer_stage]
                result[peer].append(recv)
                history[peer].add(tuple(recv))
            heads[rank] += 1
            progress = True
        if not progress:
            stuck = [f"device {rank} at {order[heads[rank]]}" for rank, order
                     in enumerate(pending) if heads[rank] < len(order)]
            raise DeadlockError(f"PyTorch cannot place SEND/RECV for this table: no device can "
                                f"take its next step ({'; '.join(stuck[:8])}"
                                f"{'; ...' if len(stuck) > 8 else ''}); the row orders "
                                f"contradict the dependencies")
    return result
