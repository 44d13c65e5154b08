// Whole-model totals computed from the lowering.
#include "sextant/models/counts.hpp"

#include "sextant/models/lowering.hpp"

namespace sextant::models {

int64_t parameter_count(const spec::ModelSpec& model) {
  LoweredModel lowered = lower(model, LoweringOptions{1, 1, spec::Dtype::kBf16, 1, false});
  int64_t total = 0;
  for (const Layer& l : lowered.layers) total += l.params_total;
  return total;
}

int64_t active_parameter_count(const spec::ModelSpec& model) {
  LoweredModel lowered = lower(model, LoweringOptions{1, 1, spec::Dtype::kBf16, 1, false});
  const spec::MoeSpec* moe =
      model.is_transformer() && model.transformer().moe ? &*model.transformer().moe : nullptr;
  int64_t total = 0;
  for (const Layer& l : lowered.layers) {
    total += l.params_total;
    if (moe != nullptr)  // the experts are alike: (experts - top_k) of them unused
      total -= l.routed_expert_params_total / moe->experts * (moe->experts - moe->top_k);
  }
  return total;
}

StepFlops step_flops(const spec::ModelSpec& model, int64_t global_batch, int64_t seq_len,
                     spec::Recompute recompute) {
  spec::Plan plan;
  plan.global_batch = global_batch;
  plan.recompute = recompute;
  return step_flops(model, plan, seq_len);
}

StepFlops step_flops(const spec::ModelSpec& model, const spec::Plan& plan, int64_t seq_len) {
  // FLOPs are linear in the batch: lower one sequence (or sample) and scale.
  LoweredModel lowered = lower(model, LoweringOptions{1, seq_len, spec::Dtype::kBf16, 1, false});
  const std::vector<spec::Recompute> modes = layer_recompute(plan, lowered);
  double per_sample = 0;
  double recomputed = 0;
  for (size_t i = 0; i < lowered.layers.size(); ++i) {
    const Layer& l = lowered.layers[i];
    per_sample += l.forward_flops() + l.backward_flops();
    bool in_split = i >= lowered.split_begin && i < lowered.split_end;
    if (!in_split) continue;
    if (modes[i] == spec::Recompute::kFull) {
      recomputed += l.forward_flops();
    } else if (modes[i] == spec::Recompute::kSelective) {
      for (const Op& op : l.selective_forward) recomputed += op.flops;
    }
  }
  double b = static_cast<double>(plan.global_batch);
  return StepFlops{b * per_sample, b * (per_sample + recomputed)};
}

double forward_flops_per_token(const spec::ModelSpec& model, int64_t seq_len) {
  LoweredModel lowered = lower(model, LoweringOptions{1, seq_len, spec::Dtype::kBf16, 1, false});
  double f = 0;
  for (const Layer& l : lowered.layers) f += l.forward_flops();
  return f / static_cast<double>(lowered.tokens_per_micro_batch);
}

int64_t block_activation_bytes(const spec::ModelSpec& model, int64_t micro_batch, int64_t seq_len,
                               int64_t tp, bool sequence_parallel, spec::Recompute recompute,
                               spec::Dtype dtype) {
  LoweredModel lowered =
      lower(model, LoweringOptions{micro_batch, seq_len, dtype, tp, sequence_parallel});
  return lowered.layers.at(lowered.split_begin).saved_bytes_for(recompute);
}

}  // namespace sextant::models
