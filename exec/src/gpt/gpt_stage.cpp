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
// The stage works out this rank's shapes once (GptParts) and runs its lowered layers in order:
// the embedding (gpt_embedding.hpp), the blocks (transformer_block.hpp) and the output layer
// (gpt_head.hpp), each holding its own parameters and what its forward keeps.
#include <map>
#include <set>

#include "gpt_embedding.hpp"
#include "gpt_head.hpp"
#include "gpt_params.hpp"
#include "grid_linear.hpp"
#include "per_op/split_block.hpp"
#include "sextant/models/vocabulary.hpp"
#include "transformer_block.hpp"

namespace sextant::exec {

namespace {

class GptStage : public StageModel {
 public:
  GptStage(const spec::ModelSpec& model, Context& ctx, const StageOptions& o)
      : ctx_(ctx), m_(model.transformer()), o_(o) {
    const spec::Plan& plan = *ctx.plan;
    GptShape& s = parts_.shape;
    s.t = ctx.groups->tp_size;
    s.r = ctx.groups->tp_rank;
    s.sequence_parallel = ctx.sequence_parallel;
    s.seq = o.seq_len;
    s.h = m_.hidden;
    s.batch = o.micro_batch;
    s.split = s.t;
    if (plan.tp_grid.any()) {
      // A z slice's sequences; the heads and the ffn split over y (spec/tensor_grid.hpp).
      grid_ = std::make_unique<GridLinear>(ctx);
      s.batch = o.micro_batch / grid_->z();
      s.split = grid_->y();
    }
    s.heads_local = m_.heads / s.split;
    s.qkv = {s.batch, s.seq, s.heads_local, m_.kv_heads / s.split, m_.head_dim()};
    if (ctx.groups->cp_size > 1) {
      // The rank's chunks of each sequence (cp_attention.hpp).
      cp_attention_ = std::make_unique<CpAttention>(ctx, s.batch, s.seq, s.qkv.heads,
                                                    s.qkv.kv_heads, s.qkv.head_dim);
      s.qkv = cp_attention_->layout();
    }
    s.rows = s.batch * s.qkv.seq;
    pairs_ = std::make_unique<LinearPairs>(ctx, grid_.get(), s.rows, s.h);
    s.local_rows = pairs_->local_rows();
    s.f_local = m_.ffn_hidden / s.split;
    s.gate = m_.activation == spec::Activation::kSwiglu ? 2 : 1;
    // The vocabulary padded as the lowering lays it out (models::vocab_shard: a multiple of the
    // executor stack's vocab_multiple x tp rows, runner.cpp): every rank holds the same number of
    // rows; the padded rows at the end of the last ranks are zeros that no token looks up, and
    // their logits, computed so that the logits GEMMs run on aligned shapes, are left out of the
    // loss (zero gradient), so the model is the same under any tp.
    s.vocab_local = ctx.lowered->vocab_shard;
    s.vocab_valid = models::vocab_rows_used(m_.vocab, s.vocab_local, s.r);
    models::StageLayers sl = models::stage_layers(plan, *ctx.lowered, ctx.groups->pp_rank);
    // One chunk of layers, or several under the interleaved schedule (chunk c is the model's
    // chunk c * pp + stage).
    for (size_t c = 0; c < sl.chunk_begin.size(); ++c)
      chunks_.push_back(
          {static_cast<int32_t>(sl.chunk_begin[c]), static_cast<int32_t>(sl.chunk_end[c])});
    head_layer_ = static_cast<int32_t>(ctx.lowered->layers.size()) - 1;
    if (m_.moe) moe_ = std::make_unique<MoeLayer>(ctx, m_);
    if (!plan.per_op.empty()) {
      // Per-op splits that change the blocks run as split_block.hpp says, those of the logits as
      // gpt_head.hpp says, on the dp x tp mesh: axis d over the replicas, t over the tp group.
      auto block = std::make_unique<models::PerOpBlock>(models::per_op_block(m_, plan));
      if (block->any_change()) per_op_ = std::move(block);
      auto head =
          std::make_unique<models::PerOpHead>(models::per_op_head(m_, plan, s.vocab_local * s.t));
      if (head->changed()) head_split_ = std::move(head);
      if (per_op_ || head_split_) {
        pairs_->split_each_sequence(s.batch);  // the stream's layout (block_graph.hpp)
        mesh_ = std::make_unique<MeshRanks>(
            spec::DeviceMesh{{{spec::kDataAxis, ctx.groups->replica_size},
                              {spec::kTensorAxis, ctx.groups->tp_size}}},
            std::map<std::string, MeshRanks::Axis, std::less<>>{
                {spec::kDataAxis, {ctx.groups->replicas, ctx.groups->replica_rank}},
                {spec::kTensorAxis, {ctx.groups->tp, ctx.groups->tp_rank}}});
      }
    }
    parts_.ctx = &ctx;
    parts_.model = &m_;
    parts_.pairs = pairs_.get();
    parts_.grid = grid_.get();
    parts_.cp = cp_attention_.get();
    parts_.moe = moe_.get();
    build_params();
    build_layers();
  }

  ParamStore& params() override { return *store_; }
  std::vector<int64_t> input_shape() const override {
    return {parts_.shape.local_rows, parts_.shape.h};
  }
  void set_hooks(LayerHooks* hooks) override { hooks_ = hooks; }
  double take_loss_sum() override { return head_ != nullptr ? head_->take_loss_sum() : 0.0; }

