// An MLP classifier stage: linear layers with ReLU between them, softmax cross-entropy on the
// last. Pipeline stages hold consecutive layers; tensor parallelism does not apply. Under per-op
// splits the layers run as a chain of split fc layers (split_fc_chain.hpp) on one stage.
#include <fmt/format.h>

#include <cmath>
#include <map>

#include "split_fc_chain.hpp"
#include "train/stage_model.hpp"

namespace sextant::exec {

using models::OpId;

namespace {

using spec::Phase;

// The MLP's layers as a chain: "fc<l>" each, its product and activation named as the lowering
// names them (models/src/mlp_lowering.cpp), ReLU on all but the classifier.
std::vector<FcChainLayer> mlp_chain_layers(const spec::MlpSpec& m) {
  std::vector<FcChainLayer> out;
  const auto layers = static_cast<int32_t>(m.widths.size()) - 1;
  for (int32_t l = 0; l < layers; ++l) {
    const std::string name = fmt::format("fc{}", l);
    const bool classifier = l + 1 == layers;
    out.push_back({l, name, name, m.widths[static_cast<size_t>(l)],
                   m.widths[static_cast<size_t>(l) + 1], !classifier, m.bias, classifier,
                   OpId::kUnitProduct, OpId::kUnitAct});
  }
  return out;
}

class MlpStage : public StageModel {
 public:
  MlpStage(const spec::ModelSpec& model, Context& ctx, const StageOptions& o)
      : ctx_(ctx), m_(model.mlp()), o_(o) {
    models::StageLayers sl = models::stage_layers(*ctx.plan, *ctx.lowered, ctx.groups->pp_rank);
    begin_ = static_cast<int32_t>(sl.chunk_begin.at(0));
    end_ = static_cast<int32_t>(sl.chunk_end.at(0));
    last_ = end_ == static_cast<int32_t>(m_.widths.size()) - 1;
    if (!ctx.plan->per_op.empty())
      split_ = std::make_unique<SplitFcChain>(ctx, mlp_chain_layers(m_), o.micro_batch);
    std::vector<ParamSpec> specs;
    for (int32_t l = begin_; l < end_; ++l) {
      if (split_ != nullptr) {
        split_->add_params(l, o.seed, specs);
        continue;
      }
      const int64_t in = m_.widths[static_cast<size_t>(l)],
                    out = m_.widths[static_cast<size_t>(l) + 1];
      const std::string name = fmt::format("fc{}.weight", l);
      const uint64_t seed = o.seed;
      // He initialisation for ReLU layers, std = sqrt(2 / fan_in); the classifier starts small
      // so that the first loss is near log(classes).
      const bool classifier = l + 1 == static_cast<int32_t>(m_.widths.size()) - 1;
      const float std_dev = classifier ? 0.01f : std::sqrt(2.0f / static_cast<float>(in));
      specs.push_back({name,
                       l,
                       {in, out},
                       [=](int64_t i) { return std_dev * init_normal(seed, name, i); },
                       true,
                       false,
                       false,
                       false});
      if (m_.bias)
        specs.push_back({fmt::format("fc{}.bias", l),
                         l,
                         {out},
                         [](int64_t) { return 0.0f; },
                         false,
                         false,
                         false,
                         false});
    }
    store_ = std::make_unique<ParamStore>(*ctx.backend, specs);
    if (split_ != nullptr) split_->bind(*store_);
  }

  ParamStore& params() override { return *store_; }
  std::vector<int64_t> input_shape() const override {
    return {o_.micro_batch, m_.widths[static_cast<size_t>(begin_)]};
  }
  std::vector<int64_t> output_shape() const override {
    return {o_.micro_batch, m_.widths[static_cast<size_t>(end_)]};
  }
  void set_hooks(LayerHooks* hooks) override { hooks_ = hooks; }
  double take_loss_sum() override {
    double l = loss_;
    loss_ = 0;
    return l;
  }
  double grad_square_sum(int64_t begin, int64_t end) override {
    // Every parameter counts once on every rank: the whole range.
    return end > begin ? ctx_.backend->sum_squares(store_->grads().rows(begin, end - begin)) : 0.0;
  }

