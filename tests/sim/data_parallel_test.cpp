// Data parallelism: overlapped gradient buckets, ZeRO memory (Rajbhandari et al. 2020, §5), FSDP.
#include <gtest/gtest.h>

#include "sextant/models/lowering.hpp"
#include "sextant/sim/collective_cost.hpp"
#include "sextant/sim/memory_model.hpp"
#include "sextant/sim/simulator.hpp"
#include "test_clusters.hpp"
#include "test_models.hpp"

namespace sextant::sim {
namespace {

// A ring all-reduce of n bytes over 2 ranks: 2(p-1)α + 2(p-1)/p nβ + (p-1)/p nγ, p = 2.
double ring_all_reduce_2(double n, double alpha, double beta, double gamma) {
  return 2 * alpha + n * beta + 0.5 * n * gamma;
}

TEST(DataParallel, OverlapExposesOnlyTheLastBucket) {
  const int64_t layers = 8, width = 1024, b = 1024;
  spec::ClusterSpec cluster = test::ideal_cluster(100, 1000, 1000, 1.0);
  spec::ModelSpec model = test::uniform_mlp(layers, width);
  spec::Plan plan = test::make_plan(2, 1, 1, b, 2 * b);
  plan.dtype = spec::Dtype::kFp32;
  plan.stack->dp_bucket_bytes = 1;  // one bucket per layer
  plan.collective_algorithms[spec::CollectiveKind::kAllReduce] = spec::CollectiveAlgorithm::kRing;
  const double n = static_cast<double>(width * width * 4);  // one layer's fp32 gradient
  const double one = ring_all_reduce_2(n, 1e-6, 1 / 1000e9, 1 / 1e21);
  // Each bucket's all-reduce (~5 us) hides behind the next layer's backward (2 * 21.5 us); only
  // the last bucket, after the last gradient, is exposed.
  SimulationResult with = simulate(model, cluster, plan, {});
  EXPECT_NEAR(with.report.breakdown_s.dp_comm_exposed, one, 1e-9);
  // Without overlap every bucket is reduced after the backward, one after the other.
  plan.stack->dp_overlap = false;
  SimulationResult without = simulate(model, cluster, plan, {});
  EXPECT_NEAR(without.report.breakdown_s.dp_comm_exposed, layers * one, 1e-9);
  EXPECT_NEAR(without.report.step_time_s - with.report.step_time_s, (layers - 1) * one, 1e-9);
}

TEST(DataParallel, ZeroMemoryPerRank) {
  // Rajbhandari et al. (ZeRO), Figure 1 with K = 12: (2 + 2 + K)Ψ for DDP, 2Ψ + 2Ψ + KΨ/N for
  // stage 1, 2Ψ + (2 + K)Ψ/N for stage 2, (2 + 2 + K)Ψ/N for stage 3 (K: k_states).
  spec::ModelSpec model = test::uniform_mlp(4, 1000);
  models::LoweredModel lowered = models::lower(model, {8, 0, spec::Dtype::kBf16, 1, false});
  const double psi = 4 * 1000 * 1000;
  const double N = 8, k_states = 12;
  auto total = [&](int zero) {
    spec::Plan plan = test::make_plan(8, 1, 1, 8, 64);
    plan.zero = zero;
    spec::MemoryBreakdown m = stage_memory(plan, *plan.stack, lowered, 0);
    return static_cast<double>(m.weights + m.gradients + m.optimizer);
  };
  EXPECT_DOUBLE_EQ(total(0), (2 + 2 + k_states) * psi);
  EXPECT_DOUBLE_EQ(total(1), 2 * psi + 2 * psi + k_states * psi / N);
  EXPECT_DOUBLE_EQ(total(2), 2 * psi + (2 + k_states) * psi / N);
  EXPECT_DOUBLE_EQ(total(3), (2 + 2 + k_states) * psi / N);
}

TEST(DataParallel, FsdpPrefetchHidesParameterGathers) {
  spec::ClusterSpec cluster = test::ideal_cluster(100, 100, 100, 1.0);
  spec::ModelSpec model = test::uniform_mlp(8, 2048);
  spec::Plan plan = test::make_plan(4, 1, 1, 256, 1024);
  plan.zero = 3;
  SimulationResult prefetch = simulate(model, cluster, plan, {});
  plan.stack->zero3_prefetch = 0;
  SimulationResult serial = simulate(model, cluster, plan, {});
  EXPECT_LT(prefetch.report.step_time_s, serial.report.step_time_s);
  EXPECT_LT(prefetch.report.breakdown_s.fsdp_comm_exposed,
            serial.report.breakdown_s.fsdp_comm_exposed);
  EXPECT_GT(serial.report.breakdown_s.fsdp_comm_exposed, 0);
}

TEST(DataParallel, GradientAccumulationReducesOnce) {
  // Four micro-batches per replica take four times the compute but still one gradient reduction.
  spec::ClusterSpec cluster = test::ideal_cluster(100, 1000, 1000, 1.0);
  spec::ModelSpec model = test::uniform_mlp(4, 1024);
  spec::Plan one = test::make_plan(2, 1, 1, 256, 512);
  spec::Plan four = test::make_plan(2, 1, 1, 256, 2048);
  one.stack->dp_overlap = four.stack->dp_overlap = false;
  SimulationResult a = simulate(model, cluster, one, {});
  SimulationResult b = simulate(model, cluster, four, {});
  EXPECT_NEAR(b.report.breakdown_s.compute, 4 * a.report.breakdown_s.compute, 1e-12);
  EXPECT_NEAR(b.report.breakdown_s.dp_comm_exposed, a.report.breakdown_s.dp_comm_exposed, 1e-12);
}

TEST(DataParallel, ZeroTwoReducesEveryMicroBatch) {
  // ZeRO-2 keeps only its shard of the gradients, so each micro-batch's buckets are
  // reduce-scattered as its backward completes them (DeepSpeed stage_1_and_2.py reduces at every
  // micro-step when it partitions gradients); ZeRO-1 keeps them whole and reduces once. Both
  // all-gather the updated parameters once. Without overlap every collective is exposed: one
  // bucket per fp32 layer of n bytes, a ring over 2 ranks, reduce-scatter (p-1)a + (p-1)/p n(b+g)
  // and all-gather (p-1)a + (p-1)/p nb; four micro-batches expose L(4 rs + ag) under ZeRO-2 and
  // L(rs + ag) under ZeRO-1, a step longer by 3 L rs.
  const int64_t layers = 4, width = 1024;
  spec::ClusterSpec cluster = test::ideal_cluster(100, 1000, 1000, 1.0);
  spec::ModelSpec model = test::uniform_mlp(layers, width);
  auto run = [&](int zero) {
    spec::Plan plan = test::make_plan(2, 1, 1, 256, 2048);
    plan.zero = zero;
    plan.dtype = spec::Dtype::kFp32;
    plan.stack->dp_overlap = false;
    plan.stack->dp_bucket_bytes = 1;  // one bucket per layer
    plan.collective_algorithms[spec::CollectiveKind::kReduceScatter] =
        spec::CollectiveAlgorithm::kRing;
    plan.collective_algorithms[spec::CollectiveKind::kAllGather] = spec::CollectiveAlgorithm::kRing;
    return simulate(model, cluster, plan, {}).report;
  };
  const double n = static_cast<double>(width * width * 4);
  const double rs = 1e-6 + 0.5 * n / 1000e9 + 0.5 * n / 1e21, ag = 1e-6 + 0.5 * n / 1000e9;
  const spec::Report z1 = run(1), z2 = run(2);
  EXPECT_NEAR(z1.breakdown_s.dp_comm_exposed, layers * (rs + ag), 1e-12);
  EXPECT_NEAR(z2.breakdown_s.dp_comm_exposed, layers * (4 * rs + ag), 1e-12);
  EXPECT_NEAR(z2.step_time_s - z1.step_time_s, 3 * layers * rs, 1e-12);
  // The shard is all it holds (ZeroMemoryPerRank).
  EXPECT_EQ(z2.memory.gradients * 2, z1.memory.gradients);
}

}  // namespace
}  // namespace sextant::sim
