// A plan's per-op splits applied to a dense transformer block lowered for its uniform layout
// (LoweringOptions::per_op). The block is walked as a per-op graph twice, under the uniform
// layout's splits and under the plan's (block_graph.hpp, op_graph.hpp); where an op's split
// differs, its ops take the work, parameters and kept activations of its new split, and the
// block's layer-group collectives become the resharding rule's for the plan's splits. An
// unchanged op keeps the lowering's ops as they are, so a plan whose splits are the uniform ones
// lowers exactly as the uniform plan.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "sextant/models/per_op_block.hpp"
#include "sextant/spec/error.hpp"
#include "transformer_lowering.hpp"

namespace sextant::models {

namespace {

using spec::Phase;

bool is_product_id(OpId id) {
  return id == OpId::kAttnQkv || id == OpId::kAttnProj || id == OpId::kMlpFc1 ||
         id == OpId::kMlpFc2;
}

int64_t scaled(int64_t v, double r) {
  return static_cast<int64_t>(std::llround(static_cast<double>(v) * r));
}

// One rank's extent of each dimension of a layout.
std::map<std::string, int64_t> local_extents(const spec::DeviceMesh& mesh,
                                             const spec::TensorLayout& l) {
  std::map<std::string, int64_t> out;
  for (const spec::TensorDim& d : l.dims) out[d.name] = spec::local_extent(mesh, d);
  return out;
}

class BlockSplitter {
 public:
  BlockSplitter(const TransformerDims& x, const PerOpBlock& block) : x_(x), b_(block) {}

  void apply(Layer& layer) {
    const GraphWalk walk = b_.walk(b_.chosen, x_.e);
    const bool selective_comms = has_layer_comms(layer.selective_forward);
    update_params(layer);
    update_saved(layer);
    for (Op& op : layer.forward) rescale(op, false);
    for (Op& op : layer.backward) rescale(op, true);
    for (Op& op : layer.selective_forward) rescale(op, false);
    rebuild_comms(layer.forward, walk, Phase::kFwd);
    rebuild_comms(layer.backward, walk, Phase::kBwd);
    if (selective_comms) rebuild_comms(layer.selective_forward, walk, Phase::kFwd);
  }

 private:
  bool changed(std::string_view op) const { return b_.changed.contains(std::string(op)); }
  ShardedOp sharded(const GraphNode& n, const BlockSplit& s) const { return b_.sharded(n, s); }
  int64_t output_elements(const GraphNode& n, const BlockSplit& s) const {
    return sharded(n, s).output.shard_elements(b_.mesh);
  }
  static bool has_layer_comms(const std::vector<Op>& ops) {
    return std::any_of(ops.begin(), ops.end(),
                       [](const Op& op) { return op.is_comm() && op.group == CommGroup::kLayer; });
  }

  // A changed op's per-rank work: a GEMM's product rebuilt on its new local shape, anything else
  // scaled by its new share of the op's work (attention's FLOPs, a memory op's output).
  void rescale(Op& op, bool backward) const {
    const std::string_view name = block_op_of(op.id);
    if (name.empty() || op.is_comm() || !changed(name)) {
      if (op.id == OpId::kAutocastWeights) scale_op(op, weight_ratio());
      return;
    }
    const GraphNode& n = b_.node(name);
    if (is_product_id(op.id)) {
      const ShardedOp s = sharded(n, b_.chosen);
      const std::map<std::string, int64_t> out = local_extents(b_.mesh, s.output);
      const std::map<std::string, int64_t> in = local_extents(b_.mesh, s.operands[0]);
      int64_t m = 1, cols = 1, k = 1;
      for (const std::string& d : n.op.output) (in.contains(d) ? m : cols) *= out.at(d);
      for (const std::string& d : n.op.operands[0])
        if (!out.contains(d)) k *= in.at(d);
      const Op fresh = gemm(OpName(op.id), m, cols, k, x_.e, op.split);
      const Op made = backward ? gemm_backward(fresh) : fresh;
      op.flops = made.flops;
      op.bytes = made.bytes;
      op.shape = made.shape;
      op.matmuls = made.matmuls;
      return;
    }
    const double r = n.op.flops > 0 ? sharded(n, b_.chosen).flops / sharded(n, b_.uniform).flops
                                    : static_cast<double>(output_elements(n, b_.chosen)) /
                                          static_cast<double>(output_elements(n, b_.uniform));
    scale_op(op, r);
  }

