// Compute model: an op takes max(compute time, bytes / (bandwidth * eff_mem)) plus the device's
// launch overhead per kernel. Compute time comes from, in order: a calibrated per-op efficiency
// (efficiency_by_op); the published throughput of the stack's fused attention kernel; the
// shape-aware GEMM model (tiles and waves over the SMs at the sustained clock) for the matrix
// products of GEMM-class ops; else the GEMM efficiency curve of the cluster file.
#pragma once

#include <optional>

#include "sextant/models/lowering.hpp"
#include "sextant/spec/cluster_spec.hpp"
#include "sextant/spec/stack.hpp"
#include "sextant/spec/units.hpp"

namespace sextant::sim {

class ComputeModel {
 public:
  // `dtype` is what tensors are stored in; `gemm_dtype` the tensor-core format of the GEMMs
  // (fp8 under an fp8 recipe; default `dtype`); `attention` the stack's attention kernel. Throws
  // InputError when the device has no peak for them. `clock_MHz` is the SM clock GEMMs and
  // attention run at; default: the device's fixed clock, or under a power model the clock of
  // back-to-back tensor-core work (step_setup.hpp's make_compute_model chooses it for a step's
  // mix).
  ComputeModel(const spec::DeviceSpec& device, spec::Dtype dtype,
               spec::AttentionKernel attention = spec::AttentionKernel::kUnfused,
               std::optional<spec::Dtype> gemm_dtype = std::nullopt,
               std::optional<double> clock_MHz = std::nullopt);

  // Time of one op (in `phase`, which selects its calibrated efficiency) at full speed.
  Picoseconds op_time(const models::Op& op, spec::Phase phase = spec::Phase::kFwd) const;
  // Time of an op of class `op_class` with explicit FLOPs and bytes: matrix classes use the GEMM
  // efficiency curve, all use the class's memory efficiency; one launch.
  // A calibrated efficiency under `op_key` (efficiency_key; when the cluster has one) replaces
  // both curves.
  double seconds(double flops, double bytes, spec::OpClass op_class,
                 std::string_view op_key = {}) const;
  // One matrix product on the device's GEMM model (the device must have one), launch excluded:
  // in the GEMM dtype, or with `in_gemm_dtype` false in the 16-bit dtype (a product an fp8
  // recipe leaves unquantized: models::fp8_recipe_quantizes).
  double matmul_seconds(const models::MatmulShape& shape, bool in_gemm_dtype = true) const;
  // The fused attention kernel of `op` (forward or backward), launch and memory time excluded.
  double attention_seconds(const models::Op& op, bool backward) const;
  // Optimizer step over `params` parameters held by this rank: memory-bound, `bytes_per_param`
  // (models::optimizer_bytes_per_param).
  Picoseconds optimizer_time(int64_t params, int64_t bytes_per_param) const;

  // `busy` devices of this one's node compute at once (this one included): every op runs the
  // device's co_run slowdown for that many slower (matrix work by its matrix figure, memory-bound
  // work by its memory figure). Default 1: alone, as calibration's fits are.
  void set_busy_devices(int64_t busy);

  // Host time per training step outside any op (DeviceSpec::step_overhead_us).
  Picoseconds step_overhead() const { return seconds_to_ps(device_->step_overhead_us * 1e-6); }

  const spec::DeviceSpec& device() const { return *device_; }
  double peak_flops() const { return peak_flops_; }
  // The SM clock tensor-core work runs at (MHz); 0 for a device without a clock model.
  double clock_MHz() const { return clock_MHz_; }
  // How much slower compute runs while a transfer is in flight on the same device (f: speed
  // 1 / (1 + f); DeviceSpec::overlap_slowdown).
  double overlap_slowdown() const { return device_->overlap_slowdown; }

 private:
  // A memory-bound op's time at the bandwidths of the kernels that move its bytes.
  double memory_bound_seconds(const models::Op& op) const;

  const spec::DeviceSpec* device_;
  spec::Dtype dtype_;
  spec::AttentionKernel attention_;
  double peak_flops_;
  double gemm_peak_flops_;
  double tile_overhead_scale_ = 1;  // the GEMM dtype's peak over the 16-bit peak
  bool fp8_gemms_ = false;
  double clock_MHz_ = 0;
  double co_run_matrix_ = 1;  // slowdown of matrix work beside the node's busy devices
  double co_run_memory_ = 1;  // of memory-bound work
};

bool is_matrix_op(spec::OpClass op_class);

// The devices of one node computing at once in a run of `ranks` ranks: the node's devices fill in
// rank order, so a run of fewer ranks than a node's devices leaves the rest idle.
int64_t busy_devices_per_node(const spec::ClusterSpec& cluster, int64_t ranks);

}  // namespace sextant::sim
