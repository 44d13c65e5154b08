"""The single-GPU peer of `sextant run --backend cuda`: the same GPT-2 block (LayerNorm, GELU tanh,
learned positions, tied embeddings, biases, no dropout), sized from a Sextant model JSON, trained
with AdamW on random tokens. Precision: fp32, tf32, or bf16 autocast (fp32 weights, bf16 GEMMs and
activations) — Sextant's bf16 mode keeps fp32 tensors and runs bf16 tensor-core GEMMs, so the
closest PyTorch peer is bf16 autocast. Attention: "explicit" (softmax(QK^T)V materialised, as
Sextant's executor does) or "sdpa" (PyTorch's fused flash attention). --compile uses torch.compile.

Usage: python3 bench/pytorch_gpt_cuda.py --model-json models/zoo/gpt2-124m.json --micro-batch 8
           --steps 20 [--precision bf16] [--attention explicit] [--compile] [--profile TRACE.json]
--profile records two more steps after the timed ones with torch.profiler (CPU and CUDA activities,
shapes) and writes them as a Kineto Chrome trace, for `sextant calibrate --kineto`.
Prints one JSON line: tokens_per_s, step_time_s, model_tflops (6 N T + attention), loss.
"""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, h, heads, ffn, attention):
        super().__init__()
        self.heads, self.attention = heads, attention
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.qkv, self.proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
        self.fc1, self.fc2 = nn.Linear(h, ffn), nn.Linear(ffn, h)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(h, dim=2)
        q, k, v = (t.view(b, s, self.heads, h // self.heads).transpose(1, 2) for t in (q, k, v))
        if self.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(h // self.heads)
            mask = torch.ones(s, s, device=x.device, dtype=torch.bool).tril()
            y = att.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v
        x = x + self.proj(y.transpose(1, 2).reshape(b, s, h))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, t, attention):
        super().__init__()
        self.wte = nn.Embedding(t["vocab"], t["hidden"])
        self.wpe = nn.Embedding(t["max_positions"], t["hidden"])
        self.blocks = nn.ModuleList(Block(t["hidden"], t["heads"], t["ffn_hidden"], attention)
                                    for _ in range(t["layers"]))
        self.ln = nn.LayerNorm(t["hidden"])

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = self.ln(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model-json", required=True)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=0, help="default: the model's seq_len")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--precision", choices=["fp32", "tf32", "bf16"], default="bf16")
    p.add_argument("--attention", choices=["explicit", "sdpa"], default="explicit")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--profile", default="", help="write a Kineto trace of two further steps here")
    args = p.parse_args()
    t = json.load(open(args.model_json))["transformer"]
    seq = args.seq or t["seq_len"]
    torch.backends.cuda.matmul.allow_tf32 = args.precision == "tf32"
    torch.manual_seed(1234)
    model = Gpt(t, args.attention).cuda()
    step_fn = torch.compile(model) if args.compile else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    n_params = sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()
    times, loss_value = [], 0.0
    def train_step():
        idx = torch.randint(0, t["vocab"], (args.micro_batch, seq + 1), device="cuda")
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss = step_fn(idx[:, :-1], idx[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.item()  # synchronises

    for step in range(args.steps + 3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss_value = train_step()
        if step >= 3:  # warm-up (and compilation)
            times.append(time.perf_counter() - t0)
    if args.profile:
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
            for _ in range(2):
                train_step()
        prof.export_chrome_trace(args.profile)
    step_time = sum(times) / len(times)
    tokens = args.micro_batch * seq
    # Model FLOPs per step: 6 N per token for the weights, 12 L h s per token for attention scores
    # and context (forward 4 L h s, backward twice that), without recomputation.
    flops = 6 * n_params * tokens + 12 * t["layers"] * t["hidden"] * seq * tokens
    print(json.dumps({"precision": args.precision, "attention": args.attention, "compile": args.compile,
                      "micro_batch": args.micro_batch, "seq": seq, "tokens_per_s": tokens / step_time,
                      "step_time_s": step_time, "model_tflops": flops / step_time / 1e12, "loss": loss_value}))


if __name__ == "__main__":
    main()
