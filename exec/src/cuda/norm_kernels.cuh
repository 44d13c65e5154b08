// Layer norm (Ba et al. 2016) and RMS norm (Zhang & Sennrich 2019) on the GPU, forward and
// backward, one kernel template each for both norms: kCentered (layer norm) subtracts the row's
// mean and has a bias; RMS norm does neither. One warp per row, kNormRows rows a block: a row's
// sums are reduced by shuffles with no block barrier, and its elements are read 16 bytes a load
// when kPacked (columns a multiple of a Pack, every operand aligned), so that the kernels run at
// the HBM's rate. The block-per-row kernels they replace (two block barriers a row, one element a
// load) took 3.6 ms a step in layer norm's backward and 0.9 ms in its forward on GPT-2 124M on the
// H200 (bench/results/gpu_h200.md).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda_check.hpp"
#include "cuda_scalar.cuh"
#include "elementwise.cuh"
#include "sextant/exec/kernels/norm.hpp"
#include "sextant/spec/error.hpp"

namespace sextant::exec::cuda_norm {

using cuda_scalar::ld;
using cuda_scalar::st;

constexpr int kNormRows = 8;  // warps, so rows, a block

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The kSize elements at p as floats: one 16-byte load when kPacked, else one element.
template <bool kPacked, typename T, int kSize>
__device__ __forceinline__ void load(const T* p, float (&v)[kSize]) {
  if constexpr (kPacked) {
    const auto pack = *reinterpret_cast<const cuda_elementwise::Pack<T>*>(p);
#pragma unroll
    for (int k = 0; k < kSize; ++k) v[k] = ld(pack.v[k]);
  } else {
    v[0] = ld(*p);
  }
}
template <bool kPacked, typename T, int kSize>
__device__ __forceinline__ void store(T* p, const float (&v)[kSize]) {
  if constexpr (kPacked) {
    cuda_elementwise::Pack<T> pack;
#pragma unroll
    for (int k = 0; k < kSize; ++k) pack.v[k] = st<T>(v[k]);
    *reinterpret_cast<cuda_elementwise::Pack<T>*>(p) = pack;
  } else {
    *p = st<T>(v[0]);
  }
}
// v added into the kSize floats at p, a warp's own shared-memory row: float4 accesses when
// kSize is a multiple of 4 (16 bytes a lane, so each quarter-warp phase covers the 32 banks once).
template <int kSize>
__device__ __forceinline__ void add_to_row(float* p, const float (&v)[kSize]) {
  if constexpr (kSize % 4 == 0) {
#pragma unroll
    for (int q = 0; q < kSize / 4; ++q) {
      float4 a = reinterpret_cast<float4*>(p)[q];
      a.x += v[4 * q];
      a.y += v[4 * q + 1];
      a.z += v[4 * q + 2];
      a.w += v[4 * q + 3];
      reinterpret_cast<float4*>(p)[q] = a;
    }
  } else {
#pragma unroll
    for (int k = 0; k < kSize; ++k) p[k] += v[k];
  }
}

// y = (x - mean) * rstd * g + b (kCentered) or x * rstd * g, rstd = 1 / sqrt(variance + eps)
// (kCentered) or 1 / sqrt(mean(x^2) + eps); saves mean (kCentered) and rstd per row. A lane reads
// its columns once per pass (from L1 after the first).
template <bool kCentered, bool kPacked, typename T>
__global__ void norm_kernel(const T* x, const T* g, const T* b, T* y, float* mean, float* rstd,
                            int64_t rows, int64_t cols) {
  constexpr int kSize = kPacked ? cuda_elementwise::Pack<T>::kSize : 1;
  const int64_t row = blockIdx.x * static_cast<int64_t>(kNormRows) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const T* xr = x + row * cols;
  float v[kSize];
  float mu = 0.0f;
  if constexpr (kCentered) {
    float s = 0.0f;
    for (int64_t j = lane * kSize; j < cols; j += 32 * kSize) {
      load<kPacked>(xr + j, v);
      for (int k = 0; k < kSize; ++k) s += v[k];
    }
    mu = warp_sum(s) / static_cast<float>(cols);
  }
  float ss = 0.0f;
  for (int64_t j = lane * kSize; j < cols; j += 32 * kSize) {
    load<kPacked>(xr + j, v);
    for (int k = 0; k < kSize; ++k) ss += (v[k] - mu) * (v[k] - mu);
  }
  const float eps = kCentered ? kLayerNormEps : kRmsNormEps;
  const float r = rsqrtf(warp_sum(ss) / static_cast<float>(cols) + eps);
  for (int64_t j = lane * kSize; j < cols; j += 32 * kSize) {
    float gv[kSize], out[kSize];
    load<kPacked>(xr + j, v);
    load<kPacked>(g + j, gv);
    for (int k = 0; k < kSize; ++k) out[k] = (v[k] - mu) * r * gv[k];
    if constexpr (kCentered) {
      float bv[kSize];
      load<kPacked>(b + j, bv);
      for (int k = 0; k < kSize; ++k) out[k] += bv[k];
    }
    store<kPacked>(y + row * cols + j, out);
  }
  if (lane == 0) {
    if constexpr (kCentered) mean[row] = mu;
    rstd[row] = r;
  }
}

// dx = rstd * (dy g - mean(dy g) - xhat mean(dy g xhat)) with xhat = (x - mean) rstd (kCentered;
// RMS norm: xhat = x rstd and no mean(dy g) term); dgamma += sum over rows of dy xhat, dbeta +=
// sum of dy (kCentered). Rows in a grid-stride loop over the grid's warps; a row's two means by
// shuffles, then dx from a second read of the row. dgamma and dbeta go into two shared-memory rows
// of the warp's own (no atomics; `cols` floats each), summed over the block's warps at the end and
// added to the global sums once per block.
template <bool kCentered, bool kPacked, typename T>
__global__ void norm_backward_kernel(const T* x, const T* g, const float* mean, const float* rstd,
                                     const T* dy, T* dx, float* dgamma, float* dbeta, int64_t rows,
                                     int64_t cols) {
  constexpr int kSize = kPacked ? cuda_elementwise::Pack<T>::kSize : 1;
  constexpr int kSums = kCentered ? 2 : 1;  // dgamma, and dbeta
  extern __shared__ float4 shared_rows[];   // float4: 16-byte aligned for add_to_row
  float* sums = reinterpret_cast<float*>(shared_rows);
  const int warps = static_cast<int>(blockDim.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  float* sg = sums + static_cast<int64_t>(threadIdx.x / 32) * kSums * cols;
  float* sb = sg + cols;  // only when kCentered
  for (int64_t j = lane; j < kSums * cols; j += 32) sg[j] = 0.0f;
  __syncwarp();
  const int64_t grid_warps = static_cast<int64_t>(gridDim.x) * warps;
  for (int64_t row = blockIdx.x * static_cast<int64_t>(warps) + threadIdx.x / 32; row < rows;
       row += grid_warps) {
    const T* xr = x + row * cols;
    const T* dyr = dy + row * cols;
    const float mu = kCentered ? mean[row] : 0.0f, r = rstd[row];
    float s1 = 0.0f, s2 = 0.0f;
    for (int64_t j = lane * kSize; j < cols; j += 32 * kSize) {
      float xv[kSize], dv[kSize], gv[kSize], pg[kSize];
      load<kPacked>(xr + j, xv);
      load<kPacked>(dyr + j, dv);
      load<kPacked>(g + j, gv);
      for (int k = 0; k < kSize; ++k) {
        const float xhat = (xv[k] - mu) * r, dxhat = dv[k] * gv[k];
        s1 += dxhat;
        s2 += dxhat * xhat;
        pg[k] = dv[k] * xhat;
      }
      add_to_row(sg + j, pg);
      if constexpr (kCentered) add_to_row(sb + j, dv);
    }
    const float m1 = kCentered ? warp_sum(s1) / static_cast<float>(cols) : 0.0f;
    const float m2 = warp_sum(s2) / static_cast<float>(cols);
    for (int64_t j = lane * kSize; j < cols; j += 32 * kSize) {
      float xv[kSize], dv[kSize], gv[kSize], out[kSize];
      load<kPacked>(xr + j, xv);
      load<kPacked>(dyr + j, dv);
      load<kPacked>(g + j, gv);
      for (int k = 0; k < kSize; ++k) out[k] = r * (dv[k] * gv[k] - m1 - (xv[k] - mu) * r * m2);
      store<kPacked>(dx + row * cols + j, out);
    }
  }
  __syncthreads();
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    float a = 0.0f, c = 0.0f;
    for (int w = 0; w < warps; ++w) {
      a += sums[static_cast<int64_t>(w) * kSums * cols + j];
      if constexpr (kCentered) c += sums[static_cast<int64_t>(w) * kSums * cols + cols + j];
    }
    atomicAdd(&dgamma[j], a);
    if constexpr (kCentered) atomicAdd(&dbeta[j], c);
  }
}

// The launch shape of norm_backward_kernel: as many warps a block as their shared-memory rows
// allow (at most kNormRows), and a few blocks an SM, so that the per-block atomics stay few (one
// per column and block).
struct NormBackwardLaunch {
  unsigned blocks = 0, threads = 0;
  size_t shared_bytes = 0;
};
inline NormBackwardLaunch norm_backward_launch(int64_t rows, int64_t cols, bool centered, int sms,
                                               size_t max_shared_bytes) {
  constexpr int kBlocksPerSm = 2;
  const size_t per_warp = (centered ? 2 : 1) * static_cast<size_t>(cols) * sizeof(float);
  SEXTANT_CHECK(per_warp <= max_shared_bytes,
                "a norm's backward over rows of {} columns needs {} bytes of shared memory a warp; "
                "the GPU has {} a block",
                cols, per_warp, max_shared_bytes);
  const int64_t warps =
      std::clamp<int64_t>(static_cast<int64_t>(max_shared_bytes / per_warp), 1, kNormRows);
  const int64_t blocks =
      std::clamp<int64_t>((rows + warps - 1) / warps, 1, static_cast<int64_t>(kBlocksPerSm) * sms);
  return {static_cast<unsigned>(blocks), static_cast<unsigned>(32 * warps),
          static_cast<size_t>(warps) * per_warp};
}

}  // namespace sextant::exec::cuda_norm
