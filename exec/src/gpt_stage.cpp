// A GPT decoder stage under Megatron-LM tensor parallelism (Shoeybi et al. 2019): column-parallel
// QKV and FC1, head-parallel attention, row-parallel projection and FC2 followed by an all-reduce,
// vocabulary-parallel embedding and cross-entropy, and optionally sequence parallelism
// (Korthikanti et al. 2022), where norms and residuals run on a 1/tp slice of the rows and the
// all-reduces become all-gathers and reduce-scatters. Activations are [rows, hidden] with rows =
// micro_batch * seq_len (sequence-major within a sequence). Under context parallelism a rank
// holds two chunks of each sequence (spec::context_positions) and attends to the whole
// sequence's keys and values, all-gathered over the cp group (Llama 3's algorithm), or trades its
// rows of every head for every row of 1/cp of the heads by an all-to-all (DeepSpeed-Ulysses).
// On AxoNN's 3D tensor grid the four linear layers run as grid_linear.hpp says, the heads and
// the ffn split over the grid's y axis, the vocabulary over the x * y ranks of a z slice.
#include <fmt/format.h>

#include <cmath>
#include <map>
#include <set>

#include "activation_comm.hpp"
#include "activations.hpp"
#include "gpt_params.hpp"
#include "grid_linear.hpp"
#include "linear_pairs.hpp"
#include "moe_layer.hpp"
#include "sextant/exec/cp_attention.hpp"
#include "sextant/models/vocabulary.hpp"
#include "stage_model.hpp"

namespace sextant::exec {

using models::OpId;

namespace {

using spec::OpClass;
using spec::Phase;
using spec::Stream;

constexpr float kRopeBase = 1e4f;  // RoFormer, Llama 1 and 2

struct BlockParams {
  Param* ln1_g = nullptr;
  Param* ln1_b = nullptr;
  Param* qkv_w = nullptr;
  Param* qkv_b = nullptr;
  Param* proj_w = nullptr;
  Param* proj_b = nullptr;
  Param* ln2_g = nullptr;
  Param* ln2_b = nullptr;
  Param* fc1_w = nullptr;
  Param* fc1_b = nullptr;
  Param* fc2_w = nullptr;
  Param* fc2_b = nullptr;
};

struct BlockCache {
  Tensor x;  // input (kept under every recompute mode)
  Tensor ln1, ln1_mean, ln1_rstd, a_in, qkv, att, o, x1, ln2, ln2_mean, ln2_rstd, m_in, f1, g;
  Tensor qkv_heads;  // Ulysses: the whole sequences' q, k, v of this rank's heads
  MoeCache moe;      // a mixture-of-experts block's MLP
};

struct HeadCache {
  Tensor x, ln, mean, rstd, xg, logits;
  std::vector<float> max, sum;
};

struct MicroBatchCache {
  std::map<int32_t, BlockCache> blocks;  // by layer
  HeadCache head;
};

class GptStage : public StageModel {
 public:
  GptStage(const spec::ModelSpec& model, Context& ctx, const StageOptions& o)
      : ctx_(ctx), m_(model.transformer()), o_(o) {
    const spec::Plan& plan = *ctx.plan;
    t_ = ctx.groups->tp_size;
    r_ = ctx.groups->tp_rank;
    sp_ = ctx.sequence_parallel;
    seq_ = o.seq_len;
    h_ = m_.hidden;
    batch_ = o.micro_batch;
    split_ = t_;
    if (plan.tp_grid.any()) {
      // A z slice's sequences; the heads and the ffn split over y (spec/tensor_grid.hpp).
      grid_ = std::make_unique<GridLinear>(ctx);
      batch_ = o.micro_batch / grid_->z();
      split_ = grid_->y();
    }
    heads_local_ = m_.heads / split_;
    qkv_ = {batch_, seq_, heads_local_, m_.kv_heads / split_, m_.head_dim()};
    if (ctx.groups->cp_size > 1) {
      // The rank's chunks of each sequence (cp_attention.hpp).
      cp_attention_ = std::make_unique<CpAttention>(ctx, batch_, seq_, qkv_.heads, qkv_.kv_heads,
                                                    qkv_.head_dim);
      qkv_ = cp_attention_->layout();
    }
    rows_ = batch_ * qkv_.seq;
    pairs_ = std::make_unique<LinearPairs>(ctx, grid_.get(), rows_, h_);
    local_rows_ = pairs_->local_rows();
    f_local_ = m_.ffn_hidden / split_;
    gate_ = m_.activation == spec::Activation::kSwiglu ? 2 : 1;
    // The vocabulary padded as the lowering lays it out (models::vocab_shard: a multiple of the
    // executor stack's vocab_multiple x tp rows, runner.cpp): every rank holds the same number of
    // rows; the padded rows at the end of the last ranks are zeros that no token looks up, and
    // their logits, computed so that the logits GEMMs run on aligned shapes, are left out of the
    // loss (zero gradient), so the model is the same under any tp.
    vocab_local_ = ctx.lowered->vocab_shard;
    vocab_valid_ = models::vocab_rows_used(m_.vocab, vocab_local_, r_);
    models::StageLayers sl = models::stage_layers(plan, *ctx.lowered, ctx.groups->pp_rank);
    // One chunk of layers, or several under the interleaved schedule (chunk c is the model's
    // chunk c * pp + stage).
    for (size_t c = 0; c < sl.chunk_begin.size(); ++c)
      chunks_.push_back(
          {static_cast<int32_t>(sl.chunk_begin[c]), static_cast<int32_t>(sl.chunk_end[c])});
    head_layer_ = static_cast<int32_t>(ctx.lowered->layers.size()) - 1;
    recompute_ = models::layer_recompute(plan, *ctx.lowered);
    has_embedding_ = chunks_.front().first == 0;
    has_head_ = chunks_.back().second == head_layer_ + 1;
    if (m_.moe) moe_ = std::make_unique<MoeLayer>(ctx, m_);
    build_params();
  }

