// Small models built in code for simulator tests.
#pragma once

#include <vector>

#include "sextant/spec/model_spec.hpp"

namespace sextant::test {

// An MLP of `layers` identical square linear layers of `width`: every pipeline stage with the
// same number of layers costs the same.
inline spec::ModelSpec uniform_mlp(int64_t layers, int64_t width) {
  spec::ModelSpec m;
  m.name = "uniform-mlp";
  spec::MlpSpec mlp;
  mlp.widths.assign(static_cast<size_t>(layers + 1), width);
  mlp.activation = spec::Activation::kRelu;
  mlp.bias = false;
  m.body = mlp;
  return m;
}

// A small CNN: a 3x3 convolution (padding 1) of `channels` with batch norm and ReLU over a
// 3 x size x size input, the global average pool, and a 10-way classifier.
inline spec::ModelSpec small_cnn(int64_t size = 32, int64_t channels = 64) {
  spec::ModelSpec m;
  m.name = "small-cnn";
  spec::CnnSpec c;
  c.in_channels = 3;
  c.height = c.width = size;
  spec::CnnLayer conv;
  conv.kind = spec::CnnLayerKind::kConv;
  conv.out_channels = channels;
  conv.kernel = 3;
  conv.padding = 1;
  conv.batch_norm = conv.relu = true;
  spec::CnnLayer pool;
  pool.kind = spec::CnnLayerKind::kAdaptiveAvgPool;
  pool.output = 1;
  spec::CnnLayer fc;
  fc.kind = spec::CnnLayerKind::kFc;
  fc.out_features = 10;
  fc.bias = true;
  c.layers = {conv, pool, fc};
  m.body = c;
  return m;
}

// A chain of 3x3 convolutions (padding 1, batch norm, ReLU) of `widths` channels over a
// 3 x size x size input, the global average pool and a 10-way classifier with bias: the channel
// split's test net (each convolution's algorithm follows from its two widths).
inline spec::ModelSpec conv_chain(const std::vector<int64_t>& widths, int64_t size) {
  spec::ModelSpec m;
  m.name = "conv-chain";
  spec::CnnSpec c;
  c.in_channels = 3;
  c.height = c.width = size;
  for (int64_t out : widths) {
    spec::CnnLayer l{spec::CnnLayerKind::kConv, out};
    l.kernel = 3;
    l.padding = 1;
    l.batch_norm = l.relu = true;
    c.layers.push_back(l);
  }
  c.layers.push_back(spec::CnnLayer{spec::CnnLayerKind::kAdaptiveAvgPool});
  spec::CnnLayer fc{spec::CnnLayerKind::kFc};
  fc.out_features = 10;
  fc.bias = true;
  c.layers.push_back(fc);
  m.body = c;
  return m;
}

// A small 2D U-Net: 1 channel of size x size; a 3x3 conv (padding 1) to 4 channels, kept; a 2x2
// max pool; a 3x3 conv to 8; a 2x2 up-convolution back to 4 channels at full size; the concat
// with the kept map (8 channels); a 1x1 head to 2 labels per pixel.
inline spec::ModelSpec small_unet(int64_t size = 16) {
  spec::ModelSpec m;
  m.name = "small-unet";
  spec::CnnSpec c;
  c.in_channels = 1;
  c.height = c.width = size;
  auto conv = [](int64_t out, int64_t k, int64_t pad) {
    spec::CnnLayer l;
    l.kind = spec::CnnLayerKind::kConv;
    l.out_channels = out;
    l.kernel = k;
    l.padding = pad;
    l.relu = true;
    return l;
  };
  spec::CnnLayer kept = conv(4, 3, 1);
  kept.skip = true;
  spec::CnnLayer pool;
  pool.kind = spec::CnnLayerKind::kMaxPool;
  pool.kernel = pool.stride = 2;
  spec::CnnLayer up;
  up.kind = spec::CnnLayerKind::kUpConv;
  up.out_channels = 4;
  up.kernel = up.stride = 2;
  spec::CnnLayer concat;
  concat.kind = spec::CnnLayerKind::kConcat;
  c.layers = {kept, pool, conv(8, 3, 1), up, concat, conv(2, 1, 0)};
  m.body = c;
  return m;
}

// The stack simulator tests state unless they test a stack: Sextant's own (unfused attention,
// one kernel per op, DDP buckets overlapped with backward), with gradients reduced in the compute
// dtype so that the textbook byte counts (ZeRO's 2 + 2 + 12) hold.
inline spec::Stack plain_stack() {
  spec::Stack s = spec::builtin_stack("sextant");
  s.grad_dtype.reset();
  s.host_launch_us = {};  // a host that keeps ahead of the GPU (tests/sim/host_issue_test.cpp)
  return s;
}

inline spec::Plan make_plan(int64_t dp, int64_t tp, int64_t pp, int64_t micro_batch,
                            int64_t global_batch) {
  spec::Plan p;
  p.stack = plain_stack();
  p.dp = dp;
  p.tp = tp;
  p.pp = pp;
  p.micro_batch = micro_batch;
  p.global_batch = global_batch;
  return p;
}

}  // namespace sextant::test
