"""The overlapped forward-backward cell on two streams: compute beside communication.

A table's cell may hold two operations that one device runs together: DualPipe's chunk
pairs (DeepSeek-AI 2024, DeepSeek-V3 technical report, section 3.2.1, Figure 4), PyTorch's
``OVERLAP_F_B`` action, Megatron-Core's combined 1F1B with
``--overlap-moe-expert-parallel-comm``. Their point is that one microbatch's
communication (a mixture of experts' dispatch and combine all-to-alls, a tensor or
context group's collectives) runs while the other's compute does. :class:`ModelCosts`
times such a cell as that, with each operation's kernels (:mod:`tabsched.costs.kernels`)
cut into *segments*: the longest runs of consecutive compute kernels (matrix and vector)
and of consecutive collectives, in the order the operation runs them (a stage's
embedding, layers and output layer for a forward; the reverse for a backward), each
segment's seconds the sum of its kernels' (a collective hidden behind a kernel of its
own operation costs what it runs longer, :func:`tabsched.costs.model_work.hidden_cost`).

The two operations' segments run on two streams, as the runtimes launch them:

* a *compute stream* runs the compute segments of both operations and a *communication
  stream* their collectives; each operation's segments run in order (a segment starts
  when the one before it in its operation has ended);
* segments are launched alternately, one of each operation in turn (DualPipe's and
  Megatron-Core's interleaving: the forward's attention beside the backward's combine,
  the forward's dispatch beside the backward's MLP, ...), and each stream runs its
  segments in launch order, as a CUDA stream runs its kernels (first in, first out): a
  segment that is not ready holds back the stream's later ones. (Taking the first ready
  segment instead is a list schedule, and a longer segment could then shorten the cell,
  Graham's anomaly; in launch order every segment waits only for segments launched
  before it, so the cell is monotone in every segment's length and cannot deadlock);
* while a collective runs, compute runs ``1 + overlap_slowdown`` times slower: the
  communication kernels occupy SMs (DeepSeek-V3 gives 20 of the H800's 132 SMs to
  communication, a slowdown of 132/112 - 1 = 0.18; the systems' ``overlap_slowdown`` is
  Lee et al.'s measured 0.189);
* with one hardware queue (``CUDA_DEVICE_MAX_CONNECTIONS=1``,
  ``Execution.max_connections = 1``, which Megatron-LM sets for its tensor-parallel
  overlap) kernels are dispatched in launch order, each once every kernel launched
  before it has started: a segment starts only once every segment launched before it
  has been dispatched whole, that is once its last kernel has started (a segment keeps
  its last kernel's seconds for this). A collective launched after a run of compute
  kernels therefore waits until that run's last kernel starts, and one waiting for its
  own operation's compute holds back the other operation's compute launched after it.
  With several queues (the default of 8, or Megatron's 32) the streams are independent.

The cell lasts until both streams are done. A cell of one operation, or of operations
without collectives, is its operations' sum (nothing to overlap); a schedule without
overlapped cells leaves every collective exposed in its operation.
"""

import numpy as np

from tabsched._memo import memo
from tabsched.table import BACKWARD, FORWARD

__all__ = ["segments", "two_streams", "cell_factors", "pair_factor"]


def segments(seconds, communication):
    """``[(is_communication, seconds, last), ...]``: consecutive kernels of one class
    merged (``seconds`` and ``communication`` per kernel, in running order); ``last`` is
    the segment's last kernel's seconds (what a single hardware queue waits for)."""
    merged = []
    for value, comm in zip(np.asarray(seconds, dtype=np.float64).tolist(),
                           np.asarray(communication, dtype=bool).tolist()):
        if value <= 0.0:
            continue
        if merged and merged[-1][0] == comm:
            merged[-1][1] += value
            merged[-1][2] = value
        else:
            merged.append([comm, value, value])
    return [(comm, value, last) for comm, value, last in merged]


def _segment(segment):
    """``(comm, seconds, last)`` of a segment given with or without its last kernel (a
    pair is one kernel)."""
    if len(segment) == 2:
        return segment[0], segment[1], segment[1]
    return segment[0], segment[1], min(segment[2], segment[1])


