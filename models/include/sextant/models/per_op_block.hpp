// A dense transformer block under a plan's per-op splits (spec/per_op_plan.hpp): the block graph
// (block_graph.hpp) on the plan's mesh of dp replicas ("d") by tp ranks ("t"), the splits the
// uniform layout gives each op and those the plan chooses. The lowering prices the chosen splits
// (per_op_lowering.cpp) and the executor runs them (exec/src/per_op/split_block.cpp), both from
// this.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "sextant/models/block_graph.hpp"
#include "sextant/models/op_graph.hpp"
#include "sextant/models/op_id.hpp"
#include "sextant/spec/per_op_plan.hpp"

namespace sextant::spec {
struct Plan;
struct TransformerSpec;
}  // namespace sextant::spec

namespace sextant::models {

struct PerOpBlock {
  spec::DeviceMesh mesh;
  OpGraph graph;
  BlockSplit uniform;             // Megatron-LM's split over t (and sequence parallelism's)
  BlockSplit chosen;              // the uniform one with the plan's ops replaced
  std::set<std::string> changed;  // the ops whose chosen split differs from the uniform one
  int64_t norm_params = 0;        // one norm's parameters: its gain (and LayerNorm's bias) over h
  bool bias = false;              // the linears have biases (GPT-2's)

  bool any_change() const { return !changed.empty(); }
  // The node named `name`; throws InputError naming the plan's field for an unknown op.
  const GraphNode& node(std::string_view name) const;
  ShardedOp sharded(const GraphNode& n, const BlockSplit& s) const;
  GraphWalk walk(const BlockSplit& s, int64_t element_bytes) const;
  // Whether op `op` has parameters: a linear's weight, a norm's gain (and bias), and with biases
  // QKV's and FC1's, and the residuals' (the projection's and FC2's bias, added after their
  // partial outputs are summed, as Megatron-LM adds them).
  bool has_params(const std::string& op) const;
  // The layout of op `op`'s bias under `s` (nullopt: none): over QKV's and FC1's output columns,
  // over h for a residual.
  std::optional<spec::TensorLayout> bias_layout(const std::string& op, const BlockSplit& s) const;
  // Whether the gradients of op `op`'s parameters are partial sums over `axis` under `s`: the
  // rows it reads (batch or sequence) are split over the axis and the parameter is not, as the
  // walk's gradient sums say.
  bool params_partial_over(const std::string& op, std::string_view axis, const BlockSplit& s) const;
  // One rank's elements of the block's parameters whose gradients are partial over `axis`.
  int64_t partial_params(std::string_view axis, const BlockSplit& s) const;
};

// A reshard step's op, as the trace names it: "<op>.reshard_<collective>", the op being the one
// whose operand (backward: whose output's gradient) moves, "block_input" or "block_output".
OpName reshard_op_name(const GraphStep& s);

// The block of `dims` (batch: one replica's micro-batch) on dp x tp ranks, with or without
// sequence parallelism, and `per_op` over it. Throws InputError for an op the graph lacks.
PerOpBlock per_op_block(BlockDims dims, int64_t dp, int64_t tp, bool sequence_parallel,
                        bool layernorm, bool bias, const spec::OpSplits& per_op);
// The same for a plan's transformer.
PerOpBlock per_op_block(const spec::TransformerSpec& model, const spec::Plan& plan);

}  // namespace sextant::models
