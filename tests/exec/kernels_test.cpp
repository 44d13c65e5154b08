// Every CPU kernel's backward against central finite differences of a scalar objective
// L = sum(c * y) with random c, accumulated in double. The kernels are fp32, so the step is
// 1e-2 and the tolerance |numeric - analytic| <= 2e-4 + 2e-3 |numeric|: truncation O(h^2) plus
// fp32 round-off of L (|L| ~ 10, eps 1.2e-7) divided by h.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "sextant/exec/context_attention.hpp"
#include "sextant/exec/conv_kernels.hpp"
#include "sextant/exec/cpu_backend.hpp"
#include "sextant/spec/context_parallel.hpp"

namespace sextant::exec {
namespace {

constexpr float kStep = 1e-2f;
constexpr double kAbsTol = 2e-4;
constexpr double kRelTol = 2e-3;

class Kernels : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be = make_cpu_backend();
  std::mt19937 rng{20261122};

  Tensor random(std::vector<int64_t> shape, float scale = 1.0f) {
    Tensor t = be->empty(std::move(shape));
    std::normal_distribution<float> d(0.0f, scale);
    for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = d(rng);
    return t;
  }
  static double dot(const Tensor& a, const Tensor& b) {
    double s = 0;
    for (int64_t i = 0; i < a.numel(); ++i) s += static_cast<double>(a.data()[i]) * b.data()[i];
    return s;
  }
  // Checks analytic[i] against dL/dinput[i] with L() recomputed after perturbing input[i] by
  // +-step.
  void expect_gradient(Tensor& input, const Tensor& analytic, const std::function<double()>& loss,
                       const char* what, float step = kStep) {
    double worst = 0;
    int64_t at = 0;
    for (int64_t i = 0; i < input.numel(); ++i) {
      const float keep = input.data()[i];
      input.data()[i] = keep + step;
      const double up = loss();
      input.data()[i] = keep - step;
      const double down = loss();
      input.data()[i] = keep;
      const double numeric = (up - down) / (2.0 * step);
      const double err =
          std::fabs(numeric - analytic.data()[i]) / (kAbsTol + kRelTol * std::fabs(numeric));
      if (err > worst) {
        worst = err;
        at = i;
      }
    }
    EXPECT_LT(worst, 1.0) << what << ": error beyond tolerance at element " << at << " (analytic "
                          << analytic.data()[at] << ")";
  }
};

TEST_F(Kernels, MatmulWithBias) {
  Tensor x = random({5, 4}), w = random({4, 3}), b = random({3}), c = random({5, 3});
  Tensor y = be->empty({5, 3});
  auto loss = [&] {
    be->matmul(x, w, &b, y);
    return dot(y, c);
  };
  Tensor dx = be->empty({5, 4}), dw = be->zeros({4, 3}), db = be->zeros({3});
  be->matmul_backward(x, w, c, &dx, dw, &db);
  expect_gradient(x, dx, loss, "dx");
  expect_gradient(w, dw, loss, "dw");
  expect_gradient(b, db, loss, "db");
}

TEST_F(Kernels, MatmulWithTransposedWeight) {
  Tensor x = random({4, 6}), w = random({5, 6}), c = random({4, 5});
  Tensor y = be->empty({4, 5});
  auto loss = [&] {
    be->matmul_nt(x, w, y);
    return dot(y, c);
  };
  Tensor dx = be->empty({4, 6}), dw = be->zeros({5, 6});
  be->matmul_nt_backward(x, w, c, dx, dw);
  expect_gradient(x, dx, loss, "dx");
  expect_gradient(w, dw, loss, "dw");
}

TEST_F(Kernels, LayerNorm) {
  Tensor x = random({3, 8}), g = random({8}), b = random({8}), c = random({3, 8});
  Tensor y = be->empty({3, 8}), mean = be->empty({3}), rstd = be->empty({3});
  auto loss = [&] {
    be->layernorm(x, g, b, y, mean, rstd);
    return dot(y, c);
  };
  loss();
  Tensor dx = be->empty({3, 8}), dg = be->zeros({8}), db = be->zeros({8});
  be->layernorm_backward(x, g, mean, rstd, c, dx, dg, db);
  expect_gradient(x, dx, loss, "dx");
  expect_gradient(g, dg, loss, "dgamma");
  expect_gradient(b, db, loss, "dbeta");
}

TEST_F(Kernels, RmsNorm) {
  Tensor x = random({3, 8}), g = random({8}), c = random({3, 8});
  Tensor y = be->empty({3, 8}), rstd = be->empty({3});
  auto loss = [&] {
    be->rmsnorm(x, g, y, rstd);
    return dot(y, c);
  };
  loss();
  // By hand for row 0: rstd = 1 / sqrt(mean(x^2) + 1e-5), y = x * rstd * g.
  double ss = 0;
  for (int64_t j = 0; j < 8; ++j) ss += static_cast<double>(x.data()[j]) * x.data()[j];
  const double r = 1.0 / std::sqrt(ss / 8 + 1e-5);
  EXPECT_NEAR(rstd.data()[0], r, 1e-5 * r);
  EXPECT_NEAR(y.data()[3], x.data()[3] * r * g.data()[3], 1e-5);
  Tensor dx = be->empty({3, 8}), dg = be->zeros({8});
  be->rmsnorm_backward(x, g, rstd, c, dx, dg);
  expect_gradient(x, dx, loss, "dx");
  expect_gradient(g, dg, loss, "dgamma");
}

TEST_F(Kernels, RotaryEmbedding) {
  const int64_t batch = 2, seq = 5, heads = 2, d = 4, hd = heads * d;
  const QkvLayout l{batch, seq, heads, heads, d};
  Tensor qkv = random({batch * seq, 3 * hd}), c = random({batch * seq, 3 * hd});
  const std::vector<float> before(qkv.data(), qkv.data() + qkv.numel());
  Tensor y = be->empty({batch * seq, 3 * hd});
  auto loss = [&] {
    be->copy(qkv, y);
    be->rope(y, l, 10000.0f, false);
    return dot(y, c);
  };
  loss();
  // Row 7 is position 2 of the second sequence; pair i = 1 of the first k head turns by
  // 2 * 10000^(-2/4) = 0.02 rad (by hand: base^(-2i/d) = 10000^-0.5 = 0.01).
  const int64_t row = 7, at = row * 3 * hd + hd + 1;  // k block, head 0, i = 1 (pair at + 2)
  const double a = before[at], b = before[at + 2], angle = 2 * 0.01;
  EXPECT_NEAR(y.data()[at], a * std::cos(angle) - b * std::sin(angle), 1e-6);
  EXPECT_NEAR(y.data()[at + 2], b * std::cos(angle) + a * std::sin(angle), 1e-6);
  // Position 0 is the identity; v is never touched.
  EXPECT_EQ(y.data()[5], before[5]);
  EXPECT_EQ(y.data()[row * 3 * hd + 2 * hd + 3], before[row * 3 * hd + 2 * hd + 3]);
  // The backward is the inverse rotation, which undoes the forward.
  Tensor dqkv = be->empty({batch * seq, 3 * hd});
  be->copy(c, dqkv);
  be->rope(dqkv, l, 10000.0f, true);
  expect_gradient(qkv, dqkv, loss, "rope");
  loss();  // y from the unperturbed input again
  be->rope(y, l, 10000.0f, true);
  for (int64_t i = 0; i < y.numel(); ++i) EXPECT_NEAR(y.data()[i], before[i], 1e-5) << i;
}

TEST_F(Kernels, Activations) {
  Tensor x = random({4, 6}), c = random({4, 6}), y = be->empty({4, 6}), dx = be->empty({4, 6});
  auto gelu = [&] {
    be->gelu(x, y);
    return dot(y, c);
  };
  be->gelu_backward(x, c, dx);
  expect_gradient(x, dx, gelu, "gelu");
  // ReLU away from its kink.
  for (int64_t i = 0; i < x.numel(); ++i)
    if (std::fabs(x.data()[i]) < 0.1f) x.data()[i] = 0.5f;
  auto relu = [&] {
    be->relu(x, y);
    return dot(y, c);
  };
  be->relu_backward(x, c, dx);
  expect_gradient(x, dx, relu, "relu");
  Tensor xs = random({3, 8}), cs = random({3, 4}), ys = be->empty({3, 4}), dxs = be->empty({3, 8});
  auto swiglu = [&] {
    be->swiglu(xs, ys);
    return dot(ys, cs);
  };
  be->swiglu_backward(xs, cs, dxs);
  expect_gradient(xs, dxs, swiglu, "swiglu");
}

// Multi-head (4 kv heads for 4 q heads) and grouped-query attention (2 kv heads, each shared by
// two q heads: their k and v gradients sum over the pair).
TEST_F(Kernels, CausalAttention) {
  for (int64_t kv_heads : {4, 2}) {
    SCOPED_TRACE(kv_heads);
    const QkvLayout l{2, 5, 4, kv_heads, 3};
    const int64_t rows = l.batch * l.seq, hd = l.heads * l.head_dim;
    Tensor qkv = random({rows, l.width()}), c = random({rows, hd});
    Tensor out = be->empty({rows, hd}), att = be->empty({l.batch, l.heads, l.seq, l.seq});
    auto loss = [&] {
      be->attention_scores(qkv, l, att);
      be->causal_softmax(att, l.seq);
      be->attention_context(att, qkv, l, out);
      return dot(out, c);
    };
    loss();
    // Causality: a row's probabilities beyond its position are zero and each row sums to one.
    for (int64_t i = 0; i < l.seq; ++i) {
      double s = 0;
      for (int64_t j = 0; j < l.seq; ++j) {
        float p = att.data()[i * l.seq + j];
        if (j > i) {
          EXPECT_EQ(p, 0.0f);
        }
        s += p;
      }
      EXPECT_NEAR(s, 1.0, 1e-6);
    }
    // Head 3 of batch 1 attends with kv head 3 / group: its first score by hand.
    const int64_t g = l.heads / kv_heads, row = l.seq;  // batch 1, position 0
    double s00 = 0;
    for (int64_t k = 0; k < l.head_dim; ++k)
      s00 += static_cast<double>(qkv.data()[row * l.width() + 3 * l.head_dim + k]) *
             qkv.data()[row * l.width() + (l.heads + 3 / g) * l.head_dim + k];
    be->attention_scores(qkv, l, att);
    EXPECT_NEAR(att.data()[(1 * l.heads + 3) * l.seq * l.seq], s00 / std::sqrt(3.0), 1e-5);
    loss();
    Tensor dqkv = be->empty({rows, l.width()});
    Tensor dprobs = be->empty({l.batch, l.heads, l.seq, l.seq});
    be->attention_context_backward(att, qkv, c, l, dprobs, dqkv);
    be->causal_softmax_backward(att, dprobs, l.seq);
    be->attention_scores_backward(dprobs, qkv, l, dqkv);
    expect_gradient(qkv, dqkv, loss, "dqkv");
  }
}

// The fused kernel computes what the three unfused steps do (checked against finite differences
// above): out = softmax(mask(q k^T / sqrt(d))) v, the log-sum-exp of each row's scaled, masked
// scores (by hand from the unfused scores here), and for loss = <out, c> the gradient of every
// q, k and v head, with grouped-query attention's k and v heads summing over their groups.
TEST_F(Kernels, FlashAttentionIsTheUnfusedAttention) {
  for (const QkvLayout l : {QkvLayout{2, 9, 4, 4, 3}, QkvLayout{1, 7, 6, 2, 5}}) {
    SCOPED_TRACE(l.kv_heads);
    const int64_t rows = l.batch * l.seq, hd = l.heads * l.head_dim;
    Tensor qkv = random({rows, l.width()}), c = random({rows, hd});
    Tensor att = be->empty({l.batch, l.heads, l.seq, l.seq}), want = be->empty({rows, hd});
    be->attention_scores(qkv, l, att);
    std::vector<double> want_lse;
    for (int64_t bh = 0; bh < l.batch * l.heads; ++bh)
      for (int64_t i = 0; i < l.seq; ++i) {
        double sum = 0;
        for (int64_t j = 0; j <= i; ++j) sum += std::exp(att.data()[(bh * l.seq + i) * l.seq + j]);
        want_lse.push_back(std::log(sum));
      }
    be->causal_softmax(att, l.seq);
    be->attention_context(att, qkv, l, want);
    Tensor want_dqkv = be->empty({rows, l.width()}), dprobs = be->empty(att.shape());
    be->attention_context_backward(att, qkv, c, l, dprobs, want_dqkv);
    be->causal_softmax_backward(att, dprobs, l.seq);
    be->attention_scores_backward(dprobs, qkv, l, want_dqkv);

    Tensor out = be->empty({rows, hd}), lse = be->empty({l.batch, l.heads, l.seq});
    be->flash_attention(qkv, l, out, lse);
    for (int64_t i = 0; i < out.numel(); ++i) EXPECT_NEAR(out.data()[i], want.data()[i], 1e-5);
    for (int64_t i = 0; i < lse.numel(); ++i) EXPECT_NEAR(lse.data()[i], want_lse[i], 1e-5);
    Tensor delta = be->empty(lse.shape()), dqkv = be->empty({rows, l.width()});
    be->fill(dqkv, std::nanf(""));  // every head is written
    be->flash_attention_backward_prep(out, c, l, delta);
    be->flash_attention_backward(qkv, c, lse, delta, l, dqkv);
    for (int64_t i = 0; i < dqkv.numel(); ++i)
      EXPECT_NEAR(dqkv.data()[i], want_dqkv.data()[i], 1e-5) << "element " << i;
  }
}

TEST_F(Kernels, EmbeddingAndPositions) {
  Tensor table = random({6, 4}), c = random({5, 4}), y = be->empty({5, 4});
  std::vector<int32_t> tokens = {3, 1, 8, 3, 5};  // 8 is outside rows [2, 8) -> zero row
  auto loss = [&] {
    be->embedding(tokens, table, 2, y);
    return dot(y, c);
  };
  loss();
  for (int64_t j = 0; j < 4; ++j) EXPECT_EQ(y.data()[2 * 4 + j], 0.0f);
  Tensor dtable = be->zeros({6, 4});
  be->embedding_backward(tokens, c, 2, dtable);
  expect_gradient(table, dtable, loss, "dtable");
  Tensor pos = random({3, 4}), z = be->empty({5, 4});
  auto ploss = [&] {
    be->fill(z, 0.0f);
    be->add_positions(pos, 4, 3, z);  // rows 4..8 -> positions 1, 2, 0, 1, 2
    return dot(z, c);
  };
  Tensor dpos = be->zeros({3, 4});
  be->add_positions_backward(c, 4, 3, dpos);
  expect_gradient(pos, dpos, ploss, "dpos");
}

TEST_F(Kernels, CrossEntropy) {
  Tensor logits = random({4, 6});
  std::vector<int32_t> targets = {0, 5, 2, 3};
  auto loss = [&] {
    std::vector<float> max, sum, t;
    be->softmax_stats(logits, targets, 0, 6, max, sum, t);
    double l = 0;
    for (size_t i = 0; i < 4; ++i) l += std::log(static_cast<double>(sum[i])) + max[i] - t[i];
    return l;
  };
  std::vector<float> max, sum, t;
  be->softmax_stats(logits, targets, 0, 6, max, sum, t);
  // Row 1 by hand: its max, sum of exp(x - max), and the logit of its target (column 5).
  float m = -INFINITY;
  for (int64_t j = 0; j < 6; ++j) m = std::max(m, logits.data()[6 + j]);
  double s = 0;
  for (int64_t j = 0; j < 6; ++j) s += std::exp(static_cast<double>(logits.data()[6 + j]) - m);
  EXPECT_EQ(max[1], m);
  EXPECT_NEAR(sum[1], s, 1e-6 * s);
  EXPECT_EQ(t[1], logits.data()[6 + 5]);
  // A shard [3, 6) of the vocabulary: targets outside it give 0.
  Tensor shard = be->empty({4, 3});
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 3; ++j) shard.data()[i * 3 + j] = logits.data()[i * 6 + 3 + j];
  std::vector<float> smax, ssum, st;
  be->softmax_stats(shard, targets, 3, 3, smax, ssum, st);
  EXPECT_EQ(st[0], 0.0f);                  // target 0: another shard's
  EXPECT_EQ(st[1], logits.data()[6 + 5]);  // target 5: column 2 of this shard
  Tensor d = be->empty({4, 6});
  be->cross_entropy_backward(logits, targets, 0, 6, max, sum, 1.0f, d);
  expect_gradient(logits, d, loss, "dlogits");
}

