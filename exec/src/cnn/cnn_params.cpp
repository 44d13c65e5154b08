// A CNN stage's parameters on one rank: He-initialised convolutions (whole, or this rank's slice
// under each channel-split algorithm), batch norms and biases following the output's channels,
// up-convolutions, fc layers and AmoebaNet's cells, each element drawn from its index in the whole
// tensor, so that every layout starts from the single rank's model.
#include <algorithm>
#include <cmath>
#include <functional>

#include "cnn_layers.hpp"
#include "sextant/spec/channel_split.hpp"

namespace sextant::exec::cnn {

namespace {

// Adds a stage's parameter specs, each element's value from its index in the whole tensor.
class SpecList {
 public:
  SpecList(std::vector<ParamSpec>& specs, uint64_t seed) : specs_(specs), seed_(seed) {}
  void normal(const std::string& name, int32_t layer, std::vector<int64_t> shape, float std_dev,
              std::function<int64_t(int64_t)> global, bool replicated) {
    const uint64_t seed = seed_;
    specs_.push_back({name, layer, std::move(shape),
                      [=](int64_t i) { return std_dev * init_normal(seed, name, global(i)); }, true,
                      replicated, false, false});
  }
  void constant(const std::string& name, int32_t layer, int64_t n, float value, bool replicated) {
    specs_.push_back(
        {name, layer, {n}, [=](int64_t) { return value; }, false, replicated, false, false});
  }
  static int64_t same(int64_t i) { return i; }

