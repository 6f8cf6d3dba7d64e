import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tabsched import InvalidParameterError, ScheduleTable, generate
from tabsched._testing import random_table
from tabsched.deadlock import reverse_edges
from tabsched.lower import lower
from tabsched.nodes import OPTIMIZER, SYNC, TRANSFER


def edges(lowered):
    sources = np.repeat(np.arange(lowered.num_nodes), np.diff(lowered.indptr))
    return set(zip(sources.tolist(), lowered.successors.tolist()))


def test_one_f_one_b_structure():
    p, m = 4, 8
    lowered = lower(generate("1f1b", devices=p, microbatches=m))
    ops = 2 * p * m
    assert lowered.num_cells == ops
    # an activation and a gradient crosses every device boundary for every microbatch
    assert len(lowered.transfers) == 2 * (p - 1) * m
    assert lowered.num_nodes == ops + 2 * (p - 1) * m
    row_edges = ops - p
    same_device_f_to_b = p * m
    assert lowered.num_edges == row_edges + same_device_f_to_b + 2 * len(lowered.transfers)
    t = lowered.transfers
    forward = ~t.gradient
    assert np.all(t.dst[forward] == t.src[forward] + 1)
    assert np.all(t.dst[~forward] == t.src[~forward] - 1)
    assert lowered.resources.shape == (lowered.num_nodes, 0)


def test_dependencies_follow_the_design():
    table = ScheduleTable([["0F0", None, None, "0I0", "0W0"], [None, "1F0", "1B0", None, None]])
    lowered = lower(table)
    cell = {str(table.op(k)): int(lowered.cell_of_op[k]) for k in range(len(table))}
    graph = edges(lowered)
    transfer_of = {(int(p), int(c)): lowered.num_cells + k for k, (p, c)
                   in enumerate(zip(lowered.transfers.producer, lowered.transfers.consumer))}
    op_index = {str(table.op(k)): k for k in range(len(table))}
    f_transfer = transfer_of[op_index["0F0"], op_index["1F0"]]
    b_transfer = transfer_of[op_index["1B0"], op_index["0I0"]]
    assert (cell["0F0"], f_transfer) in graph and (f_transfer, cell["1F0"]) in graph
    assert (cell["1B0"], b_transfer) in graph and (b_transfer, cell["0I0"]) in graph
    assert (cell["0F0"], cell["0I0"]) in graph      # I needs its own forward
    assert (cell["0I0"], cell["0W0"]) in graph      # W needs I
    assert (cell["1F0"], cell["1B0"]) in graph      # last stage: only its forward
    assert lowered.transfers.gradient.tolist() == [False, True]


def test_overlap_cell_is_one_node_with_union_of_dependencies():
    table = ScheduleTable([["0F0", "0F1", "(0F2;0B0)OVERLAP_F_B", "0B1", "0B2"]])
    lowered = lower(table)
    assert lowered.num_cells == 5
    assert len(set(lowered.cell_of_op.tolist())) == 5


