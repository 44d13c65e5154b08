// The stacks' step lines read as measurements. The logs in tests/data/logs are written by hand to
// each documented format (stacks/LOGS.md cites the format strings: Megatron-LM core_v0.14.0
// training.py:1523-1578, NeMo 8cfedd7 progress_printer.py:139-142, TorchTitan v0.2.2
// metrics.py:460-470 with its ANSI colours, DeepSpeed edaa722 timer.py:262-274).
#include "sextant/interop/training_log.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "expect_input_error.hpp"

namespace sextant::interop {
namespace {

std::string log_file(const char* name) {
  std::ifstream in(std::string(SEXTANT_TEST_DATA) + "/logs/" + name, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(TrainingLog, MegatronsIntervalMeansInMilliseconds) {
  const TrainingLog log = read_training_log(log_file("megatron.log"), "megatron.log");
  EXPECT_EQ(log.format, LogFormat::kMegatron);
  ASSERT_EQ(log.steps.size(), 3u);  // the memory line is no step line
  EXPECT_EQ(log.steps[1].step, 200);
  EXPECT_EQ(log.steps[1].line, 4);
  EXPECT_DOUBLE_EQ(log.steps[1].step_time_s, 6.8012);
  EXPECT_DOUBLE_EQ(log.steps[1].tflops_per_device, 414.4);
  // The first interval (7830.4 ms, warm-up) left out; the median of 6801.2 and 6815.0 ms.
  EXPECT_DOUBLE_EQ(measured_step_seconds(log, 512, 0, 0, "megatron.log"), (6.8012 + 6.815) / 2);
}

TEST(TrainingLog, TorchtitansTokensPerDeviceGiveTheStepTime) {
  const TrainingLog log = read_training_log(log_file("torchtitan.log"), "torchtitan.log");
  EXPECT_EQ(log.format, LogFormat::kTorchtitan);
  ASSERT_EQ(log.steps.size(), 3u);  // the validation line is no training step
  EXPECT_EQ(log.steps[1].step, 10);
  EXPECT_DOUBLE_EQ(log.steps[1].tokens_per_s, 6830);  // "6,830" behind ANSI colour codes
  EXPECT_DOUBLE_EQ(log.steps[1].mfu, 0.3995);
  EXPECT_DOUBLE_EQ(log.steps[1].memory_bytes, 45.67 * 1073741824.0);
  // 64 sequences of 8192 tokens a step over 8 devices: 524288 / (6830 x 8) and / (6850 x 8) s.
  const double a = 524288.0 / (6830 * 8), b = 524288.0 / (6850 * 8);
  EXPECT_DOUBLE_EQ(measured_step_seconds(log, 64, 524288, 8, "t"), (a + b) / 2);
  EXPECT_DOUBLE_EQ(step_seconds(log.steps[2], 64, 524288, 8), b);
}

TEST(TrainingLog, DeepspeedsSamplesPerSecondAreTheWholeStep) {
  const TrainingLog log = read_training_log(log_file("deepspeed.log"), "deepspeed.log");
  EXPECT_EQ(log.format, LogFormat::kDeepspeed);
  ASSERT_EQ(log.steps.size(), 3u);  // the step=... progress lines carry no time
  EXPECT_EQ(log.steps[2].step, 30);
  EXPECT_DOUBLE_EQ(log.steps[2].memory_bytes, 49.5 * 1073741824.0);  // "GB" is GiB there
  // 256 samples a step at 64 and 62.5 samples/s: 4.0 and 4.096 s.
  EXPECT_DOUBLE_EQ(measured_step_seconds(log, 256, 0, 8, "d"), (4.0 + 4.096) / 2);
  // The pipeline engine's line times its step itself.
  const TrainingLog pipe = read_training_log(
      "steps: 10 loss: 2.3457 iter time (s): 5.612 samples/sec: 45.614\n"
      "steps: 20 loss: 2.1 iter time (s): 5.5 samples/sec: 46.5\n",
      "pipe.log");
  EXPECT_DOUBLE_EQ(pipe.steps[1].step_time_s, 5.5);
}

TEST(TrainingLog, NemosStepTimingInSeconds) {
  const TrainingLog log = read_training_log(log_file("nemo.log"), "nemo.log");
  EXPECT_EQ(log.format, LogFormat::kNemo);
  ASSERT_EQ(log.steps.size(), 4u);
  EXPECT_EQ(log.steps[0].step, 0);
  // Steps 1-3 (3.488, 3.502, 3.495 s) after the first: the median 3.495.
  EXPECT_DOUBLE_EQ(measured_step_seconds(log, 512, 0, 0, "nemo.log"), 3.495);
}

TEST(TrainingLog, AMalformedOrEmptyLogIsRefusedByLine) {
  const std::string bad = log_file("megatron.log") +
                          " [2025-10-08 14:35:46] iteration      400/    5000 | elapsed time per "
                          "iteration (ms): n/a | global batch size:   512 |\n";
  EXPECT_INPUT_ERROR(read_training_log(bad, "m.log"), "m.log: line 6");
  EXPECT_INPUT_ERROR(read_training_log("hello\nworld\n", "x.log"),
                     "x.log: no step line of Megatron-LM, NeMo, TorchTitan or DeepSpeed");
  EXPECT_INPUT_ERROR(read_training_log("hello\n", "x.log", LogFormat::kNemo),
                     "x.log: no nemo step line");
  // One step line alone times nothing once start-up is left out.
  const TrainingLog one = read_training_log(
      "Training epoch 0, iteration 0/9 | global_step: 0 | train_step_timing in s: 3.1\n", "o.log");
  EXPECT_INPUT_ERROR(measured_step_seconds(one, 1, 0, 0, "o.log"),
                     "at least two step lines that time their step");
}

}  // namespace
}  // namespace sextant::interop
