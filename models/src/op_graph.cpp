// Forward and backward walk of a per-op split graph (op_graph.hpp).
#include "sextant/models/op_graph.hpp"

#include <algorithm>

#include "sextant/spec/error.hpp"

namespace sextant::models {

namespace {

using spec::Phase;
using spec::TensorLayout;

TensorLayout without_partial(TensorLayout l) {
  l.partial.clear();
  return l;
}

class Walker {
 public:
  Walker(const spec::DeviceMesh& mesh, const std::map<std::string, OpSplit>& splits,
         int64_t element_bytes)
      : mesh_(mesh), splits_(splits), e_(element_bytes) {}

  const OpSplit& split_of(const GraphNode& n) const {
    static const OpSplit kNone;
    const auto it = splits_.find(n.op.name);
    return it == splits_.end() ? kNone : it->second;
  }

  void move(const std::string& node, const std::string& tensor, int64_t source, Phase phase,
            GraphStep::Kind kind, const TensorLayout& from, const TensorLayout& to) {
    for (const spec::ReshardStep& s : spec::reshard(mesh_, from, to, e_))
      steps_.push_back({kind, node, tensor, source, phase, 0, s});
  }
  void move_gradients(const std::string& node, const std::string& tensor, const TensorLayout& to) {
    const std::vector<TensorLayout>& made = gradients_[tensor];
    for (size_t j = 0; j < made.size(); ++j)
      move(node, tensor, static_cast<int64_t>(j), Phase::kBwd, GraphStep::Kind::kReshard, made[j],
           to);
  }

  void forward(const OpGraph& g, const TensorLayout& input_layout,
               const TensorLayout& output_layout) {
    produced_[g.input] = input_layout;
    for (const GraphNode& n : g.nodes) {
      SEXTANT_CHECK(n.inputs.size() == n.op.operands.size(), "node {}: {} inputs for {} operands",
                    n.op.name, n.inputs.size(), n.op.operands.size());
      const ShardedOp s = shard_op(mesh_, n.op, split_of(n));
      for (size_t i = 0; i < n.inputs.size(); ++i) {
        if (n.inputs[i].param) {
          param_bytes_ += s.operands[i].shard_elements(mesh_) * e_;
          continue;
        }
        const auto it = produced_.find(n.inputs[i].tensor);
        SEXTANT_CHECK(it != produced_.end(), "node {} reads {} before it is made", n.op.name,
                      n.inputs[i].tensor);
        move(n.op.name, n.inputs[i].tensor, 0, Phase::kFwd, GraphStep::Kind::kReshard, it->second,
             s.operands[i]);
      }
      steps_.push_back({GraphStep::Kind::kCompute, n.op.name, "", 0, Phase::kFwd, s.flops, {}});
      produced_[n.output] = s.output;
    }
    move(g.output, g.output, 0, Phase::kFwd, GraphStep::Kind::kReshard, produced_.at(g.output),
         output_layout);
  }

  void backward(const OpGraph& g, const TensorLayout& input_layout,
                const TensorLayout& output_layout) {
    gradients_[g.output].push_back(output_layout);
    for (auto n = g.nodes.rbegin(); n != g.nodes.rend(); ++n) {
      const OpSplit& split = split_of(*n);
      // The output's gradient, whole over the axes its forward left partial (each partial sum's
      // gradient is the sum's), from every op that read it.
      const TensorLayout need = without_partial(shard_op(mesh_, n->op, split).output);
      move_gradients(n->op.name, n->output, need);
      double flops = 0;
      std::vector<std::pair<size_t, TensorLayout>> made;
      for (size_t i = 0; i < n->inputs.size(); ++i) {
        const ShardedOp d = shard_op(mesh_, gradient_op(n->op, i, n->backward_factor), split);
        flops += d.flops;
        made.emplace_back(i, d.output);
      }
      steps_.push_back({GraphStep::Kind::kCompute, n->op.name, "", 0, Phase::kBwd, flops, {}});
      for (const auto& [i, layout] : made) {
        if (!n->inputs[i].param) {
          gradients_[n->inputs[i].tensor].push_back(layout);
          continue;
        }
        // A parameter's gradient, summed over the axes that split what it contracted.
        const TensorLayout param = layout_of(n->op.operands[i], n->op.extents, split);
        move(n->op.name, "", static_cast<int64_t>(i), Phase::kBwd, GraphStep::Kind::kGradientSum,
             layout, param);
      }
    }
    move_gradients(g.input, g.input, input_layout);
  }

  GraphWalk result() { return {std::move(steps_), param_bytes_}; }

 private:
  const spec::DeviceMesh& mesh_;
  const std::map<std::string, OpSplit>& splits_;
  int64_t e_;
  std::map<std::string, TensorLayout> produced_;
  std::map<std::string, std::vector<TensorLayout>> gradients_;
  std::vector<GraphStep> steps_;
  int64_t param_bytes_ = 0;
};

}  // namespace

GraphWalk walk_graph(const spec::DeviceMesh& mesh, const OpGraph& graph,
                     const std::map<std::string, OpSplit>& splits, const TensorLayout& input_layout,
                     const TensorLayout& output_layout, int64_t element_bytes) {
  Walker w(mesh, splits, element_bytes);
  w.forward(graph, input_layout, output_layout);
  w.backward(graph, input_layout, output_layout);
  return w.result();
}

}  // namespace sextant::models
