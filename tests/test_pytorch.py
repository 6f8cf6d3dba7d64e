"""PyTorch interop without torch: the committed files in tests/data/pytorch carry the coverage."""

import pathlib

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from tabsched import (DeadlockError, InvalidParameterError, InvalidScheduleError, Op, Overlap,
                      ScheduleTable, StageCosts, UnitCosts, evaluate, generate, lower)
from tabsched._testing import random_table
from tabsched.pytorch import (describe_stage_map, from_pytorch_csv, pytorch_refusal,
                              read_pytorch, stage_map, to_compute_comms, to_compute_only,
                              torch_stage_to_device, write_pytorch)
from tabsched.schedules import families

DATA = pathlib.Path(__file__).resolve().parent / "data" / "pytorch"
#: Every action one step, as PyTorch's grids (and _simulate_comms_compute) count them;
#: tabsched's default slot lengths make a full backward two (I + W = B).
GRID = UnitCosts(1, 1, 1, 1)


def csv_text(*rows):
    return "".join(row + "\r\n" for row in rows)


# ------------------------------------------------------------------ tokens
def test_current_tokens_and_overlap_cells():
    table = from_pytorch_csv(csv_text("0F0,0F1,(0F2;0B0)OVERLAP_F_B,0I1,0W1,0B2")).table
    assert table.rows[0] == [Op("F", 0, 0), Op("F", 0, 1), Overlap((Op("F", 0, 2), Op("B", 0, 0))),
                             Op("I", 0, 1), Op("W", 0, 1), Op("B", 0, 2)]


def test_legacy_tokens_need_the_option():
    legacy = csv_text("0F0,0F1,0B0,0W0,0BW1")
    schedule = from_pytorch_csv(legacy, legacy=True)
    assert [str(op) for op in schedule.table.orders()[0]] == ["0F0", "0F1", "0I0", "0W0", "0B1"]
    assert "legacy tokens" in schedule.notes[0]
    with pytest.raises(InvalidScheduleError, match=r'slot 4: "0BW1" is a full backward in '
                                                   r"PyTorch's legacy tokens; read the file "
                                                   r"with legacy=True"):
        from_pytorch_csv(legacy)
    with pytest.raises(InvalidScheduleError, match=r'slot 2: "0I0": PyTorch\'s legacy tokens '
                                                   r"have no I"):
        from_pytorch_csv(csv_text("0F0,0F1,0I0,0W0,0B1"), legacy=True)


def test_legacy_file_read_with_current_tokens_gets_a_hint():
    with pytest.raises(InvalidScheduleError, match=r"splits a backward .*may be PyTorch's legacy "
                                                   r"tokens, B = input-grad"):
        from_pytorch_csv(csv_text("0F0,0B0,0W0"))


# ------------------------------------------------------------ FSDP and grad sync
def test_unshard_reshard_are_read_as_windows_with_a_note():
    schedule = from_pytorch_csv(csv_text("0UNSHARD,0F0,0B0,0RESHARD"))
    assert schedule.table.orders() == [[Op("F", 0, 0), Op("B", 0, 0)]]
    assert schedule.notes == ["read 1 UNSHARD and 1 RESHARD cells as FSDP's parameter "
                              "windows: all-gathers priced under zero_stage 3, free otherwise"]
    assert [column.tolist() for column in schedule.shard_windows] == [[0], [-1], [0], [1]]
    assert schedule.evaluate().notes == schedule.notes


def test_windows_that_hold_no_operation_leave_every_operation_ungathered():
    # every window closes before the stage computes: no window at all (this raised
    # a bare ValueError from unpacking no windows)
    with pytest.raises(InvalidScheduleError, match=r"^<csv>: device 0, slot 2: 0F0 runs while "
                                                   r"stage 0's parameters are not gathered"):
        from_pytorch_csv(csv_text("0UNSHARD,0RESHARD,0F0,0B0"))


def test_reduce_grad_becomes_the_stage_gradient_sync():
    schedule = read_pytorch(DATA / "gpipe_pp4_m4.csv")
    assert schedule.table.grad_sync == (0, 1, 2, 3)
    # every stage syncs after its last backward; stage 0's ends last, at 14
    assert schedule.evaluate(GRID).makespan == 14
    assert schedule.evaluate(UnitCosts(1, 1, 1, 1, sync=1)).makespan == 15
    assert evaluate(schedule.table, UnitCosts(1, 1, 1, 1, sync=1), grad_sync=[]).makespan == 14


