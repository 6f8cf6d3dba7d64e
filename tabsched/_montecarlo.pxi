# The Monte Carlo pass with its draws, included twice: by _kernel.pyx (built for the
# baseline instruction set, runs everywhere) and by _kernel_avx2.pyx (the same text
# built with -mavx2: the compiler turns the draws' float32 loops into 8-wide
# vectors). _kernel picks the second at import when the CPU has AVX2. Both round
# every step as IEEE 754 says (no FMA contraction), so they give the same numbers to
# the bit; tests/test_kernel_layout.py holds them to that against _reference.
#
# Everything here is self-contained (C types from _types.pxd, libc), so that the
# AVX2 module imports nothing from _kernel.

# Random draws: SplitMix64 of (the sample's key ^ the operation's key), as
# tabsched.adapt.streams keys them, gives two 24-bit uniforms; Box-Muller turns
# them into a standard normal and the lognormal factor is exp(sigma*Z - shift).
# The logarithm, cosine and exponential are short polynomials in float32 with
# no branch and no table (about 1e-7 relative error), so the compiler
# vectorises a block of samples and the numbers are the same on every machine
# that rounds float32 as IEEE 754 says (the build turns off FMA contraction).

cdef inline uint64_t _mix64(uint64_t z) noexcept nogil:
    """SplitMix64's finaliser (Steele, Lea and Flood 2014), as streams._mix."""
    z = z + <uint64_t>0x9E3779B97F4A7C15
    z = (z ^ (z >> 30)) * <uint64_t>0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * <uint64_t>0x94D049BB133111EB
    return z ^ (z >> 31)


# No branch and no conditional expression below (Cython writes those as
# if/else, which keeps the compiler from vectorising): selections are
# products with a comparison's 0 or 1, and fabsf, fminf, fmaxf, copysignf.

cdef inline float _ln(float u) noexcept nogil:
    """Natural logarithm of u > 0 (a normal float): u = m * 2^e with m in
    [sqrt(1/2), sqrt(2)), ln m = 2 atanh(t), t = (m-1)/(m+1), to t^9."""
    cdef uint32_t bits
    cdef float m, t, t2
    cdef int32_t e, big
    memcpy(&bits, &u, 4)
    e = <int32_t>((bits >> 23) & 0xFF) - 127
    bits = (bits & 0x007FFFFF) | 0x3F800000
    memcpy(&m, &bits, 4)
    big = m > <float>1.41421356237
    e = e + big
    m = m * (<float>1.0 - <float>0.5 * <float>big)
    t = (m - <float>1.0) / (m + <float>1.0)
    t2 = t * t
    return (<float>e * <float>0.693147180560
            + <float>2.0 * t * (<float>1.0 + t2 * (<float>0.333333333333 + t2 * (
                <float>0.2 + t2 * (<float>0.142857142857 + t2 * <float>0.111111111111)))))


cdef inline float _cos_turns(float u) noexcept nogil:
    """cos(2 pi u) for u in [0, 1]: reduced to x = 2 pi b, b in [0, 1/4], Taylor to x^12."""
    cdef float a = fabsf(u - <float>0.5)      # cos(2 pi u) = -cos(2 pi a)
    cdef float big = <float>(a > <float>0.25)   # cos(2 pi a) = -cos(2 pi (1/2 - a))
    cdef float b = a + big * (<float>0.5 - <float>2.0 * a)
    cdef float x2 = b * b * <float>39.4784176044           # (2 pi b)^2
    cdef float c = <float>1.0 + x2 * (<float>-0.5 + x2 * (<float>4.16666666667e-2 + x2 * (
        <float>-1.38888888889e-3 + x2 * (<float>2.48015873016e-5 + x2 * (
            <float>-2.75573192240e-7 + x2 * <float>2.08767569879e-9)))))
    return c * (<float>2.0 * big - <float>1.0)


