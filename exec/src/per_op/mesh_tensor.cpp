// Resharding steps on this rank's block of a tensor (mesh_tensor.hpp).
#include "mesh_tensor.hpp"

#include <numeric>

#include "comm/activation_comm.hpp"
#include "sextant/models/per_op_block.hpp"
#include "sextant/spec/error.hpp"

namespace sextant::exec {

namespace {

using spec::ReshardKind;

int64_t product(const std::vector<int64_t>& v, size_t begin, size_t end) {
  return std::accumulate(v.begin() + static_cast<std::ptrdiff_t>(begin),
                         v.begin() + static_cast<std::ptrdiff_t>(end), int64_t{1},
                         std::multiplies<>());
}

size_t dim_index(const spec::TensorLayout& l, std::string_view name) {
  for (size_t i = 0; i < l.dims.size(); ++i)
    if (l.dims[i].name == name) return i;
  SEXTANT_CHECK(false, "no dimension {}", name);
  return 0;
}

// A tensor of extents `e` seen along dimension k as [outer, e[k], inner] maps of one plane each:
// the box of rows [begin, end) of that dimension.
Box along(const std::vector<int64_t>& e, size_t k, int64_t begin, int64_t end) {
  return {0, product(e, 0, k), begin, end, 0, product(e, k + 1, e.size())};
}

Tensor fresh(Backend& be, const std::vector<int64_t>& extents) {
  return be.empty({product(extents, 0, extents.size())});
}

// Block j of a buffer of n equal blocks.
Tensor block(const Tensor& packed, int64_t n, int64_t j) {
  return packed.view({n, packed.numel() / n}).rows(j, 1);
}

}  // namespace

MeshRanks::MeshRanks(spec::DeviceMesh mesh, std::map<std::string, Axis, std::less<>> axes)
    : mesh_(std::move(mesh)), axes_(std::move(axes)) {
  for (const spec::MeshAxis& a : mesh_.axes)
    SEXTANT_CHECK(axes_.contains(a.name) && (a.size == 1 || axes_.at(a.name).comm != nullptr),
                  "mesh axis {} has no communicator", a.name);
}

const MeshRanks::Axis& MeshRanks::axis(std::string_view name) const {
  const auto it = axes_.find(name);
  SEXTANT_CHECK(it != axes_.end(), "no mesh axis {}", name);
  return it->second;
}

std::vector<int64_t> MeshRanks::local_extents(const spec::TensorLayout& l) const {
  std::vector<int64_t> out;
  for (const spec::TensorDim& d : l.dims) out.push_back(spec::local_extent(mesh_, d));
  return out;
}

std::vector<int64_t> MeshRanks::origin(const spec::TensorLayout& l) const {
  std::vector<int64_t> out;
  const std::vector<int64_t> local = local_extents(l);
  for (size_t i = 0; i < l.dims.size(); ++i) {
    int64_t index = 0;  // the rank's block along the dimension, major axis first
    for (const std::string& a : l.dims[i].axes) index = index * mesh_.size(a) + axis(a).coord;
    out.push_back(index * local[i]);
  }
  return out;
}

MeshTensor run_reshard_step(Backend& be, const MeshRanks& ranks, const MeshTensor& x,
                            const spec::ReshardStep& step) {
  const int64_t n = ranks.mesh().size(step.axis);
  const MeshRanks::Axis& axis = ranks.axis(step.axis);
  MeshTensor out{Tensor(), spec::after_step(ranks.mesh(), x.layout, step)};
  const std::vector<int64_t> from = ranks.local_extents(x.layout);
  const std::vector<int64_t> to = ranks.local_extents(out.layout);
  out.data = fresh(be, to);
  switch (step.kind) {
    case ReshardKind::kSlice: {
      const size_t k = dim_index(x.layout, step.dim);
      const int64_t e = to[k], c = axis.coord;
      be.copy_box(x.data, along(from, k, 0, from[k]), out.data, along(from, k, c * e, c * e + e),
                  along(from, k, c * e, c * e + e), 1, false);
      break;
    }
    case ReshardKind::kAllReduce:
      be.copy(x.data, out.data);
      all_reduce(*axis.comm, out.data);
      break;
    case ReshardKind::kReduceScatter: {
      // The blocks each rank keeps, packed in rank order, then summed and scattered.
      const size_t k = dim_index(x.layout, step.dim);
      const int64_t e = to[k];
      Tensor packed = fresh(be, from);
      for (int64_t j = 0; j < n; ++j) {
        Tensor b = block(packed, n, j);
        be.copy_box(x.data, along(from, k, 0, from[k]), b, along(from, k, j * e, j * e + e),
                    along(from, k, j * e, j * e + e), 1, false);
      }
      reduce_scatter(*axis.comm, packed, out.data);
      break;
    }
    case ReshardKind::kAllGather: {
      // Rank j's block lands at rows [j e, (j + 1) e) of the dimension.
      const size_t k = dim_index(x.layout, step.dim);
      const int64_t e = from[k];
      Tensor gathered = fresh(be, to);
      all_gather(*axis.comm, x.data, gathered);
      for (int64_t j = 0; j < n; ++j)
        be.copy_box(block(gathered, n, j), along(from, k, j * e, j * e + e), out.data,
                    along(to, k, 0, to[k]), along(from, k, j * e, j * e + e), 1, false);
      break;
    }
    case ReshardKind::kAllToAll: {
      // Block j of the new dimension goes to rank j; rank j's block of the old dimension comes
      // back and lands at rows [j e, (j + 1) e) of it.
      const size_t k = dim_index(x.layout, step.dim), m = dim_index(x.layout, step.to_dim);
      const int64_t em = to[m], ek = from[k];
      std::vector<int64_t> piece = from;  // what one rank sends another
      piece[m] = em;
      Tensor packed = fresh(be, from), received = fresh(be, from);
      for (int64_t j = 0; j < n; ++j) {
        Tensor b = block(packed, n, j);
        be.copy_box(x.data, along(from, m, 0, from[m]), b, along(from, m, j * em, j * em + em),
                    along(from, m, j * em, j * em + em), 1, false);
      }
      all_to_all(*axis.comm, packed, received);
      for (int64_t j = 0; j < n; ++j)
        be.copy_box(block(received, n, j), along(piece, k, j * ek, j * ek + ek), out.data,
                    along(to, k, 0, to[k]), along(piece, k, j * ek, j * ek + ek), 1, false);
      break;
    }
  }
  return out;
}

namespace {

spec::OpClass collective_class(spec::ReshardKind kind) {
  switch (kind) {
    case spec::ReshardKind::kReduceScatter:
      return spec::OpClass::kReduceScatter;
    case spec::ReshardKind::kAllReduce:
      return spec::OpClass::kAllReduce;
    case spec::ReshardKind::kAllToAll:
      return spec::OpClass::kAllToAll;
    case spec::ReshardKind::kAllGather:
    case spec::ReshardKind::kSlice:
      break;
  }
  return spec::OpClass::kAllGather;
}

}  // namespace

MeshTensor traced_reshard(Context& ctx, const MeshRanks& ranks, const MeshTensor& x,
                          const models::GraphStep& step, int32_t layer, int64_t mb) {
  if (step.reshard.kind == spec::ReshardKind::kSlice)
    return run_reshard_step(*ctx.backend, ranks, x, step.reshard);
  const bool data = step.reshard.axis == spec::kDataAxis;
  auto scope = ctx.recorder->scope(
      ctx.comm(models::reshard_op_name(step), collective_class(step.reshard.kind),
               data ? spec::Stream::kDpComm : spec::Stream::kTpComm, step.reshard.bytes,
               ranks.mesh().size(step.reshard.axis), step.phase, layer, mb));
  return run_reshard_step(*ctx.backend, ranks, x, step.reshard);
}

}  // namespace sextant::exec
