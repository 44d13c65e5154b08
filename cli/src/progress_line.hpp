// A progress line on stderr for work that runs longer than a second (`plan`'s simulations, one
// large `simulate`): what is done, the percentage, the rate and the time left, redrawn in place at
// most ten times a second. Silent when stderr is not a terminal or the command prints JSON or was
// given --quiet, so logs and pipes never see it.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

namespace sextant::cli {

// "simulating the leaders: 12/24 plans (50%), 3.0 plans/s, 4 s left" after `elapsed_s` seconds;
// counts above 10^5 and rates above 10^4 are written with k/M suffixes.
std::string progress_text(std::string_view what, std::string_view unit, int64_t done, int64_t total,
                          double elapsed_s);

class ProgressLine {
 public:
  // `enabled` is the caller's "may print" (no --json, no --quiet); the terminal check is added.
  ProgressLine(std::string what, std::string unit, bool enabled);
  ~ProgressLine() { finish(); }
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  // done >= total ends a series: the line is cleared and the next series timed afresh.
  void update(int64_t done, int64_t total);
  // Clears the line if one was drawn (before the command prints its results); no more updates.
  void finish();

 private:
  using Clock = std::chrono::steady_clock;
  std::string what_, unit_;
  bool enabled_;
  bool drawn_ = false;
  Clock::time_point start_ = Clock::now();
  Clock::time_point last_draw_{};
  size_t width_ = 0;
};

}  // namespace sextant::cli
