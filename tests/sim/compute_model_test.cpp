// The compute model's kernels: GEMM tiles and waves over the SMs (NVIDIA, "Matrix Multiplication
// Background User's Guide" §3), split-K, the sustained clock, an fp8 recipe, and fused attention
// from published throughput curves. Expected times are worked out by hand in each test.
#include "sextant/sim/compute_model.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include "expect_input_error.hpp"
#include "sextant/models/zoo.hpp"
#include "sextant/sim/step_setup.hpp"
#include "sextant/spec/cluster_catalog.hpp"
#include "test_clusters.hpp"
#include "test_models.hpp"

namespace sextant::sim {
namespace {

// Two SMs, one 64x64 tile, half of a 2 TFLOP/s peak in the main loop: each SM computes
// 1e12 * 0.5 = 5e11 FLOP/s; no fill, no kernel or launch overhead, free memory traffic.
spec::DeviceSpec tiny_gpu(double clock_ratio = 1.0, int64_t max_split_k = 1) {
  spec::DeviceSpec d = test::ideal_cluster().device;
  d.peak_tflops[spec::Dtype::kBf16] = 2;
  d.peak_tflops[spec::Dtype::kFp8] = 4;
  d.memory_bandwidth_GBps = 1e12;
  spec::GemmModel g;
  g.sms = 2;
  g.peak_clock_MHz = 1000;
  g.clock_MHz = 1000 * clock_ratio;
  g.mainloop_efficiency = 0.5;
  g.tile_overhead_k = 0;
  g.kernel_overhead_us = 0;
  g.tiles = {{64, 64}};
  g.max_split_k = max_split_k;
  d.gemm_model = g;
  return d;
}

// A dense linear of a block (an fp8 recipe quantizes it) unless `id` says otherwise.
models::Op gemm_op(int64_t m, int64_t n, int64_t k, models::OpId id = models::OpId::kMlpFc1) {
  models::Op op;
  op.id = id;
  op.name = "g";
  op.op_class = spec::OpClass::kGemm;
  op.flops = 2.0 * static_cast<double>(m * n * k);
  op.matmuls = {{1, m, n, k}};
  return op;
}

TEST(GemmModel, WavesOfTilesOverTheSms) {
  spec::DeviceSpec d = tiny_gpu();
  ComputeModel c(d, spec::Dtype::kBf16);
  // 128 x 128 = 4 tiles on 2 SMs: 2 waves of one 64x64x1000 tile, 2*64*64*1000 / 5e11 s each.
  const double tile = 2.0 * 64 * 64 * 1000 / 5e11;
  EXPECT_NEAR(c.matmul_seconds({1, 128, 128, 1000}), 2 * tile, 1e-15);
  // Tile quantization: 130 rows need a third row of tiles, 6 tiles, 3 waves.
  EXPECT_NEAR(c.matmul_seconds({1, 130, 128, 1000}), 3 * tile, 1e-15);
  // Wave quantization: 5 tiles take 3 waves like 6.
  EXPECT_NEAR(c.matmul_seconds({1, 64, 320, 1000}), 3 * tile, 1e-15);
  // A batch of 4 single-tile products: 2 waves.
  EXPECT_NEAR(c.matmul_seconds({4, 64, 64, 1000}), 2 * tile, 1e-15);
  // The op's time is its products' time (memory and launches are free here).
  EXPECT_NEAR(ps_to_seconds(c.op_time(gemm_op(128, 128, 1000))), 2 * tile, 1e-12);
}

TEST(GemmModel, MisalignedShapesTakeTheSlowKernels) {
  spec::DeviceSpec d = tiny_gpu();
  d.gemm_model->misaligned_efficiency = 0.25;
  ComputeModel c(d, spec::Dtype::kBf16);
  const double tile = 2.0 * 64 * 64 * 1000 / 5e11;
  // Every dimension a multiple of 8 bf16 elements (16 bytes): the aligned model, 2 waves.
  EXPECT_NEAR(c.matmul_seconds({1, 128, 128, 1000}), 2 * tile, 1e-15);
  // K = 1001 or N = 132 off the grid: the same tiles and waves at a quarter of the rate.
  EXPECT_NEAR(c.matmul_seconds({1, 128, 128, 1001}), 2 * tile * 1001 / 1000 / 0.25, 1e-15);
  // M = 130 rows is no operand's leading dimension: tile quantization alone, 3 waves.
  EXPECT_NEAR(c.matmul_seconds({1, 130, 128, 1000}), 3 * tile, 1e-15);
  EXPECT_NEAR(c.matmul_seconds({1, 64, 132, 1000}), c.matmul_seconds({1, 64, 136, 1000}) / 0.25,
              1e-15);
}

TEST(GemmModel, SustainedClockAndTileOverhead) {
  // At half the datasheet clock every tile takes twice as long.
  spec::DeviceSpec slow = tiny_gpu(0.5);
  ComputeModel c(slow, spec::Dtype::kBf16);
  const double tile = 2.0 * 64 * 64 * 1000 / 5e11;
  EXPECT_NEAR(c.matmul_seconds({1, 64, 64, 1000}), 2 * tile, 1e-15);
  // A fill of 24 K elements and a 3 us kernel overhead: 64x64x(1000 + 24) per tile, plus 3 us.
  spec::DeviceSpec d = tiny_gpu();
  d.gemm_model->tile_overhead_k = 24;
  d.gemm_model->kernel_overhead_us = 3;
  ComputeModel o(d, spec::Dtype::kBf16);
  EXPECT_NEAR(o.matmul_seconds({1, 64, 64, 1000}), 2.0 * 64 * 64 * 1024 / 5e11 + 3e-6, 1e-15);
}

TEST(GemmModel, SplitKFillsIdleSms) {
  // One 64x64 tile with K = 1024 leaves an SM idle; split in two, each SM streams K = 512 and the
  // fp32 partial outputs (64*64 values, written and read twice: 8 bytes each per split) and the
  // 2-byte result cross memory at the device's bandwidth (1e12 GB/s here: ~free).
  spec::DeviceSpec d = tiny_gpu(1.0, 4);
  ComputeModel c(d, spec::Dtype::kBf16);
  const double half = 2.0 * 64 * 64 * 512 / 5e11;
  const double reduce = 64.0 * 64 * (8 * 2 + 2) / (1e12 * 1e9);
  EXPECT_NEAR(c.matmul_seconds({1, 64, 64, 1024}), half + reduce, 1e-15);
  // Splits leave at least 128 of K per block: K = 200 is not split.
  EXPECT_NEAR(c.matmul_seconds({1, 64, 64, 200}), 2.0 * 64 * 64 * 200 / 5e11, 1e-15);
}

TEST(GemmModel, BackwardRunsDataAndWeightGradients) {
  // Y[m,n] = X[m,k] W[k,n]; backward: dX (m, k, n) and dW (k, n, m).
  spec::DeviceSpec d = tiny_gpu();
  ComputeModel c(d, spec::Dtype::kBf16);
  models::Op fwd = gemm_op(128, 64, 192);
  models::Op bwd = fwd;
  bwd.flops *= 2;
  bwd.matmuls = {{1, 128, 192, 64}, {1, 192, 64, 128}};
  // dX: 2 x 3 = 6 tiles, 3 waves of K = 64; dW: 3 x 1 = 3 tiles, 2 waves of K = 128.
  const double expected = 3 * 2.0 * 64 * 64 * 64 / 5e11 + 2 * 2.0 * 64 * 64 * 128 / 5e11;
  EXPECT_NEAR(ps_to_seconds(c.op_time(bwd, spec::Phase::kBwd)), expected, 1e-12);
}

TEST(GemmModel, Fp8RecipeRunsGemmsAtTheFp8Peak) {
  spec::DeviceSpec d = tiny_gpu();
  ComputeModel bf16(d, spec::Dtype::kBf16);
  ComputeModel fp8(d, spec::Dtype::kBf16, spec::AttentionKernel::kUnfused, spec::Dtype::kFp8);
  EXPECT_NEAR(fp8.matmul_seconds({1, 128, 128, 1000}), bf16.matmul_seconds({1, 128, 128, 1000}) / 2,
              1e-15);
}

TEST(GemmModel, Fp8TileOverheadIsTheSixteenBitFillInTime) {
  // A fill of 24 16-bit K elements takes the time of 48 fp8 ones at twice the rate: with the fp8
  // peak of 4 TFLOP/s over 2 SMs at 0.5 an SM computes 1e12 FLOP/s, a 64x64 tile over K = 1000
  // takes 2 x 64 x 64 x (1000 + 48) / 1e12 s.
  spec::DeviceSpec d = tiny_gpu();
  d.gemm_model->tile_overhead_k = 24;
  ComputeModel fp8(d, spec::Dtype::kBf16, spec::AttentionKernel::kUnfused, spec::Dtype::kFp8);
  EXPECT_NEAR(fp8.matmul_seconds({1, 64, 64, 1000}), 2.0 * 64 * 64 * 1048 / 1e12, 1e-15);
}

TEST(GemmModel, BackwardFp8GemmsAccumulateAtTheSplitAccumulatorRate) {
  // Transformer Engine's dgrad and wgrad accumulate in full precision: at an efficiency of 0.5
  // the same products take twice the forward's time in backward; bf16 GEMMs are unaffected.
  spec::DeviceSpec d = tiny_gpu();
  d.gemm_model->fp8_split_accumulator_efficiency = 0.5;
  ComputeModel fp8(d, spec::Dtype::kBf16, spec::AttentionKernel::kUnfused, spec::Dtype::kFp8);
  const models::Op op = gemm_op(128, 128, 1000);
  const double forward = ps_to_seconds(fp8.op_time(op, spec::Phase::kFwd));
  EXPECT_NEAR(forward, fp8.matmul_seconds({1, 128, 128, 1000}), 1e-12);
  EXPECT_NEAR(ps_to_seconds(fp8.op_time(op, spec::Phase::kBwd)), 2 * forward, 1e-12);
  ComputeModel bf16(d, spec::Dtype::kBf16);
  EXPECT_EQ(bf16.op_time(op, spec::Phase::kBwd), bf16.op_time(op, spec::Phase::kFwd));
}

TEST(GemmModel, AnFp8RecipeLeavesTheLogitsAndRouterInSixteenBits) {
  // Megatron-Core's output layer runs outside Transformer Engine's fp8 context and TorchTitan's
  // float8 converter skips it; the MoE router is no TE module. At the tiny GPU's 2 TFLOP/s bf16
  // peak (5e11 FLOP/s an SM) a 128 x 128 x 1000 product is 2 waves of 2 x 64 x 64 x 1000 / 5e11 s
  // in both passes (no full-precision accumulation penalty); the dense linear beside it runs at
  // the 4 TFLOP/s fp8 peak, half that forward.
  spec::DeviceSpec d = tiny_gpu();
  d.gemm_model->fp8_split_accumulator_efficiency = 0.5;
  ComputeModel fp8(d, spec::Dtype::kBf16, spec::AttentionKernel::kUnfused, spec::Dtype::kFp8);
  const double sixteen_bit = 2 * 2.0 * 64 * 64 * 1000 / 5e11;
  for (models::OpId id : {models::OpId::kHeadLogits, models::OpId::kMoeRouter}) {
    const models::Op op = gemm_op(128, 128, 1000, id);
    EXPECT_NEAR(ps_to_seconds(fp8.op_time(op, spec::Phase::kFwd)), sixteen_bit, 1e-12);
    EXPECT_NEAR(ps_to_seconds(fp8.op_time(op, spec::Phase::kBwd)), sixteen_bit, 1e-12);
  }
  const models::Op linear = gemm_op(128, 128, 1000, models::OpId::kAttnQkv);
  EXPECT_NEAR(ps_to_seconds(fp8.op_time(linear, spec::Phase::kFwd)), sixteen_bit / 2, 1e-12);
}

TEST(PowerClock, AStepRunsItsGemmsAtThePowerLimitsClock) {
  // dgx-h100's power model: a GEMM-heavy step (Llama-2 7B) runs below the 1830 MHz of the
  // datasheet peak and above the clock of back-to-back GEMMs; a 500 W cap lowers it, and the
  // step's GEMMs slow by the clock ratio (tile time is inverse in the clock).
  const spec::ModelSpec model = models::zoo_model("llama2-7b");
  spec::ClusterSpec cluster = spec::builtin_cluster("dgx-h100");
  const spec::Plan plan = test::make_plan(1, 1, 1, 1, 1);
  const StepSetup setup = step_setup(model, cluster, plan);
  const models::LoweredModel lowered = models::lower(model, setup.lowering);
  const ComputeModel at700 = make_compute_model(cluster, setup, lowered);
  const spec::PowerModel& power = *cluster.device.power;
  // The SM clock is the power model's for the step's own tensor share at that clock; the GEMM
  // model runs at its clock for that SM clock.
  const double sm_clock =
      spec::sustained_clock_MHz(power, spec::Dtype::kBf16, tensor_share(lowered, at700));
  EXPECT_LT(sm_clock, power.max_clock_MHz);
  EXPECT_GT(sm_clock, power.tensor_clock_MHz.at(spec::Dtype::kBf16));
  EXPECT_NEAR(at700.clock_MHz(), spec::gemm_model_clock_MHz(power, spec::Dtype::kBf16, sm_clock),
              0.01 * at700.clock_MHz());
  cluster.device.power->limit_W = 500;
  const ComputeModel at500 = make_compute_model(cluster, setup, lowered);
  EXPECT_LT(at500.clock_MHz(), at700.clock_MHz());
  const models::MatmulShape fc1{1, 4096, 22016, 4096};
  const double tile_time_ratio = at700.clock_MHz() / at500.clock_MHz();
  EXPECT_NEAR(at500.matmul_seconds(fc1) / at700.matmul_seconds(fc1), tile_time_ratio, 0.01);
}

// A kernel with d64 and d128 curves// A kernel with d64 and d128 curves: non-causal forward and
// backward, causal backward only.
spec::DeviceSpec attention_gpu() {
  spec::DeviceSpec d = tiny_gpu();
  spec::AttentionKernelData flash;
  flash.curves = {
      {64, false, "fwd", {1000, 4000}, {100, 200}},  {128, false, "fwd", {1000, 4000}, {200, 400}},
      {64, false, "bwd", {1000, 4000}, {80, 160}},   {64, true, "bwd", {1000, 4000}, {40, 80}},
      {128, false, "bwd", {1000, 4000}, {160, 320}}, {128, true, "bwd", {1000, 4000}, {80, 160}}};
  flash.source = "test";
  d.attention_kernels[spec::AttentionKernel::kFlash2] = flash;
  spec::AttentionKernelData sdpa;
  sdpa.same_as = spec::AttentionKernel::kFlash2;
  d.attention_kernels[spec::AttentionKernel::kSdpa] = sdpa;
  return d;
}

TEST(AttentionKernels, PublishedCurvesInterpolated) {
  spec::DeviceSpec d = attention_gpu();
  auto at = [&](spec::AttentionKernel k, int64_t hd, int64_t s, bool causal, bool bwd) {
    return spec::attention_tflops(d.attention_kernels, d.name, k, hd, s, causal, bwd);
  };
  const auto flash = spec::AttentionKernel::kFlash2;
  // Linear in log(seq): 2000 is halfway between 1000 and 4000.
  EXPECT_NEAR(at(flash, 64, 2000, false, false), 150, 1e-9);
  // Linear in head_dim: 96 is halfway between 64 (150) and 128 (300).
  EXPECT_NEAR(at(flash, 96, 2000, false, false), 225, 1e-9);
  // Clamped outside the published range.
  EXPECT_NEAR(at(flash, 256, 16000, false, false), 400, 1e-9);
  // No causal forward curve: the backward's causal/non-causal ratio (1/2) applies.
  EXPECT_NEAR(at(flash, 64, 2000, true, false), 75, 1e-9);
  // sdpa runs the flash kernel on this device.
  EXPECT_NEAR(at(spec::AttentionKernel::kSdpa, 64, 1000, false, true), 80, 1e-9);
  EXPECT_INPUT_ERROR(at(spec::AttentionKernel::kFlash3, 64, 1000, false, false),
                     "no throughput data for this attention kernel");
}

// A causal fused attention core over 8 heads x 1000 x 1000 scores, d = 64.
models::Op causal_core() {
  models::Op op;
  op.name = "attn.core";
  op.op_class = spec::OpClass::kAttention;
  op.fused_attention = true;
  op.causal = true;
  op.shape = {8, 1000, 1000, 64};
  op.flops = 4.0 * 8 * 1000 * 1000 * 64;  // the MFU convention
  op.kernel_flops = op.flops / 2;         // the causal kernel skips the masked half
  return op;
}

TEST(AttentionKernels, FusedOpTimeIsItsExecutedFlopsOverThePublishedRate) {
  spec::DeviceSpec d = attention_gpu();
  ComputeModel c(d, spec::Dtype::kBf16, spec::AttentionKernel::kFlash2);
  const models::Op op = causal_core();
  // Causal forward at s = 1000, d = 64: 100 * (40 / 80) = 50 TFLOP/s.
  EXPECT_NEAR(ps_to_seconds(c.op_time(op, spec::Phase::kFwd)), op.kernel_flops / 50e12, 1e-12);
}

TEST(AttentionKernels, DropoutAddsItsCostPerScoreElement) {
  // 1000 ps a score forward, 500 backward; 8 heads x 1000 x 1000 scores, half under the causal
  // mask: 4e6 x 1000 ps = 4 ms forward, 2 ms backward on top of the kernel's FLOPs.
  spec::DeviceSpec d = attention_gpu();
  d.attention_kernels[spec::AttentionKernel::kFlash2].dropout =
      spec::AttentionDropoutCost{1000, 500};
  ComputeModel c(d, spec::Dtype::kBf16, spec::AttentionKernel::kFlash2);
  models::Op op = causal_core();
  const double plain_fwd = c.attention_seconds(op, false),
               plain_bwd = c.attention_seconds(op, true);
  op.dropout = true;
  EXPECT_NEAR(c.attention_seconds(op, false) - plain_fwd, 4e-3, 1e-12);
  EXPECT_NEAR(c.attention_seconds(op, true) - plain_bwd, 2e-3, 1e-12);
  // Curves and dropout cost measured at 1000 MHz: at a clock of 500 MHz both take twice as long.
  d.attention_kernels[spec::AttentionKernel::kFlash2].clock_MHz = 1000;
  ComputeModel half(d, spec::Dtype::kBf16, spec::AttentionKernel::kFlash2, std::nullopt, 500.0);
  EXPECT_NEAR(half.attention_seconds(op, false), 2 * (plain_fwd + 4e-3), 1e-12);
}

TEST(MemoryKernels, EachKernelFamilyMovesItsBytesAtItsOwnBandwidth) {
  // 1000 GB/s at 0.8 for elementwise ops; eager families: native norms 0.5, mixed-dtype 0.4; a
  // block draws 10 GB/s. No launch overhead.
  spec::DeviceSpec d = test::ideal_cluster().device;
  d.memory_bandwidth_GBps = 1000;
  d.memory_efficiency = 0.8;
  d.launch_overhead_us = 0;
  d.memory_efficiency_by_kernel = {{spec::MemoryKernel::kNativeNorm, 0.5},
                                   {spec::MemoryKernel::kMixedDtype, 0.4}};
  d.block_bandwidth_GBps = 10;
  ComputeModel c(d, spec::Dtype::kBf16);
  models::Op op;
  op.op_class = spec::OpClass::kElementwise;
  op.bytes = 800'000'000;
  // Generic: 0.8e9 B at 800 GB/s = 1 ms.
  EXPECT_NEAR(ps_to_seconds(c.op_time(op)), 1e-3, 1e-12);
  // Half of it mixed-dtype: 0.4e9 at 800 GB/s + 0.4e9 at 400 GB/s = 0.5 + 1 ms.
  op.mixed_dtype_bytes = 400'000'000;
  EXPECT_NEAR(ps_to_seconds(c.op_time(op)), 1.5e-3, 1e-12);
  // A native norm of 0.8e9 B, a quarter in a kernel of 24 blocks (240 GB/s < 500 GB/s):
  // 0.6e9 / 500e9 + 0.2e9 / 240e9 = 1.2 + 0.8333 ms.
  models::Op norm;
  norm.op_class = spec::OpClass::kNorm;
  norm.memory_kernel = spec::MemoryKernel::kNativeNorm;
  norm.bytes = 800'000'000;
  norm.narrow_bytes = 200'000'000;
  norm.narrow_blocks = 24;
  EXPECT_NEAR(ps_to_seconds(c.op_time(norm)), 1.2e-3 + 0.2 / 240.0, 1e-12);
  // 64 blocks draw 640 GB/s, more than the family's 500: the family's rate caps them.
  norm.narrow_blocks = 64;
  EXPECT_NEAR(ps_to_seconds(c.op_time(norm)), 1.6e-3, 1e-12);
  // A device without the families prices everything at its class's efficiency.
  d.memory_efficiency_by_kernel.clear();
  d.block_bandwidth_GBps = 0;
  ComputeModel plain(d, spec::Dtype::kBf16);
  EXPECT_NEAR(ps_to_seconds(plain.op_time(norm)), 1e-3, 1e-12);
}

// Devices that slow each other (DeviceSpec::co_run): a plan of two ranks on a node of two runs
// every GEMM 1.5x and every memory-bound op 1.25x as long as one rank alone; one rank is alone.
TEST(CoRun, APlansBusyDevicesSlowItsOps) {
  const spec::ModelSpec model = models::zoo_model("gpt-tiny");
  spec::ClusterSpec cluster = spec::builtin_cluster("local-cpu");
  cluster.device.launch_overhead_us = 0;  // the slowdown is of the work, not of the call
  const models::Op gemm = gemm_op(512, 384, 128);
  models::Op add;
  add.name = "a";
  add.op_class = spec::OpClass::kElementwise;
  add.bytes = 3 << 18;
  auto times = [&](int64_t dp) {
    const StepSetup setup = step_setup(model, cluster, test::make_plan(dp, 1, 1, 4, 16));
    const ComputeModel m = make_compute_model(cluster, setup, models::lower(model, setup.lowering));
    return std::pair{ps_to_seconds(m.op_time(gemm)), ps_to_seconds(m.op_time(add))};
  };
  const auto [gemm_alone, add_alone] = times(2);  // no co_run in the file: two ranks as one
  cluster.device.co_run = spec::CoRunSlowdown{2, 1.5, 1.25, "test"};
  const auto [gemm_one, add_one] = times(1);
  const auto [gemm_two, add_two] = times(2);
  EXPECT_DOUBLE_EQ(gemm_one, gemm_alone);
  EXPECT_DOUBLE_EQ(add_one, add_alone);
  // (op_time counts whole picoseconds.)
  EXPECT_NEAR(gemm_two, 1.5 * gemm_alone, 2e-12);
  EXPECT_NEAR(add_two, 1.25 * add_alone, 2e-12);
  // The calibrated-efficiency path (ComputeModel::seconds) is slowed alike.
  ComputeModel two(cluster.device, spec::Dtype::kFp32);
  const double alone = two.seconds(gemm.flops, 0, spec::OpClass::kGemm);
  two.set_busy_devices(2);
  EXPECT_NEAR(two.seconds(gemm.flops, 0, spec::OpClass::kGemm), 1.5 * alone, 1e-12 * alone);
}

}  // namespace
}  // namespace sextant::sim
