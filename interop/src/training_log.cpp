// Readers of the stacks' step lines (format strings and sources in stacks/LOGS.md).
#include "sextant/interop/training_log.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <regex>
#include <sstream>

#include "sextant/spec/error.hpp"

namespace sextant::interop {

namespace {

constexpr std::array<std::pair<std::string_view, LogFormat>, 4> kFormats{
    {{"megatron", LogFormat::kMegatron},
     {"nemo", LogFormat::kNemo},
     {"torchtitan", LogFormat::kTorchtitan},
     {"deepspeed", LogFormat::kDeepspeed}}};

// What marks a step line of each format: Megatron's training_log (training.py:1523-1578), NeMo's
// ProgressPrinter (progress_printer.py:139-142), TorchTitan's MetricsProcessor.log (metrics.py:
// 460-470), DeepSpeed's ThroughputTimer (timer.py:262-274) and PipelineEngine lines.
bool is_step_line(LogFormat f, const std::string& line) {
  switch (f) {
    case LogFormat::kMegatron:
      return line.find(" iteration ") != std::string::npos &&
             line.find("elapsed time per iteration (ms):") != std::string::npos;
    case LogFormat::kNemo:
      return line.find("Training epoch ") != std::string::npos &&
             line.find(", iteration ") != std::string::npos;
    case LogFormat::kTorchtitan:
      return line.find("step:") != std::string::npos && line.find("tps:") != std::string::npos &&
             line.find("validate step:") == std::string::npos;
    case LogFormat::kDeepspeed:
      return (line.find("/global_step=") != std::string::npos &&
              line.find("CurrSamplesPerSec=") != std::string::npos) ||
             (line.find("steps: ") != std::string::npos &&
              line.find("iter time (s): ") != std::string::npos);
  }
  return false;
}

// ANSI colour sequences (TorchTitan's, 24-bit ones included) and thousands separators out.
std::string plain(const std::string& line) {
  static const std::regex ansi("\x1b\\[[0-9;]*m");
  return std::regex_replace(line, ansi, "");
}
double number(const std::string& text) {
  std::string digits;
  for (char c : text)
    if (c != ',') digits += c;
  return std::stod(digits);
}

// The first capture of `pattern` in `line` as a number, if it matches.
std::optional<double> field(const std::string& line, const std::regex& pattern) {
  std::smatch m;
  if (!std::regex_search(line, m, pattern)) return std::nullopt;
  return number(m[1].str());
}

const std::string kNum = R"(([0-9][0-9,]*\.?[0-9]*(?:[eE][-+]?[0-9]+)?))";

// A step number: a whole number below 2^53, else -1 (not a step line this reader can take).
int64_t step_number(std::optional<double> value) {
  if (!value || !(*value >= 0 && *value < 0x1p53)) return -1;
  return static_cast<int64_t>(*value);
}

LogStep megatron_step(const std::string& line) {
  static const std::regex step(R"(iteration\s+([0-9]+)\s*/)"),
      time("elapsed time per iteration \\(ms\\): " + kNum),
      tflops("throughput per GPU \\(TFLOP/s/GPU\\): " + kNum);
  LogStep s;
  s.step = step_number(field(line, step));
  s.step_time_s = field(line, time).value_or(-1) / 1e3;
  s.tflops_per_device = field(line, tflops).value_or(0);
  return s;
}

LogStep nemo_step(const std::string& line) {
  static const std::regex step(R"(, iteration ([0-9]+)/)"),
      time("\\| train_step_timing in s: " + kNum), tflops("\\| TFLOPS_per_GPU: " + kNum),
      memory("\\| max_memory_reserved: " + kNum);
  LogStep s;
  s.step = step_number(field(line, step));
  s.step_time_s = field(line, time).value_or(0);
  s.tflops_per_device = field(line, tflops).value_or(0);
  s.memory_bytes = field(line, memory).value_or(0);
  return s;
}

LogStep torchtitan_step(const std::string& line) {
  static const std::regex step(R"(step:\s*([0-9]+))"), tps("tps: " + kNum),
      tflops("tflops: " + kNum), mfu("mfu: " + kNum + "%"), memory("memory:\\s*" + kNum + "GiB");
  LogStep s;
  s.step = step_number(field(line, step));
  s.tokens_per_s = field(line, tps).value_or(-1);
  s.tflops_per_device = field(line, tflops).value_or(0);
  s.mfu = field(line, mfu).value_or(0) / 100;
  s.memory_bytes = field(line, memory).value_or(0) * std::pow(2.0, 30);
  return s;
}

LogStep deepspeed_step(const std::string& line) {
  static const std::regex step(R"(/global_step=([0-9]+))"), samples("CurrSamplesPerSec=" + kNum),
      memory("MaxMemAllocated=" + kNum + "GB"), pipe_step(R"(steps: ([0-9]+) )"),
      pipe_time("iter time \\(s\\): " + kNum);
  LogStep s;
  if (line.find("/global_step=") != std::string::npos) {
    s.step = step_number(field(line, step));
    s.samples_per_s = field(line, samples).value_or(-1);
    s.memory_bytes = field(line, memory).value_or(0) * std::pow(2.0, 30);  // GB there is GiB
  } else {
    s.step = step_number(field(line, pipe_step));
    s.step_time_s = field(line, pipe_time).value_or(-1);
  }
  return s;
}

// Whether the step line gave its step number and what it times the step by.
bool complete(const LogStep& s) {
  return s.step >= 0 && s.step_time_s >= 0 && s.tokens_per_s >= 0 && s.samples_per_s >= 0;
}

}  // namespace

spec::EnumNames<LogFormat> log_format_names() {
  return kFormats;
}

std::optional<LogFormat> detect_log_format(const std::string& text) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const std::string p = plain(line);
    for (const auto& [name, f] : kFormats)
      if (is_step_line(f, p)) return f;
  }
  return std::nullopt;
}

