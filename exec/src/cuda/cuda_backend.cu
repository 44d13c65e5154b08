// CUDA kernels and cuBLAS calls behind the Backend interface (the CNN family: convolution.cu; fused
// attention: flash_attention.cu).
// Row-major tensors are passed to column-major cuBLAS as their transposes: y = x w (row-major) is
// y^T = w^T x^T (column-major). Reductions that feed the loss (row max, sum of exponentials) run
// one block per row.
//
// Every kernel is a template over T, the type of the activations and of the parameters' compute
// copy (float, or __nv_bfloat16 in mixed precision); parameter gradients and layer-norm statistics
// are float. Loads widen to float, arithmetic is float, each output is rounded once when stored.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <stdexcept>
#include <tuple>
#include <type_traits>
#include <vector>

#include "cuda_check.hpp"
#include "cuda_convolution.hpp"
#include "cuda_flash_attention.hpp"
#include "cuda_module.hpp"
#include "cuda_scalar.cuh"
#include "elementwise.cuh"
#include "lt_gemm.hpp"
#include "norm_kernels.cuh"
#include "sextant/exec/block_pool.hpp"
#include "sextant/spec/error.hpp"

namespace sextant::exec {

namespace {

using bf16 = __nv_bfloat16;

constexpr int kThreads = 256;
// Blocks of the reductions that add per-block partial sums into parameter gradients: enough to
// fill an H100 (132 SMs) several times over, few enough that the final atomics stay cheap.
constexpr int64_t kMaxReductionBlocks = 1024;
constexpr float kLog2e = 1.4426950408889634f;

int blocks_for(int64_t n) {
  return static_cast<int>((n + kThreads - 1) / kThreads);
}
int64_t rows_of(const Tensor& t) {
  return t.numel() / t.shape().back();
}
int64_t cols_of(const Tensor& t) {
  return t.shape().back();
}

using cuda_scalar::ld;
using cuda_scalar::st;

template <typename T>
constexpr DType dtype_of() {
  return std::is_same_v<T, float> ? DType::kF32 : DType::kBF16;
}
// The elements of t as T; a logic error when t holds the other type (a caller mixing fp32 and
// bf16 activations, which no kernel here expects).
template <typename T>
T* ptr(const Tensor& t) {
  SEXTANT_CHECK(t.dtype() == dtype_of<T>(), "a {} tensor where the kernel expects {}",
                dtype_name(t.dtype()), dtype_name(dtype_of<T>()));
  return static_cast<T*>(t.raw());
}
// Calls f(T{}) with T the element type of `t`.
template <typename F>
void dispatch(const Tensor& t, F&& f) {
  if (t.dtype() == DType::kBF16) {
    f(bf16{});
  } else {
    f(float{});
  }
}
cudaDataType_t cuda_type(DType d) {
  return d == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
}

template <typename T>
__global__ void fill_kernel(T* x, int64_t n, float v) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) x[i] = st<T>(v);
}
template <typename From, typename To>
__global__ void convert_kernel(const From* x, To* y, int64_t n) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = st<To>(ld(x[i]));
}
// Box r of each map, one thread per element of the box over every map (no two write one element).
__global__ void copy_box_kernel(const float* from, Box held_from, float* to, Box held_to, Box r,
                                int64_t n, bool add) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const int64_t cols = r.col_end - r.col_begin, rows = r.row_end - r.row_begin,
                planes = r.plane_end - r.plane_begin;
  const int64_t w = r.col_begin + i % cols, h = r.row_begin + (i / cols) % rows,
                d = r.plane_begin + (i / (cols * rows)) % planes, o = i / (cols * rows * planes);
  auto at = [&](const Box& b) {
    const int64_t bc = b.col_end - b.col_begin, br = b.row_end - b.row_begin,
                  bp = b.plane_end - b.plane_begin;
    return ((o * bp + d - b.plane_begin) * br + h - b.row_begin) * bc + w - b.col_begin;
  };
  const float v = from[at(held_from)];
  float& t = to[at(held_to)];
  t = add ? t + v : v;
}
// Column sums of dy [rows, cols] added into db. A block covers kColTile columns (one per lane of
// x, so that a warp reads consecutive addresses) and a chunk of rows split over kRowLanes lanes of
// y; the lanes meet in shared memory and each block adds its partial sums with one atomic per
// column. (One thread per column over every row -- the obvious kernel -- leaves most of the GPU
// idle: 2304 columns are 72 warps, and each walks 32k rows one load at a time.)
constexpr int kColTile = 32, kRowLanes = 8;
template <typename T>
__global__ void bias_backward_kernel(const T* dy, float* db, int64_t rows, int64_t cols,
                                     int64_t rows_per_block) {
  __shared__ float partial[kRowLanes][kColTile];
  const int64_t c = blockIdx.x * static_cast<int64_t>(kColTile) + threadIdx.x;
  const int64_t r0 = blockIdx.y * rows_per_block;
  const int64_t r1 = r0 + rows_per_block < rows ? r0 + rows_per_block : rows;
  float s = 0;
  if (c < cols)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowLanes) s += ld(dy[r * cols + c]);
  partial[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    for (int k = 1; k < kRowLanes; ++k) s += partial[k][threadIdx.x];
    atomicAdd(&db[c], s);
  }
}
template <typename T>
__global__ void swiglu_kernel(const T* x, T* y, int64_t rows, int64_t f) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * f) return;
  int64_t r = i / f, j = i % f;
  float g = ld(x[r * 2 * f + j]), u = ld(x[r * 2 * f + f + j]);
  y[i] = st<T>(g / (1.0f + expf(-g)) * u);
}
template <typename T>
__global__ void swiglu_backward_kernel(const T* x, const T* dy, T* dx, int64_t rows, int64_t f) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * f) return;
  int64_t r = i / f, j = i % f;
  float g = ld(x[r * 2 * f + j]), u = ld(x[r * 2 * f + f + j]);
  float sig = 1.0f / (1.0f + expf(-g));
  float d = ld(dy[i]);
  dx[r * 2 * f + f + j] = st<T>(d * g * sig);
  dx[r * 2 * f + j] = st<T>(d * u * (sig * (1.0f + g * (1.0f - sig))));
}

