// Expert parallelism in the simulator: the dispatch and combine all-to-alls priced on the ep group
// (by hand), the routed experts' gradients summed and their optimizer state sharded over the
// ranks holding the same experts.
#include <gtest/gtest.h>

#include <map>

#include "sextant/models/lowering.hpp"
#include "sextant/sim/simulator.hpp"
#include "small_moe.hpp"
#include "test_clusters.hpp"
#include "test_models.hpp"

namespace sextant::sim {
namespace {

// test::small_moe over two sequences of 16 tokens, bf16: a rank's 32 tokens go to 2 experts each,
// 64 rows of 64 features: 8192 B each way.
constexpr double kRows = 64.0 * 64 * 2;

spec::Plan ep_plan(int64_t dp, int64_t ep, int zero) {
  spec::Plan plan = test::make_plan(dp, 1, 1, 2, 2 * dp);
  plan.dtype = spec::Dtype::kBf16;
  plan.ep = ep;
  plan.zero = zero;
  return plan;
}

TEST(ExpertParallel, DispatchAndCombineArePricedOnTheEpGroupAndExposed) {
  // Four ranks of one node at 100 GB/s, no latency, compute free. Each of the 2 MoE blocks
  // exchanges its 8192 B twice forward and twice backward; an all-to-all over 4 ranks sends 3/4
  // of the buffer: 2 x 4 x (3/4) 8192 B / 100 GB/s, all exposed, at the most loaded rank's load:
  // routed at random, the busiest of 4 ranks receiving 64 copies on average gets
  // 64 + sqrt(64) e_4, e_4 = 1.029375 (the expected largest of 4 standard normals; David and
  // Nagaraja's table), 1 + 1.029375 / 8 = 1.128672 times the mean (models/moe_load.hpp).
  const spec::ClusterSpec cluster = test::ideal_cluster(1e12, 100, 100, 0);
  SimulationOptions options;
  options.trace = true;
  const SimulationResult r = simulate(test::small_moe(), cluster, ep_plan(4, 4, 0), options);
  // (Priced in whole bytes: 8192 x 1.128672 = 9246.06, 9246 B.)
  const double balanced = 2 * 4 * 0.75 * kRows / 100e9;
  EXPECT_NEAR(r.report.breakdown_s.ep_comm_exposed, 2 * 4 * 0.75 * 9246 / 100e9, 1e-9 * balanced);
  // A measured skew replaces the floor: the busiest rank receives 1.5 times the mean.
  spec::ModelSpec skewed = test::small_moe();
  skewed.transformer().moe->load_imbalance = 1.5;
  EXPECT_NEAR(simulate(skewed, cluster, ep_plan(4, 4, 0), {}).report.breakdown_s.ep_comm_exposed,
              1.5 * balanced, 1e-9 * balanced);
  EXPECT_EQ(r.report.breakdown_s.tp_comm_exposed, 0);
  std::map<std::string, int> count;
  for (const spec::TraceEvent& e : r.trace->events) {
    if (e.name == "moe.dispatch" || e.name == "moe.combine") {
      EXPECT_EQ(e.bytes, kRows);
      EXPECT_EQ(e.group_size, 4);
    }
    ++count[e.name + "@" + std::to_string(e.rank)];
  }
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(count["moe.dispatch@" + std::to_string(rank)], 4) << rank;
    EXPECT_EQ(count["moe.combine@" + std::to_string(rank)], 4) << rank;
  }
}

TEST(ExpertParallel, ExpertGradientsAreSummedOverTheRanksHoldingThoseExperts) {
  // dp 4, ep 2: a rank holds 4 of the 8 experts, as does one rank of the other ep block. Its
  // routed experts' gradients (2 MoE blocks x 4 experts x 3 x 64 x 32, bf16) are all-reduced
  // over those 2 ranks; everything else over all 4.
  const spec::ClusterSpec cluster = test::ideal_cluster(1e12, 100, 100, 0);
  SimulationOptions options;
  options.trace = true;
  const spec::Plan plan = ep_plan(4, 2, 0);
  const SimulationResult r = simulate(test::small_moe(), cluster, plan, options);
  models::LoweringOptions o;
  o.micro_batch = 2;
  o.ep = 2;
  const models::LoweredModel lowered = models::lower(test::small_moe(), o);
  const int64_t expert_bytes = 2 * 4 * 3 * 64 * 32 * 2;
  const int64_t all_bytes = models::stage_params(plan, lowered, 0) * 2;
  int64_t over_two = 0, over_four = 0;
  for (const spec::TraceEvent& e : r.trace->events) {
    if (e.name != "dp.all_reduce" || e.rank != 0) continue;
    (e.group_size == 2 ? over_two : over_four) += e.bytes;
    EXPECT_TRUE(e.group_size == 2 || e.group_size == 4) << e.group_size;
  }
  EXPECT_EQ(over_two, expert_bytes);
  EXPECT_EQ(over_four, all_bytes - expert_bytes);
}

TEST(ExpertParallel, ZeroShardsTheExpertsStateOverTheirReplicasOnly) {
  // ZeRO-1 at dp 4, ep 2: Adam's 12 bytes a parameter (bf16 compute) sharded over the 4 replicas
  // for the dense parameters, over the 2 ranks holding them for the routed experts'.
  const spec::ClusterSpec cluster = test::ideal_cluster(1e12, 100, 100, 0);
  const spec::Plan plan = ep_plan(4, 2, 1);
  const SimulationResult r = simulate(test::small_moe(), cluster, plan, {});
  models::LoweringOptions o;
  o.micro_batch = 2;
  o.ep = 2;
  const models::LoweredModel lowered = models::lower(test::small_moe(), o);
  const int64_t experts = 2 * 4 * 3 * 64 * 32;
  const int64_t dense = models::stage_params(plan, lowered, 0) - experts;
  EXPECT_EQ(r.report.memory.optimizer, (dense * 12 + 3) / 4 + experts * 12 / 2);
  // Without ep every expert is on every rank and all state shards over 4.
  const SimulationResult whole = simulate(test::small_moe(), cluster, ep_plan(4, 1, 1), {});
  const int64_t all = dense + 8 * 3 * 64 * 32 * 2;
  EXPECT_EQ(whole.report.memory.optimizer, (all * 12 + 3) / 4);
  EXPECT_GT(whole.report.memory.weights, r.report.memory.weights);
}

TEST(ExpertParallel, ZeroThreeGathersTheExpertsFromTheirReplicas) {
  // ZeRO-3 at dp 4, ep 2: before each forward and backward a MoE block gathers its dense
  // parameters from the 4 replicas and its 4 local experts (4 x 3 x 64 x 32 x 2 B = 49152 B,
  // bf16) from the 2 ranks holding them, and reduce-scatters their gradients the same way.
  const spec::ClusterSpec cluster = test::ideal_cluster(1e12, 100, 100, 0);
  SimulationOptions options;
  options.trace = true;
  const SimulationResult r = simulate(test::small_moe(), cluster, ep_plan(4, 2, 3), options);
  constexpr int64_t kExperts = 4 * 3 * 64 * 32 * 2;
  std::map<std::string, int> over_two;
  for (const spec::TraceEvent& e : r.trace->events) {
    if (e.rank != 0 || e.name.rfind("fsdp.", 0) != 0) continue;
    if (e.group_size == 2) {
      EXPECT_EQ(e.bytes, kExperts) << e.name;
      ++over_two[e.name];
    } else {
      EXPECT_EQ(e.group_size, 4) << e.name;
    }
  }
  // Two MoE blocks: a gather before each forward and each backward, a reduce-scatter after each
  // backward (one micro-batch).
  EXPECT_EQ(over_two["fsdp.all_gather"], 2 * 2);
  EXPECT_EQ(over_two["fsdp.reduce_scatter"], 2);
}

}  // namespace
}  // namespace sextant::sim
