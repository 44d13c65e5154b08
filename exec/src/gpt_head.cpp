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

double GptHead::take_loss_sum() {
  const double l = loss_sum_;
  loss_sum_ = 0;
  return l;
}

Tensor GptHead::forward(const MicroBatch& mb, const Tensor& x) {
  Backend& be = backend();
  const GptShape& s = shape();
  Cache& c = caches_[mb.index];
  c = Cache();
  c.x = x;
  c.ln = act({s.local_rows, s.h});
  c.mean = be.empty({s.local_rows});
  c.rstd = be.empty({s.local_rows});
  {
    auto scope = rec(ctx().op(OpId::kHeadNorm, layer_, Phase::kFwd, mb.index));
    norm(x, *gamma_, beta_, c.ln, c.mean, c.rstd);
  }
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
  if (s.t > 1) {
    // Each shard's sum is relative to its own max: rescale to the global max, then add.
    const std::vector<float> local_max = c.max;
    {
      auto scope = pairs().comm_scope(OpId::kHeadLossAllReduce, OpClass::kAllReduce, s.rows * 4,
                                      Phase::kFwd, layer_, mb.index);
      ctx().groups->tp->all_reduce_max_host(c.max.data(), s.rows);
    }
    for (size_t i = 0; i < c.sum.size(); ++i) c.sum[i] *= std::exp(local_max[i] - c.max[i]);
    std::vector<float> both(c.sum);
    both.insert(both.end(), target.begin(), target.end());
    auto scope = pairs().comm_scope(OpId::kHeadLossAllReduce, OpClass::kAllReduce, 2 * s.rows * 4,
                                    Phase::kFwd, layer_, mb.index);
    ctx().groups->tp->all_reduce_host(both.data(), 2 * s.rows);
    std::copy(both.begin(), both.begin() + s.rows, c.sum.begin());
    std::copy(both.begin() + s.rows, both.end(), target.begin());
  }
  double loss = 0;
  for (size_t i = 0; i < static_cast<size_t>(s.rows); ++i)
    loss += std::log(static_cast<double>(c.sum[i])) + c.max[i] - target[i];
  loss_sum_ += loss;
  return Tensor();
}

Tensor GptHead::backward(const MicroBatch& mb, const Tensor& /*dy*/) {
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

}  // namespace sextant::exec