// The vocabulary padded for aligned GEMMs: logits [4, 8] whose last 2 columns are padding give the
// statistics of the 6 real columns alone, whatever the padding holds, and a zero gradient there.
TEST_F(Kernels, CrossEntropyLeavesPaddingColumnsOut) {
  Tensor logits = random({4, 6});
  Tensor padded = be->empty({4, 8});
  for (int64_t i = 0; i < 4; ++i) {
    for (int64_t j = 0; j < 6; ++j) padded.data()[i * 8 + j] = logits.data()[i * 6 + j];
    padded.data()[i * 8 + 6] = 50.0f;  // would dominate the max and the sum if counted
    padded.data()[i * 8 + 7] = -3.0f;
  }
  const std::vector<int32_t> targets = {0, 5, 2, 3};
  std::vector<float> max, sum, t, pmax, psum, pt;
  be->softmax_stats(logits, targets, 0, 6, max, sum, t);
  be->softmax_stats(padded, targets, 0, 6, pmax, psum, pt);
  EXPECT_EQ(pmax, max);
  EXPECT_EQ(psum, sum);
  EXPECT_EQ(pt, t);
  Tensor d = be->empty({4, 6}), pd = be->empty({4, 8});
  be->cross_entropy_backward(logits, targets, 0, 6, max, sum, 0.5f, d);
  pd.data()[6] = pd.data()[7] = 1.0f;  // poison: must be overwritten with 0
  be->cross_entropy_backward(padded, targets, 0, 6, max, sum, 0.5f, pd);
  for (int64_t i = 0; i < 4; ++i) {
    for (int64_t j = 0; j < 6; ++j) EXPECT_EQ(pd.data()[i * 8 + j], d.data()[i * 6 + j]);
    EXPECT_EQ(pd.data()[i * 8 + 6], 0.0f);
    EXPECT_EQ(pd.data()[i * 8 + 7], 0.0f);
  }
}

