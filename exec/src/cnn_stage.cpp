// A CNN stage on CPU ranks: convolutions with batch norm and ReLU, pooling, torchvision ResNet
// v1.5 bottleneck blocks, an adaptive average pool and fc classifier layers, over the lowered
// layers this pipeline stage holds (models::lower_cnn names the layers and their ops; the trace
// uses the same names). With a spatial split (Plan::spatial) the layers before the adaptive pool
// run on this rank's block of every map: halos before each window, batch-norm sums all-reduced
// over the split ranks, the pool's partial sums all-reduced so that the classifier runs whole on
// every rank (Dryden et al., IPDPS'19). With a channel split (tp > 1) each tensor-parallel rank
// holds a block of every map's channels, and each convolution runs stationary-x, -y or -w as
// spec/channel_split.hpp chooses (Dryden et al., SC'19). Volumes (3D U-Net) run the same units
// over [B, C, D, H, W] maps with cubic windows; their depth is never split.
#include <fmt/format.h>

#include <cmath>
#include <functional>
#include <limits>
#include <map>

#include "amoeba_cell.hpp"
#include "cnn_units.hpp"
#include "sextant/exec/conv_kernels.hpp"
#include "sextant/spec/amoeba_cell.hpp"
#include "sextant/spec/channel_split.hpp"
#include "spatial_exchange.hpp"
#include "stage_model.hpp"

namespace sextant::exec {

namespace {

using models::OpId;
using models::OpName;
using spec::CnnLayerKind;
using spec::OpClass;
using spec::Phase;
using spec::Stream;

struct ConvCache {
  Tensor window, z, y;             // window input, convolution output, normalised output (pre-ReLU)
  std::vector<double> mean, rstd;  // batch statistics of maps split over ranks (on the host)
  Tensor stats;                    // those of whole maps (with the backend: batch_norm_whole)
};
struct UnitCache {
  std::vector<ConvCache> convs;
  Tensor x, pre, window;  // layer input, pre-activation (fc, residual sum), pool window input
  Tensor pooled;          // a max pool's output (its backward finds each window's maximum again)
  // A kept output (U-Net's skip), and its gradient from the concat that joined it (backward
  // reaches the concat first; the unit's own backward adds it to the gradient of its output).
  Tensor kept, kept_grad;
  AmoebaCell::Cache cell;
};

class CnnStage : public StageModel {
  using MapShape = cnn::MapShape;
  using ConvUnit = cnn::ConvUnit;
  using Unit = cnn::Unit;

