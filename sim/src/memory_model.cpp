// Per-stage memory from the lowering and the pipeline schedule.
#include "sextant/sim/memory_model.hpp"

#include <algorithm>

#include "sextant/sim/program_builder.hpp"
#include "sextant/spec/pipeline_schedule.hpp"

namespace sextant::sim {

StateBytesPerParam state_bytes_per_param(spec::Dtype dtype) {
  if (spec::dtype_bytes(dtype) >= 4) return {4, 4, 8};
  return {2, 2, 12};
}

spec::MemoryBreakdown stage_memory(const spec::Plan& plan, const models::LoweredModel& lowered,
                                   const spec::ModelSpec& model, int64_t stage) {
  StageLayers layers = stage_layers(plan, lowered, stage);
  const size_t chunks = layers.chunk_begin.size();
  int64_t params = 0;
  int64_t largest_layer = 0;
  int64_t largest_working = 0;  // activations of one layer while its backward runs
  std::vector<int64_t> chunk_activation(chunks, 0);
  for (size_t v = 0; v < chunks; ++v) {
    for (size_t l = layers.chunk_begin[v]; l < layers.chunk_end[v]; ++l) {
      const models::Layer& layer = lowered.layers[l];
      params += layer.params;
      largest_layer = std::max(largest_layer, layer.params);
      chunk_activation[v] += layer.saved_bytes_for(plan.recompute);
      largest_working = std::max(largest_working, layer.saved_bytes);
    }
  }
  // Tied embeddings split over pipeline stages: the last stage keeps its own copy of the table
  // for the output projection (Megatron-LM), with its gradient and optimizer state.
  const bool last_stage = stage == plan.pp - 1;
  if (model.is_transformer() && model.transformer().tied_embeddings && plan.pp > 1 && last_stage) {
    const spec::TransformerSpec& t = model.transformer();
    params += (t.vocab + plan.tp - 1) / plan.tp * t.hidden;
  }

  StateBytesPerParam per = state_bytes_per_param(lowered.dtype);
  const int64_t n = plan.dp;
  spec::MemoryBreakdown m;
  m.weights = params * per.weights;
  m.gradients = params * per.gradients;
  m.optimizer = params * per.optimizer;
  if (plan.zero >= 1) m.optimizer = (m.optimizer + n - 1) / n;
  if (plan.zero >= 2) m.gradients = (m.gradients + n - 1) / n;
  if (plan.zero >= 3) m.weights = (m.weights + n - 1) / n;

  // Activations: replay the schedule and keep the peak of what is live.
  std::vector<spec::ScheduleUnit> units = spec::pipeline_schedule(
      plan.schedule, plan.pp, plan.virtual_stages, plan.micro_batches(), stage);
  int64_t live = 0;
  int64_t peak = 0;
  for (const spec::ScheduleUnit& u : units) {
    int64_t bytes = chunk_activation[static_cast<size_t>(u.chunk)];
    if (u.forward) {
      live += bytes;
      peak = std::max(peak, live);
    } else {
      // While a backward runs, its layer's full activations exist again under recompute.
      if (plan.recompute != spec::Recompute::kNone) peak = std::max(peak, live + largest_working);
      live -= bytes;
    }
  }
  m.activations = peak;

  // Buffers: stage-to-stage send and receive buffers, the DDP gradient bucket, and under ZeRO-3
  // the gathered parameters of the current (and prefetched) layer and its unsharded gradient.
  int64_t e = spec::dtype_bytes(lowered.dtype);
  int64_t boundary = 0;
  for (const models::Layer& layer : lowered.layers)
    boundary = std::max(boundary, layer.output_bytes);
  int64_t buffers = plan.pp > 1 ? 2 * boundary : 0;
  if (plan.dp > 1 && plan.zero < 3) buffers += std::min(plan.dp_bucket_bytes, params * e);
  if (plan.dp > 1 && plan.zero == 3)
    buffers += (plan.fsdp_prefetch ? 2 : 1) * largest_layer * e + largest_layer * e;
  m.buffers = buffers;
  m.peak_bytes = m.weights + m.gradients + m.optimizer + m.activations + m.buffers;
  return m;
}

}  // namespace sextant::sim
