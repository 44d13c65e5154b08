#pragma once
// How a tensor-parallel run lays out the vocabulary: the one rule the lowering (what the simulator
// prices and the memory verdict counts) and the executor (what it allocates and computes) share.
#include <cstdint>

namespace sextant::models {

// Rows of the embedding table / output layer each tensor-parallel rank holds: the vocabulary
// padded to a multiple of multiple x tp, split evenly (Megatron-LM's _vocab_size_with_padding,
// megatron/training/tokenizer/tokenizer.py, with --make-vocab-size-divisible-by = multiple).
// multiple = 1 gives ceil(vocab / tp). The padding rows are never a target and carry no weight.
constexpr int64_t vocab_shard(int64_t vocab, int64_t tp, int64_t multiple) {
  const int64_t unit = multiple * tp;
  return (vocab + unit - 1) / unit * unit / tp;
}

// Real (not padding) rows of tensor-parallel rank `rank`'s shard: the ranks hold consecutive
// shards, so the padding sits at the end of the last ones.
constexpr int64_t vocab_rows_used(int64_t vocab, int64_t shard, int64_t rank) {
  const int64_t left = vocab - rank * shard;
  return left < 0 ? 0 : left > shard ? shard : left;
}

}  // namespace sextant::models