  ParamStore& params() override { return *store_; }
  std::vector<int64_t> input_shape() const override { return {local_rows_, h_}; }
  void set_hooks(LayerHooks* hooks) override { hooks_ = hooks; }
  double take_loss_sum() override {
    double l = loss_sum_;
    loss_sum_ = 0;
    return l;
  }

  double grad_square_sum(int64_t begin, int64_t end) override {
    std::vector<std::pair<int64_t, int64_t>> spans;
    for (Param& p : store_->params()) {
      if (p.tied_copy) continue;
      if (p.tp_replicated && r_ != 0) continue;
      if (grid_ && norm_copies_.contains(&p)) continue;
      int64_t b = std::max(begin, p.offset);
      int64_t e = std::min(end, p.offset + p.value.numel());
      if (b < e) spans.emplace_back(b, e - b);
    }
    return ctx_.backend->sum_squares_spans(store_->grads(), spans);
  }

  int64_t chunks() const override { return static_cast<int64_t>(chunks_.size()); }

  Tensor forward(const MicroBatch& mb, const Tensor* input, int64_t chunk) override {
    MicroBatchCache& cache = caches_[{mb.index, chunk}];
    cache.blocks.clear();
    const auto [begin, end] = chunks_.at(static_cast<size_t>(chunk));
    Tensor x;
    for (int32_t layer = begin; layer < end; ++layer) {
      if (hooks_ != nullptr) hooks_->before_forward(layer, mb.index);
      if (layer == 0) {
        x = embed_forward(mb);
      } else if (layer == head_layer_) {
        head_forward(mb, x, cache.head);
        return Tensor();
      } else {
        if (layer == begin) x = *input;
        BlockCache bc;
        x = block_forward(layer, x, mb.index, bc, Phase::kFwd);
        if (recompute_[layer] == spec::Recompute::kFull) {
          Tensor keep = bc.x;
          bc = BlockCache();
          bc.x = keep;
        } else if (recompute_[layer] == spec::Recompute::kSelective) {
          bc.att = Tensor();  // the attention core is recomputed in backward
          bc.qkv_heads = Tensor();
        } else if (cp_attention_ && cp_attention_->keeps_head_block()) {
          // Ulysses' backward reads the head block's q, k, v, not the rank's rows: one copy
          // kept, as the lowering counts (and Transformer Engine keeps).
          bc.qkv = Tensor();
        }
        cache.blocks[layer] = std::move(bc);
      }
    }
    return x;
  }