cdef inline float _exp(float x) noexcept nogil:
    """exp(x), x clamped to [-87, 88]: 2^n exp(r), |r| <= ln(2)/2, Taylor to r^6."""
    cdef float r, p, scale, y
    cdef int32_t n
    cdef uint32_t bits
    x = x + <float>(x < <float>-87.0) * (<float>-87.0 - x)
    x = x + <float>(x > <float>88.0) * (<float>88.0 - x)
    y = x * <float>1.44269504089
    n = <int32_t>(y + copysignf(<float>0.5, y))
    r = x - <float>n * <float>0.693359375 + <float>n * <float>2.12194440e-4
    p = <float>1.0 + r * (<float>1.0 + r * (<float>0.5 + r * (<float>0.166666666667 + r * (
        <float>4.16666666667e-2 + r * (<float>8.33333333333e-3 + r * <float>1.38888888889e-3)))))
    bits = <uint32_t>(n + 127) << 23
    memcpy(&scale, &bits, 4)
    return p * scale


cdef inline float _radius(uint64_t z) noexcept nogil:
    """Box-Muller's radius sqrt(-2 ln u) from the hash's top 24 bits."""
    cdef float u = (<float>(<int32_t>(z >> 40)) + <float>0.5) * <float>5.96046447754e-8  # 2^-24
    return sqrtf(<float>-2.0 * _ln(u))


cdef inline float _turn(uint64_t z) noexcept nogil:
    """Box-Muller's angle, in turns, from the hash's bits 8..31."""
    return (<float>(<int32_t>((z >> 8) & 0xFFFFFF)) + <float>0.5) * <float>5.96046447754e-8


cdef inline float _factor(uint64_t z, int32_t odd, float sigma, float shift) noexcept nogil:
    """exp(sigma Z - shift), Z = r cos(2 pi t) for an even sample, r sin(2 pi t) for odd
    (sin(2 pi t) = cos(2 pi (t - 1/4)), the angle kept in [0, 1])."""
    cdef float t = _turn(z)
    t = t - <float>0.25 * <float>odd
    t = t + <float>(t < <float>0.0)
    return _exp(sigma * _radius(z) * _cos_turns(t) - shift)


cdef inline uint64_t _pair_key(uint64_t stream, int64_t sample) noexcept nogil:
    """The key of a sample's pair (samples 2k and 2k+1 share one hash, the two
    Box-Muller normals): SplitMix64 of the pair's number ^ the stream's key."""
    return _mix64(<uint64_t>(sample >> 1) ^ stream)


cdef inline void _draw_block(const uint64_t *pair_keys, uint64_t key, float sigma, float shift,
                             time_t base, time_t *out) noexcept nogil:
    """``base * factor`` for BLOCK consecutive samples from an even one: one hash
    per pair of samples, its cosine normal for the even one, its sine for the odd.
    Loops of fixed length, one step each: the hashes (64-bit integers), then the
    float32 arithmetic, which the compiler vectorises, then the products."""
    cdef int32_t q
    cdef uint64_t z
    cdef int32_t top[PAIRS]
    cdef int32_t low[PAIRS]
    cdef float radius[PAIRS]
    cdef float turn[PAIRS]
    cdef float even[PAIRS]
    cdef float odd[PAIRS]
    cdef float other
    if sigma == 0.0 and shift == 0.0:       # a factor of exactly 1: no draw needed
        for q in range(BLOCK):
            out[q] = base
        return
    for q in range(PAIRS):
        z = _mix64(pair_keys[q] ^ key)
        top[q] = <int32_t>(z >> 40)
        low[q] = <int32_t>((z >> 8) & 0xFFFFFF)
    for q in range(PAIRS):
        radius[q] = sigma * sqrtf(<float>-2.0 * _ln((<float>top[q] + <float>0.5)
                                                    * <float>5.96046447754e-8))
    for q in range(PAIRS):
        turn[q] = (<float>low[q] + <float>0.5) * <float>5.96046447754e-8
    for q in range(PAIRS):
        even[q] = _exp(radius[q] * _cos_turns(turn[q]) - shift)
    for q in range(PAIRS):
        other = turn[q] - <float>0.25
        other = other + <float>(other < <float>0.0)
        odd[q] = _exp(radius[q] * _cos_turns(other) - shift)
    for q in range(PAIRS):
        out[2 * q] = base * <time_t>even[q]
        out[2 * q + 1] = base * <time_t>odd[q]

