// The flow network: each collective or transfer becomes rounds of flows on links (every device's
// node-level link out and in, every NIC out and in). Active flows share each link equally and run
// at the rate of their most loaded link, so DP, TP and PP traffic crossing the same NIC slow each
// other down. A round's flows are sized so that on an otherwise idle network the round takes
// exactly the closed-form time of the analytic model: the two fidelities agree when nothing
// competes.
#pragma once

#include <array>
#include <vector>

#include "sextant/sim/network.hpp"
#include "sextant/spec/cluster_spec.hpp"

namespace sextant::sim {

class FlowNetwork : public Network {
 public:
  FlowNetwork(const spec::ClusterSpec& cluster, const CollectiveModel& model,
              const std::vector<GroupSetup>& groups, const std::vector<ChannelSetup>& channels);

  NetworkStart start_collective(int32_t group, spec::CollectiveKind kind, int64_t bytes,
                                Picoseconds now) override;
  NetworkStart start_transfer(int32_t channel, int64_t bytes, Picoseconds now) override;
  std::optional<Picoseconds> next_event() const override;
  void advance(Picoseconds now, std::vector<Completion>& finished) override;

  // Links, for tests: capacity in bytes per picosecond.
  int64_t link_count() const { return static_cast<int64_t>(links_.size()); }

 private:
  struct FlowSpec {
    int64_t src = 0;
    int64_t dst = 0;
    double weight = 1;  // relative size; scaled so the idle round takes its closed-form time
  };
  struct Round {
    std::vector<FlowSpec> flows;
    double latency_s = 0;
    double bandwidth_s = 0;
  };
  struct Op {
    Completion who;
    std::vector<Round> rounds;
    size_t round = 0;
    int32_t pending = 0;
    bool waiting = false;  // in the latency part of the current round
    Picoseconds wake = 0;
    bool active = false;
  };
  struct Flow {
    double remaining = 0;  // bytes
    double rate = 0;       // bytes per ps
    std::array<int32_t, 2> links{};
    int32_t op = 0;
  };
  struct Link {
    double capacity = 0;  // bytes per ps, with the cluster's link overrides
    double nominal = 0;   // without overrides: what the closed-form cost assumes
    int32_t active = 0;
  };

  std::array<int32_t, 2> path(int64_t src, int64_t dst) const;
  std::vector<FlowSpec> ring_pattern(const GroupSetup& group) const;
  int32_t add_op(Completion who, std::vector<Round> rounds, Picoseconds now);
  void begin_round(int32_t op, Picoseconds now);
  void start_flows(int32_t op);
  void progress(Picoseconds now);
  void recompute_rates();

  const spec::ClusterSpec* cluster_;
  const CollectiveModel* model_;
  const std::vector<GroupSetup>* groups_;
  const std::vector<ChannelSetup>* channels_;
  int64_t world_ = 0;
  std::vector<Link> links_;
  std::vector<Flow> flows_;
  std::vector<Op> ops_;
  std::vector<int32_t> free_ops_;
  // Each group's ring flows, made on its first collective (none for a group of one).
  std::vector<std::vector<FlowSpec>> rings_;
  // start_flows' scratch: a round's paths, and flows per link (all zero between calls).
  std::vector<std::array<int32_t, 2>> paths_;
  std::vector<int32_t> load_;
  Picoseconds now_ = 0;
  // next_event() is asked after every engine event; it is recomputed only after a change.
  mutable bool dirty_ = true;
  mutable std::optional<Picoseconds> next_;
};

}  // namespace sextant::sim
