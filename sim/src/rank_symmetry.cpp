// Colour refinement over the ranks, then the representatives' topology (rank_symmetry.hpp).
#include "sextant/sim/rank_symmetry.hpp"

#include <algorithm>
#include <bit>
#include <map>
#include <tuple>
#include <utility>

namespace sextant::sim {

namespace {

constexpr int kSlots = static_cast<int>(kGroupSlots);

// Interns values into dense ids in order of first appearance (deterministic).
template <typename T>
class Interner {
 public:
  int64_t id(const T& value) {
    auto [it, inserted] = ids_.try_emplace(value, static_cast<int64_t>(ids_.size()));
    return it->second;
  }
  int64_t size() const { return static_cast<int64_t>(ids_.size()); }

 private:
  std::map<T, int64_t> ids_;
};

// What the analytic network's price of a group or channel depends on.
using CostKey = std::tuple<int64_t, int64_t, int64_t, double>;
CostKey cost_key(const GroupShape& s, double link) {
  return {s.size, s.nodes, s.per_node, link};
}

}  // namespace

FoldedTopology fold_symmetric_ranks(const Topology& full, const spec::ClusterSpec& cluster) {
  const auto world = static_cast<int64_t>(full.ranks.size());
  // Prices, once: an id per distinct (shape, link factor) of groups and channels.
  Interner<CostKey> costs;
  std::vector<int64_t> group_cost(full.groups.size()), channel_cost(full.channels.size());
  for (size_t g = 0; g < full.groups.size(); ++g)
    group_cost[g] =
        costs.id(cost_key(full.groups[g].shape, link_factor(cluster, full.groups[g].members)));
  for (size_t c = 0; c < full.channels.size(); ++c) {
    const int64_t ends[2] = {full.channels[c].src, full.channels[c].dst};
    channel_cost[c] =
        costs.id(cost_key(group_shape(ends, cluster.devices_per_node), link_factor(cluster, ends)));
  }

  // Initial colours: program and speed.
  std::vector<int64_t> colour(static_cast<size_t>(world));
  {
    Interner<std::pair<int32_t, uint64_t>> initial;
    for (int64_t r = 0; r < world; ++r) {
      const RankSetup& s = full.ranks[static_cast<size_t>(r)];
      colour[static_cast<size_t>(r)] = initial.id({s.program, std::bit_cast<uint64_t>(s.speed)});
    }
  }
  // Refine until the number of colours stops growing (each round only splits classes, so at
  // most `world` rounds; regular layouts settle in two or three).
  int64_t colours = -1;
  for (;;) {
    // Each group's members as a multiset of colours.
    Interner<std::vector<int64_t>> member_sets;
    std::vector<int64_t> group_members(full.groups.size());
    std::vector<int64_t> counted;
    for (size_t g = 0; g < full.groups.size(); ++g) {
      counted.clear();
      for (int64_t m : full.groups[g].members) counted.push_back(colour[static_cast<size_t>(m)]);
      std::sort(counted.begin(), counted.end());
      group_members[g] = member_sets.id(counted);
    }
    Interner<std::vector<int64_t>> signatures;
    std::vector<int64_t> next(static_cast<size_t>(world));
    std::vector<int64_t> sig;
    for (int64_t r = 0; r < world; ++r) {
      const RankSetup& s = full.ranks[static_cast<size_t>(r)];
      sig.assign(1, colour[static_cast<size_t>(r)]);
      for (int k = 0; k < kSlots; ++k) {
        const int32_t g = s.groups[static_cast<size_t>(k)];
        sig.push_back(g < 0 ? -1 : group_cost[static_cast<size_t>(g)]);
        sig.push_back(g < 0 ? -1 : group_members[static_cast<size_t>(g)]);
      }
      for (int k = 0; k < kPeerSlots; ++k) {
        for (int32_t c :
             {s.send_channel[static_cast<size_t>(k)], s.recv_channel[static_cast<size_t>(k)]}) {
          if (c < 0) {
            sig.insert(sig.end(), {-1, -1});
            continue;
          }
          const ChannelSetup& ch = full.channels[static_cast<size_t>(c)];
          const int64_t peer = ch.src == r ? ch.dst : ch.src;
          sig.push_back(channel_cost[static_cast<size_t>(c)]);
          sig.push_back(colour[static_cast<size_t>(peer)]);
        }
      }
      next[static_cast<size_t>(r)] = signatures.id(sig);
    }
    colour.swap(next);
    if (signatures.size() == colours) break;
    colours = signatures.size();
  }

  FoldedTopology out;
  out.class_of.resize(static_cast<size_t>(world));
  out.class_ranks.resize(static_cast<size_t>(colours));
  for (int64_t r = 0; r < world; ++r) {
    // Colours are numbered in order of first appearance: a class's first rank is its smallest.
    out.class_of[static_cast<size_t>(r)] = static_cast<int32_t>(colour[static_cast<size_t>(r)]);
    out.class_ranks[static_cast<size_t>(colour[static_cast<size_t>(r)])].push_back(r);
  }
  auto cls = [&](int64_t rank) {
    return static_cast<int64_t>(out.class_of[static_cast<size_t>(rank)]);
  };

  // Folded groups: one per (slot, classes of the members with their counts); every real group
  // with that key is a copy of the others.
  std::map<std::pair<int, std::vector<std::pair<int64_t, int32_t>>>, int32_t> group_ids;
  std::map<std::tuple<int64_t, int64_t, int>, int32_t> channel_ids;
  auto folded_channel = [&](int32_t c, int send_slot) {
    const ChannelSetup& ch = full.channels[static_cast<size_t>(c)];
    auto key = std::make_tuple(cls(ch.src), cls(ch.dst), send_slot);
    auto [it, inserted] =
        channel_ids.try_emplace(key, static_cast<int32_t>(out.engine.channels.size()));
    if (inserted) {
      out.engine.channels.push_back({cls(ch.src), cls(ch.dst), ch.up});
      out.network_channels.push_back(ch);
    }
    return it->second;
  };
  for (int64_t k = 0; k < colours; ++k) {
    const int64_t rep = out.class_ranks[static_cast<size_t>(k)].front();
    const RankSetup& real = full.ranks[static_cast<size_t>(rep)];
    RankSetup folded = real;
    for (int slot = 0; slot < kSlots; ++slot) {
      const int32_t g = real.groups[static_cast<size_t>(slot)];
      if (g < 0) continue;
      const GroupSetup& group = full.groups[static_cast<size_t>(g)];
      std::map<int64_t, int32_t> counts;
      for (int64_t m : group.members) ++counts[cls(m)];
      std::vector<std::pair<int64_t, int32_t>> members(counts.begin(), counts.end());
      auto [it, inserted] = group_ids.try_emplace(std::make_pair(slot, members),
                                                  static_cast<int32_t>(out.engine.groups.size()));
      if (inserted) {
        GroupSetup fg;
        for (const auto& [c, n] : members) fg.members.push_back(c);
        fg.shape = group.shape;
        fg.represented = static_cast<int64_t>(group.members.size());
        out.engine.groups.push_back(std::move(fg));
        out.network_groups.push_back(group);
      }
      folded.groups[static_cast<size_t>(slot)] = it->second;
      folded.group_weight[static_cast<size_t>(slot)] = counts[k];
    }
    // The channel a rank sends on in slot s is received in the other slot (build_topology).
    for (int slot = 0; slot < kPeerSlots; ++slot) {
      if (real.send_channel[static_cast<size_t>(slot)] >= 0)
        folded.send_channel[static_cast<size_t>(slot)] =
            folded_channel(real.send_channel[static_cast<size_t>(slot)], slot);
      if (real.recv_channel[static_cast<size_t>(slot)] >= 0)
        folded.recv_channel[static_cast<size_t>(slot)] =
            folded_channel(real.recv_channel[static_cast<size_t>(slot)], slot ^ 1);
    }
    out.engine.ranks.push_back(folded);
  }
  return out;
}

}  // namespace sextant::sim
