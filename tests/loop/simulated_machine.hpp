// For the loop's tests: a machine whose runs are simulations (no timing), and scratch directories.
#pragma once

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "sextant/loop/trial.hpp"
#include "sextant/models/zoo.hpp"
#include "sextant/sim/simulator.hpp"
#include "sextant/spec/json_io.hpp"
#include "sextant/spec/stack.hpp"

namespace sextant::loop {

// An empty directory of this name under the system's temporary directory.
inline std::string fresh_dir(const std::string& name) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("sextant-loop-" + name)).string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// A machine whose runs are simulations on a true cluster the loop does not know: every step takes
// the simulated step time, and the trace holds the simulated ops, as a run's would.
class SimulatedMachine : public Machine {
 public:
  explicit SimulatedMachine(spec::ClusterSpec truth) : truth_(std::move(truth)) {}
  RunResult run(const TrialPlan& trial, int64_t steps, const std::string& base) override {
    const spec::ModelSpec model = models::resolve_model(trial.model);
    sim::SimulationOptions options;
    options.trace = true;
    const sim::SimulationResult r = sim::simulate(model, truth_, trial.plan, options);
    // A spell of the machine: this run's every op and step take `scale` times the truth's.
    const double scale = time_scale ? time_scale(trial, runs) : 1.0;
    spec::Trace t = *r.trace;
    for (spec::TraceEvent& e : t.events) {
      e.start_ps = static_cast<Picoseconds>(static_cast<double>(e.start_ps) * scale);
      e.duration_ps = static_cast<Picoseconds>(static_cast<double>(e.duration_ps) * scale);
    }
    const double step_s = r.report.step_time_s * scale;
    t.kind = "measured";
    t.metadata = {{"model", model.name},
                  {"model_json", spec::to_json(model)},
                  {"plan", trial.plan.name()},
                  {"plan_json", spec::to_json(trial.plan)},
                  {"stack", spec::kExecutorStack},
                  {"dtype", "fp32"},
                  {"ranks", trial.plan.world_size()},
                  {"step_time_s", step_s}};
    spec::write_trace_file(base + ".measured.json", t);
    {
      std::ofstream log(base + ".steps.jsonl");
      for (int64_t s = 0; s < steps; ++s)
        log << spec::Json{{"step", s}, {"step_time_s", step_s}}.dump() << "\n";
    }
    ++runs;
    return read_run(base);
  }
  std::string disturbance() override { return ""; }
  void pause(double) override {}
  bool benchmark(const std::string&) override { return false; }
  int runs = 0;
  // How much longer than the truth's a run takes, given the plan and the runs before it (none: 1).
  std::function<double(const TrialPlan&, int)> time_scale;

 private:
  spec::ClusterSpec truth_;
};

}  // namespace sextant::loop
