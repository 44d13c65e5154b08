// Stack files (stacks/*.json, `--stack FILE`).
#include "fuzz_support.hpp"
#include "sextant/spec/json_io.hpp"
#include "sextant/spec/stack.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace spec = sextant::spec;
  return sextant::fuzz::expect_clear_error(data, size, [](std::string_view text) {
    const spec::Stack stack =
        spec::stack_from_json(spec::parse_json_text(text, "fuzz.json"), "fuzz.json");
    (void)spec::stack_label(stack);
    (void)spec::stack_file_json(stack);
  });
}
