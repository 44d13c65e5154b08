// A CNN's classifier as a per-op graph, and a plan's splits of it applied to the lowering
// (cnn_fc_graph.hpp).
#include "sextant/models/cnn_fc_graph.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "lowering_ops.hpp"
#include "sextant/models/per_op_block.hpp"
#include "sextant/spec/error.hpp"

namespace sextant::models {

namespace {

using spec::Phase;

// Whether `op` is a fully connected layer's product: a CNN's fc, or an MLP layer's linear.
bool is_fc_product(const Layer& layer, const Op& op) {
  return op.id == OpId::kUnitFc ||
         (layer.kind == LayerKind::kMlpLinear && op.id == OpId::kUnitProduct);
}

// The fc GEMM of a lowered layer's pass (nullptr: none).
Op* fc_gemm(const Layer& layer, std::vector<Op>& ops) {
  for (Op& op : ops)
    if (is_fc_product(layer, op)) return &op;
  return nullptr;
}

// Whether the layer rectifies (or otherwise activates) its output: a CNN's ReLU, an MLP's act.
bool activates(const Layer& layer) {
  return std::any_of(layer.forward.begin(), layer.forward.end(), [](const Op& op) {
    return op.id == OpId::kUnitRelu || op.id == OpId::kUnitAct;
  });
}

std::string dim(size_t k) {
  return fmt::format("f{}", k);
}

int64_t local(const spec::DeviceMesh& mesh, const spec::TensorLayout& l, const std::string& d) {
  return spec::local_extent(mesh, *l.dim(d));
}

class FcSplitter {
 public:
  FcSplitter(LoweredModel& lowered, const FcChain& chain, const LoweringOptions& o)
      : lowered_(lowered),
        c_(chain),
        chosen_(fc_chain_splits(lowered, chain, o.per_op)),
        e_(spec::dtype_bytes(o.dtype)) {
    for (const auto& [op, split] : chosen_)
      if (split != c_.uniform.at(op)) changed_.insert(op);
  }

  void apply() {
    if (changed_.empty()) return;
    const GraphWalk walk = walk_graph(c_.mesh, c_.graph, chosen_, c_.features, c_.logits, e_);
    for (size_t k = 0; k < c_.graph.nodes.size(); ++k)
      if (changed_.contains(c_.graph.nodes[k].op.name)) reshape(k);
    insert_reshards(walk);
  }

 private:
  // A changed layer's GEMM on its blocks, its parameters and kept input.
  void reshape(size_t k) {
    const GraphNode& n = c_.graph.nodes[k];
    Layer& layer = lowered_.layers[c_.layers[k]];
    const ShardedOp now = shard_op(c_.mesh, n.op, chosen_.at(n.op.name));
    const ShardedOp was = shard_op(c_.mesh, n.op, c_.uniform.at(n.op.name));
    const std::string in = dim(k), out = dim(k + 1);
    const int64_t m = local(c_.mesh, now.output, "b"), cols = local(c_.mesh, now.output, out);
    const int64_t depth = local(c_.mesh, now.operands[0], in);
    Op* fwd = fc_gemm(layer, layer.forward);
    Op* bwd = fc_gemm(layer, layer.backward);
    SEXTANT_CHECK(fwd != nullptr && bwd != nullptr, "{}: no fc GEMM", layer.name);
    const double share = static_cast<double>(now.output.shard_elements(c_.mesh)) /
                         static_cast<double>(was.output.shard_elements(c_.mesh));
    for (std::vector<Op>* ops : {&layer.forward, &layer.backward})
      for (Op& op : *ops)
        if (!op.is_comm() && !is_fc_product(layer, op) && op.id != OpId::kLoss) scale(op, share);
    const Op fresh = gemm(OpName(layer.name, fwd->id), m, cols, depth, e_, TpSplit::kReplicated);
    *fwd = fresh;
    *bwd = gemm_backward(fresh);
    // The weight's block, and the bias over the rank's outputs (the lowering's count beyond the
    // whole weight).
    const int64_t whole_weight = was.operands[1].shard_elements(c_.mesh);
    const bool bias = layer.params > whole_weight;
    layer.params = now.operands[1].shard_elements(c_.mesh) + (bias ? cols : 0);
    // Rows gathered from every replica: the gradient is whole on each (its shard, or a copy).
    layer.replica_whole_params = fc_rows_whole(chosen_.at(n.op.name)) ? layer.params : 0;
    layer.matrices = {{depth, cols}};
    layer.saved_bytes +=
        (now.operands[0].shard_elements(c_.mesh) - was.operands[0].shard_elements(c_.mesh)) * e_;
  }

