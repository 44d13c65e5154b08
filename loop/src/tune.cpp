// The budgeted trial loop (tune.hpp).
#include "sextant/loop/tune.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <set>

#include "sextant/loop/report_json.hpp"
#include "sextant/loop/run_fit.hpp"
#include "sextant/models/zoo.hpp"
#include "sextant/sim/simulator.hpp"
#include "sextant/spec/error.hpp"
#include "sextant/spec/json_io.hpp"

namespace sextant::loop {

namespace {

constexpr const char* kRecordSchema = "sextant.tune/1";
// An expectation off by this much leaves out only candidates expected 10x slower than the best.
constexpr double kMaxDoubt = 0.9;

void say(const TuneOptions& o, const std::string& line) {
  if (o.say) o.say(line);
}

spec::Json candidate_names(const std::vector<TrialPlan>& candidates) {
  spec::Json names = spec::Json::array();
  for (const TrialPlan& c : candidates) names.push_back(c.name);
  return names;
}

void write_record(const TuneOptions& o, const std::vector<TrialPlan>& candidates,
                  const std::vector<TuneTrial>& trials) {
  spec::Json rows = spec::Json::array();
  for (const TuneTrial& t : trials)
    rows.push_back({{"candidate", t.candidate},
                    {"name", candidates[t.candidate].name},
                    {"wall_s", t.wall_s},
                    {"expected_s", t.expected_s},
                    {"layout_guess", t.layout_guess},
                    {"calibrated", t.calibrated},
                    {"round", t.round},
                    {"confirms", t.confirms}});
  spec::write_file_atomically(
      tune_record_path(o),
      spec::Json{
          {"schema", kRecordSchema}, {"candidates", candidate_names(candidates)}, {"trials", rows}}
              .dump(2) +
          "\n");
}

// The trials an interrupted tune of the same candidates recorded, read back from their files.
std::vector<TuneTrial> read_record(const TuneOptions& o, const std::vector<TrialPlan>& candidates) {
  const std::string path = tune_record_path(o);
  if (!std::filesystem::exists(path)) return {};
  const spec::Json j = spec::read_json_file(path);
  if (!j.is_object() || j.value("schema", spec::Json()) != kRecordSchema ||
      j.value("candidates", spec::Json()) != candidate_names(candidates))
    throw InputError(path, "/candidates", "",
                     "the record of a tune of these candidates (another tune's record: give "
                     "another directory, or remove it to start over)");
  const spec::Json rows = j.value("trials", spec::Json());
  if (!rows.is_array()) throw InputError(path, "/trials", rows.dump(), "an array of trials");
  std::vector<TuneTrial> trials;
  for (size_t i = 0; i < rows.size(); ++i) {
    const spec::Json& row = rows[i];
    const std::string pointer = fmt::format("/trials/{}", i);
    const spec::Json index = row.is_object() ? row.value("candidate", spec::Json()) : spec::Json();
    const spec::Json wall = row.is_object() ? row.value("wall_s", spec::Json()) : spec::Json();
    if (!index.is_number_unsigned() || index.get<size_t>() >= candidates.size() ||
        !wall.is_number() || !std::isfinite(wall.get<double>()) || wall.get<double>() < 0)
      throw InputError(path, pointer, row.dump(),
                       fmt::format("{{\"candidate\": an index below {}, \"wall_s\": seconds >= 0}}",
                                   candidates.size()));
    TuneTrial t;
    t.candidate = index.get<size_t>();
    t.wall_s = wall.get<double>();
    const spec::Json expected = row.value("expected_s", spec::Json(0.0));
    t.expected_s = expected.is_number() ? expected.get<double>() : 0.0;
    t.layout_guess = row.value("layout_guess", spec::Json(false)) == spec::Json(true);
    t.calibrated = row.value("calibrated", spec::Json(false)) == spec::Json(true);
    t.confirms = row.value("confirms", spec::Json(false)) == spec::Json(true);
    const spec::Json round = row.value("round", spec::Json(1));
    if (!round.is_number_unsigned() || round.get<int64_t>() < 1)
      throw InputError(path, pointer + "/round", round.dump(),
                       "the candidate's run it was, from 1");
    t.round = round.get<int64_t>();
    t.time = plan_time({read_run(run_base(o.dir, candidates[t.candidate].name, t.round))});
    t.device_hours =
        t.wall_s * static_cast<double>(candidates[t.candidate].plan.world_size()) / 3600;
    trials.push_back(t);
  }
  return trials;
}

// The measured trace a trial's run left ("" when it left none: a stack's trial read from its log).
std::string trial_trace(const TuneOptions& o, const std::vector<TrialPlan>& candidates,
                        const TuneTrial& t) {
  const std::string file =
      run_base(o.dir, candidates[t.candidate].name, t.round) + ".measured.json";
  return t.time.measured && std::filesystem::exists(file) ? file : "";
}

std::vector<double> predict(const spec::ClusterSpec& cluster,
                            const std::vector<TrialPlan>& candidates,
                            const std::vector<spec::ModelSpec>& models) {
  std::vector<double> out;
  for (size_t i = 0; i < candidates.size(); ++i) {
    sim::SimulationOptions options;
    options.plan_source = candidates[i].name;
    out.push_back(
        sim::simulate(models[i], cluster, candidates[i].plan, options).report.step_time_s);
  }
  return out;
}

// The cluster fitted to the measured trials: to all of them, or when that fit fails or predicts
// its own runs worse (`refused` says why), to the longest run of first trials whose fit holds;
// `base` when none does. A function of the trials alone, so a resumed tune expects what the
// interrupted one did.
spec::ClusterSpec refit(const spec::ClusterSpec& base, const std::vector<TrialPlan>& candidates,
                        const std::vector<TuneTrial>& trials, const TuneOptions& o,
                        std::string& refused) {
  std::vector<std::pair<std::string, spec::Trace>> runs;
  for (const TuneTrial& t : trials)
    if (const std::string file = trial_trace(o, candidates, t); !file.empty())
      runs.emplace_back(file, spec::read_trace_file(file));
  refused.clear();
  RunFitOptions options;
  options.dtype = o.fit_dtype;
  for (size_t n = runs.size(); n > 0; --n) {
    const std::vector<std::pair<std::string, spec::Trace>> first(runs.begin(), runs.begin() + n);
    try {
      const RunFit fit = fit_runs(base, first, options);
      if (n == runs.size()) refused = fit.refused;
      if (fit.refused.empty()) return fitted_cluster(fit);
    } catch (const InputError& e) {
      if (n == runs.size()) refused = e.what();
    }
  }
  return base;
}

double rms(const std::vector<double>& errors) {
  double sum = 0;
  for (double e : errors) sum += e * e;
  return errors.empty() ? 0 : std::sqrt(sum / static_cast<double>(errors.size()));
}

// Per candidate, the trial its time is taken from: the upper median of its measured trials, by
// time (TuneReport::candidate_trial).
std::vector<std::optional<size_t>> candidate_trials(size_t candidates,
                                                    const std::vector<TuneTrial>& trials) {
  std::vector<std::vector<size_t>> of(candidates);
  for (size_t i = 0; i < trials.size(); ++i)
    if (trials[i].time.measured) of[trials[i].candidate].push_back(i);
  std::vector<std::optional<size_t>> out(candidates);
  for (size_t c = 0; c < candidates; ++c) {
    if (of[c].empty()) continue;
    std::sort(of[c].begin(), of[c].end(), [&](size_t a, size_t b) {
      return trials[a].time.measured_s < trials[b].time.measured_s;
    });
    out[c] = of[c][of[c].size() / 2];
  }
  return out;
}

// The measured trial of `plan`'s layout with the micro-batch nearest its own (none: no such run),
// of the trials candidates' times are taken from.
const TuneTrial* nearest_of_layout(const std::vector<TrialPlan>& candidates,
                                   const std::vector<TuneTrial>& trials,
                                   const std::vector<std::optional<size_t>>& candidate_trial,
                                   const spec::Plan& plan) {
  const auto distance = [&](const spec::Plan& p) {
    return std::abs(std::log(static_cast<double>(p.micro_batch)) -
                    std::log(static_cast<double>(plan.micro_batch)));
  };
  const TuneTrial* nearest = nullptr;
  for (const std::optional<size_t>& i : candidate_trial) {
    if (!i) continue;
    const TuneTrial& t = trials[*i];
    const spec::Plan& ran = candidates[t.candidate].plan;
    if (layout_of(ran) != layout_of(plan)) continue;
    if (!nearest || distance(ran) < distance(candidates[nearest->candidate].plan)) nearest = &t;
  }
  return nearest;
}

std::string percent(std::optional<double> doubt) {
  return doubt ? fmt::format("{:.1f}", 100 * *doubt) : "none checked: 90";
}

// How much faster than expected the last two of a kind ran: the larger of their errors
// (expected / measured - 1), 0 when both ran slower than expected; none when none was checked.
// Only the last two: a fit grows more trustworthy as it sees more layouts, and what it missed
// before a layout ran says little of it after. Only the fast side: the question is whether a
// candidate left could beat the best, and an expectation that proved optimistic argues the other
// way (the run noise has its own margin in the stopping rule).
std::optional<double> last_two_doubt(std::vector<double> errors) {
  if (errors.empty()) return std::nullopt;
  if (errors.size() > 2) errors.erase(errors.begin(), errors.end() - 2);
  double doubt = 0;
  for (double e : errors) doubt = std::max(doubt, e);
  return doubt;
}

// Each candidate's expected time: measured; or, when its layout ran, the fit's prediction times
// the measured-over-predicted ratio of that layout's run nearest in micro-batch; or the fit's
// prediction. With the RMS error of the fit on its runs, and of each kind of expectation (a
// layout's guess, a new layout's prediction) on the last two trials it chose, before they ran:
// how far to trust that kind on what has not run.
void expect(const std::vector<TrialPlan>& candidates, const std::vector<double>& predicted,
            const std::vector<TuneTrial>& trials, TuneReport& r) {
  std::vector<double> fit_errors, layout_errors, new_layout_errors;
  for (const TuneTrial& t : trials) {
    if (!t.time.measured) continue;
    fit_errors.push_back(predicted[t.candidate] / t.time.measured_s - 1);
    if (t.calibrated)
      (t.layout_guess ? layout_errors : new_layout_errors)
          .push_back(t.expected_s / t.time.measured_s - 1);
  }
  r.fit_error = rms(fit_errors);
  r.layout_guess_doubt = last_two_doubt(layout_errors);
  r.new_layout_doubt = last_two_doubt(new_layout_errors);
  r.expected_s = predicted;
  r.layout_guess.assign(candidates.size(), false);
  r.candidate_trial = candidate_trials(candidates.size(), trials);
  for (size_t c = 0; c < candidates.size(); ++c) {
    const TuneTrial* nearest =
        nearest_of_layout(candidates, trials, r.candidate_trial, candidates[c].plan);
    if (!nearest) continue;
    if (nearest->candidate == c) {
      r.expected_s[c] = nearest->time.measured_s;
    } else {
      r.expected_s[c] = predicted[c] * nearest->time.measured_s / predicted[nearest->candidate];
      r.layout_guess[c] = true;
    }
  }
}

std::optional<size_t> measured_best(const std::vector<TuneTrial>& trials,
                                    const std::vector<std::optional<size_t>>& candidate_trial) {
  std::optional<size_t> best;
  for (const std::optional<size_t>& i : candidate_trial)
    if (i && (!best || trials[*i].time.measured_s < trials[*best].time.measured_s)) best = i;
  return best;
}

// The device-hours of every candidate run once: the measured trials' walls, and for the others
// the trials' mean start-up plus their steps at the calibrated prediction.
double grid_device_hours(const std::vector<TrialPlan>& candidates,
                         const std::vector<double>& predicted, const std::vector<TuneTrial>& trials,
                         int64_t steps) {
  std::map<size_t, double> wall;
  double startup = 0;
  int64_t measured = 0;
  for (const TuneTrial& t : trials) {
    wall.emplace(t.candidate, t.wall_s);  // a grid runs each once: its first trial's wall
    if (t.time.measured) {
      startup += std::max(0.0, t.wall_s - static_cast<double>(steps) * t.time.measured_s);
      ++measured;
    }
  }
  if (measured > 0) startup /= static_cast<double>(measured);
  double hours = 0;
  for (size_t c = 0; c < candidates.size(); ++c) {
    const double w = wall.count(c) ? wall[c] : startup + static_cast<double>(steps) * predicted[c];
    hours += w * static_cast<double>(candidates[c].plan.world_size()) / 3600;
  }
  return hours;
}

// How much slower than its one run the measured best is expected by the fit of the other trials
// (predicted / measured - 1), when that exceeds the noise plus the fit's RMS error on the runs it
// was fitted to; none otherwise, and when its time rests on more than one run, no other trial left
// a trace to fit (a stack's trials are read from their logs) or their fit was refused. Such a run
// may be a fast spell of the machine rather than a fast plan (on the Intel CI VM a tune's first
// trial ran 96.9 ms where two other tunes measured the plan at 117.9 and 122.7 ms,
// bench/results/tune_local.md), and taken as the best it ends the search for anything faster: it
// runs again before the tune stops.
std::optional<double> surprising_best(const spec::ClusterSpec& base,
                                      const std::vector<TrialPlan>& candidates,
                                      const std::vector<spec::ModelSpec>& models,
                                      const TuneReport& r, const TuneOptions& o) {
  if (!r.chosen) return std::nullopt;
  const TuneTrial& best = r.trials[*r.chosen];
  std::vector<TuneTrial> others;
  for (const TuneTrial& t : r.trials) {
    if (!t.time.measured) continue;
    if (t.candidate == best.candidate && &t != &best) return std::nullopt;  // ran twice
    if (t.candidate != best.candidate) others.push_back(t);
  }
  if (std::none_of(others.begin(), others.end(),
                   [&](const TuneTrial& t) { return !trial_trace(o, candidates, t).empty(); }))
    return std::nullopt;
  std::string refused;
  const spec::ClusterSpec fitted = refit(base, candidates, others, o, refused);
  if (!refused.empty()) return std::nullopt;
  const std::vector<double> predicted = predict(fitted, candidates, models);
  std::vector<double> errors;
  for (const TuneTrial& t : others)
    errors.push_back(predicted[t.candidate] / t.time.measured_s - 1);
  const double by = predicted[best.candidate] / best.time.measured_s - 1;
  if (by <= o.noise + rms(errors)) return std::nullopt;
  return by;
}

TuneTrial run_trial(const std::vector<TrialPlan>& candidates, size_t c, int64_t round,
                    Machine& machine, const TuneOptions& o, bool first,
                    traces::OpSpeedRecord& op_speeds) {
  RoundOptions rounds;
  rounds.op_speeds = &op_speeds;
  rounds.repeats = 1;
  rounds.first_round = round;
  rounds.steps = o.steps;
  rounds.warm_up = first;  // the machine's first run (caches, page faults) is not a trial
  rounds.extra_rounds = 0;
  rounds.quiet_wait_s = o.quiet_wait_s;
  rounds.say = o.say;
  const auto start = std::chrono::steady_clock::now();
  const Measurements m = measure_rounds({candidates[c]}, machine, o.dir, rounds);
  TuneTrial t;
  t.candidate = c;
  t.round = round;
  t.time = plan_time(m.runs[0]);
  t.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  t.device_hours = t.wall_s * static_cast<double>(candidates[c].plan.world_size()) / 3600;
  return t;
}

}  // namespace

std::string tune_record_path(const TuneOptions& o) {
  return o.dir + "/tune.json";
}

// The plans of one layout run the same collectives, so the fit's error on one is the best guess of
// its error on another.
std::string layout_of(const spec::Plan& p) {
  return fmt::format("dp{}.tp{}.pp{}.cp{}.ep{}.z{}.s{}.v{}.g{}x{}x{}", p.dp, p.tp, p.pp, p.cp, p.ep,
                     p.zero, static_cast<int>(p.schedule), p.virtual_stages, p.tp_grid.x,
                     p.tp_grid.y, p.tp_grid.z);
}

std::vector<size_t> spanning_candidates(const std::vector<spec::Plan>& ranked, size_t count) {
  std::vector<size_t> out;
  std::vector<bool> taken(ranked.size(), false);
  std::set<std::string> layouts;
  for (size_t i = 0; i < ranked.size() && out.size() < count; ++i)
    if (layouts.insert(layout_of(ranked[i])).second) {
      out.push_back(i);
      taken[i] = true;
    }
  for (size_t i = 0; i < ranked.size() && out.size() < count; ++i)
    if (!taken[i]) out.push_back(i);
  std::sort(out.begin(), out.end());
  return out;
}

TuneReport tune(const spec::ClusterSpec& base, const std::vector<TrialPlan>& candidates,
                Machine& machine, const TuneOptions& o) {
  if (candidates.empty()) throw InputError("tune", "", "", "at least one candidate plan");
  std::filesystem::create_directories(o.dir);
  std::vector<spec::ModelSpec> models;
  for (const TrialPlan& c : candidates) models.push_back(models::resolve_model(c.model));
  TuneReport r;
  r.cluster = base;
  r.trials = read_record(o, candidates);
  r.resumed_trials = static_cast<int64_t>(r.trials.size());
  if (r.resumed_trials > 0) say(o, fmt::format("resuming: {} trials recorded", r.resumed_trials));
  r.predicted_before_s = predict(base, candidates, models);
  // Unlimited, each candidate run once and confirmed at most once, unless given.
  const int64_t max_trials =
      o.max_trials > 0 ? o.max_trials : 2 * static_cast<int64_t>(candidates.size());
  traces::OpSpeedRecord op_speeds;  // how fast each op ran in the trials so far
  for (;;) {
    r.cluster = refit(base, candidates, r.trials, o, r.fit_refused);
    r.predicted_after_s = predict(r.cluster, candidates, models);
    expect(candidates, r.predicted_after_s, r.trials, r);
    r.chosen = measured_best(r.trials, r.candidate_trial);
    r.device_hours = 0;
    for (const TuneTrial& t : r.trials) r.device_hours += t.device_hours;
    // The candidate expected fastest of those not run that is expected to beat the measured best
    // by more than the noise.
    std::vector<bool> tried(candidates.size(), false);
    for (const TuneTrial& t : r.trials) tried[t.candidate] = true;
    const double bar =
        r.chosen ? r.trials[*r.chosen].time.measured_s : std::numeric_limits<double>::infinity();
    // How much faster than expected a candidate may run: as much as the last ones of its kind
    // did; before one was checked, enough to leave nothing out.
    const double layout_doubt = std::min(kMaxDoubt, r.layout_guess_doubt.value_or(kMaxDoubt));
    const double new_layout_doubt = std::min(kMaxDoubt, r.new_layout_doubt.value_or(kMaxDoubt));
    std::optional<size_t> next;
    for (size_t c = 0; c < candidates.size(); ++c)
      if (!tried[c] &&
          r.expected_s[c] * (1 - (r.layout_guess[c] ? layout_doubt : new_layout_doubt)) <
              bar * (1 - o.noise) &&
          (!next || r.expected_s[c] < r.expected_s[*next]))
        next = c;
    std::optional<double> surprise;
    if (!next && (surprise = surprising_best(base, candidates, models, r, o)))
      next = r.trials[*r.chosen].candidate;
    if (!next) {
      r.converged = r.chosen.has_value();
      r.stopped = r.converged ? fmt::format(
                                    "no candidate left could beat the measured best by more than "
                                    "the noise ({:.0f}%), were it as much faster than expected "
                                    "as the last ones of its kind ({}% in a layout that ran, {}% "
                                    "in others)",
                                    100 * o.noise, percent(r.layout_guess_doubt),
                                    percent(r.new_layout_doubt))
                              : "every candidate was tried and none ran";
      break;
    }
    if (static_cast<int64_t>(r.trials.size()) >= max_trials) {
      r.stopped = fmt::format("the budget of {} trials is spent", max_trials);
      break;
    }
    if (o.max_device_hours > 0 && r.device_hours >= o.max_device_hours) {
      r.stopped = fmt::format("the budget of {:.3g} device-hours is spent", o.max_device_hours);
      break;
    }
    say(o,
        surprise
            ? fmt::format("trial {}: {} again: its one run, {:.2f} ms, beat what the other "
                          "trials predict of it by {:.0f}%",
                          r.trials.size() + 1, candidates[*next].name, 1e3 * bar, 100 * *surprise)
            : fmt::format("trial {}: {} (expected {:.2f} ms; best measured so far {})",
                          r.trials.size() + 1, candidates[*next].name, 1e3 * r.expected_s[*next],
                          r.chosen ? fmt::format("{:.2f} ms", 1e3 * bar) : "none"));
    // A confirmation's expectation is its own run: not a check of the fit (calibrated false).
    const bool calibrated = r.fit_refused.empty() && !r.trials.empty() && !surprise;
    const int64_t round =
        1 + std::count_if(r.trials.begin(), r.trials.end(),
                          [&](const TuneTrial& t) { return t.candidate == *next; });
    TuneTrial t = run_trial(candidates, *next, round, machine, o, r.trials.empty(), op_speeds);
    t.expected_s = r.expected_s[*next];
    t.layout_guess = r.layout_guess[*next];
    t.calibrated = calibrated;
    t.confirms = surprise.has_value();
    r.trials.push_back(t);
    write_record(o, candidates, r.trials);
  }
  r.grid_device_hours = grid_device_hours(candidates, r.predicted_after_s, r.trials, o.steps);
  return r;
}

}  // namespace sextant::loop
