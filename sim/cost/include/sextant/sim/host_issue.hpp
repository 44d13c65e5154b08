// Kernels issued by the host. A framework's host thread issues a step's kernels one after
// another, each taking it some time (its Python, PyTorch's dispatcher, the launch call), and the
// GPU runs each only once it has been issued. Where kernels are shorter than their issue the GPU
// waits for the host: the launch-bound steps of small models under eager PyTorch (GPT-2 124M on
// an H100 spends ~9% of its step so, traces/samples/kineto-gpt2-124m-h100-b8.json.gz).
//
// The model is Daydream's (Zhu et al., USENIX ATC'20: host tasks launch GPU tasks; a GPU task
// starts after its launch and its predecessor), with the host never waiting for the GPU within a
// step, at the granularity of ops: an op of k kernels of equal length. A run of work on one stream
// is summed up by three numbers; started on the GPU at S while the host starts issuing it at H,
// it ends at max(S + gpu, H + critical). Runs compose in order (then()), so a pass, a stage's
// step or one op are described alike.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "sextant/spec/cluster_spec.hpp"
#include "sextant/spec/stack.hpp"
#include "sextant/spec/trace.hpp"

namespace sextant::sim {

struct HostChain {
  double gpu_s = 0;   // its kernels back to back on the GPU
  double host_s = 0;  // the host's time to issue them
  // The earliest it can end counted from when the host starts issuing it: the largest, over its
  // kernels, of the host time to issue up to that kernel plus the GPU time from there to the end
  // (-infinity without kernels: no bound, so that the empty run is the identity of then()).
  double critical_s = -std::numeric_limits<double>::infinity();

  // This run, then `next` (issued after it and run after it).
  HostChain then(const HostChain& next) const {
    return {gpu_s + next.gpu_s, host_s + next.host_s,
            std::max(critical_s + next.gpu_s, host_s + next.critical_s)};
  }
  // When the run ends, started on the GPU at `gpu_start` with its issue begun at `host_start`.
  double end(double gpu_start, double host_start) const {
    return std::max(gpu_start + gpu_s, host_start + critical_s);
  }
};

// An op of `kernels` kernels of equal length taking `seconds` together, each issued in
// `per_kernel_s`. Kernel j (1-based) is issued at j c and k - j + 1 of the k kernels of d / k run
// from its start: the bound j c + (k - j + 1) d / k is linear in j, so the first or the last kernel
// sets it. An op of no kernels (fused into a neighbour), or a collective, needs no issue of its
// own: GPU time alone.
HostChain host_chain_of_op(double seconds, int64_t kernels, double per_kernel_s);

// The host's time to issue one kernel of a pass in `phase` under `stack` (Stack::host_launch_us:
// forward and recomputed forward, backward; nothing else is modelled): 0 on a CPU device, whose
// kernels run on the host that issues them.
double host_launch_seconds(const spec::Stack& stack, const spec::DeviceSpec& device,
                           spec::Phase phase);

}  // namespace sextant::sim
