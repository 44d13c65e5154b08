// A CNN stage on CPU ranks: convolutions with batch norm and ReLU, pooling, torchvision ResNet
// v1.5 bottleneck blocks, an adaptive average pool and fc classifier layers, over the lowered
// layers this pipeline stage holds (models::lower_cnn names the layers and their ops; the trace
// uses the same names). With a spatial split (Plan::spatial) the layers before the adaptive pool
// run on this rank's block of every map: halos before each window, batch-norm sums all-reduced
// over the split ranks, the pool's partial sums all-reduced so that the classifier runs whole on
// every rank (Dryden et al., IPDPS'19). With a channel split (tp > 1) each tensor-parallel rank
// holds a block of every map's channels, and each convolution runs stationary-x, -y or -w as
// spec/channel_split.hpp chooses (Dryden et al., SC'19). Under per-op splits the fc layers run as
// split_fc_chain.hpp says. Volumes (3D U-Net) run the same units
// over [B, C, D, H, W] maps with cubic windows; their depth is never split.
//
// The stage runs its units in order: AmoebaNet's cells through amoeba_cell.hpp, the rest through
// cnn_layers.hpp (the pass of each kind), on the maps cnn_maps.hpp describes.
#include <map>
#include <memory>
#include <utility>

#include "cnn_layers.hpp"
#include "cnn_maps.hpp"
#include "cnn_units.hpp"
#include "train/stage_model.hpp"
#include "unit_tape.hpp"

namespace sextant::exec {

namespace {

using cnn::CnnLayers;
using cnn::CnnMaps;
using cnn::CnnParams;
using cnn::StageCaches;
using cnn::Unit;
using spec::CnnLayerKind;

// Checks that the units are the lowering's layers and every split convolution runs the
// lowering's algorithm (agreement by construction, checked); returns the layers [first, second)
// this rank's pipeline stage holds.
std::pair<int32_t, int32_t> layers_of_stage(const std::vector<Unit>& units, const Context& ctx) {
  SEXTANT_CHECK(units.size() == ctx.lowered->layers.size(),
                "the CNN stage has {} layers, the lowering {}", units.size(),
                ctx.lowered->layers.size());
  std::vector<spec::ChannelAlgorithm> ran;
  for (const Unit& u : units)
    for (const cnn::ConvUnit& c : u.convs)
      if (ctx.groups->tp_size > 1 && !c.in.whole) ran.push_back(c.algorithm);
  SEXTANT_CHECK(ran == ctx.lowered->channel_algorithms,
                "the CNN stage runs {} split convolutions, the lowering {}", ran.size(),
                ctx.lowered->channel_algorithms.size());
  const models::StageLayers sl = models::stage_layers(*ctx.plan, *ctx.lowered, ctx.groups->pp_rank);
  return {static_cast<int32_t>(sl.chunk_begin.at(0)), static_cast<int32_t>(sl.chunk_end.at(0))};
}

class CnnStage : public StageModel {
 public:
  CnnStage(const spec::ModelSpec& model, Context& ctx, const StageOptions& o)
      : ctx_(ctx),
        units_(cnn::units_of(model.cnn(), spec::channel_split_ranks(*ctx.plan),
                             ctx.plan->channel_algorithms)),
        maps_(ctx, o, model.cnn().volumes()),
        range_(layers_of_stage(units_, ctx)),
        split_fc_(ctx.plan->per_op.empty()
                      ? nullptr
                      : std::make_unique<SplitFcChain>(ctx, cnn_fc_chain_layers(units_),
                                                       maps_.micro_batch())),
        params_(units_, range_.first, range_.second, maps_, o.seed, cells_, split_fc_.get()),
        layers_(maps_, params_, units_, split_fc_.get()) {}

