// The geometry of a spatial split of a CNN (Dryden et al., IPDPS'19, "Improving strong-scaling of
// CNN training by exploiting finer-grained parallelism", §III-A; LBANN's Distconv): each rank of
// an h x w grid holds a block of rows and columns of every feature map, and before a convolution
// or pooling window slides over its block it receives the rows and columns the window reads beyond
// it (the halo) from its grid neighbours. The one home of the shard, halo and split rules that the
// plan check, the lowering and the planner ask.
#pragma once

#include <cstdint>
#include <string>

#include "sextant/spec/model_spec.hpp"
#include "sextant/spec/plan.hpp"

namespace sextant::spec {

// Rows of the largest shard when `extent` rows are split over `parts` ranks (the rank the step
// waits for): ceil(extent / parts), the size of shard_rows' largest range.
int64_t shard_extent(int64_t extent, int64_t parts);

// A range [begin, end) of rows (or columns) of a feature map, in the whole map's coordinates.
struct Rows {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const Rows&) const = default;
};
// The rows rank `index` of `parts` holds: balanced, [floor(i n / p), floor((i + 1) n / p)), so
// every rank holds at least one row when extent >= parts (the executor's partition).
Rows shard_rows(int64_t extent, int64_t parts, int64_t index);
// The input rows a window of `kernel` with `stride` and `padding` reads to make output rows
// `out`: [out.begin * stride - padding, (out.end - 1) * stride - padding + kernel), which reaches
// beyond the map (into the padding) at its edges.
Rows window_input_rows(Rows out, int64_t kernel, int64_t stride, int64_t padding);

// Rows a window reads beyond a shard of its input, along one axis, with shards aligned to the
// stride (rank i holds input rows [iL, (i+1)L) and computes output rows [iL/s, (i+1)L/s)): its
// first output row starts `padding` rows before the shard, its last one reads
// kernel - padding - stride rows past it (none for a 1x1 or a non-overlapping window). The rule
// of which grids split (a halo within the adjacent rank's rows) asks it; the bytes exchanged come
// from the blocks themselves (halo_elements).
struct Halo {
  int64_t before = 0;
  int64_t after = 0;
  bool operator==(const Halo&) const = default;
};
Halo window_halo(int64_t kernel, int64_t stride, int64_t padding);

// Rows and columns of a feature map, in the whole map's coordinates.
struct MapBlock {
  Rows rows, cols;
  bool empty() const { return rows.size() <= 0 || cols.size() <= 0; }
  int64_t elements() const { return empty() ? 0 : rows.size() * cols.size(); }
};
MapBlock intersect(const MapBlock& a, const MapBlock& b);

// A window of `kernel` with `stride` and `padding` sliding over an in_h x in_w map to make an
// out_h x out_w one.
struct Window {
  int64_t in_h = 0, in_w = 0, out_h = 0, out_w = 0;
  int64_t kernel = 1, stride = 1, padding = 0;
};

// The block of an h x w map that rank `rank` of `split` holds (shard_rows on each axis, the grid
// row-major), and the input block its window reads to make its block of the output
// (window_input_rows on each axis; it reaches into the padding at the map's edges).
MapBlock shard_block(int64_t height, int64_t width, const SpatialSplit& split, int64_t rank);
MapBlock window_input_block(const Window& window, const SpatialSplit& split, int64_t rank);

// Elements per sample and channel that rank `rank` receives before `window` slides over its
// block: the parts of its window input other ranks hold (corners of diagonal neighbours
// included). halo_elements: the most loaded rank's, which the exchange waits for (0: none).
int64_t halo_received(const Window& window, const SpatialSplit& split, int64_t rank);
int64_t halo_elements(const Window& window, const SpatialSplit& split);

// Index of the layer that ends the split: the model's first adaptive_avg_pool, whose window sums
// the ranks compute over their blocks and all-reduce; the classifier after it runs whole on every
// rank. The index of the first fc when none comes before it (a split the model cannot end).
size_t spatial_layer_end(const CnnSpec& cnn);

// What is wrong with splitting `model`'s feature maps over `split`, or "" when nothing is: CNNs
// only; an adaptive_avg_pool must end the convolutional part; every window must leave each rank at
// least one output row and column and read its halo from the adjacent rank only.
std::string spatial_split_problem(const ModelSpec& model, const SpatialSplit& split);

}  // namespace sextant::spec
