// Folding symmetric ranks (rank_symmetry.hpp) must not change what the analytic simulation says:
// every rank's times and the whole trace are compared with the unfolded run, over layouts that
// exercise every group and channel slot, and over perturbations that break the symmetry (a slow
// rank, a slow link, compute jitter, overlap slowdown).
#include "sextant/sim/rank_symmetry.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "sextant/models/zoo.hpp"
#include "sextant/sim/simulator.hpp"
#include "sextant/spec/cluster_catalog.hpp"
#include "sextant/spec/trace_selection.hpp"
#include "test_models.hpp"

namespace sextant::sim {
namespace {

struct SymmetryCase {
  std::string model;
  spec::Plan plan;
  std::string label;
};

spec::Plan plan_of(int64_t dp, int64_t tp, int64_t pp, int64_t mb, int64_t gb,
                   const std::string& stack) {
  spec::Plan p = test::make_plan(dp, tp, pp, mb, gb);
  p.stack = spec::builtin_stack(stack);
  return p;
}

std::vector<SymmetryCase> cases() {
  std::vector<SymmetryCase> out;
  out.push_back({"gpt2-350m", plan_of(4, 2, 2, 2, 32, "megatron-core"), "dp4.tp2.pp2 1f1b"});
  {
    spec::Plan p = plan_of(2, 4, 2, 1, 16, "megatron-core");
    p.sequence_parallel = true;
    p.zero = 1;
    out.push_back({"llama2-7b", p, "sp + distributed optimizer, GQA-free llama"});
  }
  {
    spec::Plan p = plan_of(2, 2, 4, 1, 16, "megatron-lm");
    p.schedule = spec::Schedule::kInterleaved;
    p.virtual_stages = 2;
    p.recompute = spec::Recompute::kFull;
    out.push_back({"gpt2-774m", p, "interleaved, full recompute, tied embeddings"});
  }
  {
    spec::Plan p = plan_of(16, 1, 1, 1, 32, "pytorch-fsdp");
    p.zero = 3;
    out.push_back({"llama3-8b", p, "FSDP over 2 nodes"});
  }
  {
    spec::Plan p = plan_of(2, 1, 4, 1, 16, "megatron-core");
    p.schedule = spec::Schedule::kGpipe;
    out.push_back({"gpt2-124m", p, "gpipe"});
  }
  {
    spec::Plan p = plan_of(4, 1, 1, 4, 32, "deepspeed");
    p.zero = 2;
    out.push_back({"gpt2-124m", p, "ZeRO-2"});
  }
  out.push_back({"gpt2-350m", plan_of(3, 2, 2, 1, 12, "megatron-core"),
                 "dp 3: groups straddle nodes unevenly"});
  return out;
}

void expect_same(const spec::ModelSpec& model, const spec::ClusterSpec& cluster,
                 const spec::Plan& plan, const std::string& label, int64_t* classes = nullptr) {
  SimulationOptions folded_options;
  folded_options.trace = true;
  SimulationOptions full_options = folded_options;
  full_options.fold_symmetric_ranks = false;
  SimulationResult folded = simulate(model, cluster, plan, folded_options);
  SimulationResult full = simulate(model, cluster, plan, full_options);
  SCOPED_TRACE(label);
  EXPECT_EQ(full.report.simulated_ranks, plan.world_size());
  EXPECT_LE(folded.report.simulated_ranks, plan.world_size());
  if (classes != nullptr) *classes = folded.report.simulated_ranks;
  EXPECT_EQ(folded.report.step_time_s, full.report.step_time_s);
  ASSERT_EQ(folded.ranks.size(), full.ranks.size());
  for (size_t r = 0; r < full.ranks.size(); ++r) {
    const RankTimes& a = folded.ranks[r];
    const RankTimes& b = full.ranks[r];
    EXPECT_EQ(a.finish, b.finish) << "rank " << r;
    EXPECT_EQ(a.compute, b.compute) << "rank " << r;
    EXPECT_EQ(a.optimizer, b.optimizer) << "rank " << r;
    EXPECT_EQ(a.tp, b.tp) << "rank " << r;
    EXPECT_EQ(a.dp, b.dp) << "rank " << r;
    EXPECT_EQ(a.fsdp, b.fsdp) << "rank " << r;
    EXPECT_EQ(a.pp, b.pp) << "rank " << r;
    EXPECT_EQ(a.bubble, b.bubble) << "rank " << r;
  }
  // Every task of every rank at the same times, with the same algorithm names.
  EXPECT_EQ(spec::trace_to_chrome_json(*folded.trace), spec::trace_to_chrome_json(*full.trace));
  // Recording only some ranks (folded or not) gives the whole trace's events of those ranks.
  spec::TraceSelection pick;
  pick.ranks = {0};
  if (plan.world_size() > 1) pick.ranks.push_back(plan.world_size() - 1);
  spec::Trace expected = *full.trace;
  spec::apply(pick, expected);
  ASSERT_FALSE(expected.events.empty());
  for (bool fold : {true, false}) {
    SimulationOptions some = folded_options;
    some.fold_symmetric_ranks = fold;
    some.trace_ranks = pick.ranks;
    const SimulationResult picked = simulate(model, cluster, plan, some);
    EXPECT_EQ(spec::trace_to_chrome_json(*picked.trace), spec::trace_to_chrome_json(expected))
        << (fold ? "folded" : "unfolded");
  }
}

TEST(RankSymmetry, FoldingChangesNoTimeOfAnyRank) {
  const spec::ClusterSpec cluster = spec::builtin_cluster("dgx-a100");
  for (const SymmetryCase& c : cases())
    expect_same(models::zoo_model(c.model), cluster, c.plan, c.label);
}

TEST(RankSymmetry, PerturbationsSplitTheClassesAndStayExact) {
  const spec::ModelSpec model = models::zoo_model("gpt2-350m");
  // 32 ranks on 4 nodes: stage 0 on nodes 0-1, stage 1 on nodes 2-3, data-parallel groups across
  // the two nodes of their stage, pipeline channels from node 0 to 2 and 1 to 3.
  const spec::Plan plan = plan_of(8, 2, 2, 2, 32, "megatron-core");
  spec::ClusterSpec base = spec::builtin_cluster("dgx-a100");
  int64_t regular = 0;
  expect_same(model, base, plan, "regular", &regular);
  // Every rank of a stage is a copy of the others: one class per stage.
  EXPECT_EQ(regular, plan.pp);

  spec::ClusterSpec slow_rank = base;
  slow_rank.speed_overrides.push_back({std::nullopt, 3, 0.5});
  int64_t classes = 0;
  expect_same(model, slow_rank, plan, "rank 3 at half speed", &classes);
  EXPECT_GT(classes, regular);

  spec::ClusterSpec slow_nic = base;
  slow_nic.link_overrides.push_back({"infiniband", 1, std::nullopt, 0.1});
  expect_same(model, slow_nic, plan, "node 1's NICs at a tenth", &classes);
  // Stage 0's ranks on node 0 and on node 1 now send through NICs of different speeds.
  EXPECT_GT(classes, regular);

  spec::ClusterSpec noisy = base;
  noisy.device.compute_jitter = 0.1;    // the wait for the last member, weighted by class size
  noisy.device.overlap_slowdown = 0.2;  // folded members slow their own compute only
  expect_same(model, noisy, plan, "jitter and overlap slowdown", &classes);
  EXPECT_EQ(classes, regular);

  spec::ClusterSpec slow_node = base;
  slow_node.speed_overrides.push_back({1, std::nullopt, 0.8});
  expect_same(model, slow_node, plan, "node 1 at 0.8", &classes);
  EXPECT_GT(classes, regular);
}

TEST(RankSymmetry, TheFlowNetworkIsNotFolded) {
  const spec::ModelSpec model = models::zoo_model("gpt2-124m");
  SimulationOptions o;
  o.fidelity = Fidelity::kFlow;
  const spec::Plan plan = plan_of(4, 2, 1, 2, 16, "megatron-core");
  SimulationResult r = simulate(model, spec::builtin_cluster("dgx-a100"), plan, o);
  EXPECT_EQ(r.report.simulated_ranks, plan.world_size());
}

}  // namespace
}  // namespace sextant::sim
