// The compression crossover sweep: the bandwidth it returns separates the bandwidths where the
// compressed step is faster from those where it is not (checked by simulations of its own), it is
// a property of the network and not of the cluster file's figure, it sweeps the level the
// replicas cross, and a compression that moves more bytes than the all-reduce never pays.
#include "sextant/planner/compression_crossover.hpp"

#include <gtest/gtest.h>

#include "expect_input_error.hpp"
#include "sextant/models/zoo.hpp"
#include "sextant/spec/cluster_catalog.hpp"

namespace sextant::planner {
namespace {

spec::Plan ddp(int64_t dp, int64_t micro_batch, int64_t global_batch) {
  spec::Plan p;
  p.dp = dp;
  p.micro_batch = micro_batch;
  p.global_batch = global_batch;
  return p;
}

spec::GradientCompression kind(spec::CompressionKind k) {
  spec::GradientCompression c;
  c.kind = k;
  return c;
}

// The cluster with every link of level `level` `factor` times as fast (what the sweep does).
spec::ClusterSpec faster(spec::ClusterSpec c, size_t level, double factor) {
  c.network.levels[level].bandwidth_GBps *= factor;
  return c;
}

double step(const spec::ModelSpec& m, const spec::ClusterSpec& c, spec::Plan p,
            const spec::GradientCompression& compression) {
  p.compression = compression;
  return sim::simulate(m, c, p, {}).report.step_time_s;
}

// Top-k at 1% on 64 replicas of GPT-2 350M (eight DGX A100 nodes): each rank gathers 63
// encodings of 1% of the elements as (index, value) pairs, 63 x 0.01 x 2 = 1.26 times the fp32
// gradient's bytes, against the ring all-reduce's 2 x 63/64 = 1.97 times: fewer bytes, so it
// pays on slow links, and its codec makes it the slower one where the link is fast.
spec::Plan topk_plan() {
  return ddp(64, 4, 256);
}
spec::GradientCompression topk() {
  spec::GradientCompression c = kind(spec::CompressionKind::kTopk);
  c.ratio = 0.01;
  return c;
}

TEST(CompressionCrossover, SeparatesWhereCompressionPaysFromWhereItDoesNot) {
  const spec::ModelSpec m = models::zoo_model("gpt2-350m");
  const spec::ClusterSpec c = spec::builtin_cluster("dgx-a100");
  const spec::Plan p = topk_plan();
  const CompressionCrossover x = compression_crossover(m, c, p, topk(), sim::Fidelity::kAnalytic);
  EXPECT_EQ(x.level, c.network.cluster_level()->name);
  EXPECT_DOUBLE_EQ(x.cluster_GBps, c.network.cluster_level()->bandwidth_GBps);
  EXPECT_DOUBLE_EQ(x.lowest_GBps, x.cluster_GBps / kSweepBelow);
  EXPECT_DOUBLE_EQ(x.highest_GBps, x.cluster_GBps * kSweepAbove);
  EXPECT_DOUBLE_EQ(x.compressed_step_s, step(m, c, p, topk()));
  EXPECT_DOUBLE_EQ(x.uncompressed_step_s, step(m, c, p, {}));
  ASSERT_TRUE(x.crossover_GBps.has_value());
  EXPECT_TRUE(x.pays_below);
  EXPECT_FALSE(x.pays_throughout);
  // 1% either side of the crossover, simulated here: faster compressed below, not above.
  const double at = *x.crossover_GBps / x.cluster_GBps;
  const spec::ClusterSpec below = faster(c, 1, 0.99 * at), above = faster(c, 1, 1.01 * at);
  EXPECT_LT(step(m, below, p, topk()), step(m, below, p, {}));
  EXPECT_GE(step(m, above, p, topk()), step(m, above, p, {}));
  // And at the sweep's ends.
  const spec::ClusterSpec slowest = faster(c, 1, 1 / kSweepBelow);
  EXPECT_LT(step(m, slowest, p, topk()), step(m, slowest, p, {}));
  const spec::ClusterSpec fastest = faster(c, 1, kSweepAbove);
  EXPECT_GE(step(m, fastest, p, topk()), step(m, fastest, p, {}));
}

TEST(CompressionCrossover, IsAPropertyOfTheNetworkNotOfTheClusterFile) {
  // The same network described at twice (and half) the bandwidth: the crossover, in GB/s, is
  // where it was (within the bisection's precision), only the swept range moves with the file.
  const spec::ModelSpec m = models::zoo_model("gpt2-350m");
  const spec::ClusterSpec c = spec::builtin_cluster("dgx-a100");
  const auto x = compression_crossover(m, c, topk_plan(), topk(), sim::Fidelity::kAnalytic);
  for (double factor : {0.5, 2.0}) {
    const auto y = compression_crossover(m, faster(c, 1, factor), topk_plan(), topk(),
                                         sim::Fidelity::kAnalytic);
    ASSERT_TRUE(x.crossover_GBps && y.crossover_GBps);
    EXPECT_NEAR(*y.crossover_GBps, *x.crossover_GBps, 1e-4 * *x.crossover_GBps) << factor;
  }
}

TEST(CompressionCrossover, SweepsTheLevelTheReplicasCross) {
  // dp 8 on one DGX A100 node: the gradients never leave NVLink, which is what is swept.
  const spec::ModelSpec m = models::zoo_model("gpt2-350m");
  const spec::ClusterSpec c = spec::builtin_cluster("dgx-a100");
  const auto x = compression_crossover(m, c, ddp(8, 4, 32), kind(spec::CompressionKind::kOnebit),
                                       sim::Fidelity::kAnalytic);
  EXPECT_EQ(x.level, c.network.node_level().name);
  EXPECT_DOUBLE_EQ(x.cluster_GBps, c.network.node_level().bandwidth_GBps);
}

TEST(CompressionCrossover, EightBitQsgdOnSixteenReplicasNeverPays) {
  // models/gradient_compression.hpp: QSGD's encodings are all-gathered, so each rank receives
  // (n - 1) encodings of 8/32 of the fp32 bytes B (plus a 4-byte scale per 512-element bucket):
  // at n = 16, 15 x (1/4 + 1/512) B = 3.78 B, against the ring all-reduce's 2 (n - 1) / n B =
  // 1.875 B. More bytes at every bandwidth, and a codec on top: slower across the whole range.
  const spec::ModelSpec m = models::zoo_model("gpt2-350m");
  const spec::ClusterSpec c = spec::builtin_cluster("dgx-a100");
  spec::GradientCompression qsgd = kind(spec::CompressionKind::kQsgd);
  qsgd.bits = 8;
  const auto x = compression_crossover(m, c, ddp(16, 4, 64), qsgd, sim::Fidelity::kAnalytic);
  EXPECT_FALSE(x.crossover_GBps.has_value());
  EXPECT_FALSE(x.pays_throughout);
  EXPECT_GT(x.compressed_step_s, x.uncompressed_step_s);
}

TEST(CompressionCrossover, RefusesLayoutsThatDoNotCompress) {
  const spec::ModelSpec m = models::zoo_model("gpt2-350m");
  const spec::ClusterSpec c = spec::builtin_cluster("dgx-a100");
  spec::Plan zero1 = ddp(16, 4, 64);
  zero1.zero = 1;
  EXPECT_INPUT_ERROR(compression_crossover(m, c, zero1, kind(spec::CompressionKind::kOnebit),
                                           sim::Fidelity::kAnalytic, "best plan"),
                     "best plan: /compression/kind = onebit: applies to the all-reduce of DDP");
  EXPECT_INPUT_ERROR(
      compression_crossover(m, c, ddp(16, 4, 64), {}, sim::Fidelity::kAnalytic, "best plan"),
      "a compression to sweep");
  // PowerSGD compresses matrices a rank holds whole, which a 3D tensor grid's blocks are not
  // (spec::powersgd_problem, asked through spec::compression_problem).
  spec::Plan grid = ddp(8, 4, 32);
  grid.tp = 2;
  grid.tp_grid = {1, 2, 1};
  EXPECT_INPUT_ERROR(compression_crossover(m, c, grid, kind(spec::CompressionKind::kPowersgd),
                                           sim::Fidelity::kAnalytic, "best plan"),
                     "runs without tp_grid");
}

}  // namespace
}  // namespace sextant::planner
