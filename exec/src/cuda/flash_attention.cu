// Fused causal self-attention on the GPU: FlashAttention-2 (Dao 2023). No s x s tensor is
// written: forward keeps the output and each row's log-sum-exp (Algorithm 1), backward recomputes
// the probabilities from it (Algorithm 2) with D = rowsum(dO * O) computed first.
//
// A thread block holds 64 query (or key) rows of one head, 16 rows per warp. Every matrix product
// is a warp's [16 x n] += [16 x k] * [k x n] on tiles in shared memory (warp_mma): bf16 tensor
// cores (WMMA 16x16x16, fp32 accumulation) in mixed precision, fp32 FMAs on fp32 tensors. The
// head dimension is padded with zeros to a multiple of 16 in shared memory, so any head_dim up to
// 128 runs. Softmax statistics, accumulators and the dS of the backward are fp32; P and dS enter
// the next product rounded to the storage type, as in FlashAttention-2.
//
// bf16 heads of 64 columns (forward: and 128) run flash_mma.cuh's kernels instead, which keep the
// score tiles in registers; the kernels here take every other shape and fp32.
//
// Backward runs as two kernels, as the Triton fused-attention tutorial's backward does: one per
// key tile accumulates dK and dV over the query tiles at or after it (and over a kv head's group
// of q heads), one per query tile accumulates dQ over the key tiles up to it. Each gradient has
// one writer: no atomics, the same bits every run, at the cost of recomputing S and dP once more
// (7 tile products against FlashAttention-2's 5).
#include <cuda_runtime.h>
#include <mma.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "cuda_check.hpp"
#include "cuda_flash_attention.hpp"
#include "cuda_scalar.cuh"
#include "elementwise.cuh"
#include "flash_mma.cuh"
#include "sextant/spec/error.hpp"
#include "sextant/spec/flash_limits.hpp"

