// CUDA kernels and cuBLAS calls behind the Backend interface. Row-major tensors are passed to
// column-major cuBLAS as their transposes: y = x w (row-major) is y^T = w^T x^T (column-major).
// Reductions that feed the loss (row max, sum of exponentials) run one block per row.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cmath>
#include <stdexcept>
#include <vector>

#include "sextant/exec/cuda_backend.hpp"
#include "sextant/exec/cuda_check.hpp"

namespace sextant::exec {

namespace {

constexpr int kThreads = 256;
constexpr float kGeluC = 0.7978845608028654f;
constexpr float kLayerNormEps = 1e-5f;

int blocks_for(int64_t n) {
  return static_cast<int>((n + kThreads - 1) / kThreads);
}
int64_t rows_of(const Tensor& t) {
  return t.numel() / t.shape().back();
}
int64_t cols_of(const Tensor& t) {
  return t.shape().back();
}

__global__ void fill_kernel(float* x, int64_t n, float v) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) x[i] = v;
}
__global__ void add_kernel(const float* a, const float* b, float* y, int64_t n) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = a[i] + b[i];
}
__global__ void scale_kernel(float* x, int64_t n, float f) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) x[i] *= f;
}
__global__ void bias_add_kernel(float* y, const float* b, int64_t rows, int64_t cols) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < rows * cols) y[i] += b[i % cols];
}
// One thread per column: deterministic column sums (no atomics).
__global__ void bias_backward_kernel(const float* dy, float* db, int64_t rows, int64_t cols) {
  int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= cols) return;
  float s = 0;
  for (int64_t r = 0; r < rows; ++r) s += dy[r * cols + c];
  db[c] += s;
}
__global__ void gelu_kernel(const float* x, float* y, int64_t n) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  float v = x[i];
  y[i] = 0.5f * v * (1.0f + tanhf(kGeluC * (v + 0.044715f * v * v * v)));
}
__global__ void gelu_backward_kernel(const float* x, const float* dy, float* dx, int64_t n) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  float v = x[i];
  float t = tanhf(kGeluC * (v + 0.044715f * v * v * v));
  float du = kGeluC * (1.0f + 3.0f * 0.044715f * v * v);
  dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
}
__global__ void relu_kernel(const float* x, float* y, int64_t n) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = fmaxf(0.0f, x[i]);
}
__global__ void relu_backward_kernel(const float* x, const float* dy, float* dx, int64_t n) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) dx[i] = x[i] > 0 ? dy[i] : 0.0f;
}
__global__ void swiglu_kernel(const float* x, float* y, int64_t rows, int64_t f) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * f) return;
  int64_t r = i / f, j = i % f;
  float g = x[r * 2 * f + j], u = x[r * 2 * f + f + j];
  y[i] = g / (1.0f + expf(-g)) * u;
}
__global__ void swiglu_backward_kernel(const float* x, const float* dy, float* dx, int64_t rows,
                                       int64_t f) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * f) return;
  int64_t r = i / f, j = i % f;
  float g = x[r * 2 * f + j], u = x[r * 2 * f + f + j];
  float sig = 1.0f / (1.0f + expf(-g));
  dx[r * 2 * f + f + j] = dy[i] * g * sig;
  dx[r * 2 * f + j] = dy[i] * u * (sig * (1.0f + g * (1.0f - sig)));
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

