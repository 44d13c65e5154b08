// The planner's search on the command line, shared by `plan`, `scale` and `tune`: the flags of a
// search request and options, and the plan file the best plan is written as.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "sextant/planner/planner.hpp"
#include "stack_options.hpp"

namespace sextant::cli {

struct SearchFlags {
  std::string model;
  std::string cluster;
  int64_t global_batch = 0;
  int64_t seq_len = 0;
  std::vector<std::string> constraints;
  std::vector<std::string> compressions;
  std::string network = "analytic";
  std::string objective = "time";
  std::string dtype;
  int64_t leaders = 24;
  int64_t variants_per_layout = 4;
  int threads = 0;
  bool allow_tp_across_nodes = false;
  bool asynchronous_pipelines = false;
  bool gems = false;                                // --gems: GEMS' MAST searched too
  std::vector<int64_t> parameter_server_staleness;  // --parameter-server, each bound searched
  bool fixed_stack = false;
  bool per_op = false;
  bool json = false;
  bool quiet = false;
  StackFlags stack;
};

// Registers --model, --cluster, --global-batch and the search's other flags on `cmd`.
void add_search_flags(CLI::App& cmd, SearchFlags& f);
// The request for `gpus` devices; throws InputError naming the flag that is wrong.
planner::SearchRequest request_from(const SearchFlags& f, int64_t gpus);
// Fidelity, objective, leaders and progress lines (on a terminal, not with --json or --quiet).
planner::SearchOptions options_from(const SearchFlags& f);
// The plan file of `best`: the plan, its prediction and where it came from.
spec::Json plan_file_json(const planner::RankedPlan& best, const planner::SearchRequest& r);

}  // namespace sextant::cli
