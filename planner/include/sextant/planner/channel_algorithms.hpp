// A CNN's channel split with each convolution's algorithm chosen by simulated time. The byte rule
// (spec::channel_algorithm) picks whichever of stationary-x, -y and -w moves fewest bytes; Dryden
// et al. (SC'19 §IV) choose per layer from a performance model, since the collectives' groups
// (stationary-w's two run inside and across nodes) and the GEMM shapes each algorithm leaves
// (x: every filter over C/tp channels; y: F/tp filters over all; w: F/g over C/r) cost different
// times for the same bytes. Starting from the byte rule's choices, each convolution in turn tries
// the others its tp allows, keeping a change when the simulated step is shorter (coordinate
// descent); passes repeat until one changes nothing. The chosen list rides in the plan
// (Plan::channel_algorithms), which the lowering and the executor follow.
#pragma once

#include <cstdint>

#include "sextant/sim/simulator.hpp"
#include "sextant/spec/cluster_spec.hpp"
#include "sextant/spec/model_spec.hpp"
#include "sextant/spec/plan.hpp"

namespace sextant::planner {

struct ChannelChoice {
  spec::Plan plan;               // with channel_algorithms set when some choice beat the byte rule
  sim::SimulationResult result;  // of `plan`
  double byte_rule_step_s = 0;   // the step with every convolution on the byte rule
  int64_t simulations = 0;
  int64_t changed = 0;  // convolutions running another algorithm than the byte rule's
};

// `plan` (a CNN with tp > 1; any other plan is simulated once and returned as it is) with its
// convolutions' algorithms chosen by simulated step time, at most `passes` passes.
ChannelChoice choose_channel_algorithms(const spec::ModelSpec& model,
                                        const spec::ClusterSpec& cluster, spec::Plan plan,
                                        const sim::SimulationOptions& options, int passes = 2);

}  // namespace sextant::planner