TEST_F(Kernels, BiasAndAdd) {
  Tensor y0 = random({3, 4}), b = random({4}), c = random({3, 4}), y = be->empty({3, 4});
  auto loss = [&] {
    be->copy(y0, y);
    be->bias_add(y, b);
    return dot(y, c);
  };
  Tensor db = be->zeros({4});
  be->bias_backward(c, db);
  expect_gradient(b, db, loss, "dbias");
}

TEST_F(Kernels, AdamWMatchesTorchFormula) {
  // torch.optim.AdamW, one step from zero moments, written out by hand.
  Tensor p = be->empty({2}), g = be->empty({2}), m = be->zeros({2}), v = be->zeros({2});
  p.data()[0] = 1.0f;
  p.data()[1] = -2.0f;
  g.data()[0] = 0.5f;
  g.data()[1] = -0.25f;
  const float lr = 0.1f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
  be->adamw(p, g, m, v, 1, lr, b1, b2, eps, wd, 1.0f);
  for (int i = 0; i < 2; ++i) {
    const double p0 = i == 0 ? 1.0 : -2.0, gi = i == 0 ? 0.5 : -0.25;
    const double mi = (1 - b1) * gi, vi = (1 - b2) * gi * gi;
    const double denom = std::sqrt(vi) / std::sqrt(1 - b2) + eps;
    const double expected = p0 * (1 - lr * wd) - lr / (1 - b1) * mi / denom;
    EXPECT_NEAR(p.data()[i], expected, 1e-6);
  }
}

// The CNN kernels (conv_kernels.hpp) the same way, and the forward passes by hand.

TEST_F(Kernels, ConvolutionByHandAndItsGradients) {
  // A 1-channel 3x3 input, a 2x2 kernel of ones, stride 1: each output sums a 2x2 window.
  Tensor x = be->empty({1, 1, 3, 3}), ones = be->empty({1, 1, 2, 2}), y = be->empty({1, 1, 2, 2});
  for (int64_t i = 0; i < 9; ++i) x.data()[i] = static_cast<float>(i);
  be->fill(ones, 1.0f);
  conv::convolution(x, ones, nullptr, 1, y);
  // Windows {0,1,3,4}, {1,2,4,5}, {3,4,6,7}, {4,5,7,8}.
  EXPECT_EQ(y.data()[0], 8.0f);
  EXPECT_EQ(y.data()[1], 12.0f);
  EXPECT_EQ(y.data()[2], 20.0f);
  EXPECT_EQ(y.data()[3], 24.0f);
  // Strided 3x3 with bias over 2 channels, and a 1x1 (the GEMM without im2col), against finite
  // differences.
  for (const std::pair<int64_t, int64_t>& window :
       {std::pair<int64_t, int64_t>{3, 2}, {1, 1}, {1, 2}}) {
    // (Named variables, not a structured binding: clang before 16 cannot capture those.)
    const int64_t k = window.first, stride = window.second;
    Tensor in = random({2, 2, 7, 7}), w = random({3, 2, k, k}), b = random({3});
    const int64_t out = conv::valid_output(7, k, stride);
    Tensor c = random({2, 3, out, out}), o = be->empty({2, 3, out, out});
    auto loss = [&] {
      conv::convolution(in, w, &b, stride, o);
      return dot(o, c);
    };
    Tensor dx = be->empty(in.shape()), dw = be->zeros(w.shape()), db = be->zeros({3});
    conv::convolution_backward(in, w, c, stride, &dx, dw, &db);
    expect_gradient(in, dx, loss, "conv dx");
    expect_gradient(w, dw, loss, "conv dw");
    expect_gradient(b, db, loss, "conv db");
  }
}

TEST_F(Kernels, TransposedConvolutionByHandAsTheConvolutionsAdjointAndItsGradients) {
  // By hand, a 2x2 kernel of ones over x = [[1, 2], [3, 4]]: stride 2 spreads each input over its
  // own 2x2 block; stride 1 overlaps them, each output summing the inputs whose block covers it.
  Tensor x = be->empty({1, 1, 2, 2}), ones = be->empty({1, 1, 2, 2});
  for (int64_t i = 0; i < 4; ++i) x.data()[i] = static_cast<float>(i + 1);
  be->fill(ones, 1.0f);
  Tensor spread = be->empty({1, 1, 4, 4}), overlap = be->empty({1, 1, 3, 3});
  conv::transposed_convolution(x, ones, 2, spread);
  EXPECT_EQ(std::vector<float>(spread.data(), spread.data() + 16),
            (std::vector<float>{1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4}));
  conv::transposed_convolution(x, ones, 1, overlap);
  EXPECT_EQ(std::vector<float>(overlap.data(), overlap.data() + 9),
            (std::vector<float>{1, 3, 2, 4, 10, 6, 3, 7, 4}));
  for (const std::pair<int64_t, int64_t>& window :
       {std::pair<int64_t, int64_t>{2, 2}, {3, 2}, {1, 1}}) {
    const int64_t k = window.first, stride = window.second;
    // x [2 samples, 3 channels, 4x4] up to 2 channels: (4 - 1) stride + k rows.
    const int64_t up = (4 - 1) * stride + k;
    Tensor in = random({2, 3, 4, 4}), w = random({3, 2, k, k});
    Tensor c = random({2, 2, up, up}), o = be->empty({2, 2, up, up});
    // The adjoint of the convolution with w read as [3 filters, 2 channels]: for every z,
    // <conv_transpose(x), z> = <x, conv(z)>.
    conv::transposed_convolution(in, w, stride, o);
    Tensor back = be->empty(in.shape());
    conv::convolution(c, w, nullptr, stride, back);
    EXPECT_NEAR(dot(o, c), dot(in, back), 1e-4 * std::fabs(dot(in, back)) + 1e-4) << k;
    auto loss = [&] {
      conv::transposed_convolution(in, w, stride, o);
      return dot(o, c);
    };
    Tensor dx = be->empty(in.shape()), dw = be->zeros(w.shape());
    conv::transposed_convolution_backward(in, w, c, stride, &dx, dw);
    expect_gradient(in, dx, loss, "transposed conv dx");
    expect_gradient(w, dw, loss, "transposed conv dw");
  }
}

