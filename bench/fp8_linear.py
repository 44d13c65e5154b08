"""A linear layer with Transformer Engine's FP8 recipe on Hopper, in plain PyTorch (the GPU machine
has no Transformer Engine): forward GEMMs in e4m3 with fast accumulation, output gradients in e5m2,
the data- and weight-gradient GEMMs accumulating in full precision (TE 1.x linear.py: fprop
use_split_accumulator False, dgrad and wgrad True), the weight gradient produced in fp32 (TE's
fuse_wgrad_accumulation writes Megatron's fp32 main_grad). Each operand is cast once with a
transposed copy for the backward GEMM that reads it the other way (TE's cast_transpose), its scale
from its own amax (TE's delayed scaling reads an amax history instead; the kernels are the same
kinds). Under torch.compile the casts fuse as TE's do. For clock, power and kernel-time
measurements of an FP8 training mix (issue 56), not for training quality.

torch._scaled_mm(A, B) needs A row-major and B column-major, every dimension a multiple of 16, and
not both operands e5m2; it returns scale_a * scale_b * (A @ B).
"""
import math

import torch
import torch.nn as nn

E4M3 = getattr(torch, "float8_e4m3fn", None)
E5M2 = getattr(torch, "float8_e5m2", None)
FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}


def quantize(t, kind):
    """The fp8 copy of t and its dequantization scale (a float32 scalar on t's device)."""
    dtype, top = (E4M3, FP8_MAX["e4m3"]) if kind == "e4m3" else (E5M2, FP8_MAX["e5m2"])
    amax = t.detach().abs().amax().float()
    scale = torch.where(amax > 0, top / amax, torch.ones_like(amax))
    q = (t.float() * scale).clamp(-top, top).to(dtype)
    return q, scale.reciprocal()


class Fp8Matmul(torch.autograd.Function):
    """y = x W^T for x [tokens, in] and W [out, in]."""

    @staticmethod
    def forward(ctx, x, w):
        xq, xs = quantize(x, "e4m3")
        wq, ws = quantize(w, "e4m3")
        # B = W^T [in, out] column-major: the row-major [out, in] weight seen transposed.
        y = torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws, out_dtype=torch.bfloat16,
                             use_fast_accum=True)
        # The backward GEMMs read x and W the other way: the transposed copies.
        ctx.save_for_backward(xq.t().contiguous(), xs, wq.t().contiguous(), ws)
        ctx.w_dtype = w.dtype
        return y

    @staticmethod
    def backward(ctx, gy):
        xq_t, xs, wq_t, ws = ctx.saved_tensors  # [in, tokens], [in, out]
        gq, gs = quantize(gy.contiguous(), "e5m2")  # [tokens, out]
        # dgrad [tokens, in] = gy [tokens, out] @ W [out, in]; B column-major is W^T's transpose.
        dx = torch._scaled_mm(gq, wq_t.t(), scale_a=gs, scale_b=ws, out_dtype=torch.bfloat16,
                              use_fast_accum=False)
        # wgrad [out, in] = gy^T [out, tokens] @ x [tokens, in]; A is gy's transposed copy.
        dw = torch._scaled_mm(gq.t().contiguous(), xq_t.t(), scale_a=gs, scale_b=xs,
                              out_dtype=torch.float32, use_fast_accum=False)
        return dx, dw.to(ctx.w_dtype)


class Fp8Linear(nn.Module):
    """nn.Linear without bias, its GEMMs in fp8 (Fp8Matmul); fp32 weights as autocast keeps them."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))  # nn.Linear's initialisation

    def forward(self, x):
        y = Fp8Matmul.apply(x.reshape(-1, x.shape[-1]).to(torch.bfloat16), self.weight)
        return y.view(*x.shape[:-1], y.shape[-1])