  Tensor backward(const MicroBatch& mb, const Tensor* grad_output, int64_t chunk) override {
    MicroBatchCache& cache = caches_.at({mb.index, chunk});
    const auto [begin, end] = chunks_.at(static_cast<size_t>(chunk));
    Tensor dy;
    if (end - 1 != head_layer_) dy = *grad_output;
    for (int32_t layer = end - 1; layer >= begin; --layer) {
      if (hooks_ != nullptr) hooks_->before_backward(layer, mb.index);
      if (layer == head_layer_) {
        dy = head_backward(mb, cache.head);
      } else if (layer == 0) {
        embed_backward(mb, dy);
        dy = Tensor();
      } else {
        BlockCache& bc = cache.blocks.at(layer);
        if (recompute_[layer] == spec::Recompute::kFull) {
          Tensor keep = bc.x;
          block_forward(layer, keep, mb.index, bc, Phase::kRecompute);
        } else if (recompute_[layer] == spec::Recompute::kSelective) {
          Tensor o = act({rows_, h_ / split_});
          bc.att = attention_core(bc.qkv, o, bc.qkv_heads, layer, Phase::kRecompute, mb.index);
        }
        dy = block_backward(layer, dy, mb.index, bc);
      }
      if (hooks_ != nullptr) hooks_->after_backward(layer, mb.index);
    }
    caches_.erase({mb.index, chunk});
    return dy;
  }

 private:
  Backend& backend() { return *ctx_.backend; }
  // Activations and their gradients: fp32, or bf16 in mixed precision.
  Tensor act(std::vector<int64_t> shape) {
    return backend().empty(std::move(shape), backend().activation_dtype());
  }
  Recorder::Scope rec(Recorder::Event e) { return ctx_.recorder->scope(std::move(e)); }

  // --- Parameters --------------------------------------------------------------------------

  void build_params() {
    GptSplit split;
    split.t = t_;
    split.r = r_;
    split.vocab_local = vocab_local_;
    if (grid_) {
      split.grid = true;
      split.x = grid_->x();
      split.y = grid_->y();
      split.z = grid_->z();
      split.gx = grid_->x_rank();
      split.gy = grid_->y_rank();
      split.gz = grid_->z_rank();
    }
    if (moe_) {
      split.first_expert = moe_->first_expert();
      split.local_experts = moe_->local_experts();
      split.experts_split = ctx_.plan->ep > 1;
    }
    std::vector<int32_t> layers;  // this rank's, in forward order
    for (auto [begin, end] : chunks_)
      for (int32_t layer = begin; layer < end; ++layer) layers.push_back(layer);
    GptParams made = gpt_params(m_, split, layers, head_layer_, has_embedding_, o_.seed);
    store_ = std::make_unique<ParamStore>(backend(), made.specs);
    if (grid_) {
      // What the z slices hold alike counts once, on slice 0; a bias split over y (over x) once
      // on the x (y) axis's first rank.
      for (Param& p : store_->params()) {
        const bool copy = p.grid_sharded                       ? false
                          : grid_->z_rank() > 0                ? true
                          : made.alike_over_x.contains(p.name) ? grid_->x_rank() > 0
                          : made.alike_over_y.contains(p.name) ? grid_->y_rank() > 0
                                                               : false;
        if (copy) norm_copies_.insert(&p);
      }
    }
    for (int32_t layer : layers) {
      if (layer == 0 || layer == head_layer_) continue;
      const std::string b = fmt::format("block{}", layer - 1);
      BlockParams p;
      p.ln1_g = &store_->get(b + ".ln1.gamma");
      if (layernorm()) p.ln1_b = &store_->get(b + ".ln1.beta");
      p.qkv_w = &store_->get(b + ".attn.qkv.weight");
      p.proj_w = &store_->get(b + ".attn.proj.weight");
      p.ln2_g = &store_->get(b + ".ln2.gamma");
      if (layernorm()) p.ln2_b = &store_->get(b + ".ln2.beta");
      if (moe_layer(layer)) {
        MoeWeights& w = moe_weights_[layer];
        w.router = &store_->get(b + ".moe.router.weight");
        for (int64_t e = 0; e < moe_->local_experts(); ++e) {
          const std::string x = fmt::format("{}.moe.expert{}", b, moe_->first_expert() + e);
          w.fc1.push_back(&store_->get(x + ".fc1.weight"));
          w.fc2.push_back(&store_->get(x + ".fc2.weight"));
        }
        if (m_.moe->shared_experts > 0) {
          w.shared_fc1 = &store_->get(b + ".moe.shared.fc1.weight");
          w.shared_fc2 = &store_->get(b + ".moe.shared.fc2.weight");
        }
      } else {
        p.fc1_w = &store_->get(b + ".mlp.fc1.weight");
        p.fc2_w = &store_->get(b + ".mlp.fc2.weight");
      }
      if (m_.bias) {
        p.qkv_b = &store_->get(b + ".attn.qkv.bias");
        p.proj_b = &store_->get(b + ".attn.proj.bias");
        p.fc1_b = &store_->get(b + ".mlp.fc1.bias");
        p.fc2_b = &store_->get(b + ".mlp.fc2.bias");
      }
      blocks_[layer] = p;
    }
    if (has_embedding_) {
      table_ = &store_->get("embed.table");
      if (m_.position_embedding == spec::PositionEmbedding::kLearned)
        position_table_ = &store_->get("embed.position");
    }
    if (has_head_) {
      head_g_ = &store_->get("head.norm.gamma");
      if (layernorm()) head_b_ = &store_->get("head.norm.beta");
      head_w_ = !m_.tied_embeddings ? &store_->get("head.weight")
                : has_embedding_    ? table_
                                    : &store_->get("head.tied_table");
    }
  }

