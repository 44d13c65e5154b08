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

TEST(Calibration, NothingToFitIsAnError) {
  EXPECT_THROW(calibrate(test::ideal_cluster(), Samples{}, spec::Dtype::kBf16), InputError);
}

}  // namespace
}  // namespace sextant::traces
