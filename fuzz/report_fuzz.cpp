// Reports (`simulate --json` output), which `compare` and the notebooks read back.
#include "fuzz_support.hpp"
#include "sextant/spec/json_io.hpp"
#include "sextant/spec/report.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace spec = sextant::spec;
  return sextant::fuzz::expect_clear_error(data, size, [](std::string_view text) {
    (void)spec::report_from_json(spec::parse_json_text(text, "fuzz.json"), "fuzz.json");
  });
}