def test_reduce_grad_after_other_cells_is_noted():
    prompt = from_pytorch_csv(csv_text("0F0,1F0,1B0,1REDUCE_GRAD,0B0,0REDUCE_GRAD"))
    assert prompt.table.grad_sync == (0, 1) and prompt.notes == []
    late = from_pytorch_csv(csv_text("0F0,1F0,1B0,0B0,1REDUCE_GRAD"))
    assert late.table.grad_sync == (1,)
    assert late.notes == ["the gradient sync starts at the end of the stage's last backward "
                          "even where REDUCE_GRAD comes later: 1REDUCE_GRAD on device 0 comes "
                          "1 compute cell after 1B0"]


@pytest.mark.parametrize("row,message", [
    ("0F0,0B0,1REDUCE_GRAD", r"slot 2: 1REDUCE_GRAD: stage 1 does not run on device 0 \(it "
                             r"runs stage 0\)"),
    ("0F0,0F1,0B0,0REDUCE_GRAD,0B1", r"slot 3: 0REDUCE_GRAD comes before 0B1 \(slot 4\), a "
                                     r"backward of stage 0; PyTorch would reduce gradients"),
    ("0F0,0B0,0REDUCE_GRAD,0REDUCE_GRAD", r"slot 3: 0REDUCE_GRAD appears twice \(also at slot 2\)"),
    ("0F0,0B0,0REDUCE_GRAD1", r'slot 2: "0REDUCE_GRAD1": REDUCE_GRAD takes no microbatch'),
    ("0UNSHARD2,0F0,0B0", r'slot 0: "0UNSHARD2": UNSHARD takes no microbatch'),
    ("3UNSHARD,0F0,0B0", r"slot 0: 3UNSHARD: stage 3 does not run on device 0"),
    ("0F,0B0", r'slot 0: "0F" has no microbatch \(expected e.g. 0F0\)'),
])
def test_non_compute_cell_errors(row, message):
    with pytest.raises(InvalidScheduleError, match=r"^<csv>: device 0, " + message):
        from_pytorch_csv(csv_text(row))


# ------------------------------------------------------------------ malformed
@pytest.mark.parametrize("content,message", [
    (b"0F0,0X0\r\n", r'device 0, slot 1: "0X0" is not an operation \(expected '),
    (b"0F0,(0F1;0B0,0B1\r\n", r'device 0, slot 1: "\(0F1;0B0" has no closing parenthesis'),
    (b"0F0,(0F1;0B0)OVERLAP,0B1\r\n", r'device 0, slot 1: "\(0F1;0B0\)OVERLAP" is not an '
                                      r'operation: a compound cell must end in OVERLAP_F_B, '
                                      r'not "OVERLAP"'),
    (b"0F0,(0F1;0SEND_F0)OVERLAP_F_B\r\n", r'device 0, slot 1: .*"0SEND_F0" is not a compute '
                                           r'operation'),
    (b"0F0,(0F1;0W0)OVERLAP_F_B,0B1\r\n", r"device 0, slot 1: .*an overlapped cell holds one "
                                          r"forward and one backward"),
    (b"", r"the file is empty; expected one row per device"),
    (b"0F0,0B0\r\n0F\x000\r\n", r"line 2 contains a NUL byte"),
    (b"0F0,0B0\r\n,,,\r\n", r"device 1 \(line 2\) has no operations"),
    (b"0F0,0B0\r\n1UNSHARD,,1RESHARD\r\n", r"device 1 \(line 2\) has no compute operations"),
    (b"\xff0F0\r\n", r"byte 0 is not UTF-8 text"),
    (b"0F0," + b"x" * 200_000 + b"\r\n", r"line 1: not valid CSV: field larger than field "
                                         r"limit"),
])
def test_malformed_files(tmp_path, content, message):
    path = tmp_path / "x.csv"
    path.write_bytes(content)
    with pytest.raises(InvalidScheduleError, match=r"x\.csv: " + message):
        read_pytorch(path)


def test_pytorch_single_stage_1f1b_is_refused_at_its_first_bad_cell():
    # PyTorch 2.13's Schedule1F1B: the last rank runs 3F1..3F4 and 3B0..3B3.
    with pytest.raises(InvalidScheduleError, match=r"schedule_1f1b_pp4_m4\.csv: device 3, "
                                                   r"slot 1: 3B0 has no forward \(3F0\)$"):
        read_pytorch(DATA / "schedule_1f1b_pp4_m4.csv")