  BlockParams& block(int32_t layer) { return blocks_.at(layer); }

  // Whether lowered layer `layer` is a block with a mixture-of-experts MLP.
  bool moe_layer(int32_t layer) const { return gpt_moe_layer(m_, layer, head_layer_); }

  // --- Embedding -------------------------------------------------------------------------------

  // The first of this rank's rows it holds in sequence-parallel regions (norms, residuals).
  int64_t slice_begin() const { return sp_ ? r_ * local_rows_ : 0; }

  Tensor embed_forward(const MicroBatch& mb) {
    Tensor e = act({rows_, h_});
    {
      auto s = rec(ctx_.op(OpId::kEmbedLookup, 0, Phase::kFwd, mb.index));
      backend().embedding(mb.tokens, table_->compute, r_ * vocab_local_, e);
    }
    Tensor x = pairs_->reduce_out(e, models::kEmbedCollectives, Phase::kFwd, 0, mb.index);
    if (position_table_ != nullptr) {
      auto s = rec(ctx_.op(OpId::kEmbedPosition, 0, Phase::kFwd, mb.index));
      if (!cp_attention_) {
        backend().add_positions(position_table_->compute, slice_begin(), seq_, x);
      } else {
        for (auto [row, first, count] : cp_attention_->position_runs(slice_begin(), local_rows_)) {
          Tensor run = x.rows(row, count);
          backend().add_positions(position_table_->compute, first, seq_, run);
        }
      }
    }
    return x;
  }

  void embed_backward(const MicroBatch& mb, const Tensor& dy) {
    if (position_table_ != nullptr) {
      auto s = rec(ctx_.op(OpId::kEmbedPosition, 0, Phase::kBwd, mb.index));
      if (!cp_attention_) {
        backend().add_positions_backward(dy, slice_begin(), seq_, position_table_->grad);
      } else {
        for (auto [row, first, count] : cp_attention_->position_runs(slice_begin(), local_rows_))
          backend().add_positions_backward(dy.rows(row, count), first, seq_, position_table_->grad);
      }
    }
    Tensor full = pairs_->reduce_out_backward(dy, models::kEmbedCollectives, 0, mb.index);
    auto s = rec(ctx_.op(OpId::kEmbedLookup, 0, Phase::kBwd, mb.index));
    backend().embedding_backward(mb.tokens, full, r_ * vocab_local_, table_->grad);
  }

  // --- Transformer block -----------------------------------------------------------------------