TrainingLog read_training_log(const std::string& text, const std::string& source,
                              std::optional<LogFormat> format) {
  if (!format) format = detect_log_format(text);
  if (!format)
    throw InputError(source, "", "",
                     "no step line of Megatron-LM, NeMo, TorchTitan or DeepSpeed (stacks/LOGS.md "
                     "has their formats; DeepSpeed prints them with steps_per_print and "
                     "log_level info)");
  TrainingLog log{*format, {}};
  std::istringstream in(text);
  std::string raw;
  for (int64_t n = 1; std::getline(in, raw); ++n) {
    const std::string line = plain(raw);
    if (!is_step_line(*format, line)) continue;
    LogStep s;
    try {
      switch (*format) {
        case LogFormat::kMegatron:
          s = megatron_step(line);
          break;
        case LogFormat::kNemo:
          s = nemo_step(line);
          break;
        case LogFormat::kTorchtitan:
          s = torchtitan_step(line);
          break;
        case LogFormat::kDeepspeed:
          s = deepspeed_step(line);
          break;
      }
    } catch (const std::exception&) {  // a number std::stod refuses
      s.step = -1;
    }
    if (!complete(s))
      throw InputError(source, fmt::format("line {}", n), line.substr(0, 120),
                       fmt::format("a {} step line with its step and time or throughput",
                                   spec::enum_name(log_format_names(), *format)));
    s.line = n;
    log.steps.push_back(s);
  }
  if (log.steps.empty())
    throw InputError(source, "", "",
                     fmt::format("no {} step line", spec::enum_name(log_format_names(), *format)));
  return log;
}

StepSize step_size(const spec::Plan& plan, const spec::ModelSpec& model) {
  const int64_t samples = plan.global_batch;
  const int64_t tokens =
      model.is_transformer() ? samples * plan.seq_len.value_or(model.transformer().seq_len) : 0;
  return {samples, tokens, plan.world_size()};
}

double step_seconds(const LogStep& s, int64_t samples, int64_t tokens, int64_t devices) {
  if (s.step_time_s > 0) return s.step_time_s;
  // TorchTitan's tps counts each device's tokens (metrics.py:419-435): the step's tokens spread
  // over the devices. DeepSpeed's CurrSamplesPerSec is the whole step's samples per second.
  if (s.tokens_per_s > 0 && tokens > 0 && devices > 0)
    return static_cast<double>(tokens) / (s.tokens_per_s * static_cast<double>(devices));
  if (s.samples_per_s > 0 && samples > 0) return static_cast<double>(samples) / s.samples_per_s;
  return 0;
}

double measured_step_seconds(const TrainingLog& log, int64_t samples, int64_t tokens,
                             int64_t devices, const std::string& source) {
  std::vector<double> times;
  for (size_t i = 1; i < log.steps.size(); ++i)
    if (double t = step_seconds(log.steps[i], samples, tokens, devices); t > 0) times.push_back(t);
  if (times.empty())
    throw InputError(source, "", fmt::format("{} step line(s)", log.steps.size()),
                     "at least two step lines that time their step (the first one logged "
                     "includes start-up and is left out)");
  std::sort(times.begin(), times.end());
  const size_t n = times.size();
  return n % 2 == 1 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]);
}

}  // namespace sextant::interop
