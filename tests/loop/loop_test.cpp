// The calibration loop's checks: a fit re-predicts the steps it was fitted on, and the whole-step
// class fit closes a real profiler trace within bounds.
#include <gtest/gtest.h>

#include <cmath>

#include "sextant/loop/class_fit.hpp"
#include "sextant/loop/run_fit.hpp"
#include "sextant/loop/step_check.hpp"
#include "sextant/models/zoo.hpp"
#include "sextant/sim/simulator.hpp"
#include "sextant/spec/cluster_catalog.hpp"
#include "sextant/spec/json_io.hpp"
#include "sextant/spec/plan.hpp"
#include "sextant/spec/stack.hpp"
#include "sextant/traces/calibration.hpp"
#include "sextant/traces/samples.hpp"
#include "test_models.hpp"
#include "test_paths.hpp"

namespace sextant::loop {
namespace {

// A "measured" run made by the simulator with a known host time per step: its ops are the
// model's own, and the step is the simulated one plus `host_s`.
spec::Trace synthetic_run(const spec::ModelSpec& model, const spec::ClusterSpec& cluster,
                          const spec::Plan& plan, double host_s) {
  sim::SimulationOptions options;
  options.trace = true;
  sim::SimulationResult r = sim::simulate(model, cluster, plan, options);
  spec::Trace t = *r.trace;
  t.kind = "measured";
  t.metadata = {{"model", model.name},
                {"model_json", spec::to_json(model)},
                {"plan", plan.name()},
                {"plan_json", spec::to_json(plan)},
                {"stack", spec::kExecutorStack},
                {"dtype", "fp32"},
                {"step_time_s", r.report.step_time_s + host_s}};
  return t;
}

TEST(StepCheck, ACalibrationThatLearnsTheHostTimePredictsItsOwnRunsAgain) {
  const spec::ModelSpec model = models::zoo_model("gpt-tiny");
  const spec::ClusterSpec cluster = spec::builtin_cluster("local-cpu");
  spec::Plan plan = test::make_plan(1, 1, 1, 4, 16);
  plan.stack = spec::builtin_stack(spec::kExecutorStack);
  constexpr double kHost = 0.005;  // 5 ms of host work per step, which no op shows
  std::vector<std::pair<std::string, spec::Trace>> runs = {
      {"run.json", synthetic_run(model, cluster, plan, kHost)}};
  const double simulated = runs[0].second.metadata["step_time_s"].get<double>() - kHost;
  traces::Samples samples = traces::samples_from_trace(runs[0].second, "run.json");
  traces::Calibration c = traces::calibrate(cluster, samples, spec::Dtype::kFp32);
  EXPECT_NEAR(c.cluster.device.step_overhead_us, kHost * 1e6, 1.0);
  StepCheck check = check_steps(runs, cluster, c.cluster);
  ASSERT_EQ(check.rows.size(), 1u);
  // Before: the model misses exactly the host time, -5 ms of the measured step.
  EXPECT_NEAR(check.rows[0].error_before(), -kHost / (simulated + kHost), 1e-3);
  EXPECT_LT(check.mean_abs_error_after(), 0.01);
  EXPECT_TRUE(check.skipped.empty());
}

// The loop's one fit: samples of the runs, the op-level calibration and the check on the runs.
// A run whose step holds 5 ms no op shows is fitted (the host time is learned, the run predicted
// within 1%) and may be written; the same runs with a fit forced worse would be refused.
TEST(RunFit, FitsTheRunsAndChecksTheFitOnThem) {
  const spec::ModelSpec model = models::zoo_model("gpt-tiny");
  const spec::ClusterSpec cluster = spec::builtin_cluster("local-cpu");
  spec::Plan plan = test::make_plan(1, 1, 1, 4, 16);
  plan.stack = spec::builtin_stack(spec::kExecutorStack);
  constexpr double kHost = 0.005;
  const std::vector<std::pair<std::string, spec::Trace>> runs = {
      {"run.json", synthetic_run(model, cluster, plan, kHost)}};
  const RunFit fit = fit_runs(cluster, runs, {});
  EXPECT_NEAR(fit.calibration.cluster.device.step_overhead_us, kHost * 1e6, 1.0);
  ASSERT_EQ(fit.check.rows.size(), 1u);
  EXPECT_LT(std::fabs(fit.check.rows[0].error_after()), 0.01);
  EXPECT_GT(std::fabs(fit.check.rows[0].error_before()), 0.01);
  EXPECT_EQ(fit.refused, "");
  EXPECT_FALSE(fit.class_fit.has_value());
  // The same check, with the fitted file as the base and the original as the "fit": worse.
  EXPECT_NE(refusal(check_steps(runs, fit.calibration.cluster, cluster)), "");
}

// Three runs of one plan are one row whose time is their median: host times of 1, 5 and 30 ms
// (the last a run disturbed by a neighbour) give the 5 ms run's step.
TEST(StepCheck, RepeatedRunsOfAPlanAreOneRowAtTheirMedian) {
  const spec::ModelSpec model = models::zoo_model("gpt-tiny");
  const spec::ClusterSpec cluster = spec::builtin_cluster("local-cpu");
  spec::Plan plan = test::make_plan(1, 1, 1, 4, 16);
  plan.stack = spec::builtin_stack(spec::kExecutorStack);
  std::vector<std::pair<std::string, spec::Trace>> runs;
  for (double host : {0.030, 0.001, 0.005})
    runs.push_back({"run.json", synthetic_run(model, cluster, plan, host)});
  const double simulated = runs[1].second.metadata["step_time_s"].get<double>() - 0.001;
  StepCheck check = check_steps(runs, cluster, cluster);
  ASSERT_EQ(check.rows.size(), 1u);
  EXPECT_EQ(check.rows[0].runs, 3);
  EXPECT_NEAR(check.rows[0].measured_s, simulated + 0.005, 1e-12);
}

// A fit stands on the ops the run did: the check re-simulates each run and says which ops the
// simulated step holds differently. The simulator's own trace agrees with itself; a recorded run
// of the executor (gpt-tiny, dp 2) agrees with today's simulator; a run missing its data-parallel
// all-reduces and holding an op the lowering has never heard of is reported op by op.
TEST(StepCheck, RunsWhoseOpsTheSimulatorDoesNotHoldAreNamed) {
  const spec::ModelSpec model = models::zoo_model("gpt-tiny");
  const spec::ClusterSpec cluster = spec::builtin_cluster("local-cpu");
  spec::Plan plan = test::make_plan(2, 1, 1, 4, 16);
  plan.stack = spec::builtin_stack(spec::kExecutorStack);
  spec::Trace run = synthetic_run(model, cluster, plan, 0.0);
  StepCheck same = check_steps({{"run.json", run}}, cluster, cluster);
  ASSERT_EQ(same.rows.size(), 1u);
  EXPECT_TRUE(same.rows[0].mismatched_ops.empty());
  EXPECT_TRUE(op_warnings(same).empty());

  const spec::Trace recorded =
      spec::read_trace_file(test::source_path("traces/samples/run-gpt-tiny-dp2.json"));
  StepCheck executor = check_steps({{"run-gpt-tiny-dp2.json", recorded}}, cluster, cluster);
  ASSERT_EQ(executor.rows.size(), 1u);
  EXPECT_TRUE(executor.rows[0].mismatched_ops.empty()) << executor.rows[0].mismatched_ops[0].name;

  int64_t all_reduces = 0;  // on ranks 0 and 1, in the first step
  std::vector<spec::TraceEvent> kept;
  for (const spec::TraceEvent& e : run.events) {
    if (e.name == "dp.all_reduce") {
      all_reduces += e.step == 0 ? 1 : 0;
      continue;
    }
    kept.push_back(e);
  }
  spec::TraceEvent extra = kept.front();
  extra.name = "attn.mystery";
  kept.push_back(extra);
  run.events = kept;
  StepCheck check = check_steps({{"run.json", run}}, cluster, cluster);
  ASSERT_EQ(check.rows.size(), 1u);
  const std::vector<traces::OpMismatch>& m = check.rows[0].mismatched_ops;
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].name, "attn.mystery");
  EXPECT_EQ(m[0].measured_count, 1);
  EXPECT_EQ(m[0].predicted_count, 0);
  EXPECT_EQ(m[1].name, "dp.all_reduce");
  EXPECT_EQ(m[1].measured_count, 0);
  EXPECT_EQ(m[1].predicted_count, all_reduces);
  EXPECT_GT(all_reduces, 0);
  ASSERT_EQ(op_warnings(check).size(), 1u);
  EXPECT_NE(op_warnings(check)[0].find("attn.mystery (1x measured, 0x predicted)"),
            std::string::npos)
      << op_warnings(check)[0];
}

