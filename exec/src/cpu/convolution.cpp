// The CPU backend's CNN kernels: the host kernels of conv_kernels.hpp (im2col + Eigen GEMMs),
// which the CPU-only tests also call directly.
#include <cstring>

#include "cnn/conv_geometry.hpp"
#include "cpu_backend.hpp"
#include "sextant/exec/conv_kernels.hpp"
#include "sextant/spec/error.hpp"

namespace sextant::exec::cpu {

void CpuBackend::convolution(const Tensor& x, const Tensor& w, const Tensor* bias, int64_t stride,
                             Tensor& y) {
  conv::convolution(x, w, bias, stride, y);
}
void CpuBackend::convolution_backward(const Tensor& x, const Tensor& w, const Tensor& dy,
                                      int64_t stride, Tensor* dx, Tensor& dw, Tensor* db) {
  conv::convolution_backward(x, w, dy, stride, dx, dw, db);
}
void CpuBackend::transposed_convolution(const Tensor& x, const Tensor& w, int64_t stride,
                                        Tensor& y) {
  conv::transposed_convolution(x, w, stride, y);
}
void CpuBackend::transposed_convolution_backward(const Tensor& x, const Tensor& w, const Tensor& dy,
                                                 int64_t stride, Tensor* dx, Tensor& dw) {
  conv::transposed_convolution_backward(x, w, dy, stride, dx, dw);
}
void CpuBackend::crop_concat(const Tensor& kept, const Tensor& x, Tensor& y) {
  conv::crop_concat(kept, x, y);
}
void CpuBackend::crop_concat_backward(const Tensor& dy, Tensor& dkept, Tensor& dx) {
  conv::crop_concat_backward(dy, dkept, dx);
}
double CpuBackend::pixel_cross_entropy(const Tensor& logits, const std::vector<int32_t>& labels,
                                       float scale, Tensor* dlogits, int64_t map_pixels) {
  return conv::pixel_cross_entropy(logits, labels, scale, dlogits, map_pixels);
}
void CpuBackend::add_channel_bias(Tensor& y, const Tensor& bias) {
  conv::add_channel_bias(y, bias);
}
void CpuBackend::channel_bias_backward(const Tensor& dy, Tensor& db) {
  conv::channel_bias_backward(dy, db);
}
void CpuBackend::channel_sums(const Tensor& x, std::vector<double>& sums) {
  conv::channel_sums(x, sums);
}
void CpuBackend::batch_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                            const std::vector<double>& mean, const std::vector<double>& rstd,
                            Tensor& y) {
  conv::batch_norm(x, gamma, beta, mean, rstd, y);
}
void CpuBackend::batch_norm_backward_sums(const Tensor& x, const Tensor& dy,
                                          const std::vector<double>& mean,
                                          const std::vector<double>& rstd,
                                          std::vector<double>& sums) {
  conv::batch_norm_backward_sums(x, dy, mean, rstd, sums);
}
void CpuBackend::batch_norm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                                     const std::vector<double>& mean,
                                     const std::vector<double>& rstd,
                                     const std::vector<double>& sums, int64_t count, Tensor& dx) {
  conv::batch_norm_backward(x, dy, gamma, mean, rstd, sums, count, dx);
}
namespace {

// The mean and rstd of `channels` channels as doubles in a stats tensor (4 x channels fp32 slots).
double* stats_of(const Tensor& stats, int64_t channels) {
  SEXTANT_CHECK(stats.numel() >= 4 * channels, "batch statistics of {} slots for {} channels",
                stats.numel(), channels);
  return static_cast<double*>(stats.raw());
}

}  // namespace

void CpuBackend::batch_norm_whole(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                  Tensor& y, Tensor& stats) {
  const conv::MapDims d = conv::map_dims(x);
  std::vector<double> sums, mean, rstd;
  conv::channel_sums(x, sums);
  conv::batch_statistics(sums, d.b * d.voxels(), mean, rstd);
  conv::batch_norm(x, gamma, beta, mean, rstd, y);
  double* st = stats_of(stats, d.c);
  std::memcpy(st, mean.data(), mean.size() * sizeof(double));
  std::memcpy(st + d.c, rstd.data(), rstd.size() * sizeof(double));
}

void CpuBackend::batch_norm_whole_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                                           const Tensor& stats, Tensor& dx, Tensor& dgamma,
                                           Tensor& dbeta) {
  const conv::MapDims d = conv::map_dims(x);
  const double* st = stats_of(stats, d.c);
  const std::vector<double> mean(st, st + d.c), rstd(st + d.c, st + 2 * d.c);
  std::vector<double> sums;
  conv::batch_norm_backward_sums(x, dy, mean, rstd, sums);
  for (int64_t c = 0; c < d.c; ++c) {
    dbeta.data()[c] += static_cast<float>(sums[static_cast<size_t>(c)]);
    dgamma.data()[c] += static_cast<float>(sums[static_cast<size_t>(d.c + c)]);
  }
  conv::batch_norm_backward(x, dy, gamma, mean, rstd, sums, d.b * d.voxels(), dx);
}

void CpuBackend::max_pool(const Tensor& x, int64_t kernel, int64_t stride, Tensor& y) {
  conv::max_pool(x, kernel, stride, y);
}
void CpuBackend::max_pool_backward(const Tensor& x, const Tensor& y, const Tensor& dy,
                                   int64_t kernel, int64_t stride, Tensor& dx) {
  conv::max_pool_backward(x, y, dy, kernel, stride, dx);
}
void CpuBackend::avg_pool(const Tensor& x, int64_t kernel, int64_t stride, Tensor& y) {
  conv::avg_pool(x, kernel, stride, y);
}
void CpuBackend::avg_pool_backward(const Tensor& dy, int64_t kernel, int64_t stride, Tensor& dx) {
  conv::avg_pool_backward(dy, kernel, stride, dx);
}
void CpuBackend::adaptive_avg_pool(const Tensor& x, const spec::MapBlock& block,
                                   const spec::MapExtent& map, Tensor& y) {
  conv::adaptive_avg_pool(x, block, map, y);
}
void CpuBackend::adaptive_avg_pool_backward(const Tensor& dy, const spec::MapBlock& block,
                                            const spec::MapExtent& map, Tensor& dx) {
  conv::adaptive_avg_pool_backward(dy, block, map, dx);
}

}  // namespace sextant::exec::cpu