  Tensor block_forward(int32_t layer, const Tensor& x, int64_t mb, BlockCache& c, Phase phase) {
    BlockParams& p = block(layer);
    Backend& be = backend();
    const int64_t hd_local = h_ / split_;
    c.x = x;
    c.ln1 = act({local_rows_, h_});
    c.ln1_mean = be.empty({local_rows_});
    c.ln1_rstd = be.empty({local_rows_});
    {
      auto s = rec(ctx_.op(OpId::kAttnNorm, layer, phase, mb));
      norm(x, *p.ln1_g, p.ln1_b, c.ln1, c.ln1_mean, c.ln1_rstd);
    }
    c.a_in = pairs_->pair_input(c.ln1, models::kAttnCollectives, phase, layer, mb);
    c.qkv = act({rows_, qkv_.width()});
    pairs_->first_linear(OpId::kAttnQkv, c.a_in, *p.qkv_w, p.qkv_b, c.qkv, phase, layer, mb);
    if (rope()) {
      auto s = rec(ctx_.op(OpId::kAttnRope, layer, phase, mb));
      be.rope(c.qkv, qkv_, kRopeBase, false);
    }
    c.o = act({rows_, hd_local});
    c.att = attention_core(c.qkv, c.o, c.qkv_heads, layer, phase, mb);
    Tensor a = pairs_->second_linear(models::kAttnCollectives, OpId::kAttnProj, c.o, *p.proj_w,
                                     p.proj_b, phase, layer, mb);
    c.x1 = act({local_rows_, h_});
    {
      auto s = rec(ctx_.op(OpId::kAttnResidual, layer, phase, mb));
      if (p.proj_b != nullptr && !grid_) add_bias(a, p.proj_b->compute);
      be.add(x, a, c.x1);
    }
    c.ln2 = act({local_rows_, h_});
    c.ln2_mean = be.empty({local_rows_});
    c.ln2_rstd = be.empty({local_rows_});
    {
      auto s = rec(ctx_.op(OpId::kMlpNorm, layer, phase, mb));
      norm(c.x1, *p.ln2_g, p.ln2_b, c.ln2, c.ln2_mean, c.ln2_rstd);
    }
    c.m_in = pairs_->pair_input(c.ln2, models::kMlpCollectives, phase, layer, mb);
    if (moe_layer(layer)) {
      Tensor out = moe_->forward(moe_weights_.at(layer), c.m_in, layer, phase, mb, c.moe);
      return mlp_residual(c, p, pairs_->reduce_out(out, models::kMlpCollectives, phase, layer, mb),
                          layer, phase, mb);
    }
    c.f1 = act({rows_, gate_ * f_local_});
    pairs_->first_linear(OpId::kMlpFc1, c.m_in, *p.fc1_w, p.fc1_b, c.f1, phase, layer, mb);
    c.g = act({rows_, f_local_});
    {
      auto s = rec(ctx_.op(OpId::kMlpAct, layer, phase, mb));
      activation(c.f1, c.g);
    }
    return mlp_residual(c, p,
                        pairs_->second_linear(models::kMlpCollectives, OpId::kMlpFc2, c.g, *p.fc2_w,
                                              p.fc2_b, phase, layer, mb),
                        layer, phase, mb);
  }

  // y = x1 + m (+ the MLP's output bias).
  Tensor mlp_residual(BlockCache& c, BlockParams& p, Tensor m, int32_t layer, Phase phase,
                      int64_t mb) {
    Tensor y = act({local_rows_, h_});
    auto s = rec(ctx_.op(OpId::kMlpResidual, layer, phase, mb));
    if (p.fc2_b != nullptr && !grid_) add_bias(m, p.fc2_b->compute);
    backend().add(c.x1, m, y);
    return y;
  }

