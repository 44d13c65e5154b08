// The CUDA backend's CNN kernels (kernels/convolution.hpp) on fp32 tensors: convolution as im2col +
// a cuBLAS GEMM (Chellapilla et al. 2006, "High performance convolutional neural networks for
// document processing"; Caffe's and the CPU backend's method: no cuDNN), its input gradient as the
// GEMM's transpose + col2im, and plain kernels for normalisation, pooling, the cropped concat and
// the per-pixel loss. The shapes are checked by conv_geometry.hpp, as on the CPU.
//
// Every kernel gathers rather than scatters (col2im, pooling's and adaptive pooling's backward
// loop over the outputs that read each input element), so no float atomics: a run repeats bit for
// bit. Per-channel sums (bias gradient, batch-norm statistics) run one block per channel in double,
// as the CPU sums in double.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "cnn/conv_geometry.hpp"
#include "cuda_check.hpp"
#include "cuda_convolution.hpp"
#include "sextant/spec/error.hpp"

namespace sextant::exec {

namespace {

using conv::MapDims;
using conv::WindowDims;

constexpr int kThreads = 256;
constexpr int kSumThreads = 256;  // one block per channel for the per-channel sums
// The im2col buffer of one chunk of samples stays under this many floats (256 MiB).
constexpr int64_t kMaxColumnFloats = int64_t{64} << 20;

__device__ __forceinline__ int64_t imin(int64_t a, int64_t b) {
  return a < b ? a : b;
}
__device__ __forceinline__ int64_t imax(int64_t a, int64_t b) {
  return a > b ? a : b;
}

unsigned blocks_for(int64_t n) {
  return static_cast<unsigned>((n + kThreads - 1) / kThreads);
}

// The window geometry as the kernels read it (a plain struct passed by value).
struct Geo {
  int64_t c, d, h, w;    // input channels and extent
  int64_t od, oh, ow;    // output extent
  int64_t kd, k, sd, s;  // window and stride (depth 1 and 1 on a 2D map)
  __host__ __device__ int64_t in_voxels() const { return d * h * w; }
  __host__ __device__ int64_t out_voxels() const { return od * oh * ow; }
  __host__ __device__ int64_t rows() const { return c * kd * k * k; }  // column matrix rows
};
// A window of one voxel at stride 1 (ResNet's bottleneck 1x1 convolutions): each sample's input
// [Ci, voxels] is its own column matrix, so its GEMMs read and write the maps in place, with no
// im2col copy, permute or col2im (the weight gradient, summed over samples, keeps the chunked
// path: one GEMM over every sample's voxels needs them side by side).
__host__ __device__ inline bool pointwise(const Geo& g) {
  return g.k == 1 && g.kd == 1 && g.s == 1 && g.sd == 1;
}
// (Square windows only: the rectangular ones of AmoebaNet's cells run on CPU ranks.)
Geo geo_of(const WindowDims& g) {
  SEXTANT_CHECK(g.square(), "the CUDA convolution kernels take square windows, not {} x {}", g.kh,
                g.kw);
  return {g.in.c, g.in.d, g.in.h, g.in.w, g.out.d, g.out.h, g.out.w, g.kd, g.kh, g.sd, g.sh};
}

// col[((c kd + a) k + i) k + j][n][(od Ho + oh) Wo + ow] = x[n][c][od sd + a][oh s + i][ow s + j]
// for `samples` samples: the column matrix of the whole chunk, its columns sample by sample, so
// that one GEMM covers every sample (k = samples x outputs for the weight gradient).
__global__ void im2col_kernel(const float* x, Geo g, int64_t samples, float* col) {
  const int64_t outputs = g.out_voxels(), rows = g.rows();
  const int64_t n = samples * rows * outputs;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t o = e % outputs, b = (e / outputs) % samples, r = e / (outputs * samples);
    const int64_t j = r % g.k, i = (r / g.k) % g.k, a = (r / (g.k * g.k)) % g.kd,
                  c = r / (g.k * g.k * g.kd);
    const int64_t ow = o % g.ow, oh = (o / g.ow) % g.oh, od = o / (g.ow * g.oh);
    col[e] = x[(((b * g.c + c) * g.d + od * g.sd + a) * g.h + oh * g.s + i) * g.w + ow * g.s + j];
  }
}

// [samples][channels][voxels] <-> [channels][samples][voxels]: a map tensor and the channel-major
// form the GEMMs read and write (rows of a channel or filter, the samples side by side).
__global__ void channel_major_kernel(const float* x, int64_t samples, int64_t channels,
                                     int64_t voxels, bool to_channel_major, float* y) {
  const int64_t n = samples * channels * voxels;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t v = e % voxels, c = (e / voxels) % channels, b = e / (voxels * channels);
    const int64_t major = (c * samples + b) * voxels + v;  // e is [b][c][v]
    if (to_channel_major) {
      y[major] = x[e];
    } else {
      y[e] = x[major];
    }
  }
}

// The outputs along one axis whose window (of `k` at stride `s`) reads input position p: those o
// with o s <= p < o s + k, within [0, extent).
__device__ __forceinline__ void readers(int64_t p, int64_t k, int64_t s, int64_t extent,
                                        int64_t& first, int64_t& last) {
  first = p >= k ? (p - k) / s + 1 : 0;
  last = imin(p / s, extent - 1);
}

// Calls f(od, oh, ow) for every output whose window reads input element (pz, py, px): the
// gather of every backward here (col2im, pooling).
template <typename F>
__device__ __forceinline__ void for_each_reader(const Geo& g, int64_t pz, int64_t py, int64_t px,
                                                F f) {
  int64_t d0, d1, h0, h1, w0, w1;
  readers(pz, g.kd, g.sd, g.od, d0, d1);
  readers(py, g.k, g.s, g.oh, h0, h1);
  readers(px, g.k, g.s, g.ow, w0, w1);
  for (int64_t od = d0; od <= d1; ++od)
    for (int64_t oh = h0; oh <= h1; ++oh)
      for (int64_t ow = w0; ow <= w1; ++ow) f(od, oh, ow);
}

