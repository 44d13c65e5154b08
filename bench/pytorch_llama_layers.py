"""Training steps of a few transformer layers at the widths that matter, on one GPU, for traces
(kernel-level calibration and validation data) and for clock / power under a real training loop.

--family llama: TorchTitan's Llama 3 block (RMSNorm, RoPE, grouped-query attention through SDPA with
  the KV heads repeated, SwiGLU, no biases), sized from a Sextant model JSON with --layers of its
  layers, embedding, final norm and untied head; loss in fp32 as TorchTitan computes it. On one GPU
  TorchTitan trains under bf16 autocast (fp32 weights), as here; fused AdamW, grad-norm clipping.
--family gpt3-shard: one tensor-parallel rank's shard of a GPT-3 block (Megatron layout: LayerNorm,
  column-parallel QKV and fc1, row-parallel proj and fc2, biases, GELU) with --tp shards, layers only
  (random hidden states in, a random gradient out), no all-reduces (one GPU), no dropout.
--compile: each block through torch.compile, as TorchTitan compiles per block.
--fp8 (llama): the block's linears as Megatron-Core + Transformer Engine run them in FP8 (fused QKV
  and gate+up linears, e4m3 forward, e5m2 gradients, fp32 weight gradients: bench/fp8_linear.py),
  attention through SDPA's grouped-query path in bf16; with --compile the casts fuse as TE's do.
--fsdp: TorchTitan's own precision path instead of autocast: FSDP2 fully_shard per block and on the
  model at world size 1 (NCCL), MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), so the
  casts, copy-in/copy-out and reduce kernels of FSDP2 run as on a cluster (its collectives over one
  rank); no autocast.
Prints one JSON line per run: step time, tokens/s, model TFLOP/s; --seconds runs the timed loop that
long (NVML clock and power over it when --power); --profile writes a Kineto trace of two more steps.
Usage: python3 bench/pytorch_llama_layers.py --model-json models/zoo/llama3-8b.json --layers 8
          --micro-batch 1 --seq 8192 [--compile] [--seconds 60 --power] [--profile trace.json]
"""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def rope_freqs(head_dim, seq, theta=500000.0):
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2).float() / head_dim))
    angles = torch.outer(torch.arange(seq).float(), freqs)
    return torch.polar(torch.ones_like(angles), angles)  # complex64 [seq, head_dim / 2]


def apply_rope(x, freqs):  # TorchTitan's apply_rotary_emb: complex multiply in fp32
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    out = torch.view_as_real(xc * freqs.view(1, x.shape[1], 1, -1)).flatten(3)
    return out.type_as(x)


