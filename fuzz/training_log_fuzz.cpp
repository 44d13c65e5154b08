// The stacks' training logs (`sextant compare --log`): every format's step lines.
#include "fuzz_support.hpp"
#include "sextant/interop/training_log.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace interop = sextant::interop;
  return sextant::fuzz::expect_clear_error(data, size, [](std::string_view text) {
    const interop::TrainingLog log = interop::read_training_log(std::string(text), "fuzz.log");
    (void)interop::measured_step_seconds(log, 64, 524288, 8, "fuzz.log");
  });
}