namespace sextant::exec::cuda_flash {

namespace {

using cuda_scalar::bf16;
using cuda_scalar::ld;
using cuda_scalar::st;

constexpr int kTile = 64;            // query or key rows of a block
constexpr int kWarpRows = 16;        // a warp's rows of the tile
constexpr int kFlashThreads = 128;   // kTile / kWarpRows warps
constexpr int kScoreLd = kTile + 4;  // float [16 x 64] tiles (S, dP), padded against bank conflicts
constexpr int kProbLd = kTile + 8;   // storage-type [16 x 64] tiles (P, dS)

// The shapes a launch needs, by value.
struct Shape {
  int64_t seq = 0, heads = 0, kv_heads = 0, d = 0;
  int64_t width = 0;          // qkv's row: (heads + 2 kv_heads) d
  int64_t out_width = 0;      // out's and dout's row: heads d
  int dp = 0;                 // d rounded up to 16
  float scale = 0;            // 1 / sqrt(d)
  bool vector_loads = false;  // d, both widths and every operand's address are 16-byte multiples
  __host__ __device__ int tile_ld() const {
    return dp + 8;
  }  // storage-type [64 x dp] tiles (q, k, v, dO)
  __host__ __device__ int acc_ld() const {
    return dp + 4;
  }  // float [16 x dp] accumulators per warp
  __host__ __device__ int64_t tiles() const { return (seq + kTile - 1) / kTile; }
  __host__ __device__ int64_t group() const { return heads / kv_heads; }
};

// C[16 x n] (+)= A[16 x k] B, all in shared memory, C fp32. B is [k x n] row-major, or given as its
// transpose [n x k] row-major when BT (B = that^T). n and k are multiples of 16.
template <bool BT, typename T>
__device__ void warp_mma_simt(const T* a, int lda, const T* b, int ldb, float* c, int ldc, int n,
                              int k, bool accumulate) {
  const int lane = threadIdx.x % 32;
  for (int e = lane; e < kWarpRows * n; e += 32) {
    const int r = e / n, col = e % n;
    float sum = accumulate ? c[r * ldc + col] : 0.0f;
    for (int i = 0; i < k; ++i)
      sum += ld(a[r * lda + i]) * ld(BT ? b[col * ldb + i] : b[i * ldb + col]);
    c[r * ldc + col] = sum;
  }
  __syncwarp();
}

template <bool BT>
__device__ void warp_mma(const float* a, int lda, const float* b, int ldb, float* c, int ldc, int n,
                         int k, bool accumulate) {
  warp_mma_simt<BT>(a, lda, b, ldb, c, ldc, n, k, accumulate);
}

template <bool BT>
__device__ void warp_mma(const bf16* a, int lda, const bf16* b, int ldb, float* c, int ldc, int n,
                         int k, bool accumulate) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  namespace wmma = nvcuda::wmma;
  using BLayout = std::conditional_t<BT, wmma::col_major, wmma::row_major>;
  for (int nn = 0; nn < n; nn += 16) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    if (accumulate)
      wmma::load_matrix_sync(acc, c + nn, ldc, wmma::mem_row_major);
    else
      wmma::fill_fragment(acc, 0.0f);
    for (int kk = 0; kk < k; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, BLayout> fb;
      wmma::load_matrix_sync(fa, a + kk, lda);
      wmma::load_matrix_sync(fb, BT ? b + nn * ldb + kk : b + kk * ldb + nn, ldb);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(c + nn, acc, ldc, wmma::mem_row_major);
  }
  __syncwarp();
#else
  warp_mma_simt<BT>(a, lda, b, ldb, c, ldc, n, k, accumulate);
#endif
}

// Rows [row0, row0 + 64) of sequence b of a [batch * seq, width] tensor, columns [col, col + d),
// into tile [64 x dp] (leading dimension tile_ld): zeros past the sequence and past d. 16 bytes a
// load where the shape lets every row's columns start aligned (Shape::vector_loads).
template <typename T>
__device__ void load_tile(const T* src, int64_t width, int64_t b, const Shape& s, int64_t row0,
                          int64_t col, T* tile) {
  const int ld_tile = s.tile_ld();
  if (s.vector_loads) {
    constexpr int kVector = 16 / sizeof(T);
    const int per_row = s.dp / kVector;
    for (int e = threadIdx.x; e < kTile * per_row; e += blockDim.x) {
      const int r = e / per_row, c = (e % per_row) * kVector;
      const int64_t row = row0 + r;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (row < s.seq && c < s.d)
        v = *reinterpret_cast<const uint4*>(src + (b * s.seq + row) * width + col + c);
      *reinterpret_cast<uint4*>(tile + r * ld_tile + c) = v;
    }
    return;
  }
  for (int e = threadIdx.x; e < kTile * s.dp; e += blockDim.x) {
    const int r = e / s.dp, c = e % s.dp;
    const int64_t row = row0 + r;
    tile[r * ld_tile + c] =
        row < s.seq && c < s.d ? src[(b * s.seq + row) * width + col + c] : st<T>(0.0f);
  }
}

// Shared memory, carved in order; every region's size is a multiple of 128 bytes for the shapes
// here (64 rows, leading dimensions multiples of 4 floats or 8 halves), so each one starts aligned
// as WMMA's loads need (256 bits).
struct Carver {
  unsigned char* at;
  template <typename U>
  __device__ U* take(int64_t count) {
    U* p = reinterpret_cast<U*>(at);
    at += count * static_cast<int64_t>(sizeof(U));
    return p;
  }
};

template <typename T>
int64_t forward_smem(const Shape& s) {
  return 3 * kTile * s.tile_ld() * sizeof(T) + kTile * kScoreLd * 4 + kTile * kProbLd * sizeof(T) +
         kTile * s.acc_ld() * 4;
}

// One block: 64 query rows of head h of sequence b, against the key tiles up to its own.
template <typename T>
__global__ void __launch_bounds__(kFlashThreads)
    forward_kernel(const T* qkv, T* out, float* lse, Shape s) {
  extern __shared__ __align__(128) unsigned char smem[];
  Carver carve{smem};
  const int ldt = s.tile_ld(), ldo = s.acc_ld();
  T* q = carve.take<T>(kTile * ldt);
  T* k = carve.take<T>(kTile * ldt);
  T* v = carve.take<T>(kTile * ldt);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* sw = carve.take<float>(kTile * kScoreLd) + warp * kWarpRows * kScoreLd;
  T* pw = carve.take<T>(kTile * kProbLd) + warp * kWarpRows * kProbLd;
  float* ow = carve.take<float>(kTile * ldo) + warp * kWarpRows * ldo;
  const int64_t q_tile = blockIdx.x, h = blockIdx.y, b = blockIdx.z, g = h / s.group();
  const int64_t q0 = q_tile * kTile;
  load_tile(qkv, s.width, b, s, q0, h * s.d, q);
  for (int e = lane; e < kWarpRows * s.dp; e += 32) ow[(e / s.dp) * ldo + e % s.dp] = 0.0f;
  // Lanes 2r and 2r + 1 own row r of the warp's 16, columns [32 half, 32 half + 32) of a tile.
  const int r = lane / 2, half = lane % 2;
  const int64_t qi = q0 + warp * kWarpRows + r;
  float m = -INFINITY, l = 0.0f;
  for (int64_t kt = 0; kt <= q_tile; ++kt) {  // causal: key tiles up to the diagonal
    const int64_t k0 = kt * kTile;
    __syncthreads();  // the previous tile's keys and values are used up
    load_tile(qkv, s.width, b, s, k0, (s.heads + g) * s.d, k);
    load_tile(qkv, s.width, b, s, k0, (s.heads + s.kv_heads + g) * s.d, v);
    __syncthreads();
    warp_mma<true>(q + warp * kWarpRows * ldt, ldt, k, ldt, sw, kScoreLd, kTile, s.dp, false);
    float row_max = -INFINITY;
    for (int c = 32 * half; c < 32 * half + 32; ++c) {
      const int64_t kj = k0 + c;
      const float x = kj <= qi && kj < s.seq ? sw[r * kScoreLd + c] * s.scale : -INFINITY;
      sw[r * kScoreLd + c] = x;
      row_max = fmaxf(row_max, x);
    }
    row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, 1));
    const float m_new = fmaxf(m, row_max);
    const bool none = m_new == -INFINITY;  // no key seen yet (never for key 0 <= every row)
    const float alpha = none || m == -INFINITY ? 0.0f : expf(m - m_new);
    float sum = 0.0f;
    for (int c = 32 * half; c < 32 * half + 32; ++c) {
      const float x = sw[r * kScoreLd + c];
      const float p = none || x == -INFINITY ? 0.0f : expf(x - m_new);
      pw[r * kProbLd + c] = st<T>(p);
      sum += p;
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l = l * alpha + sum;
    m = m_new;
    for (int c = half; c < s.dp; c += 2) ow[r * ldo + c] *= alpha;
    __syncwarp();
    warp_mma<false>(pw, kProbLd, v, ldt, ow, ldo, s.dp, kTile, true);  // O += P V
  }
  if (qi >= s.seq) return;
  const float inv = 1.0f / l;
  for (int c = half; c < s.d; c += 2)
    out[(b * s.seq + qi) * s.out_width + h * s.d + c] = st<T>(ow[r * ldo + c] * inv);
  if (half == 0) lse[(b * s.heads + h) * s.seq + qi] = m + logf(l);
}

