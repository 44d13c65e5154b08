// The units of a CNN stage: each lowered layer's map shapes, convolutions and kernel geometry, as
// models::lower_cnn walks the model, for the executor's CnnStage.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sextant/spec/channel_split.hpp"
#include "sextant/spec/model_spec.hpp"

namespace sextant::exec::cnn {

// A map's channels and extent; a 2D map has a depth of 1 (a volume's maps are [B, C, D, H, W]).
struct MapShape {
  int64_t c = 0, d = 1, h = 1, w = 1;
  bool whole = true;  // every channel on every tp rank (else each holds a block of them)
  int64_t voxels() const { return d * h * w; }
};

// One convolution (+ batch norm + ReLU) as the lowering names it: "layerN.conv", "layerN.conv1"...
struct ConvUnit {
  std::string name;
  MapShape in, out;
  int64_t k = 1, s = 1, p = 0;
  bool bias = false, bn = false, relu = false;
  spec::ChannelAlgorithm algorithm = spec::ChannelAlgorithm::kWholeInput;  // tp > 1
};

// One lowered layer.
struct Unit {
  spec::CnnLayerKind kind = spec::CnnLayerKind::kConv;
  std::string name;  // "layerN"
  int32_t layer = 0;
  MapShape in, out;
  bool split_in = false, split_out = false;  // maps in blocks (before the adaptive pool)
  bool fc_reads_split = false;               // the fc behind a channel split
  std::vector<ConvUnit> convs;               // conv: one; bottleneck: conv1-3 (+ downsample)
  bool downsample = false;
  int64_t k = 1, s = 1, p = 0;  // pools, up_conv (kernel and stride)
  bool bias = false, relu = false;
  bool last = false;  // the classifier (or a per-pixel one, a last conv): the loss follows
  bool keep = false;  // its output is also kept for a later concat (U-Net's skip)
  int32_t joins = 0;  // concat: the unit whose kept output it joins
  // AmoebaNet's cells (amoeba_cell.hpp): each reads the previous cell's output and the one
  // before it, the previous cell's input (`skip`: its map), when the previous unit is a cell
  // (`reads_skip`, else the input twice); `passes_skip`: the next unit is a cell, which reads this
  // one's input too (a stage ending here sends it on with the output).
  int64_t filters = 0;
  bool reduction = false, reduction_prev = false, reads_skip = false, passes_skip = false;
  MapShape skip;
  spec::CnnLayer source;  // inception: the model's layer (its module and widths)
};

// The lowered layers of a CNN with their map shapes, as models::lower_cnn walks them, for `tp`
// ranks splitting the channels with the plan's algorithms (`chosen`; empty: the byte rule's).
std::vector<Unit> units_of(const spec::CnnSpec& m, int64_t tp,
                           const std::vector<spec::ChannelAlgorithm>& chosen);

}  // namespace sextant::exec::cnn
