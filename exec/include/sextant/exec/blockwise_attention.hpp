// Blockwise causal attention: the kernels of a ring attention step on CPU ranks (Liu et al. 2023,
// "Ring Attention with Blockwise Transformers"; Transformer Engine's AttnFuncWithCPAndKVP2P runs
// them as flash attention calls). A step attends a rank's query rows to one block of key rows and
// keeps no probabilities: its output and the log-sum-exp of each row's scores (FlashAttention,
// Dao et al. 2022, §3.1), which `merge` folds into the running output (Milakov & Gimelshein 2018,
// "Online normalizer calculation for softmax": o = o_a e^(l_a - l) + o_b e^(l_b - l),
// l = log(e^l_a + e^l_b)). Backward recomputes each block's probabilities from the final
// log-sum-exp, P = exp(S - lse), and uses delta = rowsum(dO * O) for the softmax's backward
// (FlashAttention-2, Dao 2023, Algorithm 2): dS = P * (dP - delta). fp32 on host memory.
//
// Masking is by position (context::Geometry's q.positions and kv_positions): key j is seen by a
// query at position p when its position is at most p. A row that sees no key of the block has a
// zero output and a log-sum-exp of -infinity, which merge leaves out.
#pragma once

#include "sextant/exec/context_attention.hpp"
#include "sextant/exec/tensor.hpp"

namespace sextant::exec::blockwise {

// out [batch * q.seq, heads * head_dim] and lse [batch, heads, q.seq] of the rank's q rows of
// `qkv` against the key block `kv` [batch * kv_seq, 2 * kv_heads * head_dim] (k heads, then v).
void forward(const Tensor& qkv, const Tensor& kv, const context::Geometry& g, Tensor& out,
             Tensor& lse);

// In place: (out, lse) becomes the attention over the keys of both (out, lse) and (block_out,
// block_lse), whose key sets are disjoint.
void merge(Tensor& out, Tensor& lse, const Tensor& block_out, const Tensor& block_lse);

// delta [batch, heads, q.seq] = the sum over each head's columns of dout * out (both
// [batch * q.seq, heads * head_dim]): FlashAttention-2's D, computed once before the steps.
void backward_prep(const Tensor& out, const Tensor& dout, const QkvLayout& q, Tensor& delta);

// One block's share of the gradients, given the final lse and delta: dq [batch * q.seq,
// heads * head_dim] and dkv (the block's k and v heads, the layout of kv), both overwritten.
void backward(const Tensor& qkv, const Tensor& kv, const Tensor& dout, const Tensor& lse,
              const Tensor& delta, const context::Geometry& g, Tensor& dq, Tensor& dkv);

}  // namespace sextant::exec::blockwise
