// The attention core of a context-parallel rank in the GPT stage (spec/context_parallel.hpp): the
// rank holds two chunks of each sequence (spec::context_positions) and attends to the whole
// sequence in one of the two algorithms the executor runs, traced as the lowering names its ops:
//   all-gather (Llama 3 §3.3.2; TE's AttnFuncWithCPAndKVAllGather): the keys and values of every
//     rank gathered (cp.kv_all_gather), the rank's queries against them (exec/context_attention),
//     gathered again in backward and their gradients reduce-scattered (cp.kv_reduce_scatter);
//   all-to-all (DeepSpeed-Ulysses, Jacobs et al. 2023): q, k, v traded from the rank's rows of
//     every head for every row of 1/cp of the heads (cp.qkv_all_to_all), the whole-sequence causal
//     attention of those heads (the Backend's kernels), the output traded back (cp.out_all_to_all);
//   ring (Liu et al. 2023; TE's AttnFuncWithCPAndKVP2P): the key/value blocks travel the ring
//     (cp.kv_send) while each rank attends its queries to the block in hand, one flash step
//     (attn.core) per block merged by the log-sum-exp (attn.cp_merge; exec/blockwise_attention);
//     backward the blocks travel the other way with their gradients, which end at their owner,
//     each step's transfer beside its compute as forward's (TE's).
// CPU ranks, fp32 (runner.cpp refuses others).
#pragma once

#include <cstdint>
#include <tuple>
#include <vector>

#include "sextant/exec/backend.hpp"
#include "sextant/exec/context.hpp"
#include "sextant/spec/plan.hpp"

namespace sextant::exec {

class CpAttention {
 public:
  // `heads` and `kv_heads`: this tp rank's; `seq`: the whole sequence's tokens.
  // Logic errors unless 2 cp divides seq (and, for all-to-all, cp divides the heads): the plan's
  // rules (spec::context_parallel_problem) have been checked.
  CpAttention(Context& ctx, int64_t micro_batch, int64_t seq, int64_t heads, int64_t kv_heads,
              int64_t head_dim);
  // layout() points into the object: not copied or moved.
  CpAttention(const CpAttention&) = delete;
  CpAttention& operator=(const CpAttention&) = delete;

  // Whether backward reads the head block's q, k, v that forward keeps (all-to-all), rather than
  // the rank's own rows of qkv (all-gather, ring).
  bool keeps_head_block() const { return algorithm_ == spec::ContextAlgorithm::kAllToAll; }

  // The rank's rows of the fused qkv activation: seq / cp a sequence, at their positions.
  const QkvLayout& layout() const { return qkv_; }
  // The runs of consecutive positions among the rank's rows [begin, begin + count) (all of them,
  // or a tp rank's slice under sequence parallelism): (first row from begin, first position,
  // rows), at most two a sequence. Learned position embeddings are added run by run.
  std::vector<std::tuple<int64_t, int64_t, int64_t>> position_runs(int64_t begin,
                                                                   int64_t count) const;

  // out [rows, heads * head_dim] = the attention of the rank's rows; returns the probabilities
  // (ring: the log-sum-exp of each row's scores, [micro_batch, heads, seq / cp]). `keep` receives
  // what backward needs besides qkv, out and what forward returns (Ulysses: the head block's q, k
  // and v of the whole sequences; ring: the key/value block of rank r + 1, the last one forward
  // attended to, where backward starts as Transformer Engine's does; all-gather: nothing).
  Tensor forward(const Tensor& qkv, Tensor& out, Tensor& keep, int32_t layer, spec::Phase phase,
                 int64_t mb);
  // dqkv (every column of the rank's rows) from dout, given forward's qkv, probabilities, keep
  // and out.
  void backward(const Tensor& qkv, const Tensor& probs, const Tensor& keep, const Tensor& out,
                const Tensor& dout, Tensor& dqkv, int32_t layer, int64_t mb);

 private:
  Backend& backend() { return *ctx_.backend; }
  Tensor act(std::vector<int64_t> shape);
  Recorder::Scope comm_scope(models::OpId name, spec::OpClass cls, int64_t elements,
                             spec::Phase phase, int32_t layer, int64_t mb);
  Recorder::Scope op_scope(models::OpId name, int32_t layer, spec::Phase phase, int64_t mb);

  // Rank-ordered blocks of rows (block i: rank i's rows, in its order) <-> the whole sequences.
  void blocks_to_sequences(const Tensor& blocks, Tensor& whole, int64_t width) const;
  void sequences_to_blocks(const Tensor& whole, Tensor& blocks, int64_t width) const;

  // All-gather.
  Tensor gather_keys_values(const Tensor& qkv, int32_t layer, spec::Phase phase, int64_t mb);
  void scatter_key_value_grads(const Tensor& dwhole, Tensor& dqkv, int32_t layer, int64_t mb);
  Tensor gather_forward(const Tensor& qkv, Tensor& out, int32_t layer, spec::Phase phase,
                        int64_t mb);
  void gather_backward(const Tensor& qkv, const Tensor& probs, const Tensor& dout, Tensor& dqkv,
                       int32_t layer, int64_t mb);

  // All-to-all: rank j of the cp group computes q heads [j Hc, (j + 1) Hc) and key/value heads
  // [j Kc, (j + 1) Kc) of every row (Hc, Kc: this tp rank's heads over cp), packed q | k | v.
  QkvLayout head_block_layout() const;
  void take_head_block(const Tensor& whole, Tensor& block, int64_t j) const;
  void put_head_block(const Tensor& block, Tensor& whole, int64_t j) const;
  Tensor ulysses_forward(const Tensor& qkv, Tensor& out, Tensor& qkv_heads, int32_t layer,
                         spec::Phase phase, int64_t mb);
  void ulysses_backward(const Tensor& probs, const Tensor& qkv_heads, const Tensor& dout,
                        Tensor& dqkv, int32_t layer, int64_t mb);

  // Ring: the rank's own keys and values [rows, kv width], taken from its rows of qkv.
  Tensor own_keys_values(const Tensor& qkv);
  // Sends `block` to the rank ahead in `direction` (r + 1 forward, r - 1 backward) and receives
  // the rank behind's into `into` (traced as cp.kv_send of `block`'s size, timing the wait left
  // after `overlap`, which runs between the send's start and the receive).
  enum class RingDirection { kForward, kBackward };
  template <typename Overlap>
  void ring_exchange(const Tensor& block, Tensor& into, RingDirection direction, spec::Phase phase,
                     int32_t layer, int64_t mb, Overlap&& overlap);
  Tensor ring_forward(const Tensor& qkv, Tensor& out, Tensor& last_block, int32_t layer,
                      spec::Phase phase, int64_t mb);
  void ring_backward(const Tensor& qkv, const Tensor& lse, const Tensor& last_block,
                     const Tensor& out, const Tensor& dout, Tensor& dqkv, int32_t layer,
                     int64_t mb);

  Context& ctx_;
  spec::ContextAlgorithm algorithm_;
  int64_t cp_, micro_batch_, seq_, seq_local_, rows_;
  std::vector<int32_t> positions_;     // of the rank's rows in each sequence
  std::vector<int64_t> gathered_row_;  // row q of every rank's blocks -> row of the sequences
  std::vector<std::vector<int32_t>> rank_positions_;  // of every cp rank's rows (ring)
  QkvLayout qkv_;                                     // points into positions_
};

}  // namespace sextant::exec