def two_streams(first, second, slowdown, serial_launch=False):
    """Seconds of two operations' segments (``first``, ``second``: lists of
    ``(is_communication, seconds)`` or ``(is_communication, seconds, last kernel's
    seconds)``; a pair is one kernel) run on a compute and a communication stream (module
    docstring): launched alternately, each operation's in order, compute ``1 + slowdown``
    times slower beside a collective; ``serial_launch``: one hardware queue.

    >>> two_streams([(False, 2.0), (True, 1.0)], [(True, 1.0), (False, 2.0)], 0.0)
    4.0
    >>> two_streams([(False, 2.0)], [(False, 3.0)], 0.25)
    5.0
    >>> round(two_streams([(False, 2.0), (True, 2.0)], [(True, 2.0), (False, 2.0)], 0.5), 6)
    5.333333
    >>> two_streams([(True, 1.0), (False, 2.0)], [(False, 2.0), (True, 1.0)], 0.0)
    4.0
    >>> two_streams([(False, 2.0, 0.5), (True, 1.0)], [(True, 1.0)], 0.0)     # two queues
    3.0
    >>> two_streams([(False, 2.0, 0.5), (True, 1.0)], [(True, 1.0)], 0.0, True)  # waits 1.5
    3.5
    """
    first = [_segment(segment) for segment in first]
    second = [_segment(segment) for segment in second]
    launch = []
    for index in range(max(len(first), len(second))):
        for op, chain in ((0, first), (1, second)):
            if index < len(chain):
                launch.append((op, index))
    chains = (first, second)
    done = [0, 0]                 # segments of each operation finished
    dispatched = 0                # launched segments dispatched whole, in order (serial)
    running = {False: None, True: None}     # stream -> [launch position, work left, last]
    begun = [False] * len(launch)
    whole = [False] * len(launch)           # begun, and its last kernel has started
    now = 0.0
    rate_slow = 1.0 / (1.0 + slowdown)

    def tolerance():
        return 1e-12 * max(1.0, now)

    while True:
        changed = True
        while changed:          # a start may free the other stream's next launch
            changed = False
            for stream in (False, True):
                if running[stream] is not None:
                    continue
                for position, (op, index) in enumerate(launch):
                    if begun[position]:
                        continue
                    if serial_launch and position != dispatched:
                        break
                    comm, seconds, last = chains[op][index]
                    if comm != stream:
                        if serial_launch:
                            break
                        continue
                    if done[op] == index:
                        running[stream] = [position, seconds, last]
                        begun[position] = changed = True
                        whole[position] = seconds - last <= tolerance()
                        while dispatched < len(launch) and whole[dispatched]:
                            dispatched += 1
                    break   # a stream runs its segments in launch order (FIFO)
        active = [stream for stream in (False, True) if running[stream] is not None]
        if not active:
            return now
        rate = {False: rate_slow if running[True] is not None else 1.0, True: 1.0}
        step = min(running[stream][1] / rate[stream] for stream in active)
        if serial_launch:       # the next event may be a segment's last kernel starting
            for stream in active:
                position, left, last = running[stream]
                if not whole[position]:
                    step = min(step, (left - last) / rate[stream])
        now += step
        for stream in active:
            running[stream][1] -= step * rate[stream]
            position, left, last = running[stream]
            if not whole[position] and left - last <= tolerance():
                whole[position] = True
                while dispatched < len(launch) and whole[dispatched]:
                    dispatched += 1
            if left <= 1e-15 * max(1.0, now):
                op = launch[position][0]
                done[op] += 1
                running[stream] = None