  Tensor forward(const MicroBatch& mb, const Tensor* input, int64_t /*chunk: always 0*/) override {
    Backend& be = *ctx_.backend;
    auto& cache = caches_[mb.index];
    cache.clear();
    Tensor x;
    if (begin_ == 0) {
      x = be.empty({o_.micro_batch, m_.widths[0]}, be.activation_dtype());
      be.from_host(mb.features, x);
    } else {
      x = *input;
    }
    for (int32_t l = begin_; l < end_; ++l) {
      if (hooks_ != nullptr) hooks_->before_forward(l, mb.index);
      const int64_t out = m_.widths[static_cast<size_t>(l) + 1];
      const bool classifier = l + 1 == static_cast<int32_t>(m_.widths.size()) - 1;
      if (split_ != nullptr) {  // the chain runs the product and the ReLU on its blocks
        Tensor y = split_->forward(l, x, mb.index);
        if (!classifier) {
          x = y;
          continue;
        }
        cache.push_back({Tensor(), y});  // the logits, this replica's rows
        add_loss(y, mb);
        return Tensor();
      }
      Tensor y = be.empty({o_.micro_batch, out}, be.activation_dtype());
      {
        auto s = ctx_.recorder->scope(ctx_.op(
            models::OpName(fmt::format("fc{}", l), OpId::kUnitProduct), l, Phase::kFwd, mb.index));
        be.matmul(x, weight(l).compute, bias(l) ? &bias(l)->compute : nullptr, y);
      }
      cache.push_back({x, y});
      if (classifier) {
        add_loss(y, mb);
        return Tensor();
      }
      Tensor a = be.empty({o_.micro_batch, out}, be.activation_dtype());
      {
        auto s = ctx_.recorder->scope(ctx_.op(
            models::OpName(fmt::format("fc{}", l), OpId::kUnitAct), l, Phase::kFwd, mb.index));
        be.relu(y, a);
      }
      x = a;
    }
    return x;
  }

  Tensor backward(const MicroBatch& mb, const Tensor* grad_output,
                  int64_t /*chunk: always 0*/) override {
    if (split_ != nullptr) return split_backward(mb);
    Backend& be = *ctx_.backend;
    auto& cache = caches_.at(mb.index);
    Tensor dy;
    for (int32_t l = end_ - 1; l >= begin_; --l) {
      if (hooks_ != nullptr) hooks_->before_backward(l, mb.index);
      auto& [x, y] = cache[static_cast<size_t>(l - begin_)];
      Tensor dpre = be.empty(y.shape(), be.activation_dtype());
      if (l + 1 == static_cast<int32_t>(m_.widths.size()) - 1) {
        loss_backward(y, mb, dpre);
      } else {
        const Tensor& upstream = l == end_ - 1 ? *grad_output : dy;
        auto s = ctx_.recorder->scope(ctx_.op(
            models::OpName(fmt::format("fc{}", l), OpId::kUnitAct), l, Phase::kBwd, mb.index));
        be.relu_backward(y, upstream, dpre);
      }
      Tensor dx = be.empty(x.shape(), be.activation_dtype());
      {
        auto s = ctx_.recorder->scope(ctx_.op(
            models::OpName(fmt::format("fc{}", l), OpId::kUnitProduct), l, Phase::kBwd, mb.index));
        be.matmul_backward(x, weight(l).compute, dpre, l == 0 ? nullptr : &dx, weight(l).grad,
                           bias(l) ? &bias(l)->grad : nullptr);
      }
      dy = dx;
      if (hooks_ != nullptr) hooks_->after_backward(l, mb.index);
    }
    caches_.erase(mb.index);
    max_.erase(mb.index);
    sum_.erase(mb.index);
    return begin_ == 0 ? Tensor() : dy;
  }