// delta[b, h, i] = sum over head h's columns of dout * out; one thread per (row, head), 16 bytes a
// load when the head's columns allow (Shape::vector_loads).
template <typename T>
__global__ void prep_kernel(const T* out, const T* dout, float* delta, Shape s, int64_t tasks) {
  const int64_t task = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (task >= tasks) return;
  const int64_t row = task / s.heads, h = task % s.heads;
  const int64_t base = row * s.out_width + h * s.d;
  float sum = 0.0f;
  if (s.vector_loads) {
    using Pack = cuda_elementwise::Pack<T>;
    const auto* o = reinterpret_cast<const Pack*>(out + base);
    const auto* d_o = reinterpret_cast<const Pack*>(dout + base);
    for (int64_t p = 0; p < s.d / Pack::kSize; ++p) {
      const Pack a = o[p], b = d_o[p];
#pragma unroll
      for (int k = 0; k < Pack::kSize; ++k) sum += ld(a.v[k]) * ld(b.v[k]);
    }
  } else {
    for (int64_t c = 0; c < s.d; ++c) sum += ld(out[base + c]) * ld(dout[base + c]);
  }
  const int64_t b = row / s.seq, i = row % s.seq;
  delta[(b * s.heads + h) * s.seq + i] = sum;
}

template <typename T>
int64_t key_smem(const Shape& s) {
  return 4 * kTile * s.tile_ld() * sizeof(T) + kTile * kScoreLd * 4 + kTile * kProbLd * sizeof(T) +
         2 * kTile * s.acc_ld() * 4 + 2 * kTile * 4;
}