// The adjoint of im2col, gathered: x[n][c][z][y][x] = the sum of the column entries that read it.
// Overwrites x.
__global__ void col2im_kernel(const float* col, Geo g, int64_t samples, float* x) {
  const int64_t outputs = g.out_voxels();
  const int64_t n = samples * g.c * g.in_voxels();
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t px = e % g.w, py = (e / g.w) % g.h, pz = (e / (g.w * g.h)) % g.d;
    const int64_t c = (e / g.in_voxels()) % g.c, b = e / (g.c * g.in_voxels());
    float sum = 0;
    for_each_reader(g, pz, py, px, [&](int64_t od, int64_t oh, int64_t ow) {
      const int64_t a = pz - od * g.sd, i = py - oh * g.s, j = px - ow * g.s;
      const int64_t r = ((c * g.kd + a) * g.k + i) * g.k + j;
      sum += col[(r * samples + b) * outputs + (od * g.oh + oh) * g.ow + ow];
    });
    x[e] = sum;
  }
}

__global__ void add_channel_bias_kernel(float* y, const float* bias, int64_t n, int64_t channels,
                                        int64_t voxels) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[e] += bias[(e / voxels) % channels];
}

// Block-wide sum of a double (blockDim.x == kSumThreads).
__device__ double block_sum(double v) {
  __shared__ double partial[kSumThreads / 32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = threadIdx.x < kSumThreads / 32 ? partial[lane] : 0.0;
  if (warp == 0)
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;  // thread 0 holds the block's sum
}

// The per-channel sums over every sample's voxels of channel c, of
//   kind 0: dy                       (bias gradient)
//   kind 1: x and x^2                (batch statistics)
//   kind 2: dy and dy (x - m) rstd   (batch-norm backward)
// in two passes that fix the order of every addition (runs repeat bit for bit): block (c, p) sums
// part p of the channel's samples x voxels elements into partial[(k C + c) P + p], k = 0, 1; then
// one thread per channel adds its P partials in order (channel_sums_finish_kernel).
__global__ void channel_sums_kernel(int kind, const float* x, const float* dy, const double* mean,
                                    const double* rstd, int64_t samples, int64_t channels,
                                    int64_t voxels, double* partial) {
  const int64_t c = blockIdx.x, parts = gridDim.y, p = blockIdx.y;
  const int64_t n = samples * voxels, per = (n + parts - 1) / parts;
  const int64_t begin = p * per, end = begin + per < n ? begin + per : n;
  double s = 0, q = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const int64_t e = ((i / voxels) * channels + c) * voxels + i % voxels;
    if (kind == 0) {
      s += dy[e];
    } else if (kind == 1) {
      const double v = x[e];
      s += v;
      q += v * v;
    } else {
      const double g = dy[e];
      s += g;
      q += g * ((x[e] - mean[c]) * rstd[c]);
    }
  }
  s = block_sum(s);
  if (kind != 0) q = block_sum(q);
  if (threadIdx.x != 0) return;
  partial[c * parts + p] = s;
  partial[(channels + c) * parts + p] = q;
}
// kind 0: db[c] += (float) the sum; otherwise out[c], out[C + c].
__global__ void channel_sums_finish_kernel(int kind, const double* partial, int64_t channels,
                                           int64_t parts, float* db, double* out) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= channels) return;
  double s = 0, q = 0;
  for (int64_t p = 0; p < parts; ++p) {
    s += partial[c * parts + p];
    q += partial[(channels + c) * parts + p];
  }
  if (kind == 0) {
    db[c] += static_cast<float>(s);
  } else {
    out[c] = s;
    out[channels + c] = q;
  }
}

// Whole maps: the batch statistics from the partial sums of kind 1, on the device (conv::
// batch_statistics' formula: mean = s / n, var = max(0, q / n - mean^2), rstd = 1 / sqrt(var +
// eps)); stats = [mean C][rstd C].
__global__ void batch_statistics_kernel(const double* partial, int64_t channels, int64_t parts,
                                        double count, double* stats) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= channels) return;
  double s = 0, q = 0;
  for (int64_t p = 0; p < parts; ++p) {
    s += partial[c * parts + p];
    q += partial[(channels + c) * parts + p];
  }
  const double mean = s / count;
  const double var = fmax(0.0, q / count - mean * mean);
  stats[c] = mean;
  stats[channels + c] = 1.0 / sqrt(var + kBatchNormEps);
}
// Whole maps' backward: the sums of kind 2 into sums [dbeta C][dgamma C] and added to the fp32
// gradients (dbeta[c] += (float) sum, as the CPU adds them).
__global__ void batch_norm_grads_kernel(const double* partial, int64_t channels, int64_t parts,
                                        double* sums, float* dgamma, float* dbeta) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= channels) return;
  double s = 0, q = 0;
  for (int64_t p = 0; p < parts; ++p) {
    s += partial[c * parts + p];
    q += partial[(channels + c) * parts + p];
  }
  sums[c] = s;
  sums[channels + c] = q;
  dbeta[c] += static_cast<float>(s);
  dgamma[c] += static_cast<float>(q);
}

__global__ void batch_norm_kernel(const float* x, const float* gamma, const float* beta,
                                  const double* mean, const double* rstd, int64_t n,
                                  int64_t channels, int64_t voxels, float* y) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = (e / voxels) % channels;
    const float scale = static_cast<float>(rstd[c]) * gamma[c];
    const float shift = beta[c] - static_cast<float>(mean[c]) * scale;
    y[e] = x[e] * scale + shift;
  }
}