  Tensor block_backward(int32_t layer, const Tensor& dy, int64_t mb, BlockCache& c) {
    BlockParams& p = block(layer);
    Backend& be = backend();
    const int64_t hd_local = h_ / split_;
    const Phase B = Phase::kBwd;
    // MLP branch: y = x1 + fc2(act(fc1(ln2(x1)))) (+ bias).
    Tensor dm = pairs_->pair_output_backward(dy, models::kMlpCollectives, layer, mb);
    Tensor dm_in;
    if (moe_layer(layer)) {
      dm_in = moe_->backward(moe_weights_.at(layer), dm, layer, mb, c.moe);
    } else {
      Tensor dg = act({rows_, f_local_});
      pairs_->second_linear_backward(OpId::kMlpFc2, c.g, *p.fc2_w, p.fc2_b, dm, dg, layer, mb);
      Tensor df1 = act({rows_, gate_ * f_local_});
      {
        auto s = rec(ctx_.op(OpId::kMlpAct, layer, B, mb));
        activation_backward(c.f1, dg, df1);
      }
      dm_in = act({rows_, pairs_->pair_input_width()});
      pairs_->first_linear_backward(OpId::kMlpFc1, c.m_in, *p.fc1_w, p.fc1_b, df1, dm_in, layer,
                                    mb);
    }
    Tensor dln2 = pairs_->pair_input_backward(dm_in, models::kMlpCollectives, layer, mb);
    Tensor dx1 = act({local_rows_, h_});
    {
      auto s = rec(ctx_.op(OpId::kMlpNorm, layer, B, mb));
      norm_backward(c.x1, *p.ln2_g, p.ln2_b, c.ln2_mean, c.ln2_rstd, dln2, dx1);
    }
    residual_backward(OpId::kMlpResidual, layer, mb, dy, grid_ ? nullptr : p.fc2_b, dx1);
    // Attention branch: x1 = x + proj(attn(qkv(ln1(x)))) (+ bias).
    Tensor dproj = pairs_->pair_output_backward(dx1, models::kAttnCollectives, layer, mb);
    Tensor do_ = act({rows_, hd_local});
    pairs_->second_linear_backward(OpId::kAttnProj, c.o, *p.proj_w, p.proj_b, dproj, do_, layer,
                                   mb);
    Tensor dqkv = act({rows_, qkv_.width()});
    if (cp_attention_) {
      cp_attention_->backward(c.qkv, c.att, c.qkv_heads, do_, dqkv, layer, mb);
    } else {
      Tensor dprobs = act({batch_, heads_local_, seq_, seq_});
      {
        auto s = rec(ctx_.op(OpId::kAttnContext, layer, B, mb));
        be.attention_context_backward(c.att, c.qkv, do_, qkv_, dprobs, dqkv);
      }
      {
        auto s = rec(ctx_.op(OpId::kAttnSoftmax, layer, B, mb));
        be.causal_softmax_backward(c.att, dprobs, seq_);
      }
      {
        auto s = rec(ctx_.op(OpId::kAttnScores, layer, B, mb));
        be.attention_scores_backward(dprobs, c.qkv, qkv_, dqkv);
      }
    }
    if (rope()) {  // dq and dk are gradients of the rotated q and k: rotate them back
      auto s = rec(ctx_.op(OpId::kAttnRope, layer, B, mb));
      be.rope(dqkv, qkv_, kRopeBase, true);
    }
    Tensor da_in = act({rows_, pairs_->pair_input_width()});
    pairs_->first_linear_backward(OpId::kAttnQkv, c.a_in, *p.qkv_w, p.qkv_b, dqkv, da_in, layer,
                                  mb);
    Tensor dln1 = pairs_->pair_input_backward(da_in, models::kAttnCollectives, layer, mb);
    Tensor dx = act({local_rows_, h_});
    {
      auto s = rec(ctx_.op(OpId::kAttnNorm, layer, B, mb));
      norm_backward(c.x, *p.ln1_g, p.ln1_b, c.ln1_mean, c.ln1_rstd, dln1, dx);
    }
    residual_backward(OpId::kAttnResidual, layer, mb, dx1, grid_ ? nullptr : p.proj_b, dx);
    return dx;
  }

  // The backward of `out = in + branch (+ bias)`: the gradient of `in` is the incoming gradient
  // `dout` plus what the branch's norm gave back (`dnorm`, accumulated in place), and the bias
  // gradient is the sum of `dout` over rows. One op, as the lowering counts it.
  void residual_backward(OpId residual, int32_t layer, int64_t mb, const Tensor& dout, Param* bias,
                         Tensor& dnorm) {
    auto s = rec(ctx_.op(residual, layer, Phase::kBwd, mb));
    if (bias != nullptr) bias_grad(dout, bias->grad);
    backend().add(dnorm, dout, dnorm);
  }

  // The attention core, as the simulator names its steps; returns the probabilities.
  Tensor attention_core(const Tensor& qkv, Tensor& out, Tensor& qkv_heads, int32_t layer,
                        Phase phase, int64_t mb) {
    Backend& be = backend();
    if (cp_attention_) return cp_attention_->forward(qkv, out, qkv_heads, layer, phase, mb);
    Tensor probs = act({batch_, heads_local_, seq_, seq_});
    {
      auto s = rec(ctx_.op(OpId::kAttnScores, layer, phase, mb));
      be.attention_scores(qkv, qkv_, probs);
    }
    {
      auto s = rec(ctx_.op(OpId::kAttnSoftmax, layer, phase, mb));
      be.causal_softmax(probs, seq_);
    }
    {
      auto s = rec(ctx_.op(OpId::kAttnContext, layer, phase, mb));
      be.attention_context(probs, qkv, qkv_, out);
    }
    return probs;
  }

