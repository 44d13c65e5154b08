#include "gpt_head.hpp"

#include <algorithm>
#include <cmath>

namespace sextant::exec {

using models::OpId;
using spec::OpClass;
using spec::Phase;

GptHead::GptHead(const GptParts& parts, ParamStore& store, int32_t layer, Param* local_table)
    : GptLayer(parts), layer_(layer) {
  gamma_ = &store.get("head.norm.gamma");
  if (layernorm()) beta_ = &store.get("head.norm.beta");
  weight_ = !model().tied_embeddings ? &store.get("head.weight")
            : local_table != nullptr ? local_table
                                     : &store.get("head.tied_table");
}

GptHead::GptHead(const GptParts& parts, ParamStore& store, int32_t layer,
                 const models::PerOpHead& split, const MeshRanks& ranks)
    : GptLayer(parts),
      layer_(layer),
      split_(&split),
      ranks_(&ranks),
      walk_(split.walk(split.chosen, 4)) {
  gamma_ = &store.get("head.norm.gamma");
  if (layernorm()) beta_ = &store.get("head.norm.beta");
  weight_ = &store.get("head.weight");
}

double GptHead::take_loss_sum() {
  double l = loss_sum_;
  loss_sum_ = 0;
  // Per-op: each token's loss counted once over the whole mesh (counts_loss); the trainer takes
  // the tp group's first rank's, so the group's are summed there.
  if (split_ != nullptr) ctx().groups->tp->all_reduce(&l, 1);
  return l;
}

GptHead::Cache& GptHead::normed(const MicroBatch& mb, const Tensor& x) {
  Backend& be = backend();
  const GptShape& s = shape();
  Cache& c = caches_[mb.index];
  c = Cache();
  c.x = x;
  c.ln = act({s.local_rows, s.h});
  c.mean = be.empty({s.local_rows});
  c.rstd = be.empty({s.local_rows});
  auto scope = rec(ctx().op(OpId::kHeadNorm, layer_, Phase::kFwd, mb.index));
  norm(x, *gamma_, beta_, c.ln, c.mean, c.rstd);
  return c;
}

Tensor GptHead::forward(const MicroBatch& mb, const Tensor& x) {
  if (split_ != nullptr) return forward_split(mb, x);
  Backend& be = backend();
  const GptShape& s = shape();
  Cache& c = normed(mb, x);
  c.xg = pairs().gather(c.ln, models::kHeadCollectives, Phase::kFwd, layer_, mb.index);
  // Logits over the whole padded shard (aligned: an odd width such as GPT-2's 50257 ran the
  // GEMMs 5-8x slower on the H200); the loss leaves the padding columns out.
  c.logits = act({s.rows, s.vocab_local});
  {
    auto scope = rec(ctx().op(OpId::kHeadLogits, layer_, Phase::kFwd, mb.index));
    be.matmul_nt(c.xg, weight_->compute, c.logits);
  }
  std::vector<float> target;
  {
    auto scope = rec(ctx().op(OpId::kHeadLoss, layer_, Phase::kFwd, mb.index));
    be.softmax_stats(c.logits, mb.targets, s.r * s.vocab_local, s.vocab_valid, c.max, c.sum,
                     target);
  }
  if (s.t > 1)
    vocab_parallel_sums(*ctx().groups->tp, spec::Stream::kTpComm, s.t, c, target, mb.index);
  double loss = 0;
  for (size_t i = 0; i < static_cast<size_t>(s.rows); ++i)
    loss += std::log(static_cast<double>(c.sum[i])) + c.max[i] - target[i];
  loss_sum_ += loss;
  return Tensor();
}

Tensor GptHead::backward(const MicroBatch& mb, const Tensor& /*dy*/) {
  if (split_ != nullptr) return backward_split(mb);
  Backend& be = backend();
  const GptShape& s = shape();
  Cache& c = caches_.at(mb.index);
  // The loss of a step is the mean over every token of the global batch.
  const float scale = 1.0f / static_cast<float>(ctx().plan->global_batch * s.seq);
  Tensor dlogits = act({s.rows, s.vocab_local});
  {
    auto scope = rec(ctx().op(OpId::kHeadLoss, layer_, Phase::kBwd, mb.index));
    be.cross_entropy_backward(c.logits, mb.targets, s.r * s.vocab_local, s.vocab_valid, c.max,
                              c.sum, scale, dlogits);
  }
  Tensor dxg = act({s.rows, s.h});
  {
    auto scope = rec(ctx().op(OpId::kHeadLogits, layer_, Phase::kBwd, mb.index));
    // The padding columns' zero gradient leaves the padding rows' gradient zero.
    be.matmul_nt_backward(c.xg, weight_->compute, dlogits, dxg, weight_->grad);
  }
  Tensor dln = pairs().gather_backward(dxg, models::kHeadCollectives, layer_, mb.index);
  Tensor dx = act({s.local_rows, s.h});
  {
    auto scope = rec(ctx().op(OpId::kHeadNorm, layer_, Phase::kBwd, mb.index));
    norm_backward(c.x, *gamma_, beta_, c.mean, c.rstd, dln, dx);
  }
  caches_.erase(mb.index);
  return dx;
}

void GptHead::vocab_parallel_sums(Communicator& comm, spec::Stream stream, int64_t size, Cache& c,
                                  std::vector<float>& target, int64_t mb) {
  const int64_t rows = static_cast<int64_t>(c.max.size());
  // Each shard's sum is relative to its own max: rescale to the group's max, then add. (Ranks
  // holding only padding rows, all of a group's, have a max of -inf: their sums stay 0.)
  const std::vector<float> local_max = c.max;
  {
    auto scope = rec(ctx().comm(OpId::kHeadLossAllReduce, OpClass::kAllReduce, stream, rows * 4,
                                size, Phase::kFwd, layer_, mb));
    comm.all_reduce_max_host(c.max.data(), rows);
  }
  for (size_t i = 0; i < c.sum.size(); ++i)
    if (local_max[i] != c.max[i]) c.sum[i] *= std::exp(local_max[i] - c.max[i]);
  std::vector<float> both(c.sum);
  both.insert(both.end(), target.begin(), target.end());
  auto scope = rec(ctx().comm(OpId::kHeadLossAllReduce, OpClass::kAllReduce, stream, 2 * rows * 4,
                              size, Phase::kFwd, layer_, mb));
  comm.all_reduce_host(both.data(), 2 * rows);
  std::copy(both.begin(), both.begin() + rows, c.sum.begin());
  std::copy(both.begin() + rows, both.end(), target.begin());
}

MeshTensor GptHead::reshards(const std::string& node, Phase phase, MeshTensor x, int64_t mb) {
  for (const models::GraphStep& step : walk_.steps)
    if (step.phase == phase && step.kind == models::GraphStep::Kind::kReshard && step.node == node)
      x = traced_reshard(ctx(), *ranks_, x, step, layer_, mb);
  return x;
}

std::vector<int32_t> GptHead::block_targets(const MicroBatch& mb) const {
  const spec::TensorLayout out = split_->sharded(split_->chosen).output;  // [b, s, V]
  const std::vector<int64_t> at = ranks_->origin(out), n = ranks_->local_extents(out);
  const int64_t seq = shape().seq;
  SEXTANT_CHECK(static_cast<int64_t>(mb.replica_targets.size()) == out.dims[0].extent * seq,
                "the output layer's split needs every replica's targets: {} for {} sequences",
                mb.replica_targets.size(), out.dims[0].extent);
  std::vector<int32_t> targets;
  for (int64_t b = at[0]; b < at[0] + n[0]; ++b)
    for (int64_t p = at[1]; p < at[1] + n[1]; ++p)
      targets.push_back(mb.replica_targets[static_cast<size_t>(b * seq + p)]);
  return targets;
}

bool GptHead::counts_loss() const {
  const models::OpSplit& s = split_->chosen;
  for (const auto& [axis, size] : ranks_->mesh().axes) {
    bool rows = false;
    for (const char* d : {"b", "s"})
      if (const auto it = s.find(d); it != s.end())
        rows = rows || std::find(it->second.begin(), it->second.end(), axis) != it->second.end();
    if (!rows && ranks_->axis(axis).coord != 0) return false;
  }
  return true;
}

Tensor GptHead::forward_split(const MicroBatch& mb, const Tensor& x) {
  Backend& be = backend();
  const GptShape& s = shape();
  Cache& c = normed(mb, x);
  MeshTensor in = reshards(models::kLogitsOp, Phase::kFwd,
                           {c.ln.view({c.ln.numel()}), split_->stream}, mb.index);
  const spec::TensorLayout out = split_->sharded(split_->chosen).output;  // [b, s, V]
  const std::vector<int64_t> n = ranks_->local_extents(out);
  const int64_t rows = n[0] * n[1], vocab = n[2], v0 = ranks_->origin(out)[2];
  const int64_t valid = std::clamp<int64_t>(model().vocab - v0, 0, vocab);
  c.xg = in.data.view({rows, s.h});
  c.logits = act({rows, vocab});
  {
    auto scope = rec(ctx().op(OpId::kHeadLogits, layer_, Phase::kFwd, mb.index));
    be.matmul_nt(c.xg, weight_->compute, c.logits);
  }
  c.targets = block_targets(mb);
  std::vector<float> target;
  {
    auto scope = rec(ctx().op(OpId::kHeadLoss, layer_, Phase::kFwd, mb.index));
    be.softmax_stats(c.logits, c.targets, v0, valid, c.max, c.sum, target);
  }
  // Vocabulary-parallel over each axis splitting V in turn.
  for (const std::string& axis : split_->vocab_axes(split_->chosen))
    vocab_parallel_sums(*ranks_->axis(axis).comm,
                        axis == spec::kDataAxis ? spec::Stream::kDpComm : spec::Stream::kTpComm,
                        ranks_->mesh().size(axis), c, target, mb.index);
  if (counts_loss())
    for (size_t i = 0; i < static_cast<size_t>(rows); ++i)
      loss_sum_ += std::log(static_cast<double>(c.sum[i])) + c.max[i] - target[i];
  return Tensor();
}

Tensor GptHead::backward_split(const MicroBatch& mb) {
  Backend& be = backend();
  const GptShape& s = shape();
  Cache& c = caches_.at(mb.index);
  const float scale = 1.0f / static_cast<float>(ctx().plan->global_batch * s.seq);
  const models::ShardedOp sh = split_->sharded(split_->chosen);
  const int64_t rows = c.logits.dim(0), vocab = c.logits.dim(1);
  const int64_t v0 = ranks_->origin(sh.output)[2];
  const int64_t valid = std::clamp<int64_t>(model().vocab - v0, 0, vocab);
  Tensor dlogits = act({rows, vocab});
  {
    auto scope = rec(ctx().op(OpId::kHeadLoss, layer_, Phase::kBwd, mb.index));
    be.cross_entropy_backward(c.logits, c.targets, v0, valid, c.max, c.sum, scale, dlogits);
  }
  const spec::TensorLayout gradient =
      models::shard_op(split_->mesh, models::gradient_op(split_->node().op, 0), split_->chosen)
          .output;
  MeshTensor dx{be.empty({rows * s.h}), gradient};
  {
    Tensor dxg = dx.data.view({rows, s.h});
    auto scope = rec(ctx().op(OpId::kHeadLogits, layer_, Phase::kBwd, mb.index));
    be.matmul_nt_backward(c.xg, weight_->compute, dlogits, dxg, weight_->grad);
  }
  dx = reshards(split_->graph.input, Phase::kBwd, std::move(dx), mb.index);
  Tensor dln = dx.data.view({s.local_rows, s.h});
  Tensor out = act({s.local_rows, s.h});
  {
    auto scope = rec(ctx().op(OpId::kHeadNorm, layer_, Phase::kBwd, mb.index));
    norm_backward(c.x, *gamma_, beta_, c.mean, c.rstd, dln, out);
  }
  caches_.erase(mb.index);
  return out;
}

}  // namespace sextant::exec
