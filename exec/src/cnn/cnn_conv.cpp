// A CNN stage's convolutions: convolution + batch norm + ReLU, with the channel split's
// collectives around the product (stationary-x reduce-scatters partial sums by filter, -y gathers
// every input channel first, -w does both within its groups; Dryden et al., SC'19) and batch-norm
// statistics summed over the spatial split; the per-pixel classifier a last convolution feeds;
// and ResNet v1.5's bottleneck blocks (torchvision: the stride on conv2, a downsampling
// shortcut's 1x1 convolution).
#include "cnn_layers.hpp"
#include "sextant/exec/conv_kernels.hpp"
#include "sextant/spec/channel_split.hpp"

namespace sextant::exec::cnn {

using models::OpId;
using models::OpName;
using spec::ChannelAlgorithm;
using spec::Phase;

Tensor CnnLayers::forward_conv(const ConvUnit& c, const Tensor& x, bool split, int32_t layer,
                               int64_t mb, ConvCache& cache) {
  Backend& be = maps_.backend();
  Tensor input = x;
  const bool w = maps_.stationary(c, ChannelAlgorithm::kStationaryW);
  if (maps_.stationary(c, ChannelAlgorithm::kStationaryY) || w) {
    input = maps_.empty(maps_.gathered_input(c), split);
    maps_.all_gather_channels(OpName(c.name, OpId::kUnitChannelAllGather), x, input,
                              maps_.gather_group(c), layer, Phase::kFwd, mb);
  }
  cache.window =
      maps_.window_input(c.name, maps_.window(c), input, 0.0f, split, layer, Phase::kFwd, mb);
  cache.z = maps_.empty(c.out, split);
  const Tensor& weight = params_.get(c.name + ".weight").compute;
  if (maps_.stationary(c, ChannelAlgorithm::kStationaryX) || w) {
    // Partial sums of every filter (x) or of the filter group's (w) over the channels in hand,
    // reduce-scattered by filter over tp (x) or the reduce group (w).
    Tensor partial = maps_.empty(maps_.partial_output(c), split);
    {
      auto s = maps_.op(OpName(c.name, OpId::kUnitProduct), layer, Phase::kFwd, mb);
      be.convolution(cache.window, weight, nullptr, c.s, partial);
    }
    maps_.reduce_scatter_channels(OpName(c.name, OpId::kUnitFilterReduceScatter), partial, cache.z,
                                  maps_.reduce_group(c), layer, Phase::kFwd, mb);
    if (c.bias) be.add_channel_bias(cache.z, params_.get(c.name + ".bias").compute);
  } else {
    auto s = maps_.op(OpName(c.name, OpId::kUnitProduct), layer, Phase::kFwd, mb);
    be.convolution(cache.window, weight, c.bias ? &params_.get(c.name + ".bias").compute : nullptr,
                   c.s, cache.z);
  }
  cache.y = cache.z;
  if (c.bn) {
    const Tensor& gamma = params_.get(c.name + ".bn.weight").compute;
    const Tensor& beta = params_.get(c.name + ".bn.bias").compute;
    cache.y = maps_.empty(c.out, split);
    if (split && maps_.exchange().split()) {
      // The statistics pass is left untimed here: the all-reduce sits between it and its use.
      std::vector<double> sums;
      be.channel_sums(cache.z, sums);
      maps_.all_reduce_sums(OpName(c.name, OpId::kUnitBatchNormAllReduce), sums, layer, Phase::kFwd,
                            mb);
      auto s = maps_.op(OpName(c.name, OpId::kUnitBatchNorm), layer, Phase::kFwd, mb);
      conv::batch_statistics(sums, maps_.statistics_count(c.out), cache.mean, cache.rstd);
      be.batch_norm(cache.z, gamma, beta, cache.mean, cache.rstd, cache.y);
    } else {
      auto s = maps_.op(OpName(c.name, OpId::kUnitBatchNorm), layer, Phase::kFwd, mb);
      cache.stats = maps_.empty({4 * cache.z.dim(1)});
      be.batch_norm_whole(cache.z, gamma, beta, cache.y, cache.stats);
    }
  }
  if (!c.relu) return cache.y;
  Tensor a = maps_.empty(c.out, split);
  auto s = maps_.op(OpName(c.name, OpId::kUnitRelu), layer, Phase::kFwd, mb);
  be.relu(cache.y, a);
  return a;
}

Tensor CnnLayers::backward_conv(const ConvUnit& c, const Tensor& dout, bool split,
                                bool input_gradient, const Unit& u, int64_t mb, ConvCache& cache) {
  Backend& be = maps_.backend();
  const int32_t layer = u.layer;
  Tensor d = dout;
  if (c.relu) {
    Tensor dr = maps_.empty(c.out, split);
    auto s = maps_.op(OpName(c.name, OpId::kUnitRelu), layer, Phase::kBwd, mb);
    be.relu_backward(cache.y, d, dr);
    d = dr;
  }
  if (c.bn) {
    // gamma and beta take this rank's share of their gradient (the replicas' all-reduce sums
    // the shares); the input gradient needs the whole maps' sums.
    const Tensor& gamma = params_.get(c.name + ".bn.weight").compute;
    Tensor dgamma = params_.grad_of(params_.get(c.name + ".bn.weight"), u);
    Tensor dbeta = params_.grad_of(params_.get(c.name + ".bn.bias"), u);
    Tensor dz = maps_.empty(c.out, split);
    if (split && maps_.exchange().split()) {
      std::vector<double> sums;
      be.batch_norm_backward_sums(cache.z, d, cache.mean, cache.rstd, sums);
      const auto channels = static_cast<std::ptrdiff_t>(sums.size() / 2);
      maps_.add_from_host({sums.begin(), sums.begin() + channels}, dbeta);
      maps_.add_from_host({sums.begin() + channels, sums.end()}, dgamma);
      maps_.all_reduce_sums(OpName(c.name, OpId::kUnitBatchNormAllReduce), sums, layer, Phase::kBwd,
                            mb);
      auto s = maps_.op(OpName(c.name, OpId::kUnitBatchNorm), layer, Phase::kBwd, mb);
      be.batch_norm_backward(cache.z, d, gamma, cache.mean, cache.rstd, sums,
                             maps_.statistics_count(c.out), dz);
    } else {
      auto s = maps_.op(OpName(c.name, OpId::kUnitBatchNorm), layer, Phase::kBwd, mb);
      be.batch_norm_whole_backward(cache.z, d, gamma, cache.stats, dz, dgamma, dbeta);
      cache.stats = Tensor();
    }
    d = dz;
  }
  // The image is whole on every rank: a convolution reading it needs no input gradient
  // (spec::channel_split_problem keeps it first).
  SEXTANT_CHECK(!input_gradient || !maps_.stationary(c, ChannelAlgorithm::kWholeInput),
                "{}: an input gradient of a whole map under a channel split", c.name);
  Tensor db = c.bias ? params_.grad_of(params_.get(c.name + ".bias"), u) : Tensor();
  const bool w = maps_.stationary(c, ChannelAlgorithm::kStationaryW);
  const bool reduced = maps_.stationary(c, ChannelAlgorithm::kStationaryX) || w;
  if (reduced) {
    // The gradient of every filter (x) or of the filter group's (w), for this rank's slice of
    // them.
    Tensor whole = maps_.empty(maps_.partial_output(c), split);
    maps_.all_gather_channels(OpName(c.name, OpId::kUnitFilterAllGather), d, whole,
                              maps_.reduce_group(c), layer, Phase::kBwd, mb);
    if (c.bias) be.channel_bias_backward(d, db);
    d = whole;
  }
  const bool bias_in_conv = c.bias && !reduced;
  Tensor dwindow;
  if (input_gradient) dwindow = maps_.empty(cache.window.shape());
  {
    auto s = maps_.op(OpName(c.name, OpId::kUnitProduct), layer, Phase::kBwd, mb);
    Param& weight = params_.get(c.name + ".weight");
    Tensor dw = params_.grad_of(weight, u);
    be.convolution_backward(cache.window, weight.compute, d, c.s,
                            input_gradient ? &dwindow : nullptr, dw, bias_in_conv ? &db : nullptr);
  }
  cache.window = Tensor();
  if (!input_gradient) return Tensor();
  if (!maps_.stationary(c, ChannelAlgorithm::kStationaryY) && !w)
    return maps_.window_gradient(c.name, maps_.window(c), dwindow, c.in, split, layer, mb);
  // This rank's filters' share of the gradient of every input channel (y) or of its channel
  // group's (w), reduce-scattered by channel over tp (y) or the gather group (w).
  Tensor whole = maps_.window_gradient(c.name, maps_.window(c), dwindow, maps_.gathered_input(c),
                                       split, layer, mb);
  Tensor dx = maps_.empty(c.in, split);
  maps_.reduce_scatter_channels(OpName(c.name, OpId::kUnitChannelReduceScatter), whole, dx,
                                maps_.gather_group(c), layer, Phase::kBwd, mb);
  return dx;
}

Tensor CnnLayers::forward_conv_unit(const Unit& u, const Tensor& x, const MicroBatch& mb,
                                    UnitCache& cache) {
  cache.convs.resize(1);
  Tensor y = forward_conv(u.convs[0], x, u.split_in, u.layer, mb.index, cache.convs[0]);
  if (!u.last) return y;
  // A per-pixel classifier (segmentation): every pixel's softmax against its label.
  auto s = maps_.op(OpId::kLoss, u.layer, Phase::kFwd, mb.index);
  loss_ += maps_.backend().pixel_cross_entropy(y, maps_.block_labels(mb, u), 1.0f, nullptr,
                                               u.out.voxels());
  cache.pre = y;  // the logits
  return Tensor();
}

Tensor CnnLayers::backward_conv_unit(const Unit& u, const Tensor& dout, const MicroBatch& mb,
                                     UnitCache& cache) {
  const bool input_gradient = u.layer > 0;  // the image needs none
  if (!u.last)
    return backward_conv(u.convs[0], dout, u.split_in, input_gradient, u, mb.index, cache.convs[0]);
  Tensor d = maps_.empty(u.out, u.split_in);
  {
    auto s = maps_.op(OpId::kLoss, u.layer, Phase::kBwd, mb.index);
    maps_.backend().pixel_cross_entropy(cache.pre, maps_.block_labels(mb, u),
                                        1.0f / static_cast<float>(maps_.ctx().plan->global_batch),
                                        &d, u.out.voxels());
  }
  return backward_conv(u.convs[0], d, u.split_in, input_gradient, u, mb.index, cache.convs[0]);
}

Tensor CnnLayers::forward_bottleneck(const Unit& u, const Tensor& x, int64_t mb, UnitCache& cache) {
  const bool split = u.split_in;
  cache.convs.resize(u.convs.size());
  Tensor a = x;
  for (size_t i = 0; i < 3; ++i)
    a = forward_conv(u.convs[i], a, split, u.layer, mb, cache.convs[i]);
  const Tensor shortcut =
      u.downsample ? forward_conv(u.convs[3], x, split, u.layer, mb, cache.convs[3]) : x;
  cache.pre = maps_.empty(u.out, split);
  Tensor y = maps_.empty(u.out, split);
  auto s = maps_.op(OpName(u.name, OpId::kUnitResidual), u.layer, Phase::kFwd, mb);
  maps_.backend().add(a, shortcut, cache.pre);
  maps_.backend().relu(cache.pre, y);
  return y;
}

Tensor CnnLayers::backward_bottleneck(const Unit& u, const Tensor& dout, int64_t mb,
                                      UnitCache& cache) {
  const bool split = u.split_in;
  const bool input_gradient = u.layer > 0;
  Tensor dsum = maps_.empty(u.out, split);
  {
    auto s = maps_.op(OpName(u.name, OpId::kUnitResidual), u.layer, Phase::kBwd, mb);
    maps_.backend().relu_backward(cache.pre, dout, dsum);
  }
  // conv1 and the shortcut read the block's input (no gradient for the image).
  Tensor d = dsum;
  for (size_t i = 3; i-- > 0;)
    d = backward_conv(u.convs[i], d, split, i > 0 || input_gradient, u, mb, cache.convs[i]);
  const Tensor dshort =
      u.downsample ? backward_conv(u.convs[3], dsum, split, input_gradient, u, mb, cache.convs[3])
                   : dsum;
  if (!input_gradient) return Tensor();
  maps_.backend().add(d, dshort, d);
  return d;
}

}  // namespace sextant::exec::cnn
