// simulate --explain-memory: the itemized parts of a rank's peak come from the same code as the
// peak, so they must add up to it, part by part, whatever the layout.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "sextant/models/zoo.hpp"
#include "sextant/sim/simulator.hpp"
#include "sextant/spec/cluster_catalog.hpp"
#include "sextant/spec/report.hpp"
#include "sextant/spec/stack.hpp"

namespace sextant::sim {
namespace {

spec::MemoryBreakdown explained(const spec::ModelSpec& model, const spec::Plan& plan) {
  SimulationOptions o;
  o.explain_memory = true;
  return simulate(model, spec::builtin_cluster("dgx-a100"), plan, o).report.memory;
}

spec::Plan plan_of(int64_t dp, int64_t tp, int64_t pp, int zero, int64_t micro_batch,
                   int64_t global_batch, const char* stack = "megatron-core") {
  spec::Plan p;
  p.dp = dp;
  p.tp = tp;
  p.pp = pp;
  p.zero = zero;
  p.micro_batch = micro_batch;
  p.global_batch = global_batch;
  p.stack = spec::builtin_stack(stack);
  return p;
}

TEST(ExplainMemory, ThePartsAddUpToThePeakInEveryLayout) {
  const spec::ModelSpec gpt = models::zoo_model("gpt3-1.3b");
  std::vector<spec::Plan> plans;
  plans.push_back(plan_of(8, 1, 1, 1, 4, 64));
  plans.push_back(plan_of(8, 1, 1, 3, 2, 32, "torchtitan"));
  spec::Plan interleaved = plan_of(2, 2, 2, 0, 1, 16);
  interleaved.schedule = spec::Schedule::kInterleaved;
  interleaved.virtual_stages = 2;
  interleaved.recompute = spec::Recompute::kFull;
  plans.push_back(interleaved);
  spec::Plan selective = plan_of(4, 2, 1, 2, 2, 32);
  selective.sequence_parallel = true;
  selective.recompute = spec::Recompute::kSelective;
  plans.push_back(selective);
  spec::Plan autocast = plan_of(8, 1, 1, 0, 2, 16, "pytorch-fsdp");
  autocast.stack->autocast = true;
  plans.push_back(autocast);
  spec::Plan offloaded = plan_of(8, 1, 1, 2, 2, 16, "deepspeed");
  offloaded.offload.optimizer = spec::OffloadTarget::kHost;
  plans.push_back(offloaded);
  spec::Plan two_bw = plan_of(2, 1, 4, 0, 1, 16);
  two_bw.schedule = spec::Schedule::kPipeDream2BW;
  plans.push_back(two_bw);
  for (const spec::Plan& plan : plans) {
    const spec::MemoryBreakdown m = explained(gpt, plan);
    ASSERT_FALSE(m.explained.empty()) << plan.name();
    std::map<std::string, int64_t> by_part;
    int64_t total = 0;
    for (const spec::MemoryItem& i : m.explained) {
      EXPECT_GT(i.bytes, 0) << plan.name() << " " << i.part << ": " << i.detail;
      EXPECT_FALSE(i.detail.empty()) << plan.name() << " " << i.part;
      by_part[i.part] += i.bytes;
      total += i.bytes;
    }
    EXPECT_EQ(total, m.peak_bytes) << plan.name();
    EXPECT_EQ(by_part["weights"], m.weights) << plan.name();
    EXPECT_EQ(by_part["gradients"], m.gradients) << plan.name();
    EXPECT_EQ(by_part["optimizer"], m.optimizer) << plan.name();
    EXPECT_EQ(by_part["activations"], m.activations) << plan.name();
    EXPECT_EQ(by_part["buffers"], m.buffers) << plan.name();
    EXPECT_EQ(by_part["reserved"], m.reserved) << plan.name();
  }
}

TEST(ExplainMemory, SaysHowEachPartArises) {
  // gpt2-124m, dp 8, ZeRO-1, bf16 with megatron-core's fp32 gradients: 124,439,808 parameters
  // (GPT-2's 50257-row table padded to 50304 rows: 47 x 768 more = 124,475,904) x 2 B of weights,
  // x 4 B of gradients, and a 1/8 shard of 12 B of optimizer state each.
  const spec::MemoryBreakdown m =
      explained(models::zoo_model("gpt2-124m"), plan_of(8, 1, 1, 1, 4, 32));
  const auto item = [&](const std::string& part) {
    for (const spec::MemoryItem& i : m.explained)
      if (i.part == part) return i;
    return spec::MemoryItem{};
  };
  EXPECT_EQ(item("weights").bytes, m.weights);
  EXPECT_EQ(item("weights").detail, "124,475,904 parameters x 2 B");
  EXPECT_EQ(item("gradients").detail, "124,475,904 parameters x 4 B (fp32)");
  EXPECT_NE(item("optimizer").detail.find("a 1/8 ZeRO shard"), std::string::npos);
  EXPECT_NE(item("activations").detail.find("in flight at the peak"), std::string::npos);
  EXPECT_NE(item("activations").detail.find("block0-block11: 12 x "), std::string::npos);
  // Not asked for: no items.
  const spec::MemoryBreakdown plain =
      simulate(models::zoo_model("gpt2-124m"), spec::builtin_cluster("dgx-a100"),
               plan_of(8, 1, 1, 1, 4, 32), SimulationOptions{})
          .report.memory;
  EXPECT_TRUE(plain.explained.empty());
  EXPECT_EQ(plain.peak_bytes, m.peak_bytes);
}

TEST(ExplainMemory, TheReportCarriesTheItems) {
  spec::Report r;
  r.model = "m";
  r.cluster = "c";
  r.plan = "p";
  r.gpus = 1;
  r.network = "analytic";
  r.memory.peak_bytes = 10;
  r.memory.capacity_bytes = 20;
  r.memory.headroom_bytes = 10;
  r.memory.weights = 10;
  r.memory.explained = {{"weights", 10, "5 parameters x 2 B"}};
  const spec::Report back = spec::report_from_json(spec::to_json(r), "r.json");
  EXPECT_EQ(back.memory.explained, r.memory.explained);
}

}  // namespace
}  // namespace sextant::sim