  ParamStore& params() override { return params_.store(); }
  // A stage boundary between two cells carries the output and the skip map packed in one flat
  // tensor (the simulator's Layer::output_bytes counts both).
  std::vector<int64_t> input_shape() const override {
    const Unit& u = unit(begin());
    if (begin() > 0 && u.reads_skip)
      return {cnn::numel(maps_.shape_of(u.in, false)) + cnn::numel(skip_shape(u))};
    return maps_.shape_of(u.in, u.split_in);
  }
  std::vector<int64_t> output_shape() const override {
    const Unit& u = unit(end() - 1);
    if (u.passes_skip) {
      const Unit& next = unit(end());
      return {cnn::numel(maps_.shape_of(next.in, false)) + cnn::numel(skip_shape(next))};
    }
    return maps_.shape_of(u.out, u.split_out);
  }
  void set_hooks(LayerHooks* hooks) override { hooks_ = hooks; }
  // This rank's share of its replica's loss: behind a split every spatial rank holds the whole
  // classifier's loss and the first counts it; a per-pixel head split to the loss scores each
  // rank's block, and every rank counts its share.
  double take_loss_sum() override {
    const double l = layers_.take_loss();
    const bool shared = units_.back().split_in;
    return shared || maps_.exchange().index() == 0 ? l : 0.0;
  }
  double grad_square_sum(int64_t begin, int64_t end) override;
  Tensor forward(const MicroBatch& mb, const Tensor* input, int64_t chunk) override;
  Tensor backward(const MicroBatch& mb, const Tensor* grad_output, int64_t chunk) override;

 private:
  int32_t begin() const { return range_.first; }
  int32_t end() const { return range_.second; }
  const Unit& unit(int32_t layer) const { return units_[static_cast<size_t>(layer)]; }
  // The skip map a cell reads (its second input, whole: cells run unsplit).
  std::vector<int64_t> skip_shape(const Unit& u) const { return maps_.shape_of(u.skip, false); }
  // A stage boundary between cells: the activation and the skip map in one flat tensor, and back.
  Tensor pack(const Tensor& x, const Tensor& skip) const;
  std::pair<Tensor, Tensor> unpack(const Tensor& packed, const Unit& next) const;