# The pass's steps over one block of samples, on pointers declared not to overlap
# (C99 restrict; every call passes distinct rows), so that the compiler need not
# assume a row of ``finish`` may be a local block the draws wrote. Comparisons are
# those of the reference: a NaN-free max and min that keep the old value on ties.
cdef extern from *:
    """
    #if defined(_MSC_VER)
    typedef double *__restrict tabsched_block_t;
    typedef const double *__restrict tabsched_const_block_t;
    #else
    typedef double *__restrict__ tabsched_block_t;
    typedef const double *__restrict__ tabsched_const_block_t;
    #endif
    """
    ctypedef time_t *block_t "tabsched_block_t"
    ctypedef const time_t *const_block_t "tabsched_const_block_t"


cdef inline void _fill(block_t out, time_t value) noexcept nogil:
    cdef index_t b
    for b in range(BLOCK):
        out[b] = value


cdef inline void _add_into(block_t total, const_block_t part) noexcept nogil:
    cdef index_t b
    for b in range(BLOCK):
        total[b] = total[b] + part[b]


cdef inline void _scale(block_t values, time_t factor) noexcept nogil:
    cdef index_t b
    for b in range(BLOCK):
        values[b] = values[b] * factor


cdef inline void _max_into(block_t most, const_block_t values) noexcept nogil:
    cdef index_t b
    for b in range(BLOCK):
        most[b] = values[b] if values[b] > most[b] else most[b]


cdef inline void _min_into(block_t least, const_block_t values) noexcept nogil:
    cdef index_t b
    for b in range(BLOCK):
        least[b] = values[b] if values[b] < least[b] else least[b]


cdef inline void _end_into(block_t ends, const_block_t begin, const_block_t length,
                           block_t longest) noexcept nogil:
    """``ends = begin + length`` and ``longest = max(longest, ends)``."""
    cdef index_t b
    cdef time_t value
    for b in range(BLOCK):
        value = begin[b] + length[b]
        ends[b] = value
        longest[b] = value if value > longest[b] else longest[b]


cdef index_t _check_layout(const index_t[::1] offsets, const index_t[::1] lists,
                           const index_t[::1] nodes) noexcept nogil:
    """What ``Graph.add_layout`` promises the pull passes: offsets from 0 to
    ``len(lists)`` that never fall, every predecessor an earlier position, every
    order entry a node. Returns a status."""
    cdef index_t n = offsets.shape[0] - 1
    cdef index_t i, e
    if n < 0 or nodes.shape[0] != n or offsets[0] != 0 or offsets[n] != lists.shape[0]:
        return STATUS_BAD_SHAPE
    for i in range(n):
        if offsets[i + 1] < offsets[i] or offsets[i + 1] > lists.shape[0]:
            return STATUS_BAD_SHAPE
        if <size_t>nodes[i] >= <size_t>n:
            return STATUS_BAD_INDEX
        for e in range(offsets[i], offsets[i + 1]):
            if <size_t>lists[e] >= <size_t>i:      # lists[e] < 0 or lists[e] >= i
                return STATUS_BAD_INDEX
    return STATUS_OK


