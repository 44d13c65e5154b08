// `sextant plan --verify K`: the top K plans run for a few steps each on the real backend (each
// trial with a time limit; a failing or hanging trial is recorded and skipped), measured against
// predicted, the measured best picked, and the traces handed to calibration.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "sextant/planner/planner.hpp"

namespace sextant::cli {

struct Trial {
  spec::Plan plan;
  double predicted_s = 0;
  std::optional<double> measured_s;
  std::string status;  // "ok", "timed out after N s", "failed (exit N): last line"
  std::string trace_file;
};

struct VerifyOptions {
  std::string model;  // as given on the command line (zoo name or file)
  int64_t steps = 6;
  double timeout_s = 300;
  std::string work_dir;  // plans, logs and traces of the trials
};

std::vector<Trial> verify(const std::vector<planner::RankedPlan>& ranked, int64_t top,
                          const VerifyOptions& options);

}  // namespace sextant::cli
