"""Node kinds (tabsched/nodes.py) and the lowering's views of them."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tabsched import InvalidParameterError, generate
from tabsched._testing import random_table
from tabsched.lower import lower
from tabsched.nodes import (CELL, EXTRA_KINDS, KINDS, OPTIMIZER, SYNC, TRANSFER, UNSHARD,
                            NodeKind)


def test_kinds_are_registered_in_numbering_order():
    assert [int(kind) for kind in KINDS] == list(range(len(KINDS)))
    assert KINDS[:4] == (CELL, TRANSFER, SYNC, OPTIMIZER)
    assert set(EXTRA_KINDS) == set(KINDS) - {CELL, TRANSFER}
    assert [kind.label for kind in KINDS[4:]] == ["unshard", "reshard", "all-to-all",
                                                  "context-exchange", "reduce-grad"]
    assert max(KINDS) <= np.iinfo(np.int8).max      # node_kind holds them as int8
    assert CELL.on_device and OPTIMIZER.on_device
    # FSDP's all-gathers and reduce-scatters run on their own streams; a free has none
    assert not TRANSFER.on_device and not SYNC.on_device and not UNSHARD.on_device


@given(seed=st.integers(0, 2**32 - 1), sync=st.booleans(), optimizer=st.booleans())
def test_each_kind_is_one_range_in_todays_numbering(seed, sync, optimizer):
    """Cells device by device in row order, then transfers, syncs, optimizer steps."""
    table = random_table(seed)
    lowered = lower(table, grad_sync="all" if sync else None, optimizer=optimizer)
    cells = int(table.cell_starts().sum())
    counts = {CELL: cells, TRANSFER: len(lowered.transfers),
              SYNC: table.num_stages if sync else 0,
              OPTIMIZER: table.num_devices if optimizer else 0}
    first = 0
    for kind in KINDS:
        assert lowered.nodes(kind) == slice(first, first + counts.get(kind, 0))
        assert lowered.count(kind) == counts.get(kind, 0)
        assert list(lowered.node_ids(kind)) == list(range(first, first + counts.get(kind, 0)))
        first += counts.get(kind, 0)
    assert first == lowered.num_nodes
    assert lowered.num_cells == cells
    assert lowered.extra_nodes == slice(cells + len(lowered.transfers), lowered.num_nodes)
    expected = np.repeat([CELL, TRANSFER, SYNC, OPTIMIZER],
                         [counts[CELL], counts[TRANSFER], counts[SYNC], counts[OPTIMIZER]])
    assert lowered.node_kind.dtype == np.int8
    np.testing.assert_array_equal(lowered.node_kind, expected)
    device = np.full(lowered.num_nodes, -1)
    device[:cells] = lowered.cell_device
    device[lowered.nodes(OPTIMIZER)] = np.arange(counts[OPTIMIZER])
    np.testing.assert_array_equal(lowered.node_device, device)
    for node in range(lowered.num_nodes):
        assert lowered.kind_of(node) == lowered.node_kind[node]
        assert isinstance(lowered.kind_of(node), NodeKind)


def test_the_views_are_read_only_and_cheap_to_hold():
    lowered = lower(generate("1f1b", devices=4, microbatches=8), optimizer=True)
    for view in (lowered.node_kind, lowered.node_device):
        with pytest.raises(ValueError):
            view[0] = 1
    assert lowered.node_kind is lowered.node_kind     # derived once per lowering


def test_describe_node_names_every_kind():
    table = generate("chimera", devices=4, microbatches=4)
    lowered = lower(table, grad_sync="replicas", optimizer=True)
    labels = [lowered.describe_node(node) for node in range(lowered.num_nodes)]
    assert labels[0] == "0F0"
    t = lowered.transfers
    assert labels[lowered.nodes(TRANSFER).start] == (f"{table.op(int(t.producer[0]))} "
                                                     f"d{t.src[0]}->d{t.dst[0]}")
    assert labels[lowered.nodes(SYNC).start] == f"grad sync stage {lowered.sync_stage[0]}"
    assert labels[lowered.nodes(OPTIMIZER).start + 2] == "optimizer d2"
    with pytest.raises(InvalidParameterError, match=r"node 999999 is not a node"):
        lowered.kind_of(999999)
