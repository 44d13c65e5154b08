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

}  // namespace sextant::spec
