// The units of a CNN stage (cnn_units.hpp).
#include "cnn_units.hpp"

#include <fmt/format.h>

#include <optional>

#include "amoeba_cell.hpp"
#include "inception_module.hpp"
#include "sextant/spec/spatial_split.hpp"

namespace sextant::exec::cnn {

using spec::CnnLayerKind;

std::vector<Unit> units_of(const spec::CnnSpec& m, int64_t tp,
                           const std::vector<spec::ChannelAlgorithm>& chosen) {
  std::vector<Unit> out;
  const size_t split_end = spec::spatial_layer_end(m);
  MapShape f{m.in_channels, m.input_depth(), m.height, m.width};
  bool whole = true;               // before the first convolution (and behind the first fc)
  int64_t split_convolutions = 0;  // convolutions so far reading channel-split maps
  // The map a window of k, s and p makes from `in` with `channels` channels (along a volume's
  // depth too).
  auto windowed = [&](MapShape in, int64_t channels, int64_t k, int64_t s, int64_t p) {
    return MapShape{channels, m.volumes() ? spec::window_output(in.d, k, s, p) : 1,
                    spec::window_output(in.h, k, s, p), spec::window_output(in.w, k, s, p)};
  };
  auto conv = [&](std::string name, MapShape in, int64_t out_c, int64_t k, int64_t s, int64_t p,
                  bool bias, bool bn, bool relu) {
    ConvUnit c{std::move(name), in, windowed(in, out_c, k, s, p), k, s, p, bias, bn, relu};
    c.in.whole = whole;
    c.algorithm = spec::convolution_algorithm(chosen, split_convolutions, whole, in.c * in.voxels(),
                                              c.out.c * c.out.voxels(), tp);
    if (tp > 1 && !whole) ++split_convolutions;
    whole = tp == 1;
    c.out.whole = whole;
    return c;
  };
  std::vector<int32_t> kept;  // units whose outputs wait for their concat
  // The input of the last cell, when the unit before is one (models::lower_cnn's cell_input).
  std::optional<MapShape> cell_input;
  bool reduction_prev = false;
  for (size_t li = 0; li < m.layers.size(); ++li) {
    const spec::CnnLayer& l = m.layers[li];
    const int64_t repeats = l.kind == CnnLayerKind::kBottleneck ||
                                    l.kind == CnnLayerKind::kAmoebaCell ||
                                    l.kind == CnnLayerKind::kInception
                                ? l.blocks
                                : 1;
    for (int64_t r = 0; r < repeats; ++r) {
      Unit u;
      u.kind = l.kind;
      u.layer = static_cast<int32_t>(out.size());
      u.name = fmt::format("layer{}", u.layer);
      f.whole = whole;
      u.in = f;
      u.split_in = li <= split_end;
      u.split_out = li < split_end;
      switch (l.kind) {
        case CnnLayerKind::kConv:
          u.convs.push_back(conv(u.name + ".conv", f, l.out_channels, l.kernel, l.stride, l.padding,
                                 l.bias, l.batch_norm, l.relu));
          f = u.convs.back().out;
          break;
        case CnnLayerKind::kMaxPool:
        case CnnLayerKind::kAvgPool:
          u.k = l.kernel;
          u.s = l.stride;
          u.p = l.padding;
          f = windowed(f, f.c, l.kernel, l.stride, l.padding);
          break;
        case CnnLayerKind::kAdaptiveAvgPool:
          f = {f.c, m.volumes() ? l.output : 1, l.output, l.output};
          break;
        case CnnLayerKind::kFc:
          u.in = {f.c * f.voxels(), 1, 1, 1, whole};  // flattened in NCHW order, as torch.flatten
          u.fc_reads_split = !whole;
          whole = true;
          u.bias = l.bias;
          u.relu = l.relu;
          f = {l.out_features};
          break;
        case CnnLayerKind::kBottleneck: {
          const int64_t stride = r == 0 ? l.stride : 1;
          u.convs.push_back(conv(u.name + ".conv1", f, l.mid_channels, 1, 1, 0, false, true, true));
          u.convs.push_back(conv(u.name + ".conv2", u.convs[0].out, l.mid_channels, 3, stride, 1,
                                 false, true, true));
          u.convs.push_back(
              conv(u.name + ".conv3", u.convs[1].out, l.out_channels, 1, 1, 0, false, true, false));
          u.downsample = stride != 1 || f.c != l.out_channels;
          if (u.downsample) {
            whole = u.in.whole;  // the shortcut reads the block's input
            u.convs.push_back(
                conv(u.name + ".downsample", f, l.out_channels, 1, stride, 0, false, true, false));
          }
          f = u.convs[2].out;
          break;
        }
        case CnnLayerKind::kUpConv:
          u.k = l.kernel;
          u.s = l.stride;
          u.bias = l.bias;
          f = {l.out_channels, m.volumes() ? spec::up_window_output(f.d, l.kernel, l.stride) : 1,
               spec::up_window_output(f.h, l.kernel, l.stride),
               spec::up_window_output(f.w, l.kernel, l.stride)};
          break;
        case CnnLayerKind::kConcat:
          u.joins = kept.back();
          kept.pop_back();
          f.c += out[static_cast<size_t>(u.joins)].out.c;
          break;
        case CnnLayerKind::kAmoebaCell: {
          u.filters = l.filters;
          u.reduction = l.reduction;
          u.reads_skip = cell_input.has_value();
          u.reduction_prev = u.reads_skip && reduction_prev;
          u.skip = cell_input.value_or(f);
          if (!out.empty() && out.back().kind == CnnLayerKind::kAmoebaCell)
            out.back().passes_skip = true;
          const CellMap made =
              amoeba_cell(u.name, u.layer, {f.c, f.h, f.w}, {u.skip.c, u.skip.h, u.skip.w},
                          u.reduction_prev, l.filters, l.reduction, 1)
                  .output();
          cell_input = f;
          reduction_prev = l.reduction;
          f = {made.c, 1, made.h, made.w};
          break;
        }
        case CnnLayerKind::kInception: {
          u.source = l;
          const CellMap made = inception_module(u.name, u.layer, l, {f.c, f.h, f.w}, 1).output();
          f = {made.c, 1, made.h, made.w};
          break;
        }
      }
      if (l.kind != CnnLayerKind::kAmoebaCell) cell_input.reset();
      f.whole = whole;
      u.out = f;
      u.last = li + 1 == m.layers.size();
      u.keep = l.skip;
      if (u.keep) kept.push_back(u.layer);
      out.push_back(std::move(u));
    }
  }
  return out;
}

}  // namespace sextant::exec::cnn