class LlamaBlock(nn.Module):
    def __init__(self, t):
        super().__init__()
        h, self.heads, self.kv = t["hidden"], t["heads"], t["kv_heads"]
        self.hd = h // self.heads
        self.attention_norm, self.ffn_norm = nn.RMSNorm(h, eps=1e-5), nn.RMSNorm(h, eps=1e-5)
        self.fp8 = False
        self.wq = nn.Linear(h, self.heads * self.hd, bias=False)
        self.wk = nn.Linear(h, self.kv * self.hd, bias=False)
        self.wv = nn.Linear(h, self.kv * self.hd, bias=False)
        self.wo = nn.Linear(h, h, bias=False)
        f = t["ffn_hidden"]
        self.w1, self.w3 = nn.Linear(h, f, bias=False), nn.Linear(h, f, bias=False)
        self.w2 = nn.Linear(f, h, bias=False)

    def forward(self, x, freqs):
        if self.fp8:
            return self.forward_fp8(x, freqs)
        b, s, h = x.shape
        y = self.attention_norm(x)
        q = self.wq(y).view(b, s, self.heads, self.hd)
        k = self.wk(y).view(b, s, self.kv, self.hd)
        v = self.wv(y).view(b, s, self.kv, self.hd)
        q, k = apply_rope(q, freqs), apply_rope(k, freqs)
        rep = self.heads // self.kv  # TorchTitan's repeat_kv
        k = k[:, :, :, None, :].expand(b, s, self.kv, rep, self.hd).reshape(b, s, self.heads, self.hd)
        v = v[:, :, :, None, :].expand(b, s, self.kv, rep, self.hd).reshape(b, s, self.heads, self.hd)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.wo(o.transpose(1, 2).reshape(b, s, h))
        y = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(y)) * self.w3(y))

    def use_fp8(self, t):
        """Megatron-Core's layer under Transformer Engine's FP8 recipe: one QKV and one gate+up
        linear, each in fp8 (fp8_linear.py); the rest as before."""
        from fp8_linear import Fp8Linear
        h, f = t["hidden"], t["ffn_hidden"]
        self.wqkv = Fp8Linear(h, (self.heads + 2 * self.kv) * self.hd)
        self.wo, self.w13, self.w2 = Fp8Linear(h, h), Fp8Linear(h, 2 * f), Fp8Linear(f, h)
        del self.wq, self.wk, self.wv, self.w1, self.w3
        self.fp8 = True

    def forward_fp8(self, x, freqs):
        b, s, h = x.shape
        q, k, v = self.wqkv(self.attention_norm(x)).split(
            [self.heads * self.hd, self.kv * self.hd, self.kv * self.hd], dim=-1)
        q = apply_rope(q.reshape(b, s, self.heads, self.hd), freqs)
        k = apply_rope(k.reshape(b, s, self.kv, self.hd), freqs)
        v = v.reshape(b, s, self.kv, self.hd)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           is_causal=True, enable_gqa=True)
        x = x + self.wo(o.transpose(1, 2).reshape(b, s, h))
        gate, up = self.w13(self.ffn_norm(x)).chunk(2, dim=-1)
        return x + self.w2(F.silu(gate) * up)


