#!/usr/bin/env python3
"""How much slower than the loop's fastest the cores of each run computed, and each plan's time
with that taken out (issue 63). For every run of a loop's directory: its median step after the
warm-up (spec/step_times.hpp), and the slowest rank's time in its compute ops over the time the same ops took at their
fastest in any run of the directory with as many ranks (op name, pass, shape, rank count; the
communication ops are left out, their time holds the waits). A step divided by (1 + that
slowdown) estimates the run at the loop's fastest core speed. Per plan it prints the runs, the
median step and the median and spread of the estimates.

The fastest time of each op is the least of its per-run means, so the estimates lean fast by the
noise of those means, and an op's fastest may come from a plan whose other rank was idle at the
time (a pipeline bubble), when a core computes faster than beside a busy one (DeviceSpec::co_run):
the estimates compare the runs of one plan; across plans they mix in that co-run difference.

Usage: bench/run_slowdowns.py DIR...   (DIR holds NAME.rN.measured.json and NAME.rN.steps.jsonl)
"""
import collections
import glob
import json
import os
import sys

from rank_spread import COMMUNICATION, first_step


def median(values):
    values = sorted(values)
    return values[(len(values) - 1) // 2]


def op_means(trace_file, first):
    """{(op, pass, shape, ranks, rank): (mean us, count)} over steps `first` and later."""
    events = [e for e in json.load(open(trace_file))["traceEvents"] if e.get("ph") == "X"]
    ranks = len({e["pid"] for e in events})
    durations = collections.defaultdict(list)
    for e in events:
        a = e.get("args", {})
        if a.get("step", 0) < first or a.get("op_class") in COMMUNICATION:
            continue
        durations[(e["name"], a.get("phase"), str(a.get("shape")), ranks, e["pid"])].append(e["dur"])
    return {k: (sum(v) / len(v), len(v)) for k, v in durations.items()}


def main(directory):
    runs = []
    for trace in sorted(glob.glob(f"{directory}/*.r[0-9]*.measured.json")):
        base = trace[: -len(".measured.json")]
        plan = os.path.basename(base).rsplit(".r", 1)[0]
        steps = [json.loads(line)["step_time_s"] for line in open(base + ".steps.jsonl")]
        first = first_step(steps)
        if steps[first:]:
            runs.append((plan, median(steps[first:]), op_means(trace, first)))
    fastest = {}
    for _, _, means in runs:
        for key, (mean, _) in means.items():
            fastest[key[:4]] = min(fastest.get(key[:4], float("inf")), mean)
    by_plan = collections.defaultdict(list)
    for plan, step, means in runs:
        slowdown = 0.0
        for rank in {key[4] for key in means}:
            took = sum(m * n for k, (m, n) in means.items() if k[4] == rank)
            best = sum(fastest[k[:4]] * n for k, (m, n) in means.items() if k[4] == rank)
            slowdown = max(slowdown, took / best - 1)
        by_plan[plan].append((step, slowdown))
    print(f"== {directory}")
    for plan, runs_of_plan in sorted(by_plan.items()):
        runs_of_plan.sort()
        estimates = [s / (1 + d) for s, d in runs_of_plan]
        print(f"{plan:<14} " + " ".join(f"{1e3 * s:.0f}(+{100 * d:.0f}%)" for s, d in runs_of_plan)
              + f"  median {1e3 * median([s for s, _ in runs_of_plan]):.0f} ms"
              + f"  at the fastest speed {1e3 * median(estimates):.0f} ms"
              + f" (spread {100 * (max(estimates) / min(estimates) - 1):.0f}%)")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for d in sys.argv[1:]:
        main(d)
