#include "transformer_block.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "core/activations.hpp"
#include "sextant/spec/executor_support.hpp"

namespace sextant::exec {

using models::OpId;
using spec::Phase;

TransformerBlock::TransformerBlock(const GptParts& parts, ParamStore& store, int32_t layer,
                                   bool moe, spec::Recompute recompute, bool offload)
    : GptLayer(parts),
      layer_(layer),
      recompute_(recompute),
      moe_(moe),
      offload_(offload),
      fused_attention_(spec::is_fused_attention(spec::executed_attention(*ctx().plan))) {
  const std::string b = fmt::format("block{}", layer - 1);
  p_.ln1_g = &store.get(b + ".ln1.gamma");
  if (layernorm()) p_.ln1_b = &store.get(b + ".ln1.beta");
  p_.qkv_w = &store.get(b + ".attn.qkv.weight");
  p_.proj_w = &store.get(b + ".attn.proj.weight");
  p_.ln2_g = &store.get(b + ".ln2.gamma");
  if (layernorm()) p_.ln2_b = &store.get(b + ".ln2.beta");
  if (moe_) {
    MoeLayer& experts = *parts_.moe;
    moe_weights_.router = &store.get(b + ".moe.router.weight");
    for (int64_t e = 0; e < experts.local_experts(); ++e) {
      const std::string x = fmt::format("{}.moe.expert{}", b, experts.first_expert() + e);
      moe_weights_.fc1.push_back(&store.get(x + ".fc1.weight"));
      moe_weights_.fc2.push_back(&store.get(x + ".fc2.weight"));
    }
    if (model().moe->shared_experts > 0) {
      moe_weights_.shared_fc1 = &store.get(b + ".moe.shared.fc1.weight");
      moe_weights_.shared_fc2 = &store.get(b + ".moe.shared.fc2.weight");
    }
  } else {
    p_.fc1_w = &store.get(b + ".mlp.fc1.weight");
    p_.fc2_w = &store.get(b + ".mlp.fc2.weight");
  }
  if (model().bias) {
    p_.qkv_b = &store.get(b + ".attn.qkv.bias");
    p_.proj_b = &store.get(b + ".attn.proj.bias");
    p_.fc1_b = &store.get(b + ".mlp.fc1.bias");
    p_.fc2_b = &store.get(b + ".mlp.fc2.bias");
  }
}

bool TransformerBlock::rope() const {
  return model().position_embedding == spec::PositionEmbedding::kRope;
}

Tensor TransformerBlock::forward(const MicroBatch& mb, const Tensor& x) {
  Cache c;
  c.x = x;
  Tensor y = run_forward(c, mb.index, Phase::kFwd);
  if (recompute_ == spec::Recompute::kFull) {
    const Tensor keep = c.x;
    c = Cache();
    c.x = keep;
  } else if (recompute_ == spec::Recompute::kSelective) {
    c.att = Tensor();  // the attention core is recomputed in backward
    c.qkv_heads = Tensor();
  } else if (parts_.cp != nullptr && parts_.cp->keeps_head_block()) {
    // Ulysses' backward reads the head block's q, k, v, not the rank's rows: one copy kept, as
    // the lowering counts (and Transformer Engine keeps).
    c.qkv = Tensor();
  }
  if (offload_) move_cache(c, Phase::kFwd, mb.index);
  caches_[mb.index] = std::move(c);
  return y;
}

std::vector<Tensor*> TransformerBlock::cached_tensors(Cache& c) {
  std::vector<Tensor*> out;
  for (Tensor* t : {&c.x,
                    &c.ln1,
                    &c.ln1_mean,
                    &c.ln1_rstd,
                    &c.a_in,
                    &c.qkv,
                    &c.att,
                    &c.o,
                    &c.x1,
                    &c.ln2,
                    &c.ln2_mean,
                    &c.ln2_rstd,
                    &c.m_in,
                    &c.f1,
                    &c.g,
                    &c.qkv_heads,
                    &c.moe.x_route,
                    &c.moe.x,
                    &c.moe.shared_x,
                    &c.moe.in,
                    &c.moe.f1,
                    &c.moe.g,
                    &c.moe.out,
                    &c.moe.shared_f1,
                    &c.moe.shared_g})
    if (!t->empty()) out.push_back(t);
  return out;
}

namespace {

// Two tensors of a cache that are one: the same first element and size (a layer pair's input is
// the norm's output itself without sequence parallelism; a view may change the shape).
bool same_tensor(const Tensor& a, const Tensor& b) {
  return a.raw() == b.raw() && a.bytes() == b.bytes();
}

// The bytes of `all`, each tensor once.
int64_t distinct_bytes(const std::vector<Tensor*>& all) {
  int64_t bytes = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    const bool seen = std::any_of(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(i),
                                  [&](const Tensor* o) { return same_tensor(*o, *all[i]); });
    if (!seen) bytes += all[i]->bytes();
  }
  return bytes;
}

// Copies each of `all` once into a new tensor of `be` and points it and every tensor that is
// the same one at the copy (each with its own shape), so the old memory is freed.
void move_tensors(Backend& be, const std::vector<Tensor*>& all) {
  std::vector<std::pair<Tensor, Tensor>> moved;  // (old, its copy)
  for (Tensor* t : all) {
    auto it = std::find_if(moved.begin(), moved.end(),
                           [&](const auto& m) { return same_tensor(m.first, *t); });
    if (it == moved.end()) {
      Tensor copy = be.empty(t->shape(), t->dtype());
      be.copy(*t, copy);
      it = moved.insert(moved.end(), {*t, copy});
    }
    *t = it->second.view(t->shape());
  }
}

}  // namespace

