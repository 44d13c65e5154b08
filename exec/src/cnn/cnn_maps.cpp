#include "cnn_maps.hpp"

#include <algorithm>

#include "sextant/spec/channel_split.hpp"

namespace sextant::exec::cnn {

using models::OpId;
using models::OpName;
using spec::OpClass;
using spec::Phase;
using spec::Stream;

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

CnnMaps::CnnMaps(Context& ctx, const StageOptions& options, bool volume)
    : ctx_(ctx),
      micro_batch_(options.micro_batch),
      volume_(volume),
      exchange_(ctx.plan->spatial, ctx.groups->spatial_rank, ctx.groups->spatial) {}

std::vector<int64_t> CnnMaps::weight_shape(int64_t outer, int64_t inner, int64_t k) const {
  if (volume_) return {outer, inner, k, k, k};
  return {outer, inner, k, k};
}

WindowGeometry CnnMaps::window(MapShape in, MapShape out, int64_t k, int64_t s, int64_t p) const {
  return {in.h, in.w, out.h, out.w, k, s, p, volume_ ? in.d : 0, volume_ ? out.d : 0};
}

std::vector<int64_t> CnnMaps::shape_of(MapShape s, bool split) const {
  const int64_t c = s.whole ? s.c : s.c / tp();
  return shape_over(c, held(s, split));
}

std::vector<int64_t> CnnMaps::shape_over(int64_t channels, Region r) const {
  if (volume_) return {micro_batch_, channels, r.planes.size(), r.rows.size(), r.cols.size()};
  return {micro_batch_, channels, r.rows.size(), r.cols.size()};
}

Tensor CnnMaps::sum_of(const Tensor& a, const Tensor& b) const {
  Tensor s = empty(a.shape());
  ctx_.backend->add(a, b, s);
  return s;
}

void CnnMaps::add_from_host(const std::vector<double>& v, Tensor& t) const {
  Tensor h = empty({static_cast<int64_t>(v.size())});
  ctx_.backend->from_host(std::vector<float>(v.begin(), v.end()), h);
  ctx_.backend->add(t, h, t);
}

Recorder::Scope CnnMaps::split_comm(const OpName& name, OpClass cls, int64_t bytes, int32_t layer,
                                    Phase phase, int64_t mb) const {
  return ctx_.recorder->scope(
      ctx_.comm(name, cls, Stream::kTpComm, bytes, ctx_.groups->spatial_size, phase, layer, mb));
}

Tensor CnnMaps::image_block(const MicroBatch& mb, const Unit& first) const {
  Tensor whole = empty(first.in, false);
  ctx_.backend->from_host(mb.features, whole);
  if (!first.split_in || !exchange_.split()) return whole;
  Tensor block = empty(first.in, true);
  const Region own = held(first.in, true);
  copy_block(*ctx_.backend, whole, held(first.in, false), block, own, own);
  return block;
}

std::vector<int32_t> CnnMaps::block_labels(const MicroBatch& mb, const Unit& u) const {
  if (!in_blocks(u)) return mb.targets;
  const Region own = held(u.out, true);
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(micro_batch_ * own.elements()));
  for (int64_t b = 0; b < micro_batch_; ++b)
    for (int64_t d = own.planes.begin; d < own.planes.end; ++d)
      for (int64_t h = own.rows.begin; h < own.rows.end; ++h)
        for (int64_t w = own.cols.begin; w < own.cols.end; ++w)
          out.push_back(
              mb.targets[static_cast<size_t>(((b * u.out.d + d) * u.out.h + h) * u.out.w + w)]);
  return out;
}

namespace {
// The B x C maps of a map's tensor (each has its halo; a volume's are 3D).
int64_t maps(const Tensor& t) {
  return t.dim(0) * t.dim(1);
}
}  // namespace

Tensor CnnMaps::window_input(const std::string& name, const WindowGeometry& g, const Tensor& x,
                             float fill, bool split, int32_t layer, Phase phase, int64_t mb) {
  const SpatialExchange& ex = exchange_for(split);
  const int64_t halo = ex.largest_halo(g);
  if (halo == 0) return ex.gather(*ctx_.backend, x, g, fill);
  auto s = split_comm(OpName(name, OpId::kUnitHalo), OpClass::kSend, halo * maps(x) * 4, layer,
                      phase, mb);
  return ex.gather(*ctx_.backend, x, g, fill);
}

