// How unevenly a measured mixture of experts loaded its expert-parallel ranks: the quantity the
// simulator prices dispatch, combine and the experts' GEMMs at (models::moe_load_factor, the
// model's moe.load_imbalance), taken from a run's trace. The executor records on each forward
// moe.dispatch the rows the rank received (the event's shape, {rows, hidden}); for every
// dispatch -- one (step, layer, micro-batch) on one ep group (spec::RankLayout::ep_group) -- the
// most loaded rank's rows over the group's mean, averaged over the dispatches.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "sextant/spec/trace.hpp"

namespace sextant::traces {

struct MoeLoadMeasure {
  double imbalance = 0;    // mean over the dispatches of max / mean received rows
  double worst = 0;        // the largest of them
  int64_t dispatches = 0;  // (step, layer, micro-batch, ep group) measured, every rank present
};

// None when the trace holds no forward moe.dispatch with its received rows (no expert
// parallelism, or a trace from before they were recorded). Needs the run's plan in the metadata
// (plan_json, as `sextant run --trace` writes it); throws InputError naming `source` without.
std::optional<MoeLoadMeasure> moe_load_imbalance(const spec::Trace& trace,
                                                 const std::string& source);

}  // namespace sextant::traces
