// Symmetric ranks, simulated once. In a regular layout most ranks are copies of each other: the
// 64 ranks of a pipeline stage of GPT-3 175B at tp 8 x dp 8 run the same program at the same
// speed, in tensor- and data-parallel groups of the same shape, with peers of the same kind, so
// under the analytic network (a collective's time depends only on its group's shape and links,
// not on what else is in flight) they start and finish every task at the same times. Folding
// each class of such ranks onto one representative leaves the simulated times unchanged and
// divides the events by the class size (1024 ranks -> 16 for that layout).
//
// The classes are the coarsest equitable partition (colour refinement, as in graph isomorphism
// testing: Weisfeiler & Leman 1968): ranks start coloured by (program, speed), and a colour is
// split until every rank of a class has, in each group slot, a group of the same cost with the
// same number of members of each class, and in each channel slot a channel of the same cost to
// a peer of the same class. A straggler, a slow link or an irregular placement simply makes more
// classes. The flow network is not folded: its flows share links with every other transfer.
#pragma once

#include <cstdint>
#include <vector>

#include "sextant/sim/engine.hpp"
#include "sextant/sim/network.hpp"
#include "sextant/spec/cluster_spec.hpp"

namespace sextant::sim {

struct Topology {
  std::vector<RankSetup> ranks;
  std::vector<GroupSetup> groups;
  std::vector<ChannelSetup> channels;
};

struct FoldedTopology {
  // One rank per class; group members and channel ends are class indices, each group member
  // weighted (RankSetup::group_weight) by the ranks of its class in the group it stands for.
  Topology engine;
  // For each folded group and channel, one real group or channel it stands for (real ranks and
  // shapes: what the network prices).
  std::vector<GroupSetup> network_groups;
  std::vector<ChannelSetup> network_channels;
  std::vector<int32_t> class_of;                  // real rank -> class
  std::vector<std::vector<int64_t>> class_ranks;  // class -> its real ranks, ascending
};

// The classes of `full` (see above) and the topology of their representatives.
FoldedTopology fold_symmetric_ranks(const Topology& full, const spec::ClusterSpec& cluster);

}  // namespace sextant::sim
