// AmoebaNet-D's cells (Real et al. 2019, "Regularized evolution for image classifier architecture
// search"), the architecture GPipe pipelines (Huang et al. 2019): each cell reads the two previous
// cells' outputs, reduces both to `filters` channels, builds five nodes that each sum two
// operations on earlier states, and joins some states along the channels. The genotype and the
// operations are those of torchgpipe's benchmarks/models/amoebanet (genotype.py,
// operations.py), whose normal concat follows TensorFlow's reference implementation and gives
// GPipe's parameter counts. The one home of the cell's structure: the model check, the lowering
// and the executor's refusal ask it.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace sextant::spec {

// What an edge of a cell applies to one state of `filters` (c) channels.
enum class AmoebaOp {
  kConv1x1,      // ReLU, 1x1 conv c -> c (the edge's stride), batch norm
  kConv3x3,      // ReLU, 1x1 to c/4, BN; ReLU, 3x3 (stride, padding 1), BN; ReLU, 1x1 to c, BN
  kConv1x7_7x1,  // ReLU, 1x1 to c/4, BN; ReLU, 1x7 then BN, ReLU, 7x1 then BN (padding 3, the
                 // stride along each's long side); ReLU, 1x1 to c, BN
  kMaxPool3x3,   // 3x3 window, padding 1
  kAvgPool3x3,   // 3x3 window, padding 1 (padding not counted)
  kMaxPool2x2,   // 2x2 window, no padding
  kIdentity,     // stride 1: the state itself; stride 2: a factorized reduction (ReLU, two 1x1
                 // convolutions to c/2 of stride 2, the second on the map shifted by one pixel,
                 // joined, batch norm)
};

struct AmoebaEdge {
  int input =
      0;  // the state it reads: 0 the previous cell's output, 1 the one before, k + 2 node k
  AmoebaOp op = AmoebaOp::kIdentity;
};

// Edges 2k and 2k + 1 make node k (state k + 2) by their sum; `concat` lists the states joined,
// in order, into the cell's output.
struct AmoebaGenotype {
  std::array<AmoebaEdge, 10> edges;
  std::vector<int> concat;
};
const AmoebaGenotype& amoeba_genotype(bool reduction);

// One step of an edge's operation or of a cell input's reduction (torchgpipe's operations.py):
// ReLU, a kh x kw convolution of strides sh x sw padded by half its window, batch norm, to
// `channels` (kReluConvBn, its name the edge's + `suffix`); a k x k pool of stride s padded by p
// (max with the padding left out, or average leaving it out of the count); or the factorized
// reduction (ReLU, two 1x1 convolutions of stride 2 to channels / 2, the second on the map
// shifted by a pixel, joined, batch norm).
struct AmoebaStep {
  enum class Kind { kReluConvBn, kMaxPool, kAvgPool, kFactorizedReduce };
  Kind kind = Kind::kReluConvBn;
  const char* suffix = "";
  int64_t channels = 0;
  int64_t kh = 1, kw = 1, sh = 1, sw = 1;  // convolution window and strides; a pool's k and s
  int64_t padding = 0;                     // a pool's
};
// The steps of an edge's operation on a state of `channels` (c) channels at `stride`, in order;
// none for the identity of stride 1. The one home of what each operation is: the lowering prices
// these steps and the executor runs them.
std::vector<AmoebaStep> amoeba_edge_steps(AmoebaOp op, int64_t channels, int64_t stride);
// How a cell brings its second input (`prev_prev_channels`) to `filters` channels: a factorized
// reduction after a reduction cell (the input has twice the rows and columns), a 1x1
// relu_conv_bn when the channels differ, else none (torchgpipe's Cell.reduce2). The first input
// always goes through a 1x1 relu_conv_bn.
std::vector<AmoebaStep> amoeba_second_input_steps(bool reduction_prev, int64_t prev_prev_channels,
                                                  int64_t filters);

// The states a cell joins: 4 x filters channels for a normal cell, 3 x for a reduction cell.
int64_t amoeba_output_channels(int64_t filters, bool reduction);
// An edge's stride: 2 where a reduction cell's edge reads one of the cell's two inputs.
int64_t amoeba_edge_stride(bool reduction, const AmoebaEdge& edge);

// SUPER's sub-graphs of a cell (spec/branch_parallel.hpp): each node's group, numbered in the
// order of their first nodes. Groups are the connected components of the nodes under "reads"; the
// reduced inputs (states 0 and 1) are read by every group. A normal cell has three ({0, 3, 4},
// {1}, {2}), a reduction cell one (every node reads node 0 or 1).
std::vector<int> amoeba_node_groups(bool reduction);

}  // namespace sextant::spec
