// A backend's optimizer kernels: gradient norms and AdamW, on fp32 (backend.hpp).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "sextant/exec/tensor.hpp"

namespace sextant::exec {

class OptimizerKernels {
 public:
  virtual ~OptimizerKernels() = default;

  // Sum of squares of x (fp32).
  virtual double sum_squares(const Tensor& x) = 0;
  // The same over spans [offset, offset + count) of a flat fp32 tensor, added up (one launch and
  // one transfer on CUDA, rather than one per span).
  virtual double sum_squares_spans(const Tensor& flat,
                                   const std::vector<std::pair<int64_t, int64_t>>& spans);
  // AdamW on a parameter and its gradient (fp32), bias-corrected, decoupled weight decay.
  virtual void adamw(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, int64_t step,
                     float lr, float beta1, float beta2, float eps, float weight_decay,
                     float grad_scale) = 0;
  // AdamW over many spans of flat fp32 buffers at once (multi-tensor: the CUDA backend updates
  // every span in one launch). Each span is [offset, offset + count) with its own weight decay.
  struct AdamwSpan {
    int64_t offset = 0, count = 0;
    float weight_decay = 0;
  };
  virtual void adamw_spans(Tensor& params, const Tensor& grads, Tensor& m, Tensor& v,
                           const std::vector<AdamwSpan>& spans, int64_t step, float lr, float beta1,
                           float beta2, float eps, float grad_scale);
};

}  // namespace sextant::exec
