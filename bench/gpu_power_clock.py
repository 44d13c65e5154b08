"""GEMM rates at training shapes and the GPU's sustained SM clock and power under long GEMM loops.

Part 1 (--table): each training-shape GEMM in bf16 and fp8 (e4m3 through torch._scaled_mm, with and
without fast accumulation) timed with CUDA events for ~0.4 s after a warm-up, the mean SM clock
over that window beside it, so that a rate can be read at a known clock.
Part 2 (--loop-s N): N seconds of back-to-back bf16 GEMMs, then N of fp8 (fast accumulation, as Transformer Engine's forward GEMMs), cycling the shapes of one
Llama-3 8B layer, with NVML samples every 100 ms; 5 s idle before. Prints one JSON line per phase
(TFLOP/s per 5-s window and the clock / power over it) and writes all samples to --samples.
Shapes (M tokens x K in -> N out): Llama-3 8B (h 4096, kv 8 of 32 heads, SwiGLU 14336) at 8192
tokens; GPT-3 175B tensor-parallel 8 shards (h 12288) at 2048 tokens; Llama-2 7B (h 4096, ffn 11008)
at 4096 tokens. Usage: python3 bench/gpu_power_clock.py --table --loop-s 60 --samples s.json
"""
import argparse
import json
import time

import torch

from gpu_sampler import Sampler

SHAPES = {  # name: (M, K, N) for y[M,N] = x[M,K] @ W[K,N]
    "llama3-8b.qkv": (8192, 4096, 6144), "llama3-8b.wo": (8192, 4096, 4096),
    "llama3-8b.w13": (8192, 4096, 28672), "llama3-8b.w2": (8192, 14336, 4096),
    "gpt3-175b-tp8.qkv": (2048, 12288, 4608), "gpt3-175b-tp8.proj": (2048, 1536, 12288),
    "gpt3-175b-tp8.fc1": (2048, 12288, 6144), "gpt3-175b-tp8.fc2": (2048, 6144, 12288),
    "llama2-7b.w13": (4096, 4096, 22016), "llama2-7b.w2": (4096, 11008, 4096),
    "square.8192": (8192, 8192, 8192),
}
LOOP = ["llama3-8b.qkv", "llama3-8b.wo", "llama3-8b.w13", "llama3-8b.w2"]


def make(shape, kind):
    m, k, n = shape
    sets = []
    for _ in range(3):  # rotate inputs so that the L2 never holds them all
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        if kind == "bf16":
            sets.append((a, b.t()))
        else:
            sets.append((a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).t()))
    one = torch.ones((), device="cuda")
    fast = kind == "fp8-fast"

    def run(i):
        a, b = sets[i % 3]
        if kind == "bf16":
            return a @ b
        return torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16, use_fast_accum=fast)
    return run


def time_rate(run, flops, sampler, seconds):
    for i in range(5):
        run(i)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.time()
    start.record()
    n = 0
    while time.time() - t0 < seconds:
        for _ in range(50):
            run(n)
            n += 1
        torch.cuda.synchronize()
    end.record()
    end.synchronize()
    t1 = time.time()
    ms = start.elapsed_time(end)
    return {"tflops": flops * n / ms / 1e9, "us_each": ms * 1e3 / n, "clock": sampler.summary(t0, t1)}


def table(sampler):
    for name, shape in SHAPES.items():
        m, k, n = shape
        for kind in ("bf16", "fp8", "fp8-fast"):
            r = time_rate(make(shape, kind), 2.0 * m * k * n, sampler, 0.4)
            clk = r["clock"].get("sm_MHz", {}).get("mean")
            print(json.dumps({"part": "table", "gemm": name, "mkn": shape, "dtype": kind,
                              "tflops": round(r["tflops"], 1), "us": round(r["us_each"], 1),
                              "sm_MHz": clk}), flush=True)


def loop(sampler, seconds):
    sampler.mark("idle")
    time.sleep(5)
    for kind in ("bf16", "fp8-fast"):
        runs = [(make(SHAPES[s], kind), 2.0 * SHAPES[s][0] * SHAPES[s][1] * SHAPES[s][2]) for s in LOOP]
        sampler.mark(f"loop.{kind}")
        t_begin = time.time()
        windows = []
        while time.time() - t_begin < seconds:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            w0 = time.time()
            start.record()
            flops, i = 0.0, 0
            while time.time() - w0 < 5.0:
                for run, f in runs:
                    run(i)
                    flops += f
                i += 1
                if i % 20 == 0:
                    torch.cuda.synchronize()
            end.record()
            end.synchronize()
            w1 = time.time()
            windows.append({"t": round(w0 - t_begin, 1), "tflops": round(flops / start.elapsed_time(end) / 1e9, 1),
                            "clock": sampler.summary(w0, w1)})
        print(json.dumps({"part": "loop", "dtype": kind, "seconds": seconds, "windows": windows}), flush=True)
        sampler.mark("cool")
        time.sleep(3)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--table", action="store_true")
    p.add_argument("--loop-s", type=float, default=0)
    p.add_argument("--samples", default="")
    args = p.parse_args()
    sampler = Sampler().start()
    print(json.dumps({"part": "device", **sampler.static(), "torch": torch.__version__}), flush=True)
    if args.table:
        table(sampler)
    if args.loop_s > 0:
        loop(sampler, args.loop_s)
    sampler.stop()
    if args.samples:
        with open(args.samples, "w") as f:
            json.dump({"marks": sampler.marks, "samples": sampler.samples}, f)


if __name__ == "__main__":
    main()
