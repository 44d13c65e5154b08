#!/usr/bin/env python3
"""Reads bench/gpu_power_clock.py's output (summary JSON lines) and a cluster file, and prices each
measured GEMM with the cluster's GEMM model the way sim/cost/src/compute_model.cpp
(ComputeModel::matmul_seconds) does, to answer two questions:
  1. at what clock, in the GEMM model's units, does the model give the rate that the sustained
     loop measured (the power object's tensor_clock_MHz for bf16 and fp8);
  2. how the model's error spreads over the table's training shapes, each at the GEMM model's
     clock for the SM clock it ran at (the same ratio, at most the boost clock).
Usage: bench/gemm_clock_fit.py SUMMARY.jsonl clusters/dgx-h100.json. Standard library only."""
import json
import math
import sys


def gemm_seconds(m, n, k, clock, g, peak_tflops, bf16_tflops, bandwidth):
    sm_flops = peak_tflops * 1e12 / g["sms"] * clock / g["peak_clock_MHz"] * g["mainloop_efficiency"]
    k0 = g["tile_overhead_k"] * peak_tflops / bf16_tflops
    best = math.inf
    for tm, tn in g["tiles"]:
        tiles = math.ceil(m / tm) * math.ceil(n / tn)
        for split in range(1, g.get("max_split_k", 8) + 1):
            if split > 1 and k / split < 128:
                break
            waves = math.ceil(tiles * split / g["sms"])
            t = waves * 2 * tm * tn * (k / split + k0) / sm_flops
            if split > 1:
                t += m * n * (8 * split + 2) / bandwidth
            best = min(best, t)
    return best + g["kernel_overhead_us"] * 1e-6


def main():
    rows = [json.loads(line) for line in open(sys.argv[1])]
    dev = json.load(open(sys.argv[2]))["device"]
    g, peaks = dev["gemm_model"], dev["peak_tflops"]
    bw = dev["memory_bandwidth_GBps"] * 1e9 * dev.get("memory_efficiency", 1.0)
    shapes = {r["gemm"]: r["mkn"] for r in rows if r.get("part") == "table"}
    loop_shapes = ["llama3-8b.qkv", "llama3-8b.wo", "llama3-8b.w13", "llama3-8b.w2"]
    for loop in (r for r in rows if r.get("part") == "loop"):
        dtype = "bf16" if loop["dtype"] == "bf16" else "fp8"
        windows = loop["windows"][1:]  # the first window holds the ramp from idle
        rate = sum(w["tflops"] for w in windows) / len(windows)
        nvml = sum(w["clock"]["sm_MHz"]["mean"] for w in windows) / len(windows)
        power = sum(w["clock"]["power_W"]["mean"] for w in windows) / len(windows)
        flops = sum(2.0 * m * k * n for m, k, n in (shapes[s] for s in loop_shapes))

        def model_rate(clock):
            t = sum(gemm_seconds(m, n, k, clock, g, peaks[dtype], peaks["bf16"], bw)
                    for m, k, n in (shapes[s] for s in loop_shapes))
            return flops / t / 1e12
        lo, hi = 500.0, 2500.0
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if model_rate(mid) < rate else (lo, mid)
        clock = (lo + hi) / 2
        print(f"{loop['dtype']} loop: {rate:.1f} TFLOP/s sustained at {power:.0f} W, NVML SM clock "
              f"{nvml:.0f} MHz; the GEMM model gives it at {clock:.0f} MHz (model units)")
        for r in (r for r in rows if r.get("part") == "table" and r["dtype"] == loop["dtype"]):
            m, k, n = r["mkn"]
            # Each table row ran at its own SM clock: the GEMM model's clock in the same ratio,
            # at most the boost clock (spec/power_model.hpp gemm_model_clock_MHz).
            c = min(clock * r["sm_MHz"] / nvml, dev.get("power", {}).get("max_clock_MHz", math.inf))
            pred = 2.0 * m * k * n / gemm_seconds(m, n, k, c, g, peaks[dtype], peaks["bf16"], bw) / 1e12
            print(f"  {r['gemm']:20s} {m:5d}x{k:5d}x{n:5d} measured {r['tflops']:7.1f} at {r['sm_MHz']:4.0f} MHz,"
                  f" model {pred:7.1f} ({100 * (pred / r['tflops'] - 1):+5.1f}%)")


if __name__ == "__main__":
    main()