Tensor CnnMaps::window_gradient(const std::string& name, const WindowGeometry& g,
                                const Tensor& dwindow, MapShape in, bool split, int32_t layer,
                                int64_t mb) {
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

void CnnMaps::all_reduce_sums(const OpName& name, std::vector<double>& sums, int32_t layer,
                              Phase phase, int64_t mb) {
  std::vector<float> wire(sums.begin(), sums.end());
  {
    auto s = split_comm(name, OpClass::kAllReduce, static_cast<int64_t>(wire.size()) * 4, layer,
                        phase, mb);
    ctx_.groups->spatial->all_reduce(wire.data(), static_cast<int64_t>(wire.size()));
  }
  std::copy(wire.begin(), wire.end(), sums.begin());
}

void CnnMaps::all_reduce_pooled(const OpName& name, Tensor& pooled, int32_t layer, int64_t mb) {
  auto s = split_comm(name, OpClass::kAllReduce, pooled.numel() * 4, layer, Phase::kFwd, mb);
  ctx_.groups->spatial->all_reduce(pooled.data(), pooled.numel());
}

std::function<Region(int64_t)> CnnMaps::up_conv_inputs(const Unit& u) const {
  const WindowGeometry g = window(u.in, u.out, u.k, u.s, 0);
  const spec::SpatialSplit grid = ctx_.plan->spatial;
  return [g, grid](int64_t q) { return spec::up_window_input_block(g, grid, q); };
}

std::function<Region(int64_t)> CnnMaps::crop_inputs(MapShape kept, MapShape to) const {
  const spec::SpatialSplit grid = ctx_.plan->spatial;
  const spec::MapExtent from = extent(kept), into = extent(to);
  return [=](int64_t q) { return spec::crop_input_block(from, into, grid, q); };
}

Region CnnMaps::up_conv_output(const Unit& u, Region in) const {
  auto made = [&](spec::Rows r) { return spec::Rows{r.begin * u.s, (r.end - 1) * u.s + u.k}; };
  return {made(in.rows), made(in.cols), volume_ ? made(in.planes) : spec::Rows{0, 1}};
}

Tensor CnnMaps::fetch_block(const std::string& name, const Tensor& x, MapShape in,
                            const std::function<Region(int64_t)>& need, int32_t layer, int64_t mb) {
  const int64_t elements = spec::most_fetched_elements(need, extent(in), ctx_.plan->spatial);
  if (elements == 0) return exchange_.fetch(*ctx_.backend, x, extent(in), need, 0.0f);
  auto s = split_comm(OpName(name, OpId::kUnitHalo), OpClass::kSend, elements * maps(x) * 4, layer,
                      Phase::kFwd, mb);
  return exchange_.fetch(*ctx_.backend, x, extent(in), need, 0.0f);
}

void CnnMaps::give_back_block(const std::string& name, const Tensor& dneed, MapShape in,
                              const std::function<Region(int64_t)>& need, Tensor& dx, int32_t layer,
                              int64_t mb) {
  const int64_t elements = spec::most_fetched_elements(need, extent(in), ctx_.plan->spatial);
  if (elements == 0) return exchange_.give_back(*ctx_.backend, dneed, extent(in), need, dx);
  auto s = split_comm(OpName(name, OpId::kUnitHalo), OpClass::kSend, elements * maps(dx) * 4, layer,
                      Phase::kBwd, mb);
  exchange_.give_back(*ctx_.backend, dneed, extent(in), need, dx);
}

MapShape CnnMaps::with_channels(MapShape s, int64_t channels) {
  s.c = channels;
  s.whole = true;
  return s;
}

MapShape CnnMaps::gathered_input(const ConvUnit& c) const {
  return stationary(c, spec::ChannelAlgorithm::kStationaryW)
             ? with_channels(c.in, c.in.c / spec::channel_filter_grid(tp()).reduce_ranks)
             : with_channels(c.in, c.in.c);
}

MapShape CnnMaps::partial_output(const ConvUnit& c) const {
  return stationary(c, spec::ChannelAlgorithm::kStationaryW)
             ? with_channels(c.out, c.out.c / spec::channel_filter_grid(tp()).gather_ranks)
             : with_channels(c.out, c.out.c);
}

GridAxis CnnMaps::gather_group(const ConvUnit& c) const {
  return stationary(c, spec::ChannelAlgorithm::kStationaryW) ? ctx_.groups->channel_filter[1]
                                                             : tp_group();
}

GridAxis CnnMaps::reduce_group(const ConvUnit& c) const {
  return stationary(c, spec::ChannelAlgorithm::kStationaryW) ? ctx_.groups->channel_filter[0]
                                                             : tp_group();
}

void CnnMaps::reduce_scatter_channels(const OpName& name, const Tensor& whole, Tensor& mine,
                                      const GridAxis& group, int32_t layer, Phase phase,
                                      int64_t mb) {
  const int64_t n = group.size, samples = whole.dim(0), per = mine.numel() / samples;
  std::vector<float> packed(static_cast<size_t>(whole.numel()));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t b = 0; b < samples; ++b)
      std::copy_n(whole.data() + (b * n + r) * per, per, packed.data() + (r * samples + b) * per);
  auto s = ctx_.recorder->scope(ctx_.comm(name, OpClass::kReduceScatter, Stream::kTpComm,
                                          whole.numel() * 4, n, phase, layer, mb));
  group.comm->reduce_scatter(packed.data(), mine.data(), mine.numel());
}

void CnnMaps::all_gather_channels(const OpName& name, const Tensor& mine, Tensor& whole,
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

}  // namespace sextant::exec::cnn