def test_bad_options():
    with pytest.raises(InvalidParameterError, match=r"format 'dot' is not one of compute_only"):
        from_pytorch_csv("0F0,0B0\r\n", format="dot")
    with pytest.raises(InvalidParameterError, match=r"p2p 'eager' is not one of ordered, free"):
        from_pytorch_csv("0F0,0B0\r\n", p2p="eager")


# --------------------------------------------------------------- compute_comms
PAIRED = csv_text("0F0,0SEND_F0,0F1,0RECV_B0,0SEND_F1,0B0,0RECV_B1,0B1",
                  "1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1")


def test_comm_positions_shape_the_transfers():
    # F = B = 1, every transfer 0.5. Device 1 posts 1RECV_F1 only after 1B0 (ends at
    # 3.5), and between the two devices 0F1's transfer queues behind 1B0's (3.5 .. 4):
    #   0F0 0-1, t(0F0) 1-1.5, 1F0 1.5-2.5, 1B0 2.5-3.5, t(1B0) 3.5-4, 0B0 4-5,
    #   t(0F1) 4-4.5, 1F1 4.5-5.5, 1B1 5.5-6.5, t(1B1) 6.5-7, 0B1 7-8.
    costs = StageCosts(1.0, 1.0, comm=0.5)
    assert from_pytorch_csv(PAIRED).evaluate(costs).makespan == 8.0
    # free: t(0F1) waits only for the RECV, 3.5-4; 1F1 4-5, 1B1 5-6, t 6-6.5, 0B1 6.5-7.5
    assert from_pytorch_csv(PAIRED, p2p="free").evaluate(costs).makespan == 7.5
    # the same orders without communication cells: t(0F1) 2-2.5, ... 0B1 ends at 7
    compute_only = from_pytorch_csv(csv_text("0F0,0F1,0B0,0B1", "1F0,1B0,1F1,1B1"))
    assert compute_only.evaluate(costs).makespan == 7.0


def test_comms_table_is_the_compute_laid_out_in_unit_slots():
    schedule = from_pytorch_csv(PAIRED)
    assert schedule.format == "compute_comms"
    assert [[None if cell is None else str(cell) for cell in row] for row in schedule.table.rows] \
        == [["0F0", "0F1", None, "0B0", None, "0B1"], [None, "1F0", "1B0", "1F1", "1B1", None]]
    assert "4 SEND/RECV pairs are the transfers" in schedule.notes[0]


def test_pair_order_mismatch_is_a_deadlock_naming_both_cells():
    crossed = csv_text("0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1",
                       "1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1")
    with pytest.raises(DeadlockError, match=r"^<csv>: device 0, slot 3: 0SEND_F1 and device 1, "
                                            r"slot 3: 1SEND_B0 deadlock: .* 0SEND_F1 waits for "
                                            r"1RECV_F1 \(device 1, slot 4\), listed after "
                                            r"1SEND_B0, which waits for 0RECV_B0 \(device 0, "
                                            r"slot 4\)"):
        from_pytorch_csv(crossed)
    assert from_pytorch_csv(crossed, p2p="free").evaluate(GRID).makespan == 6


def test_comm_order_that_cannot_run_names_compute_and_comm_cells():
    late_send = csv_text("0F0,0RECV_B0,0B0,0SEND_F0", "1RECV_F0,1F0,1B0,1SEND_B0")
    with pytest.raises(DeadlockError, match=r"^<csv>: deadlock: .*0SEND_F0 \(device 0, slot 3\) "
                                            r"/ 1RECV_F0 \(device 1, slot 0\) -> 1F0 \(device 1, "
                                            r"slot 1\)"):
        from_pytorch_csv(late_send, p2p="free")


