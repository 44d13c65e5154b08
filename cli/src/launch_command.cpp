// `sextant launch --slurm`: a plan as a Slurm batch script for Sextant's executor or for the stack
// it is exported to; with --submit, sbatch it, and with --wait, report its measured step time
// against the prediction.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>

#include "commands.hpp"
#include "compare_log.hpp"
#include "format.hpp"
#include "plan_options.hpp"
#include "sextant/exec/runner.hpp"
#include "sextant/interop/slurm.hpp"
#include "sextant/loop/process_machine.hpp"
#include "sextant/loop/trial.hpp"
#include "sextant/models/zoo.hpp"
#include "sextant/sim/simulator.hpp"
#include "sextant/sim/step_setup.hpp"
#include "sextant/spec/cluster_catalog.hpp"
#include "sextant/spec/json_io.hpp"
#include "sextant/spec/stack_support.hpp"
#include "slurm_submit.hpp"
#include "validators.hpp"

namespace sextant::cli {

namespace {

struct LaunchOptions {
  std::string model, cluster, to = "sextant";
  int64_t gpus = 0;
  PlanFlags plan;
  bool slurm = false;
  interop::SlurmRequest request;  // nodes 0: from the cluster's devices per node
  int64_t steps = 0;
  std::string script;  // the stack's entry point (--script)
  std::string out;
  bool submit = false, wait = false;
};

// The plan's ranks over nodes: --nodes when given, else as few nodes as the cluster's
// devices per node allow.
void size_job(const spec::ClusterSpec& cluster, int64_t ranks, interop::SlurmRequest& r) {
  if (r.nodes == 0) r.nodes = (ranks + cluster.devices_per_node - 1) / cluster.devices_per_node;
  if (ranks % r.nodes != 0)
    throw InputError(
        "command line", "--nodes", std::to_string(r.nodes),
        fmt::format("a divisor of the plan's {} ranks (each node runs as many)", ranks));
  r.ranks_per_node = ranks / r.nodes;
  r.gpus = cluster.device.kind == spec::DeviceKind::kGpu;
}

std::string script_text(const LaunchOptions& o, const spec::Plan& plan,
                        const spec::ModelSpec& model, const spec::ClusterSpec& cluster,
                        const interop::SlurmRequest& r) {
  const bool gpu = cluster.device.kind == spec::DeviceKind::kGpu;
  if (o.to == "sextant") {
    // The job's `run` makes the same check; here before the job waits in a queue.
    exec::Job check;
    check.model = model;
    check.plan = plan;
    check.plan_source = "command line";
    check.backend = gpu ? exec::BackendKind::kCuda : exec::BackendKind::kCpu;
    exec::check_job(check, plan.world_size());
    interop::SextantJob job{loop::self_executable(),
                            {"--model", model_for_jobs(o.model), "--backend", gpu ? "cuda" : "cpu"},
                            spec::to_json(plan).dump(2) + "\n",
                            !gpu};
    if (o.steps > 0) job.run_args.insert(job.run_args.end(), {"--steps", std::to_string(o.steps)});
    return interop::sbatch_script(r, job);
  }
  const auto target = spec::enum_from_name(interop::target_names(), o.to);
  if (!target)
    throw InputError("command line", "--to", o.to,
                     "must be sextant or one of " + spec::enum_choices(interop::target_names()));
  const spec::Stack stack = spec::plan_stack(plan, gpu, model.kind());
  const spec::Dtype compute = sim::step_precision(cluster, plan, stack).gemm_dtype;
  std::optional<interop::Trial> trial;
  if (o.steps > 0) trial = interop::Trial{o.steps};
  interop::StackJob job{interop::export_plan(plan, model, stack, compute, *target, trial),
                        o.script};
  return interop::sbatch_script(r, job);
}

// After --wait: the job's measured step against the prediction.
void report(const LaunchOptions& o, const spec::Plan& plan, const spec::ModelSpec& model,
            const spec::ClusterSpec& cluster, const std::string& base, const std::string& log) {
  if (o.to != "sextant") {
    CompareLogFlags flags{log, "", o.model, o.cluster, o.gpus, o.plan};
    run_compare_log(flags, false);
    return;
  }
  const loop::RunResult run = loop::read_run(base);
  const std::optional<double> measured = run.mean_step_s();
  if (!measured) throw InputError(base + ".steps.jsonl", "", "", "two steps or more (a trial)");
  sim::SimulationOptions options;
  options.plan_source = o.plan.plan_file.empty() ? "command line" : o.plan.plan_file;
  const double predicted = sim::simulate(model, cluster, plan, options).report.step_time_s;
  fmt::print(
      "step time: measured {} (mean after warm-up, {} steps), predicted {} for {} ({:+.1f}%)\n",
      human_seconds(*measured), run.step_times_s.size(), human_seconds(predicted), plan.name(),
      100 * (predicted / *measured - 1));
}

void run(LaunchOptions o) {
  if (!o.slurm)
    throw InputError("command line", "--slurm", "", "given: Slurm is the launcher there is");
  if (o.wait && !o.submit) throw InputError("command line", "--wait", "", "given with --submit");
  const spec::ModelSpec model = models::resolve_model(o.model);
  const spec::ClusterSpec cluster = spec::resolve_cluster(o.cluster);
  const spec::Plan plan = validated_plan(o.plan, o.gpus, model, cluster);
  interop::SlurmRequest& r = o.request;
  size_job(cluster, plan.world_size(), r);
  // Job names say what runs: model and plan.
  if (r.job_name.empty()) r.job_name = interop::job_name(model.name + "-" + plan.name());
  if (o.submit && o.out.empty()) o.out = r.job_name + ".sbatch";
  r.directory = r.directory.empty()
                    ? std::filesystem::absolute(o.out.empty() ? "." : o.out).parent_path().string()
                    : std::filesystem::absolute(r.directory).lexically_normal().string();
  if (r.directory.size() > 1 && r.directory.back() == '/') r.directory.pop_back();
  const std::string text = script_text(o, plan, model, cluster, r);
  if (o.out.empty()) {
    std::cout << text;  // machine text: std::cout is never wrapped (fitted_output.hpp)
    return;
  }
  if (std::string why = spec::unwritable_reason(o.out); !why.empty())
    throw InputError("--out", "", o.out, why);
  spec::write_file_atomically(o.out, text);
  std::filesystem::permissions(o.out, std::filesystem::perms::owner_exec,
                               std::filesystem::perm_options::add);
  fmt::print("{}: a Slurm job of {} on {} node(s) x {} rank(s)\n", o.out, plan.name(), r.nodes,
             r.ranks_per_node);
  if (!o.submit) return;
  fmt::print(stderr, "submitting {}{}\n", o.out, o.wait ? " and waiting for the job" : "");
  const std::string id = sbatch(o.out, o.wait);
  const std::string base = r.directory + "/" + r.job_name + "-" + id;
  std::string log = r.output.empty() ? base + ".out" : r.output;
  for (size_t at; (at = log.find("%j")) != std::string::npos;) log.replace(at, 2, id);
  fmt::print("job {}: log {}\n", id, log);
  if (o.wait) report(o, plan, model, cluster, base, log);
}

}  // namespace

void add_launch_command(CLI::App& app) {
  auto o = std::make_shared<LaunchOptions>();
  o->request.nodes = 0;
  CLI::App* cmd = app.add_subcommand(
      "launch", "Write (and submit) a Slurm job that trains a plan, with Sextant or its stack");
  cmd->add_option("--model", o->model, "Zoo name, model file or Hugging Face config.json")
      ->required();
  cmd->add_option("--cluster", o->cluster, "Cluster name or file (devices per node, precision)")
      ->required();
  cmd->add_option("--gpus", o->gpus, "Number of GPUs (dp is what the other degrees leave)")
      ->check(positive());
  add_plan_flags(*cmd, o->plan);
  cmd->add_flag("--slurm", o->slurm, "Launch with Slurm (sbatch)");
  cmd->add_option("--to", o->to,
                  "Who trains: sextant (default; srun --mpi=pmix sextant run), megatron-core, "
                  "megatron-lm, torchtitan or deepspeed (torchrun on every node)");
  cmd->add_option("--steps", o->steps, "Train this many steps, a step line each (a trial)")
      ->check(positive());
  cmd->add_option("--script", o->script,
                  "The stack's entry point: DeepSpeed's training script (required), Megatron's "
                  "pretrain_gpt.py (default $MEGATRON_LM/pretrain_gpt.py)");
  cmd->add_option("--partition", o->request.partition, "Slurm partition");
  cmd->add_option("--account", o->request.account, "Slurm account");
  cmd->add_option("--time", o->request.time, "Time limit (sbatch --time)");
  cmd->add_option("--nodes", o->request.nodes,
                  "Nodes (default: as few as the cluster's devices per node allow)")
      ->check(positive());
  cmd->add_option("--job-name", o->request.job_name, "Job name (default: model-plan)");
  cmd->add_option("--dir", o->request.directory,
                  "Where the job writes its files (default: the script's directory)");
  cmd->add_option("--output", o->request.output, "The job's log (default: DIR/NAME-%j.out)");
  cmd->add_option("--out", o->out,
                  "Write the script here (default: stdout; NAME.sbatch to submit)");
  cmd->add_flag("--submit", o->submit, "Submit the script with sbatch");
  cmd->add_flag("--wait", o->wait,
                "With --submit: wait for the job, then print its measured step time against the "
                "prediction");
  cmd->callback([o] { run(*o); });
}

}  // namespace sextant::cli