  static void scale(Op& op, double r) {
    op.flops *= r;
    op.kernel_flops *= r;
    op.bytes = static_cast<int64_t>(std::llround(static_cast<double>(op.bytes) * r));
  }

  // The walk's collectives: an op's operand moves at the start of its layer's forward, the
  // logits' before the loss; an output gradient's moves at the start of its layer's backward, the
  // features' at the end of the first layer's.
  void insert_reshards(const GraphWalk& walk) {
    const std::vector<GraphNode>& nodes = c_.graph.nodes;
    std::map<std::pair<size_t, Phase>, std::vector<Op>> at_start;
    std::vector<Op> logits, features;
    for (const GraphStep& s : walk.steps) {
      if (s.kind != GraphStep::Kind::kReshard || s.reshard.kind == spec::ReshardKind::kSlice)
        continue;
      Op op = comm_op(reshard_op_name(s), s.reshard.collective(), s.reshard.bytes);
      op.group = s.reshard.axis == spec::kDataAxis ? CommGroup::kData : CommGroup::kLayer;
      op.split = TpSplit::kReplicated;
      if (s.node == c_.graph.output) {
        logits.push_back(op);
      } else if (s.node == c_.graph.input) {
        features.push_back(op);
      } else {
        const auto k = static_cast<size_t>(
            std::find_if(nodes.begin(), nodes.end(),
                         [&](const GraphNode& n) { return n.op.name == s.node; }) -
            nodes.begin());
        at_start[{k, s.phase}].push_back(op);
      }
    }
    for (const auto& [key, ops] : at_start) {
      Layer& layer = lowered_.layers[c_.layers[key.first]];
      std::vector<Op>& pass = key.second == Phase::kBwd ? layer.backward : layer.forward;
      // (The last layer's backward starts with the loss's, which makes the logits' gradient.)
      auto at = pass.begin();
      while (key.second == Phase::kBwd && at != pass.end() && at->id == OpId::kLoss) ++at;
      pass.insert(at, ops.begin(), ops.end());
    }
    Layer& last = lowered_.layers[c_.layers.back()];
    const auto loss = std::find_if(last.forward.begin(), last.forward.end(),
                                   [](const Op& op) { return op.id == OpId::kLoss; });
    last.forward.insert(loss, logits.begin(), logits.end());
    Layer& first = lowered_.layers[c_.layers.front()];
    first.backward.insert(first.backward.end(), features.begin(), features.end());
  }