@boundscheck(False)
@wraparound(False)
def monte_carlo_pass(const index_t[::1] pred_indptr not None,
                     const index_t[::1] predecessors not None,
                     const index_t[::1] order not None,
                     const index_t[::1] node_device not None,
                     const index_t[::1] cell_first_op not None,
                     const time_t[::1] op_base not None,
                     const uint64_t[::1] op_key not None,
                     const float[::1] op_sigma not None,
                     const float[::1] op_shift not None,
                     time_t overlap,
                     const time_t[::1] transfer_base not None,
                     const uint64_t[::1] transfer_key not None,
                     float transfer_sigma, float transfer_shift,
                     const time_t[::1] tail not None,
                     uint64_t noise_stream, uint64_t transfer_stream,
                     time_t[::1] makespan not None,
                     time_t[:, ::1] busy not None,
                     time_t[:, ::1] first_start not None,
                     time_t[:, ::1] last_end not None,
                     time_t[::1] finish not None,
                     index_t first_sample=0):
    """``_kernel.monte_carlo_summary`` over a layout's three arrays (``order``,
    ``pred_indptr``, ``predecessors``), checked here as ``Graph.add_layout`` checks
    them: this module may be another build of the same pass, which cannot see
    ``_kernel.Graph``. The checks cost one read of the arrays.

    Returns
    -------
    int
        A status: OK, BAD_SHAPE or BAD_INDEX.
    """
    cdef index_t n = pred_indptr.shape[0] - 1
    cdef index_t samples = makespan.shape[0]
    cdef index_t devices = busy.shape[1]
    cdef index_t cells = cell_first_op.shape[0] - 1
    cdef index_t transfers = transfer_base.shape[0]
    cdef index_t ops = op_base.shape[0]
    cdef index_t status, v, c
    with nogil:
        status = _check_layout(pred_indptr, predecessors, order)
    if status != STATUS_OK:
        return status
    if (node_device.shape[0] != n or cells < 0
            or cells + transfers + tail.shape[0] != n
            or op_key.shape[0] != ops or op_sigma.shape[0] != ops or op_shift.shape[0] != ops
            or transfer_key.shape[0] != transfers
            or busy.shape[0] != samples
            or first_start.shape[0] != samples or first_start.shape[1] != devices
            or last_end.shape[0] != samples or last_end.shape[1] != devices
            or finish.shape[0] != (<Py_ssize_t>n + 3 * <Py_ssize_t>devices) * BLOCK):
        return STATUS_BAD_SHAPE
    if cell_first_op[0] != 0 or cell_first_op[cells] != ops:
        return STATUS_BAD_SHAPE
    if first_sample < 0 or first_sample % 2 or first_sample > 2147483647 - samples:
        return STATUS_BAD_SHAPE
    for c in range(cells):
        if cell_first_op[c + 1] <= cell_first_op[c]:
            return STATUS_BAD_SHAPE
    for v in range(n):
        if node_device[v] < NO_DEVICE or node_device[v] >= devices:
            return STATUS_BAD_INDEX
    with nogil:
        status = _monte_carlo_summary(pred_indptr, predecessors, order, True,
                                      node_device, cell_first_op, op_base, op_key, op_sigma,
                                      op_shift, overlap, transfer_base, transfer_key,
                                      transfer_sigma, transfer_shift, tail, noise_stream,
                                      transfer_stream, makespan, busy, first_start, last_end,
                                      finish, first_sample)
    return status


