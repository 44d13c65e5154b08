// The loop as a library: the warm-up rule, a plan's time from its rounds, rounds interleaved with
// retries while the machine is disturbed, and the whole loop on a simulated machine whose true
// cluster differs from the file the loop starts from. No timing: every "run" is a simulation.
#include "sextant/loop/closed_loop.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <deque>
#include <filesystem>
#include <fstream>

#include "sextant/loop/rounds.hpp"
#include "sextant/loop/trial.hpp"
#include "sextant/models/zoo.hpp"
#include "sextant/sim/simulator.hpp"
#include "sextant/spec/cluster_catalog.hpp"
#include "sextant/spec/json_io.hpp"
#include "sextant/spec/stack.hpp"
#include "test_models.hpp"

namespace sextant::loop {
namespace {

std::string fresh_dir(const std::string& name) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("sextant-loop-" + name)).string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

RunResult run_of(double mean_s, std::string disturbed = "") {
  RunResult r;
  r.status = "ok";
  r.step_times_s = {mean_s};  // one step: its mean is itself
  r.disturbed = std::move(disturbed);
  return r;
}

TEST(Trial, TheMeanStepLeavesOutTheWarmUp) {
  EXPECT_FALSE(mean_step_after_warmup({}).has_value());
  EXPECT_DOUBLE_EQ(*mean_step_after_warmup({5}), 5);
  // Two or three steps: the first is left out.
  EXPECT_DOUBLE_EQ(*mean_step_after_warmup({9, 4}), 4);
  EXPECT_DOUBLE_EQ(*mean_step_after_warmup({9, 2, 4}), 3);
  // More than three: the first two; (1 + 2 + 3) / 3 = 2.
  EXPECT_DOUBLE_EQ(*mean_step_after_warmup({9, 8, 1, 2, 3}), 2);
}

TEST(Rounds, APlansTimeIsTheMedianOfItsQuietRuns) {
  RunResult failed;
  failed.status = "failed (exit 1): out of memory";
  // Quiet runs 10, 12, 11 (rounds 1, 3, 4), one disturbed 30 (round 2), one failed (round 5):
  // sorted quiet runs 10, 11, 12 -> median 11 of round 4, noise (12 - 10) / 2 = 1.
  PlanTime t = plan_time({run_of(10), run_of(30, "cpu 1 slow"), run_of(12), run_of(11), failed});
  EXPECT_TRUE(t.measured);
  EXPECT_DOUBLE_EQ(t.measured_s, 11);
  EXPECT_EQ(t.median_round, 4);
  EXPECT_DOUBLE_EQ(t.noise_s, 1);
  EXPECT_EQ(t.disturbed_runs, 1);
  // An even number: the lower middle (10, 14 -> 10).
  EXPECT_DOUBLE_EQ(plan_time({run_of(14), run_of(10)}).measured_s, 10);
  // None quiet: all runs count (20, 24, 22 -> 22).
  t = plan_time({run_of(20, "a"), run_of(24, "b"), run_of(22, "c")});
  EXPECT_DOUBLE_EQ(t.measured_s, 22);
  EXPECT_EQ(t.disturbed_runs, 3);
  // Nothing succeeded: not measured, with the failure.
  t = plan_time({failed});
  EXPECT_FALSE(t.measured);
  EXPECT_EQ(t.status, failed.status);
}

// A machine that records what it is asked and answers core checks from a script ("" = quiet;
// quiet once the script runs out).
class ScriptedMachine : public Machine {
 public:
  std::deque<std::string> checks;
  std::vector<std::string> log;  // "run NAME" / "pause"
  RunResult run(const TrialPlan& trial, int64_t, const std::string& base) override {
    log.push_back("run " + trial.name);
    std::ofstream(base + ".steps.jsonl") << "{\"step_time_s\": 1.0}\n";
    return read_run(base);
  }
  std::string disturbance() override {
    if (checks.empty()) return "";
    std::string c = checks.front();
    checks.pop_front();
    return c;
  }
  void pause(double) override { log.push_back("pause"); }
  bool benchmark(const std::string&) override { return false; }
};

std::vector<TrialPlan> two_plans() {
  return {{"a", "gpt-tiny", test::make_plan(1, 1, 1, 4, 16), false},
          {"b", "gpt-tiny", test::make_plan(1, 1, 1, 8, 16), true}};
}

TEST(Rounds, RoundsInterleaveAndARunIsRepeatedWhileTheMachineIsDisturbed) {
  const std::string out = fresh_dir("rounds");
  ScriptedMachine m;
  // Checks in order: before warm-up, after it, before a r1, after a r1 (slow: run again),
  // before the retry, after it; then quiet.
  m.checks = {"", "", "", "cpu 1: 30% slow", "", ""};
  RoundOptions o;
  o.repeats = 2;
  o.quiet_wait_s = 10;
  const Measurements ms = measure_rounds(two_plans(), m, out, o);
  const std::vector<std::string> expected = {"run a", "run a", "run a", "run b", "run a", "run b"};
  EXPECT_EQ(m.log, expected);  // warm-up, a r1 twice, then interleaved
  ASSERT_EQ(ms.runs.size(), 2u);
  ASSERT_EQ(ms.runs[0].size(), 2u);
  EXPECT_TRUE(ms.runs[0][0].disturbed.empty());  // the retry was quiet
  EXPECT_FALSE(std::filesystem::exists(out + "/a.r1.disturbed"));
  EXPECT_EQ(ms.waited_s, 0);
}

TEST(Rounds, WaitingStopsWhenItsBudgetIsSpentAndTheRunIsMarked) {
  const std::string out = fresh_dir("budget");
  ScriptedMachine m;
  m.checks = std::deque<std::string>(100, "cpu 0: 50% slow");
  RoundOptions o;
  o.repeats = 1;
  o.quiet_wait_s = 3;
  o.warm_up = false;
  const Measurements ms = measure_rounds(two_plans(), m, out, o);
  // Plan a waits 3 s (three pauses), runs, is disturbed, and with the budget spent is kept as it
  // is; plan b waits no more.
  const std::vector<std::string> expected = {"pause", "pause", "pause", "run a", "run b"};
  EXPECT_EQ(m.log, expected);
  EXPECT_EQ(ms.waited_s, 3);
  EXPECT_EQ(ms.runs[0][0].disturbed, "cpu 0: 50% slow");
  EXPECT_TRUE(std::filesystem::exists(out + "/a.r1.disturbed"));
  // What the files say is what the runs said (--refit reads them).
  const Measurements again = read_rounds(two_plans(), out, 1);
  EXPECT_EQ(again.runs[1][0].disturbed, "cpu 0: 50% slow");
  EXPECT_DOUBLE_EQ(*again.runs[1][0].mean_step_s(), 1.0);
}

TEST(LoopFigures, HeldOutErrorsTauAndRegretByHand) {
  auto row = [](const char* name, bool heldout, double predicted, double measured) {
    LoopRow r;
    r.name = name;
    r.heldout = heldout;
    r.predicted_s = predicted;
    r.predicted_uncalibrated_s = 2 * measured;  // +100%
    r.time.measured = true;
    r.time.measured_s = measured;
    r.time.noise_s = 0.05 * measured;
    return r;
  };
  // fit: a (+10%), b (-20%); held out: c (+5%), d (-25%); unmeasured e counts nowhere.
  std::vector<LoopRow> rows = {row("a", false, 1.1, 1.0), row("b", false, 1.6, 2.0),
                               row("c", true, 3.15, 3.0), row("d", true, 0.75, 1.0)};
  LoopRow e;
  e.name = "e";
  e.heldout = true;
  e.predicted_s = 0.1;
  rows.push_back(e);
  const LoopFigures f = loop_figures(rows);
  EXPECT_EQ(f.heldout_plans, 2);
  EXPECT_NEAR(f.heldout_mean_abs_error, (0.05 + 0.25) / 2, 1e-12);
  EXPECT_NEAR(f.heldout_max_abs_error, 0.25, 1e-12);
  EXPECT_NEAR(f.uncalibrated_heldout_mean_abs_error, 1.0, 1e-12);
  EXPECT_NEAR(f.fit_plans_max_abs_error, 0.2, 1e-12);
  EXPECT_NEAR(f.fit_plans_rms_error, std::sqrt((0.01 + 0.04) / 2), 1e-12);
  // Predicted order d(0.75) a(1.1) b(1.6) c(3.15); measured a=d(1.0) b(2.0) c(3.0). Pairs:
  // a-b, a-c, b-c, d-b, d-c concordant; a-d tied in measured only -> tau-b =
  // (5 - 0) / sqrt((5 + 0 + 0) * (5 + 0 + 1)) = 5 / sqrt(30).
  EXPECT_NEAR(f.kendall_tau, 5 / std::sqrt(30.0), 1e-12);
  // The predicted best d measured 1.0, the best measured is 1.0: no regret.
  EXPECT_EQ(f.predicted_best, "d");
  EXPECT_NEAR(f.regret, 0, 1e-12);
  EXPECT_NEAR(f.max_noise, 0.05, 1e-12);
}

// A machine whose runs are simulations on a true cluster the loop does not know: every step takes
// the simulated step time, and the trace holds the simulated ops, as a run's would.
class SimulatedMachine : public Machine {
 public:
  explicit SimulatedMachine(spec::ClusterSpec truth) : truth_(std::move(truth)) {}
  RunResult run(const TrialPlan& trial, int64_t steps, const std::string& base) override {
    const spec::ModelSpec model = models::resolve_model(trial.model);
    sim::SimulationOptions options;
    options.trace = true;
    const sim::SimulationResult r = sim::simulate(model, truth_, trial.plan, options);
    spec::Trace t = *r.trace;
    t.kind = "measured";
    t.metadata = {{"model", model.name},
                  {"model_json", spec::to_json(model)},
                  {"plan", trial.plan.name()},
                  {"plan_json", spec::to_json(trial.plan)},
                  {"stack", spec::kExecutorStack},
                  {"dtype", "fp32"},
                  {"step_time_s", r.report.step_time_s}};
    spec::write_trace_file(base + ".measured.json", t);
    {
      std::ofstream log(base + ".steps.jsonl");
      for (int64_t s = 0; s < steps; ++s)
        log << spec::Json{{"step", s}, {"step_time_s", r.report.step_time_s}}.dump() << "\n";
    }
    ++runs;
    return read_run(base);
  }
  std::string disturbance() override { return ""; }
  void pause(double) override {}
  bool benchmark(const std::string&) override { return false; }
  int runs = 0;

