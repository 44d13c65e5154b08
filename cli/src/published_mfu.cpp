// The table of best published MFUs (published_mfu.hpp), each with its source.
#include "published_mfu.hpp"

#include <fmt/format.h>

#include <array>
#include <string_view>

#include "sextant/sim/step_setup.hpp"

namespace sextant::cli {

namespace {

struct Entry {
  std::string_view gpu;  // a substring of the cluster file's device name
  bool fp8;              // GEMMs in fp8 (else 16-bit)
  double mfu;
  std::string_view source;
};

// H200: the H100's GH100 die and 700 W limit; no training MFU of its own is published here.
constexpr std::array<Entry, 6> kTable{{
    // Korthikanti et al. 2022 Table 5: 1T GPT on 512 A100s, SP + selective (published.md T5).
    {"A100", false, 0.563, "Korthikanti et al. 2022, 1T on 512 A100s"},
    // Megatron-LM README: "up to 47% MFU on H100 clusters"; the Llama 3 paper reports 38-43%
    // in BF16 on 8-16k H100s.
    {"H100", false, 0.47, "Megatron-LM README"},
    {"H200", false, 0.47, "Megatron-LM README, H100"},
    // NeMo 24.07: GPT-3 175B on 512 H100s in FP8, 842 model TFLOP/s (published.md T9).
    {"H100", true, 842.0 / 989.4, "NeMo 24.07, GPT-3 175B FP8"},
    {"H200", true, 842.0 / 989.4, "NeMo 24.07, GPT-3 175B FP8 on H100"},
    // Megatron-LM 2020 README: 1.2B GPT on one V100 at 71.9 TFLOP/s (published.md T6).
    {"V100", false, 71.9 / 125.0, "Megatron-LM 2020 README"},
}};

}  // namespace

std::optional<PublishedMfu> best_published_mfu(const std::string& device_name,
                                               spec::Dtype gemm_dtype) {
  const bool fp8 = gemm_dtype == spec::Dtype::kFp8;
  if (!fp8 && gemm_dtype != spec::Dtype::kBf16 && gemm_dtype != spec::Dtype::kFp16)
    return std::nullopt;
  for (const Entry& e : kTable) {
    if (e.fp8 == fp8 && device_name.find(e.gpu) != std::string::npos)
      return PublishedMfu{e.mfu, std::string(e.source)};
  }
  return std::nullopt;
}

std::optional<PublishedMfu> best_published_mfu(const spec::ClusterSpec& cluster,
                                               const spec::Plan& plan, const spec::Stack& stack) {
  return best_published_mfu(cluster.device.name,
                            sim::step_precision(cluster, plan, stack).gemm_dtype);
}

std::string mfu_plausibility_line(double mfu, const std::optional<PublishedMfu>& reference) {
  if (!reference) return "";
  if (mfu > reference->mfu) {
    return fmt::format(
        "  plausibility     MFU above the best published for this GPU and precision, {:.1f}% "
        "({}):\n                   expect the run to be slower than predicted\n",
        100 * reference->mfu, reference->source);
  }
  return fmt::format(
      "  plausibility     best published MFU for this GPU and precision {:.1f}% ({})\n",
      100 * reference->mfu, reference->source);
}

}  // namespace sextant::cli
