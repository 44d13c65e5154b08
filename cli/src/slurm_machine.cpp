// Trials as Slurm jobs (slurm_machine.hpp).
#include "slurm_machine.hpp"

#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <thread>
#include <utility>

#include "sextant/interop/training_log.hpp"
#include "sextant/loop/process_machine.hpp"
#include "sextant/spec/json_io.hpp"
#include "slurm_submit.hpp"

namespace sextant::cli {

namespace {}  // namespace

// The stack's log as the step lines `sextant run --log-json` writes: a time per logged step.
void SlurmMachine::write_logged_steps(const std::string& log, const spec::Plan& plan,
                                      const std::string& out) const {
  const interop::TrainingLog steps = interop::read_training_log(spec::read_text_file(log), log);
  const interop::StepSize size = interop::step_size(plan, options_.model);
  std::string lines;
  for (const interop::LogStep& s : steps.steps)
    if (const double t = interop::step_seconds(s, size.samples, size.tokens, size.devices); t > 0)
      lines += spec::Json{{"step", s.step}, {"step_time_s", t}}.dump() + "\n";
  spec::write_file_atomically(out, lines);
}

loop::RunResult SlurmMachine::run(const loop::TrialPlan& trial, int64_t steps,
                                  const std::string& base) {
  for (const char* ext : {".steps.jsonl", ".measured.json", ".disturbed"})
    std::filesystem::remove(base + ext);
  const std::string absolute = std::filesystem::absolute(base).lexically_normal().string();
  interop::SlurmRequest r = options_.request;
  const int64_t ranks = trial.plan.world_size();
  r.job_name = interop::job_name("sextant-" + std::filesystem::path(base).filename().string());
  r.directory = std::filesystem::path(absolute).parent_path().string();
  r.nodes = (ranks + options_.devices_per_node - 1) / options_.devices_per_node;
  r.ranks_per_node = ranks / r.nodes;
  r.gpus = options_.gpus;
  r.output = absolute + ".log";
  const std::string script = absolute + ".sbatch";
  loop::RunResult failed;
  try {
    if (ranks % r.nodes != 0)
      throw std::runtime_error(fmt::format("{} ranks do not fill {} nodes of {} alike", ranks,
                                           r.nodes, options_.devices_per_node));
    if (options_.exporter) {
      spec::write_file_atomically(
          script, interop::sbatch_script(
                      r, interop::StackJob{options_.exporter(trial.plan, steps), options_.entry}));
      sbatch(script, true);
      write_logged_steps(r.output, trial.plan, base + ".steps.jsonl");
    } else {
      interop::SextantJob job{
          options_.sextant,
          {"--model", trial.model, "--backend", options_.gpus ? "cuda" : "cpu", "--steps",
           std::to_string(steps), "--quiet", "--trace", absolute + ".measured.json"},
          spec::to_json(trial.plan).dump(2) + "\n",
          !options_.gpus};
      if (!options_.cores_reference.empty())
        job.core_check = {
            options_.sextant,
            "bench",
            "cores",
            "--repeats",
            "2",
            "--reference",
            std::filesystem::absolute(options_.cores_reference).lexically_normal().string()};
      spec::write_file_atomically(script, interop::sbatch_script(r, job));
      const std::string id = sbatch(script, true);
      // The job wrote its steps as NAME-JOBID.steps.jsonl: where read_run looks for them.
      const std::string stem = fmt::format("{}/{}-{}", r.directory, r.job_name, id);
      std::filesystem::rename(stem + ".steps.jsonl", base + ".steps.jsonl");
      if (!options_.cores_reference.empty()) {
        // What the checks around the ranks found, for disturbance() to tell.
        std::ifstream in(stem + ".cores");
        for (std::string line; std::getline(in, line);)
          if (!line.empty()) cores_verdict_ += (cores_verdict_.empty() ? "" : "; ") + line;
      }
    }
  } catch (const std::exception& e) {
    failed.status = fmt::format("failed: {}", e.what());
    return failed;
  }
  return loop::read_run(base);
}

std::string SlurmMachine::disturbance() {
  // The checks ran inside the last trial's job (interop::SextantJob::core_check): their verdict,
  // told once. Between trials nothing is probed, so there is nothing new to tell.
  return std::exchange(cores_verdict_, "");
}

void SlurmMachine::pause(double seconds) {
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
}

}  // namespace sextant::cli
