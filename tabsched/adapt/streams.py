"""Random streams: the keyed draws behind every variation model.

Nothing here advances a state: a random number is a pure function of 64-bit keys,
mixed by SplitMix64's finaliser, so it is the same whoever draws it, in which order
and in how many pieces.

Data model
    stream key
        One per seed, iteration and stream: ``"noise"`` (the operations' noise),
        ``"transfer-noise"`` and ``"spike"`` (latency spikes)
        (:meth:`RandomStreams.stream_key`).
    operation key
        One per operation of a table: its kind, its stage, and the position and
        size of its microbatch within the iteration's batch, on a grid of
        1/720720 of a full microbatch (``RandomStreams.op_keys``).
    transfer key
        One per transfer: its producer's key, its direction and its devices
        (``RandomStreams.transfer_keys``).
    draw
        Sample ``s`` of key ``k`` in a stream hashes the stream key, ``s`` and
        ``k``: lognormal factors (:meth:`RandomStreams.lognormal_factors`, drawn
        in compiled code) and pairs of uniforms (:meth:`RandomStreams.uniforms`).

    :class:`RandomStreams` holds the keys of one lowered table in one iteration;
    :func:`lognormal_parameters` turns a coefficient of variation into the
    compiled draws' ``sigma`` and ``shift``.

Reproducibility
    Random draws come from a counter-based hash (SplitMix64) of the seed, the
    iteration, the sample index and the identity of the operation: its kind,
    stage, and the position and size of its microbatch within the iteration's
    batch (a transfer adds its direction and devices). The same seed gives the
    same numbers to the bit whatever the chunking, and two tables that share an
    operation -- a table and its transform that left that operation alone --
    draw the same durations for it (common random numbers), so the search
    compares candidates on the same luck. Noise is drawn in compiled code
    (:func:`tabsched.engine.lognormal_factors`): one hash per operation and pair of samples
    ``2j, 2j+1`` gives both Box-Muller normals (cosine and sine), computed with
    float32 polynomials that round the same way on every IEEE machine; Monte
    Carlo's fused pass (:func:`tabsched.adapt.monte_carlo`) draws the same
    numbers while it runs.

Examples
--------
>>> from tabsched import generate
>>> from tabsched.lower import lower
>>> streams = RandomStreams(lower(generate("1f1b", devices=2, microbatches=2)), seed=1)
>>> factors = streams.lognormal_factors("noise", np.arange(4), streams.op_keys, 0.1)
>>> factors.shape, bool(np.all(factors > 0))
((4, 8), True)
>>> again = RandomStreams(lower(generate("1f1b", devices=2, microbatches=2)), seed=1)
>>> one = again.lognormal_factors("noise", [3], again.op_keys, 0.1)   # keyed by sample
>>> one.tobytes() == factors[3:].tobytes()
True
"""

import numbers

import numpy as np

from tabsched import engine
from tabsched.exceptions import InvalidParameterError

__all__ = ["RandomStreams", "lognormal_parameters"]

#: Microbatch offsets and sizes are hashed on a grid of 1/720720 of a full
#: microbatch (720720 is divisible by every integer up to 16), so splits into up
#: to 16 parts, nested or not, give exact keys.
_GRID = 720720
_MASK = (1 << 64) - 1
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB
_GOLDEN = 0x9E3779B97F4A7C15
_STREAMS = {"noise": 1, "transfer-noise": 2, "spike": 3}
#: Values drawn at a time: blocks this small stay in cache.
_BLOCK = 2**17


def _mix_int(value):
    """SplitMix64's finaliser on a Python int."""
    z = (value + _GOLDEN) & _MASK
    z = ((z ^ (z >> 30)) * _M1) & _MASK
    z = ((z ^ (z >> 27)) * _M2) & _MASK
    return z ^ (z >> 31)


def _mix(z):
    """SplitMix64's finaliser on a uint64 array (in place where it can)."""
    z = z + np.uint64(_GOLDEN)
    z ^= z >> np.uint64(30)
    z *= np.uint64(_M1)
    z ^= z >> np.uint64(27)
    z *= np.uint64(_M2)
    z ^= z >> np.uint64(31)
    return z


def _hash_columns(*columns):
    """One uint64 key per row of integer columns."""
    key = np.zeros(len(columns[0]), dtype=np.uint64)
    for column in columns:
        key = _mix(key ^ np.asarray(column, dtype=np.int64).astype(np.uint64))
    return key


