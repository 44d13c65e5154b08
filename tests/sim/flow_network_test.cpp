// The flow network: agrees with the analytic model on an idle network, and shares links.
#include "sextant/sim/flow_network.hpp"

#include <gtest/gtest.h>

#include "sextant/models/zoo.hpp"
#include "sextant/sim/simulator.hpp"
#include "sextant/spec/cluster_catalog.hpp"
#include "test_clusters.hpp"
#include "test_models.hpp"

namespace sextant::sim {
namespace {

// Runs a flow network until idle; returns the completion time of each finished item.
std::map<std::pair<bool, int32_t>, Picoseconds> drain(FlowNetwork& net) {
  std::map<std::pair<bool, int32_t>, Picoseconds> done;
  std::vector<Completion> finished;
  while (auto t = net.next_event()) {
    finished.clear();
    net.advance(*t, finished);
    for (const Completion& c : finished) done[{c.transfer, c.id}] = *t;
  }
  return done;
}

TEST(FlowNetwork, TwoFlowsOnOneLinkEachTakeTwiceAsLong) {
  // Two nodes of one device and one NIC each, 10 GB/s, no latency: a transfer of n bytes alone
  // takes n / 10 GB/s; two at once on the same NIC each take twice that.
  spec::ClusterSpec c = test::ideal_cluster(100, 100, 10, 0, 2, 1, 1);
  CollectiveModel model(c, {});
  std::vector<GroupSetup> groups;
  std::vector<ChannelSetup> channels = {{0, 1}, {0, 1}};
  const int64_t n = 10'000'000;
  const Picoseconds alone = seconds_to_ps(n / 10e9);
  {
    FlowNetwork net(c, model, groups, channels);
    net.start_transfer(0, n, 0);
    auto done = drain(net);
    EXPECT_NEAR(static_cast<double>(done.at({true, 0})), static_cast<double>(alone), 2);
  }
  FlowNetwork net(c, model, groups, channels);
  net.start_transfer(0, n, 0);
  net.start_transfer(1, n, 0);
  auto done = drain(net);
  EXPECT_NEAR(static_cast<double>(done.at({true, 0})), 2.0 * static_cast<double>(alone), 2);
  EXPECT_NEAR(static_cast<double>(done.at({true, 1})), 2.0 * static_cast<double>(alone), 2);
}

TEST(FlowNetwork, DataParallelAndPipelineTrafficShareANic) {
  // A 2-rank ring all-reduce across two nodes sends n bytes each way (2(p-1)/p n = n); a
  // pipeline transfer of n bytes from rank 0 to rank 1 leaves through the same NIC. Alone each
  // takes n/B; together the shared NIC halves both: both end at 2n/B.
  spec::ClusterSpec c = test::ideal_cluster(100, 100, 10, 0, 2, 1, 1);
  CollectiveModel model(c, {{spec::CollectiveKind::kAllReduce, spec::CollectiveAlgorithm::kRing}});
  std::vector<GroupSetup> groups = {{{0, 1}, {2, 2, 1}}};
  std::vector<ChannelSetup> channels = {{0, 1}};
  const int64_t n = 20'000'000;
  const double alone = static_cast<double>(seconds_to_ps(n / 10e9));
  FlowNetwork net(c, model, groups, channels);
  net.start_collective(0, spec::CollectiveKind::kAllReduce, n, 0);
  net.start_transfer(0, n, 0);
  auto done = drain(net);
  EXPECT_NEAR(static_cast<double>(done.at({false, 0})), 2 * alone, 0.001 * alone);
  EXPECT_NEAR(static_cast<double>(done.at({true, 0})), 2 * alone, 0.001 * alone);
}

TEST(FlowNetwork, AgreesWithAnalyticOnAnIdleNetwork) {
  // One collective or transfer at a time on each link: the flow model must reproduce the
  // closed forms. Plans whose traffic never overlaps on a link: data parallelism without overlap,
  // and a pipeline whose stages talk over their own rail NICs (sends and receives go opposite
  // ways). A pipeline inside a node is not such a plan: activations going forward and gradients
  // going back, and the tensor-parallel gathers, share a device's NVLink.
  spec::ClusterSpec cluster = spec::builtin_cluster("dgx-a100");
  spec::ModelSpec model = models::zoo_model("gpt3-1.3b");
  std::vector<spec::Plan> plans;
  spec::Plan a = test::make_plan(16, 1, 1, 1, 32);
  a.stack->dp_overlap = false;
  plans.push_back(a);
  plans.push_back(test::make_plan(1, 8, 2, 1, 8));  // TP in a node, PP across two
  spec::Plan b = test::make_plan(2, 8, 1, 1, 4);    // DP across nodes after TP
  b.stack->dp_overlap = false;
  plans.push_back(b);
  for (const spec::Plan& plan : plans) {
    SimulationOptions analytic;
    SimulationOptions flow;
    flow.fidelity = Fidelity::kFlow;
    double ta = simulate(model, cluster, plan, analytic).report.step_time_s;
    double tf = simulate(model, cluster, plan, flow).report.step_time_s;
    EXPECT_NEAR(tf, ta, 1e-7 * ta) << plan.name();
  }
}

TEST(FlowNetwork, ContentionOnlySlowsDown) {
  // With data-parallel buckets overlapping pipeline transfers on shared NICs the flow model can
  // only be slower than the analytic one, never faster.
  spec::ClusterSpec cluster = test::ideal_cluster(50, 200, 5, 2, 16, 1, 1);
  spec::ModelSpec model = models::zoo_model("gpt2-350m");
  spec::Plan plan = test::make_plan(4, 1, 4, 2, 64);
  plan.stack->dp_bucket_bytes = 1 << 20;
  SimulationOptions flow;
  flow.fidelity = Fidelity::kFlow;
  double ta = simulate(model, cluster, plan, {}).report.step_time_s;
  double tf = simulate(model, cluster, plan, flow).report.step_time_s;
  EXPECT_GE(tf, ta * (1 - 1e-9));
}

}  // namespace
}  // namespace sextant::sim
