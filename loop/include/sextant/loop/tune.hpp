// `sextant tune`: the budgeted trial loop. Of K candidate plans (the best predictions of each
// layout), run the one expected fastest, fit the cluster file to every run so far (fit_runs: the
// same fit and refusal as `sextant calibrate`), expect the candidates again, and repeat until the
// expected best is the measured best within the noise: no candidate not yet run could beat the
// best measured time by more than a run's noise, even were it as much faster than expected as the
// last candidates of its kind (a layout's guess, a new layout's prediction) turned out to be. A
// candidate whose layout (all but its micro-batch) already ran is expected at the fit's prediction
// scaled by that run's measured-over-predicted ratio: plans of one layout run the same collectives,
// so the fit's error on one is the best guess of its error on the other. Before it stops, a
// measured best resting on one run that beat the fit of the other trials by more than the noise
// (and that fit's own error) runs again, and a candidate's time is its runs' upper median: one fast
// spell of the machine does not end the search. What a grid of every candidate would cost is what
// tuning saves.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "sextant/loop/rounds.hpp"
#include "sextant/loop/trial.hpp"
#include "sextant/spec/cluster_spec.hpp"

namespace sextant::loop {

struct TuneOptions {
  int64_t max_trials = 0;       // 0: no limit (each candidate runs once, a surprising best twice)
  double max_device_hours = 0;  // 0: no limit; else no trial starts once this is spent
  int64_t steps = 8;            // training steps per trial
  double noise = 0.03;          // a trial's relative noise: two runs of one plan differ by this
  spec::Dtype fit_dtype = spec::Dtype::kFp32;  // the precision the trials' ops ran in
  std::string dir;  // the trials' files and the record (tune.json) an interrupted tune resumes
  double quiet_wait_s = 120;  // per trial: seconds it may wait for quiet cores (RoundOptions)
  std::function<void(const std::string&)> say;  // progress lines (may be empty)
};

// The record an interrupted tune resumes from: tune.json in o.dir.
std::string tune_record_path(const TuneOptions& o);

struct TuneTrial {
  size_t candidate = 0;       // index into the candidates
  PlanTime time;              // measured (and status) of its run, retried when disturbed
  double wall_s = 0;          // the trial's wall time, start-up included
  double device_hours = 0;    // wall x ranks
  double expected_s = 0;      // what tuning expected of it when it chose it
  bool layout_guess = false;  // that expectation came from a run of its layout
  bool calibrated = false;    // and from a fit to earlier trials (not the starting file alone)
  int64_t round = 1;          // its candidate's how-manieth run (files: run_base(dir, name, round))
  bool confirms = false;      // a second run of a measured best whose one run surprised
};

struct TuneReport {
  std::vector<double> predicted_before_s;  // with the cluster tuning started from
  std::vector<double> predicted_after_s;   // with the last fit that was not refused
  std::vector<TuneTrial> trials;           // in the order run
  int64_t resumed_trials = 0;              // read from the record, not run again
  // Per candidate: the trial its time is taken from, the upper median of its trials (of two, the
  // slower: a confirmation that disagrees overrules the run it confirms); none when none ran.
  std::vector<std::optional<size_t>> candidate_trial;
  std::optional<size_t> chosen;  // the measured best trial (none when none ran)
  bool converged = false;        // no candidate left that could beat the measured best
  std::string stopped;           // why it stopped, in words
  // Per candidate at the end: the expected time (measured; or guessed from a run of its layout,
  // layout_guess; or the fit's prediction).
  std::vector<double> expected_s;
  std::vector<bool> layout_guess;
  double fit_error = 0;  // RMS relative error of the fit's predictions of its own runs
  // How much faster than expected the last two trials of each kind ran (a layout's guess, a new
  // layout's prediction): the larger of their expected / measured - 1, 0 when both ran slower;
  // none before one was checked. A candidate not run stays in while its expected time, less its
  // kind's doubt (0.9 when none), beats the measured best by more than the noise. One-sided:
  // expectations that proved optimistic are no reason to think a candidate runs faster.
  std::optional<double> layout_guess_doubt, new_layout_doubt;
  spec::ClusterSpec cluster;  // fitted to the longest run of first trials whose fit holds (or base)
  std::string fit_refused;    // why the last fit was not taken ("" when it was)
  double device_hours = 0;    // the trials' (resumed ones included)
  double grid_device_hours = 0;  // every candidate once: measured walls, the rest estimated
};

// A plan's layout: what it runs apart from its micro-batch size (and recompute and stack knobs).
std::string layout_of(const spec::Plan& plan);

// `count` candidates from `ranked` (best predicted first) that span its layouts: the best plan of
// each layout in rank order, then the next best plans. Indices into `ranked`.
std::vector<size_t> spanning_candidates(const std::vector<spec::Plan>& ranked, size_t count);

TuneReport tune(const spec::ClusterSpec& base, const std::vector<TrialPlan>& candidates,
                Machine& machine, const TuneOptions& options);

}  // namespace sextant::loop
