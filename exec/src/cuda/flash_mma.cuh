// FlashAttention-2's kernels with the score tiles in registers (Dao 2023, §3.1-3.3): bf16
// mma.sync.m16n8k16 with fp32 accumulation, for head_dim 64 and 128 (backward: 64). Included by
// flash_attention.cu, which picks these or its shared-memory kernels per shape.
//
// Fragment layouts are the PTX ISA's for mma.m16n8k16 (".bf16" A row-major, B column-major): with
// g = lane / 4 and t = lane % 4, a thread holds A rows g and g + 8 at columns 2t, 2t + 1 (and
// + 8), B rows (k) 2t, 2t + 1 (and + 8) of column (n) g, and C rows g and g + 8 at columns 2t,
// 2t + 1. An accumulator tile of scores is therefore, two n8 tiles at a time, the A fragment of
// the next product (P V, dS K, ...) without leaving registers, and each row's softmax statistics
// reduce over the four threads of a quad. B operands stored [k][n] row-major load with
// ldmatrix.trans; those stored [n][k] (keys for S = Q K^T) load as 32-bit words. Exponentials are
// exp2 of scores pre-scaled by log2(e).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace sextant::exec::cuda_flash::mma {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kRows = 64;  // a block's query (or key) rows, and a key (or query) tile
constexpr int kWarpRows = 16;
constexpr int kThreads = 128;

using bf16 = __nv_bfloat16;

// One m16n8k16 product: c += a b.
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t word(const bf16* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}
__device__ __forceinline__ uint32_t pack(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// The A fragment of rows [0, 16) and columns [k0, k0 + 16) of a row-major tile.
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const bf16* tile, int ld, int k0) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  a[0] = word(tile + g * ld + k0 + 2 * t);
  a[1] = word(tile + (g + 8) * ld + k0 + 2 * t);
  a[2] = word(tile + g * ld + k0 + 8 + 2 * t);
  a[3] = word(tile + (g + 8) * ld + k0 + 8 + 2 * t);
}

// The B fragment (k [k0, k0 + 16) x n [n0, n0 + 8)) of B = X^T, X row-major [n][k]: keys for
// S = Q K^T, the values for dP = dO V^T.
__device__ __forceinline__ void load_b_of_transposed(uint32_t& b0, uint32_t& b1, const bf16* x,
                                                     int ld, int n0, int k0) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  b0 = word(x + (n0 + g) * ld + k0 + 2 * t);
  b1 = word(x + (n0 + g) * ld + k0 + 8 + 2 * t);
}

// The B fragment (k [k0, k0 + 16) x n [n0, n0 + 8)) of B row-major [k][n]: ldmatrix.x2.trans, lanes
// 0-7 naming rows k0..k0+7 and lanes 8-15 rows k0+8..k0+15 (16-byte aligned: ld and n0 multiples
// of 8 elements).
__device__ __forceinline__ void load_b(uint32_t& b0, uint32_t& b1, const bf16* x, int ld, int k0,
                                       int n0) {
  const int lane = threadIdx.x % 32;
  const bf16* row = x + (k0 + lane % 16) * ld + n0;
  const auto addr = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(b0), "=r"(b1)
               : "r"(addr));
}

// The A fragment of columns [16 j, 16 j + 16) of a [16 x 64] accumulator tile (eight n8 tiles),
// rounded to bf16.
__device__ __forceinline__ void a_of(uint32_t (&a)[4], const float (&c)[8][4], int j) {
  a[0] = pack(c[2 * j][0], c[2 * j][1]);
  a[1] = pack(c[2 * j][2], c[2 * j][3]);
  a[2] = pack(c[2 * j + 1][0], c[2 * j + 1][1]);
  a[3] = pack(c[2 * j + 1][2], c[2 * j + 1][3]);
}

// 2^x in one MUFU instruction (ex2.approx.ftz: relative error under 2^-22; 2^-inf = 0), as
// FlashAttention-2 builds its exponentials with --use_fast_math.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Sum or max over the quad of threads that hold one accumulator row.
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

