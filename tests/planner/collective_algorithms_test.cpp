// A plan's collective algorithms chosen by simulated time where the executor runs them as named
// (planner/collective_algorithms.hpp): MPI ranks on CPU cores with a fitted α and β.
#include "sextant/planner/collective_algorithms.hpp"

#include <gtest/gtest.h>

#include "sextant/planner/planner.hpp"
#include "test_clusters.hpp"
#include "test_models.hpp"

namespace sextant::planner {
namespace {

// CPU cores over MPI, 8 to a node, whose all-reduce was fitted at α = 50 us and 1 ns a byte (a
// latency-bound transport): every all-reduce is priced through the named algorithm's formula.
spec::ClusterSpec fitted_cpu_cluster() {
  spec::ClusterSpec c = test::ideal_cluster(1, 10, 10, 5);
  c.device.kind = spec::DeviceKind::kCpu;
  c.network.library = spec::CollectiveLibrary::kMpi;
  spec::CollectiveFit fit;
  fit.collective = "all_reduce";
  fit.level = c.network.node_level().name;
  fit.alpha_us = 50;
  fit.beta_us_per_byte = 1e-3;
  c.collective_fits.push_back(fit);
  return c;
}

spec::Plan ddp(int64_t dp) {
  spec::Plan p = test::make_plan(dp, 1, 1, 4, 4 * dp);
  p.dtype = spec::Dtype::kFp32;
  p.stack->dp_bucket_bytes = 1;  // a bucket per layer
  return p;
}

// On 8 ranks a fitted all-reduce of n bytes costs (Thakur et al. 2005; the cost model's
// formulas, no reduction term here): ring 14 α + 2 (7/8) n β, recursive doubling 3 α + 3 n β,
// Rabenseifner 6 α + 2 (7/8) n β. The MLP's buckets of 256 x 256 fp32 gradients (n = 256 KiB,
// n β = 0.26 ms) take Rabenseifner, 8 α = 0.4 ms a bucket under the ring, 1.6 ms over the 4
// buckets; those of 32 x 32 (4 KiB, 4 us) take recursive doubling, 11 α - 0.25 n β = 0.546 ms a
// bucket under the ring.
TEST(CollectiveAlgorithms, ALatencyBoundFitNamesTheAlgorithmForItsBucketSize) {
  const double a = 50e-6, b = 1e-9;
  for (int64_t width : {256, 32}) {
    const spec::ModelSpec model = test::uniform_mlp(4, width);
    const CollectiveChoice c =
        choose_collective_algorithms(model, fitted_cpu_cluster(), ddp(8), {});
    ASSERT_EQ(c.plan.collective_algorithms.size(), 1u) << width;
    const double n = static_cast<double>(width * width * 4);
    const bool large = width == 256;
    EXPECT_EQ(c.plan.collective_algorithms.at(spec::CollectiveKind::kAllReduce),
              large ? spec::CollectiveAlgorithm::kRabenseifner
                    : spec::CollectiveAlgorithm::kRecursiveDoubling)
        << width;
    const double saved = large ? 8 * a : 11 * a + (2 * 7.0 / 8 - 3) * n * b;
    EXPECT_NEAR(c.library_step_s - c.result.report.step_time_s, 4 * saved, 1e-9) << width;
    // The choice is what simulating the named plan gives.
    EXPECT_DOUBLE_EQ(sim::simulate(model, fitted_cpu_cluster(), c.plan, {}).report.step_time_s,
                     c.result.report.step_time_s);
  }
}

// Where no named algorithm saves 1% of the step, the library keeps choosing: an unfitted MPI
// cluster is priced with the cheapest algorithm for each message already, and GPU clusters run
// NCCL's choice (nothing is simulated but the plan itself).
TEST(CollectiveAlgorithms, NothingIsNamedWhereTheLibraryAlreadyChoosesBest) {
  const spec::ModelSpec model = test::uniform_mlp(4, 256);
  spec::ClusterSpec unfitted = fitted_cpu_cluster();
  unfitted.collective_fits.clear();
  EXPECT_TRUE(
      choose_collective_algorithms(model, unfitted, ddp(8), {}).plan.collective_algorithms.empty());
  spec::ClusterSpec gpus = test::ideal_cluster(1, 10, 10, 50);
  const CollectiveChoice c = choose_collective_algorithms(model, gpus, ddp(8), {});
  EXPECT_TRUE(c.plan.collective_algorithms.empty());
  EXPECT_EQ(c.simulations, 1);
  EXPECT_FALSE(names_collective_algorithms(gpus));
}

// The search names them on its ranked plans, and ranks the named plans by their own step.
TEST(CollectiveAlgorithms, TheSearchNamesThemOnItsRankedPlans) {
  SearchRequest r;
  r.model = test::uniform_mlp(4, 256);
  r.cluster = fitted_cpu_cluster();
  r.gpus = 8;
  r.global_batch = 32;
  r.stack = spec::builtin_stack("sextant");
  r.stack->dp_bucket_bytes = 1;
  // (DDP: the fit is the all-reduce's; ZeRO's reduce-scatter and gather are priced unfitted.)
  r.constraints = {parse_constraint("dp=8"), parse_constraint("zero=0")};
  SearchOptions o;
  o.top_k = 3;
  const SearchResult s = search(r, o);
  ASSERT_FALSE(s.ranked.empty());
  for (const RankedPlan& p : s.ranked) {
    ASSERT_TRUE(p.plan.collective_algorithms.contains(spec::CollectiveKind::kAllReduce))
        << p.plan.name();
    EXPECT_EQ(p.plan.collective_algorithms.at(spec::CollectiveKind::kAllReduce),
              spec::CollectiveAlgorithm::kRabenseifner)
        << p.plan.name();
    EXPECT_DOUBLE_EQ(sim::simulate(r.model, r.cluster, p.plan, {}).report.step_time_s,
                     p.report.step_time_s);
  }
  o.choose_collective_algorithms = false;
  for (const RankedPlan& p : search(r, o).ranked) EXPECT_TRUE(p.plan.collective_algorithms.empty());
}

}  // namespace
}  // namespace sextant::planner
