"""Linear walks: the critical path at 10^5 and 10^6 operations, the replay's matching at 10^5 events.

``Result.critical_path`` walks back from the node that ends last and builds one step per
node on the path. It was quadratic (each step's label scanned the table for its cell and
read every transfer's ends): 1F1B at S=64, M=4096 took 19.8 s. This prints, for GPipe on
one device (a path through every operation) and 1F1B at S=64, the time of ``evaluate``,
of the path's steps and of ``critical_counts`` (what ``tabsched eval`` prints), at two
sizes ten times apart, and the growth of the path's time per step from one to the other
(1.0: linear). Then a profiler trace's replay (``profile_from_trace``) at 10^4 and 10^5
receives whose actions span much of the trace (each receive's window holds many recv
events): the matching of receives and waits was a scan per receive (2,000 took 8.7 s);
the growth per event from one size to the other. Not collected by pytest.

    python bench/bench_paths.py [--repeat 3]
"""

import argparse

from _timing import best_of

import tabsched


def measure(family, devices, microbatches, repeat):
    table = tabsched.generate(family, devices=devices, microbatches=microbatches)
    evaluate_s, result = best_of(repeat, lambda: tabsched.evaluate(table))
    result.critical_nodes()     # the binding rerun, once, as evaluate leaves it to later
    path_s, path = best_of(repeat, lambda: result.critical_path)
    counts_s, _ = best_of(repeat, result.critical_counts)
    return len(table), evaluate_s, path_s, counts_s, len(path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    for family, devices, sizes in (("gpipe", 1, (50_000, 500_000)),
                                   ("1f1b", 64, (512, 5_120))):
        per_step = []
        for microbatches in sizes:
            ops, evaluate_s, path_s, counts_s, steps = measure(family, devices, microbatches,
                                                              args.repeat)
            per_step.append(path_s / steps)
            print(f"{family:<5} S={devices:<3} M={microbatches:<7} {ops:>9,} ops: evaluate "
                  f"{evaluate_s * 1e3:8.1f} ms; critical path {steps:>9,} steps "
                  f"{path_s * 1e3:8.1f} ms ({path_s / steps * 1e9:5.0f} ns/step, "
                  f"{path_s / evaluate_s:4.2f}x evaluate); counts {counts_s * 1e3:6.1f} ms")
        print(f"{family:<5} path time per step, 10x the operations: x{per_step[1] / per_step[0]:.2f}"
              f" (1.0 is linear)")
    replay(max(1, args.repeat // 3))


def long_actions(count):
    """A trace of ``count`` receives and operations whose actions span much of it."""
    def span(name, ts, dur):
        return {"ph": "X", "cat": "user_annotation", "name": name, "ts": ts, "dur": dur,
                "pid": 7, "tid": 1}
    events = []
    for i in range(count):
        t = 100 * i
        events += [span(f"PP:1RECV_F{i}", t, 100 * count), span("gloo:recv", t + 2, 48),
                   span(f"PP:1F{i}", t + 10, 70 * count), span("aten::linear", t + 51, 20)]
    return {"traceEvents": events}


def replay(repeat):
    from tabsched.formats.kineto import profile_from_trace
    per_event = []
    for count in (10_000, 100_000):
        document = long_actions(count)
        seconds, profile = best_of(repeat, lambda: profile_from_trace(document))
        events = len(document["traceEvents"])
        per_event.append(seconds / events)
        print(f"replay {count:>7,} receives, {events:>7,} events: {seconds * 1e3:8.1f} ms "
              f"({seconds / events * 1e9:5.0f} ns/event), {len(profile.measurements):,} "
              f"operations measured")
    print(f"replay time per event, 10x the events: x{per_event[1] / per_event[0]:.2f} "
          f"(1.0 is linear)")


if __name__ == "__main__":
    main()
