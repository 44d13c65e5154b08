// A context-parallel rank's attention core: all-gather and all-to-all (DeepSpeed-Ulysses).
#include "sextant/exec/cp_attention.hpp"

#include <algorithm>
#include <array>
#include <utility>

#include "comm/activation_comm.hpp"
#include "sextant/exec/blockwise_attention.hpp"
#include "sextant/exec/context_attention.hpp"
#include "sextant/spec/context_parallel.hpp"
#include "sextant/spec/error.hpp"

namespace sextant::exec {

using models::OpId;

using spec::OpClass;
using spec::Phase;
using spec::Stream;

CpAttention::CpAttention(Context& ctx, int64_t micro_batch, int64_t seq, int64_t heads,
                         int64_t kv_heads, int64_t head_dim)
    : ctx_(ctx),
      algorithm_(ctx.plan->cp_algorithm),
      cp_(ctx.groups->cp_size),
      micro_batch_(micro_batch),
      seq_(seq),
      seq_local_(seq / cp_),
      rows_(micro_batch * seq_local_),
      positions_(spec::context_positions(seq, cp_, ctx.groups->cp_rank)) {
  SEXTANT_CHECK(cp_ > 1 && seq % (2 * cp_) == 0, "sequences of {} tokens over cp {}", seq, cp_);
  SEXTANT_CHECK(
      algorithm_ != spec::ContextAlgorithm::kAllToAll || (heads % cp_ == 0 && kv_heads % cp_ == 0),
      "all-to-all over cp {} of {} heads and {} key/value heads", cp_, heads, kv_heads);
  qkv_ = {micro_batch, seq_local_, heads, kv_heads, head_dim, positions_.data()};
  for (int64_t j = 0; j < cp_; ++j) {
    rank_positions_.push_back(spec::context_positions(seq_, cp_, j));
    const std::vector<int32_t>& theirs = rank_positions_.back();
    for (int64_t r = 0; r < rows_; ++r)
      gathered_row_.push_back(r / seq_local_ * seq_ + theirs[static_cast<size_t>(r % seq_local_)]);
  }
}

std::vector<std::tuple<int64_t, int64_t, int64_t>> CpAttention::position_runs(int64_t begin,
                                                                              int64_t count) const {
  // Runs of consecutive positions in spec::context_positions, cut by sequence and by the rows
  // asked for.
  std::vector<std::tuple<int64_t, int64_t, int64_t>> runs;
  for (int64_t row = begin; row < begin + count;) {
    const int64_t at = row % seq_local_;
    int64_t n = 1;
    while (row + n < begin + count && at + n < seq_local_ &&
           positions_[static_cast<size_t>(at + n)] == positions_[static_cast<size_t>(at)] + n)
      ++n;
    runs.emplace_back(row - begin, positions_[static_cast<size_t>(at)], n);
    row += n;
  }
  return runs;
}

Tensor CpAttention::forward(const Tensor& qkv, Tensor& out, Tensor& keep, int32_t layer,
                            Phase phase, int64_t mb) {
  if (algorithm_ == spec::ContextAlgorithm::kAllToAll)
    return ulysses_forward(qkv, out, keep, layer, phase, mb);
  if (algorithm_ == spec::ContextAlgorithm::kRing)
    return ring_forward(qkv, out, keep, layer, phase, mb);
  return gather_forward(qkv, out, layer, phase, mb);
}

void CpAttention::backward(const Tensor& qkv, const Tensor& probs, const Tensor& keep,
                           const Tensor& out, const Tensor& dout, Tensor& dqkv, int32_t layer,
                           int64_t mb) {
  if (algorithm_ == spec::ContextAlgorithm::kAllToAll) {
    ulysses_backward(probs, keep, dout, dqkv, layer, mb);
  } else if (algorithm_ == spec::ContextAlgorithm::kRing) {
    ring_backward(qkv, probs, keep, out, dout, dqkv, layer, mb);
  } else {
    gather_backward(qkv, probs, dout, dqkv, layer, mb);
  }
}

Tensor CpAttention::act(std::vector<int64_t> shape) {
  return backend().empty(std::move(shape), backend().activation_dtype());
}

Recorder::Scope CpAttention::comm_scope(OpId name, OpClass cls, int64_t elements, Phase phase,
                                        int32_t layer, int64_t mb) {
  return ctx_.recorder->scope(ctx_.comm(
      name, cls, Stream::kTpComm, activation_wire_bytes(backend().activation_dtype(), elements),
      cp_, phase, layer, mb));
}

Recorder::Scope CpAttention::op_scope(OpId name, int32_t layer, Phase phase, int64_t mb) {
  return ctx_.recorder->scope(ctx_.op(name, layer, phase, mb));
}

void CpAttention::blocks_to_sequences(const Tensor& blocks, Tensor& whole, int64_t width) const {
  for (size_t q = 0; q < gathered_row_.size(); ++q)
    std::copy_n(blocks.data() + static_cast<int64_t>(q) * width, width,
                whole.data() + gathered_row_[q] * width);
}

void CpAttention::sequences_to_blocks(const Tensor& whole, Tensor& blocks, int64_t width) const {
  for (size_t q = 0; q < gathered_row_.size(); ++q)
    std::copy_n(whole.data() + gathered_row_[q] * width, width,
                blocks.data() + static_cast<int64_t>(q) * width);
}

// The k and v heads of the rank's rows of qkv [rows, kv width].
Tensor CpAttention::own_keys_values(const Tensor& qkv) {
  const int64_t w = 2 * qkv_.kv_heads * qkv_.head_dim, q_width = qkv_.heads * qkv_.head_dim;
  Tensor mine = act({rows_, w});
  for (int64_t r = 0; r < rows_; ++r)
    std::copy_n(qkv.data() + r * qkv_.width() + q_width, w, mine.data() + r * w);
  return mine;
}

// --- All-gather --------------------------------------------------------------------------------

// The keys and values of the whole sequences [micro_batch * seq, kv width], all-gathered from the
// cp ranks' rows of `qkv` (each rank's k and v heads follow its q heads).
Tensor CpAttention::gather_keys_values(const Tensor& qkv, int32_t layer, Phase phase, int64_t mb) {
  const int64_t w = 2 * qkv_.kv_heads * qkv_.head_dim;
  const Tensor mine = own_keys_values(qkv);
  Tensor blocks = act({cp_ * rows_, w});
  {
    auto s =
        comm_scope(OpId::kCpKvAllGather, OpClass::kAllGather, cp_ * rows_ * w, phase, layer, mb);
    all_gather(*ctx_.groups->cp, mine, blocks);
  }
  Tensor whole = act({micro_batch_ * seq_, w});
  blocks_to_sequences(blocks, whole, w);
  return whole;
}

// The backward of gather_keys_values: the whole sequences' key and value gradients summed over the
// cp ranks, each rank's rows written into the k and v heads of its dqkv.
void CpAttention::scatter_key_value_grads(const Tensor& dwhole, Tensor& dqkv, int32_t layer,
                                          int64_t mb) {
  const int64_t w = 2 * qkv_.kv_heads * qkv_.head_dim, q_width = qkv_.heads * qkv_.head_dim;
  Tensor blocks = act({cp_ * rows_, w});
  sequences_to_blocks(dwhole, blocks, w);
  Tensor mine = act({rows_, w});
  {
    auto s = comm_scope(OpId::kCpKvReduceScatter, OpClass::kReduceScatter, cp_ * rows_ * w,
                        Phase::kBwd, layer, mb);
    reduce_scatter(*ctx_.groups->cp, blocks, mine);
  }
  for (int64_t r = 0; r < rows_; ++r)
    std::copy_n(mine.data() + r * w, w, dqkv.data() + r * qkv_.width() + q_width);
}

Tensor CpAttention::gather_forward(const Tensor& qkv, Tensor& out, int32_t layer, Phase phase,
                                   int64_t mb) {
  const context::Geometry g{qkv_, seq_};
  const Tensor kv = gather_keys_values(qkv, layer, phase, mb);
  Tensor probs = act({micro_batch_, qkv_.heads, seq_local_, seq_});
  {
    auto s = op_scope(OpId::kAttnScores, layer, phase, mb);
    context::scores(qkv, kv, g, probs);
  }
  {
    auto s = op_scope(OpId::kAttnSoftmax, layer, phase, mb);
    context::masked_softmax(probs, g);
  }
  {
    auto s = op_scope(OpId::kAttnContext, layer, phase, mb);
    context::context(probs, kv, g, out);
  }
  return probs;
}

// The keys and values gathered again (only the rank's own are kept), their gradients over the
// whole sequences reduce-scattered back to the ranks holding them.
void CpAttention::gather_backward(const Tensor& qkv, const Tensor& probs, const Tensor& dout,
                                  Tensor& dqkv, int32_t layer, int64_t mb) {
  const Phase B = Phase::kBwd;
  const context::Geometry g{qkv_, seq_};
  const Tensor kv = gather_keys_values(qkv, layer, B, mb);
  Tensor dkv = backend().zeros({micro_batch_ * seq_, g.kv_width()});
  Tensor dprobs = act({micro_batch_, qkv_.heads, seq_local_, seq_});
  {
    auto s = op_scope(OpId::kAttnContext, layer, B, mb);
    context::context_backward(probs, kv, dout, g, dprobs, dkv);
  }
  {
    auto s = op_scope(OpId::kAttnSoftmax, layer, B, mb);
    context::masked_softmax_backward(probs, dprobs, g);
  }
  {
    auto s = op_scope(OpId::kAttnScores, layer, B, mb);
    context::scores_backward(dprobs, qkv, kv, g, dqkv, dkv);
  }
  scatter_key_value_grads(dkv, dqkv, layer, mb);
}

// --- All-to-all (Ulysses) ----------------------------------------------------------------------

QkvLayout CpAttention::head_block_layout() const {
  return {micro_batch_, seq_, qkv_.heads / cp_, qkv_.kv_heads / cp_, qkv_.head_dim};
}

namespace {

// Where head block j lies in a row of the rank's qkv and in a row of the block: (column in the
// whole row, column in the block, width) of its q, k and v parts.
std::array<std::array<int64_t, 3>, 3> head_block_parts(const QkvLayout& l, const QkvLayout& hb,
                                                       int64_t j) {
  const int64_t d = l.head_dim;
  return {{{j * hb.heads * d, 0, hb.heads * d},
           {(l.heads + j * hb.kv_heads) * d, hb.heads * d, hb.kv_heads * d},
           {(l.heads + l.kv_heads + j * hb.kv_heads) * d, (hb.heads + hb.kv_heads) * d,
            hb.kv_heads * d}}};
}

}  // namespace

void CpAttention::take_head_block(const Tensor& whole, Tensor& block, int64_t j) const {
  const QkvLayout hb = head_block_layout();
  const int64_t w = qkv_.width(), bw = hb.width();
  for (int64_t r = 0; r < rows_; ++r)
    for (const auto& [at, in_block, width] : head_block_parts(qkv_, hb, j))
      std::copy_n(whole.data() + r * w + at, width, block.data() + r * bw + in_block);
}

void CpAttention::put_head_block(const Tensor& block, Tensor& whole, int64_t j) const {
  const QkvLayout hb = head_block_layout();
  const int64_t w = qkv_.width(), bw = hb.width();
  for (int64_t r = 0; r < rows_; ++r)
    for (const auto& [at, in_block, width] : head_block_parts(qkv_, hb, j))
      std::copy_n(block.data() + r * bw + in_block, width, whole.data() + r * w + at);
}

Tensor CpAttention::ulysses_forward(const Tensor& qkv, Tensor& out, Tensor& qkv_heads,
                                    int32_t layer, Phase phase, int64_t mb) {
  Backend& be = backend();
  const QkvLayout hb = head_block_layout();
  Tensor send = act({cp_ * rows_, hb.width()});
  for (int64_t j = 0; j < cp_; ++j) {
    Tensor block = send.rows(j * rows_, rows_);
    take_head_block(qkv, block, j);
  }
  Tensor received = act({cp_ * rows_, hb.width()});
  {
    auto s = comm_scope(OpId::kCpQkvAllToAll, OpClass::kAllToAll, rows_ * qkv_.width(), phase,
                        layer, mb);
    all_to_all(*ctx_.groups->cp, send, received);
  }
  qkv_heads = act({micro_batch_ * seq_, hb.width()});
  blocks_to_sequences(received, qkv_heads, hb.width());
  const int64_t hd = hb.heads * hb.head_dim, width = qkv_.heads * qkv_.head_dim;
  Tensor probs = act({micro_batch_, hb.heads, seq_, seq_});
  Tensor o = act({micro_batch_ * seq_, hd});
  {
    auto s = op_scope(OpId::kAttnScores, layer, phase, mb);
    be.attention_scores(qkv_heads, hb, probs);
  }
  {
    auto s = op_scope(OpId::kAttnSoftmax, layer, phase, mb);
    be.causal_softmax(probs, seq_);
  }
  {
    auto s = op_scope(OpId::kAttnContext, layer, phase, mb);
    be.attention_context(probs, qkv_heads, hb, o);
  }
  Tensor back = act({cp_ * rows_, hd});
  sequences_to_blocks(o, back, hd);
  Tensor mine = act({cp_ * rows_, hd});
  {
    auto s = comm_scope(OpId::kCpOutAllToAll, OpClass::kAllToAll, rows_ * width, phase, layer, mb);
    all_to_all(*ctx_.groups->cp, back, mine);
  }
  // Block j holds the rank's rows of head block j: columns [j hd, (j + 1) hd) of the output.
  for (int64_t j = 0; j < cp_; ++j)
    for (int64_t r = 0; r < rows_; ++r)
      std::copy_n(mine.data() + (j * rows_ + r) * hd, hd, out.data() + r * width + j * hd);
  return probs;
}

void CpAttention::ulysses_backward(const Tensor& probs, const Tensor& qkv_heads, const Tensor& dout,
                                   Tensor& dqkv, int32_t layer, int64_t mb) {
  Backend& be = backend();
  const Phase B = Phase::kBwd;
  const QkvLayout hb = head_block_layout();
  const int64_t hd = hb.heads * hb.head_dim, width = qkv_.heads * qkv_.head_dim;
  Tensor send = act({cp_ * rows_, hd});
  for (int64_t j = 0; j < cp_; ++j)
    for (int64_t r = 0; r < rows_; ++r)
      std::copy_n(dout.data() + r * width + j * hd, hd, send.data() + (j * rows_ + r) * hd);
  Tensor received = act({cp_ * rows_, hd});
  {
    auto s = comm_scope(OpId::kCpOutAllToAll, OpClass::kAllToAll, rows_ * width, B, layer, mb);
    all_to_all(*ctx_.groups->cp, send, received);
  }
  Tensor d_o = act({micro_batch_ * seq_, hd});
  blocks_to_sequences(received, d_o, hd);
  Tensor dheads = act({micro_batch_ * seq_, hb.width()});
  Tensor dprobs = act({micro_batch_, hb.heads, seq_, seq_});
  {
    auto s = op_scope(OpId::kAttnContext, layer, B, mb);
    be.attention_context_backward(probs, qkv_heads, d_o, hb, dprobs, dheads);
  }
  {
    auto s = op_scope(OpId::kAttnSoftmax, layer, B, mb);
    be.causal_softmax_backward(probs, dprobs, seq_);
  }
  {
    auto s = op_scope(OpId::kAttnScores, layer, B, mb);
    be.attention_scores_backward(dprobs, qkv_heads, hb, dheads);
  }
  Tensor back = act({cp_ * rows_, hb.width()});
  sequences_to_blocks(dheads, back, hb.width());
  Tensor mine = act({cp_ * rows_, hb.width()});
  {
    auto s =
        comm_scope(OpId::kCpQkvAllToAll, OpClass::kAllToAll, rows_ * qkv_.width(), B, layer, mb);
    all_to_all(*ctx_.groups->cp, back, mine);
  }
  for (int64_t j = 0; j < cp_; ++j) put_head_block(mine.rows(j * rows_, rows_), dqkv, j);
}

// --- Ring -------------------------------------------------------------------------------------

namespace {

// Tag of the ring's transfers on the cp communicator (its only point-to-point traffic).
constexpr int kRingTag = 17;

}  // namespace

template <typename Overlap>
void CpAttention::ring_exchange(const Tensor& block, Tensor& into, RingDirection direction,
                                Phase phase, int32_t layer, int64_t mb, Overlap&& overlap) {
  Communicator& ring = *ctx_.groups->cp;
  const int ahead = direction == RingDirection::kForward ? 1 : ring.size() - 1;
  const int to = (ring.rank() + ahead) % ring.size();
  const int from = (ring.rank() + ring.size() - ahead) % ring.size();
  auto [request, sent] = send(ring, block, to, kRingTag);
  overlap();
  // The scope times what the rank still waits for once its compute is done.
  auto s = comm_scope(OpId::kCpKvSend, OpClass::kSend, block.numel(), phase, layer, mb);
  recv(ring, into, from, kRingTag);
  request->wait();
}

// Step i attends the rank's queries to the block of rank (r - i) mod cp, its own first (the only
// one under the diagonal of the causal mask), while that block moves on to rank r + 1.
Tensor CpAttention::ring_forward(const Tensor& qkv, Tensor& out, Tensor& last_block, int32_t layer,
                                 Phase phase, int64_t mb) {
  const int64_t r = ctx_.groups->cp_rank, w = 2 * qkv_.kv_heads * qkv_.head_dim;
  const int64_t width = qkv_.heads * qkv_.head_dim;
  Tensor lse = act({micro_batch_, qkv_.heads, seq_local_});
  Tensor block = own_keys_values(qkv), step_out = act({rows_, width}), step_lse = act(lse.shape());
  for (int64_t i = 0; i < cp_; ++i) {
    const int64_t owner = (r - i + cp_) % cp_;
    const context::Geometry g{qkv_, seq_local_, rank_positions_[static_cast<size_t>(owner)].data()};
    auto attend = [&] {
      {
        auto s = op_scope(OpId::kAttnCore, layer, phase, mb);
        blockwise::forward(qkv, block, g, i == 0 ? out : step_out, i == 0 ? lse : step_lse);
      }
      if (i > 0) {
        auto s = op_scope(OpId::kAttnCpMerge, layer, phase, mb);
        blockwise::merge(out, lse, step_out, step_lse);
      }
    };
    if (i + 1 == cp_) {
      attend();
    } else {
      Tensor next = act({rows_, w});
      ring_exchange(block, next, RingDirection::kForward, phase, layer, mb, attend);
      block = next;
    }
  }
  // The block the last step attended to (rank r + 1's): backward starts on it (TE saves it).
  last_block = block;
  return lse;
}

// The steps in reverse (Transformer Engine's AttnFuncWithCPAndKVP2P.backward): the blocks travel
// the other way (to rank r - 1), starting from the one forward ended on, so step i attends to the
// block of rank (r + 1 + i) mod cp, the rank's own last. Each step sends what it holds while it
// computes: the block's keys and values, and the gradient of the block it attended to in the step
// before, summed over the ranks that attended to it earlier (the rank it goes to attends to that
// block now). The first step sends keys and values only, the last one the gradient only; the
// received gradient gets the step's own added after the wait, and after the last step it is the
// rank's own keys and values' gradient, summed over every rank's queries.
void CpAttention::ring_backward(const Tensor& qkv, const Tensor& lse, const Tensor& last_block,
                                const Tensor& out, const Tensor& dout, Tensor& dqkv, int32_t layer,
                                int64_t mb) {
  const Phase B = Phase::kBwd;
  const int64_t r = ctx_.groups->cp_rank, w = 2 * qkv_.kv_heads * qkv_.head_dim;
  const int64_t width = qkv_.heads * qkv_.head_dim;
  Tensor delta = act(lse.shape());
  {
    auto s = op_scope(OpId::kAttnCorePrep, layer, B, mb);
    blockwise::backward_prep(out, dout, qkv_, delta);
  }
  // The step's buffer in hand (`held`) and the one receiving the next (`arriving`): a block's
  // keys and values (rows [0, rows_)) and a gradient (rows [rows_, 2 rows_)), swapped each step
  // (the first step holds forward's last block itself).
  Tensor held = act({2 * rows_, w}), arriving = act({2 * rows_, w});
  Tensor dq = act({rows_, width}), step_dq = act({rows_, width}), step_dkv = act({rows_, w});
  for (int64_t i = 0; i < cp_; ++i) {
    const bool first = i == 0, last = i + 1 == cp_;
    const Tensor block = first ? last_block : held.rows(0, rows_);
    // The first step's gradient has nowhere to come from: it is written where the next step
    // sends it from; the later ones are added to the received sums after the wait.
    Tensor dkv_out = first ? arriving.rows(rows_, rows_) : step_dkv;
    const int64_t owner = (r + 1 + i) % cp_;
    const context::Geometry g{qkv_, seq_local_, rank_positions_[static_cast<size_t>(owner)].data()};
    auto attend = [&] {
      auto s = op_scope(OpId::kAttnCore, layer, B, mb);
      blockwise::backward(qkv, block, dout, lse, delta, g, first ? dq : step_dq, dkv_out);
    };
    const Tensor sent = first ? block : last ? held.rows(rows_, rows_) : held;
    Tensor received = first  ? arriving.rows(0, rows_)
                      : last ? arriving.rows(rows_, rows_)
                             : arriving;
    ring_exchange(sent, received, RingDirection::kBackward, B, layer, mb, attend);
    if (!first) {
      auto s = op_scope(OpId::kAttnCpMerge, layer, B, mb);
      backend().add(dq, step_dq, dq);
      Tensor sum = arriving.rows(rows_, rows_);
      backend().add(sum, step_dkv, sum);
    }
    std::swap(held, arriving);
  }
  const Tensor dkv = held.rows(rows_, rows_);
  for (int64_t row = 0; row < rows_; ++row) {
    std::copy_n(dq.data() + row * width, width, dqkv.data() + row * qkv_.width());
    std::copy_n(dkv.data() + row * w, w, dqkv.data() + row * qkv_.width() + width);
  }
}

}  // namespace sextant::exec
