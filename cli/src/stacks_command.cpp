// `sextant stacks list|show`: the software-stack presets and where each knob comes from.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <iostream>
#include <memory>

#include "commands.hpp"
#include "fitted_output.hpp"
#include "sextant/spec/stack.hpp"
#include "sextant/spec/stack_support.hpp"

namespace sextant::cli {

namespace {

void run_list() {
  fmt::print("{:<20} {:<8} {:<9} {:<10} {}\n", "name", "attn", "fusion", "tp overlap",
             "description");
  for (const std::string& name : spec::builtin_stack_names()) {
    spec::Stack s = spec::builtin_stack(name);
    fmt::print("{:<20} {:<8} {:<9} {:<10} {}\n", name,
               spec::enum_name(spec::attention_kernel_names(), s.attention),
               spec::enum_name(spec::fusion_names(), s.fusion),
               spec::enum_name(spec::tp_overlap_names(), s.tp_overlap),
               wrap_from(s.description, 51));
  }
}

void run_show(const std::string& name, bool json) {
  spec::Stack s = spec::resolve_stack_preset(name);
  spec::Json knobs = spec::to_json(s);
  if (json) {
    std::cout << spec::stack_file_json(s).dump(2) << "\n";
    return;
  }
  fmt::print("{}: {}\n", s.preset, s.description);
  for (std::string_view knob : spec::stack_knob_names()) {
    auto src = s.sources.find(std::string(knob));
    fmt::print("  {:<21} {:<10} {}\n", knob, knobs.at(std::string(knob)).dump(),
               src == s.sources.end() ? "" : src->second);
  }
  // What `sextant plan` may vary (the software's flags).
  auto src = s.sources.find("tunable");
  fmt::print("  {:<21} {:<10} {}\n", "tunable",
             s.tunable.empty() ? "none" : fmt::format("{}", fmt::join(s.tunable, ", ")),
             src == s.sources.end() ? "" : src->second);
  // What the software runs: the plans `sextant plan --stack` proposes and simulate/run accept.
  const spec::StackSupport* support = spec::stack_support(s);
  if (support == nullptr) {
    fmt::print("runs: not a shipped preset, so any plan (Sextant does not know this software)\n");
    return;
  }
  fmt::print("runs:\n");
  const spec::Json features = spec::to_json(*support);
  for (std::string_view key : spec::stack_support_keys()) {
    const spec::Json& value = features.at(std::string(key));
    std::string text = value.is_array() && value.empty() ? "none" : value.dump();
    if (value.is_array() && !value.empty()) {
      std::vector<std::string> items;
      for (const spec::Json& v : value)
        items.push_back(v.is_string() ? v.get<std::string>() : v.dump());
      text = fmt::format("{}", fmt::join(items, ","));
    }
    auto from = support->sources.find(std::string(key));
    fmt::print("  {:<24} {:<20} {}\n", key, text,
               from == support->sources.end() ? "" : from->second);
  }
}

}  // namespace

void add_stacks_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("stacks", "List or show the software-stack presets");
  cmd->require_subcommand(1);
  cmd->add_subcommand("list", "List the shipped presets")->callback([] { run_list(); });
  struct Options {
    std::string name;
    bool json = false;
  };
  auto o = std::make_shared<Options>();
  CLI::App* show = cmd->add_subcommand("show", "Show one preset with the source of every knob");
  show->add_option("stack", o->name, "Preset name or sextant.stack/1 file")->required();
  show->add_flag("--json", o->json, "Print JSON");
  show->callback([o] { run_show(o->name, o->json); });
}

}  // namespace sextant::cli
