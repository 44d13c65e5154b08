#include "sextant/spec/limits.hpp"

#include <fmt/format.h>

#include <fstream>

#include "sextant/spec/model_spec.hpp"

namespace sextant::spec {

int64_t meminfo_bytes(std::string_view field) {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  int64_t kib = 0;
  while (in >> key >> kib >> unit)
    if (key.size() == field.size() + 1 && key.compare(0, field.size(), field) == 0)
      return kib * 1024;
  return 0;
}

int64_t available_memory_bytes() {
  return meminfo_bytes("MemAvailable");
}

std::vector<std::tuple<std::string, int64_t, std::string>> transformer_limit_problems(
    const TransformerSpec& t) {
  std::vector<std::tuple<std::string, int64_t, std::string>> out;
  auto at_most = [&](const char* field, int64_t value, int64_t limit, const char* power) {
    if (value > limit)
      out.emplace_back(field, value, fmt::format("must be <= {} ({})", limit, power));
  };
  at_most("layers", t.layers, kMaxLayers, "2^14");
  at_most("hidden", t.hidden, kMaxWidth, "2^20");
  at_most("heads", t.heads, kMaxWidth, "2^20");
  at_most("ffn_hidden", t.ffn_hidden, kMaxWidth, "2^20");
  at_most("vocab", t.vocab, kMaxVocab, "2^24");
  at_most("seq_len", t.seq_len, kMaxSeqLen, "2^24");
  at_most("max_positions", t.max_positions, kMaxSeqLen, "2^24");
  if (t.moe) {
    at_most("moe/experts", t.moe->experts, int64_t{1} << 16, "2^16");
    at_most("moe/expert_ffn_hidden", t.moe->expert_ffn_hidden, kMaxWidth, "2^20");
    at_most("moe/shared_experts", t.moe->shared_experts, int64_t{1} << 16, "2^16");
  }
  return out;
}

std::string micro_batch_count_problem(int64_t micro_batches) {
  if (micro_batches <= kMaxMicroBatches) return "";
  return fmt::format(
      "gives {} micro-batches per replica per step; at most {} (a larger "
      "micro_batch or more data parallelism)",
      micro_batches, kMaxMicroBatches);
}

}  // namespace sextant::spec
