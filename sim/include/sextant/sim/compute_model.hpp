// Roofline compute model: an op takes max(FLOPs / (peak * eff_gemm(FLOPs)), bytes / (bandwidth *
// eff_mem)) plus the device's launch overhead. Matrix ops (GEMM, attention, conv) use the GEMM
// efficiency curve of the cluster file; every other op is memory-bound.
#pragma once

#include "sextant/models/lowering.hpp"
#include "sextant/spec/cluster_spec.hpp"
#include "sextant/spec/units.hpp"

namespace sextant::sim {

class ComputeModel {
 public:
  // Throws InputError when the device has no peak for `dtype`.
  ComputeModel(const spec::DeviceSpec& device, spec::Dtype dtype);

  // Time of one op (in `phase`, which selects its calibrated efficiency) at full speed.
  Picoseconds op_time(const models::Op& op, spec::Phase phase = spec::Phase::kFwd) const;
  // Time of an op of class `op_class` with explicit FLOPs and bytes: matrix classes use the GEMM
  // efficiency curve, all use the class's memory efficiency.
  // A calibrated efficiency under `op_key` (efficiency_key; when the cluster has one) replaces
  // both curves.
  double seconds(double flops, double bytes, spec::OpClass op_class,
                 std::string_view op_key = {}) const;
  // AdamW step over `params` parameters held by this rank: memory-bound, kOptimizerBytesPerParam.
  Picoseconds optimizer_time(int64_t params) const;

  double peak_flops() const { return peak_flops_; }

 private:
  const spec::DeviceSpec* device_;
  spec::Dtype dtype_;
  double peak_flops_;
};

bool is_matrix_op(spec::OpClass op_class);

// Bytes an AdamW step moves per parameter. Mixed precision: read the 16-bit gradient (2), read and
// write fp32 master weight, momentum and variance (3 x 8), write the 16-bit weight copy (2) = 28.
// fp32 training moves the same: gradient 4 + weight 8 + moments 16.
inline constexpr int64_t kOptimizerBytesPerParam = 28;

}  // namespace sextant::sim
