"""Execution: one frozen value, its files, its checks, and what it resolves to."""

import dataclasses
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tabsched import InvalidParameterError, ModelCosts, StageCosts, TransformerModel, UnitCosts
from tabsched.costs.system import load_system
from tabsched.execution import FIELDS, Execution, Parallelism, load_execution
from tabsched.nodes import SYNC


def model(**changes):
    """h=256, 8 heads, s=64, V=1000, 8 layers."""
    fields = dict(layers=8, hidden=256, heads=8, sequence=64, vocab=1000, dtype="fp16")
    return TransformerModel(**{**fields, **changes})


executions = st.builds(
    Execution,
    tensor_parallel=st.sampled_from([1, 2, 4, 8]),
    data_parallel=st.integers(1, 64),
    microbatch_size=st.none() | st.integers(1, 8),
    recompute=st.sampled_from([None, "none", "selective", "full"]),
    zero_stage=st.sampled_from([0, 1]),
    attention=st.sampled_from(["eager", "flash"]),
    scatter_gather=st.booleans(),
    contention=st.sampled_from([None, "none", "link", "nic"]),
    devices_per_node=st.none() | st.sampled_from([1, 4, 8, 72]),
    blocking_sends=st.none() | st.booleans(),
    overlap_grad_reduce=st.booleans(),
    grad_sync=st.none() | st.sampled_from(["replicas", "all"])
    | st.lists(st.integers(0, 63), max_size=5).map(tuple),
    optimizer_step=st.none() | st.booleans(),
)


@given(executions)
def test_an_execution_round_trips_through_toml_json_and_dicts(tmp_path_factory, run):
    folder = tmp_path_factory.mktemp("runs")
    for name in ("run.toml", "run.json"):
        path = folder / name
        run.write(path)
        assert load_execution(path) == run
    assert Execution.from_dict(json.loads(run.to_json())) == run
    assert Execution.from_dict(run.to_dict()) == run
    assert hash(Execution.from_dict(run.to_dict())) == hash(run)


