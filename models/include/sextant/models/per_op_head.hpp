// A decoder's output layer under a plan's per-op splits (issue 60): the logits op
// [b, s, h] x [h, V] -> [b, s, V], named "logits" in a plan's per_op, on the plan's mesh of dp
// replicas ("d") by tp ranks ("t"). Its input arrives in the residual stream's layout (after the
// final norm, which keeps it); the cross-entropy runs where the logits are, vocabulary-parallel
// over the axes splitting V (Megatron-LM tensor_parallel/cross_entropy.py: each token's max, then
// its sums of exponentials and target logit, all-reduced over them). Splitting V over the replicas
// is FlexFlow's parameter dimension for a large softmax (Jia et al., SysML'19, §8: the RNN language
// model's and NMT's softmax): each replica holds a block of the output weights and computes the
// logits of every replica's tokens for it, which no replica's gradient sum then has to carry.
// The lowering prices it; the executor runs it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sextant/models/op_graph.hpp"
#include "sextant/spec/per_op_plan.hpp"

namespace sextant::spec {
struct Plan;
struct TransformerSpec;
}  // namespace sextant::spec

namespace sextant::models {

// The op a plan's per_op names for the output layer.
inline constexpr const char* kLogitsOp = "logits";

struct PerOpHead {
  spec::DeviceMesh mesh;
  OpGraph graph;              // one node, the logits op
  OpSplit uniform, chosen;    // Megatron-LM's (b over d, V over t) and the plan's
  spec::TensorLayout stream;  // the input's layout (and its gradient's): b over d (s over t: SP)

  bool changed() const { return chosen != uniform; }
  const GraphNode& node() const { return graph.nodes.front(); }
  ShardedOp sharded(const OpSplit& s) const;
  // The walk under `s`: the input moved from the stream's layout, the logits left where they are
  // made, the input's gradient moved back.
  GraphWalk walk(const OpSplit& s, int64_t element_bytes) const;
  // The mesh axes splitting V under `s`, major first: the cross-entropy's all-reduces run over
  // them.
  std::vector<std::string> vocab_axes(const OpSplit& s) const;
  // Whether the tokens are whole on every replica under `s`: each then computes the whole
  // gradient of its weight block, which no replica sums (Layer::replica_whole_params).
  bool rows_whole_over_replicas(const OpSplit& s) const;
};

// The output layer of `micro_batch` sequences of `seq` tokens a replica, hidden size `hidden`,
// `vocab` rows (padded as the lowering pads them), on dp x tp ranks, with or without sequence
// parallelism, and `per_op`'s split of the logits (other ops' splits are the blocks'). Throws
// InputError for a split the output layer cannot take: of the hidden size it contracts, or any
// change under tied embeddings (the table is the embedding's too).
PerOpHead per_op_head(int64_t micro_batch, int64_t seq, int64_t hidden, int64_t vocab, int64_t dp,
                      int64_t tp, bool sequence_parallel, bool tied, const spec::OpSplits& per_op);
// The same for a plan's decoder, its vocabulary padded to `padded_vocab` rows.
PerOpHead per_op_head(const spec::TransformerSpec& model, const spec::Plan& plan,
                      int64_t padded_vocab);

}  // namespace sextant::models