// Block-wide sum of `v` (blockDim.x a multiple of 32, at most 1024).
__device__ float block_sum(float v) {
  __shared__ float partial[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = threadIdx.x < blockDim.x / 32 ? partial[lane] : 0.0f;
  if (warp == 0)
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __shared__ float total;
  if (threadIdx.x == 0) total = v;
  __syncthreads();
  return total;
}
__device__ float block_max(float v) {
  __shared__ float partial[32];
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = threadIdx.x < blockDim.x / 32 ? partial[lane] : -INFINITY;
  if (warp == 0)
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  __shared__ float total;
  if (threadIdx.x == 0) total = v;
  __syncthreads();
  return total;
}

// One thread per (row, q-or-k head, pair i): rotates (v[i], v[i + half]) by the angle of
// (row % seq, i), from a [seq, half] table of cosines and sines. The q heads and then the k heads
// are `blocks` adjacent runs of d columns in a row of `width`.
template <typename T>
__global__ void rope_kernel(T* qkv, const float2* table, int64_t rows, int64_t blocks, int64_t d,
                            int64_t width, int64_t seq, float sign) {
  const int64_t half = d / 2;
  const int64_t n = rows * blocks * half;
  int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (k >= n) return;
  const int64_t i = k % half, block = (k / half) % blocks, r = k / (half * blocks);
  const float2 cs = table[(r % seq) * half + i];
  const float c = cs.x, sn = sign * cs.y;
  T* v = qkv + r * width + block * d;
  const float a = ld(v[i]), b = ld(v[i + half]);
  v[i] = st<T>(a * c - b * sn);
  v[i + half] = st<T>(b * c + a * sn);
}
// Causal softmax in place over rows of seq; one block per row of every (batch, head) block. The
// exponentials are recomputed in the last pass rather than stored, so each output is rounded once.
template <typename T>
__global__ void causal_softmax_kernel(T* x, int64_t seq) {
  const int64_t row = blockIdx.x;
  const int64_t i = row % seq;
  T* xr = x + row * seq;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) m = fmaxf(m, ld(xr[j]));
  m = block_max(m);
  float s = 0;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) s += expf(ld(xr[j]) - m);
  const float inv = 1.0f / block_sum(s);
  for (int64_t j = threadIdx.x; j < seq; j += blockDim.x)
    xr[j] = st<T>(j <= i ? expf(ld(xr[j]) - m) * inv : 0.0f);
}
template <typename T>
__global__ void causal_softmax_backward_kernel(const T* p, T* g, int64_t seq) {
  const int64_t row = blockIdx.x;
  const int64_t i = row % seq;
  const T* pr = p + row * seq;
  T* gr = g + row * seq;
  float dot = 0;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) dot += ld(gr[j]) * ld(pr[j]);
  dot = block_sum(dot);
  for (int64_t j = threadIdx.x; j < seq; j += blockDim.x)
    gr[j] = st<T>(j <= i ? ld(pr[j]) * (ld(gr[j]) - dot) : 0.0f);
}
template <typename T>
__global__ void embedding_kernel(const int32_t* tokens, const T* table, T* y, int64_t n, int64_t h,
                                 int64_t vocab_begin, int64_t shard) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n * h) return;
  int64_t t = i / h, j = i % h;
  int64_t row = tokens[t] - vocab_begin;
  y[i] = row >= 0 && row < shard ? table[row * h + j] : st<T>(0.0f);
}
template <typename T>
__global__ void embedding_backward_kernel(const int32_t* tokens, const T* dy, float* dtable,
                                          int64_t n, int64_t h, int64_t vocab_begin,
                                          int64_t shard) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n * h) return;
  int64_t t = i / h, j = i % h;
  int64_t row = tokens[t] - vocab_begin;
  if (row >= 0 && row < shard) atomicAdd(&dtable[row * h + j], ld(dy[i]));
}
template <typename T>
__global__ void positions_kernel(const T* pos, T* y, int64_t rows, int64_t h, int64_t row_begin,
                                 int64_t seq) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * h) return;
  y[i] = st<T>(ld(y[i]) + ld(pos[((row_begin + i / h) % seq) * h + i % h]));
}
template <typename T>
__global__ void positions_backward_kernel(const T* dy, float* dpos, int64_t rows, int64_t h,
                                          int64_t row_begin, int64_t seq) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * h) return;
  atomicAdd(&dpos[((row_begin + i / h) % seq) * h + i % h], ld(dy[i]));
}
// One block per row, one read of the logits: each thread keeps an online (max, sum of exp)
// pair over its columns, rescaled to the block's max before the sums are added.
// The online softmax's running (max, sum) of one thread (Milakov & Gimelshein 2018), in log2 units
// (exp2 of logits scaled by log2(e)), updated by a value or by the maximum and values of a pack.
struct OnlineSum {
  float m = -INFINITY, s = 0.0f;
  __device__ void rescale_to(float m_new) {
    s = m == -INFINITY ? 0.0f : s * exp2f(m - m_new);
    m = m_new;
  }
};

// One block per row: the maximum and the sum of exponentials of its `cols` valid logits (read once,
// 16 bytes a load when `packed`), and the target's logit. max is stored in natural units.
template <typename T>
__global__ void softmax_stats_kernel(const T* x, const int32_t* targets, float* max, float* sum,
                                     float* target, int64_t stride, int64_t cols,
                                     int64_t vocab_begin, bool packed) {
  using cuda_elementwise::Pack;
  const int64_t row = blockIdx.x;
  const T* xr = x + row * stride;  // columns [cols, stride) are padding
  OnlineSum acc;
  int64_t tail = 0;
  if (packed) {
    const int64_t packs = cols / Pack<T>::kSize;
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      const Pack<T> v = reinterpret_cast<const Pack<T>*>(xr)[p];
      float a[Pack<T>::kSize], pack_max = -INFINITY;
#pragma unroll
      for (int k = 0; k < Pack<T>::kSize; ++k) {
        a[k] = ld(v.v[k]) * kLog2e;
        pack_max = fmaxf(pack_max, a[k]);
      }
      if (pack_max == -INFINITY) continue;
      acc.rescale_to(fmaxf(acc.m, pack_max));
#pragma unroll
      for (int k = 0; k < Pack<T>::kSize; ++k) acc.s += exp2f(a[k] - acc.m);
    }
    tail = packs * Pack<T>::kSize;
  }
  for (int64_t j = tail + threadIdx.x; j < cols; j += blockDim.x) {
    const float a = ld(xr[j]) * kLog2e;
    if (a == -INFINITY) continue;
    acc.rescale_to(fmaxf(acc.m, a));
    acc.s += exp2f(a - acc.m);
  }
  const float mx = block_max(acc.m);
  const float total = block_sum(acc.m == -INFINITY ? 0.0f : acc.s * exp2f(acc.m - mx));
  if (threadIdx.x == 0) {
    max[row] = mx / kLog2e;
    sum[row] = total;
    const int64_t c = targets[row] - vocab_begin;
    target[row] = c >= 0 && c < cols ? ld(xr[c]) : 0.0f;
  }
}
// dx = (softmax(x) - onehot(target)) * scale over the valid columns, 0 on the padding; a thread
// takes a Pack (kPacked: cols a multiple of its size, so that a pack lies in one row) or one
// element.
template <bool kPacked, typename T>
__global__ void cross_entropy_backward_kernel(const T* x, const int32_t* targets, const float* max,
                                              const float* sum, float scale, T* dx, int64_t rows,
                                              int64_t cols, int64_t valid, int64_t vocab_begin) {
  using cuda_elementwise::Pack;
  constexpr int kSize = kPacked ? Pack<T>::kSize : 1;
  const int64_t i0 = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * kSize;
  if (i0 >= rows * cols) return;
  const int64_t r = i0 / cols, c0 = i0 % cols, target = targets[r] - vocab_begin;
  const float m2 = max[r] * kLog2e, weight = scale / sum[r];
  const auto grad = [&](float logit, int64_t c) {
    if (c >= valid) return 0.0f;  // padding columns
    return exp2f(logit * kLog2e - m2) * weight - (c == target ? scale : 0.0f);
  };
  if constexpr (kPacked) {
    const Pack<T> v = *reinterpret_cast<const Pack<T>*>(x + i0);
    Pack<T> out;
#pragma unroll
    for (int k = 0; k < kSize; ++k) out.v[k] = st<T>(grad(ld(v.v[k]), c0 + k));
    *reinterpret_cast<Pack<T>*>(dx + i0) = out;
  } else {
    dx[i0] = st<T>(grad(ld(x[i0]), c0));
  }
}
__global__ void sum_squares_kernel(const float* x, int64_t n, double* out) {
  float s = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    s += x[i] * x[i];
  s = block_sum(s);
  if (threadIdx.x == 0) atomicAdd(out, static_cast<double>(s));
}
// torch.optim.AdamW on element i: decoupled decay, moments, bias-corrected step.
__device__ __forceinline__ void adamw_element(float* p, const float* g, float* m, float* v,
                                              int64_t i, float lr, float beta1, float beta2,
                                              float eps, float wd, float grad_scale,
                                              float step_size, float bc2_sqrt) {
  const float gi = g[i] * grad_scale;
  const float pi = p[i] * (1.0f - lr * wd);
  const float mi = beta1 * m[i] + (1.0f - beta1) * gi;
  const float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
  m[i] = mi;
  v[i] = vi;
  p[i] = pi - step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
}
__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, int64_t n, float lr,
                             float beta1, float beta2, float eps, float wd, float grad_scale,
                             float step_size, float bc2_sqrt) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n)
    adamw_element(p, g, m, v, i, lr, beta1, beta2, eps, wd, grad_scale, step_size, bc2_sqrt);
}
// Multi-tensor kernels (AdamW, sums of squares) run one block per tile: a run of at most kTile
// elements of one span of a flat buffer.
constexpr int64_t kTile = 64 * 1024;
struct Tile {
  int64_t offset, count;
  float weight_decay;
};
// Multi-tensor AdamW: block b updates tile b.
__global__ void adamw_tiles_kernel(float* p, const float* g, float* m, float* v, const Tile* tiles,
                                   float lr, float beta1, float beta2, float eps, float grad_scale,
                                   float step_size, float bc2_sqrt) {
  const Tile tile = tiles[blockIdx.x];
  for (int64_t k = threadIdx.x; k < tile.count; k += blockDim.x)
    adamw_element(p, g, m, v, tile.offset + k, lr, beta1, beta2, eps, tile.weight_decay, grad_scale,
                  step_size, bc2_sqrt);
}