// dx = gamma rstd (dy - dbeta / n - xhat dgamma / n), sums[c] = dbeta, sums[C + c] = dgamma.
__global__ void batch_norm_backward_kernel(const float* x, const float* dy, const float* gamma,
                                           const double* mean, const double* rstd,
                                           const double* sums, double count, int64_t n,
                                           int64_t channels, int64_t voxels, float* dx) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = (e / voxels) % channels;
    const double dbeta = sums[c] / count, dgamma = sums[channels + c] / count;
    const double xhat = (x[e] - mean[c]) * rstd[c];
    dx[e] = static_cast<float>(gamma[c] * rstd[c] * (dy[e] - dbeta - xhat * dgamma));
  }
}

// The first input element of output o's window.
__device__ __forceinline__ int64_t window_start(const Geo& g, int64_t o) {
  const int64_t outputs = g.out_voxels();
  const int64_t ow = o % g.ow, oh = (o / g.ow) % g.oh, od = (o / (g.ow * g.oh)) % g.od;
  const int64_t bc = o / outputs;
  return ((bc * g.d + od * g.sd) * g.h + oh * g.s) * g.w + ow * g.s;
}
__device__ __forceinline__ int64_t tap(const Geo& g, int64_t first, int64_t t) {
  const int64_t j = t % g.k, i = (t / g.k) % g.k, a = t / (g.k * g.k);
  return first + (a * g.h + i) * g.w + j;
}

// max: y = the window's maximum; avg: its mean over every tap (padding included).
__global__ void pool_kernel(bool max, const float* x, Geo g, int64_t n, float* y) {
  const int64_t taps = g.kd * g.k * g.k;
  for (int64_t o = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; o < n;
       o += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t first = window_start(g, o);
    if (max) {
      float best = x[tap(g, first, 0)];
      for (int64_t t = 1; t < taps; ++t) best = fmaxf(best, x[tap(g, first, t)]);
      y[o] = best;
    } else {
      double s = 0;
      for (int64_t t = 0; t < taps; ++t) s += x[tap(g, first, t)];
      y[o] = static_cast<float>(s) * (1.0f / static_cast<float>(taps));
    }
  }
}

// The tap of each output's window that max pooling took: its first maximum (the first tap equal to
// y, as the CPU's and PyTorch's CPU kernel choose).
__global__ void max_tap_kernel(const float* x, const float* y, Geo g, int64_t n, int32_t* taps) {
  const int64_t count = g.kd * g.k * g.k;
  for (int64_t o = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; o < n;
       o += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t first = window_start(g, o);
    int32_t at = -1;
    for (int64_t t = 0; t < count && at < 0; ++t)
      if (x[tap(g, first, t)] == y[o]) at = static_cast<int32_t>(t);
    taps[o] = at;
  }
}

// Pooling's input gradient, gathered per input element over the windows that read it: max routes
// an output's gradient to the tap max_tap_kernel chose, avg shares it over every tap.
__global__ void pool_backward_kernel(const int32_t* taps, const float* dy, Geo g, int64_t n,
                                     float* dx) {
  const float inv = 1.0f / static_cast<float>(g.kd * g.k * g.k);
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t px = e % g.w, py = (e / g.w) % g.h, pz = (e / (g.w * g.h)) % g.d;
    const int64_t bc = e / g.in_voxels();
    float sum = 0;
    for_each_reader(g, pz, py, px, [&](int64_t od, int64_t oh, int64_t ow) {
      const int64_t o = ((bc * g.od + od) * g.oh + oh) * g.ow + ow;
      if (taps == nullptr) {
        sum += dy[o] * inv;
        return;
      }
      // This element's tap in window o: (a, i, j) from its offsets.
      const int64_t t = ((pz - od * g.sd) * g.k + (py - oh * g.s)) * g.k + (px - ow * g.s);
      if (taps[o] == t) sum += dy[o];
    });
    dx[e] = sum;
  }
}

// The bins of adaptive average pooling along one axis (PyTorch's start_index / end_index).
__device__ __forceinline__ int64_t bin_begin(int64_t i, int64_t extent, int64_t out) {
  return i * extent / out;
}
__device__ __forceinline__ int64_t bin_end(int64_t i, int64_t extent, int64_t out) {
  return ((i + 1) * extent + out - 1) / out;
}
struct Adaptive {
  int64_t d, h, w;     // the block's extent
  int64_t od, oh, ow;  // the pooled extent
  int64_t z0, y0, x0;  // the block's origin in the map
  int64_t map_d, map_h, map_w;
};
// y[bc][k][i][j] = (the block's elements in bin (k, i, j)) / the bin's size.
__global__ void adaptive_pool_kernel(const float* x, Adaptive a, int64_t n, float* y) {
  for (int64_t o = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; o < n;
       o += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = o % a.ow, i = (o / a.ow) % a.oh, k = (o / (a.ow * a.oh)) % a.od;
    const int64_t bc = o / (a.od * a.oh * a.ow);
    const int64_t zb = bin_begin(k, a.map_d, a.od), ze = bin_end(k, a.map_d, a.od);
    const int64_t hb = bin_begin(i, a.map_h, a.oh), he = bin_end(i, a.map_h, a.oh);
    const int64_t wb = bin_begin(j, a.map_w, a.ow), we = bin_end(j, a.map_w, a.ow);
    double s = 0;
    for (int64_t z = imax(zb, a.z0); z < imin(ze, a.z0 + a.d); ++z)
      for (int64_t h = imax(hb, a.y0); h < imin(he, a.y0 + a.h); ++h)
        for (int64_t w = imax(wb, a.x0); w < imin(we, a.x0 + a.w); ++w)
          s += x[((bc * a.d + z - a.z0) * a.h + h - a.y0) * a.w + w - a.x0];
    y[o] = static_cast<float>(s / static_cast<double>((ze - zb) * (he - hb) * (we - wb)));
  }
}
// dx[element] = the sum over the bins holding it of dy[bin] / the bin's size.
__global__ void adaptive_pool_backward_kernel(const float* dy, Adaptive a, int64_t n, float* dx) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t w = e % a.w + a.x0, h = (e / a.w) % a.h + a.y0,
                  z = (e / (a.w * a.h)) % a.d + a.z0;
    const int64_t bc = e / (a.d * a.h * a.w);
    float sum = 0;
    for (int64_t k = 0; k < a.od; ++k) {
      const int64_t zb = bin_begin(k, a.map_d, a.od), ze = bin_end(k, a.map_d, a.od);
      if (z < zb || z >= ze) continue;
      for (int64_t i = 0; i < a.oh; ++i) {
        const int64_t hb = bin_begin(i, a.map_h, a.oh), he = bin_end(i, a.map_h, a.oh);
        if (h < hb || h >= he) continue;
        for (int64_t j = 0; j < a.ow; ++j) {
          const int64_t wb = bin_begin(j, a.map_w, a.ow), we = bin_end(j, a.map_w, a.ow);
          if (w < wb || w >= we) continue;
          sum += dy[((bc * a.od + k) * a.oh + i) * a.ow + j] /
                 static_cast<float>((ze - zb) * (he - hb) * (we - wb));
        }
      }
    }
    dx[e] = sum;
  }
}

