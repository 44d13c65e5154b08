// AxoNN's 3D tensor grid in the simulator: the 1 x t x 1 grid (Megatron-LM's 1D tensor
// parallelism) simulates as the 1D plan does, and on a 2 x 2 x 2 grid every collective runs on
// its axis's two ranks, the vocabulary layers on the slice's four, and the z slices' partial
// gradients are summed over z once per step.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <tuple>

#include "sextant/models/zoo.hpp"
#include "sextant/sim/simulator.hpp"
#include "sextant/spec/cluster_catalog.hpp"
#include "test_clusters.hpp"
#include "test_models.hpp"

namespace sextant::sim {
namespace {

TEST(TensorGrid, OneByTByOneSimulatesAsMegatronsTensorParallelism) {
  // GPT-3 1.3B (16 heads) on 16 A100s, tp 8 inside a node: the grid's collectives are the 1D
  // plan's, as large and in the same places (models' TheOneByTByOneGridIs... test).
  const spec::ModelSpec model = models::zoo_model("gpt3-1.3b");
  const spec::ClusterSpec cluster = spec::builtin_cluster("dgx-a100");
  spec::Plan flat = test::make_plan(2, 8, 1, 4, 32);
  flat.stack = spec::builtin_stack("megatron-lm");
  spec::Plan grid = flat;
  grid.tp_grid = {1, 8, 1};
  const spec::Report a = simulate(model, cluster, flat, {}).report;
  const spec::Report b = simulate(model, cluster, grid, {}).report;
  EXPECT_NEAR(b.step_time_s, a.step_time_s, 1e-9 * a.step_time_s);
  EXPECT_NEAR(b.breakdown_s.tp_comm_exposed, a.breakdown_s.tp_comm_exposed, 1e-12);
  EXPECT_EQ(b.memory.weights, a.memory.weights);
  EXPECT_EQ(b.memory.activations, a.memory.activations);
}

TEST(TensorGrid, EachCollectiveRunsOnItsAxis) {
  // 8 ranks of one node as a 2 x 2 x 2 grid; a micro-batch of 2 sequences, one per z slice.
  spec::ModelSpec model = models::zoo_model("gpt-tiny");
  const spec::ClusterSpec cluster = test::ideal_cluster(1e6, 100, 100, 0);
  spec::Plan plan = test::make_plan(1, 8, 1, 2, 2);
  plan.tp_grid = {2, 2, 2};
  SimulationOptions options;
  options.trace = true;
  const SimulationResult r = simulate(model, cluster, plan, options);
  ASSERT_TRUE(r.trace);
  std::set<std::string> seen;
  for (const spec::TraceEvent& e : r.trace->events) {
    if (e.rank != 0 || e.group_size == 0) continue;
    seen.insert(e.name);
    const bool axis = e.name.find(".weight_gather") != std::string::npos ||
                      e.name.find(".grad_scatter") != std::string::npos ||
                      e.name.find("attn.qkv.all_reduce") != std::string::npos ||
                      e.name == "attn.all_gather" || e.name == "mlp.all_gather";
    if (axis) {
      EXPECT_EQ(e.group_size, 2) << e.name;
    }
    // The vocabulary layers' collectives on the slice's x * y = 4 ranks.
    if (e.name == "embed.all_reduce" || e.name == "head.loss_all_reduce") {
      EXPECT_EQ(e.group_size, 4) << e.name;
    }
    if (e.name == "sp.all_reduce") {
      // gpt-tiny's (bf16 gradients of the plain stack) parameters the z slices hold alike: per
      // block two LayerNorms (4 x 128) and the biases split as their layer's outputs (QKV 384/2,
      // projection 128/2, FC1 512/2, FC2 128/2); the embedding's rows of the tied table, the
      // 256-token vocabulary padded to a multiple of 128 x the 4 ranks holding it (the stack's
      // vocab_multiple, Megatron's --make-vocab-size-divisible-by): 512/4 = 128 rows of 128,
      // and its 128 learned positions; the final LayerNorm.
      const int64_t block = 4 * 128 + 384 / 2 + 128 / 2 + 512 / 2 + 128 / 2;
      const int64_t embedding = 512 / 4 * 128 + 128 * 128;
      EXPECT_EQ(e.bytes, (4 * block + embedding + 2 * 128) * 2);
      EXPECT_EQ(e.group_size, 2);
    }
  }
  for (const char* name : {"attn.qkv.weight_gather", "attn.qkv.all_reduce", "mlp.fc2.grad_scatter",
                           "attn.all_gather", "sp.all_reduce"})
    EXPECT_TRUE(seen.count(name)) << name;
}

// gpt-tiny on a 2 x 2 x 2 grid of 8 ranks in a node, a micro-batch of 2 sequences (one per z
// slice) and 4 micro-batches, with the stack's TP overlap at `overlap`: the reading of AxoNN's
// --overlap-axonn-comm flags (layer_cost.hpp grid_overlap). Compute and transfers of a similar
// size: a 64 x 256 weight block moves in ~3 us at 10 GB/s, a slice's product of it takes ~4 us
// at 1 TFLOP/s.
spec::Plan overlapped_grid(spec::TpOverlap overlap) {
  spec::Plan plan = test::make_plan(1, 8, 1, 2, 8);
  plan.tp_grid = {2, 2, 2};
  plan.dtype = spec::Dtype::kBf16;
  plan.stack->tp_overlap = overlap;
  return plan;
}

SimulationResult simulate_grid(spec::TpOverlap overlap) {
  SimulationOptions options;
  options.trace = true;
  return simulate(models::zoo_model("gpt-tiny"), test::ideal_cluster(1, 10, 10, 0),
                  overlapped_grid(overlap), options);
}

// Rank 0's events of one (phase, layer, micro-batch) in the order they start.
using EventKey = std::tuple<spec::Phase, int64_t, int64_t>;
std::map<EventKey, std::vector<spec::TraceEvent>> events_by_unit(const spec::Trace& trace) {
  std::map<EventKey, std::vector<spec::TraceEvent>> out;
  for (const spec::TraceEvent& e : trace.events)
    if (e.rank == 0 && e.layer && e.micro_batch)
      out[{e.phase, *e.layer, *e.micro_batch}].push_back(e);
  for (auto& [key, events] : out)
    std::stable_sort(events.begin(), events.end(),
                     [](const spec::TraceEvent& a, const spec::TraceEvent& b) {
                       return a.start_ps < b.start_ps;
                     });
  return out;
}

const spec::TraceEvent& named(const std::vector<spec::TraceEvent>& events, const std::string& name,
                              size_t nth = 0) {
  for (const spec::TraceEvent& e : events)
    if (e.name == name && nth-- == 0) return e;
  ADD_FAILURE() << "no event " << name;
  return events.front();
}

TEST(TensorGrid, TheZAxisRunsOnTheDepthGroupsOwnStream) {
  // AxoNN's depth group is a communicator of its own: its weight gathers, gradient
  // reduce-scatters and the z slices' partial-gradient sum on a stream apart from the x and y
  // all-reduces, with or without overlap.
  for (spec::TpOverlap overlap : {spec::TpOverlap::kNone, spec::TpOverlap::kPipelined}) {
    const SimulationResult r = simulate_grid(overlap);
    ASSERT_TRUE(r.trace);
    int64_t depth = 0;
    for (const spec::TraceEvent& e : r.trace->events) {
      if (e.rank != 0 || e.group_size == 0) continue;
      const bool z = e.name.find(".weight_gather") != std::string::npos ||
                     e.name.find(".grad_scatter") != std::string::npos || e.name == "sp.all_reduce";
      EXPECT_EQ(e.stream, z ? spec::Stream::kDepthComm : spec::Stream::kTpComm) << e.name;
      depth += z ? 1 : 0;
    }
    // Per micro-batch and block 4 gathers forward, 4 backward and 4 reduce-scatters; one sum.
    EXPECT_EQ(depth, 4 * 4 * 12 + 1);
  }
}

TEST(TensorGrid, AxoNNsOverlapRunsTheGridsCollectivesBesideCompute) {
  const SimulationResult none = simulate_grid(spec::TpOverlap::kNone);
  const SimulationResult bulk = simulate_grid(spec::TpOverlap::kBulk);
  const SimulationResult pipelined = simulate_grid(spec::TpOverlap::kPipelined);
  ASSERT_TRUE(bulk.trace && pipelined.trace);
  const double eps = 2;  // ps

  // Backward ("bulk"): each linear layer's product runs as its input-gradient half, then its
  // weight-gradient half, which starts as the first ends, beside the input gradient's all-reduce
  // (overlap_all_reduce). The weight gradient's reduce-scatter over z starts once its product is
  // done and nothing waits for it: the op after the layer runs as soon as the product and the
  // all-reduce are done (--overlap-axonn-reduce-scatter).
  const auto units = events_by_unit(*bulk.trace);
  const std::vector<spec::TraceEvent>& bw = units.at({spec::Phase::kBwd, 2, 1});
  for (const char* linear : {"mlp.fc2", "mlp.fc1", "attn.proj", "attn.qkv"}) {
    SCOPED_TRACE(linear);
    const spec::TraceEvent& dgrad = named(bw, linear, 0);
    const spec::TraceEvent& wgrad = named(bw, linear, 1);
    const spec::TraceEvent& reduce = named(bw, std::string(linear) + ".all_reduce");
    const spec::TraceEvent& scatter = named(bw, std::string(linear) + ".grad_scatter");
    EXPECT_NEAR(dgrad.flops, wgrad.flops, 1e-9 * dgrad.flops);
    EXPECT_NEAR(wgrad.start_ps, dgrad.start_ps + dgrad.duration_ps, eps);
    EXPECT_NEAR(reduce.start_ps, dgrad.start_ps + dgrad.duration_ps, eps);
    EXPECT_GE(scatter.start_ps, wgrad.start_ps + wgrad.duration_ps - eps);
    // What the layer runs next (the product's successor, or FC1's and QKV's all-gather over x).
    const double free = static_cast<double>(
        std::max(wgrad.start_ps + wgrad.duration_ps, reduce.start_ps + reduce.duration_ps));
    const spec::TraceEvent* next = nullptr;
    for (const spec::TraceEvent& e : bw)
      if (e.stream != spec::Stream::kDepthComm && e.start_ps > wgrad.start_ps + eps &&
          &e != &reduce) {
        next = &e;
        break;
      }
    {
      ASSERT_NE(next, nullptr);
      EXPECT_NEAR(next->start_ps, free, eps) << next->name;
      EXPECT_LT(next->start_ps, scatter.start_ps + scatter.duration_ps);
    }
  }
  // Forward "bulk" gathers each weight block when its layer needs it: after the layer before.
  const std::vector<spec::TraceEvent>& fw_bulk = units.at({spec::Phase::kFwd, 2, 1});
  EXPECT_GE(named(fw_bulk, "mlp.fc1.weight_gather").start_ps,
            named(fw_bulk, "attn.proj").start_ps + named(fw_bulk, "attn.proj").duration_ps);

  // Forward ("pipelined"): each linear layer's weight gather is issued when the one before it
  // takes its own, so it starts no later than that layer's product (--overlap-axonn-all-gather),
  // and a block's first one while the block before it runs its last linear layer.
  const auto piped = events_by_unit(*pipelined.trace);
  for (int64_t layer = 1; layer <= 4; ++layer) {
    SCOPED_TRACE(layer);
    const std::vector<spec::TraceEvent>& fw = piped.at({spec::Phase::kFwd, layer, 1});
    const char* order[] = {"attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2"};
    for (size_t j = 1; j < 4; ++j)
      EXPECT_LE(named(fw, std::string(order[j]) + ".weight_gather").start_ps,
                named(fw, order[j - 1]).start_ps + eps)
          << order[j];
    if (layer > 1) {
      const std::vector<spec::TraceEvent>& before = piped.at({spec::Phase::kFwd, layer - 1, 1});
      EXPECT_LE(named(fw, "attn.qkv.weight_gather").start_ps,
                named(before, "mlp.fc2").start_ps + eps);
    }
  }

  // Each overlap takes time off the step, and the step still waits for every reduce-scatter.
  EXPECT_LT(bulk.report.step_time_s, none.report.step_time_s);
  EXPECT_LT(pipelined.report.step_time_s, bulk.report.step_time_s);
  Picoseconds last_scatter_end = 0, optimizer_start = 0;
  for (const spec::TraceEvent& e : bulk.trace->events) {
    if (e.rank != 0) continue;
    if (e.name.find(".grad_scatter") != std::string::npos)
      last_scatter_end = std::max(last_scatter_end, e.start_ps + e.duration_ps);
    if (e.name == "optimizer.adamw") optimizer_start = e.start_ps;
  }
  EXPECT_GE(optimizer_start, last_scatter_end - eps);
}

TEST(TensorGrid, AxoNNsOverlapHoldsAPrefetchedBlockAndThePendingShards) {
  // gpt-tiny (hidden 128, ffn 512, 4 blocks) on a 2 x 2 x 2 grid in bf16, 4 micro-batches.
  // "pipelined" holds a second gathered weight block while one is in use: the largest, FC1's
  // or FC2's (128/2) x (512/2) = 16384 elements, 32768 bytes. "bulk" keeps every micro-batch's
  // reduced weight-gradient shards until the batch ends (accumulate_later): a block's weights
  // are 12 x 128^2 = 196608 elements, 1/8 of them on a rank, 4 blocks, 4 micro-batches, 2 bytes
  // each: 4 x 4 x 24576 x 2 = 786432 bytes.
  const int64_t none = simulate_grid(spec::TpOverlap::kNone).report.memory.buffers;
  const int64_t bulk = simulate_grid(spec::TpOverlap::kBulk).report.memory.buffers;
  const int64_t pipelined = simulate_grid(spec::TpOverlap::kPipelined).report.memory.buffers;
  EXPECT_EQ(bulk - none, 786432);
  EXPECT_EQ(pipelined - bulk, 32768);
}

}  // namespace
}  // namespace sextant::sim