@pytest.mark.parametrize("rows,message", [
    (("0F0,0RECV_B0,0B0", "1RECV_F0,1F0,1B0,1SEND_B0"),
     r"device 1, slot 0: 1RECV_F0 has no matching 0SEND_F0 on device 0 \(after 0F0, slot 0\)"),
    (("0F0,0SEND_F0,0RECV_B0,0B0", "1F0,1B0,1SEND_B0"),
     r"device 0, slot 1: 0SEND_F0 has no matching 1RECV_F0 on device 1 \(before 1F0, slot 0\)"),
    (("0F0,0SEND_F0,0B0", "1RECV_F0,1F0,1B0"),
     r"device 0, slot 2: 0B0 needs 1B0's output from device 1, but the file has no SEND/RECV"),
    (("0F0,0SEND_F0,0RECV_B0,0B0", "1F0,1RECV_F0,1B0,1SEND_B0"),
     r"device 1, slot 1: 1RECV_F0 comes after 1F0 \(slot 0\), which needs it"),
    (("0SEND_F0,0F0,0RECV_B0,0B0", "1RECV_F0,1F0,1B0,1SEND_B0"),
     r"device 0, slot 0: 0SEND_F0 comes before 0F0 \(slot 1\), whose output it sends"),
    (("0F0,0RECV_B0,0B0,1SEND_F0", "1RECV_F0,1F0,1B0,1SEND_B0"),
     r"device 0, slot 3: 1SEND_F0: stage 1 is the last stage; there is no neighbour to send to"),
    (("0F0,0SEND_F0,0RECV_B0,0B0,0SEND_F0", "1RECV_F0,1F0,1B0,1SEND_B0"),
     r"device 0, slot 4: 0SEND_F0 appears twice \(also at device 0, slot 1\)"),
    (("0F0,0SEND_F0,0RECV_B0,0B0", "1RECV_F0,1F0,1B0,1SEND_B0,0RECV_B0"),
     r"device 1, slot 4: 0RECV_B0 belongs to 0B0, which runs on device 0"),
    (("0F0,0SEND_F0,0RECV_B0,0B0,0RECV_F0", "1RECV_F0,1F0,1B0,1SEND_B0"),
     r"device 0, slot 4: 0RECV_F0: stage 0 is the first stage; there is no neighbour to receive"),
    (("0F0,0SEND_F0,0RECV_B0,0B0,5SEND_F0", "1RECV_F0,1F0,1B0,1SEND_B0"),
     r"device 0, slot 4: 5SEND_F0: stage 5 is out of range \(the table has stages 0\.\.1\)"),
    (("0F0,0SEND_F0,0RECV_B0,0B0,0SEND_F7", "1RECV_F0,1F0,1B0,1SEND_B0"),
     r"device 0, slot 4: 0SEND_F7: microbatch 7 is out of range"),
    (("0F0,1F0,1SEND_F0,0SEND_F0,1RECV_B0,1B0,0B0", "2RECV_F0,2F0,2B0,2SEND_B0"),
     r"device 0, slot 3: 0SEND_F0: 0F0 and 1F0 both run on device 0, which hands the data over"),
    (("0F0,0SEND_F0,,0RECV_B0,0B0", "1RECV_F0,1F0,1B0,1SEND_B0"),
     r"device 0, slot 2: empty cell; a compute_comms row lists actions without gaps"),
])
def test_comm_errors_name_the_cells(rows, message):
    with pytest.raises(InvalidScheduleError, match=r"^<csv>: " + message):
        from_pytorch_csv(csv_text(*rows))


def test_comm_cells_in_a_compute_only_read():
    with pytest.raises(InvalidScheduleError, match=r"device 0, slot 1: 0SEND_F0 is a "
                                                   r"communication action, which a compute_only "
                                                   r"schedule has none of"):
        from_pytorch_csv(PAIRED, format="compute_only")


# ------------------------------------------------------------------- writing
def test_refusals():
    replicas = ScheduleTable([["0F0", "0B0"], ["0F1", "0B1"]])
    assert stage_map(replicas) is None
    for writer in (to_compute_only, to_compute_comms):
        with pytest.raises(InvalidScheduleError, match=r"^PyTorch cannot express this table: "
                                                       r"stage 0 runs on devices 0 and 1 "
                                                       r"\(replicas, as in Chimera\)"):
            writer(replicas)
    halves = generate("1f1b", devices=2, microbatches=3).replace(
        microbatch_sizes=(1.0, 0.5, 0.5))
    with pytest.raises(InvalidScheduleError, match=r"microbatch 1 has size 0\.5 but microbatch "
                                                   r"0 has 1; PyTorch splits a batch into "
                                                   r"microbatches of equal size"):
        to_compute_only(halves)
    idle = ScheduleTable([["0F0", "0B0"], []])
    with pytest.raises(InvalidScheduleError, match=r"device 1 runs nothing; every PyTorch rank"):
        to_compute_comms(idle)