// U-Net's concat: y[b][c] is the kept map's centre crop for c < Ck, x[b][c - Ck] after; backward
// adds the first Ck channels into dkept at the crop and copies the rest to dx.
struct Concat {
  int64_t kc, kd, kh, kw;    // kept map
  int64_t xc, d, h, w;       // joined input (and the output's extent)
  int64_t at_d, at_h, at_w;  // the crop's origin in the kept map
};
__global__ void crop_concat_kernel(const float* kept, const float* x, Concat c, int64_t n,
                                   float* y) {
  const int64_t voxels = c.d * c.h * c.w, oc = c.kc + c.xc;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t v = e % voxels, ch = (e / voxels) % oc, b = e / (voxels * oc);
    if (ch >= c.kc) {
      y[e] = x[(b * c.xc + ch - c.kc) * voxels + v];
      continue;
    }
    const int64_t w = v % c.w, h = (v / c.w) % c.h, z = v / (c.w * c.h);
    y[e] = kept[(((b * c.kc + ch) * c.kd + c.at_d + z) * c.kh + c.at_h + h) * c.kw + c.at_w + w];
  }
}
__global__ void crop_concat_backward_kernel(const float* dy, Concat c, int64_t n, float* dkept,
                                            float* dx) {
  const int64_t voxels = c.d * c.h * c.w, oc = c.kc + c.xc;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t v = e % voxels, ch = (e / voxels) % oc, b = e / (voxels * oc);
    if (ch >= c.kc) {
      dx[(b * c.xc + ch - c.kc) * voxels + v] = dy[e];
      continue;
    }
    const int64_t w = v % c.w, h = (v / c.w) % c.h, z = v / (c.w * c.h);
    // Each kept element is in the crop once: no two threads add to the same one.
    dkept[(((b * c.kc + ch) * c.kd + c.at_d + z) * c.kh + c.at_h + h) * c.kw + c.at_w + w] += dy[e];
  }
}

// One thread per pixel: the softmax over its channels against its label; loss[p] = its
// cross-entropy; dlogits (when given) = per_pixel (softmax - one-hot). A label out of range sets
// *bad.
__global__ void pixel_cross_entropy_kernel(const float* z, const int32_t* labels, int64_t samples,
                                           int64_t channels, int64_t voxels, double per_pixel,
                                           double* loss, float* dz, int* bad) {
  const int64_t n = samples * voxels;
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < n;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = p / voxels, i = p % voxels;
    const float* zp = z + b * channels * voxels + i;
    double top = zp[0];
    for (int64_t c = 1; c < channels; ++c) top = fmax(top, static_cast<double>(zp[c * voxels]));
    double sum = 0;
    for (int64_t c = 0; c < channels; ++c) sum += exp(zp[c * voxels] - top);
    const int32_t label = labels[p];
    if (label < 0 || label >= channels) {
      *bad = 1;
      loss[p] = 0;
      continue;
    }
    loss[p] = log(sum) + top - zp[label * voxels];
    if (dz == nullptr) continue;
    float* g = dz + b * channels * voxels + i;
    for (int64_t c = 0; c < channels; ++c)
      g[c * voxels] =
          static_cast<float>(per_pixel * (exp(zp[c * voxels] - top) / sum - (c == label ? 1 : 0)));
  }
}
__global__ void sum_kernel(const double* x, int64_t n, double* out) {
  double s = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += x[i];
  s = block_sum(s);
  if (threadIdx.x == 0) *out = s;
}

unsigned grid_for(int64_t n) {
  // Grid-stride loops: enough blocks to fill the GPU, no more than the elements need.
  return std::max(1u, std::min(blocks_for(n), 65535u * 8));
}

class CudaConvolution final : public ConvolutionKernels {
 public:
  CudaConvolution(cublasHandle_t blas, cublasComputeType_t compute, DeviceMemory& memory)
      : blas_(blas), compute_(compute), memory_(memory) {}

  // Per chunk of samples S: col [rows, S outputs] (im2col), and a filter-major product
  // [filters, S outputs] that one GEMM makes or reads, permuted to or from the map tensor.
  void convolution(const Tensor& x, const Tensor& w, const Tensor* bias, int64_t stride,
                   Tensor& y) override {
    const WindowDims g = conv::window_dims(x, y, w.dim(2), stride, w.dim(0));
    conv::check_weight(w, g, g.out.c, g.in.c);
    const Geo geo = geo_of(g);
    const int64_t rows = geo.rows(), outputs = geo.out_voxels();
    if (pointwise(geo)) {
      // y[n] [Co, voxels] = W [Co, Ci] x[n] [Ci, voxels], every sample in one call.
      gemm_batched(false, false, g.out.c, outputs, g.in.c, 1.0f, w.data(), 0, x.data(),
                   g.in.c * g.in.voxels(), 0.0f, y.data(), g.out.c * outputs, g.in.b);
      if (bias != nullptr) add_channel_bias(y, *bias);
      return;
    }
    for_chunks(g, g.out.c, [&](int64_t b0, int64_t count, float* col, float* product) {
      launch_im2col(x.data() + b0 * g.in.c * g.in.voxels(), geo, count, col);
      // product [Co, S outputs] = W [Co, rows] col.
      gemm(false, false, g.out.c, count * outputs, rows, 1.0f, w.data(), col, 0.0f, product);
      permute(product, count, g.out.c, outputs, false, y.data() + b0 * g.out.c * outputs);
    });
    if (bias != nullptr) add_channel_bias(y, *bias);
  }

