// A checkpoint's manifest and a shard's header line, as `run --resume` reads them.
#include "fuzz_support.hpp"
#include "sextant/exec/checkpoint_manifest.hpp"
#include "sextant/spec/json_io.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace spec = sextant::spec;
  namespace exec = sextant::exec;
  return sextant::fuzz::expect_clear_error(data, size, [](std::string_view text) {
    const spec::Json json = spec::parse_json_text(text, "manifest.json");
    try {
      (void)exec::to_json(exec::manifest_from_json(json, "manifest.json"));
    } catch (const sextant::InputError&) {
      // One input, both readers.
    }
    (void)exec::to_json(exec::shard_header_from_json(json, "rank-00000.bin"));
  });
}
