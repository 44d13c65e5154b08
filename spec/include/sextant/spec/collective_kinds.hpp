// The collective operations and the algorithms that implement them, as plain enums: a header
// light enough for the CUDA sources (nvcc compiles them as C++17); their names are in
// collective.hpp.
#pragma once

#include <map>

namespace sextant::spec {

enum class CollectiveKind {
  kAllReduce,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kReduce,
  kAllToAll,
  kSendRecv,
};

enum class CollectiveAlgorithm {
  kRing,
  kBinomialTree,
  kDoubleBinaryTree,
  kRecursiveDoubling,
  kRabenseifner,  // recursive halving (reduce-scatter) + recursive doubling (all-gather)
  kParameterServer,
  kHierarchical,  // intra-node reduce-scatter, inter-node all-reduce, intra-node all-gather
  kPairwise,      // direct exchange: all-to-all, send/recv
};

// A plan's choice of algorithm per collective (the others: the library's, or the cheapest).
using CollectiveAlgorithms = std::map<CollectiveKind, CollectiveAlgorithm>;

}  // namespace sextant::spec