 private:
  spec::ClusterSpec truth_;
};

std::vector<TrialPlan> gpt_tiny_set() {
  auto plan = [](const char* name, int64_t dp, int64_t tp, int64_t pp, int64_t mb, bool heldout) {
    spec::Plan p = test::make_plan(dp, tp, pp, mb, 16);
    p.stack = spec::builtin_stack(spec::kExecutorStack);
    return TrialPlan{name, "gpt-tiny", p, heldout};
  };
  return {plan("dp1.mb4", 1, 1, 1, 4, false), plan("dp2.mb8", 2, 1, 1, 8, false),
          plan("tp2.mb2", 1, 2, 1, 2, false), plan("pp2.mb2", 1, 1, 2, 2, false),
          plan("dp1.mb8", 1, 1, 1, 8, true),  plan("dp2.mb2", 2, 1, 1, 2, true),
          plan("tp2.mb4", 1, 2, 1, 4, true),  plan("pp2.mb4", 1, 1, 2, 4, true)};
}

TEST(ClosedLoop, ASimulatedMachinesHeldOutPlansArePredictedAfterTheFit) {
  const spec::ClusterSpec nominal = spec::builtin_cluster("local-cpu");
  // The machine is slower than its file says in what the fit learns: elementwise ops at half the
  // memory efficiency, GEMMs at 0.7 of the curve, collectives at half the bandwidth.
  spec::ClusterSpec truth = nominal;
  truth.device.memory_efficiency *= 0.5;
  for (spec::EfficiencyPoint& p : truth.device.gemm_efficiency) p.efficiency *= 0.7;
  for (auto& level : truth.network.levels) level.bandwidth_GBps *= 0.5;
  SimulatedMachine machine(truth);
  LoopSetup s;
  s.cluster = nominal;
  s.plans = gpt_tiny_set();
  s.compare_plan = "pp2.mb4";
  s.out = fresh_dir("closed");
  s.rounds.repeats = 2;
  s.rounds.steps = 4;
  const LoopReport r = close_loop(s, machine);
  EXPECT_EQ(machine.runs, 1 + 2 * 8);  // the warm-up, then two rounds of eight plans
  ASSERT_EQ(r.rows.size(), 8u);
  for (size_t i = 0; i < r.rows.size(); ++i) {
    const LoopRow& row = r.rows[i];
    // The measured time is the truth's simulated step (every step the same).
    sim::SimulationOptions o;
    const double truth_s =
        sim::simulate(models::zoo_model("gpt-tiny"), truth, s.plans[i].plan, o).report.step_time_s;
    EXPECT_NEAR(row.time.measured_s, truth_s, 1e-12 * truth_s) << row.name;
    EXPECT_DOUBLE_EQ(row.time.noise_s, 0);
    // The machine is slower in every term, so the nominal file predicts every plan too fast.
    EXPECT_LT(row.uncalibrated_error(), -0.1) << row.name;
  }
  const LoopFigures& f = r.figures;
  EXPECT_EQ(f.heldout_plans, 4);
  // The truth is a cluster of the fit's own family (a GEMM curve, a memory efficiency, a link
  // bandwidth), so fitted from the four fit plans' ops it predicts the held-out plans, more than
  // 10% off each before, to within 1% (measured 0.09% mean, 0.14% worst), and ranks every plan
  // as the machine does.
  EXPECT_GT(f.uncalibrated_heldout_mean_abs_error, 0.1);
  EXPECT_LT(f.heldout_mean_abs_error, 0.01);
  EXPECT_LT(f.heldout_max_abs_error, 0.01);
  EXPECT_DOUBLE_EQ(f.kendall_tau, 1.0);
  EXPECT_DOUBLE_EQ(f.regret, 0.0);
  EXPECT_FALSE(r.fit_worse);
  EXPECT_TRUE(std::filesystem::exists(r.calibrated_file));
  EXPECT_EQ(r.compare_plan, "pp2.mb4");
  EXPECT_FALSE(r.compare_by_class.empty());
  // The JSON holds the rows and the figures as computed.
  const spec::Json j = to_json(r);
  EXPECT_EQ(j.at("plans").size(), 8u);
  EXPECT_DOUBLE_EQ(j.at("heldout_mean_abs_error").get<double>(), f.heldout_mean_abs_error);
  EXPECT_DOUBLE_EQ(j.at("kendall_tau").get<double>(), f.kendall_tau);

  // --refit: the same runs, read back from their files, give the same report.
  s.refit = true;
  SimulatedMachine unused(truth);
  const LoopReport again = close_loop(s, unused);
  EXPECT_EQ(unused.runs, 0);
  for (size_t i = 0; i < r.rows.size(); ++i) {
    EXPECT_DOUBLE_EQ(again.rows[i].time.measured_s, r.rows[i].time.measured_s);
    EXPECT_DOUBLE_EQ(again.rows[i].predicted_s, r.rows[i].predicted_s);
  }
}

// A run that fails costs its row, not the loop: the plan is reported unmeasured with the failure,
// and the figures count the others.
class FailingMachine : public SimulatedMachine {
 public:
  using SimulatedMachine::SimulatedMachine;
  RunResult run(const TrialPlan& trial, int64_t steps, const std::string& base) override {
    if (trial.name != "dp2.mb2") return SimulatedMachine::run(trial, steps, base);
    RunResult r;
    r.status = "failed (exit 1): MPI_Init failed";
    return r;
  }
};

TEST(ClosedLoop, AFailedPlanIsReportedAndLeftOutOfTheFigures) {
  FailingMachine machine(spec::builtin_cluster("local-cpu"));
  LoopSetup s;
  s.cluster = spec::builtin_cluster("local-cpu");
  s.plans = gpt_tiny_set();
  s.out = fresh_dir("failing");
  s.rounds.repeats = 1;
  s.rounds.steps = 2;
  // The machine is its file, so the file predicts every run exactly and a fit (curves through
  // samples) can only add error: the loop refuses to go on with it ...
  EXPECT_THROW(close_loop(s, machine), FitRefused);
  // ... unless told to, and then says so.
  s.force = true;
  const LoopReport r = close_loop(s, machine);
  EXPECT_TRUE(r.fit_worse);
  EXPECT_FALSE(r.refused.empty());
  ASSERT_EQ(r.rows.size(), 8u);
  EXPECT_FALSE(r.rows[5].time.measured);
  EXPECT_EQ(r.rows[5].time.status, "failed (exit 1): MPI_Init failed");
  EXPECT_EQ(r.figures.heldout_plans, 3);
  const spec::Json j = to_json(r).at("plans").at(5);
  EXPECT_FALSE(j.contains("measured_s"));
  EXPECT_EQ(j.at("status"), "failed (exit 1): MPI_Init failed");
}

}  // namespace
}  // namespace sextant::loop
