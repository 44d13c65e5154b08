// A dense block under a plan's per-op splits (per_op_block.hpp).
#include "sextant/models/per_op_block.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "sextant/models/per_op_head.hpp"
#include "sextant/spec/error.hpp"
#include "sextant/spec/model_spec.hpp"
#include "sextant/spec/plan.hpp"

namespace sextant::models {

namespace {

bool is_norm(std::string_view op) {
  return op == "norm1" || op == "norm2";
}

bool is_residual(std::string_view op) {
  return op == "residual1" || op == "residual2";
}

bool splits_over(const OpSplit& split, const std::string& dim, std::string_view axis) {
  const auto it = split.find(dim);
  return it != split.end() &&
         std::find(it->second.begin(), it->second.end(), axis) != it->second.end();
}

}  // namespace

const GraphNode& PerOpBlock::node(std::string_view name) const {
  for (const GraphNode& n : graph.nodes)
    if (n.op.name == name) return n;
  throw InputError("plan", fmt::format("/per_op/{}", name), "",
                   "an op of a transformer block: norm1, qkv, attention, proj, residual1, norm2, "
                   "fc1, activation, fc2 or residual2");
}

ShardedOp PerOpBlock::sharded(const GraphNode& n, const BlockSplit& s) const {
  return shard_op(mesh, n.op, s.ops.at(n.op.name));
}

GraphWalk PerOpBlock::walk(const BlockSplit& s, int64_t element_bytes) const {
  return walk_graph(mesh, graph, s.ops, uniform.stream, uniform.stream, element_bytes);
}

bool PerOpBlock::has_params(const std::string& op) const {
  const GraphNode& n = node(op);
  return is_norm(op) || (bias && is_residual(op)) ||
         std::any_of(n.inputs.begin(), n.inputs.end(),
                     [](const GraphOperand& in) { return in.param; });
}

std::optional<spec::TensorLayout> PerOpBlock::bias_layout(const std::string& op,
                                                          const BlockSplit& s) const {
  if (!bias) return std::nullopt;
  std::vector<std::string> dims;
  if (op == "qkv") dims = {"a", "c"};
  if (op == "fc1") dims = {"g", "f"};
  if (is_residual(op)) dims = {"h"};
  if (dims.empty()) return std::nullopt;
  return layout_of(dims, node(op).op.extents, s.ops.at(op));
}

bool PerOpBlock::params_partial_over(const std::string& op, std::string_view axis,
                                     const BlockSplit& s) const {
  if (mesh.size(axis) == 1 || !has_params(op)) return false;
  const GraphNode& n = node(op);
  const OpSplit& split = s.ops.at(op);
  if (is_norm(op) || is_residual(op))
    return splits_over(split, "b", axis) || splits_over(split, "s", axis);
  for (size_t i = 0; i < n.inputs.size(); ++i)
    if (n.inputs[i].param &&
        shard_op(mesh, gradient_op(n.op, i, n.backward_factor), split).output.partial_over(axis))
      return true;
  return false;
}

int64_t PerOpBlock::partial_params(std::string_view axis, const BlockSplit& s) const {
  int64_t n = 0;
  for (const GraphNode& g : graph.nodes) {
    if (!params_partial_over(g.op.name, axis, s)) continue;
    if (is_norm(g.op.name)) n += norm_params;
    if (const auto b = bias_layout(g.op.name, s)) n += b->shard_elements(mesh);
    const ShardedOp sh = sharded(g, s);
    for (size_t i = 0; i < g.inputs.size(); ++i)
      if (g.inputs[i].param) n += sh.operands[i].shard_elements(mesh);
  }
  return n;
}

OpName reshard_op_name(const GraphStep& s) {
  const std::string_view scope = s.node == "x"   ? "block_input"
                                 : s.node == "y" ? "block_output"
                                                 : std::string_view(s.node);
  switch (s.reshard.kind) {
    case spec::ReshardKind::kReduceScatter:
      return OpName(scope, OpId::kUnitReshardReduceScatter);
    case spec::ReshardKind::kAllReduce:
      return OpName(scope, OpId::kUnitReshardAllReduce);
    case spec::ReshardKind::kAllToAll:
      return OpName(scope, OpId::kUnitReshardAllToAll);
    case spec::ReshardKind::kAllGather:
    case spec::ReshardKind::kSlice:
      break;
  }
  return OpName(scope, OpId::kUnitReshardAllGather);
}

PerOpBlock per_op_block(BlockDims dims, int64_t dp, int64_t tp, bool sequence_parallel,
                        bool layernorm, bool bias, const spec::OpSplits& per_op) {
  dims.batch *= dp;
  PerOpBlock b;
  b.mesh = {{{spec::kDataAxis, dp}, {spec::kTensorAxis, tp}}};
  b.graph = transformer_block_graph(dims);
  b.uniform = megatron_block_split(dims, spec::kDataAxis, spec::kTensorAxis, sequence_parallel);
  b.chosen = b.uniform;
  b.norm_params = (layernorm ? 2 : 1) * dims.hidden;
  b.bias = bias;
  for (const auto& [op, split] : per_op) {
    if (op == kLogitsOp) continue;  // the output layer's (per_op_head.hpp)
    b.node(op);                     // an op of the block
    b.chosen.ops[op] = split;
    if (split != b.uniform.ops.at(op)) b.changed.insert(op);
  }
  // Every replica's parameter gradients are summed (the data-parallel buckets): an op with
  // parameters must see only its replica's rows, or each replica would hold the whole gradient
  // and the sum would count it dp times.
  for (const std::string& op : b.changed) {
    if (dp > 1 && b.has_params(op) && !b.params_partial_over(op, spec::kDataAxis, b.chosen))
      throw InputError("plan", fmt::format("/per_op/{}", op),
                       spec::op_splits_text({{op, per_op.at(op)}}).substr(1),
                       "a split of the op's batch or sequence over \"d\": it has parameters, "
                       "whose gradients the replicas sum");
  }
  return b;
}

PerOpBlock per_op_block(const spec::TransformerSpec& m, const spec::Plan& plan) {
  const BlockDims dims{plan.micro_batch, plan.seq_len.value_or(m.seq_len),
                       m.hidden,         m.heads,
                       m.head_dim(),     m.ffn_hidden,
                       m.kv_heads,       m.activation == spec::Activation::kSwiglu ? 2 : 1};
  return per_op_block(dims, plan.dp, plan.tp, plan.sequence_parallel && plan.tp > 1,
                      m.norm == spec::Norm::kLayerNorm, m.bias, plan.per_op);
}

}  // namespace sextant::models
