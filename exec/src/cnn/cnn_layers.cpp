// A CNN stage's units other than convolutions (cnn_conv.cpp): U-Net's up-convolutions and cropped
// concats (fetching the blocks they read from other spatial ranks), max and average pools, the
// adaptive pool whose partial sums end a spatial split, and fc layers (a block of rows behind a
// channel split, partial products all-reduced over tp) with the classifier's softmax loss.
#include "cnn_layers.hpp"

#include <cmath>
#include <limits>
#include <stdexcept>

namespace sextant::exec::cnn {

using models::OpId;
using models::OpName;
using spec::CnnLayerKind;
using spec::OpClass;
using spec::Phase;
using spec::Stream;

Tensor CnnLayers::forward(const Unit& u, const Tensor& x, const MicroBatch& mb,
                          StageCaches& caches) {
  Tensor y = forward_pass(u, x, mb, caches);
  if (u.keep) caches.of(u.layer).kept = y;
  return y;
}

Tensor CnnLayers::backward(const Unit& u, const Tensor& dout, const MicroBatch& mb,
                           StageCaches& caches) {
  if (!u.keep) return backward_pass(u, dout, mb, caches);
  UnitCache& cache = caches.of(u.layer);
  SEXTANT_CHECK(cache.kept_grad.numel() == dout.numel(), "{}: no gradient from its concat", u.name);
  Tensor sum = maps_.sum_of(dout, cache.kept_grad);
  cache.kept = cache.kept_grad = Tensor();
  return backward_pass(u, sum, mb, caches);
}

double CnnLayers::take_loss() {
  const double l = loss_;
  loss_ = 0;
  return l;
}

void CnnLayers::forget(int64_t mb) {
  max_.erase(mb);
  sum_.erase(mb);
  if (split_fc_ != nullptr) split_fc_->forget(mb);
}

Tensor CnnLayers::forward_pass(const Unit& u, const Tensor& x, const MicroBatch& mb,
                               StageCaches& caches) {
  UnitCache& cache = caches.of(u.layer);
  switch (u.kind) {
    case CnnLayerKind::kAmoebaCell:
    case CnnLayerKind::kInception:
      throw std::logic_error("the CNN stage runs its multi-branch units on their tapes");
    case CnnLayerKind::kUpConv:
      return forward_up_conv(u, x, mb.index, cache);
    case CnnLayerKind::kConcat:
      return forward_concat(u, x, mb.index, caches);
    case CnnLayerKind::kConv:
      return forward_conv_unit(u, x, mb, cache);
    case CnnLayerKind::kMaxPool:
    case CnnLayerKind::kAvgPool:
      return forward_pool(u, x, mb.index, cache);
    case CnnLayerKind::kAdaptiveAvgPool:
      return forward_adaptive_pool(u, x, mb.index);
    case CnnLayerKind::kFc:
      return forward_fc(u, x, mb, cache);
    case CnnLayerKind::kBottleneck:
      return forward_bottleneck(u, x, mb.index, cache);
  }
  return Tensor();
}

Tensor CnnLayers::backward_pass(const Unit& u, const Tensor& dout, const MicroBatch& mb,
                                StageCaches& caches) {
  UnitCache& cache = caches.of(u.layer);
  switch (u.kind) {
    case CnnLayerKind::kAmoebaCell:
    case CnnLayerKind::kInception:
      throw std::logic_error("the CNN stage runs its multi-branch units on their tapes");
    case CnnLayerKind::kUpConv:
      return backward_up_conv(u, dout, mb.index, cache);
    case CnnLayerKind::kConcat:
      return backward_concat(u, dout, mb.index, caches);
    case CnnLayerKind::kConv:
      return backward_conv_unit(u, dout, mb, cache);
    case CnnLayerKind::kMaxPool:
    case CnnLayerKind::kAvgPool:
      return backward_pool(u, dout, mb.index, cache);
    case CnnLayerKind::kAdaptiveAvgPool:
      return backward_adaptive_pool(u, dout, mb.index);
    case CnnLayerKind::kFc:
      return backward_fc(u, dout, mb, cache);
    case CnnLayerKind::kBottleneck:
      return backward_bottleneck(u, dout, mb.index, cache);
  }
  return Tensor();
}

Tensor CnnLayers::forward_up_conv(const Unit& u, const Tensor& x, int64_t m, UnitCache& cache) {
  Backend& be = maps_.backend();
  const Tensor& w = params_.get(u.name + ".up_conv.weight").compute;
  Tensor y = maps_.empty(u.out, u.split_in);
  const OpName product(u.name + ".up_conv", OpId::kUnitProduct);
  if (!maps_.in_blocks(u)) {
    cache.x = x;
    auto s = maps_.op(product, u.layer, Phase::kFwd, m);
    be.transposed_convolution(x, w, u.s, y);
  } else {
    // The input rows and columns that spread into this rank's output block, some from other
    // ranks; what they make, cut to the block.
    const auto need = maps_.up_conv_inputs(u);
    cache.x = maps_.fetch_block(u.name + ".up_conv", x, u.in, need, u.layer, m);
    const Region made = maps_.up_conv_output(u, need(maps_.exchange().index()));
    const Region own = maps_.held(u.out, true);
    Tensor all = maps_.empty(maps_.shape_over(u.out.c, made));
    auto s = maps_.op(product, u.layer, Phase::kFwd, m);
    be.transposed_convolution(cache.x, w, u.s, all);
    copy_block(be, all, made, y, own, own);
  }
  if (u.bias) be.add_channel_bias(y, params_.get(u.name + ".up_conv.bias").compute);
  return y;
}

Tensor CnnLayers::backward_up_conv(const Unit& u, const Tensor& dout, int64_t m, UnitCache& cache) {
  Backend& be = maps_.backend();
  const bool input_gradient = u.layer > 0;
  const Tensor& w = params_.get(u.name + ".up_conv.weight").compute;
  Tensor dw = params_.grad_of(params_.get(u.name + ".up_conv.weight"), u);
  if (u.bias) {
    Tensor db = params_.grad_of(params_.get(u.name + ".up_conv.bias"), u);
    be.channel_bias_backward(dout, db);
  }
  const OpName product(u.name + ".up_conv", OpId::kUnitProduct);
  if (!maps_.in_blocks(u)) {
    Tensor dx = maps_.empty(u.in, false);
    auto s = maps_.op(product, u.layer, Phase::kBwd, m);
    be.transposed_convolution_backward(cache.x, w, dout, u.s, input_gradient ? &dx : nullptr, dw);
    return input_gradient ? dx : Tensor();
  }
  // The block's gradient within what the fetched input made (the rest is other ranks'), and the
  // fetched input's gradient back to the ranks holding it.
  const auto need = maps_.up_conv_inputs(u);
  const Region made = maps_.up_conv_output(u, need(maps_.exchange().index()));
  const Region own = maps_.held(u.out, true);
  Tensor dall = maps_.empty(maps_.shape_over(u.out.c, made));
  be.fill(dall, 0.0f);
  copy_block(be, dout, own, dall, made, own);
  Tensor dfetched = maps_.empty(cache.x.shape());
  {
    auto s = maps_.op(product, u.layer, Phase::kBwd, m);
    be.transposed_convolution_backward(cache.x, w, dall, u.s, input_gradient ? &dfetched : nullptr,
                                       dw);
  }
  if (!input_gradient) return Tensor();
  Tensor dx = maps_.empty(u.in, u.split_in);
  maps_.give_back_block(u.name + ".up_conv", dfetched, u.in, need, dx, u.layer, m);
  return dx;
}

Tensor CnnLayers::forward_concat(const Unit& u, const Tensor& x, int64_t m, StageCaches& caches) {
  const Tensor& kept = caches.of(u.joins).kept;
  const MapShape kept_map = units_[static_cast<size_t>(u.joins)].out;
  Tensor y = maps_.empty(u.out, u.split_in);
  // In blocks: the kept map's crop at this rank's block, some from other ranks (a crop of the
  // block's own extent: offset 0).
  const Tensor crop =
      maps_.in_blocks(u)
          ? maps_.fetch_block(u.name, kept, kept_map, maps_.crop_inputs(kept_map, u.in), u.layer, m)
          : kept;
  auto s = maps_.op(OpName(u.name, OpId::kUnitConcat), u.layer, Phase::kFwd, m);
  maps_.backend().crop_concat(crop, x, y);
  return y;
}

Tensor CnnLayers::backward_concat(const Unit& u, const Tensor& dout, int64_t m,
                                  StageCaches& caches) {
  // The kept map's share goes to its unit (added there to its other use's), the rest on.
  UnitCache& kept = caches.of(u.joins);
  const MapShape kept_map = units_[static_cast<size_t>(u.joins)].out;
  Tensor dx = maps_.empty(u.in, u.split_in);
  // In blocks: the crop's gradient is of this rank's block, given back to the ranks holding the
  // kept map's rows and columns.
  Tensor dcrop = maps_.in_blocks(u)
                     ? maps_.empty(maps_.shape_of(CnnMaps::with_channels(u.in, kept_map.c), true))
                     : maps_.empty(kept.kept.shape());
  maps_.backend().fill(dcrop, 0.0f);
  {
    auto s = maps_.op(OpName(u.name, OpId::kUnitConcat), u.layer, Phase::kBwd, m);
    maps_.backend().crop_concat_backward(dout, dcrop, dx);
  }
  if (!maps_.in_blocks(u)) {
    kept.kept_grad = dcrop;
  } else {
    kept.kept_grad = maps_.empty(kept.kept.shape());
    maps_.give_back_block(u.name, dcrop, kept_map, maps_.crop_inputs(kept_map, u.in),
                          kept.kept_grad, u.layer, m);
  }
  return dx;
}

Tensor CnnLayers::forward_pool(const Unit& u, const Tensor& x, int64_t m, UnitCache& cache) {
  const bool max = u.kind == CnnLayerKind::kMaxPool;
  const WindowGeometry g = maps_.window(u.in, u.out, u.k, u.s, u.p);
  cache.window = maps_.window_input(u.name + ".pool", g, x,
                                    max ? -std::numeric_limits<float>::infinity() : 0.0f,
                                    u.split_in, u.layer, Phase::kFwd, m);
  Tensor y = maps_.empty(u.out, u.split_in);
  auto s = maps_.op(OpName(u.name, OpId::kUnitPool), u.layer, Phase::kFwd, m);
  if (max) {
    maps_.backend().max_pool(cache.window, u.k, u.s, y);
    cache.pooled = y;
  } else {
    maps_.backend().avg_pool(cache.window, u.k, u.s, y);
  }
  return y;
}

Tensor CnnLayers::backward_pool(const Unit& u, const Tensor& dout, int64_t m, UnitCache& cache) {
  const WindowGeometry g = maps_.window(u.in, u.out, u.k, u.s, u.p);
  Tensor dwindow = maps_.empty(cache.window.shape());
  {
    auto s = maps_.op(OpName(u.name, OpId::kUnitPool), u.layer, Phase::kBwd, m);
    if (u.kind == CnnLayerKind::kMaxPool) {
      maps_.backend().max_pool_backward(cache.window, cache.pooled, dout, u.k, u.s, dwindow);
      cache.pooled = Tensor();
    } else {
      maps_.backend().avg_pool_backward(dout, u.k, u.s, dwindow);
    }
  }
  if (u.layer == 0) return Tensor();  // the image needs no gradient
  return maps_.window_gradient(u.name + ".pool", g, dwindow, u.in, u.split_in, u.layer, m);
}

Tensor CnnLayers::forward_adaptive_pool(const Unit& u, const Tensor& x, int64_t m) {
  const Region own = maps_.held(u.in, u.split_in);
  Tensor y = maps_.empty(u.out, false);
  {
    auto s = maps_.op(OpName(u.name, OpId::kUnitPool), u.layer, Phase::kFwd, m);
    maps_.backend().adaptive_avg_pool(x, own, maps_.extent(u.in), y);
  }
  if (u.split_in && maps_.exchange().split())
    maps_.all_reduce_pooled(OpName(u.name, OpId::kUnitPoolAllReduce), y, u.layer, m);
  return y;
}

Tensor CnnLayers::backward_adaptive_pool(const Unit& u, const Tensor& dout, int64_t m) {
  const Region own = maps_.held(u.in, u.split_in);
  Tensor dx = maps_.empty(u.in, u.split_in);
  auto s = maps_.op(OpName(u.name, OpId::kUnitPool), u.layer, Phase::kBwd, m);
  maps_.backend().adaptive_avg_pool_backward(dout.view(maps_.shape_of(u.out, false)), own,
                                             maps_.extent(u.in), dx);
  return dx;
}

Tensor CnnLayers::forward_fc(const Unit& u, const Tensor& x, const MicroBatch& mb,
                             UnitCache& cache) {
  if (split_fc_ != nullptr) {
    Tensor y = split_fc_->forward(u.layer, x, mb.index);
    if (u.last) add_loss(u, y, mb, cache);
    return y;
  }
  Backend& be = maps_.backend();
  Context& ctx = maps_.ctx();
  const int64_t m = mb.index, batch = maps_.micro_batch();
  Tensor flat = x.view({batch, maps_.fc_rows(u)});
  cache.x = flat;
  Tensor y = maps_.empty({batch, u.out.c});
  // Behind a channel split: this rank's rows' partial product, all-reduced; the bias is added
  // once, by tp rank 0.
  const bool partial = u.fc_reads_split;
  const bool add_bias = u.bias && (!partial || ctx.groups->tp_rank == 0);
  {
    auto s = maps_.op(OpName(u.name, OpId::kUnitFc), u.layer, Phase::kFwd, m);
    be.matmul(flat, params_.get(u.name + ".fc.weight").compute,
              add_bias ? &params_.get(u.name + ".fc.bias").compute : nullptr, y);
  }
  if (partial) {
    auto s = ctx.recorder->scope(ctx.comm(OpName(u.name, OpId::kUnitFcAllReduce),
                                          OpClass::kAllReduce, Stream::kTpComm, y.numel() * 4,
                                          ctx.groups->tp_size, Phase::kFwd, u.layer, m));
    ctx.groups->tp->all_reduce(y.data(), y.numel());
  }
  cache.pre = y;
  if (u.relu) {
    Tensor a = maps_.empty({batch, u.out.c});
    auto s = maps_.op(OpName(u.name, OpId::kUnitRelu), u.layer, Phase::kFwd, m);
    be.relu(y, a);
    y = a;
  }
  if (u.last) add_loss(u, y, mb, cache);
  return y.view(maps_.shape_of(u.out, false));
}

void CnnLayers::add_loss(const Unit& u, const Tensor& logits, const MicroBatch& mb,
                         UnitCache& cache) {
  const int64_t m = mb.index;
  auto s = maps_.op(OpId::kLoss, u.layer, Phase::kFwd, m);
  std::vector<float> target;
  maps_.backend().softmax_stats(logits, mb.targets, 0, u.out.c, max_[m], sum_[m], target);
  for (int64_t i = 0; i < maps_.micro_batch(); ++i) {
    const size_t k = static_cast<size_t>(i);
    loss_ += std::log(static_cast<double>(sum_[m][k])) + max_[m][k] - target[k];
  }
  cache.window = logits;
}

Tensor CnnLayers::loss_gradient(const Unit& u, const MicroBatch& mb, UnitCache& cache) {
  const int64_t m = mb.index;
  Tensor d = maps_.empty({maps_.micro_batch(), u.out.c});
  auto s = maps_.op(OpId::kLoss, u.layer, Phase::kBwd, m);
  maps_.backend().cross_entropy_backward(cache.window, mb.targets, 0, u.out.c, max_[m], sum_[m],
                                         1.0f / static_cast<float>(maps_.ctx().plan->global_batch),
                                         d);
  return d;
}

Tensor CnnLayers::backward_fc(const Unit& u, const Tensor& dout, const MicroBatch& mb,
                              UnitCache& cache) {
  Backend& be = maps_.backend();
  const int64_t m = mb.index, batch = maps_.micro_batch();
  const bool input_gradient = u.layer > 0;
  const Unit& before = input_gradient ? units_[static_cast<size_t>(u.layer - 1)] : u;
  // The input's shape: the previous unit's output (a block of its channels behind a split).
  const std::vector<int64_t> input_shape =
      maps_.shape_of(input_gradient ? before.out : u.in, input_gradient && before.split_out);
  if (split_fc_ != nullptr) {
    Tensor dx = split_fc_->backward(u.layer, u.last ? loss_gradient(u, mb, cache) : dout, m);
    return before.kind == CnnLayerKind::kFc ? dx : dx.view(input_shape);
  }
  Tensor d = u.last ? loss_gradient(u, mb, cache) : dout.view({batch, u.out.c});
  if (u.relu) {
    Tensor dr = maps_.empty({batch, u.out.c});
    auto s = maps_.op(OpName(u.name, OpId::kUnitRelu), u.layer, Phase::kBwd, m);
    be.relu_backward(cache.pre, d, dr);
    d = dr;
  }
  Tensor dx = maps_.empty({batch, maps_.fc_rows(u)});
  auto s = maps_.op(OpName(u.name, OpId::kUnitFc), u.layer, Phase::kBwd, m);
  Param& weight = params_.get(u.name + ".fc.weight");
  Tensor dw = params_.grad_of(weight, u);
  Tensor db = u.bias ? params_.grad_of(params_.get(u.name + ".fc.bias"), u) : Tensor();
  be.matmul_backward(cache.x, weight.compute, d, input_gradient ? &dx : nullptr, dw,
                     u.bias ? &db : nullptr);
  return dx.view(input_shape);
}

}  // namespace sextant::exec::cnn
