// The CUDA backend's fused causal attention (flash_attention.cu): AttentionKernels' flash_*
// calls on device tensors of either storage type (fp32, or bf16 on tensor cores), launched on the
// default stream like the backend's other kernels.
#pragma once

#include "sextant/exec/kernels/attention.hpp"

namespace sextant::exec::cuda_flash {

void forward(const Tensor& qkv, const QkvLayout& l, Tensor& out, Tensor& lse);
void backward_prep(const Tensor& out, const Tensor& dout, const QkvLayout& l, Tensor& delta);
void backward(const Tensor& qkv, const Tensor& dout, const Tensor& lse, const Tensor& delta,
              const QkvLayout& l, Tensor& dqkv);

}  // namespace sextant::exec::cuda_flash
