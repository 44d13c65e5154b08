// `sextant import`: a stack's own config (Megatron's arguments, NeMo's overrides, TorchTitan's
// TOML, DeepSpeed's JSON) read back as a plan, to predict what one already runs.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

#include "commands.hpp"
#include "sextant/interop/import.hpp"
#include "sextant/models/zoo.hpp"
#include "sextant/spec/json_io.hpp"
#include "validators.hpp"

namespace sextant::cli {

namespace {

struct ImportOptions {
  std::string file;
  std::string from;
  std::string model;
  int64_t gpus = 0;
  std::string out;
  bool json = false;
};

void run(const ImportOptions& o) {
  auto target = spec::enum_from_name(interop::target_names(), o.from);
  if (!target)
    throw InputError("command line", "--from", o.from,
                     "must be one of " + spec::enum_choices(interop::target_names()));
  if (!o.out.empty())
    if (std::string why = spec::unwritable_reason(o.out); !why.empty())
      throw InputError("--out", "", o.out, why);
  std::ifstream in(o.file, std::ios::binary);
  if (!in) throw InputError(o.file, "", "", "cannot be read");
  std::ostringstream text;
  text << in.rdbuf();
  const spec::ModelSpec model = models::resolve_model(o.model);
  const interop::Imported imported =
      interop::import_plan(*target, text.str(), o.file, model,
                           o.gpus > 0 ? std::optional<int64_t>(o.gpus) : std::nullopt);
  const spec::Json plan = spec::to_json(imported.plan);
  if (!o.out.empty()) spec::write_json_file(o.out, plan);
  if (o.json) {
    std::cout << spec::Json({{"plan", plan},
                             {"name", imported.plan.name()},
                             {"ignored", imported.ignored}})
                     .dump(2)
              << "\n";
    return;
  }
  if (o.out.empty())
    std::cout << plan.dump(2) << "\n";
  else
    fmt::print("{}: {} ({} stack)\n", o.out, imported.plan.name(), imported.plan.stack->preset);
  if (!imported.ignored.empty())
    fmt::print(stderr, "note: {} setting(s) that shape no plan were read and left out: {}\n",
               imported.ignored.size(), fmt::join(imported.ignored, " "));
}

}  // namespace

void add_import_command(CLI::App& app) {
  auto o = std::make_shared<ImportOptions>();
  CLI::App* cmd =
      app.add_subcommand("import",
                         "Read a stack's own config (megatron-core, megatron-lm, nemo, torchtitan, "
                         "deepspeed) as a plan");
  cmd->add_option("file", o->file,
                  "The config: pretrain_gpt.py arguments, NeMo-Run overrides (path=value lines), "
                  "a TorchTitan TOML or a DeepSpeed JSON")
      ->required();
  cmd->add_option("--from", o->from, "megatron-core | megatron-lm | nemo | torchtitan | deepspeed")
      ->required();
  cmd->add_option("--model", o->model, "Zoo name, model file or Hugging Face config.json")
      ->required();
  cmd->add_option("--gpus", o->gpus,
                  "Devices the job runs on (Megatron's data parallelism and DeepSpeed's pipeline "
                  "stages are what they leave)")
      ->check(positive());
  cmd->add_option("--out", o->out, "Write the plan here (sextant.plan/1, written atomically)");
  cmd->add_flag("--json", o->json, "Print the plan, its name and the settings left out as JSON");
  cmd->callback([o] { run(*o); });
}

}  // namespace sextant::cli