// One block: 64 key rows of kv head g of sequence b. dV = sum P^T dO and dK = sum dS^T Q over the
// query tiles at or after the keys' tile, for each q head of the group (Algorithm 2's inner loop).
// dS^T = P^T (dP^T - delta) reads P^T as the storage type holds it (fp32, or rounded to bf16 as
// dS^T itself is next): one fp32 tile less, two blocks an SM at head_dim 64.
template <typename T>
__global__ void __launch_bounds__(kFlashThreads)
    key_backward_kernel(const T* qkv, const T* dout, const float* lse, const float* delta, T* dqkv,
                        Shape s) {
  extern __shared__ __align__(128) unsigned char smem[];
  Carver carve{smem};
  const int ldt = s.tile_ld(), ldo = s.acc_ld();
  T* k = carve.take<T>(kTile * ldt);
  T* v = carve.take<T>(kTile * ldt);
  T* q = carve.take<T>(kTile * ldt);
  T* d_o = carve.take<T>(kTile * ldt);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* st_tile = carve.take<float>(kTile * kScoreLd) + warp * kWarpRows * kScoreLd;  // S^T, dP^T
  T* operand = carve.take<T>(kTile * kProbLd) + warp * kWarpRows * kProbLd;            // P^T, dS^T
  float* dk = carve.take<float>(kTile * ldo) + warp * kWarpRows * ldo;
  float* dv = carve.take<float>(kTile * ldo) + warp * kWarpRows * ldo;
  float* lse_tile = carve.take<float>(kTile);
  float* delta_tile = carve.take<float>(kTile);
  const int64_t k_tile = blockIdx.x, g = blockIdx.y, b = blockIdx.z;
  const int64_t k0 = k_tile * kTile;
  load_tile(qkv, s.width, b, s, k0, (s.heads + g) * s.d, k);
  load_tile(qkv, s.width, b, s, k0, (s.heads + s.kv_heads + g) * s.d, v);
  for (int e = lane; e < kWarpRows * s.dp; e += 32) {
    dk[(e / s.dp) * ldo + e % s.dp] = 0.0f;
    dv[(e / s.dp) * ldo + e % s.dp] = 0.0f;
  }
  const int r = lane / 2, half = lane % 2;
  const int64_t kj = k0 + warp * kWarpRows + r;
  for (int64_t j = 0; j < s.group(); ++j) {
    const int64_t h = g * s.group() + j;
    for (int64_t qt = k_tile; qt < s.tiles(); ++qt) {
      const int64_t q0 = qt * kTile;
      __syncthreads();  // the previous query tile is used up
      load_tile(qkv, s.width, b, s, q0, h * s.d, q);
      load_tile(dout, s.out_width, b, s, q0, h * s.d, d_o);
      for (int e = threadIdx.x; e < kTile; e += blockDim.x) {
        const int64_t i = q0 + e, at = (b * s.heads + h) * s.seq + i;
        lse_tile[e] = i < s.seq ? lse[at] : 0.0f;
        delta_tile[e] = i < s.seq ? delta[at] : 0.0f;
      }
      __syncthreads();
      warp_mma<true>(k + warp * kWarpRows * ldt, ldt, q, ldt, st_tile, kScoreLd, kTile, s.dp,
                     false);  // S^T = K Q^T
      for (int c = 32 * half; c < 32 * half + 32; ++c) {
        const int64_t qi = q0 + c;
        const bool seen = kj <= qi && qi < s.seq && kj < s.seq;
        operand[r * kProbLd + c] =
            st<T>(seen ? expf(st_tile[r * kScoreLd + c] * s.scale - lse_tile[c]) : 0.0f);
      }
      __syncwarp();
      warp_mma<false>(operand, kProbLd, d_o, ldt, dv, ldo, s.dp, kTile, true);  // dV += P^T dO
      warp_mma<true>(v + warp * kWarpRows * ldt, ldt, d_o, ldt, st_tile, kScoreLd, kTile, s.dp,
                     false);  // dP^T = V dO^T
      for (int c = 32 * half; c < 32 * half + 32; ++c) {
        const float p = ld(operand[r * kProbLd + c]);
        operand[r * kProbLd + c] = st<T>(p * (st_tile[r * kScoreLd + c] - delta_tile[c]));
      }
      __syncwarp();
      warp_mma<false>(operand, kProbLd, q, ldt, dk, ldo, s.dp, kTile, true);  // dK += dS^T Q
    }
  }
  for (int e = lane; e < kWarpRows * s.d; e += 32) {
    const int rr = e / s.d, c = e % s.d;
    const int64_t row = k0 + warp * kWarpRows + rr;
    if (row >= s.seq) continue;
    T* dst = dqkv + (b * s.seq + row) * s.width;
    dst[(s.heads + g) * s.d + c] = st<T>(dk[rr * ldo + c] * s.scale);
    dst[(s.heads + s.kv_heads + g) * s.d + c] = st<T>(dv[rr * ldo + c]);
  }
}