def _seed(seed):
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise InvalidParameterError(f"seed must be an integer >= 0, not {seed!r}")
    return int(seed) & _MASK


def lognormal_parameters(cv, count):
    """``(sigma, sigma^2 / 2)`` as float32 arrays of ``count``, ``sigma^2 = ln(1 + cv^2)``:
    a lognormal factor of mean 1 and CV ``cv`` (scalar or one per key)."""
    sigma2 = np.log1p(np.square(np.broadcast_to(np.asarray(cv, dtype=np.float64), (count,))))
    return (np.ascontiguousarray(np.sqrt(sigma2), dtype=np.float32),
            np.ascontiguousarray(sigma2 / 2.0, dtype=np.float32))


class RandomStreams:
    """The random streams of one lowered table in one iteration: its keys and its draws.

    Parameters
    ----------
    lowered : LoweredSchedule
    seed : int
        Seed of every draw (>= 0).
    iteration : int
        Which iteration of a run the samples are.

    Attributes
    ----------
    seed, iteration : int
    op_keys : uint64 array (operations,)
    transfer_keys : uint64 array (transfers,)
    """

    __slots__ = ("seed", "iteration", "op_keys", "transfer_keys")

    def __init__(self, lowered, *, seed=0, iteration=0):
        self.seed = _seed(seed)
        self.iteration = int(iteration)
        table = lowered.table
        sizes = np.asarray(table.microbatch_sizes, dtype=np.float64)
        offsets = np.concatenate([[0.0], np.cumsum(sizes)[:-1]]) if len(sizes) else sizes
        offset_key = np.round(offsets * _GRID).astype(np.int64)
        size_key = np.round(sizes * _GRID).astype(np.int64)
        self.op_keys = _hash_columns(table.kind, table.stage, offset_key[table.microbatch],
                                     size_key[table.microbatch])
        transfers = lowered.transfers
        self.transfer_keys = _hash_columns(
            self.op_keys[transfers.producer].view(np.int64), transfers.gradient,
            transfers.src, transfers.dst)

    def stream_key(self, stream):
        """The key of a random stream (``"noise"``, ``"spike"``...) for this seed and
        iteration."""
        return _mix_int(_mix_int(_mix_int(self.seed) ^ self.iteration) ^ _STREAMS[stream])

    def sample_keys(self, stream, samples):
        """One uint64 per sample of a random stream (``"noise"``, ``"spike"``...)."""
        return _mix(np.asarray(samples, dtype=np.int64).astype(np.uint64)
                    ^ np.uint64(self.stream_key(stream)))

    def lognormal_factors(self, stream, samples, keys, cv):
        """Factors of mean 1 and CV ``cv`` (scalar or per key), shape (samples, keys).

        ``exp(sigma Z - sigma^2/2)``, ``sigma^2 = ln(1 + cv^2)``, Z standard normal
        drawn in compiled code (:func:`tabsched.engine.lognormal_factors`) from the stream, the
        sample and the key: samples ``2j`` and ``2j+1`` take the two Box-Muller
        normals of one hash. Monte Carlo's fused pass draws the same numbers.
        """
        sigma, shift = lognormal_parameters(cv, len(keys))
        return engine.lognormal_factors(self.stream_key(stream), samples, keys, sigma, shift)

    def scale_lognormal(self, target, stream, samples, keys, cv):
        """Multiply ``target`` (samples, keys) by factors of mean 1 and CV ``cv`` (scalar or
        per key), drawn block by block of samples."""
        rows = max(1, _BLOCK // max(len(keys), 1))
        for first in range(0, len(samples), rows):
            block = slice(first, first + rows)
            target[block] *= self.lognormal_factors(stream, samples[block], keys, cv)

    def uniforms(self, stream, samples, keys, dtype=np.float64):
        """Two arrays of uniforms in (0, 1), shape (samples, keys), for ``keys``.

        Each comes from 32 bits of one 64-bit hash per (sample, key).
        """
        z = _mix(self.sample_keys(stream, samples)[:, None] ^ keys[None, :])
        scale = dtype(1.0 / 4294967296.0)
        high = (z >> np.uint64(32)).astype(dtype)
        high += dtype(0.5)
        high *= scale
        z &= np.uint64(0xFFFFFFFF)
        low = z.astype(dtype)
        low += dtype(0.5)
        low *= scale
        return high, low