  Context& ctx_;
  std::vector<Unit> units_;
  CnnMaps maps_;
  std::pair<int32_t, int32_t> range_;                   // this stage's layers [first, second)
  std::map<int32_t, std::unique_ptr<UnitTape>> cells_;  // this stage's cells and modules
  std::unique_ptr<SplitFcChain> split_fc_;              // the fc layers under per-op splits
  CnnParams params_;
  CnnLayers layers_;
  std::map<int64_t, StageCaches> caches_;
  LayerHooks* hooks_ = nullptr;
};

double CnnStage::grad_square_sum(int64_t begin, int64_t end) {
  if (end <= begin) return 0.0;
  ParamStore& store = params_.store();
  if (ctx_.groups->tp_rank == 0)
    return ctx_.backend->sum_squares(store.grads().rows(begin, end - begin));
  // Tensors whole on every tp rank count on the first only.
  std::vector<std::pair<int64_t, int64_t>> spans;
  for (const Param& p : store.params()) {
    const int64_t lo = std::max(begin, p.offset), hi = std::min(end, p.offset + p.grad.numel());
    if (!p.tp_replicated && lo < hi) spans.emplace_back(lo, hi - lo);
  }
  return ctx_.backend->sum_squares_spans(store.grads(), spans);
}

Tensor CnnStage::forward(const MicroBatch& mb, const Tensor* input, int64_t /*chunk: always 0*/) {
  StageCaches& caches = caches_[mb.index];
  caches.begin = begin();
  caches.units.assign(static_cast<size_t>(end() - begin()), cnn::UnitCache{});
  const Unit& first = unit(begin());
  // x: the activation; skip: the last cell's input (the next cell's second input).
  Tensor x, skip;
  if (begin() == 0) {
    x = maps_.image_block(mb, first);
  } else if (first.reads_skip) {
    std::tie(x, skip) = unpack(*input, first);
  } else {
    x = *input;
  }
  for (int32_t l = begin(); l < end(); ++l) {
    if (hooks_ != nullptr) hooks_->before_forward(l, mb.index);
    const Unit& u = unit(l);
    if (u.kind == CnnLayerKind::kAmoebaCell) {
      Tensor y = cells_.at(l)->forward(ctx_, params_.store(), {x, u.reads_skip ? skip : x},
                                       mb.index, caches.of(l).cell);
      skip = x;
      x = y;
    } else if (u.kind == CnnLayerKind::kInception) {
      x = cells_.at(l)->forward(ctx_, params_.store(), {x}, mb.index, caches.of(l).cell);
      skip = Tensor();
    } else {
      x = layers_.forward(u, x, mb, caches);
      skip = Tensor();
    }
  }
  if (end() == static_cast<int32_t>(units_.size())) return Tensor();
  return unit(end() - 1).passes_skip ? pack(x, skip) : x;
}

Tensor CnnStage::backward(const MicroBatch& mb, const Tensor* grad_output,
                          int64_t /*chunk: always 0*/) {
  StageCaches& caches = caches_.at(mb.index);
  // d: the gradient of the activation; dskip: of the last cell's input, from the cell after it
  // (added to that input's gradient once the cell's backward gives it).
  Tensor d, dskip;
  if (grad_output != nullptr && unit(end() - 1).passes_skip) {
    std::tie(d, dskip) = unpack(*grad_output, unit(end()));
  } else if (grad_output != nullptr) {
    d = *grad_output;
  }
  for (int32_t l = end() - 1; l >= begin(); --l) {
    if (hooks_ != nullptr) hooks_->before_backward(l, mb.index);
    const Unit& u = unit(l);
    if (u.kind == CnnLayerKind::kAmoebaCell) {
      const std::vector<Tensor> dinputs =
          cells_.at(l)->backward(ctx_, params_.store(), d, mb.index, caches.of(l).cell);
      Tensor dprev = dinputs[0];
      const Tensor& dprev_prev = dinputs[1];
      // The first cell of a chain read its input twice.
      if (!u.reads_skip) dprev = maps_.sum_of(dprev, dprev_prev);
      if (!dskip.empty()) dprev = maps_.sum_of(dprev, dskip);
      d = dprev;
      dskip = u.reads_skip ? dprev_prev : Tensor();
    } else {
      SEXTANT_CHECK(dskip.empty(), "{}: a skip gradient past a cell chain", u.name);
      d = u.kind == CnnLayerKind::kInception
              ? cells_.at(l)->backward(ctx_, params_.store(), d, mb.index, caches.of(l).cell)[0]
              : layers_.backward(u, d, mb, caches);
    }
    if (hooks_ != nullptr) hooks_->after_backward(l, mb.index);
  }
  caches_.erase(mb.index);
  layers_.forget(mb.index);
  if (begin() == 0) return Tensor();
  return unit(begin()).reads_skip ? pack(d, dskip) : d;
}

Tensor CnnStage::pack(const Tensor& x, const Tensor& skip) const {
  Tensor out = maps_.empty({x.numel() + skip.numel()});
  Tensor head = out.rows(0, x.numel()), tail = out.rows(x.numel(), skip.numel());
  ctx_.backend->copy(x.view({x.numel()}), head);
  ctx_.backend->copy(skip.view({skip.numel()}), tail);
  return out;
}

// The activation and skip map `next` reads, from the flat tensor a stage boundary carries.
std::pair<Tensor, Tensor> CnnStage::unpack(const Tensor& packed, const Unit& next) const {
  const std::vector<int64_t> x_shape = maps_.shape_of(next.in, false), s_shape = skip_shape(next);
  const int64_t n = cnn::numel(x_shape), m = cnn::numel(s_shape);
  SEXTANT_CHECK(packed.numel() == n + m, "a packed activation of {} elements for {} + {}",
                packed.numel(), n, m);
  Tensor x = maps_.empty(x_shape), skip = maps_.empty(s_shape);
  Tensor xs = x.view({n}), ss = skip.view({m});
  ctx_.backend->copy(packed.view({n + m}).rows(0, n), xs);
  ctx_.backend->copy(packed.view({n + m}).rows(n, m), ss);
  return {x, skip};
}

}  // namespace

std::unique_ptr<StageModel> make_cnn_stage(const spec::ModelSpec& model, Context& ctx,
                                           const StageOptions& options) {
  return std::make_unique<CnnStage>(model, ctx, options);
}

}  // namespace sextant::exec