  LoweredModel& lowered_;
  const FcChain& c_;
  std::map<std::string, OpSplit> chosen_;
  std::set<std::string> changed_;
  int64_t e_;
};

}  // namespace

std::map<std::string, OpSplit> fc_chain_splits(const LoweredModel& lowered, const FcChain& c,
                                               const spec::OpSplits& per_op) {
  std::map<std::string, OpSplit> chosen = c.uniform;
  for (const auto& [op, split] : per_op) {
    if (!chosen.contains(op)) {
      std::vector<std::string> names;
      for (const GraphNode& n : c.graph.nodes) names.push_back(n.op.name);
      throw InputError(
          "plan", fmt::format("/per_op/{}", op), "",
          fmt::format("a fully connected layer of this model: {}", fmt::join(names, ", ")));
    }
    chosen[op] = {split.begin(), split.end()};
  }
  // A layer with a ReLU needs its summed output: a split of the features it contracts would leave
  // each rank a partial sum to rectify.
  for (size_t k = 0; k < c.graph.nodes.size(); ++k) {
    const std::string& op = c.graph.nodes[k].op.name;
    const auto in = chosen.at(op).find(dim(k));
    const bool relu = activates(lowered.layers[c.layers[k]]);
    const bool split = in != chosen.at(op).end() &&
                       std::any_of(in->second.begin(), in->second.end(),
                                   [&](const std::string& a) { return c.mesh.size(a) > 1; });
    if (relu && split)
      throw InputError("plan", fmt::format("/per_op/{}/{}", op, dim(k)),
                       fmt::format("{}", fmt::join(in->second, " x ")),
                       "no split of the features a layer with a ReLU contracts (it rectifies "
                       "its summed output)");
  }
  return chosen;
}

bool fc_rows_whole(const OpSplit& split) {
  const auto b = split.find("b");
  return b == split.end() ||
         std::find(b->second.begin(), b->second.end(), spec::kDataAxis) == b->second.end();
}

FcChain fc_chain(const std::vector<FcLayer>& layers, int64_t micro_batch, int64_t dp, int64_t tp) {
  FcChain c;
  c.mesh = {{{spec::kDataAxis, dp}, {spec::kTensorAxis, tp}}};
  std::map<std::string, int64_t> extents;
  for (size_t k = 0; k < layers.size(); ++k) {
    c.layers.push_back(layers[k].index);
    extents[dim(k)] = layers[k].in;
    extents[dim(k + 1)] = layers[k].out;
  }
  extents["b"] = micro_batch * dp;
  c.graph.input = "fc_input";
  c.graph.output = "logits";
  for (size_t k = 0; k < layers.size(); ++k) {
    GraphNode n;
    n.op.name = layers[k].name;
    n.op.operands = {{"b", dim(k)}, {dim(k), dim(k + 1)}};
    n.op.output = {"b", dim(k + 1)};
    n.op.extents = extents;
    n.inputs = {{k == 0 ? c.graph.input : c.graph.nodes.back().output, false}, {"", true}};
    n.output = k + 1 == layers.size() ? c.graph.output : n.op.name + ".out";
    c.uniform[n.op.name] = {{"b", {spec::kDataAxis}}};
    c.graph.nodes.push_back(std::move(n));
  }
  c.features = layout_of({"b", dim(0)}, extents, {{"b", {spec::kDataAxis}}});
  c.logits = layout_of({"b", dim(layers.size())}, extents, {{"b", {spec::kDataAxis}}});
  return c;
}

std::optional<FcChain> cnn_fc_chain(const LoweredModel& lowered, int64_t dp, int64_t tp) {
  // The trailing run of layers with an fc GEMM.
  std::vector<FcLayer> layers;
  int64_t batch = 0;
  for (size_t l = lowered.layers.size(); l-- > 0;) {
    const Layer& layer = lowered.layers[l];
    const auto& ops = layer.forward;
    const auto fc = std::find_if(ops.begin(), ops.end(),
                                 [&](const Op& op) { return is_fc_product(layer, op); });
    if (fc == ops.end()) break;
    const MatmulShape& mm = fc->matmuls.at(0);
    batch = mm.m;
    layers.insert(layers.begin(), {lowered.layers[l].name, l, mm.k, mm.n});
  }
  if (layers.empty()) return std::nullopt;
  return fc_chain(layers, batch, dp, tp);
}

void apply_fc_splits(LoweredModel& lowered, const LoweringOptions& o) {
  if (o.per_op.empty()) return;
  const std::string splits = spec::op_splits_text(o.per_op).substr(1);
  if (o.tp > 1 || o.spatial.any())
    throw InputError("plan", "/per_op", splits,
                     "fc layers split by op on data-parallel plans (tp 1, no spatial split): not "
                     "modelled beside channel or spatial splits");
  const std::optional<FcChain> chain = cnn_fc_chain(lowered, std::max<int64_t>(o.dp, 1), o.tp);
  if (!chain)
    throw InputError("plan", "/per_op", splits,
                     "fully connected layers to split: this model ends in none");
  FcSplitter(lowered, *chain, o).apply();
}

}  // namespace sextant::models
