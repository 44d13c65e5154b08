// The analytic network: closed-form collective times, cached, scaled by link overrides.
#include <algorithm>
#include <cmath>
#include <set>

#include "sextant/sim/network.hpp"

namespace sextant::sim {

double link_factor(const spec::ClusterSpec& cluster, std::span<const int64_t> ranks) {
  if (cluster.link_overrides.empty()) return 1.0;
  std::set<int64_t> nodes;
  for (int64_t r : ranks) nodes.insert(r / cluster.devices_per_node);
  const spec::NetworkLevel* level =
      nodes.size() > 1 ? cluster.network.cluster_level() : &cluster.network.node_level();
  double factor = 1.0;
  for (const spec::LinkOverride& o : cluster.link_overrides) {
    if (level != nullptr && o.level == level->name && nodes.count(o.node) > 0)
      factor = std::min(factor, o.factor);
  }
  return factor;
}

AnalyticNetwork::AnalyticNetwork(const spec::ClusterSpec& cluster, const CollectiveModel& model,
                                 const std::vector<GroupSetup>& groups,
                                 const std::vector<ChannelSetup>& channels)
    : model_(&model), groups_(&groups) {
  for (const GroupSetup& g : groups) group_link_factor_.push_back(link_factor(cluster, g.members));
  for (const ChannelSetup& c : channels) {
    int64_t ranks[2] = {c.src, c.dst};
    channel_shapes_.push_back(group_shape(ranks, cluster.devices_per_node));
    channel_link_factor_.push_back(link_factor(cluster, ranks));
  }
}

AnalyticNetwork::Cached AnalyticNetwork::cost(const GroupShape& shape, spec::CollectiveKind kind,
                                              int64_t bytes) {
  Key key{shape, kind, bytes};
  auto it = cache_.find(key);
  if (it != cache_.end()) return it->second;
  CollectiveCost c = model_->cost(kind, bytes, shape);
  Cached v{c.terms, spec::enum_name(spec::collective_algorithm_names(), c.algorithm)};
  cache_.emplace(key, v);
  return v;
}

Picoseconds AnalyticNetwork::duration(const Cached& c, double link_factor) {
  return seconds_to_ps(c.terms.latency + c.terms.bandwidth / link_factor);
}

NetworkStart AnalyticNetwork::start_collective(int32_t group, spec::CollectiveKind kind,
                                               int64_t bytes, Picoseconds now) {
  Cached c = cost((*groups_)[static_cast<size_t>(group)].shape, kind, bytes);
  return {now + duration(c, group_link_factor_[static_cast<size_t>(group)]), c.algorithm};
}

NetworkStart AnalyticNetwork::start_transfer(int32_t channel, int64_t bytes, Picoseconds now) {
  Cached c =
      cost(channel_shapes_[static_cast<size_t>(channel)], spec::CollectiveKind::kSendRecv, bytes);
  return {now + duration(c, channel_link_factor_[static_cast<size_t>(channel)]), c.algorithm};
}

}  // namespace sextant::sim
