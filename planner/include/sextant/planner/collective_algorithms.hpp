// A plan's collective algorithms chosen by simulated time, where the executor can run them as
// named: MPI ranks on CPU cores (exec/src/comm/p2p_collectives.hpp;
// spec::executor_runs_collective). Starting from the library's own choice, each collective kind the
// step uses tries every algorithm the executor runs for it (coordinate descent over kinds, as
// channel_algorithms.hpp does over convolutions); a name is kept only where it shortens the
// simulated step by at least kNamedAlgorithmGain, because the library's choice is what a fitted
// cluster measured and a named one is priced from the same α and β through its own formula. The
// chosen map rides in the plan (Plan::collective_algorithms). On GPU clusters NCCL picks its own:
// nothing is named.
#pragma once

#include <cstdint>

#include "sextant/sim/simulator.hpp"
#include "sextant/spec/cluster_spec.hpp"
#include "sextant/spec/model_spec.hpp"
#include "sextant/spec/plan.hpp"

namespace sextant::planner {

// The least share of the step a named algorithm must save to be kept.
inline constexpr double kNamedAlgorithmGain = 0.01;

struct CollectiveChoice {
  spec::Plan plan;               // collective_algorithms set to the kept names
  sim::SimulationResult result;  // of `plan`
  double library_step_s = 0;     // the step with the library choosing every algorithm
  int64_t simulations = 0;
};

// Whether a plan on `cluster` may name its collective algorithms: the executor runs named ones
// from MPI point-to-point messages on CPU ranks only.
bool names_collective_algorithms(const spec::ClusterSpec& cluster);

// `plan` with its collective algorithms chosen by simulated step time (the plan's own names are
// dropped first), at most `passes` passes over the kinds. On a cluster that does not name them,
// `plan` simulated once and returned as it is.
CollectiveChoice choose_collective_algorithms(const spec::ModelSpec& model,
                                              const spec::ClusterSpec& cluster, spec::Plan plan,
                                              const sim::SimulationOptions& options,
                                              int passes = 2);

}  // namespace sextant::planner
