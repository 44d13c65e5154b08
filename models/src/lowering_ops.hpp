// The op builders every model's lowering uses (models/src/*_lowering.cpp): a GEMM, a batched
// GEMM, a memory-bound op, a collective, and their backward forms. Private to models/.
#pragma once

#include <string>
#include <vector>

#include "sextant/models/lowering.hpp"

namespace sextant::models {

using spec::CollectiveKind;
using spec::OpClass;

// Sizes are element counts; `e` is bytes per element.
Op gemm(const OpName& name, int64_t m, int64_t n, int64_t k, int64_t e, TpSplit split);
// Batched GEMM of the attention core: `batch` independent (m x k) @ (k x n) products.
Op batched_gemm(const OpName& name, int64_t batch, int64_t m, int64_t n, int64_t k, int64_t e);
Op memory_op(const OpName& name, OpClass op_class, int64_t bytes, TpSplit split,
             std::vector<int64_t> shape = {});
Op comm_op(const OpName& name, CollectiveKind kind, int64_t bytes);
// Backward of a GEMM: data gradient and weight gradient, each as costly as the forward.
Op gemm_backward(const Op& fwd);
Op memory_backward(const Op& fwd, double factor);
// Scales a memory-bound op to the kernels a less fused stack runs for it: `passes` times the
// bytes of the fused kernel, in `kernels` launches.
Op unfused(Op op, double passes, int kernels);

}  // namespace sextant::models
