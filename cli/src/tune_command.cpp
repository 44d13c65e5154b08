// `sextant tune`: the planner's K best predictions as candidates, then the budgeted trial loop
// (loop/tune.hpp) on this machine's ranks or as Slurm jobs; --grid runs every candidate instead.
#include <fmt/format.h>

#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>

#include "commands.hpp"
#include "format.hpp"
#include "plan_options.hpp"
#include "search_flags.hpp"
#include "sextant/interop/export.hpp"
#include "sextant/loop/process_machine.hpp"
#include "sextant/loop/report_json.hpp"
#include "sextant/loop/tune.hpp"
#include "sextant/sim/step_setup.hpp"
#include "sextant/spec/json_io.hpp"
#include "sextant/spec/stack_support.hpp"
#include "slurm_machine.hpp"
#include "validators.hpp"

namespace sextant::cli {

namespace {

struct TuneFlags {
  SearchFlags search;
  int64_t gpus = 0;
  int64_t candidates = 12;
  loop::TuneOptions tune;
  double trial_timeout = 300;
  bool slurm = false;
  interop::SlurmRequest request;
  int64_t grid = 0;  // rounds of every candidate instead of tuning (0: tune)
  std::string out, calibrated_out;
  std::string to = "sextant";  // who trains the trials: Sextant, or a stack (with --slurm)
  // The core checks around each trial on CPU ranks: on for local trials, off under --slurm (run
  // inside each trial's job; shared nodes flag most runs, bench/results), unless the flags say.
  bool core_check = false, no_core_check = false;
  bool checks_cores() const { return core_check || (!no_core_check && !slurm); }
  std::string script;  // the stack's entry point (launch --script)
};

// The trial's settings for the stack `to` names (launch --to), for plans of `model` on `cluster`.
std::function<interop::Exported(const spec::Plan&, int64_t)> stack_exporter(
    const std::string& to, const spec::ModelSpec& model, const spec::ClusterSpec& cluster) {
  const auto target = spec::enum_from_name(interop::target_names(), to);
  if (!target)
    throw InputError("command line", "--to", to,
                     "must be sextant or one of " + spec::enum_choices(interop::target_names()));
  return [target = *target, model, cluster](const spec::Plan& plan, int64_t steps) {
    const spec::Stack stack =
        spec::plan_stack(plan, cluster.device.kind == spec::DeviceKind::kGpu, model.kind());
    return interop::export_plan(plan, model, stack,
                                sim::step_precision(cluster, plan, stack).gemm_dtype, target,
                                interop::Trial{steps});
  };
}

std::vector<loop::TrialPlan> candidates_of(const TuneFlags& f,
                                           const planner::SearchRequest& request) {
  // Candidates that span the layouts of the best predictions: near-identical plans of one layout
  // differ by less than a trial can tell, and the model's ranking of layouts is what trials check.
  planner::SearchOptions options = options_from(f.search);
  options.top_k = std::max<int64_t>(48, 4 * f.candidates);
  options.leaders = std::max(options.leaders, options.top_k);
  const planner::SearchResult result = planner::search(request, options);
  std::vector<spec::Plan> ranked;
  // With --to, the plans the stack's flags can say (the search already keeps to what it runs).
  std::function<interop::Exported(const spec::Plan&, int64_t)> exporter;
  if (f.to != "sextant") exporter = stack_exporter(f.to, request.model, request.cluster);
  for (const planner::RankedPlan& p : result.ranked) try {
      if (exporter) exporter(p.plan, f.tune.steps);
      ranked.push_back(p.plan);
    } catch (const InputError&) {
    }
  if (result.ranked.empty())
    throw InputError("command line", "--gpus", std::to_string(f.gpus),
                     "a GPU count where some plan fits (`sextant plan` says what does)");
  const std::string model = model_for_jobs(f.search.model);
  std::vector<loop::TrialPlan> out;
  for (size_t i : loop::spanning_candidates(ranked, static_cast<size_t>(f.candidates)))
    out.push_back(
        {fmt::format("c{:02}.{}", out.size() + 1, ranked[i].name()), model, ranked[i], false});
  return out;
}

std::unique_ptr<loop::Machine> machine_for(const TuneFlags& f, const spec::ModelSpec& model,
                                           const spec::ClusterSpec& cluster) {
  const bool gpu = cluster.device.kind == spec::DeviceKind::kGpu;
  // CPU ranks: a trial runs again while the core check around it finds a core slow, as the
  // loop's do (loop/rounds.hpp). The fastest core times seen are kept in the tune's directory,
  // started afresh unless the tune resumes from its record there.
  std::string cores_reference;
  if (!gpu && f.checks_cores()) {
    cores_reference = f.tune.dir + "/cores.json";
    if (!std::filesystem::exists(loop::tune_record_path(f.tune)))
      std::filesystem::remove(cores_reference);
  }
  if (f.slurm) {
    SlurmMachineOptions o;
    o.request = f.request;
    o.devices_per_node = cluster.devices_per_node;
    o.gpus = gpu;
    o.sextant = loop::self_executable();
    if (f.to != "sextant") {
      o.exporter = stack_exporter(f.to, model, cluster);
      o.entry = f.script;
      o.model = model;
    }
    // (Not for a stack's trials: its launcher holds the node, not Sextant's ranks.)
    if (f.to == "sextant") o.cores_reference = cores_reference;
    return std::make_unique<SlurmMachine>(o);
  }
  loop::ProcessMachineOptions o;
  o.sextant = loop::self_executable();
  o.run_args = {"--backend", gpu ? "cuda" : "cpu"};
  o.timeout_s = f.trial_timeout;
  o.cores_reference = cores_reference;
  return std::make_unique<loop::ProcessMachine>(o);
}

void print_grid(const std::vector<loop::TrialPlan>& c, const loop::Measurements& m, bool json) {
  spec::Json rows = spec::Json::array();
  std::optional<size_t> best;
  std::vector<loop::PlanTime> times;
  for (size_t i = 0; i < c.size(); ++i) {
    times.push_back(loop::plan_time(m.runs[i]));
    if (times[i].measured && (!best || times[i].measured_s < times[*best].measured_s)) best = i;
  }
  if (json) {
    for (size_t i = 0; i < c.size(); ++i)
      rows.push_back({{"name", c[i].name},
                      {"measured_s", times[i].measured ? spec::Json(times[i].measured_s) : nullptr},
                      {"noise_s", times[i].noise_s},
                      {"kept_s", times[i].kept_s},
                      {"quiet_runs", times[i].quiet_runs},
                      {"status", times[i].status}});
    std::cout << spec::Json{{"grid", rows}, {"measured_best", best ? c[*best].name : ""}}.dump(2)
              << "\n";
    return;
  }
  fmt::print("{:<34} {:>10} {:>9}  {}\n", "candidate", "measured", "noise", "status");
  for (size_t i = 0; i < c.size(); ++i)
    fmt::print("{:<34} {:>10} {:>9}  {}\n", c[i].name,
               times[i].measured ? human_seconds(times[i].measured_s) : "-",
               times[i].measured ? human_seconds(times[i].noise_s) : "-", times[i].status);
  if (best) fmt::print("measured best: {}\n", c[*best].name);
}

// Each candidate's measured time: its trials' upper median (none when none ran).
std::vector<std::optional<double>> candidate_times(const std::vector<loop::TrialPlan>& c,
                                                   const loop::TuneReport& r) {
  std::vector<std::optional<double>> out(c.size());
  for (size_t i = 0; i < c.size() && i < r.candidate_trial.size(); ++i)
    if (r.candidate_trial[i]) out[i] = r.trials[*r.candidate_trial[i]].time.measured_s;
  return out;
}

spec::Json report_json(const std::vector<loop::TrialPlan>& c, const loop::TuneReport& r) {
  spec::Json candidates = spec::Json::array();
  const std::vector<std::optional<double>> measured = candidate_times(c, r);
  for (size_t i = 0; i < c.size(); ++i)
    candidates.push_back({{"name", c[i].name},
                          {"plan", spec::to_json(c[i].plan)},
                          {"predicted_before_s", r.predicted_before_s[i]},
                          {"predicted_after_s", r.predicted_after_s[i]},
                          {"expected_s", r.expected_s[i]},
                          {"layout_guess", static_cast<bool>(r.layout_guess[i])},
                          {"measured_s", measured[i] ? spec::Json(*measured[i]) : nullptr}});
  spec::Json trials = spec::Json::array();
  for (const loop::TuneTrial& t : r.trials)
    trials.push_back({{"name", c[t.candidate].name},
                      {"status", t.time.status},
                      {"measured_s", t.time.measured ? spec::Json(t.time.measured_s) : nullptr},
                      {"expected_s", t.expected_s},
                      {"confirms", t.confirms},
                      {"wall_s", t.wall_s},
                      {"device_hours", t.device_hours}});
  return {{"candidates", candidates},
          {"trials", trials},
          {"resumed_trials", r.resumed_trials},
          {"chosen", r.chosen ? c[r.trials[*r.chosen].candidate].name : ""},
          {"converged", r.converged},
          {"stopped", r.stopped},
          {"fit_error", r.fit_error},
          {"layout_guess_doubt",
           r.layout_guess_doubt ? spec::Json(*r.layout_guess_doubt) : spec::Json()},
          {"new_layout_doubt", r.new_layout_doubt ? spec::Json(*r.new_layout_doubt) : spec::Json()},
          {"fit_refused", r.fit_refused},
          {"device_hours", r.device_hours},
          {"grid_trials", c.size()},
          {"grid_device_hours", r.grid_device_hours}};
}

void print_report(const std::vector<loop::TrialPlan>& c, const loop::TuneReport& r) {
  const std::vector<std::optional<double>> measured = candidate_times(c, r);
  fmt::print("{:<34} {:>10} {:>10} {:>10} {:>10}\n", "candidate", "predicted", "fitted", "expected",
             "measured");
  for (size_t i = 0; i < c.size(); ++i)
    fmt::print("{:<34} {:>10} {:>10} {:>10} {:>10}\n", c[i].name,
               human_seconds(r.predicted_before_s[i]), human_seconds(r.predicted_after_s[i]),
               fmt::format("{}{}", human_seconds(r.expected_s[i]), r.layout_guess[i] ? "*" : ""),
               measured[i] ? human_seconds(*measured[i]) : "-");
  if (r.chosen)
    fmt::print("chosen: {} (measured {})\n", c[r.trials[*r.chosen].candidate].name,
               human_seconds(r.trials[*r.chosen].time.measured_s));
  fmt::print(
      "trials: {} of {} candidates ({} resumed); {:.4g} device-hours, a grid of every "
      "candidate ~{:.4g}\n",
      r.trials.size(), c.size(), r.resumed_trials, r.device_hours, r.grid_device_hours);
  fmt::print("(*: guessed from a run of its layout; the fit is {:.1f}% off its own runs)\n",
             100 * r.fit_error);
  fmt::print("stopped: {}\n", r.stopped);
  if (!r.fit_refused.empty())
    fmt::print("warning: the last fit was not taken: {}\n", r.fit_refused);
}

void run(const TuneFlags& f) {
  // Everything the flags can get wrong, before the search and the trials.
  if (f.to != "sextant" && !f.slurm)
    throw InputError("command line", "--to", f.to,
                     "given with --slurm: a stack's trials run as Slurm jobs of `launch --to`");
  for (const auto& [flag, value] :
       {std::pair{"--partition", f.request.partition}, std::pair{"--account", f.request.account},
        std::pair{"--time", f.request.time}})
    if (!f.slurm && !value.empty())
      throw InputError("command line", flag, value, "given with --slurm (a Slurm job's setting)");
  if (f.slurm) {
    interop::SlurmRequest check = f.request;
    check.job_name = "sextant";
    check.directory = "/";
    interop::check_slurm_request(check);
  }
  for (const auto& [flag, path] :
       {std::pair{"--out", f.out}, std::pair{"--calibrated-out", f.calibrated_out}})
    if (!path.empty())
      if (std::string why = spec::unwritable_reason(path); !why.empty())
        throw InputError(flag, "", path, why);
  planner::SearchRequest request = request_from(f.search, f.gpus);
  // Trials of Sextant's executor run at the backend's default precision (machine_for's --backend).
  if (f.to == "sextant")
    request.executor = spec::executor_run(request.cluster.device.kind == spec::DeviceKind::kGpu
                                              ? spec::ExecutorBackend::kCuda
                                              : spec::ExecutorBackend::kCpu);
  const std::vector<loop::TrialPlan> c = candidates_of(f, request);
  std::unique_ptr<loop::Machine> machine = machine_for(f, request.model, request.cluster);
  loop::TuneOptions o = f.tune;
  o.say = [](const std::string& line) { fmt::print(stderr, "{}\n", line); };
  if (!f.search.json)
    fmt::print(
        "tune {} on {} x {}: {} candidates (the best predictions of each layout), {} steps a "
        "trial{}\n",
        request.model.name, f.gpus, request.cluster.name, c.size(), o.steps,
        f.slurm ? ", as Slurm jobs" : " on this machine");
  if (f.grid > 0) {
    loop::RoundOptions rounds;
    rounds.repeats = f.grid;
    rounds.steps = o.steps;
    rounds.quiet_wait_s = o.quiet_wait_s;
    rounds.say = o.say;
    std::filesystem::create_directories(o.dir + "/grid");
    print_grid(c, loop::measure_rounds(c, *machine, o.dir + "/grid", rounds), f.search.json);
    return;
  }
  const loop::TuneReport r = loop::tune(request.cluster, c, *machine, o);
  spec::Json j = report_json(c, r);
  if (!f.out.empty() && r.chosen) {
    spec::write_json_file(f.out, spec::to_json(c[r.trials[*r.chosen].candidate].plan));
    j["out"] = f.out;
  }
  if (!f.calibrated_out.empty() && r.fit_refused.empty() && r.chosen) {
    spec::write_json_file(f.calibrated_out, spec::to_json(r.cluster));
    j["calibrated_out"] = f.calibrated_out;
  }
  if (f.search.json) {
    std::cout << j.dump(2) << "\n";
    return;
  }
  print_report(c, r);
  if (j.contains("out")) fmt::print("chosen plan written to {}\n", f.out);
  if (j.contains("calibrated_out"))
    fmt::print("calibrated cluster written to {}\n", f.calibrated_out);
}

}  // namespace

void add_tune_command(CLI::App& app) {
  auto f = std::make_shared<TuneFlags>();
  f->tune.dir = "sextant-tune";
  CLI::App* cmd = app.add_subcommand(
      "tune",
      "Run the best predicted plans for a few steps each, calibrating and re-ranking after each, "
      "until none left could beat the measured best (or the budget is spent)");
  add_search_flags(*cmd, f->search);
  cmd->add_option("--gpus", f->gpus, "Devices (ranks) of every candidate")
      ->required()
      ->check(positive());
  cmd->add_option("--candidates", f->candidates, "The planner's K best predictions to tune over")
      ->check(positive());
  cmd->add_option("--max-trials", f->tune.max_trials,
                  "Budget: trials at most (default: none; at most 2K)")
      ->check(positive());
  cmd->add_option("--max-device-hours", f->tune.max_device_hours,
                  "Budget: no trial starts once this many device-hours are spent")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--steps", f->tune.steps, "Training steps per trial")->check(positive());
  cmd->add_option("--noise", f->tune.noise,
                  "A trial's relative noise: two runs of one plan differ by this much")
      ->check(CLI::Range(0.0, 0.5));
  cmd->add_option("--trial-timeout", f->trial_timeout, "Seconds a local trial may take")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--quiet-wait", f->tune.quiet_wait_s,
                  "Seconds a trial on CPU ranks may wait for undisturbed cores (default 120)")
      ->check(non_negative());
  cmd->add_option("--dir", f->tune.dir,
                  "The trials' files and the record a tune resumes from (default sextant-tune)");
  cmd->add_flag("--slurm", f->slurm, "Run each trial as a Slurm job (sbatch --wait)");
  auto* check =
      cmd->add_flag("--core-check", f->core_check,
                    "Check the cores around each trial on CPU ranks and rerun a disturbed "
                    "one (default: on locally; off with --slurm, where it runs inside "
                    "each trial's job on shared nodes that it may flag often)");
  cmd->add_flag("--no-core-check", f->no_core_check, "Run local trials without the core checks")
      ->excludes(check);
  cmd->add_option("--to", f->to,
                  "With --slurm: who trains the trials: sextant (default), megatron-core, "
                  "megatron-lm, torchtitan or deepspeed (their step times from their logs)");
  cmd->add_option("--script", f->script,
                  "With --to: the stack's entry point (as `launch --script`)");
  cmd->add_option("--partition", f->request.partition, "With --slurm: the partition");
  cmd->add_option("--account", f->request.account, "With --slurm: the account");
  cmd->add_option("--time", f->request.time, "With --slurm: a trial's time limit (sbatch --time)");
  cmd->add_option("--grid", f->grid,
                  "Instead of tuning: run every candidate in N interleaved rounds (what tuning "
                  "saves)")
      ->check(positive());
  cmd->add_option("--out", f->out, "Write the chosen plan here");
  cmd->add_option("--calibrated-out", f->calibrated_out,
                  "Write the cluster file fitted to the trials here");
  cmd->callback([f] { run(*f); });
}

}  // namespace sextant::cli
