// Measured runs to a checked calibration.
#include "sextant/loop/run_fit.hpp"

#include <fmt/format.h>

namespace sextant::loop {

std::string refusal(const traces::CalibrationReport& r) {
  if (r.compute_samples == 0 || r.compute_time_error_after <= r.compute_time_error_before + 1e-12)
    return "";
  return fmt::format(
      "the fitted compute ops' times are predicted worse after the fit ({:.1f}% time-weighted "
      "mean |error|) than before ({:.1f}%)",
      100 * r.compute_time_error_after, 100 * r.compute_time_error_before);
}

RunFit fit_runs(const spec::ClusterSpec& base,
                const std::vector<std::pair<std::string, spec::Trace>>& runs,
                const RunFitOptions& options) {
  traces::Samples samples = options.extra;
  for (const auto& [source, trace] : runs)
    samples.append(traces::samples_from_trace(trace, source));
  RunFit fit{traces::calibrate(base, samples, options.dtype), std::nullopt, {}, ""};
  if (options.profiled) {
    const ProfiledStep& p = *options.profiled;
    fit.class_fit = fit_classes(p.kernels, p.source, p.model, p.plan, fit.calibration.cluster);
    fit.calibration.cluster = fit.class_fit->cluster;
  }
  fit.check = check_steps(runs, base, fit.calibration.cluster);
  for (const LoggedRun& run : options.logged)
    fit.check.rows.push_back(check_logged_run(run, base, fit.calibration.cluster));
  // A calibration that predicts its own measurements worse than the file it started from would
  // silently make every later prediction worse.
  fit.refused = refusal(fit.check);
  if (fit.refused.empty()) fit.refused = refusal(fit.calibration.report);
  if (fit.refused.empty() && fit.class_fit) fit.refused = refusal(*fit.class_fit);
  return fit;
}

}  // namespace sextant::loop