 private:
  std::vector<ParamSpec>& specs_;
  uint64_t seed_;
};

// A convolution's weight: He initialisation, std = sqrt(2 / fan_in) (He et al. 2015), and its
// bias and batch norm over this rank's filter block.
void add_conv(SpecList& add, const ConvUnit& c, int32_t l, const CnnMaps& maps, int64_t rank) {
  const int64_t tp = maps.tp();
  const int64_t window = maps.taps(c.k);
  const float std_dev = std::sqrt(2.0f / static_cast<float>(c.in.c * window));
  const spec::ChannelBlock filters = spec::channel_block(c.out.c, tp, rank);
  const std::string weight = c.name + ".weight";
  // Whole on every tp rank (SUPER's branch split keeps the other layers whole): counted once in
  // the gradient norm.
  const bool replicated = tp == 1 && maps.ctx().groups->tp_size > 1;
  if (tp == 1) {
    add.normal(weight, l, maps.weight_shape(c.out.c, c.in.c, c.k), std_dev, SpecList::same,
               replicated);
  } else if (c.algorithm == spec::ChannelAlgorithm::kStationaryX) {
    // Every filter's slice over this rank's input channels: [F, C/tp, k, k].
    const spec::ChannelBlock channels = spec::channel_block(c.in.c, tp, rank);
    const int64_t in_c = c.in.c;
    add.normal(
        weight, l, maps.weight_shape(c.out.c, channels.count, c.k), std_dev,
        [=](int64_t i) {
          const int64_t f = i / (channels.count * window), rest = i % (channels.count * window);
          return (f * in_c + channels.begin) * window + rest;
        },
        false);
  } else if (c.algorithm == spec::ChannelAlgorithm::kStationaryW) {
    // The slice of its filter group's F/g filters over its channel group's C/r channels
    // (spec::gathered_channel_blocks, in the order its all-gather packs them): [F/g, C/r, k, k].
    const spec::ChannelFilterGrid g = spec::channel_filter_grid(tp);
    const std::vector<int64_t> blocks = spec::gathered_channel_blocks(tp, rank);
    const int64_t block = c.in.c / tp, channels = c.in.c / g.reduce_ranks;
    const int64_t first_filter = rank / g.reduce_ranks * (c.out.c / g.gather_ranks);
    const int64_t in_c = c.in.c;
    add.normal(
        weight, l, maps.weight_shape(c.out.c / g.gather_ranks, channels, c.k), std_dev,
        [=](int64_t i) {
          const int64_t f = i / (channels * window), rest = i % (channels * window);
          const int64_t local = rest / window;
          const int64_t channel =
              blocks[static_cast<size_t>(local / block)] * block + local % block;
          return ((first_filter + f) * in_c + channel) * window + rest % window;
        },
        false);
  } else {
    // This rank's block of whole filters: [F/tp, C, k, k].
    const int64_t offset = filters.begin * c.in.c * window;
    add.normal(
        weight, l, maps.weight_shape(filters.count, c.in.c, c.k), std_dev,
        [=](int64_t i) { return offset + i; }, false);
  }
  // Biases and batch norms follow the output's channels: this rank's filter block.
  if (c.bias) add.constant(c.name + ".bias", l, filters.count, 0.0f, replicated);
  if (c.bn) {
    add.constant(c.name + ".bn.weight", l, filters.count, 1.0f, replicated);
    add.constant(c.name + ".bn.bias", l, filters.count, 0.0f, replicated);
  }
}

// [Ci, Co, k, k] (or [.., k, k, k]), ConvTranspose2d's and 3d's layout; std = sqrt(2 / (Ci k^2))
// (k^3 on a volume).
void add_up_conv(SpecList& add, const Unit& u, int32_t l, const CnnMaps& maps) {
  const float std_dev = std::sqrt(2.0f / static_cast<float>(u.in.c * maps.taps(u.k)));
  add.normal(u.name + ".up_conv.weight", l, maps.weight_shape(u.in.c, u.out.c, u.k), std_dev,
             SpecList::same, false);
  if (u.bias) add.constant(u.name + ".up_conv.bias", l, u.out.c, 0.0f, false);
}

// The classifier starts small, so that the first loss is near log(classes). Behind a channel split
// the fc holds the rows of its rank's channels; later fcs are whole.
void add_fc(SpecList& add, const Unit& u, int32_t l, int64_t tp, int64_t rank) {
  const float std_dev = u.last ? 0.01f : std::sqrt(2.0f / static_cast<float>(u.in.c));
  if (u.fc_reads_split) {
    const int64_t rows = u.in.c / tp, offset = rank * rows * u.out.c;
    add.normal(
        u.name + ".fc.weight", l, {rows, u.out.c}, std_dev, [=](int64_t i) { return offset + i; },
        false);
  } else {
    add.normal(u.name + ".fc.weight", l, {u.in.c, u.out.c}, std_dev, SpecList::same, true);
  }
  if (u.bias) add.constant(u.name + ".fc.bias", l, u.out.c, 0.0f, true);
}

}  // namespace

CnnParams::CnnParams(const std::vector<Unit>& units, int32_t begin, int32_t end,
                     const CnnMaps& maps, uint64_t seed,
                     std::map<int32_t, std::unique_ptr<UnitTape>>& cells, SplitFcChain* split_fc) {
  std::vector<ParamSpec> specs;
  SpecList add(specs, seed);
  const int64_t rank = maps.ctx().groups->tp_rank;
  // Under SUPER's branch split, this tp rank's share of each cell and module.
  const bool split = maps.ctx().plan->branch_parallel;
  const int64_t ranks = split ? maps.ctx().groups->tp_size : 1;
  const int64_t tp_rank = split ? rank : 0;
  for (int32_t l = begin; l < end; ++l) {
    const Unit& u = units[static_cast<size_t>(l)];
    for (const ConvUnit& c : u.convs) add_conv(add, c, l, maps, rank);
    if (u.kind == spec::CnnLayerKind::kAmoebaCell) {
      cells[l] = std::make_unique<UnitTape>(amoeba_cell(
          u.name, l, CellMap{u.in.c, u.in.h, u.in.w}, CellMap{u.skip.c, u.skip.h, u.skip.w},
          u.reduction_prev, u.filters, u.reduction, maps.micro_batch(), ranks, tp_rank));
      cells[l]->add_params(specs, seed);
    }
    if (u.kind == spec::CnnLayerKind::kInception) {
      cells[l] = std::make_unique<UnitTape>(inception_module(u.name, l, u.source,
                                                             CellMap{u.in.c, u.in.h, u.in.w},
                                                             maps.micro_batch(), ranks, tp_rank));
      cells[l]->add_params(specs, seed);
    }
    if (u.kind == spec::CnnLayerKind::kUpConv) add_up_conv(add, u, l, maps);
    if (u.kind == spec::CnnLayerKind::kFc) {
      if (split_fc != nullptr && split_fc->holds(l)) {
        split_fc->add_params(l, seed, specs);
      } else {
        add_fc(add, u, l, maps.tp(), rank);
      }
    }
  }
  store_ = std::make_unique<ParamStore>(maps.backend(), specs);
  if (split_fc != nullptr) split_fc->bind(*store_);
  // Behind the split every spatial rank computes the whole classifier's gradient: one of them
  // contributes it to the replicas' sum, the others write theirs here (a place per tensor).
  if (maps.exchange().split() && maps.exchange().index() != 0) {
    int64_t total = 0;
    for (const Param& p : store_->params()) {
      if (units[static_cast<size_t>(p.layer)].split_in) continue;
      scratch_offset_[p.name] = total;
      total += p.grad.numel();
    }
    scratch_ = maps.backend().zeros({std::max<int64_t>(total, 1)});
  }
}

Tensor CnnParams::grad_of(Param& p, const Unit& u) {
  if (u.split_in || scratch_.empty()) return p.grad;
  return scratch_.rows(scratch_offset_.at(p.name), p.grad.numel()).view(p.grad.shape());
}

}  // namespace sextant::exec::cnn
