// Each rank's time in the compute ops every rank ran: hand-made traces and two recorded runs.
#include "sextant/traces/rank_speeds.hpp"

#include <gtest/gtest.h>

#include <tuple>

#include "sextant/spec/units.hpp"
#include "test_paths.hpp"

namespace sextant::traces {
namespace {

spec::TraceEvent op(const std::string& name, int64_t rank, int64_t step, double ms,
                    spec::OpClass op_class = spec::OpClass::kGemm) {
  spec::TraceEvent e;
  e.name = name;
  e.op_class = op_class;
  e.rank = rank;
  e.step = step;
  e.phase = spec::Phase::kFwd;
  e.shape = {8, 8, 8};
  e.duration_ps = seconds_to_ps(ms / 1e3);
  return e;
}

TEST(RankSpeeds, TheOpsEveryRankRanEachWeightedByTheCountAllRanRanks) {
  spec::Trace t;
  // Step 0 is the warm-up: left out whatever it took.
  t.events = {op("a", 0, 0, 100), op("a", 1, 0, 1)};
  // "a": two runs a rank, 10 ms on rank 0 and 12 ms on rank 1.
  for (int64_t rank : {0, 1})
    for (int i = 0; i < 2; ++i) t.events.push_back(op("a", rank, 1, rank == 0 ? 10 : 12));
  // "c": rank 0 runs it four times (a deeper pipeline stage), rank 1 twice, 5 ms each: both count
  // it twice, 10 ms.
  for (int i = 0; i < 4; ++i) t.events.push_back(op("c", 0, 1, 5));
  for (int i = 0; i < 2; ++i) t.events.push_back(op("c", 1, 1, 5));
  // Left out: an op rank 1 did not run, a collective (its time holds the waits), and "a" with
  // another shape on one rank only.
  t.events.push_back(op("b", 0, 1, 50));
  t.events.push_back(op("sync", 0, 1, 30, spec::OpClass::kAllReduce));
  t.events.push_back(op("sync", 1, 1, 1, spec::OpClass::kAllReduce));
  spec::TraceEvent wide = op("a", 1, 1, 40);
  wide.shape = {16, 8, 8};
  t.events.push_back(wide);

  const RankSpeeds s = rank_speeds(t, 1);
  ASSERT_EQ(s.compute_s.size(), 2u);
  EXPECT_EQ(s.shared_ops, 2);
  EXPECT_NEAR(s.compute_s[0], 0.030, 1e-12);  // 2 x 10 + 2 x 5 ms
  EXPECT_NEAR(s.compute_s[1], 0.034, 1e-12);  // 2 x 12 + 2 x 5 ms
  EXPECT_NEAR(s.spread(), 34.0 / 30.0 - 1, 1e-12);
  EXPECT_EQ(s.slowest_rank(), 1);
  EXPECT_EQ(s.fastest_rank(), 0);
}

TEST(RankSpeeds, NoComparisonWithoutASharedOpOrASecondRank) {
  spec::Trace t;
  t.events = {op("a", 0, 1, 10), op("b", 1, 1, 20)};
  EXPECT_EQ(rank_speeds(t, 0).shared_ops, 0);
  EXPECT_EQ(rank_speeds(t, 0).spread(), 0);
  t.events = {op("a", 0, 1, 10)};
  EXPECT_EQ(rank_speeds(t, 0).spread(), 0);
}

// Two recorded runs of one plan (gpt-tiny dp2.z2.mb8 on the 2-core VM, minutes apart, steps 2-3
// after the warm-up): 85.6 ms a step with rank 0's ops 24% slower than rank 1's, and 70.7 ms with
// the ranks within 6%. Sums by hand over the traces' shared ops: 164.2 against 132.5 ms, and 136.3
// against 129.0 ms.
TEST(RankSpeeds, RecordedRunsOfASlowCoreAndOfEvenOnes) {
  const RankSpeeds slow = rank_speeds(
      spec::read_trace_file(test::source_path("traces/samples/run-gpt-tiny-dp2-slow-core.json.gz")),
      2);
  EXPECT_NEAR(slow.compute_s[0], 0.1642, 0.0001);
  EXPECT_NEAR(slow.compute_s[1], 0.1325, 0.0001);
  EXPECT_EQ(slow.slowest_rank(), 0);
  const RankSpeeds even = rank_speeds(spec::read_trace_file(test::source_path(
                                          "traces/samples/run-gpt-tiny-dp2-even-cores.json.gz")),
                                      2);
  EXPECT_NEAR(even.compute_s[0], 0.1363, 0.0001);
  EXPECT_NEAR(even.compute_s[1], 0.1290, 0.0001);
}

spec::TraceEvent timed(const std::string& name, int64_t rank, double start_ms, double ms) {
  spec::TraceEvent e = op(name, rank, 1, ms);
  e.start_ps = seconds_to_ps(start_ms / 1e3);
  return e;
}

// One speed reference across runs: an op's least mean time over every run with as many ranks and
// the same co-run state (beside another rank's compute for at least half its time, or alone).
TEST(SlowdownsAgainstFastest, OneReferencePerOpRankCountAndCoRunState) {
  spec::Trace solo_fast, solo_slow, pair, pair_one_slow, pipeline;
  // One rank: "a" 10 ms twice, then 12 ms twice (the second run 20% slower).
  solo_fast.events = {timed("a", 0, 0, 10), timed("a", 0, 10, 10)};
  solo_slow.events = {timed("a", 0, 0, 12), timed("a", 0, 12, 12)};
  // Two ranks computing "a" at the same time, 11 ms each: their own reference (no faster run of
  // "a" beside another rank), so no slowdown, although one rank ran it in 10 ms alone.
  pair.events = {timed("a", 0, 0, 11), timed("a", 1, 0, 11)};
  // Two ranks, rank 1 at 16.5 ms beside rank 0's 11 ms: the run is as slow as its slowest rank,
  // 16.5 / 11 - 1 = 0.5 (rank 1 overlaps rank 0 for 11 of its 16.5 ms, more than half).
  pair_one_slow.events = {timed("a", 0, 0, 11), timed("a", 1, 0, 16.5)};
  // A pipeline: rank 0 computes "a" in 8 ms while rank 1 idles, then rank 1 in 8 ms alone; and
  // "b" (in no other run) beside each other. Alone, "a" has no other reference: slowdown 0, and
  // its 8 ms is no reference for the pairs' "a" beside each other.
  pipeline.events = {timed("a", 0, 0, 8), timed("a", 1, 8, 8), timed("b", 0, 16, 5),
                     timed("b", 1, 16, 5)};
  const std::vector<double> s = slowdowns_against_fastest(
      {&solo_fast, &solo_slow, &pair, &pair_one_slow, &pipeline}, {1, 1, 1, 1, 1});
  ASSERT_EQ(s.size(), 5u);
  EXPECT_NEAR(s[0], 0, 1e-12);
  EXPECT_NEAR(s[1], 0.2, 1e-12);
  EXPECT_NEAR(s[2], 0, 1e-12);
  EXPECT_NEAR(s[3], 0.5, 1e-12);
  EXPECT_NEAR(s[4], 0, 1e-12);
  // Steps before `first_steps` are left out: the slow run's slowness in a warm-up step only.
  spec::Trace warm = solo_fast;
  warm.events.push_back(op("a", 0, 0, 50));
  EXPECT_NEAR(slowdowns_against_fastest({&solo_fast, &warm}, {1, 1})[1], 0, 1e-12);
  EXPECT_NEAR(slowdowns_against_fastest({&solo_fast, &warm}, {1, 0})[1], (10 + 10 + 50) / 30.0 - 1,
              1e-12);
}

// Each step against the same rank's fastest step: per rank the step's compute over its least, and
// the most over the ranks; communication and the warm-up steps left out.
TEST(StepSlowdowns, EachRanksComputeAgainstItsFastestStep) {
  spec::Trace t;
  t.events = {op("a", 0, 0, 90), op("a", 1, 0, 90)};  // warm-up: left out
  // Step 1: rank 0 10 + 5 ms, rank 1 12 ms; step 2: rank 0 18 ms, rank 1 12 ms; step 3: rank 0
  // 15 ms, rank 1 15 ms. Rank 0's fastest is 15 ms (steps 1 and 3), rank 1's 12 ms (steps 1, 2).
  for (const auto& [rank, step, ms] : std::vector<std::tuple<int64_t, int64_t, double>>{
           {0, 1, 10}, {0, 1, 5}, {1, 1, 12}, {0, 2, 18}, {1, 2, 12}, {0, 3, 15}, {1, 3, 15}})
    t.events.push_back(op(ms == 5 ? "b" : "a", rank, step, ms));
  t.events.push_back(op("sync", 1, 1, 40, spec::OpClass::kAllReduce));  // a wait, not compute
  const std::map<int64_t, double> s = step_slowdowns(t, 1);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_NEAR(s.at(1), 0, 1e-12);
  EXPECT_NEAR(s.at(2), 18.0 / 15 - 1, 1e-12);  // rank 0
  EXPECT_NEAR(s.at(3), 15.0 / 12 - 1, 1e-12);  // rank 1
  EXPECT_TRUE(step_slowdowns(spec::Trace{}, 0).empty());
}

// The demo's local run of 2026-12-03 (gpt-tiny dp2.z2.mb4, 30 steps). Summed by hand (a Python
// script over the trace's compute events of steps 2-29): rank 0's least was step 2's, rank 1's
// step 26's; step 2 was 1.6% above (rank 1's), step 8 23.9% and step 24 25.3% (rank 0's).
TEST(StepSlowdowns, RecordedRunWithASlowSpell) {
  const std::map<int64_t, double> s =
      step_slowdowns(spec::read_trace_file(
                         test::source_path("traces/samples/run-gpt-tiny-dp2-slow-spell.json.gz")),
                     2);
  ASSERT_EQ(s.size(), 28u);
  EXPECT_NEAR(s.at(2), 0.0157, 0.0001);
  EXPECT_NEAR(s.at(8), 0.2389, 0.0001);
  EXPECT_NEAR(s.at(24), 0.2528, 0.0001);
  EXPECT_NEAR(s.at(15), 0.0428, 0.0001);
}

}  // namespace
}  // namespace sextant::traces
