// The lowering of a CNN (conv, batch norm, pools, residual adds, fc) under sample, spatial
// (Dryden et al., IPDPS'19: halo exchanges) and channel/filter splits (Dryden et al., SC'19;
// spec/channel_split.hpp), alone or together (each spatial rank's block of the maps split by
// channel over its tp ranks: the channel collectives move blocks, the halos and partial sums
// carry a tp rank's channels).
#include <fmt/format.h>

#include <map>
#include <optional>
#include <set>

#include "amoeba_lowering.hpp"
#include "inception_lowering.hpp"
#include "lowering_ops.hpp"
#include "model_lowerings.hpp"
#include "sextant/models/cnn_fc_graph.hpp"
#include "sextant/spec/branch_parallel.hpp"
#include "sextant/spec/channel_split.hpp"
#include "sextant/spec/error.hpp"
#include "sextant/spec/spatial_split.hpp"

namespace sextant::models {

namespace {

// A feature map: channels and the whole map's slices (1 for images), rows and columns (a rank of
// a spatial split holds a block of its rows and columns, and of a volume's slices).
struct Feature {
  int64_t c, d, h, w;
};
// Its extent as spec/spatial_split.hpp takes it (no depth axis for an image), and the window of
// k, s and p that makes `out` from `in`.
spec::MapExtent extent(const Feature& f, bool volumes) {
  return {f.h, f.w, volumes ? f.d : 0};
}
spec::Window window_of(const Feature& in, const Feature& out, int64_t k, int64_t s, int64_t p,
                       bool volumes) {
  return {in.h, in.w, out.h, out.w, k, s, p, volumes ? in.d : 0, volumes ? out.d : 0};
}

// How a CNN layer's maps are split: the plan's grid for the layers before the adaptive pool that
// ends the split (spec::spatial_layer_end), none after it.
struct MapSplit {
  spec::SpatialSplit grid;
  // Pixels per sample of the most loaded rank's block of an h x w map.
  int64_t block(int64_t h, int64_t w) const {
    return spec::shard_extent(h, grid.h) * spec::shard_extent(w, grid.w);
  }
  // Elements per sample and channel of the most loaded rank's block of `f` (its slices split over
  // grid.d, 1 for an image).
  int64_t block(const Feature& f) const {
    return spec::shard_extent(f.d, grid.d) * block(f.h, f.w);
  }
};

// What lowering a CNN carries from op to op: how its channels are split over the plan's tp ranks
// (spec/channel_split.hpp: whether the map entering the next op is still whole on every rank),
// and how each forward collective runs backward (its twin; nullopt: not at all; absent from the
// map: again as it was), with the halos that bring in a layer's own input (the first layer's
// need no gradient back).
struct CnnState {
  int64_t tp = 1;
  bool whole = true;
  std::map<std::string, std::optional<Op>> backward;
  std::set<std::string> input_halos;
  bool stationary_w = false;  // some convolution ran stationary-w
  // The plan's algorithm for each convolution reading split maps (empty: the byte rule's), and
  // the algorithms those convolutions run, in order (LoweredModel::channel_algorithms).
  std::vector<spec::ChannelAlgorithm> chosen, ran;
  // Channels of a `channels`-channel map one rank holds.
  int64_t held(int64_t channels) const { return whole ? channels : channels / tp; }
};

// A collective of the ranks splitting each sample spatially (halos, partial sums).
Op spatial_op(const OpName& name, CollectiveKind kind, int64_t bytes) {
  Op op = comm_op(name, kind, bytes);
  op.group = CommGroup::kSpatial;
  return op;
}

// A spatially split layer's exchange with its grid neighbours before `window` slides over its
// input: the parts of its window input other ranks hold (spec::halo_elements, the most loaded
// rank's) of the `channels` the window reads (every channel, or this tp rank's block of them
// under a channel split) of every sample, whole in the compute dtype. Backward sends the halo's
// share of the input gradient back to its owner, the same bytes the other way
// (add_cnn_backward). `reads_layer_input`: the window reads the layer's input (its halo gradient
// is dropped in the first layer). Returns the halo's elements per sample and channel (none
// unsplit).
int64_t add_halo(Layer& layer, const std::string& name, int64_t channels,
                 const spec::Window& window, const MapSplit& split, bool reads_layer_input,
                 CnnState& st, int64_t B, int64_t e) {
  if (!split.grid.any()) return 0;
  const int64_t elements = spec::halo_elements(window, split.grid);
  if (elements > 0) {
    layer.forward.push_back(spatial_op(OpName(name, OpId::kUnitHalo), CollectiveKind::kSendRecv,
                                       B * channels * elements * e));
    if (reads_layer_input) st.input_halos.insert(OpName(name, OpId::kUnitHalo).str());
  }
  return elements;
}

// A spatially split layer's fetch of the parts of its input block other ranks hold, when that
// block is not a window's (U-Net's up-convolution and cropped concat): `elements` per sample and
// channel (spec::most_fetched_elements) of `bytes_per_element` (batch x channels x dtype). Backward
// sends their gradient back, the same bytes (add_cnn_backward).
void add_fetch(Layer& layer, const std::string& name, int64_t bytes_per_element, int64_t elements) {
  if (elements > 0)
    layer.forward.push_back(spatial_op(OpName(name, OpId::kUnitHalo), CollectiveKind::kSendRecv,
                                       bytes_per_element * elements));
}

// Appends a convolution (+ batch norm + ReLU) to `layer`; returns the output map.
// A convolution's window: k x k over images, k x k x k over volumes (`volumes`).
Feature add_conv(Layer& layer, const std::string& name, Feature in, int64_t out_c, int64_t k,
                 int64_t stride, int64_t pad, bool bias, bool bn, bool relu, int64_t B, int64_t e,
                 const MapSplit& split, CnnState& cs, bool reads_layer_input, bool volumes) {
  Feature o{out_c, volumes ? spec::window_output(in.d, k, stride, pad) : 1,
            spec::window_output(in.h, k, stride, pad), spec::window_output(in.w, k, stride, pad)};
  // The window's elements per channel: k^2, or k^3 over volumes.
  const int64_t window = k * k * (volumes ? k : 1);
  const int64_t in_block = split.block(in), out_pixels = split.block(o);
  spec::ChannelAlgorithm algorithm = spec::ChannelAlgorithm::kWholeInput;
  if (cs.tp > 1) {
    if (!cs.whole && !cs.chosen.empty() && cs.ran.size() >= cs.chosen.size())
      throw InputError("plan", "/channel_algorithms", fmt::format("{} entries", cs.chosen.size()),
                       "one algorithm for each convolution after the first: the model has more");
    algorithm = spec::convolution_algorithm(cs.chosen, static_cast<int64_t>(cs.ran.size()),
                                            cs.whole, in.c * in.h * in.w, out_c * o.h * o.w, cs.tp);
    if (!cs.whole) cs.ran.push_back(algorithm);
  }
  // An implicit GEMM: M = B*Ho*Wo output pixels (of the rank's block), N = Cout, K = Cin*k*k;
  // split over tp, N = Cout/tp (whole input, stationary-y), K = Cin/tp * k*k (stationary-x), or
  // N = Cout/g and K = Cin/r * k*k (stationary-w on an r x g grid).
  int64_t n = out_c, cin = in.c, read_c = in.c, write_c = out_c, saved_c = in.c;
  std::optional<Op> after;  // stationary-x's and -w's reduce-scatter of the partial sums
  if (cs.tp > 1) {
    // The maps the channel collectives move: the rank's spatial block of them (no halo).
    const int64_t in_map = B * in.c * in_block * e, out_map = B * out_c * out_pixels * e;
    switch (algorithm) {
      case spec::ChannelAlgorithm::kWholeInput:
        n = write_c = out_c / cs.tp;
        break;
      case spec::ChannelAlgorithm::kStationaryX: {
        cin = read_c = saved_c = in.c / cs.tp;
        const Op reduce = comm_op(OpName(name, OpId::kUnitFilterReduceScatter),
                                  CollectiveKind::kReduceScatter, out_map);
        cs.backward[reduce.name] =
            comm_op(OpName(name, OpId::kUnitFilterAllGather), CollectiveKind::kAllGather, out_map);
        after = reduce;
        break;
      }
      case spec::ChannelAlgorithm::kStationaryY: {
        n = write_c = out_c / cs.tp;
        const Op gather =
            comm_op(OpName(name, OpId::kUnitChannelAllGather), CollectiveKind::kAllGather, in_map);
        cs.backward[gather.name] = comm_op(OpName(name, OpId::kUnitChannelReduceScatter),
                                           CollectiveKind::kReduceScatter, in_map);
        layer.forward.push_back(gather);
        break;
      }
      case spec::ChannelAlgorithm::kStationaryW: {
        // The channel group's input (Cin/r channels) gathered over the g ranks of the gather
        // group; the partial outputs of the rank's Cout/g filters reduce-scattered over the r
        // ranks of the reduce group. Backward: the twins, each in its own group.
        const spec::ChannelFilterGrid g = spec::channel_filter_grid(cs.tp);
        cs.stationary_w = true;
        cin = read_c = saved_c = in.c / g.reduce_ranks;
        n = write_c = out_c / g.gather_ranks;
        auto in_group = [](Op op, CommGroup group) {
          op.group = group;
          return op;
        };
        const int64_t gathered = in_map / g.reduce_ranks, partial = out_map / g.gather_ranks;
        const Op gather = in_group(comm_op(OpName(name, OpId::kUnitChannelAllGather),
                                           CollectiveKind::kAllGather, gathered),
                                   CommGroup::kChannelGather);
        cs.backward[gather.name] = in_group(comm_op(OpName(name, OpId::kUnitChannelReduceScatter),
                                                    CollectiveKind::kReduceScatter, gathered),
                                            CommGroup::kChannelGather);
        layer.forward.push_back(gather);
        const Op reduce = in_group(comm_op(OpName(name, OpId::kUnitFilterReduceScatter),
                                           CollectiveKind::kReduceScatter, partial),
                                   CommGroup::kFilterReduce);
        cs.backward[reduce.name] = in_group(
            comm_op(OpName(name, OpId::kUnitFilterAllGather), CollectiveKind::kAllGather, partial),
            CommGroup::kFilterReduce);
        after = reduce;
        break;
      }
    }
  }
  // Under both splits the window reads the channels the algorithm has in hand (exec/src/
  // cnn_conv.cpp forward_conv): stationary-y and -w gather the rank's block of the map first,
  // then exchange the halo of every gathered channel; stationary-x exchanges its own channels'.
  const int64_t window_c = read_c;
  const int64_t in_pixels =
      in_block + add_halo(layer, name, window_c, window_of(in, o, k, stride, pad, volumes), split,
                          reads_layer_input, cs, B, e);
  Op conv = gemm(OpName(name, OpId::kUnitProduct), B * out_pixels, n, cin * window, e,
                 TpSplit::kReplicated);
  conv.op_class = OpClass::kConv;
  conv.bytes = (B * read_c * in_pixels + n * cin * window + B * write_c * out_pixels) * e;
  layer.forward.push_back(conv);
  if (after) layer.forward.push_back(*after);
  cs.whole = cs.tp == 1;
  o.c = out_c;
  const int64_t held_c = cs.held(out_c);
  layer.params += n * cin * window + (bias ? held_c : 0);
  // [filters, channels, k, k] as [filters, channels * k * k] (exec/src/cnn/cnn_params.cpp).
  layer.matrices.push_back({n, cin * window});
  const int64_t conv_params = out_c * in.c * window + (bias ? out_c : 0) + (bn ? 2 * out_c : 0);
  layer.params_total += conv_params;
  layer.add_convolution(name, in.c * in.d * in.h * in.w, o.c * o.d * o.h * o.w, conv_params);
  int64_t out_bytes = B * held_c * out_pixels * e;
  layer.saved_bytes += B * saved_c * in_pixels * e;
  if (bn) {
    // Split ranks all-reduce each channel's partial sum and sum of squares (forward) and the sums
    // of the output gradient and of its product with the normalized input (backward), in fp32,
    // so the statistics are those of the whole maps (Dryden et al. §III-B).
    // (Under a channel split too, of the rank's block of channels.)
    if (split.grid.any())
      layer.forward.push_back(spatial_op(OpName(name, OpId::kUnitBatchNormAllReduce),
                                         CollectiveKind::kAllReduce, 2 * held_c * 4));
    layer.forward.push_back(memory_op(OpName(name, OpId::kUnitBatchNorm), OpClass::kNorm,
                                      2 * out_bytes, TpSplit::kReplicated,
                                      {B, held_c, o.d * o.h, o.w}));
    layer.params += 2 * held_c;
    layer.saved_bytes += out_bytes;
  }
  if (relu) {
    layer.forward.push_back(memory_op(OpName(name, OpId::kUnitRelu), OpClass::kElementwise,
                                      2 * out_bytes, TpSplit::kReplicated,
                                      {B, held_c, o.d * o.h, o.w}));
    layer.saved_bytes += out_bytes;
  }
  return o;
}

// Backward of a CNN layer: each forward op reversed, GEMM-like ops twice the forward cost, a
// communication op as it was (the halo's gradient goes back, the statistics' gradients are
// all-reduced with as many bytes; a channel split's collective becomes its twin in `cs`). Without
// `input_gradient` (the first layer: the image needs none) no halo gradient goes back.
void add_cnn_backward(Layer& layer, bool input_gradient, const CnnState& cs) {
  for (auto it = layer.forward.rbegin(); it != layer.forward.rend(); ++it) {
    if (it->is_comm()) {
      if (!input_gradient && cs.input_halos.count(it->name) > 0) continue;
      if (auto twin = cs.backward.find(it->name); twin != cs.backward.end()) {
        if (twin->second) layer.backward.push_back(*twin->second);
        continue;
      }
      layer.backward.push_back(*it);
    } else if (it->op_class == OpClass::kConv || it->op_class == OpClass::kGemm) {
      layer.backward.push_back(gemm_backward(*it));
    } else {
      layer.backward.push_back(memory_backward(*it, 1.5));
    }
  }
}

// What every unit of a layer reads: the micro-batch, the element size, the split of the maps it
// reads, and whether they are volumes.
struct UnitContext {
  int64_t B = 0, e = 0;
  MapSplit split;
  bool volumes = false;
};

// A transposed convolution (U-Net's up_conv).
Feature lower_up_conv(Layer& layer, const spec::CnnLayer& l, Feature f, const UnitContext& u) {
  // A transposed convolution (stride = kernel in U-Net: every input voxel spreads into
  // its own k^3 output block): each input element meets Cout x Cin x k^3 weights, so
  // M = B x input voxels, N = Cout x k^3, K = Cin; backward twice that.
  const int64_t window = l.kernel * l.kernel * (u.volumes ? l.kernel : 1);
  Feature up{l.out_channels, u.volumes ? spec::up_window_output(f.d, l.kernel, l.stride) : 1,
             spec::up_window_output(f.h, l.kernel, l.stride),
             spec::up_window_output(f.w, l.kernel, l.stride)};
  // Under a spatial split each rank's output block reads the input rows that spread into
  // it (spec::up_window_input_block), some held by other ranks: fetched first, their
  // gradient sent back in backward.
  if (u.split.grid.any()) {
    const spec::Window up_window = window_of(f, up, l.kernel, l.stride, 0, u.volumes);
    const spec::SpatialSplit grid = u.split.grid;
    add_fetch(layer, layer.name + ".up_conv", u.B * f.c * u.e,
              spec::most_fetched_elements(
                  [&](int64_t q) { return spec::up_window_input_block(up_window, grid, q); },
                  extent(f, u.volumes), grid));
  }
  Op conv = gemm(OpName(layer.name + ".up_conv", OpId::kUnitProduct), u.B * u.split.block(f),
                 l.out_channels * window, f.c, u.e, TpSplit::kReplicated);
  conv.op_class = OpClass::kConv;
  conv.bytes = (u.B * f.c * u.split.block(f) + f.c * l.out_channels * window +
                u.B * up.c * u.split.block(up)) *
               u.e;
  layer.forward.push_back(conv);
  const int64_t params = f.c * l.out_channels * window + (l.bias ? l.out_channels : 0);
  layer.params += params;
  layer.params_total += params;
  layer.matrices.push_back({f.c, l.out_channels * window});
  layer.add_convolution(layer.name + ".up_conv", f.c * f.d * f.h * f.w, up.c * up.d * up.h * up.w,
                        params);
  layer.saved_bytes += u.B * f.c * u.split.block(f) * u.e;
  return up;
}

// U-Net's concat of the map kept by an earlier layer (`k`) with this one.
Feature lower_concat(Layer& layer, Feature f, Feature k, const UnitContext& u) {
  // The kept map, cropped at its centre to this map's extents, and this one copied into
  // one tensor of both channel sets (torch.cat after a centre crop); backward splits the
  // gradient the other way, the kept map's part added to its own.
  Feature joined{f.c + k.c, f.d, f.h, f.w};
  // Under a spatial split each rank's block of the output reads the kept map's crop at
  // its place (spec::crop_input_block), some held by other ranks.
  if (u.split.grid.any()) {
    const spec::SpatialSplit grid = u.split.grid;
    const spec::MapExtent from = extent(k, u.volumes), to = extent(f, u.volumes);
    add_fetch(
        layer, layer.name, u.B * k.c * u.e,
        spec::most_fetched_elements(
            [&](int64_t q) { return spec::crop_input_block(from, to, grid, q); }, from, grid));
  }
  const int64_t moved = u.B * joined.c * u.split.block(joined) * u.e;
  layer.forward.push_back(memory_op(OpName(layer.name, OpId::kUnitConcat), OpClass::kElementwise,
                                    2 * moved, TpSplit::kReplicated,
                                    {u.B, joined.c, joined.d * joined.h, joined.w}));
  return joined;
}

// A max or average pool.
Feature lower_pool(Layer& layer, const spec::CnnLayer& l, Feature f, CnnState& cs,
                   const UnitContext& u) {
  Feature o2{f.c, u.volumes ? spec::window_output(f.d, l.kernel, l.stride, l.padding) : 1,
             spec::window_output(f.h, l.kernel, l.stride, l.padding),
             spec::window_output(f.w, l.kernel, l.stride, l.padding)};
  const int64_t c = cs.held(f.c);
  add_halo(layer, layer.name + ".pool", c,
           window_of(f, o2, l.kernel, l.stride, l.padding, u.volumes), u.split, true, cs, u.B, u.e);
  layer.forward.push_back(memory_op(OpName(layer.name, OpId::kUnitPool), OpClass::kPool,
                                    u.B * c * (u.split.block(f) + u.split.block(o2)) * u.e,
                                    TpSplit::kReplicated, {u.B, c, o2.d * o2.h, o2.w}));
  layer.saved_bytes += u.B * c * u.split.block(f) * u.e;
  return o2;
}

// The adaptive average pool ending a spatial split.
Feature lower_adaptive_pool(Layer& layer, const spec::CnnLayer& l, Feature f, CnnState& cs,
                            const UnitContext& u) {
  Feature o2{f.c, u.volumes ? l.output : 1, l.output, l.output};
  const int64_t c = cs.held(f.c);
  layer.forward.push_back(memory_op(OpName(layer.name, OpId::kUnitPool), OpClass::kPool,
                                    u.B * c * (u.split.block(f) + o2.d * o2.h * o2.w) * u.e,
                                    TpSplit::kReplicated, {u.B, c, o2.d * o2.h, o2.w}));
  // Each rank sums its block's share of every window; the all-reduce of those partial
  // sums is the whole map's pooled output on every rank. Forward only: the pooled
  // gradient is whole on every rank and each takes its block's share.
  if (u.split.grid.any()) {
    const Op sums = spatial_op(OpName(layer.name, OpId::kUnitPoolAllReduce),
                               CollectiveKind::kAllReduce, u.B * c * o2.d * o2.h * o2.w * u.e);
    cs.backward[sums.name] = std::nullopt;
    layer.forward.push_back(sums);
  }
  return o2;
}

// A classifier layer; `flat`: the width of the fc before it (0: none).
Feature lower_fc(Layer& layer, const spec::CnnLayer& l, Feature f, int64_t& flat, CnnState& cs,
                 const UnitContext& u) {
  // Behind a channel split each rank holds a block of the flattened rows: a partial
  // product, all-reduced (forward only: the output gradient is whole on every rank).
  int64_t in = flat > 0 ? flat : cs.held(f.c) * f.d * f.h * f.w;
  Op fc =
      gemm(OpName(layer.name, OpId::kUnitFc), u.B, l.out_features, in, u.e, TpSplit::kReplicated);
  layer.forward.push_back(fc);
  if (!cs.whole) {
    const Op sums = comm_op(OpName(layer.name, OpId::kUnitFcAllReduce), CollectiveKind::kAllReduce,
                            u.B * l.out_features * u.e);
    cs.backward[sums.name] = std::nullopt;
    layer.forward.push_back(sums);
    cs.whole = true;
  }
  layer.params += in * l.out_features + (l.bias ? l.out_features : 0);
  layer.matrices.push_back({in, l.out_features});
  layer.params_total +=
      (flat > 0 ? flat : f.c * f.d * f.h * f.w) * l.out_features + (l.bias ? l.out_features : 0);
  layer.saved_bytes += u.B * in * u.e;
  if (l.relu) {
    layer.forward.push_back(memory_op(OpName(layer.name, OpId::kUnitRelu), OpClass::kElementwise,
                                      2 * u.B * l.out_features * u.e, TpSplit::kReplicated,
                                      {u.B, l.out_features}));
    layer.saved_bytes += u.B * l.out_features * u.e;
  }
  flat = l.out_features;
  return {l.out_features, 1, 1, 1};
}

// The r-th block of a bottleneck stage.
Feature lower_bottleneck(Layer& layer, const spec::CnnLayer& l, Feature f, int64_t r, CnnState& cs,
                         const UnitContext& u) {
  // torchvision ResNet v1.5: the stride sits on the 3x3 convolution; the first block
  // projects the shortcut with a strided 1x1 convolution when the shape changes.
  int64_t stride = r == 0 ? l.stride : 1;
  Feature in = f;
  const bool in_whole = cs.whole;
  Feature a = add_conv(layer, layer.name + ".conv1", in, l.mid_channels, 1, 1, 0, false, true, true,
                       u.B, u.e, u.split, cs, true, false);
  Feature b2 = add_conv(layer, layer.name + ".conv2", a, l.mid_channels, 3, stride, 1, false, true,
                        true, u.B, u.e, u.split, cs, false, false);
  Feature c = add_conv(layer, layer.name + ".conv3", b2, l.out_channels, 1, 1, 0, false, true,
                       false, u.B, u.e, u.split, cs, false, false);
  if (stride != 1 || in.c != l.out_channels) {
    const bool out_whole = cs.whole;
    cs.whole = in_whole;  // the shortcut reads the block's input
    add_conv(layer, layer.name + ".downsample", in, l.out_channels, 1, stride, 0, false, true,
             false, u.B, u.e, u.split, cs, true, false);
    cs.whole = out_whole;
  }
  int64_t out_bytes = u.B * cs.held(c.c) * u.split.block(c) * u.e;
  layer.forward.push_back(memory_op(OpName(layer.name, OpId::kUnitResidual), OpClass::kElementwise,
                                    3 * out_bytes, TpSplit::kReplicated,
                                    {u.B, cs.held(c.c), c.h, c.w}));
  layer.saved_bytes += out_bytes;
  return c;
}

}  // namespace

// Where an Inception module reading `f` runs its branches under `o`: on the one rank, or split
// over the tp ranks (SUPER), the ops `o.branch_rank`'s or the most loaded rank's.
BranchShare branch_share(const spec::CnnLayer& l, const Feature& f, const LoweringOptions& o) {
  BranchShare share;
  if (!o.branch_parallel) return share;
  const std::vector<double> macs = spec::inception_branch_macs(l, {f.c, 1, f.h, f.w});
  share.ranks = o.tp;
  share.owners = spec::branch_owners(macs, o.tp);
  share.rank =
      o.branch_rank >= 0 ? o.branch_rank : spec::most_loaded_rank(macs, share.owners, o.tp);
  return share;
}

// Where an AmoebaNet cell reading `prev` (its reduced states' extents) runs its groups of nodes
// under `o`, as branch_share does for a module.
BranchShare cell_share(const spec::CnnLayer& l, const CellMap& prev, const LoweringOptions& o) {
  BranchShare share;
  if (!o.branch_parallel) return share;
  const spec::CellPlacement placed = spec::amoeba_placement(l, prev.h, prev.w, o.tp);
  share.ranks = o.tp;
  share.owners = placed.node_owner;
  share.join_owners = placed.join_owner;
  share.rank = o.branch_rank >= 0 ? o.branch_rank : placed.most_loaded;
  return share;
}

LoweredModel lower_cnn(const spec::ModelSpec& model, const LoweringOptions& o) {
  const spec::CnnSpec& m = model.cnn();
  const int64_t B = o.micro_batch;
  const int64_t e = spec::dtype_bytes(o.dtype);
  const size_t split_end = spec::spatial_layer_end(m);
  LoweredModel out;
  out.dtype = o.dtype;
  out.tokens_per_micro_batch = B;
  out.samples_per_micro_batch = B;
  out.tp_splits_activations = o.tp > 1;
  Feature f{m.in_channels, m.input_depth(), m.height, m.width};
  CnnState cs;
  cs.tp = o.branch_parallel ? 1 : o.tp;  // SUPER's tp ranks keep the maps whole
  cs.chosen = o.channel_algorithms;
  const bool volumes = m.volumes();
  // The maps `skip` layers keep until their concat (U-Net's skip connections): stored until then,
  // and sent on with the activations when a pipeline stage ends between the two.
  std::vector<Feature> kept;
  // AmoebaNet's cells read the two previous cells' outputs: the input of the last cell (its
  // successor's second input) and whether that cell halved the map; none after another layer.
  std::optional<Feature> cell_input;
  bool reduction_prev = false;
  int64_t flat = 0;
  int index = 0;
  for (size_t li = 0; li < m.layers.size(); ++li) {
    const spec::CnnLayer& l = m.layers[li];
    // The layers before the one ending the split run on blocks; that one reads blocks and
    // hands every rank the whole (pooled) map.
    const MapSplit split{li <= split_end ? o.spatial : spec::SpatialSplit{}};
    const MapSplit out_split{li < split_end ? o.spatial : spec::SpatialSplit{}};
    const UnitContext u{B, e, split, volumes};
    int64_t repeats = l.kind == spec::CnnLayerKind::kBottleneck ||
                              l.kind == spec::CnnLayerKind::kAmoebaCell ||
                              l.kind == spec::CnnLayerKind::kInception
                          ? l.blocks
                          : 1;
    for (int64_t r = 0; r < repeats; ++r) {
      Layer layer;
      layer.kind = LayerKind::kCnn;
      layer.name = fmt::format("layer{}", index++);
      const int64_t input_bytes = B * cs.held(f.c) * split.block(f) * e;
      BranchJoin join;  // a unit split over tp ranks (SUPER): its join and its gradient sum
      switch (l.kind) {
        case spec::CnnLayerKind::kConv:
          f = add_conv(layer, layer.name + ".conv", f, l.out_channels, l.kernel, l.stride,
                       l.padding, l.bias, l.batch_norm, l.relu, B, e, split, cs, true, volumes);
          break;
        case spec::CnnLayerKind::kUpConv:
          f = lower_up_conv(layer, l, f, u);
          break;
        case spec::CnnLayerKind::kConcat:
          f = lower_concat(layer, f, kept.back(), u);
          kept.pop_back();
          break;
        case spec::CnnLayerKind::kMaxPool:
        case spec::CnnLayerKind::kAvgPool:
          f = lower_pool(layer, l, f, cs, u);
          break;
        case spec::CnnLayerKind::kAdaptiveAvgPool:
          f = lower_adaptive_pool(layer, l, f, cs, u);
          break;
        case spec::CnnLayerKind::kFc:
          f = lower_fc(layer, l, f, flat, cs, u);
          break;
        case spec::CnnLayerKind::kAmoebaCell: {
          const CellMap prev{f.c, f.h, f.w};
          const CellMap prev_prev =
              cell_input ? CellMap{cell_input->c, cell_input->h, cell_input->w} : prev;
          const CellMap cell_out =
              add_amoeba_cell(layer, layer.name, prev, prev_prev, cell_input && reduction_prev,
                              l.filters, l.reduction, B, e, cell_share(l, prev, o), join);
          cell_input = f;
          reduction_prev = l.reduction;
          f = {cell_out.c, 1, cell_out.h, cell_out.w};
          break;
        }
        case spec::CnnLayerKind::kBottleneck:
          f = lower_bottleneck(layer, l, f, r, cs, u);
          break;
        case spec::CnnLayerKind::kInception: {
          const CellMap made = add_inception_module(layer, layer.name, l, {f.c, f.h, f.w}, B, e,
                                                    branch_share(l, f, o), join);
          if (out.layers.empty()) join.sum_bytes = 0;  // the first layer's input: no gradient
          f = {made.c, 1, made.h, made.w};
          break;
        }
      }
      if (li + 1 == m.layers.size()) {
        // The classifier's logits, or a segmentation head's: one set per pixel (voxel), of the
        // rank's block under a spatial split.
        const int64_t pixels = out_split.block(f);
        const int64_t logits = B * f.c * pixels;
        layer.forward.push_back(memory_op(OpId::kLoss, OpClass::kLoss, logits * (e + 4),
                                          TpSplit::kReplicated, {B, f.c, pixels}));
      }
      add_cnn_backward(layer, !out.layers.empty(), cs);
      // (A split unit's join: no gather in backward, where every rank holds the output's
      // gradient; the shared gradients summed before the shared ops' backward.)
      if (!join.gather.empty()) {
        std::erase_if(layer.backward, [&](const Op& op) { return op.name == join.gather; });
        if (join.sum_bytes > 0)
          layer.backward.insert(layer.backward.end() - static_cast<ptrdiff_t>(join.prelude_ops),
                                comm_op(OpName(layer.name, OpId::kUnitBranchAllReduce),
                                        CollectiveKind::kAllReduce, join.sum_bytes));
      }
      layer.saved_bytes_selective = layer.saved_bytes;
      layer.saved_bytes_full = std::min(input_bytes, layer.saved_bytes);  // the layer input
      // What a pipeline stage ending here hands on: the output and the maps earlier layers kept
      // for a concat after it (a map kept here is the output itself, sent once).
      layer.output_bytes = B * cs.held(f.c) * out_split.block(f) * e;
      for (const Feature& k : kept) layer.output_bytes += B * cs.held(k.c) * out_split.block(k) * e;
      // A cell's successor cell also reads this cell's input.
      const bool next_is_cell =
          r + 1 < repeats ||
          (li + 1 < m.layers.size() && m.layers[li + 1].kind == spec::CnnLayerKind::kAmoebaCell);
      if (l.kind == spec::CnnLayerKind::kAmoebaCell && next_is_cell)
        layer.output_bytes += B * cell_input->c * cell_input->d * cell_input->h * cell_input->w * e;
      if (l.kind != spec::CnnLayerKind::kAmoebaCell) cell_input.reset();
      if (l.skip) kept.push_back(f);
      out.layers.push_back(std::move(layer));
    }
  }
  out.split_begin = 0;
  out.split_end = out.layers.size();
  apply_fc_splits(out, o);  // a plan's per-op splits of the classifier (cnn_fc_graph.hpp)
  out.stationary_w = cs.stationary_w;
  out.channel_algorithms = cs.ran;
  if (!cs.chosen.empty() && cs.chosen.size() != cs.ran.size())
    throw InputError("plan", "/channel_algorithms", fmt::format("{} entries", cs.chosen.size()),
                     fmt::format("one algorithm for each of the model's {} convolutions after "
                                 "the first (those reading channel-split maps)",
                                 cs.ran.size()));
  return out;
}

}  // namespace sextant::models
