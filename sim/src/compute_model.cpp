// Roofline op costs.
#include "sextant/sim/compute_model.hpp"

#include <algorithm>

namespace sextant::sim {

bool is_matrix_op(spec::OpClass c) {
  return c == spec::OpClass::kGemm || c == spec::OpClass::kAttention || c == spec::OpClass::kConv;
}

ComputeModel::ComputeModel(const spec::DeviceSpec& device, spec::Dtype dtype)
    : device_(&device), dtype_(dtype), peak_flops_(device.peak_flops(dtype)) {}

double ComputeModel::seconds(double flops, double bytes, bool matrix) const {
  double compute = 0;
  if (matrix && flops > 0) compute = flops / (peak_flops_ * device_->gemm_efficiency_at(flops));
  double memory = bytes / (device_->memory_bandwidth_GBps * kBytesPerGB * device_->memory_efficiency);
  return std::max(compute, memory) + device_->launch_overhead_us * 1e-6;
}

Picoseconds ComputeModel::op_time(const models::Op& op) const {
  return seconds_to_ps(
      seconds(op.flops, static_cast<double>(op.bytes), is_matrix_op(op.op_class)));
}

Picoseconds ComputeModel::optimizer_time(int64_t params) const {
  double bytes = static_cast<double>(params * kOptimizerBytesPerParam);
  return seconds_to_ps(seconds(0, bytes, false));
}

}  // namespace sextant::sim
