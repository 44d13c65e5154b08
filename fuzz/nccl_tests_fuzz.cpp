// nccl-tests output (all_reduce_perf and friends), with and without the collective given.
#include "fuzz_support.hpp"
#include "sextant/traces/readers.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace traces = sextant::traces;
  return sextant::fuzz::expect_clear_error(data, size, [](std::string_view text) {
    const std::string s(text);
    try {
      (void)traces::parse_nccl_tests(s, "fuzz.txt", std::nullopt);
    } catch (const sextant::InputError&) {
      // Without a collective named the text must say which; with one it must not matter.
    }
    (void)traces::parse_nccl_tests(s, "fuzz.txt", sextant::spec::CollectiveKind::kAllGather);
  });
}
