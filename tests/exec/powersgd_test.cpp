// PowerSGD's bucket exchange (exec/powersgd.hpp) against its definition (Vogels et al. 2019):
// a rank-1 gradient goes through exactly, replicas end alike and what they lost is in their
// residuals, and the warm-started power iteration finds the best rank-1 approximation
// (Eckart-Young), all worked by hand.
#include "sextant/exec/powersgd.hpp"

#include <gtest/gtest.h>

#include <Eigen/Dense>
#include <barrier>
#include <random>
#include <thread>
#include <vector>

namespace sextant::exec {
namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Sums in place over ranks that run as threads of this process: every rank adds the buffers up
// in rank order (so all get the same bits) between two barriers.
class ThreadedAllReduce {
 public:
  explicit ThreadedAllReduce(int ranks) : buffers_(static_cast<size_t>(ranks)), sync_(ranks) {}
  AllReduceFn fn(size_t rank) {
    return [this, rank](float* data, int64_t n) {
      buffers_[rank] = data;
      sync_.arrive_and_wait();
      std::vector<float> sum(static_cast<size_t>(n), 0.0f);
      for (const float* b : buffers_)
        for (int64_t i = 0; i < n; ++i) sum[static_cast<size_t>(i)] += b[i];
      sync_.arrive_and_wait();
      std::copy(sum.begin(), sum.end(), data);
    };
  }

 private:
  std::vector<float*> buffers_;
  std::barrier<> sync_;
};

// One step of the exchange on every rank (a thread each), rank r holding `grads[r]` and, with
// error feedback, `residual[r]`.
void step(std::vector<PowerSgdExchange>& ranks, std::vector<std::vector<float>>& grads,
          std::vector<std::vector<float>>* residual) {
  ThreadedAllReduce sum(static_cast<int>(ranks.size()));
  std::vector<std::thread> threads;
  for (size_t r = 0; r < ranks.size(); ++r) {
    threads.emplace_back([&, r] {
      float* g = grads[r].data();
      float* e = residual != nullptr ? (*residual)[r].data() : nullptr;
      const AllReduceFn all_reduce = sum.fn(r);
      ranks[r].all_reduce_uncompressed(g, all_reduce);
      ranks[r].compress(g, e);
      ranks[r].all_reduce_p(all_reduce);
      ranks[r].project(g, e);
      ranks[r].all_reduce_q(all_reduce);
      ranks[r].decompress(g, e);
    });
  }
  for (std::thread& t : threads) t.join();
}

TEST(PowerSgdExchange, OrthonormalisedColumnsSpanTheFirstOnesDirection) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  std::vector<float> p(7 * 3);
  for (float& v : p) v = normal(rng);
  const Eigen::VectorXf first = Eigen::Map<RowMat>(p.data(), 7, 3).col(0);
  orthonormalise_columns(p.data(), 7, 3);
  const RowMat P = Eigen::Map<RowMat>(p.data(), 7, 3);
  EXPECT_TRUE((P.transpose() * P).isApprox(RowMat::Identity(3, 3), 1e-5f)) << P.transpose() * P;
  // Gram-Schmidt keeps the first column's direction.
  EXPECT_TRUE(P.col(0).isApprox(first.normalized(), 1e-5f));
}

TEST(PowerSgdExchange, ARankOneGradientGoesThroughExactly) {
  // M = u v^T (6 x 5, compressed at rank 1: (6 + 5) * 2 = 22 < 30). P = M Q = u (v^T Q), so the
  // normalised P is u / |u| (up to sign) and Q = M^T P = v |u|: P Q^T = u v^T, whatever the first
  // Q. Then 4 vector elements after it go as they are.
  const std::vector<float> u{1, -2, 0.5f, 3, 0, 1}, v{2, 1, -1, 0.25f, 4};
  std::vector<std::vector<float>> grads(1, std::vector<float>(34));
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 5; ++j) grads[0][static_cast<size_t>(i * 5 + j)] = u[i] * v[j];
  for (int i = 0; i < 4; ++i) grads[0][static_cast<size_t>(30 + i)] = 0.5f * static_cast<float>(i);
  const std::vector<float> before = grads[0];
  std::vector<PowerSgdExchange> ranks;
  ranks.emplace_back(1, std::vector<PowerSgdMatrix>{{"w", 0, 6, 5}},
                     std::vector<std::pair<int64_t, int64_t>>{{30, 34}}, 7);
  step(ranks, grads, nullptr);
  for (size_t i = 0; i < before.size(); ++i) EXPECT_NEAR(grads[0][i], before[i], 1e-5) << i;
}

