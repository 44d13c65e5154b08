// Closed-form time of one layer's passes on one rank for one micro-batch: its compute ops and its
// tensor-parallel collectives in sequence, with the chunk of an overlapped collective that stays
// exposed. Shared by the planner's estimator and `sextant validate` (layer times of Korthikanti
// et al., Table 4); the event simulation schedules the same ops (program_builder).
#pragma once

#include <span>
#include <vector>

#include "sextant/models/lowering.hpp"
#include "sextant/sim/collective_model.hpp"
#include "sextant/sim/compute_model.hpp"
#include "sextant/sim/host_issue.hpp"
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
  // The passes' kernels as the host issues them (host_issue.hpp; Stack::host_launch_us): the
  // forward, and the recompute then the backward; a collective is GPU time the host issues
  // nothing for.
  HostChain forward_issue, backward_issue;
};

// Whether the stack overlaps a block's tensor-parallel collectives in `phase` (Transformer
// Engine's userbuffers need sequence parallelism; forward only with "pipelined").
bool tp_overlap_applies(const spec::Plan& plan, const spec::Stack& stack, bool block,
                        spec::Phase phase);

// How a layer's pass runs its ops, read once for the engine's program (program_builder run_ops)
// and the closed form (layer_cost): each step names the op it starts at (ops[i]); the two-op
// steps take ops[i + 1] too.
enum class PassStepKind : uint8_t {
  kCompute,        // ops[i] on the compute stream
  kCollective,     // ops[i], a collective the compute after it waits for
  kRingStep,       // ops[i], a context-parallel transfer beside ops[i + 1], the block in hand
  kGatheredGemm,   // ops[i], an overlapped tp all-gather in chunks, feeding the GEMM ops[i + 1]
  kScatteredGemm,  // ops[i], a GEMM beside all but the last chunk of its reduce-scatter ops[i + 1]
};
// Calls step(kind, i) for each step of `ops` in order; `tp_overlapped`: tp_overlap_applies.
template <typename Step>
void for_each_pass_step(std::span<const models::Op> ops, bool tp_overlapped, Step step) {
  for (size_t i = 0; i < ops.size(); ++i) {
    const models::Op& op = ops[i];
    const models::Op* next = i + 1 < ops.size() ? &ops[i + 1] : nullptr;
    const bool layer_collective =
        next && next->is_comm() && next->group == models::CommGroup::kLayer && !next->no_tp_overlap;
    if (op.is_comm()) {
      if (op.beside_next && next && !next->is_comm()) {
        step(PassStepKind::kRingStep, i++);
      } else if (tp_overlapped && op.collective == spec::CollectiveKind::kAllGather && next &&
                 next->op_class == spec::OpClass::kGemm && op.group == models::CommGroup::kLayer &&
                 !op.no_tp_overlap) {
        step(PassStepKind::kGatheredGemm, i++);
      } else {
        step(PassStepKind::kCollective, i);
      }
    } else if (tp_overlapped && op.op_class == spec::OpClass::kGemm && layer_collective &&
               next->collective == spec::CollectiveKind::kReduceScatter) {
      step(PassStepKind::kScatteredGemm, i++);
    } else {
      step(PassStepKind::kCompute, i);
    }
  }
}

// The chunks an overlapped tensor-parallel collective is cut into (one of them stays exposed):
// Transformer Engine's ring exchange uses tp chunks for all-gathers, its pipelined reduce-scatter
// 4 splits (transformer_engine/pytorch/module/base.py, get_default_config).
int64_t tp_overlap_chunks(spec::CollectiveKind kind, int64_t tp);

// AxoNN's overlap of a 3D tensor grid's collectives with compute (Singh et al., arXiv:2305.13525:
// "we aggressively overlap expensive collective operations"; Megatron-AxoNN's
// --overlap-axonn-comm, axonn/intra_layer/overlap_communication.py optimize_communication), read
// from the stack's tp_overlap as the 1D layout reads it for Transformer Engine:
//   backward ("bulk" and "pipelined"): each linear layer's input-gradient all-reduce runs beside
//   its
//     weight-gradient GEMM (overlap_all_reduce: issued after the input-gradient product, waited
//     once the layer's backward is done), and its weight-gradient reduce-scatter over z is left
//     running until the batch ends (--overlap-axonn-reduce-scatter: accumulate_later);
//   forward ("pipelined"): each linear layer's weight block is all-gathered over z while the one
//     before it computes (--overlap-axonn-all-gather: the next gather is issued when a layer takes
//     its own), across the blocks of a forward pass and within a block's recomputed forward
//     (overlap_all_gathers_for_checkpointed_forward).
// The z collectives queue on the depth group's stream in order (spec::Stream::kDepthComm), so a
// backward's weight gather waits for the reduce-scatters issued before it, as on AxoNN's.
struct GridOverlap {
  bool backward = false;
  bool forward = false;
  bool in(spec::Phase phase) const {
    return phase == spec::Phase::kBwd ? backward : forward && phase != spec::Phase::kOpt;
  }
};
GridOverlap grid_overlap(const spec::Plan& plan, const spec::Stack& stack, bool block);

