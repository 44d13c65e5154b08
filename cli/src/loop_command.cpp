// `sextant loop`: the calibration loop on this machine (loop::close_loop). Measures collectives
// (or, with --gpu, GEMMs) and a fixed set of plans in interleaved rounds, fits the cluster file
// to the fit plans, predicts every plan with it, and reports the held-out plans' errors, Kendall's
// tau and the regret of the predicted best. scripts/calibrate-local.sh builds and calls it.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <iostream>
#include <memory>

#include "commands.hpp"
#include "detect_cluster.hpp"
#include "plan_options.hpp"
#include "sextant/loop/closed_loop.hpp"
#include "sextant/loop/process_machine.hpp"
#include "sextant/models/zoo.hpp"
#include "sextant/spec/cluster_catalog.hpp"
#include "sextant/spec/executor_support.hpp"
#include "sextant/spec/host_cpu.hpp"
#include "sextant/spec/json_io.hpp"
#include "validators.hpp"

namespace sextant::cli {

namespace {

struct LoopFlags {
  bool json = false;
  bool gpu = false;
  bool refit = false;
  bool force = false;
  bool as_measured = false;
  int64_t steps = 8;
  int64_t repeats = 3;
  int64_t extra_rounds = 2;
  double quiet_wait = 120;
  double timeout = 600;
  std::string out = "out/calibrate-local";
  std::string cluster;
};

// One plan of a set: its flags as `sextant simulate` would take them.
struct SetPlan {
  const char* name;
  const char* model;
  int64_t dp, tp, pp, micro_batch, global_batch;
  bool sp = false;
  const char* schedule = "1f1b";
  int zero = 0;
  const char* recompute = "none";
  bool heldout = true;
};

// The plans the loop measures. On CPU ranks (gpt-tiny) the fit plans span what is predicted: one
// and two ranks, each layout family (dp, tp, pp) and micro-batches 2, 4 and 8. On the GPU, GPT-2
// models and micro-batches on one device (several ranks sharing a GPU are not a cluster the
// simulator can describe): two fit plans, five held out.
std::vector<SetPlan> plan_set(bool gpu) {
  if (gpu)
    return {
        {"gpt2-124m.mb8", "gpt2-124m", 1, 1, 1, 8, 16, false, "1f1b", 0, "none", false},
        {"gpt2-350m.mb4", "gpt2-350m", 1, 1, 1, 4, 8, false, "1f1b", 0, "none", false},
        {"gpt2-124m.mb4", "gpt2-124m", 1, 1, 1, 4, 8},
        {"gpt2-124m.mb16", "gpt2-124m", 1, 1, 1, 16, 16},
        {"gpt2-124m.mb8.rc-full", "gpt2-124m", 1, 1, 1, 8, 16, false, "1f1b", 0, "full"},
        {"gpt2-350m.mb8", "gpt2-350m", 1, 1, 1, 8, 8},
        {"gpt2-774m.mb4", "gpt2-774m", 1, 1, 1, 4, 8},
    };
  return {
      {"dp1.mb4", "gpt-tiny", 1, 1, 1, 4, 16, false, "1f1b", 0, "none", false},
      {"dp2.mb8", "gpt-tiny", 2, 1, 1, 8, 16, false, "1f1b", 0, "none", false},
      {"tp2.mb2", "gpt-tiny", 1, 2, 1, 2, 16, false, "1f1b", 0, "none", false},
      {"pp2.1f1b.mb2", "gpt-tiny", 1, 1, 2, 2, 16, false, "1f1b", 0, "none", false},
      {"dp1.mb8", "gpt-tiny", 1, 1, 1, 8, 16},
      {"dp1.mb2", "gpt-tiny", 1, 1, 1, 2, 16},
      {"dp2.mb2", "gpt-tiny", 2, 1, 1, 2, 16},
      {"dp2.mb4", "gpt-tiny", 2, 1, 1, 4, 16},
      {"tp2.mb4", "gpt-tiny", 1, 2, 1, 4, 16},
      {"tp2.sp.mb4", "gpt-tiny", 1, 2, 1, 4, 16, true},
      {"pp2.gpipe.mb4", "gpt-tiny", 1, 1, 2, 4, 16, false, "gpipe"},
      {"dp2.z1.mb8", "gpt-tiny", 2, 1, 1, 8, 16, false, "1f1b", 1},
  };
}

loop::TrialPlan trial_plan(const SetPlan& p, bool gpu) {
  PlanFlags flags;
  flags.dp = p.dp;
  flags.tp = p.tp;
  flags.pp = p.pp;
  flags.micro_batch = p.micro_batch;
  flags.global_batch = p.global_batch;
  flags.sp = p.sp;
  flags.schedule = p.schedule;
  flags.zero = p.zero;
  flags.recompute = p.recompute;
  // The executor runs its own kernels: predict them (a GPU cluster's default stack is
  // megatron-core). The precision is the backend's (LoopSetup::predict_dtype).
  flags.stack.stack = "sextant";
  spec::Plan plan = plan_from_flags(flags, std::nullopt, gpu);
  // Every plan of the set runs on the executor as the loop runs it (m.run_args below).
  spec::check_executor_runs(
      models::zoo_model(p.model), plan,
      spec::executor_run(gpu ? spec::ExecutorBackend::kCuda : spec::ExecutorBackend::kCpu));
  return {p.name, p.model, std::move(plan), p.heldout};
}

void print_report(const loop::LoopReport& r) {
  const loop::LoopFigures& f = r.figures;
  fmt::print("{:<22} {:>5} {:<8} {:>17} {:>16} {:>8}  {:>12}\n", "plan", "ranks", "role",
             "predicted", "measured±noise", "error", "uncalibrated");
  for (const loop::LoopRow& row : r.rows) {
    const std::string role = row.heldout ? "held out" : "fit";
    if (!row.time.measured) {
      fmt::print("{:<22} {:>5} {:<8} {:>8.1f}ms  not measured: {}\n", row.name, row.ranks, role,
                 row.predicted_s * 1e3, row.time.status);
      continue;
    }
    fmt::print("{:<22} {:>5} {:<8} {:>8.1f}±{:4.1f}ms {:>9.1f}±{:4.1f}ms {:>7.1f}%  {:>11.1f}%\n",
               row.name, row.ranks, role, row.predicted_s * 1e3,
               f.fit_plans_rms_error * row.predicted_s * 1e3, row.time.measured_s * 1e3,
               row.time.noise_s * 1e3, 100 * row.error(), 100 * row.uncalibrated_error());
  }
  fmt::print(
      "fit plans: worst |error| {:.1f}% (RMS {:.1f}%: the ± of the predictions; each fitted run "
      "re-simulated: mean {:.1f}%); measurement noise up to ±{:.1f}% (half-range of the rounds)\n",
      100 * f.fit_plans_max_abs_error, 100 * f.fit_plans_rms_error,
      100 * r.fitted.mean_abs_error_after(), 100 * f.max_noise);
  if (r.co_run)
    fmt::print(
        "co-run: beside {} busy cores a core runs GEMMs {:.2f}x and memory-bound ops {:.2f}x "
        "as long (measured; in the calibrated file)\n",
        r.co_run->devices, r.co_run->matrix, r.co_run->memory);
  fmt::print("held-out plans: mean |error| {:.1f}%, worst {:.1f}% (uncalibrated mean {:.1f}%)\n",
             100 * f.heldout_mean_abs_error, 100 * f.heldout_max_abs_error,
             100 * f.uncalibrated_heldout_mean_abs_error);
  fmt::print(
      "runs: {} of the kept ones measured with a core disturbed (more than 8% slow before or "
      "after; waited {:.0f} s for quiet cores)\n",
      f.disturbed_runs, r.waited_s);
  fmt::print("{}\n", r.speed_reference
                         ? "times: every run; a disturbed run's step scaled to the quiet runs' "
                           "core speed, from its ops' times against the fastest any run took "
                           "(--as-measured: the quiet runs as measured)"
                         : "times: as measured, the median of each plan's quiet runs");
  if (!r.rerun.empty())
    fmt::print("extra rounds for the plans within the noise of the best: {}\n",
               fmt::join(r.rerun, ", "));
  fmt::print(
      "ranking: Kendall tau {:.2f}; the predicted best ({}) is {:.1f}% slower than the measured "
      "best ({}), {} their noise\n",
      f.kendall_tau, f.predicted_best, 100 * f.regret, f.measured_best,
      f.regret_beyond_noise ? "beyond" : "within");
  fmt::print("confidence: resampling each plan's runs, {} is the fastest in {:.0f}% of draws{}\n",
             f.predicted_best, 100 * f.predicted_best_share,
             f.predicted_best == f.measured_best
                 ? std::string()
                 : fmt::format(", {} in {:.0f}%", f.measured_best, 100 * f.measured_best_share));
  fmt::print(
      "tau over resamplings {:.2f} to {:.2f} (10th to 90th percentile); over the {} of {} pairs "
      "the rounds order (measured further apart than their noise) {:.2f}\n",
      f.kendall_tau_p10, f.kendall_tau_p90, f.resolved_pairs, f.pairs, f.kendall_tau_resolved);
  if (r.fit_worse) fmt::print("warning: {} (--force went on)\n", r.refused);
  if (!r.fit_worse && !r.refused.empty()) fmt::print("note: {}\n", r.refused);
  fmt::print("calibrated cluster: {}\n", r.calibrated_file);
}

void run_loop(const LoopFlags& f) {
  const std::string cluster_name =
      !f.cluster.empty() ? f.cluster : (f.gpu ? "h100-1gpu" : "local-cpu");
  loop::LoopSetup setup;
  setup.cluster = spec::resolve_cluster(cluster_name);
  const bool gpu_cluster = setup.cluster.device.kind == spec::DeviceKind::kGpu;
  if (gpu_cluster != f.gpu)
    throw InputError("command line", "--cluster", cluster_name,
                     f.gpu ? "a GPU cluster with --gpu (the loop runs the cuda backend)"
                           : "a CPU cluster (the loop runs CPU ranks; --gpu for a GPU cluster)");
  if (const std::string why = spec::host_cpu_mismatch(setup.cluster); !why.empty()) {
    // The loop predicts runs on this machine: a file made for another CPU would start it 30-50%
    // off, and the uncalibrated column would say nothing about this machine.
    if (!f.cluster.empty()) throw InputError("command line", "--cluster", f.cluster, why);
    std::filesystem::create_directories(f.out);
    const std::string detected = f.out + "/local-cpu-detected.json";
    if (f.refit && std::filesystem::exists(detected)) {
      setup.cluster = spec::read_cluster_file(detected);  // the file the runs were predicted on
    } else {
      fmt::print(f.json ? stderr : stdout,
                 "== the shipped local-cpu describes {}: measuring this machine first -> {}\n",
                 setup.cluster.device.host_cpu, detected);
      setup.cluster = detect_local_cluster(f.out, [json = f.json](const std::string& line) {
        fmt::print(json ? stderr : stdout, "{}\n", line);
      });
      spec::write_json_file(detected, spec::to_json(setup.cluster));
    }
  }
  for (const SetPlan& p : plan_set(f.gpu)) setup.plans.push_back(trial_plan(p, f.gpu));
  setup.compare_plan = f.gpu ? "gpt2-350m.mb8" : "pp2.gpipe.mb4";
  setup.fit_dtype = f.gpu ? spec::Dtype::kBf16 : spec::Dtype::kFp32;
  if (f.gpu) setup.predict_dtype = spec::Dtype::kBf16;  // the runs: --precision bf16
  setup.out = f.out;
  setup.refit = f.refit;
  setup.speed_reference = !f.as_measured;
  setup.force = f.force;
  setup.rounds.repeats = f.repeats;
  setup.rounds.steps = f.steps;
  setup.rounds.extra_rounds = f.extra_rounds;
  setup.rounds.quiet_wait_s = f.quiet_wait;
  // Progress goes to stderr with --json (stdout holds the one JSON object).
  setup.rounds.say = [json = f.json](const std::string& line) {
    fmt::print(json ? stderr : stdout, "{}\n", line);
    std::fflush(json ? stderr : stdout);
  };

  std::filesystem::create_directories(f.out);
  loop::ProcessMachineOptions m;
  m.sextant = loop::self_executable();
  m.timeout_s = f.timeout;
  if (f.gpu) {
    m.run_args = {"--backend", "cuda", "--precision", "bf16"};
    m.bench_args = {"compute", "--backend", "cuda", "--precision", "bf16"};
  } else {
    m.bench_args = {"comm", "--np", "2", "--sizes", "4K,64K,512K,1M,2M,4M", "--iterations", "10"};
    // Undisturbed runs only, where the machine allows (loop/rounds.hpp); the fastest core times
    // seen are kept in cores.json, started afresh by every measurement.
    m.cores_reference = f.out + "/cores.json";
    m.co_run = true;  // two ranks on two cores may share one core's units, caches or clock
    if (!f.refit) std::filesystem::remove(m.cores_reference);
  }
  loop::ProcessMachine machine(m);
  loop::LoopReport report;
  try {
    report = loop::close_loop(setup, machine);
  } catch (const loop::FitRefused& e) {
    fmt::print(stderr, "sextant loop: {}\n", e.what());
    throw CLI::RuntimeError(1);
  }
  if (f.json) {
    std::cout << loop::to_json(report).dump(2) << "\n";
  } else {
    print_report(report);
  }
}

}  // namespace

void add_loop_command(CLI::App& app) {
  auto f = std::make_shared<LoopFlags>();
  CLI::App* cmd = app.add_subcommand(
      "loop",
      "The calibration loop on this machine: measure plans, fit the cluster, predict held-out "
      "plans, report their errors, Kendall's tau and the regret");
  cmd->add_flag("--json", f->json, "Print one JSON object (docs/FORMATS.md)");
  cmd->add_option("--steps", f->steps, "Training steps per run")->check(positive());
  cmd->add_option("--repeats", f->repeats, "Rounds: runs of every plan")->check(positive());
  cmd->add_option("--extra-rounds", f->extra_rounds,
                  "Rounds more for the plans within the noise of the best (default 2)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--force", f->force,
                "Go on with a fit that predicts its own plans worse (the report says fit_worse)");
  cmd->add_option("--out", f->out, "Directory of the runs, the fit and the predictions");
  cmd->add_flag("--gpu", f->gpu,
                "GPT-2 plans on one GPU with the cuda backend, fitted from `bench compute`");
  cmd->add_flag("--as-measured", f->as_measured,
                "Take each plan's runs as measured (the median of the quiet ones) instead of "
                "every run with the disturbed ones scaled to the quiet runs' core speed");
  cmd->add_flag("--refit", f->refit,
                "Measure nothing: fit and predict from the runs already in --out");
  cmd->add_option("--quiet-wait", f->quiet_wait,
                  "Seconds the loop may wait in all for undisturbed cores")
      ->check(non_negative());
  cmd->add_option("--timeout", f->timeout, "Seconds one run may take")->check(positive());
  cmd->add_option("--cluster", f->cluster,
                  "Cluster to calibrate (default local-cpu; with --gpu h100-1gpu)");
  cmd->callback([f] { run_loop(*f); });
}

}  // namespace sextant::cli
