// Roofline op costs.
#include "sextant/sim/compute_model.hpp"

#include <algorithm>

namespace sextant::sim {

bool is_matrix_op(spec::OpClass c) {
  return c == spec::OpClass::kGemm || c == spec::OpClass::kAttention || c == spec::OpClass::kConv;
}

ComputeModel::ComputeModel(const spec::DeviceSpec& device, spec::Dtype dtype)
    : device_(&device), dtype_(dtype), peak_flops_(device.peak_flops(dtype)) {}

double ComputeModel::seconds(double flops, double bytes, spec::OpClass op_class,
                             std::string_view op_key) const {
  const bool matrix = is_matrix_op(op_class) && flops > 0;
  double gemm_eff = matrix ? device_->gemm_efficiency_at(flops) : 1.0;
  double mem_eff = device_->memory_efficiency_for(op_class);
  if (!op_key.empty()) {
    auto it = device_->efficiency_by_op.find(std::string(op_key));
    if (it != device_->efficiency_by_op.end()) {
      if (matrix) {
        gemm_eff = it->second;
      } else {
        mem_eff = it->second;
      }
    }
  }
  double compute = matrix ? flops / (peak_flops_ * gemm_eff) : 0.0;
  double memory = bytes / (device_->memory_bandwidth_GBps * kBytesPerGB * mem_eff);
  return std::max(compute, memory) + device_->launch_overhead_us * 1e-6;
}

Picoseconds ComputeModel::op_time(const models::Op& op, spec::Phase phase) const {
  return seconds_to_ps(seconds(op.flops, static_cast<double>(op.bytes), op.op_class,
                               spec::efficiency_key(op.name, phase)));
}

Picoseconds ComputeModel::optimizer_time(int64_t params) const {
  double bytes = static_cast<double>(params * kOptimizerBytesPerParam);
  return seconds_to_ps(seconds(0, bytes, spec::OpClass::kOptimizer, "optimizer.adamw"));
}

}  // namespace sextant::sim