  static void scale_op(Op& op, double r) {
    if (r == 1.0) return;
    op.flops *= r;
    op.kernel_flops *= r;
    op.bytes = scaled(op.bytes, r);
    op.mixed_dtype_bytes = scaled(op.mixed_dtype_bytes, r);
    op.narrow_bytes = scaled(op.narrow_bytes, r);
    if (op.op_class == spec::OpClass::kAttention && !op.shape.empty())
      op.shape[0] = scaled(op.shape[0], r);
    for (MatmulShape& mm : op.matmuls) mm.batch = scaled(mm.batch, r);
  }

  // Weight elements one rank holds under a split: each product's parameter operand.
  int64_t weight_elements(const BlockSplit& s) const {
    int64_t n = 0;
    for (const GraphNode& g : b_.graph.nodes) {
      const ShardedOp sh = sharded(g, s);
      for (size_t i = 0; i < g.inputs.size(); ++i)
        if (g.inputs[i].param) n += sh.operands[i].shard_elements(b_.mesh);
    }
    return n;
  }
  double weight_ratio() const {
    return static_cast<double>(weight_elements(b_.chosen)) /
           static_cast<double>(weight_elements(b_.uniform));
  }

  // The rank's parameters follow its weights' new shards. A parameter whose rows the tp ranks now
  // split (a weight they hold whole, or a norm's) sees only its rank's share of the batch: its
  // gradient is a partial sum over them, all-reduced as sequence parallelism's norm weights are
  // (Layer::sp_partial_params); the block's count changes by what changed. Weights split over the
  // data axis would be ZeRO's sharding: refused.
  void update_params(Layer& layer) const {
    for (const GraphNode& g : b_.graph.nodes) {
      if (!changed(g.op.name)) continue;
      const ShardedOp now = sharded(g, b_.chosen), was = sharded(g, b_.uniform);
      for (size_t i = 0; i < g.inputs.size(); ++i) {
        if (!g.inputs[i].param) continue;
        if (now.operands[i].split_by(spec::kDataAxis) != nullptr)
          throw InputError("plan", fmt::format("/per_op/{}", g.op.name), "",
                           "no split of its weight over \"d\": sharding weights over the "
                           "replicas is ZeRO's (plan zero), not an op's split");
        layer.params +=
            now.operands[i].shard_elements(b_.mesh) - was.operands[i].shard_elements(b_.mesh);
      }
      if (const auto bias = b_.bias_layout(g.op.name, b_.chosen)) {
        if (bias->split_by(spec::kDataAxis) != nullptr)
          throw InputError("plan", fmt::format("/per_op/{}", g.op.name), "",
                           "no split of its bias over \"d\" (ZeRO's sharding, plan zero)");
        layer.params += bias->shard_elements(b_.mesh) -
                        b_.bias_layout(g.op.name, b_.uniform)->shard_elements(b_.mesh);
      }
    }
    layer.sp_partial_params += b_.partial_params(spec::kTensorAxis, b_.chosen) -
                               b_.partial_params(spec::kTensorAxis, b_.uniform);
  }

