// Peak memory of a rank: weights, gradients and optimizer state (mixed-precision Adam: 2 + 2 + 12
// bytes per parameter, Rajbhandari et al., ZeRO, §3.1; divided over the data-parallel group by
// the ZeRO stage), activations of the micro-batches the pipeline schedule keeps in flight, and
// communication buffers.
#pragma once

#include "sextant/models/lowering.hpp"
#include "sextant/spec/plan.hpp"
#include "sextant/spec/report.hpp"

namespace sextant::sim {

struct StateBytesPerParam {
  int64_t weights;
  int64_t gradients;
  int64_t optimizer;  // K in the ZeRO paper
};
// 16-bit training: 2, 2, 12 (fp32 master weights, momentum, variance); fp32 training: 4, 4, 8.
StateBytesPerParam state_bytes_per_param(spec::Dtype dtype);

// Memory of a rank of pipeline stage `stage` (the breakdown of spec::Report, capacity unset).
spec::MemoryBreakdown stage_memory(const spec::Plan& plan, const models::LoweredModel& lowered,
                                   const spec::ModelSpec& model, int64_t stage);

}  // namespace sextant::sim
