// Loads that widen to float and stores that round once, for kernels templated over the element
// type T (float, or __nv_bfloat16 in mixed precision): one home for every .cu file.
#pragma once

#include <cuda_bf16.h>

namespace sextant::exec::cuda_scalar {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ float ld(float v) {
  return v;
}
__device__ __forceinline__ float ld(bf16 v) {
  return __bfloat162float(v);
}
template <typename T>
__device__ __forceinline__ T st(float v);
template <>
__device__ __forceinline__ float st<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ bf16 st<bf16>(float v) {
  return __float2bfloat16_rn(v);
}

}  // namespace sextant::exec::cuda_scalar
