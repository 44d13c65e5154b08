// Link parameters per group shape, the algorithm choice, and a model of NCCL's tuner.
#include "sextant/sim/collective_model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <limits>
#include <set>

#include "sextant/spec/units.hpp"

namespace sextant::sim {

using spec::CollectiveAlgorithm;
using spec::CollectiveKind;

GroupShape group_shape(std::span<const int64_t> ranks, int64_t devices_per_node) {
  std::set<int64_t> nodes;
  for (int64_t r : ranks) nodes.insert(r / devices_per_node);
  GroupShape s;
  s.size = static_cast<int64_t>(ranks.size());
  s.nodes = static_cast<int64_t>(nodes.size());
  s.per_node = std::max<int64_t>(1, s.size / s.nodes);
  return s;
}

std::string_view nccl_protocol_name(NcclProtocol p) {
  switch (p) {
    case NcclProtocol::kLL:
      return "LL";
    case NcclProtocol::kLL128:
      return "LL128";
    case NcclProtocol::kSimple:
      return "Simple";
  }
  return "?";
}

CollectiveModel::CollectiveModel(const spec::ClusterSpec& cluster,
                                 std::map<CollectiveKind, CollectiveAlgorithm> overrides)
    : cluster_(&cluster), overrides_(std::move(overrides)) {
  const spec::NetworkLevel& node = cluster.network.node_level();
  intra_.alpha = node.latency_us * 1e-6;
  intra_.beta = 1.0 / (node.bandwidth_GBps * kBytesPerGB);
  intra_.gamma = 1.0 / (cluster.network.reduction_GBps * kBytesPerGB);
}

int64_t CollectiveModel::channels(int64_t per_node) const {
  const spec::NetworkLevel* net = cluster_->network.cluster_level();
  if (net == nullptr) return 1;
  int64_t nics = net->nics_per_node;
  int64_t by_rails = per_node * nics / cluster_->devices_per_node;
  return std::clamp<int64_t>(by_rails, 1, nics);
}

double CollectiveModel::inter_node_bandwidth(int64_t per_node) const {
  const spec::NetworkLevel* net = cluster_->network.cluster_level();
  SEXTANT_CHECK(net != nullptr, "cluster {} has no network across nodes", cluster_->name);
  const double nic = net->bandwidth_GBps * kBytesPerGB / net->oversubscription;
  const double link = cluster_->network.node_level().bandwidth_GBps * kBytesPerGB;
  const double c = static_cast<double>(channels(per_node));
  if (per_node == 1) return nic;
  if (c == 1) return std::min(nic, link);
  return std::min(c * nic, c / (c - 1) * link);
}

AlphaBetaGamma CollectiveModel::across_nodes(const GroupShape& shape) const {
  if (shape.nodes <= 1) return intra_;
  const spec::NetworkLevel* net = cluster_->network.cluster_level();
  SEXTANT_CHECK(net != nullptr, "cluster {} has no network across nodes", cluster_->name);
  AlphaBetaGamma l;
  l.alpha = net->latency_us * 1e-6;
  l.beta = 1.0 / inter_node_bandwidth(shape.per_node);
  l.gamma = intra_.gamma;
  return l;
}

const spec::CollectiveFit* CollectiveModel::fit_for(CollectiveKind kind, const GroupShape& shape,
                                                    int64_t bytes) const {
  if (cluster_->collective_fits.empty()) return nullptr;
  const spec::NetworkLevel* level =
      shape.nodes > 1 ? cluster_->network.cluster_level() : &cluster_->network.node_level();
  if (level == nullptr) return nullptr;
  std::string_view name = spec::enum_name(spec::collective_kind_names(), kind);
  constexpr int64_t kUnbounded = std::numeric_limits<int64_t>::max();
  auto bound = [&](const spec::CollectiveFit& f) {
    return f.max_bytes > 0 ? f.max_bytes : kUnbounded;
  };
  const spec::CollectiveFit* holding = nullptr;  // smallest bound >= bytes
  const spec::CollectiveFit* largest = nullptr;
  for (const spec::CollectiveFit& f : cluster_->collective_fits) {
    if (f.collective != name || f.level != level->name) continue;
    if (bound(f) >= bytes && (holding == nullptr || bound(f) < bound(*holding))) holding = &f;
    if (largest == nullptr || bound(f) > bound(*largest)) largest = &f;
  }
  return holding != nullptr ? holding : largest;
}

CollectiveCost CollectiveModel::cost_of(CollectiveKind kind, CollectiveAlgorithm algorithm,
                                        int64_t bytes, const GroupShape& shape) const {
  if (!supports(kind, algorithm)) {
    throw InputError("plan",
                     "/collective_algorithms/" +
                         std::string(spec::enum_name(spec::collective_kind_names(), kind)),
                     std::string(spec::enum_name(spec::collective_algorithm_names(), algorithm)),
                     "this algorithm does not implement that collective");
  }
  CollectiveCost c;
  c.algorithm = algorithm;
  double n = static_cast<double>(bytes);
  AlphaBetaGamma link = shape.nodes > 1 ? across_nodes(shape) : intra_;
  if (algorithm == CollectiveAlgorithm::kHierarchical) {
    if (shape.nodes <= 1 || shape.per_node <= 1) {
      // Degenerates to a flat ring on one level.
      c.terms = flat_cost(kind, CollectiveAlgorithm::kRing, shape.size, n, link);
    } else {
      // Each local rank drives its own NIC for its shard across nodes.
      GroupShape one_per_node{shape.nodes, shape.nodes, 1};
      c.terms = hierarchical_all_reduce_cost(shape.per_node, shape.nodes, n, intra_,
                                             across_nodes(one_per_node));
    }
    return c;
  }
  c.terms = flat_cost(kind, algorithm, shape.size, n, link);
  return c;
}

CollectiveCost CollectiveModel::cheapest(CollectiveKind kind, int64_t bytes,
                                         const GroupShape& shape) const {
  CollectiveCost best;
  best.terms.latency = std::numeric_limits<double>::infinity();
  std::vector<CollectiveAlgorithm> algorithms = flat_algorithms(kind);
  if (kind == CollectiveKind::kAllReduce && shape.nodes > 1 && shape.per_node > 1)
    algorithms.push_back(CollectiveAlgorithm::kHierarchical);
  for (CollectiveAlgorithm a : algorithms) {
    CollectiveCost c = cost_of(kind, a, bytes, shape);
    if (c.seconds() < best.seconds()) best = c;  // first of equals wins: stable
  }
  return best;
}

namespace {

// NCCL 2.19 src/graph/tuning.cc: base latency per algorithm and protocol, and per-hop latency by
// link type, in microseconds. Rows: {LL, LL128, Simple}.
constexpr double kBaseLatRing[3] = {6.6, 14.0, 8.4};
constexpr double kBaseLatTree[3] = {6.8, 14.0, 0.0};
constexpr double kHwLatNvlRing[3] = {0.6, 1.9, 3.4};
constexpr double kHwLatNvlTree[3] = {0.6, 1.25, 4.0};
constexpr double kHwLatNetRing[3] = {2.7, 4.0, 14.0};
constexpr double kHwLatNetTree[3] = {5.0, 8.5, 14.0};
// Fraction of link bandwidth that carries data: LL sends 4 bytes of data with a 4-byte flag in
// every 8-byte line; LL128 sends 120 bytes of data in every 128-byte line; Simple sends data only.
constexpr double kProtocolEfficiency[3] = {0.5, 120.0 / 128.0, 1.0};

}  // namespace

CollectiveCost CollectiveModel::nccl(CollectiveKind kind, int64_t bytes,
                                     const GroupShape& shape) const {
  CollectiveCost best;
  best.terms.latency = std::numeric_limits<double>::infinity();
  if (shape.size == 1 && kind != CollectiveKind::kSendRecv) {
    best.terms = {};
    best.protocol = "Simple";
    return best;
  }
  const double n = static_cast<double>(bytes);
  const double p = static_cast<double>(shape.size);
  const double nodes = static_cast<double>(shape.nodes);
  const AlphaBetaGamma link = shape.nodes > 1 ? across_nodes(shape) : intra_;
  const double bw = 1.0 / link.beta;
  auto consider = [&](CollectiveAlgorithm algorithm, int proto, double latency_us, double volume) {
    CostTerms t{latency_us * 1e-6, volume / (bw * kProtocolEfficiency[proto])};
    if (t.total() < best.seconds()) {
      best.terms = t;
      best.algorithm = algorithm;
      best.protocol = nccl_protocol_name(static_cast<NcclProtocol>(proto));
    }
  };
  for (int proto = 0; proto < 3; ++proto) {
    switch (kind) {
      case CollectiveKind::kAllReduce: {
        double inter_steps = 2 * (nodes - 1);
        double intra_steps = 2 * (p - 1) - inter_steps;
        consider(CollectiveAlgorithm::kRing, proto,
                 kBaseLatRing[proto] + intra_steps * kHwLatNvlRing[proto] +
                     inter_steps * kHwLatNetRing[proto],
                 2 * (p - 1) / p * n);
        // NCCL's tree spans nodes (a chain inside each node, two binary trees across them).
        if (shape.nodes > 1) {
          double depth =
              static_cast<double>(std::bit_width(static_cast<uint64_t>(shape.nodes - 1)));
          consider(CollectiveAlgorithm::kDoubleBinaryTree, proto,
                   kBaseLatTree[proto] +
                       2 * ((static_cast<double>(shape.per_node) - 1) * kHwLatNvlTree[proto] +
                            depth * kHwLatNetTree[proto]),
                   2 * n);
        }
        break;
      }
      case CollectiveKind::kReduceScatter:
      case CollectiveKind::kAllGather:
      case CollectiveKind::kBroadcast:
      case CollectiveKind::kReduce: {
        // One pass around the ring; reduce-scatter and all-gather move (p-1)/p of the buffer
        // per rank, broadcast and reduce the whole buffer (pipelined).
        const bool sharded =
            kind == CollectiveKind::kReduceScatter || kind == CollectiveKind::kAllGather;
        double inter_steps = nodes - 1;
        double intra_steps = (p - 1) - inter_steps;
        consider(CollectiveAlgorithm::kRing, proto,
                 kBaseLatRing[proto] + intra_steps * kHwLatNvlRing[proto] +
                     inter_steps * kHwLatNetRing[proto],
                 sharded ? (p - 1) / p * n : n);
        break;
      }
      case CollectiveKind::kAllToAll:
      case CollectiveKind::kSendRecv: {
        // Point-to-point through NCCL's send/recv: one hop, every peer at once for all-to-all.
        double hop = shape.nodes > 1 ? kHwLatNetRing[proto] : kHwLatNvlRing[proto];
        double volume = kind == CollectiveKind::kAllToAll ? (p - 1) / p * n : n;
        consider(CollectiveAlgorithm::kPairwise, proto, kBaseLatRing[proto] + hop, volume);
        break;
      }
    }
  }
  return best;
}

double CollectiveModel::message_efficiency(int64_t bytes, const GroupShape& shape) const {
  const spec::NetworkLevel* level =
      shape.nodes > 1 ? cluster_->network.cluster_level() : &cluster_->network.node_level();
  return level == nullptr ? 1.0 : level->efficiency_at(static_cast<double>(bytes));
}

CollectiveCost CollectiveModel::cost(CollectiveKind kind, int64_t bytes,
                                     const GroupShape& shape) const {
  const auto named = overrides_.find(kind);
  const bool flat_named =
      named != overrides_.end() && named->second != CollectiveAlgorithm::kHierarchical;
  if (const spec::CollectiveFit* fit = fit_for(kind, shape, bytes);
      fit != nullptr && (named == overrides_.end() || flat_named)) {
    // The fitted α and β of the level, through the formula of the algorithm they were fitted
    // with, so that a fit from small groups predicts larger ones; a plan that names another
    // algorithm gets the same α (a message) and β (a byte) through that one's formula (the
    // executor runs it from point-to-point messages on CPU ranks).
    if (flat_named && !supports(kind, named->second))
      return cost_of(kind, named->second, bytes, shape);  // refuses it, naming the key
    CollectiveCost c;
    c.algorithm = flat_named ? named->second : fitted_algorithm(kind);
    c.terms = flat_cost(kind, c.algorithm, shape.size, static_cast<double>(bytes),
                        AlphaBetaGamma{fit->alpha_us * 1e-6, fit->beta_us_per_byte * 1e-6, 0});
    c.protocol = "fitted";
    return c;
  }
  CollectiveCost c;
  if (named != overrides_.end()) {
    c = cost_of(kind, named->second, bytes, shape);
  } else if (cluster_->network.library == spec::CollectiveLibrary::kNccl) {
    c = nccl(kind, bytes, shape);
  } else {
    c = cheapest(kind, bytes, shape);
  }
  c.terms.bandwidth /= message_efficiency(bytes, shape);
  return c;
}

}  // namespace sextant::sim