TEST_F(Kernels, CropConcatJoinsTheKeptMapsCentre) {
  // A kept 4x4 map of 0..15 joined to a 2x2 map of 100..103: the crop starts at row and column
  // floor((4 - 2) / 2) = 1, so channel 0 is [[5, 6], [9, 10]] and channel 1 the 2x2 map.
  Tensor kept = be->empty({1, 1, 4, 4}), x = be->empty({1, 1, 2, 2}), y = be->empty({1, 2, 2, 2});
  for (int64_t i = 0; i < 16; ++i) kept.data()[i] = static_cast<float>(i);
  for (int64_t i = 0; i < 4; ++i) x.data()[i] = static_cast<float>(100 + i);
  conv::crop_concat(kept, x, y);
  EXPECT_EQ(std::vector<float>(y.data(), y.data() + 8),
            (std::vector<float>{5, 6, 9, 10, 100, 101, 102, 103}));
  // Backward: dy = 0..7; the kept map's gradient (1 everywhere from its other use) gets 0..3 added
  // at the crop, x's gradient is 4..7.
  Tensor dy = be->empty({1, 2, 2, 2}), dkept = be->empty({1, 1, 4, 4}),
         dx = be->empty({1, 1, 2, 2});
  for (int64_t i = 0; i < 8; ++i) dy.data()[i] = static_cast<float>(i);
  be->fill(dkept, 1.0f);
  conv::crop_concat_backward(dy, dkept, dx);
  EXPECT_EQ(std::vector<float>(dkept.data(), dkept.data() + 16),
            (std::vector<float>{1, 1, 1, 1, 1, 1, 2, 1, 1, 3, 4, 1, 1, 1, 1, 1}));
  EXPECT_EQ(std::vector<float>(dx.data(), dx.data() + 4), (std::vector<float>{4, 5, 6, 7}));
  // An odd difference crops one more row after than before: 5 rows to 2 start at row 1.
  Tensor odd = be->empty({1, 1, 5, 2}), to = be->empty({1, 1, 2, 2}),
         joined = be->empty({1, 2, 2, 2});
  for (int64_t i = 0; i < 10; ++i) odd.data()[i] = static_cast<float>(i);
  be->fill(to, 0.0f);
  conv::crop_concat(odd, to, joined);
  EXPECT_EQ(std::vector<float>(joined.data(), joined.data() + 4), (std::vector<float>{2, 3, 4, 5}));
}

TEST_F(Kernels, PixelCrossEntropyByHandAndItsGradient) {
  // One sample, 2 classes, 1x2 pixels: logits (0, 0) at pixel 0 and (ln 3, 0) at pixel 1, labels
  // 0 and 1. Pixel 0: -log(1/2) = ln 2; pixel 1: -log(1/(3 + 1)) = ln 4. The sample's mean:
  // (ln 2 + ln 4) / 2 = 1.5 ln 2.
  Tensor z = be->empty({1, 2, 1, 2});
  z.data()[0] = 0.0f;                               // class 0, pixel 0
  z.data()[1] = static_cast<float>(std::log(3.0));  // class 0, pixel 1
  z.data()[2] = 0.0f;                               // class 1, pixel 0
  z.data()[3] = 0.0f;                               // class 1, pixel 1
  EXPECT_NEAR(conv::pixel_cross_entropy(z, {0, 1}, 1.0f, nullptr), 1.5 * std::log(2.0), 1e-6);
  // Against finite differences: 2 samples of 3 classes on 2x3 maps, scale 0.25.
  Tensor logits = random({2, 3, 2, 3}), grad = be->empty({2, 3, 2, 3});
  const std::vector<int32_t> labels{0, 2, 1, 1, 0, 2, 2, 2, 0, 1, 0, 1};
  conv::pixel_cross_entropy(logits, labels, 0.25f, &grad);
  expect_gradient(
      logits, grad, [&] { return 0.25 * conv::pixel_cross_entropy(logits, labels, 1.0f, nullptr); },
      "pixel cross entropy");
}

TEST_F(Kernels, ChannelBias) {
  // y[b, c, i] = y0[b, c, i] + bias[c]; db[c] = the sum of dy over its samples and pixels.
  Tensor y0 = random({2, 3, 2, 2}), bias = random({3}), c = random({2, 3, 2, 2});
  Tensor y = be->empty(y0.shape());
  auto loss = [&] {
    be->copy(y0, y);
    conv::add_channel_bias(y, bias);
    return dot(y, c);
  };
  loss();
  EXPECT_FLOAT_EQ(y.data()[5], y0.data()[5] + bias.data()[1]);  // sample 0, channel 1
  Tensor db = be->zeros({3});
  conv::channel_bias_backward(c, db);
  expect_gradient(bias, db, loss, "channel bias");
}

TEST_F(Kernels, BatchNormTrainingMode) {
  Tensor x = random({3, 2, 4, 5}, 2.0f), gamma = random({2}), beta = random({2});
  Tensor c = random({3, 2, 4, 5}), y = be->empty(x.shape());
  const int64_t count = 3 * 4 * 5;
  std::vector<double> sums, mean, rstd;
  auto forward = [&] {
    conv::channel_sums(x, sums);
    conv::batch_statistics(sums, count, mean, rstd);
    conv::batch_norm(x, gamma, beta, mean, rstd, y);
  };
  forward();
  // Each channel of the output has mean beta and (biased) variance gamma^2 var / (var + eps).
  for (int64_t ch = 0; ch < 2; ++ch) {
    double s = 0, q = 0, xs = 0, xq = 0;
    for (int64_t b = 0; b < 3; ++b)
      for (int64_t i = 0; i < 20; ++i) {
        const double v = y.data()[(b * 2 + ch) * 20 + i], u = x.data()[(b * 2 + ch) * 20 + i];
        s += v;
        q += v * v;
        xs += u;
        xq += u * u;
      }
    const double var_x = xq / count - (xs / count) * (xs / count);
    const double var_y = q / count - (s / count) * (s / count);
    EXPECT_NEAR(s / count, beta.data()[ch], 1e-5);
    EXPECT_NEAR(var_y, gamma.data()[ch] * gamma.data()[ch] * var_x / (var_x + 1e-5), 1e-4);
  }
  auto loss = [&] {
    forward();
    return dot(y, c);
  };
  forward();
  std::vector<double> back;
  conv::batch_norm_backward_sums(x, c, mean, rstd, back);
  Tensor dx = be->empty(x.shape()), dgamma = be->empty({2}), dbeta = be->empty({2});
  conv::batch_norm_backward(x, c, gamma, mean, rstd, back, count, dx);
  for (int64_t ch = 0; ch < 2; ++ch) {
    dbeta.data()[ch] = static_cast<float>(back[static_cast<size_t>(ch)]);
    dgamma.data()[ch] = static_cast<float>(back[static_cast<size_t>(2 + ch)]);
  }
  expect_gradient(x, dx, loss, "batch norm dx");
  expect_gradient(gamma, dgamma, loss, "dgamma");
  expect_gradient(beta, dbeta, loss, "dbeta");
  // The whole-map path (the backend keeps the statistics) is the same arithmetic: equal to the
  // bit, its parameter gradients added to what they held.
  forward();
  Tensor stats = be->empty({4 * 2}), yw = be->empty(x.shape()), dxw = be->empty(x.shape());
  Tensor dgw = be->zeros({2}), dbw = be->zeros({2});
  be->batch_norm_whole(x, gamma, beta, yw, stats);
  be->batch_norm_whole_backward(x, c, gamma, stats, dxw, dgw, dbw);
  for (int64_t i = 0; i < x.numel(); ++i) {
    EXPECT_EQ(yw.data()[i], y.data()[i]);
    EXPECT_EQ(dxw.data()[i], dx.data()[i]);
  }
  for (int64_t ch = 0; ch < 2; ++ch) {
    EXPECT_EQ(dgw.data()[ch], dgamma.data()[ch]);
    EXPECT_EQ(dbw.data()[ch], dbeta.data()[ch]);
  }
}