// One block per row.
__global__ void layernorm_kernel(const float* x, const float* g, const float* b, float* y,
                                 float* mean, float* rstd, int64_t cols) {
  const float* xr = x + blockIdx.x * cols;
  float s = 0;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) s += xr[j];
  const float mu = block_sum(s) / static_cast<float>(cols);
  float ss = 0;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) ss += (xr[j] - mu) * (xr[j] - mu);
  const float r = rsqrtf(block_sum(ss) / static_cast<float>(cols) + kLayerNormEps);
  float* yr = y + blockIdx.x * cols;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) yr[j] = (xr[j] - mu) * r * g[j] + b[j];
  if (threadIdx.x == 0) {
    mean[blockIdx.x] = mu;
    rstd[blockIdx.x] = r;
  }
}
__global__ void layernorm_backward_kernel(const float* x, const float* g, const float* mean,
                                          const float* rstd, const float* dy, float* dx,
                                          float* dgamma, float* dbeta, int64_t cols) {
  const int64_t row = blockIdx.x;
  const float* xr = x + row * cols;
  const float* dyr = dy + row * cols;
  const float mu = mean[row], r = rstd[row];
  float s1 = 0, s2 = 0;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const float xhat = (xr[j] - mu) * r;
    const float dxhat = dyr[j] * g[j];
    s1 += dxhat;
    s2 += dxhat * xhat;
    atomicAdd(&dgamma[j], dyr[j] * xhat);
    atomicAdd(&dbeta[j], dyr[j]);
  }
  const float m1 = block_sum(s1) / static_cast<float>(cols);
  const float m2 = block_sum(s2) / static_cast<float>(cols);
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const float xhat = (xr[j] - mu) * r;
    dx[row * cols + j] = r * (dyr[j] * g[j] - m1 - xhat * m2);
  }
}
// Causal softmax in place over rows of seq; one block per row of every (batch, head) block.
__global__ void causal_softmax_kernel(float* x, int64_t seq) {
  const int64_t row = blockIdx.x;
  const int64_t i = row % seq;
  float* xr = x + row * seq;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) m = fmaxf(m, xr[j]);
  m = block_max(m);
  float s = 0;
  for (int64_t j = threadIdx.x; j < seq; j += blockDim.x) {
    float e = j <= i ? expf(xr[j] - m) : 0.0f;
    xr[j] = e;
    s += e;
  }
  const float inv = 1.0f / block_sum(s);
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) xr[j] *= inv;
}
__global__ void causal_softmax_backward_kernel(const float* p, float* g, int64_t seq) {
  const int64_t row = blockIdx.x;
  const int64_t i = row % seq;
  const float* pr = p + row * seq;
  float* gr = g + row * seq;
  float dot = 0;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) dot += gr[j] * pr[j];
  dot = block_sum(dot);
  for (int64_t j = threadIdx.x; j < seq; j += blockDim.x)
    gr[j] = j <= i ? pr[j] * (gr[j] - dot) : 0.0f;
}
__global__ void embedding_kernel(const int32_t* tokens, const float* table, float* y, int64_t n,
                                 int64_t h, int64_t vocab_begin, int64_t shard) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n * h) return;
  int64_t t = i / h, j = i % h;
  int64_t row = tokens[t] - vocab_begin;
  y[i] = row >= 0 && row < shard ? table[row * h + j] : 0.0f;
}
__global__ void embedding_backward_kernel(const int32_t* tokens, const float* dy, float* dtable,
                                          int64_t n, int64_t h, int64_t vocab_begin,
                                          int64_t shard) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n * h) return;
  int64_t t = i / h, j = i % h;
  int64_t row = tokens[t] - vocab_begin;
  if (row >= 0 && row < shard) atomicAdd(&dtable[row * h + j], dy[i]);
}
__global__ void positions_kernel(const float* pos, float* y, int64_t rows, int64_t h,
                                 int64_t row_begin, int64_t seq) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * h) return;
  y[i] += pos[((row_begin + i / h) % seq) * h + i % h];
}
__global__ void positions_backward_kernel(const float* dy, float* dpos, int64_t rows, int64_t h,
                                          int64_t row_begin, int64_t seq) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * h) return;
  atomicAdd(&dpos[((row_begin + i / h) % seq) * h + i % h], dy[i]);
}
__global__ void row_max_kernel(const float* x, float* out, int64_t cols) {
  const float* xr = x + blockIdx.x * cols;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, xr[j]);
  m = block_max(m);
  if (threadIdx.x == 0) out[blockIdx.x] = m;
}
__global__ void row_sum_exp_kernel(const float* x, const float* max, float* out, int64_t cols) {
  const float* xr = x + blockIdx.x * cols;
  float s = 0;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) s += expf(xr[j] - max[blockIdx.x]);
  s = block_sum(s);
  if (threadIdx.x == 0) out[blockIdx.x] = s;
}
__global__ void target_logits_kernel(const float* x, const int32_t* targets, float* out,
                                     int64_t rows, int64_t cols, int64_t vocab_begin) {
  int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (r >= rows) return;
  int64_t c = targets[r] - vocab_begin;
  out[r] = c >= 0 && c < cols ? x[r * cols + c] : 0.0f;
}
__global__ void cross_entropy_backward_kernel(const float* x, const int32_t* targets,
                                              const float* max, const float* sum, float scale,
                                              float* dx, int64_t rows, int64_t cols,
                                              int64_t vocab_begin) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * cols) return;
  int64_t r = i / cols, c = i % cols;
  float p = expf(x[i] - max[r]) / sum[r];
  dx[i] = (p - (c == targets[r] - vocab_begin ? 1.0f : 0.0f)) * scale;
}
__global__ void sum_squares_kernel(const float* x, int64_t n, double* out) {
  float s = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    s += x[i] * x[i];
  s = block_sum(s);
  if (threadIdx.x == 0) atomicAdd(out, static_cast<double>(s));
}
// torch.optim.AdamW, fused: decoupled decay, moments, bias-corrected step.
__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, int64_t n, float lr,
                             float beta1, float beta2, float eps, float wd, float grad_scale,
                             float step_size, float bc2_sqrt) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float gi = g[i] * grad_scale;
  float pi = p[i] * (1.0f - lr * wd);
  const float mi = beta1 * m[i] + (1.0f - beta1) * gi;
  const float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
  m[i] = mi;
  v[i] = vi;
  p[i] = pi - step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
}