  void activation(const Tensor& x, Tensor& y) { exec::activation(backend(), m_.activation, x, y); }
  void activation_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
    exec::activation_backward(backend(), m_.activation, x, dy, dx);
  }

  bool layernorm() const { return m_.norm == spec::Norm::kLayerNorm; }
  bool rope() const { return m_.position_embedding == spec::PositionEmbedding::kRope; }
  // LayerNorm (gamma, beta; saves mean and rstd) or RMSNorm (gamma; saves rstd).
  void norm(const Tensor& x, const Param& gamma, const Param* beta, Tensor& y, Tensor& mean,
            Tensor& rstd) {
    if (layernorm()) {
      backend().layernorm(x, gamma.compute, beta->compute, y, mean, rstd);
    } else {
      backend().rmsnorm(x, gamma.compute, y, rstd);
    }
  }
  void norm_backward(const Tensor& x, Param& gamma, Param* beta, const Tensor& mean,
                     const Tensor& rstd, const Tensor& dy, Tensor& dx) {
    if (layernorm()) {
      backend().layernorm_backward(x, gamma.compute, mean, rstd, dy, dx, gamma.grad, beta->grad);
    } else {
      backend().rmsnorm_backward(x, gamma.compute, rstd, dy, dx, gamma.grad);
    }
  }

  void add_bias(Tensor& y, const Tensor& b) { backend().bias_add(y, b); }
  void bias_grad(const Tensor& dy, Tensor& db) { backend().bias_backward(dy, db); }

  // --- Head: final norm, vocabulary-parallel logits and cross-entropy ---------------------------

  void head_forward(const MicroBatch& mb, const Tensor& x, HeadCache& c) {
    Backend& be = backend();
    const int32_t layer = head_layer_;
    c.x = x;
    c.ln = act({local_rows_, h_});
    c.mean = be.empty({local_rows_});
    c.rstd = be.empty({local_rows_});
    {
      auto s = rec(ctx_.op(OpId::kHeadNorm, layer, Phase::kFwd, mb.index));
      norm(x, *head_g_, head_b_, c.ln, c.mean, c.rstd);
    }
    c.xg = pairs_->gather(c.ln, models::kHeadCollectives, Phase::kFwd, layer, mb.index);
    // Logits over the whole padded shard (aligned: an odd width such as GPT-2's 50257 ran the
    // GEMMs 5-8x slower on the H200); the loss leaves the padding columns out.
    const Tensor& w = head_w_->compute;
    c.logits = act({rows_, vocab_local_});
    {
      auto s = rec(ctx_.op(OpId::kHeadLogits, layer, Phase::kFwd, mb.index));
      be.matmul_nt(c.xg, w, c.logits);
    }
    std::vector<float> target;
    {
      auto s = rec(ctx_.op(OpId::kHeadLoss, layer, Phase::kFwd, mb.index));
      be.softmax_stats(c.logits, mb.targets, r_ * vocab_local_, vocab_valid_, c.max, c.sum, target);
    }
    if (t_ > 1) {
      // Each shard's sum is relative to its own max: rescale to the global max, then add.
      const std::vector<float> local_max = c.max;
      {
        auto s = pairs_->comm_scope(OpId::kHeadLossAllReduce, OpClass::kAllReduce, rows_ * 4,
                                    Phase::kFwd, layer, mb.index);
        ctx_.groups->tp->all_reduce_max_host(c.max.data(), rows_);
      }
      for (size_t i = 0; i < c.sum.size(); ++i) c.sum[i] *= std::exp(local_max[i] - c.max[i]);
    }
    if (t_ > 1) {
      std::vector<float> both(c.sum);
      both.insert(both.end(), target.begin(), target.end());
      auto s = pairs_->comm_scope(OpId::kHeadLossAllReduce, OpClass::kAllReduce, 2 * rows_ * 4,
                                  Phase::kFwd, layer, mb.index);
      ctx_.groups->tp->all_reduce_host(both.data(), 2 * rows_);
      std::copy(both.begin(), both.begin() + rows_, c.sum.begin());
      std::copy(both.begin() + rows_, both.end(), target.begin());
    }
    double loss = 0;
    for (int64_t i = 0; i < rows_; ++i)
      loss += std::log(static_cast<double>(c.sum[static_cast<size_t>(i)])) +
              c.max[static_cast<size_t>(i)] - target[static_cast<size_t>(i)];
    loss_sum_ += loss;
  }

