// The GPU kernels of a PyTorch-profiler (Kineto) trace grouped by the op class Sextant gives the
// work they do, so that a measured step can be compared with a predicted one class by class
// (`sextant validate`, table K1). Kernel names are matched by the libraries' naming (cuBLAS nvjet
// and *gemm* kernels, cuDNN/flash attention, PyTorch's layer-norm, softmax and multi-tensor
// kernels); whatever matches none is elementwise work (casts, copies, activations, dropout, adds).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "sextant/spec/json_reader.hpp"
#include "sextant/spec/trace.hpp"

namespace sextant::traces {

// The class of one GPU kernel, by name. Attention's pre- and post-processing kernels
// (dot(dO, O), dQ conversion) count as attention.
spec::OpClass kernel_class(const std::string& kernel_name);

struct KernelTimes {
  std::map<spec::OpClass, double> seconds;  // summed kernel time per class over the whole trace
  std::map<spec::OpClass, int64_t> counts;  // kernels per class over the whole trace
  int64_t steps = 0;                        // optimizer steps in the trace (Optimizer.step spans)
  int64_t kernels = 0;
  // Wall time of a step on the GPU timeline: from the end of one optimizer step to the end of the
  // next (Kineto's gpu_user_annotation spans), averaged over the trace's consecutive steps; kernels
  // plus the gaps between them. 0 with fewer than two such spans.
  double wall_step_s = 0;
};

// Throws InputError naming `source` when the trace has no GPU kernels.
KernelTimes kernel_times(const spec::Json& json, const std::string& source);

// The traces of one step's ranks (one profiler trace per rank of a multi-GPU run) as one: kernel
// times, counts and optimizer steps summed, so that time per step is the mean over the ranks;
// the wall step the mean of the ranks that have one.
KernelTimes merge_ranks(const std::vector<KernelTimes>& ranks);

}  // namespace sextant::traces
