// Context-parallel causal attention on CPU ranks (Eigen, fp32).
#include "sextant/exec/context_attention.hpp"

#include <cmath>

#include "attention_maps.hpp"
#include "core/eigen_maps.hpp"
#include "sextant/spec/error.hpp"

namespace sextant::exec::context {

namespace {

using namespace eigen;  // NOLINT(google-build-using-namespace): eigen_maps.hpp

int64_t block(const Geometry& g) {
  return g.q.seq * g.kv_seq;
}

}  // namespace

void scores(const Tensor& qkv, const Tensor& kv, const Geometry& g, Tensor& out) {
  check_operands(qkv, kv, g);
  const float scale = 1.0f / std::sqrt(static_cast<float>(g.q.head_dim));
  for (int64_t b = 0; b < g.q.batch; ++b)
    for (int64_t h = 0; h < g.q.heads; ++h) {
      Map s(out.data() + (b * g.q.heads + h) * block(g), g.q.seq, g.kv_seq);
      s.noalias() =
          (q_head(qkv, g, b, g.q.q_column(h)) * kv_head(kv, g, b, g.k_column(h)).transpose()) *
          scale;
    }
}

void masked_softmax(Tensor& x, const Geometry& g) {
  const int64_t blocks = x.numel() / block(g);
  for (int64_t blk = 0; blk < blocks; ++blk) {
    Map a(x.data() + blk * block(g), g.q.seq, g.kv_seq);
    for (int64_t i = 0; i < g.q.seq; ++i) {
      const int64_t last = g.q.position(i);  // the last key the query sees
      float m = -INFINITY;
      for (int64_t j = 0; j <= last; ++j) m = std::max(m, a(i, j));
      double sum = 0;
      for (int64_t j = 0; j <= last; ++j) {
        a(i, j) = std::exp(a(i, j) - m);
        sum += a(i, j);
      }
      const float inv = static_cast<float>(1.0 / sum);
      for (int64_t j = 0; j <= last; ++j) a(i, j) *= inv;
      for (int64_t j = last + 1; j < g.kv_seq; ++j) a(i, j) = 0.0f;
    }
  }
}

void context(const Tensor& probs, const Tensor& kv, const Geometry& g, Tensor& out) {
  const int64_t hd = g.q.heads * g.q.head_dim;
  for (int64_t b = 0; b < g.q.batch; ++b)
    for (int64_t h = 0; h < g.q.heads; ++h) {
      ConstMap p(probs.data() + (b * g.q.heads + h) * block(g), g.q.seq, g.kv_seq);
      StridedMap o(out.data() + b * g.q.seq * hd + h * g.q.head_dim, g.q.seq, g.q.head_dim,
                   Eigen::OuterStride<>(hd));
      o.noalias() = p * kv_head(kv, g, b, g.v_column(h));
    }
}

void context_backward(const Tensor& probs, const Tensor& kv, const Tensor& dout, const Geometry& g,
                      Tensor& dprobs, Tensor& dkv) {
  const int64_t hd = g.q.heads * g.q.head_dim;
  for (int64_t b = 0; b < g.q.batch; ++b)
    for (int64_t h = 0; h < g.q.heads; ++h) {
      ConstMap p(probs.data() + (b * g.q.heads + h) * block(g), g.q.seq, g.kv_seq);
      Map dp(dprobs.data() + (b * g.q.heads + h) * block(g), g.q.seq, g.kv_seq);
      ConstStridedMap d(dout.data() + b * g.q.seq * hd + h * g.q.head_dim, g.q.seq, g.q.head_dim,
                        Eigen::OuterStride<>(hd));
      // The first q head of a group writes its kv head's gradient, the others add to it.
      if (h % g.q.group() == 0) {
        kv_head(dkv, g, b, g.v_column(h)).noalias() = p.transpose() * d;
      } else {
        kv_head(dkv, g, b, g.v_column(h)).noalias() += p.transpose() * d;
      }
      dp.noalias() = d * kv_head(kv, g, b, g.v_column(h)).transpose();
    }
}

void masked_softmax_backward(const Tensor& probs, Tensor& grad, const Geometry& g) {
  const int64_t blocks = probs.numel() / block(g);
  for (int64_t blk = 0; blk < blocks; ++blk) {
    ConstMap a(probs.data() + blk * block(g), g.q.seq, g.kv_seq);
    Map d(grad.data() + blk * block(g), g.q.seq, g.kv_seq);
    for (int64_t i = 0; i < g.q.seq; ++i) {
      const int64_t last = g.q.position(i);
      double dot = 0;
      for (int64_t j = 0; j <= last; ++j) dot += d(i, j) * a(i, j);
      for (int64_t j = 0; j < g.kv_seq; ++j)
        d(i, j) = j <= last ? a(i, j) * (d(i, j) - static_cast<float>(dot)) : 0.0f;
    }
  }
}

void scores_backward(const Tensor& dscores, const Tensor& qkv, const Tensor& kv, const Geometry& g,
                     Tensor& dqkv, Tensor& dkv) {
  check_operands(qkv, kv, g);
  const float scale = 1.0f / std::sqrt(static_cast<float>(g.q.head_dim));
  for (int64_t b = 0; b < g.q.batch; ++b)
    for (int64_t h = 0; h < g.q.heads; ++h) {
      ConstMap ds(dscores.data() + (b * g.q.heads + h) * block(g), g.q.seq, g.kv_seq);
      q_head(dqkv, g, b, g.q.q_column(h)).noalias() =
          (ds * kv_head(kv, g, b, g.k_column(h))) * scale;
      if (h % g.q.group() == 0) {
        kv_head(dkv, g, b, g.k_column(h)).noalias() =
            (ds.transpose() * q_head(qkv, g, b, g.q.q_column(h))) * scale;
      } else {
        kv_head(dkv, g, b, g.k_column(h)).noalias() +=
            (ds.transpose() * q_head(qkv, g, b, g.q.q_column(h))) * scale;
      }
    }
}

}  // namespace sextant::exec::context