template <typename T>
int64_t query_smem(const Shape& s) {
  return 4 * kTile * s.tile_ld() * sizeof(T) + 2 * kTile * kScoreLd * 4 +
         kTile * kProbLd * sizeof(T) + kTile * s.acc_ld() * 4;
}

// One block: 64 query rows of head h of sequence b. dQ = sum dS K over the key tiles up to its own.
template <typename T>
__global__ void __launch_bounds__(kFlashThreads)
    query_backward_kernel(const T* qkv, const T* dout, const float* lse, const float* delta,
                          T* dqkv, Shape s) {
  extern __shared__ __align__(128) unsigned char smem[];
  Carver carve{smem};
  const int ldt = s.tile_ld(), ldo = s.acc_ld();
  T* q = carve.take<T>(kTile * ldt);
  T* d_o = carve.take<T>(kTile * ldt);
  T* k = carve.take<T>(kTile * ldt);
  T* v = carve.take<T>(kTile * ldt);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* p = carve.take<float>(kTile * kScoreLd) + warp * kWarpRows * kScoreLd;
  float* dp = carve.take<float>(kTile * kScoreLd) + warp * kWarpRows * kScoreLd;
  T* ds = carve.take<T>(kTile * kProbLd) + warp * kWarpRows * kProbLd;
  float* dq = carve.take<float>(kTile * ldo) + warp * kWarpRows * ldo;
  const int64_t q_tile = blockIdx.x, h = blockIdx.y, b = blockIdx.z, g = h / s.group();
  const int64_t q0 = q_tile * kTile;
  load_tile(qkv, s.width, b, s, q0, h * s.d, q);
  load_tile(dout, s.out_width, b, s, q0, h * s.d, d_o);
  for (int e = lane; e < kWarpRows * s.dp; e += 32) dq[(e / s.dp) * ldo + e % s.dp] = 0.0f;
  const int r = lane / 2, half = lane % 2;
  const int64_t qi = q0 + warp * kWarpRows + r, at = (b * s.heads + h) * s.seq + qi;
  const float row_lse = qi < s.seq ? lse[at] : 0.0f, row_delta = qi < s.seq ? delta[at] : 0.0f;
  for (int64_t kt = 0; kt <= q_tile; ++kt) {
    const int64_t k0 = kt * kTile;
    __syncthreads();
    load_tile(qkv, s.width, b, s, k0, (s.heads + g) * s.d, k);
    load_tile(qkv, s.width, b, s, k0, (s.heads + s.kv_heads + g) * s.d, v);
    __syncthreads();
    warp_mma<true>(q + warp * kWarpRows * ldt, ldt, k, ldt, p, kScoreLd, kTile, s.dp, false);
    warp_mma<true>(d_o + warp * kWarpRows * ldt, ldt, v, ldt, dp, kScoreLd, kTile, s.dp,
                   false);  // dP = dO V^T
    for (int c = 32 * half; c < 32 * half + 32; ++c) {
      const int64_t kj = k0 + c;
      const bool seen = kj <= qi && qi < s.seq && kj < s.seq;
      const float pv = seen ? expf(p[r * kScoreLd + c] * s.scale - row_lse) : 0.0f;
      ds[r * kProbLd + c] = st<T>(pv * (dp[r * kScoreLd + c] - row_delta));
    }
    __syncwarp();
    warp_mma<false>(ds, kProbLd, k, ldt, dq, ldo, s.dp, kTile, true);  // dQ += dS K
  }
  if (qi >= s.seq) return;
  T* dst = dqkv + (b * s.seq + qi) * s.width + h * s.d;
  for (int c = half; c < s.d; c += 2) dst[c] = st<T>(dq[r * ldo + c] * s.scale);
}

