// A backend's normalisations, per row over the last dimension (backend.hpp).
#pragma once

#include "sextant/exec/tensor.hpp"

namespace sextant::exec {

// The epsilons under the square roots, for every backend: PyTorch's LayerNorm default, and Llama
// 2's rms_norm_eps.
inline constexpr float kLayerNormEps = 1e-5f;
inline constexpr float kRmsNormEps = 1e-5f;

class NormKernels {
 public:
  virtual ~NormKernels() = default;

  // Layer norm; saves mean and rstd per row.
  virtual void layernorm(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& y,
                         Tensor& mean, Tensor& rstd) = 0;
  virtual void layernorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                  const Tensor& rstd, const Tensor& dy, Tensor& dx, Tensor& dgamma,
                                  Tensor& dbeta) = 0;
  // RMS norm (Llama): y = x * rstd * gamma, rstd = 1 / sqrt(mean(x^2) + eps); saves rstd.
  virtual void rmsnorm(const Tensor& x, const Tensor& gamma, Tensor& y, Tensor& rstd) = 0;
  virtual void rmsnorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& rstd,
                                const Tensor& dy, Tensor& dx, Tensor& dgamma) = 0;
};

}  // namespace sextant::exec
