// A GPT's last lowered layer: the final norm, the logits of the rank's vocabulary shard and
// Megatron-LM's vocabulary-parallel cross-entropy (each shard's max and sum of exponentials,
// rescaled to the global max and summed over tp with the target logits, so no rank holds the
// whole vocabulary's logits). Under a per-op split of the logits (models/per_op_head.hpp) the
// norm's output moves to the logits' layout by the walk's reshards, the logits are the rank's
// block of tokens and vocabulary rows, the cross-entropy is vocabulary-parallel over each axis
// splitting the vocabulary in turn, and the input's gradient moves back.
#pragma once

#include <map>
#include <vector>

#include "gpt_layer.hpp"
#include "per_op/mesh_tensor.hpp"
#include "sextant/models/per_op_head.hpp"

namespace sextant::exec {

class GptHead final : public GptLayer {
 public:
  // `layer`: the model's last lowered layer. `local_table`: this rank's token table when the
  // embeddings are tied and the embedding is on this rank, else null.
  GptHead(const GptParts& parts, ParamStore& store, int32_t layer, Param* local_table);
  // Under a per-op split of the logits that changes them, on `ranks`' mesh.
  GptHead(const GptParts& parts, ParamStore& store, int32_t layer, const models::PerOpHead& split,
          const MeshRanks& ranks);
  // Adds the micro-batch's per-token losses to the loss sum; returns an empty tensor.
  Tensor forward(const MicroBatch& mb, const Tensor& x) override;
  // Starts from the loss (`dy` is unused).
  Tensor backward(const MicroBatch& mb, const Tensor& dy) override;
  double take_loss_sum();

 private:
  struct Cache {
    Tensor x, ln, mean, rstd, xg, logits;
    std::vector<float> max, sum;
    std::vector<int32_t> targets;  // per-op: the targets of the rank's block of tokens
  };
  // A fresh cache for the micro-batch, holding the final norm of `x`.
  Cache& normed(const MicroBatch& mb, const Tensor& x);
  Tensor forward_split(const MicroBatch& mb, const Tensor& x);
  Tensor backward_split(const MicroBatch& mb);
  // The targets of the logits' block of tokens, from every replica's (MicroBatch::
  // replica_targets).
  std::vector<int32_t> block_targets(const MicroBatch& mb) const;
  // The walk's reshard steps of `phase` whose op is `node`, run on `x` in order.
  MeshTensor reshards(const std::string& node, spec::Phase phase, MeshTensor x, int64_t mb);
  // Megatron-LM's vocabulary-parallel reduction over `comm` (`size` ranks, traced on `stream`):
  // each token's max, then its rescaled sums of exponentials and its target logit.
  void vocab_parallel_sums(Communicator& comm, spec::Stream stream, int64_t size, Cache& c,
                           std::vector<float>& target, int64_t mb);
  // Whether this rank counts its tokens' losses: first along every axis that does not split them.
  bool counts_loss() const;

  int32_t layer_;
  Param* gamma_ = nullptr;
  Param* beta_ = nullptr;  // LayerNorm only
  Param* weight_ = nullptr;
  std::map<int64_t, Cache> caches_;  // by micro-batch
  double loss_sum_ = 0;
  const models::PerOpHead* split_ = nullptr;  // per-op: the split, its mesh and its walk
  const MeshRanks* ranks_ = nullptr;
  models::GraphWalk walk_;
};

}  // namespace sextant::exec
