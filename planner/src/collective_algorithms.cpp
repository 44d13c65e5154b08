// Collective algorithms by simulated time (collective_algorithms.hpp).
#include "sextant/planner/collective_algorithms.hpp"

#include <set>

#include "sextant/spec/executor_support.hpp"
#include "sextant/spec/trace.hpp"

namespace sextant::planner {

namespace {

// Whether the executor refuses `plan`'s collective algorithms (its other refusals aside: a plan it
// cannot run at all is still priced with the names it would run).
bool algorithm_refused(const spec::ModelSpec& model, const spec::Plan& plan,
                       const spec::ExecutorRun& run) {
  for (const Problem& p : spec::executor_problems(model, plan, run))
    if (p.pointer.starts_with("/collective_algorithms")) return true;
  return false;
}

}  // namespace

bool names_collective_algorithms(const spec::ClusterSpec& cluster) {
  return cluster.device.kind == spec::DeviceKind::kCpu &&
         cluster.network.library == spec::CollectiveLibrary::kMpi;
}

CollectiveChoice choose_collective_algorithms(const spec::ModelSpec& model,
                                              const spec::ClusterSpec& cluster, spec::Plan plan,
                                              const sim::SimulationOptions& options, int passes) {
  CollectiveChoice out;
  auto step_of = [&](const spec::Plan& p, bool trace) {
    ++out.simulations;
    sim::SimulationOptions o = options;
    o.trace = trace;
    return sim::simulate(model, cluster, p, o);
  };
  if (!names_collective_algorithms(cluster)) {
    out.result = step_of(plan, options.trace);
    out.library_step_s = out.result.report.step_time_s;
    out.plan = std::move(plan);
    return out;
  }
  plan.collective_algorithms.clear();
  // The kinds the step runs, read from its trace.
  sim::SimulationResult best = step_of(plan, true);
  std::set<spec::CollectiveKind> kinds;
  for (const spec::TraceEvent& e : best.trace->events)
    if (std::optional<spec::CollectiveKind> kind = spec::collective_of(e.op_class))
      kinds.insert(*kind);
  if (!options.trace) best.trace.reset();
  out.library_step_s = best.report.step_time_s;
  const spec::ExecutorRun run = spec::executor_run(spec::ExecutorBackend::kCpu);
  spec::Plan trial = plan;
  for (int pass = 0; pass < passes; ++pass) {
    bool improved = false;
    for (spec::CollectiveKind kind : kinds) {
      for (const auto& [name, algorithm] : spec::collective_algorithm_names()) {
        if (!spec::executor_runs_collective(kind, algorithm)) continue;
        const auto kept = plan.collective_algorithms.find(kind);
        if (kept != plan.collective_algorithms.end() && kept->second == algorithm) continue;
        trial.collective_algorithms = plan.collective_algorithms;
        trial.collective_algorithms[kind] = algorithm;
        // (Recursive halving and doubling need a power-of-two group: the executor's table.)
        if (algorithm_refused(model, trial, run)) continue;
        sim::SimulationResult r = step_of(trial, false);
        if (r.report.step_time_s <
            best.report.step_time_s - kNamedAlgorithmGain * out.library_step_s) {
          best = std::move(r);
          plan.collective_algorithms = trial.collective_algorithms;
          improved = true;
        }
      }
    }
    if (!improved) break;
  }
  if (options.trace && !best.trace) best = step_of(plan, true);
  out.plan = std::move(plan);
  out.result = std::move(best);
  return out;
}

}  // namespace sextant::planner
