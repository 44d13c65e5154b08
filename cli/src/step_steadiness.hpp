// How steady the cores were through a `sextant run`, for its summary: a prediction is held
// against the run's mean step, and on a shared machine the cores slow for spells within one run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sextant/spec/trace.hpp"

namespace sextant::cli {

struct StepTime {
  int64_t step = 0;
  double seconds = 0;
};

// A step whose every rank computed within this of its fastest step counts as steady: of the 17
// runs a Zen 4 loop found undisturbed, 15 computed a median step 0.5-2.0% above their fastest
// (two 6-8%; bench/results/calibration_local.md).
inline constexpr double kSteadyTolerance = 0.05;

// The summary's line (two lines when the cores slowed) on the steps after the warm-up
// (spec::steps_after_warmup), from the run's measured trace (traces::step_slowdowns): how much
// slower than its fastest the slowest step computed and, when a step was slower than
// kSteadyTolerance, the mean of the steady steps against `predicted_s` (0: no prediction). Empty
// when fewer than three steps after the warm-up have compute ops in the trace.
std::string steadiness_lines(const spec::Trace& trace, const std::vector<StepTime>& steps,
                             double predicted_s);

}  // namespace sextant::cli
