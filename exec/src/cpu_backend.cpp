// CPU kernels. GEMMs go through Eigen's row-major maps; the attention core loops over
// (batch, head) blocks with Eigen products. All math in fp32 with fp64 row statistics where a
// reduction's order would otherwise drift between layouts.
#include "sextant/exec/cpu_backend.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>

#include "eigen_maps.hpp"
#include "sextant/exec/block_pool.hpp"
#include "sextant/exec/context_attention.hpp"
#include "sextant/spec/error.hpp"

namespace sextant::exec {

namespace {

using namespace eigen;  // NOLINT(google-build-using-namespace): eigen_maps.hpp

int64_t rows_of(const Tensor& t) {
  return t.numel() / t.shape().back();
}
int64_t cols_of(const Tensor& t) {
  return t.shape().back();
}
ConstMap cmat(const Tensor& t) {
  return ConstMap(t.data(), rows_of(t), cols_of(t));
}
Map mat(Tensor& t) {
  return Map(t.data(), rows_of(t), cols_of(t));
}

constexpr float kLayerNormEps = 1e-5f;
constexpr float kRmsNormEps = 1e-5f;           // Llama 2's rms_norm_eps
constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)

class CpuBackend : public Backend {
 public:
  std::string name() const override { return "cpu"; }

  // Blocks come from a caching pool, as on the GPU: glibc serves large requests with fresh mmap
  // pages and returns them on free, so every op's output would page-fault (zero-fill) again each
  // micro-batch. On the 2-core build machine that kernel time was a third of a gpt-tiny step at
  // micro-batch 4 and grew with the micro-batch (docs/CALIBRATION.md).
  void* allocate(int64_t bytes) override {
    void* block = pool_.allocate(bytes);
    if (block == nullptr) throw std::bad_alloc();
    return block;
  }
  void release(void* data) override { pool_.release(data); }
  void fill(Tensor& t, float value) override {
    if (t.dtype() == DType::kF32) {
      std::fill(t.data(), t.data() + t.numel(), value);
    } else {
      auto* b = static_cast<uint16_t*>(t.raw());
      std::fill(b, b + t.numel(), to_bf16(value));
    }
  }
  void copy(const Tensor& from, Tensor& to) override {
    SEXTANT_CHECK(from.numel() == to.numel(), "copy of {} into {} elements", from.numel(),
                  to.numel());
    if (from.dtype() == to.dtype()) {
      std::memcpy(to.raw(), from.raw(), static_cast<size_t>(from.bytes()));
    } else if (from.dtype() == DType::kF32) {
      auto* b = static_cast<uint16_t*>(to.raw());
      const float* f = from.data();
      for (int64_t i = 0; i < from.numel(); ++i) b[i] = to_bf16(f[i]);
    } else {
      const auto* b = static_cast<const uint16_t*>(from.raw());
      float* f = to.data();
      for (int64_t i = 0; i < from.numel(); ++i) f[i] = from_bf16(b[i]);
    }
  }
  void to_host(const Tensor& t, std::vector<float>& out) override {
    if (t.dtype() == DType::kF32) {
      out.assign(t.data(), t.data() + t.numel());
    } else {
      const auto* b = static_cast<const uint16_t*>(t.raw());
      out.resize(static_cast<size_t>(t.numel()));
      for (int64_t i = 0; i < t.numel(); ++i) out[static_cast<size_t>(i)] = from_bf16(b[i]);
    }
  }
  void from_host(const std::vector<float>& in, Tensor& t) override {
    SEXTANT_CHECK(static_cast<int64_t>(in.size()) == t.numel(), "from_host size mismatch");
    if (t.dtype() == DType::kF32) {
      std::copy(in.begin(), in.end(), t.data());
    } else {
      auto* b = static_cast<uint16_t*>(t.raw());
      for (size_t i = 0; i < in.size(); ++i) b[i] = to_bf16(in[i]);
    }
  }
  void synchronize() override {}

  void matmul(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y,
              bool accumulate) override {
    auto X = cmat(x);
    auto W = cmat(w);
    auto Y = mat(y);
    SEXTANT_CHECK(X.cols() == W.rows() && Y.rows() == X.rows() && Y.cols() == W.cols(),
                  "matmul shapes [{}x{}] @ [{}x{}] -> [{}x{}]", X.rows(), X.cols(), W.rows(),
                  W.cols(), Y.rows(), Y.cols());
    if (accumulate) {
      Y.noalias() += X * W;
    } else {
      Y.noalias() = X * W;
    }
    if (bias != nullptr)
      Y.rowwise() += Eigen::Map<const Eigen::RowVectorXf>(bias->data(), W.cols());
  }

