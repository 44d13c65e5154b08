// Tensors laid out on a named device mesh, and the one rule that moves a tensor from one layout
// to another (Mesh-TensorFlow: Shazeer et al., NeurIPS'18, §3-4; GSPMD: Xu et al. 2021, §3.2).
//
// A layout says, for each dimension of a tensor, which mesh axes split it (major first), and over
// which axes each rank holds only a partial sum (a contraction split over them, not yet reduced).
// Between two layouts of the same tensor, each mesh axis moves by itself:
//   partial -> split dim d:        reduce-scatter over the axis along d
//   partial -> not split, whole:   all-reduce over the axis
//   split d -> split e (e != d):   all-to-all over the axis
//   split d -> not split:          all-gather over the axis along d
//   not split -> split d:          a local slice (no communication)
// Shrinking steps run first (slices, reduce-scatters, all-reduces, all-to-alls), all-gathers last,
// each in mesh-axis order, so that every collective moves the smallest buffer the rule allows.
// An axis of one rank moves nothing: its steps are left out.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "sextant/spec/collective_kinds.hpp"

namespace sextant::spec {

struct MeshAxis {
  std::string name;
  int64_t size = 1;
};

// A named device mesh: its ranks are the product of its axes' sizes.
struct DeviceMesh {
  std::vector<MeshAxis> axes;
  int64_t ranks() const;
  // The size of axis `name`; throws InputError when the mesh has no such axis.
  int64_t size(std::string_view name) const;
  bool has(std::string_view name) const;
};

// One dimension of a tensor (batch, seq, hidden, heads, ffn, vocab, experts, channels, height,
// width...): its extent and the mesh axes splitting it, major first.
struct TensorDim {
  std::string name;
  int64_t extent = 1;
  std::vector<std::string> axes;
  bool operator==(const TensorDim&) const = default;
};

// One rank's extent of `d`: its extent over the product of its axes' sizes.
int64_t local_extent(const DeviceMesh& mesh, const TensorDim& d);

struct TensorLayout {
  std::vector<TensorDim> dims;
  std::vector<std::string> partial;  // axes over which each rank holds a partial sum
  const TensorDim* dim(std::string_view name) const;
  // The dimension axis `axis` splits (nullptr: none).
  const TensorDim* split_by(std::string_view axis) const;
  bool partial_over(std::string_view axis) const;
  // Elements one rank holds.
  int64_t shard_elements(const DeviceMesh& mesh) const;
  bool operator==(const TensorLayout&) const = default;
};

// What is wrong with a layout on a mesh ("" when it is valid): an axis the mesh lacks, an axis used
// twice (or both splitting and partial), or a dimension its axes do not divide.
std::string layout_problem(const DeviceMesh& mesh, const TensorLayout& layout);

enum class ReshardKind { kSlice, kReduceScatter, kAllReduce, kAllToAll, kAllGather };
std::string_view reshard_kind_name(ReshardKind kind);

struct ReshardStep {
  ReshardKind kind = ReshardKind::kSlice;
  std::string axis;    // the mesh axis it runs over
  std::string dim;     // the dimension gathered, scattered or sliced (all-to-all: its source)
  std::string to_dim;  // all-to-all: the dimension split after it
  // The collective's buffer on each rank, as the collective models count it (nccl-tests' size):
  // the whole tensor an all-reduce sums, the whole input a reduce-scatter splits, the whole output
  // an all-gather makes, each rank's buffer of an all-to-all; 0 for a slice.
  int64_t bytes = 0;
  // The collective (a slice has none: kSendRecv, never priced).
  CollectiveKind collective() const;
  bool operator==(const ReshardStep&) const = default;
};

// The layout a step leaves: its axis added to a dimension as the minor one (slice,
// reduce-scatter, the all-to-all's new dimension) or taken off as the minor one (all-gather, the
// all-to-all's old dimension; axes of one rank after it are passed over), or a partial sum
// summed.
TensorLayout after_step(const DeviceMesh& mesh, const TensorLayout& layout,
                        const ReshardStep& step);

// The steps that move a tensor from layout `from` to layout `to` (the same dimensions and
// extents) on `mesh`, `element_bytes` an element; applied in turn by after_step, they lead to `to`
// (up to axes of one rank).
// Throws InputError when either layout is invalid, the dimensions differ, `to` holds a partial sum
// `from` does not (resharding cannot make one), or the blocks would be permuted: an axis gathered
// or exchanged while a minor one stays, or axes of one dimension that would change their order.
std::vector<ReshardStep> reshard(const DeviceMesh& mesh, const TensorLayout& from,
                                 const TensorLayout& to, int64_t element_bytes);

}  // namespace sextant::spec
