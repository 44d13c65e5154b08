// Interleaved rounds of runs between core checks.
#include "sextant/loop/rounds.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <tuple>

#include "sextant/spec/step_times.hpp"
#include "sextant/traces/rank_speeds.hpp"

namespace sextant::loop {

namespace {

class RoundRunner {
 public:
  RoundRunner(Machine& machine, const RoundOptions& options) : m_(machine), o_(options) {}

  // One run of `plan` kept for the round: run again while a core check around it finds the
  // machine disturbed, at most o_.tries times and while the waiting budget lasts; a run that
  // stays disturbed is kept and marked (base.disturbed says how).
  RunResult measure(const TrialPlan& plan, const std::string& base, int64_t round) {
    RunResult r;
    for (int attempt = 1; attempt <= o_.tries; ++attempt) {
      const bool quiet_before = wait_for_quiet();
      r = m_.run(plan, o_.steps, base);
      std::string after = m_.disturbance();
      std::string unsteady = unsteady_steps(r);
      if (unsteady.empty()) unsteady = slow_cores(r, o_.op_speeds ? *o_.op_speeds : own_speeds_);
      if (quiet_before && after.empty() && unsteady.empty()) {
        std::filesystem::remove(base + ".disturbed");
        r.disturbed.clear();
        return r;
      }
      r.disturbed = !after.empty() ? after : !unsteady.empty() ? unsteady : last_disturbance_;
      std::ofstream(base + ".disturbed") << r.disturbed << "\n";
      if (o_.say)
        o_.say(fmt::format("   {} round {} (try {}): {}", plan.name, round, attempt, r.disturbed));
      if (waited_s_ >= o_.quiet_wait_s) break;
    }
    return r;
  }

  double waited_s() const { return waited_s_; }

 private:
  // True once the cores are quiet, false when the waiting budget ran out first.
  bool wait_for_quiet() {
    for (;;) {
      last_disturbance_ = m_.disturbance();
      if (last_disturbance_.empty()) return true;
      if (waited_s_ >= o_.quiet_wait_s) return false;
      m_.pause(1);
      waited_s_ += 1;
    }
  }

