// The watchdog's report: which rank holds a job whose ranks stopped making progress.
#include "sextant/exec/watchdog.hpp"

#include <gtest/gtest.h>

#include <string>

namespace sextant::exec {
namespace {

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(Watchdog, AStoppedRankIsNamedWhateverItsProgress) {
  // Rank 2 was stopped (SIGSTOP) 0.3 s after the others last progressed: its state decides.
  const std::string r = hung_rank_report({{0, 100, 5, 12.0, 'R'},
                                          {2, 102, 5, 11.7, 'T'},
                                          {1, 101, 5, 12.0, 'S'},
                                          {3, 103, 5, 12.1, 'R'}},
                                         0, 4, 12.0, 10.0);
  EXPECT_EQ(r.rfind("error: rank 2 holds the job: it is stopped (SIGSTOP or SIGTSTP) and made no "
                    "progress for 11.7 s (in step 5)",
                    0),
            0u)
      << r;
  EXPECT_TRUE(has(r,
                  "the watchdog of rank 0 ended the job after 12.0 s without progress (timeout "
                  "10.0 s"));
  // Every rank a line, in rank order; none on other nodes.
  EXPECT_LT(r.find("rank    1 pid"), r.find("rank    2 pid"));
  EXPECT_FALSE(has(r, "other nodes"));
}

TEST(Watchdog, AVanishedRankOrTheOldestProgressIsNamedElseNone) {
  const std::string gone =
      hung_rank_report({{0, 100, 3, 20, 'R'}, {1, 101, -1, 20, '-'}}, 0, 2, 20, 10);
  EXPECT_TRUE(has(gone, "rank 1 holds the job: it is gone (its process exited)")) << gone;
  EXPECT_TRUE(has(gone, "(in setup)")) << gone;
  // No process state stands out: the rank whose progress is oldest by more than a second does.
  const std::string slow =
      hung_rank_report({{0, 100, 3, 20, 'R'}, {1, 101, 2, 45, 'R'}}, 0, 4, 20, 10);
  EXPECT_TRUE(has(slow,
                  "rank 1 holds the job: it is running and made no progress for 45.0 s "
                  "(in step 2)"))
      << slow;
  EXPECT_TRUE(has(slow, "2 other rank(s) run on other nodes")) << slow;
  const std::string none =
      hung_rank_report({{0, 100, 3, 20, 'R'}, {1, 101, 3, 20.5, 'R'}}, 1, 2, 20, 10);
  EXPECT_EQ(none.rfind("error: no rank made progress for 20.0 s and none stands out", 0), 0u)
      << none;
}

}  // namespace
}  // namespace sextant::exec
