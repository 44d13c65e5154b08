// Compressed data-parallel gradient exchanges: each bucket encoded, all-gathered and decoded
// (models/gradient_compression.hpp), priced by hand; and the trade-off they are for.
#include "sextant/models/gradient_compression.hpp"

#include <gtest/gtest.h>

#include <map>

#include "sextant/models/lowering.hpp"
#include "sextant/sim/memory_model.hpp"
#include "sextant/sim/simulator.hpp"
#include "test_clusters.hpp"
#include "test_models.hpp"

namespace sextant::sim {
namespace {

constexpr int64_t kLayers = 4, kWidth = 1024;

spec::Plan ddp_plan(int64_t dp, spec::CompressionKind kind) {
  spec::Plan plan = test::make_plan(dp, 1, 1, 256, 256 * dp);
  plan.dtype = spec::Dtype::kFp32;
  plan.stack->dp_bucket_bytes = 1;  // one bucket per layer
  plan.compression.kind = kind;
  for (auto [k, a] :
       {std::pair{spec::CollectiveKind::kAllReduce, spec::CollectiveAlgorithm::kRing},
        std::pair{spec::CollectiveKind::kAllGather, spec::CollectiveAlgorithm::kRing}})
    plan.collective_algorithms[k] = a;
  return plan;
}

TEST(GradientCompression, EachBucketIsEncodedGatheredAndDecoded) {
  // Two ranks on one node at 100 GB/s, no latency, memory-bound ops free: a compressed bucket of
  // n = 1024 x 1024 gradients costs its ring all-gather, (p - 1) / p of all p encodings:
  // 0.5 x 2 x words(n) x 4 B / 100 GB/s. Without overlap the four buckets follow the backward
  // one after another, all exposed.
  const spec::ClusterSpec cluster = test::ideal_cluster(100, 100, 100, 0);
  const spec::ModelSpec model = test::uniform_mlp(kLayers, kWidth);
  for (spec::CompressionKind kind : {spec::CompressionKind::kQsgd, spec::CompressionKind::kTopk,
                                     spec::CompressionKind::kOnebit}) {
    spec::Plan plan = ddp_plan(2, kind);
    plan.stack->dp_overlap = false;
    SimulationOptions options;
    options.trace = true;
    const SimulationResult r = simulate(model, cluster, plan, options);
    const int64_t n = kWidth * kWidth;
    const double gathered =
        static_cast<double>(models::compressed_gather_bytes(plan.compression, n, 2));
    EXPECT_NEAR(r.report.breakdown_s.dp_comm_exposed, kLayers * 0.5 * gathered / 100e9, 1e-9)
        << plan.name();
    // The trace names the three steps once per bucket on each rank, with the models' bytes.
    std::map<std::string, int64_t> count;
    for (const spec::TraceEvent& e : r.trace->events) {
      if (e.rank != 0) continue;
      ++count[e.name];
      if (e.name == models::op_name(models::OpId::kDpCompressedAllGather)) {
        EXPECT_EQ(e.bytes, models::compressed_gather_bytes(plan.compression, n, 2));
      }
      if (e.name == models::op_name(models::OpId::kDpCompress)) {
        EXPECT_EQ(e.bytes, models::compression_encode_op(plan.compression, n, 4).bytes);
      }
      if (e.name == models::op_name(models::OpId::kDpDecompress)) {
        EXPECT_EQ(e.bytes, models::compression_decode_op(plan.compression, n, 2, 4).bytes);
      }
    }
    EXPECT_EQ(count[models::op_name(models::OpId::kDpCompress)], kLayers);
    EXPECT_EQ(count[models::op_name(models::OpId::kDpCompressedAllGather)], kLayers);
    EXPECT_EQ(count[models::op_name(models::OpId::kDpDecompress)], kLayers);
    EXPECT_EQ(count["dp.all_reduce"], 0);
  }
}

TEST(GradientCompression, PowerSgdAllReducesTheFactorsWhateverTheDp) {
  // The same ideal cluster (100 GB/s, no latency, codecs free), rank 4, no biases: each layer's
  // 1024 x 1024 weight sends P and Q of 4 x 1024 fp32 elements (32 KiB together) in two ring
  // all-reduces of 2 (dp - 1) / dp x bytes / 100 GB/s each; nothing goes uncompressed. At dp 2
  // that is 32 KiB / 100 GB/s per bucket, at dp 8 1.75 times it -- the ring's factor, where a
  // gather's bytes grow 7-fold.
  const spec::ClusterSpec cluster = test::ideal_cluster(100, 100, 100, 0);
  const spec::ModelSpec model = test::uniform_mlp(kLayers, kWidth);
  for (int64_t dp : {2, 8}) {
    spec::Plan plan = ddp_plan(dp, spec::CompressionKind::kPowersgd);
    plan.compression.rank = 4;
    plan.stack->dp_overlap = false;
    SimulationOptions options;
    options.trace = true;
    const SimulationResult r = simulate(model, cluster, plan, options);
    const double factors = 2.0 * 4 * kWidth * 4;
    const double ring = 2.0 * static_cast<double>(dp - 1) / static_cast<double>(dp);
    EXPECT_NEAR(r.report.breakdown_s.dp_comm_exposed, kLayers * ring * factors / 100e9, 1e-9)
        << plan.name();
    std::map<std::string, int64_t> count;
    for (const spec::TraceEvent& e : r.trace->events) {
      if (e.rank != 0) continue;
      ++count[e.name];
      if (e.name == models::op_name(models::OpId::kDpPowerSgdPAllReduce) ||
          e.name == models::op_name(models::OpId::kDpPowerSgdQAllReduce)) {
        EXPECT_EQ(e.bytes, 4 * kWidth * 4) << e.name;
      }
    }
    for (models::OpId id : {models::OpId::kDpCompress, models::OpId::kDpPowerSgdPAllReduce,
                            models::OpId::kDpPowerSgdProject, models::OpId::kDpPowerSgdQAllReduce,
                            models::OpId::kDpDecompress})
      EXPECT_EQ(count[models::op_name(id)], kLayers) << models::op_name(id);
    EXPECT_EQ(count["dp.all_reduce"], 0) << "every weight is a compressed matrix";
  }
}

TEST(GradientCompression, SparCmlSendsGrowingUnionsInLog2DpRounds) {
  // dp 8 on one node at 100 GB/s, no latency, codecs free (the memory at 10^12 GB/s), buckets
  // exposed one after another: each bucket of n = 2^20 gradients sends log2(8) = 3 rounds, the
  // bytes models::sparse_all_reduce_rounds lists (unions of 1, 2 and 4 selections of
  // k = ceil(0.001 n) = 1049 pairs, 8 B each), each a send/recv of bytes / 100 GB/s.
  const spec::ClusterSpec cluster = test::ideal_cluster(100, 100, 100, 0);
  const spec::ModelSpec model = test::uniform_mlp(kLayers, kWidth);
  spec::Plan plan = ddp_plan(8, spec::CompressionKind::kSparcml);
  plan.compression.ratio = 0.001;
  plan.stack->dp_overlap = false;
  const int64_t n = kWidth * kWidth;
  const std::vector<models::SparseRound> rounds = models::sparse_all_reduce_rounds(n, 1049, 8);
  ASSERT_EQ(rounds.size(), 3u);
  EXPECT_EQ(rounds[0].bytes, 8 * 1049);
  double sent = 0;
  for (const models::SparseRound& r : rounds) sent += static_cast<double>(r.bytes);
  SimulationOptions options;
  options.trace = true;
  const SimulationResult r = simulate(model, cluster, plan, options);
  EXPECT_NEAR(r.report.breakdown_s.dp_comm_exposed, kLayers * sent / 100e9, 1e-9);
  std::map<std::string, int64_t> count;
  std::vector<int64_t> exchanged;
  for (const spec::TraceEvent& e : r.trace->events) {
    if (e.rank != 0) continue;
    ++count[e.name];
    if (e.name == models::op_name(models::OpId::kDpSparseExchange)) exchanged.push_back(e.bytes);
  }
  EXPECT_EQ(count[models::op_name(models::OpId::kDpSparseExchange)], 3 * kLayers);
  EXPECT_EQ(count[models::op_name(models::OpId::kDpSparseMerge)], 3 * kLayers);
  EXPECT_EQ(count[models::op_name(models::OpId::kDpDecompress)], kLayers);
  EXPECT_EQ(count[models::op_name(models::OpId::kDpCompressedAllGather)], 0);
  ASSERT_EQ(exchanged.size(), static_cast<size_t>(3 * kLayers));
  for (size_t i = 0; i < exchanged.size(); ++i) EXPECT_EQ(exchanged[i], rounds[i % 3].bytes);
}

TEST(GradientCompression, SparCmlTakesLog2DpLatenciesWhereTheGatherTakesDpMinusOne) {
  // The same bytes in the independent model: the unions of 1, 2 and 4 selections of k pairs are
  // 7 k pairs less their expected overlap, the ring all-gather's 7 encodings of k pairs. With a
  // 50 us latency the gather pays 7 of them a bucket and SparCML 3: about 4 x 50 us = 0.2 ms a
  // bucket faster.
  const spec::ClusterSpec cluster = test::ideal_cluster(100, 100, 100, 50);
  const spec::ModelSpec model = test::uniform_mlp(kLayers, kWidth);
  auto exposed = [&](spec::CompressionKind kind) {
    spec::Plan plan = ddp_plan(8, kind);
    plan.compression.ratio = 0.001;
    plan.stack->dp_overlap = false;
    return simulate(model, cluster, plan, {}).report.breakdown_s.dp_comm_exposed;
  };
  const double gather = exposed(spec::CompressionKind::kTopk);
  const double sparse = exposed(spec::CompressionKind::kSparcml);
  EXPECT_NEAR(gather - sparse, kLayers * 4 * 50e-6, kLayers * 0.1 * 50e-6);
}

// SparCML's split all-gather at 20% on dp 8 (n = 2^20 per bucket, 100 GB/s, no latency, codecs
// free): a rank's all-to-all sends 7/8 of its k = ceil(0.2 n) pairs (8 B each); eight
// selections' union, n (1 - 0.8^8) = 0.83 n, is 0.104 n a range of n / 8 -- over half of it --
// so the gather collects the dense vector, 7/8 of 4n B. That beats the dense ring all-reduce
// (2 x 7/8 x 4n B) by 2.1n B a bucket, where recursive doubling loses to it: its rounds send
// 1.6n, 2.9n and, dense, 4n B.
TEST(GradientCompression, SparCmlsSplitAllGatherBeatsTheDenseRingWhereRecursiveDoublingCannot) {
  const spec::ClusterSpec cluster = test::ideal_cluster(100, 100, 100, 0);
  const spec::ModelSpec model = test::uniform_mlp(kLayers, kWidth);
  const int64_t n = kWidth * kWidth, k = models::topk_count(0.2, n);
  auto exposed = [&](spec::CompressionKind kind, spec::SparseAlgorithm algorithm) {
    spec::Plan plan = ddp_plan(8, kind);
    plan.collective_algorithms[spec::CollectiveKind::kAllToAll] =
        spec::CollectiveAlgorithm::kPairwise;
    plan.compression.ratio = 0.2;
    plan.compression.sparse_algorithm = algorithm;
    plan.stack->dp_overlap = false;
    SimulationOptions options;
    options.trace = true;
    return simulate(model, cluster, plan, options);
  };
  const SimulationResult split =
      exposed(spec::CompressionKind::kSparcml, spec::SparseAlgorithm::kSplitAllGather);
  const double split_s = split.report.breakdown_s.dp_comm_exposed;
  EXPECT_NEAR(split_s, kLayers * 7.0 / 8 * (8.0 * k + 4.0 * n) / 100e9, 1e-9);
  std::map<std::string, int64_t> count;
  for (const spec::TraceEvent& e : split.trace->events) {
    if (e.rank != 0) continue;
    ++count[e.name];
    if (e.name == models::op_name(models::OpId::kDpSparseGather)) {
      EXPECT_EQ(e.bytes, 4 * n);
    }
  }
  for (models::OpId id :
       {models::OpId::kDpCompress, models::OpId::kDpSparseSplit, models::OpId::kDpSparseMerge,
        models::OpId::kDpSparseGather, models::OpId::kDpDecompress})
    EXPECT_EQ(count[models::op_name(id)], kLayers) << models::op_name(id);
  EXPECT_EQ(count[models::op_name(models::OpId::kDpSparseExchange)], 0);
  const double dense = exposed(spec::CompressionKind::kNone, {}).report.breakdown_s.dp_comm_exposed;
  const double doubling =
      exposed(spec::CompressionKind::kSparcml, spec::SparseAlgorithm::kRecursiveDoubling)
          .report.breakdown_s.dp_comm_exposed;
  EXPECT_NEAR(dense, kLayers * 2 * 7.0 / 8 * 4.0 * n / 100e9, 1e-9);
  EXPECT_LT(split_s, 0.75 * dense);
  EXPECT_GT(doubling, dense);
}

TEST(GradientCompression, PaysOnASlowLinkAndCostsOnAFastOneAtLargeDp) {
  // A device reading memory at 2 TB/s runs the codecs; n = 2^20 fp32 gradients per bucket.
  spec::ClusterSpec slow = test::ideal_cluster(100, 1, 1, 0);
  slow.device.memory_bandwidth_GBps = 2000;
  const spec::ModelSpec model = test::uniform_mlp(kLayers, kWidth);
  auto step = [&](const spec::ClusterSpec& c, int64_t dp, spec::CompressionKind kind,
                  int64_t bits = 4) {
    spec::Plan plan = ddp_plan(dp, kind);
    plan.compression.bits = bits;
    return simulate(model, c, plan, {}).report.step_time_s;
  };
  // At 1 GB/s and dp 2 a bucket's ring all-reduce moves 2 x 1/2 x 4 MiB = 4.2 ms per rank; 1-bit
  // gathers 1/2 x 2 x (2^15 + 2^11) words x 4 B = 0.14 ms, and its codecs read and write
  // ~17 MB + 8 MB at 2 TB/s (~13 us): several ms faster per step.
  EXPECT_LT(step(slow, 2, spec::CompressionKind::kOnebit) + 3 * 4e-3,
            step(slow, 2, spec::CompressionKind::kNone));
  // At dp 8 on a fast link, 8-bit QSGD gathers 7/8 x 8 x (2^18 + 2^11) words x 4 B = 7.06 n B
  // against the ring all-reduce's 2 x 7/8 x 4 n = 7 n B: no saving, and the codecs cost on top.
  spec::ClusterSpec fast = test::ideal_cluster(100, 100, 100, 0);
  fast.device.memory_bandwidth_GBps = 2000;
  EXPECT_GT(step(fast, 8, spec::CompressionKind::kQsgd, 8),
            step(fast, 8, spec::CompressionKind::kNone));
}

TEST(GradientCompression, MemoryHoldsTheResidualAndTheEncodings) {
  const spec::ModelSpec model = test::uniform_mlp(kLayers, kWidth);
  const models::LoweredModel lowered = models::lower(model, {256, 0, spec::Dtype::kFp32, 1, false});
  spec::Plan none = ddp_plan(4, spec::CompressionKind::kNone);
  // 1000 fp32 gradients per bucket: each 2^20-parameter layer is a bucket of its own (a bucket
  // closes once it holds at least the bucket size), so the largest holds 2^20.
  none.stack->dp_bucket_bytes = 4 * 1000;
  spec::Plan qsgd = none;
  qsgd.compression.kind = spec::CompressionKind::kQsgd;
  const int64_t params = kLayers * kWidth * kWidth;
  const spec::MemoryBreakdown a = stage_memory(none, *none.stack, lowered, 0);
  const spec::MemoryBreakdown b = stage_memory(qsgd, *qsgd.stack, lowered, 0);
  // The residual of every parameter, and 1 + 4 encodings of a 2^20-gradient bucket: 4-bit codes
  // in 2^17 words and 2^11 norms.
  EXPECT_EQ(b.buffers - a.buffers, params * 4 + 5 * ((int64_t{1} << 17) + 2048) * 4);
}

}  // namespace
}  // namespace sextant::sim
