// Which ranks and steps a written trace keeps (`--trace-ranks`, `--trace-steps` of `simulate` and
// `run`): one Llama-70B step on 64 GPUs is 6.6 M events (1.7 GB of JSON), more than a trace viewer
// opens comfortably, while most questions need one rank per pipeline stage or a few steps.
#pragma once

#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "sextant/spec/plan.hpp"
#include "sextant/spec/trace.hpp"

namespace sextant::spec {

struct TraceSelection {
  std::vector<int64_t> ranks;                      // sorted, unique; empty: every rank
  std::vector<std::pair<int64_t, int64_t>> steps;  // inclusive ranges; empty: every step

  bool keeps_everything() const { return ranks.empty() && steps.empty(); }
  bool keeps_rank(int64_t rank) const;
  bool keeps_step(int64_t step) const;
  bool keeps(const TraceEvent& e) const { return keeps_rank(e.rank) && keeps_step(e.step); }
};

// `ranks`: comma-separated items, each a rank, a range "A-B", "last" (the highest rank),
// "stages" (the first rank of every pipeline stage: data- and tensor-parallel index 0) or
// "replicas" (the first rank of every data-parallel replica: tensor index 0, first stage); ""
// keeps every rank. Ranks are numbered as spec/rank_layout.hpp does. `steps`: comma-separated
// steps or ranges "A-B" (from 0), "" keeps every step. Throws InputError naming --trace-ranks or
// --trace-steps for anything else or a rank outside the plan.
TraceSelection parse_trace_selection(std::string_view ranks, std::string_view steps,
                                     const Plan& plan);

// Drops the events `selection` does not keep.
void apply(const TraceSelection& selection, Trace& trace);

}  // namespace sextant::spec
