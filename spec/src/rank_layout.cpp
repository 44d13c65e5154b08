// Rank groups of a plan.
#include "sextant/spec/rank_layout.hpp"

#include <algorithm>

#include "sextant/spec/channel_split.hpp"

namespace sextant::spec {

std::vector<int64_t> RankLayout::tp_group(int64_t r) const {
  RankCoord c = coord(r);
  std::vector<int64_t> g;
  for (int64_t t = 0; t < tp_; ++t) g.push_back(rank({c.dp, t, c.pp, c.spatial, c.cp}));
  return g;
}

std::vector<int64_t> RankLayout::dp_group(int64_t r) const {
  RankCoord c = coord(r);
  std::vector<int64_t> g;
  for (int64_t d = 0; d < dp_; ++d) g.push_back(rank({d, c.tp, c.pp, c.spatial, c.cp}));
  return g;
}

std::vector<int64_t> RankLayout::spatial_group(int64_t r) const {
  RankCoord c = coord(r);
  std::vector<int64_t> g;
  for (int64_t s = 0; s < sp_; ++s) g.push_back(rank({c.dp, c.tp, c.pp, s, c.cp}));
  return g;
}

std::vector<int64_t> RankLayout::cp_group(int64_t r) const {
  RankCoord c = coord(r);
  std::vector<int64_t> g;
  for (int64_t k = 0; k < cp_; ++k) g.push_back(rank({c.dp, c.tp, c.pp, c.spatial, k}));
  return g;
}

std::vector<int64_t> RankLayout::layer_group(int64_t r) const {
  if (!grid_.any()) return tp_group(r);
  RankCoord c = coord(r);
  const int64_t slice = grid_.x * grid_.y;
  const int64_t first = c.tp / slice * slice;
  std::vector<int64_t> g;
  for (int64_t t = first; t < first + slice; ++t)
    g.push_back(rank({c.dp, t, c.pp, c.spatial, c.cp}));
  return g;
}

std::vector<int64_t> RankLayout::grid_group(int64_t r, int axis) const {
  if (!grid_.any()) return tp_group(r);
  RankCoord c = coord(r);
  // tp index = gx + x * (gy + y * gz): an axis of extent n and stride `stride`.
  const int64_t n = axis == 0 ? grid_.x : axis == 1 ? grid_.y : grid_.z;
  const int64_t stride = axis == 0 ? 1 : axis == 1 ? grid_.x : grid_.x * grid_.y;
  const int64_t first = c.tp - (c.tp / stride % n) * stride;
  std::vector<int64_t> g;
  for (int64_t i = 0; i < n; ++i)
    g.push_back(rank({c.dp, first + i * stride, c.pp, c.spatial, c.cp}));
  return g;
}

std::vector<int64_t> RankLayout::channel_filter_group(int64_t r, int axis) const {
  const ChannelFilterGrid g = channel_filter_grid(tp_);
  if (!g.any()) return tp_group(r);
  RankCoord c = coord(r);
  // tp index = place in the reduce group + reduce_ranks * reduce group.
  const int64_t n = axis == 0 ? g.reduce_ranks : g.gather_ranks;
  const int64_t stride = axis == 0 ? 1 : g.reduce_ranks;
  const int64_t first = axis == 0 ? c.tp - c.tp % g.reduce_ranks : c.tp % g.reduce_ranks;
  std::vector<int64_t> members;
  for (int64_t i = 0; i < n; ++i)
    members.push_back(rank({c.dp, first + i * stride, c.pp, c.spatial, c.cp}));
  return members;
}

std::vector<int64_t> RankLayout::replica_group(int64_t r) const {
  RankCoord c = coord(r);
  std::vector<int64_t> g;
  for (int64_t d = 0; d < dp_; ++d)
    for (int64_t k = 0; k < cp_; ++k)
      for (int64_t s = 0; s < sp_; ++s) g.push_back(rank({d, c.tp, c.pp, s, k}));
  if (mirrored_) {
    // The mirror's replicas too, every member listing them in the same (rank) order.
    RankCoord m = c;
    m.pp = pp_ - 1 - c.pp;
    for (const int64_t member : std::vector<int64_t>(g)) {
      RankCoord x = coord(member);
      x.pp = m.pp;
      g.push_back(rank(x));
    }
    std::sort(g.begin(), g.end());
  }
  return g;
}

std::vector<int64_t> RankLayout::ep_group(int64_t r) const {
  RankCoord c = coord(r);
  std::vector<int64_t> g;
  const int64_t first = c.dp / ep_ * ep_;
  for (int64_t i = 0; i < ep_; ++i) g.push_back(rank({first + i, c.tp, c.pp, c.spatial, c.cp}));
  return g;
}

std::vector<int64_t> RankLayout::expert_replica_group(int64_t r) const {
  RankCoord c = coord(r);
  std::vector<int64_t> g;
  for (int64_t d = c.dp % ep_; d < dp_; d += ep_)
    for (int64_t k = 0; k < cp_; ++k)
      for (int64_t s = 0; s < sp_; ++s) g.push_back(rank({d, c.tp, c.pp, s, k}));
  return g;
}

int64_t RankLayout::pp_next(int64_t r) const {
  RankCoord c = coord(r);
  c.pp = (c.pp + 1) % pp_;
  return rank(c);
}

int64_t RankLayout::pp_prev(int64_t r) const {
  RankCoord c = coord(r);
  c.pp = (c.pp + pp_ - 1) % pp_;
  return rank(c);
}

}  // namespace sextant::spec