Shape shape_of(const QkvLayout& l) {
  SEXTANT_CHECK(l.positions == nullptr,
                "flash attention runs whole causal sequences (context-parallel ranks run "
                "blockwise attention)");
  SEXTANT_CHECK(l.head_dim >= 1 && l.head_dim <= spec::kCudaFlashMaxHeadDim,
                "the CUDA flash attention kernels take head_dim 1..{}, not {}",
                spec::kCudaFlashMaxHeadDim, l.head_dim);
  Shape s;
  s.seq = l.seq;
  s.heads = l.heads;
  s.kv_heads = l.kv_heads;
  s.d = l.head_dim;
  s.width = l.width();
  s.out_width = l.heads * l.head_dim;
  s.dp = static_cast<int>((l.head_dim + 15) / 16 * 16);
  s.scale = 1.0f / std::sqrt(static_cast<float>(l.head_dim));
  return s;
}

// The kernel's dynamic shared memory, allowed past the 48 KiB default (up to the device's opt-in
// limit: 227 KiB on an H100 or H200).
template <typename K>
void allow_smem(K kernel, int64_t bytes, const char* what) {
  int device = 0, limit = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  SEXTANT_CHECK(bytes <= limit,
                "flash attention's {} needs {} bytes of shared memory a block, this GPU allows {} "
                "(a smaller head_dim, or bf16)",
                what, bytes, limit);
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(bytes)));
}

// The shape with Shape::vector_loads set for tiles loaded from these tensors of `element` bytes an
// element.
Shape with_vector_loads(Shape s, int64_t element, std::initializer_list<const Tensor*> loaded) {
  const int64_t v = 16 / element;
  bool ok = s.d % v == 0 && s.width % v == 0 && s.out_width % v == 0;
  for (const Tensor* t : loaded) ok = ok && reinterpret_cast<uintptr_t>(t->raw()) % 16 == 0;
  s.vector_loads = ok;
  return s;
}

