// The head dimensions Sextant's CUDA flash attention kernels take (exec/src/cuda/
// flash_attention.cu): their 64-row tiles pad head_dim to 16 and must fit an H100's or H200's
// 227 KiB of shared memory a block. One home for the kernels' check and the executor's refusal
// (spec/executor_support.cpp). C++17: nvcc includes it.
#pragma once

#include <cstdint>

namespace sextant::spec {

inline constexpr int64_t kCudaFlashMaxHeadDim = 128;      // bf16 operands
inline constexpr int64_t kCudaFlashMaxHeadDimFp32 = 112;  // fp32 operands: twice the tile bytes

}  // namespace sextant::spec
