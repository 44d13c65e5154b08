// Activations (GELU's tanh form as GPT-2 uses it, ReLU, SwiGLU), residual adds and scaling.
#include <algorithm>
#include <cmath>

#include "cpu_backend.hpp"
#include "sextant/spec/error.hpp"
#include "tensor_maps.hpp"

namespace sextant::exec::cpu {

namespace {

constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)

}  // namespace

// Eigen's array tanh is vectorised; std::tanh in a loop is not.
void CpuBackend::gelu(const Tensor& x, Tensor& y) {
  auto v = Eigen::Map<const Eigen::ArrayXf>(x.data(), x.numel());
  Eigen::Map<Eigen::ArrayXf>(y.data(), y.numel()) =
      0.5f * v * (1.0f + (kGeluC * (v + 0.044715f * v.cube())).tanh());
}

void CpuBackend::gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  auto v = Eigen::Map<const Eigen::ArrayXf>(x.data(), x.numel());
  auto d = Eigen::Map<const Eigen::ArrayXf>(dy.data(), dy.numel());
  Eigen::ArrayXf t = (kGeluC * (v + 0.044715f * v.cube())).tanh();
  Eigen::Map<Eigen::ArrayXf>(dx.data(), dx.numel()) =
      d * (0.5f * (1.0f + t) +
           0.5f * v * (1.0f - t.square()) * kGeluC * (1.0f + 3.0f * 0.044715f * v.square()));
}

void CpuBackend::relu(const Tensor& x, Tensor& y) {
  const float* xv = x.data();
  float* yv = y.data();
  for (int64_t i = 0; i < x.numel(); ++i) yv[i] = std::max(0.0f, xv[i]);
}

void CpuBackend::relu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  const float *xv = x.data(), *dyv = dy.data();
  float* dxv = dx.data();
  for (int64_t i = 0; i < x.numel(); ++i) dxv[i] = xv[i] > 0 ? dyv[i] : 0.0f;
}

void CpuBackend::swiglu(const Tensor& x, Tensor& y) {
  const int64_t n = rows_of(x), f = cols_of(x) / 2;
  for (int64_t i = 0; i < n; ++i) {
    const float* gate = x.data() + i * 2 * f;
    const float* up = gate + f;
    float* yi = y.data() + i * f;
    for (int64_t j = 0; j < f; ++j) {
      const float s = gate[j] / (1.0f + std::exp(-gate[j]));
      yi[j] = s * up[j];
    }
  }
}

void CpuBackend::swiglu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  const int64_t n = rows_of(x), f = cols_of(x) / 2;
  for (int64_t i = 0; i < n; ++i) {
    const float* gate = x.data() + i * 2 * f;
    const float* up = gate + f;
    float* dgate = dx.data() + i * 2 * f;
    float* dup = dgate + f;
    const float* dyi = dy.data() + i * f;
    for (int64_t j = 0; j < f; ++j) {
      const float sig = 1.0f / (1.0f + std::exp(-gate[j]));
      const float s = gate[j] * sig;
      const float d = dyi[j];
      dup[j] = d * s;
      dgate[j] = d * up[j] * (sig * (1.0f + gate[j] * (1.0f - sig)));
    }
  }
}

void CpuBackend::add(const Tensor& a, const Tensor& b, Tensor& y) {
  const float *av = a.data(), *bv = b.data();
  float* yv = y.data();
  for (int64_t i = 0; i < a.numel(); ++i) yv[i] = av[i] + bv[i];
}

void CpuBackend::scale(Tensor& x, float factor) {
  float* xv = x.data();
  for (int64_t i = 0; i < x.numel(); ++i) xv[i] *= factor;
}

}  // namespace sextant::exec::cpu
