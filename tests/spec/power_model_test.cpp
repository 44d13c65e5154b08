// The power-limited clock: P(f) = idle + dynamic(max) (f / max)^3 solved for the power limit, each
// expected value derived by hand from that closed form (power_model.hpp).
#include "sextant/spec/power_model.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "expect_input_error.hpp"
#include "sextant/spec/cluster_catalog.hpp"

namespace sextant::spec {
namespace {

// A GPU whose bf16 GEMMs hold 1600 MHz at 700 W, idle 100 W, memory-bound work 300 W, boost 2000.
PowerModel example() {
  PowerModel p;
  p.limit_W = 700;
  p.rated_W = 700;
  p.max_clock_MHz = 2000;
  p.idle_W = 100;
  p.memory_bound_W = 300;
  p.tensor_clock_MHz = {{Dtype::kBf16, 1600}, {Dtype::kFp8, 1500}};
  return p;
}

TEST(PowerModel, AtTheRatedLimitTensorWorkRunsAtItsMeasuredClock) {
  const PowerModel p = example();
  EXPECT_NEAR(sustained_clock_MHz(p, Dtype::kBf16, 1.0), 1600, 1e-9);
  EXPECT_NEAR(sustained_clock_MHz(p, Dtype::kFp8, 1.0), 1500, 1e-9);
  // fp16 has no entry: the 16-bit tensor cores' (bf16's) clock.
  EXPECT_NEAR(sustained_clock_MHz(p, Dtype::kFp16, 1.0), 1600, 1e-9);
  EXPECT_NEAR(board_power_W(p, Dtype::kBf16, 1.0, 1600), 700, 1e-9);
}

TEST(PowerModel, ALowerLimitLowersTheClockByTheCubeRoot) {
  PowerModel p = example();
  p.limit_W = 500;
  // Tensor work above idle at 2000 MHz: (700 - 100) (2000 / 1600)^3 = 1171.875 W; at 500 W the
  // clock is 2000 (400 / 1171.875)^(1/3).
  const double expected = 2000 * std::cbrt(400 / 1171.875);
  EXPECT_NEAR(sustained_clock_MHz(p, Dtype::kBf16, 1.0), expected, 1e-9);
  EXPECT_NEAR(expected, 1397.7, 0.1);
}

TEST(PowerModel, MemoryBoundWorkKeepsTheBoostClock) {
  const PowerModel p = example();
  // All memory-bound: 300 W at 2000 MHz, under the limit.
  EXPECT_DOUBLE_EQ(sustained_clock_MHz(p, Dtype::kBf16, 0.0), 2000);
  // Half and half: 0.5 x 1171.875 + 0.5 x 200 = 685.9375 W above idle at 2000 MHz, so the clock
  // is 2000 (600 / 685.9375)^(1/3), between the tensor clock and the boost clock.
  const double half = 2000 * std::cbrt(600 / 685.9375);
  EXPECT_NEAR(sustained_clock_MHz(p, Dtype::kBf16, 0.5), half, 1e-9);
  EXPECT_GT(half, 1600);
  EXPECT_LT(half, 2000);
}

TEST(PowerModel, TheGemmModelClockScalesTheSmClockAsMeasuredUpToTheBoostClock) {
  PowerModel p = example();
  // Without gemm_clock_MHz the GEMM model follows the SM clock.
  EXPECT_DOUBLE_EQ(gemm_model_clock_MHz(p, Dtype::kBf16, 1700), 1700);
  // bf16 GEMMs measured at 1600 MHz ran as the GEMM model does at 1760: ratio 1.1. At an SM clock
  // of 1700 the GEMM model runs at 1870; at 1900, 2090 is above the 2000 MHz boost clock.
  p.gemm_clock_MHz = {{Dtype::kBf16, 1760}};
  EXPECT_NEAR(gemm_model_clock_MHz(p, Dtype::kBf16, 1600), 1760, 1e-9);
  EXPECT_NEAR(gemm_model_clock_MHz(p, Dtype::kBf16, 1700), 1870, 1e-9);
  EXPECT_DOUBLE_EQ(gemm_model_clock_MHz(p, Dtype::kBf16, 1900), 2000);
  // fp8 has no GEMM clock of its own: bf16's ratio, 1.1 x 1500.
  EXPECT_NEAR(gemm_model_clock_MHz(p, Dtype::kFp8, 1500), 1650, 1e-9);
  // With its own: fp8 GEMMs at 1500 MHz ran as the model does at 1575 (ratio 1.05).
  p.gemm_clock_MHz[Dtype::kFp8] = 1575;
  EXPECT_NEAR(gemm_model_clock_MHz(p, Dtype::kFp8, 1600), 1680, 1e-9);
}

TEST(PowerModel, ALockedClockIsTheClock) {
  PowerModel p = example();
  p.locked_clock_MHz = 1830;
  EXPECT_DOUBLE_EQ(sustained_clock_MHz(p, Dtype::kBf16, 1.0), 1830);
  EXPECT_DOUBLE_EQ(sustained_clock_MHz(p, Dtype::kBf16, 0.0), 1830);
}

TEST(PowerModel, TheShippedH100HoldsLessThanItsBoostUnderGemms) {
  const ClusterSpec c = builtin_cluster("dgx-h100");
  ASSERT_TRUE(c.device.power);
  const PowerModel& p = *c.device.power;
  // Sustained 700 W tensor work runs below the 1830 MHz of the datasheet peak, fp8 below bf16.
  EXPECT_LT(sustained_clock_MHz(p, Dtype::kBf16, 1.0), 1830);
  EXPECT_LE(sustained_clock_MHz(p, Dtype::kFp8, 1.0), sustained_clock_MHz(p, Dtype::kBf16, 1.0));
  // A 500 W site cap (Meta's H100s, published.md T16) lowers it further.
  PowerModel capped = p;
  capped.limit_W = 500;
  EXPECT_LT(sustained_clock_MHz(capped, Dtype::kBf16, 1.0),
            sustained_clock_MHz(p, Dtype::kBf16, 1.0));
}

TEST(PowerModel, GrandTetonIsADgxH100At500WithHbm2e) {
  // TorchTitan's published H100 hosts (benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md): the
  // same GH100 tensor cores and power curve under a 500 W limit, 2.4 TB/s of 96 GiB HBM2e. By the
  // closed form, tensor work alone: 1980 (355 / ((700 - 145) (1980 / 1451)^3))^(1/3) MHz, against
  // 1451 MHz at 700 W.
  const ClusterSpec teton = builtin_cluster("grand-teton-h100");
  const ClusterSpec dgx = builtin_cluster("dgx-h100");
  ASSERT_TRUE(teton.device.power);
  EXPECT_EQ(teton.device.power->limit_W, 500);
  const double expected = 1980 * std::cbrt(355 / (555 * std::pow(1980.0 / 1451, 3)));
  EXPECT_NEAR(sustained_clock_MHz(*teton.device.power, Dtype::kBf16, 1.0), expected, 1e-9);
  EXPECT_NEAR(expected, 1250.2, 0.1);
  EXPECT_NEAR(sustained_clock_MHz(*dgx.device.power, Dtype::kBf16, 1.0), 1451, 1e-9);
  EXPECT_EQ(teton.device.memory_bandwidth_GBps, 2400);
  EXPECT_EQ(teton.device.memory_capacity_bytes, 96LL << 30);
  EXPECT_EQ(teton.device.peak_flops(Dtype::kBf16), dgx.device.peak_flops(Dtype::kBf16));
  // Load-bound kernel families keep the H100's absolute rate: 2.08 TB/s of mixed-dtype copies.
  EXPECT_NEAR(
      teton.device.memory_efficiency_for(OpClass::kElementwise, MemoryKernel::kMixedDtype) * 2400,
      2088, 1);
}

Json power_cluster_with(const std::function<void(Json&)>& edit) {
  Json j = to_json(builtin_cluster("dgx-h100"));
  edit(j);
  return j;
}

TEST(PowerModel, BadPowerObjectsAreRefused) {
  auto read = [](const Json& j) { return cluster_from_json(j, "c.json"); };
  EXPECT_INPUT_ERROR(
      read(power_cluster_with([](Json& j) { j["device"]["power"]["limit_W"] = 100; })),
      "/device/power/limit_W");
  EXPECT_INPUT_ERROR(
      read(power_cluster_with([](Json& j) { j["device"]["power"]["limit_W"] = 100; })),
      "must be > idle_W");
  EXPECT_INPUT_ERROR(read(power_cluster_with(
                         [](Json& j) { j["device"]["power"]["tensor_clock_MHz"].erase("bf16"); })),
                     "bf16 tensor-core clock");
  EXPECT_INPUT_ERROR(read(power_cluster_with(
                         [](Json& j) { j["device"]["power"]["tensor_clock_MHz"]["fp8"] = 2500; })),
                     "must be <= max_clock_MHz");
  EXPECT_INPUT_ERROR(read(power_cluster_with(
                         [](Json& j) { j["device"]["power"]["gemm_clock_MHz"].erase("bf16"); })),
                     "bf16 GEMM model clock");
  EXPECT_INPUT_ERROR(
      read(power_cluster_with([](Json& j) { j["device"]["power"]["gemm_clock_MHz"]["fp8"] = -1; })),
      "/device/power/gemm_clock_MHz/fp8");
  EXPECT_INPUT_ERROR(
      read(power_cluster_with([](Json& j) { j["device"]["power"]["limit_W"] = "700"; })),
      "/device/power/limit_W");
  // One clock model at a time: a fixed GEMM clock beside a power object is refused, and a GEMM
  // model with neither is too.
  EXPECT_INPUT_ERROR(
      read(power_cluster_with([](Json& j) { j["device"]["gemm_model"]["clock_MHz"] = 1830; })),
      "the power model decides the clock");
  EXPECT_INPUT_ERROR(read(power_cluster_with([](Json& j) { j["device"].erase("power"); })),
                     "is required when the device has no power object");
}

TEST(PowerModel, RoundTripsThroughJson) {
  const ClusterSpec c = builtin_cluster("dgx-h100");
  const ClusterSpec again = cluster_from_json(to_json(c), "again.json");
  ASSERT_TRUE(again.device.power);
  EXPECT_EQ(again.device.power->tensor_clock_MHz, c.device.power->tensor_clock_MHz);
  EXPECT_EQ(again.device.power->gemm_clock_MHz, c.device.power->gemm_clock_MHz);
  EXPECT_FALSE(again.device.power->gemm_clock_MHz.empty());
  EXPECT_EQ(again.device.power->limit_W, c.device.power->limit_W);
}

}  // namespace
}  // namespace sextant::spec
