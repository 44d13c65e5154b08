// One layer's passes in closed form.
#include "sextant/sim/layer_cost.hpp"

#include <algorithm>

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
  // The engine's program for one pass (program_builder run_ops): an overlapped all-gather feeding
  // a GEMM sends its first chunk exposed and the rest beside the GEMM; a GEMM feeding an
  // overlapped reduce-scatter runs beside all but the last chunk, which follows it.
  auto pass = [&](const std::vector<models::Op>& ops, bool core_only, spec::Phase phase,
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
    for (size_t i = 0; i < ops.size(); ++i) {
      const models::Op& op = ops[i];
      if (core_only && !op.in_core()) continue;
      const bool next_gemm = i + 1 < ops.size() && ops[i + 1].op_class == spec::OpClass::kGemm;
      const bool next_scatter = i + 1 < ops.size() && ops[i + 1].is_comm() &&
                                ops[i + 1].group == models::CommGroup::kLayer &&
                                ops[i + 1].collective == spec::CollectiveKind::kReduceScatter &&
                                !ops[i + 1].no_tp_overlap;
      if (op.is_comm()) {
        if (op.beside_next && i + 1 < ops.size() && !ops[i + 1].is_comm()) {
          // A ring attention step: the transfer beside the attention of the block in hand.
          t += overlapped_wall(ps_to_seconds(compute.op_time(ops[i + 1], phase)), op_comm(op),
                               profile);
          ++i;
        } else if (overlapped && op.collective == spec::CollectiveKind::kAllGather && next_gemm &&
                   op.group == models::CommGroup::kLayer && !op.no_tp_overlap) {
          const int64_t first = op.bytes / tp_overlap_chunks(op.collective, plan.tp);
          const double gemm = ps_to_seconds(compute.op_time(ops[i + 1], phase));
          t += exposed(comm(op.collective, first));
          t += overlapped_wall(gemm, comm(op.collective, op.bytes - first), profile);
          ++i;
        } else {
          t += exposed(op_comm(op));
        }
      } else if (overlapped && op.op_class == spec::OpClass::kGemm && next_scatter) {
        const models::Op& scatter = ops[i + 1];
        const int64_t last = scatter.bytes / tp_overlap_chunks(scatter.collective, plan.tp);
        const double gemm = ps_to_seconds(compute.op_time(op, phase));
        t += overlapped_wall(gemm, comm(scatter.collective, scatter.bytes - last), profile);
        t += exposed(comm(scatter.collective, last));
        ++i;
      } else {
        t += alone(ps_to_seconds(compute.op_time(op, phase)));
      }
    }
    return t;
  };
  out.forward = pass(layer.forward, false, spec::Phase::kFwd, out.forward_profile);
  out.backward = pass(layer.backward, false, spec::Phase::kBwd, out.backward_profile);
  if (block && recompute == spec::Recompute::kFull)
    out.recompute = pass(layer.forward, false, spec::Phase::kRecompute, out.recompute_profile);
  if (block && recompute == spec::Recompute::kSelective)
    out.recompute = pass(layer.forward, true, spec::Phase::kRecompute, out.recompute_profile);
  return out;
}

}  // namespace sextant::sim
