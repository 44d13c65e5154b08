// The plans no other plan beats on both step time and memory: the answer to "how fast, and at
// what memory headroom" when the fastest plan leaves too little room (a longer sequence later,
// fragmentation, a framework's own buffers). At one GPU count a step's cost is its time times the
// GPUs, so time and cost order plans alike and the front is two-dimensional.
#pragma once

#include <vector>

#include "sextant/planner/planner.hpp"

namespace sextant::planner {

// The plans of `plans` that no other plan beats on both simulated step time and peak memory
// (equal on both counts as beaten only by an earlier one), fastest first.
std::vector<RankedPlan> pareto_front(const std::vector<RankedPlan>& plans);

}  // namespace sextant::planner