  void convolution_backward(const Tensor& x, const Tensor& w, const Tensor& dy, int64_t stride,
                            Tensor* dx, Tensor& dw, Tensor* db) override {
    const WindowDims g = conv::window_dims(x, dy, w.dim(2), stride, w.dim(0));
    conv::check_weight(w, g, g.out.c, g.in.c);
    const Geo geo = geo_of(g);
    const int64_t rows = geo.rows(), outputs = geo.out_voxels();
    const bool in_place = pointwise(geo);
    for_chunks(g, g.out.c, [&](int64_t b0, int64_t count, float* col, float* dproduct) {
      weight_gradient(geo, g.out.c, x.data() + b0 * g.in.c * g.in.voxels(),
                      dy.data() + b0 * g.out.c * outputs, count, col, dproduct, dw.data());
      if (dx == nullptr || in_place) return;
      // dcol [rows, S outputs] = W^T dproduct (into the column buffer, read), then col2im.
      gemm(true, false, rows, count * outputs, g.out.c, 1.0f, w.data(), dproduct, 0.0f, col);
      launch_col2im(col, geo, count, dx->data() + b0 * g.in.c * g.in.voxels());
    });
    if (dx != nullptr && in_place)  // dx[n] [Ci, voxels] = W^T dy[n], every sample in one call
      gemm_batched(true, false, g.in.c, outputs, g.out.c, 1.0f, w.data(), 0, dy.data(),
                   g.out.c * outputs, 0.0f, dx->data(), g.in.c * g.in.voxels(), g.in.b);
    if (db != nullptr) channel_bias_backward(dy, *db);
  }

  void transposed_convolution(const Tensor& x, const Tensor& w, int64_t stride,
                              Tensor& y) override {
    // The adjoint of a convolution of y's shape into x's: y = col2im(W^T x).
    const WindowDims g = conv::window_dims(y, x, w.dim(2), stride, w.dim(0));
    conv::check_weight(w, g, g.out.c, g.in.c);
    const Geo geo = geo_of(g);
    const int64_t rows = geo.rows(), outputs = geo.out_voxels();
    for_chunks(g, g.out.c, [&](int64_t b0, int64_t count, float* col, float* xp) {
      permute(x.data() + b0 * g.out.c * outputs, count, g.out.c, outputs, true, xp);
      gemm(true, false, rows, count * outputs, g.out.c, 1.0f, w.data(), xp, 0.0f, col);
      launch_col2im(col, geo, count, y.data() + b0 * g.in.c * g.in.voxels());
    });
  }

  void transposed_convolution_backward(const Tensor& x, const Tensor& w, const Tensor& dy,
                                       int64_t stride, Tensor* dx, Tensor& dw) override {
    const WindowDims g = conv::window_dims(dy, x, w.dim(2), stride, w.dim(0));
    conv::check_weight(w, g, g.out.c, g.in.c);
    const Geo geo = geo_of(g);
    const int64_t rows = geo.rows(), outputs = geo.out_voxels();
    for_chunks(g, g.out.c, [&](int64_t b0, int64_t count, float* col, float* xp) {
      // The weight gradient with the roles swapped (dy is windowed, x filtered); dx = W col.
      weight_gradient(geo, g.out.c, dy.data() + b0 * g.in.c * g.in.voxels(),
                      x.data() + b0 * g.out.c * outputs, count, col, xp, dw.data());
      if (dx == nullptr) return;
      gemm(false, false, g.out.c, count * outputs, rows, 1.0f, w.data(), col, 0.0f, xp);
      permute(xp, count, g.out.c, outputs, false, dx->data() + b0 * g.out.c * outputs);
    });
  }

  void crop_concat(const Tensor& kept, const Tensor& x, Tensor& y) override {
    const Concat c = concat_of(conv::concat_dims(kept, x, y));
    crop_concat_kernel<<<grid_for(y.numel()), kThreads>>>(kept.data(), x.data(), c, y.numel(),
                                                          y.data());
    CUDA_CHECK(cudaGetLastError());
  }
  void crop_concat_backward(const Tensor& dy, Tensor& dkept, Tensor& dx) override {
    const Concat c = concat_of(conv::concat_dims(dkept, dx, dy));
    crop_concat_backward_kernel<<<grid_for(dy.numel()), kThreads>>>(dy.data(), c, dy.numel(),
                                                                    dkept.data(), dx.data());
    CUDA_CHECK(cudaGetLastError());
  }

