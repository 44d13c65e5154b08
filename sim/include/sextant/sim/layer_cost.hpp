// Closed-form time of one layer's passes on one rank for one micro-batch: its compute ops and its
// tensor-parallel collectives in sequence, with the chunk of an overlapped collective that stays
// exposed. Shared by the planner's estimator and `sextant validate` (layer times of Korthikanti
// et al., Table 4); the event simulation schedules the same ops (program_builder).
#pragma once

#include <vector>

#include "sextant/models/lowering.hpp"
#include "sextant/sim/collective_model.hpp"
#include "sextant/sim/compute_model.hpp"
#include "sextant/spec/plan.hpp"

namespace sextant::sim {

// A stretch of a pass in its order: compute alone (`alone`: a transfer that starts beside it,
// such as a pipeline stage's send or receive, slows it by the engine's overlap model), or time in
// or beside a tensor-parallel collective (exposed, the compute waits; overlapped, the GEMM beside
// it is slowed already, and a second transfer slows it no more).
struct PassSegment {
  double seconds = 0;
  bool alone = false;
  bool operator==(const PassSegment&) const = default;
};

// Appends a stretch, merged into the last when of its kind.
void append_segment(std::vector<PassSegment>& profile, double seconds, bool alone);

// Compute alone in the first `x` seconds of `profile`; past its end, none.
double alone_within(const std::vector<PassSegment>& profile, double x);

// Of the wall time a transfer runs beside passes of which `alone_share` of the time is compute
// alone, the share that is: beside it the compute alone runs 1 + f times longer (the engine's
// overlap_slowdown f) and the rest does not, so a (1 + f) / (a (1 + f) + 1 - a).
double wall_alone_share(double alone_share, double overlap_slowdown);

struct LayerTimes {
  // Wall times of one micro-batch's passes, with the exposed tensor-parallel collectives and the
  // GEMMs slowed beside the overlapped ones (the engine's overlap_slowdown).
  double forward = 0;    // s
  double backward = 0;   // s, without recompute
  double recompute = 0;  // s, the forward work the plan's recompute repeats before backward
  // The same passes as stretches (their seconds add up to the times above).
  std::vector<PassSegment> forward_profile, backward_profile, recompute_profile;
};

// Whether the stack overlaps a block's tensor-parallel collectives in `phase` (Transformer
// Engine's userbuffers need sequence parallelism; forward only with "pipelined").
bool tp_overlap_applies(const spec::Plan& plan, const spec::Stack& stack, bool block,
                        spec::Phase phase);

// The chunks an overlapped tensor-parallel collective is cut into (one of them stays exposed):
// Transformer Engine's ring exchange uses tp chunks for all-gathers, its pipelined reduce-scatter
// 4 splits (transformer_engine/pytorch/module/base.py, get_default_config).
int64_t tp_overlap_chunks(spec::CollectiveKind kind, int64_t tp);

// The groups a layer's collectives run in: the layer group (tensor-parallel, or a CNN's spatial
// grid), the context-parallel group, the expert-parallel group and the lines of a 3D tensor grid
// (models::CommGroup).
struct LayerGroups {
  GroupShape tp;
  GroupShape cp;
  GroupShape ep;
  GroupShape grid_x, grid_y, grid_z;
  const GroupShape& of(models::CommGroup group) const {
    switch (group) {
      case models::CommGroup::kLayer:
        return tp;
      case models::CommGroup::kContext:
        return cp;
      case models::CommGroup::kExpert:
        return ep;
      case models::CommGroup::kGridX:
        return grid_x;
      case models::CommGroup::kGridY:
        return grid_y;
      case models::CommGroup::kGridZ:
        return grid_z;
    }
    return tp;
  }
};

// One layer's passes as the engine runs them (program_builder's run_ops, one op after another on
// an otherwise idle rank); `recompute` is the layer's own mode (models::layer_recompute), which a
// block recomputes before its backward.
LayerTimes layer_times(const models::Layer& layer, const spec::Plan& plan, const spec::Stack& stack,
                       const ComputeModel& compute, const CollectiveModel& collectives,
                       const LayerGroups& groups, spec::Recompute recompute);

}  // namespace sextant::sim
