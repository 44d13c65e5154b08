// The α-β-γ formulas. Each case cites its row of published.md T15b (MPICH, Thakur et al. 2005).
#include "sextant/sim/collective_cost.hpp"

#include <bit>

#include "sextant/spec/error.hpp"

namespace sextant::sim {

using spec::CollectiveAlgorithm;
using spec::CollectiveKind;

std::vector<CollectiveAlgorithm> flat_algorithms(CollectiveKind kind) {
  using A = CollectiveAlgorithm;
  switch (kind) {
    case CollectiveKind::kAllReduce:
      return {A::kRing,         A::kBinomialTree,   A::kDoubleBinaryTree, A::kRecursiveDoubling,
              A::kRabenseifner, A::kParameterServer};
    case CollectiveKind::kReduceScatter:
      return {A::kRing, A::kPairwise, A::kRecursiveDoubling};
    case CollectiveKind::kAllGather:
      return {A::kRing, A::kRecursiveDoubling};
    case CollectiveKind::kBroadcast:
      return {A::kRing, A::kBinomialTree, A::kRabenseifner};
    case CollectiveKind::kReduce:
      return {A::kRing, A::kBinomialTree, A::kRabenseifner};
    case CollectiveKind::kAllToAll:
      return {A::kPairwise, A::kRecursiveDoubling};
    case CollectiveKind::kSendRecv:
      return {A::kPairwise};
  }
  return {};
}

bool supports(CollectiveKind kind, CollectiveAlgorithm algorithm) {
  if (algorithm == CollectiveAlgorithm::kHierarchical) return kind == CollectiveKind::kAllReduce;
  for (CollectiveAlgorithm a : flat_algorithms(kind))
    if (a == algorithm) return true;
  return false;
}

CostTerms flat_cost(CollectiveKind kind, CollectiveAlgorithm algorithm, int64_t p, double n,
                    const AlphaBetaGamma& l) {
  SEXTANT_CHECK(p >= 1 && n >= 0, "bad collective size p={} n={}", p, n);
  if (p == 1 && kind != CollectiveKind::kSendRecv) return {};
  const double P = static_cast<double>(p);
  const bool pof2 = std::has_single_bit(static_cast<uint64_t>(p));
  const double lg_ceil = static_cast<double>(std::bit_width(static_cast<uint64_t>(p - 1)));
  const double lg_floor = static_cast<double>(std::bit_width(static_cast<uint64_t>(p)) - 1);
  const double frac = (P - 1) / P;
  const double a = l.alpha;
  const double b = l.beta;
  const double g = l.gamma;
  auto T = [](double latency, double bandwidth) { return CostTerms{latency, bandwidth}; };
  using A = CollectiveAlgorithm;
  switch (kind) {
    case CollectiveKind::kAllReduce:
      switch (algorithm) {
        case A::kRing:  // ring reduce-scatter + ring all-gather (DERIVED in T15b)
          return T(2 * (P - 1) * a + frac * n * g, 2 * frac * n * b);
        case A::kRecursiveDoubling:  // T15b allreduce recursive doubling
          if (pof2) return T(lg_floor * (a + n * g), lg_floor * n * b);
          return T((lg_floor + 2) * a + (lg_floor + 1) * n * g, (lg_floor + 2) * n * b);
        case A::kRabenseifner:  // T15b Rabenseifner, with its non-power-of-two row
          if (pof2) return T(2 * lg_floor * a + frac * n * g, 2 * frac * n * b);
          return T((2 * lg_floor + 2) * a + (1 + frac) * n * g, (2 * frac + 2) * n * b);
        case A::kBinomialTree:  // binomial reduce then binomial broadcast
          return T(2 * lg_ceil * a + lg_ceil * n * g, 2 * lg_ceil * n * b);
        case A::kDoubleBinaryTree:
          // Two pipelined binary trees, each reducing then broadcasting half of the data
          // (Sanders, Speck & Träff 2009): every rank sends and receives n per phase.
          return T(2 * lg_ceil * a + n * g, 2 * n * b);
        case A::kParameterServer:  // the seeds' slides: 2pα + 2pnβ + pnγ
          return T(2 * P * a + P * n * g, 2 * P * n * b);
        default:
          break;
      }
      break;
    case CollectiveKind::kReduceScatter:
      switch (algorithm) {
        case A::kRing:
        case A::kPairwise:  // T15b pairwise exchange
          return T((P - 1) * a + frac * n * g, frac * n * b);
        case A::kRecursiveDoubling:  // T15b recursive halving (commutative)
          if (pof2) return T(lg_floor * a + frac * n * g, frac * n * b);
          return T((lg_floor + 2) * a + (1 + frac) * n * g, (1 + frac) * n * b);
        default:
          break;
      }
      break;
    case CollectiveKind::kAllGather:
      switch (algorithm) {
        case A::kRing:  // T15b allgather ring
          return T((P - 1) * a, frac * n * b);
        case A::kRecursiveDoubling:  // T15b recursive doubling (Bruck for other p)
          return T(lg_ceil * a, frac * n * b);
        default:
          break;
      }
      break;
    case CollectiveKind::kBroadcast:
      switch (algorithm) {
        case A::kRing:  // pipelined chain (NCCL's ring broadcast): latency p-1 hops, n once
          return T((P - 1) * a, n * b);
        case A::kBinomialTree:  // T15b bcast binomial
          return T(lg_ceil * a, lg_ceil * n * b);
        case A::kRabenseifner:  // T15b scatter + recursive-doubling all-gather
          return T(2 * lg_ceil * a, 2 * frac * n * b);
        default:
          break;
      }
      break;
    case CollectiveKind::kReduce:
      switch (algorithm) {
        case A::kRing:  // pipelined chain
          return T((P - 1) * a + n * g, n * b);
        case A::kBinomialTree:  // T15b reduce binomial
          return T(lg_ceil * (a + n * g), lg_ceil * n * b);
        case A::kRabenseifner:  // T15b reduce-scatter + gather
          if (pof2) return T(2 * lg_floor * a + frac * n * g, 2 * frac * n * b);
          return T((2 * lg_floor + 1) * a + (1 + frac) * n * g, (2 * frac + 1) * n * b);
        default:
          break;
      }
      break;
    case CollectiveKind::kAllToAll:
      switch (algorithm) {
        case A::kPairwise:  // T15b pairwise; n counts the rank's own block too
          return T((P - 1) * a, frac * n * b);
        case A::kRecursiveDoubling:  // T15b Bruck
          return T(lg_ceil * a, n / 2 * lg_ceil * b);
        default:
          break;
      }
      break;
    case CollectiveKind::kSendRecv:
      if (algorithm == A::kPairwise) return T(a, n * b);
      break;
  }
  SEXTANT_CHECK(false, "algorithm {} does not implement collective {}",
                spec::enum_name(spec::collective_algorithm_names(), algorithm),
                spec::enum_name(spec::collective_kind_names(), kind));
  return {};
}

CollectiveAlgorithm fitted_algorithm(CollectiveKind kind) {
  return kind == CollectiveKind::kAllToAll || kind == CollectiveKind::kSendRecv
             ? CollectiveAlgorithm::kPairwise
             : CollectiveAlgorithm::kRing;
}

CostTerms hierarchical_all_reduce_cost(int64_t per_node, int64_t nodes, double n,
                                       const AlphaBetaGamma& intra, const AlphaBetaGamma& inter) {
  using A = CollectiveAlgorithm;
  using K = CollectiveKind;
  double shard = n / static_cast<double>(per_node);
  CostTerms parts[] = {flat_cost(K::kReduceScatter, A::kRing, per_node, n, intra),
                       flat_cost(K::kAllReduce, A::kRing, nodes, shard, inter),
                       flat_cost(K::kAllGather, A::kRing, per_node, n, intra)};
  CostTerms sum;
  for (const CostTerms& c : parts) {
    sum.latency += c.latency;
    sum.bandwidth += c.bandwidth;
  }
  return sum;
}

}  // namespace sextant::sim
