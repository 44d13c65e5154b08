// Halo exchanges of a spatially split CNN.
#include "spatial_exchange.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

#include "sextant/spec/error.hpp"

namespace sextant::exec {

namespace {

constexpr int kGatherTag = 11;
constexpr int kScatterTag = 12;

using spec::intersect;

// A map's tensor: [B, C, rows, cols], or a volume's [B, C, planes, rows, cols]; `outer` counts its
// B x C maps.
struct Maps {
  int64_t outer;
  bool volume;
};
Maps maps_of(const Tensor& t) {
  const size_t n = t.shape().size();
  SEXTANT_CHECK(n == 4 || n == 5, "a feature map is [B, C, H, W] or [B, C, D, H, W], got {} dims",
                n);
  return {t.dim(0) * t.dim(1), n == 5};
}
// Whether `t` holds `region` of every map.
bool holds(const Tensor& t, const Region& region) {
  const size_t n = t.shape().size();
  return t.dim(n - 2) == region.rows.size() && t.dim(n - 1) == region.cols.size() &&
         (n == 4 ? region.planes.size() == 1 : t.dim(2) == region.planes.size());
}

Box box_of(const Region& r) {
  return {r.planes.begin, r.planes.end, r.rows.begin, r.rows.end, r.cols.begin, r.cols.end};
}
// Copies `r` of every one of `outer` (batch x channel) maps from `src`, which holds region `from`
// of each map, into `dst`, which holds `to`; adds when `add`.
void copy_region(DeviceMemory& backend, const Tensor& src, const Region& from, Tensor& dst,
                 const Region& to, const Region& r, int64_t outer, bool add) {
  if (r.empty()) return;
  backend.copy_box(src, box_of(from), dst, box_of(to), box_of(r), outer, add);
}

std::string describe(const Region& r) {
  return fmt::format("planes [{}, {}) rows [{}, {}) columns [{}, {})", r.planes.begin, r.planes.end,
                     r.rows.begin, r.rows.end, r.cols.begin, r.cols.end);
}

// Messages posted to peers, kept alive until they are delivered.
struct Outbox {
  std::vector<Tensor> buffers;
  std::vector<std::unique_ptr<CommRequest>> requests;
  ~Outbox() {
    for (auto& r : requests) r->wait();
  }
};

}  // namespace

void copy_block(DeviceMemory& backend, const Tensor& src, const Region& from, Tensor& dst,
                const Region& to, const Region& r) {
  copy_region(backend, src, from, dst, to, r, maps_of(src).outer, false);
}

SpatialExchange::SpatialExchange(spec::SpatialSplit grid, int64_t index, Communicator* comm)
    : grid_(grid), index_(index), ranks_(grid.ranks()), comm_(comm) {
  SEXTANT_CHECK(ranks_ == 1 || (comm != nullptr && comm->size() == ranks_),
                "a {} spatial split needs its group of {} ranks", spec::spatial_text(grid), ranks_);
}

Region SpatialExchange::block(const spec::MapExtent& map, int64_t rank) const {
  return spec::shard_block(map, grid_, rank);
}

Region SpatialExchange::window_input(const WindowGeometry& g, int64_t rank) const {
  return spec::window_input_block(g, grid_, rank);
}

int64_t SpatialExchange::largest_halo(const WindowGeometry& g) const {
  return spec::halo_elements(g, grid_);
}

Tensor SpatialExchange::gather(DeviceMemory& backend, const Tensor& x, const WindowGeometry& g,
                               float fill) const {
  return fetch(
      backend, x, g.in(), [&](int64_t q) { return window_input(g, q); }, fill);
}

void SpatialExchange::scatter(DeviceMemory& backend, const Tensor& dwindow, const WindowGeometry& g,
                              Tensor& dx) const {
  give_back(
      backend, dwindow, g.in(), [&](int64_t q) { return window_input(g, q); }, dx);
}

Tensor SpatialExchange::fetch(DeviceMemory& backend, const Tensor& x, const spec::MapExtent& map,
                              const std::function<Region(int64_t)>& need, float fill) const {
  const Region own = block(map), mine = need(index_);
  const Maps m = maps_of(x);
  SEXTANT_CHECK(m.volume == map.volume() && holds(x, own),
                "a block of {} dimensions, expected this rank's {} of the map", x.shape().size(),
                describe(own));
  std::vector<int64_t> shape{x.dim(0), x.dim(1), mine.rows.size(), mine.cols.size()};
  if (m.volume) shape.insert(shape.begin() + 2, mine.planes.size());
  Tensor out = backend.empty(shape);
  backend.fill(out, fill);
  copy_region(backend, x, own, out, mine, intersect(mine, own), m.outer, false);
  if (!split()) return out;
  Outbox outbox;
  for (int64_t q = 0; q < ranks_; ++q) {
    if (q == index_) continue;
    const Region r = intersect(need(q), own);
    if (r.empty()) continue;
    Tensor& buf = outbox.buffers.emplace_back(backend.empty({m.outer * r.elements()}));
    copy_region(backend, x, own, buf, r, r, m.outer, false);
    outbox.requests.push_back(
        comm_->send(buf.data(), buf.numel(), static_cast<int>(q), kGatherTag));
  }
  for (int64_t q = 0; q < ranks_; ++q) {
    if (q == index_) continue;
    const Region r = intersect(mine, block(map, q));
    if (r.empty()) continue;
    Tensor in = backend.empty({m.outer * r.elements()});
    comm_->recv(in.data(), in.numel(), static_cast<int>(q), kGatherTag);
    copy_region(backend, in, r, out, mine, r, m.outer, false);
  }
  return out;
}

void SpatialExchange::give_back(DeviceMemory& backend, const Tensor& dneed,
                                const spec::MapExtent& map,
                                const std::function<Region(int64_t)>& need, Tensor& dx) const {
  const Region own = block(map), mine = need(index_);
  const Maps m = maps_of(dneed);
  SEXTANT_CHECK(m.volume == map.volume() && holds(dneed, mine) && holds(dx, own),
                "the gradient of a fetched block ({}) into this rank's ({}): shapes differ",
                describe(mine), describe(own));
  backend.fill(dx, 0.0f);
  copy_region(backend, dneed, mine, dx, own, intersect(mine, own), m.outer, false);
  if (!split()) return;
  Outbox outbox;
  for (int64_t q = 0; q < ranks_; ++q) {
    if (q == index_) continue;
    const Region r = intersect(mine, block(map, q));
    if (r.empty()) continue;
    Tensor& buf = outbox.buffers.emplace_back(backend.empty({m.outer * r.elements()}));
    copy_region(backend, dneed, mine, buf, r, r, m.outer, false);
    outbox.requests.push_back(
        comm_->send(buf.data(), buf.numel(), static_cast<int>(q), kScatterTag));
  }
  for (int64_t q = 0; q < ranks_; ++q) {
    if (q == index_) continue;
    const Region r = intersect(need(q), own);
    if (r.empty()) continue;
    Tensor in = backend.empty({m.outer * r.elements()});
    comm_->recv(in.data(), in.numel(), static_cast<int>(q), kScatterTag);
    copy_region(backend, in, r, dx, own, r, m.outer, true);
  }
}

}  // namespace sextant::exec
