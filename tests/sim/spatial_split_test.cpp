// A spatially split CNN in the simulator: its halo exchanges and statistic all-reduces priced on
// the grid's ranks (by hand), gradients summed over every rank holding the model, and what the
// split buys; a channel split's stationary-w collectives in their own groups; and a U-Net cut by
// a pipeline, whose stage boundary carries the kept map.
#include <gtest/gtest.h>

#include <map>

#include "sextant/models/lowering.hpp"
#include "sextant/models/zoo.hpp"
#include "sextant/sim/simulator.hpp"
#include "sextant/spec/cluster_catalog.hpp"
#include "test_clusters.hpp"
#include "test_models.hpp"

namespace sextant::sim {
namespace {

TEST(SpatialSplit, HalosAndStatisticsArePricedOnTheGrid) {
  // Four ranks of one node at 100 GB/s, no latency, compute and memory traffic free. The small
  // CNN (B = 2, fp32, 32x32) over a 2x2 grid exchanges, per step:
  //   the convolution's halo, 2 x 3 x 33 x 4 = 792 B, forward only (the image needs no
  //   gradient): 792 / 100 GB/s;
  //   batch norm's 2 x 64 fp32 sums (512 B), forward and backward, as a ring all-reduce over 4
  //   ranks: 2 x (2 x 3/4 x 512) / 100 GB/s;
  //   the pool's 2 x 64 partial sums (512 B), forward only: 2 x 3/4 x 512 / 100 GB/s.
  // Compute being free, all of it is exposed.
  const spec::ClusterSpec cluster = test::ideal_cluster(1e12, 100, 100, 0);
  spec::Plan plan = test::make_plan(1, 1, 1, 2, 2);
  plan.dtype = spec::Dtype::kFp32;
  plan.spatial = {2, 2};
  plan.collective_algorithms[spec::CollectiveKind::kAllReduce] = spec::CollectiveAlgorithm::kRing;
  SimulationOptions options;
  options.trace = true;
  const SimulationResult r = simulate(test::small_cnn(32, 64), cluster, plan, options);
  const double expected = (792 + 2 * 768 + 768) / 100e9;
  EXPECT_NEAR(r.report.breakdown_s.spatial_comm_exposed, expected, 1e-12);
  EXPECT_EQ(r.report.breakdown_s.tp_comm_exposed, 0);
  // The trace shows the exchanges on every rank, with the lowering's bytes.
  std::map<std::string, int> count;
  for (const spec::TraceEvent& e : r.trace->events) {
    if (e.name == "layer0.conv.halo") {
      EXPECT_EQ(e.bytes, 792);
    }
    ++count[e.name + "@" + std::to_string(e.rank)];
  }
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(count["layer0.conv.halo@" + std::to_string(rank)], 1) << rank;
    EXPECT_EQ(count["layer0.conv.bn_allreduce@" + std::to_string(rank)], 2) << rank;
    EXPECT_EQ(count["layer1.pool_allreduce@" + std::to_string(rank)], 1) << rank;
  }
}

TEST(SpatialSplit, WithAChannelSplitEachCollectiveRunsInItsOwnGroup) {
  // The same CNN and grid with its 64 channels split over tp 2 as well: 8 ranks of one node,
  // the spatial grid innermost (ranks 0-3 one grid, 0 and 4 a tp pair). Per step:
  //   the convolution reads the whole image on every tp rank: its halo is the 3 channels' as
  //   before, 2 x 3 x 33 x 4 = 792 B, over the grid;
  //   batch norm sums this tp rank's 32 channels: 2 x 32 fp32 = 256 B, forward and backward, a
  //   ring over the 4 grid ranks: 2 x (2 x 3/4 x 256) B;
  //   the pool all-reduces its 2 x 32 partial sums (256 B) over the grid, forward only:
  //   2 x 3/4 x 256 B;
  //   the fc reads 32 of the 64 pooled features and all-reduces its 2 x 10 fp32 partial logits
  //   (80 B) over the tp pair, forward only: 2 x 1/2 x 80 B.
  // At 100 GB/s with compute free, all of it exposed: spatial (792 + 768 + 384) B, tp 80 B.
  const spec::ClusterSpec cluster = test::ideal_cluster(1e12, 100, 100, 0);
  spec::Plan plan = test::make_plan(1, 2, 1, 2, 2);
  plan.dtype = spec::Dtype::kFp32;
  plan.spatial = {2, 2};
  plan.collective_algorithms[spec::CollectiveKind::kAllReduce] = spec::CollectiveAlgorithm::kRing;
  SimulationOptions options;
  options.trace = true;
  const SimulationResult r = simulate(test::small_cnn(32, 64), cluster, plan, options);
  EXPECT_NEAR(r.report.breakdown_s.spatial_comm_exposed, (792 + 768 + 384) / 100e9, 1e-12);
  EXPECT_NEAR(r.report.breakdown_s.tp_comm_exposed, 80 / 100e9, 1e-12);
  // Each op in its group: the grid's 4 ranks, or the tp pair.
  const std::map<std::string, std::pair<int64_t, int64_t>> expected = {
      {"layer0.conv.halo", {792, 4}},
      {"layer0.conv.bn_allreduce", {256, 4}},
      {"layer1.pool_allreduce", {256, 4}},
      {"layer2.fc.all_reduce", {80, 2}}};
  std::map<std::string, int> seen;
  for (const spec::TraceEvent& e : r.trace->events) {
    auto it = expected.find(e.name);
    if (it == expected.end()) continue;
    ++seen[e.name];
    EXPECT_EQ(e.bytes, it->second.first) << e.name;
    EXPECT_EQ(e.group_size, it->second.second) << e.name;
  }
  // On each of the 8 ranks: one halo, two statistics all-reduces, one pool and one fc sum.
  EXPECT_EQ(seen["layer0.conv.halo"], 8);
  EXPECT_EQ(seen["layer0.conv.bn_allreduce"], 16);
  EXPECT_EQ(seen["layer1.pool_allreduce"], 8);
  EXPECT_EQ(seen["layer2.fc.all_reduce"], 8);
}

// A CNN's channels over tp 4, whose 8 -> 8 convolution runs stationary-w on a 2 x 2 grid
// (spec/channel_split.hpp): 2 nodes of 2 devices, NVLink at 100 GB/s, one 10 GB/s NIC per
// device, no latency, ring collectives. The reduce groups are tp ranks {0, 1} and {2, 3}, inside
// a node; the gather groups {0, 2} and {1, 3}, across the two. With B = 2 in fp32 on 8x8 maps,
// each collective moves a 2 x 4 x 64 x 4 = 2048-byte buffer over 2 ranks, (2 - 1)/2 of it per
// rank: 1024 B at 10 GB/s, 102.4 ns, for the gather and its backward twin (the input gradient's
// reduce-scatter); 1024 B at 100 GB/s, 10.24 ns, for the partial outputs' reduce-scatter and its
// twin (the output gradient's all-gather).
TEST(ChannelSplit, StationaryWRunsInItsReduceAndGatherGroups) {
  const spec::ModelSpec m = test::conv_chain({8, 8}, 8);
  const spec::ClusterSpec cluster = test::ideal_cluster(1e12, 100, 10, 0, 2, 2, 2);
  spec::Plan plan = test::make_plan(1, 4, 1, 2, 2);
  plan.dtype = spec::Dtype::kFp32;
  for (spec::CollectiveKind k :
       {spec::CollectiveKind::kAllGather, spec::CollectiveKind::kReduceScatter,
        spec::CollectiveKind::kAllReduce})
    plan.collective_algorithms[k] = spec::CollectiveAlgorithm::kRing;
  SimulationOptions options;
  options.trace = true;
  const SimulationResult r = simulate(m, cluster, plan, options);
  const std::map<std::string, double> expected_s = {
      {"layer1.conv.channel_all_gather", 1024 / 10e9},
      {"layer1.conv.filter_reduce_scatter", 1024 / 100e9},
      {"layer1.conv.filter_all_gather", 1024 / 100e9},
      {"layer1.conv.channel_reduce_scatter", 1024 / 10e9}};
  std::map<std::string, int> seen;
  for (const spec::TraceEvent& e : r.trace->events) {
    auto it = expected_s.find(e.name);
    if (it == expected_s.end()) continue;
    ++seen[e.name];
    EXPECT_EQ(e.bytes, 2048) << e.name;
    EXPECT_EQ(e.group_size, 2) << e.name;
    EXPECT_NEAR(static_cast<double>(e.duration_ps) * 1e-12, it->second, 1e-12)
        << e.name << " on rank " << e.rank;
  }
  for (const auto& [name, s] : expected_s) EXPECT_EQ(seen[name], 4) << name;  // every rank once
}

// A U-Net cut into two pipeline stages between a kept map and its concat: the activation sent
// forward carries the kept map too, and the gradient sent back carries its gradient. One sample
// of 16x16 in fp32: the kept map is 4 x 16 x 16 x 4 = 4096 bytes, and whichever layer between
// the keep and the concat ends stage 0, its own output rides with it (the lowering's
// output_bytes, tests/models/unet_lowering_test.cpp derives them by hand).
TEST(UnetPipeline, AStageBoundaryCarriesTheKeptMap) {
  const spec::ClusterSpec cluster = test::ideal_cluster(1e12, 100, 100, 0);
  spec::Plan plan = test::make_plan(1, 1, 2, 1, 2);
  plan.dtype = spec::Dtype::kFp32;
  SimulationOptions options;
  options.trace = true;
  const spec::ModelSpec model = test::small_unet(16);
  const SimulationResult r = simulate(model, cluster, plan, options);
  models::LoweringOptions o;
  o.micro_batch = 1;
  o.dtype = spec::Dtype::kFp32;
  const models::LoweredModel lowered = models::lower(model, o);
  const size_t end = models::stage_layers(plan, lowered, 0).chunk_end[0] - 1;
  ASSERT_GE(end, 1u);  // after the keep (layer 0) ...
  ASSERT_LE(end, 3u);  // ... and before the concat (layer 4)
  const int64_t kept = 4 * 16 * 16 * 4;
  EXPECT_GT(lowered.layers[end].output_bytes, kept);
  int sends = 0;
  for (const spec::TraceEvent& e : r.trace->events) {
    if (e.name != "pp.send_activation" && e.name != "pp.send_gradient") continue;
    ++sends;
    EXPECT_EQ(e.bytes, lowered.layers[end].output_bytes) << e.name;
  }
  EXPECT_EQ(sends, 2 * 2);  // each of 2 micro-batches forward and back
}

TEST(SpatialSplit, GradientsAreSummedOverEveryRankHoldingTheModel) {
  // dp 2 x a 2x1 grid: the four ranks each hold the whole model and a partial gradient, so the
  // gradient all-reduce spans all four, as it does for dp 4 without a split.
  const spec::ClusterSpec cluster = test::ideal_cluster(1e12, 100, 100, 0);
  spec::Plan split = test::make_plan(2, 1, 1, 2, 4);
  split.dtype = spec::Dtype::kFp32;
  split.spatial = {2, 1};
  split.stack->dp_overlap = false;
  split.collective_algorithms[spec::CollectiveKind::kAllReduce] = spec::CollectiveAlgorithm::kRing;
  spec::Plan dp4 = split;
  dp4.dp = 4;
  dp4.global_batch = 8;
  dp4.spatial = {};
  const spec::ModelSpec m = test::small_cnn(32, 64);
  const double exposed_split = simulate(m, cluster, split, {}).report.breakdown_s.dp_comm_exposed;
  const double exposed_dp4 = simulate(m, cluster, dp4, {}).report.breakdown_s.dp_comm_exposed;
  // 3x3x3x64 + 2x64 (conv, bn) + 64x10 + 10 (fc) parameters in fp32, ring over 4: 2 x 3/4 x n.
  const double n = (27 * 64 + 128 + 650) * 4.0;
  EXPECT_NEAR(exposed_dp4, 1.5 * n / 100e9, 1e-12);
  EXPECT_NEAR(exposed_split, exposed_dp4, 1e-12);
}

TEST(SpatialSplit, SplittingASampleCutsItsComputeAndActivations) {
  // ResNet-50, 8 images per replica on 4 GPUs of a DGX A100: a 2x2 grid leaves each GPU a
  // quarter of every map down to 14x14 (4 of 7 rows and columns on the last stage's 7x7 maps),
  // so at least a quarter and at most (4/7)^2 = 0.33 of the activations, and less compute.
  const spec::ModelSpec m = models::zoo_model("resnet50");
  const spec::ClusterSpec cluster = spec::builtin_cluster("dgx-a100");
  spec::Plan whole = test::make_plan(1, 1, 1, 8, 8);
  spec::Plan split = whole;
  split.spatial = {2, 2};
  const spec::Report a = simulate(m, cluster, whole, {}).report;
  const spec::Report b = simulate(m, cluster, split, {}).report;
  const double ratio =
      static_cast<double>(b.memory.activations) / static_cast<double>(a.memory.activations);
  EXPECT_GT(ratio, 0.25);
  EXPECT_LT(ratio, 0.33);
  EXPECT_LT(b.breakdown_s.compute, a.breakdown_s.compute);
  EXPECT_GT(b.breakdown_s.spatial_comm_exposed, 0);
  EXPECT_EQ(b.memory.weights, a.memory.weights);
  EXPECT_EQ(b.gpus, 4);
}

}  // namespace
}  // namespace sextant::sim
