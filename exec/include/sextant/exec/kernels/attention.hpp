// A backend's attention kernels: rotary embedding and causal self-attention in the three steps
// the trace names (backend.hpp).
#pragma once

#include <cstdint>

#include "sextant/exec/tensor.hpp"

namespace sextant::exec {

// The fused qkv activation [batch*seq, width()]: the q heads, then the k heads, then the v heads
// (head-major, head_dim columns each). q head h attends with kv head h / group(): grouped-query
// attention (Ainslie et al. 2023); kv_heads == heads is multi-head attention.
struct QkvLayout {
  int64_t batch = 0, seq = 0, heads = 0, kv_heads = 0, head_dim = 0;
  // The position of each of a sequence's `seq` rows in the whole sequence (a context-parallel
  // rank's chunks: spec::context_positions), or null: row r of a sequence is at position r.
  const int32_t* positions = nullptr;
  int64_t position(int64_t row) const {
    return positions != nullptr ? positions[row % seq] : row % seq;
  }
  int64_t group() const { return heads / kv_heads; }
  int64_t width() const { return (heads + 2 * kv_heads) * head_dim; }
  int64_t q_column(int64_t h) const { return h * head_dim; }
  int64_t k_column(int64_t h) const { return (heads + h / group()) * head_dim; }  // of q head h
  int64_t v_column(int64_t h) const { return (heads + kv_heads + h / group()) * head_dim; }
  // A logic error unless qkv is [batch*seq, width()] and the heads divide into groups.
  void check(const Tensor& qkv) const;
};

class AttentionKernels {
 public:
  virtual ~AttentionKernels() = default;

  // Rotary position embedding (RoFormer, in the rotate-half layout of GPT-NeoX and Llama) in place
  // on the q and k heads of qkv: within each head, dimension i of the first half and i of the
  // second rotate by l.position(row) * base^(-2i/head_dim) (CUDA: positions null only). inverse
  // rotates back (the backward pass, applied to dq and dk).
  virtual void rope(Tensor& qkv, const QkvLayout& l, float base, bool inverse) = 0;
  // Causal self-attention, in the three steps the trace names (attn.scores, attn.softmax,
  // attn.context), over qkv laid out as QkvLayout says; scores and probabilities =
  // [batch, heads, seq, seq]; out = [batch*seq, heads*head_dim].
  virtual void attention_scores(const Tensor& qkv, const QkvLayout& l,
                                Tensor& scores) = 0;                      // q k^T / sqrt(head_dim)
  virtual void causal_softmax(Tensor& scores_to_probs, int64_t seq) = 0;  // in place, masked
  virtual void attention_context(const Tensor& probs, const Tensor& qkv, const QkvLayout& l,
                                 Tensor& out) = 0;  // probs v
  // dprobs = dout v^T; the v heads of dqkv = sum over their q heads of probs^T dout (q and k
  // heads untouched).
  virtual void attention_context_backward(const Tensor& probs, const Tensor& qkv,
                                          const Tensor& dout, const QkvLayout& l, Tensor& dprobs,
                                          Tensor& dqkv) = 0;
  // In place: dprobs -> dscores = probs * (dprobs - rowsum(dprobs * probs)), zero above diagonal.
  virtual void causal_softmax_backward(const Tensor& probs, Tensor& dprobs_to_dscores,
                                       int64_t seq) = 0;
  // The q and k heads of dqkv from dscores (the v heads untouched; each k head sums over its
  // q heads).
  virtual void attention_scores_backward(const Tensor& dscores, const Tensor& qkv,
                                         const QkvLayout& l, Tensor& dqkv) = 0;

  // Fused causal self-attention (FlashAttention-2, Dao 2023, Algorithms 1 and 2), traced as
  // attn.core (and attn.core_prep before its backward): no s x s tensor is kept. out [batch*seq,
  // heads*head_dim]; lse [batch, heads, seq] fp32, the log-sum-exp of each row's scaled scores.
  // Positions null only (a context-parallel rank runs exec/blockwise_attention.hpp); on CUDA
  // head_dim up to 128 (bf16) or 112 (fp32: its tiles' shared memory).
  virtual void flash_attention(const Tensor& qkv, const QkvLayout& l, Tensor& out, Tensor& lse) = 0;
  // delta [batch, heads, seq] fp32 = the sum over each head's columns of dout * out.
  virtual void flash_attention_backward_prep(const Tensor& out, const Tensor& dout,
                                             const QkvLayout& l, Tensor& delta) = 0;
  // Every head of dqkv (q, k and v) overwritten, the probabilities recomputed from lse:
  // dS = P * (dP - delta); a k or v head sums over its group's q heads.
  virtual void flash_attention_backward(const Tensor& qkv, const Tensor& dout, const Tensor& lse,
                                        const Tensor& delta, const QkvLayout& l, Tensor& dqkv) = 0;
};

}  // namespace sextant::exec
