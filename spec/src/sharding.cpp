// Tensor layouts on a device mesh and the resharding rule (sharding.hpp).
#include "sextant/spec/sharding.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <map>
#include <optional>
#include <queue>
#include <set>
#include <tuple>

#include "sextant/spec/error.hpp"

namespace sextant::spec {

namespace {

constexpr std::string_view kSource = "sharding";

bool contains(const std::vector<std::string>& v, std::string_view s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

// The axes of `dim` in the order `order` lists them, then any `order` does not hold.
std::vector<std::string> ordered_like(std::vector<std::string> axes,
                                      const std::vector<std::string>& order) {
  std::stable_sort(axes.begin(), axes.end(), [&](const std::string& a, const std::string& b) {
    const auto pa = std::find(order.begin(), order.end(), a) - order.begin();
    const auto pb = std::find(order.begin(), order.end(), b) - order.begin();
    return pa < pb;
  });
  return axes;
}

TensorDim& dim_of(TensorLayout& layout, std::string_view name) {
  for (TensorDim& d : layout.dims)
    if (d.name == name) return d;
  SEXTANT_CHECK(false, "no dimension {}", name);
  throw std::logic_error("unreachable");
}

void check_same_dims(const TensorLayout& from, const TensorLayout& to) {
  bool same = from.dims.size() == to.dims.size();
  for (size_t i = 0; same && i < from.dims.size(); ++i)
    same = from.dims[i].name == to.dims[i].name && from.dims[i].extent == to.dims[i].extent;
  if (same) return;
  auto names = [](const TensorLayout& l) {
    std::vector<std::string> out;
    for (const TensorDim& d : l.dims) out.push_back(fmt::format("{}:{}", d.name, d.extent));
    return fmt::format("[{}]", fmt::join(out, ", "));
  };
  throw InputError(std::string(kSource), "/dims", names(to),
                   fmt::format("the dimensions of the tensor being resharded, {}", names(from)));
}

// A gather or an all-to-all takes an axis off a dimension: the minor one only. A rank's blocks
// along a dimension split by axes (a1, a2) are numbered c1 * n2 + c2; gathering over a1 while a2
// stays would leave each rank blocks that are not one block of the result (a permutation the
// collective does not make).
// (Axes of one rank split nothing: they are passed over.)
bool is_minor(const DeviceMesh& mesh, const std::vector<std::string>& axes,
              const std::string& axis) {
  const auto at = std::find(axes.begin(), axes.end(), axis);
  return at != axes.end() &&
         std::all_of(at + 1, axes.end(), [&](const std::string& a) { return mesh.size(a) == 1; });
}

void check_minor(const DeviceMesh& mesh, const TensorDim& d, const std::string& axis) {
  if (mesh.size(axis) == 1 || is_minor(mesh, d.axes, axis)) return;
  throw InputError(std::string(kSource), fmt::format("/from/dims/{}", d.name),
                   fmt::format("{}", fmt::join(d.axes, " x ")),
                   fmt::format("axis {} last among the axes splitting it, to be gathered or "
                               "exchanged: taking a major axis off would permute the blocks",
                               axis));
}

// The reshard steps of one phase: `kind` on every axis it applies to, in mesh order.
void run_phase(ReshardKind kind, const DeviceMesh& mesh, TensorLayout& cur, const TensorLayout& to,
               int64_t element_bytes, std::vector<ReshardStep>& steps) {
  for (const MeshAxis& axis : mesh.axes) {
    const std::string& a = axis.name;
    const TensorDim* fd = cur.split_by(a);
    const TensorDim* td = to.split_by(a);
    const bool fp = cur.partial_over(a), tp = to.partial_over(a);
    const int64_t shard_bytes = cur.shard_elements(mesh) * element_bytes;
    ReshardStep step{kind, a, "", "", 0};
    switch (kind) {
      case ReshardKind::kSlice:
        if (fp || fd != nullptr || td == nullptr) continue;
        step.dim = td->name;
        dim_of(cur, td->name).axes.push_back(a);
        break;
      case ReshardKind::kReduceScatter:
        if (!fp || tp || td == nullptr) continue;
        step.dim = td->name;
        step.bytes = shard_bytes;
        std::erase(cur.partial, a);
        dim_of(cur, td->name).axes.push_back(a);
        break;
      case ReshardKind::kAllReduce:
        if (!fp || tp || td != nullptr) continue;
        step.bytes = shard_bytes;
        std::erase(cur.partial, a);
        break;
      case ReshardKind::kAllToAll:
        if (fd == nullptr || td == nullptr || fd->name == td->name) continue;
        check_minor(mesh, *fd, a);
        step.dim = fd->name;
        step.to_dim = td->name;
        step.bytes = shard_bytes;
        std::erase(dim_of(cur, fd->name).axes, a);
        dim_of(cur, td->name).axes.push_back(a);
        break;
      case ReshardKind::kAllGather:
        if (fd == nullptr || td != nullptr) continue;
        check_minor(mesh, *fd, a);
        step.dim = fd->name;
        step.bytes = shard_bytes * axis.size;
        std::erase(dim_of(cur, fd->name).axes, a);
        break;
    }
    if (axis.size > 1) steps.push_back(step);  // over one rank a step moves nothing
  }
}

// A layout without its axes of one rank (they split nothing), partial axes sorted: the form two
// layouts are compared in.
TensorLayout split_only(const DeviceMesh& mesh, TensorLayout l) {
  for (TensorDim& d : l.dims)
    std::erase_if(d.axes, [&](const std::string& a) { return mesh.size(a) == 1; });
  std::erase_if(l.partial, [&](const std::string& a) { return mesh.size(a) == 1; });
  std::sort(l.partial.begin(), l.partial.end());
  return l;
}

std::string layout_key(const TensorLayout& l) {
  std::string key;
  for (const TensorDim& d : l.dims) key += fmt::format("{}:{};", d.name, fmt::join(d.axes, ","));
  return key + fmt::format("|{}", fmt::join(l.partial, ","));
}

// The cheapest sequence of single steps from `from` to `to` (fewest bytes moved, then fewest
// steps), each taking an axis off a dimension only as its minor one: Dijkstra over the layouts.
// For the moves the phase order cannot make (a gather or an all-to-all whose axis another step
// has made major, axes to be reordered): gathering first, then splitting again.
std::optional<std::vector<ReshardStep>> cheapest_route(const DeviceMesh& mesh,
                                                       const TensorLayout& from,
                                                       const TensorLayout& to,
                                                       int64_t element_bytes) {
  struct Reached {
    int64_t bytes = 0;
    size_t steps = 0;
    std::string prev;
    ReshardStep step;
  };
  const TensorLayout goal = split_only(mesh, to);
  const TensorLayout start = split_only(mesh, from);
  std::map<std::string, Reached> best;
  std::map<std::string, TensorLayout> layouts;
  using Entry = std::tuple<int64_t, size_t, std::string>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> open;
  const std::string start_key = layout_key(start);
  best[start_key] = {};
  layouts[start_key] = start;
  open.emplace(0, 0, start_key);
  std::set<std::string> done;
  while (!open.empty()) {
    // (Copies, not a structured binding: the lambda below captures them, which clang before 16
    // refuses for bindings.)
    const int64_t bytes = std::get<0>(open.top());
    const size_t count = std::get<1>(open.top());
    const std::string key = std::get<2>(open.top());
    open.pop();
    if (!done.insert(key).second) continue;
    const TensorLayout cur = layouts.at(key);
    if (cur == goal) {
      std::vector<ReshardStep> route;
      for (std::string at = key; at != start_key; at = best.at(at).prev)
        route.push_back(best.at(at).step);
      std::reverse(route.begin(), route.end());
      return route;
    }
    const int64_t shard = cur.shard_elements(mesh) * element_bytes;
    auto reach = [&](TensorLayout next, ReshardStep step) {
      if (!layout_problem(mesh, next).empty()) return;
      const std::string k = layout_key(next);
      const int64_t b = bytes + step.bytes;
      const auto it = best.find(k);
      if (it != best.end() &&
          std::pair(it->second.bytes, it->second.steps) <= std::pair(b, count + 1))
        return;
      best[k] = {b, count + 1, key, step};
      layouts[k] = std::move(next);
      open.emplace(b, count + 1, k);
    };
    for (const MeshAxis& axis : mesh.axes) {
      const std::string& a = axis.name;
      if (axis.size == 1) continue;
      const TensorDim* held = cur.split_by(a);
      if (cur.partial_over(a)) {
        if (goal.partial_over(a)) continue;
        TensorLayout summed = cur;
        std::erase(summed.partial, a);
        reach(summed, {ReshardKind::kAllReduce, a, "", "", shard});
        for (const TensorDim& d : cur.dims) {
          TensorLayout next = summed;
          dim_of(next, d.name).axes.push_back(a);
          reach(next, {ReshardKind::kReduceScatter, a, d.name, "", shard});
        }
      } else if (held != nullptr) {
        if (!is_minor(mesh, held->axes, a)) continue;
        TensorLayout off = cur;
        std::erase(dim_of(off, held->name).axes, a);
        reach(off, {ReshardKind::kAllGather, a, held->name, "", shard * axis.size});
        for (const TensorDim& d : cur.dims) {
          if (d.name == held->name) continue;
          TensorLayout next = off;
          dim_of(next, d.name).axes.push_back(a);
          reach(next, {ReshardKind::kAllToAll, a, held->name, d.name, shard});
        }
      } else {
        for (const TensorDim& d : cur.dims) {
          TensorLayout next = cur;
          dim_of(next, d.name).axes.push_back(a);
          reach(next, {ReshardKind::kSlice, a, d.name, "", 0});
        }
      }
    }
  }
  return std::nullopt;
}

}  // namespace

int64_t DeviceMesh::ranks() const {
  int64_t n = 1;
  for (const MeshAxis& a : axes) n *= a.size;
  return n;
}

bool DeviceMesh::has(std::string_view name) const {
  return std::any_of(axes.begin(), axes.end(), [&](const MeshAxis& a) { return a.name == name; });
}

int64_t DeviceMesh::size(std::string_view name) const {
  for (const MeshAxis& a : axes)
    if (a.name == name) return a.size;
  throw InputError(std::string(kSource), "/axes", std::string(name), "an axis of the device mesh");
}

const TensorDim* TensorLayout::dim(std::string_view name) const {
  for (const TensorDim& d : dims)
    if (d.name == name) return &d;
  return nullptr;
}

const TensorDim* TensorLayout::split_by(std::string_view axis) const {
  for (const TensorDim& d : dims)
    if (contains(d.axes, axis)) return &d;
  return nullptr;
}

bool TensorLayout::partial_over(std::string_view axis) const {
  return contains(partial, axis);
}

int64_t local_extent(const DeviceMesh& mesh, const TensorDim& d) {
  int64_t parts = 1;
  for (const std::string& a : d.axes) parts *= mesh.size(a);
  return d.extent / parts;
}

int64_t TensorLayout::shard_elements(const DeviceMesh& mesh) const {
  int64_t n = 1;
  for (const TensorDim& d : dims) n *= local_extent(mesh, d);
  return n;
}

std::string layout_problem(const DeviceMesh& mesh, const TensorLayout& layout) {
  std::set<std::string> used;
  auto use = [&](const std::string& axis) -> std::string {
    if (!mesh.has(axis)) return fmt::format("axis {} is not an axis of the mesh", axis);
    if (!used.insert(axis).second)
      return fmt::format("axis {} splits the tensor twice (or splits it and sums over it)", axis);
    return "";
  };
  for (const TensorDim& d : layout.dims) {
    if (d.extent < 1) return fmt::format("dimension {} has extent {}", d.name, d.extent);
    int64_t parts = 1;
    for (const std::string& a : d.axes) {
      if (std::string p = use(a); !p.empty()) return p;
      parts *= mesh.size(a);
    }
    if (d.extent % parts != 0)
      return fmt::format("dimension {} of extent {} does not divide over {} ranks ({})", d.name,
                         d.extent, parts, fmt::join(d.axes, " x "));
  }
  for (const std::string& a : layout.partial)
    if (std::string p = use(a); !p.empty()) return p;
  return "";
}

std::string_view reshard_kind_name(ReshardKind kind) {
  switch (kind) {
    case ReshardKind::kSlice:
      return "slice";
    case ReshardKind::kReduceScatter:
      return "reduce-scatter";
    case ReshardKind::kAllReduce:
      return "all-reduce";
    case ReshardKind::kAllToAll:
      return "all-to-all";
    case ReshardKind::kAllGather:
      return "all-gather";
  }
  return "?";
}

CollectiveKind ReshardStep::collective() const {
  switch (kind) {
    case ReshardKind::kReduceScatter:
      return CollectiveKind::kReduceScatter;
    case ReshardKind::kAllReduce:
      return CollectiveKind::kAllReduce;
    case ReshardKind::kAllToAll:
      return CollectiveKind::kAllToAll;
    case ReshardKind::kAllGather:
      return CollectiveKind::kAllGather;
    case ReshardKind::kSlice:
      break;
  }
  return CollectiveKind::kSendRecv;
}

TensorLayout after_step(const DeviceMesh& mesh, const TensorLayout& layout,
                        const ReshardStep& step) {
  TensorLayout out = layout;
  auto take_minor = [&](std::string_view name) {
    std::vector<std::string>& axes = dim_of(out, name).axes;
    SEXTANT_CHECK(is_minor(mesh, axes, step.axis), "{} is not {}'s minor axis", step.axis, name);
    std::erase(axes, step.axis);
  };
  switch (step.kind) {
    case ReshardKind::kSlice:
      dim_of(out, step.dim).axes.push_back(step.axis);
      break;
    case ReshardKind::kReduceScatter:
      std::erase(out.partial, step.axis);
      dim_of(out, step.dim).axes.push_back(step.axis);
      break;
    case ReshardKind::kAllReduce:
      std::erase(out.partial, step.axis);
      break;
    case ReshardKind::kAllToAll:
      take_minor(step.dim);
      dim_of(out, step.to_dim).axes.push_back(step.axis);
      break;
    case ReshardKind::kAllGather:
      take_minor(step.dim);
      break;
  }
  return out;
}

namespace {

// The fixed phase order's steps (reshard); throws InputError where they would permute blocks.
std::vector<ReshardStep> phased_steps(const DeviceMesh& mesh, const TensorLayout& from,
                                      const TensorLayout& to, int64_t element_bytes) {
  TensorLayout cur = from;
  std::vector<ReshardStep> steps;
  for (ReshardKind kind :
       {ReshardKind::kSlice, ReshardKind::kReduceScatter, ReshardKind::kAllReduce,
        ReshardKind::kAllToAll, ReshardKind::kAllGather})
    run_phase(kind, mesh, cur, to, element_bytes, steps);
  // Every axis now splits the dimension `to` names: what is left is the order within a dimension.
  for (size_t i = 0; i < cur.dims.size(); ++i) {
    std::vector<std::string>& axes = cur.dims[i].axes;
    const std::vector<std::string>& want = to.dims[i].axes;
    const std::vector<std::string> kept = ordered_like(axes, want);
    // Axes added by this reshard take their place in `to`'s order; those already there keep
    // theirs, which must agree with it (a reordering would permute the ranks' blocks).
    std::vector<std::string> before;
    for (const std::string& a : from.dims[i].axes)
      if (contains(want, a)) before.push_back(a);
    if (ordered_like(before, want) != before)
      throw InputError(std::string(kSource), fmt::format("/to/dims/{}", cur.dims[i].name),
                       fmt::format("{}", fmt::join(want, " x ")),
                       fmt::format("the axes splitting it in their present order ({}): "
                                   "reordering them is not modelled",
                                   fmt::join(from.dims[i].axes, " x ")));
    // Each step adds its axis as the minor one (a slice within the rank's block): the axes must
    // already stand in `to`'s order, or the blocks would be permuted.
    auto split = [&](std::vector<std::string> v) {
      std::erase_if(v, [&](const std::string& a) { return mesh.size(a) == 1; });
      return v;
    };
    if (split(kept) != split(axes))
      throw InputError(std::string(kSource), fmt::format("/to/dims/{}", cur.dims[i].name),
                       fmt::format("{}", fmt::join(want, " x ")),
                       fmt::format("the axes in the order the steps add them ({}): a new axis "
                                   "splits within the blocks of those already there",
                                   fmt::join(axes, " x ")));
    axes = kept;  // (axes of one rank take their place freely)
  }
  SEXTANT_CHECK(cur.partial.size() == to.partial.size(), "resharding left partial sums behind");
  for (size_t i = 0; i < cur.dims.size(); ++i)
    SEXTANT_CHECK(cur.dims[i].axes == to.dims[i].axes, "resharding {} ended off its layout",
                  cur.dims[i].name);
  return steps;
}

}  // namespace

std::vector<ReshardStep> reshard(const DeviceMesh& mesh, const TensorLayout& from,
                                 const TensorLayout& to, int64_t element_bytes) {
  for (const TensorLayout* l : {&from, &to})
    if (std::string p = layout_problem(mesh, *l); !p.empty())
      throw InputError(std::string(kSource), l == &from ? "/from" : "/to", "", p);
  check_same_dims(from, to);
  for (const std::string& a : to.partial)
    if (!from.partial_over(a))
      throw InputError(std::string(kSource), "/to/partial", a,
                       "an axis the tensor is already a partial sum over: resharding sums "
                       "partial sums, it cannot make them");
  // The phases in their order (shrinking steps first, so that the collectives move the least),
  // each step on the axes it applies to; where that order would permute blocks, the cheapest
  // route of single steps instead (gathering an axis before another comes behind it).
  std::vector<ReshardStep> steps;
  try {
    steps = phased_steps(mesh, from, to, element_bytes);
  } catch (const InputError&) {
    std::optional<std::vector<ReshardStep>> route = cheapest_route(mesh, from, to, element_bytes);
    if (!route) throw;
    steps = std::move(*route);
  }
  // The steps alone, as after_step applies them, lead to `to` on the axes that split anything.
  TensorLayout walked = from;
  for (const ReshardStep& s : steps) walked = after_step(mesh, walked, s);
  SEXTANT_CHECK(split_only(mesh, walked) == split_only(mesh, to),
                "the reshard steps do not lead to the layout");
  return steps;
}

}  // namespace sextant::spec
