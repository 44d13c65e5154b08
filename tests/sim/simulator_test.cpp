// End-to-end properties of `simulate`: determinism, trace validity, conservation of FLOPs and
// bytes, monotonicity in hardware speed, overrides, rejections, and coverage of the zoo.
#include "sextant/sim/simulator.hpp"

#include <gtest/gtest.h>

#include <map>
#include <random>

#include "expect_input_error.hpp"
#include "sextant/models/counts.hpp"
#include "sextant/models/zoo.hpp"
#include "sextant/spec/cluster_catalog.hpp"
#include "test_clusters.hpp"
#include "test_models.hpp"

namespace sextant::sim {
namespace {

SimulationOptions with_trace(Fidelity f = Fidelity::kAnalytic) {
  SimulationOptions o;
  o.fidelity = f;
  o.trace = true;
  return o;
}

TEST(Simulator, SameInputGivesTheSameTraceByteForByte) {
  spec::ClusterSpec cluster = spec::builtin_cluster("dgx-a100");
  spec::ModelSpec model = models::zoo_model("gpt-tiny");
  spec::Plan plan = test::make_plan(2, 2, 2, 2, 16);
  for (Fidelity f : {Fidelity::kAnalytic, Fidelity::kFlow}) {
    std::string a =
        spec::trace_to_chrome_json(*simulate(model, cluster, plan, with_trace(f)).trace);
    std::string b =
        spec::trace_to_chrome_json(*simulate(model, cluster, plan, with_trace(f)).trace);
    EXPECT_EQ(a, b);
  }
}

// The progress the engine reports (a progress line for long simulations): every 4096 completed
// tasks, counting up, out of every task of every rank's program.
TEST(Simulator, ReportsProgressEvery4096Tasks) {
  spec::ClusterSpec cluster = spec::builtin_cluster("dgx-a100");
  spec::ModelSpec model = models::zoo_model("gpt-tiny");
  spec::Plan plan = test::make_plan(8, 1, 1, 1, 8 * 256);  // 256 micro-batches on each of 8 ranks
  SimulationOptions options = with_trace();
  options.fold_symmetric_ranks = false;  // all 8 ranks' tasks (folded, the engine runs one)
  std::vector<std::pair<int64_t, int64_t>> calls;
  options.progress = [&](int64_t done, int64_t total) { calls.emplace_back(done, total); };
  const SimulationResult r = simulate(model, cluster, plan, options);
  ASSERT_FALSE(calls.empty());
  const int64_t total = calls.front().second;
  // Each rank runs at least a forward and a backward task per micro-batch.
  EXPECT_GE(total, 8 * 2 * 256);
  EXPECT_LT(total, std::ssize(r.trace->events));  // a task is a stage pass, not one op
  ASSERT_EQ(std::ssize(calls), total / 4096);
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(calls[i].first, 4096 * static_cast<int64_t>(i + 1));
    EXPECT_EQ(calls[i].second, total);
  }
}

TEST(Simulator, TraceIsValidAndConservesFlopsAndBytes) {
  spec::ClusterSpec cluster = spec::builtin_cluster("dgx-a100");
  spec::ModelSpec model = models::zoo_model("gpt-tiny");  // vocabulary 256: splits exactly
  std::mt19937 rng(20261122);
  for (int trial = 0; trial < 4; ++trial) {
    const int64_t dp = 1 << (rng() % 2), tp = 1 << (rng() % 3), pp = 1 << (rng() % 2);
    spec::Plan plan = test::make_plan(dp, tp, pp, 2, dp * 2 * 4);
    plan.recompute = static_cast<spec::Recompute>(rng() % 3);
    plan.sequence_parallel = tp > 1 && rng() % 2 == 0;
    SCOPED_TRACE(fmt::format("seed 20261122 trial {}: {}", trial, plan.name()));
    SimulationResult r = simulate(model, cluster, plan, with_trace());
    spec::Json j = spec::Json::parse(spec::trace_to_chrome_json(*r.trace));
    spec::Trace back = spec::trace_from_json(j, "trace");
    ASSERT_FALSE(back.events.empty());
    // Per rank and stream, events never overlap and time never goes backwards.
    std::map<std::pair<int64_t, spec::Stream>, Picoseconds> end;
    double flops = 0;
    int64_t sent = 0, received = 0;
    for (const spec::TraceEvent& e : back.events) {
      auto key = std::make_pair(e.rank, e.stream);
      EXPECT_GE(e.start_ps, end[key]) << e.name;
      EXPECT_GE(e.duration_ps, 0);
      end[key] = e.start_ps + e.duration_ps;
      if (!spec::is_communication(e.op_class)) flops += e.flops;
      if (e.op_class == spec::OpClass::kSend) sent += e.bytes;
      if (e.op_class == spec::OpClass::kRecv) received += e.bytes;
    }
    // FLOPs in the trace add up to the model's (with recompute: the hardware FLOPs).
    models::StepFlops expected = models::step_flops(model, plan.global_batch, 128, plan.recompute);
    EXPECT_NEAR(flops, expected.hardware, 1e-9 * expected.hardware);
    EXPECT_EQ(sent, received);
    // The breakdown adds up to the step time.
    const spec::TimeBreakdown& b = r.report.breakdown_s;
    double sum = b.compute + b.optimizer + b.tp_comm_exposed + b.dp_comm_exposed +
                 b.pp_comm_exposed + b.fsdp_comm_exposed + b.bubble;
    EXPECT_NEAR(sum, r.report.step_time_s, 1e-9);
  }
}

// Tied embeddings split over pipeline stages: the first and the last stage of every (tp, dp)
// position sum the table's gradient, one all-reduce of vocab/tp x hidden elements in a group of
// two; middle stages, untied models and pp = 1 have none. gpt-tiny: vocabulary 256, hidden 128.
TEST(Simulator, TiedEmbeddingGradientsAreSummedByTheFirstAndLastStage) {
  spec::ClusterSpec cluster = spec::builtin_cluster("dgx-a100");
  spec::ModelSpec model = models::zoo_model("gpt-tiny");
  auto tied_events = [&](const spec::ModelSpec& m, const spec::Plan& plan) {
    std::map<int64_t, int64_t> bytes_by_rank;
    SimulationResult r = simulate(m, cluster, plan, with_trace());
    for (const spec::TraceEvent& e : r.trace->events) {
      if (e.name != "embed.tied_all_reduce") continue;
      EXPECT_EQ(e.group_size, 2);
      bytes_by_rank[e.rank] += e.bytes;
    }
    return bytes_by_rank;
  };
  spec::Plan plan = test::make_plan(1, 2, 4, 1, 8);  // ranks: tp fastest, then pp
  std::map<int64_t, int64_t> got = tied_events(model, plan);
  const int64_t bytes = 256 / 2 * 128 * 2;  // bf16
  std::map<int64_t, int64_t> want = {{0, bytes}, {1, bytes}, {6, bytes}, {7, bytes}};
  EXPECT_EQ(got, want);
  EXPECT_TRUE(tied_events(model, test::make_plan(2, 2, 1, 1, 8)).empty());
  spec::ModelSpec untied = model;
  std::get<spec::TransformerSpec>(untied.body).tied_embeddings = false;
  EXPECT_TRUE(tied_events(untied, plan).empty());
}

TEST(Simulator, AFasterLinkNeverMakesAStepSlower) {
  spec::ModelSpec model = models::zoo_model("gpt2-350m");
  for (spec::Plan plan : {test::make_plan(8, 2, 2, 2, 64), test::make_plan(4, 8, 1, 1, 16),
                          test::make_plan(2, 4, 4, 1, 32)}) {
    for (Fidelity f : {Fidelity::kAnalytic, Fidelity::kFlow}) {
      SimulationOptions o;
      o.fidelity = f;
      spec::ClusterSpec base = spec::builtin_cluster("dgx-a100");
      double t0 = simulate(model, base, plan, o).report.step_time_s;
      spec::ClusterSpec fast_node = base;
      fast_node.network.levels[0].bandwidth_GBps *= 2;
      spec::ClusterSpec fast_nic = base;
      fast_nic.network.levels[1].bandwidth_GBps *= 2;
      EXPECT_LE(simulate(model, fast_node, plan, o).report.step_time_s, t0 * (1 + 1e-12))
          << plan.name();
      EXPECT_LE(simulate(model, fast_nic, plan, o).report.step_time_s, t0 * (1 + 1e-12))
          << plan.name();
    }
  }
}

TEST(Simulator, AStragglerSlowsItsWholeGroup) {
  spec::ModelSpec model = models::zoo_model("gpt2-124m");
  spec::ClusterSpec cluster = spec::builtin_cluster("dgx-a100");
  spec::Plan plan = test::make_plan(4, 2, 1, 4, 64);
  double t0 = simulate(model, cluster, plan, {}).report.step_time_s;
  cluster.speed_overrides.push_back({std::nullopt, 3, 0.5});  // rank 3 at half speed
  SimulationResult slow = simulate(model, cluster, plan, {});
  // Compute is ~all of the step: a half-speed rank nearly doubles it, and its tp partner waits.
  EXPECT_GT(slow.report.step_time_s, 1.8 * t0);
  EXPECT_GT(slow.ranks[2].tp, 0);
}

TEST(Simulator, ADegradedNicSlowsCrossNodeTraffic) {
  spec::ModelSpec model = models::zoo_model("gpt2-350m");
  spec::ClusterSpec cluster = spec::builtin_cluster("dgx-a100");
  spec::Plan plan = test::make_plan(2, 8, 1, 2, 64);
  plan.stack->dp_overlap = false;
  double t0 = simulate(model, cluster, plan, {}).report.step_time_s;
  cluster.link_overrides.push_back({"infiniband", 1, std::nullopt, 0.1});
  for (Fidelity f : {Fidelity::kAnalytic, Fidelity::kFlow}) {
    SimulationOptions o;
    o.fidelity = f;
    EXPECT_GT(simulate(model, cluster, plan, o).report.step_time_s, t0 * 1.01);
  }
}

TEST(Simulator, RejectsImpossiblePlansWithTheRule) {
  spec::ClusterSpec cluster = spec::builtin_cluster("dgx-a100");
  spec::ModelSpec model = models::zoo_model("gpt3-1.3b");
  EXPECT_INPUT_ERROR(simulate(model, cluster, test::make_plan(1, 3, 1, 1, 1), {}),
                     "must divide the 16 attention heads");
  EXPECT_INPUT_ERROR(simulate(model, cluster, test::make_plan(1, 1, 32, 1, 1), {}),
                     "must not exceed the model's 24 layers");
  EXPECT_INPUT_ERROR(
      simulate(model, spec::builtin_cluster("h100-1gpu"), test::make_plan(2, 1, 1, 1, 2), {}),
      "needs 2 devices; cluster h100-1gpu has 1");
}

TEST(Simulator, AnswersForEveryZooTransformerOnEveryCluster) {
  for (const std::string& name : models::zoo_names()) {
    spec::ModelSpec model = models::zoo_model(name);
    if (!model.is_transformer()) continue;
    const spec::TransformerSpec& t = model.transformer();
    for (const std::string& cname : spec::builtin_cluster_names()) {
      spec::ClusterSpec cluster = spec::builtin_cluster(cname);
      for (int64_t gpus : {int64_t{1}, int64_t{16}, int64_t{4096}}) {
        if (gpus > cluster.total_devices()) continue;
        int64_t tp = 1;
        while (tp * 2 <= std::min(cluster.devices_per_node, gpus) && t.heads % (tp * 2) == 0 &&
               t.kv_heads % (tp * 2) == 0)
          tp *= 2;
        int64_t pp = 1;
        while (pp * 2 * tp <= gpus && pp * 2 <= std::min<int64_t>(t.layers, 16)) pp *= 2;
        int64_t dp = gpus / (tp * pp);
        spec::Plan plan = test::make_plan(dp, tp, pp, 1, dp * pp);
        plan.recompute = spec::Recompute::kFull;
        plan.sequence_parallel = t.moe && tp > 1;  // a mixture of experts with tp needs it
        SimulationResult r = simulate(model, cluster, plan, {});
        EXPECT_GT(r.report.step_time_s, 0) << name << " " << cname << " " << plan.name();
        EXPECT_LT(r.report.mfu, 1.0) << name << " " << cname << " " << plan.name();
      }
    }
  }
}

TEST(Simulator, CnnAndMlpSimulateWithDataAndPipelineParallelism) {
  spec::ClusterSpec cluster = spec::builtin_cluster("dgx-a100");
  for (const char* name : {"resnet50", "wrn50-2", "vgg19", "alexnet", "mlp-small"}) {
    spec::ModelSpec model = models::zoo_model(name);
    SimulationResult dp = simulate(model, cluster, test::make_plan(8, 1, 1, 32, 256), {});
    SimulationResult pp = simulate(model, cluster, test::make_plan(2, 1, 4, 8, 256), {});
    EXPECT_GT(dp.report.samples_per_s, 0) << name;
    EXPECT_GT(pp.report.samples_per_s, 0) << name;
  }
}

}  // namespace
}  // namespace sextant::sim
