"""Online mode: drifting conditions, re-adaptation from what the run observed."""

import pytest

from tabsched import InvalidParameterError, StageCosts, generate
from tabsched.adapt import Noise, SlowLink, Straggler, adapt_online

COSTS = StageCosts(1.0, comm=0.5)


def test_a_link_that_slows_down_is_followed():
    table = generate("1f1b", devices=4, microbatches=8)
    slow = SlowLink((1, 2), 4.0, iterations=range(3, 8))
    run = adapt_online(table, COSTS, slow, memory_budget=6, iterations=8)
    times = [(item.static, item.adaptive) for item in run.iterations]
    assert times[0][0] == times[0][1]            # nothing observed yet: the same table
    assert all(static == times[0][0] for static, _ in times[:3])
    assert all(static > times[0][0] for static, _ in times[3:])
    searched = [item.iteration for item in run.iterations if item.searched]
    assert searched == [0, 3]                     # the fit moved when the link slowed
    assert run.searches == 2
    after = run.iterations[4]
    assert after.adaptive < run.iterations[3].adaptive < after.static
    assert run.adaptive_total < run.static_total and run.gain > 0
    fitted = [part for part in run.iterations[3].estimate if part["model"] == "slow-link"
              and part["devices"] == [1, 2]]
    assert fitted[0]["bandwidth_factor"] == pytest.approx(4.0)
    assert all(item.feasible for item in run.iterations)
    data = run.to_dict()
    assert len(data["iterations"]) == 8 and data["gain"] == run.gain


def test_a_device_that_recovers_is_followed_back():
    table = generate("1f1b", devices=4, microbatches=8)
    straggler = Straggler(1, 2.0, iterations=range(0, 3))
    run = adapt_online(table, COSTS, straggler, memory_budget=6, iterations=6)
    searched = [item.iteration for item in run.iterations if item.searched]
    assert searched == [0, 3]
    assert run.iterations[3].static < run.iterations[2].static
    assert all(item.adaptive <= item.static for item in run.iterations)


def test_noise_does_not_trigger_a_search_every_iteration():
    table = generate("1f1b", devices=4, microbatches=8)
    run = adapt_online(table, COSTS, Noise(0.05), memory_budget=6, iterations=5, samples=32,
                       retune=0.25)
    assert run.searches == 1
    assert all(item.static > 0 and item.adaptive > 0 for item in run.iterations)


def test_online_errors():
    table = generate("1f1b", devices=4, microbatches=8)
    with pytest.raises(InvalidParameterError, match=r"iterations must be an integer >= 1, not 0"):
        adapt_online(table, COSTS, None, iterations=0)
    with pytest.raises(InvalidParameterError, match=r"straggler on device 5, but the table"):
        adapt_online(table, COSTS, Straggler(5, 2.0), iterations=2)


@pytest.mark.parametrize("call,message", [
    (lambda t: adapt_online([["0F0", "0B0"]]), r"^table must be a ScheduleTable, not list$"),
    (lambda t: adapt_online(t, "paper-128l"), r"^costs must be a cost model, not str$"),
    (lambda t: adapt_online(t, COSTS, 0.1), r"^variation must be a variation model, not float$"),
])
def test_online_checks_its_arguments(call, message):
    with pytest.raises(InvalidParameterError, match=message):
        call(generate("1f1b", devices=2, microbatches=2))
