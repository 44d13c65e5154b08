// The host's issue of a step's kernels (sim/host_issue.hpp): the three-number summary of a run
// against a kernel-by-kernel replay of the host and the GPU, and the simulator's step when the
// host, not the GPU, sets the pace.
#include "sextant/sim/host_issue.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "sextant/models/lowering.hpp"
#include "sextant/sim/simulator.hpp"
#include "sextant/sim/step_setup.hpp"
#include "test_clusters.hpp"
#include "test_models.hpp"

namespace sextant::sim {
namespace {

struct ReplayOp {
  double seconds = 0;
  int64_t kernels = 0;
};

// The reference: the host issues kernel after kernel, `per_kernel` each, from `host_start`; the
// GPU, free from `gpu_start`, starts each kernel once it is issued and the one before has ended.
double replay(const std::vector<ReplayOp>& ops, double per_kernel, double gpu_start,
              double host_start) {
  double host = host_start, gpu = gpu_start;
  for (const ReplayOp& op : ops) {
    if (op.kernels == 0) {
      gpu += op.seconds;  // no issue of its own: runs after what came before
      continue;
    }
    for (int64_t k = 0; k < op.kernels; ++k) {
      host += per_kernel;
      gpu = std::max(gpu, host) + op.seconds / static_cast<double>(op.kernels);
    }
  }
  return gpu;
}

TEST(HostIssue, AnOpIsBoundByItsFirstOrItsLastKernel) {
  // 4 kernels of 2.5 us issued 5 us apart: the last is issued at 20 us and ends at 22.5 us;
  // the GPU alone would take 10 us, and the first kernel cannot start before 5 us (15 us).
  HostChain op = host_chain_of_op(10e-6, 4, 5e-6);
  EXPECT_DOUBLE_EQ(op.gpu_s, 10e-6);
  EXPECT_DOUBLE_EQ(op.host_s, 20e-6);
  EXPECT_DOUBLE_EQ(op.critical_s, 22.5e-6);
  // Long kernels: the first one's issue, then the GPU back to back.
  EXPECT_DOUBLE_EQ(host_chain_of_op(100e-6, 4, 5e-6).critical_s, 105e-6);
  // No kernels of its own: nothing to issue, no bound from the host.
  HostChain fused = host_chain_of_op(3e-6, 0, 5e-6);
  EXPECT_DOUBLE_EQ(fused.host_s, 0);
  EXPECT_DOUBLE_EQ(fused.end(1e-6, 50e-6), 4e-6);
}

TEST(HostIssue, ARunEndsWhereTheKernelByKernelReplayEnds) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> seconds(0.5e-6, 80e-6);
  std::uniform_int_distribution<int64_t> kernels(0, 6);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<ReplayOp> ops(1 + trial % 17);
    for (ReplayOp& op : ops) op = {seconds(rng), kernels(rng)};
    const double per_kernel = seconds(rng) / 4;
    HostChain run;
    for (const ReplayOp& op : ops)
      run = run.then(host_chain_of_op(op.seconds, op.kernels, per_kernel));
    // The GPU free before, at and after the host starts.
    for (double gpu_start : {0.0, 30e-6, 500e-6}) {
      const double host_start = 40e-6;
      EXPECT_NEAR(run.end(gpu_start, host_start), replay(ops, per_kernel, gpu_start, host_start),
                  1e-15)
          << "trial " << trial << " gpu start " << gpu_start;
    }
  }
}

TEST(HostIssue, RunsComposeInAnyGrouping) {
  const HostChain a = host_chain_of_op(10e-6, 3, 6e-6), b = host_chain_of_op(200e-6, 2, 6e-6),
                  c = host_chain_of_op(4e-6, 5, 6e-6);
  const HostChain left = a.then(b).then(c), right = a.then(b.then(c));
  EXPECT_DOUBLE_EQ(left.gpu_s, right.gpu_s);
  EXPECT_DOUBLE_EQ(left.host_s, right.host_s);
  EXPECT_DOUBLE_EQ(left.critical_s, right.critical_s);
}

