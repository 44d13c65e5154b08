// Trials as Slurm jobs (`sextant tune --slurm`): each trial is the batch script of `launch --slurm`
// for Sextant's executor (or, with an exporter, for the stack it is exported to), submitted with
// `sbatch --wait`, its steps (and Sextant's measured trace) written where loop::read_run finds
// them. The cores' quiet check, where asked for, runs inside each trial's job on its first node,
// before and after the ranks: `bench cores --reference` (the first node's cores stand for a
// trial's others); disturbance() tells what the last trial's checks found.
#pragma once

#include <functional>
#include <string>

#include "sextant/interop/slurm.hpp"
#include "sextant/loop/trial.hpp"

namespace sextant::cli {

struct SlurmMachineOptions {
  interop::SlurmRequest request;  // partition, account, time; name, directory and size per trial
  int64_t devices_per_node = 1;   // of the cluster: a trial's ranks fill nodes of this many
  bool gpus = false;              // the ranks are GPUs (--backend cuda, --gpus-per-node)
  std::string sextant;            // the executable, as the nodes see it
  // A stack's trial instead (launch --to): the plan's settings for `steps` steps, and the stack's
  // entry point (launch --script). Its step times come from the job's log (training_log.hpp);
  // it writes no trace, so nothing is fitted to it.
  std::function<interop::Exported(const spec::Plan& plan, int64_t steps)> exporter;
  std::string entry;
  spec::ModelSpec model;  // what the stack's trials train (their logs' throughput to step times)
  std::string cores_reference;  // `bench cores --reference` file; "": no quiet check
};

class SlurmMachine : public loop::Machine {
 public:
  explicit SlurmMachine(SlurmMachineOptions options) : options_(std::move(options)) {}
  loop::RunResult run(const loop::TrialPlan& trial, int64_t steps,
                      const std::string& base) override;
  std::string disturbance() override;
  void pause(double seconds) override;
  bool benchmark(const std::string&) override { return false; }

 private:
  void write_logged_steps(const std::string& log, const spec::Plan& plan,
                          const std::string& out) const;
  SlurmMachineOptions options_;
  std::string cores_verdict_;  // what the last trial's core checks found ("": quiet)
};

}  // namespace sextant::cli
