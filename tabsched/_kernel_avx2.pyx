# cython: language_level=3
"""The fused Monte Carlo pass of :mod:`tabsched._kernel`, built for AVX2.

The same source (``_montecarlo.pxi``) compiled with ``-mavx2``: the draws' float32
loops become 8-wide vectors, two per block of 16 pairs of samples. The numbers are
those of the baseline build to the bit (IEEE 754 rounding, no FMA contraction).
``_kernel`` imports this module only on a CPU with AVX2; importing it elsewhere
could fault, so nothing else does.
"""

from cython cimport boundscheck, wraparound
from libc.math cimport INFINITY, copysignf, fabsf, sqrtf
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.string cimport memcpy

from tabsched._types cimport (
    index_t, time_t, NO_DEVICE, BLOCK, PAIRS,
    STATUS_OK, STATUS_BAD_SHAPE, STATUS_BAD_INDEX,
)

include "_montecarlo.pxi"
