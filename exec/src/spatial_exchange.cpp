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
  const Region own = block(g.in_h, g.in_w), need = window_input(g, index_);
  const int64_t planes = planes_of(x);
  SEXTANT_CHECK(x.dim(2) == own.rows.size() && x.dim(3) == own.cols.size(),
                "block [{}, {}] of a {}x{} map, expected [{}, {}]", x.dim(2), x.dim(3), g.in_h,
                g.in_w, own.rows.size(), own.cols.size());
  Tensor out = backend.empty({x.dim(0), x.dim(1), need.rows.size(), need.cols.size()});
  backend.fill(out, fill);
  copy_region(x.data(), own, out.data(), need, intersect(need, own), planes, false);
  if (!split()) return out;
  Outbox outbox;
  for (int64_t q = 0; q < ranks_; ++q) {
    if (q == index_) continue;
    const Region r = intersect(window_input(g, q), own);
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
    const Region r = intersect(need, block(g.in_h, g.in_w, q));
    if (r.empty()) continue;
    in.resize(static_cast<size_t>(planes * r.elements()));
    comm_->recv(in.data(), static_cast<int64_t>(in.size()), static_cast<int>(q), kGatherTag);
    copy_region(in.data(), r, out.data(), need, r, planes, false);
  }
  return out;
}

void SpatialExchange::scatter(DeviceMemory& backend, const Tensor& dwindow, const WindowGeometry& g,
                              Tensor& dx) const {
  const Region own = block(g.in_h, g.in_w), need = window_input(g, index_);
  const int64_t planes = planes_of(dwindow);
  SEXTANT_CHECK(dwindow.dim(2) == need.rows.size() && dwindow.dim(3) == need.cols.size() &&
                    dx.dim(2) == own.rows.size() && dx.dim(3) == own.cols.size(),
                "window gradient shapes");
  backend.fill(dx, 0.0f);
  copy_region(dwindow.data(), need, dx.data(), own, intersect(need, own), planes, false);
  if (!split()) return;
  Outbox outbox;
  for (int64_t q = 0; q < ranks_; ++q) {
    if (q == index_) continue;
    const Region r = intersect(need, block(g.in_h, g.in_w, q));
    if (r.empty()) continue;
    std::vector<float>& buf =
        outbox.buffers.emplace_back(static_cast<size_t>(planes * r.elements()));
    copy_region(dwindow.data(), need, buf.data(), r, r, planes, false);
    outbox.requests.push_back(comm_->send(buf.data(), static_cast<int64_t>(buf.size()),
                                          static_cast<int>(q), kScatterTag));
  }
  std::vector<float> in;
  for (int64_t q = 0; q < ranks_; ++q) {
    if (q == index_) continue;
    const Region r = intersect(window_input(g, q), own);
    if (r.empty()) continue;
    in.resize(static_cast<size_t>(planes * r.elements()));
    comm_->recv(in.data(), static_cast<int64_t>(in.size()), static_cast<int>(q), kScatterTag);
    copy_region(in.data(), r, dx.data(), own, r, planes, true);
  }
}

}  // namespace sextant::exec
