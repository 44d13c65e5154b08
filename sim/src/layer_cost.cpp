// One layer's passes in closed form.
#include "sextant/sim/layer_cost.hpp"

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

LayerTimes layer_times(const models::Layer& layer, const spec::Plan& plan, const spec::Stack& stack,
                       const ComputeModel& compute, const CollectiveModel& collectives,
                       const GroupShape& tp_group, spec::Recompute recompute) {
  const bool block = layer.kind == models::LayerKind::kBlock;
  LayerTimes out;
  auto pass = [&](const std::vector<models::Op>& ops, bool core_only, spec::Phase phase) {
    const bool overlapped = tp_overlap_applies(plan, stack, block, phase);
    double t = 0;
    for (const models::Op& op : ops) {
      if (core_only && !op.core_attention) continue;
      if (op.is_comm()) {
        double c = collectives.cost(op.collective, op.bytes, tp_group).seconds();
        if (overlapped && (op.collective == spec::CollectiveKind::kAllGather ||
                           op.collective == spec::CollectiveKind::kReduceScatter)) {
          const double exposed = c / static_cast<double>(tp_overlap_chunks(op.collective, plan.tp));
          out.hidden_comm += c - exposed;
          c = exposed;
        }
        t += c;
      } else {
        t += ps_to_seconds(compute.op_time(op, phase));
      }
    }
    return t;
  };
  out.forward = pass(layer.forward, false, spec::Phase::kFwd);
  out.backward = pass(layer.backward, false, spec::Phase::kBwd);
  if (block && recompute == spec::Recompute::kFull)
    out.recompute = pass(layer.forward, false, spec::Phase::kRecompute);
  if (block && recompute == spec::Recompute::kSelective)
    out.recompute = pass(layer.forward, true, spec::Phase::kRecompute);
  return out;
}

}  // namespace sextant::sim
