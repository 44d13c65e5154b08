// A GPT's last lowered layer: the final norm, the logits of the rank's vocabulary shard and
// Megatron-LM's vocabulary-parallel cross-entropy (each shard's max and sum of exponentials,
// rescaled to the global max and summed over tp with the target logits, so no rank holds the
// whole vocabulary's logits).
#pragma once

#include <map>
#include <vector>

#include "gpt_layer.hpp"

namespace sextant::exec {

class GptHead final : public GptLayer {
 public:
  // `layer`: the model's last lowered layer. `local_table`: this rank's token table when the
  // embeddings are tied and the embedding is on this rank, else null.
  GptHead(const GptParts& parts, ParamStore& store, int32_t layer, Param* local_table);
  // Adds the micro-batch's per-token losses to the loss sum; returns an empty tensor.
  Tensor forward(const MicroBatch& mb, const Tensor& x) override;
  // Starts from the loss (`dy` is unused).
  Tensor backward(const MicroBatch& mb, const Tensor& dy) override;
  double take_loss_sum();

 private:
  struct Cache {
    Tensor x, ln, mean, rstd, xg, logits;
    std::vector<float> max, sum;
  };

  int32_t layer_;
  Param* gamma_ = nullptr;
  Param* beta_ = nullptr;  // LayerNorm only
  Param* weight_ = nullptr;
  std::map<int64_t, Cache> caches_;  // by micro-batch
  double loss_sum_ = 0;
};

}  // namespace sextant::exec
