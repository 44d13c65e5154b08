// A GPT's first lowered layer: the vocabulary-parallel token embedding (Megatron-LM: each tp rank
// looks up the tokens of its vocabulary shard, zeros elsewhere, and the partial rows are summed
// over tp, reduce-scattered under sequence parallelism) and the learned position embedding.
#pragma once

#include <tuple>
#include <vector>

#include "gpt_layer.hpp"

namespace sextant::exec {

class GptEmbedding final : public GptLayer {
 public:
  GptEmbedding(const GptParts& parts, ParamStore& store);
  // Reads mb.tokens; `x` is unused.
  Tensor forward(const MicroBatch& mb, const Tensor& x) override;
  // Returns an empty tensor: nothing comes before the embedding.
  Tensor backward(const MicroBatch& mb, const Tensor& dy) override;
  // The rank's shard of the token table (the output layer's weight when they are tied).
  Param* table() const { return table_; }

 private:
  // The first of this rank's rows it holds in sequence-parallel regions (norms, residuals).
  int64_t slice_begin() const;
  // The rank's rows as runs of consecutive positions: (first row, first position, rows).
  std::vector<std::tuple<int64_t, int64_t, int64_t>> position_runs() const;

  Param* table_ = nullptr;
  Param* position_table_ = nullptr;  // learned positions only
};

}  // namespace sextant::exec
