#!/usr/bin/env python3
"""Fits the GEMM model of a cluster file (device.gemm_model: mainloop_efficiency, tile_overhead_k,
kernel_overhead_us) to the GEMM kernels of a PyTorch-profiler trace by least squares on the
relative error, the way sim/cost/src/compute_model.cpp (ComputeModel::matmul_seconds) prices them:
waves of tiles over the SMs, split-K, at the SM clock the trace ran at.

Usage: scripts/fit-gemm-model.py TRACE.json[.gz] --sms 132 --clock-mhz 1970 --peak-tflops 989.4 \
           --peak-clock-mhz 1830 [--tiles 256x128,128x256,...]
       scripts/fit-gemm-model.py --shapes SHAPES.csv [--min-dim 512] --sms 80 ...
       ... --mainloop-efficiency 0.79 --tile-overhead-k 80 --kernel-overhead-us 5: evaluate only
A shapes file holds measured GEMM rates instead of a trace: CSV with columns m, n, k, tflops
('#' lines are comments; traces/samples/deepbench-v100-fp16-gemm.csv). --min-dim leaves out shapes
with a dimension below it (skinny GEMMs are memory-bound, which this model does not price).
Prints the fitted parameters and each kernel's error. Standard library only."""
import argparse
import collections
import csv
import gzip
import json
import math

H100_TILES = "256x128,128x256,192x128,128x192,192x192,128x160,128x128,256x64,64x256,128x64,64x128,96x64,64x64"


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def shape_rates(path, min_dim):
    """(m, n, k, microseconds) of each measured shape of a CSV of rates (columns m, n, k, tflops)."""
    with open(path) as f:
        rows = csv.DictReader(line for line in f if not line.startswith("#"))
        out = []
        for r in rows:
            m, n, k = int(r["m"]), int(r["n"]), int(r["k"])
            if min(m, n, k) >= min_dim:
                out.append((m, n, k, 2 * m * n * k / (float(r["tflops"]) * 1e12) * 1e6))
    return out


def gemm_kernels(trace):
    """(m, n, k, microseconds) of each GEMM kernel, shapes from the aten op that launched it."""
    ops = collections.defaultdict(list)
    for e in trace["traceEvents"]:
        if e.get("cat") == "cpu_op":
            ops[e.get("args", {}).get("External id")].append(e)
    out = []
    for e in trace["traceEvents"]:
        if e.get("cat") != "kernel":
            continue
        name = e["name"]
        if not ("nvjet" in name or "gemm" in name.lower()):
            continue
        for op in ops.get(e["args"].get("External id"), []):
            dims = op["args"].get("Input Dims")
            if op["name"] == "aten::mm" and dims and len(dims[0]) == 2:
                (m, k), (_, n) = dims[0], dims[1]
            elif op["name"] == "aten::addmm" and dims and len(dims[1]) == 2:
                (m, k), (_, n) = dims[1], dims[2]
            else:
                continue
            out.append((m, n, k, e["dur"]))
            break
    return out


def model_us(m, n, k, eta, k0, t0, sm_flops, tiles, sms, max_split, bandwidth):
    best = float("inf")
    for tm, tn in tiles:
        t = math.ceil(m / tm) * math.ceil(n / tn)
        for s in range(1, max_split + 1):
            if s > 1 and k / s < 128:
                break
            waves = math.ceil(t * s / sms)
            sec = waves * 2 * tm * tn * (k / s + k0) / (sm_flops * eta)
            if s > 1:
                sec += m * n * (8 * s + 2) / bandwidth
            best = min(best, sec)
    return best * 1e6 + t0


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace", nargs="?")
    p.add_argument("--shapes", help="CSV of measured rates (m, n, k, tflops) instead of a trace")
    p.add_argument("--min-dim", type=int, default=0)
    p.add_argument("--kernel-overhead-us", type=int,
                   help="hold kernel_overhead_us at this value (large shapes alone cannot tell it)")
    p.add_argument("--mainloop-efficiency", type=float,
                   help="hold mainloop_efficiency at this value (all three held: the file's "
                        "model evaluated on the shapes, nothing fitted)")
    p.add_argument("--tile-overhead-k", type=int, help="hold tile_overhead_k at this value")
    p.add_argument("--sms", type=int, default=132)
    p.add_argument("--clock-mhz", type=float, default=1970)
    p.add_argument("--peak-tflops", type=float, default=989.4)
    p.add_argument("--peak-clock-mhz", type=float, default=1830)
    p.add_argument("--bandwidth-gbps", type=float, default=3350 * 0.88)
    p.add_argument("--tiles", default=H100_TILES)
    p.add_argument("--max-split-k", type=int, default=8)
    a = p.parse_args()
    tiles = [tuple(int(x) for x in t.split("x")) for t in a.tiles.split(",")]
    sm_flops = a.peak_tflops * 1e12 / a.sms * a.clock_mhz / a.peak_clock_mhz
    if bool(a.trace) == bool(a.shapes):
        raise SystemExit("give a trace or --shapes CSV (one of them)")
    source = a.shapes or a.trace
    kernels = shape_rates(a.shapes, a.min_dim) if a.shapes else gemm_kernels(load(a.trace))
    if not kernels:
        raise SystemExit(f"{source}: no GEMM kernels with shapes (record_shapes=True?)")
    # One row per shape: the mean duration, weighted by how many kernels had that shape.
    by_shape = collections.defaultdict(list)
    for m, n, k, us in kernels:
        by_shape[(m, n, k)].append(us)
    obs = [(m, n, k, sum(v) / len(v)) for (m, n, k), v in sorted(by_shape.items())]
    weight = [len(by_shape[(m, n, k)]) for m, n, k, _ in obs]
    best = None
    etas = ([a.mainloop_efficiency] if a.mainloop_efficiency is not None
            else [x / 100 for x in range(50, 100)])
    k0s = [a.tile_overhead_k] if a.tile_overhead_k is not None else range(0, 512, 16)
    for eta in etas:
        for k0 in k0s:
            for t0 in ([a.kernel_overhead_us] if a.kernel_overhead_us is not None else range(0, 9)):
                err = [model_us(m, n, k, eta, k0, t0, sm_flops, tiles, a.sms, a.max_split_k,
                                a.bandwidth_gbps * 1e9) / us - 1 for m, n, k, us in obs]
                s = sum(w * e * e for w, e in zip(weight, err))
                if best is None or s < best[0]:
                    best = (s, eta, k0, t0, err)
    s, eta, k0, t0, err = best
    mean = sum(w * e for w, e in zip(weight, err)) / sum(weight)
    print(f"{len(kernels)} GEMM kernels, {len(obs)} shapes; mainloop_efficiency {eta}, "
          f"tile_overhead_k {k0}, kernel_overhead_us {t0}: rms relative error "
          f"{math.sqrt(s / sum(weight)):.3f}, mean {100 * mean:+.1f}%")
    for (m, n, k, us), w, e in zip(obs, weight, err):
        print(f"  {m:6d} x {n:6d} x {k:6d}  {w:3d} kernels, mean {us:8.1f} us  error {100 * e:+6.1f}%")


if __name__ == "__main__":
    main()
