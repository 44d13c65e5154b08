// The op builders of the lowerings.
#include "lowering_ops.hpp"

#include "sextant/spec/error.hpp"

namespace sextant::models {

// Builders for the three kinds of op. Sizes are element counts; `e` is bytes per element.
bool fp8_recipe_quantizes(OpId id) {
  switch (id) {
    case OpId::kAttnQkv:
    case OpId::kAttnProj:
    case OpId::kMlpFc1:
    case OpId::kMlpFc2:
    case OpId::kMoeFc1:
    case OpId::kMoeFc2:
    case OpId::kMoeSharedFc1:
    case OpId::kMoeSharedFc2:
      return true;
    default:
      return false;
  }
}

Op gemm(const OpName& name, int64_t m, int64_t n, int64_t k, int64_t e, TpSplit split) {
  Op op;
  op.id = name.id();
  op.name = name.str();
  op.op_class = OpClass::kGemm;
  op.flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  op.bytes = (m * k + k * n + m * n) * e;
  op.shape = {m, n, k};
  op.matmuls = {{1, m, n, k}};
  op.split = split;
  return op;
}

// Batched GEMM of the attention core: `batch` independent (m x k) @ (k x n) products.
Op batched_gemm(const OpName& name, int64_t batch, int64_t m, int64_t n, int64_t k, int64_t e) {
  Op op;
  op.id = name.id();
  op.name = name.str();
  op.op_class = OpClass::kAttention;
  op.flops = 2.0 * static_cast<double>(batch) * static_cast<double>(m) * static_cast<double>(n) *
             static_cast<double>(k);
  op.bytes = batch * (m * k + k * n + m * n) * e;
  op.shape = {batch, m, n, k};
  op.matmuls = {{batch, m, n, k}};
  op.split = TpSplit::kHead;
  op.core_attention = true;
  return op;
}

Op memory_op(const OpName& name, OpClass op_class, int64_t bytes, TpSplit split,
             std::vector<int64_t> shape) {
  Op op;
  op.id = name.id();
  op.name = name.str();
  op.op_class = op_class;
  op.bytes = bytes;
  op.split = split;
  op.shape = std::move(shape);
  return op;
}

Op comm_op(const OpName& name, CollectiveKind kind, int64_t bytes) {
  Op op;
  op.id = name.id();
  op.name = name.str();
  switch (kind) {
    case CollectiveKind::kAllToAll:
      op.op_class = OpClass::kAllToAll;
      break;
    case CollectiveKind::kAllReduce:
      op.op_class = OpClass::kAllReduce;
      break;
    case CollectiveKind::kReduceScatter:
      op.op_class = OpClass::kReduceScatter;
      break;
    case CollectiveKind::kAllGather:
      op.op_class = OpClass::kAllGather;
      break;
    case CollectiveKind::kSendRecv:  // a halo exchange with the spatial grid's neighbours
      op.op_class = OpClass::kSend;
      break;
    default:
      SEXTANT_CHECK(false, "unexpected collective in a layer");
  }
  op.collective = kind;
  op.bytes = bytes;
  return op;
}

// Backward of a GEMM: data gradient and weight gradient, each as costly as the forward. For
// Y[m,n] = X[m,k] W[k,n]: dX = dY W^T is an (m, k, n) product, dW = X^T dY a (k, n, m) one.
Op gemm_backward(const Op& fwd) {
  Op op = fwd;
  op.flops = 2 * fwd.flops;
  op.bytes = 2 * fwd.bytes;
  op.matmuls.clear();
  for (const MatmulShape& f : fwd.matmuls) {
    op.matmuls.push_back({f.batch, f.m, f.k, f.n});
    op.matmuls.push_back({f.batch, f.k, f.n, f.m});
  }
  op.kernels = 2 * fwd.kernels;
  return op;
}

// The backward runs kernels of the forward's family, but which of its bytes are mixed-dtype or
// narrow is the caller's to say: none, unless set.
Op memory_backward(const Op& fwd, double factor) {
  Op op = fwd;
  op.bytes = static_cast<int64_t>(static_cast<double>(fwd.bytes) * factor);
  op.mixed_dtype_bytes = 0;
  op.narrow_bytes = 0;
  op.narrow_blocks = 0;
  return op;
}

// Scales a memory-bound op to the kernels a less fused stack runs for it: `passes` times the
// bytes of the fused kernel, in `kernels` launches.
Op unfused(Op op, double passes, int kernels) {
  const auto scaled = [passes](int64_t b) {
    return static_cast<int64_t>(static_cast<double>(b) * passes);
  };
  op.bytes = scaled(op.bytes);
  op.mixed_dtype_bytes = scaled(op.mixed_dtype_bytes);
  op.narrow_bytes = scaled(op.narrow_bytes);
  op.kernels = kernels;
  return op;
}

}  // namespace sextant::models