TEST(HostIssue, OnlyGpusWaitForAHost) {
  spec::Stack stack;
  stack.host_launch_us = {50, 30};
  spec::DeviceSpec gpu;
  gpu.kind = spec::DeviceKind::kGpu;
  EXPECT_DOUBLE_EQ(host_launch_seconds(stack, gpu, spec::Phase::kFwd), 50e-6);
  EXPECT_DOUBLE_EQ(host_launch_seconds(stack, gpu, spec::Phase::kRecompute), 50e-6);
  EXPECT_DOUBLE_EQ(host_launch_seconds(stack, gpu, spec::Phase::kBwd), 30e-6);
  EXPECT_DOUBLE_EQ(host_launch_seconds(stack, gpu, spec::Phase::kOpt), 0);
  spec::DeviceSpec cpu;
  cpu.kind = spec::DeviceKind::kCpu;
  EXPECT_DOUBLE_EQ(host_launch_seconds(stack, cpu, spec::Phase::kFwd), 0);
}

// Kernels of the forward and of the backward passes of one micro-batch (the lowering's counts).
std::pair<int64_t, int64_t> pass_kernels(const spec::ModelSpec& model,
                                         const spec::ClusterSpec& cluster, const spec::Plan& plan) {
  const StepSetup setup = step_setup(model, cluster, plan);
  const models::LoweredModel lowered = models::lower(model, setup.lowering);
  int64_t forward = 0, backward = 0;
  for (const models::Layer& layer : lowered.layers) {
    for (const models::Op& op : layer.forward)
      if (!op.is_comm()) forward += op.kernels;
    for (const models::Op& op : layer.backward)
      if (!op.is_comm()) backward += op.kernels;
  }
  return {forward, backward};
}

TEST(HostIssue, AHostBoundStepTakesTheHostsTime) {
  // An 8-layer MLP on one GPU whose ops take microseconds, its host 1 ms a forward kernel and
  // 0.5 ms a backward one: the GPU runs each kernel as it arrives, so the passes end with the
  // last kernel issued, K_f c_f + K_b c_b, plus that kernel's own time (under the longest op),
  // and the optimizer step (which the host issues without waiting) follows.
  const spec::ClusterSpec cluster = test::ideal_cluster(100);
  const spec::ModelSpec model = test::uniform_mlp(8, 256);
  spec::Plan plan = test::make_plan(1, 1, 1, 64, 64);
  plan.dtype = spec::Dtype::kFp32;
  SimulationOptions traced;
  traced.trace = true;
  const SimulationResult gpu_bound = simulate(model, cluster, plan, traced);
  EXPECT_EQ(gpu_bound.report.breakdown_s.host_bound, 0);
  plan.stack->host_launch_us = {1000, 500};
  const SimulationResult host_bound = simulate(model, cluster, plan, traced);
  const auto [forward, backward] = pass_kernels(model, cluster, plan);
  ASSERT_GT(forward, 0);
  ASSERT_GT(backward, 0);
  const double issue = static_cast<double>(forward) * 1e-3 + static_cast<double>(backward) * 0.5e-3;
  double longest_op = 0, gpu_busy = 0;
  for (const spec::TraceEvent& e : gpu_bound.trace->events) {
    longest_op = std::max(longest_op, ps_to_seconds(e.duration_ps));
    gpu_busy += ps_to_seconds(e.duration_ps);
  }
  const double optimizer = gpu_bound.report.breakdown_s.optimizer;
  EXPECT_GE(host_bound.report.step_time_s, issue + optimizer);
  EXPECT_LE(host_bound.report.step_time_s, issue + optimizer + longest_op);
  // The GPU's work is what it was; the rest of the step is the wait for the host.
  const spec::TimeBreakdown& b = host_bound.report.breakdown_s;
  EXPECT_NEAR(b.compute, gpu_bound.report.breakdown_s.compute, 1e-12);
  EXPECT_NEAR(b.host_bound, host_bound.report.step_time_s - gpu_bound.report.step_time_s, 1e-12);
  // The predicted trace keeps each op's own time; the waits are gaps between them.
  double traced_busy = 0;
  for (const spec::TraceEvent& e : host_bound.trace->events)
    traced_busy += ps_to_seconds(e.duration_ps);
  EXPECT_NEAR(traced_busy, gpu_busy, 1e-9);
}

TEST(HostIssue, CpuRanksIssueNothing) {
  spec::ClusterSpec cluster = test::ideal_cluster(100);
  cluster.device.kind = spec::DeviceKind::kCpu;
  const spec::ModelSpec model = test::uniform_mlp(4, 256);
  spec::Plan plan = test::make_plan(1, 1, 1, 64, 64);
  plan.dtype = spec::Dtype::kFp32;
  const double before = simulate(model, cluster, plan, {}).report.step_time_s;
  plan.stack->host_launch_us = {1000, 500};
  EXPECT_DOUBLE_EQ(simulate(model, cluster, plan, {}).report.step_time_s, before);
}

}  // namespace
}  // namespace sextant::sim
