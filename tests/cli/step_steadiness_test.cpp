// The run summary's steadiness lines: hand-made traces whose steps' compute is set by hand, and
// the demo's recorded run with a slow spell.
#include "step_steadiness.hpp"

#include <gtest/gtest.h>

#include "sextant/spec/units.hpp"
#include "test_paths.hpp"

namespace sextant::cli {
namespace {

// One rank, one GEMM per step of the given milliseconds; steps as logged, 10 ms more than the
// compute (the step's own time is what the lines average).
struct LoggedRun {
  spec::Trace trace;
  std::vector<StepTime> steps;
};

LoggedRun run_of(const std::vector<double>& compute_ms) {
  LoggedRun r;
  for (size_t i = 0; i < compute_ms.size(); ++i) {
    spec::TraceEvent e;
    e.name = "mlp.fc1";
    e.op_class = spec::OpClass::kGemm;
    e.step = static_cast<int64_t>(i);
    e.shape = {8, 8, 8};
    e.duration_ps = seconds_to_ps(compute_ms[i] / 1e3);
    r.trace.events.push_back(e);
    r.steps.push_back({static_cast<int64_t>(i), (compute_ms[i] + 10) / 1e3});
  }
  return r;
}

TEST(StepSteadiness, SteadyCoresSayHowClose) {
  // Steps 0-1 are the warm-up (left out, 500 ms); steps 2-5 at 100, 102, 101, 104 ms of compute:
  // the most is 104 / 100 - 1 = 4.0%, within the 5% tolerance.
  const LoggedRun r = run_of({500, 500, 100, 102, 101, 104});
  EXPECT_EQ(steadiness_lines(r.trace, r.steps, 0.1),
            "cores steady: every step's compute within 4.0% of the fastest (4 steps)\n");
}

TEST(StepSteadiness, ASlowSpellAndTheSteadyStepsAgainstThePrediction) {
  // Steps 2-7: 100, 120, 125, 101, 103, 110 ms of compute. Slow (beyond 5%): 20%, 25%, 10%; steady:
  // steps 2, 5 and 6, logged at 110, 111 and 113 ms, mean 111.33 ms; against 100 ms predicted,
  // 11.3% slower.
  const LoggedRun r = run_of({500, 500, 100, 120, 125, 101, 103, 110});
  EXPECT_EQ(steadiness_lines(r.trace, r.steps, 0.1),
            "cores slowed: in 3 of 6 steps a rank computed 10-25% slower than in its fastest step\n"
            "  (the same ops each step); steady steps: 3, mean 111.33 ms, 11.3% slower than "
            "predicted\n");
  // Without a prediction, the mean alone.
  EXPECT_EQ(steadiness_lines(r.trace, r.steps, 0),
            "cores slowed: in 3 of 6 steps a rank computed 10-25% slower than in its fastest step\n"
            "  (the same ops each step); steady steps: 3, mean 111.33 ms\n");
}

TEST(StepSteadiness, TooFewSteadyStepsOrStepsSayNoMean) {
  // Steps 2-5: 100, 130, 140, 102: two steady steps.
  const LoggedRun r = run_of({500, 500, 100, 130, 140, 102});
  EXPECT_EQ(
      steadiness_lines(r.trace, r.steps, 0.1),
      "cores slowed: in 2 of 4 steps a rank computed 30-40% slower than in its fastest step\n"
      "  (the same ops each step); steady steps: 2, too few to hold the prediction against\n");
  // Three steps: the warm-up rule leaves one out, two are judged: no line.
  const LoggedRun few = run_of({500, 100, 150});
  EXPECT_EQ(steadiness_lines(few.trace, few.steps, 0.1), "");
  EXPECT_EQ(steadiness_lines(spec::Trace{}, r.steps, 0.1), "");  // no trace events
}

// The demo's local run of 2026-12-03: 26 of the 28 steps after the warm-up computed 5.1-25.3%
// slower than the fastest (tests/traces/rank_speeds_test.cpp sums them); steps 2 and 15 were
// steady, logged at 109.19 and 110.97 ms (the trace's step_times_s).
TEST(StepSteadiness, RecordedRunWithASlowSpell) {
  const spec::Trace trace = spec::read_trace_file(
      test::source_path("traces/samples/run-gpt-tiny-dp2-slow-spell.json.gz"));
  std::vector<StepTime> steps;
  const spec::Json& times = trace.metadata.at("step_times_s");
  for (size_t i = 0; i < times.size(); ++i)
    steps.push_back({static_cast<int64_t>(i), times[i].get<double>()});
  EXPECT_EQ(
      steadiness_lines(trace, steps, 0.10351),
      "cores slowed: in 26 of 28 steps a rank computed 5-25% slower than in its fastest step\n"
      "  (the same ops each step); steady steps: 2, too few to hold the prediction against\n");
}

}  // namespace
}  // namespace sextant::cli
