// The unfused attention core over (batch, head) blocks with Eigen products, the causal softmax (the
// context-parallel masked softmax with every row at its own position) and rotary embeddings
// (RoFormer).
#include <cmath>

#include "cpu_backend.hpp"
#include "sextant/exec/context_attention.hpp"
#include "sextant/spec/error.hpp"
#include "tensor_maps.hpp"

namespace sextant::exec::cpu {

namespace {

// Strided view of the head whose first column is `column`, for batch element b, in qkv.
ConstStridedMap head(const Tensor& qkv, const QkvLayout& l, int64_t b, int64_t column) {
  return ConstStridedMap(qkv.data() + b * l.seq * l.width() + column, l.seq, l.head_dim,
                         Eigen::OuterStride<>(l.width()));
}

StridedMap head(Tensor& qkv, const QkvLayout& l, int64_t b, int64_t column) {
  return StridedMap(qkv.data() + b * l.seq * l.width() + column, l.seq, l.head_dim,
                    Eigen::OuterStride<>(l.width()));
}

// The causal mask is the context-parallel mask with every row at its own position: one home
// for the softmax and its backward (context_attention.cpp).
context::Geometry causal(int64_t seq) {
  return {QkvLayout{1, seq, 1, 1, 1}, seq};
}

}  // namespace

void CpuBackend::rope(Tensor& qkv, const QkvLayout& l, float base, bool inverse) {
  l.check(qkv);
  const int64_t rows = rows_of(qkv), d = l.head_dim, half = d / 2;
  float* data = qkv.data();
  for (int64_t r = 0; r < rows; ++r) {
    const double pos = static_cast<double>(l.position(r));
    for (int64_t i = 0; i < half; ++i) {
      const double angle =
          pos * std::pow(static_cast<double>(base), -2.0 * static_cast<double>(i) / d);
      const float c = static_cast<float>(std::cos(angle));
      const float sn = static_cast<float>(inverse ? -std::sin(angle) : std::sin(angle));
      // The q heads and then the k heads are adjacent: heads + kv_heads blocks of d columns.
      for (int64_t block = 0; block < l.heads + l.kv_heads; ++block) {
        float* v = data + r * l.width() + block * d;
        const float a = v[i], b = v[i + half];
        v[i] = a * c - b * sn;
        v[i + half] = b * c + a * sn;
      }
    }
  }
}

void CpuBackend::attention_scores(const Tensor& qkv, const QkvLayout& l, Tensor& scores) {
  l.check(qkv);
  const float scale_factor = 1.0f / std::sqrt(static_cast<float>(l.head_dim));
  const int64_t ss = l.seq * l.seq;
  for (int64_t b = 0; b < l.batch; ++b) {
    for (int64_t h = 0; h < l.heads; ++h) {
      Map a(scores.data() + (b * l.heads + h) * ss, l.seq, l.seq);
      a.noalias() = (head(qkv, l, b, l.q_column(h)) * head(qkv, l, b, l.k_column(h)).transpose()) *
                    scale_factor;
    }
  }
}

void CpuBackend::causal_softmax(Tensor& x, int64_t seq) {
  context::masked_softmax(x, causal(seq));
}

void CpuBackend::attention_context(const Tensor& probs, const Tensor& qkv, const QkvLayout& l,
                                   Tensor& out) {
  l.check(qkv);
  const int64_t hd = l.heads * l.head_dim, ss = l.seq * l.seq;
  for (int64_t b = 0; b < l.batch; ++b) {
    for (int64_t h = 0; h < l.heads; ++h) {
      ConstMap a(probs.data() + (b * l.heads + h) * ss, l.seq, l.seq);
      StridedMap o(out.data() + b * l.seq * hd + h * l.head_dim, l.seq, l.head_dim,
                   Eigen::OuterStride<>(hd));
      o.noalias() = a * head(qkv, l, b, l.v_column(h));
    }
  }
}

void CpuBackend::attention_context_backward(const Tensor& probs, const Tensor& qkv,
                                            const Tensor& dout, const QkvLayout& l, Tensor& dprobs,
                                            Tensor& dqkv) {
  l.check(qkv);
  const int64_t hd = l.heads * l.head_dim, ss = l.seq * l.seq;
  for (int64_t b = 0; b < l.batch; ++b) {
    for (int64_t h = 0; h < l.heads; ++h) {
      ConstMap a(probs.data() + (b * l.heads + h) * ss, l.seq, l.seq);
      Map da(dprobs.data() + (b * l.heads + h) * ss, l.seq, l.seq);
      ConstStridedMap dout_bh(dout.data() + b * l.seq * hd + h * l.head_dim, l.seq, l.head_dim,
                              Eigen::OuterStride<>(hd));
      // The first q head of a group writes its kv head's gradient, the others add to it.
      if (h % l.group() == 0) {
        head(dqkv, l, b, l.v_column(h)).noalias() = a.transpose() * dout_bh;
      } else {
        head(dqkv, l, b, l.v_column(h)).noalias() += a.transpose() * dout_bh;
      }
      da.noalias() = dout_bh * head(qkv, l, b, l.v_column(h)).transpose();
    }
  }
}

void CpuBackend::causal_softmax_backward(const Tensor& probs, Tensor& grad, int64_t seq) {
  context::masked_softmax_backward(probs, grad, causal(seq));
}

void CpuBackend::attention_scores_backward(const Tensor& dscores, const Tensor& qkv,
                                           const QkvLayout& l, Tensor& dqkv) {
  l.check(qkv);
  const float scale_factor = 1.0f / std::sqrt(static_cast<float>(l.head_dim));
  const int64_t ss = l.seq * l.seq;
  for (int64_t b = 0; b < l.batch; ++b) {
    for (int64_t h = 0; h < l.heads; ++h) {
      ConstMap ds(dscores.data() + (b * l.heads + h) * ss, l.seq, l.seq);
      head(dqkv, l, b, l.q_column(h)).noalias() =
          (ds * head(qkv, l, b, l.k_column(h))) * scale_factor;
      if (h % l.group() == 0) {
        head(dqkv, l, b, l.k_column(h)).noalias() =
            (ds.transpose() * head(qkv, l, b, l.q_column(h))) * scale_factor;
      } else {
        head(dqkv, l, b, l.k_column(h)).noalias() +=
            (ds.transpose() * head(qkv, l, b, l.q_column(h))) * scale_factor;
      }
    }
  }
}

}  // namespace sextant::exec::cpu