// The rule that keeps a bad fit from being written: worse mean |error| on the fitted plans.
TEST(StepCheck, AFitThatPredictsItsPlansWorseIsRefused) {
  StepCheck check;
  check.rows.push_back({"a.json", "a", 3, 0.100, 0.110, 0.104, {}});  // +10% -> +4%
  check.rows.push_back({"b.json", "b", 3, 0.200, 0.190, 0.212, {}});  // -5% -> +6%
  EXPECT_EQ(refusal(check), "");                                      // mean 7.5% -> 5%
  check.rows.push_back({"c.json", "c", 3, 0.100, 0.100, 0.120, {}});  // 0% -> +20%
  EXPECT_NE(refusal(check).find("worse after the fit (10.0% mean |error|) than before (5.0%)"),
            std::string::npos);
}

// The same rule for a profiled step: 50 ms measured, 40 before the fit; 48 after may be written,
// 61 (11 ms off against 10) may not.
TEST(ClassFit, AFitThatPredictsTheProfiledStepWorseIsRefused) {
  ClassFit fit;
  fit.measured_step_s = 0.050;
  fit.before_step_s = 0.040;
  fit.after_step_s = 0.048;
  EXPECT_EQ(refusal(fit), "");
  fit.after_step_s = 0.061;
  EXPECT_NE(refusal(fit).find("worse after the fit (61.00 ms) than before (40.00 ms"),
            std::string::npos);
}

