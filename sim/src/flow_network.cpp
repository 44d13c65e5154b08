// Flow-level network: rounds of flows with equal sharing per link.
#include "sextant/sim/flow_network.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "sextant/spec/units.hpp"

namespace sextant::sim {

namespace {
constexpr double kBytesPerPsPerGBps = 1e-3;  // 1 GB/s = 1e9 B / 1e12 ps
}  // namespace

FlowNetwork::FlowNetwork(const spec::ClusterSpec& cluster, const CollectiveModel& model,
                         const std::vector<GroupSetup>& groups,
                         const std::vector<ChannelSetup>& channels)
    : cluster_(&cluster), model_(&model), groups_(&groups), channels_(&channels) {
  for (const GroupSetup& g : groups)
    for (int64_t r : g.members) world_ = std::max(world_, r + 1);
  for (const ChannelSetup& c : channels) world_ = std::max({world_, c.src + 1, c.dst + 1});
  const spec::NetworkLevel& node = cluster.network.node_level();
  auto factor = [&](const std::string& level, int64_t n, std::optional<int64_t> nic) {
    double f = 1.0;
    for (const spec::LinkOverride& o : cluster.link_overrides)
      if (o.level == level && o.node == n && (!o.nic || !nic || *o.nic == *nic)) f *= o.factor;
    return f;
  };
  // Device links: out and in for every rank.
  for (int64_t r = 0; r < world_; ++r) {
    double nominal = node.bandwidth_GBps * kBytesPerPsPerGBps;
    double cap = nominal * factor(node.name, r / cluster.devices_per_node, std::nullopt);
    links_.push_back({cap, nominal, 0});
    links_.push_back({cap, nominal, 0});
  }
  // NICs: out and in for every NIC of every node in use.
  if (const spec::NetworkLevel* net = cluster.network.cluster_level()) {
    int64_t nodes = (world_ + cluster.devices_per_node - 1) / cluster.devices_per_node;
    for (int64_t n = 0; n < nodes; ++n) {
      for (int64_t k = 0; k < net->nics_per_node; ++k) {
        double nominal = net->bandwidth_GBps * kBytesPerPsPerGBps / net->oversubscription;
        double cap = nominal * factor(net->name, n, k);
        links_.push_back({cap, nominal, 0});
        links_.push_back({cap, nominal, 0});
      }
    }
  }
  load_.assign(links_.size(), 0);
  rings_.resize(groups.size());
}

std::array<int32_t, 2> FlowNetwork::path(int64_t src, int64_t dst) const {
  const int64_t dpn = cluster_->devices_per_node;
  if (src / dpn == dst / dpn) {
    return {static_cast<int32_t>(2 * src), static_cast<int32_t>(2 * dst + 1)};
  }
  const spec::NetworkLevel* net = cluster_->network.cluster_level();
  SEXTANT_CHECK(net != nullptr, "no network across nodes in cluster {}", cluster_->name);
  const int64_t nics = net->nics_per_node;
  auto nic_link = [&](int64_t rank, int out_or_in) {
    int64_t nic = (rank % dpn) * nics / dpn;  // rail: the NIC next to the device
    int64_t index = (rank / dpn) * nics + nic;
    return static_cast<int32_t>(2 * world_ + 2 * index + out_or_in);
  };
  return {nic_link(src, 0), nic_link(dst, 1)};
}

std::vector<FlowNetwork::FlowSpec> FlowNetwork::ring_pattern(const GroupSetup& group) const {
  // Members per node, in rank order.
  std::map<int64_t, std::vector<int64_t>> by_node;
  for (int64_t r : group.members) by_node[r / cluster_->devices_per_node].push_back(r);
  std::vector<FlowSpec> flows;
  const int64_t per_node = group.shape.per_node;
  const int64_t channels = group.shape.nodes > 1 ? model_->channels(per_node) : 1;
  const double weight = 1.0 / static_cast<double>(channels);
  for (int64_t c = 0; c < channels; ++c) {
    // Channel c leaves every node through local member c (rotated ring, as NCCL's rings).
    std::vector<int64_t> order;
    for (const auto& [node, locals] : by_node) {
      const int64_t m = static_cast<int64_t>(locals.size());
      for (int64_t i = 1; i <= m; ++i) order.push_back(locals[static_cast<size_t>((c + i) % m)]);
    }
    for (size_t i = 0; i < order.size(); ++i)
      flows.push_back({order[i], order[(i + 1) % order.size()], weight});
  }
  return flows;
}

NetworkStart FlowNetwork::start_collective(int32_t group, spec::CollectiveKind kind, int64_t bytes,
                                           Picoseconds now) {
  progress(now);
  const GroupSetup& g = (*groups_)[static_cast<size_t>(group)];
  CollectiveCost cost = model_->cost(kind, bytes, g.shape);
  std::vector<Round> rounds;
  if (cost.algorithm == spec::CollectiveAlgorithm::kParameterServer && cost.protocol.empty()) {
    // Everyone sends to the server (the first member), then the server sends to everyone.
    Round up;
    Round down;
    for (size_t i = 1; i < g.members.size(); ++i) {
      up.flows.push_back({g.members[i], g.members[0], 1});
      down.flows.push_back({g.members[0], g.members[i], 1});
    }
    up.latency_s = down.latency_s = cost.terms.latency / 2;
    up.bandwidth_s = down.bandwidth_s = cost.terms.bandwidth / 2;
    rounds.push_back(std::move(up));
    rounds.push_back(std::move(down));
  } else {
    Round r;
    std::vector<FlowSpec>& ring = rings_[static_cast<size_t>(group)];
    if (ring.empty() && g.members.size() > 1) ring = ring_pattern(g);
    r.flows = ring;
    r.latency_s = cost.terms.latency;
    r.bandwidth_s = cost.terms.bandwidth;
    rounds.push_back(std::move(r));
  }
  add_op(Completion{false, group}, std::move(rounds), now);
  return {std::nullopt, spec::enum_name(spec::collective_algorithm_names(), cost.algorithm)};
}

NetworkStart FlowNetwork::start_transfer(int32_t channel, int64_t bytes, Picoseconds now) {
  progress(now);
  const ChannelSetup& c = (*channels_)[static_cast<size_t>(channel)];
  int64_t ranks[2] = {c.src, c.dst};
  CollectiveCost cost = model_->cost(spec::CollectiveKind::kSendRecv, bytes,
                                     group_shape(ranks, cluster_->devices_per_node));
  Round r;
  r.flows.push_back({c.src, c.dst, 1});
  r.latency_s = cost.terms.latency;
  r.bandwidth_s = cost.terms.bandwidth;
  std::vector<Round> rounds;
  rounds.push_back(std::move(r));
  add_op(Completion{true, channel}, std::move(rounds), now);
  return {std::nullopt, spec::enum_name(spec::collective_algorithm_names(), cost.algorithm)};
}

int32_t FlowNetwork::add_op(Completion who, std::vector<Round> rounds, Picoseconds now) {
  dirty_ = true;
  int32_t id;
  if (!free_ops_.empty()) {
    id = free_ops_.back();
    free_ops_.pop_back();
  } else {
    id = static_cast<int32_t>(ops_.size());
    ops_.emplace_back();
  }
  Op& op = ops_[static_cast<size_t>(id)];
  op.who = who;
  op.rounds = std::move(rounds);
  op.round = 0;
  op.active = true;
  begin_round(id, now);
  return id;
}

void FlowNetwork::begin_round(int32_t id, Picoseconds now) {
  Op& op = ops_[static_cast<size_t>(id)];
  op.waiting = true;
  op.wake = now + seconds_to_ps(op.rounds[op.round].latency_s);
}

void FlowNetwork::start_flows(int32_t id) {
  Op& op = ops_[static_cast<size_t>(id)];
  op.waiting = false;
  const Round& round = op.rounds[op.round];
  if (round.flows.empty() || round.bandwidth_s <= 0) {
    op.pending = 0;
    return;
  }
  // Size the flows so that, alone on a network without overrides, the round lasts bandwidth_s:
  // the slowest flow (weight / its idle rate with only this round's flows sharing the links)
  // sets the scale. Degraded links then slow the flows that cross them.
  std::vector<std::array<int32_t, 2>>& paths = paths_;
  paths.clear();
  for (const FlowSpec& f : round.flows) {
    paths.push_back(path(f.src, f.dst));
    for (int32_t l : paths.back()) ++load_[static_cast<size_t>(l)];
  }
  double slowest = 0;
  for (size_t i = 0; i < round.flows.size(); ++i) {
    double rate = std::numeric_limits<double>::infinity();
    for (int32_t l : paths[i])
      rate = std::min(rate, links_[static_cast<size_t>(l)].nominal / load_[static_cast<size_t>(l)]);
    slowest = std::max(slowest, round.flows[i].weight / rate);
  }
  for (const std::array<int32_t, 2>& p : paths)
    for (int32_t l : p) load_[static_cast<size_t>(l)] = 0;
  const double scale = static_cast<double>(seconds_to_ps(round.bandwidth_s)) / slowest;
  for (size_t i = 0; i < round.flows.size(); ++i) {
    Flow f;
    f.remaining = round.flows[i].weight * scale;
    f.links = paths[i];
    f.op = id;
    flows_.push_back(f);
    for (int32_t l : f.links) ++links_[static_cast<size_t>(l)].active;
  }
  op.pending = static_cast<int32_t>(round.flows.size());
}

void FlowNetwork::recompute_rates() {
  for (Flow& f : flows_) {
    double rate = std::numeric_limits<double>::infinity();
    for (int32_t l : f.links) {
      const Link& link = links_[static_cast<size_t>(l)];
      rate = std::min(rate, link.capacity / link.active);
    }
    f.rate = rate;
  }
}

void FlowNetwork::progress(Picoseconds now) {
  if (now > now_) {
    double dt = static_cast<double>(now - now_);
    for (Flow& f : flows_) f.remaining -= f.rate * dt;
  }
  now_ = std::max(now_, now);
}

std::optional<Picoseconds> FlowNetwork::next_event() const {
  if (!dirty_) return next_;
  dirty_ = false;
  std::optional<Picoseconds> next;
  for (const Op& op : ops_) {
    if (op.active && op.waiting && (!next || op.wake < *next)) next = op.wake;
  }
  // The first flow to end: ceil is monotone, so the least of the rounded-up times is the least
  // time rounded up once.
  double soonest = std::numeric_limits<double>::infinity();
  for (const Flow& f : flows_) soonest = std::min(soonest, std::max(0.0, f.remaining) / f.rate);
  if (!flows_.empty()) {
    Picoseconds t = now_ + static_cast<Picoseconds>(std::ceil(soonest));
    if (!next || t < *next) next = t;
  }
  next_ = next;
  return next;
}

void FlowNetwork::advance(Picoseconds now, std::vector<Completion>& finished) {
  dirty_ = true;
  progress(now);
  bool changed = false;
  // Finish flows that have (up to rounding) no bytes left.
  for (size_t i = 0; i < flows_.size();) {
    Flow& f = flows_[i];
    if (f.remaining <= f.rate * 0.5 + 1e-9) {
      for (int32_t l : f.links) --links_[static_cast<size_t>(l)].active;
      Op& op = ops_[static_cast<size_t>(f.op)];
      op.pending -= 1;
      flows_[i] = flows_.back();
      flows_.pop_back();
      changed = true;
    } else {
      ++i;
    }
  }
  for (size_t id = 0; id < ops_.size(); ++id) {
    Op& op = ops_[id];
    if (!op.active) continue;
    if (op.waiting && op.wake <= now) {
      start_flows(static_cast<int32_t>(id));
      changed = true;
    }
    if (!op.waiting && op.pending == 0) {
      if (op.round + 1 < op.rounds.size()) {
        op.round += 1;
        begin_round(static_cast<int32_t>(id), now);
        if (op.wake <= now) {
          start_flows(static_cast<int32_t>(id));
          changed = true;
        }
      }
      if (!op.waiting && op.pending == 0 && op.round + 1 >= op.rounds.size()) {
        op.active = false;
        finished.push_back(op.who);
        free_ops_.push_back(static_cast<int32_t>(id));
      }
    }
  }
  if (changed) recompute_rates();
}

}  // namespace sextant::sim
