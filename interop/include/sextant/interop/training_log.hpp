// The step lines the training stacks print, read as measurements (formats and their sources:
// stacks/LOGS.md): Megatron-LM's per-iteration line, NeMo 2.0's ProgressPrinter line, TorchTitan's
// metrics line (ANSI colours and thousands separators allowed) and DeepSpeed's throughput-timer
// and pipeline-engine lines. A line of the format that does not parse is an error naming the file
// and line; a log without a single step line is one too.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "sextant/spec/json_reader.hpp"
#include "sextant/spec/model_spec.hpp"
#include "sextant/spec/plan.hpp"

namespace sextant::interop {

enum class LogFormat { kMegatron, kNemo, kTorchtitan, kDeepspeed };
spec::EnumNames<LogFormat> log_format_names();

// One logged step; a field the line does not print is 0.
struct LogStep {
  int64_t step = 0;              // the stack's own step number
  int64_t line = 0;              // 1-based line in the log
  double step_time_s = 0;        // Megatron (interval mean), NeMo, DeepSpeed's pipeline engine
  double tokens_per_s = 0;       // per device (TorchTitan's tps)
  double samples_per_s = 0;      // all devices together (DeepSpeed's CurrSamplesPerSec)
  double tflops_per_device = 0;  // the stack's own analytic count over wall time
  double mfu = 0;                // fraction (TorchTitan prints percent)
  double memory_bytes = 0;       // peak reserved (TorchTitan) or allocated (DeepSpeed)
};

struct TrainingLog {
  LogFormat format = LogFormat::kMegatron;
  std::vector<LogStep> steps;
};

// The format whose step lines `text` holds, if any.
std::optional<LogFormat> detect_log_format(const std::string& text);
// Every step line of `text` (`format`: detected when absent). Throws InputError naming `source`.
TrainingLog read_training_log(const std::string& text, const std::string& source,
                              std::optional<LogFormat> format = std::nullopt);

// What one step of `plan` processes over all its devices, for the logs that print a throughput:
// samples (the global batch), tokens (samples x sequence; 0 for a model without tokens), devices.
struct StepSize {
  int64_t samples = 0, tokens = 0, devices = 0;
};
StepSize step_size(const spec::Plan& plan, const spec::ModelSpec& model);

// A step's wall time: as printed, or from its throughput with the step's size (`samples` a step
// over all devices, `tokens` a step over all devices, `devices`); 0 when neither says it.
double step_seconds(const LogStep& step, int64_t samples, int64_t tokens, int64_t devices);

// The measured step time of a log: the median over its steps after the first one logged (which
// includes start-up, compilation and the first iterations' warm-up in every stack's log).
// Throws InputError naming `source` when fewer than two steps give a time.
double measured_step_seconds(const TrainingLog& log, int64_t samples, int64_t tokens,
                             int64_t devices, const std::string& source);

}  // namespace sextant::interop
