// What the engine asks of a network model: when does a collective or a point-to-point transfer
// that starts now finish. The analytic network answers at once from closed forms; the flow network
// answers later, as its flows share links with whatever else is in flight.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string_view>
#include <tuple>
#include <vector>

#include "sextant/sim/collective_model.hpp"
#include "sextant/spec/units.hpp"

namespace sextant::sim {

struct GroupSetup {
  std::vector<int64_t> members;
  GroupShape shape;
  int64_t represented = 0;  // real ranks, when members are folded classes (0: the members)
  int64_t size() const {
    return represented > 0 ? represented : static_cast<int64_t>(members.size());
  }
};

struct ChannelSetup {
  int64_t src = 0;
  int64_t dst = 0;
  bool up = false;  // GEMS' second replica's: on the pp-send-up and pp-recv-up streams
};

// A finished collective (group id) or transfer (channel id).
struct Completion {
  bool transfer = false;
  int32_t id = 0;
};

// The bandwidth factor of the slowest link a set of ranks uses (cluster overrides): the node
// level's factor when they share a node, else the slowest NIC factor among their nodes.
double link_factor(const spec::ClusterSpec& cluster, std::span<const int64_t> ranks);

struct NetworkStart {
  std::optional<Picoseconds> end;  // known at once (analytic)
  std::string_view algorithm;      // for the trace
};

class Network {
 public:
  virtual ~Network() = default;
  virtual NetworkStart start_collective(int32_t group, spec::CollectiveKind kind, int64_t bytes,
                                        Picoseconds now) = 0;
  virtual NetworkStart start_transfer(int32_t channel, int64_t bytes, Picoseconds now) = 0;
  // Networks that finish work later: the time of their next completion, and the completions
  // at `now` (called with the time next_event returned).
  virtual std::optional<Picoseconds> next_event() const { return std::nullopt; }
  virtual void advance(Picoseconds now, std::vector<Completion>& finished) {
    (void)now;
    (void)finished;
  }
};

// Closed-form costs from the CollectiveModel, cached per (group shape, collective, bytes).
class AnalyticNetwork : public Network {
 public:
  AnalyticNetwork(const spec::ClusterSpec& cluster, const CollectiveModel& model,
                  const std::vector<GroupSetup>& groups, const std::vector<ChannelSetup>& channels);
  NetworkStart start_collective(int32_t group, spec::CollectiveKind kind, int64_t bytes,
                                Picoseconds now) override;
  NetworkStart start_transfer(int32_t channel, int64_t bytes, Picoseconds now) override;

 private:
  const CollectiveModel* model_;
  const std::vector<GroupSetup>* groups_;
  std::vector<GroupShape> channel_shapes_;
  struct Key {
    GroupShape shape;
    spec::CollectiveKind kind;
    int64_t bytes;
    bool operator<(const Key& o) const {
      if (shape < o.shape) return true;
      if (o.shape < shape) return false;
      return std::tie(kind, bytes) < std::tie(o.kind, o.bytes);
    }
  };
  struct Cached {
    CostTerms terms;
    std::string_view algorithm;
  };
  std::map<Key, Cached> cache_;
  std::vector<double> group_link_factor_;  // slowest link override among a group's members
  std::vector<double> channel_link_factor_;
  Cached cost(const GroupShape& shape, spec::CollectiveKind kind, int64_t bytes);
  static Picoseconds duration(const Cached& c, double link_factor);
};

}  // namespace sextant::sim
