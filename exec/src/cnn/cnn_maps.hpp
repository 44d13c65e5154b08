// A CNN stage's maps on this rank, which every unit of the stage asks about: tensor shapes with
// their channel block (tp > 1) and spatial block (Plan::spatial), window inputs with their halo
// exchanges, the blocks U-Net's layers fetch from other ranks, and the collectives over the
// spatial and channel groups, each traced as models::lower_cnn names it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "cnn_units.hpp"
#include "sextant/exec/context.hpp"
#include "sextant/exec/recorder.hpp"
#include "sextant/models/op_id.hpp"
#include "spatial_exchange.hpp"
#include "train/stage_model.hpp"

namespace sextant::exec::cnn {

class CnnMaps {
 public:
  CnnMaps(Context& ctx, const StageOptions& options, bool volume);

  Context& ctx() const { return ctx_; }
  Backend& backend() const { return *ctx_.backend; }
  int64_t micro_batch() const { return micro_batch_; }
  // The spatial split of the layers before the adaptive pool (a grid of one when unsplit).
  const SpatialExchange& exchange() const { return exchange_; }

  // Elements a window of `k` covers per channel, and a weight's shape over it: k x k, or
  // k x k x k over a volume.
  int64_t taps(int64_t k) const { return volume_ ? k * k * k : k * k; }
  std::vector<int64_t> weight_shape(int64_t outer, int64_t inner, int64_t k) const;
  // A map's extent as spec/spatial_split.hpp takes it (a 2D map has no depth axis), the block of
  // it this rank holds (`split`: the layers before the split ends; else the whole map), and the
  // window of k, s and p making `out` from `in`.
  spec::MapExtent extent(MapShape s) const { return {s.h, s.w, volume_ ? s.d : 0}; }
  Region held(MapShape s, bool split) const { return exchange_for(split).block(extent(s)); }
  WindowGeometry window(MapShape in, MapShape out, int64_t k, int64_t s, int64_t p) const;
  WindowGeometry window(const ConvUnit& c) const { return window(c.in, c.out, c.k, c.s, c.p); }
  // A map's tensor on this rank: [B, C, H, W] or a volume's [B, C, D, H, W]; its channel block
  // behind a channel split, its block of rows, columns (and planes) in a spatial split.
  std::vector<int64_t> shape_of(MapShape s, bool split) const;
  // The tensor of `channels` channels over block `r` of every sample's map.
  std::vector<int64_t> shape_over(int64_t channels, Region r) const;
  Tensor empty(const std::vector<int64_t>& shape) const { return ctx_.backend->empty(shape); }
  Tensor empty(MapShape s, bool split) const { return empty(shape_of(s, split)); }
  Tensor sum_of(const Tensor& a, const Tensor& b) const;
  // t += v (fp32 gradients: a rank's batch-norm share), through the backend: t may live on a GPU.
  void add_from_host(const std::vector<double>& v, Tensor& t) const;
  // Elements per channel of a map's batch statistics: the whole maps of the micro-batch.
  int64_t statistics_count(MapShape s) const { return micro_batch_ * s.voxels(); }

  // A compute op of layer `layer`, traced as the lowering names it.
  Recorder::Scope op(const models::OpName& name, int32_t layer, spec::Phase phase,
                     int64_t mb) const {
    return ctx_.recorder->scope(ctx_.op(name, layer, phase, mb));
  }

  // This rank's block of the micro-batch's images (`first`: the stage's first unit).
  Tensor image_block(const MicroBatch& mb, const Unit& first) const;
  // The per-pixel head's labels of this rank's block (every label of the micro-batch when the
  // head's map is whole: mb.targets holds each sample's whole map, planes, rows, columns).
  std::vector<int32_t> block_labels(const MicroBatch& mb, const Unit& u) const;

  // The window input of a map, in blocks (`split`) or whole and only padded, with the halo
  // exchange traced; and the adjoint, the map's gradient from its window's.
  Tensor window_input(const std::string& name, const WindowGeometry& g, const Tensor& x, float fill,
                      bool split, int32_t layer, spec::Phase phase, int64_t mb);
  Tensor window_gradient(const std::string& name, const WindowGeometry& g, const Tensor& dwindow,
                         MapShape in, bool split, int32_t layer, int64_t mb);
  // Sums over every split rank's block (fp32 on the wire, as the lowering prices them).
  void all_reduce_sums(const models::OpName& name, std::vector<double>& sums, int32_t layer,
                       spec::Phase phase, int64_t mb);
  // The adaptive pool's partial sums over the split ranks, so that what follows runs whole.
  void all_reduce_pooled(const models::OpName& name, Tensor& pooled, int32_t layer, int64_t mb);