// The same rule for the compute ops the fit was made from: their time-weighted mean |error|.
TEST(RunFit, AFitThatPredictsItsComputeOpsWorseIsRefused) {
  traces::CalibrationReport r;
  EXPECT_EQ(refusal(r), "");  // no compute ops: nothing to hold it to
  r.compute_samples = 10;
  r.compute_time_error_before = 0.27;
  r.compute_time_error_after = 0.175;
  EXPECT_EQ(refusal(r), "");
  r.compute_time_error_after = 0.30;
  EXPECT_NE(refusal(r).find("worse after the fit (30.0% time-weighted mean |error|) than before "
                            "(27.0%)"),
            std::string::npos);
}

TEST(StepCheck, ATraceThatDoesNotSayItsPlanIsSkippedWithTheReason) {
  spec::Trace t;
  t.kind = "measured";
  t.metadata = {{"step_time_s", 0.1}, {"model", "gpt-tiny"}};
  const spec::ClusterSpec cluster = spec::builtin_cluster("local-cpu");
  StepCheck check = check_steps({{"old.json", t}}, cluster, cluster);
  EXPECT_TRUE(check.rows.empty());
  ASSERT_EQ(check.skipped.size(), 1u);
  EXPECT_NE(check.skipped[0].find("plan_json"), std::string::npos);
}

// The reference trace (published.md K1): GPT-2 124M, batch 8, bf16 autocast, SDPA, one H100.
// Its GPU-busy time per step is the sum of its kernels over its two optimizer steps, 51.6 ms
// (103.2 ms of kernels in the file). The uncalibrated model predicts less than half of it (eager
// PyTorch's elementwise kernels); the fit must bring the whole step within 10% while no parameter
// leaves its physical range: efficiencies in (0, 1], attention at most the bf16 peak, the HBM
// bandwidth the datasheet's.
TEST(ClassFit, ClosesTheReferenceH100TraceWithinItsPhysicalBounds) {
  const std::string trace = test::source_path("traces/samples/kineto-gpt2-124m-h100-b8.json.gz");
  const spec::ModelSpec model = models::resolve_model(
      test::source_path("traces/samples/kineto-gpt2-124m-h100-b8.model.json"));
  const spec::Plan plan =
      spec::read_plan_file(test::source_path("traces/samples/kineto-gpt2-124m-h100-b8.plan.json"));
  const spec::ClusterSpec base = spec::builtin_cluster("h100-1gpu");
  const spec::Json json = spec::read_json_file(trace);
  double kernel_us = 0;
  for (const spec::Json& e : json.at("traceEvents"))
    if (e.value("cat", "") == "kernel" || e.value("cat", "") == "gpu_memset" ||
        e.value("cat", "") == "gpu_memcpy")
      kernel_us += e.at("dur").get<double>();
  const double measured_step = kernel_us * 1e-6 / 2;

  ClassFit fit = fit_classes(traces::kernel_times(json, trace), trace, model, plan, base);
  EXPECT_NEAR(fit.measured_step_s, measured_step, 1e-9);
  EXPECT_GT(std::abs(fit.before_step_s - measured_step) / measured_step, 0.3);
  EXPECT_LT(std::abs(fit.after_step_s - measured_step) / measured_step, 0.10);

  const spec::DeviceSpec& d = fit.cluster.device;
  EXPECT_EQ(d.memory_bandwidth_GBps, base.device.memory_bandwidth_GBps);
  for (const auto& [cls, e] : d.memory_efficiency_by_class) {
    EXPECT_GT(e, 0) << spec::enum_name(spec::op_class_names(), cls);
    EXPECT_LE(e, 1) << spec::enum_name(spec::op_class_names(), cls);
  }
  ASSERT_TRUE(d.gemm_model.has_value());
  EXPECT_LE(d.gemm_model->mainloop_efficiency, 1.0);
  for (const auto& [kernel, data] : d.attention_kernels)
    for (const spec::AttentionCurve& c : data.curves)
      for (double t : c.tflops) EXPECT_LE(t, d.peak_flops(spec::Dtype::kBf16) / 1e12);
  // Elementwise work is the class the model misses most; the fit says so, with kernel counts.
  bool named = false;
  for (const std::string& n : fit.notes) named = named || n.rfind("elementwise:", 0) == 0;
  EXPECT_TRUE(named);
}

}  // namespace
}  // namespace sextant::loop