def test_a_file_names_only_what_it_changes(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('tensor_parallel = 8\nsequence_parallel = true\nglobal_batch = 512\n'
                    'microbatch_size = 1\ndata_parallel = 4\ngrad_sync = [0, 3]\n')
    run = load_execution(path)
    assert run == Execution(tensor_parallel=8, sequence_parallel=True, global_batch=512,
                            microbatch_size=1, data_parallel=4, grad_sync=(3, 0))
    assert run.microbatches == 128 and run.grad_sync == (0, 3)
    assert run.to_toml().count("\n") == len([v for v in run.to_dict().values()
                                             if v is not None])


def test_frozen_fields_raise_and_replace_checks_again():
    run = Execution(tensor_parallel=2)
    with pytest.raises(dataclasses.FrozenInstanceError, match="tensor_parallel"):
        run.tensor_parallel = 4
    assert run.replace(tensor_parallel=4).tensor_parallel == 4
    with pytest.raises(InvalidParameterError, match="tensor_parallel must be an integer >= 1"):
        run.replace(tensor_parallel=0)
    with pytest.raises(InvalidParameterError, match="Execution has no field 'tensor_paralel' "
                                                    r"\(did you mean 'tensor_parallel'\?\)"):
        run.replace(tensor_paralel=4)


@pytest.mark.parametrize("fields, message", [
    (dict(tensor_parallel=0), r"tensor_parallel must be an integer >= 1, not 0"),
    (dict(data_parallel=True), r"data_parallel must be an integer >= 1, not True"),
    (dict(data_parallel=2**21), r"data_parallel must be an integer from 1 to 1048576"),
    (dict(context_parallel=2.0), r"context_parallel must be an integer >= 1, not 2.0"),
    (dict(sequence_parallel="yes"), r"sequence_parallel must be true or false, not 'yes'"),
    (dict(sequence_parallel=True), r"sequence_parallel needs tensor_parallel > 1"),
    (dict(microbatch_size=0), r"microbatch_size must be a positive integer, not 0"),
    (dict(recompute="some"), r"recompute 'some' is not one of none, selective, full"),
    (dict(zero_stage=4), r"zero_stage 4 is not a ZeRO stage: 0 .*, 1 .*, 2 .* or 3 .*FSDP"),
    (dict(zero_stage=3), r"zero_stage 3 with data_parallel 1 shards nothing"),
    (dict(zero_stage=2, data_parallel=1), r"zero_stage 2 with data_parallel 1 shards"),
    (dict(zero_stage=True), r"zero_stage must be 0, 1, 2 or 3, not True"),
    (dict(zero_stage=3, data_parallel=2, prefetch=-1),
     r"prefetch must be an integer >= 0, not -1"),
    (dict(zero_stage=3, data_parallel=2, reshard_after_forward="no"),
     r"reshard_after_forward must be true or false, not 'no'"),
    (dict(attention="xformers"), r"attention 'xformers' is not one of eager, flash"),
    (dict(contention="bus"), r"contention 'bus' is not one of none, link, nic"),
    (dict(devices_per_node=0), r"devices_per_node must be a positive integer, not 0"),
    (dict(grad_sync="some"), r"grad_sync 'some' is not one of replicas, all"),
    (dict(grad_sync=[1, -1]), r"grad_sync\[1\] must be an integer >= 0, not -1"),
    (dict(grad_sync=3), r"grad_sync must be None, 'replicas', 'all' or a list of stages"),
    (dict(global_batch=100, data_parallel=8, microbatch_size=2),
     r"global_batch 100 is not divisible by data_parallel 8 x microbatch_size 2 = 16"),
])
def test_bad_fields_are_one_line_naming_the_field(fields, message):
    with pytest.raises(InvalidParameterError, match=message):
        Execution(**fields)


@pytest.mark.parametrize("text, suffix, message", [
    ("tensor_paralel = 2\n", ".toml",
     r"run.toml: unknown key 'tensor_paralel' \(did you mean 'tensor_parallel'\?\)"),
    ('tensor_parallel = "8"\n', ".toml", r"run.toml: tensor_parallel must be an integer >= 1, "
                                         r"not '8'"),
    ("tensor_parallel = \n", ".toml", r"run.toml: not valid TOML"),
    ('{"data_parallel": 0}', ".json", r"run.json: data_parallel must be an integer >= 1"),
    ('[1, 2]', ".json", r"run.json: an execution is a table of keys, not \[1, 2\]"),
    ('{"a": ', ".json", r"run.json: not valid JSON"),
    ("a = " + "[" * 40 + "]" * 40, ".toml", r"run.toml: not an execution file: arrays or "
                                           r"inline tables nested more than 16 deep"),
    ("x" * (2**20 + 10), ".toml", r"run.toml: larger than 1 MiB; an execution file"),
    ("\xff".encode("latin-1"), ".json", r"run.json: byte 0 is not UTF-8 text"),
])
def test_bad_files_are_one_line_naming_the_file_and_key(tmp_path, text, suffix, message):
    path = tmp_path / f"run{suffix}"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    with pytest.raises(InvalidParameterError, match=message) as error:
        load_execution(path)
    assert "\n" not in str(error.value) and len(str(error.value)) < 400


@pytest.mark.parametrize("fields, system, message", [
    (dict(tensor_parallel=3), None, r"tensor_parallel 3 does not divide hidden 256"),
    (dict(tensor_parallel=16), None, r"tensor_parallel 16 does not divide heads 8"),
    (dict(tensor_parallel=4, sequence_parallel=True, context_parallel=1), None, None),
    (dict(context_parallel=3, attention="flash"), None,
     r"context_parallel 3: sequence 64 of model .* is not a multiple of 2 x 3"),
    (dict(context_parallel=2), None, r"context_parallel 2 needs attention 'flash'"),
    (dict(data_parallel=3, global_batch=12), None,
     r"global_batch 12 is not divisible by data_parallel 3 x microbatch_size 8 = 24"),
    (dict(tensor_parallel=8), "dgx-a100", None),
    (dict(tensor_parallel=8, devices_per_node=4), "dgx-a100", None),   # two whole nodes
    (dict(tensor_parallel=8, devices_per_node=3), "dgx-a100",
     r"tensor_parallel 8 is larger than a node of system dgx-a100 \(3 devices\) but does not "
     r"fill whole nodes"),
    (dict(tensor_parallel=2, data_parallel=3), "dgx-a100",
     r"the 6 devices of a pipeline rank .* neither divide nor fill the 8-device nodes"),
    (dict(tensor_parallel=2, data_parallel=8), "dgx-a100", None),
    (dict(tensor_parallel=2, context_parallel=3, data_parallel=4, attention="flash"),
     "dgx-a100", r"the 6 devices of tensor x context parallel neither divide nor fill the "
                 r"8-device"),
])
def test_check_refuses_degrees_that_do_not_divide_what_they_split(fields, system, message):
    run = Execution(**fields)
    subject = model(microbatch_size=8, sequence=64 * 3 if fields.get("context_parallel") == 3
                    and "data_parallel" in fields else 64)
    system = None if system is None else load_system(system)
    if message is None:
        assert run.check(subject, system) is run
    else:
        with pytest.raises(InvalidParameterError, match=message):
            run.check(subject, system)


def test_resolved_fills_the_defaults_from_the_model_and_system():
    run = Execution(data_parallel=2).resolved(model(microbatch_size=4, recompute="full"),
                                              load_system("dgx-h100"))
    assert (run.microbatch_size, run.recompute, run.contention, run.devices_per_node,
            run.blocking_sends, run.optimizer_step) == (4, "full", "link", 8, False, True)
    alone = Execution().resolved()
    assert (alone.contention, alone.blocking_sends, alone.optimizer_step) == ("none", False,
                                                                             False)
    assert Execution(data_parallel=2, overlap_grad_reduce=True).default_grad_sync == "all"
    assert Execution(data_parallel=2, overlap_grad_reduce=True).needs_optimizer_step is False


def test_parallelism_is_the_older_face_of_an_execution():
    assert Parallelism(tensor_parallel=8, optimizer_sharding=True) == Execution(
        tensor_parallel=8, zero_stage=1)
    with pytest.raises(InvalidParameterError, match="optimizer_sharding must be true or false"):
        Parallelism(optimizer_sharding="yes")
    assert set(FIELDS) >= {"tensor_parallel", "context_parallel", "expert_parallel"}


def test_model_costs_take_an_execution_or_its_keywords_alike(tmp_path):
    keywords = ModelCosts("paper-128l", "dgx-h100", tensor_parallel=4, data_parallel=2,
                          microbatch_size=2, optimizer_sharding=True, contention="none")
    run = Execution(tensor_parallel=4, data_parallel=2, microbatch_size=2, zero_stage=1,
                    contention="none")
    assert ModelCosts("paper-128l", "dgx-h100", run).execution == keywords.execution
    run.write(tmp_path / "run.toml")
    from_file = ModelCosts("paper-128l", "dgx-h100", str(tmp_path / "run.toml"))
    assert from_file.execution == keywords.execution
    assert from_file.describe() == keywords.describe()
    # keywords change the execution they are given with
    assert ModelCosts("paper-128l", "dgx-h100", run, tensor_parallel=8).execution \
        .tensor_parallel == 8
    with pytest.raises(InvalidParameterError, match="give execution or parallel, not both"):
        ModelCosts("paper-128l", "dgx-h100", run, parallel=run)
    with pytest.raises(InvalidParameterError, match="expert_parallel 2: model paper-128l has "
                                                    "no experts"):
        ModelCosts("paper-128l", "dgx-h100", Execution(expert_parallel=2))
    with pytest.raises(InvalidParameterError, match="context_parallel 2 needs attention"):
        ModelCosts("paper-128l", "dgx-h100", Execution(context_parallel=2))


def test_slot_costs_hold_the_execution_they_lower_with():
    run = Execution(contention="link", grad_sync="all", optimizer_step=True)
    costs = StageCosts(1.0, comm=0.5, execution=run)
    assert (costs.contention, costs.grad_sync, costs.optimizer_step) == ("link", "all", True)
    assert StageCosts(1.0, contention="nic", devices_per_node=2).execution == Execution(
        contention="nic", devices_per_node=2)
    assert UnitCosts(execution=run).optimizer_step
    assert UnitCosts().with_execution(run).execution == run


def test_a_global_batch_must_be_what_the_table_holds():
    from tabsched import evaluate, generate
    run = Execution(data_parallel=4, microbatch_size=2, global_batch=256)
    costs = ModelCosts("paper-128l", "dgx-h100", run)
    assert run.microbatches == 32
    assert evaluate(generate("1f1b", devices=8, microbatches=32), costs).makespan > 0
    with pytest.raises(InvalidParameterError, match=r"the table's 16 microbatches hold 32 "
                                                    r"samples per pipeline, but the "
                                                    r"execution's global_batch 256 over "
                                                    r"data_parallel 4 asks for 64"):
        evaluate(generate("1f1b", devices=8, microbatches=16), costs)


# ---------------------------------------------------------------- untrusted files
_JUNK = (st.none() | st.booleans() | st.integers(-2**70, 2**70)
         | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=30)
         | st.lists(st.integers(-3, 3) | st.text(max_size=3), max_size=4)
         | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


@given(st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=12), _JUNK, max_size=6))
def test_any_mapping_is_an_execution_or_one_line(fields):
    try:
        run = Execution.from_dict(fields, "run.json")
    except InvalidParameterError as error:
        text = str(error)
        assert text.startswith("run.json: ") and "\n" not in text and len(text) < 400, text
    else:
        assert Execution.from_dict(run.to_dict()) == run


