// A stack's "supports" object, the shipped presets' support tables and the plan check.
#include "sextant/spec/stack_support.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>

#include "sextant/spec/embedded_file.hpp"
#include "sextant/spec/json_io.hpp"

namespace sextant::spec {

std::span<const EmbeddedFile> embedded_stacks();  // generated from stacks/*.json

namespace {

constexpr std::array<std::pair<std::string_view, OffloadKind>, 3> kOffloadKinds{
    {{"optimizer", OffloadKind::kOptimizer},
     {"optimizer+params", OffloadKind::kOptimizerAndParams},
     {"activations", OffloadKind::kActivations}}};

constexpr std::array<std::string_view, 20> kKeys{"models",
                                                 "zero",
                                                 "ddp_with_model_parallel",
                                                 "tensor_parallel",
                                                 "sequence_parallel",
                                                 "tensor_grid",
                                                 "context_parallel",
                                                 "expert_parallel",
                                                 "spatial",
                                                 "schedules",
                                                 "recompute",
                                                 "recompute_layers",
                                                 "swap_and_recompute",
                                                 "parameter_server",
                                                 "branch_parallel",
                                                 "offload",
                                                 "offload_devices",
                                                 "precisions",
                                                 "compression",
                                                 "sources"};

template <typename T>
bool contains(const std::vector<T>& values, T value) {
  return std::find(values.begin(), values.end(), value) != values.end();
}

// A list of names from `names`, each once; `skip` names a value the list may not hold ("none").
template <typename E>
std::vector<E> read_names(ObjectReader& r, std::string_view key, EnumNames<E> names,
                          std::string_view skip = "") {
  std::vector<E> out;
  const Json* list = r.array(key);
  if (list == nullptr) return out;
  std::vector<std::string_view> allowed;
  for (const auto& [name, v] : names)
    if (name != skip) allowed.push_back(name);
  for (const Json& item : *list) {
    const std::string text = item.is_string() ? item.get<std::string>() : "";
    auto value = enum_from_name(names, text);
    if (!value || text == skip || contains(out, *value)) {
      r.problem(key, short_dump(item), "each entry once, one of " + join_names(allowed));
      continue;
    }
    out.push_back(*value);
  }
  return out;
}

template <typename E>
Json names_json(EnumNames<E> names, const std::vector<E>& values) {
  Json list = Json::array();
  for (E v : values) list.push_back(enum_name(names, v));
  return list;
}

std::string model_kind_label(ModelKind kind) {
  switch (kind) {
    case ModelKind::kTransformer:
      return "transformers";
    case ModelKind::kCnn:
      return "CNNs";
    case ModelKind::kMlp:
      break;
  }
  return "MLPs";
}

// The training state `offload` keeps off the device, if any.
std::optional<OffloadKind> state_offload(const Offload& offload) {
  if (offload.params != OffloadTarget::kNone) return OffloadKind::kOptimizerAndParams;
  if (offload.optimizer != OffloadTarget::kNone) return OffloadKind::kOptimizer;
  return std::nullopt;
}

// Whether a replica group beside model parallelism reduces gradients as plain DDP.
bool ddp_beside_model_parallel(const Plan& p) {
  return p.zero == 0 && p.replicas() > 1 && (p.tp > 1 || p.pp > 1 || p.cp > 1 || p.ep > 1);
}

struct Presets {
  std::vector<std::pair<std::string, StackSupport>> supports;
};

const Presets& presets() {
  static const Presets all = [] {
    Presets p;
    for (const EmbeddedFile& f : embedded_stacks()) {
      const std::string source = "stacks/" + std::string(f.name) + ".json";
      const Json json = parse_json_text(f.text, source);
      if (!json.contains("supports")) continue;
      p.supports.emplace_back(std::string(f.name),
                              stack_support_from_json(json["supports"], source, "/supports"));
    }
    return p;
  }();
  return all;
}

}  // namespace

EnumNames<OffloadKind> offload_kind_names() {
  return kOffloadKinds;
}

std::vector<std::string_view> stack_support_keys() {
  return {kKeys.begin(), kKeys.end() - 1};  // (all but "sources")
}

StackSupport stack_support_from_json(const Json& json, const std::string& source,
                                     const std::string& pointer) {
  Diagnostics diag(source);
  ObjectReader r(json, pointer, diag);
  if (!r.is_object()) {
    diag.add(pointer, short_dump(json), "must be an object of the plan features the stack runs");
    diag.throw_if_any();
  }
  StackSupport s;
  s.models = read_names(r, "models", model_kind_names());
  if (auto stages = r.integer_array("zero", Range::between(0, 3))) {
    for (int64_t z : *stages) {
      if (contains(s.zero, static_cast<int>(z))) r.problem("zero", std::to_string(z), "each once");
      s.zero.push_back(static_cast<int>(z));
    }
  }
  s.ddp_with_model_parallel = r.boolean("ddp_with_model_parallel").value_or(true);
  s.tensor_parallel = r.boolean("tensor_parallel").value_or(false);
  s.sequence_parallel = r.boolean("sequence_parallel").value_or(false);
  s.tensor_grid = r.boolean("tensor_grid").value_or(false);
  s.context_parallel = read_names(r, "context_parallel", context_algorithm_names());
  s.expert_parallel = r.boolean("expert_parallel").value_or(false);
  s.spatial = r.boolean("spatial").value_or(false);
  s.schedules = read_names(r, "schedules", schedule_names());
  s.recompute = read_names(r, "recompute", recompute_names());
  s.recompute_layers = r.boolean("recompute_layers").value_or(false);
  s.swap_and_recompute = r.boolean("swap_and_recompute").value_or(false);
  s.parameter_server = r.boolean("parameter_server").value_or(false);
  s.branch_parallel = r.boolean("branch_parallel").value_or(false);
  s.offload = read_names(r, "offload", offload_kind_names());
  s.offload_devices = read_names(r, "offload_devices", offload_target_names(), "none");
  s.precisions = read_names(r, "precisions", dtype_names());
  s.compression = read_names(r, "compression", compression_kind_names(), "none");
  if (s.models.empty() && r.has("models")) r.problem("models", "[]", "at least one model kind");
  if (s.precisions.empty() && r.has("precisions"))
    r.problem("precisions", "[]", "at least one compute dtype");
  if (!s.offload.empty() && !contains(s.offload, OffloadKind::kActivations) &&
      s.offload_devices.empty())
    r.problem("offload_devices", "[]", "where the offloaded state goes: host or nvme");
  if (auto src = r.object("sources", Presence::kOptional)) {
    for (std::string_view key : stack_support_keys())
      if (auto text = src->string(key, Presence::kOptional)) s.sources[std::string(key)] = *text;
    src->finish();  // anything else is not a feature
  }
  r.finish();
  diag.throw_if_any();
  return s;
}

Json to_json(const StackSupport& s) {
  Json j = Json::object();
  j["models"] = names_json(model_kind_names(), s.models);
  j["zero"] = s.zero;
  j["ddp_with_model_parallel"] = s.ddp_with_model_parallel;
  j["tensor_parallel"] = s.tensor_parallel;
  j["sequence_parallel"] = s.sequence_parallel;
  j["tensor_grid"] = s.tensor_grid;
  j["context_parallel"] = names_json(context_algorithm_names(), s.context_parallel);
  j["expert_parallel"] = s.expert_parallel;
  j["spatial"] = s.spatial;
  j["schedules"] = names_json(schedule_names(), s.schedules);
  j["recompute"] = names_json(recompute_names(), s.recompute);
  j["recompute_layers"] = s.recompute_layers;
  j["swap_and_recompute"] = s.swap_and_recompute;
  j["parameter_server"] = s.parameter_server;
  j["branch_parallel"] = s.branch_parallel;
  j["offload"] = names_json(offload_kind_names(), s.offload);
  j["offload_devices"] = names_json(offload_target_names(), s.offload_devices);
  j["precisions"] = names_json(dtype_names(), s.precisions);
  j["compression"] = names_json(compression_kind_names(), s.compression);
  if (!s.sources.empty()) j["sources"] = s.sources;
  return j;
}

const StackSupport* stack_support(std::string_view preset) {
  for (const auto& [name, support] : presets().supports)
    if (name == preset) return &support;
  return nullptr;
}

const StackSupport* stack_support(const Stack& stack) {
  return stack_support(stack.preset);
}

std::vector<PlanFeature> plan_features(const Plan& p, const ModelSpec& model, Dtype compute) {
  std::vector<PlanFeature> f;
  f.push_back(
      {model_kind_label(model.kind()), [](const StackSupport& s, const Plan&, const ModelSpec& m,
                                          Dtype) { return contains(s.models, m.kind()); }});
  // A ZeRO stage matters where there is something to shard or to offload.
  if (p.zero > 0 && (p.replicas() > 1 || p.offload.state())) {
    static constexpr std::array<std::string_view, 4> kZero{
        "", "ZeRO-1 (optimizer state sharded, gradients whole)",
        "ZeRO-2 (optimizer state and gradients sharded)", "ZeRO-3 (parameters sharded too)"};
    f.push_back({std::string(kZero[static_cast<size_t>(p.zero)]),
                 [](const StackSupport& s, const Plan& q, const ModelSpec&, Dtype) {
                   return contains(s.zero, q.zero);
                 }});
  }
  if (p.zero == 0 && p.replicas() > 1)
    f.push_back({"DDP (ZeRO 0)", [](const StackSupport& s, const Plan&, const ModelSpec&, Dtype) {
                   return contains(s.zero, 0);
                 }});
  if (ddp_beside_model_parallel(p))
    f.push_back({"DDP (ZeRO 0) beside tensor, pipeline, context or expert parallelism",
                 [](const StackSupport& s, const Plan&, const ModelSpec&, Dtype) {
                   return s.ddp_with_model_parallel;
                 }});
  if (p.branch_parallel)
    f.push_back({"SUPER's branch split", [](const StackSupport& s, const Plan&, const ModelSpec&,
                                            Dtype) { return s.branch_parallel; }});
  if (p.tp > 1 && !p.tp_grid.any() && !p.branch_parallel)
    f.push_back({"tensor parallelism", [](const StackSupport& s, const Plan&, const ModelSpec&,
                                          Dtype) { return s.tensor_parallel; }});
  if (p.tp_grid.any())
    f.push_back({"3D tensor grids (AxoNN)", [](const StackSupport& s, const Plan&, const ModelSpec&,
                                               Dtype) { return s.tensor_grid; }});
  if (p.sequence_parallel)
    f.push_back({"sequence parallelism", [](const StackSupport& s, const Plan&, const ModelSpec&,
                                            Dtype) { return s.sequence_parallel; }});
  if (p.cp > 1)
    f.push_back({fmt::format("context parallelism with {} attention",
                             enum_name(context_algorithm_names(), p.cp_algorithm)),
                 [](const StackSupport& s, const Plan& q, const ModelSpec&, Dtype) {
                   return contains(s.context_parallel, q.cp_algorithm);
                 }});
  if (p.ep > 1)
    f.push_back({"expert parallelism", [](const StackSupport& s, const Plan&, const ModelSpec&,
                                          Dtype) { return s.expert_parallel; }});
  if (p.spatial.any())
    f.push_back({"spatial parallelism", [](const StackSupport& s, const Plan&, const ModelSpec&,
                                           Dtype) { return s.spatial; }});
  if (p.pp > 1)
    f.push_back({fmt::format("pipeline parallelism with the {} schedule",
                             enum_name(schedule_names(), p.schedule)),
                 [](const StackSupport& s, const Plan& q, const ModelSpec&, Dtype) {
                   return contains(s.schedules, q.schedule);
                 }});
  if (p.recompute != Recompute::kNone)
    f.push_back({fmt::format("{} recompute", enum_name(recompute_names(), p.recompute)),
                 [](const StackSupport& s, const Plan& q, const ModelSpec&, Dtype) {
                   return contains(s.recompute, q.recompute);
                 }});
  if (p.recompute == Recompute::kFull && p.recompute_layers > 0)
    f.push_back({"full recompute of the first layers of each chunk only",
                 [](const StackSupport& s, const Plan&, const ModelSpec&, Dtype) {
                   return s.recompute_layers;
                 }});
  if (std::optional<OffloadKind> kind = state_offload(p.offload)) {
    f.push_back({*kind == OffloadKind::kOptimizer
                     ? "offloading the optimizer state alone"
                     : "offloading the optimizer state and the parameters",
                 [](const StackSupport& s, const Plan& q, const ModelSpec&, Dtype) {
                   return contains(s.offload, *state_offload(q.offload));
                 }});
    for (OffloadTarget t : {p.offload.optimizer, p.offload.params})
      if (t == OffloadTarget::kNvme) {
        f.push_back(
            {"offloading to NVMe", [](const StackSupport& s, const Plan&, const ModelSpec&, Dtype) {
               return contains(s.offload_devices, OffloadTarget::kNvme);
             }});
        break;
      }
  }
  if (p.offload.activations != OffloadTarget::kNone)
    f.push_back(
        {"offloading activations", [](const StackSupport& s, const Plan&, const ModelSpec&, Dtype) {
           return contains(s.offload, OffloadKind::kActivations);
         }});
  if (swaps_and_recomputes(p))
    f.push_back({"offloading the first layers' activations and recomputing the next (KARMA)",
                 [](const StackSupport& s, const Plan&, const ModelSpec&, Dtype) {
                   return s.swap_and_recompute;
                 }});
  if (p.offload.prefetch_layers > 1)
    f.push_back({"reloading offloaded activations more than one layer ahead (KARMA)",
                 [](const StackSupport& s, const Plan&, const ModelSpec&, Dtype) {
                   return s.swap_and_recompute;
                 }});
  if (p.parameter_server.enabled)
    f.push_back({"parameter servers", [](const StackSupport& s, const Plan&, const ModelSpec&,
                                         Dtype) { return s.parameter_server; }});
  f.push_back({fmt::format("{} compute", enum_name(dtype_names(), compute)),
               [](const StackSupport& s, const Plan&, const ModelSpec&, Dtype c) {
                 return contains(s.precisions, c);
               }});
  if (p.compression.any())
    f.push_back({fmt::format("{} gradient compression",
                             enum_name(compression_kind_names(), p.compression.kind)),
                 [](const StackSupport& s, const Plan& q, const ModelSpec&, Dtype) {
                   return contains(s.compression, q.compression.kind);
                 }});
  return f;
}

std::vector<std::string> stack_support_problems(const Plan& plan, const ModelSpec& model,
                                                const Stack& stack, Dtype compute) {
  std::vector<std::string> problems;
  const StackSupport* support = stack_support(stack);
  if (support == nullptr) return problems;
  for (const PlanFeature& feature : plan_features(plan, model, compute)) {
    if (feature.runs(*support, plan, model, compute)) continue;
    std::vector<std::string> others;
    for (const auto& [name, s] : presets().supports)
      if (feature.runs(s, plan, model, compute)) others.push_back(name);
    problems.push_back(fmt::format(
        "the stack {} does not run {}{}", stack.preset, feature.label,
        others.empty()
            ? std::string("; no shipped stack does")
            : fmt::format("; stacks that do: {} (--stack NAME)", fmt::join(others, ", "))));
  }
  return problems;
}

void check_stack_runs(const Plan& plan, const ModelSpec& model, const Stack& stack, Dtype compute,
                      const std::string& source) {
  std::vector<std::string> problems = stack_support_problems(plan, model, stack, compute);
  if (problems.empty()) return;
  Diagnostics diag(source);
  for (std::string& p : problems) diag.add("/stack", stack.preset, std::move(p));
  diag.throw_if_any();
}

}  // namespace sextant::spec
