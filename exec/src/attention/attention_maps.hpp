// Eigen views of one head of a context-parallel rank's attention operands (context::Geometry):
// its q rows in the fused qkv activation, and the keys or values of a sequence's key rows (the
// whole sequence gathered, or a ring step's block). Shared by the all-gather kernels
// (context_attention.cpp) and ring attention's blockwise ones (blockwise_attention.cpp).
#pragma once

#include <cstdint>

#include "core/eigen_maps.hpp"
#include "sextant/exec/context_attention.hpp"
#include "sextant/spec/error.hpp"

namespace sextant::exec::context {

// A logic error unless qkv holds the geometry's q rows and kv its key rows, both fp32.
inline void check_operands(const Tensor& qkv, const Tensor& kv, const Geometry& g) {
  g.q.check(qkv);
  SEXTANT_CHECK(qkv.dtype() == DType::kF32 && kv.dtype() == DType::kF32,
                "context-parallel attention runs in fp32");
  SEXTANT_CHECK(kv.numel() == g.q.batch * g.kv_seq * g.kv_width(),
                "keys and values of {} elements, expected {} x {} x {}", kv.numel(), g.q.batch,
                g.kv_seq, g.kv_width());
}

// Head `column` of the rank's q rows of sequence b.
inline eigen::ConstStridedMap q_head(const Tensor& qkv, const Geometry& g, int64_t b,
                                     int64_t column) {
  const QkvLayout& l = g.q;
  return eigen::ConstStridedMap(qkv.data() + b * l.seq * l.width() + column, l.seq, l.head_dim,
                                Eigen::OuterStride<>(l.width()));
}
inline eigen::StridedMap q_head(Tensor& qkv, const Geometry& g, int64_t b, int64_t column) {
  const QkvLayout& l = g.q;
  return eigen::StridedMap(qkv.data() + b * l.seq * l.width() + column, l.seq, l.head_dim,
                           Eigen::OuterStride<>(l.width()));
}
// Head `column` of sequence b's key rows (keys or values).
inline eigen::ConstStridedMap kv_head(const Tensor& kv, const Geometry& g, int64_t b,
                                      int64_t column) {
  return eigen::ConstStridedMap(kv.data() + b * g.kv_seq * g.kv_width() + column, g.kv_seq,
                                g.q.head_dim, Eigen::OuterStride<>(g.kv_width()));
}
inline eigen::StridedMap kv_head(Tensor& kv, const Geometry& g, int64_t b, int64_t column) {
  return eigen::StridedMap(kv.data() + b * g.kv_seq * g.kv_width() + column, g.kv_seq, g.q.head_dim,
                           Eigen::OuterStride<>(g.kv_width()));
}

}  // namespace sextant::exec::context
