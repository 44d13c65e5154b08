#!/usr/bin/env python3
"""Host time per launched kernel, by pass, in PyTorch-profiler (Kineto) traces.

For each trace: the kernel launches (cudaLaunchKernel, cuLaunchKernel[Ex], cudaMemsetAsync,
cudaMemcpyAsync) of the training script's thread are the forward pass (and, inside the optimizer's
annotation, the optimizer step; between the backward and the optimizer, what runs after the
backward: gradient clipping); those of autograd's engine thread are the backward pass. Per pass
and step: the host span from its first launch to its last divided by its launches, the host's time
to issue one kernel (the figure Stack::host_launch_us takes). Also the GPU's idle time while it
waited for a kernel its host had not issued yet (a kernel whose launch call ended after the kernel
before it had finished): what the host-issue model predicts.

Time the host spends in a synchronising call (cudaStreamSynchronize, cudaDeviceSynchronize,
cudaEventSynchronize: a loss.item()) is left out. Times are measured under the profiler, whose own
cost per op is in them.

Usage: bench/host_launch_rates.py TRACE.json.gz [...]
"""
import gzip
import json
import sys

LAUNCHES = {"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
            "cudaMemsetAsync", "cudaMemcpyAsync"}
GPU_CATS = {"kernel", "gpu_memset", "gpu_memcpy"}
SYNCS = {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize"}


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)["traceEvents"]


def analyse(path):
    events = load(path)
    launches = sorted((e for e in events if e.get("ph") == "X" and e.get("name") in LAUNCHES),
                      key=lambda e: e["ts"])
    by_corr = {e["args"]["correlation"]: e for e in launches if "correlation" in e.get("args", {})}
    optimizer = [(e["ts"], e["ts"] + e["dur"]) for e in events
                 if e.get("cat") == "user_annotation" and e["name"].startswith("Optimizer.step")]
    main_tid = launches[0]["tid"]
    syncs = [e for e in events if e.get("ph") == "X" and e.get("name") in SYNCS]

    def pass_of(e):
        if e["tid"] != main_tid:
            return "backward"
        if any(a <= e["ts"] <= b for a, b in optimizer):
            return "optimizer"
        return "forward"

    # Runs of one pass (a step's forward, backward, optimizer) in launch order. The script's
    # launches between a backward and the optimizer (gradient clipping) are a pass of their own.
    runs = []
    for e in launches:
        p = pass_of(e)
        if p == "forward" and runs and runs[-1]["pass"] in ("backward", "after backward"):
            p = "after backward"
        if not runs or runs[-1]["pass"] != p:
            runs.append({"pass": p, "n": 0, "start": e["ts"], "end": 0})
        runs[-1]["n"] += 1
        runs[-1]["end"] = e["ts"] + e["dur"]
    totals = {}
    for r in runs:
        # The host waiting for the GPU (a loss.item(), a synchronize) is not issue time.
        waited = sum(e["dur"] for e in syncs if r["start"] <= e["ts"] and e["ts"] + e["dur"] <= r["end"])
        t = totals.setdefault(r["pass"], [0, 0.0])
        t[0] += r["n"]
        t[1] += r["end"] - r["start"] - waited

    kernels = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") in GPU_CATS),
                     key=lambda e: e["ts"])
    busy = sum(k["dur"] for k in kernels)
    starved = 0.0
    prev_end = None
    for k in kernels:
        if prev_end is not None and k["ts"] > prev_end:
            launch = by_corr.get(k.get("args", {}).get("correlation"))
            if launch is not None and launch["ts"] + launch["dur"] > prev_end:
                starved += k["ts"] - prev_end
        prev_end = max(prev_end or 0, k["ts"] + k["dur"])
    span = kernels[-1]["ts"] + kernels[-1]["dur"] - kernels[0]["ts"]
    steps = max(1, len(optimizer))
    # The launch call alone (what a C or C++ program that launches directly pays a kernel).
    calls = sorted(e["dur"] for e in launches if e["name"] != "cudaMemcpyAsync")
    totals["launch call alone (median)"] = [len(calls), calls[len(calls) // 2] * len(calls)]
    return totals, steps, busy, span, starved


def main():
    print("| trace | pass | launches a step | host ms a step | host us a launch |")
    print("|---|---|---|---|---|")
    idle = []
    for path in sys.argv[1:]:
        totals, steps, busy, span, starved = analyse(path)
        name = path.split("/")[-1]
        for p in ("forward", "backward", "after backward", "optimizer",
                  "launch call alone (median)"):
            if p in totals:
                n, us = totals[p]
                print(f"| {name} | {p} | {n / steps:.0f} | {us / steps / 1e3:.2f} | {us / n:.1f} |")
        idle.append((name, steps, busy, span, starved))
    print()
    print("| trace | steps | GPU busy ms a step | kernel span ms a step | GPU waiting for the host ms a step |")
    print("|---|---|---|---|---|")
    for name, steps, busy, span, starved in idle:
        print(f"| {name} | {steps} | {busy / steps / 1e3:.2f} | {span / steps / 1e3:.2f} | "
              f"{starved / steps / 1e3:.2f} |")


if __name__ == "__main__":
    main()
