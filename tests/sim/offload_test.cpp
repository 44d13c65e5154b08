// Offloading (ZeRO-Offload, Ren et al., USENIX ATC'21; ZeRO-Infinity, Rajbhandari et al., SC'21):
// the plan's rules, the device and host memory it leaves, and the host step and copies the
// simulator schedules (the planner's proposal: tests/planner). Every expected time is derived
// here from the test cluster's numbers.
#include <gtest/gtest.h>

#include "sextant/models/lowering.hpp"
#include "sextant/sim/memory_model.hpp"
#include "sextant/sim/simulator.hpp"
#include "sextant/spec/error.hpp"
#include "test_clusters.hpp"
#include "test_models.hpp"

namespace sextant::sim {
namespace {

constexpr int64_t kMlpLayers = 8, kMlpWidth = 1024, kMlpBatch = 1024;
constexpr double kParams = kMlpLayers * kMlpWidth * kMlpWidth;  // bias-free square layers

// The ideal cluster (GEMMs at exactly 100 TFLOP/s, memory-bound ops free) with a host: PCIe at
// 100 GB/s each way, 100 GB/s of DRAM for the node's 8 devices (12.5 GB/s a rank).
spec::ClusterSpec cluster_with_host() {
  return test::ideal_cluster_with_host(100);
}

spec::Plan one_gpu(int zero, spec::Offload offload) {
  spec::Plan p = test::make_plan(1, 1, 1, kMlpBatch, kMlpBatch);
  p.dtype = spec::Dtype::kBf16;
  p.zero = zero;
  p.offload = offload;
  p.stack->dp_bucket_bytes = 1;  // one bucket per layer
  return p;
}

constexpr spec::Offload kOptimizerOnHost{spec::OffloadTarget::kHost, spec::OffloadTarget::kNone};
constexpr spec::Offload kAllOnHost{spec::OffloadTarget::kHost, spec::OffloadTarget::kHost};

TEST(Offload, PlanRulesAndRoundTrip) {
  spec::Json j = {{"schema", "sextant.plan/1"},
                  {"dp", 2},
                  {"tp", 1},
                  {"pp", 1},
                  {"zero", 0},
                  {"micro_batch", 1},
                  {"global_batch", 2},
                  {"offload", {{"optimizer", "host"}}}};
  try {
    spec::plan_from_json(j, "p.json");
    FAIL() << "optimizer offload without ZeRO was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("/offload/optimizer"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("zero >= 1"), std::string::npos) << e.what();
  }
  j["zero"] = 2;
  j["offload"]["params"] = "host";
  try {
    spec::plan_from_json(j, "p.json");
    FAIL() << "parameter offload below ZeRO-3 was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("/offload/params"), std::string::npos) << e.what();
  }
  j["zero"] = 3;
  j["offload"]["params"] = "nvme";
  const spec::Plan p = spec::plan_from_json(j, "p.json");
  EXPECT_EQ(p.offload.optimizer, spec::OffloadTarget::kHost);
  EXPECT_EQ(p.offload.params, spec::OffloadTarget::kNvme);
  EXPECT_NE(p.name().find(".off-opt.off-par-nvme"), std::string::npos) << p.name();
  EXPECT_EQ(spec::plan_from_json(spec::to_json(p), "round trip").offload, p.offload);
  j["offload"]["params"] = "gpu";
  EXPECT_THROW(spec::plan_from_json(j, "p.json"), InputError);
}

TEST(Offload, ClusterWithoutHostOrNvmeIsRefused) {
  const spec::ModelSpec model = test::uniform_mlp(kMlpLayers, kMlpWidth);
  try {
    simulate(model, test::ideal_cluster(100), one_gpu(2, kOptimizerOnHost), {});
    FAIL() << "offloaded without a host section";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("no \"host\" section"), std::string::npos) << e.what();
  }
  spec::Offload nvme{spec::OffloadTarget::kNvme, spec::OffloadTarget::kNone};
  EXPECT_THROW(simulate(model, cluster_with_host(), one_gpu(2, nvme), {}), InputError);
}

TEST(Offload, StateLeavesTheDeviceForTheHost) {
  const spec::ModelSpec model = test::uniform_mlp(kMlpLayers, kMlpWidth);
  const spec::ClusterSpec cluster = cluster_with_host();
  const models::LoweredModel lowered =
      models::lower(model, {kMlpBatch, 0, spec::Dtype::kBf16, 1, false});
  const spec::Plan base = one_gpu(2, {});
  const spec::MemoryBreakdown on_device = stage_memory(base, *base.stack, lowered, 0, &cluster);
  // ZeRO's K = 12 bytes of optimizer state per parameter (Rajbhandari et al., Figure 1).
  EXPECT_DOUBLE_EQ(static_cast<double>(on_device.optimizer), 12 * kParams);
  EXPECT_EQ(on_device.host_bytes, 0);

  // ZeRO-Offload: no optimizer state and (ZeRO-2) no gradient buffer on the device; the host
  // holds fp32 master weights (4), moments (8) and fp32 gradients (4) per parameter.
  const spec::Plan opt = one_gpu(2, kOptimizerOnHost);
  const spec::MemoryBreakdown m = stage_memory(opt, *opt.stack, lowered, 0, &cluster);
  EXPECT_EQ(m.optimizer, 0);
  EXPECT_EQ(m.gradients, 0);
  EXPECT_EQ(m.weights, on_device.weights);
  EXPECT_DOUBLE_EQ(static_cast<double>(m.host_bytes), 16 * kParams);
  EXPECT_EQ(m.host_capacity_bytes, (int64_t{1} << 40) / 8);  // the node's memory, 8 ranks
  EXPECT_TRUE(m.fits);

  // ZeRO-Infinity's parameters too: no weights on the device, their 2-byte copy on the host.
  const spec::Plan all = one_gpu(3, kAllOnHost);
  const spec::MemoryBreakdown a = stage_memory(all, *all.stack, lowered, 0, &cluster);
  EXPECT_EQ(a.weights, 0);
  EXPECT_DOUBLE_EQ(static_cast<double>(a.host_bytes), 18 * kParams);

  // A host too small: the plan does not fit although the device would hold it.
  spec::ClusterSpec small = cluster;
  small.host->memory_bytes = 8 * static_cast<int64_t>(16 * kParams) - 8;
  EXPECT_FALSE(stage_memory(opt, *opt.stack, lowered, 0, &small).fits);
  // No host section: the offloaded state has nowhere to go.
  spec::ClusterSpec none = cluster;
  none.host.reset();
  const spec::MemoryBreakdown n = stage_memory(opt, *opt.stack, lowered, 0, &none);
  EXPECT_EQ(n.host_capacity_bytes, 0);
  EXPECT_FALSE(n.fits);
}

TEST(Offload, OptimizerStepRunsOnTheHostAfterTheLastGradientCopy) {
  const spec::ModelSpec model = test::uniform_mlp(kMlpLayers, kMlpWidth);
  const spec::ClusterSpec cluster = cluster_with_host();
  const SimulationResult base = simulate(model, cluster, one_gpu(2, {}), {});
  const SimulationResult off = simulate(model, cluster, one_gpu(2, kOptimizerOnHost), {});
  // By hand. A layer's backward is two GEMMs of 2 b w^2 FLOPs at 100 TFLOP/s: 42.9 us, longer
  // than the copy of the layer before's bf16 gradients to the host, 2 w^2 B at 100 GB/s = 21.0
  // us, so only the last layer's copy (the first layer's gradients) is exposed. Then CPU-Adam
  // moves 34 bytes per parameter (Megatron's passes, models/optimizer_step.hpp: AdamW on fp32
  // param, grad, m, v 16 + 12, the master weights to the bf16 copy 4 + 2; the gradients are
  // fp32 already) at this rank's 12.5 GB/s of DRAM, and the bf16 parameters return at 100 GB/s.
  const double copy_last = 2.0 * kMlpWidth * kMlpWidth / 100e9;
  const double adam = 34 * kParams / 12.5e9;
  const double back = 2 * kParams / 100e9;
  const spec::TimeBreakdown& b = off.report.breakdown_s;
  EXPECT_EQ(b.optimizer, 0);  // nothing of the step on the device
  EXPECT_NEAR(b.offload_exposed, copy_last + adam + back, 1e-9);
  EXPECT_NEAR(b.compute, base.report.breakdown_s.compute, 1e-9);
  EXPECT_NEAR(off.report.step_time_s,
              base.report.step_time_s - base.report.breakdown_s.optimizer + b.offload_exposed,
              1e-9);
}

TEST(Offload, OffloadedParametersAreFetchedBeforeEveryLayerRuns) {
  const spec::ModelSpec model = test::uniform_mlp(kMlpLayers, kMlpWidth);
  SimulationOptions options;
  options.trace = true;
  spec::Plan plan = one_gpu(3, kAllOnHost);
  plan.micro_batch = kMlpBatch / 2;  // two micro-batches
  const SimulationResult r = simulate(model, cluster_with_host(), plan, options);
  ASSERT_TRUE(r.trace.has_value());
  // Each micro-batch's forward and backward fetch every layer's bf16 parameters (2 bytes each);
  // the updated parameters stay on the host, so the step copies none back.
  double fetched_fwd = 0, fetched_bwd = 0, returned = 0, to_host = 0;
  int steps = 0;
  for (const spec::TraceEvent& e : r.trace->events) {
    // Copies to the device on their own stream, copies to the host and the host step on the
    // other (PCIe full duplex), everything else on the compute stream.
    const spec::Stream expected = e.name == "offload.params_to_device" ? spec::Stream::kOffloadIn
                                  : e.name.starts_with("offload.")     ? spec::Stream::kOffload
                                                                       : spec::Stream::kCompute;
    EXPECT_EQ(e.stream, expected) << e.name;
    if (e.name == "offload.params_to_device") {
      if (e.phase == spec::Phase::kFwd) fetched_fwd += static_cast<double>(e.bytes);
      if (e.phase == spec::Phase::kBwd) fetched_bwd += static_cast<double>(e.bytes);
      if (e.phase == spec::Phase::kOpt) returned += static_cast<double>(e.bytes);
    }
    if (e.name == "offload.grad_to_host") to_host += static_cast<double>(e.bytes);
    if (e.name == "offload.adamw") ++steps;
  }
  EXPECT_DOUBLE_EQ(fetched_fwd, 2 * 2 * kParams);
  EXPECT_DOUBLE_EQ(fetched_bwd, 2 * 2 * kParams);
  EXPECT_EQ(returned, 0);
  EXPECT_DOUBLE_EQ(to_host, 2 * kParams);  // once, after the last micro-batch's backward
  EXPECT_EQ(steps, 1);
  EXPECT_GT(r.report.breakdown_s.offload_exposed, 0);
}

}  // namespace
}  // namespace sextant::sim
