// A backend's kernels of convolutional networks (backend.hpp): convolution and its transpose,
// batch normalisation split in its sums and their use, pooling, U-Net's cropped concat and the
// per-pixel loss. fp32 tensors in NCHW order, or NCDHW for volumes; the semantics, shapes and
// conventions are those of the host kernels in conv_kernels.hpp, which the CPU backend runs and
// the CUDA backend's own kernels are tested against (tests/exec/cuda_kernels_test.cpp).
//
// The sums of batch normalisation come back to the host as doubles, whatever the backend: ranks
// holding blocks of one map all-reduce them between the two halves (Dryden et al., IPDPS'19,
// §III-B), and they are a few numbers per channel.
#pragma once

#include <cstdint>
#include <vector>

#include "sextant/exec/tensor.hpp"

// Declared only: the CUDA sources build as C++17 and cannot read the spec's C++20 headers.
namespace sextant::spec {
struct MapBlock;   // spatial_split.hpp
struct MapExtent;  // spatial_split.hpp
}  // namespace sextant::spec

namespace sextant::exec {

// Batch normalisation's epsilon (PyTorch's BatchNorm default), for every backend.
inline constexpr double kBatchNormEps = 1e-5;

class ConvolutionKernels {
 public:
  virtual ~ConvolutionKernels() = default;

  // y = w * x (+ bias), sliding over every position of the (padded) input; stride on every axis.
  virtual void convolution(const Tensor& x, const Tensor& w, const Tensor* bias, int64_t stride,
                           Tensor& y) = 0;
  // dx (overwritten, when given), dw += and db += (when given).
  virtual void convolution_backward(const Tensor& x, const Tensor& w, const Tensor& dy,
                                    int64_t stride, Tensor* dx, Tensor& dw, Tensor* db) = 0;
  virtual void transposed_convolution(const Tensor& x, const Tensor& w, int64_t stride,
                                      Tensor& y) = 0;
  virtual void transposed_convolution_backward(const Tensor& x, const Tensor& w, const Tensor& dy,
                                               int64_t stride, Tensor* dx, Tensor& dw) = 0;
  virtual void crop_concat(const Tensor& kept, const Tensor& x, Tensor& y) = 0;
  virtual void crop_concat_backward(const Tensor& dy, Tensor& dkept, Tensor& dx) = 0;
  // The sum over the samples of each sample's mean loss over `map_pixels` pixels (0: the logits'
  // own); dlogits (when given) gets `scale` x its gradient.
  virtual double pixel_cross_entropy(const Tensor& logits, const std::vector<int32_t>& labels,
                                     float scale, Tensor* dlogits, int64_t map_pixels) = 0;
  virtual void add_channel_bias(Tensor& y, const Tensor& bias) = 0;
  virtual void channel_bias_backward(const Tensor& dy, Tensor& db) = 0;

  // Batch normalisation in training mode: per channel sums of x and x^2 (sums[c], sums[C + c]);
  // y from the statistics; the backward's sums of dy and dy * xhat; dx from the whole maps'.
  virtual void channel_sums(const Tensor& x, std::vector<double>& sums) = 0;
  virtual void batch_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                          const std::vector<double>& mean, const std::vector<double>& rstd,
                          Tensor& y) = 0;
  virtual void batch_norm_backward_sums(const Tensor& x, const Tensor& dy,
                                        const std::vector<double>& mean,
                                        const std::vector<double>& rstd,
                                        std::vector<double>& sums) = 0;
  virtual void batch_norm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                                   const std::vector<double>& mean, const std::vector<double>& rstd,
                                   const std::vector<double>& sums, int64_t count, Tensor& dx) = 0;

  // The same for maps no other rank shares a block of: the statistics stay with the backend
  // (`stats`, 4 x channels fp32 slots holding each channel's mean and 1 / sqrt(var + eps) as
  // doubles), so a GPU never waits for the host between the sums and their use. Forward fills
  // stats and y; backward adds the gamma and beta gradients (dgamma +=, dbeta +=) and writes dx.
  // The arithmetic is that of the four kernels above, in the same order.
  virtual void batch_norm_whole(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& y,
                                Tensor& stats) = 0;
  virtual void batch_norm_whole_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                                         const Tensor& stats, Tensor& dx, Tensor& dgamma,
                                         Tensor& dbeta) = 0;

  // Max pooling; its backward finds each window's first maximum again in x (no index tensor to
  // keep: the window input is cached anyway) and routes dy there.
  virtual void max_pool(const Tensor& x, int64_t kernel, int64_t stride, Tensor& y) = 0;
  virtual void max_pool_backward(const Tensor& x, const Tensor& y, const Tensor& dy, int64_t kernel,
                                 int64_t stride, Tensor& dx) = 0;
  virtual void avg_pool(const Tensor& x, int64_t kernel, int64_t stride, Tensor& y) = 0;
  virtual void avg_pool_backward(const Tensor& dy, int64_t kernel, int64_t stride, Tensor& dx) = 0;
  // Adaptive average pooling of block `block` of a map `map` (each block's share of every bin).
  virtual void adaptive_avg_pool(const Tensor& x, const spec::MapBlock& block,
                                 const spec::MapExtent& map, Tensor& y) = 0;
  virtual void adaptive_avg_pool_backward(const Tensor& dy, const spec::MapBlock& block,
                                          const spec::MapExtent& map, Tensor& dx) = 0;
};

}  // namespace sextant::exec