// The register-resident kernels (flash_mma.cuh) take bf16 heads of 64 (and forward 128) columns
// whose rows load 16 bytes at a time.
bool runs_on_mma(const Shape& s, bool backward, std::initializer_list<const Tensor*> operands) {
  const bool dims = s.d == 64 || (s.d == 128 && !backward);
  return dims && with_vector_loads(s, 2, operands).vector_loads;
}
mma::Dims dims_of(const Shape& s) {
  return {s.seq, s.heads, s.kv_heads, s.width, s.out_width, s.scale, s.scale * mma::kLog2e};
}

template <typename T>
T* elements(const Tensor& t) {
  return static_cast<T*>(t.raw());
}
float* floats(const Tensor& t, const char* what) {
  SEXTANT_CHECK(t.dtype() == DType::kF32, "flash attention's {} is fp32, not {}", what,
                dtype_name(t.dtype()));
  return static_cast<float*>(t.raw());
}
// Calls f(T{}) with T the storage type of the attention's operands, all of one type.
template <typename F>
void on_type(const Tensor& a, const Tensor& b, F&& f) {
  SEXTANT_CHECK(a.dtype() == b.dtype(), "flash attention on {} and {} tensors",
                dtype_name(a.dtype()), dtype_name(b.dtype()));
  if (a.dtype() == DType::kBF16)
    f(bf16{});
  else
    f(float{});
}

}  // namespace

void forward(const Tensor& qkv, const QkvLayout& l, Tensor& out, Tensor& lse) {
  l.check(qkv);
  const Shape s = shape_of(l);
  SEXTANT_CHECK(
      out.numel() == l.batch * l.seq * s.out_width && lse.numel() == l.batch * l.heads * l.seq,
      "flash attention's out of {} and lse of {} elements", out.numel(), lse.numel());
  float* lse_p = floats(lse, "log-sum-exp");
  if (l.batch * l.seq == 0) return;
  const dim3 grid(static_cast<unsigned>(s.tiles()), static_cast<unsigned>(l.heads),
                  static_cast<unsigned>(l.batch));
  if (qkv.dtype() == DType::kBF16 && out.dtype() == DType::kBF16 &&
      runs_on_mma(s, false, {&qkv, &out})) {
    const auto launch = [&](auto kernel, int bytes) {
      allow_smem(kernel, bytes, "forward");
      kernel<<<grid, mma::kThreads, bytes>>>(elements<bf16>(qkv), elements<bf16>(out), lse_p,
                                             dims_of(s));
    };
    if (s.d == 64)
      launch(mma::forward<64>, mma::forward_smem<64>());
    else
      launch(mma::forward<128>, mma::forward_smem<128>());
    CUDA_CHECK(cudaGetLastError());
    return;
  }
  on_type(qkv, out, [&](auto tag) {
    using T = decltype(tag);
    const int64_t bytes = forward_smem<T>(s);
    allow_smem(forward_kernel<T>, bytes, "forward");
    forward_kernel<T><<<grid, kFlashThreads, bytes>>>(elements<T>(qkv), elements<T>(out), lse_p,
                                                      with_vector_loads(s, sizeof(T), {&qkv}));
  });
  CUDA_CHECK(cudaGetLastError());
}

