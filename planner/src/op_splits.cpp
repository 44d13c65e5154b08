// Per-op splits by step time (op_splits.hpp).
#include "sextant/planner/op_splits.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>

#include "sextant/models/block_graph.hpp"
#include "sextant/models/cnn_fc_graph.hpp"
#include "sextant/models/lowering.hpp"
#include "sextant/models/per_op_head.hpp"
#include "sextant/planner/estimator.hpp"
#include "sextant/sim/step_setup.hpp"
#include "sextant/spec/error.hpp"

namespace sextant::planner {

namespace {

using models::OpSplit;

std::string split_text(const OpSplit& split) {
  std::vector<std::string> parts;
  for (const auto& [dim, axes] : split)
    if (!axes.empty()) parts.push_back(fmt::format("{}:{}", dim, fmt::join(axes, "")));
  return parts.empty() ? "whole" : fmt::format("{}", fmt::join(parts, ","));
}

// The graph a plan's per-op splits name: a transformer's block (extents are the lowering's to
// check; only the ops' dimensions and which of them are weights' are read here), or a CNN's fc
// layers as lowered for `plan` (none: an empty graph).
models::OpGraph per_op_graph(const spec::ModelSpec& model, const spec::ClusterSpec& cluster,
                             const spec::Plan& plan) {
  if (model.is_transformer()) {
    const spec::TransformerSpec& t = model.transformer();
    models::BlockDims dims{1,
                           1,
                           t.hidden,
                           t.heads,
                           t.head_dim(),
                           t.ffn_hidden,
                           0,
                           t.activation == spec::Activation::kSwiglu ? 2 : 1};
    models::OpGraph graph = models::transformer_block_graph(dims);
    // The output layer's logits after the block's ops (per_op_head.hpp).
    graph.nodes.push_back(
        models::per_op_head(1, 1, t.hidden, t.vocab, 1, 1, false, false, {}).node());
    return graph;
  }
  spec::Plan uniform = plan;
  uniform.per_op.clear();
  const models::LoweredModel lowered =
      models::lower(model, sim::step_setup(model, cluster, uniform).lowering);
  const std::optional<models::FcChain> chain = models::cnn_fc_chain(lowered, plan.dp, plan.tp);
  return chain ? chain->graph : models::OpGraph{};
}

// The layers a change is shown by: a transformer's first block and output layer, a CNN's fc
// layers.
std::vector<size_t> shown_layers(const spec::ModelSpec& model, const spec::Plan& plan,
                                 const models::LoweredModel& lowered) {
  if (model.is_transformer()) return {lowered.split_begin, lowered.layers.size() - 1};
  const std::optional<models::FcChain> chain = models::cnn_fc_chain(lowered, plan.dp, plan.tp);
  return chain ? chain->layers : std::vector<size_t>{};
}

// The block's collectives per pass and one rank's weights, as a reader checks a change.
std::string block_summary(const spec::ModelSpec& model, const spec::ClusterSpec& cluster,
                          const spec::Plan& plan) {
  const sim::StepSetup setup = sim::step_setup(model, cluster, plan);
  const models::LoweredModel lowered = models::lower(model, setup.lowering);
  const std::vector<size_t> shown = shown_layers(model, plan, lowered);
  // A pass's layer collectives counted by kind and axis, with the bytes they move in all.
  auto comms = [&](bool backward) {
    std::map<std::string, int> counts;
    int64_t bytes = 0;
    std::vector<models::Op> ops;
    for (size_t l : shown) {
      const models::Layer& layer = lowered.layers[l];
      const std::vector<models::Op>& pass = backward ? layer.backward : layer.forward;
      ops.insert(ops.end(), pass.begin(), pass.end());
    }
    for (const models::Op& op : ops) {
      if (!op.is_comm() ||
          (op.group != models::CommGroup::kLayer && op.group != models::CommGroup::kData))
        continue;
      ++counts[fmt::format("{} over {}",
                           spec::enum_name(spec::collective_kind_names(), op.collective),
                           op.group == models::CommGroup::kData ? "d" : "t")];
      bytes += op.bytes;
    }
    if (counts.empty()) return std::string("no collective");
    std::vector<std::string> parts;
    for (const auto& [what, n] : counts) parts.push_back(fmt::format("{} {}", n, what));
    return fmt::format("{} ({:.0f} MiB)", fmt::join(parts, ", "),
                       static_cast<double>(bytes) / (1 << 20));
  };
  int64_t params = 0;
  for (size_t l : shown) params += lowered.layers[l].params;
  return fmt::format("forward {}; backward {}; {:.1f} M parameters a rank", comms(false),
                     comms(true), static_cast<double>(params) / 1e6);
}

// A move: one split given to a run of consecutive ops of the block (a single op, or a segment
// such as QKV, attention and projection, which only pays changed together).
struct Move {
  size_t first = 0, count = 1;
  OpSplit split;
};

// Whether `split` applies to `node`: its dimensions are the op's and not ones it needs whole, and
// no weight is split over the replicas unless `weights_over_d` or the op is the logits (a CNN's fc
// layers, the output layer: each replica's shard of a weight its op reads every replica's rows
// for).
bool applies(const models::GraphNode& node, const OpSplit& split, bool weights_over_d) {
  weights_over_d = weights_over_d || node.op.name == models::kLogitsOp;
  for (const auto& [dim, axes] : split) {
    bool has = std::find(node.op.output.begin(), node.op.output.end(), dim) != node.op.output.end();
    for (size_t i = 0; i < node.op.operands.size(); ++i) {
      const auto& operand = node.op.operands[i];
      const bool in = std::find(operand.begin(), operand.end(), dim) != operand.end();
      has = has || in;
      if (in && node.inputs[i].param && !weights_over_d &&
          std::find(axes.begin(), axes.end(), spec::kDataAxis) != axes.end())
        return false;
    }
    if (!has || std::find(node.op.whole.begin(), node.op.whole.end(), dim) != node.op.whole.end())
      return false;
  }
  return true;
}

// Every split of `node`'s dimensions over the mesh axes d and t that applies to it: each axis
// splits no dimension or one; both on one dimension, d major.
std::vector<OpSplit> candidate_splits(const models::GraphNode& node, bool weights_over_d,
                                      const spec::Plan& plan) {
  std::vector<std::string> dims = {""};
  auto add = [&](const std::string& d) {
    if (std::find(dims.begin(), dims.end(), d) == dims.end()) dims.push_back(d);
  };
  for (const auto& operand : node.op.operands)
    for (const std::string& d : operand) add(d);
  for (const std::string& d : node.op.output) add(d);
  std::vector<OpSplit> out;
  for (const std::string& on_d : dims)
    for (const std::string& on_t : dims) {
      // An axis of one rank splits nothing: its splits are the uniform ones again.
      if ((!on_d.empty() && plan.dp == 1) || (!on_t.empty() && plan.tp == 1)) continue;
      OpSplit s;
      if (!on_d.empty()) s[on_d].push_back(spec::kDataAxis);
      if (!on_t.empty()) s[on_t].push_back(spec::kTensorAxis);
      if (applies(node, s, weights_over_d)) out.push_back(std::move(s));
    }
  return out;
}

// Graphs of up to this many ops try every run of consecutive ops; longer ones (a deep MLP's
// layers) runs of 1, 2, 4, 8... ops and every run to the end, n log n moves instead of n^2.
constexpr size_t kEveryRunUpTo = 32;

// Segments of consecutive ops with every split of their first op that applies to all of them.
std::vector<Move> segment_moves(const models::OpGraph& graph, bool weights_over_d,
                                const spec::Plan& plan) {
  std::vector<Move> out;
  const size_t n = graph.nodes.size();
  const bool every = n <= kEveryRunUpTo;
  for (size_t first = 0; first < n; ++first)
    for (const OpSplit& split : candidate_splits(graph.nodes[first], weights_over_d, plan))
      for (size_t count = 1; first + count <= n; ++count) {
        if (!applies(graph.nodes[first + count - 1], split, weights_over_d)) break;
        const bool power_of_two = (count & (count - 1)) == 0;
        if (every || power_of_two || first + count == n) out.push_back({first, count, split});
      }
  return out;
}

spec::Plan with_move(spec::Plan plan, const models::OpGraph& graph, const Move& move) {
  for (size_t i = move.first; i < move.first + move.count; ++i)
    plan.per_op[graph.nodes[i].op.name] = {move.split.begin(), move.split.end()};
  return plan;
}

// The ops whose split `after` changed from `before`'s, with the step it saved and why.
OpSplitChange change_of(const spec::ModelSpec& model, const spec::ClusterSpec& cluster,
                        const spec::Plan& before, const spec::Plan& after,
                        const sim::SimulationResult& was, const sim::SimulationResult& now) {
  OpSplitChange c;
  std::vector<std::string> ops;
  for (const auto& [op, split] : after.per_op) {
    const auto it = before.per_op.find(op);
    if (it != before.per_op.end() && it->second == split) continue;
    ops.push_back(op);
    c.from =
        it == before.per_op.end() ? "uniform" : split_text({it->second.begin(), it->second.end()});
    c.to = split_text({split.begin(), split.end()});
  }
  c.op = fmt::format("{}", fmt::join(ops, ", "));
  c.step_before_s = was.report.step_time_s;
  c.step_after_s = now.report.step_time_s;
  c.why = fmt::format("{} -> {}", block_summary(model, cluster, before),
                      block_summary(model, cluster, after));
  return c;
}

// Moves simulated per pass (the best estimated).
constexpr size_t kSimulatedMoves = 3;

// A CNN plan's convolutions bounded at its samples a replica a step, replicas, map and gradient
// dtypes.
std::vector<models::ConvSplitBound> conv_bounds(const spec::ModelSpec& model,
                                                const spec::ClusterSpec& cluster,
                                                const spec::Plan& plan) {
  if (model.kind() != spec::ModelKind::kCnn) return {};
  const sim::StepSetup setup = sim::step_setup(model, cluster, plan);
  return models::conv_split_bounds(
      models::lower(model, setup.lowering), plan.global_batch / plan.dp, plan.dp,
      spec::dtype_bytes(setup.dtype),
      spec::dtype_bytes(spec::gradient_dtype(setup.stack, setup.dtype)));
}

}  // namespace

bool splits_ops(const spec::ModelSpec& model, const spec::Plan& plan) {
  spec::Plan probe = plan;
  probe.per_op = {{"qkv", {}}};
  if (!spec::per_op_problem(probe).empty()) return false;
  if (model.is_transformer()) return !model.transformer().moe;
  // A CNN's fc layers, an MLP's layers, on data-parallel plans (models/cnn_fc_graph.hpp).
  return (model.kind() == spec::ModelKind::kCnn || model.kind() == spec::ModelKind::kMlp) &&
         plan.tp == 1;
}

OpSplitChoice choose_op_splits(const spec::ModelSpec& model, const spec::ClusterSpec& cluster,
                               spec::Plan plan, const sim::SimulationOptions& options, int passes,
                               const std::function<void(int64_t, int64_t)>& progress,
                               const std::function<bool(const spec::Plan&)>& allowed) {
  OpSplitChoice out;
  plan.per_op.clear();
  auto simulate = [&](const spec::Plan& p) {
    ++out.simulations;
    return sim::simulate(model, cluster, p, options);
  };
  sim::SimulationResult best = simulate(plan);
  out.uniform_step_s = best.report.step_time_s;
  if (!splits_ops(model, plan)) {
    out.plan = std::move(plan);
    out.result = std::move(best);
    return out;
  }
  out.conv_bounds = conv_bounds(model, cluster, plan);
  const models::OpGraph graph = per_op_graph(model, cluster, plan);
  const std::vector<Move> moves = segment_moves(graph, !model.is_transformer(), plan);
  Estimator estimator(model, cluster);
  for (int pass = 0; pass < passes; ++pass) {
    // Every move estimated; the few best simulated; the best of those kept if it pays.
    std::vector<std::pair<double, size_t>> ranked;
    for (size_t i = 0; i < moves.size(); ++i) {
      if (progress && i % 64 == 0)
        progress(static_cast<int64_t>(pass * moves.size() + i),
                 static_cast<int64_t>(passes * moves.size()));
      const spec::Plan trial = with_move(plan, graph, moves[i]);
      if (trial.per_op == plan.per_op || (allowed && !allowed(trial))) continue;
      try {
        ++out.estimates;
        const Estimate e = estimator.estimate(trial);
        if (e.fits) ranked.emplace_back(e.step_time_s, i);
      } catch (const InputError&) {
        // A split the dimensions do not divide, or one the lowering does not model.
      }
    }
    std::sort(ranked.begin(), ranked.end());
    std::optional<std::pair<spec::Plan, sim::SimulationResult>> kept;
    for (size_t k = 0; k < std::min(ranked.size(), kSimulatedMoves); ++k) {
      spec::Plan trial = with_move(plan, graph, moves[ranked[k].second]);
      sim::SimulationResult r = simulate(trial);
      const double bar = (kept ? kept->second : best).report.step_time_s;
      if (r.report.memory.fits && r.report.step_time_s < bar) kept.emplace(trial, std::move(r));
    }
    if (!kept || kept->second.report.step_time_s >=
                     best.report.step_time_s - kOpSplitGain * out.uniform_step_s)
      break;
    out.changes.push_back(change_of(model, cluster, plan, kept->first, best, kept->second));
    plan = std::move(kept->first);
    best = std::move(kept->second);
  }
  if (progress) progress(passes, passes);
  out.plan = std::move(plan);
  out.result = std::move(best);
  return out;
}

}  // namespace sextant::planner
