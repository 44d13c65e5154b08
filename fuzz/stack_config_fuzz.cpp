// The stacks' own configs (`sextant import`): the first byte picks the format (Megatron
// arguments, NeMo overrides, TorchTitan TOML, DeepSpeed JSON), the rest is the config, read as
// Llama 3 8B on 8 devices.
#include "fuzz_support.hpp"
#include "sextant/interop/import.hpp"
#include "sextant/models/zoo.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace interop = sextant::interop;
  if (size == 0) return 0;
  static const sextant::spec::ModelSpec model = sextant::models::zoo_model("llama3-8b");
  const auto target = interop::target_names()[data[0] % interop::target_names().size()].second;
  return sextant::fuzz::expect_clear_error(data + 1, size - 1, [&](std::string_view text) {
    (void)interop::import_plan(target, std::string(text), "fuzz", model, 8);
  });
}