 private:
  // The loss over the classifier's logits y [micro_batch, classes]: their softmax statistics
  // kept for the backward.
  void add_loss(const Tensor& y, const MicroBatch& mb) {
    const int32_t l = static_cast<int32_t>(m_.widths.size()) - 2;
    auto s = ctx_.recorder->scope(ctx_.op(OpId::kLoss, l, Phase::kFwd, mb.index));
    std::vector<float> target;
    ctx_.backend->softmax_stats(y, mb.targets, 0, y.shape().back(), max_[mb.index], sum_[mb.index],
                                target);
    for (int64_t i = 0; i < o_.micro_batch; ++i) {
      size_t k = static_cast<size_t>(i);
      loss_ += std::log(static_cast<double>(sum_[mb.index][k])) + max_[mb.index][k] - target[k];
    }
  }
  void loss_backward(const Tensor& y, const MicroBatch& mb, Tensor& dy) {
    const int32_t l = static_cast<int32_t>(m_.widths.size()) - 2;
    auto s = ctx_.recorder->scope(ctx_.op(OpId::kLoss, l, Phase::kBwd, mb.index));
    ctx_.backend->cross_entropy_backward(y, mb.targets, 0, y.shape().back(), max_[mb.index],
                                         sum_[mb.index],
                                         1.0f / static_cast<float>(ctx_.plan->global_batch), dy);
  }
  // The backward through the split chain (one stage: every layer, the loss first).
  Tensor split_backward(const MicroBatch& mb) {
    const Tensor logits = caches_.at(mb.index).back().second;
    Tensor dy = ctx_.backend->empty(logits.shape(), ctx_.backend->activation_dtype());
    loss_backward(logits, mb, dy);
    for (int32_t l = end_ - 1; l >= begin_; --l) {
      if (hooks_ != nullptr) hooks_->before_backward(l, mb.index);
      dy = split_->backward(l, dy, mb.index);
      if (hooks_ != nullptr) hooks_->after_backward(l, mb.index);
    }
    split_->forget(mb.index);
    caches_.erase(mb.index);
    max_.erase(mb.index);
    sum_.erase(mb.index);
    return Tensor();
  }

  Param& weight(int32_t l) { return store_->get(fmt::format("fc{}.weight", l)); }
  Param* bias(int32_t l) { return m_.bias ? &store_->get(fmt::format("fc{}.bias", l)) : nullptr; }

  Context& ctx_;
  const spec::MlpSpec& m_;
  StageOptions o_;
  int32_t begin_ = 0, end_ = 0;
  bool last_ = false;
  std::unique_ptr<SplitFcChain> split_;  // the layers under per-op splits
  std::unique_ptr<ParamStore> store_;
  std::map<int64_t, std::vector<std::pair<Tensor, Tensor>>> caches_;  // (input, pre-activation)
  std::map<int64_t, std::vector<float>> max_, sum_;
  LayerHooks* hooks_ = nullptr;
  double loss_ = 0;
};

}  // namespace

std::unique_ptr<StageModel> make_gpt_stage(const spec::ModelSpec& model, Context& ctx,
                                           const StageOptions& options);
std::unique_ptr<StageModel> make_cnn_stage(const spec::ModelSpec& model, Context& ctx,
                                           const StageOptions& options);

std::unique_ptr<StageModel> make_stage_model(const spec::ModelSpec& model, Context& ctx,
                                             const StageOptions& options) {
  // What each kind runs on which backend is spec::executor_problems' to say (exec::check_job).
  switch (model.kind()) {
    case spec::ModelKind::kMlp:
      return std::make_unique<MlpStage>(model, ctx, options);
    case spec::ModelKind::kCnn:
      return make_cnn_stage(model, ctx, options);
    case spec::ModelKind::kTransformer:
      return make_gpt_stage(model, ctx, options);
  }
  return nullptr;
}

}  // namespace sextant::exec
