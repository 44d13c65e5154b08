// Model files (sextant.model/1) and Hugging Face config.json, as `--model FILE` reads them, then
// the parameter count and FLOPs every command derives from a model first.
#include "fuzz_support.hpp"
#include "sextant/models/counts.hpp"
#include "sextant/models/zoo.hpp"
#include "sextant/spec/json_io.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return sextant::fuzz::expect_clear_error(data, size, [](std::string_view text) {
    const sextant::spec::ModelSpec model = sextant::models::model_from_document(
        sextant::spec::parse_json_text(text, "fuzz.json"), "fuzz.json", "fuzz");
    (void)sextant::models::parameter_count(model);
  });
}
