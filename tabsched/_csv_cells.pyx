# cython: language_level=3
"""Compiled scan of a schedule CSV: every cell's row, column, word and ids, in one pass.

A PyTorch schedule CSV (``csv.writer``'s bytes: cells separated by ``,``, lines
ending in ``\\r\\n``) holds tens of thousands of cells such as ``3F12``,
``0SEND_F5`` or ``1UNSHARD``. :func:`scan_cells` reads the UTF-8 bytes once and
writes, per cell, its row and column, a word code (:data:`WORDS`: the cell's
kind letter or action, ``EMPTY`` for an empty cell, ``OTHER`` for anything else)
and its stage and microbatch (``-1`` where the cell has none). A cell is read as
a word only in its plainest spelling: 1 to 9 ASCII digits, the word, 1 to 9
digits (none for ``UNSHARD``, ``RESHARD``, ``REDUCE_GRAD``). Every other cell
(spaces, an overlapped ``(..)OVERLAP_F_B``, a long id, a wrong word) is
``OTHER``, its stage and microbatch holding the byte offsets where it starts
and ends, for the general reader (:func:`tabsched.cells.parse_torch_token`).

The scan gives up, returning ``-1 - NOT_PLAIN``, where the bytes could mean
something else to Python's ``csv`` module than split at commas and line ends: a
quote, a carriage return not followed by a line feed, an empty line before
more text, a cell of more than :data:`LONGEST_OTHER` bytes. The caller then reads
the file with the general reader, which explains what is wrong with it. As in
``tabsched._build``, the function sees typed memoryviews and C scalars only,
runs without the GIL, checks every index it writes and returns a count or a
status; ``tabsched._reference.scan_cells`` is its plain-Python twin.
"""

from cython cimport boundscheck, wraparound
from libc.stdint cimport int8_t

from tabsched._types cimport index_t, STATUS_BAD_SHAPE

cdef enum:
    W_EMPTY = 0
    W_F = 1
    W_B = 2
    W_I = 3
    W_W = 4
    W_BW = 5
    W_SEND_F = 6
    W_RECV_F = 7
    W_SEND_B = 8
    W_RECV_B = 9
    W_UNSHARD = 10
    W_RESHARD = 11
    W_REDUCE_GRAD = 12
    W_OTHER = 13
    STATUS_NOT_PLAIN = 4      # the bytes need Python's csv module (and its messages)
    MAX_DIGITS = 9            # ids of at most 9 digits fit int32
    MAX_INDEX = 2147483647    # byte offsets are int32 too
    OTHER_LIMIT = 256

#: The word codes, in order: ``WORDS[code]`` is the cell's word (``""``: empty cell,
#: ``None``: any other cell).
WORDS = ("", "F", "B", "I", "W", "BW", "SEND_F", "RECV_F", "SEND_B", "RECV_B", "UNSHARD",
         "RESHARD", "REDUCE_GRAD", None)
EMPTY = W_EMPTY
OTHER = W_OTHER
#: The first and last word code of a compute cell, of a SEND/RECV, of a stage action.
COMPUTE = (W_F, W_BW)
COMMS = (W_SEND_F, W_RECV_B)
STAGE_ACTIONS = (W_UNSHARD, W_REDUCE_GRAD)
NOT_PLAIN = STATUS_NOT_PLAIN
BAD_SHAPE = STATUS_BAD_SHAPE
#: The longest cell the scan hands on as ``OTHER``; a longer one is read by ``csv``.
LONGEST_OTHER = OTHER_LIMIT


cdef inline int _word(const unsigned char[::1] text, Py_ssize_t begin,
                      Py_ssize_t end) noexcept nogil:
    """The code of the word ``text[begin:end]`` (capitals and ``_``), or W_OTHER."""
    cdef Py_ssize_t n = end - begin
    cdef unsigned char a = text[begin]
    if n == 1:
        if a == b'F':
            return W_F
        if a == b'B':
            return W_B
        if a == b'I':
            return W_I
        if a == b'W':
            return W_W
        return W_OTHER
    if n == 2:
        return W_BW if a == b'B' and text[begin + 1] == b'W' else W_OTHER
    if n == 6:
        if a == b'S' and _same(text, begin, b"SEND_F", 6):
            return W_SEND_F
        if a == b'S' and _same(text, begin, b"SEND_B", 6):
            return W_SEND_B
        if a == b'R' and _same(text, begin, b"RECV_F", 6):
            return W_RECV_F
        if a == b'R' and _same(text, begin, b"RECV_B", 6):
            return W_RECV_B
        return W_OTHER
    if n == 7:
        if _same(text, begin, b"UNSHARD", 7):
            return W_UNSHARD
        if _same(text, begin, b"RESHARD", 7):
            return W_RESHARD
        return W_OTHER
    if n == 11 and _same(text, begin, b"REDUCE_GRAD", 11):
        return W_REDUCE_GRAD
    return W_OTHER


