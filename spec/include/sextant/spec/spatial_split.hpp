// The geometry of a spatial split of a CNN (Dryden et al., IPDPS'19, "Improving strong-scaling of
// CNN training by exploiting finer-grained parallelism", §III-A; LBANN's Distconv): each rank of
// an h x w grid holds a block of rows and columns of every feature map (of a d x h x w grid, a
// block of a volume's planes, rows and columns, as Oyama et al., "The case for strong scaling in
// deep learning", 2020, split 3D CNNs), and before a convolution or pooling window slides over its
// block it receives the rows and columns the window reads beyond it (the halo) from its grid
// neighbours. The one home of the shard, halo and split rules that the plan check, the lowering
// and the planner ask.
#pragma once

#include <cstdint>
#include <functional>
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

// Rows and columns of a feature map, and planes of a volume's (a 2D map's one plane is [0, 1)), in
// the whole map's coordinates.
struct MapBlock {
  Rows rows, cols;
  Rows planes{0, 1};
  bool empty() const { return rows.size() <= 0 || cols.size() <= 0 || planes.size() <= 0; }
  int64_t elements() const { return empty() ? 0 : planes.size() * rows.size() * cols.size(); }
};

// A feature map's rows, columns and, for a volume, planes (d 0: a 2D map, no depth axis).
struct MapExtent {
  int64_t h = 0, w = 0, d = 0;
  bool volume() const { return d > 0; }
};
MapBlock intersect(const MapBlock& a, const MapBlock& b);

// A window of `kernel` with `stride` and `padding` sliding over an in_h x in_w map to make an
// out_h x out_w one; over a volume (in_d > 0) a cube, in_d planes to out_d.
struct Window {
  int64_t in_h = 0, in_w = 0, out_h = 0, out_w = 0;
  int64_t kernel = 1, stride = 1, padding = 0;
  int64_t in_d = 0, out_d = 0;
  MapExtent in() const { return {in_h, in_w, in_d}; }
  MapExtent out() const { return {out_h, out_w, out_d}; }
};

// The block of a map that rank `rank` of `split` holds (shard_rows on each axis, the grid
// row-major: planes, rows, columns; a 2D map's one plane whatever split.d), and the input block
// its window reads to make its block of the output (window_input_rows on each axis; it reaches
// into the padding at the map's edges).
MapBlock shard_block(const MapExtent& map, const SpatialSplit& split, int64_t rank);
MapBlock shard_block(int64_t height, int64_t width, const SpatialSplit& split, int64_t rank);
MapBlock window_input_block(const Window& window, const SpatialSplit& split, int64_t rank);

// Elements per sample and channel that rank `rank` receives before `window` slides over its
// block: the parts of its window input other ranks hold (corners of diagonal neighbours
// included). halo_elements: the most loaded rank's, which the exchange waits for (0: none).
int64_t halo_received(const Window& window, const SpatialSplit& split, int64_t rank);
int64_t halo_elements(const Window& window, const SpatialSplit& split);

// The parts of an in_h x in_w map (held in shard_blocks) that other ranks hold of the block
// `need(rank)` rank `rank` reads, in elements per sample and channel; most_fetched_elements: the
// most loaded rank's. The halos above are this for window_input_block; U-Net's up-convolution
// and cropped concat read other blocks of their inputs (below).
int64_t fetched_elements(const std::function<MapBlock(int64_t)>& need, const MapExtent& in,
                         const SpatialSplit& split, int64_t rank);
int64_t most_fetched_elements(const std::function<MapBlock(int64_t)>& need, const MapExtent& in,
                              const SpatialSplit& split);

// U-Net under a spatial split (each rank holds shard_block of every map, the decoder's too).
// The input rows a transposed convolution (no padding) of `kernel` and `stride` over `in` rows
// reads to make output rows `out`: input row i spreads into output rows [i s, i s + kernel), so
// the rows with i s < out.end and i s + kernel > out.begin, within [0, in).
Rows up_window_input_rows(Rows out, int64_t in, int64_t kernel, int64_t stride);
// The block of the up-convolution's input (window.in()) that rank `rank`'s block of its output
// (window.out()) reads.
MapBlock up_window_input_block(const Window& window, const SpatialSplit& split, int64_t rank);
// The block of a kept map that rank `rank`'s block of a concat's output (`out`) reads: that block
// moved by the centre crop's offsets (centre_crop_offset on each axis).
MapBlock crop_input_block(const MapExtent& kept, const MapExtent& out, const SpatialSplit& split,
                          int64_t rank);

// Index of the layer that ends the split: the model's first adaptive_avg_pool, whose window sums
// the ranks compute over their blocks and all-reduce; the classifier after it runs whole on every
// rank. The index of the first fc when none comes before it (a split the model cannot end); the
// number of layers for a network without either (a per-pixel head: the split spans it, each rank
// scoring its block's pixels).
size_t spatial_layer_end(const CnnSpec& cnn);

// What is wrong with splitting `model`'s feature maps over `split`, or "" when nothing is: CNNs
// only; a classifier's convolutional part must end in an adaptive_avg_pool (a per-pixel head,
// U-Net's, needs none); every window must leave each rank at least one output row and column and
// read its halo from the adjacent rank only, every up-convolution at least one output row and
// column (its input and a concat's kept map are read wherever they lie).
std::string spatial_split_problem(const ModelSpec& model, const SpatialSplit& split);

}  // namespace sextant::spec