TEST_F(Kernels, Pooling) {
  // 4x4 input 0..15, 2x2 windows of stride 2: max takes each window's bottom-right corner, the
  // average its mean.
  Tensor x = be->empty({1, 1, 4, 4}), y = be->empty({1, 1, 2, 2});
  for (int64_t i = 0; i < 16; ++i) x.data()[i] = static_cast<float>(i);
  conv::max_pool(x, 2, 2, y);
  EXPECT_EQ(y.data()[0], 5.0f);
  EXPECT_EQ(y.data()[3], 15.0f);
  {
    // The backward routes each window's gradient to its maximum: element 7 for the second window
    // (rows 0-1, columns 2-3); on a tie, to the window's first maximum in reading order (PyTorch's
    // CPU kernel): a window of four equal values sends its gradient to its top-left element.
    Tensor ones = be->empty({1, 1, 2, 2}), dx = be->empty({1, 1, 4, 4});
    be->fill(ones, 1.0f);
    conv::max_pool_backward(x, y, ones, 2, 2, dx);
    EXPECT_EQ(dx.data()[7], 1.0f);
    EXPECT_EQ(dx.data()[6], 0.0f);
    be->fill(x, 2.0f);
    conv::max_pool(x, 2, 2, y);
    conv::max_pool_backward(x, y, ones, 2, 2, dx);
    EXPECT_EQ(dx.data()[0], 1.0f);
    EXPECT_EQ(dx.data()[1] + dx.data()[4] + dx.data()[5], 0.0f);
    for (int64_t i = 0; i < 16; ++i) x.data()[i] = static_cast<float>(i);
  }
  conv::avg_pool(x, 2, 2, y);
  EXPECT_EQ(y.data()[0], (0 + 1 + 4 + 5) / 4.0f);
  // Overlapping 3/2 windows against finite differences.
  Tensor in = random({2, 2, 7, 7}), c = random({2, 2, 3, 3}), o = be->empty({2, 2, 3, 3});
  Tensor dx = be->empty(in.shape());
  auto max_loss = [&] {
    conv::max_pool(in, 3, 2, o);
    return dot(o, c);
  };
  max_loss();
  conv::max_pool_backward(in, o, c, 3, 2, dx);
  expect_gradient(in, dx, max_loss, "max pool dx");
  auto avg_loss = [&] {
    conv::avg_pool(in, 3, 2, o);
    return dot(o, c);
  };
  conv::avg_pool_backward(c, 3, 2, dx);
  expect_gradient(in, dx, avg_loss, "avg pool dx");
}

// AmoebaNet's pieces: rectangular windows with a stride per axis, padding and the factorized
// reduction's shift, average pooling that leaves the padding out of the count, and the channel
// join.
TEST_F(Kernels, RectangularConvolutionByHandAndItsGradients) {
  // A 1x3 window of ones over one row 0..4, column stride 2: windows {0,1,2} and {2,3,4}.
  Tensor x = be->empty({1, 1, 1, 5}), ones = be->empty({1, 1, 1, 3}), y = be->empty({1, 1, 1, 2});
  for (int64_t i = 0; i < 5; ++i) x.data()[i] = static_cast<float>(i);
  be->fill(ones, 1.0f);
  conv::convolution(x, ones, nullptr, conv::Strides{1, 2}, y);
  EXPECT_EQ(y.data()[0], 3.0f);
  EXPECT_EQ(y.data()[1], 9.0f);
  // A 1x3 window cannot make a 2-row output from 1 row: refused.
  Tensor tall = be->empty({1, 1, 2, 2});
  EXPECT_THROW(conv::convolution(x, ones, nullptr, conv::Strides{1, 2}, tall), std::exception);
  // 1x7 of stride (1, 2) and 7x1 of stride (2, 1) with their padding (0, 3) and (3, 0), as
  // AmoebaNet's conv_1x7_7x1 runs them, against finite differences.
  for (const bool wide : {true, false}) {
    const int64_t kh = wide ? 1 : 7, kw = wide ? 7 : 1;
    const conv::Strides stride{wide ? 1 : 2, wide ? 2 : 1};
    Tensor in = random({2, 2, 6 + 2 * (kh / 2), 6 + 2 * (kw / 2)}), w = random({3, 2, kh, kw});
    Tensor b = random({3});
    const int64_t oh = conv::valid_output(in.dim(2), kh, stride.rows),
                  ow = conv::valid_output(in.dim(3), kw, stride.cols);
    EXPECT_EQ(oh * ow, 18);  // 6 x 3 or 3 x 6: one axis halved
    Tensor c = random({2, 3, oh, ow}), o = be->empty({2, 3, oh, ow});
    auto loss = [&] {
      conv::convolution(in, w, &b, stride, o);
      return dot(o, c);
    };
    Tensor dx = be->empty(in.shape()), dw = be->zeros(w.shape()), db = be->zeros({3});
    conv::convolution_backward(in, w, c, stride, &dx, dw, &db);
    expect_gradient(in, dx, loss, "rectangular conv dx");
    expect_gradient(w, dw, loss, "rectangular conv dw");
    expect_gradient(b, db, loss, "rectangular conv db");
  }
}

TEST_F(Kernels, ShiftPadsAndShiftsAMap) {
  // 2x3 map 0..5. Padding by one row and two columns: a 4x7 map with the input at (1, 2).
  Tensor x = be->empty({1, 1, 2, 3}), padded = be->empty({1, 1, 4, 7});
  for (int64_t i = 0; i < 6; ++i) x.data()[i] = static_cast<float>(i);
  conv::shift_map(x, -1, -2, -1.0f, padded);
  EXPECT_EQ(padded.data()[0], -1.0f);
  EXPECT_EQ(padded.data()[1 * 7 + 2], 0.0f);
  EXPECT_EQ(padded.data()[2 * 7 + 4], 5.0f);
  EXPECT_EQ(padded.data()[3 * 7 + 6], -1.0f);
  // torchgpipe's pad(x[:, :, 1:, 1:]): y[h][w] = x[h + 1][w + 1], zeros past the edge.
  Tensor shifted = be->empty({1, 1, 2, 3});
  conv::shift_map(x, 1, 1, 0.0f, shifted);
  EXPECT_EQ(shifted.data()[0], 4.0f);
  EXPECT_EQ(shifted.data()[1], 5.0f);
  for (int64_t i = 2; i < 6; ++i) EXPECT_EQ(shifted.data()[i], 0.0f) << i;
  // The backward is the adjoint: <shift(x), c> = <x, shift_backward(c)>.
  for (const std::pair<int64_t, int64_t>& by : {std::pair<int64_t, int64_t>{1, 1}, {-2, -1}}) {
    Tensor in = random({2, 3, 5, 4}), out = be->empty({2, 3, 5 - 2 * std::min<int64_t>(by.first, 0),
                                                       4 - 2 * std::min<int64_t>(by.second, 0)});
    Tensor c = random(out.shape()), dx = be->empty(in.shape());
    conv::shift_map(in, by.first, by.second, 0.0f, out);
    conv::shift_map_backward(c, by.first, by.second, dx);
    EXPECT_NEAR(dot(out, c), dot(in, dx), 1e-4);
  }
}

TEST_F(Kernels, AveragePoolLeavesThePaddingOutOfTheCount) {
  // 3x3 map of ones, 3x3 windows of stride 1 padded by 1: every output is 1 (PyTorch's
  // count_include_pad=False), where counting the padding would give 4/9 at a corner.
  Tensor x = be->empty({1, 1, 3, 3}), y = be->empty({1, 1, 3, 3});
  be->fill(x, 1.0f);
  conv::avg_pool_excluding_padding(x, 3, 1, 1, y);
  for (int64_t i = 0; i < 9; ++i) EXPECT_FLOAT_EQ(y.data()[i], 1.0f) << i;
  // 0..8: the corner (0, 0) averages {0, 1, 3, 4} = 2, the centre all nine = 4.
  for (int64_t i = 0; i < 9; ++i) x.data()[i] = static_cast<float>(i);
  conv::avg_pool_excluding_padding(x, 3, 1, 1, y);
  EXPECT_FLOAT_EQ(y.data()[0], 2.0f);
  EXPECT_FLOAT_EQ(y.data()[4], 4.0f);
  // Stride 2 over 6x6 (AmoebaNet's reduction cells) against finite differences.
  Tensor in = random({2, 2, 6, 6}), c = random({2, 2, 3, 3}), o = be->empty({2, 2, 3, 3});
  Tensor dx = be->empty(in.shape());
  auto loss = [&] {
    conv::avg_pool_excluding_padding(in, 3, 2, 1, o);
    return dot(o, c);
  };
  conv::avg_pool_excluding_padding_backward(c, 3, 2, 1, dx);
  expect_gradient(in, dx, loss, "avg pool excluding padding dx");
}

