// The routing skew of a measured mixture of experts, from hand-made traces.
#include "sextant/traces/moe_load.hpp"

#include <gtest/gtest.h>

#include <algorithm>

#include "expect_input_error.hpp"
#include "sextant/models/op_id.hpp"
#include "sextant/spec/rank_layout.hpp"

namespace sextant::traces {
namespace {

spec::TraceEvent dispatch(int64_t rank, int64_t layer, int64_t mb, int64_t rows,
                          spec::Phase phase = spec::Phase::kFwd) {
  spec::TraceEvent e;
  e.name = models::op_name(models::OpId::kMoeDispatch);
  e.op_class = spec::OpClass::kAllToAll;
  e.rank = rank;
  e.phase = phase;
  e.layer = layer;
  e.micro_batch = mb;
  e.shape = {rows, 64};
  return e;
}

TEST(MoeLoad, TheMostLoadedRankOverTheMeanPerDispatch) {
  // dp 4, ep 2: two ep groups of two ranks (spec::RankLayout).
  spec::Plan plan;
  plan.dp = 4;
  plan.ep = 2;
  plan.micro_batch = 1;
  plan.global_batch = 8;
  const spec::RankLayout layout(plan);
  const std::vector<int64_t> a = layout.ep_group(0);
  ASSERT_EQ(a.size(), 2u);
  std::vector<int64_t> b;
  for (int64_t r = 0; r < 4; ++r)
    if (std::find(a.begin(), a.end(), r) == a.end()) b.push_back(r);
  spec::Trace t;
  t.metadata["plan_json"] = spec::to_json(plan);
  // Layer 1, micro-batch 0: group a receives 150 and 50 rows (max / mean = 150 / 100 = 1.5),
  // group b 100 and 100 (1.0); micro-batch 1: group a 120 and 80 (1.2). Not measured: a backward
  // dispatch, one without its rows (an older trace), group b's micro-batch 1 with one rank only.
  t.events = {dispatch(a[0], 1, 0, 150), dispatch(a[1], 1, 0, 50),
              dispatch(b[0], 1, 0, 100), dispatch(b[1], 1, 0, 100),
              dispatch(a[0], 1, 1, 120), dispatch(a[1], 1, 1, 80),
              dispatch(b[0], 1, 1, 500), dispatch(a[0], 1, 0, 900, spec::Phase::kBwd)};
  spec::TraceEvent shapeless = dispatch(b[1], 1, 1, 0);
  shapeless.shape.clear();
  t.events.push_back(shapeless);
  const std::optional<MoeLoadMeasure> m = moe_load_imbalance(t, "t.json");
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->dispatches, 3);
  EXPECT_NEAR(m->imbalance, (1.5 + 1.0 + 1.2) / 3, 1e-12);
  EXPECT_NEAR(m->worst, 1.5, 1e-12);
}

TEST(MoeLoad, NothingToMeasureOrNoPlan) {
  spec::Trace t;
  EXPECT_FALSE(moe_load_imbalance(t, "t.json").has_value());
  t.events = {dispatch(0, 1, 0, 10), dispatch(1, 1, 0, 20)};
  EXPECT_INPUT_ERROR(moe_load_imbalance(t, "t.json"), "t.json: /otherData/plan_json");
}

}  // namespace
}  // namespace sextant::traces
