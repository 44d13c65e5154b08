// Shards, halos and the rule of which CNNs a spatial split applies to.
#include "sextant/spec/spatial_split.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace sextant::spec {

int64_t shard_extent(int64_t extent, int64_t parts) {
  return (extent + parts - 1) / parts;
}

Rows shard_rows(int64_t extent, int64_t parts, int64_t index) {
  return {index * extent / parts, (index + 1) * extent / parts};
}

Rows window_input_rows(Rows out, int64_t kernel, int64_t stride, int64_t padding) {
  return {out.begin * stride - padding, (out.end - 1) * stride - padding + kernel};
}

Halo window_halo(int64_t kernel, int64_t stride, int64_t padding) {
  return {padding, std::max<int64_t>(0, kernel - padding - stride)};
}

namespace {
Rows overlap(Rows a, Rows b) {
  return {std::max(a.begin, b.begin), std::min(a.end, b.end)};
}
}  // namespace

MapBlock intersect(const MapBlock& a, const MapBlock& b) {
  return {overlap(a.rows, b.rows), overlap(a.cols, b.cols), overlap(a.planes, b.planes)};
}

MapBlock shard_block(const MapExtent& map, const SpatialSplit& split, int64_t rank) {
  const int64_t in_plane = rank % (split.h * split.w);
  return {shard_rows(map.h, split.h, in_plane / split.w),
          shard_rows(map.w, split.w, in_plane % split.w),
          map.volume() ? shard_rows(map.d, split.d, rank / (split.h * split.w)) : Rows{0, 1}};
}

MapBlock shard_block(int64_t height, int64_t width, const SpatialSplit& split, int64_t rank) {
  return shard_block(MapExtent{height, width}, split, rank);
}

MapBlock window_input_block(const Window& window, const SpatialSplit& split, int64_t rank) {
  const MapBlock out = shard_block(window.out(), split, rank);
  auto input = [&](Rows r) {
    return window_input_rows(r, window.kernel, window.stride, window.padding);
  };
  return {input(out.rows), input(out.cols), window.in().volume() ? input(out.planes) : Rows{0, 1}};
}

int64_t fetched_elements(const std::function<MapBlock(int64_t)>& need, const MapExtent& in,
                         const SpatialSplit& split, int64_t rank) {
  const MapBlock wanted = need(rank);
  int64_t n = 0;
  for (int64_t q = 0; q < split.ranks(); ++q)
    if (q != rank) n += intersect(wanted, shard_block(in, split, q)).elements();
  return n;
}

int64_t most_fetched_elements(const std::function<MapBlock(int64_t)>& need, const MapExtent& in,
                              const SpatialSplit& split) {
  int64_t most = 0;
  for (int64_t q = 0; q < split.ranks(); ++q)
    most = std::max(most, fetched_elements(need, in, split, q));
  return most;
}

namespace {
std::function<MapBlock(int64_t)> window_inputs(const Window& window, const SpatialSplit& split) {
  return [window, split](int64_t rank) { return window_input_block(window, split, rank); };
}
}  // namespace

int64_t halo_received(const Window& window, const SpatialSplit& split, int64_t rank) {
  return fetched_elements(window_inputs(window, split), window.in(), split, rank);
}

int64_t halo_elements(const Window& window, const SpatialSplit& split) {
  return most_fetched_elements(window_inputs(window, split), window.in(), split);
}

Rows up_window_input_rows(Rows out, int64_t in, int64_t kernel, int64_t stride) {
  // The first i with i s + kernel > out.begin (none before row 0), the last with i s < out.end.
  const int64_t first = out.begin >= kernel ? (out.begin - kernel) / stride + 1 : 0;
  return {first, std::min(in, (out.end - 1) / stride + 1)};
}

MapBlock up_window_input_block(const Window& window, const SpatialSplit& split, int64_t rank) {
  const MapBlock out = shard_block(window.out(), split, rank);
  auto input = [&](Rows r, int64_t extent) {
    return up_window_input_rows(r, extent, window.kernel, window.stride);
  };
  return {input(out.rows, window.in_h), input(out.cols, window.in_w),
          window.in().volume() ? input(out.planes, window.in_d) : Rows{0, 1}};
}

MapBlock crop_input_block(const MapExtent& kept, const MapExtent& out, const SpatialSplit& split,
                          int64_t rank) {
  const MapBlock block = shard_block(out, split, rank);
  auto moved = [](Rows r, int64_t by) { return Rows{r.begin + by, r.end + by}; };
  return {moved(block.rows, centre_crop_offset(kept.h, out.h)),
          moved(block.cols, centre_crop_offset(kept.w, out.w)),
          kept.volume() ? moved(block.planes, centre_crop_offset(kept.d, out.d)) : Rows{0, 1}};
}

size_t spatial_layer_end(const CnnSpec& cnn) {
  for (size_t i = 0; i < cnn.layers.size(); ++i) {
    const CnnLayerKind kind = cnn.layers[i].kind;
    if (kind == CnnLayerKind::kAdaptiveAvgPool || kind == CnnLayerKind::kFc) return i;
  }
  return cnn.layers.size();
}

