// Elementwise kernels that move 16 bytes a load and a store (8 bf16 or 4 floats a thread) when
// every operand is 16-byte aligned, and one element a thread otherwise: the memory-bound ops
// around the GEMMs (activations, residual adds, bias adds) at the HBM bandwidth rather than the
// load-instruction rate. Each op is a functor of the loaded values in float.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda_check.hpp"
#include "cuda_scalar.cuh"

namespace sextant::exec::cuda_elementwise {

using cuda_scalar::ld;
using cuda_scalar::st;

constexpr int kThreads = 256;
constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi), GELU's tanh form

template <typename T>
struct alignas(16) Pack {
  static constexpr int kSize = 16 / sizeof(T);
  T v[kSize];
};

inline bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// GELU in its tanh form (Hendrycks & Gimpel 2016, eq. in §2; GPT-2's gelu) and its derivative.
struct Gelu {
  __device__ float operator()(float x, float) const {
    return 0.5f * x * (1.0f + tanhf(kGeluC * (x + 0.044715f * x * x * x)));
  }
};
struct GeluBackward {  // (x, dy) -> dx
  __device__ float operator()(float x, float dy) const {
    const float t = tanhf(kGeluC * (x + 0.044715f * x * x * x));
    const float du = kGeluC * (1.0f + 3.0f * 0.044715f * x * x);
    return dy * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du);
  }
};
struct Relu {
  __device__ float operator()(float x, float) const { return fmaxf(0.0f, x); }
};
struct ReluBackward {  // (x, dy) -> dx
  __device__ float operator()(float x, float dy) const { return x > 0 ? dy : 0.0f; }
};
struct Add {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct Scale {
  float factor;
  __device__ float operator()(float x, float) const { return x * factor; }
};

// y[i] = op(a[i], b[i]) (b null: op(a[i], 0)); y may be a or b. A thread takes kPacked ? a Pack :
// one element; the last Pack of an n that is no multiple of its size goes element by element.
template <bool kPacked, typename T, typename Op>
__global__ void map_kernel(T* y, const T* a, const T* b, int64_t n, Op op) {
  constexpr int kSize = kPacked ? Pack<T>::kSize : 1;
  const int64_t i0 = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * kSize;
  if (i0 >= n) return;
  if (kPacked && i0 + kSize <= n) {
    const Pack<T> pa = *reinterpret_cast<const Pack<T>*>(a + i0);
    Pack<T> pb{}, out;
    if (b != nullptr) pb = *reinterpret_cast<const Pack<T>*>(b + i0);
#pragma unroll
    for (int k = 0; k < Pack<T>::kSize; ++k)
      out.v[k] = st<T>(op(ld(pa.v[k]), b != nullptr ? ld(pb.v[k]) : 0.0f));
    *reinterpret_cast<Pack<T>*>(y + i0) = out;
    return;
  }
  for (int64_t i = i0; i < n && i < i0 + kSize; ++i)
    y[i] = st<T>(op(ld(a[i]), b != nullptr ? ld(b[i]) : 0.0f));
}

template <typename T, typename Op>
void map(T* y, const T* a, const T* b, int64_t n, Op op) {
  if (n == 0) return;
  const bool packed = aligned16(y) && aligned16(a) && (b == nullptr || aligned16(b));
  const int64_t size = packed ? Pack<T>::kSize : 1;
  const auto blocks = static_cast<unsigned>(((n + size - 1) / size + kThreads - 1) / kThreads);
  if (packed)
    map_kernel<true><<<blocks, kThreads>>>(y, a, b, n, op);
  else
    map_kernel<false><<<blocks, kThreads>>>(y, a, b, n, op);
  CUDA_CHECK(cudaGetLastError());
}

// y [rows, cols] += bias [cols] broadcast over rows; packed when no Pack straddles two rows.
template <bool kPacked, typename T>
__global__ void bias_add_kernel(T* y, const T* bias, int64_t n, int64_t cols) {
  constexpr int kSize = kPacked ? Pack<T>::kSize : 1;
  const int64_t i0 = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * kSize;
  if (i0 >= n) return;
  const int64_t c0 = i0 % cols;
  if (kPacked) {
    Pack<T> py = *reinterpret_cast<const Pack<T>*>(y + i0);
    const Pack<T> pb = *reinterpret_cast<const Pack<T>*>(bias + c0);
#pragma unroll
    for (int k = 0; k < Pack<T>::kSize; ++k) py.v[k] = st<T>(ld(py.v[k]) + ld(pb.v[k]));
    *reinterpret_cast<Pack<T>*>(y + i0) = py;
    return;
  }
  y[i0] = st<T>(ld(y[i0]) + ld(bias[c0]));
}

template <typename T>
void bias_add(T* y, const T* bias, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  if (n == 0) return;
  const bool packed = aligned16(y) && aligned16(bias) && cols % Pack<T>::kSize == 0;
  const int64_t size = packed ? Pack<T>::kSize : 1;
  const auto blocks = static_cast<unsigned>((n / size + kThreads - 1) / kThreads);
  if (packed)
    bias_add_kernel<true><<<blocks, kThreads>>>(y, bias, n, cols);
  else
    bias_add_kernel<false><<<blocks, kThreads>>>(y, bias, n, cols);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace sextant::exec::cuda_elementwise