class Llama(nn.Module):
    def __init__(self, t, layers, seq):
        super().__init__()
        self.tok_embeddings = nn.Embedding(t["vocab"], t["hidden"])
        self.layers = nn.ModuleList(LlamaBlock(t) for _ in range(layers))
        self.norm = nn.RMSNorm(t["hidden"], eps=1e-5)
        self.output = nn.Linear(t["hidden"], t["vocab"], bias=False)
        self.register_buffer("freqs", rope_freqs(t["hidden"] // t["heads"], seq), persistent=False)

    def forward(self, idx, targets):
        x = self.tok_embeddings(idx)
        for blk in self.layers:
            x = blk(x, self.freqs)
        logits = self.output(self.norm(x))
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(0, 1))


class Gpt3Shard(nn.Module):
    def __init__(self, t, tp):
        super().__init__()
        h = t["hidden"]
        self.heads, self.hd = t["heads"] // tp, h // t["heads"]
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.qkv = nn.Linear(h, 3 * self.heads * self.hd)
        self.proj = nn.Linear(self.heads * self.hd, h)
        self.fc1, self.fc2 = nn.Linear(h, t["ffn_hidden"] // tp), nn.Linear(t["ffn_hidden"] // tp, h)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, self.hd).unbind(2)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.proj(o.transpose(1, 2).reshape(b, s, -1))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


def fsdp_wrap(model):
    """TorchTitan's apply_fsdp at world size 1: each block, then the root."""
    import os
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for i, blk in enumerate(model.layers):
        fully_shard(blk, mp_policy=mp, reshard_after_forward=i < len(model.layers) - 1)
    fully_shard(model, mp_policy=mp)


def build(args, t):
    """The model, its train-step closure and the model FLOPs of one step."""
    b, s = args.micro_batch, args.seq
    if args.family == "llama":
        model = Llama(t, args.layers, s)
        if args.fp8:
            for blk in model.layers:
                blk.use_fp8(t)
        model = model.cuda()
        if args.compile:
            for i, blk in enumerate(model.layers):
                model.layers[i] = torch.compile(blk, fullgraph=True)
        if args.fsdp:
            fsdp_wrap(model)
        h, f, kvd = t["hidden"], t["ffn_hidden"], t["kv_heads"] * t["hidden"] // t["heads"]
        layer_params = 2 * h * h + 2 * h * kvd + 3 * h * f
        weight_flops = 6 * b * s * (args.layers * layer_params + h * t["vocab"])

        def loss_fn():
            idx = torch.randint(0, t["vocab"], (b, s + 1), device="cuda")
            return model(idx[:, :-1], idx[:, 1:])
    else:
        blocks = nn.ModuleList(Gpt3Shard(t, args.tp) for _ in range(args.layers)).cuda()
        model = blocks
        run = [torch.compile(blk, fullgraph=True) if args.compile else blk for blk in blocks]
        h, f = t["hidden"], t["ffn_hidden"] // args.tp
        layer_params = 4 * h * (h // args.tp) + 2 * h * f
        weight_flops = 6 * b * s * args.layers * layer_params
        x0 = torch.randn(b, s, h, device="cuda")
        grad = torch.randn(b, s, h, device="cuda", dtype=torch.bfloat16)

        def loss_fn():
            x = x0
            for blk in run:
                x = blk(x)
            return (x * grad).sum()
    heads = t["heads"] // (args.tp if args.family == "gpt3-shard" else 1)
    # Causal attention: QK^T and AV, forward 2 x 2 b s^2 d heads / 2, backward twice the forward.
    attn_flops = 3 * args.layers * 2 * b * s * s * (t["hidden"] // t["heads"]) * heads
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)

    clip = {"on": True}

    def train_step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=not args.fsdp):
            loss = loss_fn()
        loss.backward()
        if clip["on"]:
            try:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            except Exception as e:  # recorded in the output: the run goes on without clipping
                clip["on"], clip["error"] = False, repr(e)[:200]
        opt.step()
        return loss.item()  # synchronises
    return train_step, weight_flops + attn_flops, clip


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model-json", required=True)
    p.add_argument("--family", choices=["llama", "gpt3-shard"], default="llama")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--tp", type=int, default=8)
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=0, help="default: the model's seq_len")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--fsdp", action="store_true")
    p.add_argument("--fp8", action="store_true", help="llama: the block's linears in fp8 (TE's recipe)")
    p.add_argument("--steps", type=int, default=10, help="timed steps when --seconds is 0")
    p.add_argument("--seconds", type=float, default=0)
    p.add_argument("--power", action="store_true")
    p.add_argument("--profile", default="")
    args = p.parse_args()
    spec = json.load(open(args.model_json))
    t = spec["transformer"]
    args.seq = args.seq or t["seq_len"]
    if args.fp8 and (args.family != "llama" or args.fsdp):
        p.error("--fp8 is for --family llama under autocast (not --fsdp)")
    torch.manual_seed(1234)
    train_step, flops, clip = build(args, t)
    t_compile = time.time()
    for _ in range(3):  # warm-up, compilation
        loss = train_step()
    t_compile = time.time() - t_compile
    sampler = None
    if args.power:
        from gpu_sampler import Sampler
        sampler = Sampler().start()
    times, t0 = [], time.time()
    while (args.seconds > 0 and time.time() - t0 < args.seconds) or (args.seconds <= 0 and len(times) < args.steps):
        s0 = time.perf_counter()
        loss = train_step()
        times.append(time.perf_counter() - s0)
    t1 = time.time()
    clock = sampler.summary(t0, t1, skip_s=2.0) if sampler else {}
    if sampler:
        sampler.stop()
    if args.profile:
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
            for _ in range(2):
                train_step()
        prof.export_chrome_trace(args.profile)
    times.sort()
    median = times[len(times) // 2]
    tokens = args.micro_batch * args.seq
    print(json.dumps({"family": args.family, "model": spec.get("name", args.model_json), "layers": args.layers,
                      "tp": args.tp if args.family == "gpt3-shard" else 1, "compile": args.compile, "fsdp": args.fsdp, "fp8": args.fp8,
                      "micro_batch": args.micro_batch, "seq": args.seq, "steps": len(times),
                      "warmup_s": round(t_compile, 1), "step_time_s": median, "tokens_per_s": tokens / median,
                      "model_tflops": flops / median / 1e12, "peak_mem_GiB": torch.cuda.max_memory_allocated() / 2**30,
                      "loss": loss, "clip": clip, "clock": clock}), flush=True)


if __name__ == "__main__":
    main()
