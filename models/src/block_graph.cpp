// A transformer block as a per-op graph, and the uniform layouts as its splits (block_graph.hpp).
#include "sextant/models/block_graph.hpp"

#include <fmt/format.h>

#include "sextant/spec/error.hpp"

namespace sextant::models {

namespace {

using Dims = std::vector<std::string>;

GraphNode node(std::string name, std::vector<Dims> operands, Dims output,
               std::vector<GraphOperand> inputs, std::string out,
               const std::map<std::string, int64_t>& extents, double flops = -1, Dims whole = {}) {
  GraphNode n;
  n.op.name = std::move(name);
  n.op.operands = std::move(operands);
  n.op.output = std::move(output);
  n.op.extents = extents;
  n.op.flops = flops;
  n.op.whole = std::move(whole);
  n.inputs = std::move(inputs);
  n.output = std::move(out);
  return n;
}

}  // namespace

OpGraph transformer_block_graph(const BlockDims& x) {
  const int64_t kv = x.kv_heads > 0 ? x.kv_heads : x.heads;
  const int64_t qkv_columns = (x.heads + 2 * kv) * x.head_dim;
  if (qkv_columns % x.heads != 0)
    throw InputError("per-op split", "/per_op/qkv", fmt::format("{} key/value heads", kv),
                     fmt::format("key/value heads whose columns ({}) share out over the {} heads",
                                 qkv_columns, x.heads));
  const std::map<std::string, int64_t> e = {{"b", x.batch},
                                            {"s", x.seq},
                                            {"h", x.hidden},
                                            {"a", x.heads},
                                            {"c", qkv_columns / x.heads},
                                            {"d", x.head_dim},
                                            {"g", x.gate},
                                            {"f", x.ffn}};
  const Dims bsh = {"b", "s", "h"}, bsf = {"b", "s", "f"}, bsgf = {"b", "s", "g", "f"};
  // Attention's scores and their product with the values: 2 b s^2 a d FLOPs each (Narayanan et
  // al. 2021, eq. 3, without the causal halving); it needs every position of each sequence.
  const double attention = 4.0 * static_cast<double>(x.batch * x.seq) *
                           static_cast<double>(x.seq * x.heads * x.head_dim);
  OpGraph g;
  g.input = "x";
  g.output = "y";
  auto act = [](const char* t) { return GraphOperand{t, false}; };
  const GraphOperand weight{"", true};
  g.nodes = {
      node("norm1", {bsh}, bsh, {act("x")}, "x1", e, 0, {"h"}),
      node("qkv", {bsh, {"h", "a", "c"}}, {"b", "s", "a", "c"}, {act("x1"), weight}, "qkv", e),
      node("attention", {{"b", "s", "a", "c"}}, {"b", "s", "a", "d"}, {act("qkv")}, "ctx", e,
           attention, {"s", "c", "d"}),
      node("proj", {{"b", "s", "a", "d"}, {"a", "d", "h"}}, bsh, {act("ctx"), weight}, "attn", e),
      node("residual1", {bsh, bsh}, bsh, {act("x"), act("attn")}, "r1", e, 0),
      node("norm2", {bsh}, bsh, {act("r1")}, "x2", e, 0, {"h"}),
      node("fc1", {bsh, {"h", "g", "f"}}, bsgf, {act("x2"), weight}, "fc1", e),
      node("activation", {bsgf}, bsf, {act("fc1")}, "act", e, 0, {"g"}),
      node("fc2", {bsf, {"f", "h"}}, bsh, {act("act"), weight}, "fc2", e),
      node("residual2", {bsh, bsh}, bsh, {act("r1"), act("fc2")}, "y", e, 0),
  };
  return g;
}

BlockSplit megatron_block_split(const BlockDims& x, const std::string& data_axis,
                                const std::string& tensor_axis, bool sequence_parallel) {
  BlockSplit out;
  auto with = [](OpSplit s, const std::string& dim, const std::string& axis) {
    if (!axis.empty()) s[dim].push_back(axis);
    return s;
  };
  const OpSplit data = with({}, "b", data_axis);
  const OpSplit stream = sequence_parallel ? with(data, "s", tensor_axis) : data;
  for (const char* n : {"norm1", "residual1", "norm2", "residual2"}) out.ops[n] = stream;
  for (const char* n : {"qkv", "attention", "proj"}) out.ops[n] = with(data, "a", tensor_axis);
  for (const char* n : {"fc1", "activation", "fc2"}) out.ops[n] = with(data, "f", tensor_axis);
  out.stream = layout_of({"b", "s", "h"}, {{"b", x.batch}, {"s", x.seq}, {"h", x.hidden}}, stream);
  return out;
}

std::string_view block_op_of(OpId id) {
  switch (id) {
    case OpId::kAttnNorm:
    case OpId::kAttnCast:
    case OpId::kAttnInputGradSum:
      return "norm1";
    case OpId::kAttnQkv:
    case OpId::kAttnQkvBiasGrad:
      return "qkv";
    case OpId::kAttnRope:
    case OpId::kAttnRepeatKv:
    case OpId::kAttnCorePrep:
    case OpId::kAttnLayoutCopy:
    case OpId::kAttnScores:
    case OpId::kAttnSoftmax:
    case OpId::kAttnDropout:
    case OpId::kAttnContext:
    case OpId::kAttnCore:
      return "attention";
    case OpId::kAttnFp8Cast:
    case OpId::kAttnProj:
    case OpId::kAttnProjBiasGrad:
      return "proj";
    case OpId::kAttnResidual:
      return "residual1";
    case OpId::kMlpNorm:
    case OpId::kMlpCast:
    case OpId::kMlpInputGradSum:
      return "norm2";
    case OpId::kMlpFc1:
    case OpId::kMlpFc1BiasGrad:
      return "fc1";
    case OpId::kMlpAct:
      return "activation";
    case OpId::kMlpFp8Cast:
    case OpId::kMlpFc2:
    case OpId::kMlpFc2BiasGrad:
      return "fc2";
    case OpId::kMlpResidual:
      return "residual2";
    default:
      return "";
  }
}

}  // namespace sextant::models
