// Sextant traces (what `run --trace` and `simulate --trace` write; `compare`, `calibrate` and
// `plan --calibrate-from` read them), then the samples calibration takes from them.
#include "fuzz_support.hpp"
#include "sextant/spec/json_io.hpp"
#include "sextant/spec/trace.hpp"
#include "sextant/traces/samples.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace spec = sextant::spec;
  return sextant::fuzz::expect_clear_error(data, size, [](std::string_view text) {
    const spec::Trace trace =
        spec::trace_from_json(spec::parse_json_text(text, "fuzz.json"), "fuzz.json");
    (void)sextant::traces::samples_from_trace(trace, "fuzz.json");
  });
}