// Rows [row0, row0 + 64) of sequence b, columns [col, col + D) of a [batch * seq, width] bf16
// tensor, 16 bytes a load, into tile [64 x (D + 8)]: zeros past the sequence.
template <int D>
__device__ __forceinline__ void load_rows(const bf16* src, int64_t width, int64_t seq, int64_t b,
                                          int64_t row0, int64_t col, bf16* tile) {
  constexpr int kPerRow = D / 8;
  for (int e = threadIdx.x; e < kRows * kPerRow; e += blockDim.x) {
    const int r = e / kPerRow, c = (e % kPerRow) * 8;
    const int64_t row = row0 + r;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (row < seq) v = *reinterpret_cast<const uint4*>(src + (b * seq + row) * width + col + c);
    *reinterpret_cast<uint4*>(tile + r * (D + 8) + c) = v;
  }
}

// The same rows copied asynchronously (cp.async, 16 bytes a copy, zero-filled past the sequence):
// the next tile's loads run under the current tile's products. Completion: commit(), then
// wait<N>() (all but the N latest groups done) and a barrier.
template <int D>
__device__ __forceinline__ void copy_rows(const bf16* src, int64_t width, int64_t seq, int64_t b,
                                          int64_t row0, int64_t col, bf16* tile) {
  constexpr int kPerRow = D / 8;
  for (int e = threadIdx.x; e < kRows * kPerRow; e += blockDim.x) {
    const int r = e / kPerRow, c = (e % kPerRow) * 8;
    const int64_t row = row0 + r;
    const bool inside = row < seq;
    const bf16* from = inside ? src + (b * seq + row) * width + col + c : src;
    const auto to = static_cast<uint32_t>(__cvta_generic_to_shared(tile + r * (D + 8) + c));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(to), "l"(from),
                 "r"(inside ? 16 : 0));
  }
}
// count floats from src[first..] (zeros from index `valid` on), 4 bytes a copy.
__device__ __forceinline__ void copy_floats(const float* src, int64_t first, int64_t valid,
                                            int count, float* dst) {
  for (int e = threadIdx.x; e < count; e += blockDim.x) {
    const bool inside = first + e < valid;
    const float* from = inside ? src + first + e : src;
    const auto to = static_cast<uint32_t>(__cvta_generic_to_shared(dst + e));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(to), "l"(from),
                 "r"(inside ? 4 : 0));
  }
}
__device__ __forceinline__ void commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// The launch's shapes (flash_attention.cu's Shape, the fields these kernels read).
struct Dims {
  int64_t seq, heads, kv_heads, width, out_width;
  float scale;       // 1 / sqrt(head_dim)
  float scale_log2;  // log2(e) / sqrt(head_dim)
};

template <int D>
constexpr int forward_smem() {
  return 5 * kRows * (D + 8) * 2;  // q, and two buffers of k and v
}

