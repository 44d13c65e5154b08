// Runs trials of plans as child `sextant run` jobs with a time limit (loop::ProcessMachine).
#include "verify.hpp"

#include <fmt/format.h>

#include <filesystem>

#include "sextant/loop/process_machine.hpp"

namespace sextant::cli {

std::vector<Trial> verify(const std::vector<planner::RankedPlan>& ranked, int64_t top,
                          const VerifyOptions& o) {
  std::filesystem::create_directories(o.work_dir);
  loop::ProcessMachineOptions machine_options;
  machine_options.sextant = loop::self_executable();
  machine_options.timeout_s = o.timeout_s;
  loop::ProcessMachine machine(machine_options);
  std::vector<Trial> trials;
  for (size_t i = 0; i < ranked.size() && static_cast<int64_t>(i) < top; ++i) {
    Trial t;
    t.plan = ranked[i].plan;
    t.predicted_s = ranked[i].report.step_time_s;
    const loop::RunResult r = machine.run({t.plan.name(), o.model, t.plan, false}, o.steps,
                                          fmt::format("{}/trial{}", o.work_dir, i + 1));
    t.status = r.status;
    if (r.ok()) t.measured_s = r.mean_step_s();
    t.trace_file = r.trace_file;
    trials.push_back(std::move(t));
  }
  return trials;
}

}  // namespace sextant::cli
