// AmoebaNet-D's cells lowered to ops through unit_builder.hpp: the cell's inputs reduced, each
// edge's operations, the nodes' sums and the join.
#include "amoeba_lowering.hpp"

#include <fmt/format.h>

#include "sextant/spec/amoeba_cell.hpp"
#include "sextant/spec/branch_parallel.hpp"
#include "sextant/spec/model_spec.hpp"
#include "unit_builder.hpp"

namespace sextant::models {

CellMap add_amoeba_cell(Layer& layer, const std::string& name, CellMap prev, CellMap prev_prev,
                        bool reduction_prev, int64_t filters, bool reduction, int64_t B, int64_t e,
                        const BranchShare& share, BranchJoin& join) {
  UnitBuilder b(layer, B, e);
  // torchgpipe's Cell: the previous output through relu_conv_bn to `filters` channels; the one
  // before it through a factorized reduction after a reduction cell, through relu_conv_bn when
  // its channels differ, else as it is.
  std::vector<CellMap> states;
  states.push_back(b.relu_conv_bn(name + ".reduce1", prev, filters, 1, 1, 1, 1));
  states.push_back(b.steps(name + ".reduce2",
                           spec::amoeba_second_input_steps(reduction_prev, prev_prev.c, filters),
                           prev_prev));
  const bool split = share.ranks > 1;
  join.prelude_ops = layer.forward.size();
  const spec::AmoebaGenotype& g = spec::amoeba_genotype(reduction);
  for (size_t node = 0; node < g.edges.size() / 2; ++node) {
    // Another rank's node: only its state's extents (every edge of a node makes the same).
    if (split && share.owners[node] != share.rank) {
      const CellMap& first = states[0];
      states.push_back(reduction ? CellMap{filters, first.h / 2, first.w / 2} : first);
      continue;
    }
    CellMap sum;
    for (size_t k = 0; k < 2; ++k) {
      const spec::AmoebaEdge& edge = g.edges[2 * node + k];
      const CellMap& in = states[static_cast<size_t>(edge.input)];
      sum = b.steps(
          fmt::format("{}.node{}.{}", name, node, k == 0 ? "a" : "b"),
          spec::amoeba_edge_steps(edge.op, in.c, spec::amoeba_edge_stride(reduction, edge)), in);
    }
    b.add(fmt::format("{}.node{}", name, node), sum);
    states.push_back(sum);
  }
  CellMap out = states[static_cast<size_t>(g.concat.front())];
  out.c = spec::amoeba_output_channels(filters, reduction);
  if (split) {
    // The ranks' parts of the join, in blocks of the largest; the reduced states' gradients (both
    // of filters x h x w) summed before the reductions' backward.
    std::vector<int64_t> channels(static_cast<size_t>(share.ranks), 0);
    for (int64_t owner : share.join_owners) channels[static_cast<size_t>(owner)] += filters;
    const Op gather =
        comm_op(OpName(name, OpId::kUnitBranchAllGather), spec::CollectiveKind::kAllGather,
                share.ranks * spec::branch_gather_block(channels) * B * out.h * out.w * e);
    layer.forward.push_back(gather);
    join.gather = gather.name;
    join.sum_bytes = 2 * B * filters * states[0].h * states[0].w * e;
  }
  b.join(name, out);
  return out;
}

}  // namespace sextant::models
