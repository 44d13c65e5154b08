// Calibration against a profiler trace at the level of the whole step. A PyTorch-profiler trace
// names CUDA kernels, not the simulator's ops: an eager GELU is eight kernels, an autocast cast a
// copy kernel the model may not have. Op-by-op fitting cannot close that gap; comparing the time
// per op class of one simulated step with the trace's kernels per class can. Each class's model
// parameter (memory efficiency for memory-bound classes, the GEMM model's main-loop efficiency,
// the fused-attention kernel's throughput) is scaled until the class's time matches, never past
// its physical bound (an efficiency of 1, the dtype's peak); a class that would need more is
// capped and reported.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "sextant/spec/cluster_spec.hpp"
#include "sextant/spec/model_spec.hpp"
#include "sextant/spec/plan.hpp"
#include "sextant/traces/kernel_classes.hpp"

namespace sextant::loop {

// One simulated step on rank 0, time and op count per class on the compute stream (the fused
// attention core counts as attention, as the profiler's attention kernels do).
struct ClassTimes {
  std::map<spec::OpClass, double> seconds;
  std::map<spec::OpClass, int64_t> ops;
  double step_s = 0;  // the predicted step
  double busy_s = 0;  // of it, the compute stream's ops (the GPU-busy time a profile sums)
};
ClassTimes predicted_class_times(const spec::ModelSpec& model, const spec::ClusterSpec& cluster,
                                 const spec::Plan& plan);

// The classes a profiler trace splits a step into, in the order tables print them.
const std::vector<spec::OpClass>& profiled_classes();

struct ClassFitRow {
  spec::OpClass op_class = spec::OpClass::kGemm;
  double measured_s = 0;  // per step
  double before_s = 0;
  double after_s = 0;
  double measured_kernels = 0;  // per step
  int64_t predicted_ops = 0;    // per step
  std::string parameter;        // what the fit changed ("" when nothing could be)
  double value_before = 0, value_after = 0;
  bool capped = false;  // the class needed more than the physical bound allows
};

struct ClassFit {
  spec::ClusterSpec cluster;
  std::vector<ClassFitRow> rows;
  double measured_step_s = 0;                  // GPU-busy time per step: the kernels' sum
  double before_step_s = 0, after_step_s = 0;  // predicted GPU-busy time (ClassTimes::busy_s)
  std::vector<std::string> notes;
};

// Fits `base` so that `plan` of `model` predicts the kernel time per class of `measured`.
// Throws InputError when the trace has no optimizer steps to divide by.
ClassFit fit_classes(const traces::KernelTimes& measured, const std::string& source,
                     const spec::ModelSpec& model, const spec::Plan& plan,
                     const spec::ClusterSpec& base);

// Why a class fit must not be written: it predicts the profiled step worse than before; "" when
// it may be.
std::string refusal(const ClassFit& fit);

}  // namespace sextant::loop
