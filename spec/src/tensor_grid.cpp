// The rules of 3D tensor parallelism.
#include "sextant/spec/tensor_grid.hpp"

#include <fmt/format.h>

#include <vector>

namespace sextant::spec {

std::string tensor_grid_problem(const Plan& plan) {
  const TensorGrid& g = plan.tp_grid;
  if (!g.any()) return "";
  if (g.x < 1 || g.y < 1 || g.z < 1) return "every axis of the grid must be >= 1";
  if (g.ranks() != plan.tp)
    return fmt::format("x*y*z ({}) must equal tp ({}): the grid lays out the tp ranks", g.ranks(),
                       plan.tp);
  if (plan.sequence_parallel)
    return "runs without sequence parallelism (the grid's z axis splits the sequences instead)";
  if (plan.cp > 1) return "runs without context parallelism (cp 1)";
  if (plan.ep > 1) return "runs without expert parallelism (ep 1)";
  if (plan.zero == 3)
    return "runs with zero <= 2: the grid's z axis already shards each weight block as ZeRO-3 "
           "does";
  if (plan.offload.state()) return "runs without optimizer or parameter offload";
  return "";
}

std::string tensor_grid_model_problem(const ModelSpec& model, const TensorGrid& g,
                                      int64_t micro_batch) {
  if (!g.any()) return "";
  if (!model.is_transformer())
    return "splits a transformer's linear layers: use tp_grid only with transformers";
  const TransformerSpec& t = model.transformer();
  if (t.moe) return "runs dense transformers (a mixture of experts is not modelled on the grid)";
  std::vector<std::string> parts;
  if (t.heads % g.y != 0)
    parts.push_back(fmt::format("y ({}) must divide the {} heads", g.y, t.heads));
  if (t.kv_heads % g.y != 0)
    parts.push_back(fmt::format("y ({}) must divide the {} key/value heads", g.y, t.kv_heads));
  if (t.ffn_hidden % g.y != 0)
    parts.push_back(fmt::format("y ({}) must divide ffn_hidden ({})", g.y, t.ffn_hidden));
  if (t.hidden % g.x != 0)
    parts.push_back(fmt::format("x ({}) must divide hidden ({})", g.x, t.hidden));
  if (parts.empty()) {
    // Each rank holds a 1/z shard of its block of every weight (AxoNN shards the block's
    // elements over z): z divides the elements of the blocks of QKV, the projection, FC1, FC2.
    const int64_t gate = t.activation == Activation::kSwiglu ? 2 : 1;
    const int64_t qkv = t.hidden + 2 * t.kv_hidden();
    for (int64_t block :
         {t.hidden / g.x * (qkv / g.y), t.hidden / g.y * (t.hidden / g.x),
          t.hidden / g.x * (gate * t.ffn_hidden / g.y), t.ffn_hidden / g.y * (t.hidden / g.x)}) {
      if (block % g.z != 0) {
        parts.push_back(fmt::format(
            "z ({}) must divide the elements of each rank's weight block ({} is one)", g.z, block));
        break;
      }
    }
  }
  if (micro_batch % g.z != 0)
    parts.push_back(
        fmt::format("z ({}) must divide micro_batch ({}): each z slice takes whole sequences", g.z,
                    micro_batch));
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : "; ") + p;
  return out;
}

std::string tensor_grid_text(const TensorGrid& g) {
  return fmt::format("{}x{}x{}", g.x, g.y, g.z);
}

}  // namespace sextant::spec