TEST_F(Kernels, ChannelConcatAndSplit) {
  // Two samples of a 1-channel and a 2-channel 1x2 map: each sample's channels in order.
  Tensor a = be->empty({2, 1, 1, 2}), b = be->empty({2, 2, 1, 2}), y = be->empty({2, 3, 1, 2});
  for (int64_t i = 0; i < 4; ++i) a.data()[i] = static_cast<float>(i);
  for (int64_t i = 0; i < 8; ++i) b.data()[i] = static_cast<float>(10 + i);
  conv::concat_channels({a, b}, y);
  const std::vector<float> want{0, 1, 10, 11, 12, 13, 2, 3, 14, 15, 16, 17};
  for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(y.data()[i], want[static_cast<size_t>(i)]) << i;
  std::vector<Tensor> parts{be->empty(a.shape()), be->empty(b.shape())};
  conv::split_channels(y, parts);
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(parts[0].data()[i], a.data()[i]);
  for (int64_t i = 0; i < 8; ++i) EXPECT_EQ(parts[1].data()[i], b.data()[i]);
  Tensor wrong = be->empty({2, 4, 1, 2});
  EXPECT_THROW(conv::concat_channels({a, b}, wrong), std::exception);
}

// Volumes [B, C, D, H, W] (3D U-Net): the same kernels with a window along the depth too.
TEST_F(Kernels, VolumeConvolutionByHandAndItsGradients) {
  // A 1-channel 3x3x3 volume of 0..26 and a 2x2x2 kernel of ones: each output sums a 2x2x2 cube.
  // The first cube holds {0, 1, 3, 4, 9, 10, 12, 13} (sum 52); the cube at (1, 1, 1) is each of
  // those plus 9 + 3 + 1 = 13: 52 + 8 x 13 = 156.
  Tensor x = be->empty({1, 1, 3, 3, 3}), ones = be->empty({1, 1, 2, 2, 2});
  Tensor y = be->empty({1, 1, 2, 2, 2});
  for (int64_t i = 0; i < 27; ++i) x.data()[i] = static_cast<float>(i);
  be->fill(ones, 1.0f);
  conv::convolution(x, ones, nullptr, 1, y);
  EXPECT_EQ(y.data()[0], 52.0f);
  EXPECT_EQ(y.data()[1], 60.0f);   // +1 along the columns: 8 x 1 more
  EXPECT_EQ(y.data()[4], 124.0f);  // +9 along the depth: 8 x 9 more
  EXPECT_EQ(y.data()[7], 156.0f);
  // A 2D weight does not fit a volume.
  Tensor flat = be->empty({1, 1, 2, 2});
  EXPECT_THROW(conv::convolution(x, flat, nullptr, 1, y), std::exception);
  // Strided 3x3x3 with bias, 2x2x2 of stride 2, and a 1x1x1 (the GEMM without im2col) against
  // finite differences, on 2 samples of 2 channels of 5x5x5 (odd sizes: the strided windows
  // leave the last plane unread).
  for (const std::pair<int64_t, int64_t>& window :
       {std::pair<int64_t, int64_t>{3, 2}, {2, 2}, {1, 1}}) {
    const int64_t k = window.first, stride = window.second;
    const int64_t out = conv::valid_output(5, k, stride);
    Tensor in = random({2, 2, 5, 5, 5}), w = random({3, 2, k, k, k}), b = random({3});
    Tensor c = random({2, 3, out, out, out}), o = be->empty({2, 3, out, out, out});
    auto loss = [&] {
      conv::convolution(in, w, &b, stride, o);
      return dot(o, c);
    };
    Tensor dx = be->empty(in.shape()), dw = be->zeros(w.shape()), db = be->zeros({3});
    conv::convolution_backward(in, w, c, stride, &dx, dw, &db);
    // The loss is linear in each operand: a central difference of any step is exact but for the
    // float rounding of the 54-term window sums, which a step of 0.25 divides by 25 against the
    // default 0.01 (with it, a build without FMA missed the bound by 27% on one weight).
    constexpr float kLinearStep = 0.25f;
    expect_gradient(in, dx, loss, "conv3d dx", kLinearStep);
    expect_gradient(w, dw, loss, "conv3d dw", kLinearStep);
    expect_gradient(b, db, loss, "conv3d db", kLinearStep);
  }
}

TEST_F(Kernels, VolumeTransposedConvolutionIsTheConvolutionsAdjoint) {
  // By hand: one input voxel of 2 under a 2x2x2 kernel of ones at stride 2 fills a 2x2x2 cube.
  Tensor one = be->empty({1, 1, 1, 1, 1}), ones = be->empty({1, 1, 2, 2, 2});
  Tensor cube = be->empty({1, 1, 2, 2, 2});
  one.data()[0] = 2.0f;
  be->fill(ones, 1.0f);
  conv::transposed_convolution(one, ones, 2, cube);
  EXPECT_EQ(std::vector<float>(cube.data(), cube.data() + 8), std::vector<float>(8, 2.0f));
  // 3 channels of 2x3x2 up to 2 channels, 2x2x2 of stride 2 (U-Net's) and 3x3x3 of stride 1.
  for (const std::pair<int64_t, int64_t>& window : {std::pair<int64_t, int64_t>{2, 2}, {3, 1}}) {
    const int64_t k = window.first, stride = window.second;
    auto up = [&](int64_t n) { return (n - 1) * stride + k; };
    Tensor in = random({2, 3, 2, 3, 2}), w = random({3, 2, k, k, k});
    const std::vector<int64_t> out{2, 2, up(2), up(3), up(2)};
    Tensor c = random(out), o = be->empty(out);
    conv::transposed_convolution(in, w, stride, o);
    Tensor back = be->empty(in.shape());
    conv::convolution(c, w, nullptr, stride, back);
    EXPECT_NEAR(dot(o, c), dot(in, back), 1e-4 * std::fabs(dot(in, back)) + 1e-4) << k;
    auto loss = [&] {
      conv::transposed_convolution(in, w, stride, o);
      return dot(o, c);
    };
    Tensor dx = be->empty(in.shape()), dw = be->zeros(w.shape());
    conv::transposed_convolution_backward(in, w, c, stride, &dx, dw);
    expect_gradient(in, dx, loss, "transposed conv3d dx");
    expect_gradient(w, dw, loss, "transposed conv3d dw");
  }
}

TEST_F(Kernels, VolumeCropConcatJoinsTheKeptVolumesCentre) {
  // A kept 4x4x4 volume of 0..63 joined to a 2x2x2 one of 100..107: the crop starts at plane, row
  // and column 1, so it holds 16 + 4 + 1 = 21, 22, 25, 26 and, a plane on, 37, 38, 41, 42.
  Tensor kept = be->empty({1, 1, 4, 4, 4}), x = be->empty({1, 1, 2, 2, 2});
  Tensor y = be->empty({1, 2, 2, 2, 2});
  for (int64_t i = 0; i < 64; ++i) kept.data()[i] = static_cast<float>(i);
  for (int64_t i = 0; i < 8; ++i) x.data()[i] = static_cast<float>(100 + i);
  conv::crop_concat(kept, x, y);
  EXPECT_EQ(
      std::vector<float>(y.data(), y.data() + 16),
      (std::vector<float>{21, 22, 25, 26, 37, 38, 41, 42, 100, 101, 102, 103, 104, 105, 106, 107}));
  // Backward: dy = 0..15; the kept volume's gradient gets 0..7 added at the crop, x's is 8..15.
  Tensor dy = be->empty({1, 2, 2, 2, 2}), dkept = be->zeros({1, 1, 4, 4, 4});
  Tensor dx = be->empty({1, 1, 2, 2, 2});
  for (int64_t i = 0; i < 16; ++i) dy.data()[i] = static_cast<float>(i);
  conv::crop_concat_backward(dy, dkept, dx);
  const std::vector<int64_t> crop{21, 22, 25, 26, 37, 38, 41, 42};
  double sum = 0;
  for (int64_t i = 0; i < 64; ++i) sum += dkept.data()[i];
  EXPECT_EQ(sum, 28.0);  // 0 + 1 + ... + 7, all at the crop
  for (size_t i = 0; i < crop.size(); ++i)
    EXPECT_EQ(dkept.data()[crop[i]], static_cast<float>(i)) << i;
  EXPECT_EQ(dx.data()[0], 8.0f);
  EXPECT_EQ(dx.data()[7], 15.0f);
  // A 2D map does not join a volume.
  Tensor flat = be->empty({1, 1, 2, 2}), joined = be->empty({1, 2, 2, 2});
  EXPECT_THROW(conv::crop_concat(kept, flat, joined), std::exception);
}

