// `sextant compare --log`: the measured step of a stack's log against the simulated one.
#include "compare_log.hpp"

#include <fmt/format.h>

#include <fstream>
#include <iostream>
#include <sstream>

#include "format.hpp"
#include "sextant/interop/training_log.hpp"
#include "sextant/models/zoo.hpp"
#include "sextant/sim/simulator.hpp"
#include "sextant/sim/step_setup.hpp"
#include "sextant/spec/cluster_catalog.hpp"
#include "sextant/spec/stack_support.hpp"
#include "validators.hpp"

namespace sextant::cli {

void add_compare_log_flags(CLI::App& cmd, CompareLogFlags& f) {
  cmd.add_option("--log", f.log,
                 "A training log of Megatron-LM, NeMo, TorchTitan or DeepSpeed (its step lines)");
  cmd.add_option("--log-format", f.format,
                 "megatron, nemo, torchtitan or deepspeed (default: "
                 "detected)");
  cmd.add_option("--model", f.model, "With --log: the model the run trained");
  cmd.add_option("--cluster", f.cluster, "With --log: the cluster it ran on (name or file)");
  cmd.add_option("--gpus", f.gpus, "With --log: the devices it ran on")->check(positive());
  add_plan_flags(cmd, f.plan);
}

void run_compare_log(const CompareLogFlags& f, bool json) {
  std::optional<interop::LogFormat> format;
  if (!f.format.empty()) {
    format = spec::enum_from_name(interop::log_format_names(), f.format);
    if (!format)
      throw InputError("command line", "--log-format", f.format,
                       "must be one of " + spec::enum_choices(interop::log_format_names()));
  }
  for (const auto& [flag, value] :
       {std::pair{"--model", f.model}, std::pair{"--cluster", f.cluster}})
    if (value.empty()) throw InputError("command line", flag, "", "missing: --log needs it");
  std::ifstream in(f.log, std::ios::binary);
  if (!in) throw InputError(f.log, "", "", "cannot be read");
  std::ostringstream text;
  text << in.rdbuf();
  const interop::TrainingLog log = interop::read_training_log(text.str(), f.log, format);
  const spec::ModelSpec model = models::resolve_model(f.model);
  const spec::ClusterSpec cluster = spec::resolve_cluster(f.cluster);
  const bool gpu = cluster.device.kind == spec::DeviceKind::kGpu;
  const spec::Plan plan = validated_plan(f.plan, f.gpus, model, cluster);
  const std::string source = f.plan.plan_file.empty() ? "command line" : f.plan.plan_file;
  const spec::Stack stack = spec::plan_stack(plan, gpu, model.kind());
  spec::check_stack_runs(plan, model, stack, sim::step_precision(cluster, plan, stack).gemm_dtype,
                         source);
  sim::SimulationOptions options;
  options.plan_source = source;
  const double predicted = sim::simulate(model, cluster, plan, options).report.step_time_s;
  const interop::StepSize size = interop::step_size(plan, model);
  const double measured =
      interop::measured_step_seconds(log, size.samples, size.tokens, size.devices, f.log);
  const double error = predicted / measured - 1;
  const std::string name(spec::enum_name(interop::log_format_names(), log.format));
  if (json) {
    std::cout << spec::Json{{"log", f.log},
                            {"format", name},
                            {"plan", plan.name()},
                            {"logged_steps", log.steps.size()},
                            {"measured_step_s", measured},
                            {"predicted_step_s", predicted},
                            {"step_error", error}}
                     .dump(2)
              << "\n";
    return;
  }
  fmt::print("{} log {}: {} step lines (the first, with start-up, left out)\n", name, f.log,
             log.steps.size());
  fmt::print("step time: measured {} (median), predicted {} for {} ({:+.1f}%)\n",
             human_seconds(measured), human_seconds(predicted), plan.name(), 100 * error);
}

}  // namespace sextant::cli
