#include "cpu_backend.hpp"

#include <Eigen/Core>

#include "sextant/exec/cpu_backend.hpp"

namespace sextant::exec {
namespace cpu {

// Blocks come from a caching pool, as on the GPU: glibc serves large requests with fresh mmap
// pages and returns them on free, so every op's output would page-fault (zero-fill) again each
// micro-batch. On the 2-core build machine that kernel time was a third of a gpt-tiny step at
// micro-batch 4 and grew with the micro-batch (docs/CALIBRATION.md). Eigen's aligned allocation
// gives its vectorised kernels aligned rows.
CpuBackend::CpuBackend()
    : pool_(
          [](int64_t bytes) { return Eigen::internal::aligned_malloc(static_cast<size_t>(bytes)); },
          [](void* block) { Eigen::internal::aligned_free(block); }) {}

}  // namespace cpu

std::unique_ptr<Backend> make_cpu_backend() {
  return std::make_unique<cpu::CpuBackend>();
}

}  // namespace sextant::exec
