"""adapt's references: every family at the start's shape, zb-auto for the same costs."""

import numpy as np

from tabsched import StageCosts, UnitCosts, evaluate, generate
from tabsched.adapt import Noise, Straggler, adapt, reference_tables
from tabsched.adapt.references import reference_specs
from tabsched.schedules import families


def test_every_family_is_a_reference_with_more_chunks_where_it_has_them():
    labels = [spec[0] for spec in reference_specs()]
    assert {family.name for family in families()} <= set(labels)
    assert "interleaved-1f1b:chunks=4" in labels and "hanayo:waves=2" in labels
    assert "zbv:chunks=4" in labels   # tried, and left out silently when it does not build


def test_references_keep_the_start_s_shape_and_sizes():
    start = generate("1f1b", devices=4, microbatches=8, stage_layers=[1, 2, 2, 1])
    start = start.replace(microbatch_sizes=(0.5,) * 8)
    built, errors = reference_tables(start, UnitCosts(), 6)
    assert errors == {}
    assert "zbv:chunks=4" not in built and "interleaved-1f1b:chunks=4" in built
    for label, table in built.items():
        assert table.num_devices == 4 and table.num_microbatches == 8, label
        assert table.microbatch_sizes == (0.5,) * 8, label
    assert built["zb-h1"].stage_layers == (1, 2, 2, 1)
    assert built["zb-auto"].stage_layers == (1, 2, 2, 1)
    # zb-auto is built for the same costs and budget
    assert built["zb-auto"].params["memory_budget"] == 6
    assert max(d.peak_memory for d in evaluate(built["zb-auto"], UnitCosts()).devices) <= 6


def test_replicated_stages_pay_their_gradient_sync():
    built, _ = reference_tables(generate("1f1b", devices=4, microbatches=8), UnitCosts(), 8)
    assert built["chimera"].grad_sync == (0, 1, 2, 3)
    assert built["1f1b"].grad_sync is None


def test_families_that_cannot_take_the_shape_say_why():
    built, errors = reference_tables(generate("1f1b", devices=3, microbatches=6),
                                     UnitCosts(), 6)
    assert "chimera" in errors and "devices" in errors["chimera"]
    assert "dualpipe" in errors and "chimera" not in built
    assert not any(label.endswith("chunks=4") for label in errors)   # extras stay silent
    assert {"1f1b", "zb-h1", "zb-auto", "zbv"} <= set(built)


def test_a_named_list_builds_only_those():
    built, errors = reference_tables(generate("1f1b", devices=4, microbatches=8),
                                     UnitCosts(), 6, ["1f1b", "nonesuch"])
    assert list(built) == ["1f1b"] and "unknown schedule family 'nonesuch'" in errors["nonesuch"]


COSTS = StageCosts([1.0, 1.2, 0.8, 1.1], comm=0.3)


def test_the_search_starts_from_the_best_reference_when_it_beats_the_start():
    start = generate("gpipe", devices=4, microbatches=8)
    found = adapt(start, COSTS, None, 6, max_rounds=2)
    assert found.started_from is not None and found.started_from in found.references
    assert found.log[1].status == "start" and found.log[1].reason == \
        f"reference {found.started_from}"
    best = found.references[found.best_reference]
    assert best.feasible and found.feasible
    assert found.adapted.mean <= best.mean
    data = found.to_dict()
    assert data["started_from"] == found.started_from
    assert data["best_reference"] == found.best_reference


def test_when_the_search_cannot_beat_a_reference_it_returns_it():
    start = generate("1f1b", devices=4, microbatches=8)
    found = adapt(start, COSTS, None, 6, moves=lambda table: [], start_from_reference=False,
                  references=("1f1b", "zb-h1", "zb-auto"))
    assert found.started_from is None
    best = found.best_reference
    assert found.references[best].mean < found.baseline.mean
    assert found.returned_reference == best
    assert found.table == found.references[best].table and found.feasible
    assert found.adapted is found.references[best] and found.gain(found.adapted) == 0
    assert found.to_dict()["returned_reference"] == best


def test_references_are_measured_on_the_same_fresh_samples():
    start = generate("1f1b", devices=4, microbatches=8)
    variation = Noise(0.1) + Straggler(2, 1.3)
    found = adapt(start, COSTS, variation, 8, samples=32, max_rounds=1, seed=3,
                  references=("1f1b", "zb-h1"))
    assert found.validation_seed == 4
    # the 1F1B reference is the start itself: the same samples give the same figures
    assert found.references["1f1b"].mean == found.baseline.mean
    assert np.isfinite(found.gain(found.references["zb-h1"]))


def test_a_variation_that_does_not_fit_a_reference_rules_it_out():
    start = generate("zbv", devices=4, microbatches=8)        # 8 stages
    found = adapt(start, StageCosts(1.0, comm=0.3), Noise(0.1, stages={5: 0.2}), 16,
                  samples=16, max_rounds=1, references=("1f1b", "v-half"))
    assert set(found.references) == {"v-half"}
    assert found.reference_errors["1f1b"] == "noise: stage 5 is out of range (the table has " \
                                             "stages 0..3)"


def test_a_cost_driven_reference_is_built_once_with_the_starts_layers(monkeypatch):
    """zb-auto with the start's stage layers is one build (it was built twice: seconds at
    64 devices); zbv-auto, with twice the stages, is built without them."""
    from tabsched import StageCosts, generate
    from tabsched.adapt import references
    calls = []
    real = references.generate

    def counted(name, **params):
        calls.append((name, "stage_layers" in params))
        return real(name, **params)

    monkeypatch.setattr(references, "generate", counted)
    start = generate("1f1b", devices=4, microbatches=8).replace(stage_layers=(2, 1, 1, 2))
    built, errors = references.reference_tables(start, StageCosts(1.0), None,
                                                ["zb-auto", "zbv-auto", "1f1b"])
    assert not errors
    assert built["zb-auto"].stage_layers == (2, 1, 1, 2)
    assert calls.count(("zb-auto", True)) == 1 and ("zb-auto", False) not in calls
    assert built["zbv-auto"].num_stages == 8
