// A tensor laid out on a per-op split's device mesh (spec/sharding.hpp) on this rank: its block,
// row-major over the local extents of its dimensions in the layout's order, and the resharding
// rule's steps run on it over the mesh axes' communicators. Blocks along a dimension split by axes
// (a1, ..., am) are numbered c1 n2 ... nm + ... + cm (the rule adds and removes the minor axis
// only), so a slice, a gather, a reduce-scatter and an all-to-all each move whole blocks.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "sextant/exec/backend.hpp"
#include "sextant/exec/communicator.hpp"
#include "sextant/exec/context.hpp"
#include "sextant/models/op_graph.hpp"
#include "sextant/spec/sharding.hpp"

namespace sextant::exec {

struct MeshTensor {
  Tensor data;  // fp32, the rank's block
  spec::TensorLayout layout;
};

class MeshRanks {
 public:
  struct Axis {
    Communicator* comm = nullptr;  // the ranks along the axis, ranked by their coordinate
    int64_t coord = 0;             // this rank's place on the axis
  };
  MeshRanks(spec::DeviceMesh mesh, std::map<std::string, Axis, std::less<>> axes);
  const spec::DeviceMesh& mesh() const { return mesh_; }
  const Axis& axis(std::string_view name) const;
  // Each dimension's extent on this rank, in the layout's order.
  std::vector<int64_t> local_extents(const spec::TensorLayout& l) const;
  // The global index of this rank's first element along each dimension.
  std::vector<int64_t> origin(const spec::TensorLayout& l) const;

 private:
  spec::DeviceMesh mesh_;
  std::map<std::string, Axis, std::less<>> axes_;
};

// One step of the rule applied to `x`: a slice locally, a collective over the step's axis. The
// result has the layout spec::after_step gives.
MeshTensor run_reshard_step(Backend& be, const MeshRanks& ranks, const MeshTensor& x,
                            const spec::ReshardStep& step);

// A per-op walk's reshard step (models/op_graph.hpp) run on `x` of layer `layer`'s micro-batch
// `mb`, its collective traced as the lowering names it (models::reshard_op_name) on the axis's
// stream (d: the replicas', t: tensor parallelism's); a slice is local and untraced.
MeshTensor traced_reshard(Context& ctx, const MeshRanks& ranks, const MeshTensor& x,
                          const models::GraphStep& step, int32_t layer, int64_t mb);

}  // namespace sextant::exec