  double grad_square_sum(int64_t begin, int64_t end) override {
    std::vector<std::pair<int64_t, int64_t>> spans;
    for (Param& p : store_->params()) {
      if (p.tied_copy) continue;
      if (p.tp_replicated && parts_.shape.r != 0) continue;
      if (grid_ && norm_copies_.contains(&p)) continue;
      int64_t b = std::max(begin, p.offset);
      int64_t e = std::min(end, p.offset + p.value.numel());
      if (b < e) spans.emplace_back(b, e - b);
    }
    return ctx_.backend->sum_squares_spans(store_->grads(), spans);
  }

  int64_t chunks() const override { return static_cast<int64_t>(chunks_.size()); }

  Tensor forward(const MicroBatch& mb, const Tensor* input, int64_t chunk) override {
    const auto [begin, end] = chunks_.at(static_cast<size_t>(chunk));
    Tensor x;
    if (begin != 0) x = *input;
    for (int32_t layer = begin; layer < end; ++layer) {
      if (hooks_ != nullptr) hooks_->before_forward(layer, mb.index);
      x = layers_.at(layer)->forward(mb, x);
    }
    return x;  // empty after the output layer
  }

  Tensor backward(const MicroBatch& mb, const Tensor* grad_output, int64_t chunk) override {
    const auto [begin, end] = chunks_.at(static_cast<size_t>(chunk));
    Tensor dy;
    if (end - 1 != head_layer_) dy = *grad_output;
    for (int32_t layer = end - 1; layer >= begin; --layer) {
      if (hooks_ != nullptr) hooks_->before_backward(layer, mb.index);
      dy = layers_.at(layer)->backward(mb, dy);
      if (hooks_ != nullptr) hooks_->after_backward(layer, mb.index);
    }
    return dy;  // empty before the embedding
  }

 private:
  // This rank's lowered layers, in forward order.
  std::vector<int32_t> local_layers() const {
    std::vector<int32_t> layers;
    for (auto [begin, end] : chunks_)
      for (int32_t layer = begin; layer < end; ++layer) layers.push_back(layer);
    return layers;
  }

  void build_params() {
    GptSplit split;
    split.t = parts_.shape.t;
    split.r = parts_.shape.r;
    split.vocab_local = parts_.shape.vocab_local;
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
    split.sequence_parallel = ctx_.sequence_parallel;
    split.per_op = per_op_.get();
    split.mesh = mesh_.get();
    split.head = head_split_.get();
    const bool has_embedding = chunks_.front().first == 0;
    GptParams made = gpt_params(m_, split, local_layers(), head_layer_, has_embedding, o_.seed);
    store_ = std::make_unique<ParamStore>(*ctx_.backend, made.specs);
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
  }

  void build_layers() {
    const std::vector<spec::Recompute> recompute =
        models::layer_recompute(*ctx_.plan, *ctx_.lowered);
    const std::vector<bool> offloaded = models::layer_activation_offload(*ctx_.plan, *ctx_.lowered);
    Param* table = nullptr;  // the embedding's, when this rank has it
    for (int32_t layer : local_layers()) {
      std::unique_ptr<GptLayer> made;
      if (layer == 0) {
        auto embedding = std::make_unique<GptEmbedding>(parts_, *store_);
        table = embedding->table();
        made = std::move(embedding);
      } else if (layer == head_layer_) {
        auto head = head_split_ != nullptr
                        ? std::make_unique<GptHead>(parts_, *store_, layer, *head_split_, *mesh_)
                        : std::make_unique<GptHead>(parts_, *store_, layer, table);
        head_ = head.get();
        made = std::move(head);
      } else if (per_op_) {
        made = std::make_unique<SplitBlock>(parts_, *store_, layer, *per_op_, *mesh_);
      } else {
        made = std::make_unique<TransformerBlock>(
            parts_, *store_, layer, gpt_moe_layer(m_, layer, head_layer_),
            recompute.at(static_cast<size_t>(layer)), offloaded.at(static_cast<size_t>(layer)));
      }
      layers_[layer] = std::move(made);
    }
  }

  Context& ctx_;
  const spec::TransformerSpec& m_;
  StageOptions o_;
  GptParts parts_;                                 // what the layers share
  std::unique_ptr<GridLinear> grid_;               // on a 3D tensor grid
  std::unique_ptr<LinearPairs> pairs_;             // the layer pairs and the tp collectives
  std::unique_ptr<CpAttention> cp_attention_;      // under context parallelism
  std::unique_ptr<MoeLayer> moe_;                  // a mixture of experts' MLP
  std::unique_ptr<models::PerOpBlock> per_op_;     // per-op splits that change the blocks
  std::unique_ptr<models::PerOpHead> head_split_;  // a per-op split that changes the logits
  std::unique_ptr<MeshRanks> mesh_;                // and this rank's place on their mesh
  // On a grid, the parameters another rank of the grid holds too and counts in the gradient
  // norm (besides those tp_replicated covers).
  std::set<const Param*> norm_copies_;
  std::vector<std::pair<int32_t, int32_t>> chunks_;  // [begin, end) lowered layers of each chunk
  int32_t head_layer_ = 0;                           // the model's last lowered layer
  std::unique_ptr<ParamStore> store_;
  std::map<int32_t, std::unique_ptr<GptLayer>> layers_;  // this rank's, by lowered layer
  GptHead* head_ = nullptr;                              // the output layer, on the last stage
  LayerHooks* hooks_ = nullptr;
};

}  // namespace

std::unique_ptr<StageModel> make_gpt_stage(const spec::ModelSpec& model, Context& ctx,
                                           const StageOptions& options) {
  return std::make_unique<GptStage>(model, ctx, options);
}

}  // namespace sextant::exec
