// CPU ranks run their collectives on the cores that compute (spec::collectives_block): whatever
// the stack's overlap knobs say, the simulated step runs every collective between two computes,
// and the closed-form estimate prices the same serial step.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "sextant/models/zoo.hpp"
#include "sextant/planner/estimator.hpp"
#include "sextant/planner/planner.hpp"
#include "sextant/sim/simulator.hpp"
#include "sextant/spec/cluster_catalog.hpp"
#include "sextant/spec/stack_on_cluster.hpp"
#include "test_clusters.hpp"
#include "test_models.hpp"

namespace sextant {
namespace {

// The ideal cluster's device as a CPU core: 1 TFLOP/s, 10 GB/s between ranks, 5 us latency, so
// that every collective takes a visible share of the step.
spec::ClusterSpec cpu_cluster() {
  spec::ClusterSpec c = test::ideal_cluster(1, 10, 10, 5);
  c.device.kind = spec::DeviceKind::kCpu;
  return c;
}

// Seconds during which a communication event of `rank` runs beside one of its computes. A
// receive's event spans its wait from when the stage posted it, not work of the rank: skipped.
double overlapped_s(const spec::Trace& trace, int64_t rank) {
  std::vector<const spec::TraceEvent*> compute, comm;
  for (const spec::TraceEvent& e : trace.events) {
    if (e.rank != rank || e.duration_ps == 0 || e.op_class == spec::OpClass::kRecv) continue;
    (e.stream == spec::Stream::kCompute ? compute : comm).push_back(&e);
  }
  Picoseconds both = 0;
  for (const spec::TraceEvent* a : comm)
    for (const spec::TraceEvent* b : compute) {
      const Picoseconds from = std::max(a->start_ps, b->start_ps);
      const Picoseconds to = std::min(a->start_ps + a->duration_ps, b->start_ps + b->duration_ps);
      if (to > from) both += to - from;
    }
  return ps_to_seconds(both);
}

// Every layout family with a collective the stack would overlap on a GPU: DDP buckets reduced
// during the backward, ZeRO-1's gather beside the next forward, ZeRO-3's prefetched gathers and
// its scatters beside the backward, stage transfers beside compute, tensor-parallel overlap.
// MLP plans but the last, a transformer's (tensor parallelism splits heads).
std::vector<spec::Plan> overlapping_plans() {
  std::vector<spec::Plan> plans;
  for (int64_t zero : {0, 1, 2, 3}) {
    spec::Plan p = test::make_plan(2, 1, 1, 64, 256);
    p.zero = zero;
    p.stack->dp_bucket_bytes = 1;  // a bucket per layer
    p.stack->param_gather_overlap = true;
    p.stack->zero3_prefetch = 2;
    plans.push_back(p);
  }
  spec::Plan pp = test::make_plan(1, 1, 2, 64, 256);
  plans.push_back(pp);
  spec::Plan tp = test::make_plan(1, 2, 1, 4, 16);
  tp.sequence_parallel = true;
  tp.stack->tp_overlap = spec::TpOverlap::kPipelined;
  plans.push_back(tp);
  for (spec::Plan& p : plans) p.dtype = spec::Dtype::kFp32;
  return plans;
}

spec::ModelSpec model_for(const spec::Plan& plan) {
  return plan.tp > 1 ? models::zoo_model("gpt-tiny") : test::uniform_mlp(6, 512);
}

TEST(CpuCollectives, TheStackRunsWithEveryOverlapOff) {
  spec::Stack gpu = test::plain_stack();
  gpu.tp_overlap = spec::TpOverlap::kPipelined;
  gpu.param_gather_overlap = true;
  const spec::Stack run = spec::stack_on(cpu_cluster(), gpu);
  EXPECT_FALSE(run.dp_overlap);
  EXPECT_FALSE(run.param_gather_overlap);
  EXPECT_FALSE(run.pp_overlap);
  EXPECT_EQ(run.tp_overlap, spec::TpOverlap::kNone);
  EXPECT_EQ(run.zero3_prefetch, 0);
  EXPECT_EQ(run.dp_bucket_bytes, gpu.dp_bucket_bytes);  // what does not overlap is kept
  EXPECT_TRUE(spec::stack_on(test::ideal_cluster(), gpu) == gpu);
}

TEST(CpuCollectives, NoCollectiveRunsBesideCompute) {
  const spec::ClusterSpec cluster = cpu_cluster();
  sim::SimulationOptions traced;
  traced.trace = true;
  for (const spec::Plan& plan : overlapping_plans()) {
    SCOPED_TRACE(plan.name());
    const spec::ModelSpec model = model_for(plan);
    const sim::SimulationResult cpu = sim::simulate(model, cluster, plan, traced);
    double comm = 0;
    for (const spec::TraceEvent& e : cpu.trace->events)
      if (e.rank == 0 && e.stream != spec::Stream::kCompute) comm += ps_to_seconds(e.duration_ps);
    ASSERT_GT(comm, 0.02 * cpu.report.step_time_s);  // the collectives matter
    EXPECT_LT(overlapped_s(*cpu.trace, 0), 1e-12);
    // The same plan on a GPU overlaps some of them (else the test shows nothing).
    spec::ClusterSpec gpu = cluster;
    gpu.device.kind = spec::DeviceKind::kGpu;
    EXPECT_GT(overlapped_s(*sim::simulate(model, gpu, plan, traced).trace, 0), 0);
  }
}

TEST(CpuCollectives, DataParallelStepIsItsComputeThenItsCollectives) {
  // Ranks of one data-parallel group run the same ops and meet at each collective together, so a
  // step with nothing beside anything lasts the sum of rank 0's events.
  const spec::ClusterSpec cluster = cpu_cluster();
  const spec::ModelSpec model = test::uniform_mlp(6, 512);
  sim::SimulationOptions traced;
  traced.trace = true;
  for (const spec::Plan& plan : overlapping_plans()) {
    if (plan.dp == 1) continue;
    SCOPED_TRACE(plan.name());
    const sim::SimulationResult r = sim::simulate(model, cluster, plan, traced);
    double sum = 0;
    for (const spec::TraceEvent& e : r.trace->events)
      if (e.rank == 0) sum += ps_to_seconds(e.duration_ps);
    EXPECT_NEAR(r.report.step_time_s, sum, 1e-9 * sum);
  }
}

TEST(CpuCollectives, TheEstimatePricesTheSerialStep) {
  const spec::ClusterSpec cluster = cpu_cluster();
  for (const spec::Plan& plan : overlapping_plans()) {
    SCOPED_TRACE(plan.name());
    const spec::ModelSpec model = model_for(plan);
    planner::Estimator estimator(model, cluster);
    const double simulated = sim::simulate(model, cluster, plan, {}).report.step_time_s;
    EXPECT_NEAR(estimator.estimate(plan).step_time_s, simulated, 0.01 * simulated);
  }
}

TEST(CpuCollectives, TheSearchTriesNoOverlapVariants) {
  // The sextant stack's software lets dp_overlap and the bucket vary: on a GPU cluster the search
  // tries dp_overlap off too; on CPU ranks, where stack_on turns it off anyway, it would only
  // repeat a plan.
  planner::SearchRequest r;
  r.model = models::zoo_model("gpt2-124m");  // gradients in many buckets
  r.gpus = 2;
  r.global_batch = 16;
  r.stack = spec::builtin_stack("sextant");
  planner::SearchOptions o;
  o.top_k = 1000;
  o.leaders = 0;              // every plan that fits
  o.variants_per_layout = 0;  // with all its stack variants
  auto overlap_off = [](const planner::SearchResult& result) {
    int64_t n = 0;
    for (const planner::RankedPlan& p : result.ranked) n += p.plan.stack->dp_overlap ? 0 : 1;
    return n;
  };
  r.cluster = spec::builtin_cluster("local-cpu");
  const planner::SearchResult cpu = planner::search(r, o);
  EXPECT_EQ(overlap_off(cpu), 0);
  r.cluster = spec::builtin_cluster("dgx-a100");
  EXPECT_GT(overlap_off(planner::search(r, o)), 0);
}

}  // namespace
}  // namespace sextant
