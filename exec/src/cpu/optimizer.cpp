// Sums of squares (the gradient norm) and torch.optim.AdamW.
#include <cmath>

#include "cpu_backend.hpp"
#include "sextant/spec/error.hpp"
#include "tensor_maps.hpp"

namespace sextant::exec::cpu {

double CpuBackend::sum_squares(const Tensor& x) {
  double s = 0;
  const float* xv = x.data();
  for (int64_t i = 0; i < x.numel(); ++i) s += static_cast<double>(xv[i]) * xv[i];
  return s;
}

void CpuBackend::adamw(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, int64_t step,
                       float lr, float beta1, float beta2, float eps, float weight_decay,
                       float grad_scale) {
  // torch.optim.AdamW: decoupled decay, then the bias-corrected Adam step.
  const float bc1 = 1.0f - std::pow(beta1, static_cast<float>(step));
  const float bc2 = 1.0f - std::pow(beta2, static_cast<float>(step));
  const float step_size = lr / bc1;
  const float bc2_sqrt = std::sqrt(bc2);
  const float* gv = grad.data();
  float *pv = param.data(), *mv = m.data(), *vv = v.data();
  for (int64_t i = 0; i < param.numel(); ++i) {
    const float g = gv[i] * grad_scale;
    float& p = pv[i];
    p *= 1.0f - lr * weight_decay;
    float& mi = mv[i];
    float& vi = vv[i];
    mi = beta1 * mi + (1.0f - beta1) * g;
    vi = beta2 * vi + (1.0f - beta2) * g * g;
    p -= step_size * mi / (std::sqrt(vi) / bc2_sqrt + eps);
  }
}

}  // namespace sextant::exec::cpu
