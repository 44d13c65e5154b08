// Whether a GPU is usable: the CUDA runtime's answer, turned into a count and a reason.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include "cuda_module.hpp"

namespace sextant::exec::cuda_module {

int device_count() {
  int n = 0;
  // "CUDA driver version is insufficient" (no driver, no GPU) is "no device", not an error.
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error so that later calls start clean
    return 0;
  }
  return n;
}

std::string unavailable_reason() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return fmt::format("the CUDA runtime reports: {}", cudaGetErrorString(e));
  }
  if (n == 0) return "no CUDA device is visible";
  return "";
}

}  // namespace sextant::exec::cuda_module
