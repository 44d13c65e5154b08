// A GPT stage's parameters on one rank: their names (the same in every layout), local shapes and
// initial values. Each value is drawn from the seed and the element's index in the global,
// unsplit tensor (parameters.hpp), so that every layout (tp, a 3D tensor grid, pipeline stages,
// expert parallelism) starts from the same model as the single rank.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "per_op/mesh_tensor.hpp"
#include "sextant/exec/parameters.hpp"
#include "sextant/models/per_op_block.hpp"
#include "sextant/models/per_op_head.hpp"
#include "sextant/spec/model_spec.hpp"

namespace sextant::exec {

// GPT-2's initialisation: weights N(0, 0.02), the residual projections scaled by
// 1/sqrt(2 * layers).
inline constexpr float kInitStd = 0.02f;

// How one rank splits the model.
struct GptSplit {
  // The ranks splitting the vocabulary (the layer group), and this rank's place among them; in
  // Megatron-LM's 1D layout they split the heads and the ffn too.
  int64_t t = 1, r = 0;
  // Sequence parallelism: the tp ranks hold different rows, so what they hold alike (norms,
  // biases summed after the split, positions, a router) has partial gradients (Param::tp_partial).
  bool sequence_parallel = false;
  int64_t vocab_local = 0;  // rows of the vocabulary shard (padding included)
  // A 3D tensor grid's extents and this rank's coordinates (grid_linear.hpp); x = y = z = 1
  // without one.
  int64_t x = 1, y = 1, z = 1, gx = 0, gy = 0, gz = 0;
  bool grid = false;
  // A mixture of experts: the routed experts this rank holds, and whether expert parallelism
  // splits them (Param::expert).
  int64_t first_expert = 0, local_experts = 0;
  bool experts_split = false;
  // Per-op splits that change the blocks (models::PerOpBlock::any_change), and this rank's place
  // on their mesh: each weight is the block its op's split gives the rank.
  const models::PerOpBlock* per_op = nullptr;
  const MeshRanks* mesh = nullptr;
  // A per-op split of the logits that changes the output layer (models::PerOpHead::changed), on
  // the same mesh: the output weights are the rank's block of vocabulary rows.
  const models::PerOpHead* head = nullptr;
};

struct GptParams {
  std::vector<ParamSpec> specs;  // in forward order
  // On a grid, the biases the ranks along x hold alike (split over y: QKV's, FC1's), and those
  // along y (the projection's, FC2's): each counted once in the gradient norm.
  std::set<std::string> alike_over_x, alike_over_y;
};

// Whether lowered layer `layer` is a block with a mixture-of-experts MLP (the first
// dense_layers blocks keep the dense one); `head_layer` is the model's last lowered layer.
bool gpt_moe_layer(const spec::TransformerSpec& m, int32_t layer, int32_t head_layer);

// The parameters of lowered `layers` (this rank's, in forward order: 0 the embedding,
// `head_layer` the final norm and output layer, the blocks between). `has_embedding`: the rank
// holds layer 0 (a last stage without it holds its own copy of a tied table).
GptParams gpt_params(const spec::TransformerSpec& m, const GptSplit& split,
                     const std::vector<int32_t>& layers, int32_t head_layer, bool has_embedding,
                     uint64_t seed);

}  // namespace sextant::exec
