// `sextant export`: a plan as the flags or config file of the stack that will train it.
#include <fmt/format.h>

#include <iostream>
#include <memory>

#include "commands.hpp"
#include "plan_options.hpp"
#include "sextant/interop/export.hpp"
#include "sextant/models/zoo.hpp"
#include "sextant/sim/step_setup.hpp"
#include "sextant/spec/cluster_catalog.hpp"
#include "sextant/spec/json_io.hpp"
#include "validators.hpp"

namespace sextant::cli {

namespace {

struct ExportOptions {
  std::string model;
  std::string cluster;
  std::string to;
  int64_t gpus = 0;
  PlanFlags plan;
  std::string out;
  bool json = false;
};

void run(const ExportOptions& o) {
  auto target = spec::enum_from_name(interop::target_names(), o.to);
  if (!target)
    throw InputError("command line", "--to", o.to,
                     "must be one of " + spec::enum_choices(interop::target_names()));
  if (!o.out.empty())
    if (std::string why = spec::unwritable_reason(o.out); !why.empty())
      throw InputError("--out", "", o.out, why);
  const spec::ModelSpec model = models::resolve_model(o.model);
  const spec::ClusterSpec cluster = spec::resolve_cluster(o.cluster);
  const bool gpu = cluster.device.kind == spec::DeviceKind::kGpu;
  const spec::Plan plan = validated_plan(o.plan, o.gpus, model, cluster);
  const spec::Stack stack = spec::plan_stack(plan, gpu, model.kind());
  const interop::Exported e = interop::export_plan(
      plan, model, stack, sim::step_precision(cluster, plan, stack).gemm_dtype, *target);
  if (o.json) {
    spec::Json settings = spec::Json::array();
    for (const interop::Setting& s : e.settings)
      settings.push_back({{"name", s.name}, {"value", s.value}});
    spec::Json j = {{"to", o.to},
                    {"plan", plan.name()},
                    {"settings", settings},
                    {"text", e.text},
                    {"notes", e.notes}};
    if (!o.out.empty()) {
      spec::write_file_atomically(o.out, e.text);
      j["out"] = o.out;
    }
    std::cout << j.dump(2) << "\n";
    return;
  }
  if (o.out.empty()) {
    std::cout << e.text << std::flush;  // machine text: std::cout is never wrapped
  } else {
    spec::write_file_atomically(o.out, e.text);
    fmt::print("{}: {} for {}\n", o.out, o.to, plan.name());
  }
  // What the user still does, on stderr when the text itself went to stdout (to pipe it).
  for (const std::string& note : e.notes)
    fmt::print(o.out.empty() ? stderr : stdout, "note: {}\n", note);
}

}  // namespace

void add_export_command(CLI::App& app) {
  auto o = std::make_shared<ExportOptions>();
  CLI::App* cmd =
      app.add_subcommand("export",
                         "Write a plan as the flags or config of a training stack (megatron-core, "
                         "megatron-lm, nemo, torchtitan, deepspeed)");
  cmd->add_option("--model", o->model, "Zoo name, model file or Hugging Face config.json")
      ->required();
  cmd->add_option("--cluster", o->cluster, "Cluster name or file (the default precision)")
      ->required();
  cmd->add_option("--to", o->to,
                  "megatron-core | megatron-lm (pretrain_gpt.py arguments), nemo (recipe "
                  "overrides), torchtitan (TOML), deepspeed (JSON)")
      ->required();
  cmd->add_option("--gpus", o->gpus, "Number of GPUs (dp is what the other degrees leave)")
      ->check(positive());
  add_plan_flags(*cmd, o->plan);
  cmd->add_option("--out", o->out, "Write the file here (written atomically) instead of stdout");
  cmd->add_flag("--json", o->json, "Print the settings, text and notes as JSON");
  cmd->callback([o] { run(*o); });
}

}  // namespace sextant::cli