  double pixel_cross_entropy(const Tensor& logits, const std::vector<int32_t>& labels, float scale,
                             Tensor* dlogits, int64_t map_pixels) override {
    const MapDims d = conv::map_dims(logits);
    const int64_t voxels = d.voxels(), pixels = d.b * voxels;
    SEXTANT_CHECK(static_cast<int64_t>(labels.size()) == pixels, "{} pixel labels for logits {}",
                  labels.size(), conv::describe(d));
    SEXTANT_CHECK(map_pixels == 0 || map_pixels >= voxels,
                  "a block of {} pixels of a map of {} pixels", voxels, map_pixels);
    const double mean_over = static_cast<double>(map_pixels == 0 ? voxels : map_pixels);
    // Scratch: the labels, one double per pixel, the total and the bad-label flag.
    Tensor scratch = memory_.empty({(pixels + 1) * 2 + pixels + 2});
    auto* loss = static_cast<double*>(scratch.raw());
    double* total = loss + pixels;
    int* bad = reinterpret_cast<int*>(total + 1);
    auto* ids = reinterpret_cast<int32_t*>(bad + 2);
    CUDA_CHECK(
        cudaMemcpy(ids, labels.data(), labels.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(bad, 0, sizeof(int)));
    pixel_cross_entropy_kernel<<<grid_for(pixels), kThreads>>>(
        logits.data(), ids, d.b, d.c, voxels, static_cast<double>(scale) / mean_over, loss,
        dlogits != nullptr ? dlogits->data() : nullptr, bad);
    CUDA_CHECK(cudaGetLastError());
    sum_kernel<<<1, kSumThreads>>>(loss, pixels, total);
    double sum = 0;
    int flag = 0;
    CUDA_CHECK(cudaMemcpy(&sum, total, sizeof(double), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(&flag, bad, sizeof(int), cudaMemcpyDeviceToHost));
    SEXTANT_CHECK(flag == 0, "a pixel label outside [0, {}) classes", d.c);
    // Every sample's mean over the same pixel count: the sum of the samples' means.
    return sum / mean_over;
  }

  void add_channel_bias(Tensor& y, const Tensor& bias) override {
    const MapDims d = conv::map_dims(y);
    SEXTANT_CHECK(bias.numel() == d.c, "a bias of {} for {} channels", bias.numel(), d.c);
    add_channel_bias_kernel<<<grid_for(y.numel()), kThreads>>>(y.data(), bias.data(), y.numel(),
                                                               d.c, d.voxels());
    CUDA_CHECK(cudaGetLastError());
  }
  void channel_bias_backward(const Tensor& dy, Tensor& db) override {
    const MapDims d = conv::map_dims(dy);
    SEXTANT_CHECK(db.numel() == d.c, "a bias gradient of {} for {} channels", db.numel(), d.c);
    sums(0, nullptr, dy.data(), nullptr, d, db.data(), nullptr);
  }

  void channel_sums(const Tensor& x, std::vector<double>& sums) override {
    const MapDims d = conv::map_dims(x);
    double* out = statistics(d.c, {}, {});
    this->sums(1, x.data(), nullptr, nullptr, d, nullptr, out);
    download(out, 2 * d.c, sums);
  }
  void batch_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                  const std::vector<double>& mean, const std::vector<double>& rstd,
                  Tensor& y) override {
    const MapDims d = conv::map_dims(x);
    check_statistics(d, mean, rstd);
    double* s = statistics(d.c, mean, rstd);
    batch_norm_kernel<<<grid_for(x.numel()), kThreads>>>(x.data(), gamma.data(), beta.data(),
                                                         s + 2 * d.c, s + 3 * d.c, x.numel(), d.c,
                                                         d.voxels(), y.data());
    CUDA_CHECK(cudaGetLastError());
  }
  void batch_norm_backward_sums(const Tensor& x, const Tensor& dy, const std::vector<double>& mean,
                                const std::vector<double>& rstd,
                                std::vector<double>& sums) override {
    const MapDims d = conv::map_dims(x);
    check_statistics(d, mean, rstd);
    double* s = statistics(d.c, mean, rstd);
    this->sums(2, x.data(), dy.data(), s + 2 * d.c, d, nullptr, s);
    download(s, 2 * d.c, sums);
  }
  void batch_norm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                           const std::vector<double>& mean, const std::vector<double>& rstd,
                           const std::vector<double>& sums, int64_t count, Tensor& dx) override {
    const MapDims d = conv::map_dims(x);
    check_statistics(d, mean, rstd);
    SEXTANT_CHECK(static_cast<int64_t>(sums.size()) == 2 * d.c, "{} sums for {} channels",
                  sums.size(), d.c);
    double* s = statistics(d.c, mean, rstd);
    CUDA_CHECK(cudaMemcpy(s, sums.data(), sums.size() * sizeof(double), cudaMemcpyHostToDevice));
    batch_norm_backward_kernel<<<grid_for(x.numel()), kThreads>>>(
        x.data(), dy.data(), gamma.data(), s + 2 * d.c, s + 3 * d.c, s, static_cast<double>(count),
        x.numel(), d.c, d.voxels(), dx.data());
    CUDA_CHECK(cudaGetLastError());
  }

