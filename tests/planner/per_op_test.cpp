// Per-op plans in the simulator and the estimator (issue 60): a plan's per-op splits are priced
// end to end, each reshard collective in its mesh axis's group, and the closed-form estimate
// follows the simulation as it does for uniform plans.
#include <gtest/gtest.h>

#include <set>

#include "sextant/models/zoo.hpp"
#include "sextant/planner/estimator.hpp"
#include "sextant/planner/op_splits.hpp"
#include "sextant/planner/planner.hpp"
#include "sextant/sim/simulator.hpp"
#include "sextant/spec/cluster_catalog.hpp"
#include "sextant/spec/executor_support.hpp"
#include "sextant/spec/json_io.hpp"
#include "test_models.hpp"

namespace sextant::sim {

namespace {

spec::Plan attention_data_parallel(int64_t dp, int64_t tp) {
  spec::Plan plan = test::make_plan(dp, tp, 1, 4, 4 * dp * 4);
  plan.stack = spec::builtin_stack("megatron-core");
  plan.per_op = {{"qkv", {{"b", {"d", "t"}}}},
                 {"attention", {{"b", {"d", "t"}}}},
                 {"proj", {{"b", {"d", "t"}}}}};
  return plan;
}

// GPT-3 1.3B on 8 A100s of a node, dp 2 x tp 4, attention data-parallel over t. The trace holds
// the reshard collectives: those over t in the tp group (4 ranks), and none over d.
TEST(PerOpPlan, ReshardsOverTheTensorAxisRunInTheTpGroup) {
  const spec::ModelSpec model = models::zoo_model("gpt3-1.3b");
  const spec::ClusterSpec cluster = spec::builtin_cluster("dgx-a100");
  SimulationOptions options;
  options.trace = true;
  const SimulationResult r = simulate(model, cluster, attention_data_parallel(2, 4), options);
  ASSERT_TRUE(r.trace);
  int gathers = 0;
  for (const spec::TraceEvent& e : r.trace->events) {
    if (e.rank != 0) continue;
    if (e.name == "attention.reshard_all_gather" || e.name == "residual1.reshard_all_gather") {
      ++gathers;
      EXPECT_EQ(e.group_size, 4) << e.name;
    }
    EXPECT_EQ(e.name.find("attn.all_reduce"), std::string::npos) << e.name;
  }
  EXPECT_GT(gathers, 0);
}

// A split that moves data over the replicas: the second norm's tokens split over d by sequence
// instead of by batch (the stream's split). By the rule, all-to-alls over d: forward into the norm
// (named for it) and out of it into FC1; backward FC1's input gradient into the norm's layout
// (named for the norm) and the norm's into the first residual's (named for it). Each runs in
// the replicas' group (4 ranks), and the estimate prices them as the simulation does.
TEST(PerOpPlan, ReshardsOverTheDataAxisRunInTheReplicasGroup) {
  const spec::ModelSpec model = models::zoo_model("gpt3-1.3b");
  const spec::ClusterSpec cluster = spec::builtin_cluster("dgx-a100");
  spec::Plan plan = test::make_plan(4, 2, 1, 4, 64);
  plan.stack = spec::builtin_stack("megatron-core");
  plan.per_op = {{"norm2", {{"s", {"d"}}}}};
  SimulationOptions options;
  options.trace = true;
  const SimulationResult r = simulate(model, cluster, plan, options);
  ASSERT_TRUE(r.trace);
  std::set<std::string> over_d;
  for (const spec::TraceEvent& e : r.trace->events)
    if (e.rank == 0 && e.name.find("reshard_all_to_all") != std::string::npos) {
      over_d.insert(e.name);
      EXPECT_EQ(e.group_size, 4) << e.name;
    }
  EXPECT_EQ(over_d, (std::set<std::string>{"norm2.reshard_all_to_all", "fc1.reshard_all_to_all",
                                           "residual1.reshard_all_to_all"}));
  const double estimated = planner::Estimator(model, cluster).estimate(plan).step_time_s;
  EXPECT_NEAR(estimated, r.report.step_time_s, 0.01 * r.report.step_time_s);
  SimulationOptions unfolded;
  unfolded.fold_symmetric_ranks = false;
  EXPECT_NEAR(simulate(model, cluster, plan, unfolded).report.step_time_s, r.report.step_time_s,
              1e-9 * r.report.step_time_s);
}

// The estimate follows the simulation for per-op plans as for uniform ones (within 1%), and the
// folded simulation (one rank per symmetry class) equals the full one.
TEST(PerOpPlan, EstimateAndFoldedSimulationAgree) {
  const spec::ModelSpec model = models::zoo_model("gpt3-1.3b");
  const spec::ClusterSpec cluster = spec::builtin_cluster("dgx-a100");
  for (const spec::Plan& plan : {attention_data_parallel(2, 4), attention_data_parallel(4, 2)}) {
    const double simulated = simulate(model, cluster, plan, {}).report.step_time_s;
    SimulationOptions unfolded;
    unfolded.fold_symmetric_ranks = false;
    EXPECT_NEAR(simulate(model, cluster, plan, unfolded).report.step_time_s, simulated,
                1e-9 * simulated)
        << plan.name();
    const double estimated = planner::Estimator(model, cluster).estimate(plan).step_time_s;
    EXPECT_NEAR(estimated, simulated, 0.01 * simulated) << plan.name();
    spec::Plan uniform = plan;
    uniform.per_op.clear();
    EXPECT_NE(simulate(model, cluster, uniform, {}).report.step_time_s, simulated);
  }
}

// The plan file: per_op reads back as written and names itself; what it cannot describe is
// refused naming the field.
TEST(PerOpPlan, PlanFileRoundTripsAndRefusesWhatItCannotSplit) {
  const spec::Plan plan = attention_data_parallel(2, 4);
  EXPECT_NE(plan.name().find(".op-b:dt=attention+proj+qkv"), std::string::npos) << plan.name();
  const spec::Plan back = spec::plan_from_json(spec::to_json(plan), "plan");
  EXPECT_EQ(back.per_op, plan.per_op);
  spec::Json j = spec::to_json(plan);
  j["per_op"]["qkv"]["b"] = {"d", "x"};
  EXPECT_THROW(spec::plan_from_json(j, "plan"), InputError);
  spec::Json with_cp = spec::to_json(plan);
  with_cp["cp"] = 2;
  EXPECT_THROW(spec::plan_from_json(with_cp, "plan"), InputError);
  // A model with no per-op graph (an MLP): refused by validate_plan; a CNN's ops are its fc
  // layers, so a block op names none of them: refused when lowered.
  EXPECT_THROW(spec::validate_plan(plan, models::zoo_model("mlp-small"), 8, "plan"), InputError);
  models::LoweringOptions cnn;
  cnn.dp = 2;
  cnn.per_op = plan.per_op;
  EXPECT_THROW(models::lower(models::zoo_model("resnet50"), cnn), InputError);
}

// The per-op search from the uniform GPT-3 1.3B plan on dp 2 x tp 4: it keeps only changes the
// simulation confirms, so its plan is never slower; here attention data-parallel over t (QKV,
// attention and projection together: the projection's all-reduce becomes an all-gather) pays,
// and the plan it returns simulates to the step it reports.
TEST(PerOpSearch, FindsAFasterSplitAndNeverASlowerOne) {
  const spec::ModelSpec model = models::zoo_model("gpt3-1.3b");
  const spec::ClusterSpec cluster = spec::builtin_cluster("dgx-a100");
  spec::Plan uniform = attention_data_parallel(2, 4);
  uniform.per_op.clear();
  int64_t calls = 0;
  const planner::OpSplitChoice c =
      planner::choose_op_splits(model, cluster, uniform, {}, 2, [&](int64_t, int64_t) { ++calls; });
  EXPECT_GT(calls, 0);
  EXPECT_NEAR(c.uniform_step_s, simulate(model, cluster, uniform, {}).report.step_time_s, 1e-12);
  ASSERT_FALSE(c.changes.empty());
  EXPECT_LT(c.result.report.step_time_s, (1 - planner::kOpSplitGain) * c.uniform_step_s);
  EXPECT_NEAR(simulate(model, cluster, c.plan, {}).report.step_time_s, c.result.report.step_time_s,
              1e-12);
  for (const planner::OpSplitChange& change : c.changes) {
    EXPECT_LT(change.step_after_s, change.step_before_s) << change.op;
    EXPECT_FALSE(change.why.empty());
  }
  // With one tp rank the mesh's t axis splits nothing: no change can pay, the plan is returned.
  spec::Plan data_only = test::make_plan(8, 1, 1, 4, 64);
  data_only.stack = spec::builtin_stack("megatron-core");
  const planner::OpSplitChoice none = planner::choose_op_splits(model, cluster, data_only, {}, 2);
  EXPECT_TRUE(none.changes.empty());
  EXPECT_TRUE(none.plan.per_op.empty());
  // Where per-op splits do not apply (a U-Net has no fc layer), the plan simulated once and
  // returned.
  for (const char* name : {"unet"}) {
    const planner::OpSplitChoice none_here = planner::choose_op_splits(
        models::zoo_model(name), cluster, test::make_plan(8, 1, 1, 4, 64), {}, 2);
    EXPECT_EQ(none_here.simulations, 1) << name;
    EXPECT_TRUE(none_here.plan.per_op.empty()) << name;
  }
  // ResNet-50's one fc layer (2048 x 1000, 2 M of 25 M parameters) is searched, and splitting it
  // does not pay: the plan comes back uniform.
  const planner::OpSplitChoice resnet = planner::choose_op_splits(
      models::zoo_model("resnet50"), cluster, test::make_plan(8, 1, 1, 4, 64), {}, 2);
  EXPECT_GT(resnet.estimates, 0);
  EXPECT_TRUE(resnet.plan.per_op.empty());
}

// FlexFlow's CNN case (Jia et al., SysML'19, §7; Krizhevsky's "one weird trick"): on 16 A100s,
// AlexNet's data-parallel step all-reduces 58.6 M classifier weights. The search splits the
// classifier's weights over the replicas instead (each reads every replica's images, gathered),
// saving more than a tenth of the step; the estimate it ranked by follows the simulation within 2%.
TEST(PerOpSearch, AlexNetsClassifierSplitsItsWeightsOverTheReplicas) {
  const spec::ModelSpec model = models::zoo_model("alexnet");
  const spec::ClusterSpec cluster = spec::builtin_cluster("dgx-a100");
  const spec::Plan uniform = test::make_plan(16, 1, 1, 32, 512);
  const planner::OpSplitChoice c = planner::choose_op_splits(model, cluster, uniform, {}, 2);
  ASSERT_FALSE(c.changes.empty());
  EXPECT_LT(c.result.report.step_time_s, 0.9 * c.uniform_step_s);
  for (const auto& [op, split] : c.plan.per_op) EXPECT_EQ(op.rfind("layer", 0), 0u) << op;
  const double estimated = planner::Estimator(model, cluster).estimate(c.plan).step_time_s;
  EXPECT_NEAR(estimated, c.result.report.step_time_s, 0.02 * c.result.report.step_time_s);
}

// A CNN plan's search bounds its convolutions at the plan's own replicas, micro-batch and dtypes
// (models/conv_split_bound.hpp): ResNet-50 on 64 replicas of 32 bf16 images, gradients reduced in
// the compute dtype (the test's plain stack): its 3x3 conv5_x convolution moves at least
// 2 x 63 x 32 x 7 x 7 x 512 x 2 bytes and could save 2 x 63/64 x (512 x 512 x 9 + 1024) x 2. A
// transformer has none.
TEST(PerOpSearch, ACnnPlansConvolutionsAreBoundedAtItsOwnBatch) {
  const spec::ModelSpec model = models::zoo_model("resnet50");
  const spec::ClusterSpec cluster = spec::builtin_cluster("dgx-a100");
  const planner::OpSplitChoice c =
      planner::choose_op_splits(model, cluster, test::make_plan(64, 1, 1, 32, 2048), {}, 1);
  ASSERT_EQ(c.conv_bounds.size(), 53u);
  const models::ConvSplitBound& closest = models::closest_to_paying(c.conv_bounds);
  EXPECT_EQ(closest.conv, "layer15.conv2");
  EXPECT_DOUBLE_EQ(closest.least_moved_bytes, 2.0 * 63 * 32 * 7 * 7 * 512 * 2);
  EXPECT_DOUBLE_EQ(closest.most_saved_bytes, 2.0 * 63 / 64 * (512 * 512 * 9 + 1024) * 2);
  EXPECT_FALSE(closest.could_pay());
  // Four micro-batches of 8 a step exchange as much as one of 32; the all-reduce is once a step.
  const planner::OpSplitChoice k =
      planner::choose_op_splits(model, cluster, test::make_plan(64, 1, 1, 8, 2048), {}, 1);
  ASSERT_EQ(k.conv_bounds.size(), 53u);
  EXPECT_DOUBLE_EQ(models::closest_to_paying(k.conv_bounds).least_moved_bytes,
                   closest.least_moved_bytes);
  const planner::OpSplitChoice t = planner::choose_op_splits(
      models::zoo_model("gpt2-124m"), cluster, test::make_plan(8, 1, 1, 8, 64), {}, 1);
  EXPECT_TRUE(t.conv_bounds.empty());
}

// A deep MLP's layers are a chain of fc ops (models/cnn_fc_graph.hpp). Past 32 ops the search
// tries runs of 1, 2, 4, 8... ops and every run to the end, not every run. By hand, for 40 layers
// of 256 on dp 8 (tp 1): each layer k has four splits, whole, b over d (uniform), its input
// features f_k over d and its output features f_(k+1) over d. Whole and b apply to every later
// layer, so from a layer with m layers left they make L(m) runs each, L(m) the powers of two up
// to m plus the run to the end; f_k's run is the layer alone, f_(k+1)'s also reaches the next
// layer (which reads f_(k+1)). One pass estimates every move once:
// M = sum over m = 1..40 of 2 L(m) + 1 + min(2, m), against 2 m + 1 + min(2, m) for every run.
TEST(PerOpSearch, ADeepMlpIsSearchedInRunsOfPowersOfTwo) {
  spec::ModelSpec mlp;
  mlp.name = "mlp-40";
  spec::MlpSpec body;
  body.widths.assign(41, 256);
  mlp.body = body;
  const int64_t n = 40;
  int64_t moves = 0, every = 0;
  for (int64_t m = 1; m <= n; ++m) {
    int64_t runs = 0;
    for (int64_t c = 1; c <= m; ++c) runs += ((c & (c - 1)) == 0 || c == m) ? 1 : 0;
    moves += 2 * runs + 1 + std::min<int64_t>(2, m);
    every += 2 * m + 1 + std::min<int64_t>(2, m);
  }
  const planner::OpSplitChoice c = planner::choose_op_splits(
      mlp, spec::builtin_cluster("dgx-a100"), test::make_plan(8, 1, 1, 4, 32), {}, 1);
  EXPECT_EQ(c.estimates, moves);
  EXPECT_LT(3 * moves, every);
}

// `--constraint ops<=N` bounds how many ops the per-op search splits its own way; ops=0 turns
// it off. (GPT-3 1.3B with tp 4 splits nine ops unbounded: bench/results/per_op.md.)
TEST(PerOpSearch, TheOpsConstraintBoundsTheSplits) {
  planner::SearchRequest request;
  request.model = models::zoo_model("gpt3-1.3b");
  request.cluster = spec::builtin_cluster("dgx-a100");
  request.gpus = 8;
  request.global_batch = 64;
  request.constraints = {planner::parse_constraint("tp=4")};
  planner::SearchOptions options;
  options.choose_op_splits = true;
  options.leaders = 4;
  options.top_k = 2;
  size_t most = 0;
  for (const planner::RankedPlan& p : planner::search(request, options).ranked)
    most = std::max(most, p.plan.per_op.size());
  EXPECT_GT(most, 3u);
  request.constraints.push_back(planner::parse_constraint("ops<=3"));
  bool split = false;
  for (const planner::RankedPlan& p : planner::search(request, options).ranked) {
    EXPECT_LE(p.plan.per_op.size(), 3u) << p.plan.name();
    split = split || !p.plan.per_op.empty();
  }
  EXPECT_TRUE(split);
  request.constraints.back() = planner::parse_constraint("ops=0");
  for (const planner::RankedPlan& p : planner::search(request, options).ranked)
    EXPECT_TRUE(p.plan.per_op.empty()) << p.plan.name();
}

// `plan --per-op` refines the ranked plans; a search for plans the executor runs (tune, loop,
// plan --verify) splits ops only where the executor runs the result.
TEST(PerOpSearch, TheSearchSplitsOpsOnlyWhereTheExecutorRunsThem) {
  planner::SearchRequest request;
  request.model = models::zoo_model("gpt3-1.3b");
  request.cluster = spec::builtin_cluster("dgx-a100");
  request.gpus = 8;
  request.global_batch = 64;
  request.constraints.push_back(planner::parse_constraint("tp=4"));
  planner::SearchOptions options;
  options.choose_op_splits = true;
  options.leaders = 4;
  options.top_k = 2;
  auto splits_some = [](const planner::SearchResult& r) {
    for (const planner::RankedPlan& p : r.ranked)
      if (!p.plan.per_op.empty()) return true;
    return false;
  };
  const planner::SearchResult predicted = planner::search(request, options);
  EXPECT_TRUE(splits_some(predicted));
  EXPECT_FALSE(predicted.op_splits.empty());
  request.executor = spec::executor_run(spec::ExecutorBackend::kCuda);
  const planner::SearchResult run = planner::search(request, options);
  ASSERT_FALSE(run.ranked.empty());
  EXPECT_FALSE(splits_some(run));
  EXPECT_TRUE(run.op_splits.empty());
  // On CPU ranks in fp32 the executor runs per-op splits: the search splits ops there too (the
  // same tp-4 plans as above), each move checked against the executor's table, so every plan it
  // returns is one the executor runs.
  request.executor = spec::executor_run(spec::ExecutorBackend::kCpu);
  const planner::SearchResult cpu = planner::search(request, options);
  ASSERT_FALSE(cpu.ranked.empty());
  EXPECT_FALSE(cpu.op_splits.empty());
  EXPECT_TRUE(splits_some(cpu));
  for (const planner::RankedPlan& p : cpu.ranked)
    EXPECT_TRUE(spec::executor_problems(request.model, p.plan, *request.executor).empty())
        << p.plan.name();
}

}  // namespace
}  // namespace sextant::sim