void TransformerBlock::move_cache(Cache& c, Phase phase, int64_t mb) {
  const std::vector<Tensor*> all = cached_tensors(c);
  const OpId copy =
      phase == Phase::kFwd ? OpId::kOffloadActivationsToHost : OpId::kOffloadActivationsToDevice;
  auto scope =
      rec(ctx().offload(copy, spec::OpClass::kMemcpy, distinct_bytes(all), phase, layer_, mb));
  move_tensors(backend(), all);
}

Tensor TransformerBlock::run_forward(Cache& c, int64_t mb, Phase phase) {
  Backend& be = backend();
  const GptShape& s = shape();
  LinearPairs& lp = pairs();
  c.ln1 = act({s.local_rows, s.h});
  c.ln1_mean = be.empty({s.local_rows});
  c.ln1_rstd = be.empty({s.local_rows});
  {
    auto scope = rec(ctx().op(OpId::kAttnNorm, layer_, phase, mb));
    norm(c.x, *p_.ln1_g, p_.ln1_b, c.ln1, c.ln1_mean, c.ln1_rstd);
  }
  c.a_in = lp.pair_input(c.ln1, models::kAttnCollectives, phase, layer_, mb);
  c.qkv = act({s.rows, s.qkv.width()});
  lp.first_linear(OpId::kAttnQkv, c.a_in, *p_.qkv_w, p_.qkv_b, c.qkv, phase, layer_, mb);
  if (rope()) {
    auto scope = rec(ctx().op(OpId::kAttnRope, layer_, phase, mb));
    be.rope(c.qkv, s.qkv, kRopeBase, false);
  }
  c.o = act({s.rows, s.h / s.split});
  c.att = attention_core(c.qkv, c.o, c.qkv_heads, phase, mb);
  Tensor a = lp.second_linear(models::kAttnCollectives, OpId::kAttnProj, c.o, *p_.proj_w, p_.proj_b,
                              phase, layer_, mb);
  c.x1 = act({s.local_rows, s.h});
  {
    auto scope = rec(ctx().op(OpId::kAttnResidual, layer_, phase, mb));
    if (Param* bias = residual_bias(p_.proj_b)) be.bias_add(a, bias->compute);
    be.add(c.x, a, c.x1);
  }
  c.ln2 = act({s.local_rows, s.h});
  c.ln2_mean = be.empty({s.local_rows});
  c.ln2_rstd = be.empty({s.local_rows});
  {
    auto scope = rec(ctx().op(OpId::kMlpNorm, layer_, phase, mb));
    norm(c.x1, *p_.ln2_g, p_.ln2_b, c.ln2, c.ln2_mean, c.ln2_rstd);
  }
  if (moe_ && parts_.moe->dispatches_over_tp()) {  // it gathers and scatters its own rows
    return mlp_residual(
        c, parts_.moe->forward(moe_weights_, c.ln2, c.ln2, layer_, phase, mb, c.moe), phase, mb);
  }
  c.m_in = lp.pair_input(c.ln2, models::kMlpCollectives, phase, layer_, mb);
  if (moe_) {
    Tensor out = parts_.moe->forward(moe_weights_, c.ln2, c.m_in, layer_, phase, mb, c.moe);
    return mlp_residual(c, lp.reduce_out(out, models::kMlpCollectives, phase, layer_, mb), phase,
                        mb);
  }
  c.f1 = act({s.rows, s.gate * s.f_local});
  lp.first_linear(OpId::kMlpFc1, c.m_in, *p_.fc1_w, p_.fc1_b, c.f1, phase, layer_, mb);
  c.g = act({s.rows, s.f_local});
  {
    auto scope = rec(ctx().op(OpId::kMlpAct, layer_, phase, mb));
    activation(be, model().activation, c.f1, c.g);
  }
  return mlp_residual(c,
                      lp.second_linear(models::kMlpCollectives, OpId::kMlpFc2, c.g, *p_.fc2_w,
                                       p_.fc2_b, phase, layer_, mb),
                      phase, mb);
}

