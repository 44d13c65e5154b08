// Measure, fit, predict, report.
#include "sextant/loop/closed_loop.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <random>
#include <set>

#include "sextant/loop/report_json.hpp"
#include "sextant/models/zoo.hpp"
#include "sextant/sim/simulator.hpp"
#include "sextant/spec/error.hpp"

namespace sextant::loop {

namespace {

// The plan as predicted: the trial's, in the precision the runs compute in.
spec::Plan predicted_plan(const LoopSetup& s, const TrialPlan& trial) {
  spec::Plan plan = trial.plan;
  if (s.predict_dtype) plan.dtype = s.predict_dtype;
  return plan;
}

double step_time(const spec::ModelSpec& model, const spec::ClusterSpec& cluster,
                 const spec::Plan& plan, const std::string& name) {
  sim::SimulationOptions options;
  options.plan_source = name;
  return sim::simulate(model, cluster, plan, options).report.step_time_s;
}

// What `sextant bench cores --co-run --json` measured, as the cluster file's device.co_run.
spec::CoRunSlowdown read_co_run(const std::string& path) {
  const spec::Json j = spec::read_json_file(path);
  auto field = [&](const char* key, double lo, double hi) {
    if (!j.is_object() || !j.contains(key) || !j[key].is_number() ||
        !(j[key].get<double>() >= lo) || !(j[key].get<double>() <= hi))
      throw InputError(path, std::string("/") + key,
                       j.is_object() && j.contains(key) ? j[key].dump() : "(missing)",
                       fmt::format("a number from {} to {} (a file `sextant bench cores --co-run "
                                   "--json` wrote)",
                                   lo, hi));
    return j[key].get<double>();
  };
  spec::CoRunSlowdown c;
  c.devices = static_cast<int64_t>(field("cores", 1, 1 << 20));
  // A sharing core is slowed, not sped up: a ratio under 1 is timing noise, read as none.
  c.matrix = std::clamp(field("matrix_slowdown", 0.5, 10), 1.0, 10.0);
  c.memory = std::clamp(field("memory_slowdown", 0.5, 10), 1.0, 10.0);
  c.source = fmt::format(
      "sextant bench cores --co-run on {} cores at once: GEMM {:.3f} ms alone, {:.3f} together; "
      "streaming add {:.3f} ms alone, {:.3f} together",
      c.devices, field("matrix_alone_s", 0, 1e3) * 1e3, field("matrix_together_s", 0, 1e3) * 1e3,
      field("memory_alone_s", 0, 1e3) * 1e3, field("memory_together_s", 0, 1e3) * 1e3);
  return c;
}

// The run as if its cores had computed at the quiet runs' speed: every event's start and length,
// and the step time, times `scale` (speed_scales).
spec::Trace at_speed(spec::Trace trace, double scale) {
  if (scale == 1.0) return trace;
  for (spec::TraceEvent& e : trace.events) {
    e.start_ps = static_cast<Picoseconds>(static_cast<double>(e.start_ps) * scale);
    e.duration_ps = static_cast<Picoseconds>(static_cast<double>(e.duration_ps) * scale);
  }
  if (trace.metadata.is_object() && trace.metadata.contains("step_time_s") &&
      trace.metadata["step_time_s"].is_number())
    trace.metadata["step_time_s"] = trace.metadata["step_time_s"].get<double>() * scale;
  return trace;
}

// Each plan's time from its runs, scaled to one speed when the setup says so.
std::vector<PlanTime> plan_times(const LoopSetup& s, const Measurements& m,
                                 std::vector<std::vector<double>>& scales) {
  scales = s.speed_reference ? speed_scales(m) : std::vector<std::vector<double>>{};
  std::vector<PlanTime> times;
  for (size_t p = 0; p < m.runs.size(); ++p)
    times.push_back(plan_time(m.runs[p], scales.empty() ? nullptr : &scales[p]));
  return times;
}

}  // namespace

std::vector<size_t> open_ranks(const std::vector<LoopRow>& rows, const LoopFigures& f) {
  const LoopRow* measured_best = nullptr;
  const LoopRow* predicted_best = nullptr;
  for (const LoopRow& r : rows) {
    if (!r.time.measured) continue;
    if (!measured_best || r.time.measured_s < measured_best->time.measured_s) measured_best = &r;
    if (!predicted_best || r.predicted_s < predicted_best->predicted_s) predicted_best = &r;
  }
  std::vector<size_t> open;
  if (!measured_best) return open;
  constexpr double kResolution = 0.02;
  for (size_t i = 0; i < rows.size(); ++i) {
    const LoopRow& r = rows[i];
    if (!r.time.measured) continue;
    const double best_s = measured_best->time.measured_s;
    const bool measured_close = r.time.measured_s - best_s <=
                                r.time.noise_s + measured_best->time.noise_s + kResolution * best_s;
    const double pick_s = predicted_best->predicted_s;
    const bool predicted_close =
        r.predicted_s - pick_s <= (2 * f.fit_plans_rms_error + kResolution) * pick_s;
    if (measured_close || predicted_close || r.time.quiet_runs == 0) open.push_back(i);
  }
  return open;
}

namespace {

// The ranking's confidence (LoopFigures::predicted_best_share, kendall_tau_p10): 2000
// resamplings with a fixed seed, so a report reads the same when refitted.
struct Resampled {
  double pick_share = 0, best_share = 0;
  double tau_p10 = 1, tau_p90 = 1;
};
Resampled resample_ranking(const std::vector<const LoopRow*>& measured, size_t pick, size_t best) {
  constexpr int kDraws = 2000;
  std::mt19937_64 rng(20261129);
  int pick_wins = 0, best_wins = 0;
  std::vector<double> predicted, times(measured.size()), draw, taus;
  for (const LoopRow* r : measured) predicted.push_back(r->predicted_s);
  for (int d = 0; d < kDraws; ++d) {
    for (size_t i = 0; i < measured.size(); ++i) {
      const std::vector<double>& kept = measured[i]->time.kept_s;
      times[i] = measured[i]->time.measured_s;
      if (kept.size() > 1) {
        std::uniform_int_distribution<size_t> pick_run(0, kept.size() - 1);
        draw.clear();
        for (size_t k = 0; k < kept.size(); ++k) draw.push_back(kept[pick_run(rng)]);
        times[i] = median_of_kept(draw);
      }
    }
    const auto fastest =
        static_cast<size_t>(std::min_element(times.begin(), times.end()) - times.begin());
    pick_wins += fastest == pick;
    best_wins += fastest == best;
    taus.push_back(traces::kendall_tau(predicted, times));
  }
  std::sort(taus.begin(), taus.end());
  Resampled r;
  r.pick_share = static_cast<double>(pick_wins) / kDraws;
  r.best_share = static_cast<double>(best_wins) / kDraws;
  r.tau_p10 = taus[static_cast<size_t>(0.1 * (kDraws - 1))];
  r.tau_p90 = taus[static_cast<size_t>(0.9 * (kDraws - 1))];
  return r;
}

// LoopFigures::kendall_tau_resolved and its pair counts.
void resolved_tau(const std::vector<const LoopRow*>& measured, LoopFigures& f) {
  auto within_noise = [&measured](size_t i, size_t j) {
    const PlanTime& a = measured[i]->time;
    const PlanTime& b = measured[j]->time;
    return std::abs(a.measured_s - b.measured_s) <= a.noise_s + b.noise_s;
  };
  std::vector<double> predicted, times;
  for (const LoopRow* r : measured) {
    predicted.push_back(r->predicted_s);
    times.push_back(r->time.measured_s);
  }
  f.kendall_tau_resolved = traces::kendall_tau(predicted, times, within_noise);
  const size_t n = measured.size();
  f.pairs = static_cast<int64_t>(n * (n - 1) / 2);
  f.resolved_pairs = 0;
  for (size_t i = 0; i < n; ++i)
    for (size_t j = i + 1; j < n; ++j) f.resolved_pairs += within_noise(i, j) ? 0 : 1;
}

}  // namespace

LoopFigures loop_figures(const std::vector<LoopRow>& rows) {
  LoopFigures f;
  std::vector<const LoopRow*> measured;
  for (const LoopRow& r : rows)
    if (r.time.measured) measured.push_back(&r);
  double held_sum = 0, uncal_sum = 0, fit_sq = 0;
  int64_t fit_plans = 0;
  std::vector<double> predicted, times;
  for (const LoopRow* r : measured) {
    const double e = std::abs(r->error());
    if (r->heldout) {
      ++f.heldout_plans;
      held_sum += e;
      uncal_sum += std::abs(r->uncalibrated_error());
      f.heldout_max_abs_error = std::max(f.heldout_max_abs_error, e);
    } else {
      ++fit_plans;
      fit_sq += e * e;
      f.fit_plans_max_abs_error = std::max(f.fit_plans_max_abs_error, e);
    }
    predicted.push_back(r->predicted_s);
    times.push_back(r->time.measured_s);
    f.max_noise = std::max(f.max_noise, r->time.noise_s / r->time.measured_s);
    f.disturbed_runs += r->time.disturbed_runs;
  }
  if (f.heldout_plans > 0) {
    f.heldout_mean_abs_error = held_sum / static_cast<double>(f.heldout_plans);
    f.uncalibrated_heldout_mean_abs_error = uncal_sum / static_cast<double>(f.heldout_plans);
  }
  if (fit_plans > 0) f.fit_plans_rms_error = std::sqrt(fit_sq / static_cast<double>(fit_plans));
  if (!measured.empty()) {
    f.kendall_tau = traces::kendall_tau(predicted, times);
    f.regret = traces::regret(predicted, times);
    const auto pick = std::min_element(predicted.begin(), predicted.end()) - predicted.begin();
    const auto best = std::min_element(times.begin(), times.end()) - times.begin();
    const LoopRow& picked = *measured[static_cast<size_t>(pick)];
    const LoopRow& fastest = *measured[static_cast<size_t>(best)];
    f.predicted_best = picked.name;
    f.measured_best = fastest.name;
    f.regret_beyond_noise = picked.time.measured_s - fastest.time.measured_s >
                            picked.time.noise_s + fastest.time.noise_s;
    const Resampled drawn =
        resample_ranking(measured, static_cast<size_t>(pick), static_cast<size_t>(best));
    f.predicted_best_share = drawn.pick_share;
    f.measured_best_share = drawn.best_share;
    f.kendall_tau_p10 = drawn.tau_p10;
    f.kendall_tau_p90 = drawn.tau_p90;
    resolved_tau(measured, f);
  }
  return f;
}

// The fit (the benchmark and the median run of every fit plan, at the speed the runs' scales give
// it), written to the calibrated file, and every plan predicted with it: report's rows, figures and
// fit check. Throws FitRefused when the fit predicts its own runs worse, without `force`.
void fit_and_predict(const LoopSetup& s, const Measurements& m, const spec::ClusterSpec& base,
                     const std::function<void(const std::string&)>& say, LoopReport& report) {
  const std::string bench_file = s.out + "/bench.json";
  report.rows.clear();
  report.compare_plan.clear();
  report.compare_by_class.clear();
  std::vector<std::vector<double>> scales;
  const std::vector<PlanTime> times = plan_times(s, m, scales);
  report.speed_reference = s.speed_reference;
  std::vector<std::pair<std::string, spec::Trace>> runs;
  if (std::filesystem::exists(bench_file))
    runs.emplace_back(bench_file, spec::read_trace_file(bench_file));
  for (size_t p = 0; p < s.plans.size(); ++p) {
    const PlanTime& t = times[p];
    if (!t.measured) {
      say(fmt::format("   {}: no run succeeded ({})", s.plans[p].name, t.status));
      continue;
    }
    const size_t median_run = static_cast<size_t>(t.median_round - 1);
    const RunResult& median = m.runs[p][median_run];
    if (!s.plans[p].heldout && !median.trace_file.empty())
      runs.emplace_back(median.trace_file, at_speed(spec::read_trace_file(median.trace_file),
                                                    scales.empty() ? 1.0 : scales[p][median_run]));
  }
  say(fmt::format("== calibrating {}", s.cluster.name));
  RunFitOptions fit_options;
  fit_options.dtype = s.fit_dtype;
  const RunFit fit = fit_runs(base, runs, fit_options);
  report.fitted = fit.check;
  report.refused = fit.refused;
  report.fit_worse = !fit.refused.empty();
  report.calibrated_file = fmt::format("{}/{}-calibrated.json", s.out, s.cluster.name);
  if (!fit.refused.empty() && !s.force)
    throw FitRefused(fmt::format("{}: {} not written (--force goes on with it)", fit.refused,
                                 report.calibrated_file));
  const spec::ClusterSpec calibrated = fitted_cluster(fit);
  spec::write_json_file(report.calibrated_file, spec::to_json(calibrated));

  for (size_t p = 0; p < s.plans.size(); ++p) {
    const TrialPlan& trial = s.plans[p];
    const spec::ModelSpec model = models::resolve_model(trial.model);
    LoopRow row;
    row.name = trial.name;
    row.model = trial.model;
    row.ranks = trial.plan.world_size();
    row.heldout = trial.heldout;
    row.time = times[p];
    const spec::Plan plan = predicted_plan(s, trial);
    row.predicted_uncalibrated_s = step_time(model, s.cluster, plan, trial.name);
    row.predicted_s = step_time(model, calibrated, plan, trial.name);
    report.rows.push_back(row);
    if (trial.name != s.compare_plan || !row.time.measured) continue;
    // One plan op class by op class: where the calibrated model still errs.
    const RunResult& median = m.runs[p][static_cast<size_t>(row.time.median_round - 1)];
    if (median.trace_file.empty()) continue;
    sim::SimulationOptions options;
    options.plan_source = trial.name;
    options.trace = true;
    const sim::SimulationResult predicted = sim::simulate(model, calibrated, plan, options);
    spec::write_trace_file(fmt::format("{}/{}.predicted.json", s.out, trial.name),
                           *predicted.trace);
    report.compare_plan = trial.name;
    report.compare_by_class =
        traces::compare(spec::read_trace_file(median.trace_file), *predicted.trace).by_class;
  }
  report.figures = loop_figures(report.rows);
}

LoopReport close_loop(const LoopSetup& s, Machine& machine) {
  auto say = [&s](const std::string& line) {
    if (s.rounds.say) s.rounds.say(line);
  };
  std::filesystem::create_directories(s.out);
  LoopReport report;
  report.cluster = s.cluster.name;
  const std::string bench_file = s.out + "/bench.json";
  Measurements m;
  traces::OpSpeedRecord op_speeds;  // over the loop's rounds and extra rounds
  RoundOptions rounds = s.rounds;
  rounds.op_speeds = &op_speeds;
  if (s.refit) {
    say(fmt::format("== refitting the runs in {}", s.out));
    m = read_rounds(s.plans, s.out, s.rounds.repeats);
  } else {
    std::filesystem::remove(bench_file);
    say("== measuring what the fit needs beside the runs (sextant bench)");
    machine.benchmark(bench_file);
    m = measure_rounds(s.plans, machine, s.out, rounds);
  }
  report.waited_s = m.waited_s;

  // The cores' co-run slowdown is measured, not fitted: the fit sees each run's ops as if alone.
  spec::ClusterSpec base = s.cluster;
  const std::string co_run_file = s.out + "/co_run.json";
  if (!s.refit) {
    std::filesystem::remove(co_run_file);
    say("== measuring how much slower a core computes beside the others (bench cores --co-run)");
    machine.co_run(co_run_file);
  }
  if (std::filesystem::exists(co_run_file)) {
    base.device.co_run = read_co_run(co_run_file);
    if (base.device.co_run->devices < 2) base.device.co_run.reset();  // one core: nothing beside
    report.co_run = base.device.co_run;
  }

  fit_and_predict(s, m, base, say, report);
  if (!s.refit && s.rounds.extra_rounds > 0) {
    const std::vector<size_t> open = open_ranks(report.rows, report.figures);
    if (open.size() >= 2) {
      measure_more(s.plans, open, machine, s.out, rounds, s.rounds.extra_rounds, m);
      report.waited_s = m.waited_s;
      // Again on every run: the scales, the fit plans' medians and so the fit move with the extra
      // rounds, and a fit of the first rounds' speed judged against all rounds' would carry any
      // drift of the machine's speed between them into every plan's error (on a Zen 4 VM every
      // two-rank plan 9-13% slow, the fit plans too). --refit reads the same runs.
      say("== fitting again with the extra rounds");
      LoopReport again = report;
      try {
        fit_and_predict(s, m, base, say, again);
        report = std::move(again);
      } catch (const FitRefused& e) {
        // The first rounds' fit stands (its file is written; a refused one never is), judged
        // against every run: the measurement is not thrown away for want of a better fit.
        report.refused =
            fmt::format("with the extra rounds: {}; the first rounds' fit kept", e.what());
        std::vector<std::vector<double>> scales;
        const std::vector<PlanTime> all_times = plan_times(s, m, scales);
        for (size_t p = 0; p < s.plans.size(); ++p) report.rows[p].time = all_times[p];
        report.figures = loop_figures(report.rows);
      }
    }
  }
  for (size_t p = 0; p < s.plans.size(); ++p)
    if (m.runs[p].size() > static_cast<size_t>(s.rounds.repeats))
      report.rerun.push_back(s.plans[p].name);
  return report;
}

spec::Json to_json(const LoopReport& r) {
  const LoopFigures& f = r.figures;
  spec::Json plans = spec::Json::array();
  std::set<std::string> models;
  for (const LoopRow& row : r.rows) {
    models.insert(row.model);
    spec::Json j = {{"name", row.name},
                    {"model", row.model},
                    {"ranks", row.ranks},
                    {"heldout", row.heldout},
                    {"status", row.time.status},
                    {"predicted_s", row.predicted_s},
                    {"predicted_uncalibrated_s", row.predicted_uncalibrated_s},
                    {"uncertainty_s", f.fit_plans_rms_error * row.predicted_s},
                    {"disturbed_runs", row.time.disturbed_runs}};
    if (row.time.measured) {
      j["measured_s"] = row.time.measured_s;
      j["unscaled_s"] = row.time.unscaled_s;
      j["noise_s"] = row.time.noise_s;
      j["error"] = row.error();
      j["uncalibrated_error"] = row.uncalibrated_error();
    }
    plans.push_back(j);
  }
  spec::Json j = {
      {"models", models},
      {"cluster", r.cluster},
      {"calibrated_file", r.calibrated_file},
      {"plans", plans},
      {"heldout_plans", f.heldout_plans},
      {"heldout_mean_abs_error", f.heldout_mean_abs_error},
      {"heldout_max_abs_error", f.heldout_max_abs_error},
      {"uncalibrated_heldout_mean_abs_error", f.uncalibrated_heldout_mean_abs_error},
      {"kendall_tau", f.kendall_tau},
      {"regret", f.regret},
      {"predicted_best", f.predicted_best},
      {"measured_best", f.measured_best},
      {"op_class_errors", {{"plan", r.compare_plan}, {"by_class", rows_json(r.compare_by_class)}}},
      {"fit_plans_max_abs_error", f.fit_plans_max_abs_error},
      {"fit_plans_rms_error", f.fit_plans_rms_error},
      {"fit_worse", r.fit_worse},
      {"refused", r.refused},
      {"fitted_runs",
       {{"mean_abs_error", r.fitted.mean_abs_error_after()},
        {"max_abs_error", r.fitted.max_abs_error_after()},
        {"mean_abs_error_before", r.fitted.mean_abs_error_before()}}},
      {"max_noise", f.max_noise},
      {"disturbed_runs", f.disturbed_runs},
      {"quiet_wait_s", r.waited_s},
      {"regret_beyond_noise", f.regret_beyond_noise},
      {"predicted_best_share", f.predicted_best_share},
      {"measured_best_share", f.measured_best_share},
      {"kendall_tau_resolved", f.kendall_tau_resolved},
      {"resolved_pairs", f.resolved_pairs},
      {"pairs", f.pairs},
      {"kendall_tau_p10", f.kendall_tau_p10},
      {"kendall_tau_p90", f.kendall_tau_p90},
      {"rerun", r.rerun},
      {"speed_reference", r.speed_reference}};
  if (r.co_run)
    j["co_run"] = {
        {"devices", r.co_run->devices}, {"matrix", r.co_run->matrix}, {"memory", r.co_run->memory}};
  return j;
}

}  // namespace sextant::loop
