// The budgeted trial loop on a simulated machine whose true cluster differs from the file tuning
// starts from: it must find the candidate the truth makes fastest, in fewer trials than a grid,
// stop on its budget, and resume from its record. No timing: every run is a simulation.
#include "sextant/loop/tune.hpp"

#include <gtest/gtest.h>

#include <algorithm>

#include "sextant/spec/cluster_catalog.hpp"
#include "simulated_machine.hpp"
#include "test_models.hpp"

namespace sextant::loop {
namespace {

// gpt-tiny on two ranks, global batch 16: dp, tp or pp 2 with micro-batches of 1 to 8.
std::vector<TrialPlan> candidates() {
  std::vector<TrialPlan> out;
  for (auto [dp, tp, pp] : {std::tuple{2, 1, 1}, std::tuple{1, 2, 1}, std::tuple{1, 1, 2}})
    for (int64_t mb : {1, 2, 4, 8}) {
      spec::Plan p = test::make_plan(dp, tp, pp, mb, 16);
      p.stack = spec::builtin_stack(spec::kExecutorStack);
      out.push_back({p.name(), "gpt-tiny", p, false});
    }
  return out;
}

// Slower than its file in what the fit learns (as in the closed loop's test), and with GEMMs
// slower still, so that the file's ranking is not the truth's.
spec::ClusterSpec truth_of(const spec::ClusterSpec& nominal) {
  spec::ClusterSpec truth = nominal;
  truth.device.memory_efficiency *= 0.5;
  for (spec::EfficiencyPoint& p : truth.device.gemm_efficiency) p.efficiency *= 0.6;
  for (auto& level : truth.network.levels) level.bandwidth_GBps *= 0.02;
  return truth;
}

double truth_step(const spec::ClusterSpec& truth, const TrialPlan& c) {
  sim::SimulationOptions o;
  return sim::simulate(models::zoo_model("gpt-tiny"), truth, c.plan, o).report.step_time_s;
}

// The candidate the truth makes fastest.
size_t truths_fastest(const spec::ClusterSpec& truth, const std::vector<TrialPlan>& c) {
  size_t fastest = 0;
  for (size_t i = 1; i < c.size(); ++i)
    if (truth_step(truth, c[i]) < truth_step(truth, c[fastest])) fastest = i;
  return fastest;
}

// Tuning starts from the local-cpu file; the machine runs the truth.
class Tune : public ::testing::Test {
 protected:
  const spec::ClusterSpec nominal = spec::builtin_cluster("local-cpu");
  const spec::ClusterSpec truth = truth_of(nominal);
  const std::vector<TrialPlan> c = candidates();
  const size_t fastest = truths_fastest(truth, c);
};

TEST_F(Tune, FindsTheTruthsFastestCandidateInAThirdOfAGridsTrials) {
  SimulatedMachine machine(truth);
  TuneOptions o;
  o.steps = 4;
  o.dir = fresh_dir("tune");
  const TuneReport r = tune(nominal, c, machine, o);
  ASSERT_TRUE(r.chosen);
  // The file's own best is not the truth's: the first trial alone cannot be the answer.
  size_t file_best = 0;
  for (size_t i = 1; i < c.size(); ++i)
    if (r.predicted_before_s[i] < r.predicted_before_s[file_best]) file_best = i;
  EXPECT_NE(c[file_best].name, c[fastest].name);
  EXPECT_TRUE(r.converged) << r.stopped;
  EXPECT_EQ(c[r.trials[*r.chosen].candidate].name, c[fastest].name);
  EXPECT_LE(r.trials.size(), c.size() / 3);
  EXPECT_EQ(machine.runs, static_cast<int>(r.trials.size()) + 1);  // and the warm-up
  // Every trial measured the truth's step; the fit took them.
  for (const TuneTrial& t : r.trials)
    EXPECT_NEAR(t.time.measured_s, truth_step(truth, c[t.candidate]), 1e-12);
  EXPECT_EQ(r.fit_refused, "");
  // Runs that agree with the fit of the others are not run twice.
  for (const TuneTrial& t : r.trials) EXPECT_FALSE(t.confirms) << c[t.candidate].name;
  // Each kind's doubt is how much faster than expected its last two checked trials ran, never
  // below 0: the expectation made before the trial over its measured time, less one.
  for (const bool guess : {true, false}) {
    std::vector<double> errors;
    for (const TuneTrial& t : r.trials)
      if (t.calibrated && t.layout_guess == guess)
        errors.push_back(t.expected_s / t.time.measured_s - 1);
    const std::optional<double> doubt = guess ? r.layout_guess_doubt : r.new_layout_doubt;
    if (errors.empty()) {
      EXPECT_FALSE(doubt);
      continue;
    }
    ASSERT_TRUE(doubt);
    const size_t n = errors.size();
    EXPECT_DOUBLE_EQ(*doubt, std::max({0.0, errors[n - 1], n > 1 ? errors[n - 2] : 0.0}));
  }
  // Nothing left that could beat the best by more than the noise, were it as much faster than
  // expected as the last ones of its kind.
  for (size_t i = 0; i < c.size(); ++i) {
    bool tried = false;
    for (const TuneTrial& t : r.trials) tried = tried || t.candidate == i;
    if (tried) continue;
    const std::optional<double> doubt =
        r.layout_guess[i] ? r.layout_guess_doubt : r.new_layout_doubt;
    ASSERT_TRUE(doubt) << c[i].name;
    EXPECT_GE(r.expected_s[i] * (1 - *doubt), r.trials[*r.chosen].time.measured_s * (1 - o.noise))
        << c[i].name;
  }
}

// A fast spell of the machine during the first trial: that run of the file's predicted best takes
// 0.6 of its true time, faster than the truth's fastest candidate. Taken at its word it would end
// the tune; the fit of the other trials predicts it far slower than it ran, so it runs again, and
// its time is the slower run (the upper median of two). The tune then goes on to the truth's best.
TEST_F(Tune, RunsASurprisinglyFastBestAgainBeforeTakingIt) {
  SimulatedMachine machine(truth);
  std::string fluked;
  machine.time_scale = [&](const TrialPlan& p, int runs_before) {
    if (runs_before != 1) return 1.0;  // run 0 is the warm-up; run 1 the first trial
    fluked = p.name;
    return 0.6;
  };
  TuneOptions o;
  o.steps = 4;
  o.dir = fresh_dir("tune-fluke");
  const TuneReport r = tune(nominal, c, machine, o);
  ASSERT_TRUE(r.chosen);
  const size_t first = r.trials[0].candidate;
  ASSERT_EQ(c[first].name, fluked);
  ASSERT_NE(first, fastest);
  ASSERT_LT(0.6 * truth_step(truth, c[first]), truth_step(truth, c[fastest]));  // it would win
  std::vector<size_t> runs_of_first;
  for (size_t i = 0; i < r.trials.size(); ++i)
    if (r.trials[i].candidate == first) runs_of_first.push_back(i);
  ASSERT_EQ(runs_of_first.size(), 2u);
  const TuneTrial& again = r.trials[runs_of_first[1]];
  EXPECT_TRUE(again.confirms);
  EXPECT_EQ(again.round, 2);
  EXPECT_FALSE(again.calibrated);  // its expectation was its own run, not a check of the fit
  EXPECT_NEAR(r.trials[0].time.measured_s, 0.6 * truth_step(truth, c[first]), 1e-12);
  EXPECT_NEAR(again.time.measured_s, truth_step(truth, c[first]), 1e-12);
  ASSERT_TRUE(r.candidate_trial[first]);
  EXPECT_EQ(*r.candidate_trial[first], runs_of_first[1]);  // the slower of its two runs
  EXPECT_TRUE(r.converged) << r.stopped;
  EXPECT_EQ(c[r.trials[*r.chosen].candidate].name, c[fastest].name);
  EXPECT_EQ(std::count_if(r.trials.begin(), r.trials.end(),
                          [](const TuneTrial& t) { return t.confirms; }),
            1);

  // Resumed from its record, each trial reads back its own run: the confirmation its round 2.
  const int runs_before = machine.runs;
  const TuneReport resumed = tune(nominal, c, machine, o);
  EXPECT_EQ(machine.runs, runs_before);
  ASSERT_EQ(resumed.trials.size(), r.trials.size());
  for (size_t i = 0; i < r.trials.size(); ++i) {
    EXPECT_EQ(resumed.trials[i].round, r.trials[i].round);
    EXPECT_EQ(resumed.trials[i].confirms, r.trials[i].confirms);
    EXPECT_DOUBLE_EQ(resumed.trials[i].time.measured_s, r.trials[i].time.measured_s);
  }
  EXPECT_EQ(resumed.chosen, r.chosen);
}

TEST_F(Tune, StopsOnItsBudgetAndResumesFromItsRecord) {
  SimulatedMachine machine(truth);
  TuneOptions o;
  o.steps = 4;
  o.dir = fresh_dir("tune-resume");
  o.max_trials = 1;
  const TuneReport first = tune(nominal, c, machine, o);
  EXPECT_EQ(first.trials.size(), 1u);
  EXPECT_FALSE(first.converged);
  EXPECT_EQ(first.stopped, "the budget of 1 trials is spent");
  // The predicted best of the file it started from runs first.
  size_t predicted_best = 0;
  for (size_t i = 1; i < c.size(); ++i)
    if (first.predicted_before_s[i] < first.predicted_before_s[predicted_best]) predicted_best = i;
  EXPECT_EQ(first.trials[0].candidate, predicted_best);

  o.max_trials = 0;
  const int runs_before = machine.runs;
  const TuneReport second = tune(nominal, c, machine, o);
  EXPECT_EQ(second.resumed_trials, 1);
  EXPECT_EQ(second.trials[0].candidate, predicted_best);
  EXPECT_TRUE(second.converged);
  // The recorded trial is read back, not run again (and no second warm-up).
  EXPECT_EQ(machine.runs - runs_before, static_cast<int>(second.trials.size()) - 1);

  // Another tune's record in the directory is refused, naming it.
  std::vector<TrialPlan> other = c;
  other.pop_back();
  EXPECT_THROW(tune(nominal, other, machine, o), InputError);

  // A record whose trial is not one of the candidates is refused, naming the trial.
  spec::Json record = spec::read_json_file(o.dir + "/tune.json");
  record["trials"][0]["candidate"] = 12;
  spec::write_json_file(o.dir + "/tune.json", record);
  try {
    tune(nominal, c, machine, o);
    ADD_FAILURE() << "a trial of candidate 12 of 12 was read";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("/trials/0"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace sextant::loop
