// SUPER's sub-graph parallelism (Jain et al., "SUPER: SUb-Graph Parallelism for TransformERs",
// IPDPS 2021) on multi-branch units (plan key `branch_parallel`): the tp ranks of a layer group
// split each unit's independent sub-graphs between them and run them at once: an Inception
// module's branches, an AmoebaNet cell's groups of nodes (spec::amoeba_node_groups) after both
// inputs' reductions, which every rank runs. Every rank holds the unit's whole input and runs the
// other layers (stem, pools, classifier) whole, as replicas do; a sub-graph lives on its owner
// alone, with its parameters. The join gathers each rank's outputs (an all-gather of uneven
// parts), and backward sums each rank's part of the gradients every rank holds (an all-reduce:
// a module's input, a cell's reduced inputs). The one home of the rules and the placement: the
// plan check, the lowering and the executor ask it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sextant/spec/model_spec.hpp"

namespace sextant::spec {

struct Plan;

// The most ranks a unit's sub-graphs split over: Inception's modules have 3 or 4 branches, a
// normal AmoebaNet cell 3 groups of nodes and a joined reduced input.
constexpr int64_t kMaxBranchRanks = 4;

// What keeps `plan` from splitting `model`'s branches, or "": a CNN with Inception modules or
// AmoebaNet cells, 1 < tp <= 4, and no spatial split, channel algorithms, per-op splits or grid
// (the maps stay whole).
std::string branch_parallel_problem(const ModelSpec& model, const Plan& plan);

// What each branch of module `l` reading `in` makes, in branch order: its output map (module e's
// split outputs joined) and the multiply-adds of one sample through its convolutions (pools count
// none).
struct BranchOutput {
  CnnMap map;
  double macs = 0;
};
std::vector<BranchOutput> inception_branch_outputs(const CnnLayer& l, const CnnMap& in);
// Their multiply-adds alone.
std::vector<double> inception_branch_macs(const CnnLayer& l, const CnnMap& in);
// Where an AmoebaNet cell's work runs when its sub-graphs (spec::amoeba_node_groups) are split:
// each group's multiply-adds for one sample (its edges' convolutions on reduced states of h x w),
// each node's rank (its group's) and, for each joined state, the rank whose part of the join
// carries it (a reduced input, which every rank holds, goes to the least loaded one).
struct CellPlacement {
  std::vector<double> group_macs;
  std::vector<int64_t> node_owner;
  std::vector<int64_t> join_owner;  // by position in the genotype's concat
  int64_t most_loaded = 0;          // the rank of most multiply-adds
};
CellPlacement amoeba_placement(const CnnLayer& l, int64_t h, int64_t w, int64_t ranks);

// Which of `ranks` ranks runs each branch of a module whose branches cost `macs`: the longest
// processing time first rule (Graham 1969), each branch, costliest first, to the least loaded
// rank, ties to the lower rank and the earlier branch. Deterministic: every rank computes it.
std::vector<int64_t> branch_owners(const std::vector<double>& macs, int64_t ranks);
// The rank whose branches cost the most multiply-adds (ties: the lower), which a module's join
// waits for: the one the simulator and the planner price.
int64_t most_loaded_rank(const std::vector<double>& macs, const std::vector<int64_t>& owners,
                         int64_t ranks);
// The elements each rank's all-gather part carries when each rank sends the elements `parts`
// says: the largest part, the collective's padded block (NCCL's all-gather moves equal blocks;
// MPI_Allgatherv's ring is paced by the largest).
int64_t branch_gather_block(const std::vector<int64_t>& parts);

}  // namespace sextant::spec
