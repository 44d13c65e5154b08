// Names shared by the simulator, the executor and the traces: collective operations and the
// algorithms that implement them.
#pragma once

#include "sextant/spec/json_reader.hpp"

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
EnumNames<CollectiveKind> collective_kind_names();

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
EnumNames<CollectiveAlgorithm> collective_algorithm_names();

}  // namespace sextant::spec