cdef index_t _monte_carlo_summary(const index_t[::1] pred_indptr,
                                  const index_t[::1] predecessors,
                                  const index_t[::1] order, bint ordered,
                                  const index_t[::1] node_device,
                                  const index_t[::1] cell_first_op,
                                  const time_t[::1] op_base, const uint64_t[::1] op_key,
                                  const float[::1] op_sigma, const float[::1] op_shift,
                                  time_t overlap, const time_t[::1] transfer_base,
                                  const uint64_t[::1] transfer_key, float transfer_sigma,
                                  float transfer_shift, const time_t[::1] tail,
                                  uint64_t noise_stream, uint64_t transfer_stream,
                                  time_t[::1] makespan, time_t[:, ::1] busy,
                                  time_t[:, ::1] first_start, time_t[:, ::1] last_end,
                                  time_t[::1] finish, index_t first_sample) noexcept nogil:
    cdef index_t n = pred_indptr.shape[0] - 1
    cdef index_t samples = makespan.shape[0]
    cdef index_t devices = busy.shape[1]
    cdef index_t cells = cell_first_op.shape[0] - 1
    cdef index_t first_tail = cells + transfer_base.shape[0]
    cdef index_t edges = predecessors.shape[0]
    cdef bint vary_transfers = transfer_sigma != 0.0 or transfer_shift != 0.0
    cdef index_t first, width, b, i, v, e, d, low, high, o, q
    cdef time_t begin[BLOCK]
    cdef time_t length[BLOCK]
    cdef time_t longest[BLOCK]
    cdef time_t part[BLOCK]
    cdef uint64_t pair_keys[PAIRS]
    cdef uint64_t transfer_pair_keys[PAIRS]
    cdef time_t *row
    cdef time_t *ends = &finish[0] if finish.shape[0] > 0 else NULL
    # per device, node-major over the block: busy time, first start, last end
    cdef time_t *device_busy = ends + <Py_ssize_t>n * BLOCK
    cdef time_t *device_first = device_busy + <Py_ssize_t>devices * BLOCK
    cdef time_t *device_last = device_first + <Py_ssize_t>devices * BLOCK
    first = 0
    while first < samples:
        width = samples - first if samples - first < BLOCK else BLOCK
        for q in range(PAIRS):     # lanes past the last sample are drawn, not kept
            pair_keys[q] = _pair_key(noise_stream, <int64_t>first_sample + first + 2 * q)
            transfer_pair_keys[q] = _pair_key(transfer_stream,
                                              <int64_t>first_sample + first + 2 * q)
        for b in range(BLOCK):
            longest[b] = 0.0
        for b in range(<Py_ssize_t>devices * BLOCK):
            device_busy[b] = 0.0
            device_first[b] = INFINITY
            device_last[b] = 0.0
        low = 0
        for i in range(n):
            high = pred_indptr[i + 1]
            v = order[i] if ordered else i
            # this node's durations for the block
            if v < cells:
                o = cell_first_op[v]
                _draw_block(pair_keys, op_key[o], op_sigma[o], op_shift[o], op_base[o],
                            length)
                if cell_first_op[v + 1] - o > 1:
                    for o in range(o + 1, cell_first_op[v + 1]):
                        _draw_block(pair_keys, op_key[o], op_sigma[o], op_shift[o],
                                    op_base[o], part)
                        _add_into(length, part)
                    if overlap != 1.0:
                        _scale(length, overlap)
            elif v < first_tail:
                if vary_transfers:
                    _draw_block(transfer_pair_keys, transfer_key[v - cells], transfer_sigma,
                                transfer_shift, transfer_base[v - cells], length)
                else:
                    _fill(length, transfer_base[v - cells])
            else:
                _fill(length, tail[v - first_tail])
            _fill(begin, 0.0)
            for e in range(low, high):
                _max_into(begin, ends + <Py_ssize_t>predecessors[e] * BLOCK)
            low = high
            row = ends + <Py_ssize_t>i * BLOCK
            _end_into(row, begin, length, longest)
            d = node_device[v]
            if d != NO_DEVICE:
                _add_into(device_busy + <Py_ssize_t>d * BLOCK, length)
                _min_into(device_first + <Py_ssize_t>d * BLOCK, begin)
                _max_into(device_last + <Py_ssize_t>d * BLOCK, row)
        for b in range(width):
            makespan[first + b] = longest[b]
            for d in range(devices):
                busy[first + b, d] = device_busy[d * BLOCK + b]
                first_start[first + b, d] = device_first[d * BLOCK + b]
                last_end[first + b, d] = device_last[d * BLOCK + b]
        first += BLOCK
    return STATUS_OK