  // Whether a layer's maps are in blocks over several spatial ranks.
  bool in_blocks(const Unit& u) const { return u.split_in && exchange_.split(); }
  // The blocks U-Net's up-convolution and cropped concat read of their inputs on rank q
  // (spec/spatial_split.hpp).
  std::function<Region(int64_t)> up_conv_inputs(const Unit& u) const;
  std::function<Region(int64_t)> crop_inputs(MapShape kept, MapShape to) const;
  // The output block an up-convolution makes from input block `in` (each input row i makes rows
  // [i s, i s + k)).
  Region up_conv_output(const Unit& u, Region in) const;
  // This rank's `need` block of a map `in` held in blocks, fetched from the ranks holding it
  // (traced as the lowering's exchange when any rank receives some), and the adjoint.
  Tensor fetch_block(const std::string& name, const Tensor& x, MapShape in,
                     const std::function<Region(int64_t)>& need, int32_t layer, int64_t mb);
  void give_back_block(const std::string& name, const Tensor& dneed, MapShape in,
                       const std::function<Region(int64_t)>& need, Tensor& dx, int32_t layer,
                       int64_t mb);

  // The channel split (spec/channel_split.hpp): whether convolution `c` runs algorithm `a`, what
  // its collectives move and where: the input it reads after its gather (y: every channel, w: its
  // channel group's), the output its product writes before its reduce-scatter (x: every filter,
  // w: its filter group's), and the groups of the two (the tp group, or w's gather and reduce
  // groups).
  int64_t tp() const { return spec::channel_split_ranks(*ctx_.plan); }
  bool stationary(const ConvUnit& c, spec::ChannelAlgorithm a) const {
    return tp() > 1 && c.algorithm == a;
  }
  MapShape gathered_input(const ConvUnit& c) const;
  MapShape partial_output(const ConvUnit& c) const;
  GridAxis gather_group(const ConvUnit& c) const;
  GridAxis reduce_group(const ConvUnit& c) const;
  // The map with `channels` of its channels on this rank (a concat's kept part).
  static MapShape with_channels(MapShape s, int64_t channels);
  // The channels of a map held by a group's ranks, as this rank's blocks pack them for a
  // collective over the group: the block of its member 0 for every sample, then member 1's
  // (Communicator::reduce_scatter and all_gather go by rank in the group).
  void reduce_scatter_channels(const models::OpName& name, const Tensor& whole, Tensor& mine,
                               const GridAxis& group, int32_t layer, spec::Phase phase, int64_t mb);
  void all_gather_channels(const models::OpName& name, const Tensor& mine, Tensor& whole,
                           const GridAxis& group, int32_t layer, spec::Phase phase, int64_t mb);
  // Inputs of an fc this rank holds: a block of the flattened rows behind a channel split.
  int64_t fc_rows(const Unit& u) const { return u.fc_reads_split ? u.in.c / tp() : u.in.c; }

 private:
  const SpatialExchange& exchange_for(bool split) const { return split ? exchange_ : whole_; }
  GridAxis tp_group() const { return {ctx_.groups->tp, ctx_.groups->tp_rank, tp()}; }
  // A collective or exchange among the split ranks, traced as the lowering's layer-group op.
  Recorder::Scope split_comm(const models::OpName& name, spec::OpClass cls, int64_t bytes,
                             int32_t layer, spec::Phase phase, int64_t mb) const;

  Context& ctx_;
  int64_t micro_batch_ = 1;
  bool volume_ = false;  // maps are [B, C, D, H, W]
  SpatialExchange exchange_;
  SpatialExchange whole_{spec::SpatialSplit{}, 0, nullptr};  // maps behind the split
};

// Elements of a tensor of `shape`.
int64_t numel(const std::vector<int64_t>& shape);

}  // namespace sextant::exec::cnn
