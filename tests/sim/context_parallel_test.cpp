// Context parallelism in the simulator: the attention's transfers priced on the cp group (by
// hand), ring attention's hidden behind the blocks it feeds, the all-gather's not.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "sextant/models/zoo.hpp"
#include "sextant/sim/simulator.hpp"
#include "sextant/spec/cluster_catalog.hpp"
#include "sextant/spec/device_models.hpp"
#include "sextant/spec/units.hpp"
#include "test_clusters.hpp"
#include "test_models.hpp"

namespace sextant::sim {
namespace {

// llama-tiny (4 blocks, 2 key/value heads of 16, s 32) over cp 2, two sequences, bf16: each
// rank holds 32 tokens, whose keys and values take 2 x 32 x 2 x 16 x 2 = 4096 B.
constexpr double kKv = 4096;

// The ideal cluster with a flash kernel running at the device's peak whatever its shape.
spec::ClusterSpec with_flash(spec::ClusterSpec cluster) {
  const double peak = cluster.device.peak_tflops.at(spec::Dtype::kBf16);
  spec::AttentionKernelData flash;
  for (bool causal : {false, true})
    for (const char* pass : {"fwd", "bwd"})
      flash.curves.push_back({64, causal, pass, {1000, 4000}, {peak, peak}});
  flash.source = "test";
  cluster.device.attention_kernels[spec::AttentionKernel::kFlash2] = flash;
  return cluster;
}

spec::Plan cp_plan(spec::ContextAlgorithm algorithm, spec::AttentionKernel attention) {
  spec::Plan plan = test::make_plan(1, 1, 1, 2, 2);
  plan.dtype = spec::Dtype::kBf16;
  plan.cp = 2;
  plan.cp_algorithm = algorithm;
  plan.stack->attention = attention;
  plan.collective_algorithms[spec::CollectiveKind::kAllGather] = spec::CollectiveAlgorithm::kRing;
  plan.collective_algorithms[spec::CollectiveKind::kReduceScatter] =
      spec::CollectiveAlgorithm::kRing;
  return plan;
}

TEST(ContextParallel, AllGatherTransfersArePricedOnTheCpGroupAndExposed) {
  // Two ranks of one node at 100 GB/s, no latency, compute and memory traffic free. Each block
  // gathers the 2 x 4096 B of keys and values forward and again backward, and reduce-scatters
  // their gradient: three ring passes moving half the buffer, (1/2) 8192 / 100 GB/s each, all
  // exposed: 4 blocks x 3 x 4096 / 100 GB/s.
  const spec::ClusterSpec cluster = test::ideal_cluster(1e12, 100, 100, 0);
  const spec::Plan plan =
      cp_plan(spec::ContextAlgorithm::kAllGather, spec::AttentionKernel::kUnfused);
  SimulationOptions options;
  options.trace = true;
  const SimulationResult r = simulate(models::zoo_model("llama-tiny"), cluster, plan, options);
  EXPECT_NEAR(r.report.breakdown_s.cp_comm_exposed, 4 * 3 * kKv / 100e9, 1e-12);
  EXPECT_EQ(r.report.breakdown_s.tp_comm_exposed, 0);
  // The trace names the transfers on both ranks, in the cp group, with the lowering's bytes.
  std::map<std::string, int> count;
  for (const spec::TraceEvent& e : r.trace->events) {
    if (e.name == "cp.kv_all_gather" || e.name == "cp.kv_reduce_scatter") {
      EXPECT_EQ(e.bytes, 2 * kKv);
      EXPECT_EQ(e.group_size, 2);
    }
    ++count[e.name + "@" + std::to_string(e.rank)];
  }
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(count["cp.kv_all_gather@" + std::to_string(rank)], 8) << rank;
    EXPECT_EQ(count["cp.kv_reduce_scatter@" + std::to_string(rank)], 4) << rank;
  }
}

TEST(ContextParallel, RingTransfersAreExposedWhenComputeIsFree) {
  // Ring attention over 2 ranks: forward one block of keys and values (4096 B) beside the first
  // step; backward the keys and values, then the key/value gradient: 3 x 4096 B a block, each
  // exposed when the attention beside it takes no time.
  const spec::ClusterSpec cluster = with_flash(test::ideal_cluster(1e12, 100, 100, 0));
  const spec::Plan plan = cp_plan(spec::ContextAlgorithm::kRing, spec::AttentionKernel::kFlash2);
  SimulationOptions options;
  options.trace = true;
  const SimulationResult r = simulate(models::zoo_model("llama-tiny"), cluster, plan, options);
  EXPECT_NEAR(r.report.breakdown_s.cp_comm_exposed, 4 * 3 * kKv / 100e9, 1e-12);
  int sends = 0;
  for (const spec::TraceEvent& e : r.trace->events)
    if (e.name == "cp.kv_send" && e.rank == 1) {
      ++sends;
      EXPECT_EQ(e.group_size, 2);
    }
  EXPECT_EQ(sends, 4 * 3);
}

TEST(ContextParallel, RingTransfersHideBehindTheAttentionTheAllGatherDoesNot) {
  // With slow compute (0.1 TFLOP/s: an 8 x 16 x 16 x 16 attention step of 2^16 executed FLOPs
  // takes 655 ns against a 41 ns transfer) every ring transfer runs beside a longer step and
  // nothing waits for it; the all-gather feeds the attention and stays exposed, at the same
  // 4 x 3 x 4096 / 100 GB/s as with free compute.
  const spec::ClusterSpec cluster = with_flash(test::ideal_cluster(0.1, 100, 100, 0));
  const spec::ModelSpec model = models::zoo_model("llama-tiny");
  const SimulationResult ring = simulate(
      model, cluster, cp_plan(spec::ContextAlgorithm::kRing, spec::AttentionKernel::kFlash2), {});
  EXPECT_EQ(ring.report.breakdown_s.cp_comm_exposed, 0);
  const SimulationResult gather =
      simulate(model, cluster,
               cp_plan(spec::ContextAlgorithm::kAllGather, spec::AttentionKernel::kFlash2), {});
  EXPECT_NEAR(gather.report.breakdown_s.cp_comm_exposed, 4 * 3 * kKv / 100e9, 1e-12);
}

// local-cpu carries the executor's own flash curves (`sextant bench attention`), so a ring plan
// simulates there, each step priced at the rate the file gives for its block. gpt-tiny (4 heads
// of 32, s 128) over cp 2 at micro-batch 2: a step attends a rank's 64 query rows to 64 keys,
// counted 4 * (2 * 4) * 64 * 64 * 32 = 4,194,304 FLOPs (the trace's figure), of which the masked
// first step executes half, 2,097,152, and so does the dense half-block after it; each takes its
// executed work over the file's rate for head_dim 32, 64 rows and its mask, plus one launch (its
// 264 KB of traffic would take a tenth of that time).
TEST(ContextParallel, LocalCpuPricesRingStepsFromTheExecutorsFlashCurves) {
  const spec::ClusterSpec cluster = spec::builtin_cluster("local-cpu");
  spec::Plan plan = test::make_plan(1, 1, 1, 2, 2);
  plan.cp = 2;
  plan.cp_algorithm = spec::ContextAlgorithm::kRing;
  plan.stack->attention = spec::AttentionKernel::kFlash2;
  SimulationOptions options;
  options.trace = true;
  const SimulationResult r = simulate(models::zoo_model("gpt-tiny"), cluster, plan, options);
  ASSERT_TRUE(r.trace.has_value());
  std::vector<const spec::TraceEvent*> steps;  // rank 0, the first block, micro-batch 0, forward
  for (const spec::TraceEvent& e : r.trace->events)
    if (e.rank == 0 && e.name == "attn.core" && e.phase == spec::Phase::kFwd && e.layer == 1 &&
        e.micro_batch == 0)
      steps.push_back(&e);
  ASSERT_EQ(steps.size(), 2u);
  std::sort(steps.begin(), steps.end(), [](const spec::TraceEvent* a, const spec::TraceEvent* b) {
    return a->start_ps < b->start_ps;
  });
  const double executed = 2097152;
  const double launch = cluster.device.launch_overhead_us * 1e-6;
  for (size_t i = 0; i < 2; ++i) {
    const bool causal = i == 0;
    const double rate =
        spec::attention_tflops(cluster.device.attention_kernels, cluster.device.name,
                               spec::AttentionKernel::kFlash2, 32, 64, causal, false) *
        1e12;
    EXPECT_EQ(steps[i]->flops, 2 * executed);
    EXPECT_NEAR(ps_to_seconds(steps[i]->duration_ps), executed / rate + launch, 1e-8)
        << (causal ? "the masked step" : "the dense step");
  }
}

}  // namespace
}  // namespace sextant::sim
