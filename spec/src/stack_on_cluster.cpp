// A stack's overlaps as the cluster's devices let them run.
#include "sextant/spec/stack_on_cluster.hpp"

namespace sextant::spec {

bool collectives_block(const ClusterSpec& cluster) {
  return cluster.device.kind == DeviceKind::kCpu;
}

Stack stack_on(const ClusterSpec& cluster, const Stack& stack) {
  if (!collectives_block(cluster)) return stack;
  Stack run = stack;
  run.dp_overlap = false;
  run.param_gather_overlap = false;
  run.pp_overlap = false;
  run.tp_overlap = TpOverlap::kNone;
  run.zero3_prefetch = 0;
  return run;
}

}  // namespace sextant::spec
