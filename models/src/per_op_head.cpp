// A decoder's output layer under per-op splits (per_op_head.hpp).
#include "sextant/models/per_op_head.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "sextant/spec/error.hpp"
#include "sextant/spec/model_spec.hpp"
#include "sextant/spec/plan.hpp"

namespace sextant::models {

ShardedOp PerOpHead::sharded(const OpSplit& s) const {
  return shard_op(mesh, node().op, s);
}

GraphWalk PerOpHead::walk(const OpSplit& s, int64_t element_bytes) const {
  return walk_graph(mesh, graph, {{node().op.name, s}}, stream, sharded(s).output, element_bytes);
}

std::vector<std::string> PerOpHead::vocab_axes(const OpSplit& s) const {
  std::vector<std::string> out;
  if (const auto it = s.find("V"); it != s.end())
    for (const std::string& a : it->second)
      if (mesh.size(a) > 1) out.push_back(a);
  return out;
}

bool PerOpHead::rows_whole_over_replicas(const OpSplit& s) const {
  for (const char* d : {"b", "s"})
    if (const auto it = s.find(d); it != s.end())
      if (std::find(it->second.begin(), it->second.end(), spec::kDataAxis) != it->second.end())
        return false;
  return true;
}

PerOpHead per_op_head(int64_t micro_batch, int64_t seq, int64_t hidden, int64_t vocab, int64_t dp,
                      int64_t tp, bool sequence_parallel, bool tied, const spec::OpSplits& per_op) {
  PerOpHead h;
  h.mesh = {{{spec::kDataAxis, dp}, {spec::kTensorAxis, tp}}};
  const std::map<std::string, int64_t> extents{
      {"b", micro_batch * dp}, {"s", seq}, {"h", hidden}, {"V", vocab}};
  GraphNode n;
  n.op.name = kLogitsOp;
  n.op.operands = {{"b", "s", "h"}, {"h", "V"}};
  n.op.output = {"b", "s", "V"};
  n.op.extents = extents;
  n.op.whole = {"h"};  // the cross-entropy needs the summed logits
  n.inputs = {{"head_input", false}, {"", true}};
  n.output = "logits";
  h.graph.input = "head_input";
  h.graph.output = "logits";
  h.graph.nodes.push_back(n);
  h.uniform = {{"b", {spec::kDataAxis}}};
  if (tp > 1) h.uniform["V"] = {spec::kTensorAxis};
  OpSplit stream = {{"b", {spec::kDataAxis}}};
  if (sequence_parallel && tp > 1) stream["s"] = {spec::kTensorAxis};
  h.stream = layout_of({"b", "s", "h"}, extents, stream);
  h.chosen = h.uniform;
  const auto it = per_op.find(kLogitsOp);
  if (it == per_op.end()) return h;
  h.chosen = {it->second.begin(), it->second.end()};
  const std::string text = spec::op_splits_text({{kLogitsOp, it->second}}).substr(1);
  const std::string at = fmt::format("/per_op/{}", kLogitsOp);
  if (const auto c = h.chosen.find("h"); c != h.chosen.end() && !c->second.empty())
    throw InputError("plan", at, text,
                     "a split of the logits' batch, sequence or vocabulary: not of the hidden size "
                     "they contract (the cross-entropy needs whole logits)");
  if (tied && h.changed())
    throw InputError("plan", at, text,
                     "the uniform split under tied embeddings (the output weights are the "
                     "embedding's table)");
  h.sharded(h.chosen);  // a split the op takes: each axis once, every extent divided
  return h;
}

PerOpHead per_op_head(const spec::TransformerSpec& model, const spec::Plan& plan,
                      int64_t padded_vocab) {
  return per_op_head(plan.micro_batch, plan.seq_len.value_or(model.seq_len), model.hidden,
                     padded_vocab, plan.dp, plan.tp, plan.sequence_parallel && plan.tp > 1,
                     model.tied_embeddings, plan.per_op);
}

}  // namespace sextant::models
