// Measuring a set of plans on a machine that is not always quiet. Every plan runs once per
// round, rounds interleaved (round 1 runs every plan, then round 2, ...), so that a slow spell of
// the machine touches all plans alike; each run sits between two core checks and is run again
// (at most `tries` times) when either found a core slow, after waiting for quiet cores while the
// loop's waiting budget lasts. On the shared 2-core CI VM one core at a time runs 10-100% slow
// for tens of seconds; a two-rank run then is as slow as that core (docs/CALIBRATION.md).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "sextant/loop/trial.hpp"
#include "sextant/traces/rank_speeds.hpp"

namespace sextant::loop {

struct RoundOptions {
  int64_t repeats = 3;        // rounds
  int64_t first_round = 1;    // the first round's number (its files: run_base(out, name, round))
  int64_t steps = 8;          // training steps per run
  double quiet_wait_s = 120;  // seconds the loop may wait for quiet cores, in all
  int tries = 3;              // runs of a plan in one round while they come out disturbed
  bool warm_up = true;        // one discarded run of the first plan before round 1
  // Rounds more for the plans whose rank the first rounds left open (closed_loop.hpp: measured
  // or predicted within the noise of the best), none for the rest.
  int64_t extra_rounds = 2;
  std::function<void(const std::string&)> say;  // progress lines (may be empty)
  // The fastest each op ran in so far, kept across calls (none: the call's own runs only).
  traces::OpSpeedRecord* op_speeds = nullptr;
};

struct Measurements {
  std::vector<std::vector<RunResult>> runs;  // [plan][round]: the run each round kept
  double waited_s = 0;                       // spent waiting for quiet cores
};

// Why a run's own steps say the machine was disturbed during it ("" when they do not): its
// steps after the warm-up range over more than kMaxStepSpread (slowest over fastest, - 1). The core
// checks before and after a run miss a slow spell inside it: on the 2-core VM a dp2.mb8 run passed
// both with steps of 129, 161, 154, 110, 76, 76 ms, and as a fit plan's only undisturbed run it
// moved the fit by 30%. Quiet runs there range over 2-23%.
constexpr double kMaxStepSpread = 0.3;
std::string unsteady_steps(const RunResult& run);

// Why a run's trace says its cores computed slowly ("" when it does not, or holds no trace),
// after the warm-up (traces/rank_speeds.hpp): one rank's time in the ops every rank ran exceeds
// another's by more than kMaxRankSpread, or the fastest rank ran the ops `record` holds (at least
// kMinKnownShare of its compute time) more than kMaxCoreSlowdown slower than the runs before;
// then the run's ops go into `record`. Its steps are steady, so unsteady_steps misses it, and a
// core check before or after the run may find the cores quiet. On the 2-core VM, 50 of 59 runs of
// gpt-tiny's dp, tp and pp plans had their ranks 0-9.3% apart; in the other 9 one rank 10.1-28.6%
// behind made the step 10-25% slower; both ranks 15-20% slower than before made it 10-17% slower
// (bench/results/slow_cores.md).
constexpr double kMaxRankSpread = 0.1;
constexpr double kMaxCoreSlowdown = 0.1;
constexpr double kMinKnownShare = 0.5;
std::string slow_cores(const RunResult& run, traces::OpSpeedRecord& record);

// Where run `round` (from 1) of plan `name` keeps its files: out/name.rROUND (.steps.jsonl,
// .measured.json, .disturbed).
std::string run_base(const std::string& out, const std::string& name, int64_t round);

Measurements measure_rounds(const std::vector<TrialPlan>& plans, Machine& machine,
                            const std::string& out, const RoundOptions& options);
// `count` rounds more of the plans `which` (indices into plans), numbered on from each plan's
// last round, appended to m.runs (interleaved as measure_rounds does).
void measure_more(const std::vector<TrialPlan>& plans, const std::vector<size_t>& which,
                  Machine& machine, const std::string& out, const RoundOptions& options,
                  int64_t count, Measurements& m);
// The runs an earlier measure_rounds left in `out` (the same plans and repeats), and any rounds
// measure_more added after them; throws InputError naming a missing file of the first `repeats`.
Measurements read_rounds(const std::vector<TrialPlan>& plans, const std::string& out,
                         int64_t repeats);

// Each run's step scaled to the speed the loop's quiet runs computed at, [plan][round] as m.runs,
// from one speed reference across every run's ops (traces::slowdowns_against_fastest): a run a
// check found disturbed takes (1 + the median slowdown of the quiet runs of its rank count) /
// (1 + its slowdown); a quiet run, a failed one or one without a trace keeps 1. When no run of
// that rank count was quiet, the median is over all of them. The reference resolves what the checks
// only mark: under a neighbour on one of the 2-core VM's cores (bench/neighbour.py), 47 of a loop's
// 60 kept runs were disturbed, and its plans' quiet-or-all medians gave held-out mean 20.7%, tau
// 0.58 and regret 27.6%; scaled, 3.6%, 0.79 and 0.4%. It does not resolve a few percent (ops of one
// shape run beside different neighbours in different plans), so quiet runs stay as measured
// (bench/results/calibration_neighbour.md).
std::vector<std::vector<double>> speed_scales(const Measurements& m);

// A plan's time from its rounds: the median of its undisturbed runs' mean steps, the lower middle
// when even (all runs when none was undisturbed; the fastest run instead would pick lucky
// outliers: dp1.mb8 measured 135.9 ms in one of three runs against 144-152 in the others), and
// the half-range of those runs as its noise. Failed runs count for nothing. With `scales`
// (speed_scales' row of the plan), every run counts, each at its scaled step: the scale takes the
// disturbance out of a disturbed run, which the core checks around it only mark.
struct PlanTime {
  bool measured = false;  // false: no run of the plan succeeded
  double measured_s = 0;
  double noise_s = 0;
  int64_t median_round = 0;  // the round (from 1) of the median run
  int64_t disturbed_runs = 0;
  int64_t quiet_runs = 0;      // undisturbed: 0 means its time is from disturbed runs
  std::string status;          // "ok", else the last failure
  std::vector<double> kept_s;  // the runs' mean steps it was taken from (resampled for confidence)
  double unscaled_s = 0;       // the median run's mean step as measured (measured_s unless scaled)
};
// The plan_time of each resampling of `kept_s` with replacement: the median's rule on a draw.
double median_of_kept(std::vector<double> kept);
PlanTime plan_time(const std::vector<RunResult>& rounds,
                   const std::vector<double>* scales = nullptr);

}  // namespace sextant::loop
