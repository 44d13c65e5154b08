// A dense transformer plan's per-op splits chosen by step time (issue 60; spec/per_op_plan.hpp),
// starting from the uniform plan, so the result is never slower than it.
//
// The search is coordinate descent over the block's ops (FlexFlow searched with MCMC over a
// simulator with delta simulation, Jia et al. SysML'19 §5): for each op in turn, every split of
// its dimensions over the plan's d x t mesh is estimated in closed form (planner's Estimator,
// microseconds each), the best estimate is simulated, and it is kept when the simulated step is at
// least kOpSplitGain shorter and fits memory; then the next op, for at most `passes` passes. The
// block has ten ops whose splits every block shares, so the neighbourhood is small enough to scan
// whole: no random walk is needed to reach any of it, and the result is deterministic. Each
// change kept is reported with the step it saved and what it did to the block's collectives and
// weights.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "sextant/models/conv_split_bound.hpp"
#include "sextant/sim/simulator.hpp"
#include "sextant/spec/cluster_spec.hpp"
#include "sextant/spec/model_spec.hpp"
#include "sextant/spec/plan.hpp"

namespace sextant::planner {

// The least share of the step a change of an op's split must save to be kept.
inline constexpr double kOpSplitGain = 0.005;

struct OpSplitChange {
  std::string op;
  std::string from, to;  // the op's splits, as "b:d,a:t"
  double step_before_s = 0, step_after_s = 0;
  std::string why;  // the block's collectives and weights before and after
};

struct OpSplitChoice {
  spec::Plan plan;               // per_op set to the kept splits (empty: none pays)
  sim::SimulationResult result;  // of `plan`
  double uniform_step_s = 0;
  std::vector<OpSplitChange> changes;
  int64_t estimates = 0, simulations = 0;
  // A CNN plan's convolutions, each bounded (models/conv_split_bound.hpp): the search splits a
  // CNN's fc layers only, and these say whether a split of any convolution could pay at all.
  std::vector<models::ConvSplitBound> conv_bounds;
};

// Whether per-op splits apply to `plan` of `model` (a dense transformer, no layout they refuse).
bool splits_ops(const spec::ModelSpec& model, const spec::Plan& plan);

// `plan` with its block ops' splits chosen (the plan's own per_op dropped first). Where per-op
// splits do not apply, `plan` simulated once and returned as it is. `progress` (may be empty) is
// told each op tried: (ops tried, ops to try). `allowed` (may be empty) says which plans a move
// may lead to: those the executor runs, for a search whose plans it will run.
OpSplitChoice choose_op_splits(const spec::ModelSpec& model, const spec::ClusterSpec& cluster,
                               spec::Plan plan, const sim::SimulationOptions& options,
                               int passes = 2,
                               const std::function<void(int64_t, int64_t)>& progress = {},
                               const std::function<bool(const spec::Plan&)>& allowed = {});

}  // namespace sextant::planner
