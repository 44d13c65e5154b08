// A backend's matrix products and bias terms (backend.hpp states the conventions).
#pragma once

#include "sextant/exec/tensor.hpp"

namespace sextant::exec {

class LinearKernels {
 public:
  virtual ~LinearKernels() = default;

  // y[rows, out] = x[rows, in] @ w[in, out] (+ b); accumulate: y += instead of =.
  virtual void matmul(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y,
                      bool accumulate = false) = 0;
  // dx = dy @ w^T (accumulate optional); dw += x^T @ dy; db += sum_rows dy.
  virtual void matmul_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx,
                               Tensor& dw, Tensor* db, bool accumulate_dx = false) = 0;
  // y[rows, n] = x[rows, k] @ w[n, k]^T: a weight stored transposed (the tied output layer uses
  // the embedding table [vocab, hidden] this way).
  virtual void matmul_nt(const Tensor& x, const Tensor& w, Tensor& y) = 0;
  // dx = dy @ w; dw += dy^T @ x.
  virtual void matmul_nt_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dx,
                                  Tensor& dw) = 0;
  // y[rows, n] += b[n] (broadcast over rows); db[n] += column sums of dy[rows, n].
  virtual void bias_add(Tensor& y, const Tensor& b) = 0;
  virtual void bias_backward(const Tensor& dy, Tensor& db) = 0;
};

}  // namespace sextant::exec
