// Kernels issued by the host: one op's run.
#include "sextant/sim/host_issue.hpp"

namespace sextant::sim {

HostChain host_chain_of_op(double seconds, int64_t kernels, double per_kernel_s) {
  if (kernels <= 0) return {seconds, 0, -std::numeric_limits<double>::infinity()};
  const double k = static_cast<double>(kernels);
  const double host = per_kernel_s * k;
  return {seconds, host, std::max(per_kernel_s + seconds, host + seconds / k)};
}

double host_launch_seconds(const spec::Stack& stack, const spec::DeviceSpec& device,
                           spec::Phase phase) {
  if (device.kind != spec::DeviceKind::kGpu) return 0;
  switch (phase) {
    case spec::Phase::kFwd:
    case spec::Phase::kRecompute:
      return stack.host_launch_us.forward_us * 1e-6;
    case spec::Phase::kBwd:
      return stack.host_launch_us.backward_us * 1e-6;
    case spec::Phase::kOpt:
    case spec::Phase::kNone:
      break;
  }
  return 0;
}

}  // namespace sextant::sim
