// Cluster files (clusters/*.json, `--cluster FILE`), including what `sextant calibrate` writes
// into them (calibrated efficiencies, collective fits by size range, GEMM models).
#include "fuzz_support.hpp"
#include "sextant/spec/cluster_spec.hpp"
#include "sextant/spec/json_io.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace spec = sextant::spec;
  return sextant::fuzz::expect_clear_error(data, size, [](std::string_view text) {
    const spec::ClusterSpec cluster =
        spec::cluster_from_json(spec::parse_json_text(text, "fuzz.json"), "fuzz.json");
    (void)spec::to_json(cluster);
  });
}