namespace {

// Whether a window over `in` rows making `out` rows splits over `parts` ranks: each keeps at
// least one output row and reads its halo from the adjacent rank's own rows.
bool window_splits(int64_t in, int64_t out, int64_t parts, Halo halo) {
  return out >= parts && std::max(halo.before, halo.after) <= in / parts;
}

}  // namespace

std::string spatial_split_problem(const ModelSpec& model, const SpatialSplit& split) {
  if (split.h < 1 || split.w < 1 || split.d < 1) return "h, w and d must be >= 1";
  if (!split.any()) return "";
  if (model.kind() != ModelKind::kCnn)
    return "applies to CNNs only (a transformer splits its sequence with sequence_parallel)";
  const CnnSpec& cnn = model.cnn();
  if (split.d > 1 && !cnn.volumes())
    return "d splits a volume's planes (depth): a 2D model splits its rows and columns (h, w)";
  if (cnn.has_cells())
    return "splits chains of convolutions and ResNet blocks: multi-branch units (AmoebaNet's "
           "cells, Inception's modules) are not modelled under a spatial split yet";
  const size_t end = spatial_layer_end(cnn);
  // A per-pixel head (the last layer a conv, no pool or fc before it) keeps the split to the loss.
  const bool per_pixel = end == cnn.layers.size() && cnn.layers.back().kind == CnnLayerKind::kConv;
  if (!per_pixel &&
      (end == cnn.layers.size() || cnn.layers[end].kind != CnnLayerKind::kAdaptiveAvgPool))
    return "needs an adaptive_avg_pool before the model's first fc layer: its window sums are "
           "what the split ranks all-reduce before the classifier";
  const bool volumes = cnn.volumes();
  // A map's extent as messages print it: HxW, or DxHxW for a volume.
  auto extent = [&](int64_t d, int64_t h, int64_t w) {
    return volumes ? fmt::format("{}x{}x{}", d, h, w) : fmt::format("{}x{}", h, w);
  };
  int64_t d = cnn.input_depth();
  int64_t h = cnn.height;
  int64_t w = cnn.width;
  for (size_t i = 0; i < end; ++i) {
    const CnnLayer& l = cnn.layers[i];
    if (l.kind == CnnLayerKind::kConcat) continue;  // reads its kept map wherever it lies
    if (l.kind == CnnLayerKind::kUpConv) {
      const int64_t od = volumes ? up_window_output(d, l.kernel, l.stride) : 1;
      const int64_t oh = up_window_output(h, l.kernel, l.stride);
      const int64_t ow = up_window_output(w, l.kernel, l.stride);
      if (od < split.d || oh < split.h || ow < split.w)
        return fmt::format(
            "layer {} (up_conv) makes a {} feature map: a {} grid must leave every rank at least "
            "one output plane, row and column",
            i, extent(od, oh, ow), spatial_text(split));
      d = od;
      h = oh;
      w = ow;
      continue;
    }
    // The windows the entry slides: (input planes, rows and columns, output ones, halo).
    struct Slide {
      int64_t in_d, in_h, in_w, out_d, out_h, out_w;
      Halo halo;
    };
    std::vector<Slide> windows;
    if (l.kind == CnnLayerKind::kBottleneck) {
      // Block 0's strided 3x3 convolution, then the later blocks' unstrided ones (2D only).
      const int64_t oh = bottleneck_output(h, l.stride), ow = bottleneck_output(w, l.stride);
      windows.push_back({1, h, w, 1, oh, ow, window_halo(3, l.stride, 1)});
      if (l.blocks > 1) windows.push_back({1, oh, ow, 1, oh, ow, window_halo(3, 1, 1)});
    } else {
      auto out = [&](int64_t n) { return window_output(n, l.kernel, l.stride, l.padding); };
      windows.push_back({d, h, w, volumes ? out(d) : 1, out(h), out(w),
                         window_halo(l.kernel, l.stride, l.padding)});
    }
    for (const Slide& win : windows) {
      if (!window_splits(win.in_h, win.out_h, split.h, win.halo) ||
          !window_splits(win.in_w, win.out_w, split.w, win.halo) ||
          (volumes && !window_splits(win.in_d, win.out_d, split.d, win.halo)))
        return fmt::format(
            "layer {} ({}) makes a {} feature map from {}: a {} grid must leave every rank at "
            "least one output {} and a halo ({} before, {} after) that the adjacent rank holds",
            i, enum_name(cnn_layer_kind_names(), l.kind), extent(win.out_d, win.out_h, win.out_w),
            extent(win.in_d, win.in_h, win.in_w), spatial_text(split),
            volumes ? "plane, row and column" : "row and column", win.halo.before, win.halo.after);
    }
    d = windows.back().out_d;
    h = windows.back().out_h;
    w = windows.back().out_w;
  }
  return "";
}

}  // namespace sextant::spec
