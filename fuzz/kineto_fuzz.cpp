// PyTorch profiler (Kineto) traces: the samples `calibrate --kineto` fits and the kernel times per
// class that the class fit reads.
#include "fuzz_support.hpp"
#include "sextant/spec/json_io.hpp"
#include "sextant/traces/kernel_classes.hpp"
#include "sextant/traces/readers.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace spec = sextant::spec;
  return sextant::fuzz::expect_clear_error(data, size, [](std::string_view text) {
    const spec::Json json = spec::parse_json_text(text, "fuzz.json");
    try {
      (void)sextant::traces::parse_kineto(json, "fuzz.json");
    } catch (const sextant::InputError&) {
      // The kernel reader takes what the sample reader refused as well: test it either way.
    }
    (void)sextant::traces::kernel_times(json, "fuzz.json");
  });
}
