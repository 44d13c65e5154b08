// The load of a dropless mixture of experts' busiest expert-parallel rank (models/moe_load.hpp):
// the expected largest of n standard normals against its closed forms and published table, and
// the rules of the factor the lowering prices the exchanges and expert GEMMs at.
#include "sextant/models/moe_load.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "sextant/models/lowering.hpp"
#include "small_moe.hpp"

namespace sextant::models {
namespace {

TEST(MoeLoad, ExpectedLargestNormalMatchesClosedFormsAndTables) {
  // Closed forms (David and Nagaraja, Order Statistics, §4.2): e_2 = 1/sqrt(pi),
  // e_3 = 3/(2 sqrt(pi)); e_4, e_8 and e_64 from the tables of the expected normal order
  // statistics (Harter 1961), to 6 digits.
  const double sqrt_pi = std::sqrt(std::numbers::pi);
  EXPECT_EQ(expected_max_standard_normal(1), 0);
  EXPECT_NEAR(expected_max_standard_normal(2), 1 / sqrt_pi, 1e-9);
  EXPECT_NEAR(expected_max_standard_normal(3), 3 / (2 * sqrt_pi), 1e-9);
  EXPECT_NEAR(expected_max_standard_normal(4), 1.029375, 1e-6);
  EXPECT_NEAR(expected_max_standard_normal(8), 1.423600, 1e-6);
  EXPECT_NEAR(expected_max_standard_normal(64), 2.343733, 1e-6);
}

TEST(MoeLoad, TheFactorIsTheMeasuredSkewOrTheRandomRoutingFloor) {
  spec::MoeSpec moe;
  moe.experts = 8;
  moe.top_k = 2;
  // No expert parallelism: every rank computes its own copies, whatever their experts.
  EXPECT_EQ(moe_load_factor(moe, 8192, 1), 1);
  // Mixtral's 4096-token sequences, top-2, over 8 ep ranks: 1 + e_8 / sqrt(8192) = 1.0157.
  EXPECT_NEAR(moe_load_factor(moe, 8192, 8), 1 + 1.423600 / std::sqrt(8192.0), 1e-6);
  // A measured skew replaces the floor.
  moe.load_imbalance = 1.3;
  EXPECT_EQ(moe_load_factor(moe, 8192, 8), 1.3);
  // With a capacity every expert's input is padded to it: no rank computes more.
  moe.capacity_factor = 1.25;
  EXPECT_EQ(moe_load_factor(moe, 8192, 8), 1);
}

TEST(MoeLoad, TheLoweringPricesTheBusiestRanksExchangesAndExperts) {
  // test::small_moe over 2 sequences of 16 tokens on 4 ep ranks: each rank routes 64 copies.
  spec::ModelSpec m = test::small_moe();
  m.transformer().moe->load_imbalance = 1.5;
  LoweringOptions o{2, 16, spec::Dtype::kBf16, 1, false};
  o.ep = 4;
  const LoweredModel lowered = lower(m, o);
  int priced = 0;
  for (const Layer& l : lowered.layers) {
    for (const std::vector<Op>* pass : {&l.forward, &l.backward}) {
      for (const Op& op : *pass) {
        const bool busiest = op.id == OpId::kMoeDispatch || op.id == OpId::kMoeCombine ||
                             op.id == OpId::kMoeFc1 || op.id == OpId::kMoeAct ||
                             op.id == OpId::kMoeFc2;
        EXPECT_EQ(op.load_factor, busiest ? 1.5 : 1.0) << op.name;
        if (op.id == OpId::kMoeDispatch) {
          // Counted as what every rank sends, priced as what the busiest receives.
          EXPECT_EQ(op.bytes, 64 * 64 * 2);
          EXPECT_EQ(op.costed_bytes(), 3 * 64 * 64);
        }
        priced += busiest ? 1 : 0;
      }
    }
  }
  EXPECT_EQ(priced, 2 * 10);  // 2 MoE blocks, 5 ops forward and 5 backward

  // Its memory too: a MoE block keeps the experts' 64 input rows of 64 (bf16) and their FC1
  // output and activation input, 64 x 32 x (SwiGLU's 2 x 2 + 2) bytes; the busiest rank 1.5
  // times that, 0.5 x (8192 + 12288) = 10240 bytes more than at the mean (load_imbalance 1).
  spec::ModelSpec even = m;
  even.transformer().moe->load_imbalance = 1;
  const LoweredModel balanced = lower(even, o);
  const size_t block = lowered.layers.size() - 2;  // the last block (the first one is dense)
  EXPECT_EQ(lowered.layers[block].saved_bytes - balanced.layers[block].saved_bytes, 10240);
}

}  // namespace
}  // namespace sextant::models