TEST_F(Kernels, VolumePoolingNormalisationAndLoss) {
  // 4x4x4 of 0..63, 2x2x2 windows of stride 2: max takes each cube's far corner, 16 + 4 + 1 = 21
  // for the first; the average is (0 + 1 + 4 + 5 + 16 + 17 + 20 + 21) / 8 = 10.5.
  Tensor x = be->empty({1, 1, 4, 4, 4}), y = be->empty({1, 1, 2, 2, 2});
  for (int64_t i = 0; i < 64; ++i) x.data()[i] = static_cast<float>(i);
  conv::max_pool(x, 2, 2, y);
  EXPECT_EQ(y.data()[0], 21.0f);
  EXPECT_EQ(y.data()[7], 63.0f);
  conv::avg_pool(x, 2, 2, y);
  EXPECT_EQ(y.data()[0], 10.5f);
  // Overlapping 3/2 windows against finite differences (the average divides by 27).
  Tensor in = random({2, 2, 5, 5, 5}), c = random({2, 2, 2, 2, 2}), o = be->empty({2, 2, 2, 2, 2});
  Tensor dx = be->empty(in.shape());
  auto max_loss = [&] {
    conv::max_pool(in, 3, 2, o);
    return dot(o, c);
  };
  max_loss();
  conv::max_pool_backward(in, o, c, 3, 2, dx);
  expect_gradient(in, dx, max_loss, "3D max pool dx");
  auto avg_loss = [&] {
    conv::avg_pool(in, 3, 2, o);
    return dot(o, c);
  };
  conv::avg_pool_backward(c, 3, 2, dx);
  expect_gradient(in, dx, avg_loss, "3D avg pool dx");
  // Batch statistics over every voxel of the samples: count = B D H W.
  Tensor v = random({2, 2, 2, 3, 3}, 2.0f), gamma = random({2}), beta = random({2});
  Tensor cv = random(v.shape()), yv = be->empty(v.shape());
  const int64_t count = 2 * 2 * 3 * 3;
  std::vector<double> sums, mean, rstd;
  auto bn_loss = [&] {
    conv::channel_sums(v, sums);
    conv::batch_statistics(sums, count, mean, rstd);
    conv::batch_norm(v, gamma, beta, mean, rstd, yv);
    return dot(yv, cv);
  };
  bn_loss();
  double channel0 = 0;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t i = 0; i < 18; ++i) channel0 += yv.data()[b * 36 + i];
  EXPECT_NEAR(channel0 / count, beta.data()[0], 1e-5);  // each channel's mean is its beta
  std::vector<double> back;
  conv::batch_norm_backward_sums(v, cv, mean, rstd, back);
  Tensor dv = be->empty(v.shape());
  conv::batch_norm_backward(v, cv, gamma, mean, rstd, back, count, dv);
  expect_gradient(v, dv, bn_loss, "3D batch norm dx");
  // The per-voxel loss: one label per voxel, each sample's mean over its voxels.
  Tensor logits = random({2, 3, 2, 2, 2}), grad = be->empty(logits.shape());
  const std::vector<int32_t> labels{0, 2, 1, 1, 0, 2, 2, 2, 0, 1, 0, 1, 2, 2, 1, 0};
  conv::pixel_cross_entropy(logits, labels, 0.25f, &grad);
  expect_gradient(
      logits, grad, [&] { return 0.25 * conv::pixel_cross_entropy(logits, labels, 1.0f, nullptr); },
      "per-voxel cross entropy");
  EXPECT_THROW(conv::pixel_cross_entropy(logits, {0, 1}, 1.0f, nullptr), std::exception);
}

TEST_F(Kernels, AdaptiveAveragePoolOverBlocks) {
  // 5 rows to 3 bins, PyTorch's [floor(iH/o), ceil((i+1)H/o)): rows {0,1}, {1,2,3}, {3,4}.
  Tensor x = be->empty({1, 1, 5, 1}), y = be->empty({1, 1, 3, 1});
  for (int64_t i = 0; i < 5; ++i) x.data()[i] = static_cast<float>(i);
  conv::adaptive_avg_pool(x, {0, 5}, {0, 1}, 5, 1, y);
  EXPECT_FLOAT_EQ(y.data()[0], 0.5f);
  EXPECT_FLOAT_EQ(y.data()[1], 2.0f);
  EXPECT_FLOAT_EQ(y.data()[2], 3.5f);
  // Blocks of a 6x5 map (rows 0-2 and 3-5, columns 0-1 and 2-4): their partial poolings add up
  // to the whole map's, and their gradients are the whole gradient's blocks.
  Tensor whole = random({2, 3, 6, 5}), c = random({2, 3, 2, 2}), pooled = be->empty({2, 3, 2, 2});
  conv::adaptive_avg_pool(whole, {0, 6}, {0, 5}, 6, 5, pooled);
  Tensor dwhole = be->empty(whole.shape());
  conv::adaptive_avg_pool_backward(c, {0, 6}, {0, 5}, 6, 5, dwhole);
  auto loss = [&] {
    conv::adaptive_avg_pool(whole, {0, 6}, {0, 5}, 6, 5, pooled);
    return dot(pooled, c);
  };
  expect_gradient(whole, dwhole, loss, "adaptive pool dx");
  std::vector<double> total(static_cast<size_t>(pooled.numel()), 0.0);
  for (spec::Rows rows : {spec::Rows{0, 3}, spec::Rows{3, 6}})
    for (spec::Rows cols : {spec::Rows{0, 2}, spec::Rows{2, 5}}) {
      Tensor block = be->empty({2, 3, rows.size(), cols.size()}), part = be->empty(pooled.shape());
      for (int64_t p = 0; p < 6; ++p)
        for (int64_t h = rows.begin; h < rows.end; ++h)
          for (int64_t w = cols.begin; w < cols.end; ++w)
            block.data()[(p * rows.size() + h - rows.begin) * cols.size() + w - cols.begin] =
                whole.data()[(p * 6 + h) * 5 + w];
      conv::adaptive_avg_pool(block, rows, cols, 6, 5, part);
      for (int64_t i = 0; i < part.numel(); ++i) total[static_cast<size_t>(i)] += part.data()[i];
      Tensor dblock = be->empty(block.shape());
      conv::adaptive_avg_pool_backward(c, rows, cols, 6, 5, dblock);
      for (int64_t p = 0; p < 6; ++p)
        for (int64_t h = rows.begin; h < rows.end; ++h)
          for (int64_t w = cols.begin; w < cols.end; ++w)
            EXPECT_EQ(
                dblock.data()[(p * rows.size() + h - rows.begin) * cols.size() + w - cols.begin],
                dwhole.data()[(p * 6 + h) * 5 + w]);
    }
  conv::adaptive_avg_pool(whole, {0, 6}, {0, 5}, 6, 5, pooled);
  for (int64_t i = 0; i < pooled.numel(); ++i)
    EXPECT_NEAR(total[static_cast<size_t>(i)], pooled.data()[i], 1e-5);
}

