// The fused attention core on CPU ranks: the whole sequence as one block of ring attention's
// blockwise kernels (exec/blockwise_attention.hpp, FlashAttention-2's algorithms in fp32), the
// keys and values copied out of the fused qkv rows and the gradients copied back into them.
#include <algorithm>

#include "cpu_backend.hpp"
#include "sextant/exec/blockwise_attention.hpp"
#include "sextant/spec/error.hpp"

namespace sextant::exec::cpu {

namespace {

// The whole sequence's keys as one block: key row j at position j.
context::Geometry whole_sequence(const QkvLayout& l) {
  SEXTANT_CHECK(l.positions == nullptr,
                "flash attention runs whole causal sequences (context-parallel ranks run "
                "blockwise attention)");
  return {l, l.seq};
}

// Columns [begin, begin + width) of each row of `wide` [rows, wide_width] copied to the rows of
// `narrow` [rows, width], or from them when to_wide (both tensors' storage is written through).
void copy_columns(const Tensor& wide, int64_t wide_width, int64_t begin, const Tensor& narrow,
                  int64_t width, bool to_wide) {
  const int64_t rows = narrow.numel() / width;
  for (int64_t r = 0; r < rows; ++r) {
    float* w = wide.data() + r * wide_width + begin;
    float* n = narrow.data() + r * width;
    if (to_wide)
      std::copy_n(n, width, w);
    else
      std::copy_n(w, width, n);
  }
}

}  // namespace

void CpuBackend::flash_attention(const Tensor& qkv, const QkvLayout& l, Tensor& out, Tensor& lse) {
  const context::Geometry g = whole_sequence(l);
  Tensor kv = empty({l.batch * l.seq, g.kv_width()});
  copy_columns(qkv, l.width(), l.heads * l.head_dim, kv, g.kv_width(), false);
  blockwise::forward(qkv, kv, g, out, lse);
}

void CpuBackend::flash_attention_backward_prep(const Tensor& out, const Tensor& dout,
                                               const QkvLayout& l, Tensor& delta) {
  blockwise::backward_prep(out, dout, l, delta);
}

void CpuBackend::flash_attention_backward(const Tensor& qkv, const Tensor& dout, const Tensor& lse,
                                          const Tensor& delta, const QkvLayout& l, Tensor& dqkv) {
  const context::Geometry g = whole_sequence(l);
  const int64_t q_width = l.heads * l.head_dim;
  Tensor kv = empty({l.batch * l.seq, g.kv_width()}), dkv = empty(kv.shape());
  Tensor dq = empty({l.batch * l.seq, q_width});
  copy_columns(qkv, l.width(), q_width, kv, g.kv_width(), false);
  blockwise::backward(qkv, kv, dout, lse, delta, g, dq, dkv);
  copy_columns(dqkv, l.width(), 0, dq, q_width, true);
  copy_columns(dqkv, l.width(), q_width, dkv, g.kv_width(), true);
}

}  // namespace sextant::exec::cpu
