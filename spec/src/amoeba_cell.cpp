// AmoebaNet-D's genotype.
#include "sextant/spec/amoeba_cell.hpp"

namespace sextant::spec {

const AmoebaGenotype& amoeba_genotype(bool reduction) {
  using O = AmoebaOp;
  // torchgpipe benchmarks/models/amoebanet/genotype.py, NORMAL_OPERATIONS and NORMAL_CONCAT (as
  // TensorFlow's amoeba_net defines them), REDUCTION_OPERATIONS and REDUCTION_CONCAT.
  static const AmoebaGenotype kNormal{{{{1, O::kConv1x1},
                                        {1, O::kMaxPool3x3},
                                        {1, O::kIdentity},
                                        {0, O::kConv1x7_7x1},
                                        {0, O::kConv1x1},
                                        {0, O::kConv1x7_7x1},
                                        {2, O::kMaxPool3x3},
                                        {2, O::kIdentity},
                                        {1, O::kAvgPool3x3},
                                        {5, O::kConv1x1}}},
                                      {0, 3, 4, 6}};
  static const AmoebaGenotype kReduction{{{{0, O::kMaxPool2x2},
                                           {0, O::kMaxPool3x3},
                                           {2, O::kIdentity},
                                           {1, O::kConv3x3},
                                           {2, O::kConv1x7_7x1},
                                           {2, O::kMaxPool3x3},
                                           {3, O::kIdentity},
                                           {1, O::kMaxPool2x2},
                                           {2, O::kAvgPool3x3},
                                           {3, O::kConv1x1}}},
                                         {4, 5, 6}};
  return reduction ? kReduction : kNormal;
}

int64_t amoeba_output_channels(int64_t filters, bool reduction) {
  return filters * static_cast<int64_t>(amoeba_genotype(reduction).concat.size());
}

int64_t amoeba_edge_stride(bool reduction, const AmoebaEdge& edge) {
  return reduction && edge.input < 2 ? 2 : 1;
}

std::vector<int> amoeba_node_groups(bool reduction) {
  const AmoebaGenotype& g = amoeba_genotype(reduction);
  const size_t nodes = g.edges.size() / 2;
  // Union-find over the nodes: an edge reading node k (state k + 2) joins its node to k's.
  std::vector<size_t> parent(nodes);
  for (size_t n = 0; n < nodes; ++n) parent[n] = n;
  auto root = [&](size_t n) {
    while (parent[n] != n) n = parent[n];
    return n;
  };
  for (size_t e = 0; e < g.edges.size(); ++e)
    if (g.edges[e].input >= 2)
      parent[root(e / 2)] = root(static_cast<size_t>(g.edges[e].input - 2));
  std::vector<int> group(nodes, -1), of_root(nodes, -1);
  int next = 0;
  for (size_t n = 0; n < nodes; ++n) {
    int& id = of_root[root(n)];
    if (id < 0) id = next++;
    group[n] = id;
  }
  return group;
}

std::vector<AmoebaStep> amoeba_edge_steps(AmoebaOp op, int64_t channels, int64_t stride) {
  using K = AmoebaStep::Kind;
  const int64_t c = channels, narrow = channels / 4;
  switch (op) {
    case AmoebaOp::kConv1x1:
      return {{K::kReluConvBn, "", c, 1, 1, stride, stride, 0}};
    case AmoebaOp::kConv3x3:
      return {{K::kReluConvBn, ".conv1", narrow, 1, 1, 1, 1, 0},
              {K::kReluConvBn, ".conv2", narrow, 3, 3, stride, stride, 0},
              {K::kReluConvBn, ".conv3", c, 1, 1, 1, 1, 0}};
    case AmoebaOp::kConv1x7_7x1:
      return {{K::kReluConvBn, ".conv1", narrow, 1, 1, 1, 1, 0},
              {K::kReluConvBn, ".conv2", narrow, 1, 7, 1, stride, 0},
              {K::kReluConvBn, ".conv3", narrow, 7, 1, stride, 1, 0},
              {K::kReluConvBn, ".conv4", c, 1, 1, 1, 1, 0}};
    case AmoebaOp::kMaxPool3x3:
      return {{K::kMaxPool, "", c, 3, 3, stride, stride, 1}};
    case AmoebaOp::kAvgPool3x3:
      return {{K::kAvgPool, "", c, 3, 3, stride, stride, 1}};
    case AmoebaOp::kMaxPool2x2:
      return {{K::kMaxPool, "", c, 2, 2, stride, stride, 0}};
    case AmoebaOp::kIdentity:
      if (stride == 1) return {};
      return {{K::kFactorizedReduce, "", c, 1, 1, 2, 2, 0}};
  }
  return {};
}

std::vector<AmoebaStep> amoeba_second_input_steps(bool reduction_prev, int64_t prev_prev_channels,
                                                  int64_t filters) {
  using K = AmoebaStep::Kind;
  if (reduction_prev) return {{K::kFactorizedReduce, "", filters, 1, 1, 2, 2, 0}};
  if (prev_prev_channels != filters) return {{K::kReluConvBn, "", filters, 1, 1, 1, 1, 0}};
  return {};
}

}  // namespace sextant::spec
