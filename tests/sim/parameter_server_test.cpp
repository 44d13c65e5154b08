// Parameter servers (spec/parameter_server.hpp) in the simulator, by hand: the exchange after a
// synchronous step, hidden behind the next steps' compute when the workers may run ahead, and the
// servers' state in memory.
#include "sextant/spec/parameter_server.hpp"

#include <gtest/gtest.h>

#include "sextant/models/lowering.hpp"
#include "sextant/models/optimizer_step.hpp"
#include "sextant/sim/memory_model.hpp"
#include "sextant/sim/simulator.hpp"
#include "test_clusters.hpp"
#include "test_models.hpp"

namespace sextant::sim {
namespace {

struct Case {
  spec::ModelSpec model = test::uniform_mlp(4, 1024);
  spec::Plan plan = test::make_plan(2, 1, 1, 4096, 8192);
  int64_t params = 4 * 1024 * 1024;  // four 1024 x 1024 weights, no biases
  Case() { plan.dtype = spec::Dtype::kFp32; }
  // The exchange on 2 ranks with latency 0 over links of `GBps`, in seconds: the push (an
  // all-to-all of the fp32 gradients, each rank sending the other half: n/2 β), the server's sum
  // (reading 2 parts and writing one of its n/2 range, 4 bytes each, at the device's 1e12 B/s),
  // its update of n/2 parameters and the pull (an all-gather of the fp32 weights: n/2 β).
  double exchange(double GBps) const {
    const double beta = 1 / (GBps * 1e9);
    const double half = static_cast<double>(params) / 2;
    const double per_param = static_cast<double>(models::optimizer_bytes_per_param(
        models::optimizer_precision(*plan.stack, spec::Dtype::kFp32, 0)));
    return half * 4 * beta + 3 * half * 4 / 1e12 + half * per_param / 1e12 + half * 4 * beta;
  }
  SimulationResult run(int64_t staleness, double GBps) {
    plan.parameter_server = {true, staleness};
    spec::ClusterSpec cluster = test::ideal_cluster(100, GBps, GBps);
    cluster.device.memory_bandwidth_GBps = 1000;  // 1e12 B/s: the server's work shows
    return simulate(model, cluster, plan, {});
  }
};

TEST(ParameterServer, SynchronousServersExposeTheWholeExchange) {
  Case c;
  const SimulationResult r = c.run(0, 10);
  const double compute = r.report.breakdown_s.compute;
  EXPECT_GT(compute, 0);
  // Compute, then push, sum, update and pull, one after another.
  EXPECT_NEAR(r.report.step_time_s, compute + c.exchange(10), 1e-9);
}

TEST(ParameterServer, StaleWorkersRunAtTheSlowerOfComputeAndExchange) {
  // Window of 2 (s + 1) batches, batch b waiting for the pull of batch b - s - 1 and the
  // exchanges one after another on the data-parallel stream. With compute C and exchange E:
  // E > C: the exchanges run back to back, makespan(W) = C + W E, a step adds E;
  // E < C: the compute never waits, makespan(W) = W C + E, a step adds C.
  Case c;
  const double compute = c.run(0, 10).report.breakdown_s.compute;
  const double slow = c.exchange(1);  // 1 GB/s links: the exchange dominates
  ASSERT_GT(slow, 2 * compute);
  EXPECT_NEAR(c.run(1, 1).report.step_time_s, slow, 1e-9);
  EXPECT_NEAR(c.run(3, 1).report.step_time_s, slow, 1e-9);
  const double fast = c.exchange(1000);
  ASSERT_LT(fast, compute / 2);
  EXPECT_NEAR(c.run(1, 1000).report.step_time_s, compute, 1e-9);
  // Synchronous, the same fast exchange is still paid in full.
  EXPECT_NEAR(c.run(0, 1000).report.step_time_s, compute + fast, 1e-9);
}

TEST(ParameterServer, ServersKeepTheirRangesStateAndStaleWorkersABufferMore) {
  Case c;
  const models::LoweredModel lowered =
      models::lower(c.model, {4096, 0, spec::Dtype::kFp32, 1, false});
  const spec::MemoryBreakdown ddp = stage_memory(c.plan, *c.plan.stack, lowered, 0);
  c.plan.parameter_server = {true, 0};
  const spec::MemoryBreakdown sync = stage_memory(c.plan, *c.plan.stack, lowered, 0);
  // The optimizer state of half the parameters (spec::server_shard), weights and gradients whole.
  EXPECT_EQ(sync.optimizer, ddp.optimizer / 2);
  EXPECT_EQ(sync.weights, ddp.weights);
  EXPECT_EQ(sync.gradients, ddp.gradients);
  // A stale worker also holds the version being pulled and the gradients being pushed.
  c.plan.parameter_server = {true, 2};
  const spec::MemoryBreakdown stale = stage_memory(c.plan, *c.plan.stack, lowered, 0);
  EXPECT_EQ(stale.weights, 2 * ddp.weights);
  EXPECT_EQ(stale.gradients, 2 * ddp.gradients);
  EXPECT_EQ(stale.optimizer, sync.optimizer);
}

}  // namespace
}  // namespace sextant::sim
