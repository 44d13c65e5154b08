// The transformer MLP's activation functions on the backend, by the model's kind: one home for the
// dense MLP and the mixture of experts.
#pragma once

#include "sextant/exec/kernels/elementwise.hpp"
#include "sextant/spec/model_spec.hpp"

namespace sextant::exec {

inline void activation(ElementwiseKernels& be, spec::Activation kind, const Tensor& x, Tensor& y) {
  switch (kind) {
    case spec::Activation::kGelu:
    case spec::Activation::kGeluNew:  // the same function in one kernel (model_spec.hpp)
      be.gelu(x, y);
      break;
    case spec::Activation::kRelu:
      be.relu(x, y);
      break;
    case spec::Activation::kSwiglu:
      be.swiglu(x, y);
      break;
  }
}

inline void activation_backward(ElementwiseKernels& be, spec::Activation kind, const Tensor& x,
                                const Tensor& dy, Tensor& dx) {
  switch (kind) {
    case spec::Activation::kGelu:
    case spec::Activation::kGeluNew:
      be.gelu_backward(x, dy, dx);
      break;
    case spec::Activation::kRelu:
      be.relu_backward(x, dy, dx);
      break;
    case spec::Activation::kSwiglu:
      be.swiglu_backward(x, dy, dx);
      break;
  }
}

}  // namespace sextant::exec