  void batch_norm_whole(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& y,
                        Tensor& stats) override {
    const MapDims d = conv::map_dims(x);
    auto* st = stats_of(stats, d.c);
    int64_t parts = 0;
    const Tensor partial = partial_sums(1, x.data(), nullptr, nullptr, d, parts);
    batch_statistics_kernel<<<blocks_for(d.c), kThreads>>>(
        static_cast<const double*>(partial.raw()), d.c, parts,
        static_cast<double>(d.b * d.voxels()), st);
    CUDA_CHECK(cudaGetLastError());
    batch_norm_kernel<<<grid_for(x.numel()), kThreads>>>(
        x.data(), gamma.data(), beta.data(), st, st + d.c, x.numel(), d.c, d.voxels(), y.data());
    CUDA_CHECK(cudaGetLastError());
  }
  void batch_norm_whole_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                                 const Tensor& stats, Tensor& dx, Tensor& dgamma,
                                 Tensor& dbeta) override {
    const MapDims d = conv::map_dims(x);
    const double* st = stats_of(stats, d.c);
    int64_t parts = 0;
    const Tensor partial = partial_sums(2, x.data(), dy.data(), st, d, parts);
    Tensor sums = memory_.empty({4 * d.c});  // 2 C doubles: dbeta's and dgamma's sums
    auto* sd = static_cast<double*>(sums.raw());
    batch_norm_grads_kernel<<<blocks_for(d.c), kThreads>>>(
        static_cast<const double*>(partial.raw()), d.c, parts, sd, dgamma.data(), dbeta.data());
    CUDA_CHECK(cudaGetLastError());
    batch_norm_backward_kernel<<<grid_for(x.numel()), kThreads>>>(
        x.data(), dy.data(), gamma.data(), st, st + d.c, sd, static_cast<double>(d.b * d.voxels()),
        x.numel(), d.c, d.voxels(), dx.data());
    CUDA_CHECK(cudaGetLastError());
  }

  void max_pool(const Tensor& x, int64_t kernel, int64_t stride, Tensor& y) override {
    pool(true, x, kernel, stride, y);
  }
  void max_pool_backward(const Tensor& x, const Tensor& y, const Tensor& dy, int64_t kernel,
                         int64_t stride, Tensor& dx) override {
    const WindowDims g = conv::window_dims(x, y, kernel, stride, x.dim(1));
    SEXTANT_CHECK(dy.numel() == y.numel() && dx.numel() == x.numel(),
                  "max pooling's gradients of {} and {} elements for {} and {}", dy.numel(),
                  dx.numel(), y.numel(), x.numel());
    const Geo geo = geo_of(g);
    Tensor taps = memory_.empty({y.numel()});  // int32 per output
    auto* t = static_cast<int32_t*>(taps.raw());
    max_tap_kernel<<<grid_for(y.numel()), kThreads>>>(x.data(), y.data(), geo, y.numel(), t);
    CUDA_CHECK(cudaGetLastError());
    pool_backward_kernel<<<grid_for(dx.numel()), kThreads>>>(t, dy.data(), geo, dx.numel(),
                                                             dx.data());
    CUDA_CHECK(cudaGetLastError());
  }
  void avg_pool(const Tensor& x, int64_t kernel, int64_t stride, Tensor& y) override {
    pool(false, x, kernel, stride, y);
  }
  void avg_pool_backward(const Tensor& dy, int64_t kernel, int64_t stride, Tensor& dx) override {
    const WindowDims g = conv::window_dims(dx, dy, kernel, stride, dx.dim(1));
    pool_backward_kernel<<<grid_for(dx.numel()), kThreads>>>(nullptr, dy.data(), geo_of(g),
                                                             dx.numel(), dx.data());
    CUDA_CHECK(cudaGetLastError());
  }
  void adaptive_avg_pool(const Tensor& x, const spec::MapBlock& block, const spec::MapExtent& map,
                         Tensor& y) override {
    const Adaptive a = adaptive_of(conv::adaptive_dims(x, y, block, map));
    adaptive_pool_kernel<<<grid_for(y.numel()), kThreads>>>(x.data(), a, y.numel(), y.data());
    CUDA_CHECK(cudaGetLastError());
  }
  void adaptive_avg_pool_backward(const Tensor& dy, const spec::MapBlock& block,
                                  const spec::MapExtent& map, Tensor& dx) override {
    const Adaptive a = adaptive_of(conv::adaptive_dims(dx, dy, block, map));
    adaptive_pool_backward_kernel<<<grid_for(dx.numel()), kThreads>>>(dy.data(), a, dx.numel(),
                                                                      dx.data());
    CUDA_CHECK(cudaGetLastError());
  }

 private:
  // Calls f(first sample, samples, column buffer, product buffer) over chunks of the batch whose
  // column matrix [rows, S outputs] and filter-major product [filters, S outputs] fit
  // kMaxColumnFloats together.
  template <typename F>
  void for_chunks(const WindowDims& g, int64_t filters, F f) {
    const Geo geo = geo_of(g);
    const int64_t per_sample = (geo.rows() + filters) * geo.out_voxels();
    const int64_t chunk = std::clamp<int64_t>(kMaxColumnFloats / per_sample, 1, g.in.b);
    Tensor col = memory_.empty({chunk * geo.rows() * geo.out_voxels()});
    Tensor product = memory_.empty({chunk * filters * geo.out_voxels()});
    for (int64_t b0 = 0; b0 < g.in.b; b0 += chunk)
      f(b0, std::min(chunk, g.in.b - b0), col.data(), product.data());
  }
  // The first pass of channel_sums_kernel (`stats`: the mean, then rstd, for kind 2): returns
  // the partial sums [2][C][parts] and sets `parts`.
  Tensor partial_sums(int kind, const float* x, const float* dy, const double* stats,
                      const MapDims& d, int64_t& parts) {
    // Parts of ~16k elements per channel, at most 256: enough blocks to fill the GPU when the
    // channels are few and the maps large (64 channels of 32 x 112 x 112 in ResNet's stem).
    parts = std::clamp<int64_t>(d.b * d.voxels() / 16384, 1, 256);
    Tensor partial = memory_.empty({4 * d.c * parts});  // 2 C parts doubles
    channel_sums_kernel<<<dim3(static_cast<unsigned>(d.c), static_cast<unsigned>(parts)),
                          kSumThreads>>>(kind, x, dy, stats,
                                         stats == nullptr ? nullptr : stats + d.c, d.b, d.c,
                                         d.voxels(), static_cast<double*>(partial.raw()));
    CUDA_CHECK(cudaGetLastError());
    return partial;
  }
  // The per-channel sums into db (kind 0: db[c] += the sum) or out (sums[c], sums[C + c]).
  void sums(int kind, const float* x, const float* dy, const double* stats, const MapDims& d,
            float* db, double* out) {
    int64_t parts = 0;
    const Tensor partial = partial_sums(kind, x, dy, stats, d, parts);
    channel_sums_finish_kernel<<<blocks_for(d.c), kThreads>>>(
        kind, static_cast<const double*>(partial.raw()), d.c, parts, db, out);
    CUDA_CHECK(cudaGetLastError());
  }
  void permute(const float* x, int64_t samples, int64_t channels, int64_t voxels,
               bool to_channel_major, float* y) {
    channel_major_kernel<<<grid_for(samples * channels * voxels), kThreads>>>(
        x, samples, channels, voxels, to_channel_major, y);
    CUDA_CHECK(cudaGetLastError());
  }
  // One chunk's weight gradient: the columns of `windowed` (the map the window slides over), the
  // filter-major copy of `filtered` (the map of the filters' outputs) and dW [filters, rows] +=
  // filtered col^T, every sample of the chunk in one GEMM (k = samples x outputs). A convolution's
  // (windowed x, filtered dy) and a transposed one's (windowed dy, filtered x). Leaves the columns
  // in `col` and the copy in `product`.
  void weight_gradient(const Geo& geo, int64_t filters, const float* windowed,
                       const float* filtered, int64_t count, float* col, float* product,
                       float* dw) {
    launch_im2col(windowed, geo, count, col);
    permute(filtered, count, filters, geo.out_voxels(), true, product);
    gemm(false, true, filters, geo.rows(), count * geo.out_voxels(), 1.0f, product, col, 1.0f, dw);
  }
  void launch_im2col(const float* x, const Geo& g, int64_t samples, float* col) {
    im2col_kernel<<<grid_for(samples * g.rows() * g.out_voxels()), kThreads>>>(x, g, samples, col);
    CUDA_CHECK(cudaGetLastError());
  }
  void launch_col2im(const float* col, const Geo& g, int64_t samples, float* x) {
    col2im_kernel<<<grid_for(samples * g.c * g.in_voxels()), kThreads>>>(col, g, samples, x);
    CUDA_CHECK(cudaGetLastError());
  }
  // Row-major C [m, n] = alpha op(A) op(B) + beta C, op(A) [m, k], op(B) [k, n]; cuBLAS sees the
  // column-major transposes: C^T = op(B)^T op(A)^T.
  void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
            const float* b, float beta, float* c) {
    gemm_batched(ta, tb, m, n, k, alpha, a, 0, b, 0, beta, c, 0, 1);
  }
  // The same over `count` products, A, B and C at strides sa, sb and sc (elements; 0 shares one).
  void gemm_batched(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                    int64_t sa, const float* b, int64_t sb, float beta, float* c, int64_t sc,
                    int64_t count) {
    const int lda = static_cast<int>(ta ? m : k), ldb = static_cast<int>(tb ? k : n);
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        blas_, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(n),
        static_cast<int>(m), static_cast<int>(k), &alpha, b, CUDA_R_32F, ldb, sb, a, CUDA_R_32F,
        lda, sa, &beta, c, CUDA_R_32F, static_cast<int>(n), sc, static_cast<int>(count), compute_,
        CUBLAS_GEMM_DEFAULT));
  }
  void pool(bool max, const Tensor& x, int64_t kernel, int64_t stride, Tensor& y) {
    const WindowDims g = conv::window_dims(x, y, kernel, stride, x.dim(1));
    pool_kernel<<<grid_for(y.numel()), kThreads>>>(max, x.data(), geo_of(g), y.numel(), y.data());
    CUDA_CHECK(cudaGetLastError());
  }
  static Concat concat_of(const conv::ConcatDims& c) {
    return {c.kept.c, c.kept.d, c.kept.h, c.kept.w, c.x.c, c.x.d,
            c.x.h,    c.x.w,    c.at_d,   c.at_h,   c.at_w};
  }
  static Adaptive adaptive_of(const conv::AdaptiveDims& a) {
    return {a.in.d,   a.in.h, a.in.w, a.out.d, a.out.h, a.out.w,
            a.plane0, a.row0, a.col0, a.map_d, a.map_h, a.map_w};
  }
  static double* stats_of(const Tensor& stats, int64_t channels) {
    SEXTANT_CHECK(stats.numel() >= 4 * channels, "batch statistics of {} slots for {} channels",
                  stats.numel(), channels);
    return static_cast<double*>(stats.raw());
  }
  static void check_statistics(const MapDims& d, const std::vector<double>& mean,
                               const std::vector<double>& rstd) {
    SEXTANT_CHECK(
        static_cast<int64_t>(mean.size()) == d.c && static_cast<int64_t>(rstd.size()) == d.c,
        "batch statistics of {} and {} channels for {}", mean.size(), rstd.size(),
        conv::describe(d));
  }
  // Device doubles for per-channel work: [0, 2C) sums, [2C, 3C) the mean, [3C, 4C) rstd
  // (uploaded when given).
  double* statistics(int64_t channels, const std::vector<double>& mean,
                     const std::vector<double>& rstd) {
    stats_ = memory_.empty({8 * channels});  // 4C doubles
    auto* s = static_cast<double*>(stats_.raw());
    if (!mean.empty())
      CUDA_CHECK(cudaMemcpy(s + 2 * channels, mean.data(), mean.size() * sizeof(double),
                            cudaMemcpyHostToDevice));
    if (!rstd.empty())
      CUDA_CHECK(cudaMemcpy(s + 3 * channels, rstd.data(), rstd.size() * sizeof(double),
                            cudaMemcpyHostToDevice));
    return s;
  }
  void download(const double* d, int64_t n, std::vector<double>& out) {
    CUDA_CHECK(cudaGetLastError());
    out.resize(static_cast<size_t>(n));
    CUDA_CHECK(cudaMemcpy(out.data(), d, out.size() * sizeof(double), cudaMemcpyDeviceToHost));
  }

  cublasHandle_t blas_;
  cublasComputeType_t compute_;
  DeviceMemory& memory_;
  Tensor stats_;  // kept until the next per-channel call: the kernels using it are in flight
};

}  // namespace

std::unique_ptr<ConvolutionKernels> make_cuda_convolution(cublasHandle_t blas,
                                                          cublasComputeType_t compute,
                                                          DeviceMemory& memory) {
  return std::make_unique<CudaConvolution>(blas, compute, memory);
}

}  // namespace sextant::exec
