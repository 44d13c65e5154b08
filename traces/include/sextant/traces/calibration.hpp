// Calibration: fits a cluster description to measurements by least squares (Eigen). Memory-bound
// ops give the launch overhead and the memory efficiency (time = launch + bytes / (bw * eff));
// matrix ops give the GEMM efficiency curve (achieved / peak, median per half decade of FLOPs);
// collectives give α and β per collective and network level through the collective's ring formula;
// measured training steps give the host time per step that no op explains. Physical bounds hold:
// efficiencies stay in (0, 1] of the file's peaks, which calibration never raises.
// The calibrated ClusterSpec records what it came from and how well the fit holds.
#pragma once

#include <string>
#include <vector>

#include "sextant/spec/cluster_spec.hpp"
#include "sextant/traces/samples.hpp"

namespace sextant::traces {

struct CalibrationReport {
  int64_t compute_samples = 0;
  int64_t comm_samples = 0;
  // RMS of (predicted - measured) / measured over the compute samples, with the cluster's
  // parameters before and after the fit.
  double compute_error_before = 0;
  double compute_error_after = 0;
  // sum |predicted - measured| / sum measured over the compute samples, before and after: the
  // error of the ops' time in a step, which the fits aim at (and a fit must not make worse).
  double compute_time_error_before = 0;
  double compute_time_error_after = 0;
  double launch_overhead_us = 0;
  double memory_efficiency = 0;
  double step_overhead_us = 0;  // host time per step (median over the measured training runs)
  double compute_jitter = 0;    // from the arrival spreads at collectives
  std::vector<spec::EfficiencyPoint> gemm_efficiency;
  std::vector<spec::CollectiveFit> collective_fits;  // with r2 and sample counts
  std::vector<std::string> notes;     // what could not be fitted and kept its old value
  std::vector<std::string> warnings;  // measurements left out, and why (traces/sample_checks.hpp)
};

struct Calibration {
  spec::ClusterSpec cluster;
  CalibrationReport report;
};

// `dtype`: the precision the measured ops ran in (its peak is the efficiency's denominator).
// Samples are screened first (screen_samples). Throws InputError when nothing is left to fit.
Calibration calibrate(const spec::ClusterSpec& base, const Samples& samples, spec::Dtype dtype);

}  // namespace sextant::traces
