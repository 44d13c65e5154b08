#include "gpt_layer.hpp"

namespace sextant::exec {

Tensor GptLayer::act(std::vector<int64_t> shape) const {
  return backend().empty(std::move(shape), backend().activation_dtype());
}

void GptLayer::norm(const Tensor& x, const Param& gamma, const Param* beta, Tensor& y, Tensor& mean,
                    Tensor& rstd) const {
  if (layernorm()) {
    backend().layernorm(x, gamma.compute, beta->compute, y, mean, rstd);
  } else {
    backend().rmsnorm(x, gamma.compute, y, rstd);
  }
}

void GptLayer::norm_backward(const Tensor& x, Param& gamma, Param* beta, const Tensor& mean,
                             const Tensor& rstd, const Tensor& dy, Tensor& dx) const {
  if (layernorm()) {
    backend().layernorm_backward(x, gamma.compute, mean, rstd, dy, dx, gamma.grad, beta->grad);
  } else {
    backend().rmsnorm_backward(x, gamma.compute, rstd, dy, dx, gamma.grad);
  }
}

}  // namespace sextant::exec
