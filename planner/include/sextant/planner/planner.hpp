// `plan`: enumerate the legal plans, drop those that do not fit in memory, rank the rest with the
// closed-form estimate, simulate the leaders event by event in parallel on all cores, and rank
// them by simulated step time (or cost).
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "sextant/planner/estimator.hpp"
#include "sextant/planner/op_splits.hpp"
#include "sextant/planner/search_space.hpp"
#include "sextant/sim/simulator.hpp"
#include "sextant/spec/report.hpp"

namespace sextant::planner {

// time: the fastest step; cost: GPU-seconds per step (the same order at one GPU count; `scale`
// compares counts); memory: the most headroom (least peak memory), then time.
enum class Objective { kTime, kCost, kMemory };

struct SearchOptions {
  sim::Fidelity fidelity = sim::Fidelity::kAnalytic;
  int64_t top_k = 5;
  // Leaders simulated in full, in order of their estimate; 0 simulates every plan that fits.
  int64_t leaders = 24;
  // Of the leaders, at most this many variants of one layout (the same plan but for its stack
  // knobs and recomputed layers, whose estimates sit within the estimator's error of each
  // other): the leaders span more layouts. 0: no limit (the leaders are the best estimates).
  int64_t variants_per_layout = 4;
  int threads = 0;  // 0: all cores
  Objective objective = Objective::kTime;
  // A CNN plan with a channel split (tp > 1) among the best: its convolutions' algorithms chosen
  // by simulated time (channel_algorithms.hpp) instead of the byte rule, then ranked again.
  bool choose_channel_algorithms = true;
  // On CPU ranks over MPI, each of the best plans' collective algorithms chosen by simulated time
  // where a named one beats the library's own (collective_algorithms.hpp), then ranked again.
  bool choose_collective_algorithms = true;
  // Dense transformer plans among the best: their block ops' splits chosen by step time
  // (op_splits.hpp; `plan --per-op`), never slower than the uniform plan, then ranked again.
  bool choose_op_splits = false;
  std::function<void(int64_t, int64_t)> op_split_progress;  // (moves done, total), one thread
  // Called with (done, total) while leaders are simulated.
  std::function<void(int64_t, int64_t)> progress;
  // Called with (done, total) while the configurations are estimated (from one thread at a time).
  std::function<void(int64_t, int64_t)> estimate_progress;
};

struct RankedPlan {
  spec::Plan plan;
  spec::Report report;
  double estimate_s = 0;
};

// The reason SearchResult::rejected counts plans under when they do not fit in device memory
// (the other reasons are the layout rules of search_space.hpp).
inline constexpr const char* kDoesNotFit = "does not fit in device memory";

// What the per-op search changed in one ranked plan (SearchOptions::choose_op_splits).
struct OpSplitRefinement {
  std::string uniform;  // the plan's name before
  std::string chosen;   // after (the same when no change paid)
  double uniform_step_s = 0, chosen_step_s = 0;
  std::vector<OpSplitChange> changes;
  int64_t estimates = 0, simulations = 0;
  std::vector<models::ConvSplitBound> conv_bounds;  // a CNN's (OpSplitChoice::conv_bounds)
  int64_t replicas = 1;                             // the plan's dp: what they would split over
  // The chosen plan's data-parallel communication not hidden behind compute: the most that fewer
  // gradient bytes could take off its step.
  double exposed_dp_s = 0;
};

struct SearchResult {
  std::vector<RankedPlan> ranked;            // best first, at most top_k
  std::vector<OpSplitRefinement> op_splits;  // with choose_op_splits: one per plan it applies to
  std::vector<RankedPlan> pareto;            // of the simulated plans that fit: time vs memory
  int64_t considered = 0;                    // (dp, tp, pp) factorisations looked at
  std::map<std::string, int64_t> rejected;   // reason -> count (layout rules, memory)
  // reason -> what its count counts (search_space.hpp's kLayouts ... kConfigurations).
  std::map<std::string, std::string> rejected_units;
  int64_t enumerated = 0;         // legal plans before the memory check
  int64_t stack_variants = 0;     // of those, running a variant of the request's stack
  int64_t partial_recompute = 0;  // of those, recomputing only the first layers of each chunk
  spec::Stack stack;    // the request's stack (the plans may turn overlap knobs down: tuned_knobs)
  int64_t fitting = 0;  // of those, predicted to fit
  int64_t simulated = 0;
  double wall_s = 0;
  // Where the wall time went, and on how many threads the estimates and simulations ran.
  double enumerate_s = 0;
  double estimate_s = 0;
  double simulate_s = 0;
  int threads = 1;
  // When nothing fits: the least device memory any plan needs (of those whose offloaded state
  // fits in host memory), and the smallest GPU count (within the
  // cluster, same batch) at which some plan fits.
  int64_t least_memory_bytes = 0;
  std::optional<int64_t> gpus_that_fit;
};

// Throws InputError for a request that cannot be planned (bad counts, unknown names).
SearchResult search(const SearchRequest& request, const SearchOptions& options);

// KARMA sizes its reload window to the free device memory (Wahib et al., SC'20 §III-C): each
// candidate reloading its swapped blocks as many blocks ahead as it recomputes whose estimate
// does not fit the device takes the widest window of at least 2 that does
// (Candidate::reload_window), its estimate replaced; search() runs it after the estimates.
void size_reload_windows(const SearchRequest& request, Enumeration& all,
                         std::vector<Estimate>& estimates);

}  // namespace sextant::planner