@given(st.binary(max_size=300), st.sampled_from([".toml", ".json"]))
def test_any_bytes_are_an_execution_or_one_line(tmp_path_factory, content, suffix):
    path = tmp_path_factory.mktemp("bytes") / f"run{suffix}"
    path.write_bytes(content)
    try:
        load_execution(path)
    except InvalidParameterError as error:
        assert "\n" not in str(error) and len(str(error)) < 400, str(error)


def test_entry_points_take_the_execution_and_keywords_change_one_field():
    from tabsched import evaluate, evaluate_summaries, generate
    from tabsched.adapt import Noise, monte_carlo
    from tabsched.evaluate import evaluate_many
    table = generate("1f1b", devices=4, microbatches=8)
    run = Execution(tensor_parallel=2, data_parallel=2, contention="none")
    plain = ModelCosts("paper-128l", "dgx-h100")
    built = ModelCosts("paper-128l", "dgx-h100", run)
    by_execution = evaluate(table, plain, execution=run)
    assert by_execution.makespan == evaluate(table, built).makespan
    assert by_execution.execution == built.execution and by_execution.execution.data_parallel == 2
    assert by_execution.to_dict()["execution"]["contention"] == "none"
    # a keyword changes what the table is lowered with, and the echo says so
    linked = evaluate(table, built, contention="link", optimizer=False)
    assert (linked.execution.contention, linked.execution.optimizer_step) == ("link", False)
    assert [r.makespan for r in evaluate_many(table, [plain], execution=run)] == \
        [by_execution.makespan]
    assert [s.makespan for s in evaluate_summaries(table, [plain], execution=run)] == \
        [by_execution.makespan]
    assert monte_carlo(table, plain, Noise(0.1), samples=16, execution=run).mean == \
        monte_carlo(table, built, Noise(0.1), samples=16).mean
    unit = evaluate(table, UnitCosts(), execution=Execution(optimizer_step=True))
    assert unit.execution.optimizer_step and unit.execution.contention == "none"
    with pytest.raises(InvalidParameterError, match="execution must be an Execution, not dict"):
        evaluate(table, plain, execution={"tensor_parallel": 2})


def test_an_execution_that_names_its_syncs_wins_over_the_tables_own():
    from tabsched import evaluate, generate
    table = generate("1f1b", devices=4, microbatches=8).replace(grad_sync=(0,))
    costs = StageCosts(1.0, sync=5.0)
    assert evaluate(table, costs)._lowered.count(SYNC) == 1          # the table's own
    named = evaluate(table, costs, execution=Execution(grad_sync="all"))
    assert named._lowered.count(SYNC) == 4
    assert evaluate(table, costs, grad_sync=[1, 2])._lowered.count(SYNC) == 2


def test_the_node_bound_is_the_systems():
    from tabsched.costs.system import MAX_DEVICES_PER_NODE
    from tabsched.execution import MAX_NODE
    assert MAX_NODE == MAX_DEVICES_PER_NODE
