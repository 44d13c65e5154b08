#!/usr/bin/env python3
"""Per run of a loop's or tune's directory: the median step after the warm-up and how far apart its
ranks computed, the time each rank spent in the compute ops every rank ran (what
traces::rank_speeds measures; a rank far behind the others ran on a slow core).

Usage: bench/rank_spread.py DIR   (DIR holds NAME.rN.measured.json and NAME.rN.steps.jsonl)
"""
import collections
import glob
import json
import statistics
import sys

COMMUNICATION = {"all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce",
                 "all_to_all", "send", "recv", "barrier", "host", "memcpy"}


def first_step(steps):
    """The first step after the warm-up (spec/step_times.hpp)."""
    return 2 if len(steps) > 3 else 1 if len(steps) > 1 else 0


def rank_times(trace_file, first_step):
    sums = collections.defaultdict(lambda: collections.defaultdict(float))
    counts = collections.defaultdict(lambda: collections.defaultdict(int))
    ranks = set()
    for e in json.load(open(trace_file))["traceEvents"]:
        if e.get("ph") != "X":
            continue
        a = e.get("args", {})
        ranks.add(e["pid"])
        if a.get("op_class") in COMMUNICATION or a.get("step", 0) < first_step:
            continue
        key = (e["name"], a.get("phase"), tuple(a.get("shape", [])), a.get("op_class"))
        sums[key][e["pid"]] += e["dur"]
        counts[key][e["pid"]] += 1
    times = collections.defaultdict(float)
    for key, by_rank in sums.items():
        if len(by_rank) != len(ranks):
            continue
        common = min(counts[key].values())
        for r in ranks:
            times[r] += by_rank[r] / counts[key][r] * common
    return times


def main(directory):
    for trace in sorted(glob.glob(f"{directory}/*.r[0-9]*.measured.json")):
        steps = [json.loads(line)["step_time_s"]
                 for line in open(trace.replace(".measured.json", ".steps.jsonl"))]
        first = first_step(steps)
        times = rank_times(trace, first)
        spread = max(times.values()) / min(times.values()) - 1 if times else 0
        shown = ", ".join(f"rank {r} {t / 1e3:.1f} ms" for r, t in sorted(times.items()))
        name = trace.split("/")[-1].replace(".measured.json", "")
        print(f"{name:<36} step {1e3 * statistics.median(steps[first:]):6.1f} ms  "
              f"ranks {100 * spread:4.1f}% apart ({shown})")


if __name__ == "__main__":
    main(sys.argv[1])