cdef inline bint _same(const unsigned char[::1] text, Py_ssize_t begin, const char *word,
                       Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t k
    for k in range(n):
        if text[begin + k] != <unsigned char>word[k]:
            return False
    return True


cdef inline bint _is_digit(unsigned char c) noexcept nogil:
    return b'0' <= c <= b'9'


cdef inline bint _is_word(unsigned char c) noexcept nogil:
    return (b'A' <= c <= b'Z') or c == b'_'


@boundscheck(False)
@wraparound(False)
def scan_cells(const unsigned char[::1] text not None, index_t[::1] row not None,
               index_t[::1] column not None, int8_t[::1] word not None,
               index_t[::1] stage not None, index_t[::1] microbatch not None):
    """Scan CSV bytes into per-cell arrays.

    Parameters
    ----------
    text : uint8 array (or bytes)
        The file's UTF-8 bytes.
    row, column, word, stage, microbatch : output arrays, one entry per cell
        int32 (``word`` int8), each as long as the number of commas plus line
        feeds plus one, or longer.

    Returns
    -------
    int
        The number of cells (rows are numbered from 0, each line one row; empty
        lines at the end are no rows); ``-1 - NOT_PLAIN`` where Python's ``csv``
        module must read the bytes; ``-1 - BAD_SHAPE`` for output arrays too short or
        of different lengths, or text of 2**31 bytes or more (checked first).
    """
    cdef Py_ssize_t capacity = row.shape[0]
    cdef Py_ssize_t count
    if (column.shape[0] != capacity or word.shape[0] != capacity
            or stage.shape[0] != capacity or microbatch.shape[0] != capacity
            or text.shape[0] > MAX_INDEX):
        return -1 - STATUS_BAD_SHAPE
    with nogil:
        if capacity < _cells_bound(text):
            count = -1 - STATUS_BAD_SHAPE
        else:
            count = _scan_cells(text, row, column, word, stage, microbatch)
    return count


cdef Py_ssize_t _cells_bound(const unsigned char[::1] text) noexcept nogil:
    """Commas plus line feeds plus one: no text has more cells."""
    cdef Py_ssize_t k, bound = 1
    for k in range(text.shape[0]):
        if text[k] == b',' or text[k] == b'\n':
            bound += 1
    return bound


cdef Py_ssize_t _scan_cells(const unsigned char[::1] text, index_t[::1] row,
                            index_t[::1] column, int8_t[::1] word, index_t[::1] stage,
                            index_t[::1] microbatch) noexcept nogil:
    cdef Py_ssize_t size = text.shape[0]
    cdef Py_ssize_t capacity = row.shape[0]
    cdef Py_ssize_t at = 0, begin, end, cursor, digits_end, word_end, count = 0
    cdef index_t line = 0, cell = 0
    cdef long long first_id, second_id
    cdef unsigned char c
    cdef int code
    while at < size:
        # one line: its cells up to \n, \r\n or the end of the text
        if text[at] == b'\n' or text[at] == b'\r':
            # an empty line: no row; only more empty lines may follow
            cursor = at
            while cursor < size:
                c = text[cursor]
                if c == b'\r':
                    if cursor + 1 >= size or text[cursor + 1] != b'\n':
                        return -1 - STATUS_NOT_PLAIN
                    cursor += 2
                elif c == b'\n':
                    cursor += 1
                else:
                    return -1 - STATUS_NOT_PLAIN
            return count
        cell = 0
        while True:
            begin = at
            while at < size:
                c = text[at]
                if c == b',' or c == b'\n' or c == b'\r':
                    break
                if c == b'"':
                    return -1 - STATUS_NOT_PLAIN
                at += 1
            end = at
            if count >= capacity:
                return -1 - STATUS_BAD_SHAPE
            row[count] = line
            column[count] = cell
            stage[count] = -1
            microbatch[count] = -1
            if end == begin:
                word[count] = W_EMPTY
            else:
                code = W_OTHER
                # <1..9 digits><word><0..9 digits>
                cursor = begin
                first_id = 0
                while cursor < end and _is_digit(text[cursor]) and cursor - begin < MAX_DIGITS + 1:
                    first_id = first_id * 10 + (text[cursor] - c'0')
                    cursor += 1
                digits_end = cursor
                if begin < digits_end <= begin + MAX_DIGITS:
                    while cursor < end and _is_word(text[cursor]):
                        cursor += 1
                    word_end = cursor
                    second_id = 0
                    while cursor < end and _is_digit(text[cursor]) \
                            and cursor - word_end < MAX_DIGITS + 1:
                        second_id = second_id * 10 + (text[cursor] - c'0')
                        cursor += 1
                    if cursor == end and word_end > digits_end \
                            and cursor - word_end <= MAX_DIGITS:
                        code = _word(text, digits_end, word_end)
                        if code >= W_UNSHARD and code <= W_REDUCE_GRAD:
                            if cursor > word_end:
                                code = W_OTHER       # a stage action takes no microbatch
                        elif code != W_OTHER:
                            if cursor == word_end:
                                code = W_OTHER       # a microbatch is needed
                            else:
                                microbatch[count] = <index_t>second_id
                        if code != W_OTHER:
                            stage[count] = <index_t>first_id
                if code == W_OTHER:
                    if end - begin > OTHER_LIMIT:
                        return -1 - STATUS_NOT_PLAIN
                    stage[count] = <index_t>begin
                    microbatch[count] = <index_t>end
                word[count] = <int8_t>code
            count += 1
            cell += 1
            if at >= size:
                return count
            c = text[at]
            if c == b',':
                at += 1
                continue
            # the line ends
            if c == b'\r':
                if at + 1 >= size or text[at + 1] != b'\n':
                    return -1 - STATUS_NOT_PLAIN
                at += 2
            else:
                at += 1
            break
        line += 1
    return count