def test_comms_writer_refuses_orders_that_cannot_run():
    stuck = ScheduleTable([["0F0", "0B0", "0F1", "0B1"], ["1F1", "1F0", "1B0", "1B1"]])
    with pytest.raises(DeadlockError, match=r"PyTorch cannot place SEND/RECV for this table: no "
                                            r"device can take its next step \(device 0 at 0B0; "
                                            r"device 1 at 1F1\)"):
        to_compute_comms(stuck)


def test_compute_only_writer_refuses_orders_that_cannot_run():
    # PyTorch's _load_csv fails on these bytes ("Malformed compute schedule, can't
    # schedule sends/recvs"; tests/test_torch_execution.py runs it)
    stuck = ScheduleTable([["0F0", "0B0", "0F1", "0B1"], ["1F1", "1F0", "1B0", "1B1"]])
    with pytest.raises(DeadlockError, match=r"^deadlock: the row orders contradict the "
                                            r"dependencies; .*1F1 \(device 1, slot 0\)"):
        to_compute_only(stuck)


def test_write_pytorch_formats(tmp_path):
    table = generate("1f1b", devices=2, microbatches=2)
    write_pytorch(table, tmp_path / "a.csv", drop_metadata=True)
    write_pytorch(table, tmp_path / "b.csv", format="compute_comms", drop_metadata=True)
    assert (tmp_path / "a.csv").read_bytes() == to_compute_only(table, drop_metadata=True).encode()
    assert (tmp_path / "b.csv").read_bytes() == to_compute_comms(table,
                                                                 drop_metadata=True).encode()
    write_pytorch(table, tmp_path / "c.csv")             # the family label is left out
    assert (tmp_path / "c.csv").read_bytes() == (tmp_path / "a.csv").read_bytes()
    layered = generate("1f1b", devices=2, microbatches=2, stage_layers="1,3")
    for format in ("compute_only", "compute_comms"):   # the layer split does not fit
        with pytest.raises(InvalidScheduleError, match=r"d\.csv: a PyTorch CSV cannot hold the "
                                                       r"layers of each stage \(1,3"):
            write_pytorch(layered, tmp_path / "d.csv", format=format)
    assert not (tmp_path / "d.csv").exists()
    with pytest.raises(InvalidParameterError, match=r"format 'xml' is not one of"):
        write_pytorch(table, tmp_path / "c.csv", format="xml")


# Parameters for families the candidates below cannot build; add one when a new family
# needs it (the round trip then covers it).
SMALL_PARAMETERS = {"zb-auto": {"devices": 4, "microbatches": 8,
                                "costs": StageCosts(1.0, comm=0.1)},
                    "zbv-auto": {"devices": 4, "microbatches": 8,
                                 "costs": StageCosts(1.0, comm=0.1)}}
CANDIDATES = [{"devices": 4, "microbatches": 8}, {"devices": 4, "microbatches": 4},
              {"devices": 2, "microbatches": 4}, {"devices": 4, "microbatches": 16},
              {"devices": 8, "microbatches": 16}, {"devices": 4, "microbatches": 12}]
REQUIRED_EXTRAS = {"chunks": 2, "waves": 2, "pipelines": 2, "group_size": 2}


def small_instance(family):
    if family.name in SMALL_PARAMETERS:
        return generate(family.name, **SMALL_PARAMETERS[family.name])
    names = family.parameter_names()
    required = {parameter.name for parameter in family.parameters if parameter.required}
    errors = []
    for candidate in CANDIDATES:
        params = {key: value for key, value in candidate.items() if key in names}
        params.update({key: value for key, value in REQUIRED_EXTRAS.items() if key in required})
        try:
            return generate(family.name, **params)
        except (InvalidParameterError, InvalidScheduleError) as error:
            errors.append(str(error))
    pytest.fail(f"no small instance of {family.name} ({errors[-1]}); add its parameters to "
                f"SMALL_PARAMETERS in tests/test_pytorch.py")


