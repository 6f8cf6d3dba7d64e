"""Every compiled entry point survives inconsistent arrays: a status, never a crash.

The arrays are random small integers (ids and offsets out of range, falling
offsets, wrong lengths); each call must return (any status) without reading or
writing out of bounds. A crash would end the test run.
"""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tabsched import _build, _kernel
from tabsched.engine import NoisyDurations

I32, F64, I8 = np.int32, np.float64, np.int8


def ints(rng, size, low=-3, high=8, dtype=I32):
    return rng.integers(low, high, size).astype(dtype)


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_entry_points_survive_inconsistent_arrays(seed):
    rng = np.random.default_rng(seed)
    n, e = int(rng.integers(0, 6)), int(rng.integers(0, 8))
    indptr, succ = ints(rng, n + 1), ints(rng, e)
    _kernel.topological(indptr, succ, ints(rng, n), ints(rng, n + 1), ints(rng, e),
                        ints(rng, n))
    _kernel.find_cycle(ints(rng, n + 1, -2_000_000_000, 2_000_000_000), ints(rng, e),
                       ints(rng, n), ints(rng, n), ints(rng, n))
    graph = _kernel.Graph(n)
    resources = ints(rng, (n, int(rng.integers(0, 3))), -2, 4)
    devices = int(rng.integers(0, 3))
    graph.add_layout(ints(rng, n), ints(rng, n + 1), ints(rng, e))
    graph.add_edges(indptr, succ, resources, 3)
    graph.add_devices(ints(rng, n, -2, 3), devices)

    def scratch(finish, nodes=n, resources=3):
        return _kernel.Scratch(ints(rng, nodes), rng.random(nodes), ints(rng, nodes),
                               rng.random(resources), ints(rng, resources), np.zeros(finish))
    # every pass on whatever parts were added, with scratch of the right and wrong sizes
    for finish in (n, n * _kernel.SUMMARY_BLOCK, (n + 3 * devices) * _kernel.SUMMARY_BLOCK):
        for work in (scratch(finish), scratch(finish, max(n - 1, 0), 0)):
            _kernel.longest_path_starts(graph, rng.random((2, n)), np.zeros((2, n)),
                                        np.zeros(n, I32), work, bool(rng.integers(2)))
            _kernel.fifo_starts(graph, rng.random((1, n)), np.zeros((1, n)), np.zeros(n, I32),
                                work)
            outputs = (np.zeros(3), np.zeros((3, devices)), np.zeros((3, devices)),
                       np.zeros((3, devices)))
            _kernel.longest_path_summary(graph, rng.random((3, n)), *outputs, work)
            _kernel.fifo_summary(graph, rng.random((3, n)), *outputs, work)
            cells = int(rng.integers(0, n + 1))
            ops = int(rng.integers(0, 5))
            draws = NoisyDurations(
                cell_first_op=ints(rng, cells + 1, -1, ops + 2), op_base=rng.random(ops),
                op_key=np.arange(ops, dtype=np.uint64), op_sigma=np.full(ops, 0.1, np.float32),
                op_shift=np.zeros(ops, np.float32), overlap=1.0,
                transfer_base=rng.random(int(rng.integers(0, 4))),
                transfer_key=np.arange(3, dtype=np.uint64), transfer_sigma=0.1,
                transfer_shift=0.0, extra=rng.random(int(rng.integers(0, 4))), noise_stream=1,
                transfer_stream=2)
            _kernel.monte_carlo_summary(graph, draws, np.zeros(5), np.zeros((5, devices)),
                                        np.zeros((5, devices)), np.zeros((5, devices)), work)
    for build in _kernel.FUSED_PASSES.values():    # checks its own layout arrays
        devices = int(rng.integers(0, 3))
        cells = int(rng.integers(0, n + 1))
        build(ints(rng, n + 1, -1, e + 2), ints(rng, e, -2, n + 2), ints(rng, n, -2, n + 2),
              ints(rng, n, -2, 3), np.append(np.arange(cells), cells).astype(I32),
              rng.random(cells), np.arange(cells, dtype=np.uint64),
              np.full(cells, 0.1, np.float32), np.zeros(cells, np.float32), 1.0,
              rng.random(n - cells), np.arange(n - cells, dtype=np.uint64), 0.1, 0.0,
              np.zeros(0), 1, 2, np.zeros(5), np.zeros((5, devices)), np.zeros((5, devices)),
              np.zeros((5, devices)), np.zeros((n + 3 * devices) * _kernel.SUMMARY_BLOCK))
    ops = int(rng.integers(0, 6))
    S, M = int(rng.integers(0, 3)), int(rng.integers(0, 3))
    kind, stage, mb, device = (ints(rng, ops, -1, 5, I8), ints(rng, ops, -1, 4),
                               ints(rng, ops, -1, 4), ints(rng, ops, -1, 3))
    _build.dependencies(kind, stage, mb, device, S, M, ints(rng, S * M), ints(rng, S * M),
                        ints(rng, S * M), ints(rng, 2 * ops), ints(rng, 2 * ops),
                        ints(rng, 2 * ops, dtype=I8), ints(rng, 2 * ops, dtype=I8))
    _build.table_is_valid(device, kind, stage, mb, S, M, ints(rng, 4 * S * M, dtype=I8),
                          ints(rng, S * M))
    _build.csr(ints(rng, e), ints(rng, e), ints(rng, n + 1), ints(rng, e))
    _build.append_one(ints(rng, n + 1), ints(rng, e), ints(rng, n), ints(rng, n + 1),
                      ints(rng, e + int(rng.integers(0, 3))))
    _build.activation_peaks(device, kind, ints(rng, ops), rng.random(n), rng.random(n),
                            rng.random(ops), rng.random(ops), 0.5,
                            np.zeros(int(rng.integers(0, 3))))
    cells, devices = int(rng.integers(0, 5)), int(rng.integers(0, 3))
    _build.fill_idle(rng.random(cells), ints(rng, cells, -1, 3), ints(rng, cells, 0, 2, I8),
                     ints(rng, cells + 1), ints(rng, e), rng.random(e), ints(rng, cells + 1),
                     ints(rng, e), ints(rng, devices + 1), ints(rng, e),
                     ints(rng, devices, -1, 3), np.zeros(cells, I32), np.zeros(devices, I32))
