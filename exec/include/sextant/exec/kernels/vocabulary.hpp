// A backend's vocabulary-parallel kernels: the embedding, learned positions and the loss over a
// vocabulary shard (backend.hpp).
#pragma once

#include <cstdint>
#include <vector>

#include "sextant/exec/tensor.hpp"

namespace sextant::exec {

class VocabularyKernels {
 public:
  virtual ~VocabularyKernels() = default;

  // Rows of `table` ([vocab_shard, hidden]) for token ids in [vocab_begin, vocab_begin + shard);
  // other tokens give zero rows (vocabulary-parallel embedding).
  virtual void embedding(const std::vector<int32_t>& tokens, const Tensor& table,
                         int64_t vocab_begin, Tensor& y) = 0;
  virtual void embedding_backward(const std::vector<int32_t>& tokens, const Tensor& dy,
                                  int64_t vocab_begin, Tensor& dtable) = 0;
  // Position embedding on rows [row_begin, row_begin + rows) of a [batch*seq, hidden] activation:
  // y[i] += pos[(row_begin + i) % seq].
  virtual void add_positions(const Tensor& pos, int64_t row_begin, int64_t seq, Tensor& y) = 0;
  virtual void add_positions_backward(const Tensor& dy, int64_t row_begin, int64_t seq,
                                      Tensor& dpos) = 0;
  // The local part of a (vocabulary-parallel) softmax cross-entropy, in one pass over logits
  // [rows, v]: per row the max, the sum of exp(x - max) and the logit of the row's target if it
  // falls in [vocab_begin, vocab_begin + valid) (else 0). Columns from `valid` on are padding
  // (the vocabulary padded so that the logits GEMM runs on aligned shapes): left out.
  virtual void softmax_stats(const Tensor& logits, const std::vector<int32_t>& targets,
                             int64_t vocab_begin, int64_t valid, std::vector<float>& max,
                             std::vector<float>& sum, std::vector<float>& target) = 0;
  // dlogits = (softmax(logits) - onehot(target)) * scale, with the global max and sum; 0 in the
  // padding columns from `valid` on.
  virtual void cross_entropy_backward(const Tensor& logits, const std::vector<int32_t>& targets,
                                      int64_t vocab_begin, int64_t valid,
                                      const std::vector<float>& max, const std::vector<float>& sum,
                                      float scale, Tensor& dlogits) = 0;
};

}  // namespace sextant::exec
