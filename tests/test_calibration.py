"""What a predicted iteration is made of (tabsched.calibration): terms that add up."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tabsched import ModelCosts, evaluate, generate
from tabsched.calibration import TERMS, iteration_terms, part_terms

CASES = [("1f1b", 4, 8, {}), ("interleaved-1f1b", 4, 8, {"chunks": 2}), ("zb-h1", 4, 8, {}),
         ("gpipe", 2, 4, {})]


@pytest.mark.parametrize("family, devices, microbatches, params", CASES)
@pytest.mark.parametrize("options", [
    {"tensor_parallel": 8, "recompute": "full"},
    {"tensor_parallel": 4, "sequence_parallel": True, "recompute": "selective",
     "data_parallel": 2},
])
def test_the_terms_add_up_to_the_makespan(family, devices, microbatches, params, options):
    table = generate(family, devices=devices, microbatches=microbatches, **params)
    costs = ModelCosts("gpt3-175b", "dgx-a100", optimizer=True, microbatch_size=1, **options)
    result = evaluate(table, costs, formula=False)
    terms = iteration_terms(table, costs, result)
    assert list(terms) == list(TERMS)
    assert sum(terms.values()) == pytest.approx(result.makespan, rel=1e-12)
    for term in ("matrix", "vector", "launch", "tensor_comm", "optimizer", "pipeline_comm"):
        assert terms[term] >= 0, term
    assert terms["bubble"] >= -1e-9 * result.makespan
    assert abs(terms["other"]) <= 1e-9 * result.makespan   # every second has a kernel
    assert terms["host"] == 0.0
    assert (terms["recompute"] > 0) == (options["recompute"] != "none")


def test_one_device_has_no_bubble_and_no_pipeline():
    table = generate("1f1b", devices=1, microbatches=4)
    costs = ModelCosts("megatron-22b", "dgx-a100", tensor_parallel=8, microbatch_size=4,
                       optimizer=True)
    terms = iteration_terms(table, costs)
    assert terms["pipeline_comm"] == 0.0 and abs(terms["bubble"]) < 1e-12
    assert terms["tensor_comm"] > 0 and terms["optimizer"] > 0


@settings(max_examples=10, deadline=None)
@given(samples=st.sampled_from([1.0, 2.0, 4.0]), slowdown=st.floats(0, 1))
def test_a_layer_s_terms_are_its_priced_times(samples, slowdown):
    from tabsched import load_system
    system = load_system("dgx-a100").replace(overlap_slowdown=slowdown)
    costs = ModelCosts("megatron-22b", system, tensor_parallel=8, recompute="selective")
    times = costs.part_times(np.array([samples]))
    for part in ("layer", "embedding", "output"):
        terms = part_terms(costs, part, samples)
        for kind in range(4):
            assert sum(terms[kind].values()) == pytest.approx(times[part][kind, 0], rel=1e-12)


def test_the_forward_s_collectives_are_exposed_and_the_backward_s_hide():
    from tabsched import load_system
    free = load_system("dgx-a100").replace(overlap_slowdown=0.0)
    costs = ModelCosts("megatron-22b", free, tensor_parallel=8, microbatch_size=4)
    terms = part_terms(costs, "layer", 4.0)
    assert terms[3]["tensor_comm"] == 0.0                  # W: no collective of its own
    assert terms[0]["tensor_comm"] > terms[1]["tensor_comm"]   # F's are exposed