class CudaBackend : public Backend {
 public:
  CudaBackend(int device, GemmPrecision precision) : device_(device), precision_(precision) {
    CUDA_CHECK(cudaSetDevice(device));
    CUBLAS_CHECK(cublasCreate(&blas_));
    CUDA_CHECK(cudaMalloc(&scalar_, sizeof(double)));
  }
  ~CudaBackend() override {
    cudaFree(scalar_);
    cublasDestroy(blas_);
  }
  std::string name() const override {
    return std::string("cuda-") + gemm_precision_name(precision_);
  }

  float* allocate(int64_t elements) override {
    void* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, static_cast<size_t>(elements) * sizeof(float)));
    return static_cast<float*>(p);
  }
  void release(float* data) override { cudaFree(data); }
  void fill(Tensor& t, float value) override {
    if (t.numel() == 0) return;
    fill_kernel<<<blocks_for(t.numel()), kThreads>>>(t.data(), t.numel(), value);
    CUDA_CHECK(cudaGetLastError());
  }
  void copy(const Tensor& from, Tensor& to) override {
    CUDA_CHECK(cudaMemcpy(to.data(), from.data(), static_cast<size_t>(from.numel()) * sizeof(float),
                          cudaMemcpyDeviceToDevice));
  }
  void to_host(const Tensor& t, std::vector<float>& out) override {
    out.resize(static_cast<size_t>(t.numel()));
    CUDA_CHECK(
        cudaMemcpy(out.data(), t.data(), out.size() * sizeof(float), cudaMemcpyDeviceToHost));
  }
  void from_host(const std::vector<float>& in, Tensor& t) override {
    CUDA_CHECK(cudaMemcpy(t.data(), in.data(), in.size() * sizeof(float), cudaMemcpyHostToDevice));
  }
  void synchronize() override { CUDA_CHECK(cudaDeviceSynchronize()); }

  // C (col-major m x n, ldc) = alpha op(A) op(B) + beta C.
  void gemm(cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
            float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
            float* c, int64_t ldc) {
    cublasComputeType_t compute = precision_ == GemmPrecision::kBf16 ? CUBLAS_COMPUTE_32F_FAST_16BF
                                  : precision_ == GemmPrecision::kTf32
                                      ? CUBLAS_COMPUTE_32F_FAST_TF32
                                      : CUBLAS_COMPUTE_32F;
    CUBLAS_CHECK(cublasGemmEx(blas_, ta, tb, static_cast<int>(m), static_cast<int>(n),
                              static_cast<int>(k), &alpha, a, CUDA_R_32F, static_cast<int>(lda), b,
                              CUDA_R_32F, static_cast<int>(ldb), &beta, c, CUDA_R_32F,
                              static_cast<int>(ldc), compute, CUBLAS_GEMM_DEFAULT));
  }
  void gemm_batched(cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
                    float alpha, const float* a, int64_t lda, int64_t sa, const float* b,
                    int64_t ldb, int64_t sb, float beta, float* c, int64_t ldc, int64_t sc,
                    int64_t count) {
    cublasComputeType_t compute = precision_ == GemmPrecision::kBf16 ? CUBLAS_COMPUTE_32F_FAST_16BF
                                  : precision_ == GemmPrecision::kTf32
                                      ? CUBLAS_COMPUTE_32F_FAST_TF32
                                      : CUBLAS_COMPUTE_32F;
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        blas_, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), &alpha, a,
        CUDA_R_32F, static_cast<int>(lda), sa, b, CUDA_R_32F, static_cast<int>(ldb), sb, &beta, c,
        CUDA_R_32F, static_cast<int>(ldc), sc, static_cast<int>(count), compute,
        CUBLAS_GEMM_DEFAULT));
  }

  void matmul(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y,
              bool accumulate) override {
    const int64_t rows = rows_of(x), in = cols_of(x), out = cols_of(w);
    gemm(CUBLAS_OP_N, CUBLAS_OP_N, out, rows, in, 1.0f, w.data(), out, x.data(), in,
         accumulate ? 1.0f : 0.0f, y.data(), out);
    if (bias != nullptr) bias_add(y, *bias);
  }
  void matmul_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor& dw,
                       Tensor* db, bool accumulate_dx) override {
    const int64_t rows = rows_of(x), in = cols_of(x), out = cols_of(w);
    if (dx != nullptr)
      gemm(CUBLAS_OP_T, CUBLAS_OP_N, in, rows, out, 1.0f, w.data(), out, dy.data(), out,
           accumulate_dx ? 1.0f : 0.0f, dx->data(), in);
    gemm(CUBLAS_OP_N, CUBLAS_OP_T, out, in, rows, 1.0f, dy.data(), out, x.data(), in, 1.0f,
         dw.data(), out);
    if (db != nullptr) bias_backward(dy, *db);
  }
  void matmul_nt(const Tensor& x, const Tensor& w, Tensor& y) override {
    const int64_t rows = rows_of(x), k = cols_of(x), n = w.dim(0);
    gemm(CUBLAS_OP_T, CUBLAS_OP_N, n, rows, k, 1.0f, w.data(), k, x.data(), k, 0.0f, y.data(), n);
  }
  void matmul_nt_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dx,
                          Tensor& dw) override {
    const int64_t rows = rows_of(x), k = cols_of(x), n = w.dim(0);
    gemm(CUBLAS_OP_N, CUBLAS_OP_N, k, rows, n, 1.0f, w.data(), k, dy.data(), n, 0.0f, dx.data(), k);
    gemm(CUBLAS_OP_N, CUBLAS_OP_T, k, n, rows, 1.0f, x.data(), k, dy.data(), n, 1.0f, dw.data(), k);
  }
  void layernorm(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& y, Tensor& mean,
                 Tensor& rstd) override {
    layernorm_kernel<<<static_cast<int>(rows_of(x)), kThreads>>>(
        x.data(), gamma.data(), beta.data(), y.data(), mean.data(), rstd.data(), cols_of(x));
    CUDA_CHECK(cudaGetLastError());
  }
  void layernorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& mean,
                          const Tensor& rstd, const Tensor& dy, Tensor& dx, Tensor& dgamma,
                          Tensor& dbeta) override {
    layernorm_backward_kernel<<<static_cast<int>(rows_of(x)), kThreads>>>(
        x.data(), gamma.data(), mean.data(), rstd.data(), dy.data(), dx.data(), dgamma.data(),
        dbeta.data(), cols_of(x));
    CUDA_CHECK(cudaGetLastError());
  }
  void gelu(const Tensor& x, Tensor& y) override {
    gelu_kernel<<<blocks_for(x.numel()), kThreads>>>(x.data(), y.data(), x.numel());
  }
  void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) override {
    gelu_backward_kernel<<<blocks_for(x.numel()), kThreads>>>(x.data(), dy.data(), dx.data(),
                                                              x.numel());
  }
  void relu(const Tensor& x, Tensor& y) override {
    relu_kernel<<<blocks_for(x.numel()), kThreads>>>(x.data(), y.data(), x.numel());
  }
  void relu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) override {
    relu_backward_kernel<<<blocks_for(x.numel()), kThreads>>>(x.data(), dy.data(), dx.data(),
                                                              x.numel());
  }
  void swiglu(const Tensor& x, Tensor& y) override {
    const int64_t rows = rows_of(x), f = cols_of(x) / 2;
    swiglu_kernel<<<blocks_for(rows * f), kThreads>>>(x.data(), y.data(), rows, f);
  }
  void swiglu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) override {
    const int64_t rows = rows_of(x), f = cols_of(x) / 2;
    swiglu_backward_kernel<<<blocks_for(rows * f), kThreads>>>(x.data(), dy.data(), dx.data(), rows,
                                                               f);
  }
  void bias_add(Tensor& y, const Tensor& b) override {
    bias_add_kernel<<<blocks_for(y.numel()), kThreads>>>(y.data(), b.data(), rows_of(y),
                                                         cols_of(y));
  }
  void bias_backward(const Tensor& dy, Tensor& db) override {
    bias_backward_kernel<<<blocks_for(cols_of(dy)), kThreads>>>(dy.data(), db.data(), rows_of(dy),
                                                                cols_of(dy));
  }
  void add(const Tensor& a, const Tensor& b, Tensor& y) override {
    add_kernel<<<blocks_for(a.numel()), kThreads>>>(a.data(), b.data(), y.data(), a.numel());
  }
  void scale(Tensor& x, float factor) override {
    scale_kernel<<<blocks_for(x.numel()), kThreads>>>(x.data(), x.numel(), factor);
  }

  // Per batch: heads are strided blocks of qkv (row stride 3hd, head offset d).
  void attention_scores(const Tensor& qkv, int64_t batch, int64_t seq, int64_t heads,
                        Tensor& scores) override {
    const int64_t hd = cols_of(qkv) / 3, d = hd / heads;
    const float alpha = 1.0f / std::sqrt(static_cast<float>(d));
    for (int64_t b = 0; b < batch; ++b) {
      const float* base = qkv.data() + b * seq * 3 * hd;
      gemm_batched(CUBLAS_OP_T, CUBLAS_OP_N, seq, seq, d, alpha, base + hd, 3 * hd, d, base, 3 * hd,
                   d, 0.0f, scores.data() + b * heads * seq * seq, seq, seq * seq, heads);
    }
  }
  void causal_softmax(Tensor& x, int64_t seq) override {
    causal_softmax_kernel<<<static_cast<int>(x.numel() / seq), kThreads>>>(x.data(), seq);
    CUDA_CHECK(cudaGetLastError());
  }
  void attention_context(const Tensor& probs, const Tensor& qkv, int64_t batch, int64_t seq,
                         int64_t heads, Tensor& out) override {
    const int64_t hd = cols_of(qkv) / 3, d = hd / heads;
    for (int64_t b = 0; b < batch; ++b) {
      const float* base = qkv.data() + b * seq * 3 * hd;
      gemm_batched(CUBLAS_OP_N, CUBLAS_OP_N, d, seq, seq, 1.0f, base + 2 * hd, 3 * hd, d,
                   probs.data() + b * heads * seq * seq, seq, seq * seq, 0.0f,
                   out.data() + b * seq * hd, hd, d, heads);
    }
  }
  void attention_context_backward(const Tensor& probs, const Tensor& qkv, const Tensor& dout,
                                  int64_t batch, int64_t seq, int64_t heads, Tensor& dprobs,
                                  Tensor& dqkv) override {
    const int64_t hd = cols_of(qkv) / 3, d = hd / heads;
    for (int64_t b = 0; b < batch; ++b) {
      const float* base = qkv.data() + b * seq * 3 * hd;
      float* dbase = dqkv.data() + b * seq * 3 * hd;
      const float* p = probs.data() + b * heads * seq * seq;
      const float* dob = dout.data() + b * seq * hd;
      // dprobs = dout v^T
      gemm_batched(CUBLAS_OP_T, CUBLAS_OP_N, seq, seq, d, 1.0f, base + 2 * hd, 3 * hd, d, dob, hd,
                   d, 0.0f, dprobs.data() + b * heads * seq * seq, seq, seq * seq, heads);
      // dv = probs^T dout
      gemm_batched(CUBLAS_OP_N, CUBLAS_OP_T, d, seq, seq, 1.0f, dob, hd, d, p, seq, seq * seq, 0.0f,
                   dbase + 2 * hd, 3 * hd, d, heads);
    }
  }
  void causal_softmax_backward(const Tensor& probs, Tensor& grad, int64_t seq) override {
    causal_softmax_backward_kernel<<<static_cast<int>(probs.numel() / seq), kThreads>>>(
        probs.data(), grad.data(), seq);
    CUDA_CHECK(cudaGetLastError());
  }
  void attention_scores_backward(const Tensor& dscores, const Tensor& qkv, int64_t batch,
                                 int64_t seq, int64_t heads, Tensor& dqkv) override {
    const int64_t hd = cols_of(qkv) / 3, d = hd / heads;
    const float alpha = 1.0f / std::sqrt(static_cast<float>(d));
    for (int64_t b = 0; b < batch; ++b) {
      const float* base = qkv.data() + b * seq * 3 * hd;
      float* dbase = dqkv.data() + b * seq * 3 * hd;
      const float* ds = dscores.data() + b * heads * seq * seq;
      // dq = dS k * alpha; dk = dS^T q * alpha
      gemm_batched(CUBLAS_OP_N, CUBLAS_OP_N, d, seq, seq, alpha, base + hd, 3 * hd, d, ds, seq,
                   seq * seq, 0.0f, dbase, 3 * hd, d, heads);
      gemm_batched(CUBLAS_OP_N, CUBLAS_OP_T, d, seq, seq, alpha, base, 3 * hd, d, ds, seq,
                   seq * seq, 0.0f, dbase + hd, 3 * hd, d, heads);
    }
  }

  void embedding(const std::vector<int32_t>& tokens, const Tensor& table, int64_t vocab_begin,
                 Tensor& y) override {
    const int32_t* ids = upload(tokens);
    const int64_t n = static_cast<int64_t>(tokens.size()), h = table.dim(1);
    embedding_kernel<<<blocks_for(n * h), kThreads>>>(ids, table.data(), y.data(), n, h,
                                                      vocab_begin, table.dim(0));
  }
  void embedding_backward(const std::vector<int32_t>& tokens, const Tensor& dy, int64_t vocab_begin,
                          Tensor& dtable) override {
    const int32_t* ids = upload(tokens);
    const int64_t n = static_cast<int64_t>(tokens.size()), h = dtable.dim(1);
    embedding_backward_kernel<<<blocks_for(n * h), kThreads>>>(ids, dy.data(), dtable.data(), n, h,
                                                               vocab_begin, dtable.dim(0));
  }
  void add_positions(const Tensor& pos, int64_t row_begin, int64_t seq, Tensor& y) override {
    positions_kernel<<<blocks_for(y.numel()), kThreads>>>(pos.data(), y.data(), rows_of(y),
                                                          cols_of(y), row_begin, seq);
  }
  void add_positions_backward(const Tensor& dy, int64_t row_begin, int64_t seq,
                              Tensor& dpos) override {
    positions_backward_kernel<<<blocks_for(dy.numel()), kThreads>>>(
        dy.data(), dpos.data(), rows_of(dy), cols_of(dy), row_begin, seq);
  }
  void row_max(const Tensor& logits, std::vector<float>& out) override {
    const int64_t rows = rows_of(logits);
    float* d = rows_scratch(rows, 0);
    row_max_kernel<<<static_cast<int>(rows), kThreads>>>(logits.data(), d, cols_of(logits));
    download(d, rows, out);
  }
  void row_sum_exp(const Tensor& logits, const std::vector<float>& max,
                   std::vector<float>& out) override {
    const int64_t rows = rows_of(logits);
    float* dmax = rows_scratch(rows, 0);
    CUDA_CHECK(cudaMemcpy(dmax, max.data(), max.size() * sizeof(float), cudaMemcpyHostToDevice));
    float* d = rows_scratch(rows, 1);
    row_sum_exp_kernel<<<static_cast<int>(rows), kThreads>>>(logits.data(), dmax, d,
                                                             cols_of(logits));
    download(d, rows, out);
  }
  void target_logits(const Tensor& logits, const std::vector<int32_t>& targets, int64_t vocab_begin,
                     std::vector<float>& out) override {
    const int64_t rows = rows_of(logits);
    const int32_t* t = upload(targets);
    float* d = rows_scratch(rows, 0);
    target_logits_kernel<<<blocks_for(rows), kThreads>>>(logits.data(), t, d, rows, cols_of(logits),
                                                         vocab_begin);
    download(d, rows, out);
  }
  void cross_entropy_backward(const Tensor& logits, const std::vector<int32_t>& targets,
                              int64_t vocab_begin, const std::vector<float>& max,
                              const std::vector<float>& sum, float scale_factor,
                              Tensor& dlogits) override {
    const int64_t rows = rows_of(logits);
    const int32_t* t = upload(targets);
    float* dmax = rows_scratch(rows, 0);
    float* dsum = rows_scratch(rows, 1);
    CUDA_CHECK(cudaMemcpy(dmax, max.data(), max.size() * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dsum, sum.data(), sum.size() * sizeof(float), cudaMemcpyHostToDevice));
    cross_entropy_backward_kernel<<<blocks_for(logits.numel()), kThreads>>>(
        logits.data(), t, dmax, dsum, scale_factor, dlogits.data(), rows, cols_of(logits),
        vocab_begin);
  }
  double sum_squares(const Tensor& x) override {
    CUDA_CHECK(cudaMemset(scalar_, 0, sizeof(double)));
    const int blocks = std::min(1024, std::max(1, blocks_for(x.numel())));
    sum_squares_kernel<<<blocks, kThreads>>>(x.data(), x.numel(), scalar_);
    double s = 0;
    CUDA_CHECK(cudaMemcpy(&s, scalar_, sizeof(double), cudaMemcpyDeviceToHost));
    return s;
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

 private:
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
    if (bufs.size() < 2) bufs.assign(2, nullptr);
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
  GemmPrecision precision_;
  cublasHandle_t blas_ = nullptr;
  double* scalar_ = nullptr;
  int32_t* ids_ = nullptr;
  size_t ids_capacity_ = 0;
  std::vector<float*> scratch_;
  int64_t scratch_rows_ = 0;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int device, GemmPrecision precision) {
  if (cuda_device_count() == 0)
    throw std::runtime_error("the cuda backend needs a GPU: " + cuda_unavailable_reason());
  return std::make_unique<CudaBackend>(device, precision);
}

}  // namespace sextant::exec