void backward_prep(const Tensor& out, const Tensor& dout, const QkvLayout& l, Tensor& delta) {
  const Shape s = shape_of(l);
  const int64_t tasks = l.batch * l.seq * l.heads;
  SEXTANT_CHECK(out.numel() == l.batch * l.seq * s.out_width && dout.numel() == out.numel() &&
                    delta.numel() == tasks,
                "flash attention's prep: out of {}, dout of {} and delta of {} elements",
                out.numel(), dout.numel(), delta.numel());
  float* delta_p = floats(delta, "delta");
  if (tasks == 0) return;
  on_type(out, dout, [&](auto tag) {
    using T = decltype(tag);
    constexpr int kPrepThreads = 256;
    const auto blocks = static_cast<unsigned>((tasks + kPrepThreads - 1) / kPrepThreads);
    prep_kernel<T><<<blocks, kPrepThreads>>>(elements<T>(out), elements<T>(dout), delta_p,
                                             with_vector_loads(s, sizeof(T), {&out, &dout}), tasks);
  });
  CUDA_CHECK(cudaGetLastError());
}

void backward(const Tensor& qkv, const Tensor& dout, const Tensor& lse, const Tensor& delta,
              const QkvLayout& l, Tensor& dqkv) {
  l.check(qkv);
  l.check(dqkv);
  const Shape s = shape_of(l);
  SEXTANT_CHECK(dout.numel() == l.batch * l.seq * s.out_width &&
                    lse.numel() == l.batch * l.heads * l.seq && delta.numel() == lse.numel(),
                "flash attention's backward: dout of {}, lse of {} and delta of {} elements",
                dout.numel(), lse.numel(), delta.numel());
  const float* lse_p = floats(lse, "log-sum-exp");
  const float* delta_p = floats(delta, "delta");
  SEXTANT_CHECK(dqkv.dtype() == qkv.dtype(), "flash attention's dqkv is {}, qkv {}",
                dtype_name(dqkv.dtype()), dtype_name(qkv.dtype()));
  if (l.batch * l.seq == 0) return;
  const auto tiles = static_cast<unsigned>(s.tiles());
  const auto batch = static_cast<unsigned>(l.batch);
  if (qkv.dtype() == DType::kBF16 && dout.dtype() == DType::kBF16 &&
      runs_on_mma(s, true, {&qkv, &dout, &dqkv})) {
    constexpr int kKeyBytes = mma::key_smem<64>(), kQueryBytes = mma::query_smem<64>();
    allow_smem(mma::key_backward<64>, kKeyBytes, "key backward");
    allow_smem(mma::query_backward<64>, kQueryBytes, "query backward");
    const mma::Dims d = dims_of(s);
    mma::key_backward<64>
        <<<dim3(tiles, static_cast<unsigned>(l.kv_heads), batch), mma::kThreads, kKeyBytes>>>(
            elements<bf16>(qkv), elements<bf16>(dout), lse_p, delta_p, elements<bf16>(dqkv), d);
    mma::query_backward<64>
        <<<dim3(tiles, static_cast<unsigned>(l.heads), batch), mma::kThreads, kQueryBytes>>>(
            elements<bf16>(qkv), elements<bf16>(dout), lse_p, delta_p, elements<bf16>(dqkv), d);
    CUDA_CHECK(cudaGetLastError());
    return;
  }
  on_type(qkv, dout, [&](auto tag) {
    using T = decltype(tag);
    const int64_t key_bytes = key_smem<T>(s), query_bytes = query_smem<T>(s);
    allow_smem(key_backward_kernel<T>, key_bytes, "key backward");
    allow_smem(query_backward_kernel<T>, query_bytes, "query backward");
    const Shape sv = with_vector_loads(s, sizeof(T), {&qkv, &dout});
    key_backward_kernel<T>
        <<<dim3(tiles, static_cast<unsigned>(l.kv_heads), static_cast<unsigned>(l.batch)),
           kFlashThreads, key_bytes>>>(elements<T>(qkv), elements<T>(dout), lse_p, delta_p,
                                       elements<T>(dqkv), sv);
    query_backward_kernel<T>
        <<<dim3(tiles, static_cast<unsigned>(l.heads), static_cast<unsigned>(l.batch)),
           kFlashThreads, query_bytes>>>(elements<T>(qkv), elements<T>(dout), lse_p, delta_p,
                                         elements<T>(dqkv), sv);
  });
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace sextant::exec::cuda_flash
