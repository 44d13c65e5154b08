// Peak memory of a rank: weights, gradients and optimizer state (mixed-precision Adam: 2 + 2 + 12
// bytes per parameter, Rajbhandari et al., ZeRO, §3.1, with 4-byte gradients where the stack
// accumulates them in fp32 as Megatron-Core does: 18, its docs/api-guide/dist_optimizer.md;
// divided over the data-parallel group by the ZeRO stage), activations of the micro-batches the
// pipeline schedule keeps in flight, communication buffers, and what the process holds beyond
// tensors (runtime, communicators, allocator reserve).
#pragma once

#include <optional>
#include <vector>

#include "sextant/models/lowering.hpp"
#include "sextant/spec/cluster_spec.hpp"
#include "sextant/spec/pipeline_schedule.hpp"
#include "sextant/spec/plan.hpp"
#include "sextant/spec/report.hpp"

namespace sextant::sim {

struct StateBytesPerParam {
  int64_t weights;
  int64_t gradients;
  int64_t optimizer;  // K in the ZeRO paper
};
// Parameters held in `dtype`, gradients in `grad`. 16-bit parameters: 2, 2 (or 4 with fp32
// gradients), 12 (fp32 master weights, momentum, variance); fp32 parameters: 4, 4, 8.
StateBytesPerParam state_bytes_per_param(spec::Dtype dtype, spec::Dtype grad);

// Process groups a rank of `stage` communicates in (each holds its own buffers).
int64_t communicators_of_stage(const spec::Plan& plan, const models::LoweredModel& lowered,
                               int64_t stage);

// What a stage's memory takes from its layers: it depends on the lowering, the split into stages
// (pp, virtual stages, stage_layers) and the recompute mode only, so a planner computes it once
// for the plans that differ in data parallelism, ZeRO, schedule or stack.
struct StageFootprint {
  int64_t params = 0;         // models::stage_params
  int64_t expert_params = 0;  // of those, models::stage_expert_params
  // Of those, the ones each replica holds whole for its own gradient (Layer::replica_whole_params:
  // a per-op split's weight blocks): no ZeRO stage shards their state.
  int64_t replica_whole_params = 0;
  int64_t largest_layer = 0;  // parameters of the stage's largest layer
  // ZeRO-3: parameters of the layers kept whole from forward to backward (Layer::
  // kept_for_backward), and the largest of the others (gathered again for the backward).
  int64_t kept_params = 0;
  int64_t largest_regathered = 0;
  int64_t largest_working = 0;            // what a recomputed layer brings back beside what it kept
  std::vector<int64_t> chunk_activation;  // bytes kept on the device for backward per
                                          // micro-batch, per chunk
  std::vector<int64_t> chunk_offloaded;   // of what is kept, bytes offloaded to the host
                                          // (Offload::activations), per micro-batch, per chunk
  int64_t largest_offloaded = 0;          // the most one offloaded layer keeps
  int64_t boundary = 0;                   // the largest activation a layer hands on
};
StageFootprint stage_footprint(const spec::Plan& plan, const models::LoweredModel& lowered,
                               int64_t stage);

// Memory of a rank of pipeline stage `stage`. With `cluster`, also the runtime and communicator
// reserves, the capacity, the headroom and whether it fits. `profile`: the stage's
// spec::live_profile when the caller keeps it (a planner), else it is computed here. `explain`:
// also itemize the parts into MemoryBreakdown::explained (simulate --explain-memory).
spec::MemoryBreakdown stage_memory(const spec::Plan& plan, const spec::Stack& stack,
                                   const models::LoweredModel& lowered, int64_t stage,
                                   const spec::ClusterSpec* cluster = nullptr,
                                   const spec::LiveProfile* profile = nullptr,
                                   bool explain = false);
// The same from the stage's footprint (stage_footprint of the same plan, lowering and stage).
spec::MemoryBreakdown stage_memory(const spec::Plan& plan, const spec::Stack& stack,
                                   const models::LoweredModel& lowered, int64_t stage,
                                   const StageFootprint& footprint,
                                   const spec::ClusterSpec* cluster = nullptr,
                                   const spec::LiveProfile* profile = nullptr,
                                   bool explain = false);

}  // namespace sextant::sim