 public:
  CnnStage(const spec::ModelSpec& model, Context& ctx, const StageOptions& o)
      : ctx_(ctx),
        o_(o),
        units_(cnn::units_of(model.cnn(), ctx.groups->tp_size, ctx.plan->channel_algorithms)),
        volume_(model.cnn().volumes()),
        exchange_(ctx.plan->spatial, ctx.groups->spatial_rank, ctx.groups->spatial) {
    SEXTANT_CHECK(units_.size() == ctx.lowered->layers.size(),
                  "the CNN stage has {} layers, the lowering {}", units_.size(),
                  ctx.lowered->layers.size());
    // Agreement by construction, checked: every convolution runs the lowering's algorithm.
    std::vector<spec::ChannelAlgorithm> ran;
    for (const Unit& u : units_)
      for (const ConvUnit& c : u.convs)
        if (ctx.groups->tp_size > 1 && !c.in.whole) ran.push_back(c.algorithm);
    SEXTANT_CHECK(ran == ctx.lowered->channel_algorithms,
                  "the CNN stage runs {} split convolutions, the lowering {}", ran.size(),
                  ctx.lowered->channel_algorithms.size());
    models::StageLayers sl = models::stage_layers(*ctx.plan, *ctx.lowered, ctx.groups->pp_rank);
    begin_ = static_cast<int32_t>(sl.chunk_begin.at(0));
    end_ = static_cast<int32_t>(sl.chunk_end.at(0));
    std::vector<ParamSpec> specs;
    const uint64_t seed = o.seed;
    // Values from each element's index in the whole tensor, so every layout starts alike.
    auto normal = [&](const std::string& name, int32_t layer, std::vector<int64_t> shape,
                      float std_dev, std::function<int64_t(int64_t)> global, bool replicated) {
      specs.push_back({name, layer, std::move(shape),
                       [=](int64_t i) { return std_dev * init_normal(seed, name, global(i)); },
                       true, replicated, false, false});
    };
    auto constant = [&](const std::string& name, int32_t layer, int64_t n, float value,
                        bool replicated) {
      specs.push_back(
          {name, layer, {n}, [=](int64_t) { return value; }, false, replicated, false, false});
    };
    const int64_t tp = ctx.groups->tp_size, rank = ctx.groups->tp_rank;
    auto same = [](int64_t i) { return i; };
    for (int32_t l = begin_; l < end_; ++l) {
      const Unit& u = units_[static_cast<size_t>(l)];
      for (const ConvUnit& c : u.convs) {
        // He initialisation, std = sqrt(2 / fan_in) (He et al. 2015).
        const int64_t window = taps(c.k);
        const float std_dev = std::sqrt(2.0f / static_cast<float>(c.in.c * window));
        const spec::ChannelBlock filters = spec::channel_block(c.out.c, tp, rank);
        if (tp == 1) {
          normal(c.name + ".weight", l, weight_shape(c.out.c, c.in.c, c.k), std_dev, same, false);
        } else if (c.algorithm == spec::ChannelAlgorithm::kStationaryX) {
          // Every filter's slice over this rank's input channels: [F, C/tp, k, k].
          const spec::ChannelBlock channels = spec::channel_block(c.in.c, tp, rank);
          const int64_t in_c = c.in.c;
          normal(
              c.name + ".weight", l, weight_shape(c.out.c, channels.count, c.k), std_dev,
              [=](int64_t i) {
                const int64_t f = i / (channels.count * window),
                              rest = i % (channels.count * window);
                return (f * in_c + channels.begin) * window + rest;
              },
              false);
        } else if (c.algorithm == spec::ChannelAlgorithm::kStationaryW) {
          // The slice of its filter group's F/g filters over its channel group's C/r channels
          // (spec::gathered_channel_blocks, in the order its all-gather packs them):
          // [F/g, C/r, k, k].
          const spec::ChannelFilterGrid g = spec::channel_filter_grid(tp);
          const std::vector<int64_t> blocks = spec::gathered_channel_blocks(tp, rank);
          const int64_t block = c.in.c / tp, channels = c.in.c / g.reduce_ranks;
          const int64_t first_filter = rank / g.reduce_ranks * (c.out.c / g.gather_ranks);
          const int64_t in_c = c.in.c;
          normal(
              c.name + ".weight", l, weight_shape(c.out.c / g.gather_ranks, channels, c.k), std_dev,
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
          normal(
              c.name + ".weight", l, weight_shape(filters.count, c.in.c, c.k), std_dev,
              [=](int64_t i) { return offset + i; }, false);
        }
        // Biases and batch norms follow the output's channels: this rank's filter block.
        if (c.bias) constant(c.name + ".bias", l, filters.count, 0.0f, false);
        if (c.bn) {
          constant(c.name + ".bn.weight", l, filters.count, 1.0f, false);
          constant(c.name + ".bn.bias", l, filters.count, 0.0f, false);
        }
      }
      if (u.kind == CnnLayerKind::kAmoebaCell) {
        auto cell = std::make_unique<AmoebaCell>(
            u.name, l, CellMap{u.in.c, u.in.h, u.in.w}, CellMap{u.skip.c, u.skip.h, u.skip.w},
            u.reduction_prev, u.filters, u.reduction, o.micro_batch);
        cell->add_params(specs, seed);
        cells_[l] = std::move(cell);
      }
      if (u.kind == CnnLayerKind::kUpConv) {
        // [Ci, Co, k, k] (or [.., k, k, k]), ConvTranspose2d's and 3d's layout;
        // std = sqrt(2 / (Ci k^2)) (k^3 on a volume).
        const float std_dev = std::sqrt(2.0f / static_cast<float>(u.in.c * taps(u.k)));
        normal(u.name + ".up_conv.weight", l, weight_shape(u.in.c, u.out.c, u.k), std_dev, same,
               false);
        if (u.bias) constant(u.name + ".up_conv.bias", l, u.out.c, 0.0f, false);
      }
      if (u.kind == CnnLayerKind::kFc) {
        // The classifier starts small, so that the first loss is near log(classes). Behind a
        // channel split the fc holds the rows of its rank's channels; later fcs are whole.
        const float std_dev = u.last ? 0.01f : std::sqrt(2.0f / static_cast<float>(u.in.c));
        if (u.fc_reads_split) {
          const int64_t rows = u.in.c / tp, offset = rank * rows * u.out.c;
          normal(
              u.name + ".fc.weight", l, {rows, u.out.c}, std_dev,
              [=](int64_t i) { return offset + i; }, false);
        } else {
          normal(u.name + ".fc.weight", l, {u.in.c, u.out.c}, std_dev, same, true);
        }
        if (u.bias) constant(u.name + ".fc.bias", l, u.out.c, 0.0f, true);
      }
    }
    store_ = std::make_unique<ParamStore>(*ctx.backend, specs);
    // Behind the split every spatial rank computes the whole classifier's gradient: one of them
    // contributes it to the replicas' sum, the others write theirs here (a place per tensor).
    if (exchange_.split() && exchange_.index() != 0) {
      int64_t total = 0;
      for (const Param& p : store_->params()) {
        if (units_[static_cast<size_t>(p.layer)].split_in) continue;
        scratch_offset_[p.name] = total;
        total += p.grad.numel();
      }
      scratch_ = ctx.backend->zeros({std::max<int64_t>(total, 1)});
    }
  }

  ParamStore& params() override { return *store_; }
  // A stage boundary between two cells carries the output and the skip map packed in one flat
  // tensor (the simulator's Layer::output_bytes counts both).
  std::vector<int64_t> input_shape() const override {
    const Unit& u = units_[static_cast<size_t>(begin_)];
    if (begin_ > 0 && u.reads_skip) return {numel(shape_of(u.in, false)) + numel(skip_shape(u))};
    return shape_of(u.in, u.split_in);
  }
  std::vector<int64_t> output_shape() const override {
    const Unit& u = units_[static_cast<size_t>(end_ - 1)];
    if (u.passes_skip) {
      const Unit& next = units_[static_cast<size_t>(end_)];
      return {numel(shape_of(next.in, false)) + numel(skip_shape(next))};
    }
    return shape_of(u.out, u.split_out);
  }
  void set_hooks(LayerHooks* hooks) override { hooks_ = hooks; }
  // This rank's share of its replica's loss: behind a split every spatial rank holds the whole
  // classifier's loss and the first counts it; a per-pixel head split to the loss scores each
  // rank's block, and every rank counts its share.
  double take_loss_sum() override {
    const double l = loss_;
    loss_ = 0;
    const bool shared = units_.back().split_in;
    return shared || exchange_.index() == 0 ? l : 0.0;
  }
  double grad_square_sum(int64_t begin, int64_t end) override {
    if (end <= begin) return 0.0;
    if (ctx_.groups->tp_rank == 0)
      return ctx_.backend->sum_squares(store_->grads().rows(begin, end - begin));
    // Tensors whole on every tp rank count on the first only.
    std::vector<std::pair<int64_t, int64_t>> spans;
    for (const Param& p : store_->params()) {
      const int64_t lo = std::max(begin, p.offset), hi = std::min(end, p.offset + p.grad.numel());
      if (!p.tp_replicated && lo < hi) spans.emplace_back(lo, hi - lo);
    }
    return ctx_.backend->sum_squares_spans(store_->grads(), spans);
  }

  Tensor forward(const MicroBatch& mb, const Tensor* input, int64_t /*chunk: always 0*/) override {
    std::vector<UnitCache>& caches = caches_[mb.index];
    caches.assign(static_cast<size_t>(end_ - begin_), UnitCache{});
    const Unit& first = units_[static_cast<size_t>(begin_)];
    // x: the activation; skip: the last cell's input (the next cell's second input).
    Tensor x, skip;
    if (begin_ == 0) {
      x = image_block(mb);
    } else if (first.reads_skip) {
      std::tie(x, skip) = unpack(*input, shape_of(first.in, false), skip_shape(first));
    } else {
      x = *input;
    }
    for (int32_t l = begin_; l < end_; ++l) {
      if (hooks_ != nullptr) hooks_->before_forward(l, mb.index);
      const Unit& u = units_[static_cast<size_t>(l)];
      UnitCache& cache = caches[static_cast<size_t>(l - begin_)];
      if (u.kind == CnnLayerKind::kAmoebaCell) {
        Tensor y =
            cells_.at(l)->forward(ctx_, *store_, x, u.reads_skip ? skip : x, mb.index, cache.cell);
        skip = x;
        x = y;
      } else {
        x = forward_unit(u, x, mb, cache);
        skip = Tensor();
      }
    }
    if (end_ == static_cast<int32_t>(units_.size())) return Tensor();
    return units_[static_cast<size_t>(end_ - 1)].passes_skip ? pack(x, skip) : x;
  }

  Tensor backward(const MicroBatch& mb, const Tensor* grad_output,
                  int64_t /*chunk: always 0*/) override {
    std::vector<UnitCache>& caches = caches_.at(mb.index);
    const Unit& last = units_[static_cast<size_t>(end_ - 1)];
    // d: the gradient of the activation; dskip: of the last cell's input, from the cell after it
    // (added to that input's gradient once the cell's backward gives it).
    Tensor d, dskip;
    if (grad_output != nullptr && last.passes_skip) {
      const Unit& next = units_[static_cast<size_t>(end_)];
      std::tie(d, dskip) = unpack(*grad_output, shape_of(next.in, false), skip_shape(next));
    } else if (grad_output != nullptr) {
      d = *grad_output;
    }
    for (int32_t l = end_ - 1; l >= begin_; --l) {
      if (hooks_ != nullptr) hooks_->before_backward(l, mb.index);
      const Unit& u = units_[static_cast<size_t>(l)];
      UnitCache& cache = caches[static_cast<size_t>(l - begin_)];
      if (u.kind == CnnLayerKind::kAmoebaCell) {
        auto [dprev, dprev_prev] = cells_.at(l)->backward(ctx_, *store_, d, mb.index, cache.cell);
        // The first cell of a chain read its input twice.
        if (!u.reads_skip) dprev = sum_of(dprev, dprev_prev);
        if (!dskip.empty()) dprev = sum_of(dprev, dskip);
        d = dprev;
        dskip = u.reads_skip ? dprev_prev : Tensor();
      } else {
        SEXTANT_CHECK(dskip.empty(), "{}: a skip gradient past a cell chain", u.name);
        d = backward_unit(u, d, mb, cache);
      }
      if (hooks_ != nullptr) hooks_->after_backward(l, mb.index);
    }
    caches_.erase(mb.index);
    max_.erase(mb.index);
    sum_.erase(mb.index);
    if (begin_ == 0) return Tensor();
    return units_[static_cast<size_t>(begin_)].reads_skip ? pack(d, dskip) : d;
  }

 private:
  // Elements a window of `k` covers per channel, and a weight's shape over it: k x k, or k x k x k
  // over a volume.
  int64_t taps(int64_t k) const { return volume_ ? k * k * k : k * k; }
  std::vector<int64_t> weight_shape(int64_t outer, int64_t inner, int64_t k) const {
    if (volume_) return {outer, inner, k, k, k};
    return {outer, inner, k, k};
  }
  // A map's extent as spec/spatial_split.hpp takes it (a 2D map has no depth axis), the block of
  // it this rank holds (`split`: the layers before the split ends; else the whole map), and the
  // window of k, s and p making `out` from `in`.
  spec::MapExtent extent(MapShape s) const { return {s.h, s.w, volume_ ? s.d : 0}; }
  Region held(MapShape s, bool split) const { return exchange_for(split).block(extent(s)); }
  WindowGeometry window(MapShape in, MapShape out, int64_t k, int64_t s, int64_t p) const {
    return {in.h, in.w, out.h, out.w, k, s, p, volume_ ? in.d : 0, volume_ ? out.d : 0};
  }
  WindowGeometry window(const ConvUnit& c) const { return window(c.in, c.out, c.k, c.s, c.p); }
  // A map's tensor on this rank: [B, C, H, W] or a volume's [B, C, D, H, W]; its channel block
  // behind a channel split, its block of rows, columns (and planes) in a spatial split.
  std::vector<int64_t> shape_of(MapShape s, bool split) const {
    const int64_t c = s.whole ? s.c : s.c / ctx_.groups->tp_size;
    const Region b = held(s, split);
    if (volume_) return {o_.micro_batch, c, b.planes.size(), b.rows.size(), b.cols.size()};
    return {o_.micro_batch, c, b.rows.size(), b.cols.size()};
  }
  Tensor empty(const std::vector<int64_t>& shape) const { return ctx_.backend->empty(shape); }
  static int64_t numel(const std::vector<int64_t>& shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  // The skip map a cell reads (its second input, whole: cells run unsplit).
  std::vector<int64_t> skip_shape(const Unit& u) const { return shape_of(u.skip, false); }
  // A stage boundary between cells: the activation and the skip map in one flat tensor, and back.
  Tensor pack(const Tensor& x, const Tensor& skip) const {
    Tensor out = empty({x.numel() + skip.numel()});
    Tensor head = out.rows(0, x.numel()), tail = out.rows(x.numel(), skip.numel());
    ctx_.backend->copy(x.view({x.numel()}), head);
    ctx_.backend->copy(skip.view({skip.numel()}), tail);
    return out;
  }
  std::pair<Tensor, Tensor> unpack(const Tensor& packed, const std::vector<int64_t>& x_shape,
                                   const std::vector<int64_t>& skip_shape) const {
    const int64_t n = numel(x_shape), m = numel(skip_shape);
    SEXTANT_CHECK(packed.numel() == n + m, "a packed activation of {} elements for {} + {}",
                  packed.numel(), n, m);
    Tensor x = empty(x_shape), skip = empty(skip_shape);
    Tensor xs = x.view({n}), ss = skip.view({m});
    ctx_.backend->copy(packed.view({n + m}).rows(0, n), xs);
    ctx_.backend->copy(packed.view({n + m}).rows(n, m), ss);
    return {x, skip};
  }
  Tensor sum_of(const Tensor& a, const Tensor& b) const {
    Tensor s = empty(a.shape());
    ctx_.backend->add(a, b, s);
    return s;
  }
  Tensor empty(MapShape s, bool split) const { return empty(shape_of(s, split)); }

  auto op(const OpName& name, int32_t layer, Phase phase, int64_t mb) const {
    return ctx_.recorder->scope(ctx_.op(name, layer, phase, mb));
  }
  // A collective or exchange among the split ranks, traced as the lowering's layer-group op.
  auto split_comm(const OpName& name, OpClass cls, int64_t bytes, int32_t layer, Phase phase,
                  int64_t mb) const {
    return ctx_.recorder->scope(
        ctx_.comm(name, cls, Stream::kTpComm, bytes, ctx_.groups->spatial_size, phase, layer, mb));
  }

  // This rank's block of the micro-batch's images.
  Tensor image_block(const MicroBatch& mb) const {
    const Unit& u = units_.front();
    Tensor whole = empty(u.in, false);
    ctx_.backend->from_host(mb.features, whole);
    if (!u.split_in || !exchange_.split()) return whole;
    Tensor block = empty(u.in, true);
    const Region own = held(u.in, true);
    copy_block(*ctx_.backend, whole, held(u.in, false), block, own, own);
    return block;
  }

  // The B x C maps of a map's tensor (each has its halo; a volume's are 3D).
  static int64_t maps(const Tensor& t) { return t.dim(0) * t.dim(1); }
  // The window input of a split (or padded) map, with the halo exchange traced.
  // `split`: whether the map is in blocks (the layers before the adaptive pool); behind it maps
  // are whole on every rank and only padded.
  const SpatialExchange& exchange_for(bool split) const { return split ? exchange_ : whole_; }
  Tensor window_input(const std::string& name, const WindowGeometry& g, const Tensor& x, float fill,
                      bool split, int32_t layer, Phase phase, int64_t mb) {
    const SpatialExchange& ex = exchange_for(split);
    const int64_t halo = ex.largest_halo(g);
    if (halo == 0) return ex.gather(*ctx_.backend, x, g, fill);
    auto s = split_comm(OpName(name, OpId::kUnitHalo), OpClass::kSend, halo * maps(x) * 4, layer,
                        phase, mb);
    return ex.gather(*ctx_.backend, x, g, fill);
  }
  Tensor window_gradient(const std::string& name, const WindowGeometry& g, const Tensor& dwindow,
                         MapShape in, bool split, int32_t layer, int64_t mb) {
    const SpatialExchange& ex = exchange_for(split);
    Tensor dx = empty(in, split);
    const int64_t halo = ex.largest_halo(g);
    if (halo == 0) {
      ex.scatter(*ctx_.backend, dwindow, g, dx);
      return dx;
    }
    auto s = split_comm(OpName(name, OpId::kUnitHalo), OpClass::kSend, halo * maps(dx) * 4, layer,
                        Phase::kBwd, mb);
    ex.scatter(*ctx_.backend, dwindow, g, dx);
    return dx;
  }
  // Sums over every split rank's block (fp32 on the wire, as the lowering prices them).
  void all_reduce_sums(const OpName& name, std::vector<double>& sums, int32_t layer, Phase phase,
                       int64_t mb) {
    std::vector<float> wire(sums.begin(), sums.end());
    {
      auto s = split_comm(name, OpClass::kAllReduce, static_cast<int64_t>(wire.size()) * 4, layer,
                          phase, mb);
      ctx_.groups->spatial->all_reduce(wire.data(), static_cast<int64_t>(wire.size()));
    }
    std::copy(wire.begin(), wire.end(), sums.begin());
  }
  // t += v (fp32 gradients: a rank's batch-norm share), through the backend: t may live on a GPU.
  void add_from_host(const std::vector<double>& v, Tensor& t) const {
    Tensor h = empty({static_cast<int64_t>(v.size())});
    ctx_.backend->from_host(std::vector<float>(v.begin(), v.end()), h);
    ctx_.backend->add(t, h, t);
  }
  // Elements per channel of a map's batch statistics: the whole maps of the micro-batch.
  int64_t statistics_count(MapShape s) const { return o_.micro_batch * s.voxels(); }

  // Whether a layer's maps are in blocks over several spatial ranks.
  bool in_blocks(const Unit& u) const { return u.split_in && exchange_.split(); }
  // The blocks U-Net's up-convolution and cropped concat read of their inputs on rank q
  // (spec/spatial_split.hpp).
  std::function<Region(int64_t)> up_conv_inputs(const Unit& u) const {
    const WindowGeometry g = window(u.in, u.out, u.k, u.s, 0);
    const spec::SpatialSplit grid = ctx_.plan->spatial;
    return [g, grid](int64_t q) { return spec::up_window_input_block(g, grid, q); };
  }
  std::function<Region(int64_t)> crop_inputs(MapShape kept, MapShape to) const {
    const spec::SpatialSplit grid = ctx_.plan->spatial;
    const spec::MapExtent from = extent(kept), into = extent(to);
    return [=](int64_t q) { return spec::crop_input_block(from, into, grid, q); };
  }
  // This rank's `need` block of a map `in` held in blocks, fetched from the ranks holding it
  // (traced as the lowering's exchange when any rank receives some), and the adjoint.
  Tensor fetch_block(const std::string& name, const Tensor& x, MapShape in,
                     const std::function<Region(int64_t)>& need, int32_t layer, int64_t mb) {
    const int64_t elements = spec::most_fetched_elements(need, extent(in), ctx_.plan->spatial);
    if (elements == 0) return exchange_.fetch(*ctx_.backend, x, extent(in), need, 0.0f);
    auto s = split_comm(OpName(name, OpId::kUnitHalo), OpClass::kSend, elements * maps(x) * 4,
                        layer, Phase::kFwd, mb);
    return exchange_.fetch(*ctx_.backend, x, extent(in), need, 0.0f);
  }
  void give_back_block(const std::string& name, const Tensor& dneed, MapShape in,
                       const std::function<Region(int64_t)>& need, Tensor& dx, int32_t layer,
                       int64_t mb) {
    const int64_t elements = spec::most_fetched_elements(need, extent(in), ctx_.plan->spatial);
    if (elements == 0) return exchange_.give_back(*ctx_.backend, dneed, extent(in), need, dx);
    auto s = split_comm(OpName(name, OpId::kUnitHalo), OpClass::kSend, elements * maps(dx) * 4,
                        layer, Phase::kBwd, mb);
    exchange_.give_back(*ctx_.backend, dneed, extent(in), need, dx);
  }
  // The output block an up-convolution makes from input block `in` (each input row i makes rows
  // [i s, i s + k)), and its tensor's shape.
  Region up_conv_output(const Unit& u, Region in) const {
    auto made = [&](spec::Rows r) { return spec::Rows{r.begin * u.s, (r.end - 1) * u.s + u.k}; };
    return {made(in.rows), made(in.cols), volume_ ? made(in.planes) : spec::Rows{0, 1}};
  }
  std::vector<int64_t> shape_over(int64_t channels, Region r) const {
    if (volume_) return {o_.micro_batch, channels, r.planes.size(), r.rows.size(), r.cols.size()};
    return {o_.micro_batch, channels, r.rows.size(), r.cols.size()};
  }
  // The per-pixel head's labels of this rank's block (every label of the micro-batch when the
  // head's map is whole: mb.targets holds each sample's whole map, planes, rows, columns).
  std::vector<int32_t> block_labels(const MicroBatch& mb, const Unit& u) const {
    if (!in_blocks(u)) return mb.targets;
    const Region own = held(u.out, true);
    std::vector<int32_t> out;
    out.reserve(static_cast<size_t>(o_.micro_batch * own.elements()));
    for (int64_t b = 0; b < o_.micro_batch; ++b)
      for (int64_t d = own.planes.begin; d < own.planes.end; ++d)
        for (int64_t h = own.rows.begin; h < own.rows.end; ++h)
          for (int64_t w = own.cols.begin; w < own.cols.end; ++w)
            out.push_back(
                mb.targets[static_cast<size_t>(((b * u.out.d + d) * u.out.h + h) * u.out.w + w)]);
    return out;
  }

  Param& param(const std::string& name) { return store_->get(name); }
  // Where a parameter's gradient accumulates: its own, or the scratch of a spatial rank other
  // than the first for the layers behind the split.
  Tensor grad_of(Param& p, const Unit& u) {
    if (u.split_in || scratch_.empty()) return p.grad;
    return scratch_.rows(scratch_offset_.at(p.name), p.grad.numel()).view(p.grad.shape());
  }

  bool channel_split() const { return ctx_.groups->tp_size > 1; }
  bool stationary(const ConvUnit& c, spec::ChannelAlgorithm a) const {
    return channel_split() && c.algorithm == a;
  }
  // The channels of a map held by a group's ranks, as this rank's blocks pack them for a
  // collective over the group: the block of its member 0 for every sample, then member 1's
  // (Communicator::reduce_scatter and all_gather go by rank in the group).
  void reduce_scatter_channels(const OpName& name, const Tensor& whole, Tensor& mine,
                               const GridAxis& group, int32_t layer, Phase phase, int64_t mb) {
    const int64_t n = group.size, samples = whole.dim(0), per = mine.numel() / samples;
    std::vector<float> packed(static_cast<size_t>(whole.numel()));
    for (int64_t r = 0; r < n; ++r)
      for (int64_t b = 0; b < samples; ++b)
        std::copy_n(whole.data() + (b * n + r) * per, per, packed.data() + (r * samples + b) * per);
    auto s = ctx_.recorder->scope(ctx_.comm(name, OpClass::kReduceScatter, Stream::kTpComm,
                                            whole.numel() * 4, n, phase, layer, mb));
    group.comm->reduce_scatter(packed.data(), mine.data(), mine.numel());
  }
  void all_gather_channels(const OpName& name, const Tensor& mine, Tensor& whole,
                           const GridAxis& group, int32_t layer, Phase phase, int64_t mb) {
    const int64_t n = group.size, samples = whole.dim(0), per = mine.numel() / samples;
    std::vector<float> packed(static_cast<size_t>(whole.numel()));
    {
      auto s = ctx_.recorder->scope(ctx_.comm(name, OpClass::kAllGather, Stream::kTpComm,
                                              whole.numel() * 4, n, phase, layer, mb));
      group.comm->all_gather(mine.data(), packed.data(), mine.numel());
    }
    for (int64_t r = 0; r < n; ++r)
      for (int64_t b = 0; b < samples; ++b)
        std::copy_n(packed.data() + (r * samples + b) * per, per, whole.data() + (b * n + r) * per);
  }
  // Inputs of an fc this rank holds: a block of the flattened rows behind a channel split.
  int64_t fc_rows(const Unit& u) const {
    return u.fc_reads_split ? u.in.c / ctx_.groups->tp_size : u.in.c;
  }
  static MapShape all_channels(MapShape s) {
    s.whole = true;
    return s;
  }
  // The map with `channels` of its channels on this rank (stationary-w's gathered input and
  // partial output).
  static MapShape with_channels(MapShape s, int64_t channels) {
    s.c = channels;
    s.whole = true;
    return s;
  }
  // What a convolution's channel collectives move and where (spec/channel_split.hpp): the input
  // it reads after its gather (y: every channel, w: its channel group's), the output its product
  // writes before its reduce-scatter (x: every filter, w: its filter group's), and the groups of
  // the two (the tp group, or w's gather and reduce groups).
  MapShape gathered_input(const ConvUnit& c) const {
    return stationary(c, spec::ChannelAlgorithm::kStationaryW)
               ? with_channels(c.in, c.in.c / spec::channel_filter_grid(tp()).reduce_ranks)
               : all_channels(c.in);
  }
  MapShape partial_output(const ConvUnit& c) const {
    return stationary(c, spec::ChannelAlgorithm::kStationaryW)
               ? with_channels(c.out, c.out.c / spec::channel_filter_grid(tp()).gather_ranks)
               : all_channels(c.out);
  }
  GridAxis gather_group(const ConvUnit& c) const {
    return stationary(c, spec::ChannelAlgorithm::kStationaryW) ? ctx_.groups->channel_filter[1]
                                                               : tp_group();
  }
  GridAxis reduce_group(const ConvUnit& c) const {
    return stationary(c, spec::ChannelAlgorithm::kStationaryW) ? ctx_.groups->channel_filter[0]
                                                               : tp_group();
  }
  GridAxis tp_group() const { return {ctx_.groups->tp, ctx_.groups->tp_rank, tp()}; }
  int64_t tp() const { return ctx_.groups->tp_size; }

  Tensor forward_conv(const ConvUnit& c, const Tensor& x, bool split, int32_t layer, int64_t mb,
                      ConvCache& cache) {
    Backend& be = *ctx_.backend;
    Tensor input = x;
    const bool w = stationary(c, spec::ChannelAlgorithm::kStationaryW);
    if (stationary(c, spec::ChannelAlgorithm::kStationaryY) || w) {
      input = empty(gathered_input(c), split);
      all_gather_channels(OpName(c.name, OpId::kUnitChannelAllGather), x, input, gather_group(c),
                          layer, Phase::kFwd, mb);
    }
    cache.window = window_input(c.name, window(c), input, 0.0f, split, layer, Phase::kFwd, mb);
    cache.z = empty(c.out, split);
    if (stationary(c, spec::ChannelAlgorithm::kStationaryX) || w) {
      // Partial sums of every filter (x) or of the filter group's (w) over the channels in hand,
      // reduce-scattered by filter over tp (x) or the reduce group (w).
      Tensor partial = empty(partial_output(c), split);
      {
        auto s = op(OpName(c.name, OpId::kUnitProduct), layer, Phase::kFwd, mb);
        ctx_.backend->convolution(cache.window, param(c.name + ".weight").compute, nullptr, c.s,
                                  partial);
      }
      reduce_scatter_channels(OpName(c.name, OpId::kUnitFilterReduceScatter), partial, cache.z,
                              reduce_group(c), layer, Phase::kFwd, mb);
      if (c.bias) ctx_.backend->add_channel_bias(cache.z, param(c.name + ".bias").compute);
    } else {
      auto s = op(OpName(c.name, OpId::kUnitProduct), layer, Phase::kFwd, mb);
      ctx_.backend->convolution(cache.window, param(c.name + ".weight").compute,
                                c.bias ? &param(c.name + ".bias").compute : nullptr, c.s, cache.z);
    }
    cache.y = cache.z;
    if (c.bn) {
      std::vector<double> sums;
      cache.y = empty(c.out, split);
      auto normalise = [&] {
        conv::batch_statistics(sums, statistics_count(c.out), cache.mean, cache.rstd);
        ctx_.backend->batch_norm(cache.z, param(c.name + ".bn.weight").compute,
                                 param(c.name + ".bn.bias").compute, cache.mean, cache.rstd,
                                 cache.y);
      };
      if (split && exchange_.split()) {
        // The statistics pass is left untimed here: the all-reduce sits between it and its use.
        ctx_.backend->channel_sums(cache.z, sums);
        all_reduce_sums(OpName(c.name, OpId::kUnitBatchNormAllReduce), sums, layer, Phase::kFwd,
                        mb);
        auto s = op(OpName(c.name, OpId::kUnitBatchNorm), layer, Phase::kFwd, mb);
        normalise();
      } else {
        auto s = op(OpName(c.name, OpId::kUnitBatchNorm), layer, Phase::kFwd, mb);
        cache.stats = empty({4 * cache.z.dim(1)});
        be.batch_norm_whole(cache.z, param(c.name + ".bn.weight").compute,
                            param(c.name + ".bn.bias").compute, cache.y, cache.stats);
      }
    }
    if (!c.relu) return cache.y;
    Tensor a = empty(c.out, split);
    auto s = op(OpName(c.name, OpId::kUnitRelu), layer, Phase::kFwd, mb);
    be.relu(cache.y, a);
    return a;
  }

  // Returns the input gradient (empty without `input_gradient`).
  Tensor backward_conv(const ConvUnit& c, const Tensor& dout, bool split, bool input_gradient,
                       const Unit& u, int64_t mb, ConvCache& cache) {
    Backend& be = *ctx_.backend;
    const int32_t layer = u.layer;
    Tensor d = dout;
    if (c.relu) {
      Tensor dr = empty(c.out, split);
      auto s = op(OpName(c.name, OpId::kUnitRelu), layer, Phase::kBwd, mb);
      be.relu_backward(cache.y, d, dr);
      d = dr;
    }
    if (c.bn) {
      // gamma and beta take this rank's share of their gradient (the replicas' all-reduce sums
      // the shares); the input gradient needs the whole maps' sums.
      std::vector<double> sums;
      Tensor dz = empty(c.out, split);
      auto accumulate = [&] {
        Tensor dgamma = grad_of(param(c.name + ".bn.weight"), u);
        Tensor dbeta = grad_of(param(c.name + ".bn.bias"), u);
        const auto channels = static_cast<std::ptrdiff_t>(sums.size() / 2);
        add_from_host({sums.begin(), sums.begin() + channels}, dbeta);
        add_from_host({sums.begin() + channels, sums.end()}, dgamma);
      };
      auto apply = [&] {
        ctx_.backend->batch_norm_backward(cache.z, d, param(c.name + ".bn.weight").compute,
                                          cache.mean, cache.rstd, sums, statistics_count(c.out),
                                          dz);
      };
      if (split && exchange_.split()) {
        ctx_.backend->batch_norm_backward_sums(cache.z, d, cache.mean, cache.rstd, sums);
        accumulate();
        all_reduce_sums(OpName(c.name, OpId::kUnitBatchNormAllReduce), sums, layer, Phase::kBwd,
                        mb);
        auto s = op(OpName(c.name, OpId::kUnitBatchNorm), layer, Phase::kBwd, mb);
        apply();
      } else {
        auto s = op(OpName(c.name, OpId::kUnitBatchNorm), layer, Phase::kBwd, mb);
        Tensor dgamma = grad_of(param(c.name + ".bn.weight"), u);
        Tensor dbeta = grad_of(param(c.name + ".bn.bias"), u);
        be.batch_norm_whole_backward(cache.z, d, param(c.name + ".bn.weight").compute, cache.stats,
                                     dz, dgamma, dbeta);
        cache.stats = Tensor();
      }
      d = dz;
    }
    // The image is whole on every rank: a convolution reading it needs no input gradient
    // (spec::channel_split_problem keeps it first).
    SEXTANT_CHECK(!input_gradient || !stationary(c, spec::ChannelAlgorithm::kWholeInput),
                  "{}: an input gradient of a whole map under a channel split", c.name);
    Tensor db = c.bias ? grad_of(param(c.name + ".bias"), u) : Tensor();
    const bool w = stationary(c, spec::ChannelAlgorithm::kStationaryW);
    const bool reduced = stationary(c, spec::ChannelAlgorithm::kStationaryX) || w;
    if (reduced) {
      // The gradient of every filter (x) or of the filter group's (w), for this rank's slice of
      // them.
      Tensor whole = empty(partial_output(c), split);
      all_gather_channels(OpName(c.name, OpId::kUnitFilterAllGather), d, whole, reduce_group(c),
                          layer, Phase::kBwd, mb);
      if (c.bias) ctx_.backend->channel_bias_backward(d, db);
      d = whole;
    }
    const bool bias_in_conv = c.bias && !reduced;
    Tensor dwindow;
    if (input_gradient) dwindow = empty(cache.window.shape());
    {
      auto s = op(OpName(c.name, OpId::kUnitProduct), layer, Phase::kBwd, mb);
      Tensor dw = grad_of(param(c.name + ".weight"), u);
      ctx_.backend->convolution_backward(cache.window, param(c.name + ".weight").compute, d, c.s,
                                         input_gradient ? &dwindow : nullptr, dw,
                                         bias_in_conv ? &db : nullptr);
    }
    cache.window = Tensor();
    if (!input_gradient) return Tensor();
    if (!stationary(c, spec::ChannelAlgorithm::kStationaryY) && !w)
      return window_gradient(c.name, window(c), dwindow, c.in, split, layer, mb);
    // This rank's filters' share of the gradient of every input channel (y) or of its channel
    // group's (w), reduce-scattered by channel over tp (y) or the gather group (w).
    Tensor whole = window_gradient(c.name, window(c), dwindow, gathered_input(c), split, layer, mb);
    Tensor dx = empty(c.in, split);
    reduce_scatter_channels(OpName(c.name, OpId::kUnitChannelReduceScatter), whole, dx,
                            gather_group(c), layer, Phase::kBwd, mb);
    return dx;
  }

  // A unit's forward; a kept output is also held for its concat.
  Tensor forward_unit(const Unit& u, const Tensor& x, const MicroBatch& mb, UnitCache& cache) {
    Tensor y = forward_unit_pass(u, x, mb, cache);
    if (u.keep) cache.kept = y;
    return y;
  }
  // A unit's backward; a kept output's gradient is the sum of its two uses'.
  Tensor backward_unit(const Unit& u, const Tensor& dout, const MicroBatch& mb, UnitCache& cache) {
    if (!u.keep) return backward_unit_pass(u, dout, mb, cache);
    SEXTANT_CHECK(cache.kept_grad.numel() == dout.numel(), "{}: no gradient from its concat",
                  u.name);
    Tensor sum = empty(dout.shape());
    ctx_.backend->add(dout, cache.kept_grad, sum);
    cache.kept = cache.kept_grad = Tensor();
    return backward_unit_pass(u, sum, mb, cache);
  }
  // The cache of unit `layer` for micro-batch `mb` (a concat reaches its kept map's).
  UnitCache& cache_of(int32_t layer, int64_t mb) {
    return caches_.at(mb).at(static_cast<size_t>(layer - begin_));
  }

  Tensor forward_unit_pass(const Unit& u, const Tensor& x, const MicroBatch& mb, UnitCache& cache) {
    Backend& be = *ctx_.backend;
    const int64_t m = mb.index;
    const bool split = u.split_in;
    switch (u.kind) {
      case CnnLayerKind::kAmoebaCell:
        throw std::logic_error("the CNN stage runs no AmoebaNet cell");
      case CnnLayerKind::kUpConv: {
        const Tensor& w = param(u.name + ".up_conv.weight").compute;
        Tensor y = empty(u.out, split);
        if (!in_blocks(u)) {
          cache.x = x;
          auto s = op(OpName(u.name + ".up_conv", OpId::kUnitProduct), u.layer, Phase::kFwd, m);
          ctx_.backend->transposed_convolution(x, w, u.s, y);
        } else {
          // The input rows and columns that spread into this rank's output block, some from
          // other ranks; what they make, cut to the block.
          const auto need = up_conv_inputs(u);
          cache.x = fetch_block(u.name + ".up_conv", x, u.in, need, u.layer, m);
          const Region made = up_conv_output(u, need(exchange_.index()));
          const Region own = held(u.out, true);
          Tensor all = empty(shape_over(u.out.c, made));
          auto s = op(OpName(u.name + ".up_conv", OpId::kUnitProduct), u.layer, Phase::kFwd, m);
          ctx_.backend->transposed_convolution(cache.x, w, u.s, all);
          copy_block(*ctx_.backend, all, made, y, own, own);
        }
        if (u.bias) ctx_.backend->add_channel_bias(y, param(u.name + ".up_conv.bias").compute);
        return y;
      }
      case CnnLayerKind::kConcat: {
        const Tensor& kept = cache_of(u.joins, m).kept;
        Tensor y = empty(u.out, split);
        // In blocks: the kept map's crop at this rank's block, some from other ranks (a crop of
        // the block's own extent: offset 0).
        const Tensor crop =
            in_blocks(u) ? fetch_block(u.name, kept, units_[static_cast<size_t>(u.joins)].out,
                                       crop_inputs(units_[static_cast<size_t>(u.joins)].out, u.in),
                                       u.layer, m)
                         : kept;
        auto s = op(OpName(u.name, OpId::kUnitConcat), u.layer, Phase::kFwd, m);
        ctx_.backend->crop_concat(crop, x, y);
        return y;
      }
      case CnnLayerKind::kConv: {
        cache.convs.resize(1);
        Tensor y = forward_conv(u.convs[0], x, split, u.layer, m, cache.convs[0]);
        if (!u.last) return y;
        // A per-pixel classifier (segmentation): every pixel's softmax against its label.
        auto s = op(OpId::kLoss, u.layer, Phase::kFwd, m);
        loss_ += ctx_.backend->pixel_cross_entropy(y, block_labels(mb, u), 1.0f, nullptr,
                                                   u.out.voxels());
        cache.pre = y;  // the logits
        return Tensor();
      }
      case CnnLayerKind::kMaxPool:
      case CnnLayerKind::kAvgPool: {
        const bool max = u.kind == CnnLayerKind::kMaxPool;
        const WindowGeometry g = window(u.in, u.out, u.k, u.s, u.p);
        cache.window = window_input(u.name + ".pool", g, x,
                                    max ? -std::numeric_limits<float>::infinity() : 0.0f, split,
                                    u.layer, Phase::kFwd, m);
        Tensor y = empty(u.out, split);
        auto s = op(OpName(u.name, OpId::kUnitPool), u.layer, Phase::kFwd, m);
        if (max) {
          be.max_pool(cache.window, u.k, u.s, y);
          cache.pooled = y;
        } else {
          ctx_.backend->avg_pool(cache.window, u.k, u.s, y);
        }
        return y;
      }
      case CnnLayerKind::kAdaptiveAvgPool: {
        const Region own = held(u.in, split);
        Tensor y = empty(u.out, false);
        {
          auto s = op(OpName(u.name, OpId::kUnitPool), u.layer, Phase::kFwd, m);
          ctx_.backend->adaptive_avg_pool(x, own, extent(u.in), y);
        }
        if (split && exchange_.split()) {
          auto s = split_comm(OpName(u.name, OpId::kUnitPoolAllReduce), OpClass::kAllReduce,
                              y.numel() * 4, u.layer, Phase::kFwd, m);
          ctx_.groups->spatial->all_reduce(y.data(), y.numel());
        }
        return y;
      }
      case CnnLayerKind::kFc: {
        Tensor flat = x.view({o_.micro_batch, fc_rows(u)});
        cache.x = flat;
        Tensor y = empty({o_.micro_batch, u.out.c});
        // Behind a channel split: this rank's rows' partial product, all-reduced; the bias is
        // added once, by tp rank 0.
        const bool partial = u.fc_reads_split;
        const bool add_bias = u.bias && (!partial || ctx_.groups->tp_rank == 0);
        {
          auto s = op(OpName(u.name, OpId::kUnitFc), u.layer, Phase::kFwd, m);
          be.matmul(flat, param(u.name + ".fc.weight").compute,
                    add_bias ? &param(u.name + ".fc.bias").compute : nullptr, y);
        }
        if (partial) {
          auto s = ctx_.recorder->scope(ctx_.comm(
              OpName(u.name, OpId::kUnitFcAllReduce), OpClass::kAllReduce, Stream::kTpComm,
              y.numel() * 4, ctx_.groups->tp_size, Phase::kFwd, u.layer, m));
          ctx_.groups->tp->all_reduce(y.data(), y.numel());
        }
        cache.pre = y;
        if (u.relu) {
          Tensor a = empty({o_.micro_batch, u.out.c});
          auto s = op(OpName(u.name, OpId::kUnitRelu), u.layer, Phase::kFwd, m);
          be.relu(y, a);
          y = a;
        }
        if (u.last) {
          auto s = op(OpId::kLoss, u.layer, Phase::kFwd, m);
          std::vector<float> target;
          be.softmax_stats(y, mb.targets, 0, u.out.c, max_[m], sum_[m], target);
          for (int64_t i = 0; i < o_.micro_batch; ++i) {
            const size_t k = static_cast<size_t>(i);
            loss_ += std::log(static_cast<double>(sum_[m][k])) + max_[m][k] - target[k];
          }
          cache.window = y;  // the logits
        }
        return y.view(shape_of(u.out, false));
      }
      case CnnLayerKind::kBottleneck: {
        cache.convs.resize(u.convs.size());
        Tensor a = x;
        for (size_t i = 0; i < 3; ++i)
          a = forward_conv(u.convs[i], a, split, u.layer, m, cache.convs[i]);
        const Tensor shortcut =
            u.downsample ? forward_conv(u.convs[3], x, split, u.layer, m, cache.convs[3]) : x;
        cache.pre = empty(u.out, split);
        Tensor y = empty(u.out, split);
        auto s = op(OpName(u.name, OpId::kUnitResidual), u.layer, Phase::kFwd, m);
        be.add(a, shortcut, cache.pre);
        be.relu(cache.pre, y);
        return y;
      }
    }
    return Tensor();
  }

  Tensor backward_unit_pass(const Unit& u, const Tensor& dout, const MicroBatch& mb,
                            UnitCache& cache) {
    Backend& be = *ctx_.backend;
    const int64_t m = mb.index;
    const bool split = u.split_in;
    const bool input_gradient = u.layer > 0;  // the image needs none
    switch (u.kind) {
      case CnnLayerKind::kAmoebaCell:
        throw std::logic_error("the CNN stage runs no AmoebaNet cell");
      case CnnLayerKind::kUpConv: {
        const Tensor& w = param(u.name + ".up_conv.weight").compute;
        Tensor dw = grad_of(param(u.name + ".up_conv.weight"), u);
        if (u.bias) {
          Tensor db = grad_of(param(u.name + ".up_conv.bias"), u);
          ctx_.backend->channel_bias_backward(dout, db);
        }
        if (!in_blocks(u)) {
          Tensor dx = empty(u.in, false);
          auto s = op(OpName(u.name + ".up_conv", OpId::kUnitProduct), u.layer, Phase::kBwd, m);
          ctx_.backend->transposed_convolution_backward(cache.x, w, dout, u.s,
                                                        input_gradient ? &dx : nullptr, dw);
          return input_gradient ? dx : Tensor();
        }
        // The block's gradient within what the fetched input made (the rest is other ranks'),
        // and the fetched input's gradient back to the ranks holding it.
        const auto need = up_conv_inputs(u);
        const Region made = up_conv_output(u, need(exchange_.index()));
        const Region own = held(u.out, true);
        Tensor dall = empty(shape_over(u.out.c, made));
        be.fill(dall, 0.0f);
        copy_block(*ctx_.backend, dout, own, dall, made, own);
        Tensor dfetched = empty(cache.x.shape());
        {
          auto s = op(OpName(u.name + ".up_conv", OpId::kUnitProduct), u.layer, Phase::kBwd, m);
          ctx_.backend->transposed_convolution_backward(cache.x, w, dall, u.s,
                                                        input_gradient ? &dfetched : nullptr, dw);
        }
        if (!input_gradient) return Tensor();
        Tensor dx = empty(u.in, split);
        give_back_block(u.name + ".up_conv", dfetched, u.in, need, dx, u.layer, m);
        return dx;
      }
      case CnnLayerKind::kConcat: {
        // The kept map's share goes to its unit (added there to its other use's), the rest on.
        UnitCache& kept = cache_of(u.joins, m);
        const MapShape kept_map = units_[static_cast<size_t>(u.joins)].out;
        Tensor dx = empty(u.in, split);
        // In blocks: the crop's gradient is of this rank's block, given back to the ranks
        // holding the kept map's rows and columns.
        Tensor dcrop = in_blocks(u) ? empty(shape_of(with_channels(u.in, kept_map.c), split))
                                    : empty(kept.kept.shape());
        be.fill(dcrop, 0.0f);
        {
          auto s = op(OpName(u.name, OpId::kUnitConcat), u.layer, Phase::kBwd, m);
          ctx_.backend->crop_concat_backward(dout, dcrop, dx);
        }
        if (!in_blocks(u)) {
          kept.kept_grad = dcrop;
        } else {
          kept.kept_grad = empty(kept.kept.shape());
          give_back_block(u.name, dcrop, kept_map, crop_inputs(kept_map, u.in), kept.kept_grad,
                          u.layer, m);
        }
        return dx;
      }
      case CnnLayerKind::kConv: {
        if (!u.last)
          return backward_conv(u.convs[0], dout, split, input_gradient, u, m, cache.convs[0]);
        Tensor d = empty(u.out, split);
        {
          auto s = op(OpId::kLoss, u.layer, Phase::kBwd, m);
          ctx_.backend->pixel_cross_entropy(cache.pre, block_labels(mb, u),
                                            1.0f / static_cast<float>(ctx_.plan->global_batch), &d,
                                            u.out.voxels());
        }
        return backward_conv(u.convs[0], d, split, input_gradient, u, m, cache.convs[0]);
      }
      case CnnLayerKind::kMaxPool:
      case CnnLayerKind::kAvgPool: {
        const WindowGeometry g = window(u.in, u.out, u.k, u.s, u.p);
        Tensor dwindow = empty(cache.window.shape());
        {
          auto s = op(OpName(u.name, OpId::kUnitPool), u.layer, Phase::kBwd, m);
          if (u.kind == CnnLayerKind::kMaxPool) {
            be.max_pool_backward(cache.window, cache.pooled, dout, u.k, u.s, dwindow);
            cache.pooled = Tensor();
          } else {
            ctx_.backend->avg_pool_backward(dout, u.k, u.s, dwindow);
          }
        }
        if (!input_gradient) return Tensor();
        return window_gradient(u.name + ".pool", g, dwindow, u.in, split, u.layer, m);
      }
      case CnnLayerKind::kAdaptiveAvgPool: {
        const Region own = held(u.in, split);
        Tensor dx = empty(u.in, split);
        auto s = op(OpName(u.name, OpId::kUnitPool), u.layer, Phase::kBwd, m);
        ctx_.backend->adaptive_avg_pool_backward(dout.view(shape_of(u.out, false)), own,
                                                 extent(u.in), dx);
        return dx;
      }
      case CnnLayerKind::kFc: {
        Tensor d;
        if (u.last) {
          d = empty({o_.micro_batch, u.out.c});
          auto s = op(OpId::kLoss, u.layer, Phase::kBwd, m);
          be.cross_entropy_backward(cache.window, mb.targets, 0, u.out.c, max_[m], sum_[m],
                                    1.0f / static_cast<float>(ctx_.plan->global_batch), d);
        } else {
          d = dout.view({o_.micro_batch, u.out.c});
        }
        if (u.relu) {
          Tensor dr = empty({o_.micro_batch, u.out.c});
          auto s = op(OpName(u.name, OpId::kUnitRelu), u.layer, Phase::kBwd, m);
          be.relu_backward(cache.pre, d, dr);
          d = dr;
        }
        Tensor dx = empty({o_.micro_batch, fc_rows(u)});
        auto s = op(OpName(u.name, OpId::kUnitFc), u.layer, Phase::kBwd, m);
        Tensor dw = grad_of(param(u.name + ".fc.weight"), u);
        Tensor db = u.bias ? grad_of(param(u.name + ".fc.bias"), u) : Tensor();
        be.matmul_backward(cache.x, param(u.name + ".fc.weight").compute, d,
                           input_gradient ? &dx : nullptr, dw, u.bias ? &db : nullptr);
        return dx.view(shape_of(u.layer > 0 ? units_[static_cast<size_t>(u.layer - 1)].out : u.in,
                                u.layer > 0 && units_[static_cast<size_t>(u.layer - 1)].split_out));
      }
      case CnnLayerKind::kBottleneck: {
        Tensor dsum = empty(u.out, split);
        {
          auto s = op(OpName(u.name, OpId::kUnitResidual), u.layer, Phase::kBwd, m);
          be.relu_backward(cache.pre, dout, dsum);
        }
        // conv1 and the shortcut read the block's input (no gradient for the image).
        Tensor d = dsum;
        for (size_t i = 3; i-- > 0;)
          d = backward_conv(u.convs[i], d, split, i > 0 || input_gradient, u, m, cache.convs[i]);
        const Tensor dshort = u.downsample ? backward_conv(u.convs[3], dsum, split, input_gradient,
                                                           u, m, cache.convs[3])
                                           : dsum;
        if (!input_gradient) return Tensor();
        be.add(d, dshort, d);
        return d;
      }
    }
    return Tensor();
  }

  Context& ctx_;
  StageOptions o_;
  std::vector<Unit> units_;
  bool volume_;  // maps are [B, C, D, H, W]
  SpatialExchange exchange_;
  int32_t begin_ = 0, end_ = 0;
  std::unique_ptr<ParamStore> store_;
  SpatialExchange whole_{spec::SpatialSplit{}, 0, nullptr};  // maps behind the split
  Tensor scratch_;
  std::map<std::string, int64_t> scratch_offset_;
  std::map<int32_t, std::unique_ptr<AmoebaCell>> cells_;  // this stage's cells, by layer
  std::map<int64_t, std::vector<UnitCache>> caches_;
  std::map<int64_t, std::vector<float>> max_, sum_;
  LayerHooks* hooks_ = nullptr;
  double loss_ = 0;
};

}  // namespace

std::unique_ptr<StageModel> make_cnn_stage(const spec::ModelSpec& model, Context& ctx,
                                           const StageOptions& options) {
  return std::make_unique<CnnStage>(model, ctx, options);
}

}  // namespace sextant::exec
