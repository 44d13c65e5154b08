// A calibration from measured runs, checked on them: the one place where measurements become a
// cluster file. `sextant calibrate` and `sextant plan --verify --calibrated-out` both ask it, so a
// fit that predicts its own runs worse is refused the same way wherever it is made.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "sextant/loop/class_fit.hpp"
#include "sextant/loop/step_check.hpp"
#include "sextant/spec/cluster_spec.hpp"
#include "sextant/spec/model_spec.hpp"
#include "sextant/spec/plan.hpp"
#include "sextant/spec/trace.hpp"
#include "sextant/traces/calibration.hpp"
#include "sextant/traces/kernel_classes.hpp"
#include "sextant/traces/samples.hpp"

namespace sextant::loop {

// A profiler trace of one training step and what it ran: its kernels' time per op class is fitted
// after the op-level fit (fit_classes).
struct ProfiledStep {
  traces::KernelTimes kernels;
  std::string source;
  spec::ModelSpec model;
  spec::Plan plan;
};

struct RunFitOptions {
  spec::Dtype dtype = spec::Dtype::kFp32;  // the precision the measured ops ran in
  traces::Samples extra;                   // samples from other sources (nccl-tests, Kineto ops)
  std::optional<ProfiledStep> profiled;
  // Runs known by their logs: not fitted on (a step time says nothing of which op took it), but
  // checked like the fitted runs, so a fit that predicts them worse is refused.
  std::vector<LoggedRun> logged;
};

struct RunFit {
  traces::Calibration calibration;  // the fitted cluster and the op-level report
  std::optional<ClassFit> class_fit;
  StepCheck check;      // the runs re-simulated with the cluster before and after the fit
  std::string refused;  // why the fit must not be written ("" when it may be)
};

// Why a fit that predicts its own compute ops' time worse than the file it started from must not
// be written ("" when it does not): the time-weighted error of CalibrationReport got worse.
std::string refusal(const traces::CalibrationReport& report);

// Fits `base` to the samples of the measured `runs` (Sextant traces with their file names) and of
// options.extra, then the profiled step's classes, and checks the fit on the runs.
RunFit fit_runs(const spec::ClusterSpec& base,
                const std::vector<std::pair<std::string, spec::Trace>>& runs,
                const RunFitOptions& options);

}  // namespace sextant::loop