// Forward: one block per 64 query rows of head h of sequence b, the key tiles up to its own.
template <int D>
__global__ void __launch_bounds__(kThreads)
    forward(const bf16* qkv, bf16* out, float* lse, Dims s) {
  constexpr int kLd = D + 8;
  extern __shared__ __align__(128) unsigned char smem[];  // forward_smem<D>() bytes
  bf16* q_tile = reinterpret_cast<bf16*>(smem);
  bf16* kv_tiles = q_tile + kRows * kLd;  // buffer i: keys at 2i, values at 2i + 1
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t q_block = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int64_t kv = h / (s.heads / s.kv_heads), q0 = q_block * kRows;
  const auto fetch = [&](int64_t kt) {  // key tile kt into buffer kt % 2
    bf16* k_dst = kv_tiles + (kt % 2) * 2 * kRows * kLd;
    copy_rows<D>(qkv, s.width, s.seq, b, kt * kRows, (s.heads + kv) * D, k_dst);
    copy_rows<D>(qkv, s.width, s.seq, b, kt * kRows, (s.heads + s.kv_heads + kv) * D,
                 k_dst + kRows * kLd);
    commit();
  };
  fetch(0);
  load_rows<D>(qkv, s.width, s.seq, b, q0, h * D, q_tile);
  __syncthreads();
  uint32_t qf[D / 16][4];
  for (int kc = 0; kc < D / 16; ++kc) load_a(qf[kc], q_tile + warp * kWarpRows * kLd, kLd, 16 * kc);
  float o[D / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows g and g + 8, lane-partial l
  const int64_t row_q[2] = {q0 + warp * kWarpRows + g, q0 + warp * kWarpRows + g + 8};
  for (int64_t kt = 0; kt <= q_block; ++kt) {
    const int64_t k0 = kt * kRows;
    if (kt < q_block) {
      fetch(kt + 1);  // into the buffer the last tile used: every warp left it at the barrier
      wait<1>();
    } else {
      wait<0>();
    }
    __syncthreads();  // tile kt is in place for every warp
    const bf16* k_tile = kv_tiles + (kt % 2) * 2 * kRows * kLd;
    const bf16* v_tile = k_tile + kRows * kLd;
    float sc[8][4] = {};
    for (int kc = 0; kc < D / 16; ++kc)
      for (int nt = 0; nt < 8; ++nt) {
        uint32_t b0, b1;
        load_b_of_transposed(b0, b1, k_tile, kLd, 8 * nt, 16 * kc);
        mma(sc[nt], qf[kc], b0, b1);
      }
    // Below the diagonal and inside the sequence every key is seen: no mask to test.
    const bool whole = kt < q_block && k0 + kRows <= s.seq;
    float tile_max[2] = {-INFINITY, -INFINITY};
    for (int nt = 0; nt < 8; ++nt)
      for (int i = 0; i < 4; ++i) {
        const int64_t key = k0 + 8 * nt + 2 * t + (i & 1);
        const bool seen = whole || (key <= row_q[i / 2] && key < s.seq);
        sc[nt][i] = seen ? sc[nt][i] * s.scale_log2 : -INFINITY;
        tile_max[i / 2] = fmaxf(tile_max[i / 2], sc[nt][i]);
      }
    float alpha[2];
    for (int r = 0; r < 2; ++r) {
      const float m_new = fmaxf(m[r], quad_max(tile_max[r]));
      // A row sees key 0 in the first tile, so m_new is finite from then on.
      alpha[r] = m[r] == -INFINITY ? 0.0f : fast_exp2(m[r] - m_new);
      m[r] = m_new;
      l[r] *= alpha[r];
    }
    for (int nt = 0; nt < 8; ++nt)
      for (int i = 0; i < 4; ++i) {
        const float p = fast_exp2(sc[nt][i] - m[i / 2]);  // a masked score's is 0
        sc[nt][i] = p;
        l[i / 2] += p;
      }
    for (int nt = 0; nt < D / 8; ++nt) {
      o[nt][0] *= alpha[0];
      o[nt][1] *= alpha[0];
      o[nt][2] *= alpha[1];
      o[nt][3] *= alpha[1];
    }
    for (int kc = 0; kc < 4; ++kc) {  // O += P V over the tile's 64 keys
      uint32_t a[4];
      a_of(a, sc, kc);
      for (int nt = 0; nt < D / 8; ++nt) {
        uint32_t b0, b1;
        load_b(b0, b1, v_tile, kLd, 16 * kc, 8 * nt);
        mma(o[nt], a, b0, b1);
      }
    }
    __syncthreads();  // every warp is done with buffer kt % 2 before it is refilled
  }
  const float row_l_of[2] = {quad_sum(l[0]), quad_sum(l[1])};  // the whole warp shuffles
  for (int r = 0; r < 2; ++r) {
    if (row_q[r] >= s.seq) continue;
    const float row_l = row_l_of[r];
    bf16* dst = out + (b * s.seq + row_q[r]) * s.out_width + h * D;
    for (int nt = 0; nt < D / 8; ++nt)
      *reinterpret_cast<uint32_t*>(dst + 8 * nt + 2 * t) =
          pack(o[nt][2 * r] / row_l, o[nt][2 * r + 1] / row_l);
    if (t == 0) lse[(b * s.heads + h) * s.seq + row_q[r]] = (m[r] + log2f(row_l)) / kLog2e;
  }
}

template <int D>
constexpr int key_smem() {
  return 6 * kRows * (D + 8) * 2 + 4 * kRows * 4;  // k, v, and two buffers of q, dO, lse, delta
}

// dK and dV: one block per 64 key rows of kv head `kv` of sequence b (16 a warp), over the query
// tiles at or after its own, for every q head of the kv head's group. P^T and dS^T stay fp32 in
// registers between the products.
template <int D>
__global__ void __launch_bounds__(kThreads, 3)
    key_backward(const bf16* qkv, const bf16* dout, const float* lse, const float* delta,
                 bf16* dqkv, Dims s) {
  constexpr int kLd = D + 8;
  extern __shared__ __align__(128) unsigned char smem[];  // key_smem<D>() bytes
  bf16* k_tile = reinterpret_cast<bf16*>(smem);
  bf16* v_tile = k_tile + kRows * kLd;
  bf16* q_tiles = v_tile + kRows * kLd;  // buffer i: q at 2i, dO at 2i + 1
  float* row_tiles = reinterpret_cast<float*>(q_tiles + 4 * kRows * kLd);  // lse, delta at 2i, 2i+1
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t k_block = blockIdx.x, kv = blockIdx.y, b = blockIdx.z, k0 = k_block * kRows;
  const int64_t group = s.heads / s.kv_heads, tiles = (s.seq + kRows - 1) / kRows;
  // The (q head of the group, query tile at or after this one) pairs, in order.
  const int64_t per_head = tiles - k_block, steps = group * per_head;
  const auto fetch = [&](int64_t step) {
    const int64_t h = kv * group + step / per_head, q0 = (k_block + step % per_head) * kRows;
    bf16* q_dst = q_tiles + (step % 2) * 2 * kRows * kLd;
    float* rows_dst = row_tiles + (step % 2) * 2 * kRows;
    copy_rows<D>(qkv, s.width, s.seq, b, q0, h * D, q_dst);
    copy_rows<D>(dout, s.out_width, s.seq, b, q0, h * D, q_dst + kRows * kLd);
    const int64_t row0 = (b * s.heads + h) * s.seq;
    copy_floats(lse, row0 + q0, row0 + s.seq, kRows, rows_dst);
    copy_floats(delta, row0 + q0, row0 + s.seq, kRows, rows_dst + kRows);
    commit();
  };
  fetch(0);
  load_rows<D>(qkv, s.width, s.seq, b, k0, (s.heads + kv) * D, k_tile);
  load_rows<D>(qkv, s.width, s.seq, b, k0, (s.heads + s.kv_heads + kv) * D, v_tile);
  __syncthreads();
  // The warp's keys stay in registers; its values are read from the tile when used (registers
  // for three blocks an SM).
  uint32_t kf[D / 16][4];
  for (int kc = 0; kc < D / 16; ++kc) load_a(kf[kc], k_tile + warp * kWarpRows * kLd, kLd, 16 * kc);
  float dk[D / 8][4] = {}, dv[D / 8][4] = {};
  const int64_t row_k[2] = {k0 + warp * kWarpRows + g, k0 + warp * kWarpRows + g + 8};
  for (int64_t step = 0; step < steps; ++step) {
    {
      const int64_t q0 = (k_block + step % per_head) * kRows;
      if (step + 1 < steps) {
        fetch(step + 1);  // into the buffer the last step used: every warp left it at the barrier
        wait<1>();
      } else {
        wait<0>();
      }
      __syncthreads();  // step's tiles are in place for every warp
      const bf16* q_tile = q_tiles + (step % 2) * 2 * kRows * kLd;
      const bf16* do_tile = q_tile + kRows * kLd;
      const float* lse_tile = row_tiles + (step % 2) * 2 * kRows;  // natural log units
      const float* delta_tile = lse_tile + kRows;
      float p[8][4] = {};  // S^T = K Q^T, then P^T (keys x queries)
      for (int kc = 0; kc < D / 16; ++kc)
        for (int nt = 0; nt < 8; ++nt) {
          uint32_t b0, b1;
          load_b_of_transposed(b0, b1, q_tile, kLd, 8 * nt, 16 * kc);
          mma(p[nt], kf[kc], b0, b1);
        }
      // Past the diagonal and inside the sequence every query sees every key: no mask to test.
      const bool whole = q0 > k0 && q0 + kRows <= s.seq && k0 + kRows <= s.seq;
      for (int nt = 0; nt < 8; ++nt)
        for (int i = 0; i < 4; ++i) {
          const int col = 8 * nt + 2 * t + (i & 1);
          const int64_t query = q0 + col, key = row_k[i / 2];
          const bool seen = whole || (key <= query && query < s.seq && key < s.seq);
          p[nt][i] = seen ? fast_exp2(p[nt][i] * s.scale_log2 - lse_tile[col] * kLog2e) : 0.0f;
        }
      for (int kc = 0; kc < 4; ++kc) {  // dV += P^T dO
        uint32_t a[4];
        a_of(a, p, kc);
        for (int nt = 0; nt < D / 8; ++nt) {
          uint32_t b0, b1;
          load_b(b0, b1, do_tile, kLd, 16 * kc, 8 * nt);
          mma(dv[nt], a, b0, b1);
        }
      }
      float dp[8][4] = {};  // dP^T = V dO^T
      for (int kc = 0; kc < D / 16; ++kc) {
        uint32_t vf[4];
        load_a(vf, v_tile + warp * kWarpRows * kLd, kLd, 16 * kc);
        for (int nt = 0; nt < 8; ++nt) {
          uint32_t b0, b1;
          load_b_of_transposed(b0, b1, do_tile, kLd, 8 * nt, 16 * kc);
          mma(dp[nt], vf, b0, b1);
        }
      }
      for (int nt = 0; nt < 8; ++nt)
        for (int i = 0; i < 4; ++i)
          p[nt][i] *= dp[nt][i] - delta_tile[8 * nt + 2 * t + (i & 1)];  // dS^T
      for (int kc = 0; kc < 4; ++kc) {                                   // dK += dS^T Q
        uint32_t a[4];
        a_of(a, p, kc);
        for (int nt = 0; nt < D / 8; ++nt) {
          uint32_t b0, b1;
          load_b(b0, b1, q_tile, kLd, 16 * kc, 8 * nt);
          mma(dk[nt], a, b0, b1);
        }
      }
    }
    __syncthreads();  // every warp is done with buffer step % 2 before it is refilled
  }
  for (int r = 0; r < 2; ++r) {
    if (row_k[r] >= s.seq) continue;
    bf16* dst = dqkv + (b * s.seq + row_k[r]) * s.width;
    for (int nt = 0; nt < D / 8; ++nt) {
      *reinterpret_cast<uint32_t*>(dst + (s.heads + kv) * D + 8 * nt + 2 * t) =
          pack(dk[nt][2 * r] * s.scale, dk[nt][2 * r + 1] * s.scale);
      *reinterpret_cast<uint32_t*>(dst + (s.heads + s.kv_heads + kv) * D + 8 * nt + 2 * t) =
          pack(dv[nt][2 * r], dv[nt][2 * r + 1]);
    }
  }
}

template <int D>
constexpr int query_smem() {
  return 6 * kRows * (D + 8) * 2;  // q, dO, and two buffers of k and v
}

// dQ: one block per 64 query rows of head h of sequence b (16 a warp), over the key tiles up to
// its own, S and dP recomputed.
template <int D>
__global__ void __launch_bounds__(kThreads)
    query_backward(const bf16* qkv, const bf16* dout, const float* lse, const float* delta,
                   bf16* dqkv, Dims s) {
  constexpr int kLd = D + 8;
  extern __shared__ __align__(128) unsigned char smem[];  // query_smem<D>() bytes
  bf16* q_tile = reinterpret_cast<bf16*>(smem);
  bf16* do_tile = q_tile + kRows * kLd;
  bf16* kv_tiles = do_tile + kRows * kLd;  // buffer i: keys at 2i, values at 2i + 1
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t q_block = blockIdx.x, h = blockIdx.y, b = blockIdx.z, q0 = q_block * kRows;
  const int64_t kv = h / (s.heads / s.kv_heads);
  const auto fetch = [&](int64_t kt) {  // key tile kt into buffer kt % 2
    bf16* k_dst = kv_tiles + (kt % 2) * 2 * kRows * kLd;
    copy_rows<D>(qkv, s.width, s.seq, b, kt * kRows, (s.heads + kv) * D, k_dst);
    copy_rows<D>(qkv, s.width, s.seq, b, kt * kRows, (s.heads + s.kv_heads + kv) * D,
                 k_dst + kRows * kLd);
    commit();
  };
  fetch(0);
  load_rows<D>(qkv, s.width, s.seq, b, q0, h * D, q_tile);
  load_rows<D>(dout, s.out_width, s.seq, b, q0, h * D, do_tile);
  __syncthreads();
  uint32_t qf[D / 16][4], dof[D / 16][4];
  for (int kc = 0; kc < D / 16; ++kc) {
    load_a(qf[kc], q_tile + warp * kWarpRows * kLd, kLd, 16 * kc);
    load_a(dof[kc], do_tile + warp * kWarpRows * kLd, kLd, 16 * kc);
  }
  const int64_t row_q[2] = {q0 + warp * kWarpRows + g, q0 + warp * kWarpRows + g + 8};
  float row_lse[2], row_delta[2];
  for (int r = 0; r < 2; ++r) {
    const int64_t at = (b * s.heads + h) * s.seq + row_q[r];
    row_lse[r] = row_q[r] < s.seq ? lse[at] * kLog2e : 0.0f;
    row_delta[r] = row_q[r] < s.seq ? delta[at] : 0.0f;
  }
  float dq[D / 8][4] = {};
  for (int64_t kt = 0; kt <= q_block; ++kt) {
    const int64_t k0 = kt * kRows;
    if (kt < q_block) {
      fetch(kt + 1);  // into the buffer the last tile used: every warp left it at the barrier
      wait<1>();
    } else {
      wait<0>();
    }
    __syncthreads();  // tile kt is in place for every warp
    const bf16* k_tile = kv_tiles + (kt % 2) * 2 * kRows * kLd;
    const bf16* v_tile = k_tile + kRows * kLd;
    float ds[8][4] = {}, dp[8][4] = {};  // S = Q K^T (then P, then dS) and dP = dO V^T
    for (int kc = 0; kc < D / 16; ++kc)
      for (int nt = 0; nt < 8; ++nt) {
        uint32_t b0, b1;
        load_b_of_transposed(b0, b1, k_tile, kLd, 8 * nt, 16 * kc);
        mma(ds[nt], qf[kc], b0, b1);
        load_b_of_transposed(b0, b1, v_tile, kLd, 8 * nt, 16 * kc);
        mma(dp[nt], dof[kc], b0, b1);
      }
    // Below the diagonal and inside the sequence every key is seen: no mask to test.
    const bool whole = kt < q_block && q0 + kRows <= s.seq && k0 + kRows <= s.seq;
    for (int nt = 0; nt < 8; ++nt)
      for (int i = 0; i < 4; ++i) {
        const int64_t key = k0 + 8 * nt + 2 * t + (i & 1), query = row_q[i / 2];
        const bool seen = whole || (key <= query && query < s.seq && key < s.seq);
        const float p = seen ? fast_exp2(ds[nt][i] * s.scale_log2 - row_lse[i / 2]) : 0.0f;
        ds[nt][i] = p * (dp[nt][i] - row_delta[i / 2]);
      }
    for (int kc = 0; kc < 4; ++kc) {  // dQ += dS K
      uint32_t a[4];
      a_of(a, ds, kc);
      for (int nt = 0; nt < D / 8; ++nt) {
        uint32_t b0, b1;
        load_b(b0, b1, k_tile, kLd, 16 * kc, 8 * nt);
        mma(dq[nt], a, b0, b1);
      }
    }
    __syncthreads();  // every warp is done with buffer kt % 2 before it is refilled
  }
  for (int r = 0; r < 2; ++r) {
    if (row_q[r] >= s.seq) continue;
    bf16* dst = dqkv + (b * s.seq + row_q[r]) * s.width + h * D;
    for (int nt = 0; nt < D / 8; ++nt)
      *reinterpret_cast<uint32_t*>(dst + 8 * nt + 2 * t) =
          pack(dq[nt][2 * r] * s.scale, dq[nt][2 * r + 1] * s.scale);
  }
}

}  // namespace sextant::exec::cuda_flash::mma