Tensor TransformerBlock::mlp_residual(Cache& c, Tensor m, Phase phase, int64_t mb) {
  const GptShape& s = shape();
  Tensor y = act({s.local_rows, s.h});
  auto scope = rec(ctx().op(OpId::kMlpResidual, layer_, phase, mb));
  if (Param* bias = residual_bias(p_.fc2_b)) backend().bias_add(m, bias->compute);
  backend().add(c.x1, m, y);
  return y;
}

Tensor TransformerBlock::backward(const MicroBatch& batch, const Tensor& dy) {
  const int64_t mb = batch.index;
  Cache& c = caches_.at(mb);
  const GptShape& s = shape();
  LinearPairs& lp = pairs();
  if (offload_) move_cache(c, Phase::kBwd, mb);
  if (recompute_ == spec::Recompute::kFull) {
    run_forward(c, mb, Phase::kRecompute);
  } else if (recompute_ == spec::Recompute::kSelective) {
    Tensor o = act({s.rows, s.h / s.split});
    c.att = attention_core(c.qkv, o, c.qkv_heads, Phase::kRecompute, mb);
  }
  const Phase B = Phase::kBwd;
  // MLP branch: y = x1 + fc2(act(fc1(ln2(x1)))) (+ bias).
  Tensor dln2;
  if (moe_) {
    // The gradient of the rows the experts took (summed over tp by the block's collective unless
    // the layer scattered them itself) and of the rows this rank routed.
    const bool own = parts_.moe->dispatches_over_tp();
    Tensor dm = own ? dy : lp.pair_output_backward(dy, models::kMlpCollectives, layer_, mb);
    MoeInputGrads g = parts_.moe->backward(moe_weights_, dm, layer_, mb, c.moe);
    dln2 = own ? g.tokens : lp.pair_input_backward(g.tokens, models::kMlpCollectives, layer_, mb);
    backend().add(dln2, g.routed, dln2);
  } else {
    Tensor dm = lp.pair_output_backward(dy, models::kMlpCollectives, layer_, mb);
    Tensor dg = act({s.rows, s.f_local});
    lp.second_linear_backward(OpId::kMlpFc2, c.g, *p_.fc2_w, p_.fc2_b, dm, dg, layer_, mb);
    Tensor df1 = act({s.rows, s.gate * s.f_local});
    {
      auto scope = rec(ctx().op(OpId::kMlpAct, layer_, B, mb));
      activation_backward(backend(), model().activation, c.f1, dg, df1);
    }
    Tensor dm_in = act({s.rows, lp.pair_input_width()});
    lp.first_linear_backward(OpId::kMlpFc1, c.m_in, *p_.fc1_w, p_.fc1_b, df1, dm_in, layer_, mb);
    dln2 = lp.pair_input_backward(dm_in, models::kMlpCollectives, layer_, mb);
  }
  Tensor dx1 = act({s.local_rows, s.h});
  {
    auto scope = rec(ctx().op(OpId::kMlpNorm, layer_, B, mb));
    norm_backward(c.x1, *p_.ln2_g, p_.ln2_b, c.ln2_mean, c.ln2_rstd, dln2, dx1);
  }
  residual_backward(OpId::kMlpResidual, mb, dy, residual_bias(p_.fc2_b), dx1);
  // Attention branch: x1 = x + proj(attn(qkv(ln1(x)))) (+ bias).
  Tensor dproj = lp.pair_output_backward(dx1, models::kAttnCollectives, layer_, mb);
  Tensor dout = act({s.rows, s.h / s.split});
  lp.second_linear_backward(OpId::kAttnProj, c.o, *p_.proj_w, p_.proj_b, dproj, dout, layer_, mb);
  Tensor dqkv = act({s.rows, s.qkv.width()});
  attention_core_backward(c, dout, dqkv, mb);
  if (rope()) {  // dq and dk are gradients of the rotated q and k: rotate them back
    auto scope = rec(ctx().op(OpId::kAttnRope, layer_, B, mb));
    backend().rope(dqkv, s.qkv, kRopeBase, true);
  }
  Tensor da_in = act({s.rows, lp.pair_input_width()});
  lp.first_linear_backward(OpId::kAttnQkv, c.a_in, *p_.qkv_w, p_.qkv_b, dqkv, da_in, layer_, mb);
  Tensor dln1 = lp.pair_input_backward(da_in, models::kAttnCollectives, layer_, mb);
  Tensor dx = act({s.local_rows, s.h});
  {
    auto scope = rec(ctx().op(OpId::kAttnNorm, layer_, B, mb));
    norm_backward(c.x, *p_.ln1_g, p_.ln1_b, c.ln1_mean, c.ln1_rstd, dln1, dx);
  }
  residual_backward(OpId::kAttnResidual, mb, dx1, residual_bias(p_.proj_b), dx);
  caches_.erase(mb);
  return dx;
}

