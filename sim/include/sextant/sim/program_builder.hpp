// Lowering of Plan x Model x Cluster into per-stage programs: pipeline schedule units, forward and
// backward passes with tensor-parallel collectives, activation recompute, gradient accumulation,
// DDP gradient buckets overlapped with backward, ZeRO-1/2 reduce-scatter + all-gather, ZeRO-3
// parameter all-gathers prefetched one layer ahead, point-to-point activations between stages, and
// the optimizer step, on the device or, offloaded, on the host with its PCIe/NVMe copies.
#pragma once

#include <vector>

#include "sextant/models/lowering.hpp"
#include "sextant/sim/compute_model.hpp"
#include "sextant/sim/offload_cost.hpp"
#include "sextant/sim/program.hpp"
#include "sextant/spec/plan.hpp"

namespace sextant::sim {

using models::stage_layers;
using models::StageLayers;

// The program of every rank of pipeline stage `stage` under the software stack `stack`; a plan
// that offloads needs `offload`'s prices. Under PipeDream-2BW, `batches` batches back to back
// (spec::pipedream_2bw_units), each stage updating after its part of each; otherwise 1.
Program build_stage_program(const spec::Plan& plan, const spec::Stack& stack,
                            const models::LoweredModel& lowered, const ComputeModel& compute,
                            int64_t stage, const OffloadCost* offload = nullptr,
                            int64_t batches = 1);

}  // namespace sextant::sim
