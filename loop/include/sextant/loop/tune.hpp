// `sextant tune`: the budgeted trial loop. Of K candidate plans (the planner's best predictions),
// run the one predicted fastest, fit the cluster file to every run so far (fit_runs: the same fit
// and refusal as `sextant calibrate`), predict the candidates again, and repeat while a candidate
// not yet run could still beat the measured best: its prediction, less the prediction's
// uncertainty, under the best measured time. The uncertainty is closed_loop's rule for plans whose
// rank is open: twice the RMS error of the fitted predictions on the runs plus the noise of a run.
// A candidate whose layout (all but its micro-batch) already ran is expected at the fit's
// prediction scaled by that run's measured-over-predicted ratio: plans of one layout run the same
// collectives, so the fit's error on one is the best guess of its error on the other; its margin
// is the noise plus twice the RMS error such guesses made before their own runs.
// The trial count (and device-hours) a grid of every candidate would cost is what tuning saves.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "sextant/loop/rounds.hpp"
#include "sextant/loop/trial.hpp"
#include "sextant/spec/cluster_spec.hpp"

namespace sextant::loop {

struct TuneOptions {
  int64_t max_trials = 0;       // 0: no limit but the candidates (a grid at most)
  double max_device_hours = 0;  // 0: no limit; else no trial starts once this is spent
  int64_t steps = 8;            // training steps per trial
  double noise = 0.03;          // a trial's relative noise: two runs of one plan differ by this
  spec::Dtype fit_dtype = spec::Dtype::kFp32;  // the precision the trials' ops ran in
  std::string dir;  // the trials' files and the record (tune.json) an interrupted tune resumes
  std::function<void(const std::string&)> say;  // progress lines (may be empty)
};

struct TuneTrial {
  size_t candidate = 0;       // index into the candidates
  PlanTime time;              // measured (and status) of its run, retried when disturbed
  double wall_s = 0;          // the trial's wall time, start-up included
  double device_hours = 0;    // wall x ranks
  double expected_s = 0;      // what tuning expected of it when it chose it
  bool layout_guess = false;  // that expectation came from a run of its layout
};

struct TuneReport {
  std::vector<double> predicted_before_s;  // with the cluster tuning started from
  std::vector<double> predicted_after_s;   // with the last fit that was not refused
  std::vector<TuneTrial> trials;           // in the order run
  int64_t resumed_trials = 0;              // read from the record, not run again
  std::optional<size_t> chosen;            // the measured best trial (none when none ran)
  bool converged = false;                  // no candidate left that could beat the measured best
  std::string stopped;                     // why it stopped, in words
  // Per candidate at the end: the expected time (measured, or guessed from a run of its layout,
  // or the fit's prediction) and its relative margin; a candidate not run is left out when its
  // expected time less the margin is above the measured best.
  std::vector<double> expected_s, margin;
  std::vector<bool> layout_guess;
  double layout_margin = 0;      // noise + 2 x RMS error of the in-layout guesses before their runs
  double new_layout_margin = 0;  // noise + 2 x RMS error of the fit on the runs
  spec::ClusterSpec cluster;     // calibrated (the base when no fit held)
  std::string fit_refused;       // why the last fit was not taken ("" when it was)
  double device_hours = 0;       // the trials' (resumed ones included)
  double grid_device_hours = 0;  // every candidate once: measured walls, the rest estimated
};

TuneReport tune(const spec::ClusterSpec& base, const std::vector<TrialPlan>& candidates,
                Machine& machine, const TuneOptions& options);

}  // namespace sextant::loop