// A grid's collectives by role (models' grid_block): the weight block's gather over z, the weight
// gradient's reduce-scatter over z, and a partial product's or input gradient's all-reduce over x
// or y.
bool is_depth_gather(const models::Op& op);
bool is_depth_scatter(const models::Op& op);
bool is_grid_all_reduce(const models::Op& op);

// How a 3D tensor grid's pass runs its ops under AxoNN's overlap, read once for the engine's
// program (program_builder run_grid_ops) and the closed form (layer_cost): each step names the op
// it starts at (ops[i]) and, for a two-op step or a gather that issues the next, the other op.
enum class GridStepKind : uint8_t {
  kCompute,        // ops[i] on the compute stream
  kCollective,     // ops[i], a collective the compute after it waits for
  kWeightGather,   // ops[i], a weight block's gather over z; forward, the pass's next gather is
                   // ops[other] (ops.size(): none left), issued before the compute waits for this
  kWeightScatter,  // ops[i], a weight gradient's reduce-scatter over z, left running (backward)
  kSplitGemm,      // ops[i], a backward GEMM: its input-gradient product, then its weight-
                   // gradient product beside the all-reduce ops[other] = ops[i + 1] (backward)
};
// Calls step(kind, i, other) for each step of `ops` in `phase` under `grid` (grid.in(phase)).
template <typename Step>
void for_each_grid_step(std::span<const models::Op> ops, const GridOverlap& grid, spec::Phase phase,
                        Step step) {
  const bool forward = phase != spec::Phase::kBwd && grid.forward;
  const bool backward = phase == spec::Phase::kBwd && grid.backward;
  for (size_t i = 0; i < ops.size(); ++i) {
    const models::Op& op = ops[i];
    if (is_depth_gather(op)) {
      size_t next = ops.size();
      if (forward)
        for (next = i + 1; next < ops.size() && !is_depth_gather(ops[next]);) ++next;
      step(GridStepKind::kWeightGather, i, next);
    } else if (backward && is_depth_scatter(op)) {
      step(GridStepKind::kWeightScatter, i, i);
    } else if (backward && op.op_class == spec::OpClass::kGemm && op.matmuls.size() == 2 &&
               i + 1 < ops.size() && is_grid_all_reduce(ops[i + 1])) {
      step(GridStepKind::kSplitGemm, i, i + 1);
      ++i;
    } else {
      step(op.is_comm() ? GridStepKind::kCollective : GridStepKind::kCompute, i, i);
    }
  }
}

// A backward GEMM's two products apart, the input gradient's (dgrad) and the weight gradient's
// (wgrad), each with its own matmul and half the op's FLOPs, bytes and kernels (models'
// gemm_backward doubles the forward's for the two). Needs an op of two matmuls.
struct BackwardProducts {
  models::Op dgrad, wgrad;
};
BackwardProducts split_backward_gemm(const models::Op& backward);

// The groups a layer's collectives run in: the layer group (tensor-parallel), the
// context-parallel group, the expert-parallel group, the lines of a 3D tensor grid, a CNN's
// spatial grid and its channel split's stationary-w groups (models::CommGroup).
struct LayerGroups {
  GroupShape tp;
  GroupShape cp;
  GroupShape ep;
  GroupShape grid_x, grid_y, grid_z;
  GroupShape spatial;
  GroupShape filter_reduce, channel_gather;
  GroupShape data;  // the replicas: a per-op plan's collectives over its data axis
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
      case models::CommGroup::kSpatial:
        return spatial;
      case models::CommGroup::kFilterReduce:
        return filter_reduce;
      case models::CommGroup::kChannelGather:
        return channel_gather;
      case models::CommGroup::kData:
        return data;
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
