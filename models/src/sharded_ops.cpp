// Einsum ops under a split of their dimensions (sharded_ops.hpp).
#include "sextant/models/sharded_ops.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "sextant/spec/error.hpp"

namespace sextant::models {

namespace {

std::string joined(const std::vector<std::string>& axes) {
  return fmt::format("{}", fmt::join(axes, " x "));
}

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

// Every dimension of the op, operands first, in order of appearance.
std::vector<std::string> all_dims(const EinsumOp& op) {
  std::vector<std::string> dims;
  for (const auto& operand : op.operands)
    for (const std::string& d : operand)
      if (!contains(dims, d)) dims.push_back(d);
  for (const std::string& d : op.output)
    if (!contains(dims, d)) dims.push_back(d);
  return dims;
}

void check_split(const spec::DeviceMesh& mesh, const EinsumOp& op, const OpSplit& split) {
  const std::vector<std::string> dims = all_dims(op);
  std::set<std::string> used;
  const std::string where = fmt::format("/ops/{}", op.name);
  for (const auto& [dim, axes] : split) {
    if (axes.empty()) continue;
    if (!contains(dims, dim))
      throw InputError("per-op split", where + "/" + dim, joined(axes),
                       fmt::format("a dimension of the op ({})", fmt::join(dims, ", ")));
    if (contains(op.whole, dim))
      throw InputError("per-op split", where + "/" + dim, joined(axes),
                       "no split: the op needs this dimension whole on every rank");
    int64_t parts = 1;
    for (const std::string& a : axes) {
      if (!mesh.has(a))
        throw InputError("per-op split", where + "/" + dim, a, "an axis of the device mesh");
      if (!used.insert(a).second)
        throw InputError("per-op split", where + "/" + dim, a,
                         "an axis no other dimension of the op is split over");
      parts *= mesh.size(a);
    }
    if (op.extents.at(dim) % parts != 0)
      throw InputError(
          "per-op split", where + "/" + dim, joined(axes),
          fmt::format("axes whose ranks ({}) divide its extent {}", parts, op.extents.at(dim)));
  }
}

}  // namespace

double EinsumOp::total_flops() const {
  if (!is_product()) return flops;
  double n = 2;
  for (const std::string& d : all_dims(*this)) n *= static_cast<double>(extents.at(d));
  return n;
}

spec::TensorLayout layout_of(const std::vector<std::string>& dims,
                             const std::map<std::string, int64_t>& extents, const OpSplit& split,
                             std::vector<std::string> partial) {
  spec::TensorLayout out;
  for (const std::string& d : dims) {
    const auto it = split.find(d);
    out.dims.push_back(
        {d, extents.at(d), it == split.end() ? std::vector<std::string>{} : it->second});
  }
  out.partial = std::move(partial);
  return out;
}

ShardedOp shard_op(const spec::DeviceMesh& mesh, const EinsumOp& op, const OpSplit& split) {
  check_split(mesh, op, split);
  ShardedOp out;
  for (const auto& operand : op.operands)
    out.operands.push_back(layout_of(operand, op.extents, split));
  // Axes of contracted dimensions leave partial sums, in mesh order.
  std::vector<std::string> partial;
  if (op.is_product())
    for (const spec::MeshAxis& axis : mesh.axes)
      for (const auto& [dim, axes] : split)
        if (!contains(op.output, dim) && contains(axes, axis.name)) partial.push_back(axis.name);
  out.output = layout_of(op.output, op.extents, split, partial);
  int64_t parts = 1;
  for (const auto& [dim, axes] : split)
    for (const std::string& a : axes) parts *= mesh.size(a);
  out.flops = op.total_flops() / static_cast<double>(parts);
  return out;
}

EinsumOp gradient_op(const EinsumOp& op, size_t operand, double backward_factor) {
  SEXTANT_CHECK(operand < op.operands.size(), "op {} has no operand {}", op.name, operand);
  EinsumOp g;
  g.name = fmt::format("{}.d{}", op.name, operand);
  g.extents = op.extents;
  g.whole = op.whole;
  g.output = op.operands[operand];
  if (op.is_product()) {
    // d(operand) = d(output) . (the other operands), contracting the dimensions it lacks.
    g.operands.push_back(op.output);
    for (size_t i = 0; i < op.operands.size(); ++i)
      if (i != operand) g.operands.push_back(op.operands[i]);
  } else {
    g.operands.push_back(op.output);
    g.flops = op.flops * backward_factor;
  }
  return g;
}

}  // namespace sextant::models
