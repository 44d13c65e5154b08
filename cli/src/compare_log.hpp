// `sextant compare --log FILE`: a stack's own training log (Megatron-LM, NeMo, TorchTitan,
// DeepSpeed) against the step Sextant predicts for the plan that run used.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "plan_options.hpp"

namespace sextant::cli {

struct CompareLogFlags {
  std::string log;
  std::string format;  // empty: detected from the log's step lines
  std::string model;
  std::string cluster;
  int64_t gpus = 0;
  PlanFlags plan;
};

// Registers --log, --log-format, --model, --cluster, --gpus and the plan flags on `cmd`.
void add_compare_log_flags(CLI::App& cmd, CompareLogFlags& flags);
// Prints (or, with `json`, writes as JSON) the measured and predicted step times.
void run_compare_log(const CompareLogFlags& flags, bool json);

}  // namespace sextant::cli
