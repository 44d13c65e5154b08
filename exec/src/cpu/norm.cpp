// LayerNorm (Ba et al. 2016) and RMSNorm (Zhang & Sennrich 2019), forward and backward, with fp64
// row statistics so a row's reduction order cannot drift between layouts.
#include "sextant/exec/kernels/norm.hpp"

#include <cmath>

#include "cpu_backend.hpp"
#include "sextant/spec/error.hpp"
#include "tensor_maps.hpp"

namespace sextant::exec::cpu {

void CpuBackend::layernorm(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& y,
                           Tensor& mean, Tensor& rstd) {
  const int64_t n = rows_of(x), c = cols_of(x);
  const float* g = gamma.data();
  const float* b = beta.data();
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x.data() + i * c;
    double s = 0, ss = 0;
    for (int64_t j = 0; j < c; ++j) s += xi[j];
    const double mu = s / static_cast<double>(c);
    for (int64_t j = 0; j < c; ++j) ss += (xi[j] - mu) * (xi[j] - mu);
    const float r =
        static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(c) + kLayerNormEps));
    float* yi = y.data() + i * c;
    for (int64_t j = 0; j < c; ++j) yi[j] = (xi[j] - static_cast<float>(mu)) * r * g[j] + b[j];
    mean.data()[i] = static_cast<float>(mu);
    rstd.data()[i] = r;
  }
}

void CpuBackend::layernorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                    const Tensor& rstd, const Tensor& dy, Tensor& dx,
                                    Tensor& dgamma, Tensor& dbeta) {
  const int64_t n = rows_of(x), c = cols_of(x);
  const float* g = gamma.data();
  float *dg = dgamma.data(), *db = dbeta.data();
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x.data() + i * c;
    const float* dyi = dy.data() + i * c;
    const float mu = mean.data()[i], r = rstd.data()[i];
    double sum_dxhat = 0, sum_dxhat_xhat = 0;
    for (int64_t j = 0; j < c; ++j) {
      const float xhat = (xi[j] - mu) * r;
      const float dxhat = dyi[j] * g[j];
      sum_dxhat += dxhat;
      sum_dxhat_xhat += dxhat * xhat;
      dg[j] += dyi[j] * xhat;
      db[j] += dyi[j];
    }
    const float m1 = static_cast<float>(sum_dxhat / static_cast<double>(c));
    const float m2 = static_cast<float>(sum_dxhat_xhat / static_cast<double>(c));
    float* dxi = dx.data() + i * c;
    for (int64_t j = 0; j < c; ++j) {
      const float xhat = (xi[j] - mu) * r;
      dxi[j] = r * (dyi[j] * g[j] - m1 - xhat * m2);
    }
  }
}

void CpuBackend::rmsnorm(const Tensor& x, const Tensor& gamma, Tensor& y, Tensor& rstd) {
  const int64_t n = rows_of(x), c = cols_of(x);
  const float* g = gamma.data();
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x.data() + i * c;
    double ss = 0;
    for (int64_t j = 0; j < c; ++j) ss += static_cast<double>(xi[j]) * xi[j];
    const float r = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(c) + kRmsNormEps));
    float* yi = y.data() + i * c;
    for (int64_t j = 0; j < c; ++j) yi[j] = xi[j] * r * g[j];
    rstd.data()[i] = r;
  }
}

void CpuBackend::rmsnorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& rstd,
                                  const Tensor& dy, Tensor& dx, Tensor& dgamma) {
  // xhat = x r; dx = r (dxhat - xhat mean(dxhat xhat)) with dxhat = dy gamma.
  const int64_t n = rows_of(x), c = cols_of(x);
  const float* g = gamma.data();
  float* dg = dgamma.data();
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x.data() + i * c;
    const float* dyi = dy.data() + i * c;
    const float r = rstd.data()[i];
    double sum_dxhat_xhat = 0;
    for (int64_t j = 0; j < c; ++j) {
      const float xhat = xi[j] * r;
      sum_dxhat_xhat += dyi[j] * g[j] * xhat;
      dg[j] += dyi[j] * xhat;
    }
    const float m2 = static_cast<float>(sum_dxhat_xhat / static_cast<double>(c));
    float* dxi = dx.data() + i * c;
    for (int64_t j = 0; j < c; ++j) dxi[j] = r * (dyi[j] * g[j] - xi[j] * r * m2);
  }
}

}  // namespace sextant::exec::cpu
