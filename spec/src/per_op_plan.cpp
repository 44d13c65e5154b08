// A plan's per-operator splits (per_op_plan.hpp).
#include "sextant/spec/per_op_plan.hpp"

#include <fmt/format.h>

#include "sextant/spec/plan.hpp"

namespace sextant::spec {

OpSplits read_op_splits(ObjectReader& plan) {
  OpSplits out;
  const Json* ops = plan.value("per_op", Presence::kOptional);
  if (ops == nullptr) return out;
  const std::string where = pointer_join(plan.pointer(), "per_op");
  if (!ops->is_object()) {
    plan.diagnostics().add(where, short_dump(*ops),
                           "an object: op -> dimension -> the mesh axes splitting it");
    return out;
  }
  for (const auto& [op, dims] : ops->items()) {
    const std::string op_where = pointer_join(where, op);
    if (!dims.is_object()) {
      plan.diagnostics().add(op_where, short_dump(dims),
                             "an object: dimension -> the mesh axes splitting it");
      continue;
    }
    std::map<std::string, std::vector<std::string>>& split = out[op];
    for (const auto& [dim, axes] : dims.items()) {
      const std::string dim_where = pointer_join(op_where, dim);
      bool ok = axes.is_array();
      for (size_t i = 0; ok && i < axes.size(); ++i) {
        ok = axes[i].is_string() &&
             (axes[i].get<std::string>() == kDataAxis || axes[i].get<std::string>() == kTensorAxis);
        if (ok) split[dim].push_back(axes[i].get<std::string>());
      }
      if (!ok)
        plan.diagnostics().add(dim_where, short_dump(axes),
                               "an array of mesh axes: \"d\" (the dp ranks) and \"t\" (the tp "
                               "ranks), major first, each at most once");
    }
  }
  return out;
}

Json op_splits_json(const OpSplits& splits) {
  Json j = Json::object();
  for (const auto& [op, dims] : splits) {
    Json d = Json::object();
    for (const auto& [dim, axes] : dims) d[dim] = axes;
    j[op] = d;
  }
  return j;
}

std::string op_splits_text(const OpSplits& splits) {
  if (splits.empty()) return "";
  // The ops grouped by their split: ".op-b:dt=attention+qkv-b:d,s:t=fc1+fc2".
  std::map<std::string, std::vector<std::string>> ops_by_split;
  for (const auto& [op, dims] : splits) {
    std::vector<std::string> parts;
    for (const auto& [dim, axes] : dims)
      if (!axes.empty()) parts.push_back(fmt::format("{}:{}", dim, fmt::join(axes, "")));
    ops_by_split[parts.empty() ? std::string("whole") : fmt::format("{}", fmt::join(parts, ","))]
        .push_back(op);
  }
  std::string s = ".op";
  for (const auto& [split, ops] : ops_by_split)
    s += fmt::format("-{}={}", split, fmt::join(ops, "+"));
  return s;
}

std::string per_op_problem(const Plan& p) {
  if (p.per_op.empty()) return "";
  if (p.cp > 1) return "covers dp x tp meshes: not with context parallelism (cp > 1)";
  if (p.ep > 1) return "covers dense blocks: not with expert parallelism (ep > 1)";
  if (p.tp_grid.any()) return "covers Megatron's 1D tensor parallelism: not with tp_grid";
  if (p.spatial.any()) return "covers transformer blocks: not with a spatial split";
  if (p.zero == 3) return "shards parameters by op: not with ZeRO-3, which shards them by rank";
  if (p.offload.any()) return "is not modelled with offload";
  if (p.compression.any()) return "is not modelled with gradient compression";
  return "";
}

}  // namespace sextant::spec