@pytest.mark.parametrize("family", families(), ids=lambda family: family.name)
def test_every_family_round_trips_through_pytorch_csv(family, tmp_path):
    table = small_instance(family)
    refusal = pytorch_refusal(table)
    if refusal is not None:
        for writer in (to_compute_only, to_compute_comms):
            with pytest.raises(InvalidScheduleError, match=r"^PyTorch cannot express this "
                                                           r"table: "):
                writer(table)
        pytest.skip(refusal)
    text = to_compute_only(table, drop_metadata=True)
    path = tmp_path / "schedule.csv"
    write_pytorch(table, path, drop_metadata=True)
    assert path.read_bytes() == text.encode()
    back = read_pytorch(path).table
    assert back == table.replace(family=None, params={})   # CSV has no family metadata
    assert to_compute_only(back) == text

    comms = to_compute_comms(table, drop_metadata=True)
    schedule = from_pytorch_csv(comms)
    assert schedule.table.orders() == table.orders()
    assert schedule.table.grad_sync == tuple(range(table.num_stages))
    assert to_compute_comms(schedule.table) == comms
    # the communication order only adds waits
    assert schedule.evaluate().makespan >= evaluate(table).makespan


@given(seed=st.integers(0, 2**32 - 1))
def test_random_tables_round_trip_and_pytorch_lowering_never_deadlocks(seed):
    table = random_table(seed, replicate=0.0, uneven=0.0)
    assume(pytorch_refusal(table) is None)
    assert from_pytorch_csv(to_compute_only(table)).table == table.replace(family=None,
                                                                           params={})
    # PyTorch's lock-step placement lists each pair's SEND/RECV in one order on both sides
    schedule = from_pytorch_csv(to_compute_comms(table))
    assert schedule.table.orders() == table.orders()
    costs = StageCosts(np.random.default_rng(seed).uniform(0.5, 2.0, table.num_stages),
                       comm=0.3)
    assert schedule.evaluate(costs).makespan >= evaluate(table, costs).makespan - 1e-9


# ------------------------------------------------------- PyTorch's own tables
# (file, makespan under unit costs, stage map, busy time of device 0)
PYTORCH_FILES = [
    ("interleaved_1f1b_pp4_m8", 38, "loop", 32),
    ("interleaved_zb_pp4_m8", 51, "loop", 48),
    ("zbv_pp4_m8", 51, "v", 48),
    ("dualpipev_pp4_m8", 42, "v", 39),
]


@pytest.mark.parametrize("stem,makespan,style,busy", PYTORCH_FILES)
def test_pytorch_tables_read_evaluate_and_write_back(stem, makespan, style, busy):
    path = DATA / f"{stem}.csv"
    schedule = read_pytorch(path)
    table = schedule.table
    assert schedule.format == "compute_only" and schedule.notes == []
    assert (table.num_devices, table.num_stages, table.num_microbatches) == (4, 8, 8)
    assert stage_map(table) == style and describe_stage_map(table).startswith(style)
    result = schedule.evaluate(GRID)
    assert result.makespan == makespan and result.devices[0].busy == busy
    # the same bytes back, and PyTorch's own lowering to compute_comms, byte for byte
    assert to_compute_only(table) == path.read_bytes().decode()
    comms_path = DATA / f"{stem}_comms.csv"
    assert to_compute_comms(table) == comms_path.read_bytes().decode()
    comms = read_pytorch(comms_path)
    assert comms.format == "compute_comms" and comms.table.orders() == table.orders()
    assert comms.table.grad_sync == tuple(range(8))
    assert comms.evaluate(GRID).makespan == makespan   # free transfers: positions cost nothing
    assert comms.evaluate(StageCosts(1.0, 2.0, comm=1.0)).makespan >= \
        schedule.evaluate(StageCosts(1.0, 2.0, comm=1.0)).makespan


def test_small_interleaved_1f1b_makespan_by_hand():
    # PyTorch's Interleaved1F1B, 2 ranks, 4 microbatches, stages 0,2 on d0 and 1,3 on d1:
    #   d0: 0F0 0F1 2F0 2F1 . . 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 . 2B2 . 2B3 . 0B2 . 0B3
    #   d1: . 1F0 1F1 . 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 . 1B2 . 1B3
    # Unit slots, no communication, each device in row order:
    #   d0 0F0 0-1 0F1 1-2; d1 1F0 1-2 1F1 2-3; d0 2F0 2-3 2F1 3-4; d1 3F0 3-4 3B0 4-5
    #   3F1 5-6 3B1 6-7; d0 0F2 4-5 2B0 5-6 0F3 6-7 2B1 7-8; d1 1F2 7-8 1B0 8-9 1F3 9-10
    #   1B1 10-11; d0 2F2 8-9 0B0 9-10 2F3 10-11 0B1 11-12; d1 3F2 11-12 3B2 12-13
    #   3F3 13-14 3B3 14-15; d0 2B2 13-14 2B3 15-16; d1 1B2 15-16 1B3 16-17;
    #   d0 0B2 16-17 0B3 17-18.  Makespan 18 (PyTorch's own grid is 22 slots wide).
    schedule = read_pytorch(DATA / "interleaved_1f1b_pp2_m4.csv")
    assert schedule.table.num_slots == 22
    result = schedule.evaluate(GRID)
    assert result.makespan == 18
    assert result.bubble_ratio == pytest.approx(1 - 32 / 36)
    table = schedule.table
    start = {str(table.op(k)): float(result.op_start[k]) for k in range(len(table))}
    assert (start["3F0"], start["1F2"], start["3F2"], start["2B3"], start["0B3"]) == \
        (3, 7, 11, 15, 17)


