"""The edge groups and resources of a lowering (tabsched/edges.py)."""

import numpy as np

from tabsched import generate
from tabsched.edges import node_resources, optimizer_edges, stage_holders, sync_nodes
from tabsched.lower import lower
from tabsched.nodes import OPTIMIZER, SYNC, TRANSFER


def test_stage_holders_are_every_stages_sorted_devices():
    """The holders come from a sort, not np.unique: the same sorted devices per stage."""
    for table in (generate("chimera", devices=4, microbatches=8),
                  generate("zbv", devices=3, microbatches=5),
                  generate("1f1b", devices=1, microbatches=1)):
        pairs = np.unique(np.stack([table.stage, table.device]), axis=1)
        expected = {stage: sorted(int(d) for d in pairs[1][pairs[0] == stage])
                    for stage in range(table.num_stages)}
        assert stage_holders(table) == expected


def test_every_group_names_each_source_once_and_the_lowering_has_them_all():
    table = generate("chimera", devices=4, microbatches=8)
    lowered = lower(table, grad_sync="replicas", optimizer=True)
    first_sync, first_optimizer = lowered.nodes(SYNC).start, lowered.nodes(OPTIMIZER).start
    sync_stage, groups = sync_nodes(table, "replicas", lowered.cell_of_op, first_sync)
    np.testing.assert_array_equal(sync_stage, lowered.sync_stage)
    groups += optimizer_edges(table, lowered.cell_device, sync_stage, first_sync,
                              first_optimizer)
    sources = np.repeat(np.arange(lowered.num_nodes), np.diff(lowered.indptr))
    edges = set(zip(sources.tolist(), lowered.successors.tolist()))
    for group_sources, group_targets in groups:
        assert len(set(group_sources.tolist())) == len(group_sources)
        assert set(zip(group_sources.tolist(), group_targets.tolist())) <= edges


def test_only_transfers_hold_resources():
    table = generate("1f1b", devices=4, microbatches=8)
    lowered = lower(table, optimizer=True)
    rows = lowered.nodes(TRANSFER)
    for contention, width in (("none", 0), ("link", 1), ("nic", 3)):
        resources, count = node_resources(contention, lowered.num_nodes, rows,
                                          lowered.transfers, table.num_devices, 2)
        assert resources.shape == (lowered.num_nodes, width)
        if width:
            assert np.all(resources[lowered.nodes(TRANSFER), 0] >= 0)
            assert np.all(resources[lowered.extra_nodes] < 0)
            assert np.all(resources[:lowered.num_cells] < 0)
            assert count == 16 + (4 if contention == "nic" else 0)
