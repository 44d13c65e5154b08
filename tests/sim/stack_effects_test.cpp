// What a software stack changes in a simulated step: compute slowed by communication beside it,
// the distributed optimizer's overlapped parameter gather, tensor-parallel overlap, DeepSpeed's
// per-module ZeRO-3 gathers, fp32 gradient reduction, and the memory a process holds beyond
// tensors. Expected values are worked out in each test from the model's own costs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>
#include <vector>

#include "sextant/models/lowering.hpp"
#include "sextant/models/zoo.hpp"
#include "sextant/sim/memory_model.hpp"
#include "sextant/sim/simulator.hpp"
#include "sextant/sim/step_setup.hpp"
#include "sextant/spec/cluster_catalog.hpp"
#include "test_clusters.hpp"
#include "test_models.hpp"

namespace sextant::sim {
namespace {

SimulationOptions traced() {
  SimulationOptions o;
  o.trace = true;
  return o;
}

std::map<std::string, int64_t> count_events(const spec::Trace& t, int64_t rank) {
  std::map<std::string, int64_t> n;
  for (const spec::TraceEvent& e : t.events)
    if (e.rank == rank) ++n[e.name];
  return n;
}

TEST(StackEffects, CommunicationBesideComputeSlowsIt) {
  // As DataParallel.OverlapExposesOnlyTheLastBucket: 8 layers, one bucket each; every bucket's
  // all-reduce but the last runs entirely beside the next layer's backward. With an overlap
  // slowdown f compute progresses at 1/(1+f) while an all-reduce moves data: in each all-reduce's
  // time `one` the compute does one/(1+f) of work, so each costs one*f/(1+f) more.
  const int64_t layers = 8, width = 1024, b = 1024;
  spec::ClusterSpec cluster = test::ideal_cluster(100, 1000, 1000, 1.0);
  spec::ModelSpec model = test::uniform_mlp(layers, width);
  spec::Plan plan = test::make_plan(2, 1, 1, b, 2 * b);
  plan.dtype = spec::Dtype::kFp32;
  plan.stack->dp_bucket_bytes = 1;
  plan.collective_algorithms[spec::CollectiveKind::kAllReduce] = spec::CollectiveAlgorithm::kRing;
  const double n = static_cast<double>(width * width * 4);
  const double one = 2 * 1e-6 + n / 1000e9 + 0.5 * n / 1e21;  // ring all-reduce, 2 ranks
  SimulationResult plain = simulate(model, cluster, plan, {});
  cluster.device.overlap_slowdown = 0.25;
  SimulationResult slowed = simulate(model, cluster, plan, {});
  const double extra = (layers - 1) * one * 0.25 / 1.25;
  EXPECT_NEAR(slowed.report.breakdown_s.compute - plain.report.breakdown_s.compute, extra, 1e-9);
  EXPECT_DOUBLE_EQ(slowed.report.breakdown_s.optimizer, plain.report.breakdown_s.optimizer);
  EXPECT_NEAR(slowed.report.step_time_s - plain.report.step_time_s, extra, 1e-9);
}

// Ranks whose compute varies arrive apart at a collective and the first wait for the last. Data
// parallelism on 2 ranks without overlap: one all-reduce after the whole backward pass, reached
// after C = the forward and backward compute of the step. With jitter j the last rank arrives, on
// average, j * C * E[max of 2 standard normals] = j * C / sqrt(pi) after the mean: the step is
// that much longer, and nothing else changes.
TEST(StackEffects, JitteryRanksWaitForTheLastAtACollective) {
  spec::ClusterSpec cluster = test::ideal_cluster(100, 1000, 1000, 1.0);
  spec::ModelSpec model = test::uniform_mlp(8, 1024);
  spec::Plan plan = test::make_plan(2, 1, 1, 1024, 2048);
  plan.stack->dp_overlap = false;
  SimulationResult plain = simulate(model, cluster, plan, {});
  cluster.device.compute_jitter = 0.1;
  SimulationResult jittery = simulate(model, cluster, plan, {});
  const double c = plain.report.breakdown_s.compute;
  const double wait = 0.1 * c / std::sqrt(M_PI);
  EXPECT_NEAR(jittery.report.step_time_s - plain.report.step_time_s, wait, 1e-4 * wait);
  EXPECT_DOUBLE_EQ(jittery.report.breakdown_s.compute, c);
}

// A received activation or gradient ties the receiver to its sender's timeline, as a collective
// does, so the wait for the last member builds from the end of a rank's previous collective or
// receive (traces/samples.cpp measures the jitter's segments so). gpt-tiny in two 1F1B stages with
// tied embeddings: the embedding gradients' all-reduce after the flush is the step's only
// collective. The stage that arrives last holds it for its transfer (the duration without jitter)
// plus j * S / sqrt(pi), S the mean over the stages of the time from its last receive to its
// arrival (~10 ms here), not its time since the step began (~140 ms).
TEST(StackEffects, JitterBuildsFromEachRanksLastReceive) {
  const spec::ModelSpec model = models::zoo_model("gpt-tiny");
  spec::ClusterSpec cluster = spec::builtin_cluster("local-cpu");
  spec::Plan plan = test::make_plan(1, 1, 2, 2, 16);
  plan.schedule = spec::Schedule::k1F1B;
  const SimulationResult plain = simulate(model, cluster, plan, traced());
  cluster.device.compute_jitter = 0.1;
  const SimulationResult jittery = simulate(model, cluster, plan, traced());
  // Per rank: the all-reduce's start (the rank's arrival) and duration, and its last receive's end.
  struct Seen {
    Picoseconds arrival = 0, duration = 0, last_receive_end = 0;
  };
  const auto seen = [](const spec::Trace& t) {
    std::map<int64_t, Seen> by_rank;
    for (const spec::TraceEvent& e : t.events)
      if (e.name == "embed.tied_all_reduce") by_rank[e.rank] = {e.start_ps, e.duration_ps, 0};
    for (const spec::TraceEvent& e : t.events) {
      Seen& r = by_rank.at(e.rank);
      if (e.op_class == spec::OpClass::kRecv && e.start_ps + e.duration_ps <= r.arrival)
        r.last_receive_end = std::max(r.last_receive_end, e.start_ps + e.duration_ps);
    }
    return by_rank;
  };
  const std::map<int64_t, Seen> before = seen(*plain.trace), after = seen(*jittery.trace);
  ASSERT_EQ(after.size(), 2u);
  const int64_t last = after.at(0).arrival > after.at(1).arrival ? 0 : 1;
  double segment_s = 0;
  for (const auto& [rank, r] : after)
    segment_s += ps_to_seconds(r.arrival - r.last_receive_end) / 2;
  ASSERT_GT(segment_s, 0);
  EXPECT_LT(segment_s, 0.2 * jittery.report.step_time_s);
  const double wait_s = ps_to_seconds(after.at(last).duration - before.at(last).duration);
  EXPECT_NEAR(wait_s, 0.1 * segment_s / std::sqrt(M_PI), 1e-3 * wait_s);
}

TEST(StackEffects, ConcurrentTransfersSlowComputeOnce) {
  // Two collectives moving data at the same time take SMs from the same compute; the measured
  // slowdown is per overlapped compute time, not per collective. A pipeline with overlapped
  // sends and DP buckets: whatever overlaps, compute is stretched at most by (1 + f).
  spec::ClusterSpec cluster = test::ideal_cluster(100, 50, 50, 1.0);
  spec::ModelSpec model = test::uniform_mlp(8, 1024);
  spec::Plan plan = test::make_plan(2, 1, 2, 256, 2048);
  plan.stack->dp_bucket_bytes = 1;
  SimulationResult plain = simulate(model, cluster, plan, {});
  cluster.device.overlap_slowdown = 0.5;
  SimulationResult slowed = simulate(model, cluster, plan, {});
  const double extra = slowed.report.breakdown_s.compute - plain.report.breakdown_s.compute;
  EXPECT_GT(extra, 0);
  EXPECT_LE(extra, 0.5 * plain.report.breakdown_s.compute + 1e-12);
}

TEST(StackEffects, DistributedOptimizerGathersBesideTheNextForward) {
  // ZeRO-1 on 2 ranks: after the step the updated halves are all-gathered, bucket by bucket (the
  // buckets the gradients were reduce-scattered in: one per layer here). Without overlap the eight
  // gathers follow the optimizer; with Megatron's --overlap-param-gather they run while the first
  // micro-batch goes forward, each layer waiting only for its own bucket. A layer's gather (~4 us)
  // is shorter than its forward (2*512*1024^2 FLOPs at 100 TFLOP/s = 10.7 us), so only the first
  // one shows: the step is shorter by about 7/8 of the gathers' time.
  spec::ClusterSpec cluster = test::ideal_cluster(100, 200, 200, 1.0);
  spec::ModelSpec model = test::uniform_mlp(8, 1024);
  spec::Plan plan = test::make_plan(2, 1, 1, 512, 2048);
  plan.zero = 1;
  plan.stack->dp_bucket_bytes = 1;
  SimulationResult after = simulate(model, cluster, plan, traced());
  plan.stack->param_gather_overlap = true;
  SimulationResult ahead = simulate(model, cluster, plan, traced());
  // The same gathers, all of them moved.
  EXPECT_EQ(count_events(*after.trace, 0)["zero.all_gather"], 8);
  EXPECT_EQ(count_events(*ahead.trace, 0)["zero.all_gather"], 8);
  EXPECT_EQ(count_events(*after.trace, 0)["dp.reduce_scatter"], 8);
  double gathers = 0;
  for (const spec::TraceEvent& e : after.trace->events)
    if (e.rank == 0 && e.name == "zero.all_gather") gathers += ps_to_seconds(e.duration_ps);
  EXPECT_GT(after.report.step_time_s - ahead.report.step_time_s, 0.8 * gathers);
  EXPECT_LT(after.report.step_time_s - ahead.report.step_time_s, gathers);
  EXPECT_LT(ahead.report.breakdown_s.dp_comm_exposed, after.report.breakdown_s.dp_comm_exposed);
}

TEST(StackEffects, TensorParallelOverlapHidesChunksBehindGemms) {
  // gpt2-350m at micro-batch 4 on tp 2: an 8 MB all-gather or reduce-scatter (80 us at 100 GB/s)
  // beside GEMMs of 13-50 GFLOP (130-500 us at 100 TFLOP/s).
  spec::ClusterSpec cluster = test::ideal_cluster(100, 100, 100, 1.0);
  spec::ModelSpec model = models::zoo_model("gpt2-350m");
  spec::Plan plan = test::make_plan(1, 2, 1, 4, 4);
  plan.sequence_parallel = true;
  double exposed[3];
  int i = 0;
  for (spec::TpOverlap o :
       {spec::TpOverlap::kNone, spec::TpOverlap::kBulk, spec::TpOverlap::kPipelined}) {
    plan.stack->tp_overlap = o;
    exposed[i++] = simulate(model, cluster, plan, {}).report.breakdown_s.tp_comm_exposed;
  }
  EXPECT_GT(exposed[0], 0);
  EXPECT_LT(exposed[1], exposed[0]);  // backward collectives hidden
  EXPECT_LT(exposed[2], exposed[1]);  // and the forward ones
  // Without sequence parallelism (all-reduces) Transformer Engine does not overlap.
  plan.sequence_parallel = false;
  double ar_none = 0, ar_pipelined = 0;
  plan.stack->tp_overlap = spec::TpOverlap::kNone;
  ar_none = simulate(model, cluster, plan, {}).report.step_time_s;
  plan.stack->tp_overlap = spec::TpOverlap::kPipelined;
  ar_pipelined = simulate(model, cluster, plan, {}).report.step_time_s;
  EXPECT_DOUBLE_EQ(ar_none, ar_pipelined);
}

TEST(StackEffects, EveryKnobCombinesWithEveryLayout) {
  // A forward can wait on a previous send, a receive, its tensor-parallel gather and an
  // overlapped parameter bucket at once: every combination must schedule (no deadlock, no
  // dependency overflow) and trace each collective with the bytes it moves.
  spec::ClusterSpec cluster = test::ideal_cluster(100, 100, 100, 1.0);
  cluster.device.overlap_slowdown = 0.2;
  spec::ModelSpec model = models::zoo_model("gpt-tiny");
  for (bool sp : {false, true}) {
    for (bool pp_overlap : {false, true}) {
      for (spec::TpOverlap o : {spec::TpOverlap::kNone, spec::TpOverlap::kPipelined}) {
        spec::Plan plan = test::make_plan(2, 2, 2, 1, 16);
        plan.zero = 1;
        plan.sequence_parallel = sp;
        plan.schedule = spec::Schedule::kInterleaved;
        plan.virtual_stages = 2;
        plan.stack->pp_overlap = pp_overlap;
        plan.stack->param_gather_overlap = true;
        plan.stack->tp_overlap = o;
        SimulationResult r = simulate(model, cluster, plan, traced());
        EXPECT_GT(r.report.step_time_s, 0) << plan.name();
        // The chunks of an overlapped all-gather add up to the whole collective.
        int64_t gathered = 0;
        for (const spec::TraceEvent& e : r.trace->events)
          if (e.rank == 0 && e.name == "mlp.all_gather" && e.layer == 1 && e.micro_batch == 0 &&
              e.phase == spec::Phase::kFwd)
            gathered += e.bytes;
        if (sp) {
          EXPECT_EQ(gathered, 1 * 128 * 128 * 2) << plan.name();  // b * s * h * 2 bytes
        }
      }
    }
  }
}

TEST(StackEffects, DeepspeedGathersEachModuleOnItsOwn) {
  // gpt-tiny blocks have four GEMMs with weights (qkv, proj, fc1, fc2): DeepSpeed fetches each
  // module's parameters with its own all-gather, FSDP a layer's flat parameter with one. The
  // same bytes in four times the messages: slower when messages have a latency.
  spec::ClusterSpec cluster = test::ideal_cluster(100, 100, 100, 20.0);
  spec::ModelSpec model = models::zoo_model("gpt-tiny");
  spec::Plan plan = test::make_plan(4, 1, 1, 2, 8);
  plan.zero = 3;
  SimulationResult fsdp = simulate(model, cluster, plan, traced());
  plan.stack->zero3 = spec::Zero3Impl::kDeepspeed;
  SimulationResult ds = simulate(model, cluster, plan, traced());
  const int64_t blocks = 4;
  // Forward and backward gather every block (4 modules each), the embedding and the head (the
  // tied head has no weight of its own but its logits GEMM counts as a module).
  auto gathers = [&](const SimulationResult& r) {
    return count_events(*r.trace, 0)["fsdp.all_gather"];
  };
  EXPECT_EQ(gathers(fsdp), 2 * (blocks + 2));
  EXPECT_EQ(gathers(ds), 2 * (4 * blocks + 1 + 1));
  EXPECT_GT(ds.report.step_time_s, fsdp.report.step_time_s);
}

TEST(StackEffects, DeepspeedOfTwentyTwentyOneRunsNoCollectiveBesideCompute) {
  // DeepSpeed 0.4-0.5 synchronizes the device around every ZeRO-3 parameter fetch (prefetches
  // included) and the host waits for each gradient bucket's reduce-scatter: on a rank, no
  // collective runs beside a kernel. Today's DeepSpeed prefetches the next module's parameters
  // and reduces beside backward. gpt-tiny, ZeRO-3 over 4 ranks, two micro-batches.
  spec::ClusterSpec cluster = test::ideal_cluster(100, 100, 100, 20.0);
  spec::ModelSpec model = models::zoo_model("gpt-tiny");
  auto run = [&](const char* stack) {
    spec::Plan plan = test::make_plan(4, 1, 1, 2, 16);
    plan.zero = 3;
    plan.stack = spec::builtin_stack(stack);
    plan.stack->attention = spec::AttentionKernel::kUnfused;  // the ideal device has no curves
    plan.dtype = spec::Dtype::kBf16;
    return simulate(model, cluster, plan, traced());
  };
  // Events of rank 0 that start before an earlier one has ended.
  auto overlapping = [](const SimulationResult& r) {
    std::vector<std::pair<Picoseconds, Picoseconds>> spans;
    for (const spec::TraceEvent& e : r.trace->events)
      if (e.rank == 0) spans.emplace_back(e.start_ps, e.start_ps + e.duration_ps);
    std::sort(spans.begin(), spans.end());
    int64_t n = 0;
    Picoseconds end = 0;
    for (const auto& [start, stop] : spans) {
      if (start < end) ++n;
      end = std::max(end, stop);
    }
    return n;
  };
  const SimulationResult old_ds = run("deepspeed-0.5");
  const SimulationResult new_ds = run("deepspeed");
  EXPECT_GT(count_events(*old_ds.trace, 0)["fsdp.all_gather"], 0);
  EXPECT_EQ(overlapping(old_ds), 0);
  EXPECT_GT(overlapping(new_ds), 0);
  EXPECT_GT(old_ds.report.breakdown_s.fsdp_comm_exposed,
            new_ds.report.breakdown_s.fsdp_comm_exposed);
}

TEST(StackEffects, GradientsReducedInFp32MoveTwiceTheBytes) {
  spec::ClusterSpec cluster = test::ideal_cluster();
  spec::ModelSpec model = test::uniform_mlp(2, 256);
  spec::Plan plan = test::make_plan(2, 1, 1, 4, 8);  // bf16 on a GPU cluster
  auto reduced = [&](const spec::Plan& p) {
    int64_t bytes = 0;
    SimulationResult r = simulate(model, cluster, p, traced());
    for (const spec::TraceEvent& e : r.trace->events)
      if (e.rank == 0 && e.name == "dp.all_reduce") bytes += e.bytes;
    return bytes;
  };
  EXPECT_EQ(reduced(plan), 2 * 256 * 256 * 2);
  plan.stack->grad_dtype = spec::Dtype::kFp32;
  EXPECT_EQ(reduced(plan), 2 * 256 * 256 * 4);
}

TEST(StackEffects, AutocastHoldsFp32ParametersAndGradients) {
  // torch.autocast over fp32 parameters: 4 + 4 bytes of weights and gradients and 8 of Adam
  // moments per parameter (no separate master copy), fp32 gradients reduced, and the bf16 copies
  // autocast cast in the forward held until the backward (2 bytes per parameter).
  spec::ClusterSpec cluster = test::ideal_cluster();
  spec::ModelSpec model = test::uniform_mlp(2, 256);
  spec::Plan plan = test::make_plan(2, 1, 1, 4, 8);
  plan.stack->autocast = true;
  models::LoweringOptions o;
  o.micro_batch = 4;
  models::LoweredModel lowered = models::lower(model, o);  // bf16
  const int64_t params = 2 * 256 * 256;
  spec::MemoryBreakdown m = stage_memory(plan, *plan.stack, lowered, 0);
  EXPECT_EQ(m.weights, 4 * params);
  EXPECT_EQ(m.gradients, 4 * params);
  EXPECT_EQ(m.optimizer, 8 * params);
  const int64_t bucket = std::min(plan.stack->dp_bucket_bytes, 4 * params);
  EXPECT_EQ(m.buffers, bucket + 2 * params);
  int64_t reduced = 0;
  SimulationResult r = simulate(model, cluster, plan, traced());
  for (const spec::TraceEvent& e : r.trace->events)
    if (e.rank == 0 && e.name == "dp.all_reduce") reduced += e.bytes;
  EXPECT_EQ(reduced, 4 * params);
}

TEST(StackEffects, MemoryBeyondTensors) {
  // A rank of stage 0 of dp2.tp2.pp2 on gpt-tiny (tied embeddings) is in four process groups:
  // tensor, data, pipeline and the first/last-stage embedding group.
  spec::ClusterSpec cluster = test::ideal_cluster();
  cluster.device.runtime_reserved_bytes = 1'000'000'000;
  cluster.network.communicator_buffer_bytes = 100'000'000;
  spec::ModelSpec model = models::zoo_model("gpt-tiny");
  spec::Plan plan = test::make_plan(2, 2, 2, 2, 16);
  plan.stack->allocator_reserve = 0.1;
  models::LoweringOptions o;
  o.micro_batch = 2;
  o.tp = 2;
  models::LoweredModel lowered = models::lower(model, o);
  spec::MemoryBreakdown bare = stage_memory(plan, *plan.stack, lowered, 0);
  spec::MemoryBreakdown m = stage_memory(plan, *plan.stack, lowered, 0, &cluster);
  const int64_t allocator =
      std::llround(0.1 * static_cast<double>(bare.activations + bare.buffers));
  EXPECT_EQ(bare.reserved, allocator);
  EXPECT_EQ(m.reserved, allocator + 1'000'000'000 + 4 * 100'000'000);
  EXPECT_EQ(m.peak_bytes,
            m.weights + m.gradients + m.optimizer + m.activations + m.buffers + m.reserved);
  EXPECT_EQ(m.headroom_bytes, cluster.device.memory_capacity_bytes - m.peak_bytes);
  EXPECT_TRUE(m.fits);
  cluster.device.memory_capacity_bytes = m.peak_bytes - 1;
  EXPECT_FALSE(stage_memory(plan, *plan.stack, lowered, 0, &cluster).fits);
}

// Llama-3 8B width with 2 blocks (embedding, 2 blocks, head), and TorchTitan's FSDP2 (zero 3) on
// `dp` ranks at one sequence a rank.
spec::ModelSpec llama3_two_blocks() {
  spec::ModelSpec model = models::zoo_model("llama3-8b");
  model.transformer().layers = 2;
  return model;
}
spec::Plan torchtitan_zero3(int64_t dp) {
  spec::Plan plan;
  plan.dp = dp;
  plan.micro_batch = 1;
  plan.global_batch = dp;
  plan.zero = 3;
  plan.stack = spec::builtin_stack("torchtitan");
  return plan;
}

TEST(StackEffects, Fsdp2CopiesEachLayersGradientsBeforeItsReduceScatter) {
  // TorchTitan (FSDP2, bf16 parameters, fp32 reduction) on one H100 at zero 3: each layer with
  // parameters ends its backward copying its gradients into the reduce-scatter buffer, 2 + 4
  // bytes a parameter at the copy's measured efficiency (h100-1gpu: 0.40 of 3.35 TB/s) plus one
  // launch. No power model on h100-1gpu, so nothing else in the step moves.
  const spec::ModelSpec model = llama3_two_blocks();
  const spec::ClusterSpec cluster = spec::builtin_cluster("h100-1gpu");
  spec::Plan plan = torchtitan_zero3(1);
  ASSERT_TRUE(plan.stack->grad_copy_in);
  spec::Plan no_copy = plan;
  no_copy.stack->grad_copy_in = false;
  const SimulationResult with = simulate(model, cluster, plan, traced());
  const SimulationResult without = simulate(model, cluster, no_copy, traced());
  int64_t params = 0, copies = 0;
  const models::LoweredModel lowered =
      models::lower(model, step_setup(model, cluster, plan).lowering);
  for (const models::Layer& layer : lowered.layers) {
    params += layer.params;
    copies += layer.params > 0 ? 1 : 0;
  }
  const double expected = static_cast<double>(params) * 6 / (3350e9 * 0.40) +
                          static_cast<double>(copies) * cluster.device.launch_overhead_us * 1e-6;
  EXPECT_EQ(count_events(*with.trace, 0)["fsdp.grad_copy_in"], copies);
  EXPECT_NEAR(with.report.step_time_s - without.report.step_time_s, expected, 1e-3 * expected);
}

TEST(StackEffects, Fsdp2CopiesEachUnitsParametersOutOfTheGather) {
  // TorchTitan's FSDP2 on one H100 at zero 3, world size 1 (_fsdp_param_group.py
  // wait_for_unshard): each unshard casts the fp32 shard to bf16 (4 + 2 bytes a parameter) and
  // copies it into the unsharded parameter (2 + 2) on the compute stream, at the generic memory
  // efficiency (h100-1gpu: 0.88 of 3.35 TB/s), plus one launch. Every unit unshards before its
  // forward; before its backward only the blocks but the last (the profiled script's policy,
  // bench/pytorch_llama_layers.py). No power model on h100-1gpu and no host issue modelled:
  // nothing else moves.
  const spec::ModelSpec model = llama3_two_blocks();
  const spec::ClusterSpec cluster = spec::builtin_cluster("h100-1gpu");
  spec::Plan plan = torchtitan_zero3(1);
  plan.stack->reshard_after_forward = spec::ReshardAfterForward::kBlocksButLast;
  // No host issue: the copies at the forward's start would let the host run further ahead.
  plan.stack->host_launch_us = {};
  ASSERT_TRUE(plan.stack->param_copy_out);
  spec::Plan no_copy = plan;
  no_copy.stack->param_copy_out = false;
  const SimulationResult with = simulate(model, cluster, plan, traced());
  const SimulationResult without = simulate(model, cluster, no_copy, traced());
  const models::LoweredModel lowered =
      models::lower(model, step_setup(model, cluster, plan).lowering);
  ASSERT_EQ(lowered.layers.size(), 4u);  // embedding, 2 blocks, head
  // Forward: all four units; backward: the first block only.
  const int64_t copied = lowered.layers[0].params + lowered.layers[1].params +
                         lowered.layers[2].params + lowered.layers[3].params +
                         lowered.layers[1].params;
  const double expected = static_cast<double>(copied) * 10 / (3350e9 * 0.88) +
                          5 * cluster.device.launch_overhead_us * 1e-6;
  EXPECT_EQ(count_events(*with.trace, 0)["fsdp.param_copy_out"], 5);
  EXPECT_NEAR(with.report.step_time_s - without.report.step_time_s, expected, 1e-3 * expected);
}

TEST(StackEffects, FsdpGathersForTheBackwardWhatItFreedAfterTheForward) {
  // Llama-3 8B width, 2 blocks, on 4 H100s at zero 3: every unit is gathered before its forward
  // (4), and before its backward those the stack's policy freed after the forward: all 4 under
  // DeepSpeed's, the 2 blocks under FSDP's (the root unit keeps the embedding and head), the first
  // block under TorchTitan's before v0.2, all but the head under TorchTitan's since.
  const spec::ModelSpec model = llama3_two_blocks();
  const spec::ClusterSpec cluster = spec::builtin_cluster("dgx-h100");
  using R = spec::ReshardAfterForward;
  for (auto [policy, backward] : std::vector<std::pair<R, int>>{
           {R::kAll, 4}, {R::kBlocks, 2}, {R::kBlocksButLast, 1}, {R::kAllButHead, 3}}) {
    spec::Plan plan = torchtitan_zero3(4);
    plan.stack->reshard_after_forward = policy;
    const SimulationResult r = simulate(model, cluster, plan, traced());
    EXPECT_EQ(count_events(*r.trace, 0)["fsdp.all_gather"], 4 + backward)
        << spec::enum_name(spec::reshard_after_forward_names(), policy);
    // The copy-out follows each gather (4 bytes a bf16 parameter at dp 4).
    EXPECT_EQ(count_events(*r.trace, 0)["fsdp.param_copy_out"], 4 + backward);
  }
}

TEST(StackEffects, FsdpZeroTwoGathersEachMicroBatchsForwardOnly) {
  // ZeRO-2 under TorchTitan (FSDP2 reshard_after_forward=False): the 4 units are gathered before
  // each micro-batch's forward, kept through its backward (no backward gathers) and each
  // micro-batch's gradients reduce-scattered: with 3 micro-batches 12 gathers and 12
  // reduce-scatters, where DeepSpeed's ZeRO-2 (megatron-core's) gathers its buckets once, after
  // the update. The step is ZeRO-3's with every unit kept (spec::as_run).
  const spec::ModelSpec model = llama3_two_blocks();
  const spec::ClusterSpec cluster = spec::builtin_cluster("dgx-h100");
  spec::Plan plan = torchtitan_zero3(4);
  plan.global_batch = 12;
  plan.zero = 2;
  const SimulationResult fsdp = simulate(model, cluster, plan, traced());
  std::map<std::string, int64_t> n = count_events(*fsdp.trace, 0);
  EXPECT_EQ(n["fsdp.all_gather"], 3 * 4);
  EXPECT_EQ(n["fsdp.reduce_scatter"], 3 * 4);
  EXPECT_EQ(n["zero.all_gather"], 0);
  EXPECT_EQ(fsdp.report.plan, plan.name());
  spec::Plan kept = plan;
  kept.zero = 3;
  kept.stack->reshard_after_forward = spec::ReshardAfterForward::kNone;
  EXPECT_EQ(simulate(model, cluster, kept, {}).report.step_time_s, fsdp.report.step_time_s);
  plan.stack->zero2 = spec::Zero2Impl::kDeepspeed;
  n = count_events(*simulate(model, cluster, plan, traced()).trace, 0);
  EXPECT_EQ(n["fsdp.all_gather"], 0);
  EXPECT_GT(n["zero.all_gather"], 0);
  EXPECT_GT(n["dp.reduce_scatter"], 0);
}

TEST(StackEffects, Zero3HoldsTheUnitsItKeptBesideThoseItGathersAgain) {
  // Llama-3 8B width, 2 blocks, ZeRO-3 on 4 ranks, one unit prefetched, bf16 parameters: at the
  // backward's start the units kept from the forward are all gathered, beside the unit gathered
  // again and the one prefetched. Every unit gathered again: 2 x the largest (the head: final
  // norm and 128256 x 4096 output); the head kept: it, and 2 x the embedding; FSDP's root kept
  // (embedding and head): both, and 2 x a block. The rest of the buffers is the same.
  const spec::ModelSpec model = llama3_two_blocks();
  const spec::ClusterSpec cluster = spec::builtin_cluster("dgx-h100");
  spec::Plan plan = torchtitan_zero3(4);
  ASSERT_EQ(plan.stack->zero3_prefetch, 1);
  using R = spec::ReshardAfterForward;
  auto buffers = [&](R policy, int64_t* embedding, int64_t* block, int64_t* head) {
    plan.stack->reshard_after_forward = policy;
    const models::LoweredModel lowered =
        models::lower(model, step_setup(model, cluster, plan).lowering);
    *embedding = lowered.layers[0].params;
    *block = lowered.layers[1].params;
    *head = lowered.layers[3].params;
    return stage_memory(plan, *plan.stack, lowered, 0).buffers;
  };
  int64_t embedding = 0, block = 0, head = 0;
  const int64_t all = buffers(R::kAll, &embedding, &block, &head);
  ASSERT_GT(head, embedding);
  ASSERT_GT(embedding, block);
  EXPECT_EQ(buffers(R::kAllButHead, &embedding, &block, &head) - all,
            (head + 2 * embedding - 2 * head) * 2);
  EXPECT_EQ(buffers(R::kBlocks, &embedding, &block, &head) - all,
            (embedding + head + 2 * block - 2 * head) * 2);
}

}  // namespace
}  // namespace sextant::sim