  // What the changed ops keep for backward: their activation inputs' new shards, and under a
  // changed attention the core's kept bytes (what selective recompute drops) scaled by its work.
  void update_saved(Layer& layer) const {
    int64_t inputs = 0;
    double core = 1.0;
    for (const GraphNode& g : b_.graph.nodes) {
      if (!changed(g.op.name)) continue;
      const ShardedOp now = sharded(g, b_.chosen), was = sharded(g, b_.uniform);
      for (size_t i = 0; i < g.inputs.size(); ++i)
        if (!g.inputs[i].param)
          inputs +=
              (now.operands[i].shard_elements(b_.mesh) - was.operands[i].shard_elements(b_.mesh)) *
              x_.e;
      if (g.op.name == "attention") core = now.flops / was.flops;
    }
    const int64_t core_bytes = layer.saved_bytes - layer.saved_bytes_selective;
    layer.saved_bytes += inputs + scaled(core_bytes, core) - core_bytes;
    layer.saved_bytes_selective += inputs;
  }

  // The layer-group collectives of `ops` replaced by the walk's reshards of `phase`, each before
  // the first op of the op it feeds (backward: of the op whose output gradient it brings), or of
  // a later one; the block's own input and output at the end.
  void rebuild_comms(std::vector<Op>& ops, const GraphWalk& walk, Phase phase) const {
    std::erase_if(ops, [](const Op& op) { return op.is_comm() && op.group == CommGroup::kLayer; });
    std::vector<std::string> order;
    for (const GraphNode& g : b_.graph.nodes) order.push_back(g.op.name);
    if (phase == Phase::kBwd) std::reverse(order.begin(), order.end());
    for (const GraphStep& s : walk.steps) {
      if (s.kind != GraphStep::Kind::kReshard || s.phase != phase ||
          s.reshard.kind == spec::ReshardKind::kSlice)
        continue;
      const auto at = std::find(order.begin(), order.end(), s.node);
      size_t pos = ops.size();
      for (size_t i = 0; at != order.end() && i < ops.size(); ++i) {
        const std::string_view n = block_op_of(ops[i].id);
        if (!n.empty() && !ops[i].is_comm() && std::find(at, order.end(), n) != order.end()) {
          pos = i;
          break;
        }
      }
      ops.insert(ops.begin() + static_cast<std::ptrdiff_t>(pos), reshard_op(s));
    }
  }

  static Op reshard_op(const GraphStep& s) {
    Op op = comm_op(reshard_op_name(s), s.reshard.collective(), s.reshard.bytes);
    op.group = s.reshard.axis == spec::kDataAxis ? CommGroup::kData : CommGroup::kLayer;
    op.split = TpSplit::kReplicated;
    return op;
  }

