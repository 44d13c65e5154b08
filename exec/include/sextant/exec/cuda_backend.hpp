// The CUDA backend: tensors in device memory, GEMMs through cuBLAS (fp32 storage; tensor-core
// compute in bf16 or tf32, or exact fp32), and kernels of its own for everything else, on one
// stream. Built when nvcc is found (SEXTANT_WITH_CUDA); elsewhere these functions say so.
#pragma once

#include <memory>
#include <string>

#include "sextant/exec/backend.hpp"

namespace sextant::exec {

// The compute type of cuBLAS GEMMs over fp32 tensors: exact fp32, or the tensor cores with inputs
// rounded to tf32 or bf16 (fp32 accumulation in every case).
enum class GemmPrecision { kFp32, kTf32, kBf16 };

inline const char* gemm_precision_name(GemmPrecision p) {
  return p == GemmPrecision::kBf16 ? "bf16" : p == GemmPrecision::kTf32 ? "tf32" : "fp32";
}

// Devices visible to this process; 0 when CUDA is absent, the driver too old or no GPU.
int cuda_device_count();
// A human-readable reason when cuda_device_count() is 0.
std::string cuda_unavailable_reason();
// Throws std::runtime_error when CUDA is unavailable (naming why).
std::unique_ptr<Backend> make_cuda_backend(int device, GemmPrecision precision);

bool built_with_cuda();

}  // namespace sextant::exec
