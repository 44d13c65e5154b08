// The loop as one call: measure a set of plans on a machine (rounds.hpp), fit the cluster file to
// the fit plans' runs (fit_runs: the same fit, check and refusal as `sextant calibrate`), predict
// every plan with the cluster before and after the fit, and report how far the predictions of the
// held-out plans are from what they measured, how well the predictions rank the plans (Kendall's
// tau) and what picking the predicted best costs (regret). `sextant loop` (and through it
// scripts/calibrate-local.sh and the notebook) calls it; tests run it on a simulated machine.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "sextant/loop/rounds.hpp"
#include "sextant/loop/run_fit.hpp"
#include "sextant/loop/trial.hpp"
#include "sextant/spec/cluster_spec.hpp"
#include "sextant/spec/json_io.hpp"
#include "sextant/traces/compare.hpp"

namespace sextant::loop {

struct LoopSetup {
  spec::ClusterSpec cluster;  // the cluster file the loop calibrates
  std::vector<TrialPlan> plans;
  std::string compare_plan;  // a plan compared with its prediction op class by op class ("": none)
  spec::Dtype fit_dtype = spec::Dtype::kFp32;  // the precision the runs' ops ran in
  // The precision the runs compute in, for their predictions. The plans the machine runs carry
  // none: the executor's backend and its --precision decide (it refuses a plan dtype).
  std::optional<spec::Dtype> predict_dtype;
  RoundOptions rounds;
  std::string out;     // runs, benchmark, calibrated cluster file, predicted traces
  bool refit = false;  // measure nothing: fit and predict from the runs already in `out`
  bool force = false;  // go on with a fit that predicts its own runs worse (then fit_worse)
  // Every run counts, a disturbed one's time and trace scaled to the quiet runs' core speed
  // (speed_scales); false: the median of the runs the checks found quiet, as measured.
  bool speed_reference = true;
};
// The loop measures RoundOptions::repeats rounds of every plan, fits, predicts, then
// RoundOptions::extra_rounds more of the plans open_ranks names, fits and predicts again on all
// the runs (as --refit of the same directory does), and reports on them.

struct LoopRow {
  std::string name, model;
  int64_t ranks = 0;
  bool heldout = false;
  PlanTime time;
  double predicted_s = 0;               // with the calibrated cluster
  double predicted_uncalibrated_s = 0;  // with the cluster the loop started from
  double error() const { return (predicted_s - time.measured_s) / time.measured_s; }
  double uncalibrated_error() const {
    return (predicted_uncalibrated_s - time.measured_s) / time.measured_s;
  }
};

// The loop's figures over the rows that measured (a row whose runs all failed counts in none).
struct LoopFigures {
  int64_t heldout_plans = 0;
  double heldout_mean_abs_error = 0, heldout_max_abs_error = 0;
  double uncalibrated_heldout_mean_abs_error = 0;
  double fit_plans_max_abs_error = 0;
  // RMS of the fit plans' errors: the uncertainty of a prediction, as a fraction of it.
  double fit_plans_rms_error = 0;
  double kendall_tau = 1;  // tau-b of predicted against measured over every plan
  double regret = 0;       // the measured time of the predicted best over the measured best, - 1
  std::string predicted_best, measured_best;
  double max_noise = 0;  // the largest noise_s / measured_s
  int64_t disturbed_runs = 0;
  // Whether the predicted best measured slower than the measured best by more than both plans'
  // noise together (else the regret is within what the rounds can tell apart).
  bool regret_beyond_noise = false;
  // Ranking confidence: in what share of resamplings of every plan's runs (with replacement,
  // each plan's time the median's rule on its draw) the predicted best, and the measured best,
  // is the fastest plan.
  double predicted_best_share = 1, measured_best_share = 1;
  // Tau where the measurement cannot order a pair: two plans whose measured gap is within their
  // noise together (the resolution regret_beyond_noise uses) count as tied, so a swap of plans the
  // rounds cannot tell apart counts neither way; `resolved_pairs` of `pairs` were ordered.
  double kendall_tau_resolved = 1;
  int64_t resolved_pairs = 0, pairs = 0;
  // Tau over the same resamplings: its 10th and 90th percentile (how far the rounds pin it down).
  double kendall_tau_p10 = 1, kendall_tau_p90 = 1;
};
LoopFigures loop_figures(const std::vector<LoopRow>& rows);

// The plans (indices into rows) whose rank the rounds left open: measured within the noise of the
// measured best (their gap under both noises plus 2%), or predicted within the fit's uncertainty
// of the predicted best (under twice the fit plans' RMS error plus 2%); the two bests always; and
// a plan whose every run was disturbed (its time says more about the machine than the plan).
// The 2% is the resolution the loop aims at (regret <= 5%) and covers a noise of 0 after one
// round.
std::vector<size_t> open_ranks(const std::vector<LoopRow>& rows, const LoopFigures& figures);

struct LoopReport {
  std::string cluster;          // its name
  std::string calibrated_file;  // written in `out`
  std::vector<LoopRow> rows;
  LoopFigures figures;
  StepCheck fitted;  // the fitted runs re-simulated before and after the fit
  bool fit_worse = false;
  // Why the fit predicts its own runs worse ("" when it does not); when only the fit with the
  // extra rounds did (fit_worse false), the first rounds' fit was kept and this says so.
  std::string refused;
  std::string compare_plan;
  std::vector<traces::Row> compare_by_class;
  double waited_s = 0;             // spent waiting for quiet cores
  std::vector<std::string> rerun;  // the plans given extra rounds
  // Measured by the machine and written into the calibrated file (none when it measured none).
  std::optional<spec::CoRunSlowdown> co_run;
  bool speed_reference = false;  // disturbed runs scaled to the quiet runs' core speed
};

// A fit that predicts its own runs worse, without `force`: nothing predicted after it would mean
// anything, so the loop stops.
class FitRefused : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

LoopReport close_loop(const LoopSetup& setup, Machine& machine);

// scripts/calibrate-local.sh --json's object (docs/FORMATS.md).
spec::Json to_json(const LoopReport& report);

}  // namespace sextant::loop