// Sum of squares over tiles: block b adds tile b's sum into *out.
__global__ void sum_squares_tiles_kernel(const float* x, const Tile* tiles, double* out) {
  const Tile tile = tiles[blockIdx.x];
  float s = 0;
  for (int64_t k = threadIdx.x; k < tile.count; k += blockDim.x) {
    const float v = x[tile.offset + k];
    s += v * v;
  }
  s = block_sum(s);
  if (threadIdx.x == 0) atomicAdd(out, static_cast<double>(s));
}

// A CUDA event recorded on the compute stream.
struct EventMark : Backend::TimeMark {
  EventMark() {
    CUDA_CHECK(cudaEventCreate(&event));
    CUDA_CHECK(cudaEventRecord(event, nullptr));
  }
  ~EventMark() override { cudaEventDestroy(event); }
  EventMark(const EventMark&) = delete;
  EventMark& operator=(const EventMark&) = delete;
  cudaEvent_t event = nullptr;
};

class CudaBackend : public Backend {
 public:
  CudaBackend(int device, Precision precision)
      : device_(device),
        precision_(precision),
        pool_(
            [](int64_t bytes) -> void* {
              void* p = nullptr;
              if (cudaMalloc(&p, static_cast<size_t>(bytes)) != cudaSuccess) {
                cudaGetLastError();  // out of memory: the pool trims its cache and retries
                return nullptr;
              }
              return p;
            },
            [](void* p) { cudaFree(p); }) {
    CUDA_CHECK(cudaSetDevice(device));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, device));
    int shared = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&shared, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    max_shared_bytes_ = static_cast<size_t>(shared);
    CUBLAS_CHECK(cublasCreate(&blas_));
    lt_ = std::make_unique<LtGemm>();
    CUDA_CHECK(cudaMalloc(&scalar_, sizeof(double)));
    conv_ = make_cuda_convolution(blas_, compute_type(DType::kF32), *this);
  }
  ~CudaBackend() override {
    cudaDeviceSynchronize();
    conv_.reset();
    lt_.reset();
    pool_.trim();
    cudaFree(scalar_);
    cudaFree(ids_);
    for (float* b : scratch_) cudaFree(b);
    for (auto& [key, table] : rope_tables_) cudaFree(table);
    cublasDestroy(blas_);
  }
  std::string name() const override { return std::string("cuda-") + precision_name(precision_); }
  spec::ExecutorBackend kind() const override { return spec::ExecutorBackend::kCuda; }
  spec::ExecutorPrecision precision() const override { return precision_; }
  DType activation_dtype() const override {
    return precision_ == Precision::kBf16 ? DType::kBF16 : DType::kF32;
  }

  void* allocate(int64_t bytes) override {
    void* p = pool_.allocate(bytes);
    if (p == nullptr)
      throw std::runtime_error(
          fmt::format("out of GPU memory: {:.2f} GiB asked with {:.2f} GiB in use",
                      static_cast<double>(bytes) / (1 << 30),
                      static_cast<double>(pool_.live_bytes()) / (1 << 30)));
    return p;
  }
  void release(void* data) override { pool_.release(data); }
  void fill(Tensor& t, float value) override {
    if (t.numel() == 0) return;
    dispatch(t, [&](auto tag) {
      using T = decltype(tag);
      fill_kernel<T><<<blocks_for(t.numel()), kThreads>>>(ptr<T>(t), t.numel(), value);
    });
    CUDA_CHECK(cudaGetLastError());
  }
  void copy(const Tensor& from, Tensor& to) override {
    SEXTANT_CHECK(from.numel() == to.numel(), "copy of {} into {} elements", from.numel(),
                  to.numel());
    if (from.numel() == 0) return;
    if (from.dtype() == to.dtype()) {
      CUDA_CHECK(cudaMemcpyAsync(to.raw(), from.raw(), static_cast<size_t>(from.bytes()),
                                 cudaMemcpyDeviceToDevice, nullptr));
    } else if (from.dtype() == DType::kF32) {
      convert_kernel<float, bf16>
          <<<blocks_for(from.numel()), kThreads>>>(from.data(), ptr<bf16>(to), from.numel());
    } else {
      convert_kernel<bf16, float>
          <<<blocks_for(from.numel()), kThreads>>>(ptr<bf16>(from), to.data(), from.numel());
    }
    CUDA_CHECK(cudaGetLastError());
  }
  void to_host(const Tensor& t, std::vector<float>& out) override {
    Tensor f = t;
    if (t.dtype() != DType::kF32) {
      f = empty(t.shape());
      copy(t, f);
    }
    out.resize(static_cast<size_t>(t.numel()));
    CUDA_CHECK(
        cudaMemcpy(out.data(), f.data(), out.size() * sizeof(float), cudaMemcpyDeviceToHost));
  }
  void from_host(const std::vector<float>& in, Tensor& t) override {
    SEXTANT_CHECK(static_cast<int64_t>(in.size()) == t.numel(), "from_host size mismatch");
    Tensor f = t.dtype() == DType::kF32 ? t : empty(t.shape());
    CUDA_CHECK(cudaMemcpy(f.data(), in.data(), in.size() * sizeof(float), cudaMemcpyHostToDevice));
    if (t.dtype() != DType::kF32) copy(f, t);
  }
  void copy_box(const Tensor& from, const Box& held_from, Tensor& to, const Box& held_to,
                const Box& r, int64_t maps, bool add) override {
    const int64_t n = maps * r.elements();
    if (n <= 0) return;
    SEXTANT_CHECK(
        from.numel() >= maps * held_from.elements() && to.numel() >= maps * held_to.elements(),
        "a box copy over {} maps between tensors of {} and {} elements", maps, from.numel(),
        to.numel());
    copy_box_kernel<<<blocks_for(n), kThreads>>>(from.data(), held_from, to.data(), held_to, r, n,
                                                 add);
    CUDA_CHECK(cudaGetLastError());
  }
  void synchronize() override { CUDA_CHECK(cudaDeviceSynchronize()); }
  std::unique_ptr<TimeMark> mark() override { return std::make_unique<EventMark>(); }
  double seconds_between(const TimeMark& from, const TimeMark& to) override {
    const cudaEvent_t a = static_cast<const EventMark&>(from).event;
    const cudaEvent_t b = static_cast<const EventMark&>(to).event;
    CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    return static_cast<double>(ms) * 1e-3;
  }

  // The cuBLAS compute type: bf16 tensors use the tensor cores as they are (fp32 accumulation);
  // fp32 tensors follow the precision (exact, tf32 or bf16 tensor cores).
  cublasComputeType_t compute_type(DType inputs) const {
    if (inputs == DType::kBF16) return CUBLAS_COMPUTE_32F;
    switch (precision_) {
      case Precision::kBf16Gemm:
        return CUBLAS_COMPUTE_32F_FAST_16BF;
      case Precision::kTf32:
        return CUBLAS_COMPUTE_32F_FAST_TF32;
      default:
        return CUBLAS_COMPUTE_32F;
    }
  }
  // C (col-major m x n, ldc) = alpha op(A) op(B) + beta C; A and B of type `in`, C of its own.
  void gemm(cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
            float alpha, const void* a, int64_t lda, const void* b, int64_t ldb, DType in,
            float beta, void* c, int64_t ldc, DType out) {
    CUBLAS_CHECK(cublasGemmEx(blas_, ta, tb, static_cast<int>(m), static_cast<int>(n),
                              static_cast<int>(k), &alpha, a, cuda_type(in), static_cast<int>(lda),
                              b, cuda_type(in), static_cast<int>(ldb), &beta, c, cuda_type(out),
                              static_cast<int>(ldc), compute_type(in), CUBLAS_GEMM_DEFAULT));
  }
  // The same over `count` matrices at strides sa, sb, sc (elements); all of type `t`.
  void gemm_batched(cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
                    float alpha, const void* a, int64_t lda, int64_t sa, const void* b, int64_t ldb,
                    int64_t sb, float beta, void* c, int64_t ldc, int64_t sc, int64_t count,
                    DType t) {
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        blas_, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), &alpha, a,
        cuda_type(t), static_cast<int>(lda), sa, b, cuda_type(t), static_cast<int>(ldb), sb, &beta,
        c, cuda_type(t), static_cast<int>(ldc), sc, static_cast<int>(count), compute_type(t),
        CUBLAS_GEMM_DEFAULT));
  }
  // The same type for every activation-like argument of one call.
  static DType common(const Tensor& a, const Tensor& b) {
    SEXTANT_CHECK(a.dtype() == b.dtype(), "mixed {} and {} operands", dtype_name(a.dtype()),
                  dtype_name(b.dtype()));
    return a.dtype();
  }
  // Element offset i of t, as an untyped device pointer.
  static const void* at(const Tensor& t, int64_t i) {
    return static_cast<const char*>(t.raw()) + i * element_size(t.dtype());
  }
  static void* at(Tensor& t, int64_t i) {
    return static_cast<char*>(t.raw()) + i * element_size(t.dtype());
  }

  void matmul(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y,
              bool accumulate) override {
    const int64_t rows = rows_of(x), in = cols_of(x), out = cols_of(w);
    const DType t = common(x, w);
    const float beta = accumulate ? 1.0f : 0.0f;
    if (bias != nullptr && bias->dtype() == y.dtype() &&
        lt_->gemm_bias(CUBLAS_OP_N, CUBLAS_OP_N, out, rows, in, w.raw(), out, x.raw(), in,
                       cuda_type(t), compute_type(t), beta, y.raw(), out, bias->raw()))
      return;
    gemm(CUBLAS_OP_N, CUBLAS_OP_N, out, rows, in, 1.0f, w.raw(), out, x.raw(), in, t, beta, y.raw(),
         out, common(x, y));
    if (bias != nullptr) bias_add(y, *bias);
  }
  void matmul_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor& dw,
                       Tensor* db, bool accumulate_dx) override {
    const int64_t rows = rows_of(x), in = cols_of(x), out = cols_of(w);
    const DType t = common(x, w);
    common(x, dy);
    if (dx != nullptr)
      gemm(CUBLAS_OP_T, CUBLAS_OP_N, in, rows, out, 1.0f, w.raw(), out, dy.raw(), out, t,
           accumulate_dx ? 1.0f : 0.0f, dx->raw(), in, common(x, *dx));
    // dw (fp32) += x^T dy: bf16 inputs, fp32 accumulation into the fp32 gradient.
    gemm(CUBLAS_OP_N, CUBLAS_OP_T, out, in, rows, 1.0f, dy.raw(), out, x.raw(), in, t, 1.0f,
         dw.data(), out, DType::kF32);
    if (db != nullptr) bias_backward(dy, *db);
  }
  void matmul_nt(const Tensor& x, const Tensor& w, Tensor& y) override {
    const int64_t rows = rows_of(x), k = cols_of(x), n = w.dim(0);
    gemm(CUBLAS_OP_T, CUBLAS_OP_N, n, rows, k, 1.0f, w.raw(), k, x.raw(), k, common(x, w), 0.0f,
         y.raw(), n, common(x, y));
  }
  void matmul_nt_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dx,
                          Tensor& dw) override {
    const int64_t rows = rows_of(x), k = cols_of(x), n = w.dim(0);
    const DType t = common(x, w);
    common(x, dy);
    gemm(CUBLAS_OP_N, CUBLAS_OP_N, k, rows, n, 1.0f, w.raw(), k, dy.raw(), n, t, 0.0f, dx.raw(), k,
         common(x, dx));
    gemm(CUBLAS_OP_N, CUBLAS_OP_T, k, n, rows, 1.0f, x.raw(), k, dy.raw(), n, t, 1.0f, dw.data(), k,
         DType::kF32);
  }
  void layernorm(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& y, Tensor& mean,
                 Tensor& rstd) override {
    norm_forward<true>(x, gamma, &beta, y, &mean, rstd);
  }
  void layernorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& mean,
                          const Tensor& rstd, const Tensor& dy, Tensor& dx, Tensor& dgamma,
                          Tensor& dbeta) override {
    norm_backward<true>(x, gamma, &mean, rstd, dy, dx, dgamma, &dbeta);
  }
  void rmsnorm(const Tensor& x, const Tensor& gamma, Tensor& y, Tensor& rstd) override {
    norm_forward<false>(x, gamma, nullptr, y, nullptr, rstd);
  }
  void rmsnorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& rstd, const Tensor& dy,
                        Tensor& dx, Tensor& dgamma) override {
    norm_backward<false>(x, gamma, nullptr, rstd, dy, dx, dgamma, nullptr);
  }
  void rope(Tensor& qkv, const QkvLayout& l, float base, bool inverse) override {
    l.check(qkv);
    SEXTANT_CHECK(l.positions == nullptr,
                  "the CUDA rope rotates rows by their index in the sequence only");
    const int64_t rows = rows_of(qkv), blocks = l.heads + l.kv_heads;
    const float2* table = rope_table(l.seq, l.head_dim, base);
    const int64_t n = rows * blocks * (l.head_dim / 2);
    if (n == 0) return;
    dispatch(qkv, [&](auto tag) {
      using T = decltype(tag);
      rope_kernel<T><<<blocks_for(n), kThreads>>>(ptr<T>(qkv), table, rows, blocks, l.head_dim,
                                                  l.width(), l.seq, inverse ? -1.0f : 1.0f);
    });
    CUDA_CHECK(cudaGetLastError());
  }
  void gelu(const Tensor& x, Tensor& y) override {
    dispatch(x, [&](auto tag) {
      using T = decltype(tag);
      cuda_elementwise::map(ptr<T>(y), ptr<T>(x), static_cast<const T*>(nullptr), x.numel(),
                            cuda_elementwise::Gelu{});
    });
  }
  void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) override {
    dispatch(x, [&](auto tag) {
      using T = decltype(tag);
      cuda_elementwise::map(ptr<T>(dx), ptr<T>(x), ptr<T>(dy), x.numel(),
                            cuda_elementwise::GeluBackward{});
    });
  }
  void relu(const Tensor& x, Tensor& y) override {
    dispatch(x, [&](auto tag) {
      using T = decltype(tag);
      cuda_elementwise::map(ptr<T>(y), ptr<T>(x), static_cast<const T*>(nullptr), x.numel(),
                            cuda_elementwise::Relu{});
    });
  }
  void relu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) override {
    dispatch(x, [&](auto tag) {
      using T = decltype(tag);
      cuda_elementwise::map(ptr<T>(dx), ptr<T>(x), ptr<T>(dy), x.numel(),
                            cuda_elementwise::ReluBackward{});
    });
  }
  void swiglu(const Tensor& x, Tensor& y) override {
    const int64_t rows = rows_of(x), f = cols_of(x) / 2;
    dispatch(x, [&](auto tag) {
      using T = decltype(tag);
      swiglu_kernel<T><<<blocks_for(rows * f), kThreads>>>(ptr<T>(x), ptr<T>(y), rows, f);
    });
  }
  void swiglu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) override {
    const int64_t rows = rows_of(x), f = cols_of(x) / 2;
    dispatch(x, [&](auto tag) {
      using T = decltype(tag);
      swiglu_backward_kernel<T>
          <<<blocks_for(rows * f), kThreads>>>(ptr<T>(x), ptr<T>(dy), ptr<T>(dx), rows, f);
    });
  }
  void bias_add(Tensor& y, const Tensor& b) override {
    dispatch(y, [&](auto tag) {
      using T = decltype(tag);
      cuda_elementwise::bias_add(ptr<T>(y), ptr<T>(b), rows_of(y), cols_of(y));
    });
  }
  void bias_backward(const Tensor& dy, Tensor& db) override {
    const int64_t rows = rows_of(dy), cols = cols_of(dy);
    if (rows == 0 || cols == 0) return;
    // Enough row chunks to fill the GPU (with the column tiles), at least 64 rows each.
    const int64_t col_tiles = (cols + kColTile - 1) / kColTile;
    const int64_t chunks =
        std::clamp<int64_t>(kMaxReductionBlocks / col_tiles, 1, (rows + 63) / 64);
    const int64_t rows_per_block = (rows + chunks - 1) / chunks;
    dispatch(dy, [&](auto tag) {
      using T = decltype(tag);
      bias_backward_kernel<T>
          <<<dim3(static_cast<unsigned>(col_tiles), static_cast<unsigned>(chunks)),
             dim3(kColTile, kRowLanes)>>>(ptr<T>(dy), db.data(), rows, cols, rows_per_block);
    });
  }
  void add(const Tensor& a, const Tensor& b, Tensor& y) override {
    dispatch(a, [&](auto tag) {
      using T = decltype(tag);
      cuda_elementwise::map(ptr<T>(y), ptr<T>(a), ptr<T>(b), a.numel(), cuda_elementwise::Add{});
    });
  }
  void scale(Tensor& x, float factor) override {
    dispatch(x, [&](auto tag) {
      using T = decltype(tag);
      cuda_elementwise::map(ptr<T>(x), ptr<T>(x), static_cast<const T*>(nullptr), x.numel(),
                            cuda_elementwise::Scale{factor});
    });
  }

  // The attention GEMMs run batched over heads. q head h = g * group + j uses kv head g: for each
  // j, one strided-batched call covers the kv heads g (q, scores and out heads at stride group,
  // kv heads at stride 1); multi-head attention (group 1) is one call per batch element. Gradients
  // of a kv head sum over its group (beta = 1 after the first j).
  void attention_scores(const Tensor& qkv, const QkvLayout& l, Tensor& scores) override {
    l.check(qkv);
    const int64_t d = l.head_dim, w = l.width(), g = l.group(), ss = l.seq * l.seq;
    const float alpha = 1.0f / std::sqrt(static_cast<float>(d));
    const DType t = common(qkv, scores);
    for (int64_t b = 0; b < l.batch; ++b) {
      const int64_t base = b * l.seq * w;
      for (int64_t j = 0; j < g; ++j)
        gemm_batched(CUBLAS_OP_T, CUBLAS_OP_N, l.seq, l.seq, d, alpha, at(qkv, base + l.heads * d),
                     w, d,                                               // k of kv head
                     at(qkv, base + j * d), w, g * d, 0.0f,              // q of head g*group+j
                     at(scores, (b * l.heads + j) * ss), l.seq, g * ss,  // its scores
                     l.kv_heads, t);
    }
  }
  void causal_softmax(Tensor& x, int64_t seq) override {
    dispatch(x, [&](auto tag) {
      using T = decltype(tag);
      causal_softmax_kernel<T><<<static_cast<int>(x.numel() / seq), kThreads>>>(ptr<T>(x), seq);
    });
    CUDA_CHECK(cudaGetLastError());
  }
  void attention_context(const Tensor& probs, const Tensor& qkv, const QkvLayout& l,
                         Tensor& out) override {
    l.check(qkv);
    const int64_t d = l.head_dim, w = l.width(), g = l.group(), ss = l.seq * l.seq;
    const int64_t hd = l.heads * d;
    const DType t = common(qkv, probs);
    common(qkv, out);
    for (int64_t b = 0; b < l.batch; ++b) {
      const int64_t base = b * l.seq * w;
      for (int64_t j = 0; j < g; ++j)
        gemm_batched(CUBLAS_OP_N, CUBLAS_OP_N, d, l.seq, l.seq, 1.0f,
                     at(qkv, base + (l.heads + l.kv_heads) * d), w, d,  // v of kv head
                     at(probs, (b * l.heads + j) * ss), l.seq, g * ss, 0.0f,
                     at(out, b * l.seq * hd + j * d), hd, g * d, l.kv_heads, t);
    }
  }
  void attention_context_backward(const Tensor& probs, const Tensor& qkv, const Tensor& dout,
                                  const QkvLayout& l, Tensor& dprobs, Tensor& dqkv) override {
    l.check(qkv);
    const int64_t d = l.head_dim, w = l.width(), g = l.group(), ss = l.seq * l.seq;
    const int64_t hd = l.heads * d;
    const DType t = common(qkv, probs);
    common(qkv, dout);
    common(qkv, dprobs);
    common(qkv, dqkv);
    for (int64_t b = 0; b < l.batch; ++b) {
      const int64_t base = b * l.seq * w, v = base + (l.heads + l.kv_heads) * d;
      for (int64_t j = 0; j < g; ++j) {
        const int64_t pb = (b * l.heads + j) * ss, ob = b * l.seq * hd + j * d;
        // dprobs = dout v^T
        gemm_batched(CUBLAS_OP_T, CUBLAS_OP_N, l.seq, l.seq, d, 1.0f, at(qkv, v), w, d,
                     at(dout, ob), hd, g * d, 0.0f, at(dprobs, pb), l.seq, g * ss, l.kv_heads, t);
        // dv (+)= probs^T dout
        gemm_batched(CUBLAS_OP_N, CUBLAS_OP_T, d, l.seq, l.seq, 1.0f, at(dout, ob), hd, g * d,
                     at(probs, pb), l.seq, g * ss, j == 0 ? 0.0f : 1.0f, at(dqkv, v), w, d,
                     l.kv_heads, t);
      }
    }
  }
  void causal_softmax_backward(const Tensor& probs, Tensor& grad, int64_t seq) override {
    dispatch(probs, [&](auto tag) {
      using T = decltype(tag);
      causal_softmax_backward_kernel<T>
          <<<static_cast<int>(probs.numel() / seq), kThreads>>>(ptr<T>(probs), ptr<T>(grad), seq);
    });
    CUDA_CHECK(cudaGetLastError());
  }
  void attention_scores_backward(const Tensor& dscores, const Tensor& qkv, const QkvLayout& l,
                                 Tensor& dqkv) override {
    l.check(qkv);
    const int64_t d = l.head_dim, w = l.width(), g = l.group(), ss = l.seq * l.seq;
    const float alpha = 1.0f / std::sqrt(static_cast<float>(d));
    const DType t = common(qkv, dscores);
    common(qkv, dqkv);
    for (int64_t b = 0; b < l.batch; ++b) {
      const int64_t base = b * l.seq * w, k = base + l.heads * d;
      for (int64_t j = 0; j < g; ++j) {
        const int64_t sb = (b * l.heads + j) * ss, q = base + j * d;
        // dq = dS k * alpha; dk (+)= dS^T q * alpha
        gemm_batched(CUBLAS_OP_N, CUBLAS_OP_N, d, l.seq, l.seq, alpha, at(qkv, k), w, d,
                     at(dscores, sb), l.seq, g * ss, 0.0f, at(dqkv, q), w, g * d, l.kv_heads, t);
        gemm_batched(CUBLAS_OP_N, CUBLAS_OP_T, d, l.seq, l.seq, alpha, at(qkv, q), w, g * d,
                     at(dscores, sb), l.seq, g * ss, j == 0 ? 0.0f : 1.0f, at(dqkv, k), w, d,
                     l.kv_heads, t);
      }
    }
  }

  void flash_attention(const Tensor& qkv, const QkvLayout& l, Tensor& out, Tensor& lse) override {
    cuda_flash::forward(qkv, l, out, lse);
  }
  void flash_attention_backward_prep(const Tensor& out, const Tensor& dout, const QkvLayout& l,
                                     Tensor& delta) override {
    cuda_flash::backward_prep(out, dout, l, delta);
  }
  void flash_attention_backward(const Tensor& qkv, const Tensor& dout, const Tensor& lse,
                                const Tensor& delta, const QkvLayout& l, Tensor& dqkv) override {
    cuda_flash::backward(qkv, dout, lse, delta, l, dqkv);
  }

  void embedding(const std::vector<int32_t>& tokens, const Tensor& table, int64_t vocab_begin,
                 Tensor& y) override {
    const int32_t* ids = upload(tokens);
    const int64_t n = static_cast<int64_t>(tokens.size()), h = table.dim(1);
    dispatch(table, [&](auto tag) {
      using T = decltype(tag);
      embedding_kernel<T><<<blocks_for(n * h), kThreads>>>(ids, ptr<T>(table), ptr<T>(y), n, h,
                                                           vocab_begin, table.dim(0));
    });
  }
  void embedding_backward(const std::vector<int32_t>& tokens, const Tensor& dy, int64_t vocab_begin,
                          Tensor& dtable) override {
    const int32_t* ids = upload(tokens);
    const int64_t n = static_cast<int64_t>(tokens.size()), h = dtable.dim(1);
    dispatch(dy, [&](auto tag) {
      using T = decltype(tag);
      embedding_backward_kernel<T><<<blocks_for(n * h), kThreads>>>(
          ids, ptr<T>(dy), dtable.data(), n, h, vocab_begin, dtable.dim(0));
    });
  }
  void add_positions(const Tensor& pos, int64_t row_begin, int64_t seq, Tensor& y) override {
    dispatch(y, [&](auto tag) {
      using T = decltype(tag);
      positions_kernel<T><<<blocks_for(y.numel()), kThreads>>>(ptr<T>(pos), ptr<T>(y), rows_of(y),
                                                               cols_of(y), row_begin, seq);
    });
  }
  void add_positions_backward(const Tensor& dy, int64_t row_begin, int64_t seq,
                              Tensor& dpos) override {
    dispatch(dy, [&](auto tag) {
      using T = decltype(tag);
      positions_backward_kernel<T><<<blocks_for(dy.numel()), kThreads>>>(
          ptr<T>(dy), dpos.data(), rows_of(dy), cols_of(dy), row_begin, seq);
    });
  }
  void softmax_stats(const Tensor& logits, const std::vector<int32_t>& targets, int64_t vocab_begin,
                     int64_t valid, std::vector<float>& max, std::vector<float>& sum,
                     std::vector<float>& target) override {
    const int64_t rows = rows_of(logits);
    SEXTANT_CHECK(valid >= 0 && valid <= cols_of(logits), "softmax_stats: {} valid of {} columns",
                  valid, cols_of(logits));
    const int32_t* t = upload(targets);
    float* dmax = rows_scratch(rows, 0);
    float* dsum = rows_scratch(rows, 1);
    float* dtarget = rows_scratch(rows, 2);
    dispatch(logits, [&](auto tag) {
      using T = decltype(tag);
      const bool packed = cuda_elementwise::aligned16(logits.raw()) &&
                          cols_of(logits) % cuda_elementwise::Pack<T>::kSize == 0;
      softmax_stats_kernel<T><<<static_cast<int>(rows), kThreads>>>(
          ptr<T>(logits), t, dmax, dsum, dtarget, cols_of(logits), valid, vocab_begin, packed);
    });
    CUDA_CHECK(cudaGetLastError());
    download(dmax, rows, max);
    download(dsum, rows, sum);
    download(dtarget, rows, target);
  }
  void cross_entropy_backward(const Tensor& logits, const std::vector<int32_t>& targets,
                              int64_t vocab_begin, int64_t valid, const std::vector<float>& max,
                              const std::vector<float>& sum, float scale_factor,
                              Tensor& dlogits) override {
    const int64_t rows = rows_of(logits);
    SEXTANT_CHECK(valid >= 0 && valid <= cols_of(logits),
                  "cross_entropy_backward: {} valid of {} columns", valid, cols_of(logits));
    const int32_t* t = upload(targets);
    float* dmax = rows_scratch(rows, 0);
    float* dsum = rows_scratch(rows, 1);
    CUDA_CHECK(cudaMemcpy(dmax, max.data(), max.size() * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dsum, sum.data(), sum.size() * sizeof(float), cudaMemcpyHostToDevice));
    dispatch(logits, [&](auto tag) {
      using T = decltype(tag);
      constexpr int kSize = cuda_elementwise::Pack<T>::kSize;
      const bool packed = cuda_elementwise::aligned16(logits.raw()) &&
                          cuda_elementwise::aligned16(dlogits.raw()) &&
                          cols_of(logits) % kSize == 0;
      const auto launch = [&](auto kernel, int64_t threads) {
        kernel<<<blocks_for(threads), kThreads>>>(ptr<T>(logits), t, dmax, dsum, scale_factor,
                                                  ptr<T>(dlogits), rows, cols_of(logits), valid,
                                                  vocab_begin);
      };
      if (packed)
        launch(cross_entropy_backward_kernel<true, T>, logits.numel() / kSize);
      else
        launch(cross_entropy_backward_kernel<false, T>, logits.numel());
    });
  }
  double sum_squares(const Tensor& x) override {
    CUDA_CHECK(cudaMemset(scalar_, 0, sizeof(double)));
    const int blocks = std::min(1024, std::max(1, blocks_for(x.numel())));
    sum_squares_kernel<<<blocks, kThreads>>>(x.data(), x.numel(), scalar_);
    double s = 0;
    CUDA_CHECK(cudaMemcpy(&s, scalar_, sizeof(double), cudaMemcpyDeviceToHost));
    return s;
  }
  double sum_squares_spans(const Tensor& flat,
                           const std::vector<std::pair<int64_t, int64_t>>& spans) override {
    std::vector<AdamwSpan> as;
    for (auto [offset, count] : spans) as.push_back({offset, count, 0.0f});
    const std::vector<Tile> tiles = tiles_of(as);
    if (tiles.empty()) return 0.0;
    Tensor table = upload_tiles(tiles);
    CUDA_CHECK(cudaMemset(scalar_, 0, sizeof(double)));
    sum_squares_tiles_kernel<<<static_cast<unsigned>(tiles.size()), kThreads>>>(
        flat.data(), static_cast<const Tile*>(table.raw()), scalar_);
    CUDA_CHECK(cudaGetLastError());
    double s = 0;
    CUDA_CHECK(cudaMemcpy(&s, scalar_, sizeof(double), cudaMemcpyDeviceToHost));
    return s;
  }
  void adamw_spans(Tensor& params, const Tensor& grads, Tensor& m, Tensor& v,
                   const std::vector<AdamwSpan>& spans, int64_t step, float lr, float beta1,
                   float beta2, float eps, float grad_scale) override {
    const std::vector<Tile> tiles = tiles_of(spans);
    if (tiles.empty()) return;
    Tensor table = upload_tiles(tiles);
    const float bc1 = 1.0f - std::pow(beta1, static_cast<float>(step));
    const float bc2 = 1.0f - std::pow(beta2, static_cast<float>(step));
    adamw_tiles_kernel<<<static_cast<unsigned>(tiles.size()), kThreads>>>(
        params.data(), grads.data(), m.data(), v.data(), static_cast<const Tile*>(table.raw()), lr,
        beta1, beta2, eps, grad_scale, lr / bc1, std::sqrt(bc2));
    CUDA_CHECK(cudaGetLastError());
  }
  void adamw(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, int64_t step, float lr,
             float beta1, float beta2, float eps, float weight_decay, float grad_scale) override {
    const float bc1 = 1.0f - std::pow(beta1, static_cast<float>(step));
    const float bc2 = 1.0f - std::pow(beta2, static_cast<float>(step));
    adamw_kernel<<<blocks_for(param.numel()), kThreads>>>(
        param.data(), grad.data(), m.data(), v.data(), param.numel(), lr, beta1, beta2, eps,
        weight_decay, grad_scale, lr / bc1, std::sqrt(bc2));
    CUDA_CHECK(cudaGetLastError());
  }

  // ConvolutionKernels: convolution.cu's.
  void convolution(const Tensor& x, const Tensor& w, const Tensor* bias, int64_t stride,
                   Tensor& y) override {
    conv_->convolution(x, w, bias, stride, y);
  }
  void convolution_backward(const Tensor& x, const Tensor& w, const Tensor& dy, int64_t stride,
                            Tensor* dx, Tensor& dw, Tensor* db) override {
    conv_->convolution_backward(x, w, dy, stride, dx, dw, db);
  }
  void transposed_convolution(const Tensor& x, const Tensor& w, int64_t stride,
                              Tensor& y) override {
    conv_->transposed_convolution(x, w, stride, y);
  }
  void transposed_convolution_backward(const Tensor& x, const Tensor& w, const Tensor& dy,
                                       int64_t stride, Tensor* dx, Tensor& dw) override {
    conv_->transposed_convolution_backward(x, w, dy, stride, dx, dw);
  }
  void crop_concat(const Tensor& kept, const Tensor& x, Tensor& y) override {
    conv_->crop_concat(kept, x, y);
  }
  void crop_concat_backward(const Tensor& dy, Tensor& dkept, Tensor& dx) override {
    conv_->crop_concat_backward(dy, dkept, dx);
  }
  double pixel_cross_entropy(const Tensor& logits, const std::vector<int32_t>& labels, float scale,
                             Tensor* dlogits, int64_t map_pixels) override {
    return conv_->pixel_cross_entropy(logits, labels, scale, dlogits, map_pixels);
  }
  void add_channel_bias(Tensor& y, const Tensor& bias) override {
    conv_->add_channel_bias(y, bias);
  }
  void channel_bias_backward(const Tensor& dy, Tensor& db) override {
    conv_->channel_bias_backward(dy, db);
  }
  void channel_sums(const Tensor& x, std::vector<double>& sums) override {
    conv_->channel_sums(x, sums);
  }
  void batch_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                  const std::vector<double>& mean, const std::vector<double>& rstd,
                  Tensor& y) override {
    conv_->batch_norm(x, gamma, beta, mean, rstd, y);
  }
  void batch_norm_backward_sums(const Tensor& x, const Tensor& dy, const std::vector<double>& mean,
                                const std::vector<double>& rstd,
                                std::vector<double>& sums) override {
    conv_->batch_norm_backward_sums(x, dy, mean, rstd, sums);
  }
  void batch_norm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                           const std::vector<double>& mean, const std::vector<double>& rstd,
                           const std::vector<double>& sums, int64_t count, Tensor& dx) override {
    conv_->batch_norm_backward(x, dy, gamma, mean, rstd, sums, count, dx);
  }
  void batch_norm_whole(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& y,
                        Tensor& stats) override {
    conv_->batch_norm_whole(x, gamma, beta, y, stats);
  }
  void batch_norm_whole_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                                 const Tensor& stats, Tensor& dx, Tensor& dgamma,
                                 Tensor& dbeta) override {
    conv_->batch_norm_whole_backward(x, dy, gamma, stats, dx, dgamma, dbeta);
  }
  void max_pool(const Tensor& x, int64_t kernel, int64_t stride, Tensor& y) override {
    conv_->max_pool(x, kernel, stride, y);
  }
  void max_pool_backward(const Tensor& x, const Tensor& y, const Tensor& dy, int64_t kernel,
                         int64_t stride, Tensor& dx) override {
    conv_->max_pool_backward(x, y, dy, kernel, stride, dx);
  }
  void avg_pool(const Tensor& x, int64_t kernel, int64_t stride, Tensor& y) override {
    conv_->avg_pool(x, kernel, stride, y);
  }
  void avg_pool_backward(const Tensor& dy, int64_t kernel, int64_t stride, Tensor& dx) override {
    conv_->avg_pool_backward(dy, kernel, stride, dx);
  }
  void adaptive_avg_pool(const Tensor& x, const spec::MapBlock& block, const spec::MapExtent& map,
                         Tensor& y) override {
    conv_->adaptive_avg_pool(x, block, map, y);
  }
  void adaptive_avg_pool_backward(const Tensor& dy, const spec::MapBlock& block,
                                  const spec::MapExtent& map, Tensor& dx) override {
    conv_->adaptive_avg_pool_backward(dy, block, map, dx);
  }

 private:
  // Layer norm (kCentered: beta and mean given) or RMS norm over the rows of x
  // (cuda/norm_kernels.cuh).
  template <bool kCentered>
  void norm_forward(const Tensor& x, const Tensor& gamma, const Tensor* beta, Tensor& y,
                    Tensor* mean, Tensor& rstd) {
    using cuda_elementwise::aligned16;
    using cuda_norm::kNormRows;
    const int64_t rows = rows_of(x), cols = cols_of(x);
    if (rows == 0 || cols == 0) return;
    dispatch(x, [&](auto tag) {
      using T = decltype(tag);
      const bool packed = cols % cuda_elementwise::Pack<T>::kSize == 0 && aligned16(x.raw()) &&
                          aligned16(gamma.raw()) && (!beta || aligned16(beta->raw())) &&
                          aligned16(y.raw());
      const auto blocks = static_cast<unsigned>((rows + kNormRows - 1) / kNormRows);
      const auto launch = [&](auto kernel) {
        kernel<<<blocks, 32 * kNormRows>>>(ptr<T>(x), ptr<T>(gamma), beta ? ptr<T>(*beta) : nullptr,
                                           ptr<T>(y), mean ? mean->data() : nullptr, rstd.data(),
                                           rows, cols);
      };
      if (packed)
        launch(cuda_norm::norm_kernel<kCentered, true, T>);
      else
        launch(cuda_norm::norm_kernel<kCentered, false, T>);
    });
    CUDA_CHECK(cudaGetLastError());
  }
  template <bool kCentered>
  void norm_backward(const Tensor& x, const Tensor& gamma, const Tensor* mean, const Tensor& rstd,
                     const Tensor& dy, Tensor& dx, Tensor& dgamma, Tensor* dbeta) {
    using cuda_elementwise::aligned16;
    const int64_t rows = rows_of(x), cols = cols_of(x);
    if (rows == 0 || cols == 0) return;
    const cuda_norm::NormBackwardLaunch shape =
        cuda_norm::norm_backward_launch(rows, cols, kCentered, sms_, max_shared_bytes_);
    dispatch(x, [&](auto tag) {
      using T = decltype(tag);
      const bool packed = cols % cuda_elementwise::Pack<T>::kSize == 0 && aligned16(x.raw()) &&
                          aligned16(gamma.raw()) && aligned16(dy.raw()) && aligned16(dx.raw());
      const auto launch = [&](auto kernel) {
        if (shape.shared_bytes > 48 * 1024)  // above the default: opt in
          CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(shape.shared_bytes)));
        kernel<<<shape.blocks, shape.threads, shape.shared_bytes>>>(
            ptr<T>(x), ptr<T>(gamma), mean ? mean->data() : nullptr, rstd.data(), ptr<T>(dy),
            ptr<T>(dx), dgamma.data(), dbeta ? dbeta->data() : nullptr, rows, cols);
      };
      if (packed)
        launch(cuda_norm::norm_backward_kernel<kCentered, true, T>);
      else
        launch(cuda_norm::norm_backward_kernel<kCentered, false, T>);
    });
    CUDA_CHECK(cudaGetLastError());
  }
  // Spans cut into tiles of at most kTile elements (one block each), and their device copy.
  static std::vector<Tile> tiles_of(const std::vector<AdamwSpan>& spans) {
    std::vector<Tile> tiles;
    for (const AdamwSpan& s : spans)
      for (int64_t o = 0; o < s.count; o += kTile)
        tiles.push_back({s.offset + o, std::min(kTile, s.count - o), s.weight_decay});
    return tiles;
  }
  Tensor upload_tiles(const std::vector<Tile>& tiles) {
    static_assert(sizeof(Tile) % 4 == 0);
    Tensor table = empty({static_cast<int64_t>(tiles.size() * sizeof(Tile) / 4)});
    CUDA_CHECK(
        cudaMemcpy(table.raw(), tiles.data(), tiles.size() * sizeof(Tile), cudaMemcpyHostToDevice));
    return table;
  }
  // cos and sin of every (position, pair) angle, computed in double on the host (as the CPU
  // backend does) and kept on the device per (seq, head_dim, base).
  const float2* rope_table(int64_t seq, int64_t d, float base) {
    const auto key = std::make_tuple(seq, d, base);
    auto it = rope_tables_.find(key);
    if (it != rope_tables_.end()) return it->second;
    const int64_t half = d / 2;
    std::vector<float2> host(static_cast<size_t>(seq * half));
    for (int64_t p = 0; p < seq; ++p)
      for (int64_t i = 0; i < half; ++i) {
        const double angle = static_cast<double>(p) *
                             std::pow(static_cast<double>(base), -2.0 * static_cast<double>(i) / d);
        host[static_cast<size_t>(p * half + i)] =
            make_float2(static_cast<float>(std::cos(angle)), static_cast<float>(std::sin(angle)));
      }
    float2* dev = nullptr;
    CUDA_CHECK(cudaMalloc(&dev, host.size() * sizeof(float2)));
    CUDA_CHECK(cudaMemcpy(dev, host.data(), host.size() * sizeof(float2), cudaMemcpyHostToDevice));
    rope_tables_[key] = dev;
    return dev;
  }
  const int32_t* upload(const std::vector<int32_t>& v) {
    if (ids_capacity_ < v.size()) {
      cudaFree(ids_);
      CUDA_CHECK(cudaMalloc(&ids_, v.size() * sizeof(int32_t)));
      ids_capacity_ = v.size();
    }
    CUDA_CHECK(cudaMemcpy(ids_, v.data(), v.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
    return ids_;
  }
  float* rows_scratch(int64_t rows, int which) {
    std::vector<float*>& bufs = scratch_;
    if (bufs.size() < 3) bufs.assign(3, nullptr);
    if (scratch_rows_ < rows) {
      for (float*& b : bufs) {
        cudaFree(b);
        CUDA_CHECK(cudaMalloc(&b, static_cast<size_t>(rows) * sizeof(float)));
      }
      scratch_rows_ = rows;
    }
    return bufs[static_cast<size_t>(which)];
  }
  void download(const float* d, int64_t n, std::vector<float>& out) {
    out.resize(static_cast<size_t>(n));
    CUDA_CHECK(cudaMemcpy(out.data(), d, out.size() * sizeof(float), cudaMemcpyDeviceToHost));
  }

  int device_;
  int sms_ = 0;                  // streaming multiprocessors
  size_t max_shared_bytes_ = 0;  // shared memory a block may opt in to
  Precision precision_;
  BlockPool pool_;
  cublasHandle_t blas_ = nullptr;
  std::unique_ptr<LtGemm> lt_;  // GEMMs with a fused bias
  std::unique_ptr<ConvolutionKernels> conv_;
  double* scalar_ = nullptr;
  int32_t* ids_ = nullptr;
  size_t ids_capacity_ = 0;
  std::vector<float*> scratch_;
  int64_t scratch_rows_ = 0;
  std::map<std::tuple<int64_t, int64_t, float>, float2*> rope_tables_;
};

}  // namespace

std::unique_ptr<Backend> cuda_module::make_backend(int device, Precision precision) {
  if (cuda_module::device_count() == 0)
    throw std::runtime_error("the cuda backend needs a GPU: " + cuda_module::unavailable_reason());
  return std::make_unique<CudaBackend>(device, precision);
}

}  // namespace sextant::exec
