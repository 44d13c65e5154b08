// Ring attention's kernels against the Backend's unfused causal attention over the whole
// sequence (the single-rank reference): every cp rank's rows, attended block by block to every
// rank's keys and merged by the log-sum-exp, give the reference output; the blocks' backward
// steps, summed over the query ranks, give the reference dq, dk and dv.
#include "sextant/exec/blockwise_attention.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "sextant/exec/cpu_backend.hpp"
#include "sextant/spec/context_parallel.hpp"

namespace sextant::exec {
namespace {

constexpr float kTol = 2e-5f;  // fp32 sums of a few dozen terms of order 1

class Blockwise : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be = make_cpu_backend();
  std::mt19937 rng{20261125};

  Tensor random(std::vector<int64_t> shape) {
    Tensor t = be->empty(std::move(shape));
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = d(rng);
    return t;
  }
};

// Grouped-query attention (4 q heads on 2 kv heads), 2 sequences of 12 tokens over cp 3: each
// rank holds chunks r and 5 - r of 2 tokens (spec::context_positions), so most blocks are part
// visible, part masked, and some rows of a block see none of its keys.
TEST_F(Blockwise, MergedBlocksAndTheirGradientsEqualWholeSequenceAttention) {
  const int64_t batch = 2, seq = 12, heads = 4, kv_heads = 2, d = 4, cp = 3;
  const QkvLayout whole{batch, seq, heads, kv_heads, d};
  const int64_t width = whole.width(), hd = heads * d, kvw = 2 * kv_heads * d;
  const Tensor qkv = random({batch * seq, width}), dout = random({batch * seq, hd});

  // The reference: scores, masked softmax and context over the whole sequences, and backward.
  Tensor probs = be->empty({batch, heads, seq, seq}), out = be->empty({batch * seq, hd});
  be->attention_scores(qkv, whole, probs);
  be->causal_softmax(probs, seq);
  be->attention_context(probs, qkv, whole, out);
  Tensor dprobs = be->empty({batch, heads, seq, seq}), dqkv = be->zeros({batch * seq, width});
  be->attention_context_backward(probs, qkv, dout, whole, dprobs, dqkv);
  be->causal_softmax_backward(probs, dprobs, seq);
  be->attention_scores_backward(dprobs, qkv, whole, dqkv);

  // Rank r's rows of a [batch * seq, w] tensor, in its order.
  const int64_t local = seq / cp;
  std::vector<std::vector<int32_t>> positions;
  for (int64_t r = 0; r < cp; ++r) positions.push_back(spec::context_positions(seq, cp, r));
  auto rows_of = [&](const Tensor& t, int64_t r, int64_t w, int64_t column, int64_t n) {
    Tensor x = be->empty({batch * local, n});
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t i = 0; i < local; ++i)
        for (int64_t c = 0; c < n; ++c)
          x.data()[(b * local + i) * n + c] =
              t.data()[(b * seq + positions[r][i]) * w + column + c];
    return x;
  };
  std::vector<Tensor> qkv_of, kv_of, dout_of, dkv_sum;
  for (int64_t r = 0; r < cp; ++r) {
    qkv_of.push_back(rows_of(qkv, r, width, 0, width));
    kv_of.push_back(rows_of(qkv, r, width, hd, kvw));
    dout_of.push_back(rows_of(dout, r, hd, 0, hd));
    dkv_sum.push_back(be->zeros({batch * local, kvw}));
  }
  for (int64_t r = 0; r < cp; ++r) {
    SCOPED_TRACE(r);
    const QkvLayout mine{batch, local, heads, kv_heads, d, positions[r].data()};
    Tensor o = be->empty({batch * local, hd}), lse = be->empty({batch, heads, local});
    Tensor step_o = be->empty({batch * local, hd}), step_lse = be->empty({batch, heads, local});
    for (int64_t k = 0; k < cp; ++k) {
      const context::Geometry g{mine, local, positions[k].data()};
      const bool first = k == 0;
      blockwise::forward(qkv_of[r], kv_of[k], g, first ? o : step_o, first ? lse : step_lse);
      if (!first) blockwise::merge(o, lse, step_o, step_lse);
    }
    const Tensor expected = rows_of(out, r, hd, 0, hd);
    for (int64_t i = 0; i < o.numel(); ++i) ASSERT_NEAR(o.data()[i], expected.data()[i], kTol);
    // The log-sum-exp of row i of head h: probs(i, j) = exp(score(i, j) - lse), so at the diagonal
    // key j = position(i) it is score - log(probs); the score is recomputed here by hand.
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t i = 0; i < local; ++i) {
          const int64_t p = positions[r][i], row = b * seq + p;
          double score = 0;
          for (int64_t c = 0; c < d; ++c)
            score += qkv.data()[row * width + whole.q_column(h) + c] *
                     qkv.data()[row * width + whole.k_column(h) + c];
          score /= std::sqrt(static_cast<double>(d));
          const double prob = probs.data()[((b * heads + h) * seq + p) * seq + p];
          ASSERT_NEAR(lse.data()[(b * heads + h) * local + i], score - std::log(prob), 1e-4);
        }

    Tensor delta = be->empty({batch, heads, local});
    blockwise::backward_prep(o, dout_of[r], mine, delta);
    Tensor dq = be->zeros({batch * local, hd}), step_dq = be->empty({batch * local, hd});
    Tensor step_dkv = be->empty({batch * local, kvw});
    for (int64_t k = 0; k < cp; ++k) {
      const context::Geometry g{mine, local, positions[k].data()};
      blockwise::backward(qkv_of[r], kv_of[k], dout_of[r], lse, delta, g, step_dq, step_dkv);
      be->add(dq, step_dq, dq);
      be->add(dkv_sum[k], step_dkv, dkv_sum[k]);
    }
    const Tensor expected_dq = rows_of(dqkv, r, width, 0, hd);
    for (int64_t i = 0; i < dq.numel(); ++i)
      ASSERT_NEAR(dq.data()[i], expected_dq.data()[i], kTol) << "dq " << i;
  }
  for (int64_t k = 0; k < cp; ++k) {
    const Tensor expected_dkv = rows_of(dqkv, k, width, hd, kvw);
    for (int64_t i = 0; i < expected_dkv.numel(); ++i)
      ASSERT_NEAR(dkv_sum[k].data()[i], expected_dkv.data()[i], kTol) << "dkv " << k << " " << i;
  }
}

// A row that sees no key of a block (a query before the block's first position) gets a zero
// output and a log-sum-exp of -infinity, and merging it changes nothing.
TEST_F(Blockwise, ABlockARowCannotSeeLeavesItsOutputUnchanged) {
  const std::vector<int32_t> q_positions{0, 1}, k_positions{2, 3};
  const QkvLayout l{1, 2, 1, 1, 2, q_positions.data()};
  const Tensor qkv = random({2, l.width()}), kv = random({2, 4});
  Tensor o = be->empty({2, 2}), lse = be->empty({1, 1, 2});
  blockwise::forward(qkv, kv, {l, 2, k_positions.data()}, o, lse);
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(o.data()[i], 0.0f);
  EXPECT_TRUE(std::isinf(lse.data()[0]) && lse.data()[0] < 0);
  Tensor running = random({2, 2}), running_lse = random({1, 1, 2});
  const std::vector<float> before(running.data(), running.data() + 4);
  blockwise::merge(running, running_lse, o, lse);
  EXPECT_EQ(std::vector<float>(running.data(), running.data() + 4), before);
}

}  // namespace
}  // namespace sextant::exec
