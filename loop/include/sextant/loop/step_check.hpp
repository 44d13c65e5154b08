// Does a calibration predict the runs it was fitted on? Every measured Sextant trace records what
// it ran (model, plan, dtype, software stack) and its mean step time; the check simulates each
// again with the cluster before and after the fit. A calibration whose fitted steps are off has
// no business predicting others (`sextant calibrate` refuses to write a file that got worse).
#pragma once

#include <string>
#include <vector>

#include "sextant/spec/cluster_spec.hpp"
#include "sextant/spec/model_spec.hpp"
#include "sextant/spec/plan.hpp"
#include "sextant/spec/trace.hpp"
#include "sextant/traces/compare.hpp"

namespace sextant::loop {

// One plan: its runs' measured steps, the median as the plan's time (one slow run of a noisy
// machine does not decide the check).
struct StepCheckRow {
  std::string source;  // the first run's file
  std::string plan;    // the trace's plan name
  int64_t runs = 0;
  double measured_s = 0;  // median over the runs
  double before_s = 0;    // predicted with the cluster before the fit
  double after_s = 0;     // and after it
  // Ops of the first run that the simulated step holds a different number of times (or not at
  // all): a fit of this run prices a program the simulator does not run. Empty when they agree.
  std::vector<traces::OpMismatch> mismatched_ops;
  bool logged = false;  // a stack's training log: checked, not fitted on (it holds no ops)
  double error_before() const { return (before_s - measured_s) / measured_s; }
  double error_after() const { return (after_s - measured_s) / measured_s; }
};

struct StepCheck {
  std::vector<StepCheckRow> rows;
  std::vector<std::string> skipped;  // traces that could not be re-simulated, and why
  double mean_abs_error_before() const;
  double mean_abs_error_after() const;
  double max_abs_error_after() const;
};

// The measured training traces among `traces` (with their file names), grouped by model and plan
// (repeated runs of one plan are one row), simulated with `before` and `after`. Traces without a
// measured step (benchmarks, predicted traces) are not rows.
StepCheck check_steps(const std::vector<std::pair<std::string, spec::Trace>>& traces,
                      const spec::ClusterSpec& before, const spec::ClusterSpec& after);

// A run known by its log alone (a stack's training log: its measured step, what it ran).
struct LoggedRun {
  std::string source;
  spec::ModelSpec model;
  spec::Plan plan;  // with the stack that ran it
  double measured_s = 0;
};
// Its row: simulated with `before` and `after`. Throws InputError naming the log when the plan
// cannot be simulated.
StepCheckRow check_logged_run(const LoggedRun& run, const spec::ClusterSpec& before,
                              const spec::ClusterSpec& after);

// The plans whose simulated step does not hold the measured run's ops, one line each ("" if none):
// the fit stands on times of ops the prediction prices differently, or not at all.
std::vector<std::string> op_warnings(const StepCheck& check);

// Why a fit must not be written: its fitted plans' steps are predicted worse after it than before
// (mean |error| over the plans); "" when it may be.
std::string refusal(const StepCheck& check);

}  // namespace sextant::loop
