// The CUDA backend: tensors in device memory, GEMMs through cuBLAS (bf16 or fp32 tensors;
// tensor-core compute in bf16 or tf32, or exact fp32; fp32 accumulation always), and kernels of its
// own for everything else, on one stream. Built when nvcc is found (SEXTANT_WITH_CUDA); elsewhere
// these functions say so.
#pragma once

#include <memory>
#include <string>

#include "sextant/exec/backend.hpp"
#include "sextant/exec/precision.hpp"

namespace sextant::exec {

// Devices visible to this process; 0 when CUDA is absent, the driver too old or no GPU.
int cuda_device_count();
// A human-readable reason when cuda_device_count() is 0.
std::string cuda_unavailable_reason();
// Throws std::runtime_error when CUDA is unavailable (naming why).
std::unique_ptr<Backend> make_cuda_backend(int device, Precision precision);

bool built_with_cuda();

}  // namespace sextant::exec
