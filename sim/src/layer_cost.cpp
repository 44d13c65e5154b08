// One layer's passes in closed form.
#include "sextant/sim/layer_cost.hpp"

#include <algorithm>
#include <map>

#include "sextant/spec/error.hpp"

namespace sextant::sim {

bool tp_overlap_applies(const spec::Plan& plan, const spec::Stack& stack, bool block,
                        spec::Phase phase) {
  if (!block || plan.tp == 1 || !plan.sequence_parallel) return false;
  if (stack.tp_overlap == spec::TpOverlap::kPipelined) return true;
  return stack.tp_overlap == spec::TpOverlap::kBulk && phase == spec::Phase::kBwd;
}

int64_t tp_overlap_chunks(spec::CollectiveKind kind, int64_t tp) {
  return kind == spec::CollectiveKind::kAllGather ? tp : 4;
}

GridOverlap grid_overlap(const spec::Plan& plan, const spec::Stack& stack, bool block) {
  GridOverlap out;
  if (!block || !plan.tp_grid.any()) return out;
  out.backward = stack.tp_overlap != spec::TpOverlap::kNone;
  out.forward = stack.tp_overlap == spec::TpOverlap::kPipelined;
  return out;
}

bool is_depth_gather(const models::Op& op) {
  return op.is_comm() && op.group == models::CommGroup::kGridZ &&
         op.collective == spec::CollectiveKind::kAllGather;
}

bool is_depth_scatter(const models::Op& op) {
  return op.is_comm() && op.group == models::CommGroup::kGridZ &&
         op.collective == spec::CollectiveKind::kReduceScatter;
}

bool is_grid_all_reduce(const models::Op& op) {
  return op.is_comm() &&
         (op.group == models::CommGroup::kGridX || op.group == models::CommGroup::kGridY) &&
         op.collective == spec::CollectiveKind::kAllReduce;
}

BackwardProducts split_backward_gemm(const models::Op& backward) {
  SEXTANT_CHECK(backward.matmuls.size() == 2, "op {}: a backward GEMM of two products expected",
                backward.name);
  BackwardProducts out{backward, backward};
  for (models::Op* half : {&out.dgrad, &out.wgrad}) {
    half->flops = backward.flops / 2;
    half->kernel_flops = backward.kernel_flops / 2;
    half->bytes = backward.bytes / 2;
    half->kernels = std::max(1, backward.kernels / 2);
  }
  out.dgrad.matmuls = {backward.matmuls[0]};
  out.wgrad.matmuls = {backward.matmuls[1]};
  return out;
}

void append_segment(std::vector<PassSegment>& profile, double seconds, bool alone) {
  if (seconds <= 0) return;
  if (!profile.empty() && profile.back().alone == alone) {
    profile.back().seconds += seconds;
    return;
  }
  profile.push_back({seconds, alone});
}

double alone_within(const std::vector<PassSegment>& profile, double x) {
  double alone = 0;
  for (const PassSegment& s : profile) {
    if (x <= 0) break;
    const double part = std::min(s.seconds, x);
    if (s.alone) alone += part;
    x -= part;
  }
  return alone;
}

double wall_alone_share(double alone_share, double overlap_slowdown) {
  const double a = std::clamp(alone_share, 0.0, 1.0);
  const double stretched = a * (1 + overlap_slowdown);
  return a > 0 ? stretched / (stretched + 1 - a) : 0.0;
}

LayerTimes layer_times(const models::Layer& layer, const spec::Plan& plan, const spec::Stack& stack,
                       const ComputeModel& compute, const CollectiveModel& collectives,
                       const LayerGroups& groups, spec::Recompute recompute) {
  const bool block = layer.kind == models::LayerKind::kBlock;
  // Compute beside a transfer runs at 1 / (1 + f) of full speed (the engine's overlap model).
  const double f = compute.overlap_slowdown();
  LayerTimes out;
  auto comm = [&](spec::CollectiveKind kind, int64_t bytes) {
    return collectives.cost(kind, bytes, groups.tp).seconds();
  };
  auto op_comm = [&](const models::Op& op) {
    return collectives.cost(op.collective, op.costed_bytes(), groups.of(op.group)).seconds();
  };
  // A GEMM of `gemm` seconds beside `beside` seconds of collectives that started with it: the
  // GEMM is slowed while they run, and what follows waits for both. Recorded in `profile`: the
  // collectives' time, then the GEMM's rest alone.
  auto overlapped_wall = [&](double gemm, double beside, std::vector<PassSegment>& profile) {
    const double wall = std::max(beside, gemm + beside * f / (1 + f));
    append_segment(profile, beside, false);
    append_segment(profile, wall - beside, true);
    return wall;
  };
  // The engine's program for one pass (for_each_pass_step, as program_builder run_ops reads it):
  // an overlapped all-gather feeding a GEMM sends its first chunk exposed and the rest beside the
  // GEMM; a GEMM feeding an overlapped reduce-scatter runs beside all but the last chunk, which
  // follows it.
  auto pass = [&](std::span<const models::Op> ops, spec::Phase phase,
                  std::vector<PassSegment>& profile) {
    const bool overlapped = tp_overlap_applies(plan, stack, block, phase);
    double t = 0;
    auto exposed = [&](double seconds) {
      append_segment(profile, seconds, false);
      return seconds;
    };
    auto alone = [&](double seconds) {
      append_segment(profile, seconds, true);
      return seconds;
    };
    for_each_pass_step(ops, overlapped, [&](PassStepKind kind, size_t i) {
      const models::Op& op = ops[i];
      switch (kind) {
        case PassStepKind::kRingStep:
          // A ring attention step: the transfer beside the attention of the block in hand.
          t += overlapped_wall(ps_to_seconds(compute.op_time(ops[i + 1], phase)), op_comm(op),
                               profile);
          break;
        case PassStepKind::kGatheredGemm: {
          const int64_t first = op.bytes / tp_overlap_chunks(op.collective, plan.tp);
          const double gemm = ps_to_seconds(compute.op_time(ops[i + 1], phase));
          t += exposed(comm(op.collective, first));
          t += overlapped_wall(gemm, comm(op.collective, op.bytes - first), profile);
          break;
        }
        case PassStepKind::kScatteredGemm: {
          const models::Op& scatter = ops[i + 1];
          const int64_t last = scatter.bytes / tp_overlap_chunks(scatter.collective, plan.tp);
          const double gemm = ps_to_seconds(compute.op_time(op, phase));
          t += overlapped_wall(gemm, comm(scatter.collective, scatter.bytes - last), profile);
          t += exposed(comm(scatter.collective, last));
          break;
        }
        case PassStepKind::kCollective:
          t += exposed(op_comm(op));
          break;
        case PassStepKind::kCompute:
          t += alone(ps_to_seconds(compute.op_time(op, phase)));
          break;
      }
    });
    return t;
  };
  // A pass of a 3D tensor grid's block under AxoNN's overlap (grid_overlap, for_each_grid_step as
  // program_builder run_grid_ops reads it): the z collectives in order on the depth stream, which
  // runs beside the compute and slows it while it moves data. `head` (forward): when the pass's
  // first weight gather, issued while the block before it computed, is done (< 0: issued with the
  // pass). Returns the pass's time and, forward, when the next block's first gather, issued at this
  // pass's last one, would be done, counted from this pass's end.
  const GridOverlap grid = grid_overlap(plan, stack, block);
  struct GridPass {
    double seconds = 0;
    double next_head = -1;
  };
  auto grid_pass = [&](std::span<const models::Op> ops, spec::Phase phase,
                       std::vector<PassSegment>& profile, double head) {
    const bool forward = phase != spec::Phase::kBwd && grid.forward;
    const bool backward = phase == spec::Phase::kBwd && grid.backward;
    double t = 0;
    double depth_free = std::max(0.0, head);  // when the depth stream has moved what it holds
    std::map<size_t, double> prefetched;      // op index -> when its gather is done
    double next_issue = -1;                   // when the next block's first gather is issued
    auto wait = [&](double until) {
      if (until > t) append_segment(profile, until - t, false);
      t = std::max(t, until);
    };
    // `seconds` of compute from t, slowed while the depth stream still moves data.
    auto run = [&](double seconds) {
      const double beside = std::max(0.0, depth_free - t);
      if (beside >= seconds * (1 + f)) {
        append_segment(profile, seconds * (1 + f), false);
        t += seconds * (1 + f);
        return;
      }
      const double rest = seconds - beside / (1 + f);
      append_segment(profile, beside, false);
      append_segment(profile, rest, true);
      t += beside + rest;
    };
    auto on_depth = [&](const models::Op& op) {
      depth_free = std::max(t, depth_free) + op_comm(op);
      return depth_free;
    };
    size_t first_gather = ops.size();
    for (size_t i = 0; i < ops.size(); ++i)
      if (is_depth_gather(ops[i])) {
        first_gather = i;
        break;
      }
    if (head >= 0 && first_gather < ops.size()) prefetched[first_gather] = head;
    for_each_grid_step(ops, grid, phase, [&](GridStepKind kind, size_t i, size_t other) {
      const models::Op& op = ops[i];
      switch (kind) {
        case GridStepKind::kWeightGather: {
          auto it = prefetched.find(i);
          const double done = it != prefetched.end() ? it->second : on_depth(op);
          if (forward && other < ops.size()) {
            prefetched[other] = on_depth(ops[other]);
          } else if (forward) {
            next_issue = std::max(t, depth_free);
          }
          wait(done);
          break;
        }
        case GridStepKind::kWeightScatter:
          on_depth(op);  // left running: the next gather or the batch's end waits for it
          break;
        case GridStepKind::kSplitGemm: {
          const BackwardProducts halves = split_backward_gemm(op);
          run(ps_to_seconds(compute.op_time(halves.dgrad, phase)));
          t += overlapped_wall(ps_to_seconds(compute.op_time(halves.wgrad, phase)),
                               op_comm(ops[other]), profile);
          break;
        }
        case GridStepKind::kCollective: {
          const double seconds = op_comm(op);
          append_segment(profile, seconds, false);
          t += seconds;
          break;
        }
        case GridStepKind::kCompute:
          run(ps_to_seconds(compute.op_time(op, phase)));
          break;
      }
    });
    GridPass result;
    if (backward) wait(depth_free);  // the next block's first gather queues behind the rest
    result.seconds = t;
    if (next_issue >= 0 && phase == spec::Phase::kFwd && first_gather < ops.size())
      result.next_head = std::max(0.0, next_issue + op_comm(ops[first_gather]) - t);
    return result;
  };
  if (grid.forward) {
    // In a run of blocks each block's first gather was issued while the block before it ran its
    // last linear layer: priced from this block's own (the steady state).
    std::vector<PassSegment> first;
    const double head = grid_pass(layer.forward, spec::Phase::kFwd, first, -1).next_head;
    out.forward = grid_pass(layer.forward, spec::Phase::kFwd, out.forward_profile, head).seconds;
  } else {
    out.forward = pass(layer.forward, spec::Phase::kFwd, out.forward_profile);
  }
  if (grid.backward) {
    out.backward = grid_pass(layer.backward, spec::Phase::kBwd, out.backward_profile, -1).seconds;
  } else {
    out.backward = pass(layer.backward, spec::Phase::kBwd, out.backward_profile);
  }
  // Full recompute re-runs the forward; selective what the lowering lists for the stack's policy.
  auto recomputed = [&](std::span<const models::Op> ops) {
    return grid.forward ? grid_pass(ops, spec::Phase::kRecompute, out.recompute_profile, -1).seconds
                        : pass(ops, spec::Phase::kRecompute, out.recompute_profile);
  };
  if (block && recompute == spec::Recompute::kFull)
    out.recompute = recomputed(models::recomputed_forward(layer));
  if (block && recompute == spec::Recompute::kSelective)
    out.recompute = recomputed(layer.selective_forward);
  auto issue = [&](std::span<const models::Op> ops, spec::Phase phase) {
    const double per_kernel = host_launch_seconds(stack, compute.device(), phase);
    HostChain chain;
    if (per_kernel <= 0) return chain;
    for (const models::Op& op : ops) {
      chain = chain.then(op.is_comm() ? host_chain_of_op(op_comm(op), 0, per_kernel)
                                      : host_chain_of_op(ps_to_seconds(compute.op_time(op, phase)),
                                                         op.kernels, per_kernel));
    }
    return chain;
  };
  out.forward_issue = issue(layer.forward, spec::Phase::kFwd);
  out.backward_issue = issue(layer.backward, spec::Phase::kBwd);
  if (block && recompute == spec::Recompute::kFull)
    out.backward_issue =
        issue(models::recomputed_forward(layer), spec::Phase::kRecompute).then(out.backward_issue);
  if (block && recompute == spec::Recompute::kSelective)
    out.backward_issue =
        issue(layer.selective_forward, spec::Phase::kRecompute).then(out.backward_issue);
  return out;
}

}  // namespace sextant::sim
