// Full recompute of only the first N blocks of each pipeline chunk (Megatron-LM --recompute-method
// block --recompute-num-layers N): the simulator charges exactly those blocks' forward again and
// keeps the other blocks' activations, derived here from one block's figures.
#include <gtest/gtest.h>

#include "sextant/models/counts.hpp"
#include "sextant/models/lowering.hpp"
#include "sextant/models/zoo.hpp"
#include "sextant/sim/memory_model.hpp"
#include "sextant/sim/simulator.hpp"
#include "sextant/spec/cluster_catalog.hpp"
#include "test_models.hpp"

namespace sextant::sim {
namespace {

// GPT-3 1.3B: 24 blocks on 2 pipeline stages, 12 per chunk; N = 4 recomputed in each.
constexpr int64_t kChunkBlocks = 12, kRecomputed = 4;

spec::Plan plan_with(spec::Recompute r, int64_t layers) {
  spec::Plan p = test::make_plan(1, 1, 2, 2, 16);
  p.recompute = r;
  p.recompute_layers = layers;
  return p;
}

TEST(PartialRecompute, HardwareFlopsCountTheRecomputedBlocksOnly) {
  const spec::ModelSpec model = models::zoo_model("gpt3-1.3b");
  const int64_t seq = model.transformer().seq_len;
  const models::StepFlops none =
      models::step_flops(model, plan_with(spec::Recompute::kNone, 0), seq);
  const models::StepFlops full =
      models::step_flops(model, plan_with(spec::Recompute::kFull, 0), seq);
  const models::StepFlops some =
      models::step_flops(model, plan_with(spec::Recompute::kFull, kRecomputed), seq);
  // Every block does the same work, so N of each chunk's 12 blocks repeat N/12 of what full
  // recompute repeats; the model FLOPs (MFU's) do not change.
  EXPECT_DOUBLE_EQ(some.model, none.model);
  EXPECT_NEAR(some.hardware - none.hardware,
              (full.hardware - none.hardware) * kRecomputed / kChunkBlocks, 1e-9 * full.hardware);
}

TEST(PartialRecompute, TheOtherBlocksKeepTheirActivations) {
  const spec::ModelSpec model = models::zoo_model("gpt3-1.3b");
  const models::LoweredModel lowered = models::lower(model, {2, 0, spec::Dtype::kBf16, 1, false});
  const models::Layer& block = lowered.layers[lowered.split_begin];
  for (int64_t stage : {0, 1}) {
    const StageFootprint full =
        stage_footprint(plan_with(spec::Recompute::kFull, 0), lowered, stage);
    const StageFootprint some =
        stage_footprint(plan_with(spec::Recompute::kFull, kRecomputed), lowered, stage);
    // 12 - 4 blocks keep everything instead of only their input.
    EXPECT_EQ(some.chunk_activation[0] - full.chunk_activation[0],
              (kChunkBlocks - kRecomputed) * (block.saved_bytes - block.saved_bytes_full));
  }
}

// A recompute policy only drops activations, so it never raises the activation peak: while a
// recomputed layer's backward runs, what it brings back is what it dropped (saved - kept), on top
// of what every layer kept. Under a fused attention kernel selective recompute drops nothing
// (Korthikanti et al.'s selective recompute targets the s^2 attention tensors a flash kernel
// never stores), so it costs no memory either; TorchTitan's per-op policy keeps a subset of what
// no recompute keeps. Every zoo transformer, fused and unfused.
TEST(PartialRecompute, NoRecomputePolicyRaisesActivationMemory) {
  for (const std::string& name : models::zoo_names()) {
    const spec::ModelSpec model = models::zoo_model(name);
    if (!model.is_transformer()) continue;
    for (spec::AttentionKernel attention :
         {spec::AttentionKernel::kUnfused, spec::AttentionKernel::kFlash2}) {
      models::LoweringOptions o;
      o.micro_batch = 1;
      o.seq_len = std::min<int64_t>(model.transformer().seq_len, 2048);
      o.attention = attention;
      // TorchTitan's per-op policy where a fused kernel runs (the SDPA it saves), Megatron's
      // elsewhere.
      if (attention == spec::AttentionKernel::kFlash2)
        o.selective = spec::SelectiveRecompute::kSaveMatmuls;
      const models::LoweredModel lowered = models::lower(model, o);
      auto activations = [&](spec::Recompute r, int64_t layers) {
        spec::Plan p = test::make_plan(1, 1, 1, 1, 1);
        p.recompute = r;
        p.recompute_layers = layers;
        return stage_memory(p, *p.stack, lowered, 0).activations;
      };
      const int64_t none = activations(spec::Recompute::kNone, 0);
      SCOPED_TRACE(name + (attention == spec::AttentionKernel::kFlash2 ? " flash2" : " unfused"));
      EXPECT_LE(activations(spec::Recompute::kSelective, 0), none);
      EXPECT_LE(activations(spec::Recompute::kFull, 0), none);
      EXPECT_LE(activations(spec::Recompute::kFull, 1), none);
      // One micro-batch, one stage, full recompute: what every layer keeps under its mode (a
      // block its input, the embedding and head everything) plus the largest dropped part.
      spec::Plan full = test::make_plan(1, 1, 1, 1, 1);
      full.recompute = spec::Recompute::kFull;
      const std::vector<spec::Recompute> modes = models::layer_recompute(full, lowered);
      int64_t kept = 0, dropped = 0;
      for (size_t l = 0; l < lowered.layers.size(); ++l) {
        const models::Layer& layer = lowered.layers[l];
        const int64_t k = layer.saved_bytes_for(modes[l]);
        kept += k;
        dropped = std::max(dropped, layer.saved_bytes - k);
      }
      EXPECT_EQ(activations(spec::Recompute::kFull, 0), kept + dropped);
    }
  }
}

TEST(PartialRecompute, TheSimulatedStepRecomputesThoseBlocks) {
  const spec::ModelSpec model = models::zoo_model("gpt3-1.3b");
  const spec::ClusterSpec cluster = spec::builtin_cluster("dgx-a100");
  SimulationOptions options;
  options.trace = true;
  const SimulationResult none =
      simulate(model, cluster, plan_with(spec::Recompute::kNone, 0), options);
  const SimulationResult full =
      simulate(model, cluster, plan_with(spec::Recompute::kFull, 0), options);
  const spec::Plan plan = plan_with(spec::Recompute::kFull, kRecomputed);
  const SimulationResult some = simulate(model, cluster, plan, options);
  // The recompute phase's FLOPs in the trace: N/12 of full recompute's.
  auto recomputed = [](const SimulationResult& r) {
    double flops = 0;
    for (const spec::TraceEvent& e : r.trace->events)
      if (e.phase == spec::Phase::kRecompute) flops += e.flops;
    return flops;
  };
  EXPECT_EQ(recomputed(none), 0);
  EXPECT_NEAR(recomputed(some), recomputed(full) * kRecomputed / kChunkBlocks,
              1e-9 * recomputed(full));
  EXPECT_LT(none.report.step_time_s, some.report.step_time_s);
  EXPECT_LT(some.report.step_time_s, full.report.step_time_s);
  EXPECT_LT(full.report.memory.peak_bytes, some.report.memory.peak_bytes);
  EXPECT_LT(some.report.memory.peak_bytes, none.report.memory.peak_bytes);
  EXPECT_NE(some.report.plan.find(".rc-full4"), std::string::npos) << some.report.plan;
}

}  // namespace
}  // namespace sextant::sim
