// The CUDA backend's CNN kernels (convolution.cu), made by the backend with its cuBLAS handle
// and the compute type its precision asks for (exact fp32, or tf32 / bf16 tensor cores), and
// allocating their scratch (im2col columns, per-channel sums) from its memory.
#pragma once

#include <cublas_v2.h>

#include <memory>

#include "sextant/exec/kernels/convolution.hpp"
#include "sextant/exec/kernels/memory.hpp"

namespace sextant::exec {

std::unique_ptr<ConvolutionKernels> make_cuda_convolution(cublasHandle_t blas,
                                                          cublasComputeType_t compute,
                                                          DeviceMemory& memory);

}  // namespace sextant::exec