  Tensor head_backward(const MicroBatch& mb, HeadCache& c) {
    Backend& be = backend();
    const int32_t layer = head_layer_;
    // The loss of a step is the mean over every token of the global batch.
    const float scale = 1.0f / static_cast<float>(ctx_.plan->global_batch * seq_);
    Tensor dlogits = act({rows_, vocab_local_});
    {
      auto s = rec(ctx_.op(OpId::kHeadLoss, layer, Phase::kBwd, mb.index));
      be.cross_entropy_backward(c.logits, mb.targets, r_ * vocab_local_, vocab_valid_, c.max, c.sum,
                                scale, dlogits);
    }
    Tensor dxg = act({rows_, h_});
    {
      auto s = rec(ctx_.op(OpId::kHeadLogits, layer, Phase::kBwd, mb.index));
      // The padding columns' zero gradient leaves the padding rows' gradient zero.
      be.matmul_nt_backward(c.xg, head_w_->compute, dlogits, dxg, head_w_->grad);
    }
    Tensor dln = pairs_->gather_backward(dxg, models::kHeadCollectives, layer, mb.index);
    Tensor dx = act({local_rows_, h_});
    {
      auto s = rec(ctx_.op(OpId::kHeadNorm, layer, Phase::kBwd, mb.index));
      norm_backward(c.x, *head_g_, head_b_, c.mean, c.rstd, dln, dx);
    }
    return dx;
  }

  Context& ctx_;
  const spec::TransformerSpec& m_;
  StageOptions o_;
  int64_t t_ = 1, r_ = 0;  // the layer group (Groups::tp) and the rank's place in it
  bool sp_ = false;
  int64_t batch_ = 0;  // sequences per micro-batch (a z slice's on a grid)
  int64_t split_ = 1;  // ranks splitting the heads and the ffn: tp, or a grid's y
  int64_t seq_ = 0, rows_ = 0, local_rows_ = 0, h_ = 0, heads_local_ = 0, f_local_ = 0;
  std::unique_ptr<GridLinear> grid_;    // on a 3D tensor grid
  std::unique_ptr<LinearPairs> pairs_;  // the layer pairs and the tp collectives
  // On a grid, the parameters another rank of the grid holds too and counts in the gradient
  // norm (besides those tp_replicated covers).
  std::set<const Param*> norm_copies_;
  std::unique_ptr<CpAttention> cp_attention_;  // under context parallelism
  QkvLayout qkv_;  // this rank's heads (and its rows of each sequence, under cp)
  int64_t gate_ = 1, vocab_local_ = 0;
  int64_t vocab_valid_ = 0;  // rows of this rank's vocabulary shard that are real tokens
  std::vector<std::pair<int32_t, int32_t>> chunks_;  // [begin, end) lowered layers of each chunk
  int32_t head_layer_ = 0;                           // the model's last lowered layer
  std::vector<spec::Recompute> recompute_;           // by lowered layer (models::layer_recompute)
  bool has_embedding_ = false, has_head_ = false;
  std::unique_ptr<ParamStore> store_;
  std::map<int32_t, BlockParams> blocks_;      // by layer
  std::unique_ptr<MoeLayer> moe_;              // a mixture of experts' MLP
  std::map<int32_t, MoeWeights> moe_weights_;  // by MoE layer
  Param* table_ = nullptr;
  Param* position_table_ = nullptr;
  Param* head_g_ = nullptr;
  Param* head_b_ = nullptr;
  Param* head_w_ = nullptr;
  std::map<std::pair<int64_t, int64_t>, MicroBatchCache> caches_;  // by (micro-batch, chunk)
  LayerHooks* hooks_ = nullptr;
  double loss_sum_ = 0;
};

}  // namespace

std::unique_ptr<StageModel> make_gpt_stage(const spec::ModelSpec& model, Context& ctx,
                                           const StageOptions& options) {
  return std::make_unique<GptStage>(model, ctx, options);
}

}  // namespace sextant::exec
