// The order of a stage's step: its passes with their transfers, and where a layer's gradients go.
#include "sextant/models/step_program.hpp"

#include "sextant/spec/error.hpp"

namespace sextant::models {

std::vector<PassStep> pass_steps(const spec::Plan& plan, int64_t stage, int64_t micro_batches,
                                 int64_t batches) {
  const bool asynchronous = spec::asynchronous(plan.schedule);
  SEXTANT_CHECK(batches == 1 || asynchronous,
                "plan {}: only PipeDream(-2BW) runs {} batches back to back", plan.name(), batches);
  const std::vector<spec::ScheduleUnit> units =
      asynchronous ? spec::pipedream_2bw_units(plan.pp, micro_batches, batches, stage)
                   : spec::pipeline_schedule(plan.schedule, plan.pp, spec::local_chunks(plan),
                                             micro_batches, stage);
  const int64_t last_chunk = spec::model_chunks(plan) - 1;
  std::vector<PassStep> steps;
  steps.reserve(units.size());
  for (const spec::ScheduleUnit& u : units) {
    PassStep p;
    p.unit = u;
    p.model_chunk = spec::chunk_stage(plan, stage, u.chunk);
    // Forward: from upstream unless the model's first chunk, on downstream unless its last.
    // Backward the other way: the output's gradient from downstream, the input's on upstream.
    const bool first = p.model_chunk == 0, last = p.model_chunk == last_chunk;
    p.receives = u.forward ? !first : !last;
    p.sends = u.forward ? !last : !first;
    p.runs_up = spec::chunk_runs_up(plan, stage, u.chunk);
    steps.push_back(p);
  }
  return steps;
}

LayerParameters layer_parameters(const spec::Plan& plan) {
  const bool replicated = plan.replicas() > 1 && !plan.parameter_server.enabled;
  if (plan.zero == 3 && (replicated || plan.offload.params != spec::OffloadTarget::kNone))
    return LayerParameters::kGatheredEachPass;
  if ((plan.zero == 1 || plan.zero == 2) && replicated)
    return LayerParameters::kGatheredAfterUpdate;
  return LayerParameters::kWhole;
}

LayerGradients layer_gradients(const spec::Plan& plan, bool dp_overlap) {
  if (plan.parameter_server.enabled) return LayerGradients::kKept;
  const bool replicated = plan.replicas() > 1;
  const bool host_optimizer = plan.offload.optimizer != spec::OffloadTarget::kNone;
  if (plan.zero == 3) {
    if (replicated) return LayerGradients::kScatteredEachPass;
    return host_optimizer ? LayerGradients::kToHostWhenComplete : LayerGradients::kKept;
  }
  // ZeRO-Offload hands each bucket to the host as it is ready, also on one replica.
  if (!replicated && !host_optimizer) return LayerGradients::kKept;
  if (plan.zero == 2 && replicated && plan.micro_batches() > 1)
    return LayerGradients::kBucketsEachPass;
  return dp_overlap ? LayerGradients::kBucketsAsCompleted : LayerGradients::kBucketsAfterBackward;
}

bool bucketed(LayerGradients gradients) {
  return gradients == LayerGradients::kBucketsAsCompleted ||
         gradients == LayerGradients::kBucketsAfterBackward ||
         gradients == LayerGradients::kBucketsEachPass;
}

bool completes_gradients(const spec::Plan& plan, int64_t micro_batch, int64_t micro_batches) {
  const int64_t i = micro_batch % micro_batches;
  if (plan.schedule == spec::Schedule::kGems && i == micro_batches / 2 - 1) return true;
  return i == micro_batches - 1;
}

GradientHandoff gradient_handoff(const spec::Plan& plan, LayerGradients gradients,
                                 int64_t micro_batch, int64_t micro_batches) {
  const bool complete = completes_gradients(plan, micro_batch, micro_batches);
  const bool host_optimizer = plan.offload.optimizer != spec::OffloadTarget::kNone;
  GradientHandoff h;
  switch (gradients) {
    case LayerGradients::kScatteredEachPass:
      // FSDP: every micro-batch's gradient goes to the shards' owners (ZeRO-Offload: on to the
      // host), the layer's buffer then starting the next micro-batch from zero.
      h.scatter = true;
      h.to_host = host_optimizer;
      break;
    case LayerGradients::kToHostWhenComplete:
      h.to_host = complete;
      break;
    case LayerGradients::kBucketsAsCompleted:
      h.count_buckets = complete;
      break;
    case LayerGradients::kBucketsEachPass:
      h.count_buckets = true;
      h.accumulate_shard = true;
      break;
    case LayerGradients::kKept:
    case LayerGradients::kBucketsAfterBackward:
      break;
  }
  return h;
}

}  // namespace sextant::models
