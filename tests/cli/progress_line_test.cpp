// The progress line's text: counts, percentage, rate and time left (hand-computed below).
#include "progress_line.hpp"

#include <gtest/gtest.h>

namespace sextant::cli {
namespace {

TEST(ProgressText, CountsPercentRateAndTimeLeft) {
  // 12 of 24 plans in 4 s: 3 plans/s, 12 left at 3/s = 4 s.
  EXPECT_EQ(progress_text("simulating the leaders", "plans", 12, 24, 4.0),
            "simulating the leaders: 12/24 plans (50%), 3.0 plans/s, 4 s left");
  // 2,621,440 of 11,600,000 tasks in 2 s: 1.31 M tasks/s (written 1311k), 8,978,560 left at that
  // rate = 6.85 s, shown as 7 s.
  EXPECT_EQ(progress_text("simulating", "tasks", 2'621'440, 11'600'000, 2.0),
            "simulating: 2621k/11.6M tasks (23%), 1311k tasks/s, 7 s left");
  // 1 of 100 in 30 s: 99 left at 1/30 per s = 2970 s = 49 min 30 s.
  EXPECT_EQ(progress_text("x", "plans", 1, 100, 30.0),
            "x: 1/100 plans (1%), 0.0 plans/s, 49 min 30 s left");
  // Done: no time left; nothing done yet: no rate.
  EXPECT_EQ(progress_text("x", "plans", 5, 5, 2.0), "x: 5/5 plans (100%), 2.5 plans/s");
  EXPECT_EQ(progress_text("x", "plans", 0, 5, 2.0), "x: 0/5 plans (0%)");
}

}  // namespace
}  // namespace sextant::cli
