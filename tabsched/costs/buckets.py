"""Bucketed gradient reduction: what the data-parallel reduction of a stage leaves
exposed after the backward that fills its buckets.

PyTorch DDP and Megatron-LM's distributed data parallelism (``overlap_grad_reduce``)
do not wait for a stage's whole gradient: they cut it into buckets in the order the
backward produces it (the parameters in reverse), and launch a bucket's all-reduce
(reduce-scatter with the distributed optimizer) as soon as its last gradient is
written, during the last microbatch's backward (with gradient accumulation the
earlier microbatches only accumulate: ``no_sync`` in DDP, ``is_last_microbatch``
in Megatron-Core). The collectives run one after another on the data-parallel
communicator, beside the backward's compute. What remains after the backward is
the tail of that queue: at least the last bucket, which the backward's final
layers (the embedding of the first stage) fill last.

The model here, for one stage with ``P`` parameters per tensor rank, buckets of
``b`` parameters and a last backward of ``B`` seconds:

- ``n = ceil(P / b)`` buckets, all of ``b`` parameters but the last (the rest);
- the gradients come out uniformly over the backward, so bucket ``j`` is ready
  at ``B * min((j + 1) b, P) / P`` (a layer's parameters and its backward's time
  are both about proportional to its matrices);
- a bucket's collective takes ``T(bytes)`` (the data-parallel group's time for
  that message: latency, bandwidth, a measured bus-bandwidth table where the
  system has one), and starts when it is ready and the previous one is done;
- while a collective runs beside the backward, the backward's kernels progress
  ``1 + s`` times slower (``System.overlap_slowdown``, as for tensor-parallel
  collectives: :func:`tabsched.costs.model_work.hidden_cost`), which adds
  ``s / (1 + s)`` of the overlapped communication to the iteration.

The queue's finish has a closed form (the buckets but the last are equal, ready
evenly ``d = B b / P`` apart): the ``n - 1`` equal ones end at
``max(r_0 + (n - 1) T, r_{n-2} + T)`` (communication-bound or compute-bound), and
the last one at ``max(B, that) + T_last``. So the price is O(1) in the number of
buckets, and a bucket of 1 parameter on a trillion-parameter stage costs what
any other does.

One bucket (``b >= P``) is the reduction that starts after the backward: the
whole collective exposed, as before bucketing. The default bucket is
Megatron-Core's: ``max(40,000,000, 1,000,000 * d)`` parameters
(``megatron/core/distributed/distributed_data_parallel_config.py``,
``bucket_size``: larger data-parallel groups get larger buckets so that the
collectives do not become latency-bound). PyTorch DDP's ``bucket_cap_mb = 25``
is ``25 * 2**20 / grad_bytes`` parameters (its first, 1 MiB bucket is not
modelled).

Left out: the slowdown's delay of later buckets' readiness (second order), and
on a device with several stages (interleaving) the queue shared between its
stages' reductions (each stage's is priced as if the communicator were free when
its last backward starts).
"""

import math

__all__ = ["default_bucket_parameters", "bucket_layout", "exposed_reduction"]

#: Megatron-Core's ``bucket_size`` default: ``max(40_000_000, 1_000_000 * dp_size)``
#: parameters (``megatron/core/distributed/distributed_data_parallel_config.py``).
MEGATRON_MIN_BUCKET = 40_000_000
MEGATRON_BUCKET_PER_REPLICA = 1_000_000


def default_bucket_parameters(data_parallel):
    """Megatron-Core's default bucket size for ``data_parallel`` replicas, in parameters.

    >>> default_bucket_parameters(8), default_bucket_parameters(128)
    (40000000, 128000000)
    """
    return max(MEGATRON_MIN_BUCKET, MEGATRON_BUCKET_PER_REPLICA * int(data_parallel))


def bucket_layout(parameters, bucket):
    """``(n, last)``: the number of buckets of ``parameters`` cut ``bucket`` at a time,
    and the parameters of the last (the rest); ``(0, 0.0)`` for no parameters.

    >>> bucket_layout(100.0, 40)
    (3, 20.0)
    >>> bucket_layout(80.0, 40)
    (2, 40.0)
    >>> bucket_layout(10.0, 40)
    (1, 10.0)
    """
    parameters = float(parameters)
    if parameters <= 0:
        return 0, 0.0
    n = max(1, math.ceil(parameters / bucket))
    return n, parameters - (n - 1) * float(bucket)


def exposed_reduction(parameters, bucket, backward, collective_time, slowdown=0.0):
    """Seconds a stage's bucketed reduction adds after its last backward.

    ``parameters`` (per tensor rank) are cut into buckets of ``bucket``
    parameters, filled evenly over a backward of ``backward`` seconds;
    ``collective_time(k)`` gives the seconds of one bucket's collective for ``k``
    parameters (the caller turns them into bytes); ``slowdown`` is the system's
    ``overlap_slowdown``. See the module docstring.

    With one bucket it is the whole collective; with no backward time either:

    >>> flat = lambda k: 1e-9 * k           # 1 ns per parameter, no latency
    >>> round(exposed_reduction(100.0, 1000, 5e-6, flat), 12)   # one bucket: all of it
    1e-07
    >>> round(exposed_reduction(100.0, 10, 5e-6, flat), 12)   # ten of them: the last only
    1e-08
    >>> round(exposed_reduction(100.0, 10, 0.5e-7, flat), 12)  # comm-bound: 5 + 100 - 50 ns
    5.5e-08
    """
    n, last = bucket_layout(parameters, bucket)
    if n == 0:
        return 0.0
    backward = max(float(backward), 0.0)
    T_last = float(collective_time(last))
    if n == 1:
        # the one collective waits for the whole backward: all of it exposed
        return T_last
    T = float(collective_time(float(bucket)))
    # how far the n - 1 equal buckets run past the backward's end (negative: they end
    # before it): from bucket 0, ready at B b / P, or from bucket n - 2, ready at
    # B (P - last) / P; written as differences from B, so a last bucket far shorter
    # than the backward is not lost to rounding
    parameters = float(parameters)
    past = max((n - 1) * T - backward * (parameters - float(bucket)) / parameters,
               T - backward * last / parameters)
    tail = max(past, 0.0) + T_last
    total = (n - 1) * T + T_last
    overlapped = max(total - tail, 0.0)
    if slowdown:
        tail += overlapped * slowdown / (1.0 + slowdown)
    return tail
