// Measurements no device of the cluster file could have made are left out before calibration
// fits them, each reason said once; profiles of another kind of device are refused.
#include "sextant/traces/sample_checks.hpp"

#include <gtest/gtest.h>

#include "expect_input_error.hpp"
#include "sextant/traces/calibration.hpp"
#include "test_clusters.hpp"

namespace sextant::traces {
namespace {

// 100 TFLOP/s, 1000 GB/s of memory, 100 GB/s links inside a node.
spec::ClusterSpec cluster() {
  spec::ClusterSpec c = test::ideal_cluster(100, 100, 10);
  c.device.memory_bandwidth_GBps = 1000;
  return c;
}

bool mentions(const std::vector<std::string>& lines, const std::string& text) {
  for (const std::string& l : lines)
    if (l.find(text) != std::string::npos) return true;
  return false;
}

TEST(SampleChecks, OpsPastTheDevicesPeaksAreLeftOut) {
  Samples s;
  // 1e12 FLOPs in 10 ms is 100 TFLOP/s: the peak, kept. In 5 ms it is 200 TFLOP/s, past 1.5x the
  // highest peak (150): left out. A 1e15-wide GEMM "in 1 us" is the fuzzed shape of the issue.
  s.compute.push_back({spec::OpClass::kGemm, "mm", 1e12, 0, 10e-3});
  s.compute.push_back({spec::OpClass::kGemm, "mm", 1e12, 0, 5e-3});
  s.compute.push_back({spec::OpClass::kGemm, "mm", 2e45, 0, 1e-6});
  // 1 GB in 1 ms is 1000 GB/s (kept); in 0.09 ms it is 11,111 GB/s, past 10x the bandwidth.
  s.compute.push_back({spec::OpClass::kElementwise, "add", 0, 1'000'000'000, 1e-3});
  s.compute.push_back({spec::OpClass::kElementwise, "add", 0, 1'000'000'000, 0.09e-3});
  // Not a time at all.
  s.compute.push_back({spec::OpClass::kElementwise, "add", 0, 1000, std::nan("")});
  s.compute.push_back({spec::OpClass::kElementwise, "add", 0, 1000, 0});
  const Samples out = screen_samples(s, cluster());
  ASSERT_EQ(out.compute.size(), 2u);
  EXPECT_DOUBLE_EQ(out.compute[0].seconds, 10e-3);
  EXPECT_DOUBLE_EQ(out.compute[1].seconds, 1e-3);
  ASSERT_EQ(out.warnings.size(), 3u);
  EXPECT_TRUE(mentions(out.warnings, "2 measurement(s) left out: matrix ops faster than 1.5x"));
  EXPECT_TRUE(
      mentions(out.warnings, "1 measurement(s) left out: memory-bound ops faster than 10x"));
  EXPECT_TRUE(mentions(out.warnings, "2 measurement(s) left out: a time that is not a positive"));
}

TEST(SampleChecks, CollectivesPastTheLinksOrFarFromTheirShapesAreLeftOut) {
  Samples s;
  const auto ar = spec::CollectiveKind::kAllReduce;
  // 1 MB over 8 ranks: the fastest link is 100 GB/s, so at most 2 x 10 x 100 GB/s = 2 TB/s of
  // algorithm bandwidth passes; 1 MB in 0.1 us is 10 TB/s.
  s.comm.push_back({ar, 8, 1'000'000, 0.1e-6});
  // One rank moves nothing.
  s.comm.push_back({ar, 1, 1'000'000, 20e-6});
  // Five samples of one shape around 20 us and one at 300 us (15x the median): a stall.
  for (double us : {20.0, 21.0, 19.0, 20.5, 300.0}) s.comm.push_back({ar, 8, 2'000'000, us * 1e-6});
  const Samples out = screen_samples(s, cluster());
  ASSERT_EQ(out.comm.size(), 4u);
  for (const CommSample& c : out.comm) EXPECT_LT(c.seconds, 22e-6);
  EXPECT_EQ(out.warnings.size(), 3u);
  EXPECT_TRUE(mentions(out.warnings, "faster than 10x what the fastest link"));
  EXPECT_TRUE(mentions(out.warnings, "fewer than 2 ranks"));
  EXPECT_TRUE(mentions(out.warnings, "more than 10x its shape's median"));
}

TEST(SampleChecks, AProfileOfAnotherKindOfDeviceIsRefused) {
  Samples s;
  s.compute.push_back({spec::OpClass::kGemm, "aten::mm", 1e9, 0, 1e-3});
  s.ran_on["cpu.json"] = spec::DeviceKind::kCpu;
  EXPECT_INPUT_ERROR(screen_samples(s, cluster()), "cpu.json: its ops ran on the CPU");
  spec::ClusterSpec cpu = cluster();
  cpu.device.kind = spec::DeviceKind::kCpu;
  EXPECT_EQ(screen_samples(s, cpu).compute.size(), 1u);
  s.ran_on["cpu.json"] = spec::DeviceKind::kGpu;
  EXPECT_INPUT_ERROR(screen_samples(s, cpu), "cpu.json: its ops ran on a GPU");
}

TEST(SampleChecks, CalibrationSaysWhatItLeftOutAndWhatItCouldNotFit) {
  Samples s;
  // One collective at one size, twice: alpha + beta x n has two unknowns, one equation.
  s.comm.push_back({spec::CollectiveKind::kAllGather, 8, 1 << 20, 30e-6});
  s.comm.push_back({spec::CollectiveKind::kAllGather, 8, 1 << 20, 31e-6});
  s.compute.push_back({spec::OpClass::kGemm, "mm", 2e45, 0, 1e-6});
  const Calibration c = calibrate(cluster(), s, spec::Dtype::kBf16);
  EXPECT_TRUE(c.cluster.collective_fits.empty());
  EXPECT_TRUE(mentions(c.report.warnings, "all_gather on nvlink: measured at one size only"));
  EXPECT_TRUE(mentions(c.report.warnings, "matrix ops faster than"));
  EXPECT_EQ(c.report.compute_samples, 0);
  // Everything left out is an error that says why.
  Samples bad;
  bad.compute.push_back({spec::OpClass::kGemm, "mm", 2e45, 0, 1e-6});
  EXPECT_INPUT_ERROR(calibrate(cluster(), bad, spec::Dtype::kBf16),
                     "no compute ops, collectives or training steps to fit; 1 measurement(s) "
                     "left out: matrix ops");
}

}  // namespace
}  // namespace sextant::traces
