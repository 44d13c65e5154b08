// GEMS' MAST (spec/pipeline_schedule.hpp): the stages a rank holds, the schedule's units, the
// replica groups a rank and its mirror share, and what the schedule refuses.
#include <gtest/gtest.h>

#include <set>
#include <tuple>

#include "expect_input_error.hpp"
#include "sextant/spec/pipeline_schedule.hpp"
#include "sextant/spec/rank_layout.hpp"

namespace sextant::spec {
namespace {

Plan gems(int64_t dp, int64_t pp, int64_t micro_batches) {
  Plan p;
  p.dp = dp;
  p.pp = pp;
  p.micro_batch = 1;
  p.global_batch = dp * micro_batches;
  p.schedule = Schedule::kGems;
  return p;
}

TEST(Gems, EachRankHoldsAStageOfEachReplicaTheLowerFirst) {
  const Plan p = gems(1, 4, 4);
  EXPECT_EQ(local_chunks(p), 2);
  EXPECT_EQ(model_chunks(p), 4);
  // Rank 0: stages 0 (replica A, down) and 3 (replica B's stage 3, up); rank 2: stages 1
  // (B, up: B's stage 1 runs on rank 4 - 1 - 1 = 2) and 2 (A, down).
  EXPECT_EQ(chunk_stage(p, 0, 0), 0);
  EXPECT_EQ(chunk_stage(p, 0, 1), 3);
  EXPECT_FALSE(chunk_runs_up(p, 0, 0));
  EXPECT_TRUE(chunk_runs_up(p, 0, 1));
  EXPECT_EQ(chunk_stage(p, 2, 0), 1);
  EXPECT_EQ(chunk_stage(p, 2, 1), 2);
  EXPECT_TRUE(chunk_runs_up(p, 2, 0));
  EXPECT_FALSE(chunk_runs_up(p, 2, 1));
  // A rank and its mirror hold the same stages in the same order.
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t v = 0; v < 2; ++v) EXPECT_EQ(chunk_stage(p, r, v), chunk_stage(p, 3 - r, v));
  // Without GEMS: interleaved chunks, all down the ring.
  Plan il = p;
  il.schedule = Schedule::kInterleaved;
  il.virtual_stages = 2;
  EXPECT_EQ(chunk_stage(il, 1, 1), 5);
  EXPECT_FALSE(chunk_runs_up(il, 1, 1));
}

// Every replica's micro-batch passes every stage once forward and once backward, in the
// replica's order of stages, each rank's passes of a micro-batch forward before backward; replica
// A takes micro-batches [0, m/2), B the rest. With one micro-batch a replica (pp 2) the ranks
// never idle: forwards of both replicas, then the backwards (the last stage's first).
TEST(Gems, TheScheduleRunsEveryPassOnceInEachReplicasOrder) {
  for (int64_t pp : {2, 4, 8}) {
    for (int64_t m : {2, 4, 8, 16}) {
      const Plan p = gems(1, pp, m);
      std::set<std::tuple<int64_t, int64_t, bool>> seen;  // (stage, micro-batch, forward)
      for (int64_t r = 0; r < pp; ++r) {
        std::set<int64_t> forwarded;
        for (const ScheduleUnit& u : pipeline_schedule(Schedule::kGems, pp, 2, m, r)) {
          const int64_t stage = chunk_stage(p, r, u.chunk);
          // Replica A (down: the stage is the rank) takes the first half.
          EXPECT_EQ(stage == r, u.micro_batch < m / 2) << pp << " " << m;
          EXPECT_TRUE(seen.insert({stage, u.micro_batch, u.forward}).second);
          if (u.forward) {
            forwarded.insert(u.micro_batch);
          } else {
            EXPECT_TRUE(forwarded.contains(u.micro_batch)) << "backward before forward";
          }
        }
      }
      EXPECT_EQ(seen.size(), static_cast<size_t>(2 * pp * m)) << pp << " " << m;
    }
  }
  const std::vector<ScheduleUnit> rank0 = pipeline_schedule(Schedule::kGems, 2, 2, 2, 0);
  ASSERT_EQ(rank0.size(), 4u);
  EXPECT_TRUE(rank0[0].forward && rank0[0].micro_batch == 0);  // A's stage 0
  EXPECT_TRUE(rank0[1].forward && rank0[1].micro_batch == 1);  // B's stage 1 (its last)
  EXPECT_FALSE(rank0[2].forward);
  EXPECT_EQ(rank0[2].micro_batch, 1);  // B's last stage turns around first
}

TEST(Gems, ARankAndItsMirrorAreReplicas) {
  const RankLayout layout(gems(2, 4, 4));
  // dp 2 x pp 4: rank = dp + 2 pp; rank 0 (dp 0, pp 0) sums with pp 3's ranks and dp 1's.
  EXPECT_EQ(layout.replica_group(0), (std::vector<int64_t>{0, 1, 6, 7}));
  EXPECT_EQ(layout.replica_group(7), (std::vector<int64_t>{0, 1, 6, 7}));
  EXPECT_EQ(layout.replica_group(2), (std::vector<int64_t>{2, 3, 4, 5}));
  EXPECT_EQ(gems(2, 4, 4).replicas(), 4);
}

TEST(Gems, RefusesWhatItDoesNotCombineWith) {
  EXPECT_EQ(gems_problem(gems(1, 4, 4)), "");
  EXPECT_NE(gems_problem(gems(1, 3, 4)).find("even number of stages"), std::string::npos);
  EXPECT_NE(gems_problem(gems(1, 4, 3)).find("even count"), std::string::npos);
  Plan zero = gems(2, 4, 4);
  zero.zero = 1;
  EXPECT_NE(gems_problem(zero).find("zero 0"), std::string::npos);
  Json j = to_json(gems(1, 4, 4));
  j["global_batch"] = 6;  // 6 micro-batches: fine; 5: refused
  EXPECT_EQ(plan_from_json(j, "p.json").name(), "dp1.tp1.pp4.z0.mb1.gems");
  j["global_batch"] = 5;
  EXPECT_INPUT_ERROR(plan_from_json(j, "p.json"), "/schedule = \"gems\"");
}

}  // namespace
}  // namespace sextant::spec