def test_dualpipev_overlap_is_one_step_with_both_parts_dependencies():
    schedule = read_pytorch(DATA / "dualpipev_pp4_m8.csv")
    table = schedule.table
    overlapped = ~table.cell_starts() | np.r_[~table.cell_starts()[1:], False]
    # 25 OVERLAP_F_B cells, each one node with two operations
    assert (DATA / "dualpipev_pp4_m8.csv").read_text().count("OVERLAP_F_B") == 25
    assert overlapped.sum() == 2 * 25
    assert lower(table).num_cells == len(table) - 25
    result = schedule.evaluate(UnitCosts(1, 1, 1, 1, overlap=0.75))
    index = {str(table.op(k)): k for k in range(len(table))}
    # rank 0 runs (7F4;0B0)OVERLAP_F_B: 7F4 needs 6F4 (rank 1), 0B0 needs 1B0 (rank 1)
    f_part, b_part = index["7F4"], index["0B0"]
    assert table.device[f_part] == table.device[b_part] == 0
    assert result.op_start[f_part] == result.op_start[b_part]
    assert result.op_end[f_part] - result.op_start[f_part] == pytest.approx(2 * 0.75)
    previous = result.op_end[np.flatnonzero((table.device == 0)
                                            & (table.slot == table.slot[f_part] - 1))].max()
    assert result.op_start[f_part] == max(previous, result.op_end[index["6F4"]],
                                          result.op_end[index["1B0"]])
    assert schedule.evaluate(UnitCosts(1, 1, 1, 1, overlap=0.5)).makespan < \
        schedule.evaluate(GRID).makespan


# ------------------------------------------------------------------ stage maps
def test_stage_maps_match_pytorch_styles():
    assert torch_stage_to_device(2, 6, "v") == [0, 1, 1, 0, 0, 1]
    assert torch_stage_to_device(3, 6, "loop") == [0, 1, 2, 0, 1, 2]
    with pytest.raises(InvalidParameterError, match=r"a v stage map needs the stages \(5\) to be "
                                                    r"a multiple of the devices \(2\)"):
        torch_stage_to_device(2, 5, "v")
    with pytest.raises(InvalidParameterError, match=r"stage map 'w' is not one of loop, v"):
        torch_stage_to_device(2, 4, "w")
    one_each = generate("1f1b", devices=3, microbatches=3)
    assert stage_map(one_each) == "loop"
    assert describe_stage_map(one_each) == "loop (stage s on device s)"
    custom = ScheduleTable([["1F0", "1B0"], ["0F0", "0B0"]])
    assert stage_map(custom) is None
    assert describe_stage_map(custom).startswith("custom, neither PyTorch's loop nor v "
                                                 "(stage->device 0->1, 1->0)")
    assert describe_stage_map(ScheduleTable([["0F0", "0B0"], ["0F1", "0B1"]])) == \
        "none: stage 0 runs on devices 0 and 1 (replicas, as in Chimera); " \
        "torch.distributed.pipelining places each stage on exactly one rank"


# ------------------------------------------------- against torch itself (skipped without it)
@pytest.fixture(scope="module")
def torch_pipelining():
    """PyTorch's schedules module and a runtime factory with stand-in stages."""
    pytest.importorskip("torch")
    from unittest import mock

    from torch.distributed.pipelining import schedules
    from torch.distributed.pipelining.stage import PipelineStage

    def runtime(num_devices, num_stages, num_microbatches):
        stage = mock.create_autospec(PipelineStage, instance=True)
        stage.group_rank, stage.group_size, stage.submod = 0, num_devices, None
        stage.num_stages = num_stages
        return schedules._PipelineScheduleRuntime([stage] * max(1, num_stages // num_devices),
                                                  num_microbatches)
    return schedules, runtime


def torch_csv(rows):
    """What PyTorch's ``_dump_csv`` writes for rows of actions."""
    import csv
    import io
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer)
    for row in rows:
        writer.writerow(row)
    return buffer.getvalue()


