// A GPT block's linear layers on a 3D tensor grid.
#include "grid_linear.hpp"

#include <algorithm>

#include "comm/activation_comm.hpp"

namespace sextant::exec {

using spec::OpClass;
using spec::Phase;
using spec::Stream;

GridLinear::GridLinear(Context& ctx) : ctx_(ctx) {}

Recorder::Scope GridLinear::comm(models::OpId name, OpClass cls, int64_t bytes, int64_t group_size,
                                 Phase phase, int32_t layer, int64_t mb, Stream stream) {
  return ctx_.recorder->scope(ctx_.comm(name, cls, stream, bytes, group_size, phase, layer, mb));
}

Tensor GridLinear::slice(const Tensor& whole) const {
  const int64_t rows = whole.dim(0), h = whole.dim(1), part = h / x();
  Tensor out = ctx_.backend->empty({rows, part});
  const float* from = whole.data() + x_rank() * part;
  float* to = out.data();
  for (int64_t r = 0; r < rows; ++r) std::copy_n(from + r * h, part, to + r * part);
  return out;
}

Tensor GridLinear::gather(const Tensor& part, const models::PartCollectives& collectives,
                          Phase phase, int32_t layer, int64_t mb) {
  if (x() == 1) return part;
  const int64_t rows = part.dim(0), width = part.dim(1), h = width * x();
  // The all-gather stacks the parts [x][rows][h / x]; the whole activation interleaves them.
  Tensor stacked = ctx_.backend->empty({x() * rows, width});
  {
    auto s = comm(collectives.all_gather, OpClass::kAllGather,
                  activation_wire_bytes(ctx_.backend->activation_dtype(), rows * h), x(), phase,
                  layer, mb);
    all_gather(*axis(0).comm, part, stacked);
  }
  Tensor whole = ctx_.backend->empty({rows, h});
  for (int64_t i = 0; i < x(); ++i)
    for (int64_t r = 0; r < rows; ++r)
      std::copy_n(stacked.data() + (i * rows + r) * width, width, whole.data() + r * h + i * width);
  return whole;
}

Tensor GridLinear::block(const models::GridLinearOps& ops, const Param& w, int64_t k_local,
                         Phase phase, int32_t layer, int64_t mb) {
  const int64_t elements = w.compute.numel() * z();
  if (z() == 1) return w.compute.view({k_local, elements / k_local});
  Tensor whole = ctx_.backend->empty({elements}, w.compute.dtype());
  {
    auto s =
        comm(ops.weight_gather, OpClass::kAllGather, elements * element_size(w.compute.dtype()),
             z(), phase, layer, mb, Stream::kDepthComm);
    all_gather(*axis(2).comm, w.compute.view({w.compute.numel()}), whole);
  }
  return whole.view({k_local, elements / k_local});
}

void GridLinear::forward(models::OpId name, Role role, const Tensor& x, const Param& w,
                         const Param* bias, Tensor& y, Phase phase, int32_t layer, int64_t mb) {
  const models::GridLinearOps& ops = models::grid_linear_ops(name);
  const Tensor weight = block(ops, w, x.dim(1), phase, layer, mb);
  const GridAxis& sum = inner(role);
  {
    auto s = ctx_.recorder->scope(ctx_.op(name, layer, phase, mb));
    // The bias once in the sum over the inner axis.
    const bool add_bias = bias != nullptr && sum.rank == 0;
    ctx_.backend->matmul(x, weight, add_bias ? &bias->compute : nullptr, y);
  }
  if (sum.size > 1) {
    auto s = comm(ops.all_reduce, OpClass::kAllReduce, activation_wire_bytes(y.dtype(), y.numel()),
                  sum.size, phase, layer, mb);
    all_reduce(*sum.comm, y);
  }
}

void GridLinear::backward(models::OpId name, Role role, const Tensor& x, Param& w, Param* bias,
                          const Tensor& dy, Tensor& dx, int32_t layer, int64_t mb) {
  const Phase B = Phase::kBwd;
  Backend& be = *ctx_.backend;
  const models::GridLinearOps& ops = models::grid_linear_ops(name);
  const Tensor weight = block(ops, w, x.dim(1), B, layer, mb);
  // Without a z axis the block is the rank's own: its gradient accumulates in place.
  Tensor dw = z() == 1 ? w.grad.view(weight.shape()) : be.zeros(weight.shape());
  {
    auto s = ctx_.recorder->scope(ctx_.op(name, layer, B, mb));
    be.matmul_backward(x, weight, dy, &dx, dw, bias != nullptr ? &bias->grad : nullptr);
  }
  const GridAxis& sum = outer(role);
  if (sum.size > 1) {
    auto s = comm(ops.all_reduce, OpClass::kAllReduce,
                  activation_wire_bytes(dx.dtype(), dx.numel()), sum.size, B, layer, mb);
    all_reduce(*sum.comm, dx);
  }
  if (z() == 1) return;
  Tensor mine = be.empty({w.grad.numel()});
  {
    auto s = comm(ops.grad_scatter, OpClass::kReduceScatter, dw.numel() * 4, z(), B, layer, mb,
                  Stream::kDepthComm);
    axis(2).comm->reduce_scatter(dw.data(), mine.data(), mine.numel());
  }
  Tensor grad = w.grad.view({w.grad.numel()});
  be.add(grad, mine, grad);
}

}  // namespace sextant::exec
