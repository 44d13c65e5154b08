// AxoNN's 3D tensor grid in the simulator: the 1 x t x 1 grid (Megatron-LM's 1D tensor
// parallelism) simulates as the 1D plan does, and on a 2 x 2 x 2 grid every collective runs on
// its axis's two ranks, the vocabulary layers on the slice's four, and the z slices' partial
// gradients are summed over z once per step.
#include <gtest/gtest.h>

#include <set>

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

}  // namespace
}  // namespace sextant::sim
