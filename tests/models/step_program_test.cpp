// The order of a stage's step (models/step_program.hpp): passes and their transfers derived by
// hand from the schedules' definitions, and where a layer's gradients go under each layout.
#include "sextant/models/step_program.hpp"

#include <gtest/gtest.h>

#include "../support/layout_suite.hpp"

namespace sextant::models {
namespace {

using spec::Schedule;

spec::Plan plan(int64_t dp, int64_t pp, int zero = 0, Schedule schedule = Schedule::k1F1B) {
  return layout_suite::plan_of(dp, 1, pp, zero, false, schedule);
}

TEST(StepProgram, OneF1BStagesReceiveAndSendOnTheirInnerSides) {
  // 1F1B over 4 stages, 8 micro-batches a replica (the suite's 8 sequences): every stage runs
  // each micro-batch forward and backward once, 16 passes. The first stage reads the tokens (no
  // forward receive, no backward send), the last computes the loss (no forward send, no
  // backward receive); the middle ones do both; activations travel from rank r to r + 1.
  const spec::Plan p = plan(1, 4);
  for (int64_t stage = 0; stage < 4; ++stage) {
    const std::vector<PassStep> steps = pass_steps(p, stage, 8, 1);
    ASSERT_EQ(steps.size(), 16u) << stage;
    int forwards = 0;
    for (const PassStep& s : steps) {
      forwards += s.unit.forward ? 1 : 0;
      EXPECT_EQ(s.model_chunk, stage);
      EXPECT_FALSE(s.runs_up);
      const bool from_before = stage > 0, to_after = stage < 3;
      EXPECT_EQ(s.receives, s.unit.forward ? from_before : to_after) << stage;
      EXPECT_EQ(s.sends, s.unit.forward ? to_after : from_before) << stage;
    }
    EXPECT_EQ(forwards, 8);
  }
}

TEST(StepProgram, InterleavedChunksAreTheModelsEveryPpth) {
  // Interleaved over 2 stages with 2 chunks each: rank r holds model chunks r and r + 2
  // (Megatron's virtual pipeline). Rank 0's second chunk (model chunk 2) receives and sends
  // both ways; rank 1's second (model chunk 3, the last) never sends forward.
  spec::Plan p = plan(1, 2, 0, Schedule::kInterleaved);
  p.virtual_stages = 2;
  for (int64_t stage = 0; stage < 2; ++stage) {
    for (const PassStep& s : pass_steps(p, stage, 8, 1)) {
      const int64_t chunk = s.unit.chunk * 2 + stage;
      EXPECT_EQ(s.model_chunk, chunk);
      const bool first = chunk == 0, last = chunk == 3;
      EXPECT_EQ(s.receives, s.unit.forward ? !first : !last);
      EXPECT_EQ(s.sends, s.unit.forward ? !last : !first);
    }
  }
}

TEST(StepProgram, GemsSecondReplicaRunsUp) {
  // GEMS over 2 stages (Jain et al. 2020): replica A's stages on ranks 0, 1; replica B's
  // mirrored on ranks 1, 0. Rank 0 holds A's first chunk (model chunk 0, down the ring) and B's
  // last (model chunk 1, its input from rank 1: up); rank 1 B's first (up) and A's last.
  const spec::Plan p = plan(1, 2, 0, Schedule::kGems);
  struct Expected {
    int64_t stage, local, model_chunk;
    bool up;
  };
  for (const Expected e : {Expected{0, 0, 0, false}, Expected{0, 1, 1, true},
                           Expected{1, 0, 0, true}, Expected{1, 1, 1, false}}) {
    int seen = 0;
    for (const PassStep& s : pass_steps(p, e.stage, 8, 1)) {
      if (s.unit.chunk != e.local) continue;
      ++seen;
      EXPECT_EQ(s.model_chunk, e.model_chunk);
      EXPECT_EQ(s.runs_up, e.up);
      // Model chunk 0 reads the tokens, chunk 1 computes the loss, whichever way it runs.
      EXPECT_EQ(s.receives, s.unit.forward ? e.model_chunk == 1 : e.model_chunk == 0);
      EXPECT_EQ(s.sends, s.unit.forward ? e.model_chunk == 0 : e.model_chunk == 1);
    }
    // Each replica runs half of the rank's micro-batches through it, forward and backward.
    EXPECT_EQ(seen, 8) << e.stage << " " << e.local;
  }
}

TEST(StepProgram, PipeDreamRunsBatchesBackToBackOnly) {
  // PipeDream-2BW over a window of 2 batches of 8 micro-batches: 32 passes, micro-batches
  // numbered 0..15 across the window; a synchronous schedule flushes after one batch.
  const spec::Plan p = plan(1, 2, 0, Schedule::kPipeDream2BW);
  const std::vector<PassStep> steps = pass_steps(p, 1, 8, 2);
  ASSERT_EQ(steps.size(), 32u);
  int64_t highest = 0;
  for (const PassStep& s : steps) highest = std::max(highest, s.unit.micro_batch);
  EXPECT_EQ(highest, 15);
  EXPECT_THROW(pass_steps(plan(1, 2), 0, 8, 2), std::exception);
}

TEST(StepProgram, GradientsCompleteAtTheLastBackwardThroughTheChunk) {
  // 1F1B, 4 micro-batches a batch: a chunk's last backward of the batch is micro-batch 3, and over
  // two batches back to back (PipeDream-2BW) 3 and 7. GEMS splits the 4 between its replicas
  // (0, 1 on the first, 2, 3 on the second): each replica's chunk is complete after its own
  // half, micro-batches 1 and 3.
  auto completing = [](const spec::Plan& p, int64_t micro_batches, int64_t total) {
    std::vector<int64_t> out;
    for (int64_t m = 0; m < total; ++m)
      if (completes_gradients(p, m, micro_batches)) out.push_back(m);
    return out;
  };
  EXPECT_EQ(completing(plan(1, 2), 4, 4), (std::vector<int64_t>{3}));
  EXPECT_EQ(completing(plan(1, 2, 0, Schedule::kPipeDream2BW), 4, 8), (std::vector<int64_t>{3, 7}));
  EXPECT_EQ(completing(plan(1, 2, 0, Schedule::kGems), 4, 4), (std::vector<int64_t>{1, 3}));
  // Asynchronous PipeDream: each batch is one micro-batch, complete after every backward.
  EXPECT_EQ(completing(plan(1, 2, 0, Schedule::kPipeDream), 1, 3), (std::vector<int64_t>{0, 1, 2}));
}

TEST(StepProgram, LayerParametersByLayout) {
  using P = LayerParameters;
  // ZeRO-3 gathers a layer's shards before each pass when replicas share it, or fetches it from
  // the host on one replica (ZeRO-Infinity); ZeRO-1/2 over replicas gather the updated shards;
  // without ZeRO, or on one replica, every rank holds and updates the whole.
  EXPECT_EQ(layer_parameters(plan(2, 1, 3)), P::kGatheredEachPass);
  EXPECT_EQ(layer_parameters(plan(1, 1, 3)), P::kWhole);
  EXPECT_EQ(layer_parameters(plan(2, 1, 1)), P::kGatheredAfterUpdate);
  EXPECT_EQ(layer_parameters(plan(2, 1, 2)), P::kGatheredAfterUpdate);
  EXPECT_EQ(layer_parameters(plan(1, 1, 2)), P::kWhole);
  EXPECT_EQ(layer_parameters(plan(2, 1, 0)), P::kWhole);
  spec::Plan infinity = plan(1, 1, 3);
  infinity.offload.optimizer = spec::OffloadTarget::kHost;
  infinity.offload.params = spec::OffloadTarget::kHost;
  EXPECT_EQ(layer_parameters(infinity), P::kGatheredEachPass);
}

TEST(StepProgram, LayerGradientsByLayout) {
  using G = LayerGradients;
  // One replica, optimizer on the device: nothing leaves the rank.
  EXPECT_EQ(layer_gradients(plan(1, 1), true), G::kKept);
  EXPECT_EQ(layer_gradients(plan(1, 1, 3), true), G::kKept);
  // Data parallelism and ZeRO-1 reduce buckets, during the backward if the stack overlaps; so
  // does ZeRO-2 on one micro-batch a step.
  for (int zero : {0, 1}) {
    EXPECT_EQ(layer_gradients(plan(2, 1, zero), true), G::kBucketsAsCompleted) << zero;
    EXPECT_EQ(layer_gradients(plan(2, 1, zero), false), G::kBucketsAfterBackward) << zero;
  }
  spec::Plan one_micro_batch = plan(2, 1, 2);
  one_micro_batch.micro_batch = one_micro_batch.global_batch / 2;
  EXPECT_EQ(layer_gradients(one_micro_batch, true), G::kBucketsAsCompleted);
  // ZeRO-2 over several micro-batches (the suite's 4 a replica) keeps no whole gradients: every
  // micro-batch's buckets are reduced, overlap or not.
  EXPECT_EQ(layer_gradients(plan(2, 1, 2), true), G::kBucketsEachPass);
  EXPECT_EQ(layer_gradients(plan(2, 1, 2), false), G::kBucketsEachPass);
  EXPECT_TRUE(bucketed(G::kBucketsEachPass));
  // ZeRO-3 over replicas scatters every pass's gradients (FSDP), overlap or not.
  EXPECT_EQ(layer_gradients(plan(2, 1, 3), true), G::kScatteredEachPass);
  EXPECT_EQ(layer_gradients(plan(2, 1, 3), false), G::kScatteredEachPass);
  // ZeRO-Offload on one GPU: buckets to the host (ZeRO-1/2), whole layers under ZeRO-3.
  spec::Plan offloaded = plan(1, 1);
  offloaded.offload.optimizer = spec::OffloadTarget::kHost;
  EXPECT_EQ(layer_gradients(offloaded, true), G::kBucketsAsCompleted);
  offloaded.zero = 3;
  EXPECT_EQ(layer_gradients(offloaded, true), G::kToHostWhenComplete);
  // GEMS: a replica and its mirror sum their gradients even at dp 1.
  EXPECT_TRUE(bucketed(layer_gradients(plan(1, 2, 0, Schedule::kGems), true)));
  // Parameter servers sum them at the step's end.
  spec::Plan servers = plan(2, 1);
  servers.parameter_server.enabled = true;
  EXPECT_EQ(layer_gradients(servers, true), G::kKept);
  EXPECT_FALSE(bucketed(G::kKept));
  EXPECT_FALSE(bucketed(G::kScatteredEachPass));
}

TEST(StepProgram, GradientHandoffAfterEachBackward) {
  // Four micro-batches a batch, micro-batch 1 (not the last) and 3 (the last backward through the
  // chunk). Counted as (scatter, to_host, count_buckets).
  auto handoff = [](const spec::Plan& p, int64_t micro_batch) {
    const GradientHandoff h = gradient_handoff(p, layer_gradients(p, true), micro_batch, 4);
    return std::vector<bool>{h.scatter, h.to_host, h.count_buckets};
  };
  using V = std::vector<bool>;
  // Data parallelism: the layer counts towards its buckets once the batch's last backward made
  // its gradients; before that nothing leaves.
  EXPECT_EQ(handoff(plan(2, 1), 1), (V{false, false, false}));
  EXPECT_EQ(handoff(plan(2, 1), 3), (V{false, false, true}));
  // Without overlap the buckets wait for the backward's end: nothing per layer.
  const spec::Plan dp = plan(2, 1);
  EXPECT_FALSE(gradient_handoff(dp, layer_gradients(dp, false), 3, 4).count_buckets);
  // ZeRO-2 over micro-batches counts every backward towards its buckets, into the shard.
  const GradientHandoff z2 =
      gradient_handoff(plan(2, 1, 2), layer_gradients(plan(2, 1, 2), true), 1, 4);
  EXPECT_TRUE(z2.count_buckets && z2.accumulate_shard && !z2.scatter && !z2.to_host);
  // FSDP scatters every micro-batch's gradients; ZeRO-Offload sends each scattered shard on.
  EXPECT_EQ(handoff(plan(2, 1, 3), 1), (V{true, false, false}));
  spec::Plan fsdp_offload = plan(2, 1, 3);
  fsdp_offload.offload.optimizer = spec::OffloadTarget::kHost;
  EXPECT_EQ(handoff(fsdp_offload, 1), (V{true, true, false}));
  // ZeRO-3 with a host optimizer on one GPU: the whole gradients go once complete.
  spec::Plan one_gpu = plan(1, 1, 3);
  one_gpu.offload.optimizer = spec::OffloadTarget::kHost;
  EXPECT_EQ(handoff(one_gpu, 1), (V{false, false, false}));
  EXPECT_EQ(handoff(one_gpu, 3), (V{false, true, false}));
  // One replica on the device keeps them.
  EXPECT_EQ(handoff(plan(1, 1), 3), (V{false, false, false}));
}

}  // namespace
}  // namespace sextant::models
