// `sextant run`: train a plan for real on MPI ranks (CPU or CUDA backend). Under mpirun/srun every
// rank runs this command; with --np N and no MPI launcher around it, it starts `mpirun -np N`
// itself.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <vector>

#include "commands.hpp"
#include "executor_flags.hpp"
#include "mpi_launch.hpp"
#include "plan_options.hpp"
#include "sextant/exec/runner.hpp"
#include "sextant/models/zoo.hpp"
#include "sextant/sim/simulator.hpp"
#include "sextant/spec/cluster_catalog.hpp"
#include "sextant/spec/json_io.hpp"
#include "step_steadiness.hpp"
#include "trace_options.hpp"
#include "validators.hpp"

namespace sextant::cli {

namespace {

struct RunFlags {
  std::string model;
  PlanFlags plan;
  ExecutorFlags executor;
  int64_t steps = 10;
  std::string data = "synthetic";
  uint64_t seed = 1234;
  double lr = 1e-3;
  double clip = 1.0;
  TraceFlags trace;
  std::string log_json;
  std::string checkpoint;
  std::string nvme_dir;
  int64_t checkpoint_every = 0;
  bool resume = false;
  bool resume_if_exists = false;
  int np = 0;
  bool quiet = false;
  double watchdog_s = 60;
};

// The plan's step as the simulator predicts it on the backend's own built-in machine (local-cpu
// or h200-1gpu, with as many nodes as the plan needs); nullopt when it cannot say.
std::optional<double> predicted_step_s(const exec::Job& job) {
  try {
    spec::ClusterSpec cluster =
        spec::builtin_cluster(job.backend == exec::BackendKind::kCuda ? "h200-1gpu" : "local-cpu");
    const int64_t world = job.plan.world_size();
    cluster.nodes =
        std::max(cluster.nodes, (world + cluster.devices_per_node - 1) / cluster.devices_per_node);
    return sim::simulate(job.model, cluster, job.plan, {}).report.step_time_s;
  } catch (const std::exception&) {
    return std::nullopt;  // the run itself says what is wrong with the plan
  }
}

// The step `sextant plan` wrote into the plan file (predicted.step_time_s) and the cluster it
// predicted on, into the job for the run's summary; nothing when the file holds no prediction.
void set_plan_prediction(const std::string& plan_file, exec::Job& job) {
  if (plan_file.empty()) return;
  const spec::Json j = spec::read_json_file(plan_file);
  if (!j.contains("predicted") || !j["predicted"].is_object()) return;
  const spec::Json& step = j["predicted"].value("step_time_s", spec::Json());
  if (!step.is_number() || !(step.get<double>() > 0)) return;
  job.predicted_step_s = step.get<double>();
  job.predicted_on = j.contains("cluster") && j["cluster"].is_string()
                         ? j["cluster"].get<std::string>()
                         : std::string("an unnamed cluster");
}

// --watchdog SECONDS, at least kStepMultiple x the predicted step: a rank making no progress for
// that long ends the job. The prediction (on a machine that may not be this one; the CPU file is
// 33-55% fast on the CI's cores) sets the scale before a step is measured; the measured steps set
// it after (exec/watchdog.hpp).
exec::WatchdogOptions watchdog_options(double seconds, const exec::Job& job) {
  exec::WatchdogOptions o;
  if (seconds <= 0) return o;
  o.timeout_s = std::max(seconds, o.step_multiple * predicted_step_s(job).value_or(0.0));
  return o;
}

// The peak the summary's MFU is against: the built-in cluster file of the backend's machine
// (local-cpu: this machine's cores; h200-1gpu) in the run's precision.
void set_peak(exec::Job& job) {
  const bool cuda = job.backend == exec::BackendKind::kCuda;
  const spec::Dtype dtype = spec::compute_dtype(exec::executor_run_of(job).precision);
  const std::string name = cuda ? "h200-1gpu" : "local-cpu";
  const spec::ClusterSpec cluster = spec::builtin_cluster(name);
  auto it = cluster.device.peak_tflops.find(dtype);
  if (it == cluster.device.peak_tflops.end()) return;
  job.peak_flops = it->second * kFlopsPerTflop;
  job.peak_source = name;
}

int run(const RunFlags& f, const std::vector<std::string>& args) {
  if (f.np > 0 && !under_mpi_launcher()) relaunch_under_mpirun(f.np, args);
  return exec::run_main([&f] {
    exec::Job job;
    job.backend = backend_kind(f.executor);
    job.comm_choice = comm_choice(f.executor);
    job.precision = precision_choice(f.executor);
    job.model = models::resolve_model(f.model);
    // Stack flags start from the executor's own stack on every backend (spec::executor_stack),
    // not the GPU clusters' default: --attention flash2 runs Sextant's flash kernels.
    job.plan = plan_from_flags(f.plan, std::nullopt, false, job.model.kind());
    // The stack the executor runs the plan with, decided here once: the watchdog's prediction,
    // the checks (exec::check_job, in run_main), the run and its trace all see this one.
    job.plan.stack = spec::executor_stack(job.plan);
    job.plan_source = f.plan.plan_file.empty() ? "command line" : f.plan.plan_file;
    job.train.steps = f.steps;
    job.train.data = f.data;
    job.train.seed = f.seed;
    job.train.lr = static_cast<float>(f.lr);
    job.train.clip = static_cast<float>(f.clip);
    job.train.checkpoint_dir = f.checkpoint;
    job.train.nvme_dir = f.nvme_dir;
    job.train.checkpoint_every = f.checkpoint_every;
    job.train.resume = f.resume || f.resume_if_exists;
    job.train.resume_if_exists = f.resume_if_exists;
    if (job.train.resume && f.checkpoint.empty())
      throw InputError("command line", f.resume ? "--resume" : "--resume-if-exists", "",
                       "needs --checkpoint DIR");
    job.trace_file = f.trace.file;
    job.trace_selection = trace_selection_from(f.trace, job.plan);
    job.log_json = f.log_json;
    job.quiet = f.quiet;
    job.watchdog = watchdog_options(f.watchdog_s, job);
    set_peak(job);
    set_plan_prediction(f.plan.plan_file, job);
    job.on_trace = [predicted_s = job.predicted_step_s](const spec::Trace& trace,
                                                        const std::vector<exec::StepLog>& logs) {
      std::vector<StepTime> steps;
      for (const exec::StepLog& s : logs) steps.push_back({s.step, s.step_time_s});
      fmt::print("{}", steadiness_lines(trace, steps, predicted_s));
    };
    return job;
  });
}

}  // namespace

void add_run_command(CLI::App& app, const std::vector<std::string>& args) {
  auto f = std::make_shared<RunFlags>();
  CLI::App* cmd = app.add_subcommand(
      "run", "Train a plan for real on MPI ranks (start with mpirun -np N, or give --np N)");
  cmd->add_option("--model", f->model, "Zoo name, model file or Hugging Face config.json")
      ->required();
  add_plan_flags(*cmd, f->plan);
  add_executor_flags(*cmd, f->executor, true);
  cmd->add_option("--steps", f->steps, "Training steps")->check(positive());
  cmd->add_option("--data", f->data, "synthetic, or a text file (byte-level tokens)");
  cmd->add_option("--seed", f->seed, "Seed of the initial weights and the synthetic data");
  cmd->add_option("--lr", f->lr, "AdamW learning rate")->check(positive());
  cmd->add_option("--clip", f->clip, "Global gradient-norm clipping (0: none)")
      ->check(CLI::NonNegativeNumber);
  add_trace_flags(*cmd, f->trace, "the merged measured trace of every rank");
  cmd->add_option("--log-json", f->log_json, "Write one JSON object per step (rank 0)");
  cmd->add_option("--checkpoint", f->checkpoint, "Checkpoint directory");
  cmd->add_option("--nvme-dir", f->nvme_dir,
                  "With --offload-optimizer nvme or --offload-params nvme: the directory of each "
                  "rank's optimizer-states and parameters files (DeepSpeed's nvme_path; "
                  "default: the system's temporary directory)");
  cmd->add_option("--checkpoint-every", f->checkpoint_every, "Checkpoint every K steps")
      ->check(positive());
  cmd->add_flag("--resume", f->resume,
                "Continue from the newest intact checkpoint in --checkpoint (none: an error)");
  cmd->add_flag("--resume-if-exists", f->resume_if_exists,
                "As --resume, but start from step 0 when --checkpoint holds no checkpoint");
  cmd->add_option("--np", f->np, "Start this many ranks with mpirun")->check(positive());
  cmd->add_flag("--quiet", f->quiet, "No per-step lines");
  cmd->add_option("--watchdog", f->watchdog_s,
                  "End the job, naming the rank, when a rank makes no progress for this many "
                  "seconds (at least 10x the predicted and the longest measured step; 0: off)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->callback([f, args] {
    int rc = run(*f, args);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace sextant::cli
