// Blockwise causal attention with log-sum-exp merging, the ring attention steps (CPU, Eigen,
// fp32).
#include "sextant/exec/blockwise_attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "attention_maps.hpp"
#include "core/eigen_maps.hpp"
#include "sextant/spec/error.hpp"

namespace sextant::exec::blockwise {

namespace {

using namespace eigen;  // NOLINT(google-build-using-namespace): eigen_maps.hpp
using context::Geometry;
using context::kv_head;
using context::q_head;

constexpr float kNoKey = -std::numeric_limits<float>::infinity();

// Per-row statistics [batch, heads, q.seq] and [batch * q.seq, heads * head_dim] outputs.
void check_rows(const Tensor& rows, const Tensor& stats, const QkvLayout& q) {
  SEXTANT_CHECK(stats.numel() == q.batch * q.heads * q.seq &&
                    rows.numel() == q.batch * q.seq * q.heads * q.head_dim,
                "blockwise attention statistics of {} and rows of {} elements for {} x {} x {} "
                "rows of head_dim {}",
                stats.numel(), rows.numel(), q.batch, q.heads, q.seq, q.head_dim);
}

// Head h's columns of sequence b in a [batch * seq, heads * head_dim] tensor.
ConstStridedMap head_rows(const Tensor& t, const QkvLayout& l, int64_t b, int64_t h) {
  const int64_t w = l.heads * l.head_dim;
  return ConstStridedMap(t.data() + b * l.seq * w + h * l.head_dim, l.seq, l.head_dim,
                         Eigen::OuterStride<>(w));
}
StridedMap head_rows(Tensor& t, const QkvLayout& l, int64_t b, int64_t h) {
  const int64_t w = l.heads * l.head_dim;
  return StridedMap(t.data() + b * l.seq * w + h * l.head_dim, l.seq, l.head_dim,
                    Eigen::OuterStride<>(w));
}
float scale_of(const Geometry& g) {
  return 1.0f / std::sqrt(static_cast<float>(g.q.head_dim));
}

}  // namespace

void forward(const Tensor& qkv, const Tensor& kv, const Geometry& g, Tensor& out, Tensor& lse) {
  context::check_operands(qkv, kv, g);
  check_rows(out, lse, g.q);
  const QkvLayout& l = g.q;
  RowMat p(l.seq, g.kv_seq);
  for (int64_t b = 0; b < l.batch; ++b)
    for (int64_t h = 0; h < l.heads; ++h) {
      p.noalias() =
          (q_head(qkv, g, b, l.q_column(h)) * kv_head(kv, g, b, g.k_column(h)).transpose()) *
          scale_of(g);
      float* row_lse = lse.data() + (b * l.heads + h) * l.seq;
      for (int64_t i = 0; i < l.seq; ++i) {
        const int64_t at = l.position(i);
        float m = kNoKey;
        for (int64_t j = 0; j < g.kv_seq; ++j)
          if (g.key_position(j) <= at) m = std::max(m, p(i, j));
        if (m == kNoKey) {  // no key of the block is visible: the row contributes nothing
          p.row(i).setZero();
          row_lse[i] = kNoKey;
          continue;
        }
        double sum = 0;
        for (int64_t j = 0; j < g.kv_seq; ++j) {
          p(i, j) = g.key_position(j) <= at ? std::exp(p(i, j) - m) : 0.0f;
          sum += p(i, j);
        }
        p.row(i) *= static_cast<float>(1.0 / sum);
        row_lse[i] = m + static_cast<float>(std::log(sum));
      }
      head_rows(out, l, b, h).noalias() = p * kv_head(kv, g, b, g.v_column(h));
    }
}

void merge(Tensor& out, Tensor& lse, const Tensor& block_out, const Tensor& block_lse) {
  SEXTANT_CHECK(out.numel() == block_out.numel() && lse.numel() == block_lse.numel() &&
                    lse.shape().size() == 3 && out.numel() % lse.numel() == 0,
                "merging attention outputs of {} and {} elements, statistics of {} and {}",
                out.numel(), block_out.numel(), lse.numel(), block_lse.numel());
  const int64_t batch = lse.dim(0), heads = lse.dim(1), seq = lse.dim(2);
  const int64_t d = out.numel() / lse.numel(), w = heads * d;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < seq; ++i) {
        const int64_t s = (b * heads + h) * seq + i;
        const float la = lse.data()[s], lb = block_lse.data()[s];
        if (lb == kNoKey) continue;
        float* o = out.data() + (b * seq + i) * w + h * d;
        const float* ob = block_out.data() + (b * seq + i) * w + h * d;
        if (la == kNoKey) {
          std::copy_n(ob, d, o);
          lse.data()[s] = lb;
          continue;
        }
        const float hi = std::max(la, lb);
        const float l = hi + std::log1p(std::exp(std::min(la, lb) - hi));
        const float wa = std::exp(la - l), wb = std::exp(lb - l);
        for (int64_t k = 0; k < d; ++k) o[k] = wa * o[k] + wb * ob[k];
        lse.data()[s] = l;
      }
}

