// Causal attention of a context-parallel rank (all-gather algorithm, Llama 3 §3.3.2; Transformer
// Engine's AttnFuncWithCPAndKVAllGather): the rank's query rows, at their positions in the
// sequence (spec::context_positions), attend to the keys and values of the whole sequence,
// gathered from every rank; key j is masked for a query at position p when j > p. The three
// steps the trace names (attn.scores, attn.softmax, attn.context) and their backward, on CPU ranks
// in fp32, with the conventions of the Backend's attention kernels (backward kernels overwrite
// what they write). With one rank (positions 0..s-1, the keys those of the same rows) they are
// the Backend's causal attention.
#pragma once

#include <cstdint>

#include "sextant/exec/backend.hpp"
#include "sextant/exec/tensor.hpp"

namespace sextant::exec::context {

// q: the rank's rows of the fused qkv activation (q.seq rows a sequence, q.positions theirs);
// keys and values: kv [batch * kv_seq, 2 * kv_heads * head_dim], the k heads then the v heads,
// each sequence's rows in sequence order. Scores and probabilities [batch, heads, q.seq, kv_seq].
struct Geometry {
  QkvLayout q;
  int64_t kv_seq = 0;
  // The positions of a sequence's kv_seq key rows (a ring attention step's block:
  // exec/blockwise_attention.hpp), or null: key row j is at position j (the whole sequence, as
  // the all-gather functions below take it).
  const int32_t* kv_positions = nullptr;
  int64_t key_position(int64_t j) const { return kv_positions != nullptr ? kv_positions[j] : j; }
  int64_t kv_width() const { return 2 * q.kv_heads * q.head_dim; }
  int64_t k_column(int64_t h) const { return h / q.group() * q.head_dim; }  // of q head h
  int64_t v_column(int64_t h) const { return (q.kv_heads + h / q.group()) * q.head_dim; }
};

// scores = q k^T / sqrt(head_dim).
void scores(const Tensor& qkv, const Tensor& kv, const Geometry& g, Tensor& scores);
// In place: softmax over the keys at or before each query's position, 0 after it.
void masked_softmax(Tensor& scores_to_probs, const Geometry& g);
// out [batch * q.seq, heads * head_dim] = probs v.
void context(const Tensor& probs, const Tensor& kv, const Geometry& g, Tensor& out);
// dprobs = dout v^T; the v heads of dkv = sum over their q heads of probs^T dout.
void context_backward(const Tensor& probs, const Tensor& kv, const Tensor& dout, const Geometry& g,
                      Tensor& dprobs, Tensor& dkv);
// In place: dprobs -> dscores = probs * (dprobs - rowsum(dprobs * probs)), 0 where masked.
void masked_softmax_backward(const Tensor& probs, Tensor& dprobs_to_dscores, const Geometry& g);
// The q heads of dqkv (the rank's rows) and the k heads of dkv (the whole sequence) from dscores.
void scores_backward(const Tensor& dscores, const Tensor& qkv, const Tensor& kv, const Geometry& g,
                     Tensor& dqkv, Tensor& dkv);

}  // namespace sextant::exec::context
