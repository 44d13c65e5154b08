// Halo exchanges of a spatially split CNN.
#include "spatial_exchange.hpp"

#include <algorithm>
#include <vector>

#include "sextant/spec/error.hpp"

namespace sextant::exec {

namespace {

constexpr int kGatherTag = 11;
constexpr int kScatterTag = 12;

using spec::intersect;

// Copies `r` of every one of `planes` (batch x channel) planes from `src`, which holds region
// `from` of each plane, into `dst`, which holds `to`; adds when `add`.
void copy_region(const float* src, const Region& from, float* dst, const Region& to,
                 const Region& r, int64_t planes, bool add) {
  if (r.empty()) return;
  const int64_t from_plane = from.elements(), to_plane = to.elements();
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t h = r.rows.begin; h < r.rows.end; ++h) {
      const float* s = src + p * from_plane + (h - from.rows.begin) * from.cols.size() +
                       (r.cols.begin - from.cols.begin);
      float* d = dst + p * to_plane + (h - to.rows.begin) * to.cols.size() +
                 (r.cols.begin - to.cols.begin);
      if (add) {
        for (int64_t w = 0; w < r.cols.size(); ++w) d[w] += s[w];
      } else {
        std::copy(s, s + r.cols.size(), d);
      }
    }
}

int64_t planes_of(const Tensor& t) {
  SEXTANT_CHECK(t.shape().size() == 4, "a feature map is [B, C, H, W]");
  return t.dim(0) * t.dim(1);
}

// A volume [B, C, D, H, W] goes through the exchange as [B, C D, H, W]: its depth is never split,
// so every depth plane has the same halo and padding of rows and columns.
Tensor planes_view(const Tensor& t) {
  if (t.shape().size() != 5) return t;
  return t.view({t.dim(0), t.dim(1) * t.dim(2), t.dim(3), t.dim(4)});
}
// The depth planes a window reads along an unsplit depth of `depth` planes: its whole output's
// window input rows (spec::window_input_rows), reaching into the padding at both ends.
spec::Rows depth_window(const WindowGeometry& g, int64_t depth) {
  return spec::window_input_rows({0, spec::window_output(depth, g.kernel, g.stride, g.padding)},
                                 g.kernel, g.stride, g.padding);
}
// Copies the depth planes both hold between volumes holding depth ranges `from` and `to` of
// `outer` (batch x channel) maps of `plane` elements each.
void copy_depth(const float* src, spec::Rows from, float* dst, spec::Rows to, int64_t outer,
                int64_t plane) {
  const int64_t first = std::max(from.begin, to.begin), last = std::min(from.end, to.end);
  if (last <= first) return;
  for (int64_t o = 0; o < outer; ++o)
    std::copy_n(src + (o * from.size() + first - from.begin) * plane, (last - first) * plane,
                dst + (o * to.size() + first - to.begin) * plane);
}

// Messages posted to peers, kept alive until they are delivered.
struct Outbox {
  std::vector<std::vector<float>> buffers;
  std::vector<std::unique_ptr<CommRequest>> requests;
  ~Outbox() {
    for (auto& r : requests) r->wait();
  }
};

}  // namespace

SpatialExchange::SpatialExchange(spec::SpatialSplit grid, int64_t index, Communicator* comm)
    : grid_(grid), index_(index), ranks_(grid.ranks()), comm_(comm) {
  SEXTANT_CHECK(ranks_ == 1 || (comm != nullptr && comm->size() == ranks_),
                "a {}x{} spatial split needs its group of {} ranks", grid.h, grid.w, ranks_);
}

Region SpatialExchange::block(int64_t height, int64_t width, int64_t rank) const {
  return spec::shard_block(height, width, grid_, rank);
}

Region SpatialExchange::window_input(const WindowGeometry& g, int64_t rank) const {
  return spec::window_input_block(g, grid_, rank);
}

int64_t SpatialExchange::largest_halo(const WindowGeometry& g) const {
  return spec::halo_elements(g, grid_);
}

Tensor SpatialExchange::gather(DeviceMemory& backend, const Tensor& x, const WindowGeometry& g,
                               float fill) const {
  if (x.shape().size() != 5) return gather_planes(backend, x, g, fill);
  // Rows and columns plane by plane, then the depth's padding around the planes the window reads.
  const Tensor planes = gather_planes(backend, planes_view(x), g, fill);
  const int64_t depth = x.dim(2), plane = planes.dim(2) * planes.dim(3);
  const spec::Rows all{0, depth}, need = depth_window(g, depth);
  if (need == all) return planes.view({x.dim(0), x.dim(1), depth, planes.dim(2), planes.dim(3)});
  Tensor out = backend.empty({x.dim(0), x.dim(1), need.size(), planes.dim(2), planes.dim(3)});
  backend.fill(out, fill);
  copy_depth(planes.data(), all, out.data(), need, x.dim(0) * x.dim(1), plane);
  return out;
}

Tensor SpatialExchange::gather_planes(DeviceMemory& backend, const Tensor& x,
                                      const WindowGeometry& g, float fill) const {
  return fetch(
      backend, x, g.in_h, g.in_w, [&](int64_t q) { return window_input(g, q); }, fill);
}

