// A backend's elementwise kernels: activations, sums and scaling (backend.hpp).
#pragma once

#include "sextant/exec/tensor.hpp"

namespace sextant::exec {

class ElementwiseKernels {
 public:
  virtual ~ElementwiseKernels() = default;

  // GELU, tanh approximation (GPT-2).
  virtual void gelu(const Tensor& x, Tensor& y) = 0;
  virtual void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) = 0;
  virtual void relu(const Tensor& x, Tensor& y) = 0;
  virtual void relu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) = 0;
  // SwiGLU on x = [gate | up] (each [rows, f]): y = silu(gate) * up.
  virtual void swiglu(const Tensor& x, Tensor& y) = 0;
  virtual void swiglu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) = 0;
  // y = a + b (elementwise); y may alias a.
  virtual void add(const Tensor& a, const Tensor& b, Tensor& y) = 0;
  virtual void scale(Tensor& x, float factor) = 0;
};

}  // namespace sextant::exec
