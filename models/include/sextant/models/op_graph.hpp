// A model graph of einsum ops (sharded_ops.hpp) with a split per op, walked forward and backward:
// each op's per-rank FLOPs, and the collectives the resharding rule (spec/sharding.hpp) puts
// between an op and the ops that read its output, in the order they run. Backward follows from
// the forward by the same rule: each op's gradient products under the op's own split, partial
// gradients summed into the layout their producer wants, and parameter gradients summed into
// their parameter's layout (the data-parallel sums of a uniform layout).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "sextant/models/sharded_ops.hpp"
#include "sextant/spec/sharding.hpp"
#include "sextant/spec/trace.hpp"

namespace sextant::models {

struct GraphOperand {
  std::string tensor;  // the graph input's name or an earlier node's output
  bool param = false;  // a parameter of the node (its layout is the node's split of it)
};

struct GraphNode {
  EinsumOp op;                       // op.name names the node
  std::vector<GraphOperand> inputs;  // one per operand of op
  std::string output;
  double backward_factor = 2.0;  // an op that is not a product: its backward's FLOPs over its own
};

struct OpGraph {
  std::string input;             // the tensor entering the graph
  std::string output;            // the tensor leaving it
  std::vector<GraphNode> nodes;  // in forward order; each reads only what earlier ones made
};

struct GraphStep {
  enum class Kind { kCompute, kReshard, kGradientSum };
  Kind kind = Kind::kCompute;
  std::string node;  // the op computed, or the op whose operand (or parameter) is resharded
  // Reshard and gradient sum: the tensor moved. Forward, an operand of `node` (each read moves its
  // own copy from the producer's layout); backward, the gradient of `tensor` that its `source`-th
  // reader made (readers in the order the backward reaches them), moved to the layout `node`
  // wants and summed with the others there; a gradient sum, `node`'s parameter (operand `source`).
  std::string tensor;
  int64_t source = 0;
  spec::Phase phase = spec::Phase::kFwd;
  double flops = 0;           // compute: one rank's
  spec::ReshardStep reshard;  // reshard and gradient sum
};

struct GraphWalk {
  std::vector<GraphStep> steps;  // forward, then backward, in order
  int64_t param_bytes = 0;       // one rank's parameters
};

// Walks `graph` on `mesh` with `splits` (one per node, by name; absent: the node unsplit). The
// graph's input arrives in `input_layout` and its output must leave in `output_layout` (a
// residual stream's layout, whose gradient comes back in it). Throws InputError for a split the
// rule refuses.
GraphWalk walk_graph(const spec::DeviceMesh& mesh, const OpGraph& graph,
                     const std::map<std::string, OpSplit>& splits,
                     const spec::TensorLayout& input_layout,
                     const spec::TensorLayout& output_layout, int64_t element_bytes);

}  // namespace sextant::models