def test_committed_files_are_what_this_torch_writes(torch_pipelining):
    import importlib.util

    import torch
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops
    if not torch.__version__.startswith("2.13."):
        pytest.skip(f"the files were written by torch 2.13, this is {torch.__version__}")
    spec = importlib.util.spec_from_file_location("generate_pytorch_data",
                                                  DATA / "generate.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    for stem, (name, ranks, microbatches, per_rank, comms) in script.SCHEDULES.items():
        rows = get_schedule_ops(name, ranks, microbatches, per_rank, with_comms=comms)
        assert torch_csv(rows) == (DATA / f"{stem}.csv").read_bytes().decode(), stem


@pytest.mark.parametrize("name,ranks,microbatches,per_rank", [
    ("Interleaved1F1B", 2, 4, 2), ("Interleaved1F1B", 4, 12, 3), ("LoopedBFS", 3, 5, 2),
    ("InterleavedZeroBubble", 4, 8, 2), ("InterleavedZeroBubble", 2, 6, 3),
    ("ZBVZeroBubble", 2, 4, 2), ("ZBVZeroBubble", 8, 16, 2),
    ("DualPipeV", 2, 4, 2), ("DualPipeV", 4, 10, 2),
])
def test_comms_writer_equals_pytorch_lowering(torch_pipelining, name, ranks, microbatches,
                                              per_rank):
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops
    compute = torch_csv(get_schedule_ops(name, ranks, microbatches, per_rank))
    comms = torch_csv(get_schedule_ops(name, ranks, microbatches, per_rank, with_comms=True))
    table = from_pytorch_csv(compute).table
    assert to_compute_only(table) == compute
    assert to_compute_comms(table) == comms
    assert from_pytorch_csv(comms).table.orders() == table.orders()


@pytest.mark.parametrize("family", families(), ids=lambda family: family.name)
def test_pytorch_runtime_loads_what_tabsched_writes(torch_pipelining, family, tmp_path):
    _, runtime = torch_pipelining
    table = small_instance(family)
    if pytorch_refusal(table) is not None:
        pytest.skip(pytorch_refusal(table))
    shape = (table.num_devices, table.num_stages, table.num_microbatches)
    compute, comms, dumped = (tmp_path / name for name in ("c.csv", "cc.csv", "d.csv"))
    write_pytorch(table, compute, drop_metadata=True)
    write_pytorch(table, comms, format="compute_comms", drop_metadata=True)
    loaded = runtime(*shape)
    loaded._load_csv(str(compute), format="compute_only")   # validates and lowers
    loaded._dump_csv(str(dumped), format="compute_comms")
    assert dumped.read_bytes() == comms.read_bytes()
    runtime(*shape)._load_csv(str(comms), format="compute_comms")


def test_tabsched_never_imports_torch():
    import subprocess
    import sys
    code = ("import sys, tabsched, tabsched.pytorch, tabsched.cli; "
            "tabsched.read_pytorch(sys.argv[1]).evaluate(); "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code, str(DATA / "dualpipev_pp4_m8_comms.csv")],
                   check=True)


@given(seed=st.integers(0, 2**32 - 1))
def test_pytorch_lowers_random_tables_as_tabsched_does(torch_pipelining, seed):
    _, runtime = torch_pipelining
    table = random_table(seed, replicate=0.0, uneven=0.0)
    assume(pytorch_refusal(table) is None)
    loaded = runtime(table.num_devices, table.num_stages, table.num_microbatches)
    actions = {device: [schedules_action(cell) for cell in row]
               for device, row in enumerate(table.rows)}
    loaded._prepare_schedule_with_comms(actions)
    assert torch_csv(loaded.pipeline_order_with_comms[device]
                     for device in range(table.num_devices)) == to_compute_comms(table)


def schedules_action(cell):
    """PyTorch's _Action for a tabsched cell (via its text, as _load_csv does)."""
    from torch.distributed.pipelining.schedules import _Action
    return None if cell is None else _Action.from_str(str(cell))