void backward_prep(const Tensor& out, const Tensor& dout, const QkvLayout& q, Tensor& delta) {
  check_rows(out, delta, q);
  SEXTANT_CHECK(dout.numel() == out.numel(), "dout of {} elements, out of {}", dout.numel(),
                out.numel());
  for (int64_t b = 0; b < q.batch; ++b)
    for (int64_t h = 0; h < q.heads; ++h) {
      Eigen::Map<Eigen::VectorXf> dst(delta.data() + (b * q.heads + h) * q.seq, q.seq);
      dst = head_rows(out, q, b, h).cwiseProduct(head_rows(dout, q, b, h)).rowwise().sum();
    }
}

void backward(const Tensor& qkv, const Tensor& kv, const Tensor& dout, const Tensor& lse,
              const Tensor& delta, const Geometry& g, Tensor& dq, Tensor& dkv) {
  context::check_operands(qkv, kv, g);
  check_rows(dq, lse, g.q);
  check_rows(dout, delta, g.q);
  SEXTANT_CHECK(dkv.numel() == kv.numel(), "dkv of {} elements, the key block {}", dkv.numel(),
                kv.numel());
  const QkvLayout& l = g.q;
  const float scale = scale_of(g);
  std::fill_n(dkv.data(), dkv.numel(), 0.0f);  // a group's q heads add into their kv head
  RowMat p(l.seq, g.kv_seq), ds(l.seq, g.kv_seq);
  for (int64_t b = 0; b < l.batch; ++b)
    for (int64_t h = 0; h < l.heads; ++h) {
      const ConstStridedMap q = q_head(qkv, g, b, l.q_column(h));
      const ConstStridedMap k = kv_head(kv, g, b, g.k_column(h));
      const ConstStridedMap v = kv_head(kv, g, b, g.v_column(h));
      const ConstStridedMap d_o = head_rows(dout, l, b, h);
      const float* row_lse = lse.data() + (b * l.heads + h) * l.seq;
      const float* row_delta = delta.data() + (b * l.heads + h) * l.seq;
      // The block's probabilities under the whole row's normalizer.
      p.noalias() = (q * k.transpose()) * scale;
      for (int64_t i = 0; i < l.seq; ++i) {
        const int64_t at = l.position(i);
        for (int64_t j = 0; j < g.kv_seq; ++j)
          p(i, j) = g.key_position(j) <= at ? std::exp(p(i, j) - row_lse[i]) : 0.0f;
      }
      kv_head(dkv, g, b, g.v_column(h)).noalias() += p.transpose() * d_o;
      ds.noalias() = d_o * v.transpose();  // dP
      for (int64_t i = 0; i < l.seq; ++i)
        ds.row(i) = p.row(i).cwiseProduct((ds.row(i).array() - row_delta[i]).matrix());
      head_rows(dq, l, b, h).noalias() = (ds * k) * scale;
      kv_head(dkv, g, b, g.k_column(h)).noalias() += (ds.transpose() * q) * scale;
    }
}

}  // namespace sextant::exec::blockwise