def test_link_and_nic_resources():
    table = generate("1f1b", devices=4, microbatches=2)
    link = lower(table, contention="link")
    t = link.transfers
    assert link.num_resources == 16
    assert np.all(link.resources[:link.num_cells] == -1)
    np.testing.assert_array_equal(link.resources[link.num_cells:, 0], t.src * 4 + t.dst)
    nic = lower(table, contention="nic", devices_per_node=2)
    assert nic.num_resources == 16 + 2 + 2
    crossing = (t.src // 2) != (t.dst // 2)
    ports = nic.resources[nic.num_cells:]
    assert np.all(ports[crossing, 1] == 16 + t.src[crossing] // 2)
    assert np.all(ports[crossing, 2] == 18 + t.dst[crossing] // 2)
    assert np.all(ports[~crossing, 1:] == -1)


def test_blocking_sends_hold_the_sender():
    table = generate("gpipe", devices=2, microbatches=2)
    lowered = lower(table, blocking_sends=True)
    graph = edges(lowered)
    for k, producer in enumerate(lowered.transfers.producer):
        cell = int(lowered.cell_of_op[producer])
        if cell + 1 < lowered.num_cells and lowered.cell_device[cell + 1] == table.device[producer]:
            assert (lowered.num_cells + k, cell + 1) in graph


def test_bad_options():
    table = generate("gpipe", devices=2, microbatches=2)
    with pytest.raises(InvalidParameterError, match="contention 'bus' is not one of none, link, nic"):
        lower(table, contention="bus")
    with pytest.raises(InvalidParameterError, match="needs devices_per_node"):
        lower(table, contention="nic")


@pytest.mark.parametrize("seed", range(25))
def test_csr_is_well_formed(seed):
    lowered = lower(random_table(seed))
    assert lowered.indptr[0] == 0 and lowered.indptr[-1] == lowered.num_edges
    assert np.all(np.diff(lowered.indptr) >= 0)
    assert lowered.successors.dtype == np.int32
    assert np.all((lowered.successors >= 0) & (lowered.successors < lowered.num_nodes))
    pred_indptr, predecessors = reverse_edges(lowered)
    sources = np.repeat(np.arange(lowered.num_nodes), np.diff(lowered.indptr))
    assert sorted(zip(sources.tolist(), lowered.successors.tolist())) == sorted(
        zip(predecessors.tolist(), np.repeat(np.arange(lowered.num_nodes),
                                             np.diff(pred_indptr)).tolist()))


def test_tail_nodes_follow_the_last_backwards():
    # stage 0 lives on both devices: microbatch 0 on device 0, microbatch 1 on device 1
    table = ScheduleTable([["0F0", "0B0", None, None], [None, None, "0F1", "0B1"]])
    lowered = lower(table, grad_sync="replicas", optimizer=True)
    assert lowered.sync_stage.tolist() == [0]
    assert lowered.num_nodes == lowered.num_cells + len(lowered.transfers) + 1 + 2
    sync = lowered.nodes(SYNC).start
    opt = lowered.nodes(OPTIMIZER).start
    graph = edges(lowered)
    cell = {str(table.op(k)): int(lowered.cell_of_op[k]) for k in range(len(table))}
    assert (cell["0B0"], sync) in graph and (cell["0B1"], sync) in graph
    assert (sync, opt) in graph and (sync, opt + 1) in graph
    assert (cell["0B0"], opt) in graph and (cell["0B1"], opt + 1) in graph
    assert lowered.describe_node(sync) == "grad sync stage 0"
    assert lowered.describe_node(opt + 1) == "optimizer d1"
    assert lowered.sync_devices(0) == (0, 1)


def test_grad_sync_choices():
    table = generate("1f1b", devices=3, microbatches=2)
    assert lower(table, grad_sync="replicas").count(SYNC) == 0
    assert lower(table, grad_sync="all").sync_stage.tolist() == [0, 1, 2]
    assert lower(table, grad_sync=[2]).sync_stage.tolist() == [2]
    with pytest.raises(InvalidParameterError, match="grad_sync: stage 5 is out of range"):
        lower(table, grad_sync=[5])
    with pytest.raises(InvalidParameterError, match="grad_sync must be None, 'replicas'"):
        lower(table, grad_sync="some")


def test_sync_waits_for_weight_grads():
    table = ScheduleTable([["0F0", "0I0", "0W0"]])
    lowered = lower(table, grad_sync="all")
    cell = {str(table.op(k)): int(lowered.cell_of_op[k]) for k in range(len(table))}
    assert (cell["0W0"], lowered.nodes(SYNC).start) in edges(lowered)
    assert (cell["0I0"], lowered.nodes(SYNC).start) not in edges(lowered)


@pytest.mark.parametrize("contention", ["link", "nic"])
def test_tail_nodes_hold_no_link_or_port(contention):
    table = generate("1f1b", devices=4, microbatches=2)
    lowered = lower(table, contention=contention, devices_per_node=2, grad_sync="all",
                    optimizer=True)
    assert lowered.resources.shape[0] == lowered.num_nodes
    assert np.all(lowered.resources[lowered.extra_nodes] < 0)
    assert np.all(lowered.resources[lowered.nodes(TRANSFER), 0] >= 0)


def test_transfer_after_adds_edges_into_transfer_nodes():
    table = generate("1f1b", devices=2, microbatches=2)
    index = {str(table.op(k)): k for k in range(len(table))}
    plain = lower(table)
    node = {str(table.op(int(p))): plain.num_cells + k
            for k, p in enumerate(plain.transfers.producer)}
    cell = {name: int(plain.cell_of_op[k]) for name, k in index.items()}
    extra = lower(table, transfer_after=(
        [index["0F1"], index["1B1"], index["0F1"]],
        [index["1B0"], index["1B0"], -1 - index["0F0"]]))
    assert edges(extra) - edges(plain) == {(cell["1B0"], node["0F1"]), (cell["1B0"], node["1B1"]),
                                           (node["0F0"], node["0F1"])}
    assert edges(plain) <= edges(extra)


def test_transfer_after_cycle_names_its_nodes():
    from tabsched import DeadlockError
    table = generate("1f1b", devices=2, microbatches=1)
    index = {str(table.op(k)): k for k in range(len(table))}
    lowered = lower(table, transfer_after=([index["0F0"]], [index["1F0"]]))
    with pytest.raises(DeadlockError, match=r"1F0 \(device 1, slot 1\)") as error:
        lowered.run(np.ones(lowered.num_nodes))
    assert lowered.num_cells in error.value.nodes   # the transfer 0F0 -> 1F0 is on the cycle


@pytest.mark.parametrize("transfer_after,message", [
    ("x", r"transfer_after must be a pair of integer arrays \(producer, after\)"),
    (([1], [2, 3]), r"transfer_after: 1 producers but 2 predecessors"),
    (([99], [0]), r"transfer_after\[0\]: \(99, 0\) names an operation the table does not have"),
    (([0], [-100]), r"transfer_after\[0\]: \(0, -100\) names an operation"),
    (([2], [0]), r"transfer_after\[0\]: operation 2 sends nothing to another device"),
    (([0], [-3]), r"transfer_after\[0\]: operation 2 sends nothing to another device"),
])
def test_transfer_after_errors(transfer_after, message):
    table = generate("1f1b", devices=2, microbatches=1)   # ops: 0F0 0B0 | 1F0 1B0
    assert str(table.op(2)) == "1F0"
    with pytest.raises(InvalidParameterError, match=message):
        lower(table, transfer_after=transfer_after)


def test_tables_beyond_int32_ids_are_refused(monkeypatch):
    import importlib
    monkeypatch.setattr(importlib.import_module("tabsched.lower"), "MAX_IDS", 20)
    with pytest.raises(InvalidParameterError, match=r"the lowered table has 24 nodes and 38 "
                                                    r"edges; the kernel's int32 ids hold at "
                                                    r"most 20"):
        lower(generate("1f1b", devices=2, microbatches=4))


def laid_out_now(family, **params):
    """``generate(family, **params)`` with its layout made at once (``lay_out``), which
    offers its lowering to the table's next ``lower()``; a generator's own layout is
    made when its slots are first read, and offers none."""
    from tabsched.layout import lay_out
    lazy = generate(family, **params)
    assert not lazy.laid_out and lazy._lowering is None
    return lay_out(lazy._order)


@pytest.mark.parametrize("family", ["1f1b", "zbv", "chimera", "dualpipe"])
@pytest.mark.parametrize("contention, grad_sync", [("none", None), ("link", "replicas"),
                                                   ("nic", None), ("link", [])])
def test_a_generated_tables_lowering_is_reused_only_where_it_is_the_same(family, contention,
                                                                       grad_sync):
    """The layout's lowering serves the next lower() of its table whatever the
    contention, when no sync node is added; it equals a lowering made afresh. It
    travels on the table (no module-level slot): another table's layout leaves it."""
    offered = laid_out_now(family, devices=4, microbatches=8)   # the layout offers its own
    made = laid_out_now(family, devices=4, microbatches=8)
    pending = offered._lowering
    assert pending is not None and pending.table is None    # no cycle back to the table
    made._lowering = None                                   # lowered afresh below
    options = dict(contention=contention, devices_per_node=2, grad_sync=grad_sync)
    fresh, reused = lower(made, **options), lower(offered, **options)
    adds_syncs = grad_sync == "replicas" and family in ("chimera", "dualpipe")
    assert (reused.indptr is pending.indptr) is not adds_syncs
    # the layout's one run took the push pass: no layout made, none copied
    assert not pending.laid_out and not reused.laid_out
    assert (offered._lowering is None) is not adds_syncs     # taken once
    for name in ("cell_of_op", "cell_device", "indptr", "successors", "resources",
                 "sync_stage", "topo_order", "topo_pred_indptr", "topo_predecessors"):
        assert np.array_equal(getattr(fresh, name), getattr(reused, name)), name
    assert (fresh.num_resources, fresh.contention) == (reused.num_resources,
                                                      reused.contention)
    assert reused.table is offered and reused.transfers.table is offered


def test_a_tables_offered_lowering_is_not_compared_copied_or_pickled():
    import copy
    import pickle
    table = laid_out_now("1f1b", devices=4, microbatches=8)
    assert table._lowering is not None
    for other in (copy.copy(table), copy.deepcopy(table), pickle.loads(pickle.dumps(table)),
                  table.replace(family="mine")):
        assert other._lowering is None
        assert lower(other).num_nodes == lower(table).num_nodes
    assert table == copy.copy(table)


def test_sync_devices_are_the_stages_holders():
    table = generate("chimera", devices=6, microbatches=12)
    lowered = lower(table, grad_sync="all")
    for k, stage in enumerate(lowered.sync_stage.tolist()):
        expected = tuple(sorted(set(table.device[table.stage == stage].tolist())))
        assert lowered.sync_devices(k) == expected


@settings(max_examples=40, deadline=None)
@given(family=st.sampled_from(["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zbv",
                               "dualpipev", "chimera", "hanayo"]),
       devices=st.sampled_from([2, 4, 6, 8]), microbatches=st.integers(1, 16))
def test_the_plain_lowering_written_at_once_is_the_edge_lists_csr(family, devices,
                                                                   microbatches):
    """A plain lowering's CSR comes from ``_build.plain_csr``; with an (empty) extra edge
    group the lowering goes through the edge lists and ``csr`` as before. The DAGs are
    the same, every node's successors in the same order, and so are the runs."""
    from tabsched import UnitCosts
    try:
        table = generate(family, devices=devices, microbatches=microbatches)
    except InvalidParameterError:
        assume(False)
    nothing = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    plain, listed = lower(table), lower(table, transfer_after=nothing)
    for name in ("kind_bounds", "cell_of_op", "cell_device", "indptr", "successors"):
        assert np.array_equal(getattr(plain, name), getattr(listed, name)), name
    durations = UnitCosts(f=1, b=2).node_durations(plain)
    mine, theirs = plain.run(durations), listed.run(durations)
    for a, b in zip(mine, theirs):
        assert np.array_equal(a, b)
