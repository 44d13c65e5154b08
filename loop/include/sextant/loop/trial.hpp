// A plan run for real, and the machine that runs it. The loop (closed_loop.hpp) and
// `sextant plan --verify` ask a Machine to train plans and to say whether its cores are quiet; the
// real one starts `sextant run` as child processes (process_machine.hpp), a test's simulates them,
// so the loop's logic is tested without timing anything.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "sextant/spec/plan.hpp"
#include "sextant/spec/step_times.hpp"

namespace sextant::loop {

struct TrialPlan {
  std::string name;      // what reports call it, e.g. "dp2.mb8"
  std::string model;     // as `sextant run --model` takes it: a zoo name or a file
  spec::Plan plan;       // with the stack and dtype its prediction uses
  bool heldout = false;  // predicted by the fit, not fitted on
};

// The warm-up rule is spec's (the executor's trace metadata follows it too).
using spec::mean_step_after_warmup;

struct RunResult {
  std::string status;  // "ok", "timed out after N s", "failed (exit N): last line of its log"
  std::vector<double> step_times_s;
  std::string trace_file;  // the run's measured trace ("" when it wrote none)
  std::string disturbed;   // why the machine was not quiet around the run ("" when it was)
  bool ok() const { return status == "ok"; }
  std::optional<double> mean_step_s() const { return mean_step_after_warmup(step_times_s); }
};

class Machine {
 public:
  virtual ~Machine() = default;
  // Trains `trial` for `steps` steps. `base` names its files: base + ".steps.jsonl" (one JSON
  // object per step with step_time_s), ".measured.json" (the trace), ".log".
  virtual RunResult run(const TrialPlan& trial, int64_t steps, const std::string& base) = 0;
  // "" when every core runs at its undisturbed speed now, else what is slow.
  virtual std::string disturbance() = 0;
  // Waits `seconds` (for a disturbance to pass).
  virtual void pause(double seconds) = 0;
  // Measures what the fit needs beside the runs (collectives, GEMMs) into the trace file `path`;
  // false when this machine has nothing to measure.
  virtual bool benchmark(const std::string& path) = 0;
  // Measures how much slower a device computes while the node's others compute too
  // (`sextant bench cores --co-run --json`'s object) into `path`; false when this machine does
  // not (its devices compute independently, or it cannot tell).
  virtual bool co_run(const std::string& path) {
    (void)path;
    return false;
  }
};

// A run's results as its files hold them (`--refit` reads earlier runs): the steps, the trace
// when it exists, and base + ".disturbed" when the run was marked disturbed.
RunResult read_run(const std::string& base);

}  // namespace sextant::loop
