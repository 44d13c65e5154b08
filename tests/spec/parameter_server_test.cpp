// Parameter servers' plan rules (spec/parameter_server.hpp): the plan key, its name, what it does
// not combine with, the version a step reads and the servers' ranges.
#include "sextant/spec/parameter_server.hpp"

#include <gtest/gtest.h>

#include "expect_input_error.hpp"
#include "sextant/spec/pipeline_schedule.hpp"

namespace sextant::spec {
namespace {

Json dp4_plan() {
  return Json{{"schema", kPlanSchema},
              {"dp", 4},
              {"tp", 1},
              {"pp", 1},
              {"zero", 0},
              {"micro_batch", 2},
              {"global_batch", 16},
              {"parameter_server", {{"staleness", 2}}}};
}

TEST(ParameterServer, ThePlanKeyNamesTheBoundAndRoundTrips) {
  const Plan p = plan_from_json(dp4_plan(), "p.json");
  EXPECT_TRUE(p.parameter_server.enabled);
  EXPECT_EQ(p.parameter_server.staleness, 2);
  EXPECT_EQ(p.name(), "dp4.tp1.pp1.z0.mb2.ps2");
  EXPECT_EQ(to_json(plan_from_json(to_json(p), "again")), to_json(p));
  // Without the key: the all-reduce; an empty object: synchronous servers.
  Json j = dp4_plan();
  j.erase("parameter_server");
  EXPECT_FALSE(plan_from_json(j, "p.json").parameter_server.enabled);
  j["parameter_server"] = Json::object();
  EXPECT_EQ(plan_from_json(j, "p.json").name(), "dp4.tp1.pp1.z0.mb2.ps0");
}

TEST(ParameterServer, RefusesWhatItDoesNotCombineWith) {
  Json j = dp4_plan();
  j["parameter_server"]["staleness"] = kMaxStaleness + 1;
  EXPECT_INPUT_ERROR(plan_from_json(j, "p.json"), "/parameter_server/staleness = 17: must be in");
  j = dp4_plan();
  j["zero"] = 1;
  EXPECT_INPUT_ERROR(plan_from_json(j, "p.json"), "shards the optimizer state over its servers");
  j = dp4_plan();
  j["dp"] = 1;
  j["global_batch"] = 2;
  EXPECT_INPUT_ERROR(plan_from_json(j, "p.json"), "needs dp >= 2");
  j = dp4_plan();
  j["compression"] = {{"kind", "topk"}};
  EXPECT_INPUT_ERROR(plan_from_json(j, "p.json"), "pushes dense gradients");
  j = dp4_plan();
  j["schedule"] = "pipedream";
  j["micro_batch"] = 4;
  EXPECT_INPUT_ERROR(plan_from_json(j, "p.json"), "not pipedream");
}

TEST(ParameterServer, AStepReadsTheVersionItsBoundAllows) {
  // Staleness 0 is synchronous: step t reads the t updates before it.
  EXPECT_EQ(parameter_server_version(5, 0), 5);
  // Staleness 2: steps 0, 1 and 2 read the initial weights, step 3 the first update.
  EXPECT_EQ(parameter_server_version(0, 2), 0);
  EXPECT_EQ(parameter_server_version(2, 2), 0);
  EXPECT_EQ(parameter_server_version(3, 2), 1);
  EXPECT_EQ(parameter_server_version(10, 2), 8);
  // The simulator's window: one batch synchronous, 2 (s + 1) otherwise.
  Plan p = plan_from_json(dp4_plan(), "p.json");
  EXPECT_EQ(asynchronous_window(p), 6);
  p.parameter_server.staleness = 0;
  EXPECT_EQ(asynchronous_window(p), 1);
}

TEST(ParameterServer, TheServersRangesCoverTheParametersOnce) {
  // 10 parameters over 4 servers: ceil(10 / 4) = 3 each, the last holding 1.
  EXPECT_EQ(server_shard(10, 4), 3);
  EXPECT_EQ(server_range(10, 4, 0), std::make_pair(int64_t{0}, int64_t{3}));
  EXPECT_EQ(server_range(10, 4, 3), std::make_pair(int64_t{9}, int64_t{10}));
  for (int64_t n : {1, 7, 1000, 1001}) {
    for (int64_t servers : {2, 3, 8}) {
      int64_t next = 0;
      for (int64_t r = 0; r < servers; ++r) {
        const auto [b, e] = server_range(n, servers, r);
        EXPECT_EQ(b, next) << n << " over " << servers;
        EXPECT_LE(e - b, server_shard(n, servers));
        next = e;
      }
      EXPECT_EQ(next, n);
    }
  }
}

}  // namespace
}  // namespace sextant::spec