TEST(PowerSgdExchange, ReplicasEndAlikeAndTheirResidualsHoldWhatTheSumLost) {
  // Two ranks, an 8 x 6 matrix at rank 1 and 3 vector elements. The vector part is summed
  // exactly. The matrix's sum is projected on one direction P: grads = P P^T (M0 + M1), rank 1;
  // each residual is M_r - P P^T M_r, so grads + e0 + e1 = M0 + M1 (Vogels et al.'s error
  // feedback loses nothing, it only delays).
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  std::vector<std::vector<float>> grads(2, std::vector<float>(51)),
      residual(2, std::vector<float>(51, 0.0f));
  for (auto& g : grads)
    for (float& x : g) x = normal(rng);
  std::vector<float> sum(51);
  for (size_t i = 0; i < 51; ++i) sum[i] = grads[0][i] + grads[1][i];
  std::vector<PowerSgdExchange> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back(1, std::vector<PowerSgdMatrix>{{"w", 0, 8, 6}},
                       std::vector<std::pair<int64_t, int64_t>>{{48, 51}}, 5);
  step(ranks, grads, &residual);
  for (size_t i = 0; i < 51; ++i) {
    EXPECT_EQ(grads[0][i], grads[1][i]) << i;
    EXPECT_NEAR(grads[0][i] + residual[0][i] + residual[1][i], sum[i], 1e-4) << i;
  }
  for (size_t i = 48; i < 51; ++i) {
    EXPECT_NEAR(grads[0][i], sum[i], 1e-6) << i;
    EXPECT_EQ(residual[0][i], 0.0f) << "vectors go whole: nothing to keep";
  }
  Eigen::JacobiSVD<RowMat> svd(Eigen::Map<RowMat>(grads[0].data(), 8, 6));
  EXPECT_GT(svd.singularValues()(0), 0.1f);
  EXPECT_LT(svd.singularValues()(1), 1e-5f) << "a rank-1 approximation";
}

TEST(PowerSgdExchange, TheWarmStartFindsTheBestRankOneApproximation) {
  // The same M every step, no error feedback: each step is one power iteration (Q <- M^T M Q up
  // to scale), so P Q^T converges to sigma_1 u_1 v_1^T, the best rank-1 approximation
  // (Eckart-Young). M (6 x 5) = 3 e1 e1^T + 1 e2 e2^T + 0.5 e3 e3^T, with its singular vectors
  // the unit vectors: the limit is 3 at (0, 0) and 0 elsewhere, the error shrinking as (1/3)^2
  // per step.
  std::vector<float> m(30, 0.0f);
  m[0] = 3;
  m[1 * 5 + 1] = 1;
  m[2 * 5 + 2] = 0.5f;
  std::vector<PowerSgdExchange> ranks;
  ranks.emplace_back(1, std::vector<PowerSgdMatrix>{{"w", 0, 6, 5}},
                     std::vector<std::pair<int64_t, int64_t>>{}, 3);
  std::vector<std::vector<float>> grads(1);
  for (int s = 0; s < 20; ++s) {
    grads[0] = m;
    step(ranks, grads, nullptr);
  }
  for (size_t i = 0; i < 30; ++i) EXPECT_NEAR(grads[0][i], i == 0 ? 3.0f : 0.0f, 1e-4) << i;
  // A checkpoint's Q carries the iteration over: a fresh exchange (another first Q) loaded with
  // it gives the same next step.
  std::vector<float> saved(30, 0.0f);
  ranks[0].save_q(saved);
  std::vector<PowerSgdExchange> resumed;
  resumed.emplace_back(1, std::vector<PowerSgdMatrix>{{"w", 0, 6, 5}},
                       std::vector<std::pair<int64_t, int64_t>>{}, 99);
  resumed[0].load_q(saved);
  std::vector<std::vector<float>> again{m};
  grads[0] = m;
  step(ranks, grads, nullptr);
  step(resumed, again, nullptr);
  for (size_t i = 0; i < 30; ++i) EXPECT_FLOAT_EQ(again[0][i], grads[0][i]) << i;
}

}  // namespace
}  // namespace sextant::exec
