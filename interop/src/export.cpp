// export_plan: the target's support check, its settings, and their text.
#include "sextant/interop/export.hpp"

#include <fmt/format.h>

#include <array>
#include <numeric>

#include "export_targets.hpp"
#include "sextant/spec/error.hpp"
#include "sextant/spec/stack_support.hpp"

namespace sextant::interop {

namespace {

constexpr std::array<std::pair<std::string_view, Target>, 5> kTargets{
    {{"megatron-core", Target::kMegatronCore},
     {"megatron-lm", Target::kMegatronLm},
     {"nemo", Target::kNemo},
     {"torchtitan", Target::kTorchtitan},
     {"deepspeed", Target::kDeepspeed}}};

// Megatron: one flag per line, continued with " \".
std::string render_arguments(const std::vector<Setting>& settings) {
  std::string text;
  for (size_t i = 0; i < settings.size(); ++i) {
    const Setting& s = settings[i];
    text += s.name;
    if (s.value.is_array()) {
      for (const spec::Json& v : s.value)
        text += " " + (v.is_string() ? v.get<std::string>() : v.dump());
    } else if (!(s.value.is_boolean() && s.value.get<bool>())) {
      text += " " + (s.value.is_string() ? s.value.get<std::string>() : s.value.dump());
    }
    text += i + 1 < settings.size() ? " \\\n" : "\n";
  }
  return text;
}

// NeMo-Run's command-line overrides: path=value, Python literals for booleans.
std::string render_overrides(const std::vector<Setting>& settings) {
  std::string text;
  for (const Setting& s : settings) {
    std::string value = s.value.is_boolean()  ? (s.value.get<bool>() ? "True" : "False")
                        : s.value.is_string() ? s.value.get<std::string>()
                                              : s.value.dump();
    text += s.name + "=" + value + "\n";
  }
  return text;
}

std::string toml_value(const spec::Json& v) {
  if (v.is_array()) {
    std::string items;
    for (const spec::Json& item : v) items += (items.empty() ? "" : ", ") + toml_value(item);
    return "[" + items + "]";
  }
  return v.dump();  // strings quoted, booleans lower case, numbers as they are: TOML's forms
}

// TorchTitan: "section.key" settings grouped under [section] in first-seen order.
std::string render_toml(const std::vector<Setting>& settings) {
  std::vector<std::string> sections;
  for (const Setting& s : settings) {
    std::string section = s.name.substr(0, s.name.find('.'));
    if (std::find(sections.begin(), sections.end(), section) == sections.end())
      sections.push_back(section);
  }
  std::string text;
  for (const std::string& section : sections) {
    text += (text.empty() ? "" : "\n") + ("[" + section + "]\n");
    for (const Setting& s : settings)
      if (s.name.substr(0, s.name.find('.')) == section)
        text += s.name.substr(section.size() + 1) + " = " + toml_value(s.value) + "\n";
  }
  return text;
}

// DeepSpeed: dotted paths as nested objects.
std::string render_json(const std::vector<Setting>& settings) {
  spec::Json j = spec::Json::object();
  for (const Setting& s : settings)
    j[spec::Json::json_pointer("/" + [&] {
      std::string p = s.name;
      std::replace(p.begin(), p.end(), '.', '/');
      return p;
    }())] = s.value;
  return j.dump(2) + "\n";
}

}  // namespace

spec::EnumNames<Target> target_names() {
  return kTargets;
}

std::string_view target_preset(Target target) {
  switch (target) {
    case Target::kMegatronLm:
      return "megatron-lm";
    case Target::kTorchtitan:
      return "torchtitan";
    case Target::kDeepspeed:
      return "deepspeed";
    case Target::kMegatronCore:
    case Target::kNemo:
      break;
  }
  return "megatron-core";  // NeMo 2.0 trains through Megatron-Core
}

std::string_view target_facts(Target target) {
  switch (target) {
    case Target::kMegatronCore:
    case Target::kMegatronLm:
      return "megatron";
    case Target::kNemo:
      return "nemo";
    case Target::kTorchtitan:
      return "torchtitan";
    case Target::kDeepspeed:
      break;
  }
  return "deepspeed";
}

namespace detail {

int64_t sequence_length(const ExportInput& in) {
  return in.plan.seq_len.value_or(in.model.is_transformer() ? in.model.transformer().seq_len : 0);
}

bool even_stages(const ExportInput& in) {
  const std::vector<int64_t>& s = in.plan.stage_layers;
  return s.empty() || std::all_of(s.begin(), s.end(), [&](int64_t n) { return n == s.front(); });
}

int64_t bucket_elements(const ExportInput& in) {
  const int64_t bytes = spec::dtype_bytes(spec::gradient_dtype(in.stack, in.compute));
  return std::max<int64_t>(1, in.stack.dp_bucket_bytes / bytes);
}

}  // namespace detail

Exported export_plan(const spec::Plan& plan, const spec::ModelSpec& model, const spec::Stack& stack,
                     spec::Dtype compute, Target target, std::optional<Trial> trial) {
  const std::string name(spec::enum_name(target_names(), target));
  Diagnostics diag("--to");
  // What the target's software cannot run at all, with the stacks that can.
  const spec::Stack preset = spec::builtin_stack(target_preset(target));
  for (std::string& p : spec::stack_support_problems(plan, model, preset, compute))
    diag.add("", name, std::move(p));
  if (!plan.collective_algorithms.empty())
    diag.add("", name,
             "collective algorithms named per collective (the plan's collective_algorithms): "
             "the stack's NCCL chooses its own (NCCL_ALGO in the job's environment sets one for "
             "every collective); remove them to export");
  diag.throw_if_any();
  detail::ExportOutput out;
  if (trial && target == Target::kNemo)
    diag.add("", name,
             "a trial run: NeMo-Run starts and times its own jobs (nemo llm pretrain --executor "
             "slurm with the overrides of `sextant export --to nemo`)");
  diag.throw_if_any();
  const detail::ExportInput in{plan, model, stack, compute, trial};
  switch (target) {
    case Target::kMegatronCore:
    case Target::kMegatronLm:
      detail::megatron_settings(in, false, out);
      break;
    case Target::kNemo:
      detail::megatron_settings(in, true, out);
      break;
    case Target::kTorchtitan:
      detail::torchtitan_settings(in, out);
      break;
    case Target::kDeepspeed:
      detail::deepspeed_settings(in, out);
      break;
  }
  // What it runs but its flags cannot say.
  for (std::string& r : out.refused) diag.add("", name, std::move(r));
  diag.throw_if_any();
  Exported e{target, std::move(out.settings), "", std::move(out.notes)};
  switch (target) {
    case Target::kMegatronCore:
    case Target::kMegatronLm:
      e.text = render_arguments(e.settings);
      break;
    case Target::kNemo:
      e.text = render_overrides(e.settings);
      break;
    case Target::kTorchtitan:
      e.text = render_toml(e.settings);
      break;
    case Target::kDeepspeed:
      e.text = render_json(e.settings);
      break;
  }
  return e;
}

}  // namespace sextant::interop