  void matmul_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor& dw,
                       Tensor* db, bool accumulate_dx) override {
    auto X = cmat(x);
    auto W = cmat(w);
    auto DY = cmat(dy);
    if (dx != nullptr) {
      auto DX = mat(*dx);
      if (accumulate_dx) {
        DX.noalias() += DY * W.transpose();
      } else {
        DX.noalias() = DY * W.transpose();
      }
    }
    mat(dw).noalias() += X.transpose() * DY;
    if (db != nullptr) Eigen::Map<Eigen::RowVectorXf>(db->data(), DY.cols()) += DY.colwise().sum();
  }

  void matmul_nt(const Tensor& x, const Tensor& w, Tensor& y) override {
    mat(y).noalias() = cmat(x) * cmat(w).transpose();
  }
  void matmul_nt_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dx,
                          Tensor& dw) override {
    mat(dx).noalias() = cmat(dy) * cmat(w);
    mat(dw).noalias() += cmat(dy).transpose() * cmat(x);
  }

  void layernorm(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& y, Tensor& mean,
                 Tensor& rstd) override {
    const int64_t n = rows_of(x), c = cols_of(x);
    const float* g = gamma.data();
    const float* b = beta.data();
    for (int64_t i = 0; i < n; ++i) {
      const float* xi = x.data() + i * c;
      double s = 0, ss = 0;
      for (int64_t j = 0; j < c; ++j) s += xi[j];
      const double mu = s / static_cast<double>(c);
      for (int64_t j = 0; j < c; ++j) ss += (xi[j] - mu) * (xi[j] - mu);
      const float r =
          static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(c) + kLayerNormEps));
      float* yi = y.data() + i * c;
      for (int64_t j = 0; j < c; ++j) yi[j] = (xi[j] - static_cast<float>(mu)) * r * g[j] + b[j];
      mean.data()[i] = static_cast<float>(mu);
      rstd.data()[i] = r;
    }
  }

  void layernorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& mean,
                          const Tensor& rstd, const Tensor& dy, Tensor& dx, Tensor& dgamma,
                          Tensor& dbeta) override {
    const int64_t n = rows_of(x), c = cols_of(x);
    const float* g = gamma.data();
    float *dg = dgamma.data(), *db = dbeta.data();
    for (int64_t i = 0; i < n; ++i) {
      const float* xi = x.data() + i * c;
      const float* dyi = dy.data() + i * c;
      const float mu = mean.data()[i], r = rstd.data()[i];
      double sum_dxhat = 0, sum_dxhat_xhat = 0;
      for (int64_t j = 0; j < c; ++j) {
        const float xhat = (xi[j] - mu) * r;
        const float dxhat = dyi[j] * g[j];
        sum_dxhat += dxhat;
        sum_dxhat_xhat += dxhat * xhat;
        dg[j] += dyi[j] * xhat;
        db[j] += dyi[j];
      }
      const float m1 = static_cast<float>(sum_dxhat / static_cast<double>(c));
      const float m2 = static_cast<float>(sum_dxhat_xhat / static_cast<double>(c));
      float* dxi = dx.data() + i * c;
      for (int64_t j = 0; j < c; ++j) {
        const float xhat = (xi[j] - mu) * r;
        dxi[j] = r * (dyi[j] * g[j] - m1 - xhat * m2);
      }
    }
  }

  void rmsnorm(const Tensor& x, const Tensor& gamma, Tensor& y, Tensor& rstd) override {
    const int64_t n = rows_of(x), c = cols_of(x);
    const float* g = gamma.data();
    for (int64_t i = 0; i < n; ++i) {
      const float* xi = x.data() + i * c;
      double ss = 0;
      for (int64_t j = 0; j < c; ++j) ss += static_cast<double>(xi[j]) * xi[j];
      const float r =
          static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(c) + kRmsNormEps));
      float* yi = y.data() + i * c;
      for (int64_t j = 0; j < c; ++j) yi[j] = xi[j] * r * g[j];
      rstd.data()[i] = r;
    }
  }

  void rmsnorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& rstd, const Tensor& dy,
                        Tensor& dx, Tensor& dgamma) override {
    // xhat = x r; dx = r (dxhat - xhat mean(dxhat xhat)) with dxhat = dy gamma.
    const int64_t n = rows_of(x), c = cols_of(x);
    const float* g = gamma.data();
    float* dg = dgamma.data();
    for (int64_t i = 0; i < n; ++i) {
      const float* xi = x.data() + i * c;
      const float* dyi = dy.data() + i * c;
      const float r = rstd.data()[i];
      double sum_dxhat_xhat = 0;
      for (int64_t j = 0; j < c; ++j) {
        const float xhat = xi[j] * r;
        sum_dxhat_xhat += dyi[j] * g[j] * xhat;
        dg[j] += dyi[j] * xhat;
      }
      const float m2 = static_cast<float>(sum_dxhat_xhat / static_cast<double>(c));
      float* dxi = dx.data() + i * c;
      for (int64_t j = 0; j < c; ++j) dxi[j] = r * (dyi[j] * g[j] - xi[j] * r * m2);
    }
  }

  void rope(Tensor& qkv, const QkvLayout& l, float base, bool inverse) override {
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

  // Eigen's array tanh is vectorised; std::tanh in a loop is not.
  void gelu(const Tensor& x, Tensor& y) override {
    auto v = Eigen::Map<const Eigen::ArrayXf>(x.data(), x.numel());
    Eigen::Map<Eigen::ArrayXf>(y.data(), y.numel()) =
        0.5f * v * (1.0f + (kGeluC * (v + 0.044715f * v.cube())).tanh());
  }
  void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) override {
    auto v = Eigen::Map<const Eigen::ArrayXf>(x.data(), x.numel());
    auto d = Eigen::Map<const Eigen::ArrayXf>(dy.data(), dy.numel());
    Eigen::ArrayXf t = (kGeluC * (v + 0.044715f * v.cube())).tanh();
    Eigen::Map<Eigen::ArrayXf>(dx.data(), dx.numel()) =
        d * (0.5f * (1.0f + t) +
             0.5f * v * (1.0f - t.square()) * kGeluC * (1.0f + 3.0f * 0.044715f * v.square()));
  }
  void relu(const Tensor& x, Tensor& y) override {
    const float* xv = x.data();
    float* yv = y.data();
    for (int64_t i = 0; i < x.numel(); ++i) yv[i] = std::max(0.0f, xv[i]);
  }
  void relu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) override {
    const float *xv = x.data(), *dyv = dy.data();
    float* dxv = dx.data();
    for (int64_t i = 0; i < x.numel(); ++i) dxv[i] = xv[i] > 0 ? dyv[i] : 0.0f;
  }
  void swiglu(const Tensor& x, Tensor& y) override {
    const int64_t n = rows_of(x), f = cols_of(x) / 2;
    for (int64_t i = 0; i < n; ++i) {
      const float* gate = x.data() + i * 2 * f;
      const float* up = gate + f;
      float* yi = y.data() + i * f;
      for (int64_t j = 0; j < f; ++j) {
        const float s = gate[j] / (1.0f + std::exp(-gate[j]));
        yi[j] = s * up[j];
      }
    }
  }
  void swiglu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) override {
    const int64_t n = rows_of(x), f = cols_of(x) / 2;
    for (int64_t i = 0; i < n; ++i) {
      const float* gate = x.data() + i * 2 * f;
      const float* up = gate + f;
      float* dgate = dx.data() + i * 2 * f;
      float* dup = dgate + f;
      const float* dyi = dy.data() + i * f;
      for (int64_t j = 0; j < f; ++j) {
        const float sig = 1.0f / (1.0f + std::exp(-gate[j]));
        const float s = gate[j] * sig;
        const float d = dyi[j];
        dup[j] = d * s;
        dgate[j] = d * up[j] * (sig * (1.0f + gate[j] * (1.0f - sig)));
      }
    }
  }
  void bias_add(Tensor& y, const Tensor& b) override {
    mat(y).rowwise() += Eigen::Map<const Eigen::RowVectorXf>(b.data(), b.numel());
  }
  void bias_backward(const Tensor& dy, Tensor& db) override {
    Eigen::Map<Eigen::RowVectorXf>(db.data(), db.numel()) += cmat(dy).colwise().sum();
  }
  void add(const Tensor& a, const Tensor& b, Tensor& y) override {
    const float *av = a.data(), *bv = b.data();
    float* yv = y.data();
    for (int64_t i = 0; i < a.numel(); ++i) yv[i] = av[i] + bv[i];
  }
  void scale(Tensor& x, float factor) override {
    float* xv = x.data();
    for (int64_t i = 0; i < x.numel(); ++i) xv[i] *= factor;
  }

  // Strided view of the head whose first column is `column`, for batch element b, in qkv.
  static ConstStridedMap head(const Tensor& qkv, const QkvLayout& l, int64_t b, int64_t column) {
    return ConstStridedMap(qkv.data() + b * l.seq * l.width() + column, l.seq, l.head_dim,
                           Eigen::OuterStride<>(l.width()));
  }
  static StridedMap head(Tensor& qkv, const QkvLayout& l, int64_t b, int64_t column) {
    return StridedMap(qkv.data() + b * l.seq * l.width() + column, l.seq, l.head_dim,
                      Eigen::OuterStride<>(l.width()));
  }

  void attention_scores(const Tensor& qkv, const QkvLayout& l, Tensor& scores) override {
    l.check(qkv);
    const float scale_factor = 1.0f / std::sqrt(static_cast<float>(l.head_dim));
    const int64_t ss = l.seq * l.seq;
    for (int64_t b = 0; b < l.batch; ++b) {
      for (int64_t h = 0; h < l.heads; ++h) {
        Map a(scores.data() + (b * l.heads + h) * ss, l.seq, l.seq);
        a.noalias() =
            (head(qkv, l, b, l.q_column(h)) * head(qkv, l, b, l.k_column(h)).transpose()) *
            scale_factor;
      }
    }
  }

  // The causal mask is the context-parallel mask with every row at its own position: one home
  // for the softmax and its backward (context_attention.cpp).
  static context::Geometry causal(int64_t seq) { return {QkvLayout{1, seq, 1, 1, 1}, seq}; }
  void causal_softmax(Tensor& x, int64_t seq) override { context::masked_softmax(x, causal(seq)); }

  void attention_context(const Tensor& probs, const Tensor& qkv, const QkvLayout& l,
                         Tensor& out) override {
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

  void attention_context_backward(const Tensor& probs, const Tensor& qkv, const Tensor& dout,
                                  const QkvLayout& l, Tensor& dprobs, Tensor& dqkv) override {
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

  void causal_softmax_backward(const Tensor& probs, Tensor& grad, int64_t seq) override {
    context::masked_softmax_backward(probs, grad, causal(seq));
  }

  void attention_scores_backward(const Tensor& dscores, const Tensor& qkv, const QkvLayout& l,
                                 Tensor& dqkv) override {
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

  void embedding(const std::vector<int32_t>& tokens, const Tensor& table, int64_t vocab_begin,
                 Tensor& y) override {
    const int64_t shard = table.dim(0), h = table.dim(1);
    for (size_t i = 0; i < tokens.size(); ++i) {
      int64_t row = tokens[i] - vocab_begin;
      float* yi = y.data() + static_cast<int64_t>(i) * h;
      if (row >= 0 && row < shard) {
        std::memcpy(yi, table.data() + row * h, static_cast<size_t>(h) * sizeof(float));
      } else {
        std::fill(yi, yi + h, 0.0f);
      }
    }
  }
  void embedding_backward(const std::vector<int32_t>& tokens, const Tensor& dy, int64_t vocab_begin,
                          Tensor& dtable) override {
    const int64_t shard = dtable.dim(0), h = dtable.dim(1);
    for (size_t i = 0; i < tokens.size(); ++i) {
      int64_t row = tokens[i] - vocab_begin;
      if (row < 0 || row >= shard) continue;
      const float* dyi = dy.data() + static_cast<int64_t>(i) * h;
      float* dt = dtable.data() + row * h;
      for (int64_t j = 0; j < h; ++j) dt[j] += dyi[j];
    }
  }
  void add_positions(const Tensor& pos, int64_t row_begin, int64_t seq, Tensor& y) override {
    const int64_t h = cols_of(y), n = rows_of(y);
    for (int64_t i = 0; i < n; ++i) {
      const float* p = pos.data() + ((row_begin + i) % seq) * h;
      float* yi = y.data() + i * h;
      for (int64_t j = 0; j < h; ++j) yi[j] += p[j];
    }
  }
  void add_positions_backward(const Tensor& dy, int64_t row_begin, int64_t seq,
                              Tensor& dpos) override {
    const int64_t h = cols_of(dy), n = rows_of(dy);
    for (int64_t i = 0; i < n; ++i) {
      float* p = dpos.data() + ((row_begin + i) % seq) * h;
      const float* d = dy.data() + i * h;
      for (int64_t j = 0; j < h; ++j) p[j] += d[j];
    }
  }

  void softmax_stats(const Tensor& logits, const std::vector<int32_t>& targets, int64_t vocab_begin,
                     int64_t valid, std::vector<float>& max, std::vector<float>& sum,
                     std::vector<float>& target) override {
    const int64_t n = rows_of(logits), stride = cols_of(logits), v = valid;
    SEXTANT_CHECK(v >= 0 && v <= stride, "softmax_stats: {} valid of {} columns", v, stride);
    max.assign(static_cast<size_t>(n), -INFINITY);
    sum.assign(static_cast<size_t>(n), 0.0f);
    target.assign(static_cast<size_t>(n), 0.0f);
    for (int64_t i = 0; i < n; ++i) {
      const float* row = logits.data() + i * stride;
      const size_t k = static_cast<size_t>(i);
      for (int64_t j = 0; j < v; ++j) max[k] = std::max(max[k], row[j]);
      double s = 0;
      for (int64_t j = 0; j < v; ++j) s += std::exp(row[j] - max[k]);
      sum[k] = static_cast<float>(s);
      const int64_t col = targets[k] - vocab_begin;
      if (col >= 0 && col < v) target[k] = row[col];
    }
  }
  void cross_entropy_backward(const Tensor& logits, const std::vector<int32_t>& targets,
                              int64_t vocab_begin, int64_t valid, const std::vector<float>& max,
                              const std::vector<float>& sum, float scale_factor,
                              Tensor& dlogits) override {
    const int64_t n = rows_of(logits), v = cols_of(logits);
    SEXTANT_CHECK(valid >= 0 && valid <= v, "cross_entropy_backward: {} valid of {} columns", valid,
                  v);
    const float* x = logits.data();
    float* dx = dlogits.data();
    for (int64_t i = 0; i < n; ++i) {
      const float m = max[static_cast<size_t>(i)];
      const float inv = 1.0f / sum[static_cast<size_t>(i)];
      const int64_t col = targets[static_cast<size_t>(i)] - vocab_begin;
      for (int64_t j = 0; j < valid; ++j) {
        float p = std::exp(x[i * v + j] - m) * inv;
        dx[i * v + j] = (p - (j == col ? 1.0f : 0.0f)) * scale_factor;
      }
      for (int64_t j = valid; j < v; ++j) dx[i * v + j] = 0.0f;
    }
  }

  double sum_squares(const Tensor& x) override {
    double s = 0;
    const float* xv = x.data();
    for (int64_t i = 0; i < x.numel(); ++i) s += static_cast<double>(xv[i]) * xv[i];
    return s;
  }

  void adamw(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, int64_t step, float lr,
             float beta1, float beta2, float eps, float weight_decay, float grad_scale) override {
    // torch.optim.AdamW: decoupled decay, then the bias-corrected Adam step.
    const float bc1 = 1.0f - std::pow(beta1, static_cast<float>(step));
    const float bc2 = 1.0f - std::pow(beta2, static_cast<float>(step));
    const float step_size = lr / bc1;
    const float bc2_sqrt = std::sqrt(bc2);
    const float* gv = grad.data();
    float *pv = param.data(), *mv = m.data(), *vv = v.data();
    for (int64_t i = 0; i < param.numel(); ++i) {
      const float g = gv[i] * grad_scale;
      float& p = pv[i];
      p *= 1.0f - lr * weight_decay;
      float& mi = mv[i];
      float& vi = vv[i];
      mi = beta1 * mi + (1.0f - beta1) * g;
      vi = beta2 * vi + (1.0f - beta2) * g * g;
      p -= step_size * mi / (std::sqrt(vi) / bc2_sqrt + eps);
    }
  }

 private:
  BlockPool pool_{
      [](int64_t bytes) { return Eigen::internal::aligned_malloc(static_cast<size_t>(bytes)); },
      [](void* block) { Eigen::internal::aligned_free(block); }};
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() {
  return std::make_unique<CpuBackend>();
}

}  // namespace sextant::exec