  Machine& m_;
  const RoundOptions& o_;
  double waited_s_ = 0;
  std::string last_disturbance_;
  traces::OpSpeedRecord own_speeds_;
};

}  // namespace

std::string unsteady_steps(const RunResult& run) {
  if (!run.ok()) return "";
  const std::vector<double> steps = spec::steps_after_warmup(run.step_times_s);
  if (steps.size() < 2) return "";
  const auto [fastest, slowest] = std::minmax_element(steps.begin(), steps.end());
  if (*fastest <= 0 || *slowest / *fastest - 1 <= kMaxStepSpread) return "";
  return fmt::format("its steps ranged {:.1f}-{:.1f} ms (+{:.0f}%): disturbed during the run",
                     *fastest * 1e3, *slowest * 1e3, 100 * (*slowest / *fastest - 1));
}

std::string slow_cores(const RunResult& run, traces::OpSpeedRecord& record) {
  if (!run.ok() || run.trace_file.empty()) return "";
  const int64_t warm_up = static_cast<int64_t>(run.step_times_s.size() -
                                               spec::steps_after_warmup(run.step_times_s).size());
  const spec::Trace trace = spec::read_trace_file(run.trace_file);
  const traces::RankSpeeds speeds = traces::rank_speeds(trace, warm_up);
  const traces::OpSpeedRecord::Verdict before = record.judge_then_record(trace, warm_up);
  if (speeds.spread() > kMaxRankSpread) {
    const int64_t slow = speeds.slowest_rank(), fast = speeds.fastest_rank();
    return fmt::format(
        "rank {} computed the ops every rank ran {:.0f}% slower than rank {} ({:.1f} against "
        "{:.1f} ms): a slow core during the run",
        slow, 100 * speeds.spread(), fast, 1e3 * speeds.compute_s[static_cast<size_t>(slow)],
        1e3 * speeds.compute_s[static_cast<size_t>(fast)]);
  }
  if (before.covered >= kMinKnownShare && before.slowdown > kMaxCoreSlowdown)
    return fmt::format(
        "every rank computed {:.0f}% slower than earlier runs of the same ops: slow cores during "
        "the run",
        100 * before.slowdown);
  return "";
}

std::string run_base(const std::string& out, const std::string& name, int64_t round) {
  return fmt::format("{}/{}.r{}", out, name, round);
}

Measurements measure_rounds(const std::vector<TrialPlan>& plans, Machine& machine,
                            const std::string& out, const RoundOptions& options) {
  std::filesystem::create_directories(out);
  RoundRunner runner(machine, options);
  Measurements m;
  m.runs.resize(plans.size());
  // The machine's first runs after a build or an idle spell are slower (caches, clocks).
  if (options.warm_up && !plans.empty()) {
    if (options.say) options.say("== warming up (one run, discarded)");
    runner.measure(plans.front(), run_base(out, "warmup", 0), 0);
  }
  for (int64_t i = 0; i < options.repeats; ++i) {
    const int64_t round = options.first_round + i;
    if (options.say)
      options.say(fmt::format("== round {} of {}: measuring {} plans", i + 1, options.repeats,
                              plans.size()));
    for (size_t p = 0; p < plans.size(); ++p)
      m.runs[p].push_back(runner.measure(plans[p], run_base(out, plans[p].name, round), round));
  }
  m.waited_s = runner.waited_s();
  return m;
}

void measure_more(const std::vector<TrialPlan>& plans, const std::vector<size_t>& which,
                  Machine& machine, const std::string& out, const RoundOptions& options,
                  int64_t count, Measurements& m) {
  RoundOptions rest = options;  // the waiting budget is the loop's in all, not per call
  rest.quiet_wait_s = std::max(0.0, options.quiet_wait_s - m.waited_s);
  RoundRunner runner(machine, rest);
  for (int64_t extra = 1; extra <= count; ++extra) {
    if (options.say)
      options.say(fmt::format("== extra round {} of {}: {} plans within the noise of the best",
                              extra, count, which.size()));
    for (size_t p : which) {
      const int64_t round = static_cast<int64_t>(m.runs[p].size()) + 1;
      m.runs[p].push_back(runner.measure(plans[p], run_base(out, plans[p].name, round), round));
    }
  }
  m.waited_s += runner.waited_s();
}

Measurements read_rounds(const std::vector<TrialPlan>& plans, const std::string& out,
                         int64_t repeats) {
  Measurements m;
  for (const TrialPlan& p : plans) {
    m.runs.emplace_back();
    for (int64_t round = 1; round <= repeats; ++round)
      m.runs.back().push_back(read_run(run_base(out, p.name, round)));
    for (int64_t round = repeats + 1;
         std::filesystem::exists(run_base(out, p.name, round) + ".steps.jsonl"); ++round)
      m.runs.back().push_back(read_run(run_base(out, p.name, round)));
  }
  return m;
}

double median_of_kept(std::vector<double> kept) {
  std::sort(kept.begin(), kept.end());
  return kept[(kept.size() - 1) / 2];
}

std::vector<std::vector<double>> speed_scales(const Measurements& m) {
  std::vector<spec::Trace> traces;
  std::vector<int64_t> first_steps;
  std::vector<const RunResult*> traced;
  std::vector<std::pair<size_t, size_t>> where;  // (plan, round index) of each trace
  for (size_t p = 0; p < m.runs.size(); ++p)
    for (size_t i = 0; i < m.runs[p].size(); ++i) {
      const RunResult& r = m.runs[p][i];
      if (!r.ok() || r.trace_file.empty() || !r.mean_step_s()) continue;
      traces.push_back(spec::read_trace_file(r.trace_file));
      first_steps.push_back(static_cast<int64_t>(r.step_times_s.size() -
                                                 spec::steps_after_warmup(r.step_times_s).size()));
      traced.push_back(&r);
      where.emplace_back(p, i);
    }
  std::vector<const spec::Trace*> runs;
  for (const spec::Trace& t : traces) runs.push_back(&t);
  const std::vector<double> slowdowns = traces::slowdowns_against_fastest(runs, first_steps);
  std::vector<std::vector<double>> scales(m.runs.size());
  for (size_t p = 0; p < m.runs.size(); ++p) scales[p].assign(m.runs[p].size(), 1.0);
  // The quiet runs' speed, per rank count: a run's slowdown is against the fastest runs of its
  // own rank count (traces::slowdowns_against_fastest keys its ops by it), so only runs of one
  // count share a unit. The median slowdown of that count's runs no check found disturbed (of all
  // of them when none was quiet). One median over every run mixed the units: on a Zen 4 VM whose
  // one-rank runs fell in two speeds 18% apart, it scaled the two-rank runs up and predicted every
  // two-rank plan 3-10% slow, the fit plans included.
  std::map<int64_t, std::vector<double>> quiet, all;
  std::vector<int64_t> ranks;
  for (size_t j = 0; j < traced.size(); ++j) {
    int64_t count = 0;
    for (const spec::TraceEvent& e : traces[j].events) count = std::max(count, e.rank + 1);
    ranks.push_back(count);
    all[count].push_back(slowdowns[j]);
    if (traced[j]->disturbed.empty()) quiet[count].push_back(slowdowns[j]);
  }
  auto typical = [&quiet, &all](int64_t count) {
    std::vector<double> v = quiet[count].empty() ? all[count] : quiet[count];
    std::sort(v.begin(), v.end());
    return v[(v.size() - 1) / 2];
  };
  for (size_t j = 0; j < traced.size(); ++j)
    if (!traced[j]->disturbed.empty())
      scales[where[j].first][where[j].second] = (1 + typical(ranks[j])) / (1 + slowdowns[j]);
  return scales;
}

PlanTime plan_time(const std::vector<RunResult>& rounds, const std::vector<double>* scales) {
  PlanTime t;
  t.status = "no runs";
  // (scaled mean step, round, mean step as measured)
  std::vector<std::tuple<double, int64_t, double>> quiet, all;
  for (size_t i = 0; i < rounds.size(); ++i) {
    const RunResult& r = rounds[i];
    if (!r.ok() || !r.mean_step_s()) {
      t.status = r.status;
      continue;
    }
    const double scale = scales ? scales->at(i) : 1.0;
    const auto run =
        std::tuple{*r.mean_step_s() * scale, static_cast<int64_t>(i) + 1, *r.mean_step_s()};
    all.push_back(run);
    if (r.disturbed.empty()) {
      quiet.push_back(run);
    } else {
      ++t.disturbed_runs;
    }
  }
  std::vector<std::tuple<double, int64_t, double>>& kept = quiet.empty() || scales ? all : quiet;
  if (kept.empty()) return t;
  std::sort(kept.begin(), kept.end());
  const auto& median = kept[(kept.size() - 1) / 2];
  t.measured = true;
  t.status = "ok";
  t.measured_s = std::get<0>(median);
  t.median_round = std::get<1>(median);
  t.unscaled_s = std::get<2>(median);
  t.quiet_runs = static_cast<int64_t>(quiet.size());
  t.noise_s = (std::get<0>(kept.back()) - std::get<0>(kept.front())) / 2;
  for (const auto& run : kept) t.kept_s.push_back(std::get<0>(run));
  return t;
}

}  // namespace sextant::loop
