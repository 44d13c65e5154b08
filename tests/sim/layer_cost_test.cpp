// One layer's passes in closed form (sim::layer_times) as stretches: compute alone, or time in
// or beside a tensor-parallel collective. What a pipeline transfer or a data-parallel collective
// starting beside a pass slows is the compute alone (the engine slows compute once, however
// many transfers run beside it), so the planner's estimate reads the stretches.
#include "sextant/sim/layer_cost.hpp"

#include <gtest/gtest.h>

#include "sextant/models/lowering.hpp"
#include "sextant/models/zoo.hpp"
#include "sextant/sim/step_setup.hpp"
#include "test_clusters.hpp"
#include "test_models.hpp"

namespace sextant::sim {
namespace {

double total(const std::vector<PassSegment>& profile) {
  double t = 0;
  for (const PassSegment& s : profile) t += s.seconds;
  return t;
}

TEST(LayerCost, AloneWithinCountsComputeAloneFromTheStart) {
  std::vector<PassSegment> p;
  append_segment(p, 2.0, false);
  append_segment(p, 3.0, true);
  append_segment(p, 1.0, true);   // merged into the last
  append_segment(p, 0.0, false);  // nothing
  append_segment(p, 4.0, false);
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[1], (PassSegment{4.0, true}));
  EXPECT_DOUBLE_EQ(alone_within(p, 1.0), 0.0);    // inside the collective
  EXPECT_DOUBLE_EQ(alone_within(p, 3.5), 1.5);    // 2 s in, 1.5 s of compute
  EXPECT_DOUBLE_EQ(alone_within(p, 9.0), 4.0);    // past the compute
  EXPECT_DOUBLE_EQ(alone_within(p, 100.0), 4.0);  // past the end
}

TEST(LayerCost, ComputeAloneTakesMoreOfTheWallBesideATransfer) {
  // A pass half compute alone, half beside a tensor-parallel collective, with f = 0.25: beside a
  // transfer its 1 s of compute alone takes 1.25 s and the other 1 s stays 1 s, so compute alone
  // is 1.25 / 2.25 of the wall time.
  EXPECT_NEAR(wall_alone_share(0.5, 0.25), 1.25 / 2.25, 1e-15);
  EXPECT_DOUBLE_EQ(wall_alone_share(1.0, 0.25), 1.0);
  EXPECT_DOUBLE_EQ(wall_alone_share(0.0, 0.25), 0.0);
  EXPECT_DOUBLE_EQ(wall_alone_share(0.3, 0.0), 0.3);  // no slowdown: the work's share
}

TEST(LayerCost, ProfilesAddUpToThePassesAndMarkTheCollectives) {
  // gpt2-350m at micro-batch 4 on tp 2 with sequence parallelism, on the ideal cluster at 100
  // TFLOP/s and 100 GB/s without latency (a collective cut in chunks costs what it costs
  // whole): without tensor parallelism every pass is compute alone; with it and pipelined
  // overlap the chunks of each all-gather and reduce-scatter are stretches not alone, whether
  // exposed or beside a GEMM, so what is not alone is the collectives' time.
  spec::ClusterSpec cluster = test::ideal_cluster(100, 100, 100, 0);
  cluster.device.overlap_slowdown = 0.2;
  const spec::ModelSpec model = models::zoo_model("gpt2-350m");
  for (int64_t tp : {1, 2}) {
    spec::Plan plan = test::make_plan(1, tp, 1, 4, 4);
    plan.sequence_parallel = tp > 1;
    plan.stack->tp_overlap = spec::TpOverlap::kPipelined;
    plan.recompute = spec::Recompute::kFull;
    const StepSetup setup = step_setup(model, cluster, plan, *plan.stack);
    const models::LoweredModel lowered = models::lower(model, setup.lowering);
    const ComputeModel compute = make_compute_model(cluster, setup, lowered);
    const CollectiveModel collectives(cluster, plan.collective_algorithms);
    std::vector<int64_t> ranks;
    for (int64_t r = 0; r < tp; ++r) ranks.push_back(r);
    const LayerGroups groups{
        group_shape(ranks, cluster.devices_per_node), {}, {}, {}, {}, {}, {}, {}, {}, {}};
    const models::Layer& block = lowered.layers[lowered.split_begin];
    const LayerTimes t =
        layer_times(block, plan, *plan.stack, compute, collectives, groups, plan.recompute);
    EXPECT_NEAR(total(t.forward_profile), t.forward, 1e-12 * t.forward);
    EXPECT_NEAR(total(t.backward_profile), t.backward, 1e-12 * t.backward);
    EXPECT_NEAR(total(t.recompute_profile), t.recompute, 1e-12 * t.recompute);
    const double alone = alone_within(t.forward_profile, t.forward);
    if (tp == 1) {
      ASSERT_EQ(t.forward_profile.size(), 1u);
      EXPECT_DOUBLE_EQ(alone, t.forward);
    } else {
      // A block's forward under sequence parallelism: two all-gathers and two reduce-scatters
      // (attention and MLP), each beside its GEMM or partly exposed.
      EXPECT_GT(t.forward_profile.size(), 4u);
      double collectives_time = 0;
      for (const models::Op& op : block.forward)
        if (op.is_comm())
          collectives_time +=
              collectives.cost(op.collective, op.costed_bytes(), groups.tp).seconds();
      EXPECT_NEAR(t.forward - alone, collectives_time, 1e-9 * t.forward);
    }
  }
}

}  // namespace
}  // namespace sextant::sim
