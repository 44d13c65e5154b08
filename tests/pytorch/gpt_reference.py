"""An independent reference for Sextant's executor: the same GPT written in PyTorch, with the same
initial weights and data regenerated here from Sextant's definitions (counter-based normal init
keyed by tensor name and global element index; arithmetic-progression token sequences), trained
with torch.optim.AdamW and clip_grad_norm_. Prints one JSON line per step: {"step", "loss",
"grad_norm"}.

Usage: /usr/bin/python3 gpt_reference.py --model-json MODEL.json --global-batch 8 --micro-batch 2
                                          --steps 5 [--seed 1234] [--lr 1e-3] [--device cuda]
--device cuda runs the reference on the GPU in fp32 (TF32 off), the peer of `sextant run --backend
cuda --precision fp32`. --dtype float64 computes in double precision: for large vocabularies
PyTorch's own fp32 gradients drift (gpt2-124m's 50257-entry tied table: 1e-5..1e-3 relative in the
gradient norm over a few steps, while Sextant's fp32 agrees with float64 to 1e-8), so a float64
reference is the one to compare against there.
"""
import argparse
import json
import math

import numpy as np
import torch
import torch.nn.functional as F

MASK = (1 << 64) - 1


def splitmix64(x):
    """Vectorised over uint64 arrays; wraps modulo 2^64 like the C++."""
    x = (x + np.uint64(0x9E3779B97F4A7C15)) & np.uint64(MASK)
    x = ((x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & np.uint64(MASK)
    x = ((x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & np.uint64(MASK)
    return x ^ (x >> np.uint64(31))


def fnv1a(s):
    h = 1469598103934665603
    for c in s.encode():
        h ^= c
        h = (h * 1099511628211) & MASK
    return h


def init_normal(seed, name, n):
    """exec/src/train/parameters.cpp init_normal for global indices 0..n-1."""
    with np.errstate(over="ignore"):
        key = splitmix64(np.array([seed ^ fnv1a(name)], dtype=np.uint64))[0]
        idx = np.arange(n, dtype=np.uint64)
        base = key ^ (idx * np.uint64(2))
        a = splitmix64(base)
        b = splitmix64(base + np.uint64(1))
    u1 = ((a >> np.uint64(11)).astype(np.float64) + 1.0) / 9007199254740993.0
    u2 = (b >> np.uint64(11)).astype(np.float64) / 9007199254740992.0
    return (np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)).astype(np.float32)


def sequence(seed, index, vocab, seq):
    """exec/src/train/data.cpp SyntheticTokens."""
    with np.errstate(over="ignore"):
        h = int(splitmix64(np.array([seed], dtype=np.uint64) ^ splitmix64(np.array([index], dtype=np.uint64)))[0])
    start = h % vocab
    step = 1 + (h >> 32) % 7
    return [(start + i * step) % vocab for i in range(seq + 1)]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model-json", required=True)
    p.add_argument("--global-batch", type=int, required=True)
    p.add_argument("--micro-batch", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    args = p.parse_args()
    dev = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    t = json.load(open(args.model_json))["transformer"]
    L, h, a, f, V, S = t["layers"], t["hidden"], t["heads"], t["ffn_hidden"], t["vocab"], t["seq_len"]
    # GPT-2 (layernorm, learned positions, GELU, biases, tied) or Llama-style (rmsnorm, rotary,
    # SwiGLU, no biases, untied) and mixes of them, as Sextant's GPT stage builds them.
    # "gelu_new" (GPT-2's, Hugging Face's NewGELUActivation) is the same tanh-form GELU.
    assert t["activation"] in ("gelu", "gelu_new", "swiglu")
    kv = t.get("kv_heads", a)  # grouped-query attention when fewer than the heads
    rmsnorm = t.get("norm", "layernorm") == "rmsnorm"
    rope = t.get("position_embedding", "learned") == "rope"
    swiglu = t["activation"] == "swiglu"
    bias = t.get("bias", True)
    tied = t.get("tied_embeddings", False)
    g = 2 if swiglu else 1
    # A mixture of experts (exec/src/moe/moe_layer.hpp): top-k routing, the chosen logits' softmax as
    # the weights, each expert a SwiGLU/GELU MLP of its own width, shared experts as one MLP. With
    # a capacity factor each expert takes at most ceil(factor * copies / experts) of a
    # micro-batch's copies, those of the highest weights (GShard; Megatron-LM's "probs" policy).
    moe = t.get("moe")
    seed = args.seed
    torch.set_num_threads(1)

    def param(name, shape, std):
        return torch.tensor(std * init_normal(seed, name, int(np.prod(shape))).reshape(shape), device=dev,
                            dtype=dtype, requires_grad=True)

    def ones(n):
        return torch.ones(n, device=dev, dtype=dtype, requires_grad=True)

    def zeros(n):
        return torch.zeros(n, device=dev, dtype=dtype, requires_grad=True)

    def linear_bias(n):  # linear layers carry biases only with "bias": true
        return zeros(n) if bias else None

    def norm_beta():  # layernorm always has its shift (Sextant and the lowering count it); rmsnorm none
        return None if rmsnorm else zeros(h)

    def normalize(x, gamma, beta):
        if rmsnorm:
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * gamma
        return F.layer_norm(x, (h,), gamma, beta, 1e-5)

    def linear(x, w, b):
        return x @ w + b if b is not None else x @ w

    proj_std = 0.02 / math.sqrt(2.0 * L)
    wte = param("wte", (V, h), 0.02)
    decay, no_decay = [wte], []
    wpe = None
    if not rope:
        wpe = param("wpe", (t["max_positions"], h), 0.02)
        decay.append(wpe)
    lm_head = wte if tied else param("lm_head", (V, h), 0.02)
    if not tied:
        decay.append(lm_head)
    blocks = []
    for i in range(L):
        b = f"block{i}"
        p_ = {
            "ln1_g": ones(h), "ln1_b": norm_beta(),
            "qkv_w": param(b + ".attn.qkv.weight", (h, h + 2 * kv * (h // a)), 0.02),
            "qkv_b": linear_bias(h + 2 * kv * (h // a)),
            "proj_w": param(b + ".attn.proj.weight", (h, h), proj_std), "proj_b": linear_bias(h),
            "ln2_g": ones(h), "ln2_b": norm_beta(),
        }
        if moe and i >= moe.get("dense_layers", 0):
            fe = moe.get("expert_ffn_hidden", f)
            fs = moe.get("shared_experts", 0) * fe
            p_["router_w"] = param(b + ".moe.router.weight", (h, moe["experts"]), 0.02)
            p_["experts"] = [(param(f"{b}.moe.expert{e}.fc1.weight", (h, g * fe), 0.02),
                              param(f"{b}.moe.expert{e}.fc2.weight", (fe, h), proj_std))
                             for e in range(moe["experts"])]
            decay += [p_["router_w"]] + [w for pair in p_["experts"] for w in pair]
            if fs > 0:
                p_["shared"] = (param(b + ".moe.shared.fc1.weight", (h, g * fs), 0.02),
                                param(b + ".moe.shared.fc2.weight", (fs, h), proj_std))
                decay += list(p_["shared"])
        else:
            p_["fc1_w"] = param(b + ".mlp.fc1.weight", (h, g * f), 0.02)
            p_["fc1_b"] = linear_bias(g * f)
            p_["fc2_w"] = param(b + ".mlp.fc2.weight", (f, h), proj_std)
            p_["fc2_b"] = linear_bias(h)
            decay += [p_["fc1_w"], p_["fc2_w"]]
        blocks.append(p_)
        decay += [p_["qkv_w"], p_["proj_w"]]
        no_decay += [v for k, v in p_.items()
                     if not k.endswith("_w") and k not in ("experts", "shared") and v is not None]
    lnf_g, lnf_b = ones(h), norm_beta()
    no_decay += [v for v in (lnf_g, lnf_b) if v is not None]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    mask = torch.ones(S, S, device=dev).tril() == 0
    d = h // a
    half = d // 2
    angle = torch.arange(S, dtype=torch.float64)[:, None] * \
        10000.0 ** (-2.0 * torch.arange(half, dtype=torch.float64) / d)[None, :]
    cos, sin = (z.to(device=dev, dtype=dtype) for z in (angle.cos(), angle.sin()))

    def rotate(z):  # [B, a, S, d]: rotate-half rotary embedding (GPT-NeoX, Llama)
        z1, z2 = z[..., :half], z[..., half:]
        return torch.cat((z1 * cos - z2 * sin, z2 * cos + z1 * sin), dim=-1)

    def activate(y):
        if swiglu:
            gate, up = y.split(y.shape[-1] // 2, dim=-1)
            return F.silu(gate) * up
        return F.gelu(y, approximate="tanh")

    def mixture(y, p_):  # y [N, h]: each token through its top-k experts, weighted
        top, chosen = (y @ p_["router_w"]).topk(moe["top_k"], dim=-1)
        weights = top.softmax(-1)
        out = torch.zeros_like(y)
        factor = moe.get("capacity_factor", 0)
        capacity = math.ceil(chosen.numel() / moe["experts"] * factor) if factor > 0 else None
        for e, (w1, w2) in enumerate(p_["experts"]):
            token, slot = (chosen == e).nonzero(as_tuple=True)
            if capacity is not None and len(token) > capacity:
                kept = torch.sort(weights[token, slot].detach(), descending=True,
                                  stable=True).indices[:capacity]
                token, slot = token[kept], slot[kept]
            if len(token) > 0:
                out = out.index_add(0, token, weights[token, slot, None] * (activate(y[token] @ w1) @ w2))
        if "shared" in p_:
            out = out + activate(y @ p_["shared"][0]) @ p_["shared"][1]
        return out

    def forward(tokens):  # tokens [B, S+1] -> summed loss over B*S tokens
        x = wte[tokens[:, :-1]]
        if wpe is not None:
            x = x + wpe[:S]
        B = x.shape[0]
        for p_ in blocks:
            y = normalize(x, p_["ln1_g"], p_["ln1_b"])
            q, k, v = linear(y, p_["qkv_w"], p_["qkv_b"]).split([h, kv * d, kv * d], dim=2)
            q = q.view(B, S, a, d).transpose(1, 2)
            # q head i attends with kv head i // (a // kv)
            k, v = (z.view(B, S, kv, d).transpose(1, 2).repeat_interleave(a // kv, dim=1) for z in (k, v))
            if rope:
                q, k = rotate(q), rotate(k)
            att = (q @ k.transpose(-2, -1)) / math.sqrt(d)
            att = att.masked_fill(mask, float("-inf")).softmax(-1)
            o = (att @ v).transpose(1, 2).reshape(B, S, h)
            x = x + linear(o, p_["proj_w"], p_["proj_b"])
            y = normalize(x, p_["ln2_g"], p_["ln2_b"])
            if "experts" in p_:
                x = x + mixture(y.reshape(-1, h), p_).view(B, S, h)
                continue
            x = x + linear(activate(linear(y, p_["fc1_w"], p_["fc1_b"])), p_["fc2_w"], p_["fc2_b"])
        logits = normalize(x, lnf_g, lnf_b) @ lm_head.t()
        return F.cross_entropy(logits.reshape(-1, V), tokens[:, 1:].reshape(-1), reduction="sum")

    params = decay + no_decay
    for step in range(args.steps):
        opt.zero_grad()
        total = 0.0
        tokens_in_step = args.global_batch * S
        for m in range(args.global_batch // args.micro_batch):
            rows = [sequence(seed, step * args.global_batch + m * args.micro_batch + i, V, S)
                    for i in range(args.micro_batch)]
            loss = forward(torch.tensor(rows, device=dev)) / tokens_in_step
            loss.backward()
            total += loss.item()
        norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        print(json.dumps({"step": step, "loss": total, "grad_norm": float(norm)}))


if __name__ == "__main__":
    main()