Tensor SpatialExchange::fetch(DeviceMemory& backend, const Tensor& x, int64_t height, int64_t width,
                              const std::function<Region(int64_t)>& need, float fill) const {
  const Region own = block(height, width), mine = need(index_);
  const int64_t planes = planes_of(x);
  SEXTANT_CHECK(x.dim(2) == own.rows.size() && x.dim(3) == own.cols.size(),
                "block [{}, {}] of a {}x{} map, expected [{}, {}]", x.dim(2), x.dim(3), height,
                width, own.rows.size(), own.cols.size());
  Tensor out = backend.empty({x.dim(0), x.dim(1), mine.rows.size(), mine.cols.size()});
  backend.fill(out, fill);
  copy_region(x.data(), own, out.data(), mine, intersect(mine, own), planes, false);
  if (!split()) return out;
  Outbox outbox;
  for (int64_t q = 0; q < ranks_; ++q) {
    if (q == index_) continue;
    const Region r = intersect(need(q), own);
    if (r.empty()) continue;
    std::vector<float>& buf =
        outbox.buffers.emplace_back(static_cast<size_t>(planes * r.elements()));
    copy_region(x.data(), own, buf.data(), r, r, planes, false);
    outbox.requests.push_back(
        comm_->send(buf.data(), static_cast<int64_t>(buf.size()), static_cast<int>(q), kGatherTag));
  }
  std::vector<float> in;
  for (int64_t q = 0; q < ranks_; ++q) {
    if (q == index_) continue;
    const Region r = intersect(mine, block(height, width, q));
    if (r.empty()) continue;
    in.resize(static_cast<size_t>(planes * r.elements()));
    comm_->recv(in.data(), static_cast<int64_t>(in.size()), static_cast<int>(q), kGatherTag);
    copy_region(in.data(), r, out.data(), mine, r, planes, false);
  }
  return out;
}

void SpatialExchange::scatter(DeviceMemory& backend, const Tensor& dwindow, const WindowGeometry& g,
                              Tensor& dx) const {
  if (dx.shape().size() != 5) {
    scatter_planes(backend, dwindow, g, dx);
    return;
  }
  SEXTANT_CHECK(dwindow.shape().size() == 5, "the window gradient of a volume is a volume");
  const int64_t depth = dx.dim(2), plane = dwindow.dim(3) * dwindow.dim(4);
  const spec::Rows all{0, depth}, need = depth_window(g, depth);
  SEXTANT_CHECK(dwindow.dim(2) == need.size(), "a window gradient of {} planes, expected {}",
                dwindow.dim(2), need.size());
  Tensor dplanes = dwindow;
  if (need != all) {
    // The padding's gradient is dropped; planes the window does not read get none.
    dplanes = backend.empty({dx.dim(0), dx.dim(1), depth, dwindow.dim(3), dwindow.dim(4)});
    backend.fill(dplanes, 0.0f);
    copy_depth(dwindow.data(), need, dplanes.data(), all, dx.dim(0) * dx.dim(1), plane);
  }
  Tensor flat = planes_view(dx);
  scatter_planes(backend, planes_view(dplanes), g, flat);
}

void SpatialExchange::scatter_planes(DeviceMemory& backend, const Tensor& dwindow,
                                     const WindowGeometry& g, Tensor& dx) const {
  give_back(
      backend, dwindow, g.in_h, g.in_w, [&](int64_t q) { return window_input(g, q); }, dx);
}

void SpatialExchange::give_back(DeviceMemory& backend, const Tensor& dneed, int64_t height,
                                int64_t width, const std::function<Region(int64_t)>& need,
                                Tensor& dx) const {
  const Region own = block(height, width), mine = need(index_);
  const int64_t planes = planes_of(dneed);
  SEXTANT_CHECK(dneed.dim(2) == mine.rows.size() && dneed.dim(3) == mine.cols.size() &&
                    dx.dim(2) == own.rows.size() && dx.dim(3) == own.cols.size(),
                "the gradient of a fetched block [{}, {}] into a block [{}, {}], expected [{}, {}] "
                "into [{}, {}]",
                dneed.dim(2), dneed.dim(3), dx.dim(2), dx.dim(3), mine.rows.size(),
                mine.cols.size(), own.rows.size(), own.cols.size());
  backend.fill(dx, 0.0f);
  copy_region(dneed.data(), mine, dx.data(), own, intersect(mine, own), planes, false);
  if (!split()) return;
  Outbox outbox;
  for (int64_t q = 0; q < ranks_; ++q) {
    if (q == index_) continue;
    const Region r = intersect(mine, block(height, width, q));
    if (r.empty()) continue;
    std::vector<float>& buf =
        outbox.buffers.emplace_back(static_cast<size_t>(planes * r.elements()));
    copy_region(dneed.data(), mine, buf.data(), r, r, planes, false);
    outbox.requests.push_back(comm_->send(buf.data(), static_cast<int64_t>(buf.size()),
                                          static_cast<int>(q), kScatterTag));
  }
  std::vector<float> in;
  for (int64_t q = 0; q < ranks_; ++q) {
    if (q == index_) continue;
    const Region r = intersect(need(q), own);
    if (r.empty()) continue;
    in.resize(static_cast<size_t>(planes * r.elements()));
    comm_->recv(in.data(), static_cast<int64_t>(in.size()), static_cast<int>(q), kScatterTag);
    copy_region(in.data(), r, dx.data(), own, r, planes, true);
  }
}

}  // namespace sextant::exec
