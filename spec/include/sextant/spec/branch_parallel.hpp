// SUPER's sub-graph parallelism (Jain et al., "SUPER: SUb-Graph Parallelism for TransformERs",
// IPDPS 2021) on Inception's modules (plan key `branch_parallel`): the tp ranks of a layer
// group split each module's parallel branches between them and run them at once. Every rank
// holds the module's whole input and runs the other layers (stem, pools, classifier) whole, as
// replicas do; a module's branches live on their owner alone, with their parameters. The join
// gathers each rank's branch outputs (an all-gather of uneven parts), and backward sums each
// rank's part of the module's input gradient (an all-reduce). The one home of the rules and the
// placement: the plan check, the lowering and the executor ask it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sextant/spec/model_spec.hpp"

namespace sextant::spec {

struct Plan;

// The most ranks a module's branches split over: Inception's modules have 3 or 4 branches.
constexpr int64_t kMaxBranchRanks = 4;

// What keeps `plan` from splitting `model`'s branches, or "": a CNN with Inception modules
// (AmoebaNet's cells are not split: their nodes read each other's states), 1 < tp <= 4, and no
// spatial split, channel algorithms or per-op splits (the maps stay whole).
std::string branch_parallel_problem(const ModelSpec& model, const Plan& plan);

// The multiply-adds of one sample through each branch of module `l` reading `in` (its
// convolutions'; pools count none), in branch order.
std::vector<double> inception_branch_macs(const CnnLayer& l, const CnnMap& in);
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
