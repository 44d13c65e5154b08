// Calibration recovers known parameters from synthetic measurements made with them plus noise.
#include "sextant/traces/calibration.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "sextant/sim/collective_cost.hpp"
#include "test_clusters.hpp"

namespace sextant::traces {
namespace {

constexpr uint32_t kSeed = 20261122;

TEST(Calibration, RecoversLaunchOverheadMemoryAndGemmEfficiency) {
  std::mt19937 rng(kSeed);
  std::normal_distribution<double> noise(1.0, 0.01);  // 1% multiplicative noise
  spec::ClusterSpec base = test::ideal_cluster(100, 100, 10, 1);
  base.device.memory_bandwidth_GBps = 1000;
  base.device.memory_efficiency = 0.5;
  base.device.launch_overhead_us = 0;
  Samples s;
  // Memory-bound ops: t = 4 us + bytes / (1000 GB/s * 0.7).
  for (int i = 0; i < 40; ++i) {
    const int64_t bytes = int64_t{1} << (12 + i % 16);
    const double t = 4e-6 + static_cast<double>(bytes) / (1000e9 * 0.7);
    s.compute.push_back({spec::OpClass::kElementwise, "", 0, bytes, t * noise(rng)});
  }
  // GEMMs at 100 TFLOP/s peak: efficiency 0.3 around 1e9 FLOPs and 0.8 around 1e12.
  for (int i = 0; i < 20; ++i) {
    const double flops = i % 2 == 0 ? 1e9 : 1e12;
    const double eff = i % 2 == 0 ? 0.3 : 0.8;
    s.compute.push_back(
        {spec::OpClass::kGemm, "", flops, 0, (4e-6 + flops / (100e12 * eff)) * noise(rng)});
  }
  Calibration c = calibrate(base, s, spec::Dtype::kBf16);
  EXPECT_NEAR(c.cluster.device.launch_overhead_us, 4.0, 0.2);
  EXPECT_NEAR(c.cluster.device.memory_efficiency_for(spec::OpClass::kElementwise) *
                  c.cluster.device.memory_bandwidth_GBps,
              700, 700 * 0.03);
  ASSERT_EQ(c.cluster.device.gemm_efficiency.size(), 2u);
  EXPECT_NEAR(c.cluster.device.gemm_efficiency[0].efficiency, 0.3, 0.01);
  EXPECT_NEAR(c.cluster.device.gemm_efficiency[1].efficiency, 0.8, 0.02);
  EXPECT_LT(c.report.compute_error_after, 0.03);
  EXPECT_GT(c.report.compute_error_before, c.report.compute_error_after);
  ASSERT_TRUE(c.cluster.calibrated_from.has_value());
  EXPECT_EQ(c.cluster.calibrated_from->at("compute_samples"), 60);
}

TEST(Calibration, RecoversAlphaAndBetaOfEachCollectiveAcrossGroupSizes) {
  std::mt19937 rng(kSeed + 1);
  std::normal_distribution<double> noise(1.0, 0.02);
  spec::ClusterSpec base = test::ideal_cluster(100, 100, 10, 1, 4, 8, 8);
  const double alpha = 7e-6, beta = 1 / 50e9;  // 7 us, 50 GB/s
  Samples s;
  for (spec::CollectiveKind kind :
       {spec::CollectiveKind::kAllReduce, spec::CollectiveKind::kAllGather}) {
    for (int64_t p : {2, 4, 8}) {
      for (int64_t bytes : {int64_t{1} << 12, int64_t{1} << 18, int64_t{1} << 24}) {
        // The ring formula, written out: all-reduce 2(p-1) a + 2(p-1)/p n b; all-gather (p-1) a
        // + (p-1)/p n b.
        const double P = static_cast<double>(p), n = static_cast<double>(bytes);
        const double t = kind == spec::CollectiveKind::kAllReduce
                             ? 2 * (P - 1) * alpha + 2 * (P - 1) / P * n * beta
                             : (P - 1) * alpha + (P - 1) / P * n * beta;
        s.comm.push_back({kind, p, bytes, t * noise(rng)});
      }
    }
  }
  Calibration c = calibrate(base, s, spec::Dtype::kBf16);
  ASSERT_EQ(c.cluster.collective_fits.size(), 2u);
  for (const spec::CollectiveFit& f : c.cluster.collective_fits) {
    EXPECT_EQ(f.level, "nvlink");  // groups of up to 8 ranks fit in a node of 8
    EXPECT_NEAR(f.alpha_us, 7.0, 0.35) << f.collective;
    EXPECT_NEAR(1e-3 / f.beta_us_per_byte, 50.0, 1.5) << f.collective;  // GB/s
    EXPECT_GT(f.r2, 0.99);
    EXPECT_EQ(f.samples, 9);
  }
}

// Open MPI switching algorithms: reduce-scatter between 2 ranks follows t = α + n/2 β (ring, p = 2)
// with α = 2 us and 1/β = 4 GB/s up to 512 KB, then 14 ms at 4 MB. One line misses 4 MB by far more
// than 25%, so each pair of neighbouring sizes gets its own fit: three, bounded by 64 KB, 512 KB
// and none; the middle one is the line itself. The last range has no line with α >= 0 through
// both ends (per byte, 4 MB costs 14 ms / 2 MB = 6.7 ns against 0.5 ns at 512 KB), so it is
// priced by the larger size's per-byte cost: α = 0, β = 14 ms / (4 MB / 2), exact at 4 MB.
TEST(Calibration, CollectivesThatSwitchAlgorithmsAreFittedBySizeRange) {
  const double alpha = 2e-6, beta = 1 / 4e9;
  Samples s;
  for (int64_t bytes : {int64_t{4096}, int64_t{65536}, int64_t{524288}, int64_t{4194304}}) {
    const double t = bytes == 4194304 ? 14e-3 : alpha + static_cast<double>(bytes) / 2 * beta;
    for (int i = 0; i < 3; ++i)
      s.comm.push_back({spec::CollectiveKind::kReduceScatter, 2, bytes, t});
  }
  spec::ClusterSpec base = test::ideal_cluster(100, 100, 10, 1, 4, 8, 8);
  Calibration c = calibrate(base, s, spec::Dtype::kBf16);
  ASSERT_EQ(c.cluster.collective_fits.size(), 3u);
  std::vector<int64_t> bounds;
  for (const spec::CollectiveFit& f : c.cluster.collective_fits) bounds.push_back(f.max_bytes);
  std::sort(bounds.begin(), bounds.end());
  EXPECT_EQ(bounds, (std::vector<int64_t>{0, 65536, 524288}));
  for (const spec::CollectiveFit& f : c.cluster.collective_fits) {
    if (f.max_bytes == 524288) {
      EXPECT_NEAR(f.alpha_us, 2.0, 1e-6);
      EXPECT_NEAR(1e-3 / f.beta_us_per_byte, 4.0, 1e-6);  // GB/s
    } else if (f.max_bytes == 0) {
      EXPECT_EQ(f.alpha_us, 0.0);
      EXPECT_NEAR(f.beta_us_per_byte * 4194304 / 2, 14e3, 1e-6);  // us at 4 MB
    }
  }
}

// A collective seen only in the benchmark loop takes the per-byte ratio of training over benchmark
// of the collectives training showed: all-reduce at 1/β = 8 GB/s in the benchmark and 4 GB/s in
// training (two sizes) makes the benchmark's all-gather at 8 GB/s cost 4 GB/s.
TEST(Calibration, TrainingCostCarriesOverToCollectivesTrainingDidNotShow) {
  Samples s;
  auto ring = [](spec::CollectiveKind k, double n, double per_byte) {
    return k == spec::CollectiveKind::kAllReduce ? n * per_byte : n / 2 * per_byte;
  };
  for (int64_t bytes : {int64_t{1} << 16, int64_t{1} << 20}) {
    const double n = static_cast<double>(bytes);
    for (spec::CollectiveKind k :
         {spec::CollectiveKind::kAllReduce, spec::CollectiveKind::kAllGather})
      s.comm.push_back({k, 2, bytes, ring(k, n, 1 / 8e9)});
    CommSample t{spec::CollectiveKind::kAllReduce, 2, bytes,
                 ring(spec::CollectiveKind::kAllReduce, n, 1 / 4e9)};
    t.in_training = true;
    s.comm.push_back(t);
  }
  spec::ClusterSpec base = test::ideal_cluster(100, 100, 10, 1, 4, 8, 8);
  Calibration c = calibrate(base, s, spec::Dtype::kBf16);
  ASSERT_EQ(c.cluster.collective_fits.size(), 2u);
  for (const spec::CollectiveFit& f : c.cluster.collective_fits)
    EXPECT_NEAR(1e-3 / f.beta_us_per_byte, 4.0, 1e-6) << f.collective;
}

// The file's bandwidth is the device's peak: ops that seem faster (cache-resident data) cap their
// class's efficiency at 1 and leave the bandwidth alone (a fit once tripled H100's HBM bandwidth).
TEST(Calibration, NeverRaisesTheBandwidthAboveThePeak) {
  spec::ClusterSpec base = test::ideal_cluster(100, 100, 10, 1);
  base.device.memory_bandwidth_GBps = 1000;
  base.device.memory_efficiency = 0.5;
  Samples s;
  // Elementwise ops moving their bytes at 3000 GB/s (3x the peak), norms at 400 GB/s.
  for (int i = 0; i < 8; ++i) {
    const int64_t bytes = int64_t{1} << (16 + i);
    s.compute.push_back({spec::OpClass::kElementwise, "", 0, bytes, bytes / 3000e9});
    s.compute.push_back({spec::OpClass::kNorm, "", 0, bytes, bytes / 400e9});
  }
  Calibration c = calibrate(base, s, spec::Dtype::kBf16);
  EXPECT_EQ(c.cluster.device.memory_bandwidth_GBps, 1000);
  EXPECT_EQ(c.cluster.device.memory_efficiency_for(spec::OpClass::kElementwise), 1.0);
  EXPECT_NEAR(c.cluster.device.memory_efficiency_for(spec::OpClass::kNorm), 0.4, 0.01);
  bool noted = false;
  for (const std::string& n : c.report.notes) noted = noted || n.find("elementwise") == 0;
  EXPECT_TRUE(noted);
}

// A file whose peak `clusters detect` measured states the fastest GEMM it saw: a faster one is
// the better bound. Memory-bound ops t = 2 us + bytes / 3000 GB/s give the launch overhead, 2 us.
// GEMMs of 1e12 FLOPs take 2 us + 1e12 / 150e12 s (mlp.fc1) and 2 us + 1e12 / 120e12 s
// (attn.qkv) against a measured 100 TFLOP/s: the peak becomes fc1's FLOPs over its whole time
// (the launch not taken off), and qkv's efficiency its rate after the launch over that, ~0.8.
// A 1e6-FLOP GEMM of 2.005 us would be 200 TFLOP/s after the launch, 0.5 over its time: it
// raises nothing. Against a datasheet peak of 100 nothing is raised and both are capped at 1.
TEST(Calibration, RaisesAMeasuredPeakToTheFastestGemm) {
  spec::ClusterSpec base = test::ideal_cluster(100, 100, 10, 1);
  base.device.memory_bandwidth_GBps = 1000;
  base.device.peak_measured = true;
  Samples s;
  const double fc1_s = 2e-6 + 1e12 / 150e12, qkv_s = 2e-6 + 1e12 / 120e12;
  for (int i = 0; i < 3; ++i) {
    const int64_t bytes = int64_t{1} << (16 + i);
    s.compute.push_back({spec::OpClass::kElementwise, "", 0, bytes, 2e-6 + bytes / 3000e9});
    s.compute.push_back({spec::OpClass::kGemm, "mlp.fc1", 1e12, 0, fc1_s});
    s.compute.push_back({spec::OpClass::kGemm, "attn.qkv", 1e12, 0, qkv_s});
    s.compute.push_back({spec::OpClass::kGemm, "attn.scores", 1e6, 0, 2.005e-6});
  }
  const Calibration c = calibrate(base, s, spec::Dtype::kBf16);
  const spec::DeviceSpec& d = c.cluster.device;
  ASSERT_NEAR(d.launch_overhead_us, 2, 1e-6);
  const double peak = 1e12 / fc1_s;  // 149.96 TFLOP/s
  EXPECT_NEAR(d.peak_tflops.at(spec::Dtype::kBf16) * 1e12, peak, 1e-6 * peak);
  EXPECT_NEAR(*d.op_efficiency("mlp.fc1", 1e12), 1.0, 1e-9);  // 150 over 149.96: capped
  EXPECT_NEAR(*d.op_efficiency("attn.qkv", 1e12), 1e12 / (qkv_s - 2e-6) / peak, 1e-6);
  EXPECT_NEAR(*d.op_efficiency("attn.qkv", 1e12), 0.8, 0.001);
  EXPECT_EQ(d.memory_bandwidth_GBps, 1000);
  EXPECT_TRUE(d.peak_measured);
  int raised = 0;
  for (const std::string& n : c.report.notes) raised += n.find("raised to it") != std::string::npos;
  EXPECT_EQ(raised, 1);
  base.device.peak_measured = false;
  const Calibration datasheet = calibrate(base, s, spec::Dtype::kBf16);
  EXPECT_EQ(datasheet.cluster.device.peak_tflops.at(spec::Dtype::kBf16), 100);
  EXPECT_EQ(*datasheet.cluster.device.op_efficiency("attn.qkv", 1e12), 1.0);
  EXPECT_EQ(*datasheet.cluster.device.op_efficiency("mlp.fc1", 1e12), 1.0);
}

// A measured training step: ops on two streams of rank 0 overlap ([0, 10) and [5, 12) ms of each
// step), so the ops explain 12 ms of a 20 ms step; rank 1 is busier ([0, 15) ms). The host time
// per step is what the least idle rank leaves unexplained: 20 - 15 = 5 ms.
TEST(Calibration, HostTimePerStepIsWhatNoOpExplains) {
  spec::Trace t;
  t.kind = "measured";
  t.metadata = {{"step_time_s", 0.020}};
  auto ms = [](double v) { return static_cast<Picoseconds>(v * 1e9); };
  auto event = [&](int64_t rank, spec::Stream stream, spec::OpClass cls, double start_ms,
                   double duration_ms, int64_t step) {
    spec::TraceEvent e;
    e.name = cls == spec::OpClass::kGemm ? "mlp.fc1" : "all_reduce";
    e.op_class = cls;
    e.rank = rank;
    e.stream = stream;
    e.start_ps = ms(start_ms);
    e.duration_ps = ms(duration_ms);
    e.step = step;
    e.flops = cls == spec::OpClass::kGemm ? 1e9 : 0;
    return e;
  };
  for (int64_t step = 0; step < 3; ++step) {
    const double at = 20.0 * static_cast<double>(step);
    t.events.push_back(event(0, spec::Stream::kCompute, spec::OpClass::kGemm, at, 10, step));
    t.events.push_back(event(0, spec::Stream::kDpComm, spec::OpClass::kAllReduce, at + 5, 7, step));
    t.events.push_back(event(1, spec::Stream::kCompute, spec::OpClass::kGemm, at, 15, step));
  }
  Samples s = samples_from_trace(t, "run.json");
  ASSERT_EQ(s.steps.size(), 1u);
  EXPECT_NEAR(s.steps[0].busy_s, 0.015, 1e-12);
  Calibration cal = calibrate(test::ideal_cluster(), s, spec::Dtype::kBf16);
  EXPECT_NEAR(cal.cluster.device.step_overhead_us, 5000, 1e-6);
}

// One op name at two sizes (a CPU's activation that fits L2 at 1 MB and not at 4 MB): each size
// keeps its own efficiency, and sizes between are interpolated in log(bytes): at 2 MB, halfway.
TEST(Calibration, PerOpEfficienciesFollowTheOpsSize) {
  spec::ClusterSpec base = test::ideal_cluster(100, 100, 10, 1);
  base.device.memory_bandwidth_GBps = 100;
  base.device.launch_overhead_us = 0;
  Samples s;
  for (int i = 0; i < 4; ++i) {
    s.compute.push_back({spec::OpClass::kElementwise, "mlp.act", 0, 1 << 20, (1 << 20) / 50e9});
    s.compute.push_back({spec::OpClass::kElementwise, "mlp.act", 0, 4 << 20, (4 << 20) / 25e9});
  }
  Calibration c = calibrate(base, s, spec::Dtype::kBf16);
  const spec::DeviceSpec& d = c.cluster.device;
  ASSERT_EQ(d.efficiency_by_op.at("mlp.act").size(), 2u);
  EXPECT_NEAR(*d.op_efficiency("mlp.act", 1 << 20), 0.5, 1e-9);
  EXPECT_NEAR(*d.op_efficiency("mlp.act", 4 << 20), 0.25, 1e-9);
  EXPECT_NEAR(*d.op_efficiency("mlp.act", 2 << 20), 0.375, 1e-9);
  EXPECT_NEAR(*d.op_efficiency("mlp.act", 64 << 20), 0.25, 1e-9);  // clamped past the last size
  EXPECT_FALSE(d.op_efficiency("mlp.fc1", 1e9).has_value());
  // The curve survives the file: written as {work, efficiency} points and read back.
  spec::ClusterSpec again = spec::cluster_from_json(spec::to_json(c.cluster), "calibrated.json");
  EXPECT_NEAR(*again.device.op_efficiency("mlp.act", 2 << 20), 0.375, 1e-9);
}

// Arrival spreads at collectives: two ranks meet at an all-reduce ending at 1 ms, then compute
// 10 and 12 ms and meet again (arrivals at 11 and 13 ms): the last came 1 ms after the mean of
// 12, after a mean segment of 11 ms. The fit reads jitter j = spread / (E[max of 2] * S) =
// 1 / (11 / sqrt(pi)) from each such collective (the median of ten identical ones).
TEST(Calibration, ComputeJitterFromArrivalSpreads) {
  spec::Trace t;
  t.kind = "measured";
  t.metadata = {{"step_time_s", 0.020}};
  auto ms = [](double v) { return static_cast<Picoseconds>(v * 1e9); };
  auto collective = [&](int64_t rank, double start, double duration, int64_t layer) {
    spec::TraceEvent e;
    e.name = "attn.all_reduce";
    e.op_class = spec::OpClass::kAllReduce;
    e.rank = rank;
    e.stream = spec::Stream::kTpComm;
    e.start_ps = ms(start);
    e.duration_ps = ms(duration);
    e.layer = layer;
    e.bytes = 1024;
    e.group_size = 2;
    return e;
  };
  t.events = {collective(0, 0, 1, 0), collective(1, 0, 1, 0), collective(0, 11, 3, 1),
              collective(1, 13, 1, 1)};
  Samples s = samples_from_trace(t, "run.json");
  ASSERT_EQ(s.sync.size(), 1u);  // the first collective has no segment before it
  EXPECT_NEAR(s.sync[0].spread_s, 1e-3, 1e-12);
  EXPECT_NEAR(s.sync[0].segment_s, 11e-3, 1e-12);
  // The collective as its last member saw it (it waited for nobody): rank 1's 1 ms, not rank 0's
  // 3 ms of which 2 were waiting.
  ASSERT_EQ(s.comm.size(), 2u);  // both collectives; the first one's members arrived together
  for (const CommSample& c : s.comm) {
    EXPECT_TRUE(c.in_training);
    EXPECT_NEAR(c.seconds, 1e-3, 1e-12);
    EXPECT_EQ(c.ranks, 2);
    EXPECT_EQ(c.bytes, 1024);
  }
  for (int i = 0; i < 9; ++i) s.sync.push_back(s.sync[0]);
  Calibration c = calibrate(test::ideal_cluster(), s, spec::Dtype::kBf16);
  EXPECT_NEAR(c.cluster.device.compute_jitter, 1.0 / (11.0 / std::sqrt(M_PI)), 1e-3);
}

// Four runs of 2-rank collectives with segments of 10 ms: two on a quiet machine (spreads of
// 0.2 and 0.3 ms), two beside a busy neighbour (2 ms at every collective). Per run j = spread /
// (e(2) S) with e(2) = 1/sqrt(pi): 0.0354, 0.0532, 0.354, 0.354. Pooled, the upper median of the
// 40 collectives would be the busy runs' 0.354; the lower median of the runs is 0.0532.
TEST(Calibration, ComputeJitterIgnoresRunsBesideABusyNeighbour) {
  Samples s;
  auto run = [&](const std::string& source, double spread_ms) {
    for (int i = 0; i < 10; ++i) s.sync.push_back({source, 2, spread_ms * 1e-3, 10e-3});
  };
  run("quiet-a.json", 0.2);
  run("quiet-b.json", 0.3);
  run("busy-a.json", 2.0);
  run("busy-b.json", 2.0);
  s.compute.push_back({spec::OpClass::kGemm, "mlp.fc1", 1e9, 0, 1e-3});
  Calibration c = calibrate(test::ideal_cluster(), s, spec::Dtype::kBf16);
  EXPECT_NEAR(c.cluster.device.compute_jitter, 0.3e-3 / (10e-3 / std::sqrt(M_PI)), 1e-5);
}

// A step pays its ops' mean time. Four runs of an op at 1 ms and one stalled at 5 ms: the median
// would say 1 ms per op, the step pays (4 + 5) / 5 = 1.8 ms per op; the fitted efficiency must
// give the latter: 1 GFLOP / (100 TFLOP/s * 1.8 ms) = 1/180.
TEST(Calibration, PerOpEfficiencyGivesTheMeanTimeAStepPays) {
  spec::ClusterSpec base = test::ideal_cluster(100, 100, 10, 1);
  base.device.launch_overhead_us = 0;
  Samples s;
  for (double ms : {1.0, 1.0, 5.0, 1.0, 1.0})
    s.compute.push_back({spec::OpClass::kGemm, "mlp.fc1", 1e9, 0, ms * 1e-3});
  Calibration c = calibrate(base, s, spec::Dtype::kBf16);
  EXPECT_NEAR(*c.cluster.device.op_efficiency("mlp.fc1", 1e9), 1.0 / 180, 1e-9);
  ASSERT_EQ(c.cluster.device.gemm_efficiency.size(), 1u);
  EXPECT_NEAR(c.cluster.device.gemm_efficiency[0].efficiency, 1.0 / 180, 1e-9);
}

TEST(Calibration, NothingToFitIsAnError) {
  EXPECT_THROW(calibrate(test::ideal_cluster(), Samples{}, spec::Dtype::kBf16), InputError);
}

}  // namespace
}  // namespace sextant::traces
