// Time of a collective on a group of ranks of a cluster: the group's shape (ranks per node, nodes)
// picks the link parameters of the hierarchical network; the algorithm is the plan's override, or
// the one the cluster's collective library would choose: the cheapest formula (MPI-style tuned
// choice) or NCCL's own tuning model (ring or tree, LL / LL128 / Simple protocols).
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string_view>

#include "sextant/sim/collective_cost.hpp"
#include "sextant/spec/cluster_spec.hpp"
#include "sextant/spec/collective.hpp"

namespace sextant::sim {

// The shape of a communicator: `size` ranks on `nodes` nodes, `per_node` on each (uniform).
struct GroupShape {
  int64_t size = 1;
  int64_t nodes = 1;
  int64_t per_node = 1;
  bool operator<(const GroupShape& o) const {
    return std::tie(size, nodes, per_node) < std::tie(o.size, o.nodes, o.per_node);
  }
};
GroupShape group_shape(std::span<const int64_t> ranks, int64_t devices_per_node);

enum class NcclProtocol { kLL, kLL128, kSimple };
std::string_view nccl_protocol_name(NcclProtocol p);

struct CollectiveCost {
  CostTerms terms;
  double seconds() const { return terms.total(); }
  spec::CollectiveAlgorithm algorithm = spec::CollectiveAlgorithm::kRing;
  std::string_view protocol;  // NCCL protocol when the NCCL model chose, "fitted" for calibrated
};

class CollectiveModel {
 public:
  CollectiveModel(const spec::ClusterSpec& cluster,
                  std::map<spec::CollectiveKind, spec::CollectiveAlgorithm> overrides);

  // Cost with the plan's override, else the library's choice, with the level's measured
  // message-size efficiency applied. Throws InputError when an override does not implement
  // `kind`.
  CollectiveCost cost(spec::CollectiveKind kind, int64_t bytes, const GroupShape& shape) const;
  // Cost of one named algorithm with the α-β-γ formulas.
  CollectiveCost cost_of(spec::CollectiveKind kind, spec::CollectiveAlgorithm algorithm,
                         int64_t bytes, const GroupShape& shape) const;
  // The cheapest α-β-γ algorithm (what a tuned MPI picks).
  CollectiveCost cheapest(spec::CollectiveKind kind, int64_t bytes, const GroupShape& shape) const;
  // NCCL's choice and time (tuning constants of NCCL's src/graph/tuning.cc).
  CollectiveCost nccl(spec::CollectiveKind kind, int64_t bytes, const GroupShape& shape) const;

  // Link parameters of a group: one node's links, or the network across nodes.
  AlphaBetaGamma intra_node() const { return intra_; }
  AlphaBetaGamma across_nodes(const GroupShape& shape) const;
  // Per-rank bandwidth (bytes/s) of a ring across nodes for a group with `per_node` ranks on each
  // node. NCCL runs one ring per channel and rotates the rings so that each channel leaves the node
  // through a different local rank's NIC (rail-aligned): with C channels each NIC carries 1/C of
  // the data and each node-internal link (C-1)/C of it, so the bandwidth is
  // min(C * nic, C/(C-1) * link) -- what the flow model finds on an idle network.
  double inter_node_bandwidth(int64_t per_node) const;
  // Measured fraction of the bandwidth a message of `bytes` gets on the group's level.
  double message_efficiency(int64_t bytes, const GroupShape& shape) const;
  // Rings (channels) a group with `per_node` ranks per node runs across nodes: one per NIC its
  // local ranks sit next to.
  int64_t channels(int64_t per_node) const;

 private:
  // The calibrated fit for a message of `bytes`: the one with the smallest bound that holds it,
  // else (larger than every bound) the one with the largest bound.
  const spec::CollectiveFit* fit_for(spec::CollectiveKind kind, const GroupShape& shape,
                                     int64_t bytes) const;

  const spec::ClusterSpec* cluster_;
  std::map<spec::CollectiveKind, spec::CollectiveAlgorithm> overrides_;
  AlphaBetaGamma intra_;
};

}  // namespace sextant::sim