def cell_factors(costs, lowered):
    """The factor on each overlapped cell of ``lowered`` (``overlapped_cells``' order) under
    ``costs`` (a ModelCosts): the two streams' time of its two operations over their sum
    (1.0 for a cell of more than two, whose pairing no runtime defines, and for a pair
    with nothing to overlap)."""
    cells = lowered.overlapped_cells
    factors = np.ones(len(cells))
    if not len(cells):
        return factors
    table = lowered.table
    layers, first, last, unique, inverse = costs._shape(table)
    chains = _Chains(costs.model, costs.system, costs.placement,
                     costs.execution.max_connections == 1, layers, first, last, unique)
    bounds = np.asarray(lowered.cell_first_op, dtype=np.int64)
    cells = np.asarray(cells, dtype=np.int64)
    pair = np.flatnonzero(bounds[cells + 1] - bounds[cells] == 2)
    if not len(pair):
        return factors
    # each two-operation cell as (kind, stage, microbatch shape) of both operations; the
    # factor is computed once per distinct key (a table holds few), in the cells' order
    ops = np.stack([bounds[cells[pair]], bounds[cells[pair]] + 1], axis=1)
    inverse = np.asarray(inverse, dtype=np.int64)
    keys = np.stack([np.asarray(table.kind, dtype=np.int64)[ops],
                     np.asarray(table.stage, dtype=np.int64)[ops],
                     inverse[np.asarray(table.microbatch, dtype=np.int64)[ops]]], axis=2)
    distinct, which = np.unique(keys.reshape(len(pair), 6), axis=0, return_inverse=True)
    values = np.array([chains.factor((int(row[0]), int(row[1]), int(row[2])),
                                     (int(row[3]), int(row[4]), int(row[5])))
                       for row in distinct])
    factors[pair] = values[which.reshape(-1)]
    return factors


def pair_factor(costs, table):
    """The factor on an overlapped pair of one full microbatch's forward and backward on
    the same stage, over ``table``'s stages (their sum's weighted mean): what the formula
    level takes for the F&B of DualPipe's closed form. Remembered by what it depends on
    (a sweep asks it again for every microbatch count of a pipeline depth)."""
    layers = costs.stage_layers(table)
    layers = tuple(layers.tolist() if isinstance(layers, np.ndarray) else layers)
    return _pair_factor(costs.model, costs.system, costs.placement,
                        costs.execution.max_connections == 1, layers)


@memo(limit=1024)
def _pair_factor(model, system, placement, serial, layers):
    from tabsched.costs.model_work import end_stages, microbatch_samples
    first, last = end_stages(len(layers))
    full = microbatch_samples(model, (1.0,))
    chains = _Chains(model, system, placement, serial, layers, first, last, full)
    together = total = 0.0
    for stage in range(len(layers)):
        forward, backward = chains.chain(FORWARD, stage, 0), chains.chain(BACKWARD, stage, 0)
        both = sum(segment[1] for segment in forward + backward)
        together += two_streams(forward, backward, chains.slowdown, chains.serial)
        total += both
    return together / total if total > 0 else 1.0


class _Chains:
    """The segment chains of a table's operations by (kind, stage, size index)."""

    def __init__(self, model, system, placement, serial, layers, first, last, samples):
        from tabsched.costs.model_work import dense_counts, part_kernel_seconds
        self.layers, self.first, self.last = layers, first, last
        self.dense = dense_counts(model, layers)
        self.seconds = part_kernel_seconds(model, system, placement,
                                           tuple(np.asarray(samples, dtype=float).tolist()))
        self.slowdown = float(system.overlap_slowdown)
        self.serial = serial
        self._chains = {}

    def chain(self, kind, stage, size):
        """An operation's segments: a forward runs the embedding, the dense layers, the
        other layers, the output; a backward the reverse."""
        key = (kind, stage, size)
        if key not in self._chains:
            order = [("embedding", self.first[stage]), ("dense_layer", self.dense[stage]),
                     ("layer", self.layers[stage] - self.dense[stage]),
                     ("output", self.last[stage])]
            seconds, communication = [], []
            for part, count in (order if kind == FORWARD else order[::-1]):
                if count <= 0 or kind not in self.seconds[part]:
                    continue
                cost, comm = self.seconds[part][kind]
                seconds.append(np.tile(cost[:, size], int(count)))
                communication.append(np.tile(comm, int(count)))
            self._chains[key] = segments(np.concatenate(seconds) if seconds else [],
                                         np.concatenate(communication) if communication
                                         else [])
        return self._chains[key]

    def factor(self, key_a, key_b):
        """The two streams' time of two operations over their sum."""
        a, b = self.chain(*key_a), self.chain(*key_b)
        total = sum(segment[1] for segment in a + b)
        return two_streams(a, b, self.slowdown, self.serial) / total if total > 0 else 1.0
