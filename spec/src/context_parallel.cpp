// The rules of context parallelism.
#include "sextant/spec/context_parallel.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace sextant::spec {

std::string context_parallel_problem(const ModelSpec& model, int64_t seq_len, const Plan& plan) {
  const int64_t cp = plan.cp;
  if (cp <= 1) return "";
  if (!model.is_transformer())
    return "splits a transformer's sequences: use cp = 1 for MLPs and CNNs (a CNN's samples split "
           "with spatial)";
  if (seq_len % (2 * cp) != 0)
    return fmt::format(
        "needs 2*cp ({}) to divide the sequence length ({}): each rank holds two of 2*cp equal "
        "chunks (Megatron-LM's load balance under the causal mask)",
        2 * cp, seq_len);
  if (plan.sequence_parallel && plan.tp > 1 && (seq_len / cp) % plan.tp != 0)
    return fmt::format(
        "leaves {} tokens per rank, which sequence parallelism cannot split over tp {}",
        seq_len / cp, plan.tp);
  if (plan.cp_algorithm == ContextAlgorithm::kAllToAll) {
    const TransformerSpec& t = model.transformer();
    const int64_t tp = plan.tp > 0 ? plan.tp : 1;
    if (t.heads % tp == 0 && t.kv_heads % tp == 0 &&
        ((t.heads / tp) % cp != 0 || (t.kv_heads / tp) % cp != 0))
      return fmt::format(
          "must divide each tp rank's {} attention heads and {} key/value heads under "
          "cp_algorithm \"all-to-all\" (DeepSpeed-Ulysses gives each rank whole heads): use "
          "\"ring\" or \"all-gather\"",
          t.heads / tp, t.kv_heads / tp);
  }
  return "";
}

std::string context_attention_problem(int64_t cp, ContextAlgorithm algorithm,
                                      AttentionKernel attention) {
  if (cp <= 1 || algorithm != ContextAlgorithm::kRing || is_fused_attention(attention)) return "";
  return "ring attention runs blockwise flash attention (Transformer Engine): use a stack with a "
         "fused attention kernel, or cp_algorithm \"all-gather\"";
}

std::vector<int32_t> context_positions(int64_t seq_len, int64_t cp, int64_t rank) {
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(seq_len / std::max<int64_t>(cp, 1)));
  if (cp <= 1) {
    for (int64_t p = 0; p < seq_len; ++p) out.push_back(static_cast<int32_t>(p));
    return out;
  }
  const int64_t chunk = seq_len / (2 * cp);
  for (int64_t c : {rank, 2 * cp - 1 - rank})
    for (int64_t i = 0; i < chunk; ++i) out.push_back(static_cast<int32_t>(c * chunk + i));
  return out;
}

}  // namespace sextant::spec
