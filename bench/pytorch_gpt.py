"""The same GPT as Sextant's gpt-tiny (GPT-2 block: LayerNorm, GELU tanh, learned positions, tied
embeddings, biases, no dropout) trained with PyTorch on CPU, data parallel over gloo, for a
tokens/s comparison with `sextant run`. One thread per rank, as Sextant's executor uses.

Usage: /usr/bin/python3 bench/pytorch_gpt.py --ranks 2 --global-batch 16 --micro-batch 4 --steps 10
Prints one JSON line: {"ranks", "tokens_per_s", "step_time_s", "loss"}.
"""
import argparse
import json
import math
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, h, heads, ffn):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(h)
        self.qkv = nn.Linear(h, 3 * h)
        self.proj = nn.Linear(h, h)
        self.ln2 = nn.LayerNorm(h)
        self.fc1 = nn.Linear(h, ffn)
        self.fc2 = nn.Linear(ffn, h)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(h, dim=2)
        q, k, v = (t.view(b, s, self.heads, h // self.heads).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(h // self.heads)
        mask = torch.ones(s, s, dtype=torch.float32).tril()
        att = att.masked_fill(mask == 0, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, s, h)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, layers=4, h=128, heads=4, ffn=512, vocab=256, seq=128):
        super().__init__()
        self.wte = nn.Embedding(vocab, h)
        self.wpe = nn.Embedding(seq, h)
        self.blocks = nn.ModuleList(Block(h, heads, ffn) for _ in range(layers))
        self.ln = nn.LayerNorm(h)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for blk in self.blocks:
            x = blk(x)
        logits = self.ln(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def worker(rank, args, out):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29511")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    torch.manual_seed(1234)
    model = Gpt()
    ddp = nn.parallel.DistributedDataParallel(model) if args.ranks > 1 else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    per_rank = args.global_batch // args.ranks
    micro = per_rank // args.micro_batch
    g = torch.Generator().manual_seed(rank)
    times, loss_value = [], 0.0
    for step in range(args.steps + 2):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        for m in range(micro):
            idx = torch.randint(0, 256, (args.micro_batch, 129), generator=g)
            ctx = ddp.no_sync() if args.ranks > 1 and m < micro - 1 else torch.enable_grad()
            with ctx:
                loss = ddp(idx[:, :-1], idx[:, 1:]) / micro
                loss.backward()
            loss_value = loss.item() * micro
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step >= 2:  # two warm-up steps
            times.append(time.perf_counter() - t0)
    step_time = sum(times) / len(times)
    if rank == 0:
        out.put({"ranks": args.ranks, "tokens_per_s": args.global_batch * 128 / step_time,
                 "step_time_s": step_time, "loss": loss_value})
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--global-batch", type=int, default=16)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=10)
    args = p.parse_args()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    mp.spawn(worker, args=(args, out), nprocs=args.ranks, join=True)
    print(json.dumps(out.get()))


if __name__ == "__main__":
    main()