TEST_F(Kernels, VolumeAdaptiveAveragePoolOverBlocksOfPlanes) {
  // 4 planes of 1 x 1 to 3 bins: planes {0, 1}, {1, 2}, {2, 3} (PyTorch's bins on the depth too).
  Tensor x = be->empty({1, 1, 4, 1, 1}), y = be->empty({1, 1, 3, 1, 1});
  for (int64_t i = 0; i < 4; ++i) x.data()[i] = static_cast<float>(i);
  conv::adaptive_avg_pool(x, spec::MapBlock{{0, 1}, {0, 1}, {0, 4}}, spec::MapExtent{1, 1, 4}, y);
  EXPECT_FLOAT_EQ(y.data()[0], 0.5f);
  EXPECT_FLOAT_EQ(y.data()[1], 1.5f);
  EXPECT_FLOAT_EQ(y.data()[2], 2.5f);
  // A 4 x 3 x 3 volume to 3 x 2 x 2 against finite differences, and its two blocks of planes
  // ([0, 2) and [2, 4): the middle bin straddles them): the partial poolings add up to the whole.
  const spec::MapExtent map{3, 3, 4};
  const spec::MapBlock all{{0, 3}, {0, 3}, {0, 4}};
  Tensor whole = random({2, 2, 4, 3, 3}), c = random({2, 2, 3, 2, 2});
  Tensor pooled = be->empty(c.shape()), dwhole = be->empty(whole.shape());
  conv::adaptive_avg_pool_backward(c, all, map, dwhole);
  auto loss = [&] {
    conv::adaptive_avg_pool(whole, all, map, pooled);
    return dot(pooled, c);
  };
  expect_gradient(whole, dwhole, loss, "3D adaptive pool dx");
  loss();
  std::vector<double> total(static_cast<size_t>(pooled.numel()), 0.0);
  for (const spec::Rows planes : {spec::Rows{0, 2}, spec::Rows{2, 4}}) {
    const spec::MapBlock block{{0, 3}, {0, 3}, planes};
    Tensor part_in = be->empty({2, 2, 2, 3, 3}), part = be->empty(pooled.shape());
    for (int64_t m = 0; m < 4; ++m)
      std::copy_n(whole.data() + (m * 4 + planes.begin) * 9, 2 * 9, part_in.data() + m * 2 * 9);
    conv::adaptive_avg_pool(part_in, block, map, part);
    for (int64_t i = 0; i < part.numel(); ++i) total[static_cast<size_t>(i)] += part.data()[i];
    Tensor dpart = be->empty(part_in.shape());
    conv::adaptive_avg_pool_backward(c, block, map, dpart);
    for (int64_t m = 0; m < 4; ++m)
      for (int64_t i = 0; i < 2 * 9; ++i)
        EXPECT_EQ(dpart.data()[m * 2 * 9 + i], dwhole.data()[(m * 4 + planes.begin) * 9 + i]);
  }
  for (int64_t i = 0; i < pooled.numel(); ++i)
    EXPECT_NEAR(total[static_cast<size_t>(i)], pooled.data()[i], 1e-5);
}

}  // namespace
}  // namespace sextant::exec

namespace sextant::exec {
namespace {

// Context-parallel attention against the single-rank causal attention (the Backend's kernels):
// each of two ranks holds chunks (0, 3) or (1, 2) of a sequence of 8 in 4 chunks of 2, attends to
// the whole sequence's keys and values, and must give the whole attention's output rows at its
// positions; in backward its q gradient rows, and the two ranks' key/value gradients summed, must
// be the whole attention's. Grouped-query attention: 4 q heads over 2 kv heads.
TEST_F(Kernels, ContextParallelAttentionIsTheWholeAttentionsRows) {
  const int64_t seq = 8, cp = 2;
  const QkvLayout whole{2, seq, 4, 2, 3};
  const int64_t rows = whole.batch * seq, hd = whole.heads * whole.head_dim;
  const int64_t q_width = hd, kv_width = 2 * whole.kv_heads * whole.head_dim;
  Tensor qkv = random({rows, whole.width()}), dout = random({rows, hd});
  Tensor out = be->empty({rows, hd}), att = be->empty({whole.batch, whole.heads, seq, seq});
  be->attention_scores(qkv, whole, att);
  be->causal_softmax(att, seq);
  be->attention_context(att, qkv, whole, out);
  Tensor dqkv = be->empty({rows, whole.width()});
  Tensor dprobs = be->empty({whole.batch, whole.heads, seq, seq});
  be->attention_context_backward(att, qkv, dout, whole, dprobs, dqkv);
  be->causal_softmax_backward(att, dprobs, seq);
  be->attention_scores_backward(dprobs, qkv, whole, dqkv);
  // The keys and values of the whole sequences, as a rank gathers them.
  Tensor kv = be->empty({rows, kv_width});
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < kv_width; ++k)
      kv.data()[r * kv_width + k] = qkv.data()[r * whole.width() + q_width + k];
  Tensor dkv_sum = be->zeros({rows, kv_width});
  for (int64_t rank = 0; rank < cp; ++rank) {
    SCOPED_TRACE(rank);
    const std::vector<int32_t> pos = spec::context_positions(seq, cp, rank);
    ASSERT_EQ(pos,
              rank == 0 ? (std::vector<int32_t>{0, 1, 6, 7}) : (std::vector<int32_t>{2, 3, 4, 5}));
    const int64_t local = static_cast<int64_t>(pos.size());
    context::Geometry g{whole, seq};
    g.q.seq = local;
    g.q.positions = pos.data();
    auto whole_row = [&](int64_t r) {
      return r / local * seq + pos[static_cast<size_t>(r % local)];
    };
    Tensor q = be->empty({whole.batch * local, whole.width()});
    Tensor d = be->empty({whole.batch * local, hd});
    for (int64_t r = 0; r < whole.batch * local; ++r) {
      std::copy_n(qkv.data() + whole_row(r) * whole.width(), whole.width(),
                  q.data() + r * whole.width());
      std::copy_n(dout.data() + whole_row(r) * hd, hd, d.data() + r * hd);
    }
    Tensor probs = be->empty({whole.batch, whole.heads, local, seq});
    Tensor o = be->empty({whole.batch * local, hd});
    context::scores(q, kv, g, probs);
    context::masked_softmax(probs, g);
    context::context(probs, kv, g, o);
    for (int64_t r = 0; r < whole.batch * local; ++r)
      for (int64_t k = 0; k < hd; ++k)
        EXPECT_NEAR(o.data()[r * hd + k], out.data()[whole_row(r) * hd + k], 1e-6) << r;
    Tensor dq = be->empty({whole.batch * local, whole.width()});
    Tensor dkv = be->zeros({rows, kv_width});
    Tensor dp = be->empty({whole.batch, whole.heads, local, seq});
    context::context_backward(probs, kv, d, g, dp, dkv);
    context::masked_softmax_backward(probs, dp, g);
    context::scores_backward(dp, q, kv, g, dq, dkv);
    for (int64_t r = 0; r < whole.batch * local; ++r)
      for (int64_t k = 0; k < q_width; ++k)
        EXPECT_NEAR(dq.data()[r * whole.width() + k], dqkv.data()[whole_row(r) * whole.width() + k],
                    1e-5)
            << r;
    be->add(dkv_sum, dkv, dkv_sum);
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < kv_width; ++k)
      EXPECT_NEAR(dkv_sum.data()[r * kv_width + k], dqkv.data()[r * whole.width() + q_width + k],
                  1e-5)
          << r;
}

// Rotary embeddings at given positions: a row rotated as the row of the whole sequence at its
// position.
TEST_F(Kernels, RopeAtPositionsRotatesAsTheWholeSequence) {
  const QkvLayout whole{1, 8, 2, 1, 4};
  Tensor all = random({8, whole.width()});
  Tensor part = be->empty({4, whole.width()});
  const std::vector<int32_t> pos = spec::context_positions(8, 2, 1);  // 2, 3, 4, 5
  for (int64_t r = 0; r < 4; ++r)
    std::copy_n(all.data() + pos[static_cast<size_t>(r)] * whole.width(), whole.width(),
                part.data() + r * whole.width());
  QkvLayout l = whole;
  l.seq = 4;
  l.positions = pos.data();
  be->rope(all, whole, 1e4f, false);
  be->rope(part, l, 1e4f, false);
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t k = 0; k < whole.width(); ++k)
      EXPECT_NEAR(part.data()[r * whole.width() + k],
                  all.data()[pos[static_cast<size_t>(r)] * whole.width() + k], 1e-6);
}

}  // namespace
}  // namespace sextant::exec
