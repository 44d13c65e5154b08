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

MapBlock intersect(const MapBlock& a, const MapBlock& b) {
  return {{std::max(a.rows.begin, b.rows.begin), std::min(a.rows.end, b.rows.end)},
          {std::max(a.cols.begin, b.cols.begin), std::min(a.cols.end, b.cols.end)}};
}

MapBlock shard_block(int64_t height, int64_t width, const SpatialSplit& split, int64_t rank) {
  return {shard_rows(height, split.h, rank / split.w), shard_rows(width, split.w, rank % split.w)};
}

MapBlock window_input_block(const Window& window, const SpatialSplit& split, int64_t rank) {
  const MapBlock out = shard_block(window.out_h, window.out_w, split, rank);
  return {window_input_rows(out.rows, window.kernel, window.stride, window.padding),
          window_input_rows(out.cols, window.kernel, window.stride, window.padding)};
}

int64_t fetched_elements(const std::function<MapBlock(int64_t)>& need, int64_t in_h, int64_t in_w,
                         const SpatialSplit& split, int64_t rank) {
  const MapBlock wanted = need(rank);
  int64_t n = 0;
  for (int64_t q = 0; q < split.ranks(); ++q)
    if (q != rank) n += intersect(wanted, shard_block(in_h, in_w, split, q)).elements();
  return n;
}

int64_t most_fetched_elements(const std::function<MapBlock(int64_t)>& need, int64_t in_h,
                              int64_t in_w, const SpatialSplit& split) {
  int64_t most = 0;
  for (int64_t q = 0; q < split.ranks(); ++q)
    most = std::max(most, fetched_elements(need, in_h, in_w, split, q));
  return most;
}

namespace {
std::function<MapBlock(int64_t)> window_inputs(const Window& window, const SpatialSplit& split) {
  return [window, split](int64_t rank) { return window_input_block(window, split, rank); };
}
}  // namespace

int64_t halo_received(const Window& window, const SpatialSplit& split, int64_t rank) {
  return fetched_elements(window_inputs(window, split), window.in_h, window.in_w, split, rank);
}

int64_t halo_elements(const Window& window, const SpatialSplit& split) {
  return most_fetched_elements(window_inputs(window, split), window.in_h, window.in_w, split);
}

Rows up_window_input_rows(Rows out, int64_t in, int64_t kernel, int64_t stride) {
  // The first i with i s + kernel > out.begin (none before row 0), the last with i s < out.end.
  const int64_t first = out.begin >= kernel ? (out.begin - kernel) / stride + 1 : 0;
  return {first, std::min(in, (out.end - 1) / stride + 1)};
}

MapBlock up_window_input_block(const Window& window, const SpatialSplit& split, int64_t rank) {
  const MapBlock out = shard_block(window.out_h, window.out_w, split, rank);
  return {up_window_input_rows(out.rows, window.in_h, window.kernel, window.stride),
          up_window_input_rows(out.cols, window.in_w, window.kernel, window.stride)};
}

MapBlock crop_input_block(int64_t kept_h, int64_t kept_w, int64_t out_h, int64_t out_w,
                          const SpatialSplit& split, int64_t rank) {
  const MapBlock out = shard_block(out_h, out_w, split, rank);
  const int64_t top = centre_crop_offset(kept_h, out_h), left = centre_crop_offset(kept_w, out_w);
  return {{out.rows.begin + top, out.rows.end + top}, {out.cols.begin + left, out.cols.end + left}};
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
  if (split.h < 1 || split.w < 1) return "h and w must be >= 1";
  if (!split.any()) return "";
  if (model.kind() != ModelKind::kCnn)
    return "applies to CNNs only (a transformer splits its sequence with sequence_parallel)";
  const CnnSpec& cnn = model.cnn();
  if (cnn.volumes())
    return "splits the rows and columns of 2D maps: a spatial split of volumes (depth) is not "
           "modelled yet";
  if (cnn.has_cells())
    return "splits chains of convolutions and ResNet blocks: AmoebaNet's cells (two inputs, five "
           "nodes) are not modelled under a spatial split yet";
  const size_t end = spatial_layer_end(cnn);
  // A per-pixel head (the last layer a conv, no pool or fc before it) keeps the split to the loss.
  const bool per_pixel = end == cnn.layers.size() && cnn.layers.back().kind == CnnLayerKind::kConv;
  if (!per_pixel &&
      (end == cnn.layers.size() || cnn.layers[end].kind != CnnLayerKind::kAdaptiveAvgPool))
    return "needs an adaptive_avg_pool before the model's first fc layer: its window sums are "
           "what the split ranks all-reduce before the classifier";
  int64_t h = cnn.height;
  int64_t w = cnn.width;
  for (size_t i = 0; i < end; ++i) {
    const CnnLayer& l = cnn.layers[i];
    if (l.kind == CnnLayerKind::kConcat) continue;  // reads its kept map wherever it lies
    if (l.kind == CnnLayerKind::kUpConv) {
      const int64_t oh = up_window_output(h, l.kernel, l.stride);
      const int64_t ow = up_window_output(w, l.kernel, l.stride);
      if (oh < split.h || ow < split.w)
        return fmt::format(
            "layer {} (up_conv) makes a {}x{} feature map: a {}x{} grid must leave every rank at "
            "least one output row and column",
            i, oh, ow, split.h, split.w);
      h = oh;
      w = ow;
      continue;
    }
    // The windows the entry slides: (input rows and columns, output ones, halo).
    struct Slide {
      int64_t in_h, in_w, out_h, out_w;
      Halo halo;
    };
    std::vector<Slide> windows;
    if (l.kind == CnnLayerKind::kBottleneck) {
      // Block 0's strided 3x3 convolution, then the later blocks' unstrided ones.
      const int64_t oh = bottleneck_output(h, l.stride), ow = bottleneck_output(w, l.stride);
      windows.push_back({h, w, oh, ow, window_halo(3, l.stride, 1)});
      if (l.blocks > 1) windows.push_back({oh, ow, oh, ow, window_halo(3, 1, 1)});
    } else {
      windows.push_back({h, w, window_output(h, l.kernel, l.stride, l.padding),
                         window_output(w, l.kernel, l.stride, l.padding),
                         window_halo(l.kernel, l.stride, l.padding)});
    }
    for (const Slide& win : windows) {
      if (!window_splits(win.in_h, win.out_h, split.h, win.halo) ||
          !window_splits(win.in_w, win.out_w, split.w, win.halo))
        return fmt::format(
            "layer {} ({}) makes a {}x{} feature map from {}x{}: a {}x{} grid must leave every "
            "rank at least one output row and column and a halo ({} before, {} after) that the "
            "adjacent rank holds",
            i, enum_name(cnn_layer_kind_names(), l.kind), win.out_h, win.out_w, win.in_h, win.in_w,
            split.h, split.w, win.halo.before, win.halo.after);
    }
    h = windows.back().out_h;
    w = windows.back().out_w;
  }
  return "";
}

}  // namespace sextant::spec
