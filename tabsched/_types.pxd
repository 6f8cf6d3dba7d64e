# Shared C types, sentinels and status codes of the evaluation kernel.
# The Python side reads the same values from tabsched._kernel (STATUS_*, NO_NODE,
# NO_RESOURCE), never from literals of its own.

from libc.stdint cimport int32_t

ctypedef int32_t index_t      # node, edge and resource ids
ctypedef double time_t        # start, end and durations, in the cost model's unit

cdef enum:
    NO_NODE = -1              # "no node": a binding slot with nothing behind it
    NO_RESOURCE = -1          # padding in a node's resource list
    NO_DEVICE = -1            # a node on no device's compute stream (transfer, sync)
    BLOCK = 32                # samples a blocked pass carries per node: its inner loops
                              # have this fixed length, which the compiler vectorises.
                              # 16 is too few: GCC unrolls a loop of 16 completely and
                              # then leaves its max and min scalar (twice the pass's
                              # time, measured with bench/bench_limits.py); 64 gains
                              # nothing more and doubles the scratch rows
    PAIRS = 16                # BLOCK / 2: pairs of samples drawn from one hash

cdef enum Status:
    STATUS_OK = 0
    STATUS_DEADLOCK = 1       # some nodes never became ready: a cycle
    STATUS_BAD_SHAPE = 2      # arrays disagree about the number of nodes/samples
    STATUS_BAD_INDEX = 3      # a successor or resource id out of range