void TransformerBlock::residual_backward(OpId residual, int64_t mb, const Tensor& dout, Param* bias,
                                         Tensor& dnorm) {
  auto scope = rec(ctx().op(residual, layer_, Phase::kBwd, mb));
  if (bias != nullptr) backend().bias_backward(dout, bias->grad);
  backend().add(dnorm, dout, dnorm);
}

Tensor TransformerBlock::attention_core(const Tensor& qkv, Tensor& out, Tensor& qkv_heads,
                                        Phase phase, int64_t mb) {
  if (parts_.cp != nullptr) return parts_.cp->forward(qkv, out, qkv_heads, layer_, phase, mb);
  Backend& be = backend();
  const GptShape& s = shape();
  if (fused_attention_) {  // FlashAttention-2: the output and each row's fp32 log-sum-exp
    Tensor lse = be.empty({s.batch, s.heads_local, s.seq});
    auto scope = rec(ctx().op(OpId::kAttnCore, layer_, phase, mb));
    be.flash_attention(qkv, s.qkv, out, lse);
    return lse;
  }
  Tensor probs = act({s.batch, s.heads_local, s.seq, s.seq});
  {
    auto scope = rec(ctx().op(OpId::kAttnScores, layer_, phase, mb));
    be.attention_scores(qkv, s.qkv, probs);
  }
  {
    auto scope = rec(ctx().op(OpId::kAttnSoftmax, layer_, phase, mb));
    be.causal_softmax(probs, s.seq);
  }
  {
    auto scope = rec(ctx().op(OpId::kAttnContext, layer_, phase, mb));
    be.attention_context(probs, qkv, s.qkv, out);
  }
  return probs;
}

void TransformerBlock::attention_core_backward(Cache& c, const Tensor& dout, Tensor& dqkv,
                                               int64_t mb) {
  if (parts_.cp != nullptr) {
    parts_.cp->backward(c.qkv, c.att, c.qkv_heads, c.o, dout, dqkv, layer_, mb);
    return;
  }
  Backend& be = backend();
  const GptShape& s = shape();
  const Phase B = Phase::kBwd;
  if (fused_attention_) {  // c.att is the log-sum-exp; the probabilities are recomputed
    Tensor delta = be.empty(c.att.shape());
    {
      auto scope = rec(ctx().op(OpId::kAttnCorePrep, layer_, B, mb));
      be.flash_attention_backward_prep(c.o, dout, s.qkv, delta);
    }
    auto scope = rec(ctx().op(OpId::kAttnCore, layer_, B, mb));
    be.flash_attention_backward(c.qkv, dout, c.att, delta, s.qkv, dqkv);
    return;
  }
  Tensor dprobs = act({s.batch, s.heads_local, s.seq, s.seq});
  {
    auto scope = rec(ctx().op(OpId::kAttnContext, layer_, B, mb));
    be.attention_context_backward(c.att, c.qkv, dout, s.qkv, dprobs, dqkv);
  }
  {
    auto scope = rec(ctx().op(OpId::kAttnSoftmax, layer_, B, mb));
    be.causal_softmax_backward(c.att, dprobs, s.seq);
  }
  {
    auto scope = rec(ctx().op(OpId::kAttnScores, layer_, B, mb));
    be.attention_scores_backward(dprobs, c.qkv, s.qkv, dqkv);
  }
}

}  // namespace sextant::exec
