// The real machine: each trial is `sextant run --np N --plan FILE` started as a child process (in
// its own process group, killed with its ranks when it runs past its time limit), the cores'
// quiet check is `sextant bench cores --reference FILE`, and the benchmark a `sextant bench`
// command. Child processes, not calls into the executor: a trial that crashes or hangs costs
// the loop one row, not the loop (and the loop links no MPI).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "sextant/loop/trial.hpp"

namespace sextant::loop {

struct ProcessMachineOptions {
  std::string sextant;                  // the sextant executable (the running one: self_executable)
  std::vector<std::string> run_args;    // added to every `sextant run` (--backend cuda ...)
  std::vector<std::string> bench_args;  // `sextant bench ...` without --trace; empty: none
  std::string cores_reference;          // `bench cores --reference` file; "": no quiet check
  bool co_run = false;                  // measure `bench cores --co-run` (CPU ranks)
  double timeout_s = 300;               // per trial
};

class ProcessMachine : public Machine {
 public:
  explicit ProcessMachine(ProcessMachineOptions options) : options_(std::move(options)) {}
  RunResult run(const TrialPlan& trial, int64_t steps, const std::string& base) override;
  std::string disturbance() override;
  void pause(double seconds) override;
  bool benchmark(const std::string& path) override;
  bool co_run(const std::string& path) override;

 private:
  ProcessMachineOptions options_;
};

// The path of the running executable (/proc/self/exe).
std::string self_executable();

// The last non-empty line of `file` ("" when it has none or cannot be read): a child's verdict.
std::string last_line(const std::string& file);

// Runs `args` (args[0] looked up in PATH) in its own process group with stdout and stderr to
// `log`, and kills the group after `timeout_s`. The exit status, or nullopt on timeout.
std::optional<int> run_child(const std::vector<std::string>& args, const std::string& log,
                             double timeout_s);

}  // namespace sextant::loop
