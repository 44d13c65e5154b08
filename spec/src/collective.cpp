// Collective and algorithm names.
#include "sextant/spec/collective.hpp"

#include <array>

namespace sextant::spec {

namespace {
constexpr std::array<std::pair<std::string_view, CollectiveKind>, 7> kKinds{{
    {"all_reduce", CollectiveKind::kAllReduce},
    {"reduce_scatter", CollectiveKind::kReduceScatter},
    {"all_gather", CollectiveKind::kAllGather},
    {"broadcast", CollectiveKind::kBroadcast},
    {"reduce", CollectiveKind::kReduce},
    {"all_to_all", CollectiveKind::kAllToAll},
    {"send_recv", CollectiveKind::kSendRecv},
}};
constexpr std::array<std::pair<std::string_view, CollectiveAlgorithm>, 8> kAlgorithms{{
    {"ring", CollectiveAlgorithm::kRing},
    {"binomial_tree", CollectiveAlgorithm::kBinomialTree},
    {"double_binary_tree", CollectiveAlgorithm::kDoubleBinaryTree},
    {"recursive_doubling", CollectiveAlgorithm::kRecursiveDoubling},
    {"rabenseifner", CollectiveAlgorithm::kRabenseifner},
    {"parameter_server", CollectiveAlgorithm::kParameterServer},
    {"hierarchical", CollectiveAlgorithm::kHierarchical},
    {"pairwise", CollectiveAlgorithm::kPairwise},
}};
}  // namespace

EnumNames<CollectiveKind> collective_kind_names() {
  return kKinds;
}
EnumNames<CollectiveAlgorithm> collective_algorithm_names() {
  return kAlgorithms;
}

}  // namespace sextant::spec
