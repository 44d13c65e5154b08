// Lowering of a model and a plan's split into per-rank ops: what a plan's pipeline stages hold,
// which layers recompute, the gradient buckets, and the dispatch to each model family's lowering
// (transformer_lowering.cpp, mlp_lowering.cpp, cnn_lowering.cpp).
#include "sextant/models/lowering.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "lowering_ops.hpp"
#include "model_lowerings.hpp"
#include "sextant/spec/channel_split.hpp"
#include "sextant/spec/error.hpp"
#include "sextant/spec/pipeline_schedule.hpp"
#include "sextant/spec/spatial_split.hpp"

namespace sextant::models {

using spec::CollectiveKind;
using spec::OpClass;

std::string_view tp_split_name(TpSplit split) {
  switch (split) {
    case TpSplit::kReplicated:
      return "replicated";
    case TpSplit::kColumn:
      return "column";
    case TpSplit::kRow:
      return "row";
    case TpSplit::kHead:
      return "head";
    case TpSplit::kVocab:
      return "vocab";
    case TpSplit::kSequence:
      return "sequence";
  }
  return "?";
}

bool Layer::same_work_as(const Layer& o) const {
  return kind == o.kind && params == o.params && params_total == o.params_total &&
         routed_expert_params_total == o.routed_expert_params_total &&
         expert_params == o.expert_params && sp_partial_params == o.sp_partial_params &&
         matrices == o.matrices && convolutions == o.convolutions && saved_bytes == o.saved_bytes &&
         saved_bytes_selective == o.saved_bytes_selective &&
         saved_bytes_full == o.saved_bytes_full && output_bytes == o.output_bytes &&
         forward == o.forward && backward == o.backward &&
         selective_forward == o.selective_forward && kept_for_backward == o.kept_for_backward;
}

std::span<const Op> recomputed_forward(const Layer& layer) {
  size_t copies = 0;
  while (copies < layer.forward.size() && layer.forward[copies].id == OpId::kFsdpParamCopyOut)
    ++copies;
  return std::span<const Op>(layer.forward).subspan(copies);
}

void Layer::add_convolution(const std::string& op_name, int64_t input, int64_t output,
                            int64_t weights) {
  const std::string prefix = name + ".";
  convolutions.push_back({op_name.starts_with(prefix) ? op_name.substr(prefix.size()) : op_name,
                          input, output, weights});
}

int64_t Layer::parameter_modules() const {
  int64_t n = 0;
  for (const Op& op : forward)
    if (op.op_class == spec::OpClass::kGemm || op.op_class == spec::OpClass::kConv) ++n;
  return std::max<int64_t>(1, n);
}

int64_t Layer::saved_bytes_for(spec::Recompute r) const {
  switch (r) {
    case spec::Recompute::kNone:
      return saved_bytes;
    case spec::Recompute::kSelective:
      return saved_bytes_selective;
    case spec::Recompute::kFull:
      return saved_bytes_full;
  }
  return saved_bytes;
}

double Layer::forward_flops() const {
  double f = 0;
  for (const Op& op : forward) f += op.flops;
  return f;
}

double Layer::backward_flops() const {
  double f = 0;
  for (const Op& op : backward) f += op.flops;
  return f;
}

int64_t pipeline_layer_count(const LoweredModel& lowered) {
  return static_cast<int64_t>(lowered.split_end - lowered.split_begin);
}

StageLayers stage_layers(const spec::Plan& plan, const LoweredModel& lowered, int64_t stage) {
  const int64_t units = pipeline_layer_count(lowered);
  std::vector<int64_t> counts = spec::stage_layer_counts(plan, units);
  std::vector<size_t> begin_of(counts.size() + 1);
  begin_of[0] = lowered.split_begin;
  for (size_t c = 0; c < counts.size(); ++c)
    begin_of[c + 1] = begin_of[c] + static_cast<size_t>(counts[c]);
  StageLayers out;
  const int64_t chunks = spec::model_chunks(plan);
  for (int64_t v = 0; v < spec::local_chunks(plan); ++v) {
    const int64_t c = spec::chunk_stage(plan, stage, v);
    size_t b = begin_of[static_cast<size_t>(c)];
    size_t e = begin_of[static_cast<size_t>(c + 1)];
    if (c == 0) b = 0;
    if (c == chunks - 1) e = lowered.layers.size();
    out.chunk_begin.push_back(b);
    out.chunk_end.push_back(e);
  }
  return out;
}

std::vector<spec::Recompute> layer_recompute(const spec::Plan& plan, const LoweredModel& lowered) {
  std::vector<spec::Recompute> modes(lowered.layers.size(), plan.recompute);
  const std::vector<spec::Recompute> units =
      spec::unit_recompute(plan, pipeline_layer_count(lowered));
  std::copy(units.begin(), units.end(),
            modes.begin() + static_cast<std::ptrdiff_t>(lowered.split_begin));
  return modes;
}

std::vector<bool> layer_activation_offload(const spec::Plan& plan, const LoweredModel& lowered) {
  std::vector<bool> offloaded(lowered.layers.size(), false);
  const std::vector<bool> units =
      spec::unit_activation_offload(plan, pipeline_layer_count(lowered));
  std::copy(units.begin(), units.end(),
            offloaded.begin() + static_cast<std::ptrdiff_t>(lowered.split_begin));
  return offloaded;
}

std::vector<GradientBucket> gradient_buckets(const spec::Plan& plan, const LoweredModel& lowered,
                                             int64_t stage, int64_t bucket_bytes,
                                             int64_t grad_bytes) {
  const StageLayers layers = stage_layers(plan, lowered, stage);
  const bool tied_across_stages = plan.pp > 1 && lowered.tied_table_params > 0;
  const bool own_experts = plan.ep > 1;
  auto holds_tied_table = [&](size_t l) {
    return tied_across_stages &&
           ((stage == 0 && l == 0) || (stage == plan.pp - 1 && l + 1 == lowered.layers.size()));
  };
  std::vector<GradientBucket> out;
  GradientBucket open, experts, tied;
  experts.experts = true;
  tied.after_tied_sum = true;
  // (A layer without parameters joins the dense bucket all the same: the bucket is complete after
  // its backward, as DDP's hooks see it.)
  auto fill = [&](GradientBucket& bucket, size_t l, int64_t params) {
    if (params == 0 && bucket.experts) return;
    bucket.layers.push_back(l);
    bucket.params += params;
    if (!bucket.experts)
      bucket.matrices.insert(bucket.matrices.end(), lowered.layers[l].matrices.begin(),
                             lowered.layers[l].matrices.end());
    if (bucket.params * grad_bytes >= bucket_bytes) {
      const bool kind = bucket.experts;
      out.push_back(std::move(bucket));
      bucket = GradientBucket();
      bucket.experts = kind;
    }
  };
  for (size_t v = layers.chunk_begin.size(); v-- > 0;) {
    for (size_t l = layers.chunk_end[v]; l-- > layers.chunk_begin[v];) {
      if (holds_tied_table(l)) {
        tied.layers.push_back(l);
        tied.params += lowered.layers[l].params + (stage == 0 ? 0 : lowered.tied_table_params);
        tied.matrices.insert(tied.matrices.end(), lowered.layers[l].matrices.begin(),
                             lowered.layers[l].matrices.end());
        // The last stage's copy of the table: [vocab shard, h], as the embedding's.
        if (stage != 0)
          tied.matrices.push_back(
              {lowered.vocab_shard, lowered.tied_table_params / lowered.vocab_shard});
        continue;
      }
      const int64_t expert = own_experts ? lowered.layers[l].expert_params : 0;
      fill(open, l, lowered.layers[l].params - expert - lowered.layers[l].replica_whole_params);
      fill(experts, l, expert);
    }
  }
  if (!open.layers.empty()) out.push_back(std::move(open));
  if (!experts.layers.empty()) out.push_back(std::move(experts));
  if (!tied.layers.empty()) out.push_back(std::move(tied));
  return out;
}

int64_t pipeline_transfer_parts(const spec::Plan& plan, const LoweredModel& lowered,
                                int64_t elements) {
  // On a tensor grid the x*y ranks of a z slice hold the activation whole (their layer group).
  const int64_t holders = plan.tp_grid.any() ? plan.tp_grid.x * plan.tp_grid.y : plan.tp;
  return holders > 1 && !plan.sequence_parallel && !lowered.tp_splits_activations &&
                 elements % holders == 0
             ? holders
             : 1;
}

int64_t stage_params(const spec::Plan& plan, const LoweredModel& lowered, int64_t stage) {
  const StageLayers layers = stage_layers(plan, lowered, stage);
  int64_t params = 0;
  for (size_t v = 0; v < layers.chunk_begin.size(); ++v)
    for (size_t l = layers.chunk_begin[v]; l < layers.chunk_end[v]; ++l)
      params += lowered.layers[l].params;
  if (plan.pp > 1 && stage == plan.pp - 1) params += lowered.tied_table_params;
  return params;
}

int64_t stage_expert_params(const spec::Plan& plan, const LoweredModel& lowered, int64_t stage) {
  if (plan.ep <= 1) return 0;
  const StageLayers layers = stage_layers(plan, lowered, stage);
  int64_t params = 0;
  for (size_t v = 0; v < layers.chunk_begin.size(); ++v)
    for (size_t l = layers.chunk_begin[v]; l < layers.chunk_end[v]; ++l)
      params += lowered.layers[l].expert_params;
  return params;
}

int64_t zero_shard(int64_t params, int64_t ranks) {
  SEXTANT_CHECK(params >= 0 && ranks > 0, "a shard of {} parameters over {} ranks", params, ranks);
  return (params + ranks - 1) / ranks;
}

int64_t zero_updated_params(const spec::Plan& plan, const LoweredModel& lowered, int64_t stage,
                            const std::vector<GradientBucket>& buckets) {
  if (plan.zero == 0 || plan.replicas() == 1) return stage_params(plan, lowered, stage);
  int64_t updated = 0;
  if (plan.zero < 3) {
    for (const GradientBucket& b : buckets)
      updated += zero_shard(b.params, b.experts ? plan.expert_replicas() : plan.replicas());
    // What the replicas do not hold alike (Layer::replica_whole_params) each updates whole.
    const StageLayers layers = stage_layers(plan, lowered, stage);
    for (size_t v = 0; v < layers.chunk_begin.size(); ++v)
      for (size_t l = layers.chunk_begin[v]; l < layers.chunk_end[v]; ++l)
        updated += lowered.layers[l].replica_whole_params;
    return updated;
  }
  const StageLayers layers = stage_layers(plan, lowered, stage);
  for (size_t v = 0; v < layers.chunk_begin.size(); ++v) {
    for (size_t l = layers.chunk_begin[v]; l < layers.chunk_end[v]; ++l) {
      const int64_t expert = plan.ep > 1 ? lowered.layers[l].expert_params : 0;
      // The last stage keeps its copy of a tied table with its last layer (stage_params).
      const bool tied_copy = plan.pp > 1 && stage == plan.pp - 1 && l + 1 == lowered.layers.size();
      const int64_t dense =
          lowered.layers[l].params - expert + (tied_copy ? lowered.tied_table_params : 0);
      updated += zero_shard(dense, plan.replicas());
      if (expert > 0) updated += zero_shard(expert, plan.expert_replicas());
    }
  }
  return updated;
}

namespace {

// ZeRO-3's units, one per layer that holds parameters: which keep their parameters for the
// backward (LoweringOptions::reshard_after_forward), and the copy each unshard costs
// (LoweringOptions::param_copy_bytes).
void shard_units(LoweredModel& lowered, const LoweringOptions& options) {
  size_t last_block = lowered.layers.size();
  for (size_t i = 0; i < lowered.layers.size(); ++i)
    if (lowered.layers[i].kind == LayerKind::kBlock) last_block = i;
  for (size_t i = 0; i < lowered.layers.size(); ++i) {
    Layer& layer = lowered.layers[i];
    if (layer.params == 0) continue;
    spec::ShardUnit unit = spec::ShardUnit::kBlock;
    if (layer.kind == LayerKind::kEmbedding) unit = spec::ShardUnit::kEmbedding;
    if (layer.kind == LayerKind::kHead) unit = spec::ShardUnit::kHead;
    if (i == last_block) unit = spec::ShardUnit::kLastBlock;
    layer.kept_for_backward =
        !spec::regathers_for_backward(options.reshard_after_forward, unit, options.pipelined);
    if (options.param_copy_bytes == 0) continue;
    const Op copy =
        memory_op(OpId::kFsdpParamCopyOut, OpClass::kElementwise,
                  layer.params * options.param_copy_bytes, TpSplit::kReplicated, {layer.params});
    layer.forward.insert(layer.forward.begin(), copy);
    if (!layer.kept_for_backward) layer.backward.insert(layer.backward.begin(), copy);
  }
}

}  // namespace

LoweredModel lower(const spec::ModelSpec& model, const LoweringOptions& options) {
  SEXTANT_CHECK(options.micro_batch > 0 && options.tp > 0, "bad lowering options");
  if (std::string problem = spec::spatial_split_problem(model, options.spatial); !problem.empty())
    throw InputError(fmt::format("model {}", model.name), "/spatial",
                     spec::spatial_text(options.spatial), problem);
  // (SUPER's branch split keeps the channels whole: spec::branch_parallel_problem, the plan's.)
  if (!model.is_transformer() && !options.branch_parallel)
    if (std::string problem = spec::tensor_parallel_problem(model, options.tp); !problem.empty())
      throw InputError(fmt::format("model {}", model.name), "/tp", std::to_string(options.tp),
                       problem);
  LoweredModel lowered;
  switch (model.kind()) {
    case spec::ModelKind::kTransformer:
      lowered = lower_transformer(model, options);
      break;
    case spec::ModelKind::kMlp:
      lowered = lower_mlp(model, options);
      break;
    case spec::ModelKind::kCnn:
      lowered = lower_cnn(model, options);
      break;
  }
  // ZeRO-3 gathers every layer's parameters from the replicas' shards: a per-op split's weight
  // blocks, whole on each replica for its own gradient, are no such shards.
  if (options.zero3)
    for (const Layer& layer : lowered.layers)
      if (layer.replica_whole_params > 0)
        throw InputError("plan", "/zero", "3",
                         fmt::format("0, 1 or 2 beside per-op splits that keep {}'s weights "
                                     "apart on each replica (ZeRO-3 gathers them from shards)",
                                     layer.name));
  // ZeRO-3's gradient copy-in (LoweringOptions::grad_copy_in_bytes), the last op of the backward
  // of each layer that holds parameters.
  if (options.grad_copy_in_bytes > 0) {
    for (Layer& layer : lowered.layers) {
      if (layer.params == 0) continue;
      layer.backward.push_back(memory_op(OpId::kFsdpGradCopyIn, OpClass::kElementwise,
                                         layer.params * options.grad_copy_in_bytes,
                                         TpSplit::kReplicated, {layer.params}));
    }
  }
  if (options.zero3) shard_units(lowered, options);
  // Megatron's selective recompute, wherever a lowering did not give its own list: the forward's
  // attention core and the context-parallel transfers feeding it.
  for (Layer& layer : lowered.layers) {
    if (!layer.selective_forward.empty()) continue;
    for (const Op& op : layer.forward)
      if (op.in_core()) layer.selective_forward.push_back(op);
  }
  return lowered;
}

}  // namespace sextant::models
