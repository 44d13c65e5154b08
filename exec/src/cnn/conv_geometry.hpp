// The shapes of the CNN kernels' tensors, checked once for both backends: the host kernels
// (conv_kernels.cpp) and the CUDA ones (cuda/convolution.cu) read their loops' bounds from these.
// Plain C++17 with no spec types, so that nvcc compiles it (the .cu files build as C++17).
#pragma once

#include <cstdint>
#include <string>

#include "sextant/exec/tensor.hpp"

namespace sextant::spec {
struct MapBlock;
struct MapExtent;
}  // namespace sextant::spec

namespace sextant::exec::conv {

// A map is [B, C, H, W] (2D) or [B, C, D, H, W] (a volume); a 2D map is a volume of depth 1.
struct MapDims {
  int64_t b, c, d, h, w;
  bool volume;
  int64_t voxels() const { return d * h * w; }  // elements per sample and channel
};
// The dimensions of a feature map tensor; a logic error on any other rank.
MapDims map_dims(const Tensor& t);
std::string describe(const MapDims& d);

// The window geometry of a convolution or pooling, checked against the tensors' shapes: kh x kw
// with strides sh and sw (AmoebaNet's 1x7 and 7x1 windows), or cubic k x k x k over a volume with
// stride s on every axis; a 2D map's depth axis takes a window of 1.
struct WindowDims {
  MapDims in, out;
  int64_t kd, kh, kw, sd, sh, sw;
  int64_t taps() const { return kd * kh * kw; }  // input elements one output reads per channel
  bool square() const { return kh == kw && sh == sw; }
};
// A square window of k and stride s (cubic on a volume).
WindowDims window_dims(const Tensor& x, const Tensor& y, int64_t k, int64_t s,
                       int64_t out_channels);
// A kh x kw window of strides sh and sw over a 2D map.
WindowDims window_dims(const Tensor& x, const Tensor& y, int64_t kh, int64_t kw, int64_t sh,
                       int64_t sw, int64_t out_channels);
// A weight [O, I, kh, kw] (or [O, I, k, k, k] for a volume's window); a logic error otherwise.
void check_weight(const Tensor& w, const WindowDims& g, int64_t outer, int64_t inner);

// U-Net's cropped concat: the kept map's dims, the joined input's and the output's, checked; and
// the offset of the kept map's centre crop on each axis.
struct ConcatDims {
  MapDims kept, x, out;
  int64_t at_d, at_h, at_w;
};
ConcatDims concat_dims(const Tensor& kept, const Tensor& x, const Tensor& y);

// Adaptive average pooling of a block of a map: the block's first plane, row and column in the
// map, and the map's extent (depth 1 for a 2D map), checked against the tensors.
struct AdaptiveDims {
  MapDims in, out;
  int64_t plane0, row0, col0;  // the block's origin in the map
  int64_t map_d, map_h, map_w;
};
AdaptiveDims adaptive_dims(const Tensor& x, const Tensor& y, const spec::MapBlock& block,
                           const spec::MapExtent& map);

}  // namespace sextant::exec::conv
