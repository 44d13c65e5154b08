// A block's layer pairs under Megatron-LM's split or a 3D tensor grid (linear_pairs.hpp).
#include "linear_pairs.hpp"

#include "comm/activation_comm.hpp"

namespace sextant::exec {

using models::OpId;
using spec::OpClass;
using spec::Phase;
using spec::Stream;

LinearPairs::LinearPairs(Context& ctx, GridLinear* grid, int64_t rows, int64_t h)
    : ctx_(ctx),
      grid_(grid),
      t_(ctx.groups->tp_size),
      sp_(ctx.sequence_parallel),
      rows_(rows),
      local_rows_(sp_ ? rows / t_ : rows),
      h_(h) {}

Tensor LinearPairs::act(std::vector<int64_t> shape) {
  return backend().empty(std::move(shape), backend().activation_dtype());
}

Tensor LinearPairs::to_rank_blocks(const Tensor& x) {
  if (!splits_each_sequence()) return x;
  const int64_t b = sequences_, s = rows_ / b, sl = s / t_;
  Tensor out = act({rows_, h_});
  for (int64_t r = 0; r < t_; ++r) {
    Tensor block = out.rows(r * b * sl, b * sl);
    const Box mine{0, b, r * sl, (r + 1) * sl, 0, h_};
    backend().copy_box(x, {0, b, 0, s, 0, h_}, block, mine, mine, 1, false);
  }
  return out;
}

Tensor LinearPairs::from_rank_blocks(const Tensor& x) {
  if (!splits_each_sequence()) return x;
  const int64_t b = sequences_, s = rows_ / b, sl = s / t_;
  Tensor out = act({rows_, h_});
  for (int64_t r = 0; r < t_; ++r) {
    const Box mine{0, b, r * sl, (r + 1) * sl, 0, h_};
    backend().copy_box(x.rows(r * b * sl, b * sl), mine, out, {0, b, 0, s, 0, h_}, mine, 1, false);
  }
  return out;
}

Recorder::Scope LinearPairs::comm_scope(OpId name, OpClass cls, int64_t bytes, Phase phase,
                                        int32_t layer, int64_t mb) {
  return ctx_.recorder->scope(ctx_.comm(name, cls, Stream::kTpComm, bytes, t_, phase, layer, mb));
}

Tensor LinearPairs::gather(const Tensor& x, const models::PartCollectives& part, Phase phase,
                           int32_t layer, int64_t mb) {
  if (!sp_) return x;
  Tensor out = act({rows_, h_});
  auto s =
      comm_scope(part.all_gather, OpClass::kAllGather,
                 activation_wire_bytes(backend().activation_dtype(), rows_ * h_), phase, layer, mb);
  all_gather(*ctx_.groups->tp, x, out);
  return from_rank_blocks(out);
}

Tensor LinearPairs::gather_backward(Tensor& d, const models::PartCollectives& part, int32_t layer,
                                    int64_t mb) {
  if (t_ == 1) return d;
  if (sp_) {
    Tensor out = act({local_rows_, h_});
    const Tensor blocks = to_rank_blocks(d);
    auto s = comm_scope(part.reduce_scatter, OpClass::kReduceScatter,
                        activation_wire_bytes(backend().activation_dtype(), rows_ * h_),
                        Phase::kBwd, layer, mb);
    reduce_scatter(*ctx_.groups->tp, blocks, out);
    return out;
  }
  auto s = comm_scope(part.all_reduce, OpClass::kAllReduce,
                      activation_wire_bytes(backend().activation_dtype(), rows_ * h_), Phase::kBwd,
                      layer, mb);
  all_reduce(*ctx_.groups->tp, d);
  return d;
}

Tensor LinearPairs::reduce_out(Tensor& y, const models::PartCollectives& part, Phase phase,
                               int32_t layer, int64_t mb) {
  if (t_ == 1) return y;
  if (sp_) {
    Tensor out = act({local_rows_, h_});
    const Tensor blocks = to_rank_blocks(y);
    auto s = comm_scope(part.reduce_scatter, OpClass::kReduceScatter,
                        activation_wire_bytes(backend().activation_dtype(), rows_ * h_), phase,
                        layer, mb);
    reduce_scatter(*ctx_.groups->tp, blocks, out);
    return out;
  }
  auto s =
      comm_scope(part.all_reduce, OpClass::kAllReduce,
                 activation_wire_bytes(backend().activation_dtype(), rows_ * h_), phase, layer, mb);
  all_reduce(*ctx_.groups->tp, y);
  return y;
}

Tensor LinearPairs::reduce_out_backward(const Tensor& d, const models::PartCollectives& part,
                                        int32_t layer, int64_t mb) {
  if (!sp_) return d;
  Tensor out = act({rows_, h_});
  auto s = comm_scope(part.all_gather, OpClass::kAllGather,
                      activation_wire_bytes(backend().activation_dtype(), rows_ * h_), Phase::kBwd,
                      layer, mb);
  all_gather(*ctx_.groups->tp, d, out);
  return from_rank_blocks(out);
}

Tensor LinearPairs::pair_input(const Tensor& x, const models::PartCollectives& part, Phase phase,
                               int32_t layer, int64_t mb) {
  return grid_ != nullptr ? grid_->slice(x) : gather(x, part, phase, layer, mb);
}

Tensor LinearPairs::pair_input_backward(Tensor& d, const models::PartCollectives& part,
                                        int32_t layer, int64_t mb) {
  return grid_ != nullptr ? grid_->gather(d, part, Phase::kBwd, layer, mb)
                          : gather_backward(d, part, layer, mb);
}

int64_t LinearPairs::pair_input_width() const {
  return grid_ != nullptr ? h_ / grid_->x() : h_;
}

void LinearPairs::first_linear(OpId name, const Tensor& x, const Param& w, const Param* b,
                               Tensor& y, Phase phase, int32_t layer, int64_t mb) {
  if (grid_ != nullptr)
    return grid_->forward(name, GridLinear::Role::kFirst, x, w, b, y, phase, layer, mb);
  auto s = ctx_.recorder->scope(ctx_.op(name, layer, phase, mb));
  backend().matmul(x, w.compute, b != nullptr ? &b->compute : nullptr, y);
}

void LinearPairs::first_linear_backward(OpId name, const Tensor& x, Param& w, Param* b,
                                        const Tensor& dy, Tensor& dx, int32_t layer, int64_t mb) {
  if (grid_ != nullptr)
    return grid_->backward(name, GridLinear::Role::kFirst, x, w, b, dy, dx, layer, mb);
  auto s = ctx_.recorder->scope(ctx_.op(name, layer, Phase::kBwd, mb));
  backend().matmul_backward(x, w.compute, dy, &dx, w.grad, b != nullptr ? &b->grad : nullptr);
}

Tensor LinearPairs::second_linear(const models::PartCollectives& collectives, OpId name,
                                  const Tensor& x, const Param& w, const Param* b, Phase phase,
                                  int32_t layer, int64_t mb) {
  if (grid_ != nullptr) {
    Tensor part = act({rows_, h_ / grid_->x()});
    grid_->forward(name, GridLinear::Role::kSecond, x, w, b, part, phase, layer, mb);
    return grid_->gather(part, collectives, phase, layer, mb);
  }
  Tensor y = act({rows_, h_});
  {
    auto s = ctx_.recorder->scope(ctx_.op(name, layer, phase, mb));
    backend().matmul(x, w.compute, nullptr, y);
  }
  return reduce_out(y, collectives, phase, layer, mb);
}

Tensor LinearPairs::pair_output_backward(const Tensor& d, const models::PartCollectives& part,
                                         int32_t layer, int64_t mb) {
  return grid_ != nullptr ? grid_->slice(d) : reduce_out_backward(d, part, layer, mb);
}

void LinearPairs::second_linear_backward(OpId name, const Tensor& x, Param& w, Param* b,
                                         const Tensor& dy, Tensor& dx, int32_t layer, int64_t mb) {
  if (grid_ != nullptr)
    return grid_->backward(name, GridLinear::Role::kSecond, x, w, b, dy, dx, layer, mb);
  auto s = ctx_.recorder->scope(ctx_.op(name, layer, Phase::kBwd, mb));
  backend().matmul_backward(x, w.compute, dy, &dx, w.grad, nullptr);
}

}  // namespace sextant::exec