  const TransformerDims& x_;
  const PerOpBlock& b_;
};

}  // namespace

void apply_op_splits(Layer& block, const TransformerDims& x, const PerOpBlock& per_op) {
  if (per_op.any_change()) BlockSplitter(x, per_op).apply(block);
}

namespace {

bool is_head_collective(OpId id) {
  return id == OpId::kHeadAllGather || id == OpId::kHeadReduceScatter ||
         id == OpId::kHeadAllReduce || id == OpId::kHeadLossAllReduce;
}

Op head_reshard(const GraphStep& s) {
  Op op = comm_op(reshard_op_name(s), s.reshard.collective(), s.reshard.bytes);
  op.group = s.reshard.axis == spec::kDataAxis ? CommGroup::kData : CommGroup::kLayer;
  op.split = TpSplit::kReplicated;
  return op;
}

// Where op `id` sits in `ops` (ops.end(): nowhere).
std::vector<Op>::iterator find_op(std::vector<Op>& ops, OpId id) {
  return std::find_if(ops.begin(), ops.end(), [&](const Op& op) { return op.id == id; });
}

}  // namespace

void apply_head_splits(Layer& head, const TransformerDims& x, const PerOpHead& h) {
  if (!h.changed()) return;
  const ShardedOp now = h.sharded(h.chosen), was = h.sharded(h.uniform);
  const std::map<std::string, int64_t> out = local_extents(h.mesh, now.output);
  const int64_t rows = out.at("b") * out.at("s"), vocab = out.at("V");
  const double logits_ratio = static_cast<double>(now.output.shard_elements(h.mesh)) /
                              static_cast<double>(was.output.shard_elements(h.mesh));
  const int64_t weight_now = now.operands[1].shard_elements(h.mesh);
  const int64_t weight_was = was.operands[1].shard_elements(h.mesh);
  const Op logits = gemm(OpId::kHeadLogits, rows, vocab, x.h, x.e, TpSplit::kVocab);
  auto rescale = [&](Op& op, bool backward) {
    if (op.id == OpId::kHeadLogits) {
      op = backward ? gemm_backward(logits) : logits;
    } else if (op.id == OpId::kHeadLoss || op.id == OpId::kHeadLossCast) {
      op.flops *= logits_ratio;
      op.bytes = scaled(op.bytes, logits_ratio);
      op.mixed_dtype_bytes = scaled(op.mixed_dtype_bytes, logits_ratio);
    } else if (op.id == OpId::kAutocastWeights) {
      const double r = static_cast<double>(weight_now) / static_cast<double>(weight_was);
      op.bytes = scaled(op.bytes, r);
      op.mixed_dtype_bytes = scaled(op.mixed_dtype_bytes, r);
    }
  };
  std::erase_if(head.forward, [](const Op& op) { return is_head_collective(op.id); });
  std::erase_if(head.backward, [](const Op& op) { return is_head_collective(op.id); });
  for (Op& op : head.forward) rescale(op, false);
  for (Op& op : head.backward) rescale(op, true);
  // The walk's moves: the input's before the logits, its gradient's after their backward.
  const GraphWalk walk = h.walk(h.chosen, x.e);
  std::vector<Op> before, after;
  for (const GraphStep& s : walk.steps)
    if (s.kind == GraphStep::Kind::kReshard && s.reshard.kind != spec::ReshardKind::kSlice)
      (s.phase == Phase::kFwd ? before : after).push_back(head_reshard(s));
  head.forward.insert(find_op(head.forward, OpId::kHeadLogits), before.begin(), before.end());
  head.backward.insert(find_op(head.backward, OpId::kHeadLogits) + 1, after.begin(), after.end());
  // Vocabulary-parallel cross-entropy over each axis splitting V (transformer_head's pair: each
  // token's max logit, then its sums of exponentials and target logit, fp32).
  std::vector<Op> loss_sums;
  for (const std::string& axis : h.vocab_axes(h.chosen)) {
    for (int64_t values : {1, 2}) {
      Op sum = comm_op(OpId::kHeadLossAllReduce, CollectiveKind::kAllReduce, values * rows * 4);
      sum.group = axis == spec::kDataAxis ? CommGroup::kData : CommGroup::kLayer;
      loss_sums.push_back(sum);
    }
  }
  head.forward.insert(find_op(head.forward, OpId::kHeadLoss) + 1, loss_sums.begin(),
                      loss_sums.end());
  // The weights' new block: held whole by each replica's gradient when every replica sees every
  // token (no replica sums it), partial over t when the tp ranks split the tokens.
  head.params += weight_now - weight_was;
  if (h.rows_whole_over_replicas(h.chosen) && h.mesh.size(spec::kDataAxis) > 1)
    head.replica_whole_params = weight_now;
  if (now.operands[1].split_by(spec::kTensorAxis) == nullptr &&
      (now.operands[0].split_by(spec::kTensorAxis) != nullptr))
    head.sp_partial_params += weight_now;
  head.matrices = {{vocab, x.h}};
  // Kept: the logits input's new block and the fp32 softmax of the new logits block.
  head.saved_bytes +=
      (now.operands[0].shard_elements(h.mesh) - was.operands[0].shard_elements(h.mesh)) * x.e +
      (now.output.shard_elements(h.mesh) - was.output.shard_elements(h.mesh)) * 4;
  head.saved_bytes_selective = head.saved_bytes;
  head.saved_bytes_full = head.saved_bytes;
}

}  // namespace sextant::models
