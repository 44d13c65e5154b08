// `simulate`: one training step of a model on a cluster under a plan, every rank and event
// simulated, as a Report and optionally a trace in the shared schema.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "sextant/sim/engine.hpp"
#include "sextant/spec/cluster_spec.hpp"
#include "sextant/spec/model_spec.hpp"
#include "sextant/spec/plan.hpp"
#include "sextant/spec/report.hpp"
#include "sextant/spec/trace.hpp"

namespace sextant::sim {

enum class Fidelity { kAnalytic, kFlow };
spec::EnumNames<Fidelity> fidelity_names();

struct SimulationOptions {
  Fidelity fidelity = Fidelity::kAnalytic;
  bool trace = false;
  // The ranks the trace keeps (sorted; empty: every rank). Only these are recorded: the events
  // of 1024 copies of the symmetric ranks' programs took 6.7 GB for GPT-3 175B with 24
  // micro-batches, and more than the machine had with 96.
  std::vector<int64_t> trace_ranks;
  std::string plan_source = "plan";  // names the plan in error messages
  EngineProgress progress;           // the engine's tasks done / total, for a progress line
  // Analytic fidelity: simulate each class of symmetric ranks once (rank_symmetry.hpp); the
  // result is the same, off only for checking that.
  bool fold_symmetric_ranks = true;
  // Itemize the most loaded stage's memory (spec::MemoryBreakdown::explained).
  bool explain_memory = false;
};

struct SimulationResult {
  spec::Report report;
  std::optional<spec::Trace> trace;
  std::vector<RankTimes> ranks;
  int64_t critical_rank = 0;
};

// Throws InputError when the plan does not fit the model, the cluster or its rules.
SimulationResult simulate(const spec::ModelSpec& model, const spec::ClusterSpec& cluster,
                          const spec::Plan& plan, const SimulationOptions& options);

}  // namespace sextant::sim
